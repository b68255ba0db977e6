//! The `onnx` service: ONNX sessions in supervised worker processes, one worker per
//! execution target (device).
//!
//! | method | parameters | result |
//! |---|---|---|
//! | `onnx.status` | — | `{runtime: {library, version, providers}, workers: [{target, pid, state}], sessions: [{session, model, target, provider, state, error?, inputs, outputs}]}` |
//! | `onnx.load` | `{model, executionTarget?, options?, isolated?}` | `{session, model, target, provider, worker: {pid}, inputs, outputs}` |
//! | `onnx.run` | `{session, inputs: {name: {type, shape, data}}, outputs?, encoding?}` | `{session, outputs: {name: tensor}}` |
//! | `onnx.unload` | `{session}` | `{session, unloaded: true}` |
//!
//! `model` is a registered model id or a path (checked like the registry checks one:
//! a regular file, opened without blocking). `executionTarget` is a device id from
//! `localai.devices` (`cpu`, the default, or a GPU's id) or `{deviceId}`, resolved by
//! `arcane-devices`: a GPU runs on the CUDA execution provider in a worker whose
//! `CUDA_VISIBLE_DEVICES` is that GPU's UUID, and is refused
//! (`LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED`) when the runtime has no CUDA provider.
//!
//! Sessions on one target share its worker; `isolated: true` gives a session a worker
//! of its own (on the same target), so nothing else shares its fate. A worker runs
//! only while it has sessions: the unload of its last one stops it (input closed, the
//! process reaped, its ownership record removed), and at most
//! [`OnnxConfig::max_workers`] run at once: past that `onnx.load` is `ARCANE_IN_USE`
//! ([`pool`]).
//!
//! A relative `model` path is the workspace's (the resolver's contract): the host's
//! working directory is wherever it happened to be started, not something a client
//! can see.
//!
//! A worker that dies (a crash, SIGKILL) fails its sessions with
//! `LOCAL_AI_SERVER_FAILED` saying how it ended; other workers keep serving, and the
//! next `onnx.load` on that target starts a fresh worker. A cancelled `onnx.run`
//! sends the worker a cancel frame (ONNX Runtime's terminate flag); a run that has not
//! stopped within [`OnnxConfig::cancel_grace`] has its worker killed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arcane_devices::{Backend, DeviceSource, ResolveRequest};
use arcane_onnx::{Encoding, Provider, Tensor};
use arcane_report::codes;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use arcane_core::service::{
    BoxError, BoxFuture, MethodResult, MethodSpec, RequestContext, Service,
};
use arcane_core::Error;

mod pool;
pub mod records;
mod worker;

pub use worker::{Worker, WorkerSpec};

/// The worker flag (`arcane __onnx-worker`) that keeps it alive after its input ends.
pub const OUTLIVE_INPUT_FLAG: &str = "--outlive-input";

/// How many worker processes a host runs at most unless configured otherwise.
pub const DEFAULT_MAX_WORKERS: usize = 16;

/// How long a stopped worker may take to exit after its input closes (then SIGTERM,
/// and SIGKILL after as long again).
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Resolves `onnx.load`'s `model` (a registered id or a path; a relative path against
/// the workspace, never the host's working directory) to a model file.
pub type ModelResolver = dyn Fn(&str) -> Result<PathBuf, BoxError> + Send + Sync;

/// What the service needs, plugged in by the CLI.
pub struct OnnxConfig {
    /// The ONNX Runtime library (from the runtime registry). Its version and execution
    /// providers come from the CPU worker's hello (started on first use), so the host
    /// itself never loads the library.
    pub library: PathBuf,
    /// The worker program (the `arcane` binary) and the arguments before the library
    /// path (`["__onnx-worker", "--library"]`).
    pub worker_program: PathBuf,
    /// Those arguments.
    pub worker_args: Vec<String>,
    /// Where devices come from.
    pub devices: Arc<dyn DeviceSource>,
    /// Resolves a model id or path (a relative path against the workspace).
    pub models: Arc<ModelResolver>,
    /// How long a worker may take to say hello.
    pub start_timeout: Duration,
    /// How long a cancelled run may take to stop before its worker is killed.
    pub cancel_grace: Duration,
    /// The most worker processes that run at once ([`DEFAULT_MAX_WORKERS`]); a load
    /// that needs one more is refused with `ARCANE_IN_USE` (so 0 refuses every load).
    pub max_workers: usize,
    /// The workspace whose `.arcane/onnx-workers/` records each worker ([`records`]);
    /// the service's start stops the orphans recorded there. `None`: no records.
    pub records: Option<PathBuf>,
    /// Test-only: start workers without the parent-death signal and with
    /// [`OUTLIVE_INPUT_FLAG`] (they stay after their input ends, as one stuck in a run
    /// would), to make an orphan.
    pub workers_outlive_host: bool,
}

