//! The loopback HTTP transport: `arcane/1` endpoints, the SSE event stream and the
//! engine's whole API (the passthrough), all behind one bearer token.
//!
//! # Admission (every endpoint, before anything runs)
//!
//! 1. `Host` must name the listener on a loopback name (`127.0.0.1:<port>`,
//!    `localhost:<port>`, `[::1]:<port>`), else **421** (defeats DNS rebinding).
//! 2. An `Origin` header, if present, must be the listener's own origin or one the
//!    user allows ([`HttpOptions::allowed_origins`], see [`crate::origins`]), else
//!    **403**. A CORS preflight from an allowed origin is answered here (204, no
//!    token: browsers send none), and every answer to such a page carries its CORS
//!    headers.
//! 3. `Authorization: Bearer <token>` or `x-api-key: <token>` (Anthropic's clients)
//!    must match `core.json`'s token (compared in constant time), else **401** with
//!    `WWW-Authenticate: Bearer`; both headers naming different tokens is a 401 too.
//!    `GET /v1/events` also accepts `?token=` because `EventSource` cannot send
//!    headers.
//!
//! Each refusal has one fixed body, whatever was wrong with the token.
//!
//! # Endpoints
//!
//! Dispatch goes through the route table of [`crate::router`]: the Core's rows below,
//! the gateway's own answers (`GET /v1/models[/{id}]`, `GET /metrics`, when it routes
//! by model), Ollama's API (`/api/*`, translated by [`crate::apis::ollama`], when it routes
//! by model), then the engines' API paths. A path no row serves is, with the gateway,
//! the Core's 404 (`ARCANE_NOT_FOUND`; nothing loads), and with a single engine
//! forwarded to it (its own answer).
//!
//! | method and path | content |
//! |---|---|
//! | `GET /v1/health` | `{protocol, state, pid, services[]}` |
//! | `POST /v1/rpc` | one request frame → its response frame (HTTP 200 even when `ok:false`; 400 for a malformed frame, 413 over the body limit, 503 while shutting down). `X-Arcane-Client: <id>` selects the client's id space and SSE stream; without it every POST gets a fresh id space. |
//! | `POST /v1/control` | one control frame for the client named by `X-Arcane-Client` → `{ok, result}` |
//! | `GET /v1/events?client=<id>` | SSE (`data: <frame>` per message): the replay first, then events; the client's request events and a copy of its responses |
//! | `GET /health` | no token: only `{"status": "ok" \| "loading" \| "error"}` |
//! | the engines' paths | the engine's own API, forwarded by [`crate::passthrough`] |
//!
//! # Deadlines and the drain
//!
//! Every exchange with an engine or a host goes through [`EngineClient::send`] with
//! [`Deadlines`]: connecting, then the response head, each bounded; a body then gets an
//! idle (stall) deadline between two pieces, never a total one, so a long stream runs
//! as long as it keeps moving.
//!
//! A passthrough exchange is accepted work of the host ([`Host::accept_work`]), counted
//! like an RPC until its response body has been sent to the end: a shutdown waits for it
//! (bounded by the host's drain deadline), then cuts what is left, which closes the
//! upstream connection, before any engine is stopped.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arcane_report::{codes, error_json, Diagnostic};
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::router::{self, Handler, Lookup};
use arcane_core::dispatch::{self, Client, Dispatch, FrameSink, Session};
use arcane_core::endpoint::constant_time_eq;
use arcane_core::host::Host;
use arcane_core::keys::Principal;
use arcane_core::protocol::{
    parse_incoming, Incoming as Frame_, Response as RpcResponse, PROTOCOL,
};
use arcane_core::Error;

pub use arcane_core::upstream::{
    collect, engine_client, full, stream_lines, BodyError, Deadlines, EngineAccess, EngineClient,
    HttpBody, Stalled, CONNECT_DEADLINE,
};

pub use crate::passthrough::{Upstream, UpstreamTarget};

/// Options of the HTTP transport.
#[derive(Clone)]
#[non_exhaustive]
pub struct HttpOptions {
    /// The bearer token every request must present.
    pub token: String,
    /// The largest accepted request body (RPC and control frames), in bytes.
    pub max_body: usize,
    /// The passthrough target, if any engine is selected.
    pub upstream: Option<Arc<dyn Upstream>>,
    /// How long to wait for open HTTP exchanges after the host closed.
    pub grace: Duration,
    /// Header-read and idle timeouts and the connection cap.
    pub limits: crate::limits::ConnectionLimits,
    /// The workspace's token file: when set, a changed file (`arcane token rotate`)
    /// replaces `token` at once, on the next request.
    pub token_file: Option<std::path::PathBuf>,
    /// Origins besides the listener's own whose pages may read answers (CORS).
    pub allowed_origins: crate::origins::AllowedOrigins,
    /// The host's log lines, for `GET /v1/logs` (none: that path is a 404).
    pub logs: Option<Arc<arcane_core::logs::LogBook>>,
    /// The application's packaged web, served at `/ui/app/` with the dashboard's
    /// session (none: those paths are a 404).
    pub web: Option<Arc<crate::web::WebRoot>>,
    /// The application keys ([`arcane_core::keys`]) admitted beside the token (none:
    /// only the token is).
    pub keys: Option<Arc<arcane_core::keys::KeyBook>>,
    /// The dashboard's clock: its login codes and sessions expire by it
    /// ([`crate::ui::session`]); tests inject one to expire a code without sleeping.
    pub ui_clock: crate::ui::Clock,
}

