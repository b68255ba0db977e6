//! Engine states, the one table of allowed state changes, and the snapshot every
//! `local-ai.server.<state>` event carries.
//!
//! One enum ([`EngineState`]) and one table ([`transition`]) serve every user: the
//! supervisor of one engine process, the host's record of each engine it selected,
//! and every model of the gateway. Each says what happened as a [`Change`]; the
//! table alone says which state that enters, or refuses it. An event names the state
//! it entered in the same words: `local-ai.server.<state>` for an engine,
//! `local-ai.model.<state>` for a gateway model ([`EngineState::event_type`]).
//!
//! # The transition table
//!
//! A server enters `starting` when its start begins (announced once, not a change).
//! A record that has no engine yet (a host's slot, a gateway model) begins `stopped`.
//!
//! | from \ change | start | spawned | loading | ready | failed | gave-up | stop | stopped | close |
//! |---|---|---|---|---|---|---|---|---|---|
//! | `stopped` | `starting` | — | — | — | — | — | — | — | `closed` |
//! | `starting` | — | `starting` | `loading` | `ready` | `error` | — | — | `stopped` | `closed` |
//! | `loading` | — | — | — | `ready` | `error` | — | — | `stopped` | `closed` |
//! | `ready` | — | — | — | — | `error` | — | `stopping` | `stopped` | `closed` |
//! | `stopping` | — | — | — | — | — | — | — | `stopped` | `closed` |
//! | `error` | `starting` | `starting` | — | — | — | `error` | `stopping` | `stopped` | `closed` |
//! | `closed` | — | — | — | — | — | — | — | — | — |
//!
//! * `start` begins a new start (a first load, `recover`, a load after an unload):
//!   never while an engine starts, runs or stops, so one record has one engine.
//! * `starting → starting` happens once per owned process: the start was announced
//!   while probing, and `spawned` says Arcane now owns a process (`owned: true`, `pid`).
//! * `error → starting` by `spawned` is a restart after a crash (`--restart
//!   on-failure`); by `start`, a new start after a failed one.
//! * `error → error` is allowed for one change only, `gave-up`: the restart policy is
//!   exhausted, and that final `error` says so ("gave up restarting …").
//! * `stop` begins stopping a running engine, or the remains of a crashed one; while
//!   `stopping` nothing new starts, and only `stopped` (or `close`) follows.
//! * `closed` is terminal: the host disposed of the engine while shutting down.

use arcane_report::event_types;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::process::{ExitInfo, StopStep};

/// The state of an engine, or of a gateway model (whose engine it describes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineState {
    /// No engine runs: never started, stopped (owned), released (adopted) or unloaded.
    Stopped,
    /// Probing, or an owned engine was started and is not answering yet.
    Starting,
    /// The engine answers `503 Loading model`.
    Loading,
    /// The engine answers its readiness probe; requests may be sent.
    Ready,
    /// The engine is being stopped; nothing new starts until it is down.
    Stopping,
    /// Starting failed, or the engine crashed; the record's `error` says why.
    Error,
    /// The host disposed of the engine while shutting down, for good.
    Closed,
}

/// Whose state an event announces: `local-ai.server.<state>` or `local-ai.model.<state>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// One engine process (the supervisor's snapshot).
    Server,
    /// One model of the gateway.
    Model,
}

impl EngineState {
    /// Every state, for tables and tests.
    pub const ALL: [EngineState; 7] = [
        EngineState::Stopped,
        EngineState::Starting,
        EngineState::Loading,
        EngineState::Ready,
        EngineState::Stopping,
        EngineState::Error,
        EngineState::Closed,
    ];

