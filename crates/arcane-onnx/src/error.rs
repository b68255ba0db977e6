//! The crate's one error type: every variant names the offending value (a path, an
//! input, the expected shape) in its message and its details, and maps to one stable
//! code.

use std::path::PathBuf;

use arcane_report::{codes, Diagnostic};
use serde_json::{json, Value};

/// Everything that can go wrong loading ONNX Runtime, opening a session, converting
/// tensors or reading `.onnx` and `.npy` files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The ONNX Runtime shared library is not there (or is not a file).
    #[error("the ONNX Runtime library `{}` is missing: {reason} (ONNX Runtime {minimum} or newer is needed)", path.display())]
    LibraryMissing {
        /// The path given.
        path: PathBuf,
        /// Why it could not be used.
        reason: String,
        /// The minimum version this build needs.
        minimum: String,
    },
    /// The library loads but is older than this build needs.
    #[error("the ONNX Runtime library `{}` is version {found}, older than the minimum {minimum}", path.display())]
    LibraryTooOld {
        /// The library.
        path: PathBuf,
        /// The version it reports.
        found: String,
        /// The minimum version this build needs.
        minimum: String,
    },
    /// The library is not ONNX Runtime (no `OrtGetApiBase`, a malformed version).
    #[error("`{}` is not a usable ONNX Runtime library: {reason} (ONNX Runtime {minimum} or newer is needed)", path.display())]
    LibraryInvalid {
        /// The library.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
        /// The minimum version this build needs.
        minimum: String,
    },
    /// The session asks for an execution provider this runtime does not have.
    #[error("execution provider `{provider}` is not available in this ONNX Runtime (available: {})", available.join(", "))]
    ProviderUnavailable {
        /// The provider asked for (`CUDAExecutionProvider`).
        provider: String,
        /// The providers the runtime has.
        available: Vec<String>,
    },
    /// A model file is not a readable ONNX model.
    #[error("`{}` is not a valid ONNX model: {reason}", path.display())]
    ModelInvalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A request is malformed (an unknown option, a missing field).
    #[error("{message}")]
    Usage {
        /// What is wrong.
        message: String,
        /// The offending values.
        details: Value,
    },
    /// A run names an input the model does not have.
    #[error("the model has no input `{name}` (inputs: {})", known.join(", "))]
    UnknownInput {
        /// The name given.
        name: String,
        /// The model's inputs.
        known: Vec<String>,
    },
    /// A run leaves out one of the model's inputs.
    #[error("input `{name}` is missing: expected {expected_type} {expected_shape}")]
    MissingInput {
        /// The input.
        name: String,
        /// Its element type.
        expected_type: String,
        /// Its shape (dynamic dimensions by name).
        expected_shape: String,
    },
    /// A run asks for an output the model does not have.
    #[error("the model has no output `{name}` (outputs: {})", known.join(", "))]
    UnknownOutput {
        /// The name given.
        name: String,
        /// The model's outputs.
        known: Vec<String>,
    },
    /// An input has the wrong element type.
    #[error("input `{name}` must be {expected} (shape {expected_shape}), not {found}")]
    WrongType {
        /// The input.
        name: String,
        /// The element type the model wants.
        expected: String,
        /// Its shape.
        expected_shape: String,
        /// The element type given.
        found: String,
    },
    /// An input has the wrong shape.
    #[error("input `{name}` must have shape {expected}, not {}", shape_text(found))]
    WrongShape {
        /// The input.
        name: String,
        /// The shape the model wants (dynamic dimensions by name).
        expected: String,
        /// The shape given.
        found: Vec<i64>,
    },
    /// An input's data does not match its type or shape.
    #[error("input `{name}`: {reason}")]
    BadData {
        /// The input (or `.npy` file).
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A model input or output has a type Arcane cannot carry in JSON.
    #[error("`{name}` has type {found}, which Arcane cannot carry (supported: float16/32/64, int8-64, uint8-64, bool, string tensors)")]
    UnsupportedType {
        /// The input or output.
        name: String,
        /// Its type.
        found: String,
    },
    /// A run was cancelled.
    #[error("the run was cancelled")]
    Cancelled,
    /// ONNX Runtime failed.
    #[error("{context}: {message}")]
    Runtime {
        /// What Arcane was doing.
        context: String,
        /// ONNX Runtime's message.
        message: String,
    },
    /// A file could not be read or written.
    #[error("could not {action} `{}`", path.display())]
    Io {
        /// What was attempted.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn shape_text(shape: &[i64]) -> String {
    let dims: Vec<String> = shape.iter().map(i64::to_string).collect();
    format!("[{}]", dims.join(", "))
}

impl Error {
    /// A usage error with details.
    pub fn usage(message: impl Into<String>, details: Value) -> Self {
        Self::Usage {
            message: message.into(),
            details,
        }
    }

    /// Wraps an ONNX Runtime error with what was being done.
    pub(crate) fn runtime(context: impl Into<String>, error: impl std::fmt::Display) -> Self {
        Self::Runtime {
            context: context.into(),
            message: error.to_string(),
        }
    }
}

impl Diagnostic for Error {
    fn code(&self) -> &'static str {
        match self {
            Self::LibraryMissing { .. }
            | Self::LibraryTooOld { .. }
            | Self::LibraryInvalid { .. } => codes::ARCANE_PREREQUISITE_MISSING,
            Self::ProviderUnavailable { .. } => codes::LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED,
            Self::ModelInvalid { .. } => codes::LOCAL_AI_MODEL_INVALID,
            Self::Usage { .. }
            | Self::UnknownInput { .. }
            | Self::MissingInput { .. }
            | Self::UnknownOutput { .. }
            | Self::WrongType { .. }
            | Self::WrongShape { .. }
            | Self::BadData { .. }
            | Self::UnsupportedType { .. } => codes::ARCANE_USAGE,
            Self::Cancelled => codes::ARCANE_CANCELLED,
            Self::Runtime { .. } => codes::ARCANE_OPERATION_FAILED,
            Self::Io { .. } => codes::ARCANE_IO,
        }
    }

    fn details(&self) -> Value {
        match self {
            Self::LibraryMissing { path, minimum, .. }
            | Self::LibraryInvalid { path, minimum, .. } => {
                json!({"path": path, "minimumVersion": minimum})
            }
            Self::LibraryTooOld {
                path,
                found,
                minimum,
            } => {
                json!({"path": path, "version": found, "minimumVersion": minimum})
            }
            Self::ProviderUnavailable {
                provider,
                available,
            } => {
                json!({"provider": provider, "available": available})
            }
            Self::ModelInvalid { path, .. } => json!({"path": path}),
            Self::Usage { details, .. } => details.clone(),
            Self::UnknownInput { name, known } => json!({"input": name, "inputs": known}),
            Self::MissingInput {
                name,
                expected_type,
                expected_shape,
            } => {
                json!({"input": name, "expectedType": expected_type, "expectedShape": expected_shape})
            }
            Self::UnknownOutput { name, known } => json!({"output": name, "outputs": known}),
            Self::WrongType {
                name,
                expected,
                expected_shape,
                found,
            } => json!({
                "input": name, "expectedType": expected, "expectedShape": expected_shape, "type": found
            }),
            Self::WrongShape {
                name,
                expected,
                found,
            } => {
                json!({"input": name, "expectedShape": expected, "shape": found})
            }
            Self::BadData { name, .. } => json!({"input": name}),
            Self::UnsupportedType { name, found } => json!({"name": name, "type": found}),
            Self::Cancelled => Value::Null,
            Self::Runtime { context, .. } => json!({"context": context}),
            Self::Io { action, path, .. } => json!({"action": action, "path": path}),
        }
    }

    fn hints(&self) -> Vec<String> {
        match self {
            Self::LibraryMissing { .. } | Self::LibraryTooOld { .. } | Self::LibraryInvalid { .. } => vec![
                "install the `onnxruntime` wheel (scripts/provision.sh does) and register its `onnxruntime/capi/libonnxruntime.so.<version>` with `arcane runtime add onnx --library PATH`".into(),
            ],
            Self::ProviderUnavailable { .. } => vec![
                "register an ONNX Runtime built with that provider (the `onnxruntime-gpu` wheel has CUDA), or choose the `cpu` target".into(),
            ],
            _ => Vec::new(),
        }
    }
}
