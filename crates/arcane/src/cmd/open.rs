//! `arcane open [--print] [--app]`: log a browser in to the running host's dashboard
//! (`/ui`), or its application's packaged web (`/ui/app/`), without putting the bearer
//! token in any URL.
//!
//! The command (which may read the token) asks the host for a one-time login code
//! (`ui.code.issue`) and a link `http://arcane-<random>.localhost:PORT/ui#code=…`: the
//! code is in the fragment, which the browser never sends to a server; the page trades
//! it for a session cookie and removes it from the address bar. A code is good once,
//! for 60 seconds (see `arcane_front_door::ui::session`).
//!
//! # Never on a command line
//!
//! Every local user can read every process's arguments (`/proc/PID/cmdline`), so the
//! link is not handed to the opener: it goes into a small page in the workspace's
//! private run directory (`.arcane/run/open-<random>.html`, mode 0600 in a 0700
//! directory of this user), and the opener gets that page's `file://` path, which holds
//! no secret. The page sends the browser on to the link. Pages older than a code's
//! lifetime are removed by the next `arcane open`.

use std::path::{Path, PathBuf};

use arcane_core::client::CoreClient;
use serde_json::json;

use crate::config::Context;
use crate::error::{CliError, CommandError};

/// Arguments of `arcane open`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the one-time link instead of opening it (paste it into a browser on this
    /// machine within 60 seconds).
    #[arg(long)]
    print: bool,

    /// Open the application's packaged web (`arcane serve --web DIR`, a bundle's
    /// `app/web/`) at `/ui/app/` instead of the dashboard, logged in the same way.
    #[arg(long)]
    app: bool,
}

/// Runs `arcane open`.
pub fn run(context: &Context, args: Args) -> Result<u8, CliError> {
    let client = CoreClient::from_workspace(&context.workspace)?;
    let issued = crate::cmd::core::block_on_client(context, "`arcane open`", async {
        Ok::<_, CliError>(
            client
                .call(arcane_front_door::ui::ISSUE_METHOD, json!({}))
                .await?,
        )
    })?;
    let Some(mut url) = issued["url"].as_str().map(str::to_string) else {
        return Err(CommandError::new(
            arcane_report::codes::ARCANE_OPERATION_FAILED,
            "the host answered without a login link",
            json!({ "answer": issued }),
        )
        .into());
    };
    if args.app {
        url.push_str("&next=app");
    }
    let expires = issued["expiresIn"].as_u64().unwrap_or(60);
    let opener = if args.print {
        None
    } else {
        crate::config::search_path("xdg-open")
    };
    let page = match opener {
        Some(opener) => open_with(&opener, &context.workspace, &url)?,
        None => None,
    };
    let opened = page.is_some();
    let human = if opened {
        let what = if args.app {
            "the application"
        } else {
            "the dashboard"
        };
        format!("opened {what} in the browser (the link is good once, for {expires} s)")
    } else {
        url.clone()
    };
    context.output.result(
        &human,
        &json!({ "url": url, "expiresIn": expires, "opened": opened, "page": page }),
    );
    Ok(0)
}

/// The prefix and suffix of the login pages in the run directory.
const PAGE_PREFIX: &str = "open-";
const PAGE_SUFFIX: &str = ".html";

/// Writes `url` into a private login page and hands the page's path to `opener`:
/// the page, or `None` when the opener refused it (then the page is removed).
fn open_with(opener: &Path, workspace: &Path, url: &str) -> Result<Option<PathBuf>, CliError> {
    let run = arcane_localai::private_run_dir(workspace)?;
    remove_old_pages(&run);
    let name = format!(
        "{PAGE_PREFIX}{}{PAGE_SUFFIX}",
        arcane_files::secret_hex(8).map_err(|source| io_error(
            "read random bytes for",
            &run,
            source
        ))?
    );
    let page = run.join(name);
    arcane_files::write_atomic(&page, login_page(url).as_bytes(), 0o600)
        .map_err(|source| io_error("write", &page, source))?;
    if run_opener(opener, &file_url(&page)) {
        Ok(Some(page))
    } else {
        let _ = std::fs::remove_file(&page);
        Ok(None)
    }
}

