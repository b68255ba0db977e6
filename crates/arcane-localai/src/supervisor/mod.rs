//! [`Supervisor`]: probe first, adopt or own, readiness, events, clean stop.
//!
//! # Theory of operation
//!
//! [`Supervisor::start`] validates the configuration, publishes `starting`, stops a
//! proven orphan of an earlier Arcane (see `records`), and runs ONE probe:
//!
//! * healthy (or loading) external server → [`Server::Adopted`] (never signalled), unless
//!   a managed selection is required (`LOCAL_AI_EXTERNAL_SELECTION_UNSUPPORTED`);
//! * any other answer → fail, spawn nothing;
//! * refused on a loopback host → resolve the device plan, check the port is free,
//!   spawn the executable (process module), write the ownership record, and wait for
//!   readiness: the listening line triggers an immediate probe, and the readiness path
//!   is polled with a short backoff (10 ms doubling to 250 ms). A startup timeout and a
//!   load-stall timeout end a hung start; an early exit fails at once with its status
//!   and last lines. Cancellation stops the child and fails with `ARCANE_CANCELLED`.
//!
//! An owned server is then watched by one monitor task that owns the child: it sees a
//! crash at once (`error`, restart with backoff under [`RestartPolicy::OnFailure`];
//! when no restart is left, one last `error` whose message says it gave up, with
//! `details.gaveUp`: the table's one `error → error` change, `gave-up`), and performs [`OwnedServer::stop`] (SIGTERM to the group, grace, SIGKILL). Dropping
//! every [`OwnedServer`] handle stops the engine; dropping the monitor (runtime shut
//! down) kills it.
//!
//! The exit hook given to [`Supervisor::start_with_exit_hook`] runs exactly once: after
//! the owned process settles for good, or right after startup when nothing was spawned.
//!
//! One file per seam: this one holds the public types (the supervisor, the servers it
//! returns) and the state they share; `context` starts an engine (probe, adopt, version,
//! orphans), `launch` starts Arcane's own (device, spawn, readiness, stop), `monitor`
//! owns it once ready (output, crashes, restarts, the readiness watchdog).

use std::collections::VecDeque;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arcane_report::event_types;
use arcane_report::{codes, error_json, CancelToken, Event, EventSink};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::command::{engine_command, EngineCommand};
use crate::config::{Engine, EngineConfig, RestartPolicy, Validated};
use crate::endpoint::{Endpoint, EngineAddress};
use crate::execution::{self, SharedDeviceSource};
use crate::listen;
use crate::probe::{self, decide, Decision, ProbeOutcome};
use crate::process::{self, Child, ExitInfo, SpawnSpec, StopStep};
use crate::records::{self, OwnershipRecord, Record, RecordStore};
use crate::state::{Change, InvalidTransition, ServerSnapshot};
use crate::Error;

/// How many output lines are kept for error details.
mod context;
mod launch;
mod monitor;

use launch::llama_build;
pub(crate) use launch::normalize_version;

const LAST_LINES: usize = 20;
/// The first readiness poll delay; it doubles up to [`POLL_MAX`].
const POLL_FIRST: Duration = Duration::from_millis(10);
/// The longest wait between two readiness polls: a loading engine is asked every
/// 20 ms (a `GET /health` on a local socket costs well under a millisecond), so a cold
/// request waits at most that long after the engine is ready.
const POLL_MAX: Duration = Duration::from_millis(20);

/// Runs exactly once with the final snapshot.
pub type ExitHook = Box<dyn FnOnce(&ServerSnapshot) + Send>;

/// Starts servers for one workspace, publishing events to one sink.
#[derive(Clone)]
pub struct Supervisor {
    workspace: PathBuf,
    events: Arc<dyn EventSink>,
    devices: SharedDeviceSource,
    observer: Option<StateObserver>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("workspace", &self.workspace)
            .finish_non_exhaustive()
    }
}

impl Supervisor {
    /// A supervisor for `workspace` (ownership records live in its `.arcane/engines/`)
    /// that probes this machine's devices.
    pub fn new(workspace: impl Into<PathBuf>, events: Arc<dyn EventSink>) -> Self {
        Self {
            workspace: workspace.into(),
            events,
            devices: Arc::new(arcane_devices::LiveProbe),
            observer: None,
        }
    }

