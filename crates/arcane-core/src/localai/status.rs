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
//! The states are the supervisor's ([`ServerState`]) plus `closed`, and every change
//! goes through a table: what the supervisor reports was already checked by its
//! [`arcane_localai::transition`]; what the host decides itself is a [`HostChange`],
//! checked by [`host_transition`], which defers to the supervisor's table and adds
//! only what the host alone does:
//!
//! | from \ change | start | failed | stopped | close |
//! |---|---|---|---|---|
//! | `starting` | `starting` | `error` | `stopped` | `closed` |
//! | `loading` | — | `error` | `stopped` | `closed` |
//! | `ready` | — | `error` | `stopped` | `closed` |
//! | `error` | `starting` | `error` | `stopped` | `closed` |
//! | `stopped` | `starting` | — | `stopped` | `closed` |
//! | `closed` | — | — | — | `closed` |
//!
//! * `start` is a new server (a first launch, `recover`, `llama.load` after an
//!   unload): never while one runs (`loading`, `ready`), so a slot has one engine.
//! * `error → error` and `stopped → stopped`: the supervisor reported the failure or
//!   the stop first; the host's record of the same event replaces or confirms it.
//! * `closed` is terminal, and a late snapshot of a closed engine is ignored.

use arcane_localai::{Change, ServerSnapshot, ServerState};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use arcane_localai::Engine;

/// An engine's state as the host reports it: the supervisor's [`ServerState`], or
/// `closed` once the host has disposed of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineState {
    /// Probing, or an owned engine was started and is not answering yet.
    #[default]
    Starting,
    /// The engine answers `503 Loading model`.
    Loading,
    /// The engine answers; requests may be sent.
    Ready,
    /// Starting failed, or the engine crashed.
    Error,
    /// Stopped (owned) or released (adopted), e.g. by `llama.unload`.
    Stopped,
    /// The host disposed of the engine while shutting down.
    Closed,
}

impl EngineState {
    /// `starting`, `loading`, `ready`, `error`, `stopped` or `closed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Starting => ServerState::Starting.as_str(),
            Self::Loading => ServerState::Loading.as_str(),
            Self::Ready => ServerState::Ready.as_str(),
            Self::Error => ServerState::Error.as_str(),
            Self::Stopped => ServerState::Stopped.as_str(),
        }
    }

    /// Whether requests may be sent.
    pub fn is_ready(self) -> bool {
        self == Self::Ready
    }

    /// Whether the current start has settled (ready, failed, stopped or closed): a
    /// request that needs the engine stops waiting.
    pub fn is_settled(self) -> bool {
        !matches!(self, Self::Starting | Self::Loading)
    }

    /// The supervisor's state this is (`closed` is the host's alone).
    pub fn server_state(self) -> Option<ServerState> {
        match self {
            Self::Starting => Some(ServerState::Starting),
            Self::Loading => Some(ServerState::Loading),
            Self::Ready => Some(ServerState::Ready),
            Self::Error => Some(ServerState::Error),
            Self::Stopped => Some(ServerState::Stopped),
            Self::Closed => None,
        }
    }

    /// Seconds after which a retry may succeed: only while it is starting or loading.
    pub fn retry_after(self) -> Option<u64> {
        (!self.is_settled()).then_some(2)
    }
}

impl From<ServerState> for EngineState {
    fn from(state: ServerState) -> Self {
        match state {
            ServerState::Starting => Self::Starting,
            ServerState::Loading => Self::Loading,
            ServerState::Ready => Self::Ready,
            ServerState::Error => Self::Error,
            ServerState::Stopped => Self::Stopped,
        }
    }
}

impl std::fmt::Display for EngineState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A decision the host makes about an engine itself, beside what its supervisor
/// reports (the table is in the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum HostChange {
    /// A new start begins: `starting`, the last error cleared.
    Start,
    /// The start failed (or was cancelled) before it handed over an engine: `error`
    /// with this record.
    Failed(Value),
    /// The host stopped the engine (`llama.unload`): `stopped`.
    Stopped,
    /// The host disposed of the engine while shutting down: `closed`, for good.
    Close,
}

impl HostChange {
    /// `start`, `failed`, `stopped` or `close`.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Failed(_) => "failed",
            Self::Stopped => "stopped",
            Self::Close => "close",
        }
    }
}

/// A host decision the table does not allow: the state stays as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the host cannot `{change}` an engine in state `{from}`")]
pub(crate) struct RefusedChange {
    /// The state the engine was in (and stays in).
    pub from: EngineState,
    /// The change asked for ([`HostChange::as_str`]).
    pub change: &'static str,
}

