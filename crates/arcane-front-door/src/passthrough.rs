//! The front door to the engine's own HTTP API: every request the route table
//! ([`crate::router`]) gives to an engine goes, after admission (Host, Origin, token:
//! see [`crate::http`]), unchanged to the ready llama.cpp engine, and the engine's
//! answer comes back unchanged, streamed chunk by chunk: `/v1/chat/completions`,
//! `/v1/completions`, `/v1/embeddings`, `/v1/models[/{id}]`, `/v1/responses`,
//! `/v1/messages[/count_tokens]`, `/v1/rerank`, `/tokenize`, `/props`, `/metrics`, and,
//! with a single engine, any path no row serves (the engine's own answer).
//!
//! [`forward`] runs in stages, one function each: **route** (with the gateway, the
//! model the request names, found by [`crate::request_model`], picks the engine through
//! [`Upstream::route`]), **rewrite** (re-addressed to the engine: the Core's token, its
//! `x-api-key`, the client's `Origin` and the hop-by-hop headers are dropped; the
//! engine's key is added; its private socket is used when it has one), **exchange**
//! (deadlines, the drain cut), **answer** (the body sent on as it comes; with the
//! gateway, renamed and measured line by line by [`crate::response_lines`]).
//!
//! A client that goes away mid-stream drops the response body, which closes the
//! connection to the engine ([`arcane_core::upstream::EngineClient`]), so generation stops.
//! Each exchange is accepted work of the host ([`Host::accept_work`]) until its body is
//! sent to the end: a shutdown waits for it (bounded by the drain deadline), then cuts
//! it before any engine is stopped.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio_util::sync::WaitForCancellationFutureOwned;

use crate::response_lines::{find_usage, rename_model, LineTransformer, Rewrite, Transformed};
use arcane_core::host::{Host, Work};
pub use arcane_core::route::{
    model_not_found, Lease, ModelFacts, NoRoute, Route, RouteRequest, Upstream, UpstreamTarget,
};
use arcane_core::upstream::{BodyError, Deadlines, EngineAccess, EngineClient, HttpBody};
use arcane_core::{Error, Peer, Unready};
use arcane_report::Diagnostic;
use serde_json::Value;

/// Headers that describe one hop or the client's credentials with the Core: never
/// forwarded either way.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "authorization",
    "x-api-key",
    "origin",
];

fn copy_headers(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            to.append(HeaderName::clone(name), value.clone());
        }
    }
}

/// Forwards an admitted `request` to the engine `upstream` names and returns its
/// answer (or the Core's 503 when the engine is not ready, 502/504 when it fails), in
/// stages, one private function each: `route` (the model the request names →
/// [`Upstream::route`]), `forwarded_request` (re-addressed, headers dropped),
/// `exchange` (deadlines, the drain cut), `answer` (the body renamed and measured line
/// by line).
pub async fn forward<B>(
    host: &Host,
    upstream: Option<&dyn Upstream>,
    client: &EngineClient,
    request: Request<B>,
) -> Response<HttpBody>
where
    B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
    B::Error: Into<BodyError>,
{
    // Accepted work from here until the response body is sent to the end.
    let Some(work) = host.accept_work() else {
        return crate::http::error_response(StatusCode::SERVICE_UNAVAILABLE, &Error::ShuttingDown);
    };
    let Some(upstream) = upstream else {
        return refusal(no_engine());
    };
    let deadlines = if request.method() == Method::GET {
        Deadlines::QUICK
    } else {
        Deadlines::GENERATION
    };
    let model_id = model_id_of(&request);
    let api = StreamApi::of_path(request.uri().path());
    let (request, route, wanted) = match route(upstream, request).await {
        Ok(routed) => routed,
        Err(response) => return *response,
    };
    let (request, replay) = match crate::replay::Replay::capture(&wanted, &route, request).await {
        Ok(captured) => captured,
        Err(response) => return *response,
    };
    let forwarded = match forwarded_request(&route.access, request) {
        Ok(forwarded) => forwarded,
        Err(response) => return *response,
    };
    let mut route = route;
    match exchange(
        client, upstream, &mut route, forwarded, replay, deadlines, &work,
    )
    .await
    {
        Ok(upstream) if upstream.status() == StatusCode::NOT_FOUND && model_id.is_some() => {
            // llama.cpp serves the list but not `GET /v1/models/{id}` (the OpenAI
            // clients' `models.retrieve`): the entry comes from the list.
            drop(upstream);
            let id = model_id.unwrap_or_default();
            retrieve_model(client, &route.access, &id).await
        }
        Ok(upstream) => answer(upstream, route, work, api).await,
        Err(response) => *response,
    }
}

