//! The Core's one HTTP client, for engines and hosts alike: where an engine is
//! reached ([`EngineAccess`]: a TCP origin, or an owned engine's private Unix socket,
//! with the key an owned engine on a TCP port demands), one fresh connection per
//! exchange, and every exchange bounded by [`Deadlines`]: connecting, then the
//! response head, each bounded; a body then gets an idle (stall) deadline between two
//! pieces, never a total one, so a long stream runs as long as it keeps moving.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use arcane_localai::{ApiKey, EngineAddress};
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;

use crate::error::{Error, Peer, TimeoutPhase};

/// Why a body stopped: a transport error, a stall, or a shutdown that cut it.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// The body type of every request and response (endpoints, engine and host calls).
pub type HttpBody = BoxBody<Bytes, BodyError>;

/// How long connecting may take (loopback: an accept, or nothing listening).
pub const CONNECT_DEADLINE: Duration = Duration::from_secs(5);

/// The deadlines of one HTTP exchange after connecting (which
/// [`CONNECT_DEADLINE`] bounds): every call to an engine or a host has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// From sending the request to the response head, connecting included. A
    /// non-streamed completion's head comes only once it is generated.
    pub head: Duration,
    /// The longest wait for the next piece of the body: a stall deadline, never a
    /// total one.
    pub idle: Duration,
}

impl Deadlines {
    /// Questions answered from memory (health, status, model lists): 10 s each.
    pub const QUICK: Self = Self::uniform(Duration::from_secs(10));
    /// Generation (completions, chat, embeddings): 10 min to the head (a non-streamed
    /// answer), 2 min between two chunks.
    pub const GENERATION: Self = Self {
        head: Duration::from_secs(600),
        idle: Duration::from_secs(120),
    };
    /// Model downloads (`ollama.pull`): 1 h to the head, 10 min between two chunks.
    pub const TRANSFER: Self = Self {
        head: Duration::from_secs(3600),
        idle: Duration::from_secs(600),
    };

    /// `limit` for the head and between two chunks alike (the CLI's `--timeout`).
    pub const fn uniform(limit: Duration) -> Self {
        Self {
            head: limit,
            idle: limit,
        }
    }
}

/// Where and how the Core reaches one engine: its address (a TCP origin or the owned
/// engine's private socket) and the key an owned engine on a TCP port demands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineAccess {
    /// Where the engine answers.
    pub address: EngineAddress,
    /// The key to send as `Authorization: Bearer`, if the engine demands one.
    pub key: Option<ApiKey>,
}

impl EngineAccess {
    /// Access to a TCP `url` (an adopted engine, a host) with no key.
    pub fn tcp(url: &str) -> Result<Self, Error> {
        let endpoint = arcane_localai::Endpoint::parse(url).map_err(|e| Error::Http {
            url: url.into(),
            source: Box::new(e),
        })?;
        Ok(Self {
            address: EngineAddress::Tcp(endpoint),
            key: None,
        })
    }

    /// `path_and_query` at this engine, for messages (`http://127.0.0.1:8080/v1/models`,
    /// `unix:/w/.arcane/run/llama.cpp.sock:/v1/models`).
    pub fn url_of(&self, path_and_query: &str) -> String {
        self.address.url_of(path_and_query)
    }

    /// A request builder for `path_and_query` here: origin-form URI, the `Host` header,
    /// and the engine's key.
    pub fn request(&self, method: Method, path_and_query: &str) -> hyper::http::request::Builder {
        let mut builder = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(hyper::header::HOST, self.address.authority());
        if let Some(key) = &self.key {
            builder = builder.header(
                hyper::header::AUTHORIZATION,
                format!("Bearer {}", key.expose()),
            );
        }
        builder
    }
}

