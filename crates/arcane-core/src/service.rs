//! The [`Service`] trait: what a unit of functionality plugs into the host with.
//!
//! A service has a unique name, a fixed list of methods (each with a
//! [`Lifetime`]), and four lifecycle hooks: `start` (run once in the background when
//! the host starts; requests to the service wait for it), `call` (one method call),
//! `drain` and `dispose` (run concurrently with other services' at shutdown;
//! `dispose` runs even when `drain` fails). The host tracks each service's
//! [`ServiceState`] and publishes `core.service.state` on every change.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use arcane_report::Diagnostic;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::host::{EventRoute, HostEvents};

/// A boxed, sendable future (the trait's async methods return these).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A boxed library error with its stable code.
pub type BoxError = Box<dyn Diagnostic>;

/// The outcome of one method call: a JSON result or a diagnostic.
pub type MethodResult = Result<Value, BoxError>;

/// A service's state, in the order a service moves through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServiceState {
    /// Registered; the host has not started it.
    Registered,
    /// `start` is running; requests wait.
    Starting,
    /// Ready; requests are served.
    Ready,
    /// `start` failed; requests get `CORE_SERVICE_UNAVAILABLE`.
    Failed,
    /// Shutdown has begun; `drain` and `dispose` are running.
    Draining,
    /// Disposed.
    Closed,
}

impl ServiceState {
    /// The lowercase name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Registered => "registered",
            Self::Starting => "starting",
            Self::Ready => "ready",
            Self::Failed => "failed",
            Self::Draining => "draining",
            Self::Closed => "closed",
        }
    }

    /// Whether a waiting request can stop waiting (ready or never will be).
    pub fn is_settled(self) -> bool {
        !matches!(self, Self::Registered | Self::Starting)
    }
}

/// How long a method's work may live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lifetime {
    /// Cancelled by `request.cancel`, `requests.cancelAll`, the client's disconnect
    /// and shutdown (the default).
    Request,
    /// Ignores cancel controls and shutdown: shutdown waits for it to finish.
    Service,
}

/// One method a service provides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodSpec {
    /// The full dotted name, e.g. `llama.chat`.
    pub name: String,
    /// Its lifetime.
    pub lifetime: Lifetime,
}

impl MethodSpec {
    /// A request-lifetime method.
    pub fn request(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            lifetime: Lifetime::Request,
        }
    }

    /// A service-lifetime method.
    pub fn service(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            lifetime: Lifetime::Service,
        }
    }
}

/// What a service gets when it starts: a way to publish events to every client and a
/// token that fires when the host begins shutting down.
#[derive(Clone)]
pub struct ServiceContext {
    pub(crate) events: HostEvents,
    pub(crate) shutdown: CancellationToken,
}

impl ServiceContext {
    /// Publishes an event to every connection (and the host's observer).
    pub fn emit(&self, event: &str, data: Value) {
        self.events.publish(event, data, EventRoute::Broadcast);
    }

    /// Fires when the host starts shutting down.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// An [`arcane_report::EventSink`] that publishes library events (e.g. the
    /// supervisor's `local-ai.server.*`) to every connection.
    pub fn sink(&self) -> Arc<dyn arcane_report::EventSink> {
        Arc::new(self.events.clone())
    }
}

/// What one method call gets besides its parameters.
#[derive(Clone)]
pub struct RequestContext {
    /// The client's request id (unique among that connection's active requests).
    pub request_id: String,
    /// The method name.
    pub method: String,
    /// Fires when the request is cancelled (for request-lifetime methods) or, for
    /// service-lifetime methods, never before the host has closed.
    pub cancel: CancellationToken,
    pub(crate) events: HostEvents,
    pub(crate) route: EventRoute,
}

impl RequestContext {
    /// Publishes an event tied to this request: only the requesting connection
    /// receives it, with `requestId` set to the client's id.
    pub fn emit(&self, event: &str, data: Value) {
        self.events.publish(event, data, self.route.clone());
    }

    /// Publishes an event to every connection.
    pub fn broadcast(&self, event: &str, data: Value) {
        self.events.publish(event, data, EventRoute::Broadcast);
    }
}

/// A unit of functionality hosted by the Core host.
///
/// Implementations are shared (`Arc<Self>`) between the host and in-flight calls.
pub trait Service: Send + Sync + 'static {
    /// The unique service name, e.g. `local-ai`.
    fn name(&self) -> &str;

    /// The methods this service answers. Names must be unique across the host and may
    /// not shadow a built-in method.
    fn methods(&self) -> Vec<MethodSpec>;

    /// Starts the service (in the background; requests to it wait). The default does
    /// nothing.
    fn start(
        self: Arc<Self>,
        _context: ServiceContext,
    ) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async { Ok(()) })
    }

    /// Answers one method call.
    fn call(
        self: Arc<Self>,
        method: String,
        parameters: Value,
        context: RequestContext,
    ) -> BoxFuture<'static, MethodResult>;

    /// Stops taking new work and finishes what runs. The default does nothing.
    fn drain(self: Arc<Self>) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async { Ok(()) })
    }

    /// Releases everything (stops owned engines). Runs even when `drain` failed.
    fn dispose(self: Arc<Self>) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async { Ok(()) })
    }

    /// The service's current domain snapshots, sent to every new connection after the
    /// host's own state (e.g. `("localai.state", {...})`). Never history.
    fn replay(&self) -> Vec<(String, Value)> {
        Vec::new()
    }
}
