//! The model gateway: many models, each in its own engine on its own exact device,
//! loaded when a request names it, unloaded when idle, evicted when its device is
//! full — behind the one front door.
//!
//! * **Routing.** The `model` of a forwarded request (its JSON body, or `?model=`)
//!   selects a configured model by id or alias; none selects the first (the default).
//!   An unknown name is OpenAI's 404 `model_not_found` listing the known ids. The
//!   answer names the model as the client asked for it. `GET /v1/models` lists every
//!   configured model, loaded or not, with its state.
//! * **On demand.** A request for a model that is not loaded starts its engine and is
//!   answered once it is ready (bounded by the model's load timeout). Concurrent
//!   requests share one load; a failed load answers every waiting request with the
//!   engine's error. After repeated failures a load waits (1 s doubling to 30 s).
//! * **Keep-alive.** A model without requests in flight is unloaded after its
//!   `keep_alive` (a request may override it, as Ollama's API does): `0` after each
//!   request, `-1` never.
//! * **Eviction.** Per device, `max_loaded` and `memory` (a model's need is estimated
//!   from its file size) decide what fits. A load that does not fit evicts the least
//!   recently used idle model on that device; a model with requests in flight is never
//!   evicted: the load waits for one to become idle (bounded), then fails naming what
//!   holds the device. Placement decisions are made one at a time.
//! * **Crashes.** An engine that dies leaves its model `unloaded`; the next request
//!   loads it again (`arcane ps` shows the crash).
//!
//! Methods: `models.list` (the `arcane ps` rows), `models.load {model}`,
//! `models.unload {model}`; `llama.status|models|load|unload` act on the same models,
//! and `localai.status` lists them as `models`. Events: `local-ai.model.loading|ready|
//! unloaded|evicted|failed`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use arcane_localai::ServerSnapshot;
use arcane_report::{codes, error_json, event_types, CancelToken};
use hyper::StatusCode;
use serde_json::{json, Value};

use crate::error::Error;
use crate::localai::{EngineHandle, EngineLauncher};
use crate::passthrough::{NoRoute, Route, RouteRequest, Upstream, UpstreamTarget};
use crate::service::{
    BoxError, BoxFuture, MethodResult, MethodSpec, RequestContext, Service, ServiceContext,
};

mod keep_alive;
mod metrics;
mod model;

pub use keep_alive::KeepAlive;
use metrics::Metrics;
use model::{Model, Phase};

/// One configured model.
pub struct ModelSpec {
    /// The id clients name (`[[model]] id`).
    pub id: String,
    /// Other names that select it.
    pub aliases: Vec<String>,
    /// Starts (or, for an external `url`, adopts) its engine.
    pub launcher: Arc<dyn EngineLauncher>,
    /// The device it runs on (`cpu`, a GPU id, or `external` for a url entry).
    pub device: String,
    /// Its idle time before unloading.
    pub keep_alive: KeepAlive,
    /// Load it when the host starts (`load = "on-start"`).
    pub load_on_start: bool,
    /// An external server (never started or signalled).
    pub external: bool,
    /// The memory it needs on its device, in bytes (0: unknown).
    pub memory: u64,
    /// How long a load may take.
    pub load_timeout: Duration,
    /// What the model's configuration was made from: a reload keeps a model whose
    /// fingerprint is unchanged (loaded or not) and replaces one whose changed.
    pub fingerprint: String,
}

/// Reads the configuration again (`arcane reload`, SIGHUP): the models and device
/// limits it now names. Blocking (it reads files and the registry).
pub type Reloader =
    Arc<dyn Fn() -> Result<(Vec<ModelSpec>, HashMap<String, DeviceLimit>), BoxError> + Send + Sync>;

/// What fits on one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceLimit {
    /// The most models loaded at once.
    pub max_loaded: Option<usize>,
    /// The memory budget in bytes.
    pub memory: Option<u64>,
}