/// The HTTP client for engines and hosts: one fresh connection per request (TCP or the
/// engine's Unix socket), every exchange bounded by [`Deadlines`].
///
/// Connections are not pooled: `llama-server` may close a kept-alive connection right
/// after a streamed response, and a request sent on such a connection fails with
/// "connection closed before message completed" and cannot be replayed (its body is
/// a stream); an idle pooled connection would also be a request the engine sees as
/// open when it is stopped. A loopback connect costs tens of microseconds.
///
/// Dropping a response body closes its connection at once, so a client that goes away
/// mid-stream stops the engine's generation too.
#[derive(Clone, Default)]
pub struct EngineClient {
    _private: (),
}

/// A fresh [`EngineClient`].
pub fn engine_client() -> EngineClient {
    EngineClient::default()
}

impl EngineClient {
    /// Sends `request` (with an absolute `http://host:port/...` URI: a host, or an
    /// engine on TCP without a key) to `peer`; see [`EngineClient::send_to`].
    pub async fn send(
        &self,
        request: Request<HttpBody>,
        deadlines: Deadlines,
        peer: Peer,
    ) -> Result<Response<HttpBody>, Error> {
        let url = request.uri().to_string();
        let access = EngineAccess::tcp(&url)?;
        let (mut parts, body) = request.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        parts.uri = path.parse().map_err(|e| Error::Http {
            url: url.clone(),
            source: Box::new(e),
        })?;
        if !parts.headers.contains_key(hyper::header::HOST) {
            if let Ok(host) = HeaderValue::from_str(&access.address.authority()) {
                parts.headers.insert(hyper::header::HOST, host);
            }
        }
        self.exchange(
            &access,
            Request::from_parts(parts, body),
            url,
            deadlines,
            peer,
        )
        .await
    }

    /// Sends `request` (an origin-form URI and headers, as [`EngineAccess::request`]
    /// builds) to the engine at `access` and returns the response head within
    /// `deadlines.head`; its body fails with a stall once no data came for
    /// `deadlines.idle` (see [`collect`], which turns that into [`Error::Timeout`]).
    /// Failures name the URL.
    pub async fn send_to(
        &self,
        access: &EngineAccess,
        request: Request<HttpBody>,
        deadlines: Deadlines,
        peer: Peer,
    ) -> Result<Response<HttpBody>, Error> {
        let url = access.url_of(request.uri().path_and_query().map_or("/", |p| p.as_str()));
        self.exchange(access, request, url, deadlines, peer).await
    }

    async fn exchange(
        &self,
        access: &EngineAccess,
        request: Request<HttpBody>,
        url: String,
        deadlines: Deadlines,
        peer: Peer,
    ) -> Result<Response<HttpBody>, Error> {
        let timeout = |phase, deadline| Error::Timeout {
            url: url.clone(),
            phase,
            deadline,
            peer,
        };
        // 1. Connect, within the connect deadline.
        let stream = match tokio::time::timeout(CONNECT_DEADLINE, access.address.connect()).await {
            Err(_) => return Err(timeout(TimeoutPhase::Connect, CONNECT_DEADLINE)),
            Ok(Err(failure)) => {
                return Err(Error::Http {
                    url,
                    source: Box::new(failure),
                })
            }
            Ok(Ok(stream)) => stream,
        };
        // 2. The HTTP/1.1 handshake and the exchange, within the head deadline; the
        //    connection task lives as long as the response body.
        let head = async {
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            let connection = AbortOnDrop(tokio::spawn(connection));
            let response = sender.send_request(request).await?;
            Ok::<_, hyper::Error>((response, connection))
        };
        match tokio::time::timeout(deadlines.head, head).await {
            Err(_) => Err(timeout(TimeoutPhase::Head, deadlines.head)),
            Ok(Err(error)) => Err(Error::Http {
                url,
                source: Box::new(error),
            }),
            Ok(Ok((response, connection))) => Ok(response.map(|body| {
                StallBody {
                    inner: body,
                    idle: deadlines.idle,
                    timer: Box::pin(tokio::time::sleep(deadlines.idle)),
                    _connection: connection,
                }
                .boxed()
            })),
        }
    }
}

