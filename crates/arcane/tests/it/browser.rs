//! Browser origins the user allows, in a real browser: headless Chromium (Debian's,
//! driven by Playwright from Python) loads the same page from two loopback origins.
//! The Core runs the real llama-server and SmolLM2 with `--allow-origin` naming one
//! of them: that page streams a chat with the token (and, without it, can read the
//! 401); the other page reads nothing at all.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use crate::serve::{host_endpoint, real_socket_args, strs, wait_host_ready, Serve, START};
use crate::support::TestWorkspace;

/// A page driver (a Python script under `tests/browser/`) and its lines, as they come.
pub(crate) struct Driver {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Driver {
    fn start() -> Driver {
        Driver::script("cors_pages.py")
    }

    /// Starts `tests/browser/<name>` with the provisioned Python and Chromium.
    pub(crate) fn script(name: &str) -> Driver {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/browser")
            .join(name);
        let mut child = Command::new(crate::support::provisioned("ARCANE_BROWSER_PYTHON"))
            .arg(script)
            .env(
                "ARCANE_CHROMIUM",
                crate::support::provisioned("ARCANE_CHROMIUM"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the page driver");
        let stdout = child.stdout.take().expect("the driver's stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        Driver { child, lines }
    }

    /// The next line, within `within` (the driver bounds each page itself too).
    pub(crate) fn line(&self, within: Duration) -> String {
        self.lines
            .recv_timeout(within)
            .expect("the page driver answered in time (its stderr says why not)")
    }

    pub(crate) fn send(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().expect("the driver's stdin");
        writeln!(stdin, "{line}").expect("write to the page driver");
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_page_of_an_allowed_origin_streams_a_chat_and_another_reads_nothing() {
    let mut driver = Driver::start();
    let pages = driver.line(Duration::from_secs(60));
    let ports: Vec<u16> = pages
        .strip_prefix("pages ")
        .unwrap_or_else(|| panic!("unexpected first line {pages:?}"))
        .split(' ')
        .map(|p| p.parse().expect("a port"))
        .collect();
    let (allowed, other) = (
        format!("http://127.0.0.1:{}", ports[0]),
        format!("http://127.0.0.1:{}", ports[1]),
    );
    let ws = TestWorkspace::new();
    let mut args = real_socket_args();
    args.extend([
        "--alias".into(),
        "smol".into(),
        "--allow-origin".into(),
        allowed.clone(),
    ]);
    let mut serve = Serve::start(&ws, &strs(&args));
    serve.wait_for("local-ai.server.ready", START);
    wait_host_ready(&ws);
    let (port, token) = host_endpoint(&ws);
    driver.send(&format!("core http://127.0.0.1:{port} {token} smol"));

    let mut results = std::collections::HashMap::new();
    loop {
        let line = driver.line(Duration::from_secs(600));
        if line == "done" {
            break;
        }
        let (origin, result) = line
            .strip_prefix("result ")
            .and_then(|rest| rest.split_once(' '))
            .unwrap_or_else(|| panic!("unexpected line {line:?}"));
        let result: Value = serde_json::from_str(result).expect("a JSON result");
        results.insert(origin.to_string(), result);
    }

    // The allowed page streamed the chat: several reads of SSE chunks, then [DONE].
    let granted = &results[&allowed];
    let with_token = &granted["withToken"];
    assert_eq!(with_token["status"], 200, "{granted}");
    assert_eq!(with_token["error"], Value::Null, "{granted}");
    let text = with_token["text"].as_str().unwrap_or_default();
    assert!(text.matches("data: ").count() >= 3, "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(
        with_token["reads"].as_u64() >= Some(2),
        "streamed, not one body: {granted}"
    );
    // Still the token: without it the page reads the 401, nothing more.
    let without = &granted["withoutToken"];
    assert_eq!(without["status"], 401, "{granted}");
    assert!(
        !without["text"]
            .as_str()
            .unwrap_or_default()
            .contains("data: "),
        "{granted}"
    );

    // The other page read nothing: the browser refused it, with or without the token.
    let refused = &results[&other];
    for attempt in ["withToken", "withoutToken"] {
        assert_eq!(refused[attempt]["status"], Value::Null, "{refused}");
        assert_eq!(refused[attempt]["text"], "", "{refused}");
        assert!(refused[attempt]["error"].is_string(), "{refused}");
    }
    serve.terminate();
}

/// `--allow-origin` and `allowed_origins` refuse a wildcard and anything that is not
/// an origin, naming the value, before anything starts.
#[test]
fn a_wildcard_or_a_non_origin_is_refused_before_anything_starts() {
    let ws = TestWorkspace::new();
    let output = crate::support::run(ws.arcane().args(["serve", "--allow-origin", "*"]));
    assert_eq!(output.status.code(), Some(2));
    insta::assert_snapshot!(
        "serve_allow_origin_wildcard",
        ws.redact(&crate::support::stderr(&output))
    );
    std::fs::write(
        ws.path().join("arcane.toml"),
        "allowed_origins = [\"http://localhost:3000/app\"]\n",
    )
    .unwrap();
    let output = crate::support::run(ws.arcane().args(["--output", "json", "serve"]));
    assert_eq!(output.status.code(), Some(2));
    let error = crate::support::json(&output);
    assert_eq!(error["error"]["code"], "ARCANE_USAGE", "{error}");
    assert_eq!(
        error["error"]["details"]["origin"], "http://localhost:3000/app",
        "{error}"
    );
    assert!(
        !ws.path().join(".arcane/core.json").exists(),
        "nothing was served"
    );
}