/// The model gateway service (see the module documentation).
pub struct Gateway {
    /// The models requests are routed to (the first is the default).
    models: std::sync::RwLock<Vec<Arc<Model>>>,
    /// Models a reload removed or replaced: no longer routed to, unloaded once idle,
    /// still holding their device until then.
    retiring: Mutex<Vec<Arc<Model>>>,
    limits: std::sync::RwLock<HashMap<String, DeviceLimit>>,
    reloader: Mutex<Option<Reloader>>,
    placement: tokio::sync::Mutex<()>,
    changed: tokio::sync::Notify,
    /// Set when the host starts the service; a load waits for it (a request may come
    /// through the passthrough before).
    context: tokio::sync::watch::Sender<Option<ServiceContext>>,
    metrics: Metrics,
    me: Weak<Gateway>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self.models().iter().map(|m| m.spec.id.clone()).collect();
        f.debug_struct("Gateway").field("models", &ids).finish()
    }
}

/// Held by a forwarded request until its answer is sent: the model counts it in flight
/// and starts its idle clock when the last one ends.
struct Lease {
    model: Arc<Model>,
    gateway: Weak<Gateway>,
    started: Instant,
    status: Option<StatusCode>,
    usage: Option<Value>,
    finished: bool,
}

impl crate::passthrough::Lease for Lease {
    fn answered(&mut self, status: StatusCode) {
        self.status = Some(status);
    }

    fn usage(&mut self, usage: &Value) {
        self.usage = Some(usage.clone());
    }

    fn finished(&mut self) {
        self.finished = true;
    }

    fn unreachable(&mut self) {
        // An external server that stopped answering is probed again by the next
        // request (an owned engine's death is seen by its supervisor).
        if self.model.spec.external {
            if let Some(gateway) = self.gateway.upgrade() {
                gateway.lost_external(&self.model);
            }
        }
    }
}

impl Lease {
    /// Counts the request in the model's metrics.
    fn measure(&self, metrics: &Metrics) {
        let label = Metrics::label(&self.model.spec.id);
        metrics.requests.get_or_create(&label).inc();
        let failed = !self.finished || self.status.is_none_or(|s| s.as_u16() >= 400);
        if failed {
            metrics.errors.get_or_create(&label).inc();
        }
        metrics
            .duration
            .get_or_create(&label)
            .observe(self.started.elapsed().as_secs_f64());
        let tokens = |key: &str| {
            self.usage
                .as_ref()
                .and_then(|u| u[key].as_u64())
                .unwrap_or(0)
        };
        metrics
            .prompt_tokens
            .get_or_create(&label)
            .inc_by(tokens("prompt_tokens"));
        metrics
            .completion_tokens
            .get_or_create(&label)
            .inc_by(tokens("completion_tokens"));
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(gateway) = self.gateway.upgrade() {
            self.measure(&gateway.metrics);
        }
        let idle = {
            let mut inner = self.model.lock();
            inner.in_flight = inner.in_flight.saturating_sub(1);
            inner.last_used = Instant::now();
            inner.in_flight == 0
        };
        if let Some(gateway) = self.gateway.upgrade() {
            gateway.changed.notify_waiters();
            if idle {
                gateway.schedule_idle(&self.model);
            }
        }
    }
}

/// Why a model is being unloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    KeepAlive,
    Requested,
    Evicted,
    Shutdown,
}

impl Reason {
    fn name(self) -> &'static str {
        match self {
            Self::KeepAlive => "keep-alive",
            Self::Requested => "request",
            Self::Evicted => "evicted",
            Self::Shutdown => "shutdown",
        }
    }
}

impl Gateway {
    /// A gateway over `models` (the first is the default) with per-device `limits`.
    pub fn new(models: Vec<ModelSpec>, limits: HashMap<String, DeviceLimit>) -> Arc<Self> {
        let metrics = Metrics::new();
        for model in &models {
            metrics.register_model(&model.id);
        }
        Arc::new_cyclic(|me| Self {
            models: std::sync::RwLock::new(models.into_iter().map(Model::new).collect()),
            retiring: Mutex::new(Vec::new()),
            limits: std::sync::RwLock::new(limits),
            reloader: Mutex::new(None),
            placement: tokio::sync::Mutex::new(()),
            changed: tokio::sync::Notify::new(),
            context: tokio::sync::watch::Sender::new(None),
            metrics,
            me: me.clone(),
        })
    }

    /// The Prometheus text of the gateway's metrics.
    pub fn metrics_text(&self) -> String {
        self.metrics.encode()
    }

    fn emit(&self, kind: &str, data: Value) {
        if let Some(context) = self.context.borrow().clone() {
            context.emit(kind, data);
        }
    }

