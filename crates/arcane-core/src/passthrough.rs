//! The front door to the engine's own HTTP API: every request the Core does not answer
//! itself goes, after admission (Host, Origin, token: see [`crate::http`]), unchanged
//! to the ready llama.cpp engine, and the engine's answer comes back unchanged,
//! streamed chunk by chunk, whatever the path: `/v1/chat/completions`,
//! `/v1/completions`, `/v1/embeddings`, `/v1/models[/{id}]`, `/v1/responses`,
//! `/v1/messages[/count_tokens]`, `/v1/rerank`, `/tokenize`, `/props`, `/metrics`, and
//! the paths a later engine adds. A path the engine does not serve gets the engine's
//! own answer.
//!
//! What changes on the way: the Core's token, the client's `Origin` and the hop-by-hop
//! headers are dropped; the engine's key (an owned engine on a TCP port) is added; the
//! request goes over the engine's private socket when it has one.
//!
//! A client that goes away mid-stream drops the response body, which closes the
//! connection to the engine ([`crate::upstream::EngineClient`]), so generation stops.
//! Each exchange is accepted work of the host ([`Host::accept_work`]) until its body is
//! sent to the end: a shutdown waits for it (bounded by the drain deadline), then cuts
//! it before any engine is stopped.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio_util::sync::WaitForCancellationFutureOwned;

use crate::error::{Error, Peer, Unready};
use crate::host::{Host, Work};
use crate::service::BoxFuture;
use crate::upstream::{BodyError, Deadlines, EngineAccess, EngineClient, HttpBody};
use serde_json::Value;

/// Where the passthrough sends requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamTarget {
    /// The engine is ready; this is how to reach it.
    Ready {
        /// Its address and key.
        access: EngineAccess,
    },
    /// Not ready; a retry may succeed after `retry_after` seconds (`None`: it will
    /// not by itself, e.g. failed or not selected).
    Unavailable {
        /// The runtime id.
        runtime: String,
        /// Why it is not ready.
        state: Unready,
        /// Seconds until a retry makes sense.
        retry_after: Option<u64>,
    },
}

/// What one forwarded request asks for: the model its JSON body (or `?model=`) names,
/// and the body's `keep_alive` (Ollama's override of the model's idle time).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteRequest {
    /// The model or alias asked for (`None`: the default model).
    pub model: Option<String>,
    /// `keep_alive` from the body, as given (seconds or a duration string).
    pub keep_alive: Option<Value>,
}

/// What a forwarded request holds until its answer is sent to the end (or dropped):
/// the gateway counts the model's requests in flight with it, and measures them.
pub trait Lease: Send + Sync {
    /// The engine answered with `status`.
    fn answered(&mut self, status: StatusCode) {
        let _ = status;
    }
    /// The answer reported this `usage` (`{prompt_tokens, completion_tokens, …}`).
    fn usage(&mut self, usage: &Value) {
        let _ = usage;
    }
    /// The answer was sent to the end.
    fn finished(&mut self) {}
    /// The engine could not be reached (or gave no answer).
    fn unreachable(&mut self) {}
}

/// Where one forwarded request goes, and what it holds until its answer is sent.
pub struct Route {
    /// How to reach the engine.
    pub access: EngineAccess,
    /// Held until the response body is sent to the end or dropped.
    pub lease: Option<Box<dyn Lease>>,
    /// The name the client asked for: every `"model"` the answer names becomes it.
    pub rename: Option<String>,
}

/// Why a request has no route: the HTTP status and the error to answer with.
pub struct NoRoute {
    /// The status (404 unknown model, 503 not ready, …).
    pub status: StatusCode,
    /// The JSON body.
    pub body: Value,
    /// `Retry-After` seconds, when a retry may succeed.
    pub retry_after: Option<u64>,
}

impl NoRoute {
    /// 503 `LOCAL_AI_SERVER_NOT_READY`: the engine of `runtime` is not ready.
    pub fn not_ready(runtime: String, state: Unready, retry_after: Option<u64>) -> Self {
        let error = Error::EngineNotReady {
            runtime,
            state,
            retry_after,
        };
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            body: serde_json::json!({"error": arcane_report::error_json(&error)}),
            retry_after,
        }
    }
}

/// Supplies the passthrough's target: the local-AI service (one engine) or the model
/// gateway (a model per request).
pub trait Upstream: Send + Sync {
    /// The current target of a request that names no model (also what `/health`
    /// reports).
    fn openai_target(&self) -> UpstreamTarget;

    /// Whether requests are routed by the model they name; the passthrough then reads
    /// `model` from JSON bodies and answers `GET /v1/models[/{id}]` from
    /// [`Upstream::models`].
    fn routes_by_model(&self) -> bool {
        false
    }

