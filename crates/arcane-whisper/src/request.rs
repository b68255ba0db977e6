//! One transcription request from OpenAI's multipart fields, checked: the file, and
//! `language`, `prompt`, `response_format`, `temperature`, `timestamp_granularities[]`
//! (`model` is the gateway's, `stream` and other fields are ignored). A bad value is a
//! [`RequestError`] naming the field and the value.

use crate::format::ResponseFormat;
use crate::transcribe::{Options, Task};

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
            Self::Missing { field } | Self::Invalid { field, .. } => field,
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

fn text<'a>(field: &'static str, data: &'a [u8]) -> Result<&'a str, RequestError> {
    std::str::from_utf8(data)
        .map(str::trim)
        .map_err(|_| RequestError::Invalid {
            field,
            value: String::from_utf8_lossy(data).into_owned(),
            expected: "text in UTF-8".into(),
        })
}

fn invalid(field: &'static str, value: &str, expected: &str) -> RequestError {
    RequestError::Invalid {
        field,
        value: value.to_string(),
        expected: expected.to_string(),
    }
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
            "language" => {
                let value = text("language", field.data)?;
                options.language = (!value.is_empty()).then(|| value.to_ascii_lowercase());
            }
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
                granularities.push(text("timestamp_granularities[]", field.data)?.to_string());
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
    let (file, file_name) = file.ok_or(RequestError::Missing { field: "file" })?;
    Ok(Upload {
        file,
        file_name,
        options,
        format,
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
}
