//! Tests of `arcane serve`: the real `llama-server` + SmolLM2 for the main paths (owned,
//! adopted, `kill -9`, orphan reaping), the supervisor's fake llama server for the rest.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{llama_server, smollm2, TestWorkspace};

/// The fake llama server shipped with the supervisor's tests.
fn fake_llama() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../arcane-localai/tests/fakes/fake_llama.py")
}

/// A loopback port no one listens on, for a process a test starts later. It is taken
/// below Linux's ephemeral range (32768 and up), which is where every `port 0` bind of
/// the hosts and engines the other tests run at the same time lands: a port taken from
/// that range could be handed to one of them before this test's process binds it. Each
/// call tries the next port of this process's own stretch, so two tests of one run never
/// get the same one either.
pub(crate) fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7_919) % SPAN;
    for _ in 0..SPAN {
        let port = FIRST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN;
        let port = u16::try_from(port).expect("below 32768");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port between {FIRST} and {}", FIRST + SPAN);
}

pub(crate) fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next().map(|s| s != "Z"))
                .unwrap_or(false)
        })
        .unwrap_or(false)
}

pub(crate) fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status();
}

pub(crate) fn wait_gone(pid: u32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    !alive(pid)
}

pub(crate) fn health(port: u16) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

pub(crate) fn proc_list(pid: u32, file: &str) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/{file}"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// A running `arcane serve --output ndjson`; its stdout lines arrive on a channel.
/// Dropping it kills arcane and every engine pid it reported.
pub(crate) struct Serve {
    child: Child,
    lines: mpsc::Receiver<Value>,
    seen: Vec<Value>,
    engine_pids: Vec<u32>,
}

impl Serve {
    pub(crate) fn start(ws: &TestWorkspace, args: &[&str]) -> Serve {
        let mut command = ws.arcane();
        command.args(["--output", "ndjson", "serve"]).args(args);
        Serve::spawn(command)
    }

    /// Runs `command` (an `arcane … --output ndjson` that becomes a host, such as a
    /// bundle's `launch`), its stdout lines on the channel.
    pub(crate) fn spawn(mut command: Command) -> Serve {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn arcane serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(value) = serde_json::from_str::<Value>(&line) {
                    let _ = tx.send(value);
                }
            }
        });
        Serve {
            child,
            lines,
            seen: Vec::new(),
            engine_pids: Vec::new(),
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the first line of `kind` (an event type, or `error` for the error line).
    /// SIGTERM, then the clean exit (0) within a minute.
    pub(crate) fn terminate(&mut self) {
        signal(self.pid(), "TERM");
        assert_eq!(
            self.wait_exit(Duration::from_secs(60)),
            Some(0),
            "arcane serve exits 0 on SIGTERM"
        );
    }

    /// Every line seen so far, after taking in what has arrived.
    pub(crate) fn seen(&mut self) -> &[Value] {
        while let Ok(value) = self.lines.try_recv() {
            self.seen.push(value);
        }
        &self.seen
    }

    /// How many lines of type `kind` were seen so far.
    pub(crate) fn count(&mut self, kind: &str) -> usize {
        self.seen().iter().filter(|l| l["type"] == kind).count()
    }

    /// How many models were stopped to make room on their device (`stopped` with
    /// `reason: "evicted"`).
    pub(crate) fn evictions(&mut self) -> usize {
        self.seen()
            .iter()
            .filter(|l| l["type"] == "local-ai.model.stopped" && l["data"]["reason"] == "evicted")
            .count()
    }

    pub(crate) fn wait_for(&mut self, kind: &str, limit: Duration) -> Value {
        self.wait_line(&format!("`{kind}`"), limit, |value| value["type"] == kind)
    }

    /// Waits for the first new line that passes `pred` (`what` names it).
    pub(crate) fn wait_line(
        &mut self,
        what: &str,
        limit: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(value) => {
                    if let Some(pid) = value["data"]["pid"].as_u64() {
                        if value["type"] == "local-ai.server.starting"
                            || value["type"] == "local-ai.server.ready"
                        {
                            self.engine_pids.push(pid as u32);
                        }
                    }
                    self.seen.push(value.clone());
                    if pred(&value) {
                        return value;
                    }
                }
                Err(_) => panic!("no {what} line within {limit:?}; saw {:#?}", self.seen),
            }
        }
    }

    pub(crate) fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        crate::support::wait_for_exit(&mut self.child, limit, "arcane serve").code()
    }

    /// Every line printed (after exit).
    pub(crate) fn rest(&mut self) -> Vec<Value> {
        while let Ok(value) = self.lines.recv_timeout(Duration::from_millis(500)) {
            self.seen.push(value);
        }
        self.seen.clone()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for pid in &self.engine_pids {
            if alive(*pid) {
                signal(*pid, "9");
            }
        }
    }
}