    /// Hands every published snapshot to `observer` too (typed, right after its event).
    pub fn with_observer(mut self, observer: StateObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Uses `source` instead of the live machine for device resolution (fixtures).
    pub fn with_device_source(mut self, source: SharedDeviceSource) -> Self {
        self.devices = source;
        self
    }

    /// Probes, then adopts or starts the server `config` describes, and returns once it
    /// is ready. See the module documentation for every path.
    pub async fn start(&self, config: EngineConfig, cancel: CancelToken) -> Result<Server, Error> {
        self.start_with_exit_hook(config, cancel, None).await
    }

    /// [`start`](Self::start), running `hook` exactly once when the server is down
    /// for good (owned), or right after startup settles (adopted or failed).
    pub async fn start_with_exit_hook(
        &self,
        config: EngineConfig,
        cancel: CancelToken,
        hook: Option<ExitHook>,
    ) -> Result<Server, Error> {
        let validated = config.validate(&self.workspace)?;
        let publisher = Arc::new(Publisher::new(
            self.events.clone(),
            self.observer.clone(),
            ServerSnapshot::new(
                &config.id,
                config.engine.as_str(),
                &validated.endpoint.origin(),
            ),
        ));
        let hook = Arc::new(Mutex::new(hook));
        publisher.announce();
        let context = Context {
            workspace: self.workspace.clone(),
            events: self.events.clone(),
            devices: self.devices.clone(),
            config,
            validated,
            publisher: publisher.clone(),
            hook: hook.clone(),
        };
        match context.start(&cancel).await {
            Ok(server) => Ok(server),
            Err(error) => {
                if error.is_cancelled() {
                    publisher.publish(Change::Stopped, |_| {});
                } else {
                    let record = error_json(&error);
                    publisher.publish(Change::Failed, |s| s.error = Some(record));
                }
                run_hook(&hook, &publisher.snapshot());
                Err(error)
            }
        }
    }
}

/// A ready server: owned (Arcane started it and will stop it) or adopted (it was
/// already running; Arcane never signals it).
#[derive(Debug)]
pub enum Server {
    /// Arcane spawned it.
    Owned(OwnedServer),
    /// It was already running.
    Adopted(AdoptedServer),
}

impl Server {
    /// The current snapshot.
    pub fn snapshot(&self) -> ServerSnapshot {
        match self {
            Server::Owned(s) => s.snapshot(),
            Server::Adopted(s) => s.snapshot(),
        }
    }

    /// A receiver that sees every state change.
    pub fn subscribe(&self) -> watch::Receiver<ServerSnapshot> {
        match self {
            Server::Owned(s) => s.subscribe(),
            Server::Adopted(s) => s.subscribe(),
        }
    }

    /// The listener url (origin).
    pub fn url(&self) -> String {
        self.snapshot().url
    }

    /// Whether Arcane spawned (and will stop) the server.
    pub fn is_owned(&self) -> bool {
        matches!(self, Server::Owned(_))
    }

    /// Stops an owned server, or releases an adopted one (left running).
    pub async fn close(self) -> StopReport {
        match self {
            Server::Owned(s) => s.stop().await,
            Server::Adopted(s) => s.release(),
        }
    }
}

/// How a stop ended.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StopReport {
    /// Which step ended the process (`released` for an adopted server).
    pub step: StopStep,
    /// How the process ended, when Arcane owned it.
    pub exit: Option<ExitInfo>,
    /// The final snapshot.
    pub snapshot: ServerSnapshot,
}

/// A server Arcane did not start. It has no stop or signal method: Arcane never
/// signals a process it did not spawn.
#[derive(Debug)]
pub struct AdoptedServer {
    publisher: Arc<Publisher>,
}

impl AdoptedServer {
    /// The current snapshot.
    pub fn snapshot(&self) -> ServerSnapshot {
        self.publisher.snapshot()
    }

    /// A receiver that sees every state change.
    pub fn subscribe(&self) -> watch::Receiver<ServerSnapshot> {
        self.publisher.subscribe()
    }

