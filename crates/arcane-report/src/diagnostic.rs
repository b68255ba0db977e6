//! The [`Diagnostic`] trait: the common face of every library error.

use serde_json::{json, Value};

/// What every Arcane library error exposes beyond `std::error::Error`.
///
/// * [`code`](Diagnostic::code) is the stable machine code from [`crate::codes`]; the
///   CLI maps it to an exit code and clients match on it.
/// * [`details`](Diagnostic::details) carries the offending values (a path, a pid, the
///   expected and actual digests) as JSON, so machines never parse messages.
/// * [`hints`](Diagnostic::hints) are short sentences that tell a person what to do
///   next; the CLI prints them as `hint: …`.
///
/// The `Display` text says what happened, starts lowercase, has no trailing period and
/// never repeats its `source()`: renderers print the cause chain themselves.
pub trait Diagnostic: std::error::Error + Send + Sync + 'static {
    /// The stable code of this error (one of the constants in [`crate::codes`]).
    fn code(&self) -> &'static str;

    /// Structured context: the offending values, as a JSON object (or `null`).
    fn details(&self) -> Value {
        Value::Null
    }

    /// Things the user can do about it, one sentence each.
    fn hints(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Serializes a diagnostic as `{"code", "message", "details", "causes"}`, the shape the
/// CLI prints in `--output json|ndjson` and the Core host sends in error frames.
///
/// `causes` lists the `Display` of each `source()` in order, outermost first.
pub fn error_json(error: &dyn Diagnostic) -> Value {
    let mut causes = Vec::new();
    let mut source = error.source();
    while let Some(cause) = source {
        causes.push(Value::String(cause.to_string()));
        source = cause.source();
    }
    let mut value = json!({
        "code": error.code(),
        "message": error.to_string(),
        "details": error.details(),
    });
    if !causes.is_empty() {
        value["causes"] = Value::Array(causes);
    }
    let hints = error.hints();
    if !hints.is_empty() {
        value["hints"] = json!(hints);
    }
    value
}
