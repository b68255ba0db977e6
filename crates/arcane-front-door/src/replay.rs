//! A crash no client sees: a request whose engine died after it was forwarded and
//! before the first byte of its answer is sent again, once, to the engine that replaces
//! it, and the client gets an ordinary answer.
//!
//! Nothing of the answer had reached the client, so nothing is repeated in what it
//! reads; the engine that died had taken the request and never finished it, so the
//! request is done once. Only work that waits its turn in a model's queue
//! ([`RouteRequest::queued`]) with a body of at most [`MAX_REPLAYED`] bytes is kept for
//! a replay (the body is read whole before it is sent, which an upload larger than
//! that should not be), and only when the gateway confirms that the engine behind the
//! route is gone ([`arcane_core::route::Lease::engine_gone`]): a connection that broke
//! while the engine lives is no crash, and is answered as the failure it is.
//!
//! Never a second replay: the second answer, or its failure, is the client's. Once the
//! first byte has been sent, a crash ends the stream with the API's error event
//! ([`crate::passthrough`]), as before. The gateway says each replay in its events
//! (`local-ai.request.replayed`) and in the model's log.

use bytes::Bytes;
use hyper::body::Body;
use hyper::header::HeaderMap;
use hyper::{Method, Request, Response, Uri, Version};

use crate::passthrough::{Route, RouteRequest, Upstream};
use arcane_core::host::Work;
use arcane_core::upstream::{Deadlines, EngineAccess, EngineClient, HttpBody};
use arcane_core::Error;

/// The largest body kept for a replay.
pub const MAX_REPLAYED: u64 = 8 << 20;

/// What is needed to send a request again: its route request and its bytes.
pub(crate) struct Replay {
    wanted: RouteRequest,
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    body: Bytes,
}

impl Replay {
    /// Keeps what `request` needs to be sent again when `wanted` is queued work with a
    /// body of known length up to [`MAX_REPLAYED`] (read whole here) and `route` holds
    /// a lease that can confirm a crash (a single engine's route has none: nothing is
    /// kept for it); the request comes back with the same content. A body that fails to
    /// arrive is the client's 400.
    pub(crate) async fn capture(
        wanted: &RouteRequest,
        route: &Route,
        request: Request<HttpBody>,
    ) -> Result<(Request<HttpBody>, Option<Replay>), Box<Response<HttpBody>>> {
        let fits = request
            .body()
            .size_hint()
            .exact()
            .is_some_and(|n| n <= MAX_REPLAYED);
        if !wanted.queued || !fits || route.lease.is_none() {
            return Ok((request, None));
        }
        let (parts, body) = request.into_parts();
        let body = crate::passthrough::read_whole(body).await?;
        let replay = Replay {
            wanted: wanted.clone(),
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            version: parts.version,
            headers: parts.headers.clone(),
            body: body.clone(),
        };
        Ok((
            Request::from_parts(parts, arcane_core::upstream::full(body)),
            Some(replay),
        ))
    }

    /// A translated request (Ollama's API) Arcane built itself, kept for a replay.
    pub(crate) fn of_built(
        wanted: &RouteRequest,
        request: &Request<HttpBody>,
        body: Bytes,
    ) -> Self {
        Replay {
            wanted: wanted.clone(),
            method: request.method().clone(),
            uri: request.uri().clone(),
            version: request.version(),
            headers: request.headers().clone(),
            body,
        }
    }

    /// The request again, as it first came.
    fn request(&self) -> Request<HttpBody> {
        let mut request = Request::new(arcane_core::upstream::full(self.body.clone()));
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.version_mut() = self.version;
        *request.headers_mut() = self.headers.clone();
        request
    }
}

/// Whether `error` of an exchange means the engine went away before it answered: the
/// connection closed or reset before the response head, or nothing accepts on its
/// address any more.
pub(crate) fn engine_went_away(error: &Error) -> bool {
    match error {
        Error::EngineStopped { .. } => true,
        Error::Http { source, .. } => {
            crate::passthrough::connection_lost(&**source) || nothing_listens(&**source)
        }
        _ => false,
    }
}

/// Whether a cause of `error` is a refused connection or a socket that is gone.
fn nothing_listens(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(cause) = next {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(io.kind(), ConnectionRefused | NotFound) {
                return true;
            }
        }
        next = cause.source();
    }
    false
}

/// Sends `forwarded` on `route`; when its engine went away before answering and a
/// `replay` was kept, routes `replay` again (the gateway loads the model anew) and
/// sends it once more. Returns the answer, or the error of the last try.
pub(crate) async fn exchange(
    client: &EngineClient,
    upstream: &dyn Upstream,
    route: &mut Route,
    forwarded: Request<HttpBody>,
    replay: Option<Replay>,
    deadlines: Deadlines,
    work: &Work,
) -> Result<Response<HttpBody>, Failure> {
    let error = match crate::passthrough::send(client, route, forwarded, deadlines, work).await {
        Ok(answer) => return Ok(answer),
        Err(failure) => failure,
    };
    let (Failure::Engine(cause), Some(replay)) = (&error, replay) else {
        return Err(error);
    };
    if !engine_went_away(cause) {
        return Err(error);
    }
    let gone = match route.lease.as_mut() {
        Some(lease) => lease.engine_gone().await,
        None => false,
    };
    if !gone {
        return Err(error);
    }
    // The old lease (and its slot) goes before the new route waits for one.
    route.lease = None;
    *route = upstream
        .route(replay.wanted.clone())
        .await
        .map_err(|no_route| {
            Failure::NoRoute(crate::passthrough::in_api_shape(
                replay.uri.path(),
                no_route,
            ))
        })?;
    let again = forward_again(&route.access, &replay).map_err(Failure::Unsendable)?;
    crate::passthrough::send(client, route, again, deadlines, work).await
}

fn forward_again(access: &EngineAccess, replay: &Replay) -> Result<Request<HttpBody>, String> {
    crate::passthrough::forwarded_request(access, replay.request())
        .map_err(|_| format!("`{}` cannot be forwarded again", replay.uri))
}

/// Why an exchange gave no answer.
pub(crate) enum Failure {
    /// The host is shutting down (its drain deadline passed).
    Cancelled,
    /// The engine could not be reached, or failed before it answered.
    Engine(Error),
    /// A replay found no route (the model could not be loaded again).
    NoRoute(crate::passthrough::NoRoute),
    /// A replay could not be built.
    Unsendable(String),
}
