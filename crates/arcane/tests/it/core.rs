//! Tests of the Core host through the real binary: `arcane core --stdio` on real pipes,
//! and `arcane serve` with `arcane status` / `arcane chat` against the real
//! `llama-server` and SmolLM2.

use std::io::{Read, Write};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::serve::free_port;
use crate::support::{self, TestWorkspace};

/// A child killed (and reaped) on drop, also on panic.
pub(crate) struct Guard(pub(crate) Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn frame(value: &Value) -> Vec<u8> {
    raw_frame(&value.to_string())
}

/// One frame with a raw body.
fn raw_frame(body: &str) -> Vec<u8> {
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
    let reader = StdoutReader::start(&mut guard);
    finish_reading(guard, reader)
}

/// [`finish`] for a child whose stdout a [`StdoutReader`] already reads.
fn finish_reading(mut guard: Guard, reader: StdoutReader) -> (i32, Vec<u8>, String) {
    let mut stderr = String::new();
    guard
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = support::wait_for_exit(&mut guard.0, Duration::from_secs(60), "arcane core");
    (status.code().unwrap_or(-1), reader.rest(), stderr)
}

/// The child's stdout, read on a thread, so a test can wait (bounded) for the frames it
/// needs before it ends the input, and still get every byte afterwards.
struct StdoutReader {
    chunks: std::sync::mpsc::Receiver<Vec<u8>>,
    bytes: Vec<u8>,
}

impl StdoutReader {
    fn start(guard: &mut Guard) -> Self {
        let mut pipe = guard.0.stdout.take().unwrap();
        let (sender, chunks) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut buffer) {
                if sender.send(buffer[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        StdoutReader {
            chunks,
            bytes: Vec::new(),
        }
    }

    /// Waits (at most 60 s) until a response to each of `ids` has arrived.
    fn wait_responses(&mut self, ids: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let complete = complete_frames(&self.bytes);
            if ids.iter().all(|id| {
                complete
                    .iter()
                    .any(|f| f["type"] == "response" && f["id"] == *id)
            }) {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.chunks.recv_timeout(left) {
                Ok(chunk) => self.bytes.extend(chunk),
                Err(_) => panic!(
                    "no responses to {ids:?} in time: {}",
                    String::from_utf8_lossy(&self.bytes)
                ),
            }
        }
    }

    /// Every byte, once the child closed its stdout.
    fn rest(mut self) -> Vec<u8> {
        while let Ok(chunk) = self.chunks.recv_timeout(Duration::from_secs(60)) {
            self.bytes.extend(chunk);
        }
        self.bytes
    }
}

/// The complete frames at the start of `bytes` (a partial last frame is left out).
fn complete_frames(mut bytes: &[u8]) -> Vec<Value> {
    let mut frames = Vec::new();
    while let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
        let Some(length) = std::str::from_utf8(&bytes[..end])
            .ok()
            .and_then(|h| h.strip_prefix("Content-Length: "))
            .and_then(|l| l.parse::<usize>().ok())
        else {
            break;
        };
        let Some(body) = bytes.get(end + 4..end + 4 + length) else {
            break;
        };
        frames.extend(serde_json::from_slice::<Value>(body).ok());
        bytes = &bytes[end + 4 + length..];
    }
    frames
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
            // Not synchronisation: the pauses split the frame across reads.
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let mut both = frame(&request("b", "version.current"));
    both.extend(frame(&request("c", "nosuch.method")));
    stdin.write_all(&both).unwrap();
    // End the input only once the host answered (EOF cancels request work).
    let mut reader = StdoutReader::start(&mut child);
    reader.wait_responses(&["a", "b", "c"]);
    drop(stdin);
    let (code, stdout, stderr) = finish_reading(child, reader);
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

/// Issue 10, item 12: valid JSON that is not an object is answered `ok:false` and the
/// transport stays open (docs/protocol.md), so a later request is still answered.
#[test]
fn stdio_answers_non_object_json_frames_and_stays_open() {
    let workspace = TestWorkspace::new();
    let mut child = spawn_stdio(&workspace, &[]);
    let mut stdin = child.0.stdin.take().unwrap();
    for body in ["[1]", "\"hi\"", "null"] {
        stdin.write_all(&raw_frame(body)).unwrap();
    }
    stdin
        .write_all(&frame(&request("after", "system.ping")))
        .unwrap();
    stdin.flush().unwrap();
    // End the input only once the host answered the last request.
    let mut reader = StdoutReader::start(&mut child);
    reader.wait_responses(&["after"]);
    drop(stdin);
    let (code, stdout, stderr) = finish_reading(child, reader);
    assert_eq!(code, 0, "the transport must not fail: {stderr}");
    let frames = frames(&stdout);
    let refusals: Vec<&Value> = frames
        .iter()
        .filter(|f| f["type"] == "response" && f["ok"] == false)
        .collect();
    assert_eq!(refusals.len(), 3, "{frames:?}");
    for refusal in refusals {
        assert_eq!(refusal["error"]["code"], "RPC_FRAME_INVALID");
    }
    assert!(
        !frames.iter().any(|f| f["event"] == "core.error"),
        "no transport error: {frames:?}"
    );
    let ping = frames
        .iter()
        .find(|f| f["type"] == "response" && f["id"] == "after")
        .unwrap_or_else(|| panic!("the request after them was not answered: {frames:?}"));
    assert_eq!(ping["result"], json!({"ok": true}));
}

#[test]
fn an_unsupported_runtime_selection_is_a_usage_error_before_anything_starts() {
    let runtime = "nemo-speech";
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

#[test]
fn client_commands_without_a_running_host_say_so() {
    let workspace = TestWorkspace::new();
    for args in [vec!["status"], vec!["chat", "hello"]] {
        let output = support::run(workspace.arcane().arg("--output").arg("json").args(&args));
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        assert_eq!(support::json(&output)["error"]["code"], "CORE_NOT_RUNNING");
    }
}

/// `arcane serve` on the real llama-server and SmolLM2 (engine and host on free ports),
/// killed on drop; `ready` returns once `arcane status` reports the engine ready.
struct Served {
    child: Guard,
    workspace: TestWorkspace,
    engine_url: String,
}

impl Served {
    fn start() -> Self {
        let workspace = TestWorkspace::new();
        Self::start_in(workspace)
    }

    fn start_in(workspace: TestWorkspace) -> Self {
        let engine_url = format!("http://127.0.0.1:{}", free_port());
        let child = workspace
            .arcane()
            .arg("serve")
            .arg("--executable")
            .arg(support::llama_server())
            .arg("--model")
            .arg(support::smollm2())
            .args([
                "--device",
                "cpu",
                "--url",
                &engine_url,
                "--port",
                &free_port().to_string(),
                // In-flight completions must finish even on a loaded machine.
                "--drain-timeout",
                "300",
            ])
            .args([
                "--",
                "--ctx-size",
                "8192",
                "--parallel",
                "1",
                "--threads",
                "2",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn arcane serve");
        let served = Self {
            child: Guard(child),
            workspace,
            engine_url,
        };
        served.wait_ready();
        served
    }

    fn status(&self) -> Option<Value> {
        let output = support::run(self.workspace.arcane().args(["--output", "json", "status"]));
        output.status.success().then(|| support::json(&output))
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = self.status() {
                if status["engines"][0]["state"] == "ready" {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "arcane serve did not become ready"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn endpoint(&self) -> Value {
        serde_json::from_slice(
            &std::fs::read(self.workspace.path().join(".arcane/core.json")).unwrap(),
        )
        .unwrap()
    }
}

/// Whether nothing holds the Core owner lease (`.arcane/core.lock`, which stays as
/// the lease's sentinel).
fn owner_lease_is_free(workspace: &std::path::Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(file) = std::fs::File::open(workspace.join(".arcane/core.lock")) else {
        return true;
    };
    // SAFETY: flock on a descriptor we own; closing the file releases the probe.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

fn process_exists(pid: i64) -> bool {
    // SAFETY: signal 0 only checks for existence (kill(2)).
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// One raw HTTP/1.1 request with `Connection: close`; status and body.
fn http(port: u64, request: &str) -> (u16, String) {
    support::http_exchange(&format!("127.0.0.1:{port}"), request)
}

#[test]
fn serve_then_status_chat_passthrough_and_a_second_serve() {
    let served = Served::start();
    let endpoint = served.endpoint();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(served.workspace.path().join(".arcane/core.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // `arcane status` (human) names the engine, its state and ownership.
    let output = support::run(served.workspace.arcane().arg("status"));
    let text = support::stdout(&output);
    assert!(output.status.success(), "{}", support::stderr(&output));
    assert!(text.contains(endpoint["url"].as_str().unwrap()), "{text}");
    assert!(
        text.contains("llama.cpp") && text.contains("ready") && text.contains("owned"),
        "{text}"
    );

    // `arcane chat` streams an answer.
    let output = support::run(served.workspace.arcane().args([
        "chat",
        "Say hello.",
        "--max-tokens",
        "12",
        "--temperature",
        "0",
    ]));
    assert!(output.status.success(), "{}", support::stderr(&output));
    assert!(!support::stdout(&output).trim().is_empty());
    let output = support::run(served.workspace.arcane().args([
        "--output",
        "json",
        "chat",
        "Say hello.",
        "--max-tokens",
        "12",
        "--temperature",
        "0",
    ]));
    let answer = support::json(&output)["answer"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!answer.is_empty());

    // The passthrough with the token, as curl would send it; refused without.
    let port = endpoint["port"].as_u64().unwrap();
    let body = json!({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 12, "temperature": 0}).to_string();
    let request = |auth: &str| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let (status, reply) = http(
        port,
        &request(&format!(
            "Authorization: Bearer {}\r\n",
            endpoint["token"].as_str().unwrap()
        )),
    );
    assert_eq!(status, 200, "{reply}");
    assert!(
        reply.contains(&answer.replace('\n', "\\n")) || reply.contains("chat.completion"),
        "{reply}"
    );
    assert_eq!(http(port, &request("")).0, 401);

    // A second `arcane serve` on the same workspace reports the first and exits 75.
    let output =
        support::run(
            served
                .workspace
                .arcane()
                .args(["serve", "--port", &free_port().to_string()]),
        );
    assert_eq!(
        output.status.code(),
        Some(75),
        "{}",
        support::stderr(&output)
    );
    let stderr = support::stderr(&output);
    assert!(
        stderr.contains(endpoint["url"].as_str().unwrap()),
        "{stderr}"
    );
    assert!(stderr.contains(&endpoint["pid"].to_string()), "{stderr}");
    // …and did not disturb it.
    assert_eq!(served.status().unwrap()["engines"][0]["state"], "ready");

    // `llama.unload` stops the owned engine; `llama.load` starts it again.
    let engine_pid = served.status().unwrap()["engines"][0]["pid"]
        .as_i64()
        .expect("owned");
    let rpc = |id: &str, method: &str| {
        let frame = json!({"protocol": "arcane/1", "type": "request", "id": id, "method": method, "parameters": {}}).to_string();
        let (status, reply) = http(
            port,
            &format!(
                "POST /v1/rpc HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{frame}",
                endpoint["token"].as_str().unwrap(),
                frame.len()
            ),
        );
        assert_eq!(status, 200, "{reply}");
        serde_json::from_str::<Value>(&reply).unwrap()
    };
    // The SDK's `{released, unloaded}`, beside the gateway's row of the model.
    let unloaded = rpc("u", "llama.unload")["result"].clone();
    assert_eq!(
        (&unloaded["released"], &unloaded["unloaded"]),
        (&json!(true), &json!(true)),
        "{unloaded}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while process_exists(engine_pid) {
        assert!(
            Instant::now() < deadline,
            "the unloaded engine kept running"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(served.status().unwrap()["engines"][0]["state"], "stopped");
    let loaded = rpc("l", "llama.load");
    assert_eq!(loaded["result"]["loaded"], true, "{loaded}");
    let again = served.status().unwrap();
    assert_eq!(again["engines"][0]["state"], "ready");
    assert_ne!(again["engines"][0]["pid"].as_i64(), Some(engine_pid));
    let _ = served.engine_url;
}

#[test]
fn sigterm_during_a_streaming_request_drains_and_leaves_no_process_behind() {
    let mut served = Served::start();
    let status = served.status().unwrap();
    let engine_pid = status["engines"][0]["pid"]
        .as_i64()
        .expect("the engine is owned");
    let endpoint = served.endpoint();
    let port = endpoint["port"].as_u64().unwrap();
    // A streamed chat through the passthrough, short enough to finish within the drain.
    let body = json!({"messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 120, "stream": true}).to_string();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port as u16)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(300)))
        .unwrap();
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        endpoint["token"].as_str().unwrap(),
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 1024];
    let n = stream.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).contains("200 OK"));
    // SIGTERM the host mid-stream.
    let pid = served.child.0.id() as libc::pid_t;
    // SAFETY: sending SIGTERM to the child this test spawned.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    // Bounded by the drain deadline it was started with (`--drain-timeout 300`): on a
    // loaded machine the 120 tokens may take longer than a minute to finish.
    let code = support::wait_for_exit(
        &mut served.child.0,
        Duration::from_secs(330),
        "arcane serve (after SIGTERM)",
    )
    .code();
    let mut stderr = String::new();
    served
        .child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(code, Some(0), "{stderr}");
    // The owned engine is gone, and so are the endpoint record and owner lock.
    let deadline = Instant::now() + Duration::from_secs(30);
    while process_exists(engine_pid) {
        assert!(
            Instant::now() < deadline,
            "llama-server (pid {engine_pid}) outlived arcane serve"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!served.workspace.path().join(".arcane/core.json").exists());
    assert!(
        owner_lease_is_free(served.workspace.path()),
        "the owner lease is still held"
    );
    // The drain let the stream finish: it ends with its final event.
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    let whole = [&first[..n], &rest[..]].concat();
    let whole = String::from_utf8_lossy(&whole);
    assert!(whole.contains("data: [DONE]"), "{whole}");
}

/// A minimal stand-in for an Ollama already running (answers every request with a
/// version), so `arcane serve --runtime ollama` adopts it and starts nothing.
pub(crate) fn fake_ollama() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut buffer = [0u8; 4096];
                let _ = stream.read(&mut buffer);
                let body = r#"{"version":"0.9.0","models":[]}"#;
                let _ = write!(stream, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            });
        }
    });
    url
}

/// `arcane serve` adopting a stand-in Ollama: a quick host to exercise the listener.
fn serve_without_engine(workspace: &TestWorkspace) -> Guard {
    let child = workspace
        .arcane()
        .args(["serve", "--runtime", "ollama", "--url", &fake_ollama()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn arcane serve");
    Guard(child)
}

pub(crate) fn wait_for_endpoint(workspace: &TestWorkspace, child: &mut Guard) -> Value {
    let path = workspace.path().join(".arcane/core.json");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(bytes) = std::fs::read(&path) {
            if let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
                // And its engine adopted: a host stopped while its engine still starts
                // exits 130, not 0, and the callers stop it next.
                crate::serve::wait_host_ready(workspace);
                return value;
            }
        }
        if let Some(status) = child.0.try_wait().unwrap() {
            let mut stderr = String::new();
            child
                .0
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut stderr)
                .unwrap();
            panic!("arcane serve exited early ({status}): {stderr}");
        }
        assert!(Instant::now() < deadline, "no core.json");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn terminate(mut child: Guard) -> Option<i32> {
    // SAFETY: sending SIGTERM to the child this test spawned.
    unsafe { libc::kill(child.0.id() as libc::pid_t, libc::SIGTERM) };
    support::wait_for_exit(
        &mut child.0,
        Duration::from_secs(60),
        "arcane serve (after SIGTERM)",
    )
    .code()
}

#[test]
fn the_port_is_chosen_once_and_a_busy_saved_port_is_an_error() {
    let workspace = TestWorkspace::new();
    let mut first = serve_without_engine(&workspace);
    let endpoint = wait_for_endpoint(&workspace, &mut first);
    let port = endpoint["port"].as_u64().unwrap() as u16;
    assert_eq!(terminate(first), Some(0));
    assert!(!workspace.path().join(".arcane/core.json").exists());
    // Something else takes the saved port: the host refuses to move.
    let squatter = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let output = support::run(workspace.arcane().args([
        "--output",
        "json",
        "serve",
        "--runtime",
        "ollama",
        "--url",
        "http://127.0.0.1:9",
    ]));
    assert_eq!(output.status.code(), Some(1));
    let error = &support::json(&output)["error"];
    assert_eq!(error["code"], "CORE_PORT_IN_USE");
    assert_eq!(error["details"]["port"], port);
    drop(squatter);
    // Freed again: the same port, and the same token (kept across restarts).
    let mut again = serve_without_engine(&workspace);
    let second = wait_for_endpoint(&workspace, &mut again);
    assert_eq!(second["port"], port);
    assert_eq!(second["token"], endpoint["token"]);
    assert_eq!(terminate(again), Some(0));
}

#[test]
fn no_content_of_core_lock_keeps_a_workspace_stuck() {
    // Issue: an empty `core.lock` (a crash between create and write) made every later
    // `arcane serve` fail with "the owner lock keeps changing"; one naming a live
    // unrelated pid made it report a running host, forever.
    let mut unrelated = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let contents = [
        String::new(),
        format!(
            r#"{{"pid":{},"nonce":"x","startedAt":"2026-01-01T00:00:00Z"}}"#,
            unrelated.id()
        ),
    ];
    for content in contents {
        let workspace = TestWorkspace::new();
        std::fs::create_dir_all(workspace.path().join(".arcane")).unwrap();
        std::fs::write(workspace.path().join(".arcane/core.lock"), &content).unwrap();
        let mut child = serve_without_engine(&workspace);
        let endpoint = wait_for_endpoint(&workspace, &mut child);
        assert_eq!(endpoint["pid"], child.0.id(), "{content:?}");
        assert_eq!(terminate(child), Some(0), "{content:?}");
    }
    let _ = unrelated.kill();
    let _ = unrelated.wait();
}

#[test]
fn core_stdio_next_to_a_running_host_joins_it_and_leaves_its_engine_alone() {
    // Issue: `arcane core --stdio` next to `arcane serve` started a second engine,
    // overwrote serve's ownership record and deleted it on exit. It now joins the
    // running host as a bridge: the same engine, no record touched.
    let served = Served::start();
    let records = served.workspace.path().join(".arcane/engines");
    let snapshot = |dir: &std::path::Path| {
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| {
                        (
                            e.file_name().to_string_lossy().into_owned(),
                            std::fs::read(e.path()).unwrap_or_default(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        files
    };
    let before = snapshot(&records);
    assert!(!before.is_empty(), "serve keeps an ownership record");
    let mut stdio = Guard(
        served
            .workspace
            .arcane()
            .args(["core", "--stdio"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut reader = StdoutReader::start(&mut stdio);
    let mut input = stdio.0.stdin.take().unwrap();
    input
        .write_all(&frame(&request("s", "localai.status")))
        .unwrap();
    // End of input once it is answered (end of input cancels request-lifetime work,
    // as for a host): the bridge then ends alone.
    reader.wait_responses(&["s"]);
    drop(input);
    let (code, out, stderr) = finish_reading(stdio, reader);
    assert_eq!(code, 0, "{stderr}");
    let answers = frames(&out);
    let answer = answers
        .iter()
        .find(|f| f["type"] == "response" && f["id"] == "s")
        .unwrap_or_else(|| panic!("no answer in {answers:?}"));
    let engine = &answer["result"]["runtimes"][0];
    assert_eq!(engine["url"], served.engine_url.as_str(), "{answer}");
    assert!(engine["pid"].as_u64().is_some(), "{answer}");
    assert_eq!(
        snapshot(&records),
        before,
        "the ownership records were touched"
    );
    assert!(served.status().is_some(), "the running host still answers");
}

#[test]
fn a_core_json_left_by_a_dead_host_is_never_trusted() {
    // Issue: a `core.json` left by a dead host whose port a silent listener now holds
    // made `arcane status` hang, and sent that listener the bearer token.
    let workspace = TestWorkspace::new();
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = squatter.local_addr().unwrap().port();
    std::fs::create_dir_all(workspace.path().join(".arcane")).unwrap();
    let record = json!({
        "protocol": "arcane/1", "url": format!("http://127.0.0.1:{port}"), "host": "127.0.0.1",
        "port": port, "pid": std::process::id(), "token": "f".repeat(64),
        "startedAt": "2026-01-01T00:00:00.000Z"
    });
    std::fs::write(
        workspace.path().join(".arcane/core.json"),
        record.to_string(),
    )
    .unwrap();
    for command in [vec!["status"], vec!["chat", "hello"]] {
        let mut child = workspace
            .arcane()
            .args(["--output", "json"])
            .args(&command)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = support::wait_for_exit(&mut child, Duration::from_secs(30), command[0]);
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert!(!status.success(), "{out}");
        assert!(out.contains("CORE_NOT_RUNNING"), "{command:?}: {out}");
    }
    squatter.set_nonblocking(true).unwrap();
    assert!(
        squatter.accept().is_err(),
        "a client connected to the squatter (and would have sent the token)"
    );
}

/// A process held stopped (SIGSTOP) until dropped, which continues it (SIGCONT), also
/// on panic, so it can be cleaned up.
struct Stopped(libc::pid_t);

impl Stopped {
    fn new(pid: i64) -> Self {
        let pid = pid as libc::pid_t;
        // SAFETY: stopping a process this test started (directly or through `serve`).
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: continuing the process `new` stopped.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// Runs an `arcane` client command to its end, bounded: a hang fails the test.
fn client(served: &Served, args: &[&str]) -> std::process::Output {
    let child = served
        .workspace
        .arcane()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn arcane");
    let mut guard = Guard(child);
    let read = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = read(
        guard
            .0
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = read(
        guard
            .0
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let status = support::wait_for_exit(&mut guard.0, Duration::from_secs(60), &args.join(" "));
    std::process::Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// Whether `pid` has an established TCP connection to `port` on the loopback (its
/// socket descriptors matched against `/proc/net/tcp{,6}`).
fn connected_to(pid: u32, port: u16) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let inodes: Vec<String> = fds
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    let remote = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                // rem_address, st (01 = ESTABLISHED), inode.
                fields.len() > 9
                    && fields[2].ends_with(&remote)
                    && fields[3] == "01"
                    && inodes.iter().any(|inode| inode == fields[9])
            })
    })
}

/// Starts an `arcane` client command that will wait on a stopped peer, sends it one
/// SIGTERM while it waits, and returns its exit code (bounded: a client that ignores
/// the signal fails the test).
fn terminate_waiting_client(served: &Served, args: &[&str]) -> Option<i32> {
    let child = served
        .workspace
        .arcane()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn arcane");
    let mut guard = Guard(child);
    // It waits once it is connected to the host (its signal handlers are installed
    // before it connects).
    let url = served.endpoint()["url"].as_str().unwrap().to_string();
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let pid = guard.0.id();
    support::wait_until(
        Duration::from_secs(30),
        &format!("{} to connect to the host", args.join(" ")),
        || connected_to(pid, port),
    );
    // SAFETY: SIGTERM to the child this test spawned.
    assert_eq!(
        unsafe { libc::kill(guard.0.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    support::wait_for_exit(
        &mut guard.0,
        Duration::from_secs(30),
        &format!("{} after one SIGTERM", args.join(" ")),
    )
    .code()
}

#[test]
fn a_stopped_engine_hangs_neither_status_nor_chat() {
    let served = Served::start();
    let engine = served.status().unwrap()["engines"][0]["pid"]
        .as_i64()
        .expect("the engine is owned");
    let _stopped = Stopped::new(engine);

    // `status` answers from the host's state, without asking the engine.
    let output = client(&served, &["--output", "json", "status"]);
    assert!(output.status.success(), "{}", support::stderr(&output));
    let status = support::json(&output);
    assert_eq!(status["engines"][0]["state"], "ready");
    assert!(!status["engines"][0]["models"]
        .as_array()
        .unwrap()
        .is_empty());

    // `chat` fails with the deadline error instead of hanging.
    let output = client(
        &served,
        &["--output", "json", "chat", "Hello", "--timeout", "2"],
    );
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        support::stderr(&output)
    );
    let error = &support::json(&output)["error"];
    assert_eq!(error["code"], "CORE_TIMEOUT", "{error}");
    let url = format!(
        "{}/v1/chat/completions",
        served.endpoint()["url"].as_str().unwrap()
    );
    assert_eq!(error["details"]["url"], url.as_str());
    assert_eq!(error["details"]["deadlineSeconds"], 2.0);
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains(&url) && message.contains("2 s"),
        "{message}"
    );
    assert!(!error["hints"].as_array().unwrap().is_empty());

    // A chat that waits on the stopped engine ends on one SIGTERM.
    assert_eq!(
        terminate_waiting_client(&served, &["chat", "Hello", "--timeout", "600"]),
        Some(130)
    );
}

#[test]
fn a_stopped_host_is_a_deadline_error_and_one_sigterm_ends_a_waiting_status() {
    let served = Served::start();
    let host = served.endpoint()["pid"].as_i64().unwrap();
    let _stopped = Stopped::new(host);

    let output = client(&served, &["--output", "json", "status", "--timeout", "1"]);
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        support::stderr(&output)
    );
    let error = &support::json(&output)["error"];
    assert_eq!(error["code"], "CORE_TIMEOUT", "{error}");
    let url = format!("{}/v1/health", served.endpoint()["url"].as_str().unwrap());
    assert!(error["message"].as_str().unwrap().contains(&url), "{error}");

    assert_eq!(
        terminate_waiting_client(&served, &["status", "--timeout", "600"]),
        Some(130)
    );
    assert_eq!(
        terminate_waiting_client(&served, &["chat", "Hello", "--timeout", "600"]),
        Some(130)
    );
}

/// Issue 10, item 8: under `--output json|ndjson` a command line clap refuses is the
/// same JSON error as every other failure (`ARCANE_USAGE`, exit 2), wherever `--output`
/// stands; without it, clap's own text.
#[test]
fn usage_errors_are_json_under_machine_output_modes() {
    let workspace = TestWorkspace::new();
    let cases: [(&[&str], &str); 3] = [
        (&["--output", "json", "model", "lis"], "json"),
        (&["lock", "run", "--bogus", "--output", "json"], "json"),
        (
            &["serve", "--restart", "sometimes", "--output=ndjson"],
            "ndjson",
        ),
    ];
    for (args, mode) in cases {
        let output = support::run(workspace.arcane().args(args));
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let value = support::json(&output);
        let error = if mode == "ndjson" {
            assert_eq!(value["type"], "error", "{value}");
            &value["error"]
        } else {
            &value["error"]
        };
        assert_eq!(error["code"], "ARCANE_USAGE", "{args:?}: {value}");
        assert!(error["message"].is_string(), "{value}");
    }
    let output = support::run(
        workspace
            .arcane()
            .args(["--output", "json", "model", "lis"]),
    );
    assert_eq!(output.status.code(), Some(2));
    // The whole error, with its hint naming `list`.
    insta::assert_snapshot!(
        "usage_error_misspelt_subcommand_json",
        workspace.redactions().json(&support::json(&output))
    );
    let output = support::run(workspace.arcane().args(["model", "lis"]));
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty());
    insta::assert_snapshot!(
        "usage_error_misspelt_subcommand",
        workspace.redact(&support::stderr(&output))
    );
}

#[test]
fn the_token_survives_restarts_rotation_takes_effect_at_once_and_a_user_key_is_honoured() {
    use std::os::unix::fs::PermissionsExt;
    let workspace = TestWorkspace::new();
    let health = |endpoint: &Value, token: &str| {
        http(
            endpoint["port"].as_u64().unwrap(),
            &format!(
                "GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n",
                endpoint["port"]
            ),
        )
        .0
    };
    // 1. Two runs, one token; `token show` prints it; the file is private.
    let mut first = serve_without_engine(&workspace);
    let token = wait_for_endpoint(&workspace, &mut first)["token"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(terminate(first), Some(0));
    let mut second = serve_without_engine(&workspace);
    let endpoint = wait_for_endpoint(&workspace, &mut second);
    assert_eq!(
        endpoint["token"],
        token.as_str(),
        "the token changed across a restart"
    );
    let shown = support::run(workspace.arcane().args(["token", "show"]));
    assert_eq!(support::stdout(&shown).trim(), token);
    let mode = std::fs::metadata(workspace.path().join(".arcane/core-token"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    // 2. Rotation: the running host accepts only the new token, at once.
    assert_eq!(health(&endpoint, &token), 200);
    let rotated = support::run(
        workspace
            .arcane()
            .args(["--output", "json", "token", "rotate"]),
    );
    assert!(rotated.status.success(), "{}", support::stderr(&rotated));
    let new = support::json(&rotated)["token"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(new, token);
    assert_eq!(health(&endpoint, &token), 401);
    assert_eq!(health(&endpoint, &new), 200);
    let record: Value =
        serde_json::from_slice(&std::fs::read(workspace.path().join(".arcane/core.json")).unwrap())
            .unwrap();
    assert_eq!(
        record["token"],
        new.as_str(),
        "core.json names the new token"
    );
    assert_eq!(terminate(second), Some(0));
    // 3. A key of the user's own.
    let mut own = workspace
        .arcane()
        .env("ARCANE_API_KEY", "my-own-key-0123456789")
        .args(["serve", "--runtime", "ollama", "--url", &fake_ollama()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(Guard)
        .unwrap();
    let endpoint = wait_for_endpoint(&workspace, &mut own);
    assert_eq!(endpoint["token"], "my-own-key-0123456789");
    assert_eq!(health(&endpoint, "my-own-key-0123456789"), 200);
    assert_eq!(health(&endpoint, &new), 401);
    assert_eq!(terminate(own), Some(0));
}

/// `arcane core --stdio` drives pipes from its async reactor (non-blocking while it
/// runs) and leaves them in blocking mode when it exits, for whoever shares them.
#[test]
fn stdio_pipes_are_left_blocking_for_whoever_shares_them() {
    use std::os::fd::AsRawFd;
    let workspace = TestWorkspace::new();
    let (stdin_read, mut stdin_write) = std::io::pipe().unwrap();
    let (mut stdout_read, stdout_write) = std::io::pipe().unwrap();
    // The test keeps a second handle on each of the child's ends: same open file.
    let shared_in = stdin_read.try_clone().unwrap();
    let shared_out = stdout_write.try_clone().unwrap();
    let child = workspace
        .arcane()
        .args(["core", "--stdio"])
        .stdin(stdin_read)
        .stdout(stdout_write)
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn arcane core --stdio");
    let mut child = Guard(child);
    stdin_write
        .write_all(&frame(&request("a", "system.ping")))
        .unwrap();
    drop(stdin_write);
    let mut out = Vec::new();
    let reader = std::thread::spawn(move || {
        stdout_read.read_to_end(&mut out).unwrap();
        out
    });
    let status = support::wait_for_exit(&mut child.0, Duration::from_secs(60), "arcane core");
    assert!(status.success(), "{status:?}");
    let nonblocking = |fd: i32| {
        // SAFETY: F_GETFL on a descriptor this test owns.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        assert!(flags >= 0);
        flags & libc::O_NONBLOCK != 0
    };
    assert!(
        !nonblocking(shared_in.as_raw_fd()),
        "stdin left non-blocking"
    );
    assert!(
        !nonblocking(shared_out.as_raw_fd()),
        "stdout left non-blocking"
    );
    drop(shared_out);
    let frames = frames(&reader.join().unwrap());
    assert!(
        frames.iter().any(|f| f["id"] == "a" && f["ok"] == true),
        "{frames:?}"
    );
}

/// Reads frames from `stdout` until the response to `id` arrives (bounded by the host's
/// own answer; the reader blocks on the pipe, never on a timer).
fn read_until_response(stdout: &mut impl Read, id: &str) -> Value {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(found) = complete_frames(&buffer)
            .into_iter()
            .find(|f| f["type"] == "response" && f["id"] == id)
        {
            return found;
        }
        let read = stdout.read(&mut chunk).expect("read stdout");
        assert!(read > 0, "stdout closed before the response to {id}");
        buffer.extend_from_slice(&chunk[..read]);
    }
}

/// Issue 18, part 4: `arcane core --stdio` serves the workspace's `[[model]]` tables as
/// `arcane serve` does (it ignored them), and a cold model loads through it.
#[test]
fn core_stdio_serves_the_gateway_of_arcane_toml() {
    let workspace = crate::gateway::gateway_workspace(
        "[[model]]\nid = \"smol-a\"\naliases = [\"fast\"]\nmodel = \"smollm2-135m\"\n\n[[model]]\nid = \"smol-b\"\nmodel = \"{model}\"\n",
    );
    let mut child = spawn_stdio(&workspace, &[]);
    let mut stdin = child.0.stdin.take().unwrap();
    let mut stdout = child.0.stdout.take().unwrap();
    stdin
        .write_all(&frame(&request("l", "models.list")))
        .unwrap();
    let listed = read_until_response(&mut stdout, "l");
    let ids: Vec<Value> = listed["result"]["models"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(ids, [json!("smol-a"), json!("smol-b")]);
    assert!(listed["result"]["models"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["state"] == "stopped"));
    // Loading by alias starts its engine; the row says ready with a pid.
    let mut load = request("a", "models.load");
    load["parameters"] = json!({"model": "fast"});
    stdin.write_all(&frame(&load)).unwrap();
    let loaded = read_until_response(&mut stdout, "a");
    assert_eq!(loaded["result"]["id"], "smol-a", "{loaded}");
    assert_eq!(loaded["result"]["state"], "ready", "{loaded}");
    let pid = loaded["result"]["pid"].as_u64().expect("a pid") as u32;
    assert!(crate::serve::alive(pid));
    // End of input drains and stops the engine it started.
    drop(stdin);
    let status = support::wait_for_exit(&mut child.0, Duration::from_secs(60), "core --stdio");
    assert!(status.success(), "{status:?}");
    assert!(crate::serve::wait_gone(pid, Duration::from_secs(10)));
}

/// Issue 19, item 12: a saved port cut short (a full disk left a 0-byte
/// `core-port.json`) no longer keeps every later `serve` failing: it is rebuilt with the
/// port the host listens on.
#[test]
fn a_cut_saved_port_is_rebuilt_not_a_dead_end() {
    let workspace = TestWorkspace::new();
    let state = workspace.path().join(".arcane");
    std::fs::create_dir_all(&state).unwrap();
    for broken in [&b""[..], b"{\"por", b"{\"port\": 0}"] {
        std::fs::write(state.join("core-port.json"), broken).unwrap();
        let mut host = serve_without_engine(&workspace);
        let endpoint = wait_for_endpoint(&workspace, &mut host);
        let saved: Value =
            serde_json::from_slice(&std::fs::read(state.join("core-port.json")).unwrap()).unwrap();
        assert_eq!(saved["port"], endpoint["port"], "{broken:?}");
        // Stopped at once (its engine may still be starting: 0 or 130).
        assert!(matches!(terminate(host), Some(0 | 130)));
        std::fs::remove_file(state.join("core-port.json")).unwrap();
    }
}

/// An app that selects `llama.cpp` (`core --stdio --runtime llama.cpp`, as the SDK's
/// Core entry does) in a workspace whose `arcane.toml` has `[[model]]` tables gets the
/// gateway's models as its engines; it used to fail with "a service or method named
/// `localai.status` is already registered".
#[test]
fn a_runtime_selection_in_a_gateway_workspace_is_served_by_the_gateway() {
    let workspace =
        crate::gateway::gateway_workspace("[[model]]\nid = \"smol\"\nmodel = \"smollm2-135m\"\n");
    let mut child = spawn_stdio(&workspace, &["--runtime", "llama.cpp"]);
    let mut stdin = child.0.stdin.take().unwrap();
    stdin
        .write_all(&frame(&request("status", "localai.status")))
        .unwrap();
    let mut reader = StdoutReader::start(&mut child);
    reader.wait_responses(&["status"]);
    drop(stdin);
    let (code, stdout, stderr) = finish_reading(child, reader);
    assert_eq!(code, 0, "{stderr}");
    let frames = frames(&stdout);
    let status = frames
        .iter()
        .find(|f| f["type"] == "response" && f["id"] == "status")
        .unwrap_or_else(|| panic!("no status: {frames:?}"));
    let models = status["result"]["models"].to_string();
    assert!(models.contains("smol"), "{status}");
}
