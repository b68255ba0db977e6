//! The crate's one error type. Every variant maps to a stable code with no `_` arm, so a
//! new variant forces a choice of code.

use std::path::PathBuf;
use std::time::Duration;

use arcane_report::{codes, Diagnostic};
use serde_json::{json, Value};

use crate::localai::EngineState;

/// Why a stdio frame could not be decoded (the SDK's `IPC_*` reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameProblem {
    /// The header block has no `Content-Length` line (`IPC_LENGTH_MISSING`).
    LengthMissing,
    /// The `Content-Length` value is not a decimal number, or appears twice with
    /// different values (`IPC_LENGTH_INVALID`).
    LengthInvalid,
    /// The input ended in the middle of a frame (`IPC_FRAME_INCOMPLETE`).
    Incomplete,
    /// The frame (or its header block) is larger than the configured limit.
    TooLarge,
    /// The body is not valid UTF-8.
    InvalidUtf8,
    /// The body is not valid JSON (valid JSON that is not an object is a frame, answered
    /// `ok:false` by the protocol layer).
    InvalidJson,
    /// An object in the body has the same key twice (`"method"` twice would let a
    /// filter and the dispatcher see different methods).
    DuplicateKey,
}

impl FrameProblem {
    /// The SDK-compatible reason string carried in `details.reason`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::LengthMissing => "IPC_LENGTH_MISSING",
            Self::LengthInvalid => "IPC_LENGTH_INVALID",
            Self::Incomplete => "IPC_FRAME_INCOMPLETE",
            Self::TooLarge => "IPC_FRAME_TOO_LARGE",
            Self::InvalidUtf8 => "IPC_INVALID_UTF8",
            Self::InvalidJson => "IPC_INVALID_JSON",
            Self::DuplicateKey => "IPC_DUPLICATE_KEY",
        }
    }
}

