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
use crate::records::{self, Judgement, Record};
use crate::state::{Change, InvalidTransition, ServerSnapshot};
use crate::Error;

/// How many output lines are kept for error details.
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
        self.events
            .emit(Event::new(snapshot.state.event_type(), data));
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

/// Resolves when `cancel` fires (polled: the token is a blocking primitive).
async fn cancelled(cancel: &CancelToken) {
    while !cancel.is_cancelled() {
        tokio::time::sleep(Duration::from_millis(20)).await;
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

impl Context {
    fn engine(&self) -> Engine {
        self.config.engine
    }

    /// The configured url: probed first, adopted when it answers.
    fn endpoint(&self) -> &Endpoint {
        &self.validated.endpoint
    }

    /// The configured url as an address to probe.
    fn configured(&self) -> EngineAddress {
        EngineAddress::Tcp(self.validated.endpoint.clone())
    }

    /// Where an engine Arcane starts listens, and its key.
    fn owned(&self) -> &crate::config::Owned {
        &self.validated.owned
    }

    /// Prepares [`Context::owned`] for a spawn (see [`listen`]).
    async fn prepare_listen(&self) -> Result<(), Error> {
        let (workspace, id, owned) = (
            self.workspace.clone(),
            self.config.id.clone(),
            self.owned().clone(),
        );
        tokio::task::spawn_blocking(move || listen::prepare(&workspace, &id, &owned))
            .await
            .unwrap_or_else(|_| {
                Err(Error::Io {
                    operation: "prepare",
                    path: arcane_workspace::layout::run_dir(&self.workspace),
                    source: std::io::Error::other("the preparation did not finish"),
                })
            })
    }

    async fn start(self, cancel: &CancelToken) -> Result<Server, Error> {
        if cancel.is_cancelled() {
            return Err(self.cancelled_error());
        }
        self.reap_orphan().await?;
        if !self.config.adopts() {
            // Its own engine, always: nothing at the url is asked, let alone adopted.
            return self.launch(cancel).await;
        }
        let configured = self.configured();
        let outcome = tokio::select! {
            outcome = probe::probe(self.engine(), &configured, self.config.probe_timeout) => outcome,
            _ = cancelled(cancel) => return Err(self.cancelled_error()),
        };
        let answered = !matches!(outcome, ProbeOutcome::Refused);
        let reported = match &outcome {
            ProbeOutcome::Ready { version } => version.clone(),
            _ => None,
        };
        if answered {
            self.publisher.update(|s| s.external = true);
        }
        match decide(
            self.engine(),
            self.endpoint(),
            outcome,
            self.validated.selection.as_deref(),
        ) {
            Decision::Adopt => self.adopt(false, reported, cancel).await,
            Decision::AdoptLoading => self.adopt(true, None, cancel).await,
            Decision::Spawn => self.launch(cancel).await,
            Decision::Fail(error) => Err(error),
        }
    }

    fn cancelled_error(&self) -> Error {
        Error::Cancelled {
            engine: self.engine().as_str().into(),
        }
    }

    /// Adopts an external server: waits for it if it is loading, checks the version,
    /// publishes `ready`, and runs the exit hook (nothing was spawned).
    async fn adopt(
        self,
        loading: bool,
        reported: Option<String>,
        cancel: &CancelToken,
    ) -> Result<Server, Error> {
        let mut version = reported;
        if loading {
            self.publisher.publish(Change::Loading, |_| {});
            version = self.wait_external(cancel).await?;
        }
        let address = EngineAddress::Tcp(self.endpoint().clone());
        let version = self.check_version(&address, version, None).await?;
        self.publisher
            .publish(Change::Ready, |s| s.version = version);
        run_hook(&self.hook, &self.publisher.snapshot());
        Ok(Server::Adopted(AdoptedServer {
            publisher: self.publisher,
        }))
    }

    /// Polls a loading external server until it is ready (or the startup timeout).
    async fn wait_external(&self, cancel: &CancelToken) -> Result<Option<String>, Error> {
        let deadline = Instant::now() + self.config.startup_timeout;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(POLL_MAX) => {}
                _ = cancelled(cancel) => return Err(self.cancelled_error()),
            }
            match probe::probe(self.engine(), &self.configured(), self.config.probe_timeout).await {
                ProbeOutcome::Ready { version } => return Ok(version),
                ProbeOutcome::Loading if Instant::now() < deadline => {}
                ProbeOutcome::Loading => {
                    return Err(Error::ExternalNotReady {
                        engine: self.engine().as_str().into(),
                        url: self.endpoint().origin(),
                        timeout: self.config.startup_timeout,
                    })
                }
                other => {
                    return match decide(self.engine(), self.endpoint(), other, None) {
                        Decision::Fail(error) => Err(error),
                        _ => Err(Error::NotLoopback {
                            url: self.endpoint().origin(),
                        }),
                    }
                }
            }
        }
    }

    /// Checks the requested version against what the server reports (Ollama's
    /// `/api/version`; llama.cpp's `/props` `build_info`, else the registry's record
    /// of the executable). Returns the observed version.
    async fn check_version(
        &self,
        address: &EngineAddress,
        reported: Option<String>,
        runtime: Option<&str>,
    ) -> Result<Option<String>, Error> {
        let requested = self.config.version.as_deref().filter(|v| *v != "latest");
        let over_http = self.engine().kind().reports_build_over_http();
        let observed = match reported {
            Some(version) => Some(version),
            // `/props` costs a round trip on the way to ready: ask only when it matters.
            None if over_http && requested.is_some() => {
                llama_build(address, self.config.probe_timeout)
                    .await
                    .or_else(|| runtime.map(str::to_string))
            }
            None if over_http => runtime.map(str::to_string),
            None => None,
        };
        let Some(requested) = requested else {
            return Ok(observed);
        };
        let matches = observed
            .as_deref()
            .is_some_and(|o| normalize_version(o) == normalize_version(requested));
        if matches {
            Ok(observed)
        } else {
            Err(Error::VersionMismatch {
                engine: self.engine().as_str().into(),
                url: self.endpoint().origin(),
                requested: requested.into(),
                observed,
            })
        }
    }

    /// Stops a proven orphan of an earlier Arcane, removes stale records.
    async fn reap_orphan(&self) -> Result<(), Error> {
        records::check_dir(&self.workspace).await?;
        let Some(record) = records::read(&self.workspace, &self.config.id) else {
            return Ok(());
        };
        match records::judge(&record) {
            Judgement::OwnerAlive => Ok(()),
            Judgement::Stale(_) => {
                let (workspace, id, nonce) = (
                    self.workspace.clone(),
                    record.id.clone(),
                    record.nonce.clone(),
                );
                records::with_lock(
                    &self.workspace,
                    self.engine().as_str(),
                    &self.events,
                    move || records::remove(&workspace, &id, &nonce),
                )
                .await
            }
            Judgement::Orphan => {
                let step =
                    process::stop_orphan(record.pid, record.start_time, self.config.stop_grace)
                        .await;
                records::orphan_event(&*self.events, &record, step);
                let (workspace, id, nonce) = (
                    self.workspace.clone(),
                    record.id.clone(),
                    record.nonce.clone(),
                );
                records::with_lock(
                    &self.workspace,
                    self.engine().as_str(),
                    &self.events,
                    move || records::remove(&workspace, &id, &nonce),
                )
                .await
            }
        }
    }

    /// Starts the configured executable and waits until it is ready.
    async fn launch(self, cancel: &CancelToken) -> Result<Server, Error> {
        if let Some(reason) = &self.config.cannot_start {
            return Err(Error::CannotStart {
                engine: self.engine().as_str().into(),
                url: self.endpoint().origin(),
                reason: reason.clone(),
            });
        }
        let Some(executable) = self.config.executable.clone() else {
            return Err(Error::ExecutableMissing {
                engine: self.engine().as_str().into(),
                url: self.endpoint().origin(),
            });
        };
        self.publisher.update(|s| s.managed = true);
        if let Some(dir) = &self.validated.models_dir {
            std::fs::create_dir_all(dir).map_err(|source| Error::Io {
                operation: "create",
                path: dir.clone(),
                source,
            })?;
        }
        let resolved = tokio::select! {
            resolved = execution::resolve(&self.config, &self.devices) => resolved?,
            _ = cancelled(cancel) => return Err(self.cancelled_error()),
        };
        let record = resolved.execution;
        let execution_json = execution::to_json(&record);
        let mut running = self
            .spawn(&executable, &resolved.launch, execution_json)
            .await?;
        let abort = cancelled(cancel);
        let ready = self.wait_ready(&mut running, abort).await;
        let version = match ready {
            Ok(version) => version,
            Err(error) => return Err(self.fail_start(running, error).await),
        };
        let version = match self
            .check_version(
                &self.owned().address,
                version,
                self.config.runtime_version.as_deref(),
            )
            .await
        {
            Ok(version) => version,
            Err(error) => return Err(self.fail_start(running, error).await),
        };
        let pid = running.child.pid;
        let unchecked = record.clone();
        let placed = tokio::task::spawn_blocking(move || {
            let mut record = record;
            let result = execution::check_placement(&mut record, pid);
            (record, result)
        })
        .await;
        let (record, placement) = placed.unwrap_or((unchecked, Ok(())));
        if let Err(source) = placement {
            let error = Error::Execution {
                engine: self.engine().as_str().into(),
                source,
            };
            return Err(self.fail_start(running, error).await);
        }
        let execution_json = execution::to_json(&record);
        self.publisher.publish(Change::Ready, |s| {
            s.version = version;
            s.execution = execution_json;
        });
        let (stop, stop_rx) = watch::channel(false);
        let (done_tx, done) = watch::channel(None);
        let publisher = self.publisher.clone();
        let monitor = Monitor {
            context: self,
            executable,
            launch: resolved.launch,
            stop: stop_rx,
            done: done_tx,
            restarts: 0,
        };
        tokio::spawn(monitor.run(running));
        Ok(Server::Owned(OwnedServer {
            publisher,
            stop,
            done,
        }))
    }

    /// Spawns the engine, publishes `starting` (owned), writes the ownership record.
    async fn spawn(
        &self,
        executable: &Path,
        launch: &crate::command::DeviceLaunch,
        execution: Option<Value>,
    ) -> Result<Running, Error> {
        // Never run a program (or load libraries) another user could have swapped
        // (StrictModes): the program, its library directories and the libraries in them.
        match arcane_files::trust::check_program(executable, &self.config.library_dirs) {
            Ok(Ok(())) => {}
            Ok(Err(untrusted)) => {
                return Err(Error::Untrusted {
                    executable: executable.to_path_buf(),
                    detail: untrusted.describe(),
                    fix: untrusted.fix(),
                })
            }
            Err(source) => {
                return Err(Error::Spawn {
                    executable: executable.to_path_buf(),
                    source,
                })
            }
        }
        self.prepare_listen().await?;
        let nonce = records::new_nonce().map_err(|source| Error::Io {
            operation: "read random bytes for",
            path: records::path(&self.workspace, &self.config.id),
            source,
        })?;
        let key_file = listen::key_file(&self.workspace, &self.config.id, self.owned());
        let EngineCommand {
            program,
            args,
            env,
            env_remove,
        } = engine_command(
            &self.config,
            &self.validated,
            executable,
            launch,
            &nonce,
            key_file.as_deref(),
        );
        let owned = self.owned().clone();
        self.publisher.publish(Change::Spawned, |s| {
            s.owned = true;
            s.managed = true;
            s.execution = execution;
            s.exit = None;
            s.pid = None;
            s.url = owned.address.to_string();
            s.socket = owned.address.socket().map(Path::to_path_buf);
            s.api_key = owned.key.clone();
        });
        let cwd = process::working_directory(&program);
        self.publisher.emit(
            event_types::PROCESS_STARTING,
            json!({"command": program, "args": args, "cwd": cwd}),
        );
        let child = process::spawn(SpawnSpec {
            program: program.clone(),
            args,
            env,
            env_remove,
            cwd,
            parent_death_signal: self.config.parent_death_signal,
        })
        .await
        .map_err(|source| Error::Spawn {
            executable: program.clone(),
            source,
        })?;
        let pid = child.pid;
        self.publisher.update(|s| s.pid = Some(pid));
        let running = Running {
            child,
            nonce: nonce.clone(),
            last_lines: VecDeque::new(),
            output_open: true,
        };
        let record = Record {
            schema_version: 1,
            kind: "arcane-engine-ownership".into(),
            id: self.config.id.clone(),
            engine: self.engine().as_str().into(),
            url: self.owned().address.to_string(),
            port: match &self.owned().address {
                EngineAddress::Tcp(endpoint) => endpoint.port(),
                EngineAddress::Unix(_) => 0,
            },
            pid,
            start_time: running.child.start_time.unwrap_or(0),
            exe: running.child.exe.clone().unwrap_or_else(|| program.clone()),
            executable: program,
            nonce,
            owner: records::current_owner(),
            created_at: arcane_report::time::now_rfc3339(),
        };
        let workspace = self.workspace.clone();
        let written = records::with_lock(
            &self.workspace,
            self.engine().as_str(),
            &self.events,
            move || records::write(&workspace, &record),
        )
        .await;
        if let Err(error) = written {
            return Err(self.fail_start(running, error).await);
        }
        Ok(running)
    }

    /// Stops a child whose start failed, removes its record, and returns `error`.
    async fn fail_start(&self, mut running: Running, error: Error) -> Error {
        let (step, exit) = self.terminate(&mut running).await;
        let _ = step;
        self.publisher.update(|s| {
            s.exit = Some(exit);
            s.pid = None;
        });
        self.remove_record(&running.nonce).await;
        error
    }

    async fn terminate(&self, running: &mut Running) -> (StopStep, ExitInfo) {
        let pid = running.child.pid;
        if running.child.exit_status().is_none() {
            self.publisher.emit(
                event_types::PROCESS_CANCELLATION_REQUESTED,
                json!({"pid": pid}),
            );
        }
        let publisher = self.publisher.clone();
        let (step, exit) = running
            .child
            .terminate(self.config.stop_grace, move || {
                publisher.emit(
                    event_types::PROCESS_CANCELLATION_ESCALATED,
                    json!({"pid": pid, "signal": "SIGKILL"}),
                );
            })
            .await;
        self.publisher.emit(
            event_types::PROCESS_EXITED,
            json!({"pid": pid, "code": exit.code, "signal": exit.signal, "stopStep": step}),
        );
        (step, exit)
    }

    /// Forgets an owned process that has exited: removes its socket or key file and
    /// its ownership record.
    async fn remove_record(&self, nonce: &str) {
        let (workspace, id, owned) = (
            self.workspace.clone(),
            self.config.id.clone(),
            self.owned().clone(),
        );
        let _ =
            tokio::task::spawn_blocking(move || listen::clean_up(&workspace, &id, &owned)).await;
        let (workspace, id, nonce) = (
            self.workspace.clone(),
            self.config.id.clone(),
            nonce.to_string(),
        );
        // A record left behind is judged stale (or an orphan) by the next start.
        let _ = records::with_lock(
            &self.workspace,
            self.engine().as_str(),
            &self.events,
            move || records::remove(&workspace, &id, &nonce),
        )
        .await;
    }

    /// Waits until the owned engine answers ready; see the module doc.
    async fn wait_ready(
        &self,
        running: &mut Running,
        abort: impl Future<Output = ()>,
    ) -> Result<Option<String>, Error> {
        let engine = self.engine().as_str().to_string();
        let started = Instant::now();
        let deadline = started + self.config.startup_timeout;
        let mut last_progress = started;
        let mut delay = POLL_FIRST;
        let mut next_probe = started + POLL_FIRST;
        let mut loading = false;
        tokio::pin!(abort);
        loop {
            let stall_deadline = if loading {
                last_progress + self.config.stall_timeout
            } else {
                deadline
            };
            let wake = next_probe.min(deadline).min(stall_deadline);
            tokio::select! {
                biased;
                _ = &mut abort => return Err(self.cancelled_error()),
                exit = running.child.exit.exited() => {
                    running.drain(&self.publisher).await;
                    return Err(exit_error(&engine, &self.owned().address, exit, running.last_lines()));
                }
                line = running.child.lines.recv(), if running.output_open => {
                    if let Some(line) = line {
                        let announces = line.line.to_ascii_lowercase().contains("listening on");
                        running.push_line(&self.publisher, line);
                        last_progress = Instant::now();
                        if announces {
                            next_probe = Instant::now();
                        }
                    } else {
                        running.output_open = false;
                    }
                }
                _ = tokio::time::sleep_until(wake) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(Error::StartupTimeout {
                            engine, timeout: self.config.startup_timeout, last_lines: running.last_lines(),
                        });
                    }
                    if loading && now >= stall_deadline {
                        return Err(Error::Stalled {
                            engine, stall: self.config.stall_timeout, last_lines: running.last_lines(),
                        });
                    }
                    if now < next_probe {
                        continue;
                    }
                    match probe::probe_path(self.engine(), self.config.health_path(), &self.owned().address, self.config.probe_timeout).await {
                        ProbeOutcome::Ready { version } => return Ok(version),
                        ProbeOutcome::Loading => {
                            if !loading {
                                loading = true;
                                last_progress = Instant::now();
                                self.publisher.publish(Change::Loading, |_| {});
                            }
                        }
                        ProbeOutcome::Answered { status, body } => {
                            return Err(Error::NotReady {
                                engine, url: self.owned().address.to_string(), status, body,
                                last_lines: running.last_lines(),
                            });
                        }
                        ProbeOutcome::Refused | ProbeOutcome::NoHttp(_) | ProbeOutcome::Unreachable(_) => {}
                    }
                    delay = (delay * 2).min(POLL_MAX);
                    next_probe = Instant::now() + delay;
                }
            }
        }
    }
}