    /// `stopped`, `starting`, `loading`, `ready`, `stopping`, `error` or `closed`.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineState::Stopped => "stopped",
            EngineState::Starting => "starting",
            EngineState::Loading => "loading",
            EngineState::Ready => "ready",
            EngineState::Stopping => "stopping",
            EngineState::Error => "error",
            EngineState::Closed => "closed",
        }
    }

    /// The event type published on entering this state: `local-ai.<subject>.<state>`.
    pub fn event_type(self, subject: Subject) -> &'static str {
        use event_types as e;
        let [server, model] = match self {
            EngineState::Stopped => [e::LOCAL_AI_SERVER_STOPPED, e::LOCAL_AI_MODEL_STOPPED],
            EngineState::Starting => [e::LOCAL_AI_SERVER_STARTING, e::LOCAL_AI_MODEL_STARTING],
            EngineState::Loading => [e::LOCAL_AI_SERVER_LOADING, e::LOCAL_AI_MODEL_LOADING],
            EngineState::Ready => [e::LOCAL_AI_SERVER_READY, e::LOCAL_AI_MODEL_READY],
            EngineState::Stopping => [e::LOCAL_AI_SERVER_STOPPING, e::LOCAL_AI_MODEL_STOPPING],
            EngineState::Error => [e::LOCAL_AI_SERVER_ERROR, e::LOCAL_AI_MODEL_ERROR],
            EngineState::Closed => [e::LOCAL_AI_SERVER_CLOSED, e::LOCAL_AI_MODEL_CLOSED],
        };
        match subject {
            Subject::Server => server,
            Subject::Model => model,
        }
    }

    /// Whether the engine answers requests.
    pub fn is_ready(self) -> bool {
        self == EngineState::Ready
    }

    /// Whether the current start has settled (ready, failed, stopped or closed): a
    /// request that needs the engine stops waiting. `stopping` has not: what follows
    /// it is `stopped`, and then a new start.
    pub fn is_settled(self) -> bool {
        !matches!(
            self,
            EngineState::Starting | EngineState::Loading | EngineState::Stopping
        )
    }

    /// Whether an engine holds (or is about to hold) its device: starting, loading,
    /// ready or stopping.
    pub fn occupies(self) -> bool {
        matches!(
            self,
            EngineState::Starting
                | EngineState::Loading
                | EngineState::Ready
                | EngineState::Stopping
        )
    }

    /// Seconds after which a retry may succeed: only while it starts, loads or stops.
    pub fn retry_after(self) -> Option<u64> {
        (!self.is_settled()).then_some(2)
    }
}

impl std::fmt::Display for EngineState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One change of a state: what happened, which decides the state it enters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A new start begins (a first load, a restart asked for): `starting`.
    Start,
    /// An owned engine process was spawned (first launch or restart): `starting`.
    Spawned,
    /// The engine answers `503 Loading model`: `loading`.
    Loading,
    /// The engine answers its readiness probe: `ready`.
    Ready,
    /// Starting failed, or the engine crashed: `error`.
    Failed,
    /// The restart policy is exhausted after a crash: the final `error`, saying so.
    GaveUp,
    /// Stopping a running (or crashed) engine begins: `stopping`.
    Stop,
    /// Stopped (owned), released (adopted) or cancelled while starting: `stopped`.
    Stopped,
    /// The host disposed of the engine while shutting down: `closed`.
    Close,
}

impl Change {
    /// Every change, for tables and tests.
    pub const ALL: [Change; 9] = [
        Change::Start,
        Change::Spawned,
        Change::Loading,
        Change::Ready,
        Change::Failed,
        Change::GaveUp,
        Change::Stop,
        Change::Stopped,
        Change::Close,
    ];

    /// The state this change enters.
    pub fn target(self) -> EngineState {
        match self {
            Change::Start | Change::Spawned => EngineState::Starting,
            Change::Loading => EngineState::Loading,
            Change::Ready => EngineState::Ready,
            Change::Failed | Change::GaveUp => EngineState::Error,
            Change::Stop => EngineState::Stopping,
            Change::Stopped => EngineState::Stopped,
            Change::Close => EngineState::Closed,
        }
    }

    /// `start`, `spawned`, `loading`, `ready`, `failed`, `gave-up`, `stop`, `stopped`
    /// or `close`.
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Start => "start",
            Change::Spawned => "spawned",
            Change::Loading => "loading",
            Change::Ready => "ready",
            Change::Failed => "failed",
            Change::GaveUp => "gave-up",
            Change::Stop => "stop",
            Change::Stopped => "stopped",
            Change::Close => "close",
        }
    }
}