/// Everything that can go wrong in the Core host.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A host option or runtime selection is invalid (e.g. a runtime Arcane does not
    /// support yet).
    #[error("{message}")]
    Usage {
        /// What is wrong.
        message: String,
        /// The offending values.
        details: Value,
    },

    /// A frame could not be decoded; the transport that read it closes.
    #[error("invalid frame: {detail}")]
    Frame {
        /// Which rule the frame broke.
        problem: FrameProblem,
        /// A short description naming the offending value.
        detail: String,
    },

    /// A decoded JSON frame is not a valid `arcane/1` request or control.
    #[error("invalid `arcane/1` frame: {reason}")]
    InvalidFrame {
        /// What is missing or wrong.
        reason: String,
        /// The request id, when one could be read.
        id: Option<String>,
    },

    /// The request id is already active on this connection.
    #[error("request id `{id}` is already active on this connection")]
    RequestIdActive {
        /// The reused id.
        id: String,
    },

    /// No service provides the method.
    #[error("method `{method}` is not available")]
    MethodNotAllowed {
        /// The requested method.
        method: String,
        /// Its first dotted part.
        namespace: String,
        /// `core-namespace-unavailable` or `core-method-unavailable`.
        reason: &'static str,
    },

    /// Two services (or a service and a built-in) claim the same name or method.
    #[error("a service or method named `{name}` is already registered")]
    ServiceExists {
        /// The duplicate name.
        name: String,
    },

    /// The service owning a method failed to start or is closing.
    #[error("service `{service}` is {state}")]
    ServiceUnavailable {
        /// The service name.
        service: String,
        /// Its state (`failed`, `draining`, `closed`).
        state: String,
        /// Why it failed, as serialized by `error_json`.
        error: Option<Value>,
    },

    /// A service's `drain` or `dispose` failed during shutdown (the host closed anyway).
    #[error("{} shutdown step(s) failed", failures.len())]
    Shutdown {
        /// `{service, step, error}` for each failure.
        failures: Vec<Value>,
    },

    /// The host is draining and refuses new requests.
    #[error("the Core host is shutting down")]
    ShuttingDown,

    /// The request was cancelled (`request.cancel`, `requests.cancelAll`, a disconnect
    /// or shutdown).
    #[error("request `{id}` was cancelled")]
    Cancelled {
        /// The client's request id.
        id: String,
    },

    /// Another Core host owns this workspace.
    #[error("a Core host already serves this workspace at {url} (pid {pid})")]
    AlreadyRunning {
        /// Its URL.
        url: String,
        /// Its process id.
        pid: u32,
        /// Its endpoint file.
        endpoint_file: PathBuf,
    },

    /// The saved port is taken; the host never moves to another port.
    #[error("port {port} on `{host}` is already in use")]
    PortInUse {
        /// The loopback address.
        host: String,
        /// The saved port.
        port: u16,
        /// The file that saved it.
        saved_in: PathBuf,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },

    /// A file or socket operation failed.
    #[error("cannot {operation} `{path}`")]
    Io {
        /// What was being done (`write`, `read`, `bind`, …).
        operation: &'static str,
        /// The path or address involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A file Arcane wrote earlier (`core.json`, the saved port) is malformed.
    #[error("`{path}` is not a valid {what}")]
    InvalidRecord {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        what: &'static str,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },

    /// No Core host is running for this workspace (client commands).
    #[error("no Core host is running for workspace `{workspace}`")]
    NotRunning {
        /// The workspace root.
        workspace: PathBuf,
        /// Why the recorded one is not usable, if a record existed.
        reason: String,
    },

    /// The engine a request needs is not ready.
    #[error("engine `{runtime}` {}", engine_state_text(state))]
    EngineNotReady {
        /// `llama.cpp` or `ollama`.
        runtime: String,
        /// Why: its state, not selected, or how it failed to answer.
        state: Unready,
        /// Seconds after which a retry may succeed (loading engines).
        retry_after: Option<u64>,
    },

    /// An HTTP exchange with an engine or the Core host failed.
    #[error("request to `{url}` failed")]
    Http {
        /// The URL.
        url: String,
        /// The transport error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The engine closed its connection before its answer was complete: it crashed,
    /// was killed, or was stopped mid-request.
    #[error("the engine at `{url}` stopped before its answer was complete (it crashed or was stopped; `arcane ps` and `arcane logs` say why)")]
    EngineStopped {
        /// The engine's URL.
        url: String,
        /// The transport error (`connection closed before message completed`).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// An engine or the Core host did not answer within a deadline (see
    /// [`Deadlines`](crate::upstream::Deadlines)).
    #[error("`{url}` did not {} within {}", phase.describe(), seconds(*deadline))]
    Timeout {
        /// The URL asked.
        url: String,
        /// Which deadline passed.
        phase: TimeoutPhase,
        /// Its length.
        deadline: Duration,
        /// Who was asked.
        peer: Peer,
    },

    /// An engine answered a request with an error status.
    #[error("`{url}` answered HTTP {status}")]
    Upstream {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The body (truncated), parsed as JSON when possible.
        body: Value,
    },

    /// The Core host answered a client with an error frame. Its code is this error's
    /// code when this build knows it (else `ARCANE_OPERATION_FAILED`, with the sent code
    /// in the details), and its details, hints and causes are kept.
    #[error("{message}")]
    Remote {
        /// The code it sent.
        code: Box<str>,
        /// Its message.
        message: String,
        /// Its details.
        details: Value,
        /// Its hints.
        hints: Vec<String>,
        /// Its causes (`causes` on the wire), outermost first: why it failed, down to
        /// the system's own words (`No space left on device (os error 28)`).
        #[source]
        cause: Option<Box<arcane_report::Cause>>,
    },

    /// A library the host drives (devices, supervisor, registry) failed; its code,
    /// details and hints are kept.
    #[error("{context}")]
    Library {
        /// What the host was doing.
        context: String,
        /// The library's code.
        code: &'static str,
        /// The library's details.
        details: Value,
        /// The library's hints.
        hints: Vec<String>,
        /// The library's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Which deadline of an HTTP exchange passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutPhase {
    /// The TCP connection was not accepted in time.
    Connect,
    /// No response head came back in time.
    Head,
    /// A body (a stream) stopped sending data for longer than its idle deadline.
    Stall,
}

impl TimeoutPhase {
    /// The verb phrase the message uses (`did not … within 2 s`).
    pub fn describe(self) -> &'static str {
        match self {
            Self::Connect => "accept the connection",
            Self::Head => "answer",
            Self::Stall => "send more of its answer",
        }
    }

    /// The wire name in `details.phase`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Head => "head",
            Self::Stall => "stall",
        }
    }
}

/// Who an HTTP exchange talked to (it decides the hint of a [`Error::Timeout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A local-AI engine (llama.cpp, Ollama).
    Engine,
    /// The Core host (the CLI's client commands).
    Host,
}

impl Peer {
    /// `engine` or `host`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Engine => "engine",
            Self::Host => "host",
        }
    }
}

/// `2 s`, `0.5 s`: a duration as a person reads it.
fn seconds(duration: Duration) -> String {
    let value = duration.as_secs_f64();
    if value.fract() == 0.0 {
        format!("{value:.0} s")
    } else {
        format!("{value} s")
    }
}

