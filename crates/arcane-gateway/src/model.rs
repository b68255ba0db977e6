//! One configured model: its phase (its [`EngineState`] through the one table,
//! `arcane_localai::transition`, with what that state carries), what it holds while
//! loaded, its requests in flight and its idle clock. Its clocks are tokio's
//! (`tokio::time::Instant`), so a test with paused time drives the idle clock, the
//! backoff and the waits alike.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arcane_localai::{Change, EngineState};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{KeepAlive, ModelSpec};
use arcane_core::localai::EngineHandle;
use arcane_core::upstream::EngineAccess;

/// Where a model is in its life: the state of its engine (`stopped` while none runs,
/// `stopping` while one is being stopped: evicted, idle, asked to, or crashed), how
/// its engine is reached while `ready`, and its last load's error while `error` (a new
/// request tries again, after the backoff).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Phase {
    pub state: EngineState,
    pub access: Option<EngineAccess>,
    pub error: Option<Value>,
}

impl Phase {
    fn stopped() -> Self {
        Self {
            state: EngineState::Stopped,
            access: None,
            error: None,
        }
    }

    /// The phase after `changes`, applied in order through the table, with `edit`
    /// filling in what the last state carries (the access is kept only while `ready`,
    /// the error only while `error`), and the states entered; `None` when the table
    /// refuses any of them.
    fn step(
        &self,
        changes: &[Change],
        edit: impl FnOnce(&mut Phase),
    ) -> Option<(Phase, Vec<EngineState>)> {
        let mut next = self.clone();
        let mut entered = Vec::with_capacity(changes.len());
        for change in changes {
            next.state = arcane_localai::transition(next.state, *change).ok()?;
            entered.push(next.state);
        }
        edit(&mut next);
        if next.state != EngineState::Ready {
            next.access = None;
        }
        if next.state != EngineState::Error {
            next.error = None;
        }
        Some((next, entered))
    }

    /// How its engine is reached, while `ready`.
    pub(crate) fn ready(&self) -> Option<&EngineAccess> {
        self.access.as_ref().filter(|_| self.state.is_ready())
    }
}

/// What changes together under the model's lock.
pub(crate) struct Inner {
    /// The running engine (owned or adopted), while ready or unloading.
    pub handle: Option<Box<dyn EngineHandle>>,
    /// Requests holding a [`super::Lease`].
    pub in_flight: usize,
    /// Requests waiting for the model to be ready: about to be in flight, so its idle
    /// clock does not start (a `keep_alive` of 0 would unload it under them).
    pub waiting: usize,
    /// When the last request ended (or the model became ready).
    pub last_used: Instant,
    /// Bumped by every new request: an idle timer from before it does nothing.
    pub idle_generation: u64,
    /// The idle time in force (the spec's, or the last request's override).
    pub keep_alive: KeepAlive,
    /// When the idle timer will unload it.
    pub unload_at: Option<Instant>,
    /// How many times its engine died after it was ready.
    pub crashes: u32,
    /// No new load before this (after repeated failures).
    pub retry_at: Option<Instant>,
    /// The last failure (a load error or a crash), for `arcane ps`.
    pub last_error: Option<Value>,
    /// The engine's pid while ready (owned engines).
    pub pid: Option<u32>,
    /// The gateway is stopping the engine itself (not a crash).
    pub stopping: bool,
    /// Consecutive failed loads, and crashes of an engine up for less than a minute:
    /// the backoff before the next load.
    pub load_failures: u32,
    /// When the engine became ready.
    pub ready_since: Option<Instant>,
}

/// Whether the running engine ignores the key it was started behind (its supervisor
/// found so once it was ready).
fn key_ignored(inner: &Inner) -> bool {
    inner
        .handle
        .as_ref()
        .is_some_and(|handle| handle.snapshot().key_ignored)
}

/// One configured model.
pub(crate) struct Model {
    pub spec: ModelSpec,
    pub inner: Mutex<Inner>,
    pub phase: watch::Sender<Phase>,
    /// Who of its requests is forwarded now, who waits, who is refused.
    pub admission: Arc<super::admission::Admission>,
}

