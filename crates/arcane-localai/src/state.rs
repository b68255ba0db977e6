//! Server states, the one table of allowed state changes, and the snapshot every
//! `local-ai.server.<state>` event carries.
//!
//! # The transition table
//!
//! A server enters `starting` when its start begins (announced once, not a change).
//! From then on every state change is one [`Change`], and [`transition`] is the only
//! place that says which are allowed:
//!
//! | from \ change | spawned | loading | ready | failed | gave-up | stopped |
//! |---|---|---|---|---|---|---|
//! | `starting` | `starting` | `loading` | `ready` | `error` | — | `stopped` |
//! | `loading` | — | — | `ready` | `error` | — | `stopped` |
//! | `ready` | — | — | — | `error` | — | `stopped` |
//! | `error` | `starting` | — | — | — | `error` | `stopped` |
//! | `stopped` | — | — | — | — | — | — |
//!
//! * `starting → starting` happens once per owned process: the start was announced
//!   while probing, and `spawned` says Arcane now owns a process (`owned: true`, `pid`).
//! * `error → starting` is a restart after a crash (`--restart on-failure`).
//! * `error → error` is allowed for one change only, `gave-up`: the restart policy is
//!   exhausted, and that final `error` says so ("gave up restarting …").
//! * `stopped` is terminal: a stopped server is never started again (a new start is a
//!   new server).

use arcane_report::event_types;
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
    /// Every state, for tables and tests.
    pub const ALL: [ServerState; 5] = [
        ServerState::Starting,
        ServerState::Loading,
        ServerState::Ready,
        ServerState::Error,
        ServerState::Stopped,
    ];

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
    pub fn event_type(self) -> &'static str {
        match self {
            ServerState::Starting => event_types::LOCAL_AI_SERVER_STARTING,
            ServerState::Loading => event_types::LOCAL_AI_SERVER_LOADING,
            ServerState::Ready => event_types::LOCAL_AI_SERVER_READY,
            ServerState::Error => event_types::LOCAL_AI_SERVER_ERROR,
            ServerState::Stopped => event_types::LOCAL_AI_SERVER_STOPPED,
        }
    }

    /// Whether the server answers requests.
    pub fn is_ready(self) -> bool {
        self == ServerState::Ready
    }

    /// Whether this start has settled: ready, failed or stopped (not starting or loading).
    pub fn is_settled(self) -> bool {
        !matches!(self, ServerState::Starting | ServerState::Loading)
    }
}

/// One change of a server's state: what happened, which decides the state it enters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
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
    /// Stopped (owned), released (adopted) or cancelled while starting: `stopped`.
    Stopped,
}

impl Change {
    /// Every change, for tables and tests.
    pub const ALL: [Change; 6] = [
        Change::Spawned,
        Change::Loading,
        Change::Ready,
        Change::Failed,
        Change::GaveUp,
        Change::Stopped,
    ];

    /// The state this change enters.
    pub fn target(self) -> ServerState {
        match self {
            Change::Spawned => ServerState::Starting,
            Change::Loading => ServerState::Loading,
            Change::Ready => ServerState::Ready,
            Change::Failed | Change::GaveUp => ServerState::Error,
            Change::Stopped => ServerState::Stopped,
        }
    }

    /// `spawned`, `loading`, `ready`, `failed`, `gave-up` or `stopped`.
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Spawned => "spawned",
            Change::Loading => "loading",
            Change::Ready => "ready",
            Change::Failed => "failed",
            Change::GaveUp => "gave-up",
            Change::Stopped => "stopped",
        }
    }
}

/// A state change the table does not allow: a bug in the caller, refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid state change `{}` of a server in state `{}`", .change.as_str(), .from.as_str())]
pub struct InvalidTransition {
    /// The state the server was in (and stays in).
    pub from: ServerState,
    /// The change that was asked for.
    pub change: Change,
}