#[derive(Clone)]
struct SessionEntry {
    model: PathBuf,
    target: String,
    provider: Provider,
    /// The worker's key in the pool (the target, or `<target>/<session>`).
    key: String,
    worker: Arc<Worker>,
    described: Value,
    error: Option<String>,
}

/// The `onnx` service.
pub struct OnnxService {
    config: OnnxConfig,
    workers: tokio::sync::Mutex<pool::Pool>,
    sessions: Mutex<BTreeMap<String, SessionEntry>>,
    next_session: AtomicU64,
    /// The runtime's hello (`{version, providers}`), kept from the first worker so
    /// that no worker has to stay for it.
    runtime: Mutex<Option<Value>>,
}

fn usage(message: String, details: Value) -> BoxError {
    Box::new(Error::usage(message, details))
}

fn string_param(parameters: &Value, name: &str) -> Result<String, BoxError> {
    parameters[name]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| {
            usage(
                format!("`{name}` is required (a string)"),
                json!({"parameters": parameters}),
            )
        })
}

impl OnnxService {
    /// The service (creating it starts nothing: workers start on `onnx.load`).
    pub fn new(config: OnnxConfig) -> Arc<Self> {
        let max_workers = config.max_workers;
        Arc::new(Self {
            config,
            workers: tokio::sync::Mutex::new(pool::Pool::new(max_workers)),
            sessions: Mutex::new(BTreeMap::new()),
            next_session: AtomicU64::new(1),
            runtime: Mutex::new(None),
        })
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SessionEntry>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The runtime's hello (`{version, providers}`): kept from the first worker's, else
    /// any running worker's, else the CPU worker's, started for it (without a hold:
    /// the next settle stops it unless a load on the CPU took it).
    async fn runtime_info(&self) -> Result<Value, BoxError> {
        if let Some(hello) = self
            .runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Ok(hello);
        }
        let mut workers = self.workers.lock().await;
        let worker = match workers.any_live() {
            Some(worker) => worker,
            None => {
                let cpu = arcane_devices::CPU_DEVICE_ID;
                let spec = self.spec(BTreeMap::new(), Vec::new());
                self.start_worker(&mut workers, cpu, cpu, spec).await?
            }
        };
        let hello = worker.hello().clone();
        *self.runtime.lock().unwrap_or_else(|e| e.into_inner()) = Some(hello.clone());
        Ok(hello)
    }

    fn spec(&self, env: BTreeMap<String, String>, env_remove: Vec<String>) -> WorkerSpec {
        let mut args = self.config.worker_args.clone();
        args.push(self.config.library.display().to_string());
        if self.config.workers_outlive_host {
            args.push(OUTLIVE_INPUT_FLAG.into());
        }
        WorkerSpec {
            program: self.config.worker_program.clone(),
            args,
            env,
            env_remove,
            parent_death_signal: !self.config.workers_outlive_host,
            records: self.config.records.clone(),
        }
    }

    async fn status(&self) -> MethodResult {
        let info = self.runtime_info().await?;
        self.settle().await;
        let sessions: Vec<Value> = self
            .sessions()
            .iter()
            .map(|(id, s)| {
                let (state, error) = match (&s.error, s.worker.is_dead()) {
                    (Some(e), _) => ("failed", Some(e.clone())),
                    (None, true) => ("failed", Some(s.worker.death().to_string())),
                    (None, false) => ("loaded", None),
                };
                json!({
                    "session": id, "model": s.model, "target": s.target, "provider": s.provider,
                    "state": state, "error": error,
                    "inputs": s.described["inputs"], "outputs": s.described["outputs"],
                })
            })
            .collect();
        let workers: Vec<Value> = match self.workers.try_lock() {
            Ok(workers) => workers
                .workers()
                .map(|w| json!({"target": w.target(), "pid": w.pid(), "state": if w.is_dead() { "exited" } else { "running" }}))
                .collect(),
            Err(_) => Vec::new(),
        };
        Ok(json!({
            "runtime": {"id": "onnx", "library": self.config.library, "version": info["version"], "providers": info["providers"]},
            "workers": workers,
            "sessions": sessions,
        }))
    }

