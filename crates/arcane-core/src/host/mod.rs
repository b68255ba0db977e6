//! The host: service registry, dispatcher, connections, event routing, replay and the
//! draining shutdown.
//!
//! # Theory of operation
//!
//! A [`Host`] is built once with its services ([`HostBuilder`]; duplicate service or
//! method names are refused) and started with [`Host::start`], which launches every
//! service's `start` in the background without waiting. A request waits only for its
//! own service to settle (`ready` or `failed`).
//!
//! Transports open a [`Connection`] per peer. Each connection has its own request-id
//! space: reusing one of its *active* ids fails with `RPC_REQUEST_ID_ACTIVE`, and two
//! connections may use the same id at once. Events that carry a `requestId` go only to
//! the connection that made the request; all other events go to every subscriber.
//! A new subscriber first receives a replay of the current state (`core.ready` when
//! ready, `core.state`, one `core.service.state` per service, then each service's
//! domain snapshots), never history; replay and subscription happen under the same
//! lock as publishing, so nothing is lost or duplicated between them.
//!
//! Transports that forward work the host does not dispatch (the HTTP passthrough to
//! an engine) take a [`Work`] from [`Host::accept_work`]: it is admitted and counted
//! exactly like a request, and held until the response has been sent.
//!
//! [`Host::close`] (idempotent; also fired through a [`ShutdownHandle`]) runs the
//! drain sequence: refuse new requests (`CORE_SHUTTING_DOWN`), cancel request-lifetime
//! work, wait for every accepted request to be answered and every [`Work`] to end
//! (those get until the drain deadline, [`HostBuilder::drain_deadline`], then are
//! cancelled and awaited), run each service's `drain` then `dispose` concurrently
//! (`dispose` even when `drain` fails; this is where engines are stopped, so no engine
//! is signalled while the host still holds a request open on it), publish
//! `core.state {state:"closed"}` and end every event stream.
//!
//! One file per seam: this one holds the types (the host, its builder, its shared
//! state); `lifecycle` the host's own methods (start, connect, shutdown, close),
//! `dispatch` the routing of requests and events inside it, `connection` one client's
//! connection and the work a shutdown waits for.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arcane_report::event_types;
use arcane_report::{error_json, Event, EventSink, NullSink};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::dispatch::FrameSink;
use crate::error::Error;
use crate::protocol::{Control, EventFrame, Request, Response, PROTOCOL};
use crate::service::{Lifetime, RequestContext, Service, ServiceContext, ServiceState};

mod connection;
mod dispatch;
mod lifecycle;

use connection::forget_idle_clients;

/// Built-in methods; services may not register these names.
pub const BUILTIN_METHODS: &[&str] = &[
    "system.ping",
    "version.current",
    "app.current",
    "core.host.shutdown",
];

/// The application a host serves, returned by `app.current` and sent in `core.ready`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AppInfo {
    /// A stable id, e.g. `arcane`.
    pub id: String,
    /// A display name.
    pub name: String,
    /// Its version.
    pub version: String,
}

impl Default for AppInfo {
    fn default() -> Self {
        Self {
            id: "arcane".into(),
            name: "Arcane".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }
}

/// The dispatcher's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HostState {
    /// Built, not started.
    Created,
    /// Started; requests are accepted.
    Ready,
    /// Shutting down; new requests are refused.
    Draining,
    /// Every service is disposed.
    Closed,
}

impl HostState {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Ready => "ready",
            Self::Draining => "draining",
            Self::Closed => "closed",
        }
    }
}

/// A service's state and, when failed, its serialized error.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceStatus {
    /// The state.
    pub state: ServiceState,
    /// The error (`{code, message, details}`) when `failed`.
    pub error: Option<Value>,
}

struct Entry {
    name: String,
    service: Arc<dyn Service>,
    status: watch::Sender<ServiceStatus>,
}

/// Where an event goes.
#[derive(Debug, Clone)]
pub(crate) enum EventRoute {
    Broadcast,
    Request { connection: u64, request_id: String },
}

struct Subscriber {
    connection: u64,
    sender: FrameSink,
}