    /// The model `name` selects (`None`: the default), or OpenAI's 404.
    fn find(&self, name: Option<&str>) -> Result<Arc<Model>, NoRoute> {
        let models = self.models();
        let found = match name {
            None => models.first(),
            Some(name) => models.iter().find(|m| m.answers_to(name)),
        };
        found.cloned().ok_or_else(|| {
            let entries: Vec<Value> = models.iter().map(|m| m.entry()).collect();
            NoRoute {
                status: StatusCode::NOT_FOUND,
                body: crate::passthrough::model_not_found(name.unwrap_or(""), &entries),
                retry_after: None,
            }
        })
    }

    /// Waits until `model` is ready and counts one request in flight on it.
    async fn acquire(
        &self,
        model: &Arc<Model>,
        keep_alive: Option<KeepAlive>,
    ) -> Result<Lease, NoRoute> {
        let deadline = Instant::now() + model.spec.load_timeout + Duration::from_secs(30);
        let mut waited_on_load = false;
        loop {
            let mut phase = model.phase.subscribe();
            let current = phase.borrow_and_update().clone();
            match current {
                Phase::Ready(_) => {
                    let mut inner = model.lock();
                    // Checked again under the lock an unload takes to begin.
                    if !matches!(model.current(), Phase::Ready(_)) {
                        continue;
                    }
                    inner.in_flight += 1;
                    inner.idle_generation += 1;
                    inner.unload_at = None;
                    if let Some(keep_alive) = keep_alive {
                        inner.keep_alive = keep_alive;
                    }
                    return Ok(Lease {
                        model: Arc::clone(model),
                        gateway: self.me.clone(),
                        started: Instant::now(),
                        status: None,
                        usage: None,
                        finished: false,
                    });
                }
                Phase::Failed(error) if waited_on_load => return Err(load_failed(&error)),
                Phase::Loading | Phase::Unloading => {
                    waited_on_load |= matches!(current, Phase::Loading);
                    let left = deadline.saturating_duration_since(Instant::now());
                    if tokio::time::timeout(left, phase.changed()).await.is_err() {
                        return Err(not_ready(&model.spec.id, "its load did not finish in time"));
                    }
                }
                Phase::Unloaded | Phase::Failed(_) => {
                    self.load(model, "request").await?;
                    waited_on_load = true;
                }
            }
        }
    }

    /// Starts loading `model` unless a load already runs (then returns at once): makes
    /// room on its device first.
    async fn load(&self, model: &Arc<Model>, reason: &str) -> Result<(), NoRoute> {
        let placement = self.placement.lock().await;
        if !matches!(model.current(), Phase::Unloaded | Phase::Failed(_)) {
            return Ok(());
        }
        let retry_at = model.lock().retry_at;
        if let Some(at) = retry_at.filter(|at| *at > Instant::now()) {
            let error = model.lock().last_error.clone().unwrap_or(Value::Null);
            let mut refused = load_failed(&error);
            refused.status = StatusCode::SERVICE_UNAVAILABLE;
            refused.retry_after = Some(
                at.saturating_duration_since(Instant::now())
                    .as_secs()
                    .max(1),
            );
            return Err(refused);
        }
        self.make_room(model).await?;
        if !model.become_(Phase::Loading) {
            return Ok(());
        }
        drop(placement);
        self.metrics
            .loads
            .get_or_create(&Metrics::label(&model.spec.id))
            .inc();
        self.emit(
            event_types::LOCAL_AI_MODEL_LOADING,
            json!({"model": model.spec.id, "device": model.spec.device, "reason": reason}),
        );
        self.changed.notify_waiters();
        let Some(me) = self.me.upgrade() else {
            return Ok(());
        };
        let model = Arc::clone(model);
        tokio::spawn(async move { me.run_load(model).await });
        Ok(())
    }

