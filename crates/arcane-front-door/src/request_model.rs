//! Finding the model a forwarded request names, in one place, for every body kind.
//!
//! The model gateway routes each request by the model it names. Reading `model` only
//! from bodies whose `Content-Type` contained "json" sent everything else (a
//! `text/plain` body, `Application/JSON`, a multipart upload) to the default model
//! while its engine saw the other name. [`find`] reads, in this order:
//!
//! 1. **JSON** whatever the `Content-Type` says (a missing type, `Application/JSON`,
//!    `application/json; charset=utf-8`, `text/plain`, a leading UTF-8 BOM): a body
//!    that is not multipart is JSON when its first significant byte (after a BOM and
//!    whitespace) is `{`; it is then read whole, up to [`MAX_BUFFERED`] (413 past it),
//!    and its `model` and `keep_alive` are taken. One that does not parse is a 400
//!    naming the parse error (it names no model, and sending it to the default model
//!    answered a voice's request with another engine's 404). Any other body is not
//!    buffered: the bytes read to decide are sent first, then the rest as it comes.
//! 2. **`multipart/form-data`**: the field named `model` (at most [`MAX_MODEL_FIELD`]
//!    bytes). The body runs through a recorder into a streaming parser (`multer`),
//!    which stops once the `model` field is complete; the recorded prefix is then
//!    forwarded followed by the rest of the stream, untouched, so a file part after the
//!    field is never held. What is recorded is bounded by [`MAX_BUFFERED`]: a `model`
//!    field after a file part bigger than that is a 413. A body with no `model` field
//!    (or one the parser cannot read) goes to the default model.
//! 3. **`?model=`** in the query, when the body names none.
//!
//! A `model` that is present but not a string (`7`, `null`, an object) is a 400
//! (`ARCANE_USAGE`) whose details show it: `{"model": 7}`. `GET` and `HEAD` bodies are
//! not read. The forwarded body is byte for byte what the client sent.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::HeaderMap;
use hyper::{Method, StatusCode, Uri};
use serde_json::{json, Value};

use crate::passthrough::RouteRequest;
use arcane_core::upstream::{BodyError, HttpBody};
use arcane_core::Error;

/// The most bytes held to find the model (a JSON body, or a multipart body up to its
/// `model` field).
pub const MAX_BUFFERED: usize = 64 << 20;

/// The longest `model` field of a multipart body.
pub const MAX_MODEL_FIELD: usize = 4096;

/// Why a request's model could not be found: the status and the error to answer with.
#[derive(Debug)]
pub struct Refused {
    /// 400 (a `model` that is not a string, an unreadable body) or 413 (too large).
    pub status: StatusCode,
    /// The error (`ARCANE_USAGE`).
    pub error: Error,
}

impl Refused {
    fn usage(status: StatusCode, message: String, details: Value) -> Self {
        Self {
            status,
            error: Error::usage(message, details),
        }
    }

    fn too_large(limit: usize) -> Self {
        Self::usage(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {limit} bytes before it names its model"),
            json!({"limit": limit}),
        )
    }

    fn unreadable() -> Self {
        Self::usage(
            StatusCode::BAD_REQUEST,
            "the request body could not be read".into(),
            json!({}),
        )
    }

    /// A body that starts as JSON and is not: its model cannot be known, and no
    /// engine could read it either.
    fn not_json(error: serde_json::Error) -> Self {
        Self::usage(
            StatusCode::BAD_REQUEST,
            format!("the request body is not valid JSON: {error}"),
            json!({"line": error.line(), "column": error.column()}),
        )
    }

    fn not_a_string(value: Value) -> Self {
        Self::usage(
            StatusCode::BAD_REQUEST,
            format!("`model` must be a string, not `{value}`"),
            json!({ "model": value }),
        )
    }
}

/// The body to forward (byte for byte the client's) and what it asks for.
pub struct Found {
    /// The request body, to send on.
    pub body: HttpBody,
    /// The model, and `keep_alive`, it names.
    pub route: RouteRequest,
    /// The body is a JSON object, read whole (its `model` can be replaced:
    /// [`with_model`]).
    pub json: bool,
}

