//! The supervisor's one error type.
//!
//! Every failure of [`Supervisor::start`](crate::Supervisor::start) and of a running
//! server is one of these variants; each maps to a stable code from
//! [`arcane_report::codes`] and carries the offending values in its details (the url,
//! the port, the exit status and the last lines the engine printed).

use std::path::PathBuf;
use std::time::Duration;

use arcane_report::{codes, Diagnostic};
use serde_json::{json, Value};

/// Why a server could not be started, adopted or kept running.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid (checked before any side effect).
    #[error("invalid engine configuration: {message}")]
    Config {
        /// What is wrong, with the offending value in backticks.
        message: String,
        /// The offending field and value.
        details: Value,
    },

    /// Nothing answers at the url and no engine executable was configured to start.
    #[error("nothing answers at `{url}` and no installed `{engine}` executable was supplied")]
    ExecutableMissing {
        /// The engine id (`llama.cpp`, `ollama`).
        engine: String,
        /// The url that refused the connection.
        url: String,
    },

    /// The engine executable could not be spawned.
    #[error("could not start `{}`", executable.display())]
    Spawn {
        /// The executable.
        executable: PathBuf,
        /// The spawn failure.
        #[source]
        source: std::io::Error,
    },

    /// The engine runs on CPUs other than its `cpus` (read back from
    /// `/proc/PID/status`): it was stopped.
    #[error(
        "engine `{id}` (pid {pid}) runs on CPUs {actual}, not the {wanted} its `cpus` asks for"
    )]
    CpusNotApplied {
        /// The server id.
        id: String,
        /// Its pid.
        pid: u32,
        /// The CPUs asked for.
        wanted: String,
        /// The CPUs it may run on.
        actual: String,
    },

    /// Nothing answers at a url whose host is not loopback; such a server is never started.
    #[error("nothing answers at `{url}`, and a server on a non-loopback host is never started by Arcane")]
    NotLoopback {
        /// The url.
        url: String,
    },

    /// The url could not be reached for a reason other than a refused connection.
    #[error("could not reach `{url}`")]
    Unreachable {
        /// The url that was probed.
        url: String,
        /// The connection or protocol failure.
        #[source]
        source: std::io::Error,
    },

    /// A managed selection (device target, backend) was requested but an external server answers.
    #[error("an external `{engine}` server already answers at `{url}`; it owns its model and device selection, so `{selection}` cannot be applied")]
    ExternalSelection {
        /// The engine id.
        engine: String,
        /// The url of the external server.
        url: String,
        /// The requested selection, e.g. `device=cpu`.
        selection: String,
    },

    /// Something answered HTTP at the url, but not as the expected engine.
    #[error("another service answers at `{url}` (HTTP {status}); it is not a `{engine}` server, so nothing was started")]
    ServiceConflict {
        /// The engine id.
        engine: String,
        /// The probed url.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The body, parsed as JSON where possible.
        body: Value,
    },

    /// The port is taken by a process that is not the expected engine.
    #[error("port {port} of `{url}` is already in use by another process")]
    PortInUse {
        /// The port.
        port: u16,
        /// The url.
        url: String,
        /// How it was noticed (`bind`, `no-http-answer`, `engine-output`).
        evidence: String,
        /// The last lines the engine printed, if it was started.
        last_lines: Vec<String>,
    },

    /// The owned engine exited before it became ready.
    #[error("`{engine}` exited before it was ready ({status})")]
    ExitedEarly {
        /// The engine id.
        engine: String,
        /// `exit code N` or `signal N`.
        status: String,
        /// The exit code, if it exited normally.
        code: Option<i32>,
        /// The signal that ended it, if any.
        signal: Option<i32>,
        /// The last lines it printed.
        last_lines: Vec<String>,
    },

    /// A ready owned engine stopped answering its readiness probe: every process of it
    /// was stopped (`SIGSTOP`), or probes went unanswered while it used no CPU time
    /// (hung). It was killed so its requests fail at once instead of waiting for it.
    #[error("`{engine}` stopped answering its readiness probe ({}) and was killed", unresponsive_reason(*stopped, *misses, *interval))]
    Unresponsive {
        /// The engine id.
        engine: String,
        /// Whether its processes were stopped (`SIGSTOP`), rather than hung.
        stopped: bool,
        /// How many probes in a row went unanswered with no CPU time used.
        misses: u32,
        /// The time between two probes.
        interval: Duration,
        /// The last lines it printed.
        last_lines: Vec<String>,
    },

    /// The owned engine did not become ready within the startup timeout.
    #[error("`{engine}` was not ready after {} s", timeout.as_secs_f64())]
    StartupTimeout {
        /// The engine id.
        engine: String,
        /// The configured startup timeout.
        timeout: Duration,
        /// The last lines it printed.
        last_lines: Vec<String>,
    },

    /// A server Arcane did not start (it already answered) stayed loading for the
    /// startup timeout. Raising the timeout is rarely the answer: something else serves
    /// that URL.
    #[error("the server at `{url}`, which Arcane did not start, still answered `loading` after {} s", timeout.as_secs_f64())]
    ExternalNotReady {
        /// The engine id.
        engine: String,
        /// The url it answers on.
        url: String,
        /// The configured startup timeout.
        timeout: Duration,
    },

    /// The owned engine stayed loading without printing anything for the stall timeout.
    #[error("`{engine}` stalled while loading: no progress for {} s", stall.as_secs_f64())]
    Stalled {
        /// The engine id.
        engine: String,
        /// The configured stall timeout.
        stall: Duration,
        /// The last lines it printed.
        last_lines: Vec<String>,
    },

    /// The engine answered its readiness probe with an unexpected HTTP status.
    #[error("`{engine}` readiness at `{url}` returned HTTP {status}")]
    NotReady {
        /// The engine id.
        engine: String,
        /// The probed url.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The body, parsed as JSON where possible.
        body: Value,
        /// The last lines it printed (owned engines only).
        last_lines: Vec<String>,
    },

    /// The running engine's version does not match the requested one.
    #[error("the running `{engine}` server at `{url}` does not report the requested version `{requested}`")]
    VersionMismatch {
        /// The engine id.
        engine: String,
        /// The url.
        url: String,
        /// The requested version.
        requested: String,
        /// What the server reported, if anything.
        observed: Option<String>,
    },

    /// Device resolution failed (a target that is unsupported or unavailable).
    #[error("the execution target for `{engine}` could not be resolved")]
    Execution {
        /// The engine id.
        engine: String,
        /// The resolver's error; its code is this error's code.
        #[source]
        source: arcane_devices::Error,
    },

    /// A GPU (or other non-CPU) target for a kind that runs on the CPU only.
    #[error("`{engine}` runs on the CPU only in this build: the execution target `{device}` is refused (use `device = \"cpu\"`)")]
    TargetUnsupported {
        /// The engine id.
        engine: String,
        /// The target asked for.
        device: String,
    },

    /// The start was cancelled (Ctrl-C, SIGTERM or the cancellation token).
    #[error("starting `{engine}` was cancelled")]
    Cancelled {
        /// The engine id.
        engine: String,
    },

    /// A file operation failed.
    #[error("could not {operation} `{}`", path.display())]
    Io {
        /// What was being done (`write`, `read`, `create`).
        operation: &'static str,
        /// The path.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },

    /// A directory of ownership records (`.arcane/engines`, `.arcane/onnx-workers`) is
    /// not a physical directory of the workspace (a symbolic link, a file): no record
    /// is written there, and nothing is started.
    #[error("refusing to keep ownership records in `{}`", path.display())]
    RecordsRefused {
        /// The records directory.
        path: std::path::PathBuf,
        /// The physical-path check's error; its code is this error's code.
        #[source]
        source: arcane_lock::Error,
    },

    /// The engine's executable, or a directory above it, could be changed by another
    /// user: it is not run.
    #[error("refusing to run `{}`: {detail}", executable.display())]
    Untrusted {
        /// The executable.
        executable: std::path::PathBuf,
        /// What is wrong (path, owner, mode).
        detail: String,
        /// How to fix it.
        fix: String,
    },

    /// A `command` server started behind a key (`${API_KEY_FILE}`) answered without it,
    /// and its model requires the key (`require_key = true`): it is not served.
    #[error("`{engine}` at {url} answered `GET {path}` without its key (HTTP {status}): it ignores `${{API_KEY_FILE}}`, so anyone on this machine could use it without the Core's token")]
    KeyIgnored {
        /// The engine id.
        engine: String,
        /// Where it listens.
        url: String,
        /// The path asked without the key.
        path: String,
        /// What it answered.
        status: u16,
    },

    /// The private run directory (`.arcane/run`) or a path in it is not what Arcane
    /// made: a link, another file type, or something owned by another user.
    #[error("refusing to use `{}` for the engine's socket or key: {detail}", path.display())]
    RunDirRefused {
        /// The path refused.
        path: PathBuf,
        /// What is wrong.
        detail: String,
        /// How to fix it.
        fix: String,
    },

    /// Another process already listens on the owned engine's socket.
    #[error("something already listens on `{}`", socket.display())]
    SocketInUse {
        /// The socket path.
        socket: PathBuf,
    },

    /// Nothing answered at the url, and this configuration may only adopt.
    #[error("nothing answers at `{url}`, and Arcane cannot start `{engine}` there: {reason}")]
    CannotStart {
        /// The engine id.
        engine: String,
        /// The url probed.
        url: String,
        /// Why Arcane may not start it.
        reason: String,
    },

    /// The workspace lock guarding ownership records could not be taken.
    #[error("could not take the workspace lock to record the `{engine}` server")]
    Lock {
        /// The engine id.
        engine: String,
        /// The lock's error; its code is this error's code.
        #[source]
        source: arcane_lock::Error,
    },
}