    /// The route of one request (the default: [`Upstream::openai_target`]).
    fn route(&self, request: RouteRequest) -> BoxFuture<'_, Result<Route, NoRoute>> {
        let _ = request;
        Box::pin(async move {
            match self.openai_target() {
                UpstreamTarget::Ready { access } => Ok(Route {
                    access,
                    lease: None,
                    rename: None,
                }),
                UpstreamTarget::Unavailable {
                    runtime,
                    state,
                    retry_after,
                } => Err(NoRoute::not_ready(runtime, state, retry_after)),
            }
        })
    }

    /// Whether the front door is healthy whatever [`Upstream::openai_target`] says: the
    /// gateway, whose models load on demand.
    fn loads_on_demand(&self) -> bool {
        false
    }

    /// Arcane's own `GET /metrics` answer (the gateway's Prometheus text), when it
    /// routes by model.
    fn metrics(&self) -> Option<String> {
        None
    }

    /// Arcane's own `GET /v1/models` answer (`{object: "list", data: [...]}`), when it
    /// routes by model.
    fn models(&self) -> Option<Value> {
        None
    }
}

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
    "origin",
];

fn copy_headers(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            to.append(HeaderName::clone(name), value.clone());
        }
    }
}

/// The largest JSON body read to find its `model` (bigger ones are refused with 413).
const MAX_ROUTED_BODY: usize = 64 << 20;

/// Forwards an admitted `request` to the engine `upstream` names and returns its
/// answer (or the Core's 503 when the engine is not ready, 502/504 when it fails).
pub async fn forward(
    host: &Host,
    upstream: Option<&dyn Upstream>,
    client: &EngineClient,
    request: Request<Incoming>,
) -> Response<HttpBody> {
    // 1. Accepted work from here until the response body is sent to the end.
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
    let model_id = (request.method() == Method::GET)
        .then(|| request.uri().path().strip_prefix("/v1/models/"))
        .flatten()
        .filter(|id| !id.is_empty())
        .map(percent_decode);
    // 2. The gateway answers the model list itself, and reads the model a body names.
    let (request, wanted) = if upstream.routes_by_model() {
        if let Some(answer) = gateway_models(upstream, &request, model_id.as_deref()) {
            return answer;
        }
        if request.method() == Method::GET && request.uri().path() == "/metrics" {
            if let Some(text) = upstream.metrics() {
                let mut response = Response::new(crate::upstream::full(text));
                response.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    HeaderValue::from_static(
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    ),
                );
                return response;
            }
        }
        match read_route(request).await {
            Ok(read) => read,
            Err(response) => return *response,
        }
    } else {
        (request.map(incoming_body), RouteRequest::default())
    };
    // 3. The route, then the exchange.
    let mut route = match upstream.route(wanted).await {
        Ok(route) => route,
        Err(no_route) => return refusal(no_route),
    };
    let forwarded = match forwarded_request(&route.access, request) {
        Ok(forwarded) => forwarded,
        Err(response) => return *response,
    };
    let cancelled = work.cancelled();
    let answer = tokio::select! {
        answer = client.send_to(&route.access, forwarded, deadlines, Peer::Engine) => answer,
        // The drain deadline passed before the engine answered: drop the request.
        () = cancelled => return crate::http::error_response(StatusCode::SERVICE_UNAVAILABLE, &Error::ShuttingDown),
    };
    match answer {
        // llama.cpp serves the list but not `GET /v1/models/{id}` (the OpenAI clients'
        // `models.retrieve`): the entry comes from the list.
        Ok(upstream) if upstream.status() == StatusCode::NOT_FOUND && model_id.is_some() => {
            drop(upstream);
            let id = model_id.unwrap_or_default();
            retrieve_model(client, &route.access, &id).await
        }
        Ok(upstream) => {
            let (parts, body) = upstream.into_parts();
            if let Some(lease) = route.lease.as_mut() {
                lease.answered(parts.status);
            }
            let (body, rename) = match route.rename {
                // A whole answer is renamed at once and keeps an exact length; a stream
                // is renamed piece by piece.
                Some(asked) if body.size_hint().exact().is_some() => match body.collect().await {
                    Ok(collected) => {
                        let bytes = collected.to_bytes();
                        if let (Some(lease), Some(usage)) =
                            (route.lease.as_mut(), find_usage(&bytes))
                        {
                            lease.usage(&usage);
                        }
                        (crate::upstream::full(rename_model(&bytes, &asked)), None)
                    }
                    Err(error) => {
                        let error = crate::upstream::body_error(
                            error,
                            &route.access.url_of("/"),
                            Peer::Engine,
                        );
                        return crate::http::error_response(StatusCode::BAD_GATEWAY, &error);
                    }
                },
                rename => (body, rename),
            };
            let streams_renamed = rename.is_some();
            let body = WorkBody::new(body, work, route.lease, rename);
            let mut response = Response::new(body.boxed());
            *response.status_mut() = parts.status;
            copy_headers(&parts.headers, response.headers_mut());
            response.headers_mut().remove(hyper::header::CONTENT_LENGTH);
            if !streams_renamed {
                if let Some(length) = response.body().size_hint().exact() {
                    response
                        .headers_mut()
                        .insert(hyper::header::CONTENT_LENGTH, HeaderValue::from(length));
                }
            }
            response
        }
        Err(error) => {
            if let Some(lease) = route.lease.as_mut() {
                lease.unreachable();
            }
            let status =
                StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::BAD_GATEWAY);
            crate::http::error_response(status, &error)
        }
    }
}

