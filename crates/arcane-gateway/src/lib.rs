//! The model gateway: many models, each in its own engine on its own exact device,
//! loaded when a request names it, unloaded when idle, evicted when its device is
//! full — behind the one front door.
//!
//! * **Routing.** The `model` of a forwarded request (its body of any kind, or
//!   `?model=`: the front door's `request_model`) selects a configured model by id or alias;
//!   none selects the first (the default).
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
//!   holds the device. A pinned model ([`ModelSpec::pinned`]) is never evicted: a load
//!   only pinned models block fails at once (`LOCAL_AI_DEVICE_PINNED`). In an exclusive
//!   [`Group`] one member is loaded at a time: another's load unloads it once idle.
//!   Placement decisions are made one at a time, in `placement`.
//! * **Listing.** `unlisted` models are routed to but shown in no client listing
//!   (`Gateway::listed`); `upstream_model` is the name the engine is sent.
//! * **Crashes.** An engine that dies puts its model in `error`, then `stopping` at
//!   once (nothing new is routed to it, and no second engine starts beside the dead
//!   one's remains), then `stopped` once it is down; the next request loads it again
//!   (`arcane ps` shows the crash).
//! * **States.** A model's state is its engine's: `stopped`, `starting`, `loading`,
//!   `ready`, `stopping`, `error`, changed only through `arcane_localai::transition`,
//!   the table the supervisor and the host use too.
//!
//! One module per concept: `model` (a model's phase), `lease`
//! (routing one request and holding it in flight), `load` (loads, crashes, lost external
//! servers), `placement` (eviction, unloading, the idle clock), `reload`, `service` (the
//! passthrough's [`Upstream`] and the Core [`Service`]), `keep_alive`, `metrics`.
//!
//! Methods: `models.list` (the `arcane ps` rows), `models.load {model}`,
//! `models.unload {model}`; `llama.status|models|load|unload` act on the same models,
//! and `localai.status` lists them as `models`. Events: `local-ai.model.<state>`
//! (`starting|loading|ready|stopping|stopped|error`) `{model, device, state, reason?,
//! …}`, one for each state entered.

#![warn(missing_docs)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arcane_localai::{Change, EngineState, Subject};
use arcane_report::codes;
use hyper::StatusCode;
use serde_json::{json, Value};

use arcane_core::keys::Principal;
use arcane_core::localai::{EngineHandle, EngineLauncher};
use arcane_core::route::{NoRoute, Route, RouteRequest, Upstream, UpstreamTarget};
use arcane_core::service::{
    BoxError, BoxFuture, MethodResult, MethodSpec, RequestContext, Service, ServiceContext,
};
use arcane_core::Error;

pub mod admission;
mod chat;
mod keep_alive;
mod lease;
mod load;
mod metrics;
mod model;
mod placement;
mod reload;
mod service;
#[cfg(test)]
mod tests;

pub use admission::{DEFAULT_MAX_QUEUE, DEFAULT_PARALLEL};
pub use keep_alive::KeepAlive;
use metrics::Metrics;
use model::Model;