impl Error {
    /// The last output lines attached to this error, if any.
    pub fn last_lines(&self) -> &[String] {
        match self {
            Error::PortInUse { last_lines, .. }
            | Error::ExitedEarly { last_lines, .. }
            | Error::Unresponsive { last_lines, .. }
            | Error::StartupTimeout { last_lines, .. }
            | Error::Stalled { last_lines, .. }
            | Error::NotReady { last_lines, .. } => last_lines,
            _ => &[],
        }
    }

    /// Whether this is a cancellation.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Error::Cancelled { .. })
    }

    pub(crate) fn config(message: impl Into<String>, details: Value) -> Self {
        Error::Config {
            message: message.into(),
            details,
        }
    }
}

impl Diagnostic for Error {
    fn code(&self) -> &'static str {
        match self {
            Error::Config { .. } => codes::ARCANE_USAGE,
            Error::ExecutableMissing { .. } => codes::ARCANE_PREREQUISITE_MISSING,
            Error::Spawn { .. } => codes::ARCANE_PREREQUISITE_MISSING,
            Error::CpusNotApplied { .. } => codes::LOCAL_AI_PLACEMENT_MISMATCH,
            Error::NotLoopback { .. } => codes::LOCAL_AI_SERVER_FAILED,
            Error::Unreachable { .. } => codes::LOCAL_AI_SERVER_FAILED,
            Error::ExternalSelection { .. } => codes::LOCAL_AI_EXTERNAL_SELECTION_UNSUPPORTED,
            Error::ServiceConflict { .. } => codes::LOCAL_AI_SERVICE_CONFLICT,
            Error::PortInUse { .. } => codes::LOCAL_AI_PORT_IN_USE,
            Error::ExitedEarly { .. } => codes::LOCAL_AI_SERVER_FAILED,
            Error::Unresponsive { .. } => codes::LOCAL_AI_SERVER_FAILED,
            Error::StartupTimeout { .. } => codes::LOCAL_AI_SERVER_FAILED,
            Error::ExternalNotReady { .. } => codes::LOCAL_AI_SERVER_FAILED,
            Error::Stalled { .. } => codes::LOCAL_AI_SERVER_FAILED,
            Error::NotReady { .. } => codes::LOCAL_AI_SERVER_FAILED,
            Error::VersionMismatch { .. } => codes::LOCAL_AI_VERSION_MISMATCH,
            Error::Execution { source, .. } => source.code(),
            Error::TargetUnsupported { .. } => codes::LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED,
            Error::Cancelled { .. } => codes::ARCANE_CANCELLED,
            Error::Io { .. } => codes::ARCANE_IO,
            Error::Lock { source, .. } | Error::RecordsRefused { source, .. } => source.code(),
            Error::Untrusted { .. } | Error::RunDirRefused { .. } | Error::KeyIgnored { .. } => {
                codes::ARCANE_POLICY_DENIED
            }
            Error::SocketInUse { .. } => codes::LOCAL_AI_PORT_IN_USE,
            Error::CannotStart { .. } => codes::LOCAL_AI_SERVER_FAILED,
        }
    }

    fn details(&self) -> Value {
        match self {
            Error::Config { details, .. } => details.clone(),
            Error::ExecutableMissing { engine, url } => json!({"engine": engine, "url": url}),
            Error::Spawn { executable, source } => {
                json!({"executable": executable, "error": source.to_string()})
            }
            Error::CpusNotApplied {
                id,
                pid,
                wanted,
                actual,
            } => json!({"id": id, "pid": pid, "cpus": wanted, "actual": actual}),
            Error::NotLoopback { url } => json!({"url": url}),
            Error::Unreachable { url, source } => json!({"url": url, "error": source.to_string()}),
            Error::ExternalSelection {
                engine,
                url,
                selection,
            } => json!({"engine": engine, "url": url, "selection": selection}),
            Error::ServiceConflict {
                engine,
                url,
                status,
                body,
            } => json!({"engine": engine, "url": url, "status": status, "result": body}),
            Error::PortInUse {
                port,
                url,
                evidence,
                last_lines,
            } => json!({"port": port, "url": url, "evidence": evidence, "lastLines": last_lines}),
            Error::ExitedEarly {
                engine,
                status,
                code,
                signal,
                last_lines,
            } => json!({
                "engine": engine, "status": status, "exitCode": code, "signal": signal,
                "lastLines": last_lines,
            }),
            Error::Unresponsive {
                engine,
                stopped,
                misses,
                interval,
                last_lines,
            } => json!({
                "engine": engine, "stopped": stopped, "misses": misses,
                "intervalMs": interval.as_millis() as u64, "lastLines": last_lines,
            }),
            Error::StartupTimeout {
                engine,
                timeout,
                last_lines,
            } => json!({
                "engine": engine, "timeoutMs": timeout.as_millis() as u64, "lastLines": last_lines,
            }),
            Error::ExternalNotReady {
                engine,
                url,
                timeout,
            } => json!({
                "engine": engine, "url": url, "timeoutMs": timeout.as_millis() as u64, "external": true,
            }),
            Error::Stalled {
                engine,
                stall,
                last_lines,
            } => json!({
                "engine": engine, "stallTimeoutMs": stall.as_millis() as u64, "lastLines": last_lines,
            }),
            Error::NotReady {
                engine,
                url,
                status,
                body,
                last_lines,
            } => json!({
                "engine": engine, "url": url, "status": status, "result": body, "lastLines": last_lines,
            }),
            Error::VersionMismatch {
                engine,
                url,
                requested,
                observed,
            } => {
                json!({"engine": engine, "url": url, "requested": requested, "observed": observed})
            }
            Error::TargetUnsupported { engine, device } => {
                json!({"engine": engine, "device": device, "supported": ["cpu"]})
            }
            Error::Execution { engine, source } => {
                let mut details = source.details();
                if let Value::Object(map) = &mut details {
                    map.insert("engine".into(), json!(engine));
                }
                details
            }
            Error::Cancelled { engine } => json!({"engine": engine}),
            Error::Io {
                operation, path, ..
            } => json!({"operation": operation, "path": path}),
            Error::Lock { engine, source } => {
                json!({"engine": engine, "lock": source.details()})
            }
            Error::RecordsRefused { path, source } => {
                json!({"path": path, "check": source.details()})
            }
            Error::Untrusted {
                executable, detail, ..
            } => json!({"executable": executable, "reason": "untrusted", "detail": detail}),
            Error::RunDirRefused { path, detail, .. } => json!({"path": path, "detail": detail}),
            Error::KeyIgnored {
                engine,
                url,
                path,
                status,
            } => json!({"engine": engine, "url": url, "path": path, "status": status}),
            Error::SocketInUse { socket } => json!({"socket": socket}),
            Error::CannotStart {
                engine,
                url,
                reason,
            } => json!({"engine": engine, "url": url, "reason": reason}),
        }
    }

    fn hints(&self) -> Vec<String> {
        match self {
            Error::ExecutableMissing { engine, .. } => vec![format!(
                "register one with `arcane runtime add {engine} --executable PATH`, or pass `--executable FILE`"
            )],
            Error::ExternalSelection { .. } => vec![
                "stop the external server, or drop `--device`/`--backend` to adopt it as it is".into(),
            ],
            Error::ServiceConflict { .. } | Error::PortInUse { .. } => {
                vec!["choose a free port with `--url http://127.0.0.1:PORT`".into()]
            }
            Error::StartupTimeout { .. } => {
                vec!["raise `startup_timeout` in `arcane.toml` for large models".into()]
            }
            Error::ExternalNotReady { url, .. } => vec![
                format!("something else already serves `{url}`; Arcane adopted it and never starts or stops it, so stop that server or wait until it has loaded"),
                "or run Arcane's own engine on a free address: `--url http://127.0.0.1:PORT` (`url` in `arcane.toml`)".into(),
            ],
            Error::Stalled { .. } => {
                vec!["raise `stall_timeout` in `arcane.toml` if loading is just slow".into()]
            }
            Error::Execution { source, .. } => source.hints(),
            Error::Lock { source, .. } | Error::RecordsRefused { source, .. } => source.hints(),
            Error::Untrusted { fix, .. } | Error::RunDirRefused { fix, .. } => vec![fix.clone()],
            Error::KeyIgnored { .. } => vec![
                "make the server demand the key in `${API_KEY_FILE}` (its `--api-key-file` option or the like), or listen on `${SOCKET}` instead of `${PORT}`".into(),
                "or drop `require_key` to serve it anyway, reported as reachable without the token".into(),
            ],
            Error::SocketInUse { .. } => vec![
                "another Arcane may serve this workspace: `arcane status` says; stop it first".into(),
            ],
            Error::CannotStart { .. } => vec![
                "start the server at that url first, or pass `--model ID|PATH` so Arcane can start its own".into(),
            ],
            _ => Vec::new(),
        }
    }
}

/// Why an engine was judged unresponsive, for [`Error::Unresponsive`]'s message.
fn unresponsive_reason(stopped: bool, misses: u32, interval: Duration) -> String {
    if stopped {
        "its processes are stopped (SIGSTOP)".into()
    } else {
        format!(
            "{misses} probes {} s apart, with no CPU time used",
            interval.as_secs_f64()
        )
    }
}
