//! Shared helpers: a test service with observable side effects, raw HTTP, frames.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arcane_core::{
    BoxError, BoxFuture, MethodResult, MethodSpec, RequestContext, Service, ServiceContext,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A service whose methods have observable effects:
/// `test.echo` returns its parameters and counts calls; `test.sleep {ms}` sleeps
/// (request lifetime); `test.save {ms}` sleeps with service lifetime; `test.stream
/// {count, ms}` emits `test.chunk` events tied to the request; `test.fail` fails.
pub struct TestService {
    pub name: String,
    pub namespace: String,
    pub calls: AtomicUsize,
    pub disposed: AtomicUsize,
    pub start_delay: Duration,
    pub start_fails: bool,
}

impl TestService {
    pub fn new(name: &str, namespace: &str) -> Arc<Self> {
        Self::with(name, namespace, Duration::ZERO, false)
    }

    pub fn with(
        name: &str,
        namespace: &str,
        start_delay: Duration,
        start_fails: bool,
    ) -> Arc<Self> {
        Arc::new(Self {
            name: name.into(),
            namespace: namespace.into(),
            calls: AtomicUsize::new(0),
            disposed: AtomicUsize::new(0),
            start_delay,
            start_fails,
        })
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Service for TestService {
    fn name(&self) -> &str {
        &self.name
    }

    fn methods(&self) -> Vec<MethodSpec> {
        let n = &self.namespace;
        vec![
            MethodSpec::request(format!("{n}.echo")),
            MethodSpec::request(format!("{n}.sleep")),
            MethodSpec::service(format!("{n}.save")),
            MethodSpec::request(format!("{n}.stream")),
            MethodSpec::request(format!("{n}.fail")),
        ]
    }

    fn start(
        self: Arc<Self>,
        _context: ServiceContext,
    ) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move {
            tokio::time::sleep(self.start_delay).await;
            if self.start_fails {
                return Err(Box::new(arcane_core::Error::usage(
                    "the test service refuses to start",
                    json!({}),
                )) as BoxError);
            }
            Ok(())
        })
    }

    fn call(
        self: Arc<Self>,
        method: String,
        parameters: Value,
        context: RequestContext,
    ) -> BoxFuture<'static, MethodResult> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            let suffix = method.rsplit('.').next().unwrap_or_default().to_string();
            let ms = parameters["ms"].as_u64().unwrap_or(0);
            match suffix.as_str() {
                "echo" => Ok(parameters),
                "sleep" | "save" => {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Ok(json!({"slept": ms}))
                }
                "stream" => {
                    let count = parameters["count"].as_u64().unwrap_or(3);
                    for i in 0..count {
                        context.emit(
                            "test.chunk",
                            json!({"index": i, "requestId": context.request_id}),
                        );
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                    }
                    Ok(json!({"chunks": count}))
                }
                _ => Err(Box::new(arcane_core::Error::usage(
                    "asked to fail",
                    json!({"method": method}),
                )) as BoxError),
            }
        })
    }

    fn dispose(self: Arc<Self>) -> BoxFuture<'static, Result<(), BoxError>> {
        self.disposed.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    }

    fn replay(&self) -> Vec<(String, Value)> {
        vec![(
            format!("{}.state", self.namespace),
            json!({"name": self.name}),
        )]
    }
}

/// A request frame.
pub fn request(id: &str, method: &str, parameters: Value) -> arcane_core::protocol::Request {
    arcane_core::protocol::Request {
        id: id.into(),
        method: method.into(),
        parameters,
    }
}

/// One raw HTTP/1.1 exchange (`Connection: close`): status, lower-cased head, body.
pub async fn raw_http(
    address: std::net::SocketAddr,
    head: &str,
    body: &str,
) -> (u16, String, String) {
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let text = format!(
        "{head}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(text.as_bytes()).await.expect("write");
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut reply))
        .await
        .expect("reply in time")
        .expect("read");
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_string())
}

/// Decodes a chunked body when the head says so.
pub fn dechunk(head: &str, body: &str) -> String {
    if !head.contains("transfer-encoding: chunked") {
        return body.to_string();
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || tail.len() < size {
            break;
        }
        out.push_str(&tail[..size]);
        rest = tail[size..].trim_start_matches("\r\n");
    }
    out
}

/// The frames in a receiver so far, parsed.
pub fn drain(receiver: &mut tokio::sync::mpsc::UnboundedReceiver<Arc<str>>) -> Vec<Value> {
    let mut frames = Vec::new();
    while let Ok(frame) = receiver.try_recv() {
        frames.push(serde_json::from_str(&frame).expect("frame is JSON"));
    }
    frames
}

/// Receives frames until `pred` matches one (at most 30 s).
pub async fn until(
    receiver: &mut tokio::sync::mpsc::UnboundedReceiver<Arc<str>>,
    pred: impl Fn(&Value) -> bool,
) -> Vec<Value> {
    let mut frames = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let frame = tokio::time::timeout_at(deadline, receiver.recv())
            .await
            .expect("frame in time")
            .expect("stream open");
        let value: Value = serde_json::from_str(&frame).expect("frame is JSON");
        let done = pred(&value);
        frames.push(value);
        if done {
            return frames;
        }
    }
}

/// `LLAMA_SERVER` and `ARCANE_TEST_MODEL`, failing loudly when unset.
#[allow(clippy::disallowed_methods)]
pub fn real_parts() -> (std::path::PathBuf, std::path::PathBuf) {
    let get = |var: &str| {
        let value = std::env::var_os(var).unwrap_or_else(|| panic!("{var} is not set: run the tests through `./scripts/test.sh` (it provisions llama-server and SmolLM2)"));
        let path = std::path::PathBuf::from(value);
        assert!(
            path.is_file(),
            "{var}={} does not exist; rerun `bash scripts/provision.sh`",
            path.display()
        );
        path
    };
    (get("LLAMA_SERVER"), get("ARCANE_TEST_MODEL"))
}

/// A real `llama-server` on a free loopback port, killed on drop.
pub struct LlamaServer {
    pub child: std::process::Child,
    pub url: String,
}

impl LlamaServer {
    pub async fn start() -> Self {
        let (server, model) = real_parts();
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let child = std::process::Command::new(&server)
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--model",
            ])
            .arg(&model)
            .args([
                "--ctx-size",
                "8192",
                "--parallel",
                "1",
                "--threads",
                "2",
                "--no-webui",
            ])
            .current_dir(server.parent().unwrap())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn llama-server");
        let server = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        // Wait for /health = ok (generous; never asserted as a duration).
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                let _ = stream
                    .write_all(format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").as_bytes())
                    .await;
                let mut reply = String::new();
                let _ = stream.read_to_string(&mut reply).await;
                if reply.contains("\"ok\"") {
                    return server;
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "llama-server did not become ready"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