    /// Resolves the target to `(device id, provider, env, env_remove)`.
    fn resolve(
        &self,
        target: &Value,
        providers: &[String],
    ) -> Result<(String, Provider, WorkerSpec), BoxError> {
        let id = match target {
            Value::Null => arcane_devices::CPU_DEVICE_ID.to_string(),
            Value::String(id) => id.clone(),
            Value::Object(map) => match map.get("deviceId").and_then(Value::as_str) {
                Some(id) => id.to_string(),
                None => {
                    return Err(usage(
                        "`executionTarget` needs a `deviceId`".into(),
                        json!({"executionTarget": target}),
                    ))
                }
            },
            _ => {
                return Err(usage(
                    "`executionTarget` must be `{deviceId}` or a device id".into(),
                    json!({"executionTarget": target}),
                ))
            }
        };
        let has_cuda = providers.iter().any(|p| p == Provider::Cuda.ort_name());
        // Resolved as for a CUDA runtime, so that a GPU target is recognised as one and
        // refused below in ONNX's own terms when this runtime lacks the provider.
        let request = ResolveRequest {
            target: Some(id.clone()),
            runtime_backend: Backend::Cuda,
            requested_backend: Backend::Auto,
        };
        let plan = arcane_devices::resolve(&request, self.config.devices.as_ref())
            .map_err(|e| Box::new(e) as BoxError)?;
        let cuda = plan
            .execution()
            .configured_target
            .as_ref()
            .is_some_and(|t| t.backend == Backend::Cuda);
        if cuda && !has_cuda {
            return Err(self.no_cuda(&id, providers));
        }
        let spec = self.spec(plan.env().clone(), plan.env_remove().to_vec());
        Ok((id, if cuda { Provider::Cuda } else { Provider::Cpu }, spec))
    }

    /// The refusal of GPU target `id` on a runtime without the CUDA provider.
    fn no_cuda(&self, id: &str, providers: &[String]) -> BoxError {
        let cuda = Provider::Cuda.ort_name();
        let device = self
            .config
            .devices
            .catalog()
            .devices
            .into_iter()
            .find(|d| d.device_id.as_deref() == Some(id))
            .map(|d| format!(" ({})", d.name))
            .unwrap_or_default();
        Box::new(Error::Remote {
            code: codes::LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED.into(),
            message: format!(
                "execution target `{id}`{device} is an NVIDIA GPU, which needs ONNX Runtime's `{cuda}`; the runtime `{}` has only {}",
                self.config.library.display(),
                providers.join(", ")
            ),
            details: json!({"target": id, "provider": cuda, "available": providers, "library": self.config.library}),
            hints: vec!["register an ONNX Runtime built with CUDA (the `onnxruntime-gpu` wheel's library) with `arcane runtime add onnx --library PATH`, or choose the target `cpu`".into()],
            cause: None,
        })
    }

    /// The live worker under `key` (serving `target`) with a hold taken for a load,
    /// starting a fresh one when there is none or the last one died.
    async fn hold_worker(
        &self,
        key: &str,
        target: &str,
        spec: WorkerSpec,
    ) -> Result<Arc<Worker>, BoxError> {
        let mut workers = self.workers.lock().await;
        let worker = match workers.live(key) {
            Some(worker) => worker,
            None => self.start_worker(&mut workers, key, target, spec).await?,
        };
        workers.hold(key);
        Ok(worker)
    }

    /// Starts a worker under `key` within the cap: idle workers (a CPU worker started
    /// only for the runtime's hello) are stopped first to make room.
    async fn start_worker(
        &self,
        workers: &mut pool::Pool,
        key: &str,
        target: &str,
        spec: WorkerSpec,
    ) -> Result<Arc<Worker>, BoxError> {
        if workers.check_room(target).is_err() {
            stop(workers.take_idle()).await;
        }
        workers.check_room(target)?;
        let started = Worker::start(key, &spec, self.config.start_timeout).await?;
        workers.insert(key, Arc::clone(&started));
        Ok(started)
    }

