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

use crate::error::Error;
use crate::protocol::{Control, EventFrame, Request, Response, PROTOCOL};
use crate::service::{Lifetime, RequestContext, Service, ServiceContext, ServiceState};

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
    sender: SubscriberSender,
}

/// Where a subscriber's frames go. A bounded subscriber that falls `capacity` frames
/// behind (a client that stopped reading) is dropped, which ends its stream: memory
/// stays bounded, and the client reconnects to a fresh replay.
enum SubscriberSender {
    Unbounded(mpsc::UnboundedSender<Arc<str>>),
    Bounded(mpsc::Sender<Arc<str>>),
}

impl SubscriberSender {
    /// Sends one frame; `false` when the subscriber is gone or too far behind.
    fn send(&self, frame: Arc<str>) -> bool {
        match self {
            Self::Unbounded(sender) => sender.send(frame).is_ok(),
            Self::Bounded(sender) => sender.try_send(frame).is_ok(),
        }
    }
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

impl Host {
    /// A builder for a host serving `app`.
    pub fn builder(app: AppInfo) -> HostBuilder {
        HostBuilder {
            app,
            version: env!("CARGO_PKG_VERSION").to_string(),
            services: Vec::new(),
            names: HashSet::new(),
            methods: HashMap::new(),
            observer: Arc::new(NullSink),
            drain_deadline: DEFAULT_DRAIN_DEADLINE,
        }
    }

    /// Admits one piece of work a transport runs itself (a passthrough exchange):
    /// `None` once shutdown began. A shutdown waits for the returned [`Work`] to be
    /// dropped, until the drain deadline, then fires [`Work::cancelled`].
    pub fn accept_work(&self) -> Option<Work> {
        let inner = &self.inner;
        let admitted = inner.admission.lock().ok()?;
        if !*admitted {
            return None;
        }
        inner.active.send_modify(|n| *n += 1);
        drop(admitted);
        Some(Work {
            host: Arc::clone(inner),
            cancel: inner.held_work.child_token(),
        })
    }

    /// Starts every service in the background and admits requests. Must be called
    /// inside a tokio runtime. Calling it twice does nothing.
    pub fn start(&self) {
        {
            let Ok(mut admitted) = self.inner.admission.lock() else {
                return;
            };
            if *self.inner.state.borrow() != HostState::Created {
                return;
            }
            *admitted = true;
            self.inner.state.send_replace(HostState::Ready);
        }
        self.inner.publish(
            event_types::CORE_READY,
            json!({"version": self.inner.version, "app": self.inner.app}),
            EventRoute::Broadcast,
        );
        self.inner.publish_state();
        for entry in &self.inner.services {
            let entry = Arc::clone(entry);
            let inner = Arc::clone(&self.inner);
            let context = ServiceContext {
                events: self.events(),
                shutdown: self.inner.draining.clone(),
            };
            inner.set_service_state(&entry, ServiceState::Starting, None);
            tokio::spawn(async move {
                let outcome = Arc::clone(&entry.service).start(context).await;
                // A service that settles after shutdown began keeps its draining state.
                if entry.status.borrow().state != ServiceState::Starting {
                    return;
                }
                match outcome {
                    Ok(()) => inner.set_service_state(&entry, ServiceState::Ready, None),
                    Err(error) => {
                        let error = error_json(&*error);
                        inner.publish(
                            event_types::CORE_ERROR,
                            json!({"service": entry.name, "error": error}),
                            EventRoute::Broadcast,
                        );
                        inner.set_service_state(&entry, ServiceState::Failed, Some(error));
                    }
                }
            });
        }
        let host = self.clone();
        tokio::spawn(async move {
            host.inner.shutdown_requested.cancelled().await;
            host.begin_close();
        });
    }

    /// A handle that fires shutdown from anywhere.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.inner.shutdown_requested.clone())
    }