/// What an external `url` model serves beside its kind's paths: every `/v1` path.
const EVERY_V1_PATH: &str = "/v1/";

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
    /// Whether its engine answers with the model's id (an owned llama.cpp started with
    /// `--alias ID`); otherwise every answer is renamed to the name the client asked
    /// for (or the id).
    pub answers_as_id: bool,
    /// Whether its engine can be reached without the Core's token (an external url, a
    /// `command` on a bare `${PORT}`, Ollama): said in `arcane ps`, `status` and
    /// `/v1/models`.
    pub reachable_without_token: bool,
    /// The memory it needs on its device, in bytes (0: unknown).
    pub memory: u64,
    /// How long a load may take.
    pub load_timeout: Duration,
    /// The registered SHA-256 of its model file (`None`: not registered, or no file):
    /// the `digest` Ollama's API lists.
    pub digest: Option<String>,
    /// What the model's configuration was made from: a reload keeps a model whose
    /// fingerprint is unchanged (loaded or not) and replaces one whose changed.
    pub fingerprint: String,
    /// `pin`: `Some(true)` never evicts it to make room, `Some(false)` lets it be
    /// evicted whatever else it says; `None` pins it when `keep_alive` is never or
    /// it loads on start (see [`ModelSpec::pinned`]).
    pub pin: Option<bool>,
    /// Routable but left out of every model listing shown to clients (`/v1/models`,
    /// an unknown model's 404): see `Gateway::listed`.
    pub unlisted: bool,
    /// The model name the engine is sent in a JSON body's `model` instead of the
    /// client's (answers still name the model as the client asked).
    pub upstream_model: Option<String>,
    /// How many of its requests are forwarded to its engine at once; more wait in its
    /// queue, served by priority and in turns between keys.
    pub parallel: usize,
    /// How many of its requests may wait beyond `parallel`; one more is refused at once
    /// (503 with `Retry-After`).
    pub max_queue: usize,
    /// The only CPUs its engine may run on (`cpus`), shown in `arcane ps` with the
    /// loaded models whose sets overlap it.
    pub cpus: Option<arcane_process::CpuSet>,
    /// The parts `memory` was estimated from (`{bytes, weights, cache, compute,
    /// runtime, context}`), shown in `arcane ps` and the dry run of a load.
    pub memory_estimate: Option<Value>,
}

impl ModelSpec {
    /// A model `id` on `launcher` with every other setting at its default: on the
    /// CPU, `keep_alive` five minutes, loaded on demand, owned, answering with its id,
    /// behind the token, memory unknown, two minutes to load, its id as fingerprint,
    /// not pinned, listed, sent under its own name, no digest, [`DEFAULT_PARALLEL`]
    /// requests at once and [`DEFAULT_MAX_QUEUE`] waiting. Callers set what
    /// differs with `ModelSpec { field, ..ModelSpec::new(id, launcher) }`, so a new
    /// setting is added here once.
    pub fn new(id: impl Into<String>, launcher: Arc<dyn EngineLauncher>) -> Self {
        let id = id.into();
        Self {
            fingerprint: id.clone(),
            id,
            aliases: Vec::new(),
            launcher,
            device: "cpu".into(),
            keep_alive: KeepAlive::default(),
            load_on_start: false,
            external: false,
            answers_as_id: true,
            reachable_without_token: false,
            memory: 0,
            load_timeout: Duration::from_secs(120),
            digest: None,
            pin: None,
            unlisted: false,
            upstream_model: None,
            parallel: DEFAULT_PARALLEL,
            max_queue: DEFAULT_MAX_QUEUE,
            cpus: None,
            memory_estimate: None,
        }
    }

    /// The API paths it serves, as [`arcane_localai::EngineKind::api_paths`] writes
    /// them: its kind's, and for an external `url` every `/v1` path too (any
    /// OpenAI-compatible server: vLLM, another Arcane).
    pub fn api_paths(&self) -> Vec<&'static str> {
        let mut paths = self.launcher.runtime().kind().api_paths().to_vec();
        if self.external && !paths.contains(&EVERY_V1_PATH) {
            paths.push(EVERY_V1_PATH);
        }
        paths
    }

    /// Whether it serves `path` ([`ModelSpec::api_paths`]), without listing them.
    pub fn serves(&self, path: &str) -> bool {
        arcane_localai::serves_path(self.launcher.runtime().kind().api_paths(), path)
            || (self.external && arcane_localai::serves_path(&[EVERY_V1_PATH], path))
    }

    /// Why this model is never evicted to make room, or `None` when it may be.
    pub fn pinned(&self) -> Option<Pinned> {
        match self.pin {
            Some(false) => None,
            Some(true) => Some(Pinned::Explicit),
            None if self.load_on_start => Some(Pinned::OnStart),
            None if self.keep_alive == KeepAlive::Never => Some(Pinned::KeepAliveNever),
            None => None,
        }
    }
}