impl Model {
    pub(crate) fn new(spec: ModelSpec) -> Arc<Self> {
        let keep_alive = spec.keep_alive;
        let admission = super::admission::Admission::new(spec.parallel, spec.max_queue);
        Arc::new(Self {
            admission,
            spec,
            inner: Mutex::new(Inner {
                handle: None,
                in_flight: 0,
                waiting: 0,
                last_used: Instant::now(),
                idle_generation: 0,
                keep_alive,
                unload_at: None,
                crashes: 0,
                retry_at: None,
                last_error: None,
                pid: None,
                stopping: false,
                load_failures: 0,
                ready_since: None,
            }),
            phase: watch::Sender::new(Phase::stopped()),
        })
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn current(&self) -> Phase {
        self.phase.borrow().clone()
    }

    /// The state it is in.
    pub(crate) fn state(&self) -> EngineState {
        self.phase.borrow().state
    }

    /// Applies `changes` in order, as one step, if the table allows every one of them
    /// from the current phase (then `edit` fills in what the last state carries): the
    /// states entered, or `None` and the phase unchanged. Only
    /// [`Gateway::enter`](super::Gateway) calls it, and announces what it returns.
    pub(super) fn enter(
        &self,
        changes: &[Change],
        edit: impl FnOnce(&mut Phase),
    ) -> Option<Vec<EngineState>> {
        let mut entered = None;
        self.phase.send_if_modified(|phase| {
            let Some((next, states)) = phase.step(changes, edit) else {
                return false;
            };
            *phase = next;
            entered = Some(states);
            true
        });
        entered
    }

    /// Whether `name` is this model's id or one of its aliases.
    pub(crate) fn answers_to(&self, name: &str) -> bool {
        self.spec.id == name || self.spec.aliases.iter().any(|a| a == name)
    }

    /// Whether its engine can be used without the Core's token: by its configuration
    /// (an external url, an open port), or because its running engine ignores the key
    /// it was started behind (`keyIgnored`, found once it was ready).
    fn reachable_without_token(&self, inner: &Inner) -> bool {
        self.spec.reachable_without_token || key_ignored(inner)
    }

    /// The `/v1/models` entry.
    pub(crate) fn entry(&self) -> Value {
        let inner = self.lock();
        json!({
            "id": self.spec.id,
            "object": "model",
            "created": 0,
            "owned_by": "arcane",
            "aliases": self.spec.aliases,
            "state": self.state(),
            "device": self.spec.device,
            "reachableWithoutToken": self.reachable_without_token(&inner),
            "keyIgnored": key_ignored(&inner),
        })
    }

    /// What the front door's other APIs list of it (Ollama's `/api/tags`, `/api/ps`).
    pub(crate) fn facts(&self) -> arcane_core::route::ModelFacts {
        let loaded = self.state().is_ready();
        let inner = self.lock();
        arcane_core::route::ModelFacts {
            id: self.spec.id.clone(),
            aliases: self.spec.aliases.clone(),
            kind: self.spec.launcher.runtime(),
            file: self.spec.launcher.files().0,
            digest: self.spec.digest.clone(),
            args: self.spec.launcher.args(),
            device: self.spec.device.clone(),
            loaded,
            resident_bytes: inner.pid.and_then(arcane_process::resident_bytes),
            memory: self.spec.memory,
            unloads_in: inner
                .unload_at
                .filter(|_| inner.in_flight == 0 && loaded)
                .map(|at| at.saturating_duration_since(Instant::now()).as_secs_f64()),
            keep_alive: inner.keep_alive.seconds(),
        }
    }

    /// The `arcane ps` row.
    pub(crate) fn row(&self) -> Value {
        let phase = self.current();
        let inner = self.lock();
        let unloads_in = inner
            .unload_at
            .filter(|_| inner.in_flight == 0 && phase.state.is_ready())
            .map(|at| at.saturating_duration_since(Instant::now()).as_secs_f64());
        let url = phase.ready().map(|access| access.address.to_string());
        let (parallel, max_queue) = self.admission.limits();
        let (_, queued, by_key) = self.admission.depth();
        let queued_by_key: serde_json::Map<String, Value> = by_key
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(key, n)| (key.to_string(), json!(n)))
            .collect();
        json!({
            "id": self.spec.id,
            "aliases": self.spec.aliases,
            "state": phase.state,
            "device": self.spec.device,
            "external": self.spec.external,
            "reachableWithoutToken": self.reachable_without_token(&inner),
            "keyIgnored": key_ignored(&inner),
            "pid": inner.pid,
            "residentBytes": inner.pid.and_then(arcane_process::resident_bytes),
            "memoryNeed": self.spec.memory,
            "memoryEstimate": self.spec.memory_estimate,
            "inFlight": inner.in_flight,
            "parallel": parallel,
            "maxQueue": max_queue,
            "queued": queued,
            "queuedByKey": queued_by_key,
            "serviceSeconds": self.admission.service_time().map(|t| t.as_secs_f64()),
            "keepAlive": inner.keep_alive.seconds(),
            "unloadsIn": unloads_in,
            "crashes": inner.crashes,
            "lastError": inner.last_error,
            "url": url,
            "pinned": self.spec.pinned().map(super::Pinned::setting),
            "unlisted": self.spec.unlisted,
            "chat": self.chats(),
        })
    }