    /// An event publisher for services and libraries.
    pub fn events(&self) -> HostEvents {
        HostEvents {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// The dispatcher's state.
    pub fn state(&self) -> HostState {
        *self.inner.state.borrow()
    }

    /// Every service's name and status, in registration order.
    pub fn services(&self) -> Vec<(String, ServiceStatus)> {
        self.inner
            .services
            .iter()
            .map(|e| (e.name.clone(), e.status.borrow().clone()))
            .collect()
    }

    /// The service registered under `name`.
    pub fn service(&self, name: &str) -> Option<Arc<dyn Service>> {
        self.inner
            .services
            .iter()
            .find(|e| e.name == name)
            .map(|e| Arc::clone(&e.service))
    }

    /// Waits until the service `name` has settled, returning its status.
    pub async fn service_settled(&self, name: &str) -> Option<ServiceStatus> {
        let entry = self.inner.services.iter().find(|e| e.name == name)?;
        let mut rx = entry.status.subscribe();
        let status = rx.wait_for(|s| s.state.is_settled()).await.ok()?.clone();
        Some(status)
    }

    /// The full state as `core.state` carries it.
    pub fn snapshot(&self) -> Value {
        self.inner.state_json()
    }

    /// Opens a private connection (its own request-id space), e.g. for stdio.
    pub fn connect(&self, label: &str) -> Connection {
        let inner = self.inner.new_connection(label);
        Connection {
            host: self.clone(),
            inner,
        }
    }

    /// The connection named `client` (HTTP clients name theirs with `X-Arcane-Client` /
    /// `?client=`), created on first use and shared by every HTTP request naming it.
    pub fn named_connection(&self, client: &str) -> Connection {
        let inner = {
            let mut named = self.inner.named.lock().unwrap_or_else(|p| p.into_inner());
            if !named.contains_key(client) {
                forget_idle_clients(&mut named);
            }
            let entry = named.entry(client.to_string()).or_insert_with(|| Named {
                connection: self.inner.new_connection(client),
                last_used: std::time::Instant::now(),
            });
            entry.last_used = std::time::Instant::now();
            Arc::clone(&entry.connection)
        };
        Connection {
            host: self.clone(),
            inner,
        }
    }

    /// Publishes `core.http.connection-limit` (the HTTP transport refused a connection
    /// because `max` were open).
    pub(crate) fn publish_connection_limit(&self, max: usize) {
        self.inner.publish(
            "core.http.connection-limit",
            serde_json::json!({
                "maxConnections": max,
                "message": format!("refusing new connections: {max} are open (a local process may be holding them)"),
            }),
            EventRoute::Broadcast,
        );
    }

    /// How many named clients the host remembers now (bounded; see
    /// [`named_connection`](Self::named_connection)).
    pub fn named_clients(&self) -> usize {
        self.inner
            .named
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Starts closing in the background (idempotent); see [`Host::close`].
    pub fn begin_close(&self) {
        if self.inner.closing.swap(true, Ordering::SeqCst) {
            return;
        }
        self.inner.shutdown_requested.cancel();
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move { inner.run_close().await });
    }

    /// Drains and closes the host, waiting until it is closed. Idempotent: every
    /// caller waits for the same sequence. Fails when a service's `drain` or
    /// `dispose` failed (the host is closed either way).
    pub async fn close(&self) -> Result<(), Error> {
        self.begin_close();
        self.closed().await;
        let failures = self
            .inner
            .close_failures
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Error::Shutdown { failures })
        }
    }

    /// Resolves once the host is closed.
    pub async fn closed(&self) {
        let mut rx = self.inner.state.subscribe();
        let _ = rx.wait_for(|s| *s == HostState::Closed).await;
    }

    /// Resolves once shutdown was requested (draining may still be running).
    pub async fn closing(&self) {
        self.inner.shutdown_requested.cancelled().await;
    }
}

impl Inner {
    fn new_connection(&self, label: &str) -> Arc<ConnectionInner> {
        let id = self.next_connection.fetch_add(1, Ordering::Relaxed);
        let connection = Arc::new(ConnectionInner {
            id,
            label: label.to_string(),
            active: Mutex::new(HashMap::new()),
        });
        if let Ok(mut all) = self.connections.lock() {
            all.retain(|_, weak| weak.strong_count() > 0);
            all.insert(id, Arc::downgrade(&connection));
        }
        connection
    }

    fn set_service_state(&self, entry: &Entry, state: ServiceState, error: Option<Value>) {
        entry.status.send_replace(ServiceStatus {
            state,
            error: error.clone(),
        });
        self.publish(
            event_types::CORE_SERVICE_STATE,
            json!({"name": entry.name, "state": state.as_str(), "error": error}),
            EventRoute::Broadcast,
        );
    }

