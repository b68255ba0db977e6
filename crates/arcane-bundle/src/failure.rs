//! One integrity failure found while checking a bundle.

use serde::Serialize;
use serde_json::Value;

/// One thing wrong with a bundle: a stable code from [`arcane_report::codes`]
/// (`BUNDLE_*`), the bundle-relative path it concerns, a message and details.
///
/// Serialized as `{"code", "path", "message", "details"}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failure {
    /// The stable code, e.g. `BUNDLE_HASH_MISMATCH`.
    pub code: &'static str,
    /// The bundle-relative path concerned (the manifest entry as written), if any.
    pub path: Option<String>,
    /// What is wrong, for a person.
    pub message: String,
    /// The offending values (expected and actual size or digest, the reason).
    pub details: Value,
}

impl Failure {
    /// A failure about `path`.
    pub(crate) fn at(
        code: &'static str,
        path: impl Into<String>,
        message: impl Into<String>,
        details: Value,
    ) -> Self {
        Self {
            code,
            path: Some(path.into()),
            message: message.into(),
            details,
        }
    }

    /// A failure about the bundle as a whole.
    pub(crate) fn whole(code: &'static str, message: impl Into<String>, details: Value) -> Self {
        Self {
            code,
            path: None,
            message: message.into(),
            details,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{}: `{}`: {}", self.code, path, self.message),
            None => write!(f, "{}: {}", self.code, self.message),
        }
    }
}