struct ActiveRequest {
    method: String,
    lifetime: Lifetime,
    cancel: CancellationToken,
}

/// A named (HTTP) client's connection and when it was last asked for.
struct Named {
    connection: Arc<ConnectionInner>,
    last_used: std::time::Instant,
}

impl Named {
    /// No exchange holds it and it has no request in flight: it can be forgotten
    /// without anyone noticing (the next request naming it starts afresh).
    fn idle(&self) -> bool {
        Arc::strong_count(&self.connection) == 1
            && self
                .connection
                .active
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
    }
}

/// At most this many named clients are remembered; past it the least recently used
/// idle one is forgotten (local processes choose the names, so the map must be bounded).
const MAX_NAMED_CLIENTS: usize = 1024;
/// A named client idle for this long is forgotten.
const NAMED_CLIENT_IDLE: Duration = Duration::from_secs(300);

struct ConnectionInner {
    id: u64,
    label: String,
    active: Mutex<HashMap<String, ActiveRequest>>,
}

struct Inner {
    app: AppInfo,
    version: String,
    services: Vec<Arc<Entry>>,
    methods: HashMap<String, (usize, Lifetime)>,
    namespaces: HashSet<String>,
    state: watch::Sender<HostState>,
    /// `true` while requests are admitted; guarded with the active count.
    admission: Mutex<bool>,
    active: watch::Sender<usize>,
    /// Parent of every request-lifetime token; fired when draining starts.
    request_work: CancellationToken,
    /// Parent of every [`Work`] token; fired when the drain deadline passes.
    held_work: CancellationToken,
    /// How long a shutdown waits for [`Work`] before cancelling it.
    drain_deadline: Duration,
    /// Fired by anyone wanting the host closed (signals, stdin EOF, `core.host.shutdown`).
    shutdown_requested: CancellationToken,
    /// Fired when draining starts (services watch it).
    draining: CancellationToken,
    closing: AtomicBool,
    close_failures: Mutex<Vec<Value>>,
    subscribers: Mutex<Vec<Subscriber>>,
    connections: Mutex<HashMap<u64, Weak<ConnectionInner>>>,
    named: Mutex<HashMap<String, Named>>,
    next_connection: AtomicU64,
    observer: Arc<dyn EventSink>,
}

/// A cheap handle that publishes events through the host (held by services without
/// keeping the host alive).
#[derive(Clone)]
pub struct HostEvents {
    inner: Weak<Inner>,
}

impl HostEvents {
    pub(crate) fn publish(&self, event: &str, data: Value, route: EventRoute) {
        if let Some(inner) = self.inner.upgrade() {
            inner.publish(event, data, route);
        }
    }
}

impl EventSink for HostEvents {
    fn emit(&self, event: Event) {
        if let Some(inner) = self.inner.upgrade() {
            inner.publish_frame(
                EventFrame {
                    event: event.kind,
                    data: event.data,
                    request_id: None,
                    time: event.time,
                },
                EventRoute::Broadcast,
            );
        }
    }
}

/// Builds a [`Host`]: registers services, refusing duplicates.
pub struct HostBuilder {
    app: AppInfo,
    version: String,
    services: Vec<Arc<dyn Service>>,
    names: HashSet<String>,
    methods: HashMap<String, (usize, Lifetime)>,
    observer: Arc<dyn EventSink>,
    drain_deadline: Duration,
}

/// How long a shutdown waits for accepted [`Work`] by default.
pub const DEFAULT_DRAIN_DEADLINE: Duration = Duration::from_secs(30);

impl HostBuilder {
    /// How long a shutdown waits for accepted [`Work`] (passthrough responses) to end
    /// before it cancels what is left (default [`DEFAULT_DRAIN_DEADLINE`]).
    pub fn drain_deadline(mut self, deadline: Duration) -> Self {
        self.drain_deadline = deadline;
        self
    }

    /// The version `version.current` reports (default: this crate's).
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// Receives every broadcast event (host and service events, not request-scoped
    /// chunks), e.g. the CLI's printer.
    pub fn observer(mut self, observer: Arc<dyn EventSink>) -> Self {
        self.observer = observer;
        self
    }

