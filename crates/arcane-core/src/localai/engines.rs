//! The `local-ai` service: one slot per selected engine, each holding the host's typed
//! [`EngineView`]; starts, stops and recovers engines, answers `localai.status`,
//! `localai.services.recover`, `llama.status|models|load|unload`, and is the HTTP
//! passthrough's [`Upstream`]. The forwarding methods (`llama.chat`, `ollama.*`) are
//! in `forward`.

use std::sync::{Arc, Mutex, Weak};

use arcane_localai::{ServerSnapshot, StateObserver};
use arcane_report::event_types;
use arcane_report::{error_json, CancelToken};
use hyper::Method;
use serde_json::{json, Value};
use tokio::sync::watch;

use super::status::{EngineState, EngineView, LocalAiStatus};
use super::{EngineHandle, EngineLauncher};
use crate::error::{Error, Unready};
use crate::route::{Upstream, UpstreamTarget};
use crate::service::{
    BoxError, BoxFuture, MethodResult, MethodSpec, RequestContext, Service, ServiceContext,
};
use crate::upstream::{engine_client, Deadlines, EngineAccess, EngineClient};
use arcane_localai::Engine;
use arcane_localai::{Change, InvalidTransition};

/// One selected engine.
pub(super) struct Slot {
    pub(super) runtime: Engine,
    launcher: Arc<dyn EngineLauncher>,
    pub(super) view: watch::Sender<EngineView>,
    handle: tokio::sync::Mutex<Option<Box<dyn EngineHandle>>>,
    cancel: Mutex<CancelToken>,
    launching: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Slot {
    pub(super) fn state(&self) -> EngineState {
        self.view.borrow().state()
    }

    pub(super) fn models(&self) -> Vec<Value> {
        self.view.borrow().models.clone()
    }
}

/// The `local-ai` service: supervises the selected engines and answers `localai.*`,
/// `llama.*` and `ollama.*`. It is also the HTTP passthrough's [`Upstream`].
pub struct LocalAiService {
    slots: Vec<Arc<Slot>>,
    pub(super) client: EngineClient,
    context: Mutex<Option<ServiceContext>>,
    status: watch::Sender<LocalAiStatus>,
    me: Weak<LocalAiService>,
}

impl LocalAiService {
    /// A service over `launchers` (one per engine; at most one per runtime).
    pub fn new(launchers: Vec<Arc<dyn EngineLauncher>>) -> Arc<Self> {
        let slots: Vec<Arc<Slot>> = launchers
            .into_iter()
            .map(|launcher| {
                let runtime = launcher.runtime();
                Arc::new(Slot {
                    runtime,
                    view: watch::Sender::new(EngineView::new(runtime, launcher.url())),
                    launcher,
                    handle: tokio::sync::Mutex::new(None),
                    cancel: Mutex::new(CancelToken::new()),
                    launching: Mutex::new(None),
                })
            })
            .collect();
        let status = LocalAiStatus {
            runtimes: slots.iter().map(|s| s.view.borrow().status()).collect(),
        };
        Arc::new_cyclic(|me| Self {
            slots,
            client: engine_client(),
            context: Mutex::new(None),
            status: watch::Sender::new(status),
            me: me.clone(),
        })
    }

    fn slot(&self, runtime: Engine) -> Option<&Arc<Slot>> {
        self.slots.iter().find(|s| s.runtime == runtime)
    }

    /// The slot of the kind whose `arcane/1` methods are in `namespace`
    /// ([`Engine::for_namespace`]), or the same 503 as [`Self::require`].
    pub(super) fn require_namespace(&self, namespace: &str) -> Result<&Arc<Slot>, BoxError> {
        match Engine::for_namespace(namespace) {
            Some(engine) => self.require(engine),
            None => Err(Box::new(Error::usage(
                format!("no engine kind answers `{namespace}.*` methods"),
                serde_json::json!({"namespace": namespace}),
            ))),
        }
    }

    /// The slot of `runtime`, or 503 `LOCAL_AI_SERVER_NOT_READY` (not selected).
    pub(super) fn require(&self, runtime: Engine) -> Result<&Arc<Slot>, BoxError> {
        self.slot(runtime).ok_or_else(|| {
            Box::new(Error::EngineNotReady {
                runtime: runtime.as_str().into(),
                state: Unready::NotSelected,
                retry_after: None,
            }) as BoxError
        })
    }