impl HttpOptions {
    /// Options with `token` and defaults (8 MiB bodies, no upstream, 5 s grace).
    pub fn new(token: impl Into<String>) -> Self {
        Self {
            token: token.into(),
            max_body: arcane_core::framing::DEFAULT_MAX_FRAME,
            upstream: None,
            grace: Duration::from_secs(5),
            limits: crate::limits::ConnectionLimits::default(),
            token_file: None,
            allowed_origins: crate::origins::AllowedOrigins::default(),
            logs: None,
            web: None,
            keys: None,
            ui_clock: crate::ui::system_clock(),
        }
    }

    /// Sets the passthrough target.
    pub fn upstream(mut self, upstream: Arc<dyn Upstream>) -> Self {
        self.upstream = Some(upstream);
        self
    }
}

/// Binds `address` (loopback), mapping "address in use" to [`Error::PortInUse`].
pub async fn bind(address: SocketAddr, saved_in: &std::path::Path) -> Result<TcpListener, Error> {
    TcpListener::bind(address).await.map_err(|source| {
        if source.kind() == std::io::ErrorKind::AddrInUse {
            Error::PortInUse {
                host: address.ip().to_string(),
                port: address.port(),
                saved_in: saved_in.to_path_buf(),
                source,
            }
        } else {
            Error::Io {
                operation: "bind",
                path: address.to_string().into(),
                source,
            }
        }
    })
}

struct Shared {
    host: Host,
    options: HttpOptions,
    hosts: Vec<String>,
    origins: Vec<String>,
    client: EngineClient,
    /// The listener's port (it names the dashboard's session cookie).
    port: u16,
    /// The dashboard's host and port, `<random label>.localhost:PORT`
    /// ([`crate::ui::dashboard_authority`]): its login links, and the only host name its
    /// sessions are accepted on.
    dashboard: String,
    /// The dashboard's login codes and sessions.
    sessions: crate::ui::Sessions,
    /// The token in force and the token file's identity when it was read.
    token: std::sync::RwLock<(String, Option<FileVersion>)>,
}

/// What identifies one version of the token file.
type FileVersion = (u64, u64, i64, i64, u64);

fn file_version(path: &std::path::Path) -> Option<FileVersion> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some((
        meta.dev(),
        meta.ino(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.len(),
    ))
}

impl Shared {
    /// The token requests must present: the token file's, reread when it changed (a
    /// rotation takes effect on the next request); the last good one when the file is
    /// unreadable.
    fn current_token(&self) -> String {
        let Some(path) = &self.options.token_file else {
            return self.options.token.clone();
        };
        let version = file_version(path);
        {
            let current = self.token.read().unwrap_or_else(|p| p.into_inner());
            if current.1 == version {
                return current.0.clone();
            }
        }
        let mut current = self.token.write().unwrap_or_else(|p| p.into_inner());
        if let Ok(Some(token)) = arcane_core::endpoint::read_token_file(path) {
            *current = (token, version);
        }
        current.0.clone()
    }
}

/// Serves HTTP on `listener` until the host closes, then waits up to the grace period
/// for open exchanges.
pub async fn serve(host: Host, listener: TcpListener, options: HttpOptions) -> Result<(), Error> {
    let address = listener.local_addr().map_err(|source| Error::Io {
        operation: "inspect",
        path: "the listener".into(),
        source,
    })?;
    let port = address.port();
    let mut hosts = vec![format!("localhost:{port}")];
    let mut origins = vec![format!("http://localhost:{port}")];
    let url = match address {
        SocketAddr::V4(v4) => format!("http://{}:{port}", v4.ip()),
        SocketAddr::V6(v6) => format!("http://[{}]:{port}", v6.ip()),
    };
    hosts.push(url.trim_start_matches("http://").to_string());
    origins.push(url);
    let label = crate::ui::dashboard_label().map_err(|source| Error::Io {
        operation: "read random bytes for",
        path: "the dashboard's host name".into(),
        source,
    })?;
    let dashboard = crate::ui::dashboard_authority(&label, port);
    hosts.push(dashboard.clone());
    origins.push(format!("http://{dashboard}"));
    let token_version = options.token_file.as_deref().and_then(file_version);
    let clock = std::sync::Arc::clone(&options.ui_clock);
    let shared = Arc::new(Shared {
        host: host.clone(),
        token: std::sync::RwLock::new((options.token.clone(), token_version)),
        options,
        hosts,
        origins,
        client: engine_client(),
        port,
        dashboard,
        sessions: crate::ui::Sessions::new(clock),
    });
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let (rotations, keys_in_force) = watch_credentials(Arc::clone(&shared));
    let limits = shared.options.limits;
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let unauthenticated = crate::limits::Unauthenticated::default();
    let mut refusing = false;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = host.closed() => break,
        };
        let Ok((stream, peer)) = accepted else {
            continue;
        };
        // 1. The connection cap: past it a new connection is closed at once, said once
        //    per burst.
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            if !std::mem::replace(&mut refusing, true) {
                host.publish_connection_limit(limits.max_connections);
            }
            drop(stream);
            continue;
        };
        refusing = false;
        let _ = stream.set_nodelay(true);
        // 2. Activity tracking for the idle timeout; a request counts as in flight until
        //    its response body is sent.
        let activity = crate::limits::Activity::new();
        unauthenticated.admit(&activity, peer.ip(), limits.max_unauthenticated);
        let shared = Arc::clone(&shared);
        let requests = Arc::clone(&activity);
        let service = hyper::service::service_fn(move |request| {
            let shared = Arc::clone(&shared);
            let connection = Arc::clone(&requests);
            let in_flight = requests.begin();
            async move {
                let response = handle(shared, request, &connection).await;
                Ok::<_, Infallible>(
                    response.map(|body| BoxBody::new(crate::limits::Guarded::new(body, in_flight))),
                )
            }
        });
        // 3. The header-read timeout, by hyper's own timer.
        let connection = hyper::server::conn::http1::Builder::new()
            .keep_alive(true)
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(limits.header_read)
            .serve_connection(
                TokioIo::new(crate::limits::Tracked::new(stream, Arc::clone(&activity))),
                service,
            );
        let connection = graceful.watch(connection);
        let mut rotated = rotations.clone();
        rotated.borrow_and_update();
        let mut keys_changed = keys_in_force.clone();
        keys_changed.borrow_and_update();
        tokio::spawn(async move {
            let _slot = slot;
            tokio::pin!(connection);
            loop {
                let authenticated = activity.is_authenticated();
                let idle = if authenticated {
                    limits.idle
                } else {
                    limits.unauthenticated_idle
                };
                // Dropping an idle connection closes it; nothing is in flight on it. A
                // rotation of the token closes it whatever it carries: its requests and
                // streams were admitted with the old token. One that has not presented
                // the token yet is closed when a newer one needs its room.
                tokio::select! {
                    _ = &mut connection => break,
                    () = activity.idle_for(idle) => break,
                    // (No token file: the watch's sender is gone and this never fires.)
                    Ok(()) = rotated.changed() => break,
                    // A revoked key's connections end, whatever they carry.
                    Ok(()) = keys_changed.changed() => {
                        let in_force = Arc::clone(&keys_changed.borrow_and_update());
                        if activity.holds_revoked_key(&in_force) {
                            break;
                        }
                    }
                    () = activity.changed(), if !authenticated => {
                        if activity.is_evicted() {
                            break;
                        }
                    }
                }
            }
        });
    }
    drop(listener);
    let grace = shared.options.grace;
    let _ = tokio::time::timeout(grace, graceful.shutdown()).await;
    Ok(())
}