/// The id of a `GET /v1/models/{id}` (percent-decoded).
fn model_id_of<B>(request: &Request<B>) -> Option<String> {
    (request.method() == Method::GET)
        .then(|| request.uri().path().strip_prefix("/v1/models/"))
        .flatten()
        .filter(|id| !id.is_empty())
        .map(percent_decode)
}

/// Stage 1: the route. When the upstream routes by model, the model the request names
/// (its body of any kind, or `?model=`: [`crate::request_model`]) selects it.
async fn route<B>(
    upstream: &dyn Upstream,
    request: Request<B>,
) -> Result<(Request<HttpBody>, Route, RouteRequest), Box<Response<HttpBody>>>
where
    B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
    B::Error: Into<BodyError>,
{
    let (request, wanted) = if upstream.routes_by_model() {
        let (parts, body) = request.into_parts();
        let found = crate::request_model::find(
            &parts.method,
            &parts.uri,
            &parts.headers,
            body,
            crate::request_model::MAX_BUFFERED,
        )
        .await
        // In the shape the API's clients read (`type`, `param`), as the engine's own
        // refusals would be.
        .map_err(|refused| Box::new(api_error_response(refused.status, &refused.error)))?;
        (
            Request::from_parts(parts, found.body),
            (found.route, found.json),
        )
    } else {
        (request.map(incoming_body), (RouteRequest::default(), false))
    };
    let (wanted, json) = wanted;
    let path = request.uri().path().to_string();
    let mut wanted = crate::caller::fill(wanted, &request);
    wanted.path = Some(path.clone());
    let route = upstream
        .route(wanted.clone())
        .await
        .map_err(|no_route| Box::new(refusal(in_api_shape(&path, no_route))))?;
    let request = match route.upstream_model.as_deref().filter(|_| json) {
        Some(name) => with_model(request, name).await?,
        None => request,
    };
    Ok((request, route, wanted))
}

/// A request body read whole; one that fails to arrive is the client's 400.
pub(crate) async fn read_whole(body: HttpBody) -> Result<Bytes, Box<Response<HttpBody>>> {
    Ok(body
        .collect()
        .await
        .map_err(|error| {
            let error = Error::usage(
                format!("the request body could not be read: {error}"),
                serde_json::json!({}),
            );
            Box::new(crate::http::error_response(StatusCode::BAD_REQUEST, &error))
        })?
        .to_bytes())
}

/// `request` (a JSON object body, already read whole) with its `model` replaced by
/// `name` and its `Content-Length` made to match.
async fn with_model(
    request: Request<HttpBody>,
    name: &str,
) -> Result<Request<HttpBody>, Box<Response<HttpBody>>> {
    let (mut parts, body) = request.into_parts();
    let bytes = read_whole(body).await?;
    let bytes = crate::request_model::with_model(&bytes, name).unwrap_or(bytes);
    parts.headers.remove(hyper::header::TRANSFER_ENCODING);
    parts.headers.insert(
        hyper::header::CONTENT_LENGTH,
        HeaderValue::from(bytes.len()),
    );
    Ok(Request::from_parts(
        parts,
        arcane_core::upstream::full(bytes),
    ))
}