    /// Whether it answers chat (`/v1/chat/completions`): its kind serves the path and
    /// its engine was not started to serve only vectors (a voice, a transcriber or an
    /// embedding model does not).
    fn chats(&self) -> bool {
        self.spec.serves("/v1/chat/completions")
            && !arcane_workspace::serves_only_vectors(&self.spec.launcher.args())
    }

    /// How long to wait before a load after `failures` consecutive failures: none for
    /// the first, then 1 s doubling to 30 s.
    pub(crate) fn backoff(failures: u32) -> Option<Duration> {
        (failures >= 2).then(|| {
            Duration::from_secs(1u64 << (failures - 2).min(5)).min(Duration::from_secs(30))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step of several changes is taken whole or not at all, and the phase keeps
    /// only what its state carries.
    #[test]
    fn a_step_is_taken_whole_and_keeps_what_its_state_carries() {
        let access = EngineAccess::tcp("http://127.0.0.1:1").unwrap();
        let stopped = Phase::stopped();
        assert!(
            stopped.step(&[Change::Ready], |_| {}).is_none(),
            "ready needs a start"
        );
        let (starting, _) = stopped.step(&[Change::Start], |_| {}).unwrap();
        let (ready, entered) = starting
            .step(&[Change::Ready], |p| p.access = Some(access.clone()))
            .unwrap();
        assert_eq!(entered, [EngineState::Ready]);
        assert_eq!(ready.ready(), Some(&access));
        // A crash: `error`, then `stopping`, in one step; neither the access nor the
        // error stays with `stopping`.
        let (stopping, entered) = ready
            .step(&[Change::Failed, Change::Stop], |p| {
                p.error = Some(json!({"message": "died"}))
            })
            .unwrap();
        assert_eq!(entered, [EngineState::Error, EngineState::Stopping]);
        assert_eq!(
            (stopping.state, stopping.ready(), stopping.error.clone()),
            (EngineState::Stopping, None, None)
        );
        // A failed load keeps its error while `error`.
        let (failed, _) = starting
            .step(&[Change::Failed], |p| {
                p.error = Some(json!({"message": "no"}))
            })
            .unwrap();
        assert_eq!(failed.error, Some(json!({"message": "no"})));
        // Refused as a whole: `stopped` would be allowed, `ready` after it is not, and
        // nothing is taken half.
        assert!(ready
            .step(&[Change::Stopped, Change::Ready], |_| {})
            .is_none());
    }

    #[test]
    fn repeated_failures_back_off_up_to_thirty_seconds() {
        assert_eq!(Model::backoff(1), None);
        assert_eq!(Model::backoff(2), Some(Duration::from_secs(1)));
        assert_eq!(Model::backoff(3), Some(Duration::from_secs(2)));
        assert_eq!(Model::backoff(40), Some(Duration::from_secs(30)));
    }
}
