//! The HTTP side of Arcane's own engines (`arcane __whisper-worker`, `arcane
//! __piper-worker`): a small server for one model, behind the Core.
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
//!   transcription nobody waits for stops;
//! * every failure is a JSON answer in OpenAI's shape with Arcane's stable code:
//!   `{"error": {"message", "type", "param", "code", "details"}}`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use crate::service::BoxFuture;

/// Where a worker listens.
#[derive(Debug, Clone)]
pub enum Listen {
    /// A Unix socket path (created here, mode 0600).
    Socket(PathBuf),
    /// A loopback address.
    Tcp(std::net::SocketAddr),
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
pub type WorkerResponse = Response<Full<Bytes>>;

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
        let kind = match self.status.as_u16() {
            401 => "authentication_error",
            404 => "not_found_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        json_response(
            self.status,
            &json!({"error": {
                "message": self.message,
                "type": kind,
                "param": self.param,
                "code": self.code,
                "details": self.details,
            }}),
        )
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
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    if let Ok(value) = HeaderValue::from_str(content_type) {
        response.headers_mut().insert(CONTENT_TYPE, value);
    }
    response
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

/// The parts of a `multipart/form-data` body (what OpenAI's audio uploads are), or a
/// 400 naming what is wrong with it.
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
    let stream = futures_once(body);
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

/// A stream of one chunk: the body read whole.
fn futures_once(
    body: Bytes,
) -> impl futures_core::Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    struct Once(Option<Bytes>);
    impl futures_core::Stream for Once {
        type Item = Result<Bytes, Infallible>;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            std::task::Poll::Ready(self.0.take().map(Ok))
        }
    }
    Once(Some(body))
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
        let server = Arc::new(self);
        match listen {
            Listen::Socket(path) => {
                let listener = tokio::net::UnixListener::bind(&path)?;
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
                loop {
                    let (stream, _) = listener.accept().await?;
                    server.clone().connection(stream);
                }
            }
            Listen::Tcp(address) => {
                let listener = tokio::net::TcpListener::bind(address).await?;
                loop {
                    let (stream, _) = listener.accept().await?;
                    server.clone().connection(stream);
                }
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
