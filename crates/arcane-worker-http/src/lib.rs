//! The HTTP side of Arcane's own engines (`arcane __whisper-worker`, `arcane
//! __piper-worker`, `arcane __sd-worker`): a small server for one model, behind the
//! Core. It is a crate of its own so that a worker links what it serves with, not the
//! Core host.
//!
//! # Why a server, and why this one
//!
//! An engine Arcane starts is supervised, reaped, listed and routed to as an HTTP
//! server: the gateway forwards a request to its url and answers with what comes back.
//! Serving speech the same way makes speech one engine kind plus its routes, with
//! load on demand, keep-alive, eviction, metrics and `arcane ps` for free. What whisper.cpp's
//! own server lacks (a socket, a key, a closed door to other origins) is here:
//!
//! * it listens on the private socket the supervisor chose (`--socket`, in the
//!   workspace's 0700 run directory, the socket itself 0600), or on a loopback port that
//!   demands the key in `--api-key-file` on every request but `GET /health`;
//! * it sends no CORS header at all, so no web page can read an answer;
//! * a request's body is bounded ([`WorkerServer::max_body`], 413 past it);
//! * every request carries a [`Cancel`] that fires when the client goes away before
//!   the answer (hyper drops a request's future when its connection ends), so a
//!   transcription nobody waits for stops; an answer streamed as server-sent events
//!   ([`event_stream`]) sees its client go away as its channel closing;
//! * every failure is a JSON answer in OpenAI's shape with Arcane's stable code:
//!   `{"error": {"message", "type", "param", "code", "details"}}`.

#![warn(missing_docs)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::Frame;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

/// A boxed future a handler returns.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Where a worker listens.
#[derive(Debug, Clone)]
pub enum Listen {
    /// A Unix socket path (created here, mode 0600).
    Socket(PathBuf),
    /// A loopback address.
    Tcp(std::net::SocketAddr),
}

/// A bound [`Listen`].
#[derive(Debug)]
pub enum Listener {
    /// On a Unix socket.
    Unix(tokio::net::UnixListener),
    /// On a loopback port.
    Tcp(tokio::net::TcpListener),
}

impl Listener {
    /// Binds `listen` (a socket is made 0600).
    pub async fn bind(listen: &Listen) -> std::io::Result<Listener> {
        match listen {
            Listen::Socket(path) => {
                let listener = tokio::net::UnixListener::bind(path)?;
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
                Ok(Listener::Unix(listener))
            }
            Listen::Tcp(address) => {
                Ok(Listener::Tcp(tokio::net::TcpListener::bind(address).await?))
            }
        }
    }
}

/// Set when the request's client went away before its answer was sent.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<CancelState>);

#[derive(Debug, Default)]
struct CancelState {
    flag: Arc<AtomicBool>,
    fired: tokio::sync::Notify,
}

impl Cancel {
    /// Whether the client went away.
    pub fn is_cancelled(&self) -> bool {
        self.0.flag.load(Ordering::Relaxed)
    }

    /// The flag itself, for code that polls an `AtomicBool` (whisper.cpp's abort
    /// callback).
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.0.flag.clone()
    }

    /// Fires it.
    pub fn cancel(&self) {
        self.0.flag.store(true, Ordering::Relaxed);
        self.0.fired.notify_waiters();
    }

    /// Resolves once it fires.
    pub async fn cancelled(&self) {
        loop {
            let fired = self.0.fired.notified();
            if self.is_cancelled() {
                return;
            }
            fired.await;
        }
    }
}

/// Fires the request's [`Cancel`] unless the answer was produced first.
struct CancelOnDrop {
    cancel: Cancel,
    answered: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.answered {
            self.cancel.cancel();
        }
    }
}

/// One request as a handler sees it: its head, its whole body, and its [`Cancel`].
#[derive(Debug)]
pub struct WorkerRequest {
    /// The headers.
    pub headers: HeaderMap,
    /// The body, read whole (bounded by [`WorkerServer::max_body`]).
    pub body: Bytes,
    /// Fires when the client goes away.
    pub cancel: Cancel,
}

impl WorkerRequest {
    /// The `Content-Type` header, if any.
    pub fn content_type(&self) -> Option<&str> {
        self.headers.get(CONTENT_TYPE)?.to_str().ok()
    }
}

/// An answer.
pub type WorkerResponse = Response<BoxBody<Bytes, Infallible>>;

/// A route's handler.
pub type Handler = Arc<dyn Fn(WorkerRequest) -> BoxFuture<'static, WorkerResponse> + Send + Sync>;

/// A failure, answered as `{"error": {"message", "type", "param", "code", "details"}}`
/// (OpenAI's shape, with Arcane's stable code and the offending value in `details`).
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// Arcane's stable code (`AUDIO_UNSUPPORTED`, `ARCANE_USAGE`, …).
    pub code: &'static str,
    /// What went wrong, naming the offending value.
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<&'static str>,
    /// The offending values.
    pub details: Value,
}