    /// Registers a service. Fails with `ARCANE_ALREADY_EXISTS` when its name, or one of
    /// its methods, is already taken (including the built-in methods).
    pub fn service(mut self, service: Arc<dyn Service>) -> Result<Self, Error> {
        let name = service.name().to_string();
        if !self.names.insert(name.clone()) {
            return Err(Error::ServiceExists { name });
        }
        let index = self.services.len();
        let mut seen = HashSet::new();
        for method in service.methods() {
            if BUILTIN_METHODS.contains(&method.name.as_str())
                || self.methods.contains_key(&method.name)
                || !seen.insert(method.name.clone())
            {
                return Err(Error::ServiceExists { name: method.name });
            }
        }
        for method in service.methods() {
            self.methods.insert(method.name, (index, method.lifetime));
        }
        self.services.push(service);
        Ok(self)
    }

    /// Finishes the host (not started yet).
    pub fn build(self) -> Host {
        let namespaces = self
            .methods
            .keys()
            .map(String::as_str)
            .chain(BUILTIN_METHODS.iter().copied())
            .map(|m| namespace_of(m).to_string())
            .collect();
        let services = self
            .services
            .into_iter()
            .map(|service| {
                Arc::new(Entry {
                    name: service.name().to_string(),
                    service,
                    status: watch::Sender::new(ServiceStatus {
                        state: ServiceState::Registered,
                        error: None,
                    }),
                })
            })
            .collect();
        let inner = Arc::new(Inner {
            app: self.app,
            version: self.version,
            services,
            methods: self.methods,
            namespaces,
            state: watch::Sender::new(HostState::Created),
            admission: Mutex::new(false),
            active: watch::Sender::new(0),
            request_work: CancellationToken::new(),
            held_work: CancellationToken::new(),
            drain_deadline: self.drain_deadline,
            shutdown_requested: CancellationToken::new(),
            draining: CancellationToken::new(),
            closing: AtomicBool::new(false),
            close_failures: Mutex::new(Vec::new()),
            subscribers: Mutex::new(Vec::new()),
            connections: Mutex::new(HashMap::new()),
            named: Mutex::new(HashMap::new()),
            next_connection: AtomicU64::new(1),
            observer: self.observer,
        });
        Host { inner }
    }
}

fn namespace_of(method: &str) -> &str {
    method.split('.').next().unwrap_or(method)
}

/// Fires the host's shutdown from any thread (a signal handler, a watcher).
#[derive(Clone)]
pub struct ShutdownHandle(CancellationToken);

impl ShutdownHandle {
    /// Asks the host to drain and close. Idempotent.
    pub fn shutdown(&self) {
        self.0.cancel();
    }
}

/// The Core host. Cheap to clone; every clone is the same host.
#[derive(Clone)]
pub struct Host {
    inner: Arc<Inner>,
}

/// Work a transport runs itself, admitted by [`Host::accept_work`] and counted as an
/// accepted request until dropped.
pub struct Work {
    host: Arc<Inner>,
    cancel: CancellationToken,
}

/// One peer's view of the host: its own request-id space and event subscription.
pub struct Connection {
    host: Host,
    inner: Arc<ConnectionInner>,
}

struct ActiveGuard {
    host: Arc<Inner>,
    connection: Arc<ConnectionInner>,
    id: String,
}

/// A request admitted (or refused) by [`Connection::prepare`], to be run by
/// [`Connection::finish`]. Dropping it unanswered cancels the request.
pub struct Prepared(PreparedKind);

enum PreparedKind {
    Refused {
        id: String,
        error: Error,
    },
    Builtin {
        id: String,
        method: String,
    },
    /// Counted as active until the guard drops (after the answer is delivered).
    Admitted(Admitted, ActiveGuard),
}

/// What [`Connection::run`] needs of an admitted request.
struct Admitted {
    id: String,
    method: String,
    parameters: Value,
    /// The service's index; `None` for a built-in method.
    index: Option<usize>,
    lifetime: Lifetime,
    cancel: CancellationToken,
}