/// Stage 3: the exchange with the engine of `route`, within `deadlines`, sent once more
/// when the engine died before answering and a `replay` was kept ([`crate::replay`]); a
/// shutdown whose drain deadline passes before the engine answers drops the request.
pub(crate) async fn exchange(
    client: &EngineClient,
    upstream: &dyn Upstream,
    route: &mut Route,
    forwarded: Request<HttpBody>,
    replay: Option<crate::replay::Replay>,
    deadlines: Deadlines,
    work: &Work,
) -> Result<Response<HttpBody>, Box<Response<HttpBody>>> {
    use crate::replay::Failure;
    crate::replay::exchange(client, upstream, route, forwarded, replay, deadlines, work)
        .await
        .map_err(|failure| {
            Box::new(match failure {
                Failure::Cancelled => crate::http::error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &Error::ShuttingDown,
                ),
                Failure::Engine(error) => {
                    let error = engine_error(error);
                    let status = StatusCode::from_u16(error.http_status())
                        .unwrap_or(StatusCode::BAD_GATEWAY);
                    api_error_response(status, &error)
                }
                Failure::NoRoute(no_route) => refusal(no_route),
                Failure::Unsendable(message) => api_error_response(
                    StatusCode::BAD_GATEWAY,
                    &Error::usage(message, serde_json::json!({})),
                ),
            })
        })
}

/// One exchange with the engine of `route`: its answer's head, or why there is none
/// (an unreachable engine is reported to the route's lease).
pub(crate) async fn send(
    client: &EngineClient,
    route: &mut Route,
    forwarded: Request<HttpBody>,
    deadlines: Deadlines,
    work: &Work,
) -> Result<Response<HttpBody>, crate::replay::Failure> {
    let cancelled = work.cancelled();
    let answer = tokio::select! {
        answer = client.send_to(&route.access, forwarded, deadlines, Peer::Engine) => answer,
        () = cancelled => return Err(crate::replay::Failure::Cancelled),
    };
    answer.map_err(|error| {
        if let Some(lease) = route.lease.as_mut() {
            lease.unreachable();
        }
        crate::replay::Failure::Engine(error)
    })
}

/// Stage 4: the engine's answer, sent on as it comes, holding `work` and the lease
/// until its end. With a rename, a whole answer (known length) is renamed at once and
/// keeps an exact `Content-Length`; a stream is renamed line by line.
async fn answer(
    upstream: Response<HttpBody>,
    mut route: Route,
    work: Work,
    api: StreamApi,
) -> Response<HttpBody> {
    let (parts, body) = upstream.into_parts();
    let streamed = parts
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if let Some(lease) = route.lease.as_mut() {
        lease.answered(parts.status);
    }
    let whole = route.rename.is_some() && body.size_hint().exact().is_some();
    let body = if whole {
        let bytes = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) => {
                let error = engine_error(arcane_core::upstream::body_error(
                    error,
                    &route.access.url_of("/"),
                    Peer::Engine,
                ));
                return api_error_response(StatusCode::BAD_GATEWAY, &error);
            }
        };
        if let (Some(lease), Some(usage)) = (route.lease.as_mut(), find_usage(&bytes)) {
            lease.usage(&usage);
        }
        let asked =
            serde_json::to_string(route.rename.as_deref().unwrap_or_default()).unwrap_or_default();
        WorkBody::new(
            arcane_core::upstream::full(rename_model(&bytes, &asked)),
            work,
            route.lease,
            None,
        )
    } else {
        let lines = (route.rename.is_some() || route.lease.is_some())
            .then(|| Box::new(LineTransformer::new(route.rename.as_deref())) as Box<dyn Rewrite>);
        let url = route.access.url_of("/");
        WorkBody::new(body, work, route.lease, lines).failing_as(streamed.then_some(api), url)
    };
    respond(parts, body)
}

