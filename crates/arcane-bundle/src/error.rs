//! The crate's one error type.

use std::path::PathBuf;

use arcane_report::{codes, Diagnostic};
use serde_json::{json, Value};

use crate::failure::Failure;

/// Everything that can go wrong building, verifying or launching a bundle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file system operation failed.
    #[error("cannot {operation} `{}`", path.display())]
    Io {
        /// What was being done (`read`, `create`, `rename`, …).
        operation: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The bundle failed verification; `failures` lists every problem found.
    #[error("bundle `{}` failed verification: {}", root.display(), summary(failures))]
    Integrity {
        /// The bundle root.
        root: PathBuf,
        /// Every failure, in report order.
        failures: Vec<Failure>,
    },
    /// The operation was cancelled.
    #[error("{operation} was cancelled")]
    Cancelled {
        /// What was cancelled (`bundle build`, `bundle verify`).
        operation: &'static str,
    },
    /// `--out` already exists; bundles never overwrite an earlier output.
    #[error("output directory `{}` already exists", path.display())]
    OutputExists {
        /// The existing path.
        path: PathBuf,
    },
    /// A build input (app directory, runtime, model, option) is unusable.
    #[error("{message}")]
    InvalidInput {
        /// What is wrong.
        message: String,
        /// The offending values.
        details: Value,
        /// What to do about it.
        hint: Option<String>,
    },
    /// A launch option (launch file, state root, app entry) is unusable.
    #[error("{message}")]
    Usage {
        /// What is wrong.
        message: String,
        /// The offending values.
        details: Value,
    },
    /// The `--arcane-app-entry` path fails the path grammar or escapes `app/`.
    #[error("app entry `{entry}` is refused: it {reason}")]
    AppEntryEscapes {
        /// The entry as given.
        entry: String,
        /// Why.
        reason: String,
    },
    /// The workspace registry refused a lookup.
    #[error("cannot read the registry of workspace `{}`", workspace.display())]
    Registry {
        /// The workspace.
        workspace: PathBuf,
        /// The registry's error.
        #[source]
        source: Box<arcane_registry::Error>,
    },
    /// The workspace lock could not be taken or released.
    #[error("cannot lock workspace `{}` for `bundle build`", workspace.display())]
    Lock {
        /// The workspace.
        workspace: PathBuf,
        /// The lock's error.
        #[source]
        source: Box<arcane_lock::Error>,
    },
    /// A failed build could not remove what it created; both problems are reported.
    #[error("{original}; and the partial output `{}` could not be removed", leftover.display())]
    Cleanup {
        /// The error that made the build fail.
        original: Box<Error>,
        /// What is left behind.
        leftover: PathBuf,
        /// Why removal failed.
        #[source]
        source: std::io::Error,
    },
}

fn summary(failures: &[Failure]) -> String {
    match failures {
        [] => "no details".into(),
        [one] => one.to_string(),
        [first, rest @ ..] => format!("{first} (and {} more)", rest.len()),
    }
}

impl Error {
    pub(crate) fn io(
        operation: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::Io {
            operation,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn input(message: impl Into<String>, details: Value) -> Self {
        Error::InvalidInput {
            message: message.into(),
            details,
            hint: None,
        }
    }

    pub(crate) fn usage(message: impl Into<String>, details: Value) -> Self {
        Error::Usage {
            message: message.into(),
            details,
        }
    }

    /// The failures of an [`Error::Integrity`], else an empty slice.
    pub fn failures(&self) -> &[Failure] {
        match self {
            Error::Integrity { failures, .. } => failures,
            _ => &[],
        }
    }
}

impl Diagnostic for Error {
    fn code(&self) -> &'static str {
        match self {
            Error::Io { .. } => codes::ARCANE_IO,
            Error::Integrity { failures, .. } => failures
                .first()
                .map(|f| f.code)
                .unwrap_or(codes::BUNDLE_MANIFEST_INVALID),
            Error::Cancelled { .. } => codes::ARCANE_CANCELLED,
            Error::OutputExists { .. } => codes::ARCANE_ALREADY_EXISTS,
            Error::InvalidInput { .. } => codes::ARCANE_USAGE,
            Error::Usage { .. } => codes::ARCANE_USAGE,
            Error::AppEntryEscapes { .. } => codes::BUNDLE_PATH_INVALID,
            Error::Registry { source, .. } => source.code(),
            Error::Lock { source, .. } => source.code(),
            Error::Cleanup { original, .. } => original.code(),
        }
    }

    fn details(&self) -> Value {
        match self {
            Error::Io {
                operation, path, ..
            } => json!({"operation": operation, "path": path}),
            Error::Integrity { root, failures } => json!({"root": root, "failures": failures}),
            Error::Cancelled { operation } => json!({"operation": operation}),
            Error::OutputExists { path } => json!({"path": path}),
            Error::InvalidInput { details, .. } => details.clone(),
            Error::Usage { details, .. } => details.clone(),
            Error::AppEntryEscapes { entry, reason } => json!({"entry": entry, "reason": reason}),
            Error::Registry { workspace, source } => {
                json!({"workspace": workspace, "registry": source.details()})
            }
            Error::Lock { workspace, source } => {
                json!({"workspace": workspace, "lock": source.details()})
            }
            Error::Cleanup {
                original, leftover, ..
            } => {
                json!({"leftover": leftover, "original": original.details(), "originalCode": original.code()})
            }
        }
    }

    fn hints(&self) -> Vec<String> {
        match self {
            Error::OutputExists { .. } => vec!["choose a new `--out` directory; bundles never overwrite an earlier build".into()],
            Error::Integrity { .. } => vec!["rebuild the bundle or copy it again from a trusted source; run `arcane bundle verify DIR` for the full list".into()],
            Error::InvalidInput { hint: Some(hint), .. } => vec![hint.clone()],
            Error::Registry { source, .. } => source.hints(),
            Error::Lock { source, .. } => source.hints(),
            Error::Cleanup { leftover, .. } => vec![format!("remove `{}` by hand", leftover.display())],
            _ => Vec::new(),
        }
    }
}