    fn state_json(&self) -> Value {
        let services: Vec<Value> = self
            .services
            .iter()
            .map(|e| {
                let status = e.status.borrow();
                json!({"name": e.name, "state": status.state.as_str(), "error": status.error})
            })
            .collect();
        let mut active = Vec::new();
        if let Ok(connections) = self.connections.lock() {
            for connection in connections.values().filter_map(Weak::upgrade) {
                if let Ok(requests) = connection.active.lock() {
                    for (id, request) in requests.iter() {
                        active.push(json!({"id": id, "connection": connection.label, "method": request.method, "lifetime": request.lifetime}));
                    }
                }
            }
        }
        json!({
            "protocol": PROTOCOL,
            "state": self.state.borrow().as_str(),
            "version": self.version,
            "app": self.app,
            "services": services,
            "activeRequests": active,
        })
    }

    fn publish_state(&self) {
        self.publish(
            event_types::CORE_STATE,
            self.state_json(),
            EventRoute::Broadcast,
        );
    }

    fn publish(&self, event: &str, data: Value, route: EventRoute) {
        self.publish_frame(
            EventFrame {
                event: event.to_string(),
                data,
                request_id: None,
                time: arcane_report::time::now_rfc3339(),
            },
            route,
        );
    }

    fn publish_frame(&self, mut frame: EventFrame, route: EventRoute) {
        let target = match &route {
            EventRoute::Broadcast => {
                self.observer.emit(Event {
                    kind: frame.event.clone(),
                    time: frame.time.clone(),
                    data: frame.data.clone(),
                });
                None
            }
            EventRoute::Request {
                connection,
                request_id,
            } => {
                frame.request_id = Some(request_id.clone());
                Some(*connection)
            }
        };
        let text: Arc<str> = Arc::from(frame.to_frame().to_string());
        let Ok(mut subscribers) = self.subscribers.lock() else {
            return;
        };
        subscribers.retain(|s| {
            if target.is_some_and(|t| t != s.connection) {
                return true;
            }
            s.sender.send(Arc::clone(&text))
        });
    }

    /// The replay frames, in order: `core.ready` (when ready), `core.state`, one
    /// `core.service.state` per service, each service's snapshots.
    fn replay_frames(&self) -> Vec<Arc<str>> {
        let time = arcane_report::time::now_rfc3339();
        let frame = |event: &str, data: Value| -> Arc<str> {
            Arc::from(
                EventFrame {
                    event: event.to_string(),
                    data,
                    request_id: None,
                    time: time.clone(),
                }
                .to_frame()
                .to_string(),
            )
        };
        let mut frames = Vec::new();
        if *self.state.borrow() == HostState::Ready {
            frames.push(frame(
                event_types::CORE_READY,
                json!({"version": self.version, "app": self.app}),
            ));
        }
        frames.push(frame(event_types::CORE_STATE, self.state_json()));
        for entry in &self.services {
            let status = entry.status.borrow().clone();
            frames.push(frame(
                event_types::CORE_SERVICE_STATE,
                json!({"name": entry.name, "state": status.state.as_str(), "error": status.error}),
            ));
        }
        for entry in &self.services {
            for (event, data) in entry.service.replay() {
                frames.push(frame(&event, data));
            }
        }
        frames
    }