/// Hands `target` (a `file://` URL, no secret) to the desktop's opener; `true` when it
/// accepted it.
fn run_opener(opener: &Path, target: &str) -> bool {
    // The browser the opener starts belongs to the user's session, not to Arcane: it
    // must outlive this command, so it is not started through `arcane_process::spawn`
    // (whose children die with their parent).
    #[allow(clippy::disallowed_methods)]
    let status = std::process::Command::new(opener)
        .arg(target)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    status.is_ok_and(|s| s.success())
}

/// A page that sends the browser on to `url` at once (and offers it as a link).
fn login_page(url: &str) -> String {
    let url = url
        .replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n\
         <meta name=\"referrer\" content=\"no-referrer\">\n\
         <meta http-equiv=\"refresh\" content=\"0;url={url}\">\n\
         <title>Arcane: opening</title></head>\n\
         <body><p>Opening <a href=\"{url}\">Arcane</a> (a one-time link, good for 60 seconds).</p></body></html>\n"
    )
}

/// `file://` and `path`, percent-encoded where a URL needs it.
fn file_url(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut url = String::from("file://");
    for &byte in path.as_os_str().as_bytes() {
        if byte.is_ascii_alphanumeric() || b"/-._~".contains(&byte) {
            url.push(char::from(byte));
        } else {
            url.push_str(&format!("%{byte:02X}"));
        }
    }
    url
}

/// Removes the login pages of earlier runs whose code has expired (regular files of
/// this command's naming only; nothing else in the directory is touched).
fn remove_old_pages(run: &Path) {
    let Ok(entries) = std::fs::read_dir(run) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with(PAGE_PREFIX) && name.ends_with(PAGE_SUFFIX)) {
            continue;
        }
        let expired = entry.metadata().is_ok_and(|meta| {
            meta.file_type().is_file()
                && meta
                    .modified()
                    .ok()
                    .and_then(|at| at.elapsed().ok())
                    .is_some_and(|age| age > arcane_front_door::ui::CODE_LIFETIME)
        });
        if expired {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn io_error(operation: &str, path: &Path, source: std::io::Error) -> CliError {
    CommandError::new(
        arcane_report::codes::ARCANE_IO,
        format!("cannot {operation} `{}`: {source}", path.display()),
        json!({ "path": path }),
    )
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_expired_login_pages_are_removed_and_nothing_else() {
        let run = tempfile::tempdir().unwrap();
        let page = |name: &str, age: std::time::Duration| {
            let path = run.path().join(name);
            std::fs::write(&path, "x").unwrap();
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(std::time::SystemTime::now() - age)
                .unwrap();
            path
        };
        let old = arcane_front_door::ui::CODE_LIFETIME * 2;
        let expired = page("open-0123456789abcdef.html", old);
        let fresh = page("open-fedcba9876543210.html", std::time::Duration::ZERO);
        let other = page("llama.cpp.key", old);
        let directory = run.path().join("open-directory.html");
        std::fs::create_dir(&directory).unwrap();
        remove_old_pages(run.path());
        assert!(!expired.exists(), "an expired page is removed");
        assert!(fresh.exists(), "a page whose code may still be good stays");
        assert!(
            other.exists() && directory.exists(),
            "nothing else is touched"
        );
    }

    #[test]
    fn the_page_forwards_to_the_link_and_its_path_is_a_file_url() {
        let html = login_page("http://arcane-1.localhost:1/ui#code=ab&next=app");
        assert!(
            html.contains("content=\"0;url=http://arcane-1.localhost:1/ui#code=ab&amp;next=app\""),
            "{html}"
        );
        assert_eq!(
            file_url(Path::new("/tmp/a b/open-1.html")),
            "file:///tmp/a%20b/open-1.html"
        );
    }
}