    /// Stops observing the server, which keeps running; publishes `stopped` with
    /// `stopStep: released`.
    pub fn release(self) -> StopReport {
        self.publisher.publish(Change::Stopped, |s| {
            s.stop_step = Some(StopStep::Released);
        });
        StopReport {
            step: StopStep::Released,
            exit: None,
            snapshot: self.publisher.snapshot(),
        }
    }
}

/// A server Arcane spawned and owns. Stop it with [`stop`](Self::stop); dropping the
/// last handle stops it too.
#[derive(Debug)]
#[must_use = "dropping an OwnedServer stops the engine"]
pub struct OwnedServer {
    publisher: Arc<Publisher>,
    stop: watch::Sender<bool>,
    done: watch::Receiver<Option<StopReport>>,
}

impl OwnedServer {
    /// The current snapshot.
    pub fn snapshot(&self) -> ServerSnapshot {
        self.publisher.snapshot()
    }

    /// A receiver that sees every state change (starting, loading, ready, error, stopped).
    ///
    /// Do not hold a borrow of it (`borrow()`, the guard `wait_for` returns) across an
    /// await: the supervisor cannot publish while a borrow is held.
    pub fn subscribe(&self) -> watch::Receiver<ServerSnapshot> {
        self.publisher.subscribe()
    }

    /// The engine's current process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.publisher.snapshot().pid
    }

    /// Stops the engine: SIGTERM to its process group, the configured grace, then
    /// SIGKILL; waits until it is reaped and publishes `stopped` saying which step ended
    /// it. Idempotent: later calls return the same report.
    pub async fn stop(&self) -> StopReport {
        let _ = self.stop.send(true);
        self.wait().await
    }

    /// Whether the server is down for good (stopped, or crashed with no restart left).
    pub fn is_finished(&self) -> bool {
        self.done.borrow().is_some()
    }

    /// Waits until the server is down for good: stopped, or crashed with no restart left.
    pub async fn wait(&self) -> StopReport {
        let mut done = self.done.clone();
        loop {
            if let Some(report) = done.borrow_and_update().clone() {
                return report;
            }
            if done.changed().await.is_err() {
                let snapshot = self.publisher.snapshot();
                return done.borrow().clone().unwrap_or(StopReport {
                    step: StopStep::AlreadyExited,
                    exit: snapshot.exit,
                    snapshot,
                });
            }
        }
    }
}

/// Sees every published snapshot, right after its `local-ai.server.<state>` event (the
/// typed twin of the events, for a host that keeps engine state).
pub type StateObserver = Arc<dyn Fn(&ServerSnapshot) + Send + Sync>;

/// The kind of the event that reports a refused state change (a bug, never a state).
pub const TRANSITION_REFUSED: &str = event_types::LOCAL_AI_TRANSITION_REFUSED;

/// Publishes state changes: every change goes through [`transition`]'s table, updates
/// the watched snapshot, and is emitted exactly once as `local-ai.server.<state>` with
/// the snapshot as data (then handed to the observer).
struct Publisher {
    events: Arc<dyn EventSink>,
    observer: Option<StateObserver>,
    snapshot: watch::Sender<ServerSnapshot>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("snapshot", &*self.snapshot.borrow())
            .finish_non_exhaustive()
    }
}

impl Publisher {
    fn new(
        events: Arc<dyn EventSink>,
        observer: Option<StateObserver>,
        initial: ServerSnapshot,
    ) -> Self {
        Self {
            events,
            observer,
            snapshot: watch::Sender::new(initial),
        }
    }

    fn snapshot(&self) -> ServerSnapshot {
        self.snapshot.borrow().clone()
    }

    fn subscribe(&self) -> watch::Receiver<ServerSnapshot> {
        self.snapshot.subscribe()
    }

    /// Changes fields without a state change (no event).
    fn update(&self, change: impl FnOnce(&mut ServerSnapshot)) {
        self.snapshot.send_modify(change);
    }

    /// Announces the initial `starting` state, once, when a start begins (entering the
    /// first state is not a change of the table).
    fn announce(&self) {
        self.emit_state(&self.snapshot());
    }