    async fn run_close(self: Arc<Self>) {
        // 1. Refuse new requests.
        if let Ok(mut admitted) = self.admission.lock() {
            *admitted = false;
        }
        self.state.send_replace(HostState::Draining);
        self.draining.cancel();
        self.publish_state();
        // 2. Cancel request-lifetime work.
        self.request_work.cancel();
        // 3. Wait for every accepted request to be answered and every `Work` to end;
        //    past the drain deadline, cancel the work (passthrough bodies are cut and
        //    their upstream connections closed) and wait for it to let go.
        let mut active = self.active.subscribe();
        let drained = tokio::time::timeout(self.drain_deadline, active.wait_for(|n| *n == 0))
            .await
            .is_ok();
        if !drained {
            self.held_work.cancel();
            let _ = active.wait_for(|n| *n == 0).await;
        }
        // 4. Drain then dispose each service, concurrently.
        let mut tasks = tokio::task::JoinSet::new();
        for entry in &self.services {
            let error = entry.status.borrow().error.clone();
            self.set_service_state(entry, ServiceState::Draining, error);
            let entry = Arc::clone(entry);
            tasks.spawn(async move {
                let mut failures = Vec::new();
                if let Err(error) = Arc::clone(&entry.service).drain().await {
                    failures.push(json!({"service": entry.name, "step": "drain", "error": error_json(&*error)}));
                }
                if let Err(error) = Arc::clone(&entry.service).dispose().await {
                    failures.push(json!({"service": entry.name, "step": "dispose", "error": error_json(&*error)}));
                }
                (entry, failures)
            });
        }
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((entry, failures)) => {
                    let error = failures.first().map(|f| f["error"].clone());
                    self.set_service_state(&entry, ServiceState::Closed, error);
                    if let Ok(mut all) = self.close_failures.lock() {
                        all.extend(failures);
                    }
                }
                Err(join) => {
                    if let Ok(mut all) = self.close_failures.lock() {
                        all.push(json!({"step": "dispose", "error": {"code": arcane_report::codes::ARCANE_OPERATION_FAILED, "message": format!("a service task panicked: {join}")}}));
                    }
                }
            }
        }
        // 5. Publish `closed`, then end every event stream.
        self.state.send_replace(HostState::Closed);
        self.publish_state();
        if let Ok(mut subscribers) = self.subscribers.lock() {
            subscribers.clear();
        }
    }
}

/// Work a transport runs itself, admitted by [`Host::accept_work`] and counted as an
/// accepted request until dropped.
pub struct Work {
    host: Arc<Inner>,
    cancel: CancellationToken,
}

impl Work {
    /// Resolves when a shutdown's drain deadline passed: stop the work now.
    pub fn cancelled(&self) -> WaitForCancellationFutureOwned {
        self.cancel.clone().cancelled_owned()
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        self.host.active.send_modify(|n| *n = n.saturating_sub(1));
    }
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

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        if let Ok(mut active) = self.connection.active.lock() {
            if let Some(request) = active.remove(&self.id) {
                // A dropped dispatch (client gone) cancels its work.
                request.cancel.cancel();
            }
        }
        self.host.active.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Connection {
    /// The host this connection belongs to.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Subscribes to events: the replay first, then every broadcast event and every
    /// event of this connection's requests. The channel ends when the host closes.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<Arc<str>> {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.subscribe_with(sender);
        receiver
    }

    /// Like [`Connection::subscribe`] with a caller-owned sender (the stdio transport
    /// writes responses into the same channel, so a stream's chunks always precede
    /// its response).
    pub fn subscribe_with(&self, sender: mpsc::UnboundedSender<Arc<str>>) {
        self.subscribe_sender(SubscriberSender::Unbounded(sender));
    }

    /// Like [`Connection::subscribe`], but the subscription is dropped (its stream
    /// ends) when more than `capacity` frames wait unread: for network clients that
    /// may stop reading.
    pub fn subscribe_bounded(&self, capacity: usize) -> mpsc::Receiver<Arc<str>> {
        let (sender, receiver) = mpsc::channel(capacity.max(64));
        self.subscribe_sender(SubscriberSender::Bounded(sender));
        receiver
    }

    fn subscribe_sender(&self, sender: SubscriberSender) {
        let inner = &self.host.inner;
        let Ok(mut subscribers) = inner.subscribers.lock() else {
            return;
        };
        for frame in inner.replay_frames() {
            sender.send(frame);
        }
        if *inner.state.borrow() != HostState::Closed {
            subscribers.push(Subscriber {
                connection: self.inner.id,
                sender,
            });
        }
    }

    /// Sends a frame to this connection's subscribers only (e.g. a response copy).
    pub fn deliver(&self, frame: &Value) {
        let text: Arc<str> = Arc::from(frame.to_string());
        if let Ok(mut subscribers) = self.host.inner.subscribers.lock() {
            subscribers
                .retain(|s| s.connection != self.inner.id || s.sender.send(Arc::clone(&text)));
        }
    }