/// The engine's answer `upstream`, rewritten by `rewrite` on its way (another API's
/// shape: [`crate::apis::ollama`]), holding `work` and the route's lease until its end
/// exactly as a forwarded answer does (its `usage` measured, a shutdown's cut).
pub(crate) fn answer_rewritten(
    upstream: Response<HttpBody>,
    mut route: Route,
    work: Work,
    rewrite: Box<dyn Rewrite>,
    api: Option<StreamApi>,
) -> Response<HttpBody> {
    let (parts, body) = upstream.into_parts();
    if let Some(lease) = route.lease.as_mut() {
        lease.answered(parts.status);
    }
    let url = route.access.url_of("/");
    let body = WorkBody::new(body, work, route.lease, Some(rewrite)).failing_as(api, url);
    respond(parts, body)
}

/// The API whose shape the last frame of a stream takes when the engine's answer was
/// cut (it crashed, was killed, or stalled): the clients of each API raise the error
/// such a frame carries, where a stream that just stops reads as a network fault or,
/// worse, as a complete answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamApi {
    /// OpenAI's events: `data: {"error": {message, type, param, code, details}}`.
    OpenAi,
    /// Anthropic's: `event: error` with `{"type": "error", "error": {type, message}}`.
    Anthropic,
    /// JSON lines (NDJSON, Ollama's API): `{"error": "…"}`.
    JsonLines,
}

impl StreamApi {
    /// The API of a front-door path: `/v1/messages` speaks Anthropic's events, every
    /// other streamed path OpenAI's.
    pub(crate) fn of_path(path: &str) -> StreamApi {
        if path.trim_end_matches('/').ends_with("/messages") {
            StreamApi::Anthropic
        } else {
            StreamApi::OpenAi
        }
    }

    /// The frame that ends a stream `error` cut.
    pub(crate) fn error_frame(self, error: &dyn Diagnostic) -> Bytes {
        let text = match self {
            StreamApi::OpenAi => format!(
                "data: {}\n\n",
                api_error_body(StatusCode::BAD_GATEWAY, error)
            ),
            StreamApi::Anthropic => format!(
                "event: error\ndata: {}\n\n",
                serde_json::json!({"type": "error", "error": {
                    "type": "api_error",
                    "message": error.to_string(),
                    "code": error.code(),
                }})
            ),
            StreamApi::JsonLines => format!(
                "{}\n",
                serde_json::json!({"error": error.to_string(), "code": error.code()})
            ),
        };
        Bytes::from(text)
    }
}

/// An engine error as the client should read it: a transport failure of an engine that
/// closed its connection before its answer was complete is [`Error::EngineStopped`].
pub(crate) fn engine_error(error: Error) -> Error {
    match error {
        Error::Http { url, source } if connection_lost(&*source) => {
            Error::EngineStopped { url, source }
        }
        other => other,
    }
}

/// Whether `error` (or a cause of it) is a connection closed or reset mid-exchange.
pub(crate) fn connection_lost(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(hyper) = error.downcast_ref::<hyper::Error>() {
            if hyper.is_incomplete_message() || hyper.is_canceled() {
                return true;
            }
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
            ) {
                return true;
            }
        }
        next = error.source();
    }
    false
}

