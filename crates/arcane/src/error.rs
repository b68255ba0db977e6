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

impl CliError {
    /// The same error with one more hint: for what only the CLI knows, such as a flag
    /// of the running command (a library's hints never name flags a command may lack).
    pub fn with_hint(self, hint: impl Into<String>) -> Self {
        CliError(Box::new(Hinted {
            inner: self.0,
            hint: hint.into(),
        }))
    }
}

/// A diagnostic with one hint added by the CLI; everything else is the inner error's.
struct Hinted {
    inner: Box<dyn Diagnostic>,
    hint: String,
}

impl std::fmt::Debug for Hinted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} (hint: {})", self.inner, self.hint)
    }
}

impl std::fmt::Display for Hinted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl std::error::Error for Hinted {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner.source()
    }
}

impl Diagnostic for Hinted {
    fn code(&self) -> &'static str {
        self.inner.code()
    }
    fn details(&self) -> serde_json::Value {
        self.inner.details()
    }
    fn hints(&self) -> Vec<String> {
        let mut hints = self.inner.hints();
        hints.push(self.hint.clone());
        hints
    }
}

/// A cause known only by its text (as `error_json` sent it in `causes`).
pub use arcane_report::Cause;

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

/// The exit code for an error code: 2 usage (and a named workspace that does not
/// exist), 75 busy (EX_TEMPFAIL), 130 cancelled,
/// 1 anything else. Bundle integrity failures exit 2 as `arcane bundle verify` documents.
pub fn exit_code(code: &str) -> u8 {
    match code {
        codes::ARCANE_USAGE | codes::ARCANE_WORKSPACE_NOT_FOUND => 2,
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
    fn an_added_hint_keeps_the_code_message_details_and_earlier_hints() {
        let error = CliError::from(
            CommandError::new(
                codes::ARCANE_WORKSPACE_BUSY,
                "busy",
                serde_json::json!({"a": 1}),
            )
            .hint("first"),
        )
        .with_hint("second");
        assert_eq!(error.0.code(), codes::ARCANE_WORKSPACE_BUSY);
        assert_eq!(error.0.to_string(), "busy");
        assert_eq!(error.0.details(), serde_json::json!({"a": 1}));
        assert_eq!(error.0.hints(), ["first", "second"]);
    }

    #[test]
    fn a_cause_chain_keeps_its_order() {
        let error = CommandError::usage("outer", serde_json::Value::Null)
            .caused_by(Cause::chain(["first", "second"]).unwrap());
        let json = arcane_report::error_json(&error);
        assert_eq!(json["causes"], serde_json::json!(["first", "second"]));
        assert!(Cause::chain(Vec::<String>::new()).is_none());
    }

    #[test]
    fn codes_map_to_documented_exit_codes() {
        assert_eq!(exit_code(codes::ARCANE_USAGE), 2);
        assert_eq!(exit_code(codes::ARCANE_WORKSPACE_NOT_FOUND), 2);
        assert_eq!(exit_code(codes::ARCANE_WORKSPACE_BUSY), 75);
        assert_eq!(exit_code(codes::ARCANE_CANCELLED), 130);
        assert_eq!(exit_code(codes::ARCANE_POLICY_DENIED), 1);
        assert_eq!(exit_code(codes::BUNDLE_HASH_MISMATCH), 2);
        for code in codes::ALL {
            assert_ne!(exit_code(code), 0, "{code} must not exit 0");
        }
    }
}