    /// The load itself: launch, then `ready` (or `failed`).
    async fn run_load(self: Arc<Self>, model: Arc<Model>) {
        let mut started = self.context.subscribe();
        let Ok(context) = started.wait_for(Option::is_some).await.map(|c| c.clone()) else {
            return;
        };
        let Some(context) = context else {
            return;
        };
        let observer = self.observer(&model);
        let launched = tokio::time::timeout(
            model.spec.load_timeout + Duration::from_secs(5),
            model
                .spec
                .launcher
                .launch(context.sink(), observer, CancelToken::new()),
        )
        .await;
        match launched {
            Ok(Ok(handle)) => self.loaded(&model, handle),
            Ok(Err(error)) => self.load_failed(&model, error_json(&*error)),
            Err(_) => self.load_failed(
                &model,
                json!({"code": codes::LOCAL_AI_SERVER_FAILED, "message": format!("`{}` did not load within {:?}", model.spec.id, model.spec.load_timeout), "details": {"model": model.spec.id}}),
            ),
        }
        self.changed.notify_waiters();
    }

    fn loaded(&self, model: &Arc<Model>, handle: Box<dyn EngineHandle>) {
        let snapshot = handle.snapshot();
        let Some(address) = snapshot.address() else {
            self.load_failed(model, json!({"code": codes::LOCAL_AI_SERVER_FAILED, "message": format!("`{}` has no usable address `{}`", model.spec.id, snapshot.url)}));
            return;
        };
        let access = crate::upstream::EngineAccess {
            address,
            key: snapshot.api_key.clone(),
        };
        {
            let mut inner = model.lock();
            inner.handle = Some(handle);
            inner.pid = snapshot.pid;
            inner.last_used = Instant::now();
            inner.retry_at = None;
            inner.ready_since = Some(Instant::now());
        }
        if model.become_(Phase::Ready(access.clone())) {
            self.metrics
                .loaded
                .get_or_create(&Metrics::label(&model.spec.id))
                .set(1);
            self.emit(
                event_types::LOCAL_AI_MODEL_READY,
                json!({"model": model.spec.id, "device": model.spec.device, "pid": snapshot.pid, "url": access.address.to_string()}),
            );
            self.schedule_idle(model);
        }
    }

    fn load_failed(&self, model: &Arc<Model>, error: Value) {
        {
            let mut inner = model.lock();
            inner.load_failures += 1;
            // Even after one failure, a second load waits a moment: the requests that
            // arrive right after it get its error (and `Retry-After`) instead of a load
            // each.
            let wait = Model::backoff(inner.load_failures).unwrap_or(Duration::from_secs(1));
            inner.retry_at = Some(Instant::now() + wait);
            inner.last_error = Some(error.clone());
        }
        model.become_(Phase::Failed(error.clone()));
        self.emit(
            event_types::LOCAL_AI_MODEL_FAILED,
            json!({"model": model.spec.id, "device": model.spec.device, "reason": "load-failed", "error": error}),
        );
    }

    /// Sees the supervisor's snapshots: an engine that died while ready is a crash.
    fn observer(&self, model: &Arc<Model>) -> arcane_localai::StateObserver {
        let gateway = self.me.clone();
        let model = Arc::downgrade(model);
        Arc::new(move |snapshot: &ServerSnapshot| {
            use arcane_localai::ServerState;
            let (Some(gateway), Some(model)) = (gateway.upgrade(), model.upgrade()) else {
                return;
            };
            let died = matches!(snapshot.state, ServerState::Error | ServerState::Stopped);
            if died && matches!(model.current(), Phase::Ready(_)) && !model.lock().stopping {
                gateway.crashed(&model, snapshot);
            }
        })
    }

    fn crashed(&self, model: &Arc<Model>, snapshot: &ServerSnapshot) {
        let error = snapshot.error.clone().unwrap_or_else(|| {
            json!({"code": codes::LOCAL_AI_SERVER_FAILED, "message": format!("the engine of `{}` stopped", model.spec.id)})
        });
        let handle = {
            let mut inner = model.lock();
            inner.crashes += 1;
            inner.pid = None;
            inner.last_error = Some(error.clone());
            // An engine that stayed up a minute starts the count again; one that keeps
            // dying sooner backs off like a failing load.
            let stayed_up = inner
                .ready_since
                .is_some_and(|since| since.elapsed() >= Duration::from_secs(60));
            inner.load_failures = if stayed_up {
                1
            } else {
                inner.load_failures + 1
            };
            inner.retry_at = Model::backoff(inner.load_failures).map(|d| Instant::now() + d);
            inner.handle.take()
        };
        model.become_(Phase::Unloaded);
        let label = Metrics::label(&model.spec.id);
        self.metrics.crashes.get_or_create(&label).inc();
        self.metrics.loaded.get_or_create(&label).set(0);
        self.emit(
            event_types::LOCAL_AI_MODEL_FAILED,
            json!({"model": model.spec.id, "device": model.spec.device, "reason": "crashed", "error": error, "exit": snapshot.exit}),
        );
        self.changed.notify_waiters();
        if let Some(handle) = handle {
            // The supervisor saw the exit; this only reaps its bookkeeping.
            tokio::spawn(async move {
                let _ = handle.stop().await;
            });
        }
    }

