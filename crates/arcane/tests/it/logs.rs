//! `arcane logs` and `GET /v1/logs` with the real llama-server and SmolLM2: the
//! engine's own output and the host's lines are kept per model, a follower sees new
//! lines as they happen (an unload, then a new engine's start), an unknown model is
//! an error naming the known ones, and the budget of `log_buffer` holds.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use serde_json::Value;

use crate::serve::{real_socket_args, strs, wait_host_ready, Serve, START};
use crate::support::{json, run, stderr, TestWorkspace};

/// `arcane logs … --output ndjson` running, its lines on a channel.
struct Follower {
    child: Child,
    lines: mpsc::Receiver<Value>,
}

impl Follower {
    fn start(ws: &TestWorkspace, args: &[&str]) -> Follower {
        let mut child = ws
            .arcane()
            .args(["--output", "ndjson", "logs"])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start arcane logs -f");
        let stdout = child.stdout.take().expect("its stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(value) = serde_json::from_str::<Value>(&line) {
                    if sender.send(value).is_err() {
                        return;
                    }
                }
            }
        });
        Follower { child, lines }
    }

    /// Waits (bounded) for a line whose text passes `pred`; returns it.
    fn wait_for(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + START;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if pred(&line) => return line,
                Ok(_) => {}
                Err(_) => panic!("`arcane logs -f` never showed {what}"),
            }
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(line: &Value) -> &str {
    line["data"]["line"].as_str().unwrap_or_default()
}

#[test]
fn the_engines_output_and_the_hosts_lines_are_kept_and_followed_per_model() {
    let ws = TestWorkspace::new();
    std::fs::write(ws.path().join("arcane.toml"), "log_buffer = \"2KiB\"\n").unwrap();
    let mut args = real_socket_args();
    args.extend(["--alias".into(), "smol".into()]);
    let mut serve = Serve::start(&ws, &strs(&args));
    serve.wait_for("local-ai.server.ready", START);
    wait_host_ready(&ws);

    // What was kept: llama-server's own output and the host's lines, under `smol`.
    let kept = json(&run(ws.arcane().args(["--output", "json", "logs", "smol"])));
    let lines = kept["lines"].as_array().expect("a list of lines").clone();
    assert!(lines.iter().all(|l| l["model"] == "smol"), "{kept}");
    assert!(
        lines.iter().any(|l| l["stream"] == "stderr"),
        "llama-server's own output is kept: {kept}"
    );
    assert!(
        lines.iter().any(|l| l["stream"] == "host"
            && l["line"]
                .as_str()
                .unwrap_or_default()
                .starts_with("local-ai.model.ready")),
        "the host's line for the load is kept: {kept}"
    );
    // `log_buffer` holds: llama-server alone prints far more than 2 KiB while it
    // loads, so with the default (1 MiB) this would fail. A line counts its text,
    // its model's name and 64 bytes of bookkeeping.
    let bytes: usize = lines
        .iter()
        .map(|l| l["line"].as_str().unwrap_or_default().len() + "smol".len() + 64)
        .sum();
    assert!(bytes <= 2 * 1024, "the budget holds: {bytes}");

    // A follower sees what happens next: the unload, then a new engine's start.
    let follower = Follower::start(&ws, &["-f", "smol", "--since", "0s"]);
    let unload = run(ws.arcane().args(["unload", "smol"]));
    assert!(unload.status.success(), "{}", stderr(&unload));
    follower.wait_for("the unload", |l| {
        text(l).starts_with("local-ai.model.unloaded")
    });
    let load = run(ws.arcane().args(["load", "smol"]));
    assert!(load.status.success(), "{}", stderr(&load));
    let started = follower.wait_for("the new engine's own output", |l| {
        l["data"]["stream"] == "stderr"
    });
    assert_eq!(started["data"]["model"], "smol");
    follower.wait_for("the new engine ready", |l| {
        text(l).starts_with("local-ai.model.ready")
    });

    // An unknown model is an error naming the ones that have logs.
    let unknown = run(ws.arcane().args(["--output", "json", "logs", "smoll"]));
    assert!(!unknown.status.success());
    let error = json(&unknown);
    assert_eq!(error["error"]["code"], "ARCANE_NOT_FOUND", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("smol"),
        "{error}"
    );
    // A bad --since is refused before anything is asked.
    let bad = run(ws.arcane().args(["logs", "--since", "soon"]));
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("soon"), "{}", stderr(&bad));
    serve.terminate();
}
