//! Shared helpers: fake engines, free ports, a raw loopback HTTP client, process guards.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arcane_localai::{Engine, EngineConfig, Supervisor};
use arcane_report::Collector;

/// A fake engine script under `tests/fakes/`.
pub fn fake(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fakes")
        .join(name)
}

/// A port that was free a moment ago (bound to 127.0.0.1:0, then released).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// A temp workspace.
pub fn workspace() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("arcane-localai-")
        .tempdir()
        .expect("temp dir")
}

/// A supervisor over `workspace` that collects its events.
pub fn supervisor(workspace: &Path) -> (Supervisor, Arc<Collector>) {
    let events = Arc::new(Collector::default());
    (Supervisor::new(workspace, events.clone()), events)
}

/// A llama.cpp config for the fake on `port`, with short timeouts and the given modes.
pub fn fake_llama(port: u16, modes: &[&str]) -> EngineConfig {
    let mut config = EngineConfig::new(Engine::LlamaCpp);
    config.url = format!("http://127.0.0.1:{port}");
    config.executable = Some(fake("fake_llama.py"));
    config.model = Some("/nonexistent/fake.gguf".into());
    config.startup_timeout = Duration::from_secs(20);
    config.stop_grace = Duration::from_secs(5);
    for mode in modes {
        config.extra_args.push("--fake-mode".into());
        config.extra_args.push((*mode).into());
    }
    config
}

/// A process started by a test; killed (and reaped) when dropped.
pub struct Proc(pub std::process::Child);

impl Proc {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Kills a pid (a server a test expects to be gone) if it is somehow still alive.
pub struct PidGuard(pub u32);

impl Drop for PidGuard {
    fn drop(&mut self) {
        if alive(self.0) {
            let _ = Command::new("kill")
                .arg("-9")
                .arg(self.0.to_string())
                .status();
        }
    }
}

/// Starts the fake llama server as an external process on `port` and waits until it
/// answers `/health`.
pub fn external_fake_llama(port: u16, modes: &[&str]) -> Proc {
    let mut command = Command::new(fake("fake_llama.py"));
    command
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for mode in modes {
        command.args(["--fake-mode", mode]);
    }
    let proc = Proc(command.spawn().expect("spawn fake llama"));
    wait_until(Duration::from_secs(20), || {
        http_get(port, "/health").is_some()
    });
    proc
}

/// Polls `condition` every 20 ms for up to `limit`; panics when it never holds.
pub fn wait_until(limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if condition() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("condition not met within {limit:?}");
}

/// Whether `pid` is a live (non-zombie) process.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next().map(str::to_string));
            state.as_deref() != Some("Z")
        }
        Err(_) => false,
    }
}

/// `GET path` on 127.0.0.1:port; `(status, body)` or `None` when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    request(
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"),
    )
}

/// `POST path` with a JSON body on 127.0.0.1:port.
pub fn http_post(port: u16, path: &str, body: &str) -> Option<(u16, String)> {
    request(
        port,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// `method path` with an optional JSON body and bearer key, on a Unix socket.
pub fn http_unix(
    socket: &Path,
    method: &str,
    path: &str,
    body: &str,
    key: Option<&str>,
) -> Option<(u16, String)> {
    let stream = std::os::unix::net::UnixStream::connect(socket).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .ok()?;
    exchange(stream, &raw_request(method, path, body, key))
}

/// `method path` with an optional JSON body and bearer key, on 127.0.0.1:port.
pub fn http_keyed(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    key: Option<&str>,
) -> Option<(u16, String)> {
    request(port, &raw_request(method, path, body, key))
}

fn raw_request(method: &str, path: &str, body: &str, key: Option<&str>) -> String {
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The socket an owned engine `id` listens on in `workspace`.
pub fn engine_socket(workspace: &Path, id: &str) -> PathBuf {
    workspace.join(".arcane/run").join(format!("{id}.sock"))
}

fn request(port: u16, text: &str) -> Option<(u16, String)> {
    let stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .ok()?;
    exchange(stream, text)
}

fn exchange(mut stream: impl Read + Write, text: &str) -> Option<(u16, String)> {
    stream.write_all(text.as_bytes()).ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// The NUL-separated `/proc/<pid>/cmdline` or `environ` of a process.
pub fn proc_list(pid: u32, file: &str) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/{file}"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// The `data` of every event of type `kind`.
pub fn events_of(events: &Collector, kind: &str) -> Vec<serde_json::Value> {
    events
        .events()
        .into_iter()
        .filter(|e| e.kind == kind)
        .map(|e| e.data)
        .collect()
}

/// The state sequence of `local-ai.server.*` events.
pub fn states(events: &Collector) -> Vec<String> {
    events
        .types()
        .into_iter()
        .filter_map(|t| t.strip_prefix("local-ai.server.").map(str::to_string))
        .collect()
}

/// The real llama-server (`LLAMA_SERVER`); fails loudly when unset.
#[allow(clippy::disallowed_methods)]
pub fn llama_server() -> PathBuf {
    real("LLAMA_SERVER")
}

/// The real SmolLM2 model (`ARCANE_TEST_MODEL`).
#[allow(clippy::disallowed_methods)]
pub fn smollm2() -> PathBuf {
    real("ARCANE_TEST_MODEL")
}

#[allow(clippy::disallowed_methods)]
fn real(var: &str) -> PathBuf {
    let value = std::env::var_os(var).unwrap_or_else(|| {
        panic!("{var} is not set: run the tests through `./scripts/test.sh` (or source ~/.cache/arcane/embedded.env)")
    });
    let path = PathBuf::from(value);
    assert!(path.is_file(), "{var}={} does not exist", path.display());
    path
}

/// Sends signal `name` (`STOP`, `KILL`, …) to `pid`.
pub fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status();
}
