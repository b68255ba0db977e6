//! Tests of the Core host through the real binary: `arcane core --stdio` on real pipes,
//! and `arcane serve` with `arcane status` / `arcane chat` against the real
//! `llama-server` and SmolLM2.

use std::io::{Read, Write};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{self, TestWorkspace};

/// A child killed (and reaped) on drop, also on panic.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn frame(value: &Value) -> Vec<u8> {
    let body = value.to_string();
    let mut out = format!("Content-Length: {}\r\n\r\n", body.len()).into_bytes();
    out.extend(body.as_bytes());
    out
}

fn request(id: &str, method: &str) -> Value {
    json!({"protocol": "arcane/1", "type": "request", "id": id, "method": method})
}

/// Splits a stdout byte stream into frames, checking the framing of every one.
fn frames(mut bytes: &[u8]) -> Vec<Value> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let end = bytes
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a header block");
        let header = std::str::from_utf8(&bytes[..end]).unwrap();
        let length: usize = header
            .strip_prefix("Content-Length: ")
            .expect("Content-Length header")
            .parse()
            .unwrap();
        let body = &bytes[end + 4..end + 4 + length];
        frames.push(serde_json::from_slice(body).unwrap());
        bytes = &bytes[end + 4 + length..];
    }
    frames
}

fn spawn_stdio(workspace: &TestWorkspace, extra: &[&str]) -> Guard {
    let child = workspace
        .arcane()
        .args(["core", "--stdio"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn arcane core --stdio");
    Guard(child)
}

/// Waits for the child to exit (bounded), returning its status, stdout and stderr.
fn finish(mut guard: Guard) -> (i32, Vec<u8>, String) {
    let mut stdout = Vec::new();
    guard
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    let mut stderr = String::new();
    guard
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = guard.0.try_wait().unwrap() {
            return (status.code().unwrap_or(-1), stdout, stderr);
        }
        assert!(Instant::now() < deadline, "arcane core did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn stdio_answers_split_and_concatenated_frames_on_real_pipes_and_drains_at_eof() {
    let workspace = TestWorkspace::new();
    let mut child = spawn_stdio(&workspace, &[]);
    let mut stdin = child.0.stdin.take().unwrap();
    // One frame dribbled byte by byte with pauses, then two frames in one write.
    let first = frame(&request("a", "system.ping"));
    for (i, byte) in first.iter().enumerate() {
        stdin.write_all(std::slice::from_ref(byte)).unwrap();
        stdin.flush().unwrap();
        if i % 16 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let mut both = frame(&request("b", "version.current"));
    both.extend(frame(&request("c", "nosuch.method")));
    stdin.write_all(&both).unwrap();
    // Give the host time to answer before end of input (EOF cancels request work).
    std::thread::sleep(Duration::from_millis(300));
    drop(stdin);
    let (code, stdout, stderr) = finish(child);
    assert_eq!(code, 0, "{stderr}");
    let frames = frames(&stdout);
    assert_eq!(frames[0]["event"], "core.ready");
    let response = |id: &str| {
        frames
            .iter()
            .find(|f| f["type"] == "response" && f["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no response {id}: {frames:?}"))
    };
    assert_eq!(response("a")["result"], json!({"ok": true}));
    assert_eq!(response("b")["result"]["protocol"], "arcane/1");
    assert_eq!(response("c")["error"]["code"], "METHOD_NOT_ALLOWED");
    assert_eq!(
        response("c")["error"]["details"]["reason"],
        "core-namespace-unavailable"
    );
    let last = frames.last().unwrap();
    assert_eq!(
        (last["event"].as_str(), last["data"]["state"].as_str()),
        (Some("core.state"), Some("closed"))
    );
}

#[test]
fn stdio_decode_errors_close_the_transport_cleanly() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"Content-Type: x\r\n\r\n{}".to_vec(), "IPC_LENGTH_MISSING"),
        (
            b"Content-Length: twelve\r\n\r\n{}".to_vec(),
            "IPC_LENGTH_INVALID",
        ),
        (
            b"Content-Length: 100\r\n\r\n{\"protocol\":".to_vec(),
            "IPC_FRAME_INCOMPLETE",
        ),
        (
            b"Content-Length: 4\r\n\r\n\"\xff\xfe\"".to_vec(),
            "IPC_INVALID_UTF8",
        ),
        (
            b"Content-Length: 5\r\n\r\nnope!".to_vec(),
            "IPC_INVALID_JSON",
        ),
        (
            b"Content-Length: 2048\r\n\r\n".to_vec(),
            "IPC_FRAME_TOO_LARGE",
        ),
    ];
    for (bad, reason) in cases {
        let workspace = TestWorkspace::new();
        let mut child = spawn_stdio(&workspace, &["--max-frame", "1024"]);
        let mut stdin = child.0.stdin.take().unwrap();
        stdin
            .write_all(&frame(&request("ok", "system.ping")))
            .unwrap();
        stdin.write_all(&bad).unwrap();
        drop(stdin);
        let (code, stdout, stderr) = finish(child);
        assert_eq!(code, 1, "{reason}: {stderr}");
        assert!(stderr.contains("invalid frame"), "{reason}: {stderr}");
        let frames = frames(&stdout);
        let error = frames
            .iter()
            .find(|f| f["event"] == "core.error")
            .unwrap_or_else(|| panic!("{reason}: no core.error in {frames:?}"));
        assert_eq!(error["data"]["error"]["code"], "RPC_FRAME_INVALID");
        assert_eq!(error["data"]["error"]["details"]["reason"], reason);
        assert_eq!(
            frames.last().unwrap()["data"]["state"],
            "closed",
            "{reason}: the host still drains"
        );
    }
}

#[test]
fn an_unsupported_runtime_selection_is_a_usage_error_before_anything_starts() {
    for runtime in ["whisper.cpp", "stable-diffusion.cpp", "onnx"] {
        let workspace = TestWorkspace::new();
        let output = support::run(
            workspace
                .arcane()
                .args(["--output", "json", "core", "--stdio", "--runtime", runtime])
                .stdin(Stdio::null()),
        );
        assert_eq!(output.status.code(), Some(2), "{runtime}");
        let error = &support::json(&output)["error"];
        assert_eq!(error["code"], "ARCANE_USAGE");
        assert_eq!(error["details"]["runtime"], runtime);
        assert!(!workspace.path().join(".arcane/core.json").exists());
    }
}

#[test]
fn client_commands_without_a_running_host_say_so() {
    let workspace = TestWorkspace::new();
    for args in [vec!["status"], vec!["chat", "hello"]] {
        let output = support::run(workspace.arcane().arg("--output").arg("json").args(&args));
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        assert_eq!(support::json(&output)["error"]["code"], "CORE_NOT_RUNNING");
    }
}