    /// Applies `change` (and the field edits that go with it) through the table. An
    /// invalid change is a bug: refused (the snapshot stays as it was), reported as a
    /// [`TRANSITION_REFUSED`] event, and a panic in debug builds.
    fn publish(&self, change: Change, edit: impl FnOnce(&mut ServerSnapshot)) {
        if let Err(refused) = self.transition(change, edit) {
            debug_assert!(false, "{refused}");
        }
    }

    /// [`publish`](Self::publish) without the debug assertion: the refusal is returned.
    fn transition(
        &self,
        change: Change,
        edit: impl FnOnce(&mut ServerSnapshot),
    ) -> Result<(), InvalidTransition> {
        let mut outcome = None;
        self.snapshot.send_if_modified(|s| match s.apply(change) {
            Ok(_) => {
                edit(s);
                outcome = Some(Ok(s.clone()));
                true
            }
            Err(refused) => {
                outcome = Some(Err(refused));
                false
            }
        });
        match outcome {
            Some(Ok(snapshot)) => {
                self.emit_state(&snapshot);
                Ok(())
            }
            Some(Err(refused)) => {
                let snapshot = self.snapshot();
                self.emit(
                    TRANSITION_REFUSED,
                    json!({
                        "id": snapshot.id,
                        "engine": snapshot.engine,
                        "from": refused.from.as_str(),
                        "change": refused.change.as_str(),
                        "message": refused.to_string(),
                    }),
                );
                Err(refused)
            }
            // `send_if_modified` always runs the closure.
            None => Ok(()),
        }
    }

    /// Emits `local-ai.server.<state>` for `snapshot`, then tells the observer.
    fn emit_state(&self, snapshot: &ServerSnapshot) {
        let data = serde_json::to_value(snapshot).unwrap_or(Value::Null);
        self.events.emit(Event::new(
            snapshot.state.event_type(crate::state::Subject::Server),
            data,
        ));
        if let Some(observer) = &self.observer {
            observer(snapshot);
        }
    }

    fn emit(&self, kind: &str, data: Value) {
        self.events.emit(Event::new(kind, data));
    }
}

fn run_hook(hook: &Mutex<Option<ExitHook>>, snapshot: &ServerSnapshot) {
    let taken = hook.lock().ok().and_then(|mut h| h.take());
    if let Some(hook) = taken {
        hook(snapshot);
    }
}

/// Everything one start needs; moved into the monitor for restarts.
struct Context {
    workspace: PathBuf,
    events: Arc<dyn EventSink>,
    devices: SharedDeviceSource,
    config: EngineConfig,
    validated: Validated,
    publisher: Arc<Publisher>,
    hook: Arc<Mutex<Option<ExitHook>>>,
}

/// An owned child with the bookkeeping readiness and stops need.
struct Running {
    child: Child,
    nonce: String,
    last_lines: VecDeque<String>,
    /// Whether the output pipes are still open (a closed channel is always ready).
    output_open: bool,
}

impl Running {
    fn last_lines(&self) -> Vec<String> {
        self.last_lines.iter().cloned().collect()
    }

    fn push_line(&mut self, publisher: &Publisher, line: process::OutputLine) {
        publisher.emit(
            match line.stream {
                process::Stream::Stdout => event_types::PROCESS_STDOUT,
                process::Stream::Stderr => event_types::PROCESS_STDERR,
            },
            json!({"pid": self.child.pid, "line": line.line}),
        );
        if self.last_lines.len() == LAST_LINES {
            self.last_lines.pop_front();
        }
        self.last_lines.push_back(line.line);
    }

    /// Moves every line already read into the ring (after an exit).
    async fn drain(&mut self, publisher: &Publisher) {
        // The reader threads finish once the pipes close; give them a moment.
        let deadline = Instant::now() + Duration::from_millis(200);
        while let Ok(Some(line)) = tokio::time::timeout_at(deadline, self.child.lines.recv()).await
        {
            self.push_line(publisher, line);
        }
    }
}

