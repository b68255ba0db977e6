//! The host's typed view of its engines, and the one wire type that carries it.
//!
//! The host keeps each engine as an [`EngineView`]: the supervisor's latest typed
//! [`ServerSnapshot`] plus what the host itself decided. JSON appears only at the
//! edge: [`EngineStatus`] is what `localai.status`, `llama.status` and the
//! `localai.state` event carry, and what clients (`arcane status`, `arcane chat`)
//! parse it back into, once.
//!
//! # One state model
//!
//! The states and the table are `arcane-localai`'s ([`EngineState`],
//! [`arcane_localai::transition`]), the same the supervisor and the gateway use. What
//! the supervisor reports was already checked by that table; what the host decides
//! itself (`start`, `failed`, `stopped`, `close`) goes through it too. A record of the
//! state the engine is already in (the host's `stopped` after the supervisor reported
//! the stop, its `failed` after the supervisor's `error`) confirms that state and
//! changes nothing. A late snapshot of a closed engine is ignored.

use arcane_localai::{Change, InvalidTransition, ServerSnapshot};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use arcane_localai::Engine;
pub use arcane_localai::EngineState;

/// One engine on the wire (camelCase): `{id, url, state, available, owned, managed,
/// external, reachableWithoutToken, keyIgnored, execution, error, models}`, plus, once the
/// supervisor has reported, `{engine, pid, version, restarts, stopStep, exit, socket}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineStatus {
    /// The server id (the runtime id unless configured).
    pub id: String,
    /// The listener URL.
    pub url: String,
    /// The state.
    pub state: EngineState,
    /// `state == ready`.
    #[serde(default)]
    pub available: bool,
    /// Arcane spawned and owns the process.
    #[serde(default)]
    pub owned: bool,
    /// Arcane can manage the server (not external, executable known).
    #[serde(default)]
    pub managed: bool,
    /// A listener Arcane did not start answered.
    #[serde(default)]
    pub external: bool,
    /// Whether a local process or a web page can use the engine without the Core's
    /// token: an adopted server or a port without a key (Ollama) yes; an owned engine
    /// on its private socket or behind its key no.
    #[serde(default)]
    pub reachable_without_token: bool,
    /// An owned server started behind a key answered without it once ready: it ignores
    /// its key (so it is reachable without the token).
    #[serde(default)]
    pub key_ignored: bool,
    /// The device resolution record (owned llama.cpp servers).
    #[serde(default)]
    pub execution: Option<Value>,
    /// `{code, message, details, …}` while failed.
    #[serde(default)]
    pub error: Option<Value>,
    /// What only the supervisor knows; absent until it has reported.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessStatus>,
    /// The models the engine serves (fetched when it became ready).
    #[serde(default)]
    pub models: Vec<Value>,
}

/// The supervisor's part of an [`EngineStatus`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessStatus {
    /// The engine id (`llama.cpp`, `ollama`).
    pub engine: String,
    /// The owned process id, while it runs.
    #[serde(default)]
    pub pid: Option<u32>,
    /// The version the server reported.
    #[serde(default)]
    pub version: Option<String>,
    /// How many times it was restarted after a crash.
    #[serde(default)]
    pub restarts: u32,
    /// In `stopped`: which step of the stop ended it (`sigterm`, `released`, …).
    #[serde(default)]
    pub stop_step: Option<String>,
    /// How the owned process ended, once it has.
    #[serde(default)]
    pub exit: Option<ExitStatus>,
    /// The private Unix socket an owned engine listens on (none: a TCP port).
    #[serde(default)]
    pub socket: Option<std::path::PathBuf>,
}

/// How an owned engine process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    /// The exit code, when it exited by itself.
    pub code: Option<i32>,
    /// The signal that ended it.
    pub signal: Option<i32>,
}

impl EngineStatus {
    /// Which of "owned, pid N", "owned, no process running", "adopted (not started by
    /// Arcane)" or "not running" describes this engine: never a bare `pid null`.
    pub fn ownership(&self) -> String {
        let pid = self.process.as_ref().and_then(|p| p.pid);
        match (self.owned, pid) {
            (true, Some(pid)) => format!("owned, pid {pid}"),
            (true, None) => "owned, no process running".to_string(),
            (false, _) if self.external => "adopted (not started by Arcane)".to_string(),
            (false, _) => "not running".to_string(),
        }
    }

