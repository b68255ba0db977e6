//! The built-in local-AI services: `execution-devices`, `local-ai` and `model-assets`.
//!
//! The host does not supervise processes itself. The `local-ai` service drives one
//! [`EngineLauncher`] per selected engine (the CLI plugs in `arcane-localai`'s
//! supervisor; tests may plug in anything that yields a running engine) and keeps an
//! engine record per runtime, updated from the supervisor's `local-ai.server.<state>`
//! events. Every change publishes `localai.state {runtimes[]}`.
//!
//! Engines start in the background when the service starts, so `localai.status` and
//! `llama.status` answer at once from the service's own state (what the supervisor
//! published, and the models fetched when the engine became ready); they never ask
//! the engine, so a hung engine cannot hang them. Every call to an engine has
//! [`Deadlines`]. Methods that need an engine
//! (`llama.chat`, `llama.models`, `llama.load`, `ollama.*`) wait for it to settle and
//! fail with `LOCAL_AI_SERVER_NOT_READY` when it failed or stopped.
//!
//! Methods (all request-lifetime):
//!
//! | method | parameters | result |
//! |---|---|---|
//! | `localai.status` | — | `{runtimes:[{id, url, state, available, owned, managed, external, execution, error, models[]}]}` |
//! | `localai.services.recover` | `{runtimes?: [id]}` | restarts those engines (default all): owned ones are stopped and started again, external ones re-probed; `{runtimes}` |
//! | `localai.devices` | `{refresh?}` | the device catalog |
//! | `localai.resolveTarget` | `{executionTarget}` | the resolution record |
//! | `llama.status` | — | the llama.cpp engine record |
//! | `llama.models` | — | `{models:[…]}` from the engine's `/v1/models` |
//! | `llama.load` | `{model}` | `{model, loaded}` (router mode: `POST /models/load`) |
//! | `llama.unload` | `{model?}` | `{released, unloaded}`: an owned single-model engine is stopped; an external one is untouched; router mode: `POST /models/unload` |
//! | `llama.chat` | `{model?, payload?, messages?, stream?, streamId?}` | the completion; with `stream:true`, each upstream chunk first arrives as `llama.chunk {streamId, chunk}` tied to the request, and the response is the assembled completion |
//! | `ollama.version\|models\|running\|show\|chat\|generate\|embed\|pull` | the `/api/*` body | the Ollama answer; streamed ones emit `ollama.chunk {streamId, chunk}` |

use std::sync::{Arc, Mutex, Weak};

use arcane_report::{error_json, CancelToken, Event, EventSink};
use bytes::Bytes;
use hyper::{Method, Request};
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::error::{Error, Peer};
use crate::http::{
    collect, engine_client, full, Deadlines, EngineClient, HttpBody, Upstream, UpstreamTarget,
};
use crate::selection::Runtime;
use crate::service::{
    BoxError, BoxFuture, MethodResult, MethodSpec, RequestContext, Service, ServiceContext,
};

/// Starts (or adopts) one engine. Implemented over `arcane-localai`'s supervisor by the
/// CLI.
pub trait EngineLauncher: Send + Sync + 'static {
    /// Which runtime this launches.
    fn runtime(&self) -> Runtime;

    /// The engine's listener URL.
    fn url(&self) -> String;

    /// Starts or adopts the engine; resolves once it is ready (or failed). Library
    /// events (`local-ai.server.<state>`) go to `events`; `cancel` aborts the start.
    fn launch(
        &self,
        events: Arc<dyn EventSink>,
        cancel: CancelToken,
    ) -> BoxFuture<'static, Result<Box<dyn EngineHandle>, BoxError>>;
}

/// A running (owned or adopted) engine.
pub trait EngineHandle: Send + Sync {
    /// The supervisor's snapshot `{id, url, state, available, owned, managed, external,
    /// execution, error}`.
    fn snapshot(&self) -> Value;

    /// Stops an owned engine (an adopted one is only released).
    fn stop(self: Box<Self>) -> BoxFuture<'static, Result<(), BoxError>>;
}

/// The device catalog behind `localai.devices` and `localai.resolveTarget` (the CLI
/// plugs in `arcane-devices`). Calls may block (NVML); the host runs them on a
/// blocking thread.
pub trait DeviceCatalog: Send + Sync + 'static {
    /// The catalog; `refresh` probes again instead of using a cached one.
    fn devices(&self, refresh: bool) -> Result<Value, BoxError>;

    /// Resolves an execution target (`{deviceId}` or a device id string).
    fn resolve(&self, target: &Value) -> Result<Value, BoxError>;
}

