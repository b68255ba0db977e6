//! The CLI's error type and the one function that maps error codes to exit codes.

use arcane_report::{codes, Diagnostic};

/// Any library error, boxed behind [`Diagnostic`] so the CLI can render its code,
/// message, details, causes and hints uniformly.
pub struct CliError(pub Box<dyn Diagnostic>);

impl std::fmt::Debug for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.0.code(), self.0)
    }
}

impl<E: Diagnostic> From<E> for CliError {
    fn from(error: E) -> Self {
        CliError(Box::new(error))
    }
}

/// An error raised by the CLI itself (bad flag combinations, unreadable config files).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CommandError {
    /// The stable code.
    pub code: &'static str,
    /// What happened.
    pub message: String,
    /// The offending values.
    pub details: serde_json::Value,
    /// What to do about it.
    pub hints: Vec<String>,
    /// The underlying cause, if any.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl CommandError {
    /// A usage error naming the offending value.
    pub fn usage(message: impl Into<String>, details: serde_json::Value) -> Self {
        Self {
            code: codes::ARCANE_USAGE,
            message: message.into(),
            details,
            hints: Vec::new(),
            source: None,
        }
    }

    /// An error with any code.
    pub fn new(code: &'static str, message: impl Into<String>, details: serde_json::Value) -> Self {
        Self {
            code,
            message: message.into(),
            details,
            hints: Vec::new(),
            source: None,
        }
    }

    /// Adds a hint.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hints.push(hint.into());
        self
    }

    /// Attaches the underlying cause.
    pub fn caused_by(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }
}

impl Diagnostic for CommandError {
    fn code(&self) -> &'static str {
        self.code
    }
    fn details(&self) -> serde_json::Value {
        self.details.clone()
    }
    fn hints(&self) -> Vec<String> {
        self.hints.clone()
    }
}

/// The exit code for an error code: 2 usage, 75 busy (EX_TEMPFAIL), 130 cancelled,
/// 1 anything else. Bundle integrity failures exit 2 as `arcane bundle verify` documents.
pub fn exit_code(code: &str) -> u8 {
    match code {
        codes::ARCANE_USAGE => 2,
        codes::ARCANE_WORKSPACE_BUSY | codes::CORE_ALREADY_RUNNING | codes::ARCANE_IN_USE => 75,
        codes::ARCANE_CANCELLED => 130,
        c if c.starts_with("BUNDLE_") => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_documented_exit_codes() {
        assert_eq!(exit_code(codes::ARCANE_USAGE), 2);
        assert_eq!(exit_code(codes::ARCANE_WORKSPACE_BUSY), 75);
        assert_eq!(exit_code(codes::ARCANE_CANCELLED), 130);
        assert_eq!(exit_code(codes::ARCANE_POLICY_DENIED), 1);
        assert_eq!(exit_code(codes::BUNDLE_HASH_MISMATCH), 2);
        for code in codes::ALL {
            assert_ne!(exit_code(code), 0, "{code} must not exit 0");
        }
    }
}
