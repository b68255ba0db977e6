//! The crate's one error type.

use std::path::PathBuf;

use arcane_report::{codes, Diagnostic};
use serde_json::{json, Value};

use crate::catalog::describe_origin;
use crate::resolve::{ExecutionRecord, Reason};
use crate::Backend;

/// Everything that can go wrong in catalog loading, resolution and placement checks.
///
/// Probing never fails: a missing NVML library or an unreadable device is an issue in
/// a `partial` catalog, not an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A backend name is not one of `auto`, `cpu`, `cuda`, `vulkan`, `metal`.
    #[error("unknown backend `{value}`")]
    UnknownBackend {
        /// The value as given.
        value: String,
    },

    /// An inventory file could not be read.
    #[error("cannot read the device inventory `{}`", path.display())]
    InventoryRead {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// An inventory is not JSON in the inventory format.
    #[error("the device inventory{} is not in the inventory format", describe_origin(path.as_ref()))]
    InventoryInvalid {
        /// The file, when it came from one.
        path: Option<PathBuf>,
        /// The parse error (with line and column).
        #[source]
        source: serde_json::Error,
    },

    /// An inventory parses but breaks a rule (duplicate ids, wrong schema version).
    #[error("the device inventory{} is inconsistent: {problem}", describe_origin(path.as_ref()))]
    InventoryInconsistent {
        /// The file, when it came from one.
        path: Option<PathBuf>,
        /// Which rule, with the offending value.
        problem: String,
    },

    /// A target was given but is empty.
    #[error("the execution target is empty")]
    EmptyTarget,

    /// The target names a device that is not present.
    #[error("execution target `{target}` is not available: {reason}")]
    TargetUnavailable {
        /// The requested device id.
        target: String,
        /// Why (`device-not-present`).
        reason: Reason,
        /// The execution record (`resolution: unavailable`).
        execution: Box<ExecutionRecord>,
    },

    /// The target cannot be honoured with this inventory, runtime or backend.
    #[error("execution target `{target}` is not supported: {explanation} ({reason})")]
    TargetUnsupported {
        /// The requested device id.
        target: String,
        /// Why, as a stable string.
        reason: Reason,
        /// Why, for a person.
        explanation: String,
        /// The backend the runtime was built with.
        runtime_backend: Backend,
        /// The backend the configuration asked for.
        requested_backend: Backend,
        /// The execution record.
        execution: Box<ExecutionRecord>,
    },

    /// A placement check found the engine on another GPU than the plan configured.
    #[error("the engine (pid {pid}) runs on {}, not only on the configured GPU `{configured_uuid}`", observed_uuids.iter().map(|u| format!("`{u}`")).collect::<Vec<_>>().join(", "))]
    PlacementMismatch {
        /// The engine's process id.
        pid: u32,
        /// The UUID the plan configured (`none` for a CPU target).
        configured_uuid: String,
        /// Every GPU UUID NVML lists the process on.
        observed_uuids: Vec<String>,
        /// The execution record.
        execution: Box<ExecutionRecord>,
    },
}

impl Error {
    /// The execution record a resolution or placement error carries.
    pub fn execution(&self) -> Option<&ExecutionRecord> {
        match self {
            Error::TargetUnavailable { execution, .. }
            | Error::TargetUnsupported { execution, .. }
            | Error::PlacementMismatch { execution, .. } => Some(execution),
            Error::UnknownBackend { .. }
            | Error::InventoryRead { .. }
            | Error::InventoryInvalid { .. }
            | Error::InventoryInconsistent { .. }
            | Error::EmptyTarget => None,
        }
    }

    /// The stable reason string of a resolution error (`device-not-present`, …).
    pub fn reason(&self) -> Option<Reason> {
        match self {
            Error::TargetUnavailable { reason, .. } | Error::TargetUnsupported { reason, .. } => {
                Some(*reason)
            }
            _ => None,
        }
    }
}