/// The JSON object `body` (a UTF-8 BOM allowed) with its `model` set to `name`,
/// written again; `None` when it is not a JSON object.
pub fn with_model(body: &[u8], name: &str) -> Option<Bytes> {
    let text = body.strip_prefix(BOM).unwrap_or(body);
    let mut value: Value = serde_json::from_slice(text).ok()?;
    value.as_object_mut()?.insert("model".into(), json!(name));
    serde_json::to_vec(&value).ok().map(Bytes::from)
}

/// Finds the model of a request (`method`, `uri`, `headers`, `body`); see the module
/// documentation. `limit` bounds what is held ([`MAX_BUFFERED`] at the front door).
pub async fn find<B>(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: B,
    limit: usize,
) -> Result<Found, Refused>
where
    B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
    B::Error: Into<BodyError>,
{
    let from_query = query_model(uri.query());
    if method == Method::GET || method == Method::HEAD {
        return Ok(Found {
            body: boxed(body),
            route: RouteRequest {
                model: from_query,
                ..RouteRequest::default()
            },
            json: false,
        });
    }
    let mut found = match multipart_boundary(headers) {
        Some(boundary) => from_multipart(body, boundary, limit).await?,
        None => from_json(body, limit).await?,
    };
    if found.route.model.is_none() {
        found.route.model = from_query;
    }
    Ok(found)
}

fn boxed<B>(body: B) -> HttpBody
where
    B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
    B::Error: Into<BodyError>,
{
    body.map_err(Into::into).boxed()
}

/// `?model=` (percent-decoded).
fn query_model(query: Option<&str>) -> Option<String> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("model="))
        .map(crate::passthrough::percent_decode)
}