    /// Drops a hold on `worker` (under `key`) and stops every worker left without one.
    async fn release(&self, key: &str, worker: &Arc<Worker>) {
        let idle = {
            let mut workers = self.workers.lock().await;
            workers.release(key, worker);
            workers.take_idle()
        };
        stop(idle).await;
    }

    /// Stops every worker without a hold.
    async fn settle(&self) {
        let idle = self.workers.lock().await.take_idle();
        stop(idle).await;
    }

    /// Loads a session, then stops whatever worker is left without sessions (the CPU
    /// worker started only for the runtime's hello, or this load's own fresh worker
    /// when the load failed). A load whose request was cancelled meanwhile is
    /// unloaded again: nobody knows its session.
    async fn load(&self, parameters: Value, cancel: CancellationToken) -> MethodResult {
        let mut loaded = self.load_session(parameters).await;
        if cancel.is_cancelled() {
            if let Ok(result) = &loaded {
                let session = result["session"].clone();
                let _ = self.unload(json!({"session": session})).await;
                loaded = Err(Box::new(arcane_onnx::Error::Cancelled));
            }
        }
        self.settle().await;
        loaded
    }

    async fn load_session(&self, parameters: Value) -> MethodResult {
        let model = string_param(&parameters, "model")?;
        let models = Arc::clone(&self.config.models);
        let path = tokio::task::spawn_blocking(move || models(&model))
            .await
            .map_err(|e| usage(format!("resolving the model failed: {e}"), Value::Null))??;
        let info = self.runtime_info().await?;
        let providers: Vec<String> =
            serde_json::from_value(info["providers"].clone()).unwrap_or_default();
        let (target, provider, spec) = self.resolve(&parameters["executionTarget"], &providers)?;
        let options = arcane_onnx::SessionOptions::from_json(&parameters["options"])
            .map_err(|e| Box::new(e) as BoxError)?;
        let session = format!("onnx-{}", self.next_session.fetch_add(1, Ordering::SeqCst));
        // An isolated session gets a worker of its own on the same target.
        let key = match parameters["isolated"].as_bool() {
            Some(true) => format!("{target}/{session}"),
            _ => target.clone(),
        };
        let worker = self.hold_worker(&key, &target, spec).await?;
        let id = worker.next_id();
        let frame = json!({"op": "load", "id": id, "session": session, "model": path, "provider": provider, "options": options});
        let described = match worker.call(id, frame).await {
            Ok(described) => described,
            Err(e) => {
                self.workers.lock().await.release(&key, &worker);
                return Err(e);
            }
        };
        let pid = worker.pid();
        self.sessions().insert(
            session.clone(),
            SessionEntry {
                model: path.clone(),
                target: target.clone(),
                provider,
                key,
                worker,
                described: described.clone(),
                error: None,
            },
        );
        Ok(json!({
            "session": session, "model": path, "target": target, "provider": provider,
            "worker": {"pid": pid},
            "inputs": described["inputs"], "outputs": described["outputs"],
        }))
    }

    fn entry(&self, session: &str) -> Result<SessionEntry, BoxError> {
        let entry = self.sessions().get(session).cloned().ok_or_else(|| {
            Box::new(Error::Remote {
                code: codes::ARCANE_NOT_FOUND.into(),
                message: format!("no ONNX session `{session}` is loaded"),
                details: json!({"session": session}),
                hints: vec!["load one with `onnx.load`; `onnx.status` lists the sessions".into()],
                cause: None,
            }) as BoxError
        })?;
        if let Some(error) = &entry.error {
            return Err(failed_session(session, error));
        }
        if entry.worker.is_dead() {
            let error = entry.worker.death().to_string();
            if let Some(e) = self.sessions().get_mut(session) {
                e.error = Some(error.clone());
            }
            return Err(failed_session(session, &error));
        }
        Ok(entry)
    }