    /// An external model that did not answer: released, so the next request adopts
    /// (probes) it again.
    fn lost_external(&self, model: &Arc<Model>) {
        let handle = model.lock().handle.take();
        if model.become_(Phase::Unloaded) {
            let label = Metrics::label(&model.spec.id);
            self.metrics.loaded.get_or_create(&label).set(0);
            self.emit(
                event_types::LOCAL_AI_MODEL_FAILED,
                json!({"model": model.spec.id, "device": model.spec.device, "reason": "unreachable"}),
            );
            self.changed.notify_waiters();
        }
        if let Some(handle) = handle {
            // Releasing an adopted server signals nothing.
            tokio::spawn(async move {
                let _ = handle.stop().await;
            });
        }
    }

    /// Evicts least recently used idle models on `model`'s device until it fits, or
    /// waits (bounded) for one to become idle. Called with the placement lock held.
    async fn make_room(&self, model: &Arc<Model>) -> Result<(), NoRoute> {
        let device = &model.spec.device;
        let limit = self
            .limits
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(device)
            .copied()
            .unwrap_or_default();
        if let Some(budget) = limit.memory.filter(|b| model.spec.memory > *b) {
            return Err(busy(format!(
                "`{}` needs {} bytes, more than device `{device}`'s budget of {budget}",
                model.spec.id, model.spec.memory
            )));
        }
        let deadline = Instant::now() + model.spec.load_timeout;
        loop {
            let mut everyone = self.models();
            everyone.extend(
                self.retiring
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .cloned(),
            );
            let occupants: Vec<&Arc<Model>> = everyone
                .iter()
                .filter(|m| {
                    &m.spec.device == device && !Arc::ptr_eq(m, model) && m.current().occupies()
                })
                .collect();
            let used: u64 = occupants.iter().map(|m| m.spec.memory).sum();
            let fits_count = limit.max_loaded.is_none_or(|max| occupants.len() < max);
            let fits_memory = limit
                .memory
                .is_none_or(|budget| used + model.spec.memory <= budget);
            if fits_count && fits_memory {
                return Ok(());
            }
            let victim = occupants
                .iter()
                .filter(|m| matches!(m.current(), Phase::Ready(_)) && m.lock().in_flight == 0)
                .min_by_key(|m| m.lock().last_used)
                .map(|m| Arc::clone(m));
            if let Some(victim) = victim {
                self.unload(&victim, Reason::Evicted, Some(&model.spec.id))
                    .await;
                continue;
            }
            let notified = self.changed.notified();
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() {
                let holders: Vec<String> = occupants
                    .iter()
                    .map(|m| {
                        format!(
                            "`{}` ({} in flight, {})",
                            m.spec.id,
                            m.lock().in_flight,
                            m.current().name()
                        )
                    })
                    .collect();
                return Err(busy(format!(
                    "device `{device}` is full and busy: {} hold it; `{}` cannot load until one is idle",
                    holders.join(", "),
                    model.spec.id
                )));
            }
        }
    }

