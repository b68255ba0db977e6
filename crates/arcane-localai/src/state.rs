//! Server states and the snapshot every `local-ai.server.<state>` event carries.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::process::{ExitInfo, StopStep};

/// The state of a supervised server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerState {
    /// Probing, or an owned engine was started and is not answering yet.
    Starting,
    /// The engine answers `503 Loading model`.
    Loading,
    /// The engine answers its readiness probe; requests may be sent.
    Ready,
    /// Starting failed, or the engine crashed; the snapshot's `error` says why.
    Error,
    /// The server was stopped (owned) or released (adopted).
    Stopped,
}

impl ServerState {
    /// `starting`, `loading`, `ready`, `error` or `stopped`.
    pub fn as_str(self) -> &'static str {
        match self {
            ServerState::Starting => "starting",
            ServerState::Loading => "loading",
            ServerState::Ready => "ready",
            ServerState::Error => "error",
            ServerState::Stopped => "stopped",
        }
    }

    /// The event type published on entering this state: `local-ai.server.<state>`.
    pub fn event_type(self) -> String {
        format!("local-ai.server.{}", self.as_str())
    }

    /// Whether the server answers requests.
    pub fn is_ready(self) -> bool {
        self == ServerState::Ready
    }
}

/// Everything known about a server at one moment; the `data` of every
/// `local-ai.server.<state>` event (serialized in camelCase).
///
/// * `owned`: Arcane spawned the process (and will stop it).
/// * `external`: a listener answered the first probe (adopted or refused).
/// * `managed`: not external, and an executable could be managed at this listener.
/// * `execution`: the device resolution record (llama.cpp, owned only; `null` otherwise).
/// * `error`: `{code, message, details}` in the `error` state only.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerSnapshot {
    /// The server id (the engine id unless configured).
    pub id: String,
    /// The engine id (`llama.cpp`, `ollama`).
    pub engine: String,
    /// The listener url (origin).
    pub url: String,
    /// The state.
    pub state: ServerState,
    /// `state == ready`.
    pub available: bool,
    /// Arcane spawned and owns the process.
    pub owned: bool,
    /// The server can be managed by Arcane (not external, executable known).
    pub managed: bool,
    /// A listener that Arcane did not start answered.
    pub external: bool,
    /// The execution record from device resolution (llama.cpp owned servers).
    pub execution: Option<Value>,
    /// The error, in the `error` state.
    pub error: Option<Value>,
    /// The owned process id, while it runs.
    pub pid: Option<u32>,
    /// The version the server reported, when known.
    pub version: Option<String>,
    /// How many times the engine was restarted after a crash.
    pub restarts: u32,
    /// In `stopped`: which step of the stop ended the process.
    pub stop_step: Option<StopStep>,
    /// How the owned process ended, once it has.
    pub exit: Option<ExitInfo>,
}

impl ServerSnapshot {
    pub(crate) fn new(id: &str, engine: &str, url: &str) -> Self {
        Self {
            id: id.into(),
            engine: engine.into(),
            url: url.into(),
            state: ServerState::Starting,
            available: false,
            owned: false,
            managed: false,
            external: false,
            execution: None,
            error: None,
            pid: None,
            version: None,
            restarts: 0,
            stop_step: None,
            exit: None,
        }
    }
}