const STATES_SETTLED: &[&str] = &["ready", "error", "stopped", "closed"];

#[derive(Clone, Debug)]
struct View {
    record: Value,
}

impl View {
    fn state(&self) -> &str {
        self.record["state"].as_str().unwrap_or("starting")
    }
}

struct Slot {
    runtime: Runtime,
    launcher: Arc<dyn EngineLauncher>,
    view: watch::Sender<View>,
    handle: tokio::sync::Mutex<Option<Box<dyn EngineHandle>>>,
    cancel: Mutex<CancelToken>,
    launching: Mutex<Option<tokio::task::JoinHandle<()>>>,
    models: Mutex<Vec<Value>>,
}

impl Slot {
    fn record(&self) -> Value {
        let mut record = self.view.borrow().record.clone();
        record["models"] = Value::Array(self.models.lock().map(|m| m.clone()).unwrap_or_default());
        record
    }
}

/// The `local-ai` service: supervises the selected engines and answers `localai.*`,
/// `llama.*` and `ollama.*`. It is also the HTTP passthrough's [`Upstream`].
pub struct LocalAiService {
    slots: Vec<Arc<Slot>>,
    client: EngineClient,
    context: Mutex<Option<ServiceContext>>,
    me: Weak<LocalAiService>,
}

impl LocalAiService {
    /// A service over `launchers` (one per engine; at most one per runtime).
    pub fn new(launchers: Vec<Arc<dyn EngineLauncher>>) -> Arc<Self> {
        Arc::new_cyclic(|me| {
            Self {
            slots: launchers
                .into_iter()
                .map(|launcher| {
                    let runtime = launcher.runtime();
                    let record = json!({
                        "id": runtime.id(), "url": launcher.url(), "state": "starting", "available": false,
                        "owned": false, "managed": false, "external": false, "execution": null, "error": null,
                    });
                    Arc::new(Slot {
                        runtime,
                        launcher,
                        view: watch::Sender::new(View { record }),
                        handle: tokio::sync::Mutex::new(None),
                        cancel: Mutex::new(CancelToken::new()),
                        launching: Mutex::new(None),
                        models: Mutex::new(Vec::new()),
                    })
                })
                .collect(),
            client: engine_client(),
            context: Mutex::new(None),
            me: me.clone(),
        }
        })
    }

    fn slot(&self, runtime: Runtime) -> Option<&Arc<Slot>> {
        self.slots.iter().find(|s| s.runtime == runtime)
    }

    fn require(&self, runtime: Runtime) -> Result<&Arc<Slot>, BoxError> {
        self.slot(runtime).ok_or_else(|| {
            Box::new(Error::EngineNotReady {
                runtime: runtime.id().into(),
                state: "not selected".into(),
                retry_after: None,
            }) as BoxError
        })
    }

    /// The current `localai.state` payload.
    pub fn state(&self) -> Value {
        json!({"runtimes": self.slots.iter().map(|s| s.record()).collect::<Vec<_>>()})
    }

    fn publish_state(&self) {
        if let Some(context) = self.context.lock().ok().and_then(|c| c.clone()) {
            context.emit("localai.state", self.state());
        }
    }

    fn update(&self, slot: &Slot, patch: Value) {
        slot.view.send_modify(|view| {
            if let (Value::Object(record), Value::Object(patch)) = (&mut view.record, patch) {
                for (key, value) in patch {
                    record.insert(key, value);
                }
            }
        });
        self.publish_state();
    }

    fn launch(&self, slot: Arc<Slot>) {
        let Some(me) = self.me.upgrade() else { return };
        let Some(context) = self.context.lock().ok().and_then(|c| c.clone()) else {
            return;
        };
        let cancel = CancelToken::new();
        if let Ok(mut current) = slot.cancel.lock() {
            *current = cancel.clone();
        }
        self.update(
            &slot,
            json!({"state": "starting", "available": false, "error": null}),
        );
        let sink: Arc<dyn EventSink> = Arc::new(SlotSink {
            service: Arc::downgrade(&me),
            slot: Arc::clone(&slot),
            forward: context.sink(),
        });
        let task_slot = Arc::clone(&slot);
        let task = tokio::spawn(async move {
            let slot = task_slot;
            match slot.launcher.launch(sink, cancel).await {
                Ok(handle) => {
                    let snapshot = handle.snapshot();
                    *slot.handle.lock().await = Some(handle);
                    me.refresh_models(&slot).await;
                    me.update(&slot, snapshot);
                }
                Err(error) => {
                    me.update(
                        &slot,
                        json!({"state": "error", "available": false, "error": error_json(&*error)}),
                    );
                }
            }
        });
        if let Ok(mut launching) = slot.launching.lock() {
            *launching = Some(task);
        }
    }