    /// Stops `model`'s engine (a ready model only; one with requests in flight only
    /// at shutdown).
    async fn unload(&self, model: &Arc<Model>, reason: Reason, for_model: Option<&str>) {
        let handle = {
            let mut inner = model.lock();
            let busy = inner.in_flight > 0 && reason != Reason::Shutdown;
            if busy
                || !matches!(model.current(), Phase::Ready(_))
                || !model.become_(Phase::Unloading)
            {
                return;
            }
            inner.stopping = true;
            inner.unload_at = None;
            inner.handle.take()
        };
        if let Some(handle) = handle {
            let _ = handle.stop().await;
        }
        {
            let mut inner = model.lock();
            inner.stopping = false;
            inner.pid = None;
            inner.ready_since = None;
            // A clean unload: the next load starts without a backoff.
            inner.load_failures = 0;
        }
        model.become_(Phase::Unloaded);
        let label = Metrics::label(&model.spec.id);
        self.metrics.loaded.get_or_create(&label).set(0);
        if reason == Reason::Evicted {
            self.metrics.evictions.get_or_create(&label).inc();
        }
        let (kind, data) = match reason {
            Reason::Evicted => (
                event_types::LOCAL_AI_MODEL_EVICTED,
                json!({"model": model.spec.id, "device": model.spec.device, "for": for_model}),
            ),
            _ => (
                event_types::LOCAL_AI_MODEL_UNLOADED,
                json!({"model": model.spec.id, "device": model.spec.device, "reason": reason.name()}),
            ),
        };
        self.emit(kind, data);
        self.changed.notify_waiters();
    }

    /// Starts the idle clock of a model with nothing in flight.
    fn schedule_idle(&self, model: &Arc<Model>) {
        let (generation, wait) = {
            let mut inner = model.lock();
            if inner.in_flight > 0 {
                return;
            }
            let wait = match inner.keep_alive {
                KeepAlive::Never => return,
                KeepAlive::AfterEachRequest => Duration::ZERO,
                KeepAlive::For(duration) => duration,
            };
            inner.unload_at = Some(Instant::now() + wait);
            (inner.idle_generation, wait)
        };
        let (Some(gateway), model) = (self.me.upgrade(), Arc::clone(model)) else {
            return;
        };
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let still_idle = {
                let inner = model.lock();
                inner.idle_generation == generation && inner.in_flight == 0
            };
            if still_idle {
                gateway.unload(&model, Reason::KeepAlive, None).await;
            }
        });
    }

    /// Sets how `models.reload` reads the configuration again.
    pub fn set_reloader(&self, reloader: Reloader) {
        *self.reloader.lock().unwrap_or_else(|p| p.into_inner()) = Some(reloader);
    }

    /// Reads the configuration again and applies it: added models become routable,
    /// removed ones stop being routed to and unload once idle, changed ones are
    /// replaced (the old engine unloads once idle), unchanged ones are untouched.
    /// Returns `{added, removed, changed, unchanged}`.
    pub async fn reload(&self) -> MethodResult {
        let reloader = self
            .reloader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(reloader) = reloader else {
            return Err(Box::new(Error::usage(
                "this host cannot read its configuration again",
                json!({}),
            )));
        };
        let read = tokio::task::spawn_blocking(move || reloader())
            .await
            .map_err(|e| {
                Box::new(Error::usage(
                    format!("the reload did not finish: {e}"),
                    json!({}),
                )) as BoxError
            })
            .and_then(|read| read);
        match read {
            Ok((specs, limits)) => {
                let summary = self.apply(specs, limits);
                self.emit(event_types::LOCAL_AI_MODELS_RELOADED, summary.clone());
                Ok(summary)
            }
            Err(error) => {
                // Nothing changes: the models keep running as configured before.
                self.emit(
                    event_types::LOCAL_AI_MODELS_RELOADED,
                    json!({"error": error_json(&*error)}),
                );
                Err(error)
            }
        }
    }

    /// Applies a new configuration (see [`Gateway::reload`]).
    fn apply(&self, specs: Vec<ModelSpec>, limits: HashMap<String, DeviceLimit>) -> Value {
        let old = self.models();
        let (mut added, mut changed, mut unchanged) = (Vec::new(), Vec::new(), Vec::new());
        let mut next = Vec::new();
        for spec in specs {
            let id = spec.id.clone();
            match old.iter().find(|m| m.spec.id == id) {
                Some(model) if model.spec.fingerprint == spec.fingerprint => {
                    unchanged.push(id);
                    next.push(Arc::clone(model));
                }
                Some(_) => {
                    changed.push(id);
                    next.push(Model::new(spec));
                }
                None => {
                    added.push(id);
                    next.push(Model::new(spec));
                }
            }
        }
        let retired: Vec<Arc<Model>> = old
            .into_iter()
            .filter(|m| !next.iter().any(|n| Arc::ptr_eq(n, m)))
            .collect();
        let removed: Vec<String> = retired
            .iter()
            .filter(|m| !changed.contains(&m.spec.id))
            .map(|m| m.spec.id.clone())
            .collect();
        for model in &next {
            self.metrics.register_model(&model.spec.id);
        }
        *self.models.write().unwrap_or_else(|p| p.into_inner()) = next;
        *self.limits.write().unwrap_or_else(|p| p.into_inner()) = limits;
        for model in retired {
            self.retire(model);
        }
        self.changed.notify_waiters();
        json!({"added": added, "removed": removed, "changed": changed, "unchanged": unchanged})
    }

    /// Unloads a model no longer routed to once its requests are done.
    fn retire(&self, model: Arc<Model>) {
        if !model.current().occupies() {
            return;
        }
        self.retiring
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::clone(&model));
        let Some(gateway) = self.me.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            loop {
                let notified = gateway.changed.notified();
                let phase = model.current();
                let idle = model.lock().in_flight == 0;
                match phase {
                    Phase::Ready(_) if idle => {
                        gateway.unload(&model, Reason::Requested, None).await;
                        break;
                    }
                    phase if !phase.occupies() => break,
                    _ => {
                        // Woken by a request's end or a phase change; checked again at
                        // least every second.
                        let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
                    }
                }
            }
            gateway
                .retiring
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|m| !Arc::ptr_eq(m, &model));
        });
    }

    /// The `arcane ps` rows.
    pub fn rows(&self) -> Vec<Value> {
        self.models().iter().map(|m| m.row()).collect()
    }

    /// The models requests are routed to now.
    fn models(&self) -> Vec<Arc<Model>> {
        self.models
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn model_parameter(&self, parameters: &Value) -> Result<Arc<Model>, BoxError> {
        let name = parameters["model"].as_str();
        self.find(name).map_err(|no_route| {
            Box::new(Error::usage(
                no_route.body["error"]["message"]
                    .as_str()
                    .unwrap_or("unknown model")
                    .to_string(),
                json!({"model": name, "known": self.models().iter().map(|m| m.spec.id.clone()).collect::<Vec<_>>()}),
            )) as BoxError
        })
    }

    async fn load_method(&self, parameters: Value) -> MethodResult {
        let model = self.model_parameter(&parameters)?;
        let lease = self.acquire(&model, None).await.map_err(refused)?;
        drop(lease);
        Ok(model.row())
    }

    async fn unload_method(&self, parameters: Value) -> MethodResult {
        let model = self.model_parameter(&parameters)?;
        let in_flight = model.lock().in_flight;
        if in_flight > 0 {
            return Err(Box::new(Error::Remote {
                code: codes::ARCANE_IN_USE.into(),
                message: format!("`{}` has {in_flight} request(s) in flight", model.spec.id),
                details: json!({"model": model.spec.id, "inFlight": in_flight}),
                hints: vec!["wait for its requests to finish, then unload it".into()],
            }));
        }
        self.unload(&model, Reason::Requested, None).await;
        Ok(model.row())
    }
}