/// How often the token file is looked at for a rotation (`arcane token rotate`).
const ROTATION_POLL: Duration = Duration::from_millis(250);

/// The names of the application keys in force, as the watcher last saw them.
type KeysInForce = Arc<std::collections::HashSet<Arc<str>>>;

/// Watches the token file and the keys file (when there are) until the host closes.
///
/// Each change of the token in force is a new generation, and every connection opened
/// before it is closed (its streams and keep-alive requests were admitted with the old
/// token). Each change of the keys in force is sent too: a connection that presented
/// a key no longer in force (`arcane token revoke`) is closed, its streams with it.
/// The same poll writes down when keys were last used.
fn watch_credentials(
    shared: Arc<Shared>,
) -> (
    tokio::sync::watch::Receiver<u64>,
    tokio::sync::watch::Receiver<KeysInForce>,
) {
    let (generation, rotations) = tokio::sync::watch::channel(0u64);
    let keys_now = || -> KeysInForce {
        Arc::new(
            shared
                .options
                .keys
                .as_ref()
                .map(|book| {
                    book.refresh();
                    book.names()
                })
                .unwrap_or_default(),
        )
    };
    let (in_force, keys) = tokio::sync::watch::channel(keys_now());
    if shared.options.token_file.is_none() && shared.options.keys.is_none() {
        return (rotations, keys);
    }
    let watched = Arc::clone(&shared);
    tokio::spawn(async move {
        let shared = watched;
        let mut token = shared.current_token();
        let mut ticks = tokio::time::interval(ROTATION_POLL);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = shared.host.closed() => break,
            }
            let now = shared.current_token();
            if now != token {
                token = now;
                generation.send_modify(|g| *g += 1);
            }
            if let Some(book) = &shared.options.keys {
                book.refresh();
                let names = book.names();
                in_force.send_if_modified(|current| {
                    let changed = **current != names;
                    if changed {
                        *current = Arc::new(names);
                    }
                    changed
                });
                book.flush_used();
            }
        }
        if let Some(book) = &shared.options.keys {
            book.flush_used();
        }
    });
    (rotations, keys)
}

pub(crate) fn json_response(status: StatusCode, value: &Value) -> Response<HttpBody> {
    let mut response = Response::new(full(value.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

pub(crate) fn error_response(status: StatusCode, error: &dyn Diagnostic) -> Response<HttpBody> {
    json_response(status, &json!({"error": error_json(error)}))
}

/// An error the front door answers itself for `path`: in the shape of the API the path
/// belongs to ([`crate::apis::error_body`]), else Arcane's `{error: {code, message,
/// details}}`.
fn own_error(
    path: &str,
    status: StatusCode,
    code: &'static str,
    message: &str,
    details: Value,
) -> Response<HttpBody> {
    let body = crate::apis::error_body(path, code, message).unwrap_or_else(
        || json!({"error": {"code": code, "message": message, "details": details}}),
    );
    json_response(status, &body)
}

fn refusal(path: &str, status: StatusCode, message: &'static str) -> Response<HttpBody> {
    let mut response = own_error(path, status, codes::CORE_UNAUTHORIZED, message, json!({}));
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer"),
        );
    }
    response
}

fn query_param<'a>(query: Option<&'a str>, name: &str) -> Option<&'a str> {
    query?.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then_some(value)
    })
}

/// Admission: Host, then Origin, then token. `None` means admitted.
fn admit(shared: &Shared, request: &Request<Incoming>) -> Option<Response<HttpBody>> {
    admit_door(shared, request)
        .or_else(|| admit_token(shared, request).err().map(|refused| *refused))
}