    /// The current state of every engine (what `localai.status` answers).
    pub fn status(&self) -> LocalAiStatus {
        LocalAiStatus {
            runtimes: self
                .slots
                .iter()
                .map(|s| s.view.borrow().status())
                .collect(),
        }
    }

    /// The current `localai.state` payload (the JSON form of [`status`](Self::status)).
    pub fn state(&self) -> Value {
        self.status().to_json()
    }

    /// A receiver that sees every change of [`status`](Self::status), typed: updated
    /// right before the `localai.state` event that reports it.
    pub fn watch(&self) -> watch::Receiver<LocalAiStatus> {
        self.status.subscribe()
    }

    pub(super) fn publish_state(&self) {
        let status = self.status();
        let data = status.to_json();
        self.status.send_replace(status);
        if let Some(context) = self.context.lock().ok().and_then(|c| c.clone()) {
            context.emit(event_types::LOCALAI_STATE, data);
        }
    }

    /// Changes `slot`'s view, then publishes the new state.
    fn update(&self, slot: &Slot, change: impl FnOnce(&mut EngineView)) {
        slot.view.send_modify(change);
        self.publish_state();
    }

    /// Applies the host's own decision about `slot` through its table, then publishes
    /// the new state; `false` when refused. A refusal is reported as
    /// `local-ai.transition.refused`, as the supervisor reports its own, except on a
    /// closed slot, where a late failure or stop is expected and ignored.
    fn decide(
        &self,
        slot: &Slot,
        change: impl FnOnce(&mut EngineView) -> Result<(), InvalidTransition>,
    ) -> bool {
        let mut outcome = Ok(());
        self.update(slot, |view| outcome = change(view));
        let Err(refused) = outcome else { return true };
        if refused.from != EngineState::Closed {
            if let Some(context) = self.context.lock().ok().and_then(|c| c.clone()) {
                context.emit(
                    event_types::LOCAL_AI_TRANSITION_REFUSED,
                    json!({
                        "id": slot.view.borrow().status().id,
                        "engine": slot.runtime.as_str(),
                        "from": refused.from.as_str(),
                        "change": refused.change.as_str(),
                        "message": refused.to_string(),
                    }),
                );
            }
        }
        false
    }

    /// Takes the supervisor's snapshot of `slot`'s engine.
    fn observe(&self, slot: &Slot, snapshot: &ServerSnapshot) {
        self.update(slot, |view| view.observe(snapshot));
    }

    fn observer(&self, slot: &Arc<Slot>) -> StateObserver {
        let service = self.me.clone();
        let slot = Arc::downgrade(slot);
        Arc::new(move |snapshot: &ServerSnapshot| {
            if let (Some(service), Some(slot)) = (service.upgrade(), slot.upgrade()) {
                service.observe(&slot, snapshot);
            }
        })
    }

    pub(super) fn launch(&self, slot: Arc<Slot>) {
        let Some(me) = self.me.upgrade() else { return };
        let Some(context) = self.context.lock().ok().and_then(|c| c.clone()) else {
            return;
        };
        // One engine per slot: a start while one runs is refused by the table, and
        // nothing is launched.
        if !self.decide(&slot, |view| view.apply(Change::Start)) {
            return;
        }
        let cancel = CancelToken::new();
        if let Ok(mut current) = slot.cancel.lock() {
            *current = cancel.clone();
        }
        let observer = self.observer(&slot);
        let task_slot = Arc::clone(&slot);
        let task = tokio::spawn(async move {
            let slot = task_slot;
            // The engine's output is filed under its id (`llama.cpp`, `ollama`).
            let events = crate::logs::ModelTag::wrap(slot.runtime.as_str(), context.sink());
            match slot.launcher.launch(events, observer, cancel).await {
                Ok(handle) => {
                    let snapshot = handle.snapshot();
                    *slot.handle.lock().await = Some(handle);
                    me.refresh_models(&slot).await;
                    me.observe(&slot, &snapshot);
                }
                Err(error) => {
                    let record = error_json(&*error);
                    me.decide(&slot, |view| view.fail(record));
                }
            }
        });
        if let Ok(mut launching) = slot.launching.lock() {
            *launching = Some(task);
        }
    }