fn refused(no_route: NoRoute) -> BoxError {
    let error = &no_route.body["error"];
    Box::new(Error::Remote {
        code: error["code"]
            .as_str()
            .filter(|c| codes::known(c).is_some())
            .unwrap_or(codes::LOCAL_AI_SERVER_FAILED)
            .into(),
        message: error["message"]
            .as_str()
            .unwrap_or("the model is not available")
            .into(),
        details: error["details"].clone(),
        hints: Vec::new(),
    })
}

fn load_failed(error: &Value) -> NoRoute {
    NoRoute {
        status: StatusCode::BAD_GATEWAY,
        body: json!({"error": error}),
        retry_after: None,
    }
}

fn not_ready(model: &str, why: &str) -> NoRoute {
    NoRoute {
        status: StatusCode::SERVICE_UNAVAILABLE,
        body: json!({"error": {"code": codes::LOCAL_AI_SERVER_NOT_READY, "message": format!("`{model}` is not ready: {why}"), "details": {"model": model}}}),
        retry_after: Some(2),
    }
}

fn busy(message: String) -> NoRoute {
    NoRoute {
        status: StatusCode::SERVICE_UNAVAILABLE,
        body: json!({"error": {"code": codes::ARCANE_IN_USE, "message": message, "details": {}}}),
        retry_after: Some(5),
    }
}

