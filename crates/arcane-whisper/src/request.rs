//! One transcription request from OpenAI's multipart fields, checked: the file, and
//! `language`, `prompt`, `response_format`, `temperature`, `timestamp_granularities[]`
//! and `stream` (`model` is the gateway's; other fields are ignored). A bad value is a
//! [`RequestError`] naming the field and the value (its first [`SHOWN_CHARS`]
//! characters when it is longer).
//!
//! Every text field is bounded before it reaches whisper.cpp, whose tokenizer recurses
//! per character of the prompt (an 8 KB prompt overflowed the worker's stack):
//! `prompt` to [`MAX_PROMPT_BYTES`] (whisper.cpp keeps at most half of the model's
//! 448-token text context, 224 tokens, of a prompt; 4 bytes a token is what English
//! averages), `language` to a code whisper.cpp knows (at most [`MAX_LANGUAGE_BYTES`]),
//! every other field to [`MAX_FIELD_BYTES`], and `timestamp_granularities[]` to
//! [`MAX_GRANULARITIES`] values.

use crate::format::ResponseFormat;
use crate::transcribe::{Options, Task};

/// The longest `prompt`, in bytes: 224 tokens (what whisper.cpp keeps of a prompt,
/// half its 448-token text context) at 4 bytes each.
pub const MAX_PROMPT_BYTES: usize = 896;

/// The longest `language`, in bytes (whisper.cpp also knows names: `haitian creole`).
pub const MAX_LANGUAGE_BYTES: usize = 32;

/// The longest value of any other text field, in bytes (the gateway's bound on
/// `model`).
pub const MAX_FIELD_BYTES: usize = 4096;

/// The most `timestamp_granularities[]` values (there are two kinds).
pub const MAX_GRANULARITIES: usize = 4;

/// How much of an offending value an error shows, in characters.
pub const SHOWN_CHARS: usize = 64;

/// A checked request.
#[derive(Debug, Clone)]
pub struct Upload {
    /// The uploaded file's bytes.
    pub file: Vec<u8>,
    /// Its name as the client sent it, if any.
    pub file_name: Option<String>,
    /// What whisper.cpp is asked to do.
    pub options: Options,
    /// The answer's format.
    pub format: ResponseFormat,
    /// Whether the text is sent as it is decoded (`stream=true`: OpenAI's
    /// `transcript.text.delta` events), with `json` or `text` only.
    pub stream: bool,
}

/// Why a request's fields are refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    /// A required field is missing.
    #[error("the field `{field}` is required")]
    Missing {
        /// The field.
        field: &'static str,
    },
    /// A field's value is longer than its bound.
    #[error("the field `{name}` is {size} bytes long; at most {limit} are accepted")]
    TooLong {
        /// The field (`other` for one this worker does not read).
        field: &'static str,
        /// Its name as sent (its first [`SHOWN_CHARS`] characters).
        name: String,
        /// Its size in bytes.
        size: usize,
        /// The bound.
        limit: usize,
    },
    /// A field's value is not one accepted.
    #[error("`{value}` is not a valid `{field}`: {expected}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// The value sent.
        value: String,
        /// What is accepted.
        expected: String,
    },
}

impl RequestError {
    /// The field at fault.
    pub fn field(&self) -> &'static str {
        match self {
            Self::Missing { field } | Self::TooLong { field, .. } | Self::Invalid { field, .. } => {
                field
            }
        }
    }
}

/// One multipart field: its name, file name and bytes.
#[derive(Debug, Clone, Copy)]
pub struct Field<'a> {
    /// The field's name.
    pub name: &'a str,
    /// The file name of a file part.
    pub file_name: Option<&'a str>,
    /// Its bytes.
    pub data: &'a [u8],
}

/// `value`, or its first [`SHOWN_CHARS`] characters and an ellipsis.
pub fn shown(value: &str) -> String {
    match value.char_indices().nth(SHOWN_CHARS) {
        Some((at, _)) => format!("{}…", &value[..at]),
        None => value.to_string(),
    }
}

/// The bound on the field `name` (a file has none here: the audio bounds it).
fn limit(name: &str) -> usize {
    match name {
        "prompt" => MAX_PROMPT_BYTES,
        "language" => MAX_LANGUAGE_BYTES,
        _ => MAX_FIELD_BYTES,
    }
}

/// The field's text, trimmed, once its size is within its bound.
fn text<'a>(field: &'static str, data: &'a [u8]) -> Result<&'a str, RequestError> {
    if data.len() > limit(field) {
        return Err(RequestError::TooLong {
            field,
            name: field.to_string(),
            size: data.len(),
            limit: limit(field),
        });
    }
    std::str::from_utf8(data)
        .map(str::trim)
        .map_err(|_| RequestError::Invalid {
            field,
            value: shown(&String::from_utf8_lossy(data)),
            expected: "text in UTF-8".into(),
        })
}