    /// Applies a control frame to this connection and returns its result.
    pub fn control(&self, control: Control) -> Value {
        match control {
            Control::Cancel { request_id } => {
                let cancelled = self
                    .inner
                    .active
                    .lock()
                    .ok()
                    .and_then(|active| {
                        active
                            .get(&request_id)
                            .filter(|r| r.lifetime == Lifetime::Request)
                            .map(|r| r.cancel.cancel())
                    })
                    .is_some();
                json!({"requestId": request_id, "cancelled": cancelled})
            }
            Control::CancelAll => {
                let mut count = 0;
                if let Ok(active) = self.inner.active.lock() {
                    for request in active.values().filter(|r| r.lifetime == Lifetime::Request) {
                        request.cancel.cancel();
                        count += 1;
                    }
                }
                json!({"cancelled": count})
            }
            Control::Replay => {
                let inner = &self.host.inner;
                let frames = inner.replay_frames();
                let count = frames.len();
                if let Ok(mut subscribers) = inner.subscribers.lock() {
                    subscribers.retain(|s| {
                        s.connection != self.inner.id
                            || frames.iter().all(|f| s.sender.send(Arc::clone(f)))
                    });
                }
                json!({"replayed": count})
            }
        }
    }

    /// Cancels every request-lifetime request of this connection (a disconnect).
    pub fn cancel_all(&self) {
        let _ = self.control(Control::CancelAll);
    }

    /// Dispatches one request and returns its response (never fails: errors become
    /// `ok:false` responses).
    pub async fn dispatch(&self, request: Request) -> Response {
        let prepared = self.prepare(request);
        self.finish(prepared).await
    }

    /// The synchronous half of [`Connection::dispatch`]: admits the request (or
    /// refuses it) at once, so a transport that reads a request before end of input
    /// has it counted as accepted even if shutdown starts before it runs.
    pub fn prepare(&self, request: Request) -> Prepared {
        let host = &self.host.inner;
        let Request {
            id,
            method,
            parameters,
        } = request;
        // `core.host.shutdown` waits for the close it starts, so it cannot count as an
        // accepted request the close waits for; the other built-ins do.
        if method == "core.host.shutdown" {
            return Prepared(PreparedKind::Builtin { id, method });
        }
        let refuse = |error: Error| {
            Prepared(PreparedKind::Refused {
                id: id.clone(),
                error,
            })
        };
        let target = if BUILTIN_METHODS.contains(&method.as_str()) {
            Some((None, Lifetime::Request))
        } else {
            host.methods
                .get(&method)
                .map(|&(index, lifetime)| (Some(index), lifetime))
        };
        let Some((index, lifetime)) = target else {
            let namespace = namespace_of(&method).to_string();
            let reason = if host.namespaces.contains(&namespace) {
                "core-method-unavailable"
            } else {
                "core-namespace-unavailable"
            };
            return refuse(Error::MethodNotAllowed {
                method,
                namespace,
                reason,
            });
        };
        let cancel = match lifetime {
            Lifetime::Request => host.request_work.child_token(),
            Lifetime::Service => CancellationToken::new(),
        };
        // Admission and the active count change under one lock, so `close` never
        // misses a request it admitted.
        {
            let Ok(admitted) = host.admission.lock() else {
                return refuse(Error::ShuttingDown);
            };
            if !*admitted {
                return refuse(Error::ShuttingDown);
            }
            let Ok(mut active) = self.inner.active.lock() else {
                return refuse(Error::ShuttingDown);
            };
            if active.contains_key(&id) {
                return refuse(Error::RequestIdActive { id: id.clone() });
            }
            active.insert(
                id.clone(),
                ActiveRequest {
                    method: method.clone(),
                    lifetime,
                    cancel: cancel.clone(),
                },
            );
            host.active.send_modify(|n| *n += 1);
        }
        let guard = ActiveGuard {
            host: Arc::clone(host),
            connection: Arc::clone(&self.inner),
            id: id.clone(),
        };
        Prepared(PreparedKind::Admitted {
            id,
            method,
            parameters,
            index,
            lifetime,
            cancel,
            guard,
        })
    }

    /// The asynchronous half of [`Connection::dispatch`]: runs a prepared request.
    pub async fn finish(&self, prepared: Prepared) -> Response {
        let mut answer = None;
        self.finish_then(prepared, |response| answer = Some(response))
            .await;
        answer.unwrap_or_else(|| Response::error(None, &Error::ShuttingDown))
    }

