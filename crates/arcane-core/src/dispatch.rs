//! The one thing every transport serves: an `arcane/1` endpoint, [`Dispatch`].
//!
//! The stdio loop and the HTTP transport's `/v1/rpc`, `/v1/control` and `/v1/events`
//! do not know what answers them: they open a [`Session`] per peer, subscribe it to
//! frames, submit requests and controls, and on end of input close what they serve.
//! The [`Host`] of this process is one implementation. Another (a host running in
//! another process, reached over its own transport) stands behind the same loops
//! unchanged; that is how a second process joins a running host.
//!
//! # The contract an implementation keeps
//!
//! * [`Session::submit`] admits (or refuses) the request **when it is called**, in
//!   call order, so a transport that read a request before its end of input has it
//!   counted even if shutdown starts before it runs; the returned future runs it.
//! * The response goes to `deliver` **while the request still counts as accepted**,
//!   and after every event of that request went to the session's subscribers: a
//!   stream's chunks precede its response, and a drain waits until it is handed over.
//! * [`Dispatch::close`] is what end of input means for the thing served: a host
//!   drains and closes (as in the SDK); a session with a remote host would only end.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::error::Error;
use crate::host::{Connection, Host, HostState};
use crate::protocol::{Control, Request, Response};
use crate::service::BoxFuture;

/// Who a session is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client<'a> {
    /// One peer with its own request-id space (stdio, a single HTTP exchange), with a
    /// label for logs.
    Private(&'a str),
    /// The named client's session, shared by every exchange naming it (HTTP's
    /// `X-Arcane-Client`), so a control or an event stream reaches its requests.
    Named(&'a str),
}

/// Where a session's frames (events, copies of responses) go. A bounded sink that
/// falls its capacity behind (a client that stopped reading) is dropped, which ends
/// its stream: memory stays bounded, and the client reconnects to a fresh replay.
#[derive(Debug)]
pub enum FrameSink {
    /// Never drops: the transport drains it as fast as frames come (stdio).
    Unbounded(mpsc::UnboundedSender<Arc<str>>),
    /// Dropped when full (network clients).
    Bounded(mpsc::Sender<Arc<str>>),
}

impl FrameSink {
    /// Sends one frame; `false` when the receiver is gone or too far behind.
    pub fn send(&self, frame: Arc<str>) -> bool {
        match self {
            Self::Unbounded(sender) => sender.send(frame).is_ok(),
            Self::Bounded(sender) => sender.try_send(frame).is_ok(),
        }
    }
}

/// Where a submitted request's response goes.
pub type Deliver = Box<dyn FnOnce(Response) + Send>;

/// An `arcane/1` endpoint a transport serves (see the module documentation).
pub trait Dispatch: Send + Sync {
    /// Opens a session for `client`.
    fn open(&self, client: Client<'_>) -> Arc<dyn Session>;

    /// Whether new requests are accepted now (a closing endpoint refuses them).
    fn accepting(&self) -> bool;

    /// Resolves once the endpoint has closed (the transport stops reading).
    fn closed(&self) -> BoxFuture<'_, ()>;

    /// What end of input means: drains and closes a host; ends a remote session.
    fn close(&self) -> BoxFuture<'_, Result<(), Error>>;
}

/// One peer's session: its request-id space and its frames.
pub trait Session: Send + Sync {
    /// Sends the replay of the current state to `sink`, then every broadcast event and
    /// every event of this session's requests, until the endpoint closes.
    fn subscribe(&self, sink: FrameSink);

    /// Admits `request` now; the future runs it and hands the response to `deliver`.
    fn submit(self: Arc<Self>, request: Request, deliver: Deliver) -> BoxFuture<'static, ()>;

    /// Applies a control frame (cancel, cancel all, replay) in call order, like
    /// [`submit`](Self::submit) admits; the future resolves to its result.
    fn control(self: Arc<Self>, control: Control) -> BoxFuture<'static, Value>;

    /// Sends `frame` to this session's subscribers only (a copy of a response).
    fn deliver(&self, frame: &Value);
}

/// Submits `request` on `session` and waits for its response (for transports that
/// answer each request on its own exchange).
pub async fn call(session: &Arc<dyn Session>, request: Request) -> Response {
    let (sender, receiver) = oneshot::channel();
    let id = request.id.clone();
    Arc::clone(session)
        .submit(
            request,
            Box::new(move |response| {
                let _ = sender.send(response);
            }),
        )
        .await;
    receiver
        .await
        .unwrap_or_else(|_| Response::error(Some(id), &Error::ShuttingDown))
}

impl Dispatch for Host {
    fn open(&self, client: Client<'_>) -> Arc<dyn Session> {
        Arc::new(match client {
            Client::Private(label) => self.connect(label),
            Client::Named(name) => self.named_connection(name),
        })
    }

    fn accepting(&self) -> bool {
        self.state() == HostState::Ready
    }

    fn closed(&self) -> BoxFuture<'_, ()> {
        Box::pin(Host::closed(self))
    }

    fn close(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(Host::close(self))
    }
}

impl Session for Connection {
    fn subscribe(&self, sink: FrameSink) {
        self.subscribe_sink(sink);
    }

    fn submit(self: Arc<Self>, request: Request, deliver: Deliver) -> BoxFuture<'static, ()> {
        let prepared = self.prepare(request);
        Box::pin(async move { self.finish_then(prepared, deliver).await })
    }

    fn control(self: Arc<Self>, control: Control) -> BoxFuture<'static, Value> {
        let result = Connection::control(&self, control);
        Box::pin(std::future::ready(result))
    }

    fn deliver(&self, frame: &Value) {
        Connection::deliver(self, frame);
    }
}