    async fn refresh_models(&self, slot: &Slot) {
        let url = slot.view.borrow().record["url"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let models = match slot.runtime {
            Runtime::LlamaCpp => self
                .engine_json(
                    Method::GET,
                    &format!("{url}/v1/models"),
                    None,
                    Deadlines::QUICK,
                )
                .await
                .ok()
                .and_then(|v| v["data"].as_array().cloned()),
            Runtime::Ollama => self
                .engine_json(
                    Method::GET,
                    &format!("{url}/api/tags"),
                    None,
                    Deadlines::QUICK,
                )
                .await
                .ok()
                .and_then(|v| v["models"].as_array().cloned()),
            _ => None,
        };
        if let Some(models) = models {
            if let Ok(mut current) = slot.models.lock() {
                *current = models;
            }
            self.publish_state();
        }
    }

    /// Waits until `slot` settles; its URL when ready.
    async fn ready_url(&self, slot: &Slot, context: &RequestContext) -> Result<String, BoxError> {
        let mut view = slot.view.subscribe();
        let settled = tokio::select! {
            settled = view.wait_for(|v| STATES_SETTLED.contains(&v.state())) => settled.map(|v| v.clone()).ok(),
            _ = context.cancel.cancelled() => return Err(Box::new(Error::Cancelled { id: context.request_id.clone() })),
        };
        match settled {
            Some(view) if view.state() == "ready" => Ok(view.record["url"]
                .as_str()
                .unwrap_or_default()
                .trim_end_matches('/')
                .to_string()),
            Some(view) => Err(Box::new(Error::EngineNotReady {
                runtime: slot.runtime.id().into(),
                state: view.state().to_string(),
                retry_after: None,
            })),
            None => Err(Box::new(Error::ShuttingDown)),
        }
    }

    async fn send(
        &self,
        method: Method,
        url: &str,
        body: Option<&Value>,
        deadlines: Deadlines,
    ) -> Result<hyper::Response<HttpBody>, Error> {
        let mut request = Request::builder().method(method).uri(url);
        let body = match body {
            Some(body) => {
                request = request.header(hyper::header::CONTENT_TYPE, "application/json");
                full(body.to_string())
            }
            None => full(Bytes::new()),
        };
        let request = request.body(body).map_err(|e| Error::Http {
            url: url.into(),
            source: Box::new(e),
        })?;
        let response = self.client.send(request, deadlines, Peer::Engine).await?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let bytes = collect(response, url, Peer::Engine)
            .await
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(4096)]).into_owned();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Err(Error::Upstream {
            url: url.into(),
            status,
            body,
        })
    }

    async fn engine_json(
        &self,
        method: Method,
        url: &str,
        body: Option<&Value>,
        deadlines: Deadlines,
    ) -> Result<Value, Error> {
        let response = self.send(method, url, body, deadlines).await?;
        let bytes = collect(response, url, Peer::Engine).await?;
        Ok(serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned())))
    }

    async fn llama_chat(&self, parameters: Value, context: RequestContext) -> MethodResult {
        let slot = self.require(Runtime::LlamaCpp)?;
        let base = self.ready_url(slot, &context).await?;
        let mut payload = match parameters.get("payload") {
            Some(Value::Object(p)) => Value::Object(p.clone()),
            _ => json!({}),
        };
        for key in [
            "messages",
            "model",
            "max_tokens",
            "temperature",
            "top_p",
            "seed",
            "stop",
        ] {
            if let Some(value) = parameters.get(key).filter(|v| !v.is_null()) {
                payload[key] = value.clone();
            }
        }
        // The SDK's camelCase option names, translated to llama.cpp's spelling.
        for (sdk, upstream) in [
            ("maxTokens", "max_tokens"),
            ("topP", "top_p"),
            ("topK", "top_k"),
        ] {
            if let Some(value) = parameters.get(sdk).or_else(|| payload.get(sdk)).cloned() {
                payload[upstream] = value;
                if let Value::Object(map) = &mut payload {
                    map.remove(sdk);
                }
            }
        }
        if payload.get("messages").is_none() {
            return Err(Box::new(Error::usage(
                "`llama.chat` needs `messages` (or `payload.messages`)",
                json!({"parameters": parameters}),
            )));
        }
        let stream = parameters["stream"]
            .as_bool()
            .or_else(|| payload["stream"].as_bool())
            .unwrap_or(false);
        payload["stream"] = json!(stream);
        let url = format!("{base}/v1/chat/completions");
        if !stream {
            return Ok(self
                .engine_json(Method::POST, &url, Some(&payload), Deadlines::GENERATION)
                .await?);
        }
        let stream_id = parameters["streamId"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| context.request_id.clone());
        let response = self
            .send(Method::POST, &url, Some(&payload), Deadlines::GENERATION)
            .await?;
        let mut content = String::new();
        let mut finish_reason = Value::Null;
        let mut last = Value::Null;
        let mut chunks = 0usize;
        crate::http::stream_lines(response, &url, Peer::Engine, |line| {
            let Some(data) = line.strip_prefix("data:").map(str::trim) else {
                return true;
            };
            if data == "[DONE]" {
                return false;
            }
            let Ok(chunk) = serde_json::from_str::<Value>(data) else {
                return true;
            };
            if let Some(delta) = chunk["choices"][0]["delta"]["content"].as_str() {
                content.push_str(delta);
            }
            if !chunk["choices"][0]["finish_reason"].is_null() {
                finish_reason = chunk["choices"][0]["finish_reason"].clone();
            }
            chunks += 1;
            context.emit(
                "llama.chunk",
                json!({"streamId": stream_id, "chunk": chunk}),
            );
            last = chunk;
            true
        })
        .await?;
        Ok(json!({
            "id": last["id"],
            "object": "chat.completion",
            "created": last["created"],
            "model": last["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish_reason}],
            "usage": last.get("usage").cloned().unwrap_or(Value::Null),
            "timings": last.get("timings").cloned().unwrap_or(Value::Null),
            "streamId": stream_id,
            "chunks": chunks,
        }))
    }

    async fn ollama(
        &self,
        method: &str,
        parameters: Value,
        context: RequestContext,
    ) -> MethodResult {
        let slot = self.require(Runtime::Ollama)?;
        let base = self.ready_url(slot, &context).await?;
        let (http_method, path, streams) = match method {
            "ollama.version" => (Method::GET, "/api/version", false),
            "ollama.models" => (Method::GET, "/api/tags", false),
            "ollama.running" => (Method::GET, "/api/ps", false),
            "ollama.show" => (Method::POST, "/api/show", false),
            "ollama.chat" => (Method::POST, "/api/chat", true),
            "ollama.generate" => (Method::POST, "/api/generate", true),
            "ollama.embed" => (Method::POST, "/api/embed", false),
            _ => (Method::POST, "/api/pull", true),
        };
        let url = format!("{base}{path}");
        if http_method == Method::GET {
            return Ok(self
                .engine_json(Method::GET, &url, None, Deadlines::QUICK)
                .await?);
        }
        let deadlines = match method {
            "ollama.show" => Deadlines::QUICK,
            "ollama.pull" => Deadlines::TRANSFER,
            _ => Deadlines::GENERATION,
        };
        let mut body = match parameters.get("payload") {
            Some(Value::Object(p)) => Value::Object(p.clone()),
            _ => parameters.clone(),
        };
        if let Value::Object(map) = &mut body {
            map.remove("streamId");
            map.remove("payload");
        }
        // Ollama streams by default; the host streams only when asked.
        let stream = streams && body["stream"].as_bool().unwrap_or(false);
        body["stream"] = json!(stream);
        if !stream {
            let result = self
                .engine_json(Method::POST, &url, Some(&body), deadlines)
                .await?;
            if method == "ollama.pull" {
                self.refresh_models(slot).await;
            }
            return Ok(result);
        }
        let stream_id = parameters["streamId"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| context.request_id.clone());
        let response = self
            .send(Method::POST, &url, Some(&body), deadlines)
            .await?;
        let mut content = String::new();
        let mut last = Value::Null;
        crate::http::stream_lines(response, &url, Peer::Engine, |line| {
            let Ok(chunk) = serde_json::from_str::<Value>(line) else {
                return true;
            };
            if let Some(text) = chunk["message"]["content"]
                .as_str()
                .or_else(|| chunk["response"].as_str())
            {
                content.push_str(text);
            }
            context.emit(
                "ollama.chunk",
                json!({"streamId": stream_id, "chunk": chunk}),
            );
            last = chunk;
            true
        })
        .await?;
        if method == "ollama.pull" {
            self.refresh_models(slot).await;
            return Ok(last);
        }
        let mut result = last;
        match method {
            "ollama.chat" => result["message"] = json!({"role": "assistant", "content": content}),
            _ => result["response"] = json!(content),
        }
        Ok(result)
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
                .map(|s| s.runtime.id().to_string())
                .collect(),
        };
        let mut restarted = Vec::new();
        for id in &wanted {
            let Some(slot) = self.slots.iter().find(|s| s.runtime.id() == id) else {
                return Err(Box::new(Error::usage(
                    format!("runtime `{id}` is not selected"),
                    json!({"runtime": id, "selected": self.slots.iter().map(|s| s.runtime.id()).collect::<Vec<_>>()}),
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
        match handle {
            Some(handle) => handle.stop().await,
            None => Ok(()),
        }
    }

    async fn llama_unload(&self, _parameters: Value) -> MethodResult {
        let slot = self.require(Runtime::LlamaCpp)?;
        let record = slot.view.borrow().record.clone();
        if record["owned"].as_bool() != Some(true) {
            return Ok(json!({"released": true, "unloaded": false}));
        }
        self.stop_slot(slot).await?;
        self.update(slot, json!({"state": "stopped", "available": false}));
        if let Ok(mut models) = slot.models.lock() {
            for model in models.iter_mut() {
                model["loaded"] = json!(false);
            }
        }
        Ok(json!({"released": true, "unloaded": true}))
    }

    async fn llama_load(&self, parameters: Value, context: RequestContext) -> MethodResult {
        let slot = self.require(Runtime::LlamaCpp)?;
        let model = parameters["model"].as_str().map(str::to_string);
        // A stopped (unloaded) engine is started again.
        if slot.view.borrow().state() == "stopped" {
            self.launch(Arc::clone(slot));
        }
        let base = self.ready_url(slot, &context).await?;
        self.refresh_models(slot).await;
        let models = slot.models.lock().map(|m| m.clone()).unwrap_or_default();
        let listed = |id: &str| models.iter().any(|m| m["id"].as_str() == Some(id));
        match model {
            None => Ok(
                json!({"model": models.first().map(|m| m["id"].clone()), "loaded": true, "url": base}),
            ),
            Some(id) if listed(&id) => Ok(json!({"model": id, "loaded": true, "url": base})),
            Some(id) => Err(Box::new(Error::usage(
                format!("model `{id}` is not served by the llama.cpp engine"),
                json!({"model": id, "available": models.iter().map(|m| m["id"].clone()).collect::<Vec<_>>()}),
            ))),
        }
    }
}

/// Forwards library events to the host and keeps the slot's record current.
struct SlotSink {
    service: Weak<LocalAiService>,
    slot: Arc<Slot>,
    forward: Arc<dyn EventSink>,
}

impl EventSink for SlotSink {
    fn emit(&self, event: Event) {
        let patch = event.kind.starts_with("local-ai.server.").then(|| {
            let mut patch = event.data.clone();
            if patch.get("state").is_none() {
                patch["state"] = json!(event.kind.trim_start_matches("local-ai.server."));
            }
            patch
        });
        // The library's own event first, then the `localai.state` it causes.
        self.forward.emit(event);
        if let (Some(patch), Some(service)) = (patch, self.service.upgrade()) {
            service.update(&self.slot, patch);
        }
    }
}

impl Upstream for LocalAiService {
    fn openai_target(&self) -> UpstreamTarget {
        let Some(slot) = self.slot(Runtime::LlamaCpp) else {
            return UpstreamTarget::Unavailable {
                runtime: "llama.cpp".into(),
                state: "not selected".into(),
                retry_after: None,
            };
        };
        let view = slot.view.borrow();
        match view.state() {
            "ready" => UpstreamTarget::Ready {
                url: view.record["url"].as_str().unwrap_or_default().to_string(),
            },
            state @ ("starting" | "loading") => UpstreamTarget::Unavailable {
                runtime: "llama.cpp".into(),
                state: state.into(),
                retry_after: Some(2),
            },
            state => UpstreamTarget::Unavailable {
                runtime: "llama.cpp".into(),
                state: state.into(),
                retry_after: None,
            },
        }
    }
}

const LOCAL_AI_METHODS: &[&str] = &[
    "localai.status",
    "localai.services.recover",
    "llama.status",
    "llama.models",
    "llama.load",
    "llama.unload",
    "llama.chat",
    "ollama.version",
    "ollama.models",
    "ollama.running",
    "ollama.show",
    "ollama.chat",
    "ollama.generate",
    "ollama.embed",
    "ollama.pull",
];

impl Service for LocalAiService {
    fn name(&self) -> &str {
        "local-ai"
    }

    fn methods(&self) -> Vec<MethodSpec> {
        LOCAL_AI_METHODS
            .iter()
            .map(|m| MethodSpec::request(*m))
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
                "llama.status" => Ok(self.require(Runtime::LlamaCpp)?.record()),
                "llama.models" => {
                    let slot = self.require(Runtime::LlamaCpp)?;
                    if slot.view.borrow().state() == "ready" {
                        self.refresh_models(slot).await;
                    }
                    Ok(json!({"models": slot.models.lock().map(|m| m.clone()).unwrap_or_default()}))
                }
                "llama.load" => self.llama_load(parameters, context).await,
                "llama.unload" => self.llama_unload(parameters).await,
                "llama.chat" => self.llama_chat(parameters, context).await,
                other => self.ollama(other, parameters, context).await,
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
                self.update(slot, json!({"state": "closed", "available": false}));
            }
            match first_error {
                Some(error) => Err(error),
                None => Ok(()),
            }
        })
    }

    fn replay(&self) -> Vec<(String, Value)> {
        vec![("localai.state".into(), self.state())]
    }
}

/// The `execution-devices` service: `localai.devices` and `localai.resolveTarget`.
pub struct DevicesService {
    catalog: Arc<dyn DeviceCatalog>,
}

impl DevicesService {
    /// A service over `catalog` (creating it does no I/O).
    pub fn new(catalog: Arc<dyn DeviceCatalog>) -> Arc<Self> {
        Arc::new(Self { catalog })
    }
}

impl Service for DevicesService {
    fn name(&self) -> &str {
        "execution-devices"
    }

    fn methods(&self) -> Vec<MethodSpec> {
        vec![
            MethodSpec::request("localai.devices"),
            MethodSpec::request("localai.resolveTarget"),
        ]
    }

    fn call(
        self: Arc<Self>,
        method: String,
        parameters: Value,
        _context: RequestContext,
    ) -> BoxFuture<'static, MethodResult> {
        Box::pin(async move {
            let catalog = Arc::clone(&self.catalog);
            let joined = tokio::task::spawn_blocking(move || match method.as_str() {
                "localai.devices" => {
                    catalog.devices(parameters["refresh"].as_bool().unwrap_or(false))
                }
                _ => {
                    let target = parameters
                        .get("executionTarget")
                        .cloned()
                        .unwrap_or(Value::Null);
                    catalog.resolve(&target)
                }
            })
            .await;
            match joined {
                Ok(result) => result,
                Err(join) => Err(Box::new(Error::usage(
                    format!("device probing failed: {join}"),
                    json!({}),
                )) as BoxError),
            }
        })
    }
}

