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

/// Where a session's frames (events, copies of responses) go. A bounded sink whose
/// client falls its byte budget behind (it stopped reading) is dropped, which ends its
/// stream: memory stays bounded, and the client reconnects to a fresh replay.
#[derive(Debug)]
pub enum FrameSink {
    /// Never drops: the transport drains it as fast as frames come (stdio).
    Unbounded(mpsc::UnboundedSender<Arc<str>>),
    /// Dropped when its budget is spent (network clients).
    Bounded(BoundedFrames),
}

impl FrameSink {
    /// Sends one frame; `false` when the receiver is gone or too far behind.
    pub fn send(&self, frame: Arc<str>) -> bool {
        match self {
            Self::Unbounded(sender) => sender.send(frame).is_ok(),
            Self::Bounded(sender) => sender.send(frame),
        }
    }
}

/// A queue of frames bounded in bytes, not frames: frames are shared between every
/// client (an engine's output line is one frame, up to 64 KiB), so what one slow
/// client can keep alive is the bytes it has not read. [`frames_within`] makes one.
#[derive(Debug)]
pub struct BoundedFrames {
    sender: mpsc::UnboundedSender<Arc<str>>,
    queued: Arc<std::sync::atomic::AtomicUsize>,
    limit: usize,
}

impl BoundedFrames {
    /// Queues `frame` unless it would take the queue past its budget (a first frame
    /// is always taken, however long); `false` when refused or the receiver is gone.
    fn send(&self, frame: Arc<str>) -> bool {
        use std::sync::atomic::Ordering;
        let length = frame.len();
        let before = self.queued.fetch_add(length, Ordering::AcqRel);
        if before > 0 && before + length > self.limit {
            self.queued.fetch_sub(length, Ordering::AcqRel);
            return false;
        }
        self.sender.send(frame).is_ok()
    }
}

/// The reading end of a [`BoundedFrames`]: every frame taken gives its bytes back to
/// the budget.
#[derive(Debug)]
pub struct FrameReceiver {
    receiver: mpsc::UnboundedReceiver<Arc<str>>,
    queued: Arc<std::sync::atomic::AtomicUsize>,
}

impl FrameReceiver {
    /// The next frame, as [`mpsc::UnboundedReceiver::poll_recv`].
    pub fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Arc<str>>> {
        self.receiver.poll_recv(cx).map(|frame| self.taken(frame))
    }

    /// A frame already queued, if any.
    pub fn try_recv(&mut self) -> Option<Arc<str>> {
        let frame = self.receiver.try_recv().ok();
        self.taken(frame)
    }

    fn taken(&self, frame: Option<Arc<str>>) -> Option<Arc<str>> {
        if let Some(frame) = &frame {
            self.queued
                .fetch_sub(frame.len(), std::sync::atomic::Ordering::AcqRel);
        }
        frame
    }
}

/// A frame queue that holds at most `limit` bytes not yet read (see [`BoundedFrames`]).
pub fn frames_within(limit: usize) -> (BoundedFrames, FrameReceiver) {
    let (sender, receiver) = mpsc::unbounded_channel();
    let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    (
        BoundedFrames {
            sender,
            queued: Arc::clone(&queued),
            limit,
        },
        FrameReceiver { receiver, queued },
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(bytes: usize) -> Arc<str> {
        Arc::from("x".repeat(bytes))
    }

    /// A slow client's queue is bounded in bytes: frames past the budget are refused
    /// (its stream then ends), frames it reads give their bytes back, and a first frame
    /// longer than the whole budget still goes through.
    #[test]
    fn a_bounded_sink_holds_at_most_its_budget_in_bytes() {
        let (sink, mut receiver) = frames_within(100);
        let sink = FrameSink::Bounded(sink);
        assert!(sink.send(frame(60)));
        assert!(sink.send(frame(40)));
        assert!(!sink.send(frame(1)), "a byte past the budget is refused");
        assert_eq!(receiver.try_recv().map(|f| f.len()), Some(60));
        assert!(sink.send(frame(60)), "what was read is given back");
        assert_eq!(receiver.try_recv().map(|f| f.len()), Some(40));
        assert_eq!(receiver.try_recv().map(|f| f.len()), Some(60));
        assert_eq!(receiver.try_recv(), None);
        assert!(sink.send(frame(1000)), "an empty queue takes any one frame");
        assert!(!sink.send(frame(1)));
        drop(receiver);
        let (sink, receiver) = frames_within(100);
        drop(receiver);
        assert!(!FrameSink::Bounded(sink).send(frame(1)), "nobody reads");
    }
}