/// A real `llama-server` started by the test (external to Arcane); killed on drop.
pub(crate) struct External(pub(crate) Child);

impl External {
    pub(crate) fn start(port: u16) -> External {
        let child = Command::new(llama_server())
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--model",
            ])
            .arg(smollm2())
            .args(["--device", "none", "--gpu-layers", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn llama-server");
        let external = External(child);
        let deadline = Instant::now() + Duration::from_secs(120);
        while health(port) != Some(200) {
            assert!(
                Instant::now() < deadline,
                "the external llama-server never became ready"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        external
    }
}

impl Drop for External {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The real engine on `port` (a url the user asked for: an owned engine listens there,
/// behind its key).
pub(crate) fn real_args(port: u16) -> Vec<String> {
    let mut args = vec!["--url".into(), format!("http://127.0.0.1:{port}")];
    args.extend(real_socket_args());
    args
}

/// The real engine with no url: an owned engine listens on its private socket.
pub(crate) fn real_socket_args() -> Vec<String> {
    vec![
        "--model".into(),
        smollm2().display().to_string(),
        "--executable".into(),
        llama_server().display().to_string(),
    ]
}

pub(crate) fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

pub(crate) const START: Duration = Duration::from_secs(120);

#[test]
fn serve_owns_a_real_llama_server_on_the_cpu_then_stops_it_on_sigterm() {
    let ws = TestWorkspace::new();
    let mut args = real_socket_args();
    args.extend(["--device".into(), "cpu".into()]);
    let mut serve = Serve::start(&ws, &strs(&args));
    let ready = serve.wait_for("local-ai.server.ready", START);
    assert_eq!(ready["data"]["owned"], true);
    let socket = ready["data"]["socket"].as_str().expect("a private socket");
    assert!(socket.ends_with("/.arcane/run/llama.cpp.sock"), "{socket}");
    assert_eq!(ready["data"]["url"], format!("unix:{socket}"));
    let pid = ready["data"]["pid"].as_u64().unwrap() as u32;
    // No TCP listener belongs to the engine: the Core's port is the only way in.
    assert_eq!(arcane_process::tcp_listeners(pid).unwrap(), []);

    // The CPU target's arguments and environment reached the child.
    let cmdline = proc_list(pid, "cmdline");
    assert!(
        cmdline.ends_with(&["--device", "none", "--gpu-layers", "0"].map(String::from)),
        "{cmdline:?}"
    );
    assert!(proc_list(pid, "environ")
        .iter()
        .any(|v| v == "CUDA_VISIBLE_DEVICES="));

    wait_host_ready(&ws);
    let (host_port, token) = host_endpoint(&ws);
    let (status, reply) = completion(
        host_port,
        &token,
        serde_json::json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
    )
    .join()
    .unwrap();
    assert_eq!(status, 200, "{reply}");

    signal(serve.pid(), "TERM");
    assert_eq!(serve.wait_exit(Duration::from_secs(60)), Some(0));
    assert!(
        !std::path::Path::new(socket).exists(),
        "the socket is removed"
    );
    assert!(
        wait_gone(pid, Duration::from_secs(5)),
        "llama-server must be gone after arcane stops"
    );
    let lines = serve.rest();
    assert!(
        lines
            .iter()
            .any(|l| l["type"] == "local-ai.server.stopped" && l["data"]["stopStep"] == "sigterm"),
        "{lines:#?}"
    );
    assert!(!ws.path().join(".arcane/engines/llama.cpp.json").exists());
}

#[test]
fn kill_9_of_arcane_takes_the_server_down() {
    let ws = TestWorkspace::new();
    let port = free_port();
    let mut serve = Serve::start(&ws, &strs(&real_args(port)));
    let ready = serve.wait_for("local-ai.server.ready", START);
    let pid = ready["data"]["pid"].as_u64().unwrap() as u32;
    signal(serve.pid(), "KILL");
    // Not a timing assertion: a generous bound on a wait that a working
    // parent-death signal ends at once.
    assert!(
        wait_gone(pid, Duration::from_secs(10)),
        "llama-server outlived a killed arcane"
    );
}

#[test]
fn a_real_external_server_is_adopted_and_survives_arcane() {
    let ws = TestWorkspace::new();
    let port = free_port();
    let external = External::start(port);
    let mut serve = Serve::start(&ws, &strs(&real_args(port)));
    let ready = serve.wait_for("local-ai.server.ready", START);
    assert_eq!(ready["data"]["owned"], false);
    assert_eq!(ready["data"]["external"], true);
    assert!(ready["data"]["execution"].is_null());
    signal(serve.pid(), "TERM");
    assert_eq!(serve.wait_exit(Duration::from_secs(30)), Some(0));
    assert!(alive(external.0.id()), "an adopted server is never stopped");
    assert_eq!(health(port), Some(200));
    let lines = serve.rest();
    assert!(
        !lines.iter().any(|l| l["type"] == "process.starting"),
        "nothing may be spawned"
    );
}

#[test]
fn a_device_target_while_an_external_server_runs_is_refused() {
    let ws = TestWorkspace::new();
    let port = free_port();
    let external = External::start(port);
    let mut args = real_args(port);
    args.extend(["--device".into(), "cpu".into()]);
    let mut serve = Serve::start(&ws, &strs(&args));
    let error = serve.wait_for("error", Duration::from_secs(30));
    assert_eq!(
        error["error"]["code"],
        "LOCAL_AI_EXTERNAL_SELECTION_UNSUPPORTED"
    );
    assert_eq!(serve.wait_exit(Duration::from_secs(30)), Some(1));
    assert!(alive(external.0.id()));
    assert_eq!(health(port), Some(200));
}

#[test]
fn an_orphan_left_by_a_killed_arcane_is_stopped_by_the_next_start() {
    let ws = TestWorkspace::new();
    let port = free_port();
    let mut args = real_args(port);
    args.push("--no-parent-death-signal".into());
    let mut first = Serve::start(&ws, &strs(&args));
    let ready = first.wait_for("local-ai.server.ready", START);
    let orphan = ready["data"]["pid"].as_u64().unwrap() as u32;
    signal(first.pid(), "KILL");
    first.wait_exit(Duration::from_secs(10));
    // Without the parent-death signal the engine survives: an orphan. Not
    // synchronisation: a window in which an engine tied to its parent would die.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        alive(orphan),
        "the simulated orphan must survive its arcane"
    );

    let mut second = Serve::start(&ws, &strs(&real_args(port)));
    let stopped = second.wait_for("process.orphan.stopped", Duration::from_secs(60));
    assert_eq!(stopped["data"]["pid"], orphan);
    assert!(!alive(orphan));
    let ready = second.wait_for("local-ai.server.ready", START);
    assert_eq!(
        ready["data"]["owned"], true,
        "a new server replaces the orphan instead of adopting it"
    );
    assert_ne!(ready["data"]["pid"], orphan);
    signal(second.pid(), "TERM");
    assert_eq!(second.wait_exit(Duration::from_secs(60)), Some(0));
}

#[test]
fn cancelling_during_start_exits_130_and_stops_the_child() {
    let ws = TestWorkspace::new();
    let port = free_port();
    let fake = fake_llama().display().to_string();
    let url = format!("http://127.0.0.1:{port}");
    let mut serve = Serve::start(
        &ws,
        &[
            "--url",
            &url,
            "--model",
            "x.gguf",
            "--executable",
            &fake,
            "--",
            "--fake-mode",
            "never-ready",
        ],
    );
    let _ = &mut serve;
    // `--model x.gguf` names a file that does not exist: a usage problem found before
    // anything starts.
    assert_eq!(serve.wait_exit(Duration::from_secs(30)), Some(1));

    let model = ws.path().join("fake.gguf");
    std::fs::write(&model, b"GGUF").unwrap();
    let model = model.display().to_string();
    let mut serve = Serve::start(
        &ws,
        &[
            "--url",
            &url,
            "--model",
            &model,
            "--executable",
            &fake,
            "--",
            "--fake-mode",
            "never-ready",
        ],
    );
    let starting = loop {
        let line = serve.wait_for("local-ai.server.starting", Duration::from_secs(30));
        if line["data"]["owned"] == true {
            break line;
        }
    };
    let _ = starting;
    let spawned = serve.wait_for("process.starting", Duration::from_secs(30));
    assert!(spawned["data"]["args"].as_array().is_some());
    // Interrupt once the engine runs (a child of `serve` in `never-ready` mode).
    let parent = serve.pid();
    crate::support::wait_until(Duration::from_secs(30), "the fake engine to run", || {
        children(parent).into_iter().any(|child| {
            std::fs::read(format!("/proc/{child}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == b"never-ready"))
        })
    });
    signal(serve.pid(), "INT");
    assert_eq!(serve.wait_exit(Duration::from_secs(30)), Some(130));
    let lines = serve.rest();
    let error = lines
        .iter()
        .find(|l| l["type"] == "error")
        .expect("an error line");
    assert_eq!(error["error"]["code"], "ARCANE_CANCELLED");
    let exited = lines
        .iter()
        .find(|l| l["type"] == "process.exited")
        .expect("the child was stopped");
    let pid = exited["data"]["pid"].as_u64().unwrap() as u32;
    assert!(!alive(pid));
}

#[test]
fn engines_come_from_arcane_toml() {
    let ws = TestWorkspace::new();
    let port = free_port();
    let model = ws.path().join("fake.gguf");
    std::fs::write(&model, b"GGUF").unwrap();
    let config = format!(
        "[[engine]]\nruntime = \"llama.cpp\"\nurl = \"http://127.0.0.1:{port}\"\nexecutable = \"{}\"\nmodel = \"fake.gguf\"\nalias = \"tiny\"\nargs = [\"--fake-mode\", \"loading=0.3\"]\nstop_grace = 2\n",
        fake_llama().display()
    );
    std::fs::write(ws.path().join("arcane.toml"), config).unwrap();
    let mut serve = Serve::start(&ws, &[]);
    let ready = serve.wait_for("local-ai.server.ready", Duration::from_secs(60));
    let pid = ready["data"]["pid"].as_u64().unwrap() as u32;
    let cmdline = proc_list(pid, "cmdline");
    let alias = cmdline
        .iter()
        .position(|a| a == "--alias")
        .map(|i| cmdline[i + 1].clone());
    assert_eq!(alias.as_deref(), Some("tiny"));
    assert!(serve
        .seen
        .iter()
        .any(|l| l["type"] == "local-ai.server.loading"));
    signal(serve.pid(), "TERM");
    assert_eq!(serve.wait_exit(Duration::from_secs(30)), Some(0));
    assert!(!alive(pid));
}

#[test]
fn the_embedded_default_needs_the_registered_model_and_says_how_to_get_it() {
    let ws = TestWorkspace::new();
    // Before anything starts without a url; after probing the url with one (a server
    // answering there would have been adopted).
    for url in [None, Some(format!("http://127.0.0.1:{}", free_port()))] {
        let mut command = ws.arcane();
        command.arg("serve");
        if let Some(url) = &url {
            command.args(["--url", url]);
        }
        let output = command.output().unwrap();
        assert_eq!(output.status.code(), Some(1), "{url:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("smollm2-135m"), "{url:?}: {stderr}");
        assert!(stderr.contains("arcane model add"), "{url:?}: {stderr}");
    }
}

#[test]
fn serve_url_adopts_an_answering_server_with_nothing_registered() {
    let ws = TestWorkspace::new();
    let port = free_port();
    let external = External::start(port);
    let url = format!("http://127.0.0.1:{port}");
    let mut serve = Serve::start(&ws, &["--url", &url]);
    let ready = serve.wait_for("local-ai.server.ready", START);
    assert_eq!(ready["data"]["external"], true);
    assert_eq!(ready["data"]["owned"], false);
    wait_host_ready(&ws);
    // It serves what the adopted server has loaded, through the token.
    let (host_port, token) = host_endpoint(&ws);
    let (status, reply) = completion(
        host_port,
        &token,
        serde_json::json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
    )
    .join()
    .unwrap();
    assert_eq!(status, 200, "{reply}");
    let status = crate::support::run(ws.arcane().args(["--output", "json", "status"]));
    let engine = &crate::support::json(&status)["engines"][0];
    assert_eq!(engine["reachableWithoutToken"], true, "{engine}");
    signal(serve.pid(), "TERM");
    assert_eq!(serve.wait_exit(Duration::from_secs(30)), Some(0));
    assert!(alive(external.0.id()), "an adopted server is never stopped");
}

#[test]
fn a_bad_configuration_is_a_usage_error_before_anything_starts() {
    let ws = TestWorkspace::new();
    std::fs::write(
        ws.path().join("arcane.toml"),
        "[[engine]]\nruntime = \"llama.cpp\"\nnot_a_field = 1\n",
    )
    .unwrap();
    let output = ws.arcane().arg("serve").output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let model = ws.path().join("m.gguf");
    std::fs::write(&model, b"GGUF").unwrap();
    let output = ws
        .arcane()
        .args([
            "serve",
            "--config",
            "/dev/null",
            "--url",
            "https://127.0.0.1:1",
            "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The running host's port and token, from `core.json`.
pub(crate) fn host_endpoint(ws: &TestWorkspace) -> (u16, String) {
    let record: Value =
        serde_json::from_slice(&std::fs::read(ws.path().join(".arcane/core.json")).unwrap())
            .unwrap();
    (
        record["port"].as_u64().unwrap() as u16,
        record["token"].as_str().unwrap().to_string(),
    )
}

/// Starts `POST /v1/chat/completions` through the host's passthrough on a thread;
/// the thread returns the raw reply (status line, headers, body) once the host closes
/// the connection.
pub(crate) fn completion(
    port: u16,
    token: &str,
    body: Value,
) -> std::thread::JoinHandle<(u16, String)> {
    let body = body.to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    std::thread::spawn(move || {
        crate::support::http_exchange(&format!("127.0.0.1:{port}"), &request)
    })
}

/// How many of the engine's slots are generating (llama-server `GET /slots`, through
/// the Core's front door).
fn processing_slots(ws: &TestWorkspace) -> usize {
    let (port, token) = host_endpoint(ws);
    let (_, text) = crate::support::http_exchange(
        &format!("127.0.0.1:{port}"),
        &format!("GET /slots HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"),
    );
    text.matches("\"is_processing\":true").count()
}

/// The pids of `pid`'s children (`/proc/<pid>/task/*/children`).
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Waits (bounded) until the host itself reports its engine ready (`arcane status`),
/// which comes a little after the engine's own `local-ai.server.ready` event.
pub(crate) fn wait_host_ready(ws: &TestWorkspace) {
    let deadline = Instant::now() + START;
    loop {
        let out = crate::support::run(ws.arcane().args(["--output", "json", "status"]));
        if out.status.success() && crate::support::json(&out)["engines"][0]["state"] == "ready" {
            return;
        }
        assert!(Instant::now() < deadline, "the host never reported ready");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (bounded) until `count` slots of the engine are generating.
fn wait_processing(ws: &TestWorkspace, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while processing_slots(ws) < count {
        assert!(
            Instant::now() < deadline,
            "the engine never worked on {count} request(s)"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `arcane serve` owning the real llama-server with two slots, so a streamed and a
/// non-streamed completion run at once.
fn serve_two_slots(ws: &TestWorkspace, drain: &str) -> Serve {
    let mut args = real_socket_args();
    args.extend(["--device", "cpu", "--drain-timeout", drain].map(String::from));
    args.extend(["--", "--parallel", "2", "--threads", "2"].map(String::from));
    Serve::start(ws, &strs(&args))
}

fn stop_steps(lines: &[Value]) -> Vec<Value> {
    lines
        .iter()
        .filter(|l| l["type"] == "local-ai.server.stopped")
        .map(|l| l["data"]["stopStep"].clone())
        .collect()
}

#[test]
fn sigterm_waits_for_in_flight_passthrough_responses_then_the_engine_exits_on_sigterm() {
    let ws = TestWorkspace::new();
    let mut serve = serve_two_slots(&ws, "600");
    let ready = serve.wait_for("local-ai.server.ready", START);
    wait_host_ready(&ws);
    let engine = ready["data"]["pid"].as_u64().unwrap() as u32;
    let (host_port, token) = host_endpoint(&ws);
    let messages =
        serde_json::json!([{"role": "user", "content": "Write a long story about a lighthouse."}]);
    let streamed = completion(
        host_port,
        &token,
        serde_json::json!({"messages": messages, "max_tokens": 160, "stream": true}),
    );
    let whole = completion(
        host_port,
        &token,
        serde_json::json!({"messages": messages, "max_tokens": 160}),
    );
    wait_processing(&ws, 2);

    signal(serve.pid(), "TERM");
    let (status, reply) = streamed.join().unwrap();
    assert_eq!(status, 200, "{reply}");
    assert!(
        reply.trim_end().ends_with("data: [DONE]") || reply.contains("data: [DONE]\n"),
        "the stream must end with its final `data: [DONE]`: {reply}"
    );
    let (status, reply) = whole.join().unwrap();
    assert_eq!(status, 200, "{reply}");
    let body = reply
        .split_once("\r\n\r\n")
        .map_or(reply.as_str(), |(_, b)| b);
    let body: Value = serde_json::from_str(body).expect("a complete JSON completion");
    assert!(
        body["choices"][0]["message"]["content"].is_string(),
        "{body}"
    );

    assert_eq!(serve.wait_exit(Duration::from_secs(120)), Some(0));
    let lines = serve.rest();
    // Stopped by its SIGTERM, not killed: nothing held a request open on it.
    assert_eq!(
        stop_steps(&lines),
        [serde_json::json!("sigterm")],
        "{lines:#?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l["type"] == "process.cancellation.escalated"),
        "{lines:#?}"
    );
    assert!(wait_gone(engine, Duration::from_secs(10)));
}

#[test]
fn past_the_drain_deadline_passthrough_responses_are_cut_and_the_engine_still_exits_on_sigterm() {
    let ws = TestWorkspace::new();
    let mut serve = serve_two_slots(&ws, "1");
    serve.wait_for("local-ai.server.ready", START);
    wait_host_ready(&ws);
    let (host_port, token) = host_endpoint(&ws);
    let endless = serde_json::json!({
        "messages": [{"role": "user", "content": "Count to one million."}],
        "max_tokens": 6000, "ignore_eos": true, "stream": true,
    });
    let streamed = completion(host_port, &token, endless);
    wait_processing(&ws, 1);

    signal(serve.pid(), "TERM");
    let (status, reply) = streamed.join().unwrap();
    assert_eq!(status, 200);
    assert!(
        !reply.contains("data: [DONE]"),
        "a cut stream must not look complete"
    );
    assert_eq!(serve.wait_exit(Duration::from_secs(120)), Some(0));
    let lines = serve.rest();
    assert_eq!(
        stop_steps(&lines),
        [serde_json::json!("sigterm")],
        "{lines:#?}"
    );
}

#[test]
fn a_second_sigterm_during_the_drain_ends_the_host_and_leaves_no_engine() {
    let ws = TestWorkspace::new();
    let mut serve = serve_two_slots(&ws, "600");
    let ready = serve.wait_for("local-ai.server.ready", START);
    wait_host_ready(&ws);
    let engine = ready["data"]["pid"].as_u64().unwrap() as u32;
    let (host_port, token) = host_endpoint(&ws);
    let endless = serde_json::json!({
        "messages": [{"role": "user", "content": "Count to one million."}],
        "max_tokens": 6000, "ignore_eos": true, "stream": true,
    });
    let streamed = completion(host_port, &token, endless);
    wait_processing(&ws, 1);

    signal(serve.pid(), "TERM");
    // The first signal started the drain, which waits for the stream.
    loop {
        let state = serve.wait_for("core.state", Duration::from_secs(30));
        if state["data"]["state"] == "draining" {
            break;
        }
    }
    assert!(alive(engine), "the engine is kept while the drain waits");
    signal(serve.pid(), "TERM");
    assert_eq!(serve.wait_exit(Duration::from_secs(30)), Some(130));
    assert!(
        wait_gone(engine, Duration::from_secs(30)),
        "llama-server (pid {engine}) outlived the escalated stop"
    );
    let _ = streamed.join();
}

/// Issue 10, item 7: a misspelt key (`[[engines]]`, `modle`) or an empty `engine` list
/// is refused naming the key, the file and the known keys; the built-in default never
/// runs in its place.
#[test]
fn unknown_keys_and_an_empty_engine_list_in_arcane_toml_are_refused() {
    let cases = [
        (
            "[[engines]]\nruntime = \"llama.cpp\"\n",
            "engines",
            Some("engine"),
        ),
        ("engine = []\nengin = 1\n", "engin", Some("engine")),
        (
            "[[engine]]\nruntime = \"llama.cpp\"\nmodle = \"x\"\n",
            "modle",
            Some("model"),
        ),
        ("[server]\nport = 1\n", "server", None),
    ];
    for (text, key, suggestion) in cases {
        let ws = TestWorkspace::new();
        let path = ws.path().join("arcane.toml");
        std::fs::write(&path, text).unwrap();
        let output = ws
            .arcane()
            .args(["--output", "json", "serve"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{text}");
        let error = &crate::support::json(&output)["error"];
        assert_eq!(error["code"], "ARCANE_USAGE", "{text}");
        assert_eq!(error["details"]["key"], key, "{text}: {error}");
        assert_eq!(error["details"]["path"], json!(path), "{text}");
        assert!(error["details"]["known"]
            .as_array()
            .is_some_and(|k| !k.is_empty()));
        assert_eq!(error["details"]["suggestion"], json!(suggestion), "{text}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(&format!("`{key}`")), "{message}");
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(!ws.path().join(".arcane/core.json").exists(), "{text}");
    }
    let ws = TestWorkspace::new();
    std::fs::write(ws.path().join("arcane.toml"), "engine = []\n").unwrap();
    let output = ws.arcane().arg("serve").output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("lists no engines"), "{stderr}");
    assert!(stderr.contains("[[engine]]"), "{stderr}");
}

/// `arcane serve` on the fake engine at a free port, with `engine_args` after `--`.
pub(crate) fn fake_serve_args(ws: &TestWorkspace, port: u16, engine_args: &[&str]) -> Vec<String> {
    let model = ws.path().join("fake.gguf");
    std::fs::write(&model, b"GGUF").unwrap();
    let mut args: Vec<String> = vec![
        "--executable".into(),
        fake_llama().display().to_string(),
        "--model".into(),
        model.display().to_string(),
        "--url".into(),
        format!("http://127.0.0.1:{port}"),
        "--".into(),
    ];
    args.extend(engine_args.iter().map(|a| a.to_string()));
    args
}

/// Issue 10, item 8: an engine that exits before it is ready shows its last output
/// lines (the real cause) in the human error without `-v`, and in `details` in JSON.
#[test]
fn an_engine_that_exits_before_ready_shows_its_last_lines_without_verbose() {
    let ws = TestWorkspace::new();
    let args = fake_serve_args(&ws, free_port(), &["--fake-mode", "exit-early=3"]);
    let output = ws.arcane().arg("serve").args(&args).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let error = &stderr[stderr.find("error: ").expect("an error line")..];
    assert!(error.contains("exited before it was ready"), "{stderr}");
    assert!(
        error.contains("| error: failed to load model (fake early exit)"),
        "{stderr}"
    );
    let output = ws
        .arcane()
        .args(["--output", "json", "serve"])
        .args(&args)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let error = &crate::support::json(&output)["error"];
    assert_eq!(error["code"], "LOCAL_AI_SERVER_FAILED");
    let lines = error["details"]["lastLines"].as_array().expect("lastLines");
    assert!(
        lines.iter().any(|l| l
            .as_str()
            .is_some_and(|l| l.contains("failed to load model"))),
        "{error}"
    );
}

/// Issue 10, item 8: after the engine crashed, `arcane chat` says what happened (the
/// engine's error as its cause) with the real top-level code and hints naming what to
/// run, and `arcane status` never prints `pid null`.
#[test]
fn chat_after_an_engine_crash_names_the_crash_and_what_to_run() {
    // An `[[engine]]` table: a plain supervised engine stays down after a crash (the
    // one-model gateway of the flags reloads it on the next request instead).
    let ws = TestWorkspace::new();
    let model = ws.path().join("fake.gguf");
    std::fs::write(&model, b"GGUF").unwrap();
    std::fs::write(
        ws.path().join("arcane.toml"),
        format!(
            "[[engine]]\nexecutable = \"{}\"\nmodel = \"{}\"\nurl = \"http://127.0.0.1:{}\"\nargs = [\"--fake-mode\", \"crash-after=0.3\"]\n",
            fake_llama().display(),
            model.display(),
            free_port()
        ),
    )
    .unwrap();
    let mut serve = Serve::start(&ws, &[]);
    serve.wait_for("local-ai.server.ready", Duration::from_secs(60));
    serve.wait_for("local-ai.server.error", Duration::from_secs(60));
    let output = ws
        .arcane()
        .args(["--output", "json", "chat", "hello"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let error = &crate::support::json(&output)["error"];
    assert_eq!(error["code"], "LOCAL_AI_SERVER_NOT_READY", "{error}");
    assert_eq!(error["details"]["state"], "error", "{error}");
    let causes = error["causes"].to_string();
    assert!(causes.contains("exit code 7"), "{error}");
    let hints = error["hints"].to_string();
    assert!(hints.contains("arcane status"), "{error}");
    assert!(hints.contains("localai.services.recover"), "{error}");
    let output = ws.arcane().args(["chat", "hello"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    // The whole message: the crash as its cause (exit code 7), never "is error".
    insta::assert_snapshot!(
        "chat_after_an_engine_crash",
        ws.redact(&crate::support::stderr(&output))
    );
    let output = ws.arcane().arg("status").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(!stdout.contains("null"), "{stdout}");
    assert!(stdout.contains("engine  llama.cpp"), "{stdout}");
    signal(serve.pid(), "TERM");
    assert_eq!(serve.wait_exit(Duration::from_secs(30)), Some(0));
}

/// Issue 10, item 8: a failed first start keeps the engine error's causes (they cross
/// the host as `causes`), so the human error says why, e.g. why a spawn failed.
#[test]
fn a_failed_first_start_keeps_its_causes() {
    let ws = TestWorkspace::new();
    let executable = ws.path().join("not-executable");
    std::fs::write(&executable, "#!/bin/sh\n").unwrap();
    let mut args = fake_serve_args(&ws, free_port(), &[]);
    args[1] = executable.display().to_string();
    let output = ws.arcane().arg("serve").args(&args).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    // From the error on (what comes before is the start's progress).
    let error = &stderr[stderr.find("error: ").expect("an error line")..];
    insta::assert_snapshot!("serve_first_start_not_executable", ws.redact(error));
}

/// Issue 10, item 10: `--restart on-failure` that runs out of restarts prints a line
/// saying so (engine, count, last error) instead of going quiet.
#[test]
fn giving_up_restarting_prints_a_clear_line() {
    let ws = TestWorkspace::new();
    let port = free_port();
    std::fs::write(ws.path().join("fake.gguf"), b"GGUF").unwrap();
    let config = format!(
        "[[engine]]\nurl = \"http://127.0.0.1:{port}\"\nexecutable = \"{}\"\nmodel = \"fake.gguf\"\nargs = [\"--fake-mode\", \"crash-after=0.2\"]\nrestart = \"on-failure\"\nmax_restarts = 1\nrestart_backoff = 0.1\n",
        fake_llama().display()
    );
    std::fs::write(ws.path().join("arcane.toml"), config).unwrap();
    /// Kills `arcane serve` (which stops its engine) if the test fails midway.
    struct Killed(Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Killed(
        ws.arcane()
            .arg("serve")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.0.stderr.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    let line = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains("gave up restarting") => break line,
            Ok(line) => seen.push(line),
            Err(_) => panic!("no give-up line; saw {seen:#?}"),
        }
    };
    assert!(
        line.contains("gave up restarting `llama.cpp` after 1 restart: `llama.cpp` stopped unexpectedly (exit code 7)"),
        "{line}"
    );
    signal(child.0.id(), "TERM");
    let status = crate::support::wait_for_exit(&mut child.0, Duration::from_secs(30), "serve");
    assert_eq!(status.code(), Some(0));
}

/// Issue 10, item 11: with nothing registered, `serve --runtime ollama` says how to
/// register Ollama, not llama.cpp.
#[test]
fn the_missing_runtime_hint_names_the_runtime_asked_for() {
    let ws = TestWorkspace::new();
    let url = format!("http://127.0.0.1:{}", free_port());
    let output = ws
        .arcane()
        .args([
            "--output",
            "json",
            "serve",
            "--runtime",
            "ollama",
            "--url",
            &url,
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let error = &crate::support::json(&output)["error"];
    assert_eq!(error["code"], "ARCANE_PREREQUISITE_MISSING", "{error}");
    let hints = error["hints"].to_string();
    assert!(hints.contains("arcane runtime add ollama"), "{hints}");
    assert!(!hints.contains("llama.cpp"), "{hints}");
}

/// Issue 14, item 12: with `.arcane/engines` a symbolic link, `serve` wrote engine
/// ownership records through it; with `.arcane` a link, it started llama-server and
/// wrote `core.json` (which holds the token) before refusing. Now both are refused
/// before anything starts, and nothing is written through either link.
#[test]
fn a_linked_state_directory_is_refused_before_anything_starts() {
    for linked in [".arcane", ".arcane/engines"] {
        let ws = TestWorkspace::new();
        let elsewhere = tempfile::tempdir().unwrap();
        let link = ws.path().join(linked);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), &link).unwrap();
        let port = free_port();
        let out = crate::support::run(
            ws.arcane()
                .args(["--output", "json", "serve", "--executable"])
                .arg(llama_server())
                .arg("--model")
                .arg(smollm2())
                .args([
                    "--device",
                    "cpu",
                    "--url",
                    &format!("http://127.0.0.1:{port}"),
                ])
                .args(["--port", &free_port().to_string()]),
        );
        assert!(!out.status.success(), "{linked}");
        let v = crate::support::json(&out);
        assert_eq!(v["error"]["code"], "ARCANE_POLICY_DENIED", "{linked}: {v}");
        assert_eq!(
            std::fs::read_dir(elsewhere.path()).unwrap().count(),
            0,
            "{linked}: something was written through the link"
        );
        assert!(health(port).is_none(), "{linked}: an engine was started");
    }
}

/// Issue 14, item 1: with `.arcane` writable by others, another user could rewrite the
/// registry; with the engine executable (or its directory) writable or owned by
/// another user, they could swap the program `serve` (perhaps as root) runs. Both are
/// refused, naming the path, its owner and mode and the fix, before anything starts.
#[test]
fn state_or_an_executable_another_user_could_change_is_refused_with_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    // 1. A world-writable `.arcane`.
    let ws = TestWorkspace::new();
    std::fs::create_dir(ws.path().join(".arcane")).unwrap();
    std::fs::set_permissions(
        ws.path().join(".arcane"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    for args in [
        vec![
            "--output",
            "json",
            "lock",
            "run",
            "--operation",
            "x",
            "--",
            "true",
        ],
        vec![
            "--output",
            "json",
            "serve",
            "--runtime",
            "ollama",
            "--url",
            "http://127.0.0.1:9",
        ],
    ] {
        let out = crate::support::run(ws.arcane().args(&args));
        let v = crate::support::json(&out);
        assert_eq!(v["error"]["code"], "ARCANE_POLICY_DENIED", "{args:?}: {v}");
        let text = v.to_string();
        assert!(
            text.contains("writable by everyone") && text.contains("0777"),
            "{text}"
        );
        assert!(text.contains("chmod go-w"), "{text}");
    }
    // 2. An engine executable in a directory others may write to.
    let ws = TestWorkspace::new();
    let bin = ws.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let program = bin.join("llama-server");
    std::fs::copy(llama_server(), &program).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o777)).unwrap();
    let port = free_port();
    // `serve` of `program` with the real model; its JSON error.
    let serve_program = || {
        let out = crate::support::run(
            ws.arcane()
                .args(["--output", "json", "serve", "--executable"])
                .arg(&program)
                .arg("--model")
                .arg(smollm2())
                .args([
                    "--device",
                    "cpu",
                    "--url",
                    &format!("http://127.0.0.1:{port}"),
                ])
                .args(["--port", &free_port().to_string()]),
        );
        assert!(!out.status.success());
        crate::support::json(&out)
    };
    let v = serve_program();
    assert_eq!(v["error"]["code"], "ARCANE_POLICY_DENIED", "{v}");
    assert!(v.to_string().contains(&bin.display().to_string()), "{v}");
    assert!(health(port).is_none(), "the untrusted program ran");
    // 3. As root (as here): an executable another user owns.
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    if std::os::unix::fs::chown(&program, Some(65534), None).is_ok() {
        let v = serve_program();
        assert_eq!(v["error"]["code"], "ARCANE_POLICY_DENIED", "{v}");
        assert!(
            v.to_string().contains("owned by another user (uid 65534)"),
            "{v}"
        );
        assert!(health(port).is_none(), "the untrusted program ran");
    }
}