/// The `model-assets` service: `modelAssets.status` lists the workspace's registered
/// models (the lister is plugged in by the CLI from `arcane-registry`).
pub struct ModelAssetsService {
    lister: Box<dyn Fn() -> Result<Value, BoxError> + Send + Sync>,
}

impl ModelAssetsService {
    /// A service listing models with `lister`.
    pub fn new(lister: impl Fn() -> Result<Value, BoxError> + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self {
            lister: Box::new(lister),
        })
    }
}

impl Service for ModelAssetsService {
    fn name(&self) -> &str {
        "model-assets"
    }

    fn methods(&self) -> Vec<MethodSpec> {
        vec![MethodSpec::request("modelAssets.status")]
    }

    fn call(
        self: Arc<Self>,
        _method: String,
        _parameters: Value,
        _context: RequestContext,
    ) -> BoxFuture<'static, MethodResult> {
        let result = (self.lister)();
        Box::pin(async move { result.map(|models| json!({"models": models})) })
    }
}

/// An [`EngineLauncher`] that only adopts an engine already listening at a URL (it
/// never starts or signals a process): the external-server case, and what tests use
/// around an engine they run themselves. It probes `GET /health` (llama.cpp: ready on
/// `{"status":"ok"}`, loading on 503) or `GET /api/version` (Ollama) until ready or
/// until `wait` has passed.
pub struct AdoptLauncher {
    runtime: Runtime,
    url: String,
    wait: std::time::Duration,
}