impl Error {
    /// A usage error.
    pub fn usage(message: impl Into<String>, details: Value) -> Self {
        Self::Usage {
            message: message.into(),
            details,
        }
    }

    /// A frame error.
    pub fn frame(problem: FrameProblem, detail: impl Into<String>) -> Self {
        Self::Frame {
            problem,
            detail: detail.into(),
        }
    }

    /// Wraps another library's diagnostic, keeping its code.
    pub fn library(context: impl Into<String>, source: impl Diagnostic) -> Self {
        Self::Library {
            context: context.into(),
            code: source.code(),
            details: source.details(),
            hints: source.hints(),
            source: Box::new(source),
        }
    }

    /// The HTTP status this error maps to when it reaches an HTTP client directly.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::Usage { .. } | Self::InvalidFrame { .. } | Self::Frame { .. } => 400,
            Self::RequestIdActive { .. }
            | Self::ServiceExists { .. }
            | Self::AlreadyRunning { .. } => 409,
            Self::MethodNotAllowed { .. } | Self::NotRunning { .. } => 404,
            Self::ServiceUnavailable { .. } | Self::ShuttingDown | Self::EngineNotReady { .. } => {
                503
            }
            Self::Shutdown { .. } => 500,
            Self::Cancelled { .. } => 499,
            Self::Http { .. }
            | Self::EngineStopped { .. }
            | Self::Upstream { .. }
            | Self::Remote { .. } => 502,
            Self::Timeout { .. } => 504,
            Self::PortInUse { .. }
            | Self::Io { .. }
            | Self::InvalidRecord { .. }
            | Self::Library { .. } => 500,
        }
    }
}

