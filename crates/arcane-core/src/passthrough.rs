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
use crate::upstream::{BodyError, Deadlines, EngineAccess, EngineClient, HttpBody};

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

/// Supplies the passthrough's target (implemented by the local-AI service).
pub trait Upstream: Send + Sync {
    /// The current target.
    fn openai_target(&self) -> UpstreamTarget;
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

/// Forwards an admitted `request` to the engine `upstream` names and returns its
/// answer (or the Core's 503 when the engine is not ready, 502/504 when it fails).
pub async fn forward(
    host: &Host,
    upstream: Option<&dyn Upstream>,
    client: &EngineClient,
    request: Request<Incoming>,
) -> Response<HttpBody> {
    // Accepted work from here until the response body is sent to the end.
    let Some(work) = host.accept_work() else {
        return crate::http::error_response(StatusCode::SERVICE_UNAVAILABLE, &Error::ShuttingDown);
    };
    let access = match target(upstream) {
        Ok(access) => access,
        Err(response) => return *response,
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
    let forwarded = match forwarded_request(&access, request) {
        Ok(forwarded) => forwarded,
        Err(response) => return *response,
    };
    let cancelled = work.cancelled();
    let answer = tokio::select! {
        answer = client.send_to(&access, forwarded, deadlines, Peer::Engine) => answer,
        // The drain deadline passed before the engine answered: drop the request.
        () = cancelled => return crate::http::error_response(StatusCode::SERVICE_UNAVAILABLE, &Error::ShuttingDown),
    };
    match answer {
        // llama.cpp serves the list but not `GET /v1/models/{id}` (the OpenAI clients'
        // `models.retrieve`): the entry comes from the list.
        Ok(upstream) if upstream.status() == StatusCode::NOT_FOUND && model_id.is_some() => {
            drop(upstream);
            let id = model_id.unwrap_or_default();
            retrieve_model(client, &access, &id).await
        }
        Ok(upstream) => {
            let (parts, body) = upstream.into_parts();
            let mut response = Response::new(WorkBody::new(body, work).boxed());
            *response.status_mut() = parts.status;
            copy_headers(&parts.headers, response.headers_mut());
            response
        }
        Err(error) => {
            let status =
                StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::BAD_GATEWAY);
            crate::http::error_response(status, &error)
        }
    }
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

/// The ready engine, or the 503 that says why there is none.
fn target(upstream: Option<&dyn Upstream>) -> Result<EngineAccess, Box<Response<HttpBody>>> {
    let target = match upstream {
        Some(upstream) => upstream.openai_target(),
        None => UpstreamTarget::Unavailable {
            runtime: "llama.cpp".into(),
            state: Unready::NotSelected,
            retry_after: None,
        },
    };
    match target {
        UpstreamTarget::Ready { access } => Ok(access),
        UpstreamTarget::Unavailable {
            runtime,
            state,
            retry_after,
        } => {
            let error = Error::EngineNotReady {
                runtime,
                state,
                retry_after,
            };
            let mut response = crate::http::error_response(StatusCode::SERVICE_UNAVAILABLE, &error);
            if let Some(seconds) = retry_after {
                response
                    .headers_mut()
                    .insert(hyper::header::RETRY_AFTER, HeaderValue::from(seconds));
            }
            Err(Box::new(response))
        }
    }
}

/// The client's request, re-addressed to the engine at `access` (hop-by-hop headers,
/// the Core's token and the origin are not forwarded; the engine's key is added).
fn forwarded_request(
    access: &EngineAccess,
    request: Request<Incoming>,
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
    builder
        .body(body.map_err(|e| -> BodyError { Box::new(e) }).boxed())
        .map_err(|_| {
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
    _work: Work,
}

impl WorkBody {
    fn new(inner: HttpBody, work: Work) -> Self {
        Self {
            inner,
            cut: Box::pin(work.cancelled()),
            _work: work,
        }
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
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
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
}