    /// Who can reach the engine, in words: "private socket, only through the Core",
    /// "port behind a key only the Core knows", or "reachable without the token" and
    /// why. The one wording `arcane status` and `arcane serve` print.
    pub fn exposure(&self) -> String {
        let socket = self.process.as_ref().and_then(|p| p.socket.as_ref());
        match (self.reachable_without_token, socket) {
            (false, Some(_)) => "private socket: reachable only through the Core".into(),
            (false, None) => "port behind a key only the Core knows".into(),
            (true, _) if self.key_ignored => {
                "reachable without the token (it answered without the key it was started behind)"
                    .into()
            }
            (true, _) if self.external => {
                "reachable without the token (adopted: not Arcane's to secure)".into()
            }
            (true, _) if self.owned => {
                "reachable without the token (the engine has no authentication)".into()
            }
            (true, _) => "reachable without the token".into(),
        }
    }

    /// The error's message, while failed.
    pub fn error_message(&self) -> Option<&str> {
        self.error.as_ref()?.get("message")?.as_str()
    }

    /// The device it runs on (resolved, else configured), when known.
    pub fn device(&self) -> Option<&str> {
        let execution = self.execution.as_ref()?;
        execution
            .pointer("/resolvedDevice/deviceId")
            .and_then(Value::as_str)
            .or_else(|| {
                execution
                    .pointer("/configuredTarget/deviceId")
                    .and_then(Value::as_str)
            })
    }
}

/// The `local-ai` service's state on the wire: `localai.status`'s result and the
/// `localai.state` event's data, `{runtimes: [EngineStatus]}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LocalAiStatus {
    /// One entry per selected engine.
    pub runtimes: Vec<EngineStatus>,
}

impl LocalAiStatus {
    /// The engine `id`, if selected.
    pub fn engine(&self, id: &str) -> Option<&EngineStatus> {
        self.runtimes.iter().find(|engine| engine.id == id)
    }

    /// The JSON form (keys as documented; serde_json sorts them).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// The wire record of an engine described from outside the host's own slots (a
/// gateway model's): the supervisor's `snapshot` while an engine runs, else a record
/// of no engine at `url` in `state` with its `error` (`stopped`, `starting`, or
/// `error` after a failed load), serving `models`.
pub fn describe(
    runtime: Engine,
    url: String,
    snapshot: Option<&ServerSnapshot>,
    state: EngineState,
    error: Option<Value>,
    models: Vec<Value>,
) -> EngineStatus {
    let mut view = EngineView::new(runtime, url);
    match snapshot {
        Some(snapshot) => view.observe(snapshot),
        None => {
            view.state = state;
            view.error = error;
        }
    }
    view.models = models;
    view.status()
}

/// What the host holds for one engine: the supervisor's latest snapshot, and the
/// state the host reports (the snapshot's, unless the host changed it since).
#[derive(Debug, Clone)]
pub(crate) struct EngineView {
    runtime: Engine,
    url: String,
    state: EngineState,
    error: Option<Value>,
    server: Option<ServerSnapshot>,
    pub(crate) models: Vec<Value>,
}

impl EngineView {
    /// An engine not started yet, listening (later) at `url`.
    pub(crate) fn new(runtime: Engine, url: String) -> Self {
        Self {
            runtime,
            url,
            state: EngineState::Stopped,
            error: None,
            server: None,
            models: Vec::new(),
        }
    }

    /// The state the host reports.
    pub(crate) fn state(&self) -> EngineState {
        self.state
    }

    /// The listener URL (the supervisor's origin once it reported).
    pub(crate) fn url(&self) -> &str {
        self.server.as_ref().map_or(&self.url, |s| &s.url)
    }

    /// How to reach the engine: the supervisor's address and key once it reported,
    /// else the configured url.
    pub(crate) fn access(&self) -> Option<crate::upstream::EngineAccess> {
        match &self.server {
            Some(server) => server
                .address()
                .map(|address| crate::upstream::EngineAccess {
                    address,
                    key: server.api_key.clone(),
                }),
            None => crate::upstream::EngineAccess::tcp(&self.url).ok(),
        }
    }

    /// Whether Arcane owns the engine process.
    pub(crate) fn owned(&self) -> bool {
        self.server.as_ref().is_some_and(|s| s.owned)
    }