/// The first two steps of admission, for every path: `Host`, then `Origin`.
fn admit_door(shared: &Shared, request: &Request<Incoming>) -> Option<Response<HttpBody>> {
    let headers = request.headers();
    let host_ok = headers
        .get(hyper::header::HOST)
        .and_then(|h| h.to_str().ok())
        .is_some_and(|h| {
            shared
                .hosts
                .iter()
                .any(|allowed| allowed.eq_ignore_ascii_case(h))
        });
    if !host_ok {
        return Some(refusal(
            request.uri().path(),
            StatusCode::MISDIRECTED_REQUEST,
            "the `Host` header must name the loopback listener",
        ));
    }
    if let Some(origin) = headers.get(hyper::header::ORIGIN) {
        let allowed = origin.to_str().is_ok_and(|o| {
            shared
                .origins
                .iter()
                .any(|allowed| allowed.eq_ignore_ascii_case(o))
                || shared.options.allowed_origins.allows(o)
        });
        if !allowed {
            return Some(refusal(
                request.uri().path(),
                StatusCode::FORBIDDEN,
                "cross-origin requests are refused",
            ));
        }
    }
    None
}

/// The last step of admission: the credential (all but `GET /health`), the workspace
/// token or an application key ([`arcane_core::keys`]), turned into the [`Principal`]
/// the request acts as. `Ok(None)`: `GET /health`, which needs none.
fn admit_token(
    shared: &Shared,
    request: &Request<Incoming>,
) -> Result<Option<Principal>, Box<Response<HttpBody>>> {
    let headers = request.headers();
    // The one endpoint that needs no token: `GET /health` says only ok/loading/error.
    if request.method() == Method::GET && request.uri().path() == "/health" {
        return Ok(None);
    }
    let expected = shared.current_token();
    let expected = expected.as_bytes();
    // `Authorization: <scheme> <token>`; the scheme is case-insensitive (RFC 9110 §11.1).
    // Ollama's clients send their key the same way (`OLLAMA_API_KEY`).
    let from_header = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let from_query = (request.method() == Method::GET && request.uri().path() == "/v1/events")
        .then(|| query_param(request.uri().query(), "token"))
        .flatten();
    // `x-api-key: <token>` (Anthropic's clients, litellm's `anthropic/`) is the same
    // token; both headers naming different tokens is refused.
    let from_api_key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let disagree = matches!((from_header, from_api_key),
        (Some(bearer), Some(key)) if !constant_time_eq(bearer.as_bytes(), key.as_bytes()));
    let presented = from_header.or(from_api_key).or(from_query).unwrap_or("");
    let refused = || {
        Box::new(refusal(
            request.uri().path(),
            StatusCode::UNAUTHORIZED,
            "a valid bearer token is required (the workspace's token is what `arcane token show` prints, or an application's key from `arcane token add`)",
        ))
    };
    if disagree || presented.is_empty() {
        return Err(refused());
    }
    if !expected.is_empty() && constant_time_eq(presented.as_bytes(), expected) {
        return Ok(Some(Principal::workspace()));
    }
    shared
        .options
        .keys
        .as_ref()
        .and_then(|book| book.principal(presented))
        .map(Some)
        .ok_or_else(refused)
}

async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    connection: &crate::limits::Activity,
) -> Response<HttpBody> {
    // A page of an allowed origin may read every answer, refusals included.
    let Some(origin) = shared.options.allowed_origins.of_request(request.headers()) else {
        return answer(shared, request, connection).await;
    };
    let mut response = if is_preflight(&request) && preflight_admissible(&shared, &request) {
        preflight(&origin, &request)
    } else {
        answer(shared, request, connection).await
    };
    crate::origins::AllowedOrigins::decorate(&origin, response.headers_mut());
    response
}

/// A CORS preflight: `OPTIONS` with `Access-Control-Request-Method`.
fn is_preflight(request: &Request<Incoming>) -> bool {
    request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(hyper::header::ACCESS_CONTROL_REQUEST_METHOD)
}

/// A preflight carries no token (browsers never send one): it is admitted on `Host`
/// and `Origin` alone, which [`admit`] checks before the token.
fn preflight_admissible(shared: &Shared, request: &Request<Incoming>) -> bool {
    match admit(shared, request) {
        None => true,
        Some(refused) => refused.status() == StatusCode::UNAUTHORIZED,
    }
}

/// The preflight's answer: 204 with what may be sent, or 403 when the page asks for a
/// method or header the Core does not take from pages.
fn preflight(origin: &HeaderValue, request: &Request<Incoming>) -> Response<HttpBody> {
    match crate::origins::AllowedOrigins::preflight(origin, request.headers()) {
        Some(headers) => {
            let mut response = Response::new(full(Bytes::new()));
            *response.status_mut() = StatusCode::NO_CONTENT;
            response.headers_mut().extend(headers);
            response
        }
        None => refusal(
            request.uri().path(),
            StatusCode::FORBIDDEN,
            "the preflight asks for a method or header the Core does not take from pages",
        ),
    }
}

async fn answer(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    connection: &crate::limits::Activity,
) -> Response<HttpBody> {
    if let Some(refused) = admit_door(&shared, &request) {
        return refused;
    }
    let path = request.uri().path().to_string();
    let upstream = shared.options.upstream.as_deref();
    let routes_by_model = upstream.is_some_and(|u| u.routes_by_model());
    let engines_serve = |path: &str| upstream.is_some_and(|u| u.serves(path));
    let lookup = router::lookup(
        router::TABLE,
        &engines_serve,
        request.method(),
        &path,
        routes_by_model,
    );
    // The dashboard's paths are admitted by its session, never by the token.
    if let Lookup::Found(handler) = lookup {
        if handler.is_dashboard() {
            let mut response = dashboard(&shared, handler, request, connection).await;
            // The app's pages run under its own policy; the dashboard's under the
            // dashboard's (no inline style at all).
            match handler {
                Handler::UiWeb => crate::web::secure(response.headers_mut()),
                _ => crate::ui::secure(response.headers_mut()),
            }
            return response;
        }
    }
    if lookup == Lookup::Found(Handler::AppMoved) {
        return app_moved(&request);
    }
    let principal = match admit_token(&shared, &request) {
        Ok(principal) => principal,
        Err(refused) => return *refused,
    };
    let mut request = request;
    // Admitted with a credential (only `GET /health` is admitted without one): the
    // connection now counts among the authenticated, and what the credential may do
    // is checked before anything runs.
    if let Some(principal) = principal {
        connection.authenticate();
        if !principal.is_admin() {
            connection.presented_key(&principal.name);
        }
        if let Err(refused) = crate::scopes::permit(&principal, lookup, request.method(), &path) {
            return *refused;
        }
        request.extensions_mut().insert(principal);
    }
    dispatch(&shared, lookup, request, None).await
}