/// Why a model is pinned: never evicted to make room for another (a `keep_alive` its
/// table gives still unloads it, as `arcane unload` does; without one it stays).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pinned {
    /// `pin = true`.
    Explicit,
    /// `keep_alive = -1`: it is meant to stay loaded.
    KeepAliveNever,
    /// `load = "on-start"`: it is meant to be there from the start.
    OnStart,
}

impl Pinned {
    /// The setting that pins it, as written in `arcane.toml`.
    pub fn setting(self) -> &'static str {
        match self {
            Self::Explicit => "pin = true",
            Self::KeepAliveNever => "keep_alive = -1",
            Self::OnStart => "load = \"on-start\"",
        }
    }
}

/// An exclusive group (`[[group]]` with `exclusive = true`): at most one of its
/// members is loaded at a time; loading another unloads the loaded one once it is
/// idle. A model belongs to at most one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The group's id (`[[group]] id`).
    pub id: String,
    /// The ids of its models.
    pub members: Vec<String>,
}

/// What the configuration says: the models (the first is the default), the device
/// limits and the exclusive groups.
pub struct Configuration {
    /// The models.
    pub models: Vec<ModelSpec>,
    /// What fits on each device.
    pub limits: HashMap<String, DeviceLimit>,
    /// The exclusive groups.
    pub groups: Vec<Group>,
}

/// Reads the configuration again (`arcane reload`, SIGHUP): the models, device limits
/// and groups it now names. Blocking (it reads files and the registry).
pub type Reloader = Arc<dyn Fn() -> Result<Configuration, BoxError> + Send + Sync>;

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
    groups: std::sync::RwLock<Vec<Group>>,
    reloader: Mutex<Option<Reloader>>,
    placement: tokio::sync::Mutex<()>,
    changed: tokio::sync::Notify,
    /// Set when the host starts the service; a load waits for it (a request may come
    /// through the passthrough before).
    context: tokio::sync::watch::Sender<Option<ServiceContext>>,
    metrics: Metrics,
    me: Weak<Gateway>,
    /// Fired when the host disposes of the gateway: loads in progress are cancelled
    /// (the supervisor stops what it started).
    shutdown: arcane_report::CancelToken,
    /// Tests only: runs between a retiring model's idle check and its unload, the
    /// moment a request on another thread of the host's runtime may take the model
    /// ([`Gateway::retire`]); the tests force that race here.
    /// Where each request's line goes (`arcane logs`), once the server gives it one.
    logs: std::sync::OnceLock<Arc<arcane_core::logs::LogBook>>,
    #[cfg(test)]
    retire_race: RetireRace,
}

/// What a test runs at the retire task's race point (see `Gateway::retire_race`).
#[cfg(test)]
type RetireRace = Mutex<Option<Box<dyn Fn(&Arc<Model>) + Send + Sync>>>;

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self.models().iter().map(|m| m.spec.id.clone()).collect();
        f.debug_struct("Gateway").field("models", &ids).finish()
    }
}

impl Gateway {
    /// A gateway over `models` (the first is the default) with per-device `limits`.
    pub fn new(models: Vec<ModelSpec>, limits: HashMap<String, DeviceLimit>) -> Arc<Self> {
        Self::configured(Configuration {
            models,
            limits,
            groups: Vec::new(),
        })
    }

    /// A gateway over `configuration`'s models, device limits and groups.
    pub fn configured(configuration: Configuration) -> Arc<Self> {
        let Configuration {
            models,
            limits,
            groups,
        } = configuration;
        let metrics = Metrics::new();
        for model in &models {
            metrics.register_model(&model.id);
        }
        Arc::new_cyclic(|me| Self {
            models: std::sync::RwLock::new(models.into_iter().map(Model::new).collect()),
            retiring: Mutex::new(Vec::new()),
            limits: std::sync::RwLock::new(limits),
            groups: std::sync::RwLock::new(groups),
            reloader: Mutex::new(None),
            placement: tokio::sync::Mutex::new(()),
            changed: tokio::sync::Notify::new(),
            context: tokio::sync::watch::Sender::new(None),
            metrics,
            me: me.clone(),
            shutdown: arcane_report::CancelToken::new(),
            logs: std::sync::OnceLock::new(),
            #[cfg(test)]
            retire_race: Mutex::new(None),
        })
    }