/// Aborts the connection task when the response body is dropped (the client went
/// away, or the body was read to the end): the engine sees its connection close.
struct AbortOnDrop(tokio::task::JoinHandle<Result<(), hyper::Error>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A body that stopped sending data for longer than its idle deadline.
#[derive(Debug, thiserror::Error)]
#[error("no data for {0:?}")]
pub struct Stalled(Duration);

/// An upstream body with an idle deadline: the timer restarts with every frame.
struct StallBody {
    inner: Incoming,
    idle: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
    _connection: AbortOnDrop,
}

impl Body for StallBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let next = tokio::time::Instant::now() + self.idle;
                self.timer.as_mut().reset(next);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(Box::new(error)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match self.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(Stalled(self.idle))))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Maps a body error to the crate's error: a stall is [`Error::Timeout`].
pub fn body_error(error: BodyError, url: &str, peer: Peer) -> Error {
    match error.downcast::<Stalled>() {
        Ok(stalled) => Error::Timeout {
            url: url.into(),
            phase: TimeoutPhase::Stall,
            deadline: stalled.0,
            peer,
        },
        Err(source) => Error::Http {
            url: url.into(),
            source,
        },
    }
}

/// Reads a whole (bounded-by-deadline) response body from `peer`.
pub async fn collect(response: Response<HttpBody>, url: &str, peer: Peer) -> Result<Bytes, Error> {
    response
        .into_body()
        .collect()
        .await
        .map(|collected| collected.to_bytes())
        .map_err(|error| body_error(error, url, peer))
}

/// A body from bytes.
pub fn full(bytes: impl Into<Bytes>) -> HttpBody {
    Full::new(bytes.into())
        .map_err(|never: Infallible| -> BodyError { match never {} })
        .boxed()
}

/// Streams an upstream body line by line, calling `line` for each non-empty, trimmed
/// line until it returns `false`; the one line splitter for every streamed reply
/// (llama.cpp SSE, Ollama NDJSON, the CLI's chat client). A stall past the body's idle
/// deadline is [`Error::Timeout`].
pub async fn stream_lines(
    response: Response<HttpBody>,
    url: &str,
    peer: Peer,
    mut line: impl FnMut(&str) -> bool,
) -> Result<(), Error> {
    let mut body = response.into_body();
    let mut buffer: Vec<u8> = Vec::new();
    // How much of `buffer` is known to hold no newline: a long line (an image's
    // base64) arriving in many frames is scanned once, not once per frame.
    let mut scanned = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| body_error(e, url, peer))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buffer.extend_from_slice(&data);
        while let Some(end) = buffer[scanned..].iter().position(|b| *b == b'\n') {
            let end = scanned + end;
            scanned = 0;
            let raw: Vec<u8> = buffer.drain(..=end).collect();
            let text = String::from_utf8_lossy(&raw);
            let text = text.trim();
            if !text.is_empty() && !line(text) {
                return Ok(());
            }
        }
        scanned = buffer.len();
    }
    let text = String::from_utf8_lossy(&buffer).trim().to_string();
    if !text.is_empty() {
        line(&text);
    }
    Ok(())
}

/// A body fed by a channel of pieces, one frame each; it ends when the sender is
/// dropped (a log follower, a file read on a blocking thread).
pub struct ChannelBody(tokio::sync::mpsc::Receiver<Bytes>);

impl ChannelBody {
    /// The body `receiver` feeds.
    pub fn new(receiver: tokio::sync::mpsc::Receiver<Bytes>) -> Self {
        Self(receiver)
    }
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, BodyError>>> {
        self.0
            .poll_recv(cx)
            .map(|piece| piece.map(|bytes| Ok(hyper::body::Frame::data(bytes))))
    }
}