/// Answers an admitted request by the handler `lookup` found; `rpc_methods`, when
/// set, are the only methods `POST /v1/rpc` may call (the dashboard's).
async fn dispatch(
    shared: &Shared,
    lookup: Lookup,
    request: Request<Incoming>,
    rpc_methods: Option<&[&str]>,
) -> Response<HttpBody> {
    let path = request.uri().path().to_string();
    let upstream = shared.options.upstream.as_deref();
    let routes_by_model = upstream.is_some_and(|u| u.routes_by_model());
    let handler = match lookup {
        Lookup::Found(handler) => handler,
        Lookup::MethodNotAllowed => return method_not_allowed(&path),
        // With a single engine, any other path is the engine's (its own answer, 404
        // included); with the gateway, an unknown path loads nothing.
        Lookup::Unknown if upstream.is_some() && !routes_by_model => Handler::Engine,
        Lookup::Unknown => return not_found(&path, upstream.is_some()),
    };
    match handler {
        Handler::Health => health(shared),
        Handler::CoreHealth => core_health(shared),
        Handler::Rpc => rpc(shared, request, rpc_methods).await,
        Handler::Control => control(shared, request).await,
        Handler::Events => events(shared, &request),
        Handler::Logs => logs(shared, &request),
        Handler::Api(endpoint) => match upstream {
            Some(upstream) => {
                crate::apis::handle(&shared.host, upstream, &shared.client, endpoint, request).await
            }
            None => not_found(&path, false),
        },
        Handler::ModelList | Handler::ModelEntry | Handler::Metrics | Handler::Engine => {
            engine_api(shared, handler, &path, request).await
        }
        // A dashboard path is never the target of a dashboard call.
        Handler::UiPage
        | Handler::UiAsset
        | Handler::UiLogin
        | Handler::UiLogout
        | Handler::UiApi
        | Handler::UiWeb
        | Handler::AppMoved => not_found(&path, upstream.is_some()),
    }
}

/// A refusal of the dashboard's, with its stable code.
fn ui_refusal(status: StatusCode, error: &crate::ui::UiError) -> Response<HttpBody> {
    error_response(status, error)
}

/// An embedded page or file of the dashboard.
fn ui_asset(asset: crate::ui::assets::Asset) -> Response<HttpBody> {
    let mut response = Response::new(full(asset.body));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    response
}

/// The dashboard's paths, admitted by its own rules ([`crate::ui`]): the page and its
/// files for anyone, the login for a code from the own origin, everything else for a
/// live session from the own origin.
async fn dashboard(
    shared: &Shared,
    handler: Handler,
    request: Request<Incoming>,
    connection: &crate::limits::Activity,
) -> Response<HttpBody> {
    use crate::ui::{self, UiError};
    // A session is believed only on the dashboard's own host name, the one its cookie
    // was set for (see `ui::dashboard_authority`).
    let own_host = request
        .headers()
        .get(hyper::header::HOST)
        .and_then(|h| h.to_str().ok())
        .is_some_and(|h| h.eq_ignore_ascii_case(&shared.dashboard));
    let session = ui::session_cookie(request.headers(), shared.port)
        .filter(|_| own_host)
        .and_then(|s| {
            let scope = shared.sessions.check(&s, &shared.current_token()).ok()?;
            Some((s, scope))
        });
    match handler {
        Handler::UiAsset => {
            return match ui::assets::file(request.uri().path()) {
                Some(asset) => ui_asset(asset),
                None => not_found(request.uri().path(), false),
            }
        }
        Handler::UiPage if session.is_some() => return ui_asset(ui::assets::DASHBOARD),
        Handler::UiPage => return ui_asset(ui::assets::LOGIN),
        // The app's files: its session only. A navigation from elsewhere carries no
        // cookie (`SameSite=Strict`), and a static file changes nothing.
        Handler::UiWeb => return packaged_web(shared, session.is_some(), &request),
        _ => {}
    }
    if let Err(error) = ui::same_origin(request.headers(), &shared.origins) {
        return ui_refusal(StatusCode::FORBIDDEN, &error);
    }
    if handler == Handler::UiLogin {
        if !own_host {
            return ui_refusal(StatusCode::FORBIDDEN, &UiError::HostRefused);
        }
        return ui_login(shared, request).await;
    }
    let Some((session, scope)) = session else {
        return ui_refusal(StatusCode::UNAUTHORIZED, &UiError::SessionRequired);
    };
    connection.authenticate();
    if handler == Handler::UiLogout {
        shared.sessions.end(&session);
        let mut response = Response::new(full(Bytes::new()));
        *response.status_mut() = StatusCode::NO_CONTENT;
        if let Ok(value) = HeaderValue::from_str(&ui::clear_cookie(shared.port)) {
            response
                .headers_mut()
                .insert(hyper::header::SET_COOKIE, value);
        }
        return response;
    }
    // `/ui/api/*`: the same handler as the path it stands for, without the cookie.
    let target = match ui::api_target(request.method(), request.uri().path()) {
        Ok(target) => target,
        Err(error) => return ui_refusal(StatusCode::NOT_FOUND, &error),
    };
    let (mut parts, body) = request.into_parts();
    let uri = match parts.uri.query() {
        Some(query) => format!("{target}?{query}"),
        None => target.to_string(),
    };
    let Ok(uri) = uri.parse::<hyper::Uri>() else {
        return ui_refusal(
            StatusCode::NOT_FOUND,
            &UiError::NoEndpoint {
                path: parts.uri.path().to_string(),
            },
        );
    };
    parts.uri = uri;
    parts.headers.remove(hyper::header::COOKIE);
    scope_client(&mut parts, &scope);
    let request = Request::from_parts(parts, body);
    let upstream = shared.options.upstream.as_deref();
    let engines_serve = |path: &str| upstream.is_some_and(|u| u.serves(path));
    let lookup = router::lookup(
        router::TABLE,
        &engines_serve,
        request.method(),
        target,
        upstream.is_some_and(|u| u.routes_by_model()),
    );
    dispatch(shared, lookup, request, Some(ui::RPC_METHODS)).await
}