    /// The Prometheus text of the gateway's metrics (the queues' depths as of now).
    pub fn metrics_text(&self) -> String {
        for model in self.models() {
            let (running, queued, by_key) = model.admission.depth();
            let label = Metrics::label(&model.spec.id);
            self.metrics
                .running
                .get_or_create(&label)
                .set(running as i64);
            self.metrics.queued.get_or_create(&label).set(queued as i64);
            for (key, queued) in by_key {
                self.metrics
                    .key_queued
                    .get_or_create(&Metrics::key_label(&key, &model.spec.id))
                    .set(queued as i64);
            }
        }
        self.metrics.encode()
    }

    /// Files one line per finished request (`request key=NAME status=… seconds=…`)
    /// under its model in `logs` (`arcane logs MODEL`).
    pub fn log_requests_to(&self, logs: Arc<arcane_core::logs::LogBook>) {
        let _ = self.logs.set(logs);
    }

    fn log_request(&self, model: &str, line: &str) {
        if let Some(logs) = self.logs.get() {
            logs.record(model, arcane_core::logs::LogStream::Host, line);
        }
    }

    fn emit(&self, kind: &str, data: Value) {
        if let Some(context) = self.context.borrow().clone() {
            context.emit(kind, data);
        }
    }

    /// The one way a model changes state: `changes` through the table as one step
    /// (`edit` fills in what the last state carries; see `Model::enter`), each state
    /// entered announced as `local-ai.model.<state>` `{model, device, state, …data}`,
    /// and every waiter woken. `false`, and nothing announced, when the table refuses.
    fn enter(
        &self,
        model: &Model,
        changes: &[Change],
        edit: impl FnOnce(&mut model::Phase),
        data: Value,
    ) -> bool {
        let Some(states) = model.enter(changes, edit) else {
            return false;
        };
        for state in states {
            let mut event =
                json!({"model": model.spec.id, "device": model.spec.device, "state": state});
            if let (Some(event), Value::Object(data)) = (event.as_object_mut(), &data) {
                event.extend(data.clone());
            }
            self.emit(state.event_type(Subject::Model), event);
        }
        self.changed.notify_waiters();
        true
    }

    /// The model `name` selects (`None`: the default), or OpenAI's 404.
    /// The model a request names (`None`: the first that serves `path`), refused
    /// with a 404 — before anything is loaded — when it is unknown or does not serve
    /// `path` (`None`: any path).
    fn find(
        &self,
        name: Option<&str>,
        path: Option<&str>,
        caller: &Principal,
    ) -> Result<Arc<Model>, NoRoute> {
        let models = self.models();
        let serves = |m: &&Arc<Model>| path.is_none_or(|path| m.spec.serves(path));
        let usable = |m: &&Arc<Model>| caller.may_use(&m.spec.id);
        let found = match name {
            // The default: the first model that serves the path, of those the caller may
            // use; when it may use none of them, the default it may not use (refused
            // below, naming the models it may use).
            None => models
                .iter()
                .filter(usable)
                .find(serves)
                .or(models.iter().find(usable))
                .or(models.iter().find(serves))
                .or(models.first()),
            Some(name) => models.iter().find(|m| m.answers_to(name)),
        };
        let Some(model) = found else {
            let entries: Vec<Value> = self.listed_for(caller).iter().map(|m| m.entry()).collect();
            return Err(NoRoute {
                status: StatusCode::NOT_FOUND,
                body: arcane_core::route::model_not_found(name.unwrap_or(""), &entries),
                retry_after: None,
                retry_after_ms: None,
            });
        };
        if !caller.may_use(&model.spec.id) {
            return Err(model_denied(caller, name.unwrap_or(&model.spec.id)));
        }
        match path {
            Some(path) if !model.spec.serves(path) => {
                Err(self.path_not_served(model, path, caller))
            }
            _ => Ok(Arc::clone(model)),
        }
    }

