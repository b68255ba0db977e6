//! The application's packaged web (`arcane serve --web DIR`) in a real browser:
//! `arcane open --app` logs headless Chromium in; the app at `/ui/app/` lists the
//! models and streams a chat from the real llama-server through the Core's API with
//! the session, never a token; without a session its files are refused; `/app/`
//! points to it; a directory another user could change is refused before anything
//! starts.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::serve::{real_socket_args, strs, wait_host_ready, Serve, START};
use crate::support::{json, run, stderr, stdout, TestWorkspace};

/// Opens `link` (from `arcane open --app --print`) in headless Chromium and lets the
/// app run (`tests/browser/app_web.py`): what the page showed.
pub(crate) fn app_in_browser(link: &str) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/browser/app_web.py");
    let mut driver = Command::new(crate::support::provisioned("ARCANE_BROWSER_PYTHON"))
        .arg(script)
        .env(
            "ARCANE_CHROMIUM",
            crate::support::provisioned("ARCANE_CHROMIUM"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the browser driver");
    let mut stdin = driver.stdin.take().expect("the driver's stdin");
    writeln!(stdin, "link {link}").expect("write the link");
    drop(stdin);
    let output = driver.wait_with_output().expect("the driver ends");
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "{text}");
    text.lines()
        .find_map(|line| line.strip_prefix("result "))
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or_else(|| panic!("no result in {text}"))
}

/// The app of `tests/browser/app`, copied into `dir` so that only this user can
/// change it.
pub(crate) fn copy_app(dir: &std::path::Path) {
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/browser/app");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    for name in ["index.html", "app.js", "style.css"] {
        std::fs::copy(source.join(name), dir.join(name)).unwrap();
    }
}

/// A copy of `tests/browser/app` that only this user can change.
fn app_dir(ws: &TestWorkspace) -> PathBuf {
    let web = ws.path().join("web");
    copy_app(&web);
    web
}

#[test]
fn the_packaged_web_lists_the_models_and_streams_a_chat_with_the_session() {
    let ws = TestWorkspace::new();
    let web = app_dir(&ws);
    let mut args = real_socket_args();
    args.extend([
        "--alias".into(),
        "smol".into(),
        "--web".into(),
        web.display().to_string(),
    ]);
    let mut serve = Serve::start(&ws, &strs(&args));
    serve.wait_for("local-ai.server.ready", START);
    wait_host_ready(&ws);
    let open = run(ws.arcane().args(["open", "--app", "--print"]));
    assert!(open.status.success(), "{}", stderr(&open));
    let link = stdout(&open).trim().to_string();
    assert!(
        link.contains("/ui#code=") && link.ends_with("&next=app"),
        "{link}"
    );

    let result = app_in_browser(&link);
    assert_eq!(result["error"], Value::Null, "{result}");
    assert!(
        result["url"]
            .as_str()
            .unwrap_or_default()
            .ends_with("/ui/app/"),
        "{result}"
    );
    assert_eq!(result["models"], "smol", "{result}");
    assert!(
        !result["answer"].as_str().unwrap_or_default().is_empty(),
        "{result}"
    );
    assert!(result["reads"].as_u64() >= Some(2), "streamed: {result}");
    assert!(
        result["csp"]
            .as_str()
            .unwrap_or_default()
            .starts_with("default-src 'self'"),
        "{result}"
    );
    assert_eq!(result["withoutSession"]["status"], 401, "{result}");
    assert!(
        !result["withoutSession"]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("models"),
        "{result}"
    );
    assert_eq!(result["moved"]["status"], 308, "{result}");
    assert_eq!(result["moved"]["location"], "/ui/app/", "{result}");
    serve.terminate();
}

#[test]
fn a_web_directory_others_can_change_is_refused_before_anything_starts() {
    let ws = TestWorkspace::new();
    let web = app_dir(&ws);
    std::fs::set_permissions(&web, std::fs::Permissions::from_mode(0o777)).unwrap();
    let output = run(ws
        .arcane()
        .args(["--output", "json", "serve", "--web"])
        .arg(&web));
    assert!(!output.status.success());
    let error = json(&output);
    assert_eq!(error["error"]["code"], "ARCANE_POLICY_DENIED", "{error}");
    assert!(
        !ws.path().join(".arcane/core.json").exists(),
        "nothing was served"
    );
}