    async fn run(&self, parameters: Value, context: RequestContext) -> MethodResult {
        let session = string_param(&parameters, "session")?;
        let entry = self.entry(&session)?;
        let Some(inputs) = parameters.get("inputs").filter(|v| v.is_object()) else {
            return Err(usage(
                "`inputs` is required: `{name: {type, shape, data}}`".into(),
                json!({"session": session}),
            ));
        };
        let encoding = match parameters.get("encoding").filter(|v| !v.is_null()) {
            Some(value) => Encoding::deserialize(value).map_err(|e| {
                usage(
                    format!("`encoding` must be `array` or `base64`: {e}"),
                    json!({"encoding": value}),
                )
            })?,
            None => Encoding::Array,
        };
        let worker = entry.worker;
        let id = worker.next_id();
        let mut frame = json!({
            "op": "run", "id": id, "session": session,
            "inputs": worker_inputs(inputs)?, "encoding": Encoding::Base64,
        });
        if let Some(outputs) = parameters.get("outputs").filter(|v| !v.is_null()) {
            frame["outputs"] = outputs.clone();
        }
        let call = worker.call(id, frame);
        tokio::pin!(call);
        let result = tokio::select! {
            result = &mut call => result,
            () = context.cancel.cancelled() => {
                worker.send(&json!({"op": "cancel", "id": worker.next_id(), "run": id})).await;
                match tokio::time::timeout(self.config.cancel_grace, &mut call).await {
                    Ok(_) => {}
                    Err(_) => {
                        worker.forget(id);
                        worker.kill();
                    }
                }
                return Err(Box::new(arcane_onnx::Error::Cancelled));
            }
        };
        let result = result.map_err(|e| {
            if worker.is_dead() {
                let error = worker.death().to_string();
                if let Some(s) = self.sessions().get_mut(&session) {
                    s.error = Some(error.clone());
                }
                failed_session(&session, &error)
            } else {
                e
            }
        })?;
        Ok(json!({"session": session, "outputs": caller_outputs(&result["outputs"], encoding)?}))
    }

    async fn unload(&self, parameters: Value) -> MethodResult {
        let session = string_param(&parameters, "session")?;
        let entry = self.sessions().remove(&session);
        let Some(entry) = entry else {
            return Err(Box::new(Error::Remote {
                code: codes::ARCANE_NOT_FOUND.into(),
                message: format!("no ONNX session `{session}` is loaded"),
                details: json!({"session": session}),
                hints: vec![],
                cause: None,
            }));
        };
        let unloaded = if entry.worker.is_dead() {
            Ok(Value::Null)
        } else {
            let id = entry.worker.next_id();
            entry
                .worker
                .call(id, json!({"op": "unload", "id": id, "session": session}))
                .await
        };
        // The session is gone from the host either way, and with it its hold: a worker
        // that failed to unload it is stopped with it when it was the last.
        self.release(&entry.key, &entry.worker).await;
        unloaded?;
        Ok(json!({"session": session, "unloaded": true}))
    }
}

/// The caller's inputs as the worker gets them: each one parsed here (so malformed
/// data is refused before the worker sees it) and its numeric data sent as base64,
/// which the worker reads without parsing numbers. Names, types and shapes are checked
/// against the model by the worker.
fn worker_inputs(inputs: &Value) -> Result<Value, BoxError> {
    let Value::Object(inputs) = inputs else {
        return Ok(Value::Null);
    };
    let mut encoded = serde_json::Map::with_capacity(inputs.len());
    for (name, value) in inputs {
        let tensor = Tensor::from_value(name, value).map_err(|e| Box::new(e) as BoxError)?;
        let json = tensor.to_json(Encoding::Base64).into_value();
        encoded.insert(name.clone(), json);
    }
    Ok(Value::Object(encoded))
}

/// The worker's outputs (base64) in the encoding the caller asked for.
fn caller_outputs(outputs: &Value, encoding: Encoding) -> Result<Value, BoxError> {
    if encoding == Encoding::Base64 {
        return Ok(outputs.clone());
    }
    let Value::Object(outputs) = outputs else {
        return Ok(outputs.clone());
    };
    let mut decoded = serde_json::Map::with_capacity(outputs.len());
    for (name, value) in outputs {
        let tensor = Tensor::from_value(name, value).map_err(|e| Box::new(e) as BoxError)?;
        let json = tensor.to_json(encoding).into_value();
        decoded.insert(name.clone(), json);
    }
    Ok(Value::Object(decoded))
}