/// The error for an engine that exited before it was ready: a port conflict when its
/// output says so, else its exit status.
fn exit_error(
    engine: &str,
    address: &EngineAddress,
    exit: ExitInfo,
    last_lines: Vec<String>,
) -> Error {
    let port_taken = last_lines.iter().any(|line| {
        let line = line.to_ascii_lowercase();
        line.contains("address already in use")
            || line.contains("couldn't bind")
            || line.contains("could not bind")
    });
    match address {
        EngineAddress::Tcp(endpoint) if port_taken => {
            return Error::PortInUse {
                port: endpoint.port(),
                url: endpoint.origin(),
                evidence: "engine-output".into(),
                last_lines,
            }
        }
        EngineAddress::Unix(socket) if port_taken => {
            return Error::SocketInUse {
                socket: socket.clone(),
            }
        }
        _ => {}
    }
    Error::ExitedEarly {
        engine: engine.into(),
        status: exit.describe(),
        code: exit.code,
        signal: exit.signal,
        last_lines,
    }
}

/// llama.cpp's build (`b6000` from `/props` `build_info` `b6000-abc123`), if it says.
async fn llama_build(address: &EngineAddress, timeout: Duration) -> Option<String> {
    let answer = crate::http::get(address, "/props", timeout).await.ok()?;
    if !(200..300).contains(&answer.status) {
        return None;
    }
    let props: Value = serde_json::from_slice(&answer.body).ok()?;
    let build = props.get("build_info")?.as_str()?;
    Some(build.split('-').next().unwrap_or(build).to_string())
}

