//! The shared host: `arcane core --stdio` on a workspace whose `arcane serve` runs
//! becomes a bridge. Three bridges on one host with the real llama-server: they see
//! the same engine, chat concurrently, see one another's unload and load as events;
//! killing one leaves the host and the others untouched; killing the host ends the
//! others within seconds, saying why.

use std::io::{BufReader, Read, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::serve::{real_socket_args, signal, strs, wait_host_ready, Serve, START};
use crate::support::{json as json_of, run, TestWorkspace};

/// One `arcane core --stdio` bridge: frames in, frames out on a channel.
struct Bridge {
    child: Child,
    stdin: Option<ChildStdin>,
    frames: mpsc::Receiver<Value>,
    seen: Vec<Value>,
}

impl Bridge {
    fn start(ws: &TestWorkspace) -> Bridge {
        let mut child = ws
            .arcane()
            .args(["core", "--stdio"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a bridge");
        let stdout = child.stdout.take().expect("its stdout");
        let (sender, frames) = mpsc::channel();
        std::thread::spawn(move || read_frames(stdout, &sender));
        let stdin = child.stdin.take();
        Bridge {
            child,
            stdin,
            frames,
            seen: Vec::new(),
        }
    }

    fn send(&mut self, id: &str, method: &str, parameters: Value) {
        let body = json!({"protocol": "arcane/1", "type": "request", "id": id, "method": method, "parameters": parameters}).to_string();
        let stdin = self.stdin.as_mut().expect("stdin open");
        write!(stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).expect("write a frame");
        stdin.flush().expect("flush");
    }

    /// Waits (bounded) for a frame that passes `pred`, keeping every frame seen.
    fn wait_for(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(found) = self.seen.iter().find(|f| pred(f)) {
            return found.clone();
        }
        let deadline = Instant::now() + START;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let frame = self
                .frames
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("the bridge never sent {what}"));
            self.seen.push(frame.clone());
            if pred(&frame) {
                return frame;
            }
        }
    }

    fn response(&mut self, id: &str) -> Value {
        self.wait_for(&format!("the response `{id}`"), |f| {
            f["type"] == "response" && f["id"] == id
        })
    }

    fn event(&mut self, event: &str) -> Value {
        self.wait_for(&format!("the event `{event}`"), |f| f["event"] == event)
    }

    /// Waits (bounded) for the bridge to exit; its code and stderr.
    fn exit(&mut self, within: Duration) -> (Option<i32>, String) {
        let status = crate::support::wait_for_exit(&mut self.child, within, "the bridge");
        let mut err = String::new();
        if let Some(mut stderr) = self.child.stderr.take() {
            let _ = stderr.read_to_string(&mut err);
        }
        (status.code(), err)
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Decodes `Content-Length` frames from `stdout` until it ends.
fn read_frames(stdout: impl Read, sender: &mpsc::Sender<Value>) {
    let mut reader = BufReader::new(stdout);
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let Ok(n) = reader.read(&mut chunk) else {
            return;
        };
        if n == 0 {
            return;
        }
        buffer.extend_from_slice(&chunk[..n]);
        while let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let header = String::from_utf8_lossy(&buffer[..end]).to_string();
            let length: usize = header
                .trim()
                .strip_prefix("Content-Length: ")
                .and_then(|l| l.parse().ok())
                .expect("a Content-Length header");
            if buffer.len() < end + 4 + length {
                break;
            }
            let body: Vec<u8> = buffer[end + 4..end + 4 + length].to_vec();
            buffer.drain(..end + 4 + length);
            if let Ok(frame) = serde_json::from_slice(&body) {
                if sender.send(frame).is_err() {
                    return;
                }
            }
        }
    }
}

/// The engine pid a `localai.status` answer names.
fn engine_pid(answer: &Value) -> u64 {
    answer["result"]["runtimes"][0]["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no engine pid in {answer}"))
}