    pub(super) async fn refresh_models(&self, slot: &Slot) {
        let Some(access) = slot.view.borrow().access() else {
            return;
        };
        let Some((path, key)) = slot.runtime.kind().model_list() else {
            return;
        };
        let models = self
            .engine_json(&access, Method::GET, path, None, Deadlines::QUICK)
            .await
            .ok()
            .and_then(|v| v[key].as_array().cloned());
        if let Some(models) = models {
            slot.view.send_modify(|view| view.models = models);
            self.publish_state();
        }
    }

    /// Waits until `slot` settles; how to reach it when ready.
    pub(super) async fn ready_access(
        &self,
        slot: &Slot,
        context: &RequestContext,
    ) -> Result<EngineAccess, BoxError> {
        let mut view = slot.view.subscribe();
        let settled = tokio::select! {
            settled = view.wait_for(|v| v.state().is_settled()) => settled.map(|v| v.clone()).ok(),
            _ = context.cancel.cancelled() => return Err(Box::new(Error::Cancelled { id: context.request_id.clone() })),
        };
        match settled {
            Some(view) if view.state().is_ready() => view.access().ok_or_else(|| {
                Box::new(Error::EngineNotReady {
                    runtime: slot.runtime.as_str().into(),
                    state: Unready::Unanswered(format!("no usable address `{}`", view.url())),
                    retry_after: None,
                }) as BoxError
            }),
            Some(view) => Err(Box::new(Error::EngineNotReady {
                runtime: slot.runtime.as_str().into(),
                state: Unready::In(view.state()),
                retry_after: None,
            })),
            None => Err(Box::new(Error::ShuttingDown)),
        }
    }

    async fn recover(&self, parameters: Value) -> MethodResult {
        let wanted: Vec<String> = match parameters.get("runtimes") {
            Some(Value::Array(list)) => list
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            _ => self
                .slots
                .iter()
                .map(|s| s.runtime.as_str().to_string())
                .collect(),
        };
        let mut restarted = Vec::new();
        for id in &wanted {
            let Some(slot) = self.slots.iter().find(|s| s.runtime.as_str() == id) else {
                return Err(Box::new(Error::usage(
                    format!("runtime `{id}` is not selected"),
                    json!({"runtime": id, "selected": self.slots.iter().map(|s| s.runtime.as_str()).collect::<Vec<_>>()}),
                )));
            };
            // A failed stop is reported by the fresh launch's state, not here.
            let _ = self.stop_slot(slot).await;
            self.launch(Arc::clone(slot));
            restarted.push(id.clone());
        }
        Ok(json!({"runtimes": restarted}))
    }

    async fn stop_slot(&self, slot: &Slot) -> Result<(), BoxError> {
        if let Ok(cancel) = slot.cancel.lock() {
            cancel.cancel();
        }
        // A start in progress is cancelled and awaited, so whatever it spawned is
        // stopped before this returns.
        let launching = slot.launching.lock().ok().and_then(|mut l| l.take());
        if let Some(task) = launching {
            let _ = task.await;
        }
        let handle = slot.handle.lock().await.take();
        let stopped = match handle {
            Some(handle) => handle.stop().await,
            None => Ok(()),
        };
        // The host stopped it, whether its handle said so (an owned engine's
        // supervisor does, an adopted one's does not): a new start may follow.
        self.decide(slot, |view| view.apply(Change::Stopped));
        stopped
    }

    async fn llama_unload(&self, _parameters: Value) -> MethodResult {
        let slot = self.require_namespace("llama")?;
        if !slot.view.borrow().owned() {
            return Ok(json!({"released": true, "unloaded": false}));
        }
        self.stop_slot(slot).await?;
        self.update(slot, |view| {
            for model in view.models.iter_mut() {
                model["loaded"] = json!(false);
            }
        });
        Ok(json!({"released": true, "unloaded": true}))
    }

    async fn llama_load(&self, parameters: Value, context: RequestContext) -> MethodResult {
        let slot = self.require_namespace("llama")?;
        let model = parameters["model"].as_str().map(str::to_string);
        // A stopped (unloaded) engine is started again.
        if slot.state() == EngineState::Stopped {
            self.launch(Arc::clone(slot));
        }
        let base = self.ready_access(slot, &context).await?.address.to_string();
        self.refresh_models(slot).await;
        let models = slot.models();
        let listed = |id: &str| models.iter().any(|m| m["id"].as_str() == Some(id));
        match model {
            None => Ok(
                json!({"model": models.first().map(|m| m["id"].clone()), "loaded": true, "url": base}),
            ),
            Some(id) if listed(&id) => Ok(json!({"model": id, "loaded": true, "url": base})),
            Some(id) => Err(Box::new(Error::usage(
                format!(
                    "model `{id}` is not served by the `{}` engine",
                    slot.runtime
                ),
                json!({"model": id, "available": models.iter().map(|m| m["id"].clone()).collect::<Vec<_>>()}),
            ))),
        }
    }