impl Diagnostic for Error {
    fn code(&self) -> &'static str {
        match self {
            Self::Usage { .. } => codes::ARCANE_USAGE,
            Self::Frame { .. } | Self::InvalidFrame { .. } => codes::RPC_FRAME_INVALID,
            Self::RequestIdActive { .. } => codes::RPC_REQUEST_ID_ACTIVE,
            Self::MethodNotAllowed { .. } => codes::METHOD_NOT_ALLOWED,
            Self::ServiceExists { .. } => codes::ARCANE_ALREADY_EXISTS,
            Self::ServiceUnavailable { .. } => codes::CORE_SERVICE_UNAVAILABLE,
            Self::ShuttingDown => codes::CORE_SHUTTING_DOWN,
            Self::Shutdown { .. } => codes::ARCANE_OPERATION_FAILED,
            Self::Cancelled { .. } => codes::ARCANE_CANCELLED,
            Self::AlreadyRunning { .. } => codes::CORE_ALREADY_RUNNING,
            Self::PortInUse { .. } => codes::CORE_PORT_IN_USE,
            Self::Io { .. } => codes::ARCANE_IO,
            Self::InvalidRecord { .. } => codes::ARCANE_OPERATION_FAILED,
            Self::NotRunning { .. } => codes::CORE_NOT_RUNNING,
            Self::EngineNotReady { .. } => codes::LOCAL_AI_SERVER_NOT_READY,
            Self::Http { .. } => codes::ARCANE_OPERATION_FAILED,
            Self::EngineStopped { .. } => codes::LOCAL_AI_SERVER_FAILED,
            Self::Timeout { .. } => codes::CORE_TIMEOUT,
            Self::Upstream { .. } => codes::LOCAL_AI_REQUEST_FAILED,
            Self::Remote { code, .. } => {
                codes::known(code).unwrap_or(codes::ARCANE_OPERATION_FAILED)
            }
            Self::Library { code, .. } => code,
        }
    }

    fn details(&self) -> Value {
        match self {
            Self::Usage { details, .. } => details.clone(),
            Self::Frame { problem, .. } => json!({"reason": problem.reason()}),
            Self::InvalidFrame { reason, id } => json!({"reason": reason, "id": id}),
            Self::RequestIdActive { id } => json!({"id": id}),
            Self::MethodNotAllowed {
                method,
                namespace,
                reason,
            } => json!({"method": method, "namespace": namespace, "reason": reason}),
            Self::ServiceExists { name } => json!({"name": name}),
            Self::ServiceUnavailable {
                service,
                state,
                error,
            } => {
                json!({"service": service, "state": state, "error": error})
            }
            Self::ShuttingDown => json!({"reason": "CORE_CLOSING"}),
            Self::Shutdown { failures } => json!({"failures": failures}),
            Self::Cancelled { id } => json!({"id": id, "reason": "REQUEST_ABORTED"}),
            Self::AlreadyRunning {
                url,
                pid,
                endpoint_file,
            } => json!({"url": url, "pid": pid, "endpointFile": endpoint_file}),
            Self::PortInUse {
                host,
                port,
                saved_in,
                ..
            } => {
                json!({"host": host, "port": port, "savedIn": saved_in})
            }
            Self::Io {
                operation, path, ..
            } => json!({"operation": operation, "path": path}),
            Self::InvalidRecord { path, what, .. } => json!({"path": path, "what": what}),
            Self::NotRunning { workspace, reason } => {
                json!({"workspace": workspace, "reason": reason})
            }
            Self::EngineNotReady {
                runtime,
                state,
                retry_after,
            } => json!({"runtime": runtime, "state": state.to_string(), "retryAfter": retry_after}),
            Self::Http { url, .. } | Self::EngineStopped { url, .. } => json!({"url": url}),
            Self::Timeout {
                url,
                phase,
                deadline,
                peer,
            } => json!({
                "url": url,
                "phase": phase.as_str(),
                "deadlineSeconds": deadline.as_secs_f64(),
                "peer": peer.as_str(),
            }),
            Self::Upstream { url, status, body } => {
                json!({"url": url, "status": status, "body": body})
            }
            Self::Remote { code, details, .. } => match codes::known(code) {
                Some(_) => details.clone(),
                None => json!({"code": code, "details": details}),
            },
            Self::Library { details, .. } => details.clone(),
        }
    }

    fn hints(&self) -> Vec<String> {
        match self {
            Self::AlreadyRunning { .. } => vec![
                "talk to the running host (`arcane status`, `arcane chat`), or stop it before starting another".into(),
            ],
            Self::PortInUse { saved_in, .. } => vec![format!(
                "stop whatever listens on that port, or pass `--port` (the saved port lives in `{}`)",
                saved_in.display()
            )],
            Self::NotRunning { .. } => vec!["start one with `arcane serve`".into()],
            Self::EngineNotReady {
                retry_after: Some(_),
                ..
            } => vec!["the engine is loading its model; retry in a few seconds".into()],
            Self::Timeout {
                peer: Peer::Engine,
                ..
            } => vec![
                "the engine may be stopped (SIGSTOP), hung or overloaded: check its process (`arcane status` shows its pid), or restart it with `localai.services.recover`".into(),
            ],
            Self::Timeout {
                peer: Peer::Host, ..
            } => vec![
                "the Core host, or the engine it forwards to, may be stopped (SIGSTOP), hung or busy: check their processes (the host's pid is in `.arcane/core.json`), or pass a longer `--timeout SECONDS`".into(),
            ],
            Self::EngineNotReady {
                state: Unready::In(EngineState::Error | EngineState::Stopped),
                ..
            } => vec![
                "`arcane status` shows what happened to the engine".into(),
                "start it again with the `localai.services.recover` RPC, or restart `arcane serve`".into(),
            ],
            Self::Remote { hints, .. } | Self::Library { hints, .. } => hints.clone(),
            _ => Vec::new(),
        }
    }
}

/// Why an engine cannot take a request ([`Error::EngineNotReady`]). On the wire
/// (`details.state`) it is the state's name, `not selected`, or the description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unready {
    /// The runtime is not selected on this host.
    NotSelected,
    /// The engine is in this state (not `ready`).
    In(EngineState),
    /// The engine did not answer as a ready engine does; says how.
    Unanswered(String),
}

impl std::fmt::Display for Unready {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotSelected => f.write_str("not selected"),
            Self::In(state) => f.write_str(state.as_str()),
            Self::Unanswered(how) => f.write_str(how),
        }
    }
}

/// How [`Error::EngineNotReady`] words why, after "engine `id`".
fn engine_state_text(state: &Unready) -> String {
    match state {
        Unready::In(EngineState::Error) => "failed and is not serving".into(),
        Unready::In(EngineState::Stopped) => "is stopped".into(),
        Unready::In(EngineState::Starting) => "is still starting".into(),
        Unready::In(EngineState::Loading) => "is still loading its model".into(),
        Unready::In(EngineState::Stopping) => "is stopping".into(),
        Unready::NotSelected => "is not selected on this host".into(),
        other => format!("is not ready ({other})"),
    }
}

impl From<Error> for Box<dyn Diagnostic> {
    fn from(error: Error) -> Self {
        Box::new(error)
    }
}