/// A state change the table does not allow: a bug in the caller, refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid state change `{}` in state `{}`", .change.as_str(), .from.as_str())]
pub struct InvalidTransition {
    /// The state it was in (and stays in).
    pub from: EngineState,
    /// The change that was asked for.
    pub change: Change,
}

/// The one table of allowed state changes (see the module documentation): the state
/// `change` enters from `from`, or the refusal.
pub fn transition(from: EngineState, change: Change) -> Result<EngineState, InvalidTransition> {
    use EngineState::{Error, Loading, Ready, Starting, Stopped, Stopping};
    let allowed = match change {
        Change::Start => matches!(from, Stopped | Error),
        Change::Spawned => matches!(from, Starting | Error),
        Change::Loading => matches!(from, Starting),
        Change::Ready => matches!(from, Starting | Loading),
        Change::Failed => matches!(from, Starting | Loading | Ready),
        Change::GaveUp => matches!(from, Error),
        Change::Stop => matches!(from, Ready | Error),
        Change::Stopped => matches!(from, Starting | Loading | Ready | Stopping | Error),
        Change::Close => from != EngineState::Closed,
    };
    if allowed {
        Ok(change.target())
    } else {
        Err(InvalidTransition { from, change })
    }
}

/// Whether some allowed change leads from `from` to `to` (the table seen as state pairs).
pub fn is_valid_transition(from: EngineState, to: EngineState) -> bool {
    Change::ALL
        .iter()
        .any(|change| transition(from, *change) == Ok(to))
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
    /// Where the engine answers: the url's origin (`http://127.0.0.1:8080`), or
    /// `unix:<socket path>` for an owned engine on its private socket.
    pub url: String,
    /// The Unix socket an owned engine listens on (none: a TCP port).
    pub socket: Option<std::path::PathBuf>,
    /// The key an owned engine on a TCP port demands; never serialized (the Core adds
    /// it to the requests it forwards).
    #[serde(skip)]
    pub api_key: Option<crate::endpoint::ApiKey>,
    /// An owned `command` server behind a key answered `GET /v1/models` without it
    /// once ready: it ignores its key, so anyone on this machine reaches it without
    /// the Core's token.
    pub key_ignored: bool,
    /// The state.
    pub state: EngineState,
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
    /// The snapshot of a server whose start was just announced: `starting`, not owned,
    /// nothing known yet.
    pub fn new(id: &str, engine: &str, url: &str) -> Self {
        Self {
            id: id.into(),
            engine: engine.into(),
            url: url.into(),
            socket: None,
            api_key: None,
            key_ignored: false,
            state: EngineState::Starting,
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

    /// Where the engine answers ([`ServerSnapshot::url`] as an address), or `None`
    /// when the url does not parse.
    pub fn address(&self) -> Option<crate::endpoint::EngineAddress> {
        use crate::endpoint::{Endpoint, EngineAddress};
        match &self.socket {
            Some(socket) => Some(EngineAddress::Unix(socket.clone())),
            None => Endpoint::parse(&self.url).ok().map(EngineAddress::Tcp),
        }
    }

    /// Whether a local process or a web page could use the engine without the Core's
    /// token: yes for an adopted server (not Arcane's to secure) and for a TCP port
    /// without a key (Ollama), or one that ignores its key ([`Self::key_ignored`]); no
    /// for an owned engine on its private socket or behind a key it honours.
    pub fn reachable_without_token(&self) -> bool {
        self.key_ignored || !(self.owned && (self.socket.is_some() || self.api_key.is_some()))
    }

    /// Applies `change` through the table ([`transition`]): the new `state`, `available`,
    /// and `error` / `stopStep` cleared outside the one state they belong to. A refused
    /// change leaves the snapshot untouched.
    pub fn apply(&mut self, change: Change) -> Result<EngineState, InvalidTransition> {
        let state = transition(self.state, change)?;
        if state != EngineState::Error {
            self.error = None;
        }
        if state != EngineState::Stopped {
            self.stop_step = None;
        }
        self.state = state;
        self.available = state.is_ready();
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use EngineState::{Closed, Error, Loading, Ready, Starting, Stopped, Stopping};

    fn state_named(name: &str) -> Option<EngineState> {
        EngineState::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// The table in the module documentation, read cell by cell: `(from, change) ->
    /// to`, or `None` for a `—`.
    fn documented() -> Vec<(EngineState, Change, Option<EngineState>)> {
        let rows: Vec<Vec<String>> = include_str!("state.rs")
            .lines()
            .take_while(|line| line.starts_with("//!"))
            .filter_map(|line| line.strip_prefix("//! |"))
            .map(|row| {
                row.split('|')
                    .map(|c| c.trim().trim_matches('`').to_string())
                    .collect()
            })
            .collect();
        let changes: Vec<Change> = rows[0][1..]
            .iter()
            .filter(|c| !c.is_empty())
            .map(|name| {
                Change::ALL
                    .into_iter()
                    .find(|c| c.as_str() == name)
                    .unwrap()
            })
            .collect();
        assert_eq!(
            changes,
            Change::ALL,
            "the header lists every change in order"
        );
        let mut cells = Vec::new();
        for row in &rows[2..] {
            let from = state_named(&row[0]).unwrap_or_else(|| panic!("row `{}`", row[0]));
            for (change, cell) in changes.iter().zip(&row[1..]) {
                let to = (cell != "—").then(|| state_named(cell).unwrap());
                cells.push((from, *change, to));
            }
        }
        cells
    }

    #[test]
    fn the_table_is_exactly_the_documented_one() {
        let cells = documented();
        assert_eq!(cells.len(), EngineState::ALL.len() * Change::ALL.len());
        let mut allowed = 0;
        for (from, change, to) in cells {
            match to {
                Some(to) => {
                    assert_eq!(transition(from, change), Ok(to), "{from} --{change:?}-->");
                    allowed += 1;
                }
                None => assert_eq!(
                    transition(from, change),
                    Err(InvalidTransition { from, change }),
                    "{from} --{change:?}--> must be refused"
                ),
            }
        }
        assert_eq!(allowed, 24);
    }

    /// What the supervisor, the host and the gateway rely on.
    #[test]
    fn the_rules_every_user_relies_on() {
        // Nothing starts over an engine that starts, runs or stops.
        for from in [Starting, Loading, Ready, Stopping, Closed] {
            assert!(
                transition(from, Change::Start).is_err(),
                "start from {from}"
            );
        }
        // `closed` is terminal.
        for to in EngineState::ALL {
            assert!(!is_valid_transition(Closed, to), "closed -> {to}");
        }
        // `error -> error` only through `gave-up`.
        let into_error: Vec<Change> = Change::ALL
            .into_iter()
            .filter(|c| transition(Error, *c) == Ok(Error))
            .collect();
        assert_eq!(into_error, [Change::GaveUp]);
        // `stopping` only ends.
        let after_stopping: Vec<EngineState> = EngineState::ALL
            .into_iter()
            .filter(|to| is_valid_transition(Stopping, *to))
            .collect();
        assert_eq!(after_stopping, [Stopped, Closed]);
        // Only a running or crashed engine is stopped through `stopping`.
        let stoppable: Vec<EngineState> = EngineState::ALL
            .into_iter()
            .filter(|from| transition(*from, Change::Stop).is_ok())
            .collect();
        assert_eq!(stoppable, [Ready, Error]);
    }

    #[test]
    fn each_state_has_its_event_types() {
        for state in EngineState::ALL {
            assert_eq!(
                state.event_type(Subject::Server),
                format!("local-ai.server.{state}")
            );
            assert_eq!(
                state.event_type(Subject::Model),
                format!("local-ai.model.{state}")
            );
        }
    }

    #[test]
    fn a_refusal_names_the_state_and_the_change() {
        let refused = transition(Stopped, Change::Ready).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "invalid state change `ready` in state `stopped`"
        );
    }
}
