//! The crate's one error type. The HTTP worker that calls this library turns an error
//! into a response by its [`code`](Error::code) alone, so every variant maps to one
//! stable code, and its message names the offending value (the text's length, the
//! speed, the path, the executable) so that the response explains itself.

use std::path::PathBuf;

use arcane_report::{codes, Diagnostic};
use serde_json::{json, Value};

/// Everything that can go wrong loading a voice, phonemizing or synthesizing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The text is empty or only whitespace.
    #[error("the text to speak is empty")]
    EmptyText,
    /// The text is longer than [`MAX_TEXT_CHARS`](crate::MAX_TEXT_CHARS).
    #[error("the text to speak is {chars} characters long; at most {max} are accepted")]
    TextTooLong {
        /// Its length in characters.
        chars: usize,
        /// The limit.
        max: usize,
    },
    /// The text's phonemes are more than
    /// [`MAX_REQUEST_PHONEMES`](crate::MAX_REQUEST_PHONEMES) (what about 14 minutes of
    /// speech at the voice's own pace holds), times the speed below speed 1.
    #[error(
        "the text makes {phonemes} phonemes; at most {max} are spoken in one request at this speed"
    )]
    TooManyPhonemes {
        /// How many the text makes.
        phonemes: usize,
        /// The limit.
        max: usize,
    },
    /// The text has nothing espeak-ng can speak (only punctuation, say).
    #[error("the text {text:?} has nothing to speak")]
    NothingToSay {
        /// The text (its first 64 characters).
        text: String,
    },
    /// `speed` is outside [`MIN_SPEED`](crate::MIN_SPEED)..=[`MAX_SPEED`](crate::MAX_SPEED)
    /// or not a number.
    #[error("speed {speed} is outside {min}..={max}")]
    BadSpeed {
        /// The speed given.
        speed: f32,
        /// The smallest accepted.
        min: f32,
        /// The largest accepted.
        max: f32,
    },
    /// An espeak-ng voice name that is not one (it would reach the command line).
    #[error("{voice:?} is not an espeak-ng voice name such as \"en-us\"")]
    BadVoiceName {
        /// The name given.
        voice: String,
    },
    /// The voice's model or its `.onnx.json` is not there.
    #[error("the Piper voice file `{}` does not exist", path.display())]
    NotFound {
        /// The missing file.
        path: PathBuf,
    },
    /// The `.onnx.json` or the ONNX graph is not a usable Piper voice.
    #[error("`{}` is not a usable Piper voice: {reason}", path.display())]
    VoiceInvalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A file could not be read.
    #[error("could not {action} `{}`: {source}", path.display())]
    Io {
        /// What was attempted.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The phonemizer could not be started (it does not exist, is not executable).
    #[error("could not start the phonemizer `{}`: {source}", executable.display())]
    PhonemizerStart {
        /// The executable.
        executable: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The phonemizer outlived its deadline and was killed.
    #[error("the phonemizer `{}` did not finish within {} ms and was killed", executable.display(), timeout_ms)]
    PhonemizerTimeout {
        /// The executable.
        executable: PathBuf,
        /// The deadline, in milliseconds.
        timeout_ms: u128,
    },
    /// The phonemizer failed or printed something unusable.
    #[error("the phonemizer `{}` failed ({reason}){}", executable.display(), stderr_suffix(stderr))]
    PhonemizerFailed {
        /// The executable.
        executable: PathBuf,
        /// How it failed (`exit code 1`, `its output is not UTF-8`).
        reason: String,
        /// What it printed on standard error (bounded).
        stderr: String,
    },
    /// The synthesis was cancelled.
    #[error("the speech synthesis was cancelled")]
    Cancelled,
    /// ONNX Runtime failed to open or run the voice.
    #[error("{context}: {message}")]
    Runtime {
        /// What was being done.
        context: String,
        /// ONNX Runtime's (or arcane-onnx's) message.
        message: String,
    },
    /// The audio could not be encoded in the format asked for.
    #[error(transparent)]
    Encode(#[from] arcane_audio::EncodeError),
}

fn stderr_suffix(stderr: &str) -> String {
    let stderr = stderr.trim();
    if stderr.is_empty() {
        String::new()
    } else {
        format!(": {stderr}")
    }
}

impl Error {
    /// The stable code of this error (one of [`arcane_report::codes`]).
    pub fn code(&self) -> &'static str {
        match self {
            Self::EmptyText
            | Self::TextTooLong { .. }
            | Self::TooManyPhonemes { .. }
            | Self::NothingToSay { .. }
            | Self::BadSpeed { .. }
            | Self::BadVoiceName { .. } => codes::ARCANE_USAGE,
            Self::NotFound { .. } => codes::ARCANE_NOT_FOUND,
            Self::VoiceInvalid { .. } => codes::LOCAL_AI_MODEL_INVALID,
            Self::Io { .. } => codes::ARCANE_IO,
            Self::PhonemizerStart { .. }
            | Self::PhonemizerTimeout { .. }
            | Self::PhonemizerFailed { .. } => codes::TTS_PHONEMIZER_FAILED,
            Self::Cancelled => codes::ARCANE_CANCELLED,
            Self::Runtime { .. } | Self::Encode(_) => codes::LOCAL_AI_SERVER_FAILED,
        }
    }

    /// An arcane-onnx error met while running or opening `context`.
    pub(crate) fn onnx(context: impl Into<String>, error: arcane_onnx::Error) -> Self {
        match error {
            arcane_onnx::Error::Cancelled => Self::Cancelled,
            arcane_onnx::Error::ModelInvalid { path, reason } => {
                Self::VoiceInvalid { path, reason }
            }
            other => Self::Runtime {
                context: context.into(),
                message: other.to_string(),
            },
        }
    }
}

impl Diagnostic for Error {
    fn code(&self) -> &'static str {
        Error::code(self)
    }

    fn details(&self) -> Value {
        match self {
            Self::EmptyText | Self::Cancelled => Value::Null,
            Self::TextTooLong { chars, max } => json!({"chars": chars, "max": max}),
            Self::TooManyPhonemes { phonemes, max } => json!({"phonemes": phonemes, "max": max}),
            Self::NothingToSay { text } => json!({"text": text}),
            Self::BadSpeed { speed, min, max } => json!({"speed": speed, "min": min, "max": max}),
            Self::BadVoiceName { voice } => json!({"voice": voice}),
            Self::NotFound { path } | Self::VoiceInvalid { path, .. } => json!({"path": path}),
            Self::Io { action, path, .. } => json!({"action": action, "path": path}),
            Self::PhonemizerStart { executable, .. } => json!({"executable": executable}),
            Self::PhonemizerTimeout {
                executable,
                timeout_ms,
            } => json!({"executable": executable, "timeoutMs": timeout_ms}),
            Self::PhonemizerFailed {
                executable, stderr, ..
            } => json!({"executable": executable, "stderr": stderr}),
            Self::Runtime { context, .. } => json!({"context": context}),
            Self::Encode(arcane_audio::EncodeError::Codec { format, .. }) => {
                json!({"format": format.as_str()})
            }
        }
    }

    fn hints(&self) -> Vec<String> {
        match self {
            Self::PhonemizerStart { .. } => {
                vec!["install espeak-ng (the Debian package `espeak-ng`) or give its path".into()]
            }
            _ => Vec::new(),
        }
    }
}
