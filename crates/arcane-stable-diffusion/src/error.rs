//! The crate's one error type: every variant has one stable code, and its message names
//! the offending value, so that the HTTP worker answers with it as it is.

use std::path::PathBuf;

use arcane_report::{codes, Diagnostic};
use serde_json::{json, Value};

/// Everything that can go wrong loading the library or a model, checking a request or
/// generating.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A request field is missing, of the wrong type or out of its bounds.
    #[error("{message}")]
    BadRequest {
        /// The field (`prompt`, `size`, `n`, …).
        field: &'static str,
        /// What is wrong, naming the value.
        message: String,
        /// The value given (shortened), and the bounds.
        details: Value,
    },
    /// The library cannot be loaded, or is not stable-diffusion.cpp's of the version
    /// this build declares.
    #[error("`{path}` is not a usable stable-diffusion.cpp library: {reason}")]
    Library {
        /// The library's path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// stable-diffusion.cpp did not load the model (its log says why).
    #[error("stable-diffusion.cpp could not load `{path}` as a diffusion model{hint}")]
    ModelInvalid {
        /// The model's path.
        path: PathBuf,
        /// A hint: what the library printed last, when anything.
        hint: String,
    },
    /// The generation stopped because its client went away.
    #[error("the generation was cancelled")]
    Cancelled,
    /// The generation failed (the child process that ran it died, or stable-diffusion.cpp
    /// gave no image).
    #[error("the generation failed: {reason}")]
    Failed {
        /// What happened.
        reason: String,
    },
    /// The operating system refused a pipe, a fork or a read.
    #[error("{action} failed: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The cause.
        source: std::io::Error,
    },
}

impl Error {
    /// A [`Error::BadRequest`] for `field`.
    pub fn bad(field: &'static str, message: impl Into<String>, details: Value) -> Error {
        Error::BadRequest {
            field,
            message: message.into(),
            details,
        }
    }

    /// The request field a [`Error::BadRequest`] is about.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            Error::BadRequest { field, .. } => Some(field),
            _ => None,
        }
    }
}

impl Diagnostic for Error {
    fn code(&self) -> &'static str {
        match self {
            Error::BadRequest { .. } => codes::ARCANE_USAGE,
            Error::Library { .. } => codes::ARCANE_PREREQUISITE_MISSING,
            Error::ModelInvalid { .. } => codes::LOCAL_AI_MODEL_INVALID,
            Error::Cancelled => codes::ARCANE_CANCELLED,
            Error::Failed { .. } => codes::LOCAL_AI_SERVER_FAILED,
            Error::Io { .. } => codes::ARCANE_IO,
        }
    }

    fn details(&self) -> Value {
        match self {
            Error::BadRequest { field, details, .. } => {
                let mut value = details.clone();
                if let Some(map) = value.as_object_mut() {
                    map.insert("field".into(), json!(field));
                }
                value
            }
            Error::Library { path, reason } => json!({"path": path, "reason": reason}),
            Error::ModelInvalid { path, .. } => json!({"path": path}),
            Error::Cancelled => json!({}),
            Error::Failed { reason } => json!({"reason": reason}),
            Error::Io { action, source } => json!({"action": action, "cause": source.to_string()}),
        }
    }
}