/// Puts the client name a dashboard call gives (`X-Arcane-Client`, `?client=`) in the
/// session's own space ([`crate::ui::scoped_client`]): a session acts only as itself.
fn scope_client(parts: &mut hyper::http::request::Parts, scope: &str) {
    use crate::ui::scoped_client;
    let named = parts
        .headers
        .get("x-arcane-client")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    parts.headers.remove("x-arcane-client");
    if let Some(value) = named.and_then(|n| HeaderValue::from_str(&scoped_client(scope, &n)).ok()) {
        parts.headers.insert("x-arcane-client", value);
    }
    let Some(query) = parts.uri.query() else {
        return;
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some(("client", name)) => format!("client={}", scoped_client(scope, name)),
            _ if pair == "client" => String::new(),
            _ => pair.to_string(),
        })
        .collect();
    let path = parts.uri.path().to_string();
    // A query that no longer parses (it cannot: the scope is hex) is dropped whole, so
    // no unscoped name ever passes.
    match format!("{path}?{}", query.join("&")).parse() {
        Ok(uri) => parts.uri = uri,
        Err(_) => parts.uri = path.parse().unwrap_or_default(),
    }
}

/// `GET /ui/app/…`: the application's packaged web ([`crate::web`]) for a session.
fn packaged_web(shared: &Shared, session: bool, request: &Request<Incoming>) -> Response<HttpBody> {
    let path = request.uri().path();
    let Some(web) = &shared.options.web else {
        return not_found(path, false);
    };
    if !session {
        return ui_refusal(
            StatusCode::UNAUTHORIZED,
            &crate::ui::UiError::SessionRequired,
        );
    }
    match path.strip_prefix("/ui/app") {
        // `/ui/app` itself: its directory, so relative links resolve under it.
        Some("") => moved("/ui/app/"),
        Some(below) => web.answer(request.method(), below, request.headers()),
        None => not_found(path, false),
    }
}

/// A permanent redirect to `location` (a path of this origin).
fn moved(location: &str) -> Response<HttpBody> {
    let mut response = Response::new(full(Bytes::new()));
    *response.status_mut() = StatusCode::PERMANENT_REDIRECT;
    if let Ok(value) = HeaderValue::from_str(location) {
        response
            .headers_mut()
            .insert(hyper::header::LOCATION, value);
    }
    response
}

/// `/app/…` → `/ui/app/…`: reveals nothing, so it needs no token.
fn app_moved(request: &Request<Incoming>) -> Response<HttpBody> {
    let below = request
        .uri()
        .path()
        .strip_prefix("/app")
        .unwrap_or_default();
    let below = if below.is_empty() { "/" } else { below };
    moved(&format!("/ui/app{below}"))
}

/// `POST /ui/session`: a login code traded for a session cookie.
async fn ui_login(shared: &Shared, request: Request<Incoming>) -> Response<HttpBody> {
    use crate::ui::{self, UiError};
    let body = match Limited::new(request.into_body(), 4096).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return ui_refusal(StatusCode::BAD_REQUEST, &UiError::BadLogin),
    };
    let code = match ui::login_code(&body) {
        Ok(code) => code,
        Err(error) => return ui_refusal(StatusCode::BAD_REQUEST, &error),
    };
    match shared.sessions.redeem(&code, &shared.current_token()) {
        Ok(session) => {
            let mut response = Response::new(full(Bytes::new()));
            *response.status_mut() = StatusCode::NO_CONTENT;
            match HeaderValue::from_str(&ui::set_cookie(shared.port, &session)) {
                Ok(value) => {
                    response
                        .headers_mut()
                        .insert(hyper::header::SET_COOKIE, value);
                    response
                }
                Err(_) => ui_refusal(StatusCode::INTERNAL_SERVER_ERROR, &UiError::Random),
            }
        }
        Err(UiError::Random) => ui_refusal(StatusCode::INTERNAL_SERVER_ERROR, &UiError::Random),
        Err(error) => ui_refusal(StatusCode::UNAUTHORIZED, &error),
    }
}

/// `ui.code.issue` (bearer token only): a one-time login code and its link.
fn issue_code(shared: &Shared) -> Result<Value, crate::ui::UiError> {
    let code = shared.sessions.issue_code()?;
    Ok(json!({
        "code": code,
        "url": format!("http://{}/ui#code={code}", shared.dashboard),
        "expiresIn": crate::ui::CODE_LIFETIME.as_secs(),
    }))
}