impl ApiError {
    /// A 400 `ARCANE_USAGE` about `param`.
    pub fn usage(param: &'static str, message: impl Into<String>, details: Value) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: arcane_report::codes::ARCANE_USAGE,
            message: message.into(),
            param: Some(param),
            details,
        }
    }

    /// A 500 `LOCAL_AI_SERVER_FAILED`: the engine itself failed.
    pub fn failed(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: arcane_report::codes::LOCAL_AI_SERVER_FAILED,
            message: message.into(),
            param: None,
            details: json!({}),
        }
    }

    /// `ARCANE_CANCELLED` with nginx's 499 (client closed request): nobody reads it,
    /// the client went away, but the worker's log says so.
    pub fn cancelled(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            code: arcane_report::codes::ARCANE_CANCELLED,
            message: message.into(),
            param: None,
            details: json!({}),
        }
    }

    /// The answer.
    pub fn response(&self) -> WorkerResponse {
        json_response(self.status, &json!({"error": self.body()}))
    }

    /// The `error` object of the answer (also what an event stream's `error` event
    /// carries): `{"message", "type", "param", "code", "details"}`.
    pub fn body(&self) -> Value {
        let kind = match self.status.as_u16() {
            401 => "authentication_error",
            404 => "not_found_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        json!({
            "message": self.message,
            "type": kind,
            "param": self.param,
            "code": self.code,
            "details": self.details,
        })
    }
}

/// A JSON answer.
pub fn json_response(status: StatusCode, body: &Value) -> WorkerResponse {
    bytes_response(
        status,
        "application/json",
        Bytes::from(serde_json::to_vec(body).unwrap_or_default()),
    )
}

/// An answer of `content_type`.
pub fn bytes_response(status: StatusCode, content_type: &str, body: Bytes) -> WorkerResponse {
    let mut response = Response::new(Full::new(body).boxed());
    *response.status_mut() = status;
    if let Ok(value) = HeaderValue::from_str(content_type) {
        response.headers_mut().insert(CONTENT_TYPE, value);
    }
    response
}

/// A `200` answer of `content_type` whose body is what is sent on the returned
/// channel, chunk by chunk as it comes, ending when the sender is dropped. When the
/// client goes away the body is dropped, so the sender's
/// [`closed`](tokio::sync::mpsc::Sender::closed) resolves: that is the stream's
/// cancellation (the request's [`Cancel`] no longer fires once the answer began).
pub fn body_stream(
    content_type: &str,
    capacity: usize,
) -> (tokio::sync::mpsc::Sender<Bytes>, WorkerResponse) {
    let (sender, receiver) = tokio::sync::mpsc::channel::<Bytes>(capacity.max(1));
    let frames = futures_util::stream::unfold(receiver, |mut receiver| async move {
        let chunk = receiver.recv().await?;
        Some((Ok::<_, Infallible>(Frame::data(chunk)), receiver))
    });
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(frames)));
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(content_type) {
        headers.insert(CONTENT_TYPE, value);
    }
    headers.insert(
        hyper::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    (sender, response)
}

/// A `200 text/event-stream` [`body_stream`]: what is sent are whole SSE frames
/// ([`sse_frame`]).
pub fn event_stream(capacity: usize) -> (tokio::sync::mpsc::Sender<Bytes>, WorkerResponse) {
    body_stream("text/event-stream", capacity)
}