/// The host's table: the state `change` enters from `from`, or the refusal.
pub(crate) fn host_transition(
    from: EngineState,
    change: &HostChange,
) -> Result<EngineState, RefusedChange> {
    let supervisor = |change: Change| {
        from.server_state()
            .is_some_and(|state| arcane_localai::transition(state, change).is_ok())
    };
    let allowed = match change {
        HostChange::Start => matches!(
            from,
            EngineState::Starting | EngineState::Error | EngineState::Stopped
        ),
        HostChange::Failed(_) => supervisor(Change::Failed) || from == EngineState::Error,
        HostChange::Stopped => supervisor(Change::Stopped) || from == EngineState::Stopped,
        HostChange::Close => true,
    };
    let to = match change {
        HostChange::Start => EngineState::Starting,
        HostChange::Failed(_) => EngineState::Error,
        HostChange::Stopped => EngineState::Stopped,
        HostChange::Close => EngineState::Closed,
    };
    if allowed {
        Ok(to)
    } else {
        Err(RefusedChange {
            from,
            change: change.as_str(),
        })
    }
}

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
            state: EngineState::Starting,
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
    pub(crate) fn access(&self) -> Option<crate::http::EngineAccess> {
        match &self.server {
            Some(server) => server.address().map(|address| crate::http::EngineAccess {
                address,
                key: server.api_key.clone(),
            }),
            None => crate::http::EngineAccess::tcp(&self.url).ok(),
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
        self.state = snapshot.state.into();
        self.error = snapshot.error.clone();
        self.server = Some(snapshot.clone());
    }

    /// Applies the host's own decision through [`host_transition`]; a refused one
    /// changes nothing. A new start clears the last error; `stopped` and `closed` keep
    /// what was known.
    pub(crate) fn apply(&mut self, change: HostChange) -> Result<(), RefusedChange> {
        self.state = host_transition(self.state, &change)?;
        match change {
            HostChange::Start => self.error = None,
            HostChange::Failed(error) => self.error = Some(error),
            HostChange::Stopped | HostChange::Close => {}
        }
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
        assert_eq!(before["state"], "starting");
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

    /// The host's own decisions go through its table: a new start clears the old
    /// error; `closed` is the host's alone and ends every change, snapshots included.
    #[test]
    fn the_host_decides_through_its_table() {
        let mut view = EngineView::new(Engine::Ollama, "http://127.0.0.1:11434".into());
        view.apply(HostChange::Failed(json!({"message": "boom"})))
            .unwrap();
        assert_eq!(view.status().error_message(), Some("boom"));
        view.apply(HostChange::Start).unwrap();
        assert_eq!(view.status().error, None);
        view.apply(HostChange::Close).unwrap();
        let status = view.status();
        assert_eq!(status.state, EngineState::Closed);
        assert!(!status.available);
        assert_eq!(serde_json::to_value(status).unwrap()["state"], "closed");
        // Nothing reopens a closed engine: not the host, not a late snapshot.
        let refused = view.apply(HostChange::Start).unwrap_err();
        assert_eq!(refused.from, EngineState::Closed);
        assert_eq!(
            refused.to_string(),
            "the host cannot `start` an engine in state `closed`"
        );
        let mut late = ServerSnapshot::new("ollama", "ollama", "http://127.0.0.1:11434");
        late.apply(Change::Ready).unwrap();
        view.observe(&late);
        assert_eq!(view.state(), EngineState::Closed);
    }

    /// A running engine is never started a second time over itself: `start` is refused
    /// from `loading` and `ready`, and the state stays.
    #[test]
    fn a_running_engine_cannot_be_started_again() {
        let mut view = EngineView::new(Engine::LlamaCpp, "http://127.0.0.1:8080".into());
        let mut snapshot = ServerSnapshot::new("llama.cpp", "llama.cpp", "http://127.0.0.1:8080");
        snapshot.apply(Change::Ready).unwrap();
        view.observe(&snapshot);
        assert_eq!(
            view.apply(HostChange::Start),
            Err(RefusedChange {
                from: EngineState::Ready,
                change: "start"
            })
        );
        assert_eq!(view.state(), EngineState::Ready);
        // Stopping it first (as `recover` does) allows the new start.
        view.apply(HostChange::Stopped).unwrap();
        view.apply(HostChange::Start).unwrap();
        assert_eq!(view.state(), EngineState::Starting);
    }

    /// Every cell of the table in the module documentation, checked against the
    /// function: the documentation cannot drift from the rule.
    #[test]
    fn the_documented_table_is_the_rule() {
        use EngineState::*;
        let changes = [
            HostChange::Start,
            HostChange::Failed(Value::Null),
            HostChange::Stopped,
            HostChange::Close,
        ];
        let rows: [(EngineState, [Option<EngineState>; 4]); 6] = [
            (
                Starting,
                [Some(Starting), Some(Error), Some(Stopped), Some(Closed)],
            ),
            (Loading, [None, Some(Error), Some(Stopped), Some(Closed)]),
            (Ready, [None, Some(Error), Some(Stopped), Some(Closed)]),
            (
                Error,
                [Some(Starting), Some(Error), Some(Stopped), Some(Closed)],
            ),
            (Stopped, [Some(Starting), None, Some(Stopped), Some(Closed)]),
            (Closed, [None, None, None, Some(Closed)]),
        ];
        for (from, expected) in rows {
            for (change, want) in changes.iter().zip(expected) {
                assert_eq!(
                    host_transition(from, change).ok(),
                    want,
                    "{from} + {}",
                    change.as_str()
                );
            }
        }
        let doc = include_str!("status.rs");
        for (from, expected) in rows {
            let cells: Vec<String> = expected
                .iter()
                .map(|to| to.map_or("—".to_string(), |to| format!("`{to}`")))
                .collect();
            let row = format!("//! | `{from}` | {} |", cells.join(" | "));
            assert!(
                doc.contains(&row),
                "the module documentation lacks the row {row}"
            );
        }
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
