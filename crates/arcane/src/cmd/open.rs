//! `arcane open [--print] [--app]`: log a browser in to the running host's dashboard
//! (`/ui`), or its application's packaged web (`/ui/app/`), without putting the bearer
//! token in any URL.
//!
//! The command (which may read the token) asks the host for a one-time login code
//! (`ui.code.issue`) and opens `http://127.0.0.1:PORT/ui#code=…`: the code is in the
//! fragment, which the browser never sends to a server; the page trades it for a
//! session cookie and removes it from the address bar. A code is good once, for 60
//! seconds (see `arcane_core::ui::session`).

use std::path::Path;

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
                .call(arcane_core::ui::ISSUE_METHOD, json!({}))
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
    let opened = opener.is_some_and(|opener| open_with(&opener, &url));
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
        &json!({ "url": url, "expiresIn": expires, "opened": opened }),
    );
    Ok(0)
}

/// Hands `url` to the desktop's opener; `true` when it accepted it.
fn open_with(opener: &Path, url: &str) -> bool {
    // The browser the opener starts belongs to the user's session, not to Arcane: it
    // must outlive this command, so it is not started through `arcane_process::spawn`
    // (whose children die with their parent).
    #[allow(clippy::disallowed_methods)]
    let status = std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    status.is_ok_and(|s| s.success())
}