impl AdoptLauncher {
    /// Adopts `runtime` at `url`, probing for at most `wait`.
    pub fn new(runtime: Runtime, url: impl Into<String>, wait: std::time::Duration) -> Arc<Self> {
        Arc::new(Self {
            runtime,
            url: url.into().trim_end_matches('/').to_string(),
            wait,
        })
    }
}

struct AdoptedEngine {
    snapshot: Value,
}

impl EngineHandle for AdoptedEngine {
    fn snapshot(&self) -> Value {
        self.snapshot.clone()
    }

    fn stop(self: Box<Self>) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async { Ok(()) })
    }
}

impl EngineLauncher for AdoptLauncher {
    fn runtime(&self) -> Runtime {
        self.runtime
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    fn launch(
        &self,
        events: Arc<dyn EventSink>,
        cancel: CancelToken,
    ) -> BoxFuture<'static, Result<Box<dyn EngineHandle>, BoxError>> {
        let runtime = self.runtime;
        let url = self.url.clone();
        let wait = self.wait;
        Box::pin(async move {
            let client = engine_client();
            let probe_url = match runtime {
                Runtime::Ollama => format!("{url}/api/version"),
                _ => format!("{url}/health"),
            };
            let snapshot = |state: &str, error: Value| {
                json!({"id": runtime.id(), "engine": runtime.id(), "url": url, "state": state, "available": state == "ready",
                       "owned": false, "managed": false, "external": true, "execution": null, "error": error})
            };
            events.emit(Event::new(
                "local-ai.server.starting",
                snapshot("starting", Value::Null),
            ));
            let deadline = tokio::time::Instant::now() + wait;
            let mut announced_loading = false;
            loop {
                let request = Request::get(&probe_url).body(full(Bytes::new()));
                let outcome = match request {
                    Ok(request) => client
                        .send(request, Deadlines::QUICK, Peer::Engine)
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                let last_error = match outcome {
                    Ok(response) => {
                        let status = response.status();
                        let body = collect(response, &probe_url, Peer::Engine)
                            .await
                            .unwrap_or_default();
                        let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        let ready = status.is_success()
                            && match runtime {
                                Runtime::Ollama => {
                                    value["version"].as_str().is_some_and(|v| !v.is_empty())
                                }
                                _ => value["status"] == "ok",
                            };
                        if ready {
                            let mut ready = snapshot("ready", Value::Null);
                            if let Some(version) = value["version"].as_str() {
                                ready["version"] = json!(version);
                            }
                            events.emit(Event::new("local-ai.server.ready", ready.clone()));
                            return Ok(Box::new(AdoptedEngine { snapshot: ready })
                                as Box<dyn EngineHandle>);
                        }
                        if status.as_u16() == 503 && !announced_loading {
                            announced_loading = true;
                            events.emit(Event::new(
                                "local-ai.server.loading",
                                snapshot("loading", Value::Null),
                            ));
                        }
                        format!("`{probe_url}` answered HTTP {}", status.as_u16())
                    }
                    Err(error) => format!("`{probe_url}` did not answer: {error}"),
                };
                if cancel.is_cancelled() {
                    return Err(Box::new(Error::Cancelled {
                        id: runtime.id().into(),
                    }) as BoxError);
                }
                if tokio::time::Instant::now() >= deadline {
                    let error = Error::EngineNotReady {
                        runtime: runtime.id().into(),
                        state: last_error,
                        retry_after: None,
                    };
                    events.emit(Event::new(
                        "local-ai.server.error",
                        snapshot("error", error_json(&error)),
                    ));
                    return Err(Box::new(error) as BoxError);
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        })
    }
}
