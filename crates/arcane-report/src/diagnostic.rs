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

/// A cause known only by its text, as [`error_json`] sent it in `causes`: the chain is
/// rebuilt so that whoever renders the error (the CLI's `caused by:` lines, the next
/// `error_json`) sees every link again, outermost first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    message: String,
    next: Option<Box<Cause>>,
}

impl Cause {
    /// The chain of `messages`, outermost first; `None` when there are none.
    pub fn chain<S: Into<String>>(messages: impl IntoIterator<Item = S>) -> Option<Self> {
        let messages: Vec<String> = messages.into_iter().map(Into::into).collect();
        messages.into_iter().rev().fold(None, |next, message| {
            Some(Cause {
                message,
                next: next.map(Box::new),
            })
        })
    }

    /// The chain in the `causes` of an error [`error_json`] serialized (`None` when it
    /// has none).
    pub fn of_error_json(error: &Value) -> Option<Self> {
        let causes = error["causes"].as_array().into_iter().flatten();
        Self::chain(causes.filter_map(Value::as_str))
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.next.as_deref().map(|c| c as _)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(Cause);

    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("outer")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    impl Diagnostic for Outer {
        fn code(&self) -> &'static str {
            crate::codes::ARCANE_IO
        }
    }

    #[test]
    fn a_sent_cause_chain_comes_back_whole_and_in_order() {
        let sent = error_json(&Outer(Cause::chain(["first", "second"]).unwrap()));
        assert_eq!(sent["causes"], json!(["first", "second"]));
        let again = error_json(&Outer(Cause::of_error_json(&sent).unwrap()));
        assert_eq!(again, sent);
        assert!(Cause::chain(Vec::<String>::new()).is_none());
        assert!(Cause::of_error_json(&json!({"message": "m"})).is_none());
    }
}