/// The one table of allowed state changes (see the module documentation): the state
/// `change` enters from `from`, or the refusal.
pub fn transition(from: ServerState, change: Change) -> Result<ServerState, InvalidTransition> {
    use ServerState::{Error, Loading, Ready, Starting};
    let allowed = match change {
        Change::Spawned => matches!(from, Starting | Error),
        Change::Loading => matches!(from, Starting),
        Change::Ready => matches!(from, Starting | Loading),
        Change::Failed => matches!(from, Starting | Loading | Ready),
        Change::GaveUp => matches!(from, Error),
        Change::Stopped => matches!(from, Starting | Loading | Ready | Error),
    };
    if allowed {
        Ok(change.target())
    } else {
        Err(InvalidTransition { from, change })
    }
}

/// Whether some allowed change leads from `from` to `to` (the table seen as state pairs).
pub fn is_valid_transition(from: ServerState, to: ServerState) -> bool {
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
    pub fn apply(&mut self, change: Change) -> Result<ServerState, InvalidTransition> {
        let state = transition(self.state, change)?;
        if state != ServerState::Error {
            self.error = None;
        }
        if state != ServerState::Stopped {
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
    use ServerState::{Error, Loading, Ready, Starting, Stopped};

    /// Every (state, change) pair, written out: the table in the module documentation.
    #[test]
    fn the_table_allows_exactly_the_documented_changes() {
        let expected = |from: ServerState, change: Change| -> Option<ServerState> {
            match (from, change) {
                (Starting, Change::Spawned) => Some(Starting),
                (Starting, Change::Loading) => Some(Loading),
                (Starting, Change::Ready) => Some(Ready),
                (Starting, Change::Failed) => Some(Error),
                (Starting, Change::Stopped) => Some(Stopped),
                (Loading, Change::Ready) => Some(Ready),
                (Loading, Change::Failed) => Some(Error),
                (Loading, Change::Stopped) => Some(Stopped),
                (Ready, Change::Failed) => Some(Error),
                (Ready, Change::Stopped) => Some(Stopped),
                (Error, Change::Spawned) => Some(Starting),
                (Error, Change::GaveUp) => Some(Error),
                (Error, Change::Stopped) => Some(Stopped),
                _ => None,
            }
        };
        let mut allowed = 0;
        for from in ServerState::ALL {
            for change in Change::ALL {
                let got = transition(from, change);
                match expected(from, change) {
                    Some(to) => {
                        assert_eq!(got, Ok(to), "{from:?} --{change:?}-->");
                        allowed += 1;
                    }
                    None => assert_eq!(
                        got,
                        Err(InvalidTransition { from, change }),
                        "{from:?} --{change:?}--> must be refused"
                    ),
                }
            }
        }
        assert_eq!(allowed, 13);
    }

    /// Every (from, to) state pair: `stopped` is terminal, `error -> error` exists (only
    /// through `gave-up`), and no state goes back to `loading` once past it.
    #[test]
    fn every_state_pair_is_judged() {
        let pairs = |from: ServerState, to: ServerState| {
            matches!(
                (from, to),
                (Starting, Starting | Loading | Ready | Error | Stopped)
                    | (Loading, Ready | Error | Stopped)
                    | (Ready, Error | Stopped)
                    | (Error, Starting | Error | Stopped)
            )
        };
        for from in ServerState::ALL {
            for to in ServerState::ALL {
                assert_eq!(
                    is_valid_transition(from, to),
                    pairs(from, to),
                    "{from:?} -> {to:?}"
                );
            }
        }
        let into_error: Vec<Change> = Change::ALL
            .into_iter()
            .filter(|c| transition(Error, *c) == Ok(Error))
            .collect();
        assert_eq!(into_error, [Change::GaveUp]);
    }

    #[test]
    fn each_state_has_its_event_type() {
        for state in ServerState::ALL {
            assert_eq!(
                state.event_type(),
                format!("local-ai.server.{}", state.as_str())
            );
        }
    }

    #[test]
    fn a_refusal_names_the_state_and_the_change() {
        let refused = transition(Stopped, Change::Ready).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "invalid state change `ready` of a server in state `stopped`"
        );
    }
}