/// One server-sent event: `event: NAME` and `data: JSON` (NAME is also the `type` of
/// the events of OpenAI's streamed audio, which clients read from `data`).
pub fn sse_frame(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// A named part of a `multipart/form-data` body.
#[derive(Debug, Clone)]
pub struct FormField {
    /// The field's name.
    pub name: String,
    /// The file name, for a file part.
    pub file_name: Option<String>,
    /// Its bytes.
    pub data: Bytes,
}

/// The most parts a `multipart/form-data` body may have (OpenAI's transcription has
/// eight fields; a body of a million empty parts is refused rather than listed).
pub const MAX_FORM_FIELDS: usize = 64;

/// The parts of a `multipart/form-data` body (what OpenAI's audio uploads are), or a
/// 400 naming what is wrong with it (at most [`MAX_FORM_FIELDS`] parts).
pub async fn form_fields(request: &WorkerRequest) -> Result<Vec<FormField>, ApiError> {
    let content_type = request.content_type().unwrap_or("");
    let boundary = multer::parse_boundary(content_type).map_err(|_| {
        ApiError::usage(
            "file",
            format!("the body must be `multipart/form-data` with a boundary, not `{content_type}`"),
            json!({"contentType": content_type}),
        )
    })?;
    let body = request.body.clone();
    let stream = futures_util::stream::once(async move { Ok::<_, Infallible>(body) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    let mut fields = Vec::new();
    loop {
        let field = multipart.next_field().await.map_err(|e| {
            ApiError::usage(
                "file",
                format!("the multipart body cannot be read: {e}"),
                json!({}),
            )
        })?;
        let Some(field) = field else { break };
        if fields.len() == MAX_FORM_FIELDS {
            return Err(ApiError {
                param: None,
                ..ApiError::usage(
                    "file",
                    format!("the multipart body has more than {MAX_FORM_FIELDS} fields"),
                    json!({"limit": MAX_FORM_FIELDS}),
                )
            });
        }
        let name = field.name().unwrap_or("").to_string();
        let file_name = field.file_name().map(str::to_string);
        let data = field.bytes().await.map_err(|e| {
            ApiError::usage(
                "file",
                format!("the multipart field `{name}` cannot be read: {e}"),
                json!({"field": name}),
            )
        })?;
        fields.push(FormField {
            name,
            file_name,
            data,
        });
    }
    Ok(fields)
}

/// A worker's routes and limits.
pub struct WorkerServer {
    routes: HashMap<(Method, &'static str), Handler>,
    /// What the 404 lists.
    paths: Vec<&'static str>,
    /// The largest body read, in bytes.
    pub max_body: usize,
    key: Option<String>,
}

impl std::fmt::Debug for WorkerServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerServer")
            .field("paths", &self.paths)
            .finish()
    }
}

impl WorkerServer {
    /// A server answering `GET /health` only, reading bodies up to `max_body` bytes.
    pub fn new(max_body: usize) -> Self {
        Self {
            routes: HashMap::new(),
            paths: Vec::new(),
            max_body,
            key: None,
        }
    }

    /// Answers `method path` with `handler`.
    pub fn route(mut self, method: Method, path: &'static str, handler: Handler) -> Self {
        self.routes.insert((method, path), handler);
        if !self.paths.contains(&path) {
            self.paths.push(path);
        }
        self
    }

    /// Demands the key in `file` (its contents, trimmed) as `Authorization: Bearer`.
    pub fn key_file(mut self, file: Option<&Path>) -> std::io::Result<Self> {
        if let Some(file) = file {
            let key = std::fs::read_to_string(file)?.trim().to_string();
            if key.is_empty() {
                return Err(std::io::Error::other(format!(
                    "the key file `{}` is empty",
                    file.display()
                )));
            }
            self.key = Some(key);
        }
        Ok(self)
    }

    /// Serves until the process ends (the supervisor stops it by signal).
    pub async fn serve(self, listen: Listen) -> std::io::Result<()> {
        let listener = Listener::bind(&listen).await?;
        self.serve_on(listener).await
    }

    /// Serves on a listener already bound (so a caller knows it listens).
    pub async fn serve_on(self, listener: Listener) -> std::io::Result<()> {
        let server = Arc::new(self);
        loop {
            match &listener {
                Listener::Unix(listener) => server.clone().connection(listener.accept().await?.0),
                Listener::Tcp(listener) => server.clone().connection(listener.accept().await?.0),
            }
        }
    }

    fn connection<S>(self: Arc<Self>, stream: S)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let server = self.clone();
            async move { Ok::<_, Infallible>(server.answer(request).await) }
        });
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            // A connection that ends mid-request drops the request's future: its
            // `Cancel` fires.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }

    async fn answer(&self, request: Request<Incoming>) -> WorkerResponse {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path();
        if parts.method == Method::GET && path == "/health" {
            return json_response(StatusCode::OK, &json!({"status": "ok"}));
        }
        if let Some(key) = &self.key {
            let presented = parts
                .headers
                .get(AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            if presented != Some(key.as_str()) {
                return ApiError {
                    status: StatusCode::UNAUTHORIZED,
                    code: arcane_report::codes::CORE_UNAUTHORIZED,
                    message: "this engine answers only the Arcane Core that started it".into(),
                    param: None,
                    details: json!({}),
                }
                .response();
            }
        }
        let Some(handler) = self.routes.get(&(parts.method.clone(), path)).cloned() else {
            return self.unrouted(&parts.method, path);
        };
        let body = match Limited::new(body, self.max_body).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) => return self.unreadable(error),
        };
        let mut guard = CancelOnDrop {
            cancel: Cancel::default(),
            answered: false,
        };
        let response = handler(WorkerRequest {
            headers: parts.headers,
            body,
            cancel: guard.cancel.clone(),
        })
        .await;
        guard.answered = true;
        response
    }

    fn unrouted(&self, method: &Method, path: &str) -> WorkerResponse {
        let served = self.paths.contains(&path) || path == "/health";
        let (status, message) = if served {
            (
                StatusCode::METHOD_NOT_ALLOWED,
                format!("`{method} {path}` is not answered here"),
            )
        } else {
            (
                StatusCode::NOT_FOUND,
                format!(
                    "`{path}` is not served by this model: it answers {}",
                    self.paths.join(", ")
                ),
            )
        };
        ApiError {
            status,
            code: arcane_report::codes::ARCANE_NOT_FOUND,
            message,
            param: None,
            details: json!({"path": path, "served": self.paths}),
        }
        .response()
    }

    fn unreadable(&self, error: Box<dyn std::error::Error + Send + Sync>) -> WorkerResponse {
        let too_large = error.is::<http_body_util::LengthLimitError>();
        if too_large {
            ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                code: arcane_report::codes::ARCANE_USAGE,
                message: format!("the body is larger than {} bytes", self.max_body),
                param: Some("file"),
                details: json!({"limit": self.max_body}),
            }
            .response()
        } else {
            ApiError::usage(
                "file",
                format!("the body could not be read: {error}"),
                json!({}),
            )
            .response()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixStream;

    use super::*;

    /// A server on a socket in `dir` demanding the key `k3y`: `POST /echo` answers the
    /// body's length, `POST /wait` hands its request's [`Cancel`] to `waiting` and never
    /// answers.
    async fn start(dir: &Path) -> (PathBuf, tokio::sync::mpsc::UnboundedReceiver<Cancel>) {
        let key = dir.join("key");
        std::fs::write(&key, "k3y\n").unwrap();
        let (waiting_tx, waiting) = tokio::sync::mpsc::unbounded_channel();
        let server = WorkerServer::new(16)
            .route(
                Method::POST,
                "/echo",
                Arc::new(|request: WorkerRequest| {
                    Box::pin(async move {
                        json_response(StatusCode::OK, &json!({"bytes": request.body.len()}))
                    })
                }),
            )
            .route(
                Method::POST,
                "/wait",
                Arc::new(move |request: WorkerRequest| {
                    let _ = waiting_tx.send(request.cancel.clone());
                    Box::pin(std::future::pending())
                }),
            )
            .key_file(Some(&key))
            .unwrap();
        let socket = dir.join("w.sock");
        let listener = Listener::bind(&Listen::Socket(socket.clone()))
            .await
            .unwrap();
        tokio::spawn(server.serve_on(listener));
        (socket, waiting)
    }

    async fn exchange(socket: &Path, request: &str) -> String {
        let mut stream = UnixStream::connect(socket).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    fn post(path: &str, key: Option<&str>, body: &str) -> String {
        let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn the_door_demands_the_key_bounds_bodies_and_names_what_it_serves() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, _) = start(dir.path()).await;
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Health needs no key and says only that it is ready.
        let health = exchange(
            &socket,
            "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(health.starts_with("HTTP/1.1 200"), "{health}");
        assert!(health.ends_with(r#"{"status":"ok"}"#), "{health}");
        for key in [None, Some("wrong")] {
            let refused = exchange(&socket, &post("/echo", key, "hi")).await;
            assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
            assert!(refused.contains("CORE_UNAUTHORIZED"), "{refused}");
        }
        let echoed = exchange(&socket, &post("/echo", Some("k3y"), "hello")).await;
        assert!(echoed.starts_with("HTTP/1.1 200"), "{echoed}");
        assert!(echoed.ends_with(r#"{"bytes":5}"#), "{echoed}");
        // No page of another origin may read an answer.
        assert!(
            !echoed.to_ascii_lowercase().contains("access-control"),
            "{echoed}"
        );
        let large = exchange(&socket, &post("/echo", Some("k3y"), &"x".repeat(17))).await;
        assert!(large.starts_with("HTTP/1.1 413"), "{large}");
        assert!(large.contains(r#""limit":16"#), "{large}");
        let unknown = exchange(&socket, &post("/load", Some("k3y"), "")).await;
        assert!(unknown.starts_with("HTTP/1.1 404"), "{unknown}");
        assert!(
            unknown.contains("/echo") && unknown.contains("/wait"),
            "{unknown}"
        );
        let method = exchange(
            &socket,
            "GET /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(method.starts_with("HTTP/1.1 405"), "{method}");
    }

    #[tokio::test]
    async fn a_client_that_goes_away_fires_its_requests_cancel() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, mut waiting) = start(dir.path()).await;
        let mut stream = UnixStream::connect(&socket).await.unwrap();
        stream
            .write_all(post("/wait", Some("k3y"), "").as_bytes())
            .await
            .unwrap();
        let cancel = waiting.recv().await.expect("the handler ran");
        assert!(!cancel.is_cancelled(), "fired while the client waits");
        drop(stream);
        tokio::time::timeout(Duration::from_secs(10), cancel.cancelled())
            .await
            .expect("the cancel never fired");
        assert!(cancel.flag().load(Ordering::Relaxed));
    }
}