    async fn llama_models(&self) -> MethodResult {
        let slot = self.require_namespace("llama")?;
        if slot.state().is_ready() {
            self.refresh_models(slot).await;
        }
        Ok(json!({"models": slot.models()}))
    }
}

impl Upstream for LocalAiService {
    fn serves(&self, path: &str) -> bool {
        self.slots
            .iter()
            .any(|slot| arcane_localai::serves_path(slot.runtime.kind().api_paths(), path))
    }

    /// The first selected engine whose kind serves OpenAI's chat path (llama.cpp
    /// before Ollama when both are selected, in selection order).
    fn openai_target(&self) -> UpstreamTarget {
        let serves_openai = |slot: &&Arc<Slot>| {
            arcane_localai::serves_path(slot.runtime.kind().api_paths(), "/v1/chat/completions")
        };
        let Some(slot) = self.slots.iter().find(serves_openai) else {
            return UpstreamTarget::Unavailable {
                runtime: Engine::DEFAULT.as_str().into(),
                state: Unready::NotSelected,
                retry_after: None,
            };
        };
        let runtime = slot.runtime.as_str().to_string();
        let view = slot.view.borrow();
        let state = view.state();
        if let Some(access) = view.access().filter(|_| state.is_ready()) {
            return UpstreamTarget::Ready { access };
        }
        UpstreamTarget::Unavailable {
            runtime,
            state: Unready::In(state),
            retry_after: state.retry_after(),
        }
    }
}

/// The service's own methods; the methods the kinds forward to their engines
/// ([`arcane_localai::EngineKind::forwarded_methods`]) come after them.
const LOCAL_AI_METHODS: &[&str] = &[
    "localai.status",
    "localai.services.recover",
    "llama.status",
    "llama.models",
    "llama.load",
    "llama.unload",
    "llama.chat",
];

impl Service for LocalAiService {
    fn name(&self) -> &str {
        "local-ai"
    }

    fn methods(&self) -> Vec<MethodSpec> {
        let forwarded = Engine::ALL
            .into_iter()
            .flat_map(|e| e.kind().forwarded_methods())
            .map(|m| m.name);
        LOCAL_AI_METHODS
            .iter()
            .copied()
            .chain(forwarded)
            .map(MethodSpec::request)
            .collect()
    }

    fn start(self: Arc<Self>, context: ServiceContext) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move {
            if let Ok(mut slot) = self.context.lock() {
                *slot = Some(context);
            }
            for slot in &self.slots {
                self.launch(Arc::clone(slot));
            }
            Ok(())
        })
    }

    fn call(
        self: Arc<Self>,
        method: String,
        parameters: Value,
        context: RequestContext,
    ) -> BoxFuture<'static, MethodResult> {
        Box::pin(async move {
            match method.as_str() {
                // The host's own state: asking a hung engine here would hang `status`.
                "localai.status" => Ok(self.state()),
                "localai.services.recover" => self.recover(parameters).await,
                "llama.status" => {
                    let slot = self.require_namespace("llama")?;
                    let status = slot.view.borrow().status();
                    Ok(serde_json::to_value(status).unwrap_or(Value::Null))
                }
                "llama.models" => self.llama_models().await,
                "llama.load" => self.llama_load(parameters, context).await,
                "llama.unload" => self.llama_unload(parameters).await,
                "llama.chat" => self.llama_chat(parameters, context).await,
                other => self.forwarded(other, parameters, context).await,
            }
        })
    }

    fn dispose(self: Arc<Self>) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move {
            let mut first_error = None;
            for slot in &self.slots {
                if let Err(error) = self.stop_slot(slot).await {
                    first_error.get_or_insert(error);
                }
                self.decide(slot, |view| view.apply(Change::Close));
            }
            match first_error {
                Some(error) => Err(error),
                None => Ok(()),
            }
        })
    }

    fn replay(&self) -> Vec<(String, Value)> {
        vec![(event_types::LOCALAI_STATE.into(), self.state())]
    }
}