/// The task that owns a ready child: output, crashes, restarts, stops.
struct Monitor {
    context: Context,
    executable: PathBuf,
    launch: crate::command::DeviceLaunch,
    stop: watch::Receiver<bool>,
    done: watch::Sender<Option<StopReport>>,
    restarts: u32,
}

/// Probes a ready owned engine's readiness path every `interval`; an unanswered probe
/// is judged by what the engine's process group did meanwhile ([`monitor::Liveness`]):
/// resolves once the group is stopped, or `misses` probes in a row went unanswered
/// while it used no CPU time. Never resolves when turned off (`misses` 0).
struct Watchdog {
    interval: Duration,
    misses: u32,
    missed: u32,
    /// The next probe's timeout: the interval, widened after an unanswered probe.
    timeout: Duration,
    /// When the next probe is due (kept across the monitor's other wake-ups, such as
    /// output lines, so a chatty engine is probed on time too).
    next: Instant,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::EngineState;
    use arcane_report::Collector;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn publisher() -> (Arc<Collector>, Arc<AtomicUsize>, Publisher) {
        let events = Arc::new(Collector::default());
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = seen.clone();
        let observer: StateObserver = Arc::new(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let publisher = Publisher::new(
            events.clone(),
            Some(observer),
            ServerSnapshot::new("llama.cpp", "llama.cpp", "http://127.0.0.1:1"),
        );
        (events, seen, publisher)
    }

    /// One change is one event, one observed snapshot and one watch update: never two,
    /// never none.
    #[test]
    fn one_change_is_published_exactly_once() {
        let (events, seen, publisher) = publisher();
        let mut watched = publisher.subscribe();
        watched.mark_unchanged();
        publisher.announce();
        assert_eq!(events.types(), ["local-ai.server.starting"]);
        publisher.publish(Change::Ready, |s| s.version = Some("b1".into()));
        assert_eq!(
            events.types(),
            ["local-ai.server.starting", "local-ai.server.ready"]
        );
        assert_eq!(seen.load(Ordering::SeqCst), 2);
        assert!(watched.has_changed().unwrap());
        let snapshot = watched.borrow_and_update().clone();
        assert_eq!(snapshot.state, EngineState::Ready);
        assert!(snapshot.available);
        assert_eq!(events.events()[1].data["state"], "ready");
        assert_eq!(events.events()[1].data["version"], "b1");
    }

    /// A change the table refuses leaves the snapshot as it was, publishes no state
    /// event (and no watch update), and reports the refusal as its own event.
    #[test]
    fn an_invalid_change_is_refused_not_applied() {
        let (events, seen, publisher) = publisher();
        publisher.publish(Change::Stopped, |_| {});
        let mut watched = publisher.subscribe();
        watched.mark_unchanged();
        let refused = publisher.transition(Change::Ready, |s| s.version = Some("x".into()));
        assert_eq!(
            refused,
            Err(InvalidTransition {
                from: EngineState::Stopped,
                change: Change::Ready
            })
        );
        assert_eq!(
            events.types(),
            ["local-ai.server.stopped", TRANSITION_REFUSED]
        );
        assert_eq!(events.events()[1].data["from"], "stopped");
        assert_eq!(events.events()[1].data["change"], "ready");
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        assert!(!watched.has_changed().unwrap());
        let snapshot = publisher.snapshot();
        assert_eq!(snapshot.state, EngineState::Stopped);
        assert_eq!(snapshot.version, None);
    }

    /// In debug builds a refused change is also a panic: it is a bug in the supervisor.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "invalid state change `gave-up` in state `ready`")]
    fn an_invalid_change_panics_in_debug_builds() {
        let (_events, _seen, publisher) = publisher();
        publisher.publish(Change::Ready, |_| {});
        publisher.publish(Change::GaveUp, |_| {});
    }

    #[test]
    fn versions_compare_loosely() {
        assert_eq!(normalize_version("v0.5.1"), normalize_version("0.5.1"));
        assert_eq!(normalize_version("b6000"), normalize_version("6000"));
        assert_eq!(normalize_version("b6000-abc123"), "6000");
        assert_eq!(normalize_version("version: 6000 (abc123)"), "6000");
        assert_ne!(normalize_version("0.5.2"), normalize_version("0.5.1"));
    }
}