    /// 404 `LOCAL_AI_PATH_NOT_SERVED` in OpenAI's shape: `model` does not serve `path`;
    /// the message names the paths it serves and the listed models that serve `path`.
    fn path_not_served(&self, model: &Model, path: &str, caller: &Principal) -> NoRoute {
        let id = &model.spec.id;
        let serves = model.spec.api_paths();
        let served_by: Vec<String> = self
            .listed_for(caller)
            .iter()
            .filter(|m| m.spec.serves(path))
            .map(|m| m.spec.id.clone())
            .collect();
        let elsewhere = match served_by.as_slice() {
            [] => format!("no model here serves `{path}`"),
            ids => {
                let ids: Vec<String> = ids.iter().map(|id| format!("`{id}`")).collect();
                format!("ask for {}", ids.join(" or "))
            }
        };
        let message = format!(
            "model `{id}` does not serve `{path}` (it serves {}); {elsewhere}",
            serves.join(", ")
        );
        NoRoute {
            status: StatusCode::NOT_FOUND,
            body: json!({"error": {
                "message": message,
                "type": "invalid_request_error",
                "param": "model",
                "code": codes::LOCAL_AI_PATH_NOT_SERVED,
                "details": {"model": id, "path": path, "serves": serves, "servedBy": served_by},
            }}),
            retry_after: None,
            retry_after_ms: None,
        }
    }

    /// The `arcane ps` rows.
    pub fn rows(&self) -> Vec<Value> {
        self.models()
            .iter()
            .map(|m| {
                let mut row = m.row();
                row["cpus"] = json!(m.spec.cpus.as_ref().map(ToString::to_string));
                row["cpusSharedWith"] = json!(self.cpus_shared_with(m));
                row
            })
            .collect()
    }

    /// The other loaded models whose `cpus` overlap `model`'s (allowed, and said: they
    /// compete for the same cores).
    fn cpus_shared_with(&self, model: &Model) -> Vec<String> {
        let Some(mine) = &model.spec.cpus else {
            return Vec::new();
        };
        self.models()
            .iter()
            .filter(|other| other.spec.id != model.spec.id && other.state().occupies())
            .filter(|other| {
                other
                    .spec
                    .cpus
                    .as_ref()
                    .is_some_and(|theirs| !theirs.intersection(mine).is_empty())
            })
            .map(|other| other.spec.id.clone())
            .collect()
    }

    /// The ids of the models loaded when the host starts (`load = "on-start"`).
    pub fn on_start_models(&self) -> Vec<String> {
        self.models()
            .iter()
            .filter(|m| m.spec.load_on_start)
            .map(|m| m.spec.id.clone())
            .collect()
    }

    /// The model files and executables of every model (loaded or not, retiring ones
    /// included): what a running host must keep.
    pub fn files(&self) -> (Vec<std::path::PathBuf>, Vec<std::path::PathBuf>) {
        let (mut models, mut executables) = (Vec::new(), Vec::new());
        for model in self.everyone() {
            let (file, executable) = model.spec.launcher.files();
            models.extend(file);
            executables.extend(executable);
        }
        (models, executables)
    }