/// Runs `work` on a task of its own and waits for it; the work goes on when the
/// waiter is dropped.
async fn detached(
    work: impl std::future::Future<Output = MethodResult> + Send + 'static,
) -> MethodResult {
    tokio::spawn(work).await.unwrap_or_else(|e| {
        Err(Box::new(Error::Remote {
            code: codes::ARCANE_OPERATION_FAILED.into(),
            message: format!("the ONNX service's task failed: {e}"),
            details: Value::Null,
            hints: vec![],
            cause: None,
        }))
    })
}

/// The orderly stop of `workers`: their input closed (each finishes what it is doing
/// and exits), then each reaped, SIGTERM and SIGKILL for one that does not exit within
/// [`STOP_GRACE`]; reaping runs its exit hooks, which remove its ownership record.
async fn stop(workers: Vec<Arc<Worker>>) {
    if workers.is_empty() {
        return;
    }
    for worker in &workers {
        worker.close_input().await;
    }
    let _ = tokio::task::spawn_blocking(move || {
        for worker in workers {
            worker.reap(STOP_GRACE);
        }
    })
    .await;
}

fn failed_session(session: &str, error: &str) -> BoxError {
    Box::new(Error::Remote {
        code: codes::LOCAL_AI_SERVER_FAILED.into(),
        message: format!("ONNX session `{session}` failed: {error}"),
        details: json!({"session": session, "state": "failed"}),
        hints: vec!["unload it and load the model again: a fresh worker is started".into()],
        cause: None,
    })
}

impl Service for OnnxService {
    fn name(&self) -> &str {
        "onnx"
    }

    fn methods(&self) -> Vec<MethodSpec> {
        ["onnx.status", "onnx.load", "onnx.run", "onnx.unload"]
            .into_iter()
            .map(MethodSpec::request)
            .collect()
    }

    fn start(
        self: Arc<Self>,
        context: arcane_core::service::ServiceContext,
    ) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move {
            let Some(workspace) = self.config.records.clone() else {
                return Ok(());
            };
            let reaped = tokio::task::spawn_blocking(move || {
                records::Records::new(workspace).reap_orphans(Duration::from_secs(2))
            })
            .await
            .unwrap_or_default();
            for (record, step) in reaped {
                context.emit(
                    arcane_report::event_types::PROCESS_ORPHAN_STOPPED,
                    json!({
                        "id": format!("onnx-worker:{}", record.target), "pid": record.pid,
                        "executable": record.exe, "previousOwner": record.owner.pid,
                        "stopStep": step,
                    }),
                );
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
                "onnx.status" => self.status().await,
                // Load and unload take and drop a worker's hold: they run to the end on
                // a task of their own, so a caller that goes away (a cancelled request,
                // a closed connection) cannot leave a hold taken and a worker running.
                "onnx.load" => {
                    let cancel = context.cancel.clone();
                    detached(async move { self.load(parameters, cancel).await }).await
                }
                "onnx.run" => self.run(parameters, context).await,
                "onnx.unload" => detached(async move { self.unload(parameters).await }).await,
                other => Err(usage(format!("unknown method `{other}`"), Value::Null)),
            }
        })
    }

    fn dispose(self: Arc<Self>) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move {
            let workers = self.workers.lock().await.drain();
            stop(workers).await;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worker is sent base64 whatever the caller wrote (so it parses no numbers),
    /// malformed data is refused here naming the input, and outputs come back to the
    /// caller bit for bit in the encoding asked for.
    #[test]
    fn the_worker_leg_carries_base64_and_the_caller_gets_its_encoding_back() {
        let inputs = json!({
            "x": {"type": "float32", "shape": [2], "data": [0.1, -2.5]},
            "s": {"type": "string", "shape": [1], "data": ["a"]},
        });
        let sent = worker_inputs(&inputs).unwrap();
        assert!(sent["x"]["data"].is_string(), "{sent}");
        assert_eq!(sent["s"]["data"], json!(["a"]));
        let back = caller_outputs(&sent, Encoding::Array).unwrap();
        assert_eq!(
            back["x"],
            json!({"type": "float32", "shape": [2], "data": [0.1f32, -2.5f32]})
        );
        assert_eq!(caller_outputs(&sent, Encoding::Base64).unwrap(), sent);

        let bad = json!({"x": {"type": "float32", "shape": [3], "data": [1, 2]}});
        let error = worker_inputs(&bad).unwrap_err().to_string();
        assert!(
            error.contains("input `x`") && error.contains("needs 3 elements"),
            "{error}"
        );
    }
}