impl Diagnostic for Error {
    fn code(&self) -> &'static str {
        match self {
            Error::UnknownBackend { .. } => codes::ARCANE_USAGE,
            Error::InventoryRead { .. } => codes::ARCANE_IO,
            Error::InventoryInvalid { .. } => codes::ARCANE_USAGE,
            Error::InventoryInconsistent { .. } => codes::ARCANE_USAGE,
            Error::EmptyTarget => codes::ARCANE_USAGE,
            Error::TargetUnavailable { .. } => codes::LOCAL_AI_EXECUTION_TARGET_UNAVAILABLE,
            Error::TargetUnsupported { .. } => codes::LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED,
            Error::PlacementMismatch { .. } => codes::LOCAL_AI_PLACEMENT_MISMATCH,
        }
    }

    fn details(&self) -> Value {
        match self {
            Error::UnknownBackend { value } => json!({
                "value": value,
                "allowed": Backend::ALL.iter().map(|b| b.as_str()).collect::<Vec<_>>(),
            }),
            Error::InventoryRead { path, .. } => json!({"path": path}),
            Error::InventoryInvalid { path, source } => json!({
                "path": path,
                "line": source.line(),
                "column": source.column(),
            }),
            Error::InventoryInconsistent { path, problem } => {
                json!({"path": path, "problem": problem})
            }
            Error::EmptyTarget => json!({"target": ""}),
            Error::TargetUnavailable {
                target,
                reason,
                execution,
            } => json!({
                "target": target,
                "reason": reason,
                "execution": execution,
            }),
            Error::TargetUnsupported {
                target,
                reason,
                runtime_backend,
                requested_backend,
                execution,
                ..
            } => json!({
                "target": target,
                "reason": reason,
                "runtimeBackend": runtime_backend,
                "requestedBackend": requested_backend,
                "execution": execution,
            }),
            Error::PlacementMismatch {
                pid,
                configured_uuid,
                observed_uuids,
                execution,
            } => json!({
                "pid": pid,
                "configuredUuid": configured_uuid,
                "observedUuids": observed_uuids,
                "execution": execution,
            }),
        }
    }

    fn hints(&self) -> Vec<String> {
        match self {
            Error::UnknownBackend { .. } => {
                vec!["use one of `auto`, `cpu`, `cuda`, `vulkan`, `metal`".to_string()]
            }
            Error::InventoryRead { .. } => Vec::new(),
            Error::InventoryInvalid { .. } | Error::InventoryInconsistent { .. } => vec![
                "the format is documented in `docs/inventory.md`; `arcane devices --output json` writes one".to_string(),
            ],
            Error::EmptyTarget => vec!["pass a `deviceId` from `arcane devices`, or `cpu`".to_string()],
            Error::TargetUnavailable { .. } => vec![
                "run `arcane devices` to list the present devices and their ids".to_string(),
            ],
            Error::TargetUnsupported {
                reason,
                runtime_backend,
                ..
            } => match reason {
                Reason::InventoryUnavailable => vec![
                    "install the NVIDIA driver (it provides `libnvidia-ml.so.1`), or choose the target `cpu`".to_string(),
                ],
                Reason::BackendMismatch if *runtime_backend != Backend::Cuda => vec![
                    "use a runtime built with CUDA (`--runtime-backend cuda` when planning), or choose the target `cpu`".to_string(),
                ],
                Reason::BackendMismatch => {
                    vec!["request the backend `auto` or `cuda` for a GPU target, `cpu` for the CPU".to_string()]
                }
                Reason::IdentityUnresolved => vec![
                    "run `arcane devices` to see which device could not be identified".to_string(),
                ],
                _ => vec!["choose the target `cpu` or an NVIDIA GPU from `arcane devices`".to_string()],
            },
            Error::PlacementMismatch { .. } => vec![
                "stop the engine; something in its environment overrides the GPU selection".to_string(),
            ],
        }
    }
}