fn invalid(field: &'static str, value: &str, expected: &str) -> RequestError {
    RequestError::Invalid {
        field,
        value: shown(value),
        expected: expected.to_string(),
    }
}

/// A language whisper.cpp knows (a code such as `en`, or a name), lowercased.
fn language(value: &str) -> Result<Option<String>, RequestError> {
    if value.is_empty() {
        return Ok(None);
    }
    let code = value.to_ascii_lowercase();
    if whisper_rs::get_lang_id(&code).is_none() {
        return Err(invalid(
            "language",
            value,
            "a language whisper knows, as an ISO-639-1 code such as `en`",
        ));
    }
    Ok(Some(code))
}

/// Reads `fields` as a request for `task`.
pub fn upload<'a>(
    fields: impl IntoIterator<Item = Field<'a>>,
    task: Task,
) -> Result<Upload, RequestError> {
    let mut file = None;
    let mut options = Options {
        task,
        ..Options::default()
    };
    let mut format = ResponseFormat::Json;
    let mut granularities = Vec::new();
    let mut stream = false;
    for field in fields {
        match field.name {
            "file" => file = Some((field.data.to_vec(), field.file_name.map(str::to_string))),
            "language" if task == Task::Translate => {
                return Err(invalid(
                    "language",
                    text("language", field.data)?,
                    "a translation is always into English; `language` applies to transcriptions",
                ))
            }
            "language" => options.language = language(text("language", field.data)?)?,
            "prompt" => {
                let value = text("prompt", field.data)?;
                options.prompt = (!value.is_empty()).then(|| value.to_string());
            }
            "response_format" => {
                let value = text("response_format", field.data)?;
                format = ResponseFormat::parse(value).ok_or_else(|| {
                    invalid(
                        "response_format",
                        value,
                        &format!("one of {}", ResponseFormat::NAMES.join(", ")),
                    )
                })?;
            }
            "temperature" => {
                let value = text("temperature", field.data)?;
                let parsed = value
                    .parse::<f32>()
                    .ok()
                    .filter(|t| (0.0..=1.0).contains(t));
                options.temperature = Some(
                    parsed.ok_or_else(|| invalid("temperature", value, "a number from 0 to 1"))?,
                );
            }
            "timestamp_granularities[]" | "timestamp_granularities" => {
                let value = text("timestamp_granularities[]", field.data)?;
                if granularities.len() == MAX_GRANULARITIES {
                    return Err(invalid(
                        "timestamp_granularities[]",
                        value,
                        &format!("at most {MAX_GRANULARITIES} values"),
                    ));
                }
                granularities.push(value.to_string());
            }
            "stream" => {
                let value = text("stream", field.data)?;
                stream = match value.to_ascii_lowercase().as_str() {
                    "true" | "1" => true,
                    "false" | "0" | "" => false,
                    _ => return Err(invalid("stream", value, "`true` or `false`")),
                };
            }
            // `model` and what OpenAI may add are not used, but bounded.
            other if field.data.len() > MAX_FIELD_BYTES && field.file_name.is_none() => {
                return Err(RequestError::TooLong {
                    field: "other",
                    name: shown(other),
                    size: field.data.len(),
                    limit: MAX_FIELD_BYTES,
                })
            }
            _ => {}
        }
    }
    for granularity in &granularities {
        match granularity.as_str() {
            "segment" => {}
            "word" => options.word_timestamps = true,
            other => {
                return Err(invalid(
                    "timestamp_granularities[]",
                    other,
                    "`segment` or `word` (with `response_format` `verbose_json`)",
                ))
            }
        }
    }
    if !granularities.is_empty() && format != ResponseFormat::VerboseJson {
        return Err(invalid(
            "timestamp_granularities[]",
            &granularities.join(","),
            "timestamps need `response_format` `verbose_json`",
        ));
    }
    if stream && !matches!(format, ResponseFormat::Json | ResponseFormat::Text) {
        return Err(invalid(
            "stream",
            "true",
            &format!(
                "a streamed transcript is sent as text deltas: use `response_format` `json` or `text`, not `{}`",
                format.name()
            ),
        ));
    }
    let (file, file_name) = file.ok_or(RequestError::Missing { field: "file" })?;
    Ok(Upload {
        file,
        file_name,
        options,
        format,
        stream,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field<'a>(name: &'a str, data: &'a str) -> Field<'a> {
        Field {
            name,
            file_name: None,
            data: data.as_bytes(),
        }
    }

    #[test]
    fn stream_is_read_and_needs_a_text_format() {
        let file = Field {
            name: "file",
            file_name: Some("a.wav"),
            data: b"RIFF",
        };
        let streamed = |fields: &[Field<'_>]| upload(fields.iter().copied(), Task::Transcribe);
        assert!(streamed(&[file, field("stream", "true")]).unwrap().stream);
        assert!(!streamed(&[file, field("stream", "false")]).unwrap().stream);
        assert!(!streamed(&[file]).unwrap().stream);
        let text = [
            file,
            field("stream", "True"),
            field("response_format", "text"),
        ];
        assert!(streamed(&text).unwrap().stream);
        let error = streamed(&[file, field("stream", "yes")]).unwrap_err();
        assert_eq!(error.field(), "stream");
        let srt = [
            file,
            field("stream", "true"),
            field("response_format", "srt"),
        ];
        let error = streamed(&srt).unwrap_err();
        assert_eq!(error.field(), "stream");
        assert!(error.to_string().contains("`srt`"), "{error}");
    }

    #[test]
    fn fields_become_options() {
        let upload = upload(
            [
                Field {
                    name: "file",
                    file_name: Some("a.wav"),
                    data: b"RIFF",
                },
                field("model", "whisper-1"),
                field("language", " EN "),
                field("prompt", "Kennedy"),
                field("response_format", "verbose_json"),
                field("temperature", "0.2"),
                field("timestamp_granularities[]", "segment"),
                field("timestamp_granularities[]", "word"),
            ],
            Task::Transcribe,
        )
        .unwrap();
        assert!(upload.options.word_timestamps);
        assert_eq!(upload.file, b"RIFF");
        assert_eq!(upload.file_name.as_deref(), Some("a.wav"));
        assert_eq!(upload.options.language.as_deref(), Some("en"));
        assert_eq!(upload.options.prompt.as_deref(), Some("Kennedy"));
        assert_eq!(upload.options.temperature, Some(0.2));
        assert_eq!(upload.format, ResponseFormat::VerboseJson);
    }

    #[test]
    fn bad_values_name_the_field_and_the_value() {
        let file = Field {
            name: "file",
            file_name: None,
            data: b"x",
        };
        let cases = [
            (field("response_format", "mp3"), "response_format", "mp3"),
            (field("temperature", "7"), "temperature", "7"),
            (
                field("timestamp_granularities[]", "char"),
                "timestamp_granularities[]",
                "char",
            ),
        ];
        for (bad, name, value) in cases {
            let error = upload([file, bad], Task::Transcribe).unwrap_err();
            assert_eq!(error.field(), name);
            assert!(error.to_string().contains(value), "{error}");
        }
        let error = upload([field("language", "en")], Task::Transcribe).unwrap_err();
        assert_eq!(error, RequestError::Missing { field: "file" });
        let error = upload([file, field("language", "de")], Task::Translate).unwrap_err();
        assert_eq!(error.field(), "language");
        // Timestamps need the verbose format.
        let error = upload(
            [file, field("timestamp_granularities[]", "segment")],
            Task::Transcribe,
        )
        .unwrap_err();
        assert!(error.to_string().contains("verbose_json"), "{error}");
    }

    #[test]
    fn every_text_field_is_bounded_naming_it() {
        let file = Field {
            name: "file",
            file_name: Some("a.wav"),
            data: b"RIFF",
        };
        let prompt = "a".repeat(8 * 1024);
        let language = "x".repeat(1 << 20);
        let long = "y".repeat(MAX_FIELD_BYTES + 1);
        for (bad, name) in [
            (field("prompt", &prompt), "prompt"),
            (field("language", &language), "language"),
            (field("response_format", &long), "response_format"),
            (field("temperature", &long), "temperature"),
            (
                field("timestamp_granularities[]", &long),
                "timestamp_granularities[]",
            ),
            (field("model", &long), "other"),
        ] {
            let error = upload([file, bad], Task::Transcribe).unwrap_err();
            assert_eq!(error.field(), name, "{error}");
            assert!(matches!(error, RequestError::TooLong { .. }), "{error}");
            assert!(error.to_string().len() < 200, "{error}");
        }
        // At the bound a prompt is taken.
        let most = "b".repeat(MAX_PROMPT_BYTES);
        let taken = upload([file, field("prompt", &most)], Task::Transcribe).unwrap();
        assert_eq!(taken.options.prompt.as_deref(), Some(most.as_str()));
        let many = field("timestamp_granularities[]", "segment");
        let error = upload([file, many, many, many, many, many], Task::Transcribe).unwrap_err();
        assert_eq!(error.field(), "timestamp_granularities[]");
    }

    #[test]
    fn a_language_whisper_does_not_know_is_refused_and_a_long_value_is_shown_short() {
        let file = Field {
            name: "file",
            file_name: None,
            data: b"x",
        };
        let error = upload([file, field("language", "xx")], Task::Transcribe).unwrap_err();
        assert_eq!(error.field(), "language");
        assert!(error.to_string().contains("`xx`"), "{error}");
        let taken = upload([file, field("language", "De")], Task::Transcribe).unwrap();
        assert_eq!(taken.options.language.as_deref(), Some("de"));
        let long = "z".repeat(1000);
        let error = upload([file, field("response_format", &long)], Task::Transcribe).unwrap_err();
        assert!(error
            .to_string()
            .contains(&format!("{}…", "z".repeat(SHOWN_CHARS))));
        assert!(error.to_string().len() < 200, "{error}");
    }
}
