//! How long an idle model stays loaded: one rule for `keep_alive` in `arcane.toml` and
//! in a request body (Ollama's spelling): seconds as a number, or a duration string
//! (`"90s"`, `"5m"`, `"1h"`, `"1h30m"`); `0` unloads after each request, `-1` never.

use std::time::Duration;

use serde_json::Value;

/// The idle time before a model is unloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    /// Unload once the model has no request in flight (`0`).
    AfterEachRequest,
    /// Unload after this long without a request.
    For(Duration),
    /// Never unload for idleness (`-1`, or any negative value).
    Never,
}

impl Default for KeepAlive {
    /// Five minutes, as Ollama.
    fn default() -> Self {
        Self::For(Duration::from_secs(300))
    }
}

impl KeepAlive {
    /// From seconds (`0`: after each request; negative: never).
    pub fn from_seconds(seconds: f64) -> Result<Self, String> {
        if !seconds.is_finite() {
            return Err(format!("`{seconds}` is not a number of seconds"));
        }
        Ok(if seconds < 0.0 {
            Self::Never
        } else if seconds == 0.0 {
            Self::AfterEachRequest
        } else {
            Self::For(Duration::from_secs_f64(seconds.min(1e9)))
        })
    }

    /// From a duration string: `"300"`, `"90s"`, `"5m"`, `"1h30m"`, `"0"`, `"-1"`
    /// ([`arcane_core::duration::parse`], plus the negative "never").
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if let Ok(seconds) = text.parse::<f64>() {
            return Self::from_seconds(seconds);
        }
        if text.starts_with('-') {
            return Ok(Self::Never);
        }
        Self::from_seconds(arcane_core::duration::parse(text)?.as_secs_f64())
    }

    /// From a JSON value (a number of seconds or a duration string).
    pub fn from_json(value: &Value) -> Result<Self, String> {
        match value {
            Value::Number(n) => Self::from_seconds(n.as_f64().unwrap_or(f64::NAN)),
            Value::String(text) => Self::parse(text),
            other => Err(format!("`{other}` is not a duration")),
        }
    }

    /// Seconds for the wire (`0`, `-1`, or the duration).
    pub fn seconds(self) -> f64 {
        match self {
            Self::AfterEachRequest => 0.0,
            Self::For(duration) => duration.as_secs_f64(),
            Self::Never => -1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_duration_strings_mean_the_same() {
        let five = KeepAlive::For(Duration::from_secs(300));
        assert_eq!(KeepAlive::parse("5m"), Ok(five));
        assert_eq!(KeepAlive::parse("300"), Ok(five));
        assert_eq!(KeepAlive::from_json(&serde_json::json!(300)), Ok(five));
        assert_eq!(
            KeepAlive::parse("1h30m"),
            Ok(KeepAlive::For(Duration::from_secs(5400)))
        );
        assert_eq!(KeepAlive::parse("0"), Ok(KeepAlive::AfterEachRequest));
        assert_eq!(KeepAlive::parse("-1"), Ok(KeepAlive::Never));
        assert_eq!(
            KeepAlive::from_json(&serde_json::json!(-1)),
            Ok(KeepAlive::Never)
        );
        assert_eq!(
            KeepAlive::parse("2s"),
            Ok(KeepAlive::For(Duration::from_secs(2)))
        );
    }

    #[test]
    fn nonsense_is_refused_naming_it() {
        for text in ["", "5x", "m", "5m3", "soon"] {
            let error = KeepAlive::parse(text).unwrap_err();
            assert!(error.contains(text), "{error}");
        }
        assert!(KeepAlive::from_json(&serde_json::json!(true)).is_err());
    }
}