/// The gateway's own answers (its model list, one entry, its metrics), else the
/// engine's API, forwarded.
async fn engine_api(
    shared: &Shared,
    handler: Handler,
    path: &str,
    request: Request<Incoming>,
) -> Response<HttpBody> {
    let Some(upstream) = shared.options.upstream.as_deref() else {
        return not_found(path, false);
    };
    let caller = crate::caller::principal(request.extensions());
    let own = match handler {
        Handler::ModelList => crate::passthrough::model_list(upstream, &caller),
        Handler::ModelEntry => crate::passthrough::model_entry(upstream, path, &caller),
        // `?model=ID` asks for that model's engine's own metrics (forwarded).
        Handler::Metrics if query_param(request.uri().query(), "model").is_some() => None,
        Handler::Metrics => crate::passthrough::metrics(upstream),
        Handler::Health
        | Handler::CoreHealth
        | Handler::Rpc
        | Handler::Control
        | Handler::Events
        | Handler::Logs
        | Handler::Api(_)
        | Handler::Engine
        | Handler::UiPage
        | Handler::UiAsset
        | Handler::UiLogin
        | Handler::UiLogout
        | Handler::UiApi
        | Handler::UiWeb
        | Handler::AppMoved => None,
    };
    match own {
        Some(response) => response,
        None => {
            crate::passthrough::forward(&shared.host, Some(upstream), &shared.client, request).await
        }
    }
}

fn core_health(shared: &Shared) -> Response<HttpBody> {
    let snapshot = shared.host.snapshot();
    json_response(
        StatusCode::OK,
        &json!({
            "protocol": PROTOCOL,
            "state": snapshot["state"],
            "pid": std::process::id(),
            "version": snapshot["version"],
            "services": snapshot["services"],
        }),
    )
}

fn method_not_allowed(path: &str) -> Response<HttpBody> {
    own_error(
        path,
        StatusCode::METHOD_NOT_ALLOWED,
        codes::METHOD_NOT_ALLOWED,
        &format!("`{path}` does not accept this HTTP method"),
        json!({"path": path}),
    )
}

/// The Core's 404 for a path no row serves (`engine`: an engine is selected, the
/// gateway's) or an engine path with no engine selected.
fn not_found(path: &str, engine: bool) -> Response<HttpBody> {
    // A translated API's client given the OpenAI base URL: told what to change, in its
    // API's shape (the path it meant decides the shape).
    let (message, shaped_as) = match crate::apis::misplaced(path) {
        Some((api, meant)) => (
            format!("no endpoint `{path}`: {api}'s API is at `{meant}`; give the client the host's root URL, without `/v1`"),
            meant,
        ),
        None if engine => (format!("no endpoint `{path}`"), path),
        None => (format!("no endpoint `{path}` (no engine is selected)"), path),
    };
    own_error(
        shaped_as,
        StatusCode::NOT_FOUND,
        codes::ARCANE_NOT_FOUND,
        &message,
        json!({"path": path}),
    )
}

/// `GET /health` (no token): only `{"status": "ok" | "loading" | "error"}`, with 200 for
/// `ok` and 503 otherwise, for monitors and load balancers. `ok`: the host, its
/// services and its engine (when one is selected) are ready; `loading`: a service or
/// the engine is still starting or loading; `error`: something failed or stopped, or
/// the host is shutting down.
fn health(shared: &Shared) -> Response<HttpBody> {
    use arcane_core::host::HostState;
    use arcane_core::service::ServiceState;
    let services: Vec<ServiceState> = shared
        .host
        .services()
        .into_iter()
        .map(|(_, status)| status.state)
        .collect();
    // `None`: healthy whatever the target (no engine, or a gateway).
    let engine = shared
        .options
        .upstream
        .as_ref()
        .filter(|u| !u.loads_on_demand())
        .map(|u| u.openai_target());
    let status =
        if shared.host.state() != HostState::Ready || services.contains(&ServiceState::Failed) {
            "error"
        } else if services
            .iter()
            .any(|s| matches!(s, ServiceState::Registered | ServiceState::Starting))
        {
            "loading"
        } else {
            match engine {
                None | Some(UpstreamTarget::Ready { .. }) => "ok",
                Some(UpstreamTarget::Unavailable {
                    retry_after: Some(_),
                    ..
                }) => "loading",
                Some(UpstreamTarget::Unavailable { .. }) => "error",
            }
        };
    let code = if status == "ok" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(code, &json!({ "status": status }))
}

fn client_name(request: &Request<Incoming>) -> Option<String> {
    request
        .headers()
        .get("x-arcane-client")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| query_param(request.uri().query(), "client").map(str::to_string))
        .filter(|c| !c.is_empty() && c.len() <= 200)
}

async fn read_frame(
    shared: &Shared,
    request: Request<Incoming>,
) -> Result<Value, Response<HttpBody>> {
    let limit = shared.options.max_body;
    let collected = Limited::new(request.into_body(), limit).collect().await;
    let bytes = match collected {
        Ok(collected) => collected.to_bytes(),
        Err(error)
            if error
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            let error = Error::frame(
                arcane_core::FrameProblem::TooLarge,
                format!("the body exceeds the {limit}-byte limit"),
            );
            return Err(error_response(StatusCode::PAYLOAD_TOO_LARGE, &error));
        }
        Err(_) => {
            let error = Error::frame(
                arcane_core::FrameProblem::Incomplete,
                "the body could not be read",
            );
            return Err(error_response(StatusCode::BAD_REQUEST, &error));
        }
    };
    let text = std::str::from_utf8(&bytes).map_err(|_| {
        error_response(
            StatusCode::BAD_REQUEST,
            &Error::frame(
                arcane_core::FrameProblem::InvalidUtf8,
                "the body is not UTF-8",
            ),
        )
    })?;
    arcane_core::framing::parse_strict(text)
        .map_err(|error| error_response(StatusCode::BAD_REQUEST, &error))
}