    /// Takes the supervisor's snapshot (its change passed the supervisor's table):
    /// its state and error become the host's, unless the host closed the engine.
    pub(crate) fn observe(&mut self, snapshot: &ServerSnapshot) {
        if self.state == EngineState::Closed {
            return;
        }
        self.state = snapshot.state;
        self.error = snapshot.error.clone();
        self.server = Some(snapshot.clone());
    }

    /// Applies the host's own decision through the table; a refused one changes
    /// nothing. A decision the state already records (the supervisor reported it
    /// first) confirms it. A new start clears the last error.
    pub(crate) fn apply(&mut self, change: Change) -> Result<(), InvalidTransition> {
        let confirms =
            matches!(change, Change::Failed | Change::Stopped) && self.state == change.target();
        if !confirms {
            self.state = arcane_localai::transition(self.state, change)?;
        }
        if change == Change::Start {
            self.error = None;
        }
        Ok(())
    }

    /// The host's `failed`: the start ended with `error` before it handed over an
    /// engine (or was cancelled).
    pub(crate) fn fail(&mut self, error: Value) -> Result<(), InvalidTransition> {
        self.apply(Change::Failed)?;
        self.error = Some(error);
        Ok(())
    }

    /// The wire form.
    pub(crate) fn status(&self) -> EngineStatus {
        let server = self.server.as_ref();
        EngineStatus {
            id: server.map_or_else(|| self.runtime.as_str().to_string(), |s| s.id.clone()),
            url: self.url().to_string(),
            state: self.state,
            available: self.state.is_ready(),
            owned: server.is_some_and(|s| s.owned),
            managed: server.is_some_and(|s| s.managed),
            external: server.is_some_and(|s| s.external),
            reachable_without_token: server.is_none_or(ServerSnapshot::reachable_without_token),
            key_ignored: server.is_some_and(|s| s.key_ignored),
            execution: server.and_then(|s| s.execution.clone()),
            error: self.error.clone(),
            process: server.map(|s| ProcessStatus {
                engine: s.engine.clone(),
                pid: s.pid,
                version: s.version.clone(),
                restarts: s.restarts,
                stop_step: s.stop_step.map(|step| step.name().to_string()),
                exit: s.exit.map(|exit| ExitStatus {
                    code: exit.code,
                    signal: exit.signal,
                }),
                socket: s.socket.clone(),
            }),
            models: self.models.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The wire keys are today's: before the supervisor reports, and after.
    #[test]
    fn the_wire_form_keeps_the_documented_keys() {
        let mut view = EngineView::new(Engine::LlamaCpp, "http://127.0.0.1:8080".into());
        let keys =
            |value: Value| -> Vec<String> { value.as_object().unwrap().keys().cloned().collect() };
        let before = serde_json::to_value(view.status()).unwrap();
        assert_eq!(
            keys(before.clone()),
            [
                "available",
                "error",
                "execution",
                "external",
                "id",
                "keyIgnored",
                "managed",
                "models",
                "owned",
                "reachableWithoutToken",
                "state",
                "url"
            ]
        );
        assert_eq!(before["state"], "stopped");
        let mut snapshot = ServerSnapshot::new("llama.cpp", "llama.cpp", "http://127.0.0.1:8080");
        snapshot.apply(arcane_localai::Change::Ready).unwrap();
        view.observe(&snapshot);
        let after = serde_json::to_value(view.status()).unwrap();
        assert_eq!(
            keys(after.clone()),
            [
                "available",
                "engine",
                "error",
                "execution",
                "exit",
                "external",
                "id",
                "keyIgnored",
                "managed",
                "models",
                "owned",
                "pid",
                "reachableWithoutToken",
                "restarts",
                "socket",
                "state",
                "stopStep",
                "url",
                "version"
            ]
        );
        assert_eq!(after["state"], "ready");
        assert_eq!(after["available"], true);
        // What a client parses back is what the host sent.
        let parsed: EngineStatus = serde_json::from_value(after.clone()).unwrap();
        assert_eq!(serde_json::to_value(&parsed).unwrap(), after);
        let parsed: EngineStatus = serde_json::from_value(before.clone()).unwrap();
        assert_eq!(serde_json::to_value(&parsed).unwrap(), before);
    }

    /// The host's own decisions go through the one table: a new start clears the old
    /// error; `closed` ends every change, snapshots included.
    #[test]
    fn the_host_decides_through_the_table() {
        let mut view = EngineView::new(Engine::Ollama, "http://127.0.0.1:11434".into());
        view.apply(Change::Start).unwrap();
        view.fail(json!({"message": "boom"})).unwrap();
        assert_eq!(view.status().error_message(), Some("boom"));
        view.apply(Change::Start).unwrap();
        assert_eq!(view.status().error, None);
        view.apply(Change::Close).unwrap();
        let status = view.status();
        assert_eq!(status.state, EngineState::Closed);
        assert!(!status.available);
        assert_eq!(serde_json::to_value(status).unwrap()["state"], "closed");
        // Nothing reopens a closed engine: not the host, not a late snapshot.
        let refused = view.apply(Change::Start).unwrap_err();
        assert_eq!(refused.from, EngineState::Closed);
        assert_eq!(
            refused.to_string(),
            "invalid state change `start` in state `closed`"
        );
        let mut late = ServerSnapshot::new("ollama", "ollama", "http://127.0.0.1:11434");
        late.apply(Change::Ready).unwrap();
        view.observe(&late);
        assert_eq!(view.state(), EngineState::Closed);
    }

    /// A running engine is never started a second time over itself: `start` is refused
    /// from `starting`, `loading` and `ready`, and the state stays.
    #[test]
    fn a_running_engine_cannot_be_started_again() {
        let mut view = EngineView::new(Engine::LlamaCpp, "http://127.0.0.1:8080".into());
        view.apply(Change::Start).unwrap();
        assert!(view.apply(Change::Start).is_err());
        let mut snapshot = ServerSnapshot::new("llama.cpp", "llama.cpp", "http://127.0.0.1:8080");
        snapshot.apply(Change::Ready).unwrap();
        view.observe(&snapshot);
        assert_eq!(
            view.apply(Change::Start),
            Err(InvalidTransition {
                from: EngineState::Ready,
                change: Change::Start
            })
        );
        assert_eq!(view.state(), EngineState::Ready);
        // Stopping it first (as `recover` does) allows the new start.
        view.apply(Change::Stopped).unwrap();
        view.apply(Change::Start).unwrap();
        assert_eq!(view.state(), EngineState::Starting);
    }

    /// The host's record of what the supervisor already reported confirms it: its
    /// `stopped` after the supervisor's, its `failed` (with its own record) after the
    /// supervisor's `error`. A `stopped` never stands in for a start.
    #[test]
    fn a_decision_the_supervisor_reported_first_confirms_it() {
        let mut view = EngineView::new(Engine::LlamaCpp, "http://127.0.0.1:8080".into());
        view.apply(Change::Start).unwrap();
        let mut snapshot = ServerSnapshot::new("llama.cpp", "llama.cpp", "http://127.0.0.1:8080");
        snapshot.apply(Change::Failed).unwrap();
        view.observe(&snapshot);
        view.fail(json!({"message": "the host's record"})).unwrap();
        assert_eq!(view.state(), EngineState::Error);
        assert_eq!(view.status().error_message(), Some("the host's record"));
        snapshot.apply(Change::Stopped).unwrap();
        view.observe(&snapshot);
        view.apply(Change::Stopped).unwrap();
        assert_eq!(view.state(), EngineState::Stopped);
        // From `stopped`, a failure is not a confirmation but a refused change.
        assert!(view.fail(json!({"message": "late"})).is_err());
        assert_eq!(view.state(), EngineState::Stopped);
    }

    #[test]
    fn ownership_is_said_in_words() {
        let mut status = EngineView::new(Engine::LlamaCpp, "u".into()).status();
        assert_eq!(status.ownership(), "not running");
        status.external = true;
        assert_eq!(status.ownership(), "adopted (not started by Arcane)");
        status.owned = true;
        assert_eq!(status.ownership(), "owned, no process running");
        status.process = Some(ProcessStatus {
            engine: "llama.cpp".into(),
            pid: Some(42),
            version: None,
            restarts: 0,
            stop_step: None,
            exit: None,
            socket: None,
        });
        assert_eq!(status.ownership(), "owned, pid 42");
    }
}
