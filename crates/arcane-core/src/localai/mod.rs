//! The built-in local-AI services, one module each: `local-ai` ([`LocalAiService`],
//! `engines`), `execution-devices` ([`DevicesService`], `devices`) and `model-assets`
//! ([`ModelAssetsService`], `assets`); [`AdoptLauncher`] (`adopt`) adopts an engine
//! that already runs, and `status` holds the typed engine view and its wire form.
//!
//! The host does not supervise processes itself. The `local-ai` service drives one
//! [`EngineLauncher`] per selected engine (the CLI plugs in `arcane-localai`'s
//! supervisor; tests may plug in anything that yields a running engine) and keeps a
//! typed view per runtime, updated from the supervisor's typed snapshots (never from
//! event JSON). Every change publishes `localai.state {runtimes[]}` and the watch
//! [`LocalAiService::watch`] returns.
//!
//! Engines start in the background when the service starts, so `localai.status` and
//! `llama.status` answer at once from the service's own state (what the supervisor
//! published, and the models fetched when the engine became ready); they never ask
//! the engine, so a hung engine cannot hang them. Every call to an engine has
//! [`Deadlines`](crate::upstream::Deadlines). Methods that need an engine
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

use std::sync::Arc;

use arcane_localai::{ServerSnapshot, StateObserver};
use arcane_report::{CancelToken, EventSink};
use serde_json::Value;

use crate::service::{BoxError, BoxFuture};
use arcane_localai::Engine;

mod adopt;
mod assets;
mod devices;
mod engines;
mod forward;
mod orphans;

pub use forward::chat;
pub(crate) mod status;

pub use adopt::AdoptLauncher;
pub use assets::ModelAssetsService;
pub use devices::DevicesService;
pub use engines::LocalAiService;
pub use orphans::EngineRecordsService;
pub use status::{describe, EngineState, EngineStatus, ExitStatus, LocalAiStatus, ProcessStatus};

/// Starts (or adopts) one engine. Implemented over `arcane-localai`'s supervisor by the
/// CLI.
pub trait EngineLauncher: Send + Sync + 'static {
    /// Which runtime this launches.
    fn runtime(&self) -> Engine;

    /// The engine's listener URL.
    fn url(&self) -> String;

    /// The files it runs: its model file and its executable (what `arcane model|runtime
    /// remove` must not take from a running host).
    fn files(&self) -> (Option<std::path::PathBuf>, Option<std::path::PathBuf>) {
        (None, None)
    }

    /// The engine's own arguments beyond what Arcane derives (`--embeddings`,
    /// `--mmproj …`): what it can serve follows from them.
    fn args(&self) -> Vec<String> {
        Vec::new()
    }

    /// Starts or adopts the engine; resolves once it is ready (or failed). Library
    /// events (`local-ai.server.<state>`) go to `events`; every state change also goes
    /// to `observer`, typed, right after its event; `cancel` aborts the start.
    fn launch(
        &self,
        events: Arc<dyn EventSink>,
        observer: StateObserver,
        cancel: CancelToken,
    ) -> BoxFuture<'static, Result<Box<dyn EngineHandle>, BoxError>>;
}

/// A running (owned or adopted) engine.
pub trait EngineHandle: Send + Sync {
    /// The supervisor's current snapshot.
    fn snapshot(&self) -> ServerSnapshot;

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