/// The boundary of a `multipart/form-data` body (the media type in any case).
fn multipart_boundary(headers: &HeaderMap) -> Option<String> {
    let content_type = headers.get(hyper::header::CONTENT_TYPE)?.to_str().ok()?;
    let media = content_type.split(';').next()?.trim();
    if !media.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    multer::parse_boundary(content_type).ok()
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The first byte of `prefix` after a UTF-8 BOM and whitespace; `None` while only
/// those (or part of a BOM) have been seen.
fn first_significant(prefix: &[u8]) -> Option<u8> {
    let rest = if prefix.starts_with(BOM) {
        &prefix[BOM.len()..]
    } else if BOM.starts_with(prefix) {
        return None;
    } else {
        prefix
    };
    rest.iter().copied().find(|b| !b.is_ascii_whitespace())
}

/// A body sniffed as JSON is read whole (bounded) and parsed; any other is replayed.
async fn from_json<B>(body: B, limit: usize) -> Result<Found, Refused>
where
    B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
    B::Error: Into<BodyError>,
{
    let mut tape = Tape::new(body, limit);
    // Read until the first significant byte decides.
    let mut prefix: Vec<u8> = Vec::new();
    let first = loop {
        if let Some(first) = first_significant(&prefix) {
            break Some(first);
        }
        match tape.next().await? {
            Some(data) => prefix.extend_from_slice(&data),
            None => break None,
        }
    };
    if first != Some(b'{') {
        return Ok(Found {
            body: tape.replay(),
            route: RouteRequest::default(),
            json: false,
        });
    }
    while tape.next().await?.is_some() {}
    let whole = tape.recorded_bytes();
    let text = whole.strip_prefix(BOM).unwrap_or(&whole);
    let value: Value = serde_json::from_slice(text).map_err(Refused::not_json)?;
    let route = route_of(Some(&value))?;
    Ok(Found {
        body: tape.replay(),
        route,
        json: value.is_object(),
    })
}

/// The `model` and `keep_alive` of a parsed JSON body.
fn route_of(value: Option<&Value>) -> Result<RouteRequest, Refused> {
    let model = match value.and_then(|v| v.get("model")) {
        None => None,
        Some(Value::String(name)) => Some(name.clone()),
        Some(other) => return Err(Refused::not_a_string(other.clone())),
    };
    Ok(RouteRequest {
        model,
        keep_alive: value.and_then(|v| v.get("keep_alive").cloned()),
        ..RouteRequest::default()
    })
}

/// The `model` field of a multipart body, read through a recorder (see the module
/// documentation).
async fn from_multipart<B>(body: B, boundary: String, limit: usize) -> Result<Found, Refused>
where
    B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
    B::Error: Into<BodyError>,
{
    let shared = Arc::new(Mutex::new(Tape::new(body, limit)));
    let recorder = Recorder {
        tape: Arc::clone(&shared),
        gave: false,
    };
    let mut multipart =
        multer::Multipart::new(http_body_util::BodyDataStream::new(recorder), boundary);
    let model = model_field(&mut multipart).await;
    drop(multipart);
    let tape = match Arc::try_unwrap(shared) {
        Ok(tape) => tape.into_inner().unwrap_or_else(|p| p.into_inner()),
        // The parser is dropped: nothing else holds the tape.
        Err(_) => return Err(Refused::unreadable()),
    };
    if tape.over {
        return Err(Refused::too_large(limit));
    }
    if tape.failed {
        return Err(Refused::unreadable());
    }
    let model = match model? {
        None => None,
        Some(raw) => Some(String::from_utf8(raw).map_err(|raw| {
            Refused::not_a_string(Value::String(
                String::from_utf8_lossy(raw.as_bytes()).into_owned(),
            ))
        })?),
    };
    Ok(Found {
        body: tape.replay(),
        route: RouteRequest {
            model,
            ..RouteRequest::default()
        },
        json: false,
    })
}

/// Reads fields until the one named `model` is complete; `None` when the body ends (or
/// cannot be parsed) without one. Other fields, files included, are read past piece by
/// piece, never held here (the tape records what was read, within its limit).
async fn model_field(multipart: &mut multer::Multipart<'_>) -> Result<Option<Vec<u8>>, Refused> {
    loop {
        let mut field = match multipart.next_field().await {
            Ok(Some(field)) => field,
            // The end, or a body the parser cannot read (the tape tells a failed or
            // too large body apart): no `model` field.
            Ok(None) | Err(_) => return Ok(None),
        };
        let is_model = field.name() == Some("model");
        let mut value = Vec::new();
        loop {
            match field.chunk().await {
                Ok(Some(piece)) if is_model => {
                    if value.len() + piece.len() > MAX_MODEL_FIELD {
                        return Err(Refused::usage(
                            StatusCode::BAD_REQUEST,
                            format!("the multipart `model` field is longer than {MAX_MODEL_FIELD} bytes"),
                            json!({"limit": MAX_MODEL_FIELD}),
                        ));
                    }
                    value.extend_from_slice(&piece);
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => return Ok(None),
            }
        }
        if is_model {
            return Ok(Some(value));
        }
    }
}

/// The request body, recording every piece read from it (up to a limit) so that it
/// can be sent on whole.
struct Tape<B> {
    body: B,
    recorded: VecDeque<Bytes>,
    size: usize,
    limit: usize,
    /// More than `limit` bytes were asked for.
    over: bool,
    /// The body failed (the client went away).
    failed: bool,
    /// The body has ended.
    ended: bool,
}

impl<B> Tape<B>
where
    B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
    B::Error: Into<BodyError>,
{
    fn new(body: B, limit: usize) -> Self {
        Self {
            body,
            recorded: VecDeque::new(),
            size: 0,
            limit,
            over: false,
            failed: false,
            ended: false,
        }
    }

    /// The next data frame, recorded.
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, Refused>> {
        loop {
            if self.ended {
                return Poll::Ready(Ok(None));
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    self.ended = true;
                    return Poll::Ready(Ok(None));
                }
                Poll::Ready(Some(Err(_))) => {
                    self.failed = true;
                    return Poll::Ready(Err(Refused::unreadable()));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    // Trailers: a request body rarely has them, and they are not data.
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    if self.size + data.len() > self.limit {
                        self.over = true;
                        return Poll::Ready(Err(Refused::too_large(self.limit)));
                    }
                    self.size += data.len();
                    self.recorded.push_back(data.clone());
                    if self.body.is_end_stream() {
                        self.ended = true;
                    }
                    return Poll::Ready(Ok(Some(data)));
                }
            }
        }
    }

    async fn next(&mut self) -> Result<Option<Bytes>, Refused> {
        std::future::poll_fn(|cx| self.poll_data(cx)).await
    }

    /// Everything recorded, in one piece.
    fn recorded_bytes(&self) -> Vec<u8> {
        let mut all = Vec::with_capacity(self.size);
        for piece in &self.recorded {
            all.extend_from_slice(piece);
        }
        all
    }

    /// The body to forward: what was recorded, then the rest of the stream.
    fn replay(self) -> HttpBody {
        Replay {
            recorded: self.recorded,
            rest: (!self.ended).then_some(self.body),
        }
        .boxed()
    }
}

/// The recorder the multipart parser reads through: a body over the shared tape.
///
/// The parser (`multer`'s stream buffer) reads every piece that is ready before it
/// looks at what it has, so a fast client's whole upload would be read (and recorded)
/// before the `model` field is seen. After each piece the recorder says "not yet" once,
/// waking its task at once: the parser looks at each piece before it reads the next.
struct Recorder<B> {
    tape: Arc<Mutex<Tape<B>>>,
    /// A piece was just given: the next poll yields first.
    gave: bool,
}

impl<B> Body for Recorder<B>
where
    B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
    B::Error: Into<BodyError>,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        if std::mem::take(&mut this.gave) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let mut tape = this.tape.lock().unwrap_or_else(|p| p.into_inner());
        match tape.poll_data(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(Some(data))) => {
                this.gave = true;
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Poll::Ready(Ok(None)) => Poll::Ready(None),
            Poll::Ready(Err(refused)) => Poll::Ready(Some(Err(Box::new(refused.error)))),
        }
    }
}