impl Upstream for Gateway {
    fn openai_target(&self) -> UpstreamTarget {
        match self.models().first().map(|m| m.current()) {
            Some(Phase::Ready(access)) => UpstreamTarget::Ready { access },
            _ => UpstreamTarget::Unavailable {
                runtime: "llama.cpp".into(),
                state: crate::error::Unready::Unanswered("the default model is not loaded".into()),
                retry_after: Some(1),
            },
        }
    }

    fn healthy(&self) -> Option<bool> {
        // Models load on demand: the front door works once the host is ready.
        Some(true)
    }

    fn routes_by_model(&self) -> bool {
        true
    }

    fn route(&self, request: RouteRequest) -> BoxFuture<'_, Result<Route, NoRoute>> {
        Box::pin(async move {
            let model = self.find(request.model.as_deref())?;
            let keep_alive = match request.keep_alive.as_ref().map(KeepAlive::from_json) {
                Some(Err(why)) => {
                    return Err(NoRoute {
                        status: StatusCode::BAD_REQUEST,
                        body: json!({"error": {"message": format!("`keep_alive`: {why}"), "type": "invalid_request_error", "param": "keep_alive"}}),
                        retry_after: None,
                    })
                }
                Some(Ok(keep_alive)) => Some(keep_alive),
                None => None,
            };
            let lease = self.acquire(&model, keep_alive).await?;
            let Phase::Ready(access) = model.current() else {
                return Err(not_ready(&model.spec.id, "it was unloaded"));
            };
            Ok(Route {
                access,
                lease: Some(Box::new(lease)),
                // An owned engine answers with the model's id; an external one with its
                // own name: rename when the client asked for something else.
                rename: request
                    .model
                    .filter(|asked| *asked != model.spec.id || model.spec.external)
                    .or_else(|| model.spec.external.then(|| model.spec.id.clone())),
            })
        })
    }

    fn metrics(&self) -> Option<String> {
        Some(self.metrics_text())
    }

    fn models(&self) -> Option<Value> {
        let data: Vec<Value> = self.models().iter().map(|m| m.entry()).collect();
        Some(json!({"object": "list", "data": data}))
    }
}

const METHODS: &[&str] = &[
    "models.reload",
    "models.list",
    "models.load",
    "models.unload",
    "localai.status",
    "llama.status",
    "llama.models",
    "llama.load",
    "llama.unload",
];

impl Service for Gateway {
    fn name(&self) -> &str {
        "model-gateway"
    }

    fn methods(&self) -> Vec<MethodSpec> {
        METHODS.iter().map(|m| MethodSpec::request(*m)).collect()
    }

    fn start(self: Arc<Self>, context: ServiceContext) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move {
            self.context.send_replace(Some(context));
            for model in self.models().iter().filter(|m| m.spec.load_on_start) {
                // A failed start load is reported as `local-ai.model.failed`; requests
                // try again.
                let _ = self.load(model, "on-start").await;
            }
            Ok(())
        })
    }

    fn call(
        self: Arc<Self>,
        method: String,
        parameters: Value,
        _context: RequestContext,
    ) -> BoxFuture<'static, MethodResult> {
        Box::pin(async move {
            match method.as_str() {
                "models.reload" => self.reload().await,
                "models.load" | "llama.load" => self.load_method(parameters).await,
                "models.unload" | "llama.unload" => self.unload_method(parameters).await,
                "localai.status" => Ok(json!({"runtimes": [], "models": self.rows()})),
                _ => Ok(json!({"models": self.rows()})),
            }
        })
    }

    fn dispose(self: Arc<Self>) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move {
            let mut stops = tokio::task::JoinSet::new();
            let mut everyone = self.models();
            everyone.extend(
                self.retiring
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .drain(..),
            );
            for model in &everyone {
                let (gateway, model) = (Arc::clone(&self), Arc::clone(model));
                stops.spawn(async move { gateway.unload(&model, Reason::Shutdown, None).await });
            }
            while stops.join_next().await.is_some() {}
            Ok(())
        })
    }

    fn replay(&self) -> Vec<(String, Value)> {
        Vec::new()
    }
}