#[test]
fn three_bridges_share_one_host_and_end_with_it() {
    let ws = TestWorkspace::new();
    let mut args = real_socket_args();
    args.extend(["--alias".into(), "smol".into()]);
    let mut serve = Serve::start(&ws, &strs(&args));
    serve.wait_for("local-ai.server.ready", START);
    wait_host_ready(&ws);
    let mut bridges: Vec<Bridge> = (0..3).map(|_| Bridge::start(&ws)).collect();

    // One host, one engine: every bridge sees the same pid.
    let pids: Vec<u64> = bridges
        .iter_mut()
        .enumerate()
        .map(|(n, bridge)| {
            let id = format!("status-{n}");
            bridge.send(&id, "localai.status", json!({}));
            engine_pid(&bridge.response(&id))
        })
        .collect();
    assert!(pids.iter().all(|pid| *pid == pids[0]), "{pids:?}");
    let ps = json_of(&run(ws.arcane().args(["--output", "json", "ps"])));
    assert_eq!(ps["models"][0]["pid"].as_u64(), Some(pids[0]), "{ps}");

    // Three chats at once, each streamed to its own bridge only.
    for (n, bridge) in bridges.iter_mut().enumerate() {
        let messages = json!([{"role": "user", "content": format!("Say the number {n}.")}]);
        let parameters =
            json!({"model": "smol", "messages": messages, "max_tokens": 8, "stream": true});
        bridge.send(&format!("chat-{n}"), "llama.chat", parameters);
    }
    for (n, bridge) in bridges.iter_mut().enumerate() {
        let id = format!("chat-{n}");
        let answer = bridge.response(&id);
        assert_eq!(answer["ok"], true, "{answer}");
        assert_eq!(answer["result"]["model"], "smol", "{answer}");
        let chunks: Vec<&Value> = bridge
            .seen
            .iter()
            .filter(|f| f["event"] == "llama.chunk")
            .collect();
        assert!(!chunks.is_empty(), "bridge {n} got its chunks");
        assert!(
            chunks.iter().all(|c| c["requestId"] == id.as_str()),
            "only its own: {chunks:?}"
        );
    }

    // One bridge's unload and load are events every other bridge sees.
    bridges[0].send("unload", "models.unload", json!({"model": "smol"}));
    assert_eq!(bridges[0].response("unload")["ok"], true);
    for bridge in &mut bridges[1..] {
        let unloaded = bridge.event("local-ai.model.stopped");
        assert_eq!(unloaded["data"]["model"], "smol");
    }
    bridges[1].send("load", "models.load", json!({"model": "smol"}));
    assert_eq!(bridges[1].response("load")["ok"], true);
    for n in [0, 2] {
        let ready = bridges[n].wait_for("the new engine ready", |f| {
            f["event"] == "local-ai.model.ready" && f["data"]["model"] == "smol"
        });
        assert!(ready["data"]["pid"].as_u64().is_some(), "{ready}");
    }

    // Killing a bridge leaves the host and the other bridges as they were.
    signal(bridges[2].child.id(), "KILL");
    bridges[2].exit(Duration::from_secs(10));
    for (n, bridge) in bridges[..2].iter_mut().enumerate() {
        let id = format!("ping-{n}");
        bridge.send(&id, "system.ping", json!({}));
        assert_eq!(bridge.response(&id)["ok"], true);
    }
    let ps = run(ws.arcane().args(["ps"]));
    assert!(ps.status.success(), "the host still answers");

    // Killing the host ends the other bridges within seconds, saying why.
    signal(serve.pid(), "KILL");
    for bridge in &mut bridges[..2] {
        let (code, stderr) = bridge.exit(Duration::from_secs(15));
        assert_eq!(code, Some(1), "{stderr}");
        assert!(
            stderr.contains("ended; this bridge ends with it"),
            "{stderr}"
        );
    }
}

/// End of input ends only the bridge: the host keeps serving.
#[test]
fn a_bridge_that_ends_its_input_leaves_the_host_running() {
    let ws = TestWorkspace::new();
    let mut args = real_socket_args();
    args.extend(["--alias".into(), "smol".into()]);
    let mut serve = Serve::start(&ws, &strs(&args));
    serve.wait_for("local-ai.server.ready", START);
    wait_host_ready(&ws);
    let mut bridge = Bridge::start(&ws);
    // The bridge receives the replay an HTTP client would, first of all.
    bridge.event("core.ready");
    bridge.send("p", "system.ping", json!({}));
    assert_eq!(bridge.response("p")["ok"], true);
    drop(bridge.stdin.take());
    let (code, stderr) = bridge.exit(Duration::from_secs(15));
    assert_eq!(code, Some(0), "{stderr}");
    let status = run(ws.arcane().args(["--output", "json", "status"]));
    assert!(status.status.success(), "the host is still there");
    serve.terminate();
}

/// A host on stdio only has no endpoint to join: a second `core --stdio` says so
/// (after the host's grace to write `core.json`), and the first is untouched.
#[test]
fn a_stdio_only_host_cannot_be_joined_and_the_bridge_says_why() {
    let ws = TestWorkspace::new();
    // The first `core --stdio` on a free workspace is the host itself.
    let mut host = Bridge::start(&ws);
    host.event("core.ready");
    let second = run(ws
        .arcane()
        .args(["--output", "json", "core", "--stdio"])
        .stdin(Stdio::null()));
    assert!(!second.status.success());
    let error = json_of(&second);
    assert_eq!(error["error"]["code"], "CORE_NOT_RUNNING", "{error}");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("a bridge joins an `arcane serve` host"),
        "{error}"
    );
    host.send("p", "system.ping", json!({}));
    assert_eq!(
        host.response("p")["ok"],
        true,
        "the first host still answers"
    );
}