fn incoming_body(body: Incoming) -> HttpBody {
    body.map_err(|e| -> BodyError { Box::new(e) }).boxed()
}

fn no_engine() -> NoRoute {
    NoRoute::not_ready("llama.cpp".into(), Unready::NotSelected, None)
}

/// The answer for a request without a route.
fn refusal(no_route: NoRoute) -> Response<HttpBody> {
    let mut response = crate::http::json_response(no_route.status, &no_route.body);
    if let Some(seconds) = no_route.retry_after {
        response
            .headers_mut()
            .insert(hyper::header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// The gateway's own `GET /v1/models` and `GET /v1/models/{id}`.
fn gateway_models(
    upstream: &dyn Upstream,
    request: &Request<Incoming>,
    model_id: Option<&str>,
) -> Option<Response<HttpBody>> {
    if request.method() != Method::GET {
        return None;
    }
    let path = request.uri().path();
    if path != "/v1/models" && model_id.is_none() {
        return None;
    }
    let list = upstream.models()?;
    let Some(id) = model_id else {
        return Some(crate::http::json_response(StatusCode::OK, &list));
    };
    let entries = list["data"].as_array().cloned().unwrap_or_default();
    Some(
        match entries.iter().find(|m| m["id"].as_str() == Some(id)) {
            Some(entry) => crate::http::json_response(StatusCode::OK, entry),
            None => {
                crate::http::json_response(StatusCode::NOT_FOUND, &model_not_found(id, &entries))
            }
        },
    )
}

/// OpenAI's 404 for an unknown model, listing the known ids.
pub fn model_not_found(id: &str, entries: &[Value]) -> Value {
    let known: Vec<&str> = entries.iter().filter_map(|m| m["id"].as_str()).collect();
    serde_json::json!({"error": {
        "message": format!("The model `{id}` does not exist; known: {}", known.join(", ")),
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }})
}

/// Reads a JSON body (bounded) to find the `model` and `keep_alive` it names; the
/// query's `model=` names it for other requests. Returns the request with its body
/// ready to send again.
async fn read_route(
    request: Request<Incoming>,
) -> Result<(Request<HttpBody>, RouteRequest), Box<Response<HttpBody>>> {
    let from_query = request.uri().query().and_then(|q| {
        q.split('&')
            .find_map(|pair| pair.strip_prefix("model="))
            .map(percent_decode)
    });
    let json = request
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("json"));
    if request.method() == Method::GET || !json {
        let wanted = RouteRequest {
            model: from_query,
            keep_alive: None,
        };
        return Ok((request.map(incoming_body), wanted));
    }
    let (parts, body) = request.into_parts();
    let bytes = match http_body_util::Limited::new(body, MAX_ROUTED_BODY)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            let error = Error::usage(
                format!("the request body is unreadable or larger than {MAX_ROUTED_BODY} bytes"),
                serde_json::json!({"limit": MAX_ROUTED_BODY}),
            );
            return Err(Box::new(crate::http::error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                &error,
            )));
        }
    };
    let value: Option<Value> = serde_json::from_slice(&bytes).ok();
    let wanted = RouteRequest {
        model: value
            .as_ref()
            .and_then(|v| v["model"].as_str())
            .map(str::to_string)
            .or(from_query),
        keep_alive: value.as_ref().and_then(|v| v.get("keep_alive").cloned()),
    };
    Ok((
        Request::from_parts(parts, crate::upstream::full(bytes)),
        wanted,
    ))
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
            .body(crate::upstream::full(Bytes::new()))
            .map_err(|e| Error::Http {
                url: access.url_of(path),
                source: Box::new(e),
            })?;
        let response = client
            .send_to(access, request, Deadlines::QUICK, Peer::Engine)
            .await?;
        let bytes = crate::upstream::collect(response, &access.url_of(path), Peer::Engine).await?;
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
    let known: Vec<&str> = entries.iter().filter_map(|m| m["id"].as_str()).collect();
    crate::http::json_response(
        StatusCode::NOT_FOUND,
        &serde_json::json!({"error": {
            "message": format!("The model `{id}` does not exist; known: {}", known.join(", ")),
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }}),
    )
}