    /// Every model's engine, as `localai.status` describes engines (url, state,
    /// ownership, who can reach it, process, execution; `model` names the model): the
    /// supervisor's snapshot while loaded, else `stopped` (or `error` after a failed
    /// load). `arcane status` shows a gateway's engines as it shows a single engine's.
    pub fn engines(&self) -> Vec<Value> {
        self.models()
            .iter()
            .filter_map(|model| {
                let snapshot = model.lock().handle.as_ref().map(|h| h.snapshot());
                let phase = model.current();
                let url = snapshot
                    .as_ref()
                    .map_or_else(|| model.spec.launcher.url(), |s| s.url.clone());
                let described = arcane_core::localai::describe(
                    model.spec.launcher.runtime(),
                    url,
                    snapshot.as_ref(),
                    phase.state,
                    phase.error,
                    vec![model.entry()],
                );
                let mut status = serde_json::to_value(described).ok()?;
                if snapshot.is_none() {
                    // No engine runs: it is named by its model (a running one names
                    // itself), never by its kind as if one engine served them all.
                    status["id"] = json!(model.spec.id);
                }
                status["model"] = json!(model.spec.id);
                Some(status)
            })
            .collect()
    }

    /// Whether `model` is one requests are routed to now (not replaced or removed by a
    /// reload).
    pub(crate) fn is_routed(&self, model: &Arc<Model>) -> bool {
        self.models().iter().any(|m| Arc::ptr_eq(m, model))
    }

    /// The model now configured under `model`'s id, after a reload replaced it; a 404
    /// when the reload removed it.
    pub(crate) fn successor(&self, model: &Arc<Model>) -> Result<Arc<Model>, NoRoute> {
        self.find(Some(&model.spec.id), None, &Principal::workspace())
    }

    /// Every model that may hold a device: those routed to and those a reload retired
    /// (unloaded once idle).
    fn everyone(&self) -> Vec<Arc<Model>> {
        let mut everyone = self.models();
        everyone.extend(
            self.retiring
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned(),
        );
        everyone
    }

    /// The models shown to clients: every model routed to but those configured
    /// `unlisted`. The one rule of every client-facing listing (`/v1/models`, the
    /// known models of a 404), so a later listing inherits it.
    pub(crate) fn listed(&self) -> Vec<Arc<Model>> {
        let mut models = self.models();
        models.retain(|m| !m.spec.unlisted);
        models
    }

    /// The models listed to `caller`: those it may use ([`Principal::may_use`]).
    pub(crate) fn listed_for(&self, caller: &Principal) -> Vec<Arc<Model>> {
        let mut models = self.listed();
        models.retain(|m| caller.may_use(&m.spec.id));
        models
    }

    /// The models requests are routed to now.
    fn models(&self) -> Vec<Arc<Model>> {
        self.models
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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
        cause: arcane_report::Cause::of_error_json(error).map(Box::new),
    })
}

fn load_failed(error: &Value) -> NoRoute {
    NoRoute {
        status: StatusCode::BAD_GATEWAY,
        body: json!({"error": error}),
        retry_after: None,
        retry_after_ms: None,
    }
}

/// 403 `CORE_MODEL_DENIED` in OpenAI's shape: `caller`'s key may not use the model it
/// asked for as `asked`; the message and details name the models it may use.
fn model_denied(caller: &Principal, asked: &str) -> NoRoute {
    let allowed: Vec<String> = caller.models.as_deref().unwrap_or_default().to_vec();
    let named: Vec<String> = allowed.iter().map(|id| format!("`{id}`")).collect();
    NoRoute {
        status: StatusCode::FORBIDDEN,
        body: json!({"error": {
            "message": format!("the key `{}` may not use the model `{asked}`; it may use {}", caller.name, named.join(", ")),
            "type": "permission_error",
            "param": "model",
            "code": codes::CORE_MODEL_DENIED,
            "details": {"key": &*caller.name, "model": asked, "allowed": allowed},
        }}),
        retry_after: None,
        retry_after_ms: None,
    }
}

fn not_ready(model: &str, why: &str) -> NoRoute {
    NoRoute {
        status: StatusCode::SERVICE_UNAVAILABLE,
        body: json!({"error": {"code": codes::LOCAL_AI_SERVER_NOT_READY, "message": format!("`{model}` is not ready: {why}"), "details": {"model": model}}}),
        retry_after: Some(2),
        retry_after_ms: None,
    }
}