    /// Like [`Connection::finish`], handing the response to `deliver` while the request
    /// still counts as accepted, so a shutdown waits until it is written (the stdio
    /// transport queues it here, before `closed`).
    pub async fn finish_then(&self, prepared: Prepared, deliver: impl FnOnce(Response)) {
        match prepared.0 {
            PreparedKind::Refused { id, error } => deliver(Response::error(Some(id), &error)),
            PreparedKind::Builtin { id, method } => {
                deliver(Response::ok(id, self.builtin(&method).await))
            }
            PreparedKind::Admitted {
                id,
                method,
                parameters,
                index,
                lifetime,
                cancel,
                guard,
            } => {
                let outcome = self
                    .run(id.clone(), method, parameters, index, lifetime, cancel)
                    .await;
                deliver(match outcome {
                    Ok(result) => Response::ok(id, result),
                    Err(error) => Response::error(Some(id), &*error),
                });
                drop(guard);
            }
        }
    }

    async fn builtin(&self, method: &str) -> Value {
        let host = &self.host.inner;
        match method {
            "system.ping" => json!({"ok": true}),
            "version.current" => {
                json!({"name": "arcane", "version": host.version, "protocol": PROTOCOL})
            }
            "app.current" => json!(host.app),
            _ => {
                // `core.host.shutdown`: drains, then answers `{state:"closed"}`.
                self.host.begin_close();
                self.host.closed().await;
                json!({"state": "closed"})
            }
        }
    }

    async fn run(
        &self,
        id: String,
        method: String,
        parameters: Value,
        index: Option<usize>,
        lifetime: Lifetime,
        cancel: CancellationToken,
    ) -> Result<Value, crate::service::BoxError> {
        let host = &self.host.inner;
        let Some(index) = index else {
            return Ok(self.builtin(&method).await);
        };
        let entry = Arc::clone(&host.services[index]);
        let mut status = entry.status.subscribe();
        let settled = tokio::select! {
            status = status.wait_for(|s| s.state.is_settled()) => status.map(|s| s.clone()).ok(),
            _ = cancel.cancelled() => return Err(Box::new(Error::Cancelled { id })),
        };
        let Some(settled) = settled else {
            return Err(Box::new(Error::ShuttingDown));
        };
        if settled.state != ServiceState::Ready {
            return Err(Box::new(Error::ServiceUnavailable {
                service: entry.name.clone(),
                state: settled.state.as_str().to_string(),
                error: settled.error,
            }));
        }
        let context = RequestContext {
            request_id: id.clone(),
            method: method.clone(),
            cancel: cancel.clone(),
            events: self.host.events(),
            route: EventRoute::Request {
                connection: self.inner.id,
                request_id: id.clone(),
            },
        };
        let call = Arc::clone(&entry.service).call(method, parameters, context);
        match lifetime {
            Lifetime::Request => {
                let outcome = tokio::select! {
                    outcome = call => outcome,
                    _ = cancel.cancelled() => return Err(Box::new(Error::Cancelled { id })),
                };
                // Cancelled work that would otherwise succeed still reports the abort.
                if cancel.is_cancelled() {
                    return Err(Box::new(Error::Cancelled { id }));
                }
                outcome
            }
            Lifetime::Service => call.await,
        }
    }
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
    Admitted {
        id: String,
        method: String,
        parameters: Value,
        index: Option<usize>,
        lifetime: Lifetime,
        cancel: CancellationToken,
        guard: ActiveGuard,
    },
}

/// Before a new name is added: forgets idle clients not used for [`NAMED_CLIENT_IDLE`],
/// then, at the cap, the least recently used idle one.
fn forget_idle_clients(named: &mut HashMap<String, Named>) {
    named.retain(|_, entry| !(entry.idle() && entry.last_used.elapsed() >= NAMED_CLIENT_IDLE));
    if named.len() < MAX_NAMED_CLIENTS {
        return;
    }
    let oldest = named
        .iter()
        .filter(|(_, entry)| entry.idle())
        .min_by_key(|(_, entry)| entry.last_used)
        .map(|(name, _)| name.clone());
    if let Some(name) = oldest {
        named.remove(&name);
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // A private connection going away cancels its requests; named (HTTP) clients
        // outlive any one HTTP exchange.
        if Arc::strong_count(&self.inner) == 1 {
            self.cancel_all();
        }
    }
}