/// Decodes `%XX` escapes in a path segment (a model id such as `org%2Fmodel`).
fn percent_decode(text: &str) -> String {
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

/// The client's request, re-addressed to the engine at `access` (hop-by-hop headers,
/// the Core's token and the origin are not forwarded; the engine's key is added).
fn forwarded_request(
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
/// upstream body closes the connection to the engine.
struct WorkBody {
    inner: HttpBody,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    rename: Option<String>,
    _work: Work,
    lease: Option<Box<dyn Lease>>,
}

impl WorkBody {
    fn new(
        inner: HttpBody,
        work: Work,
        lease: Option<Box<dyn Lease>>,
        rename: Option<String>,
    ) -> Self {
        Self {
            inner,
            cut: Box::pin(work.cancelled()),
            rename,
            _work: work,
            lease,
        }
    }
}

/// The `usage` an answer reports: in a JSON body, or in an SSE `data:` line of a
/// stream (the last chunk carries it).
fn find_usage(data: &[u8]) -> Option<Value> {
    if !data.windows(7).any(|w| w == b"\"usage\"") {
        return None;
    }
    let text = String::from_utf8_lossy(data);
    let whole = serde_json::from_str::<Value>(text.trim()).ok();
    let lines = text.lines().filter_map(|line| {
        let json = line.trim().strip_prefix("data:")?.trim();
        serde_json::from_str::<Value>(json).ok()
    });
    whole
        .into_iter()
        .chain(lines)
        .filter_map(|v| v.get("usage").filter(|u| u.is_object()).cloned())
        .next_back()
}

/// `data` (compact JSON, or SSE lines of it) with the value of every `"model"` key
/// replaced by `asked`. A `"model":"` inside a JSON string would be escaped (`\"`), so
/// only keys match.
pub(crate) fn rename_model(data: &[u8], asked: &str) -> Bytes {
    const KEY: &[u8] = b"\"model\":\"";
    let value = serde_json::to_string(asked).unwrap_or_default();
    let mut out = Vec::with_capacity(data.len());
    let mut rest = data;
    while let Some(at) = rest.windows(KEY.len()).position(|w| w == KEY) {
        let start = at + KEY.len();
        // The end of the string value: the first quote not escaped.
        let mut end = start;
        while end < rest.len() && rest[end] != b'"' {
            end += if rest[end] == b'\\' { 2 } else { 1 };
        }
        if end >= rest.len() {
            break;
        }
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(b"\"model\":");
        out.extend_from_slice(value.as_bytes());
        rest = &rest[end + 1..];
    }
    out.extend_from_slice(rest);
    Bytes::from(out)
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
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        // A body of known length is not polled again after its last frame: its end is
        // seen here.
        let ended = self.inner.is_end_stream();
        if let Some(lease) = self.lease.as_mut() {
            match &polled {
                Poll::Ready(None) => lease.finished(),
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(usage) = frame.data_ref().and_then(|d| find_usage(d)) {
                        lease.usage(&usage);
                    }
                    if ended {
                        lease.finished();
                    }
                }
                _ => {}
            }
        }
        let Some(asked) = &self.rename else {
            return polled;
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Poll::Ready(Some(Ok(Frame::data(rename_model(&data, asked))))),
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.rename.is_some() {
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
    fn usage_is_found_in_a_json_answer_and_in_a_stream_chunk() {
        let whole = br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#;
        assert_eq!(find_usage(whole).unwrap()["completion_tokens"], 4);
        let stream = b"data: {\"choices\":[]}\n\ndata: {\"usage\":{\"prompt_tokens\":5}}\n\n";
        assert_eq!(find_usage(stream).unwrap()["prompt_tokens"], 5);
        assert_eq!(find_usage(b"data: [DONE]"), None);
    }

    #[test]
    fn every_model_key_is_renamed_and_nothing_inside_a_string() {
        let data =
            br#"data: {"model":"smol-a","x":1} {"model":"a\"b"} {"content":"say \"model\":\"x\""}"#;
        let out = rename_model(data, "fast");
        assert_eq!(
            &out[..],
            br#"data: {"model":"fast","x":1} {"model":"fast"} {"content":"say \"model\":\"x\""}"#
        );
    }
}
