//! The host's errors: any library error boxed behind [`Diagnostic`] ([`Error`]), and
//! the host's own refusals ([`Refusal`]: a bad configuration, an unreadable file), each
//! with a stable code, the offending values and hints.

use arcane_report::{codes, Diagnostic};

/// Any library error, boxed behind [`Diagnostic`] so a caller can render its code,
/// message, details, causes and hints uniformly.
pub struct Error(pub Box<dyn Diagnostic>);

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.0.code(), self.0)
    }
}

impl<E: Diagnostic> From<E> for Error {
    fn from(error: E) -> Self {
        Error(Box::new(error))
    }
}

impl Error {
    /// The same error with one more hint: for what only the caller knows, such as a flag
    /// of the running command (a library's hints never name flags a command may lack).
    pub fn with_hint(self, hint: impl Into<String>) -> Self {
        Error(Box::new(Hinted {
            inner: self.0,
            hint: hint.into(),
        }))
    }
}

/// A diagnostic with one hint added by the caller; everything else is the inner error's.
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

/// An error raised by the host's own checks (bad settings or flag combinations,
/// unreadable configuration files), and by the CLI over it.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
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

impl Refusal {
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

impl Diagnostic for Refusal {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_added_hint_keeps_the_code_message_details_and_earlier_hints() {
        let error = Error::from(
            Refusal::new(
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
        let error = Refusal::usage("outer", serde_json::Value::Null)
            .caused_by(Cause::chain(["first", "second"]).unwrap());
        let json = arcane_report::error_json(&error);
        assert_eq!(json["causes"], serde_json::json!(["first", "second"]));
        assert!(Cause::chain(Vec::<String>::new()).is_none());
    }
}