/// `{"error": …}` in OpenAI's shape (`message`, `type`, `param`) with Arcane's stable
/// `code`, `details` and causes.
fn api_error_body(status: StatusCode, error: &dyn Diagnostic) -> Value {
    let mut body = arcane_report::error_json(error);
    body["type"] = Value::from(match status.as_u16() {
        401 => "authentication_error",
        404 => "not_found_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    });
    body["param"] = Value::Null;
    serde_json::json!({"error": body})
}

/// An error answer of the front door in OpenAI's shape (see [`api_error_body`]).
pub(crate) fn api_error_response(status: StatusCode, error: &dyn Diagnostic) -> Response<HttpBody> {
    crate::http::json_response(status, &api_error_body(status, error))
}

/// The client's response: the engine's status and headers (hop-by-hop ones dropped)
/// around `body`, with an exact `Content-Length` only when the body's is known.
fn respond(parts: hyper::http::response::Parts, body: WorkBody) -> Response<HttpBody> {
    let mut response = Response::new(body.boxed());
    *response.status_mut() = parts.status;
    copy_headers(&parts.headers, response.headers_mut());
    response.headers_mut().remove(hyper::header::CONTENT_LENGTH);
    if let Some(length) = response.body().size_hint().exact() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    response
}

fn incoming_body<B>(body: B) -> HttpBody
where
    B: Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BodyError>,
{
    body.map_err(Into::into).boxed()
}

fn no_engine() -> NoRoute {
    NoRoute::not_ready(
        arcane_localai::Engine::DEFAULT.as_str().into(),
        Unready::NotSelected,
        None,
    )
}

/// `no_route` with its body in the shape of the API `path` belongs to (Anthropic's for
/// `/v1/messages`: [`crate::apis::error_body`]); OpenAI's and Arcane's stay as they are.
pub(crate) fn in_api_shape(path: &str, mut no_route: NoRoute) -> NoRoute {
    let error = &no_route.body["error"];
    let code = error["code"]
        .as_str()
        .or(error["type"].as_str())
        .unwrap_or_default();
    let message = error["message"].as_str().unwrap_or_default();
    if let Some(body) = crate::apis::error_body(path, code, message) {
        no_route.body = body;
    }
    no_route
}

/// The answer for a request without a route: its body, and when to come back.
pub(crate) fn refusal(no_route: NoRoute) -> Response<HttpBody> {
    let mut response = crate::http::json_response(no_route.status, &no_route.body);
    if let Some(seconds) = no_route.retry_after {
        response
            .headers_mut()
            .insert(hyper::header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    if let Some(millis) = no_route.retry_after_ms {
        response
            .headers_mut()
            .insert("retry-after-ms", HeaderValue::from(millis));
    }
    response
}

/// The gateway's models as `caller` sees them (`{object, data}`): only those its key
/// may use ([`arcane_core::keys::Principal::may_use`]).
fn visible_models(upstream: &dyn Upstream, caller: &arcane_core::keys::Principal) -> Option<Value> {
    let mut list = upstream.models()?;
    if let Some(data) = list["data"].as_array_mut() {
        data.retain(|entry| caller.may_use(entry["id"].as_str().unwrap_or_default()));
    }
    Some(list)
}

/// The gateway's own `GET /v1/models`, as `caller` sees it; `None` when `upstream` has
/// no list of its own.
pub fn model_list(
    upstream: &dyn Upstream,
    caller: &arcane_core::keys::Principal,
) -> Option<Response<HttpBody>> {
    let list = visible_models(upstream, caller)?;
    Some(crate::http::json_response(StatusCode::OK, &list))
}

/// The gateway's own `GET /v1/models/{id}` for `path`: the entry of the model whose id
/// or alias is `{id}`, named as asked (`id` is `{id}`), or OpenAI's 404
/// `model_not_found` listing the known ids (a model `caller` may not use is not one);
/// `None` when `upstream` has no list.
pub fn model_entry(
    upstream: &dyn Upstream,
    path: &str,
    caller: &arcane_core::keys::Principal,
) -> Option<Response<HttpBody>> {
    let list = visible_models(upstream, caller)?;
    let id = percent_decode(path.strip_prefix("/v1/models/").unwrap_or_default());
    let entries = list["data"].as_array().cloned().unwrap_or_default();
    let answers_to = |entry: &Value| {
        entry["id"].as_str() == Some(id.as_str())
            || entry["aliases"]
                .as_array()
                .is_some_and(|aliases| aliases.iter().any(|a| a.as_str() == Some(id.as_str())))
    };
    Some(match entries.iter().find(|entry| answers_to(entry)) {
        Some(entry) => {
            let mut entry = entry.clone();
            entry["id"] = Value::String(id);
            crate::http::json_response(StatusCode::OK, &entry)
        }
        None => crate::http::json_response(StatusCode::NOT_FOUND, &model_not_found(&id, &entries)),
    })
}

/// The gateway's own `GET /metrics` (Prometheus text); `None` when `upstream` has none.
pub fn metrics(upstream: &dyn Upstream) -> Option<Response<HttpBody>> {
    let text = upstream.metrics()?;
    let mut response = Response::new(arcane_core::upstream::full(text));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    Some(response)
}

/// `GET /v1/models/{id}` answered from the engine's `GET /v1/models`: the entry whose
/// `id` matches, or OpenAI's 404 (`model_not_found`) listing the known ids.
async fn retrieve_model(
    client: &EngineClient,
    access: &EngineAccess,
    id: &str,
) -> Response<HttpBody> {
    let path = "/v1/models";
    let list = async {
        let request = access
            .request(Method::GET, path)
            .body(arcane_core::upstream::full(Bytes::new()))
            .map_err(|e| Error::Http {
                url: access.url_of(path),
                source: Box::new(e),
            })?;
        let response = client
            .send_to(access, request, Deadlines::QUICK, Peer::Engine)
            .await?;
        let bytes =
            arcane_core::upstream::collect(response, &access.url_of(path), Peer::Engine).await?;
        Ok::<_, Error>(serde_json::from_slice::<serde_json::Value>(&bytes).unwrap_or_default())
    };
    let list = match list.await {
        Ok(list) => list,
        Err(error) => {
            let status =
                StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::BAD_GATEWAY);
            return crate::http::error_response(status, &error);
        }
    };
    let entries = list["data"].as_array().cloned().unwrap_or_default();
    if let Some(entry) = entries.iter().find(|m| m["id"].as_str() == Some(id)) {
        return crate::http::json_response(StatusCode::OK, entry);
    }
    crate::http::json_response(StatusCode::NOT_FOUND, &model_not_found(id, &entries))
}

/// Decodes `%XX` escapes in a path segment (a model id such as `org%2Fmodel`).
pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| text.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Stage 2: the client's request, re-addressed to the engine at `access` (hop-by-hop
/// headers, the Core's token and the origin are not forwarded; the engine's key is
/// added).
pub(crate) fn forwarded_request(
    access: &EngineAccess,
    request: Request<HttpBody>,
) -> Result<Request<HttpBody>, Box<Response<HttpBody>>> {
    let path_and_query = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let (parts, body) = request.into_parts();
    let mut builder = access.request(parts.method, &path_and_query);
    if let Some(headers) = builder.headers_mut() {
        copy_headers(&parts.headers, headers);
    }
    builder.body(body).map_err(|_| {
        let error = Error::usage(
            format!("`{path_and_query}` cannot be forwarded"),
            serde_json::json!({"path": path_and_query}),
        );
        Box::new(crate::http::error_response(StatusCode::BAD_REQUEST, &error))
    })
}

/// A passthrough response body that holds its [`Work`] until it is sent to the end (or
/// dropped), and is cut when a shutdown's drain deadline passes; dropping the cut
/// upstream body closes the connection to the engine. With a [`Rewrite`] (the
/// gateway's [`LineTransformer`], or a translation), its lines are rewritten and their
/// `usage` reported to the lease.
struct WorkBody {
    inner: HttpBody,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    lines: Option<Box<dyn Rewrite>>,
    /// The shape of the error frame a stream the engine cut ends with, and the engine's
    /// url (none: the cut reaches the client as one).
    failure: Option<(StreamApi, String)>,
    /// The end was seen (and the lease told).
    done: bool,
    _work: Work,
    lease: Option<Box<dyn Lease>>,
}

impl WorkBody {
    fn new(
        inner: HttpBody,
        work: Work,
        lease: Option<Box<dyn Lease>>,
        lines: Option<Box<dyn Rewrite>>,
    ) -> Self {
        Self {
            inner,
            cut: Box::pin(work.cancelled()),
            lines,
            failure: None,
            done: false,
            _work: work,
            lease,
        }
    }

    /// Ends a stream the engine (at `url`) cuts with an error frame in `api`'s shape.
    fn failing_as(mut self, api: Option<StreamApi>, url: String) -> Self {
        self.failure = api.map(|api| (api, url));
        self
    }

    /// The frame that ends a stream the engine cut with `error`: a line held back is
    /// dropped (it is incomplete), and the lease is told.
    fn cut_by_engine(&mut self, (api, url): (StreamApi, String), error: BodyError) -> Bytes {
        self.done = true;
        if let Some(lease) = self.lease.as_mut() {
            lease.finished();
        }
        let error = engine_error(arcane_core::upstream::body_error(error, &url, Peer::Engine));
        api.error_frame(&error)
    }

    /// The end of the body: the transformer's held line, and the lease is told.
    fn end(&mut self) -> Transformed {
        self.done = true;
        let tail = self
            .lines
            .as_mut()
            .map(|lines| lines.finish())
            .unwrap_or_default();
        if let Some(lease) = self.lease.as_mut() {
            if let Some(usage) = &tail.usage {
                lease.usage(usage);
            }
            lease.finished();
        }
        tail
    }
}

/// The error a cut passthrough body ends with (the client sees a truncated response).
#[derive(Debug, thiserror::Error)]
#[error("the Core host is shutting down and its drain deadline passed")]
struct Cut;

impl Body for WorkBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.cut.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(Cut))));
        }
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    let tail = self.end();
                    return if tail.data.is_empty() {
                        Poll::Ready(None)
                    } else {
                        Poll::Ready(Some(Ok(Frame::data(tail.data))))
                    };
                }
                Poll::Ready(Some(Err(error))) => {
                    return match self.failure.take() {
                        Some(failure) => {
                            Poll::Ready(Some(Ok(Frame::data(self.cut_by_engine(failure, error)))))
                        }
                        None => Poll::Ready(Some(Err(error))),
                    };
                }
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(frame) => return Poll::Ready(Some(Ok(frame))),
            };
            let mut out = match self.lines.as_mut() {
                Some(lines) => lines.push(data),
                None => Transformed { data, usage: None },
            };
            if let (Some(lease), Some(usage)) = (self.lease.as_mut(), &out.usage) {
                lease.usage(usage);
            }
            // A body of known length is not polled again after its last frame: its end
            // is seen here.
            if self.inner.is_end_stream() {
                let tail = self.end();
                if !tail.data.is_empty() {
                    let mut joined = out.data.to_vec();
                    joined.extend_from_slice(&tail.data);
                    out.data = Bytes::from(joined);
                }
            }
            if out.data.is_empty() && !self.done {
                // A line is held back: read on.
                continue;
            }
            return Poll::Ready(Some(Ok(Frame::data(out.data))));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
            || (self.inner.is_end_stream() && !self.lines.as_ref().is_some_and(|l| l.holding()))
    }

    fn size_hint(&self) -> SizeHint {
        if self.lines.as_ref().is_some_and(|l| l.changes_length()) {
            // The length changes with the name.
            return SizeHint::default();
        }
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_are_percent_decoded_and_bad_escapes_kept() {
        assert_eq!(percent_decode("org%2Fmodel"), "org/model");
        assert_eq!(percent_decode("a%zz%2"), "a%zz%2");
        assert_eq!(percent_decode("smollm2-135m"), "smollm2-135m");
    }

    #[test]
    fn the_engine_never_sees_the_cores_credentials() {
        let mut from = HeaderMap::new();
        from.insert("authorization", HeaderValue::from_static("Bearer core"));
        from.insert("x-api-key", HeaderValue::from_static("core"));
        from.insert("origin", HeaderValue::from_static("http://127.0.0.1:1"));
        from.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
        let mut to = HeaderMap::new();
        copy_headers(&from, &mut to);
        assert_eq!(to.len(), 1, "{to:?}");
        assert!(to.contains_key("anthropic-version"));
    }
}