/// The recorded prefix of a body, then its unread rest.
struct Replay<B> {
    recorded: VecDeque<Bytes>,
    rest: Option<B>,
}

impl<B> Body for Replay<B>
where
    B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
    B::Error: Into<BodyError>,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(data) = self.recorded.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        match self.rest.as_mut() {
            None => Poll::Ready(None),
            Some(rest) => match Pin::new(rest).poll_frame(cx) {
                Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(error.into()))),
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recorded.is_empty() && self.rest.as_ref().is_none_or(|rest| rest.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let recorded: u64 = self.recorded.iter().map(|piece| piece.len() as u64).sum();
        let rest = self
            .rest
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint);
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + recorded);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + recorded);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    /// A request body arriving in `pieces`, counting how many were read.
    struct Pieces {
        pieces: VecDeque<Bytes>,
        read: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Body for Pieces {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            let next = self.pieces.pop_front();
            if next.is_some() {
                self.read.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            Poll::Ready(next.map(|piece| Ok(Frame::data(piece))))
        }

        fn is_end_stream(&self) -> bool {
            self.pieces.is_empty()
        }
    }

    fn pieces(pieces: &[&[u8]]) -> (Pieces, Arc<std::sync::atomic::AtomicUsize>) {
        let read = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let body = Pieces {
            pieces: pieces.iter().map(|p| Bytes::copy_from_slice(p)).collect(),
            read: Arc::clone(&read),
        };
        (body, read)
    }

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(future)
    }

    /// `find` for a POST to `uri` with `content_type` and a body in `parts`; the model
    /// found and the forwarded body, which must be the client's bytes.
    fn post(
        uri: &str,
        content_type: Option<&str>,
        parts: &[&[u8]],
        limit: usize,
    ) -> Result<(RouteRequest, Vec<u8>), Refused> {
        let mut headers = HeaderMap::new();
        if let Some(content_type) = content_type {
            headers.insert(
                hyper::header::CONTENT_TYPE,
                content_type.parse().expect("a header value"),
            );
        }
        let (body, _) = pieces(parts);
        block_on(async {
            let found = find(
                &Method::POST,
                &uri.parse().expect("a URI"),
                &headers,
                body,
                limit,
            )
            .await?;
            let sent = found
                .body
                .collect()
                .await
                .expect("the forwarded body")
                .to_bytes();
            assert_eq!(sent.to_vec(), parts.concat(), "forwarded byte for byte");
            Ok((found.route, sent.to_vec()))
        })
    }

    fn model(uri: &str, content_type: Option<&str>, parts: &[&[u8]]) -> Option<String> {
        post(uri, content_type, parts, MAX_BUFFERED)
            .unwrap_or_else(|refused| panic!("{content_type:?}: {:?}", refused.error))
            .0
            .model
    }

    const CHAT: &[u8] = br#"{"model":"smol-b","keep_alive":"5m","messages":[]}"#;

    #[test]
    fn json_is_read_whatever_the_content_type_says() {
        for content_type in [
            Some("application/json"),
            Some("Application/JSON"),
            Some("application/json; charset=utf-8"),
            Some("text/plain"),
            Some("text/plain;charset=UTF-8"),
            Some("application/x-www-form-urlencoded"),
            None,
        ] {
            assert_eq!(
                model("/v1/chat/completions", content_type, &[CHAT]).as_deref(),
                Some("smol-b"),
                "{content_type:?}"
            );
        }
        let (route, _) = post("/v1/chat/completions", None, &[CHAT], MAX_BUFFERED).unwrap();
        assert_eq!(route.keep_alive, Some(json!("5m")));
    }

    #[test]
    fn a_leading_bom_and_a_body_split_anywhere_still_name_the_model() {
        let with_bom = [BOM, &b"\n "[..], CHAT].concat();
        assert_eq!(
            model(
                "/v1/chat/completions",
                Some("application/json"),
                &[&with_bom]
            )
            .as_deref(),
            Some("smol-b")
        );
        // The BOM itself split across reads, and the key too.
        let split: Vec<&[u8]> = vec![
            &with_bom[..1],
            &with_bom[1..2],
            &with_bom[2..12],
            &with_bom[12..],
        ];
        assert_eq!(
            model("/v1/chat/completions", Some("text/plain"), &split).as_deref(),
            Some("smol-b")
        );
    }

    #[test]
    fn a_model_that_is_not_a_string_is_refused_showing_it() {
        for (body, shown) in [
            (&br#"{"model":7}"#[..], json!(7)),
            (&br#"{"model":null}"#[..], Value::Null),
            (&br#"{"model":{"id":"x"}}"#[..], json!({"id": "x"})),
        ] {
            let refused = post(
                "/v1/chat/completions",
                Some("application/json"),
                &[body],
                MAX_BUFFERED,
            )
            .expect_err("a refusal");
            assert_eq!(refused.status, StatusCode::BAD_REQUEST);
            assert_eq!(
                arcane_report::Diagnostic::code(&refused.error),
                "ARCANE_USAGE"
            );
            assert_eq!(
                arcane_report::error_json(&refused.error)["details"],
                json!({ "model": shown })
            );
            assert!(
                refused.error.to_string().contains("`model`"),
                "{}",
                refused.error
            );
        }
    }

    #[test]
    fn a_body_that_starts_as_json_and_is_not_is_refused_naming_the_parse_error() {
        for body in [
            &b"{\"input\": \"hi\""[..],
            b"{input: 1}",
            b"  {\"model\":\"tts-1\",}",
        ] {
            let refused = post(
                "/v1/audio/speech",
                Some("application/json"),
                &[body],
                MAX_BUFFERED,
            )
            .expect_err("a refusal");
            assert_eq!(refused.status, StatusCode::BAD_REQUEST);
            let error = arcane_report::error_json(&refused.error);
            assert_eq!(error["code"], "ARCANE_USAGE");
            let message = error["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("not valid JSON") && message.contains("line 1"),
                "{error}"
            );
        }
    }

    #[test]
    fn the_query_names_the_model_when_the_body_does_not() {
        assert_eq!(
            model(
                "/v1/embeddings?x=1&model=org%2Fsmol",
                Some("application/json"),
                &[&b"{}"[..]]
            )
            .as_deref(),
            Some("org/smol")
        );
        assert_eq!(
            model(
                "/v1/embeddings?model=other",
                Some("application/json"),
                &[CHAT]
            )
            .as_deref(),
            Some("smol-b"),
            "the body wins"
        );
        assert_eq!(
            model("/tokenize?model=q", Some("audio/wav"), &[&b"RIFF...."[..]]).as_deref(),
            Some("q")
        );
    }

    #[test]
    fn a_body_that_is_not_json_is_not_buffered() {
        let (body, read) = pieces(&[&b"RIFF"[..], &b"...."[..], &b"data"[..]]);
        let found = block_on(find(
            &Method::POST,
            &"/v1/audio/transcriptions".parse().unwrap(),
            &HeaderMap::new(),
            body,
            MAX_BUFFERED,
        ))
        .unwrap_or_else(|r| panic!("{:?}", r.error));
        assert_eq!(found.route, RouteRequest::default());
        // Only the first piece was read to decide; the rest is streamed.
        assert_eq!(read.load(std::sync::atomic::Ordering::SeqCst), 1);
        let sent = block_on(found.body.collect()).unwrap().to_bytes();
        assert_eq!(&sent[..], b"RIFF....data");
    }

    #[test]
    fn a_json_body_over_the_limit_is_refused() {
        let refused = post(
            "/v1/chat/completions",
            Some("application/json"),
            &[&b"{\"model\":"[..], &b"\"smol-b\"}"[..]],
            12,
        )
        .expect_err("too large");
        assert_eq!(refused.status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    fn form(parts: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
        let mut body = Vec::new();
        for (name, file, value) in parts {
            body.extend_from_slice(b"--XyZ\r\n");
            let disposition = match file {
                Some(file) => format!(
                    "Content-Disposition: form-data; name=\"{name}\"; filename=\"{file}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                ),
                None => format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n"),
            };
            body.extend_from_slice(disposition.as_bytes());
            body.extend_from_slice(value);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(b"--XyZ--\r\n");
        body
    }

    const MULTIPART: &str = "Multipart/Form-Data; boundary=XyZ";

    #[test]
    fn a_multipart_model_field_before_or_after_a_file_names_the_model() {
        let audio = vec![7u8; 100_000];
        let before = form(&[("model", None, b"smol-b"), ("file", Some("a.wav"), &audio)]);
        let after = form(&[("file", Some("a.wav"), &audio), ("model", None, b"smol-b")]);
        let none = form(&[("file", Some("a.wav"), &audio), ("language", None, b"en")]);
        for (body, expected) in [
            (&before, Some("smol-b")),
            (&after, Some("smol-b")),
            (&none, None),
        ] {
            // In pieces of 1000 bytes, so a field crosses reads.
            let parts: Vec<&[u8]> = body.chunks(1000).collect();
            assert_eq!(
                model("/v1/audio/transcriptions", Some(MULTIPART), &parts).as_deref(),
                expected
            );
        }
    }

    #[test]
    fn a_multipart_body_bigger_than_the_limit_is_not_held_whole() {
        let big = vec![0u8; 4 << 20];
        let body = form(&[("model", None, b"smol-b"), ("file", Some("a.wav"), &big)]);
        let parts: Vec<&[u8]> = body.chunks(64 * 1024).collect();
        let total = parts.len();
        let limit = 1 << 20;
        let (reader, read) = pieces(&parts);
        let mut headers = HeaderMap::new();
        headers.insert(hyper::header::CONTENT_TYPE, MULTIPART.parse().unwrap());
        let found = block_on(find(
            &Method::POST,
            &"/v1/audio/transcriptions".parse().unwrap(),
            &headers,
            reader,
            limit,
        ))
        .unwrap_or_else(|r| panic!("{:?}", r.error));
        assert_eq!(found.route.model.as_deref(), Some("smol-b"));
        // The recorder holds only the prefix up to the field: one or two pieces.
        let held = read.load(std::sync::atomic::Ordering::SeqCst);
        assert!(held <= 2, "{held} of {total} pieces read before forwarding");
        let sent = block_on(found.body.collect()).unwrap().to_bytes();
        assert_eq!(sent.len(), body.len());
        assert!(sent[..] == body[..]);
        // A `model` field after a file bigger than the limit: 413, not a wrong model.
        let after = form(&[("file", Some("a.wav"), &big), ("model", None, b"smol-b")]);
        let parts: Vec<&[u8]> = after.chunks(64 * 1024).collect();
        let refused = post("/v1/audio/transcriptions", Some(MULTIPART), &parts, limit)
            .expect_err("too large");
        assert_eq!(refused.status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn a_multipart_model_field_past_its_bound_is_refused() {
        let long = vec![b'm'; MAX_MODEL_FIELD + 1];
        let body = form(&[("model", None, &long)]);
        let refused = post(
            "/v1/audio/transcriptions",
            Some(MULTIPART),
            &[&body],
            MAX_BUFFERED,
        )
        .expect_err("too long");
        assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn get_bodies_are_not_read() {
        let (body, read) = pieces(&[CHAT]);
        let found = block_on(find(
            &Method::GET,
            &"/v1/models?model=a".parse().unwrap(),
            &HeaderMap::new(),
            body,
            MAX_BUFFERED,
        ))
        .unwrap_or_else(|r| panic!("{:?}", r.error));
        assert_eq!(found.route.model.as_deref(), Some("a"));
        assert_eq!(read.load(std::sync::atomic::Ordering::SeqCst), 0);
    }
}