async fn rpc(
    shared: &Shared,
    request: Request<Incoming>,
    methods: Option<&[&str]>,
) -> Response<HttpBody> {
    let client = client_name(&request);
    let value = match read_frame(shared, request).await {
        Ok(value) => value,
        Err(response) => return response,
    };
    let request = match parse_incoming(value) {
        Ok(Frame_::Request(request)) => request,
        Ok(Frame_::Control(_)) => {
            let error = Error::InvalidFrame {
                reason: "controls go to `/v1/control`".into(),
                id: None,
            };
            return error_response(StatusCode::BAD_REQUEST, &error);
        }
        Err(error) => {
            let id = match &error {
                Error::InvalidFrame { id, .. } => id.clone(),
                _ => None,
            };
            return json_response(
                StatusCode::BAD_REQUEST,
                &RpcResponse::error(id, &error).to_frame(),
            );
        }
    };
    if let Some(methods) = methods {
        if !methods.contains(&request.method.as_str()) {
            let error = crate::ui::UiError::MethodRefused {
                method: request.method.clone(),
            };
            let response = RpcResponse::error(Some(request.id), &error);
            return json_response(StatusCode::FORBIDDEN, &response.to_frame());
        }
    } else if request.method == crate::ui::ISSUE_METHOD {
        // The listener's own method: the code is for this listener's dashboard.
        let response = match issue_code(shared) {
            Ok(result) => RpcResponse::ok(request.id, result),
            Err(error) => RpcResponse::error(Some(request.id), &error),
        };
        return json_response(StatusCode::OK, &response.to_frame());
    }
    let endpoint: &dyn Dispatch = &shared.host;
    if !endpoint.accepting() {
        let response = RpcResponse::error(Some(request.id), &Error::ShuttingDown);
        return json_response(StatusCode::SERVICE_UNAVAILABLE, &response.to_frame());
    }
    let session = endpoint.open(match &client {
        Some(name) => Client::Named(name),
        None => Client::Private("http"),
    });
    let response = dispatch::call(&session, request).await.to_frame();
    if client.is_some() {
        session.deliver(&response);
    }
    json_response(StatusCode::OK, &response)
}

async fn control(shared: &Shared, request: Request<Incoming>) -> Response<HttpBody> {
    let Some(client) = client_name(&request) else {
        let error = Error::InvalidFrame {
            reason: "controls need the `X-Arcane-Client` header naming the client they apply to"
                .into(),
            id: None,
        };
        return error_response(StatusCode::BAD_REQUEST, &error);
    };
    let value = match read_frame(shared, request).await {
        Ok(value) => value,
        Err(response) => return response,
    };
    match parse_incoming(value) {
        Ok(Frame_::Control(control)) => {
            let endpoint: &dyn Dispatch = &shared.host;
            let result = endpoint.open(Client::Named(&client)).control(control).await;
            json_response(
                StatusCode::OK,
                &json!({"protocol": PROTOCOL, "ok": true, "result": result}),
            )
        }
        Ok(Frame_::Request(_)) => error_response(
            StatusCode::BAD_REQUEST,
            &Error::InvalidFrame {
                reason: "requests go to `/v1/rpc`".into(),
                id: None,
            },
        ),
        Err(error) => error_response(StatusCode::BAD_REQUEST, &error),
    }
}

/// `GET /v1/logs` ([`crate::logs`]): the models the upstream serves are known even
/// before they print anything.
fn logs(shared: &Shared, request: &Request<Incoming>) -> Response<HttpBody> {
    let Some(book) = &shared.options.logs else {
        return not_found(request.uri().path(), shared.options.upstream.is_some());
    };
    let served = shared.options.upstream.as_deref().and_then(|u| u.models());
    let known: Vec<String> = served
        .iter()
        .flat_map(|list| list["data"].as_array().into_iter().flatten())
        .filter_map(|model| model["id"].as_str().map(str::to_string))
        .collect();
    crate::logs::answer(book, &shared.host, request.uri().query(), &known)
}

/// An SSE body fed by a host subscription; ends when the host closes.
struct SseBody {
    receiver: arcane_core::dispatch::FrameReceiver,
    _session: Arc<dyn Session>,
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.receiver.poll_recv(cx) {
            Poll::Ready(Some(first)) => {
                let mut text = format!("data: {first}\n\n");
                // Coalesce what is already queued into one write.
                while text.len() < 64 * 1024 {
                    match self.receiver.try_recv() {
                        Some(next) => {
                            text.push_str("data: ");
                            text.push_str(&next);
                            text.push_str("\n\n");
                        }
                        None => break,
                    }
                }
                Poll::Ready(Some(Ok(Frame::data(Bytes::from(text)))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

fn events(shared: &Shared, request: &Request<Incoming>) -> Response<HttpBody> {
    let endpoint: &dyn Dispatch = &shared.host;
    let client = client_name(request);
    let session = endpoint.open(match &client {
        Some(name) => Client::Named(name),
        None => Client::Private("sse"),
    });
    let (sink, receiver) = arcane_core::dispatch::frames_within(SSE_BACKLOG_BYTES);
    session.subscribe(FrameSink::Bounded(sink));
    let body = SseBody {
        receiver,
        _session: session,
    };
    let mut response = Response::new(body.boxed());
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(
        hyper::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    response
}

/// How many bytes of frames an SSE client may fall behind before its stream is ended
/// (bytes, not frames: one frame may be an engine's 64 KiB output line, so a count of
/// frames would let one slow client keep a gigabyte alive).
const SSE_BACKLOG_BYTES: usize = 4 * 1024 * 1024;