/// Compares versions loosely: case, a leading `v` (Ollama) or `b` (llama.cpp build),
/// and anything after the first `-`, space or `(` are ignored.
pub(crate) fn normalize_version(version: &str) -> String {
    let lower = version.trim().to_ascii_lowercase();
    let lower = lower
        .strip_prefix("version:")
        .map(str::trim)
        .unwrap_or(&lower);
    let mut text = lower.strip_prefix('v').unwrap_or(lower);
    if let Some(rest) = text.strip_prefix('b') {
        if rest.starts_with(|c: char| c.is_ascii_digit()) {
            text = rest;
        }
    }
    text.split(['-', ' ', '('])
        .next()
        .unwrap_or(text)
        .to_string()
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

/// Probes a ready owned engine's readiness path every `interval` (each probe waiting
/// at most as long); resolves once `misses` probes in a row went unanswered (no HTTP
/// answer, or not ready). Never resolves when turned off (`misses` 0).
struct Watchdog {
    interval: Duration,
    misses: u32,
    missed: u32,
    /// When the next probe is due (kept across the monitor's other wake-ups, such as
    /// output lines, so a chatty engine is probed on time too).
    next: Instant,
}

impl Watchdog {
    fn new(config: &crate::config::EngineConfig) -> Self {
        Self {
            interval: config.watchdog_interval,
            misses: config.watchdog_misses,
            missed: 0,
            next: Instant::now() + config.watchdog_interval,
        }
    }

    async fn unanswered(&mut self, context: &Context) {
        if self.misses == 0 || self.interval.is_zero() {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep_until(self.next).await;
            self.next = Instant::now() + self.interval;
            let outcome = probe::probe_path(
                context.engine(),
                context.config.health_path(),
                &context.owned().address,
                self.interval,
            )
            .await;
            if matches!(outcome, ProbeOutcome::Ready { .. } | ProbeOutcome::Loading) {
                self.missed = 0;
                continue;
            }
            self.missed += 1;
            if self.missed >= self.misses {
                return;
            }
        }
    }
}

impl Monitor {
    async fn run(mut self, mut running: Running) {
        let publisher = self.context.publisher.clone();
        let mut watchdog = Watchdog::new(&self.context.config);
        loop {
            let mut stop = self.stop.clone();
            let stop_requested = async move {
                let _ = stop.wait_for(|requested| *requested).await;
            };
            tokio::select! {
                biased;
                _ = stop_requested => {
                    let (step, exit) = self.context.terminate(&mut running).await;
                    self.context.remove_record(&running.nonce).await;
                    publisher.publish(Change::Stopped, |s| {
                        s.stop_step = Some(step);
                        s.exit = Some(exit);
                        s.pid = None;
                    });
                    self.finish(step, Some(exit));
                    return;
                }
                line = running.child.lines.recv(), if running.output_open => {
                    match line {
                        Some(line) => running.push_line(&publisher, line),
                        // Both pipes closed; the exit branch will follow.
                        None => running.output_open = false,
                    }
                }
                () = watchdog.unanswered(&self.context) => {
                    // Stopped answering while ready: stopped like a crash, so requests
                    // waiting on it fail now and the next one starts it again.
                    let (_, exit) = self.context.terminate(&mut running).await;
                    running.drain(&publisher).await;
                    let error = Error::Unresponsive {
                        engine: self.context.engine().as_str().into(),
                        misses: watchdog.misses,
                        interval: watchdog.interval,
                        last_lines: running.last_lines(),
                    };
                    publisher.publish(Change::Failed, |s| {
                        s.error = Some(error_json(&error));
                        s.exit = Some(exit);
                        s.pid = None;
                    });
                    self.context.remove_record(&running.nonce).await;
                    match self.restart().await {
                        Some(next) => {
                            running = next;
                            watchdog = Watchdog::new(&self.context.config);
                        }
                        None => {
                            self.finish(StopStep::Sigkill, Some(exit));
                            return;
                        }
                    }
                }
                exit = running.child.exit.exited() => {
                    running.drain(&publisher).await;
                    let error = Error::ExitedEarly {
                        engine: self.context.engine().as_str().into(),
                        status: exit.describe(),
                        code: exit.code,
                        signal: exit.signal,
                        last_lines: running.last_lines(),
                    };
                    let message = format!("`{}` stopped unexpectedly ({})", self.context.engine(), exit.describe());
                    let mut record = error_json(&error);
                    record["message"] = Value::String(message);
                    publisher.publish(Change::Failed, |s| {
                        s.error = Some(record);
                        s.exit = Some(exit);
                        s.pid = None;
                    });
                    self.context.remove_record(&running.nonce).await;
                    match self.restart().await {
                        Some(next) => running = next,
                        None => {
                            if *self.stop.borrow() {
                                publisher.publish(Change::Stopped, |s| {
                                    s.stop_step = Some(StopStep::AlreadyExited);
                                });
                            }
                            self.finish(StopStep::AlreadyExited, Some(exit));
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Restarts after a crash when the policy allows; `None` when staying down.
    async fn restart(&mut self) -> Option<Running> {
        let RestartPolicy::OnFailure {
            max_restarts,
            backoff,
        } = self.context.config.restart
        else {
            return None;
        };
        loop {
            if *self.stop.borrow() {
                return None;
            }
            if self.restarts >= max_restarts {
                self.publish_gave_up();
                return None;
            }
            let delay = backoff
                .saturating_mul(1u32 << self.restarts.min(10))
                .min(Duration::from_secs(30));
            self.restarts += 1;
            let mut stop = self.stop.clone();
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.wait_for(|r| *r) => return None,
            }
            let restarts = self.restarts;
            self.context.publisher.update(|s| s.restarts = restarts);
            let execution = self.context.publisher.snapshot().execution;
            let mut running = match self
                .context
                .spawn(&self.executable, &self.launch, execution)
                .await
            {
                Ok(running) => running,
                Err(error) => {
                    self.publish_error(&error);
                    continue;
                }
            };
            let mut stop = self.stop.clone();
            let abort = async move {
                let _ = stop.wait_for(|r| *r).await;
            };
            match self.context.wait_ready(&mut running, abort).await {
                Ok(version) => {
                    self.context.publisher.publish(Change::Ready, |s| {
                        if version.is_some() {
                            s.version = version;
                        }
                    });
                    return Some(running);
                }
                Err(error) => {
                    let error = self.context.fail_start(running, error).await;
                    if error.is_cancelled() {
                        return None;
                    }
                    self.publish_error(&error);
                }
            }
        }
    }

    /// Says once, as the final `error`, that the restart policy is exhausted: "gave up
    /// restarting `llama.cpp` after N restarts: <the last error>" (`details.gaveUp`).
    fn publish_gave_up(&self) {
        let last = self.context.publisher.snapshot().error;
        let reason = last
            .as_ref()
            .and_then(|e| e["message"].as_str())
            .unwrap_or("it failed")
            .to_string();
        let restarts = self.restarts;
        let noun = if restarts == 1 { "restart" } else { "restarts" };
        let mut record = last.unwrap_or_else(|| json!({"code": codes::LOCAL_AI_SERVER_FAILED}));
        record["message"] = Value::String(format!(
            "gave up restarting `{}` after {restarts} {noun}: {reason}",
            self.context.engine()
        ));
        if !record["details"].is_object() {
            record["details"] = json!({});
        }
        record["details"]["gaveUp"] = Value::Bool(true);
        record["details"]["restarts"] = json!(restarts);
        self.context
            .publisher
            .publish(Change::GaveUp, |s| s.error = Some(record));
    }

    fn publish_error(&self, error: &Error) {
        let record = error_json(error);
        self.context
            .publisher
            .publish(Change::Failed, |s| s.error = Some(record));
    }

    fn finish(&self, step: StopStep, exit: Option<ExitInfo>) {
        let snapshot = self.context.publisher.snapshot();
        let report = StopReport {
            step,
            exit,
            snapshot: snapshot.clone(),
        };
        let _ = self.done.send(Some(report));
        run_hook(&self.context.hook, &snapshot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ServerState;
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
        assert_eq!(snapshot.state, ServerState::Ready);
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
                from: ServerState::Stopped,
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
        assert_eq!(snapshot.state, ServerState::Stopped);
        assert_eq!(snapshot.version, None);
    }

    /// In debug builds a refused change is also a panic: it is a bug in the supervisor.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "invalid state change `gave-up` of a server in state `ready`")]
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
