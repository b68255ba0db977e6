//! OpenAI's `response_format`s of a transcript: `json` (`{"text"}`), `text` (the
//! transcript and a newline), `srt` and `vtt` (subtitle files), `verbose_json`
//! (`task`, `language`, `duration`, `text`, `segments` with `start`/`end`/`text`).

use serde_json::{json, Value};

use crate::transcribe::{Task, Transcript};

/// A response format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFormat {
    /// `{"text": "…"}`.
    Json,
    /// The text alone.
    Text,
    /// SubRip subtitles.
    Srt,
    /// `{task, language, duration, text, segments}`.
    VerboseJson,
    /// WebVTT subtitles.
    Vtt,
}

impl ResponseFormat {
    /// Every format.
    pub const ALL: [ResponseFormat; 5] = [
        ResponseFormat::Json,
        ResponseFormat::Text,
        ResponseFormat::Srt,
        ResponseFormat::VerboseJson,
        ResponseFormat::Vtt,
    ];

    /// Parses OpenAI's name; `None` for another.
    pub fn parse(name: &str) -> Option<ResponseFormat> {
        Self::ALL.into_iter().find(|format| format.name() == name)
    }

    /// OpenAI's name of it.
    pub fn name(self) -> &'static str {
        match self {
            ResponseFormat::Json => "json",
            ResponseFormat::Text => "text",
            ResponseFormat::Srt => "srt",
            ResponseFormat::VerboseJson => "verbose_json",
            ResponseFormat::Vtt => "vtt",
        }
    }

    /// The names accepted.
    pub const NAMES: [&'static str; 5] = ["json", "text", "srt", "verbose_json", "vtt"];

    /// The answer's `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            ResponseFormat::Json | ResponseFormat::VerboseJson => "application/json",
            ResponseFormat::Text | ResponseFormat::Srt => "text/plain; charset=utf-8",
            ResponseFormat::Vtt => "text/vtt; charset=utf-8",
        }
    }
}

/// `seconds` as `HH:MM:SS<sep>mmm`.
fn timestamp(seconds: f64, separator: char) -> String {
    let millis = (seconds.max(0.0) * 1000.0).round() as u64;
    format!(
        "{:02}:{:02}:{:02}{separator}{:03}",
        millis / 3_600_000,
        millis / 60_000 % 60,
        millis / 1000 % 60,
        millis % 1000
    )
}

/// The segments worth a cue: those with text.
fn cues(transcript: &Transcript) -> impl Iterator<Item = (f64, f64, &str)> {
    transcript
        .segments
        .iter()
        .map(|s| (s.start, s.end.max(s.start), s.text.trim()))
        .filter(|(_, _, text)| !text.is_empty())
}

/// The body of the answer in `format`.
pub fn render(transcript: &Transcript, task: Task, format: ResponseFormat) -> Vec<u8> {
    match format {
        ResponseFormat::Json => json!({"text": transcript.text}).to_string().into_bytes(),
        ResponseFormat::Text => format!("{}\n", transcript.text).into_bytes(),
        ResponseFormat::VerboseJson => verbose(transcript, task).to_string().into_bytes(),
        ResponseFormat::Srt => {
            let mut out = String::new();
            for (n, (start, end, text)) in cues(transcript).enumerate() {
                out.push_str(&format!(
                    "{}\n{} --> {}\n{}\n\n",
                    n + 1,
                    timestamp(start, ','),
                    timestamp(end, ','),
                    text
                ));
            }
            out.into_bytes()
        }
        ResponseFormat::Vtt => {
            let mut out = String::from("WEBVTT\n\n");
            for (start, end, text) in cues(transcript) {
                out.push_str(&format!(
                    "{} --> {}\n{}\n\n",
                    timestamp(start, '.'),
                    timestamp(end, '.'),
                    text
                ));
            }
            out.into_bytes()
        }
    }
}

/// OpenAI's `verbose_json` object.
pub fn verbose(transcript: &Transcript, task: Task) -> Value {
    let language = language_name(&transcript.language);
    let mut verbose = json!({
        "task": match task { Task::Transcribe => "transcribe", Task::Translate => "translate" },
        "language": language,
        "duration": transcript.duration,
        "text": transcript.text,
        // OpenAI's `seek` and `compression_ratio` are not computed by whisper.cpp:
        // they are left out rather than made up.
        "segments": transcript.segments.iter().map(|s| json!({
            "id": s.id,
            "start": s.start,
            "end": s.end,
            "text": s.text,
            "tokens": s.tokens,
            "temperature": transcript.temperature,
            "avg_logprob": s.avg_logprob,
            "no_speech_prob": s.no_speech_prob,
        })).collect::<Vec<_>>(),
    });
    if let Some(words) = &transcript.words {
        verbose["words"] = json!(words);
    }
    verbose
}

/// OpenAI names the language in `verbose_json` in English words (`"english"`).
fn language_name(code: &str) -> String {
    whisper_rs::get_lang_id(code)
        .and_then(whisper_rs::get_lang_str_full)
        .map(str::to_string)
        .unwrap_or_else(|| code.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcribe::Segment;

    fn transcript() -> Transcript {
        Transcript {
            language: "en".into(),
            duration: 3725.5,
            text: "Hello there. General Kenobi.".into(),
            temperature: 0.0,
            words: Some(vec![crate::transcribe::Word {
                word: "Hello".into(),
                start: 0.0,
                end: 0.5,
            }]),
            segments: vec![
                Segment {
                    id: 0,
                    start: 0.0,
                    end: 1.5,
                    text: " Hello there.".into(),
                    tokens: vec![2425, 612, 13],
                    avg_logprob: -0.25,
                    no_speech_prob: 0.01,
                },
                Segment {
                    id: 1,
                    start: 3723.25,
                    end: 3725.5,
                    text: " General Kenobi.".into(),
                    tokens: vec![3611, 14094, 13],
                    avg_logprob: -0.5,
                    no_speech_prob: 0.02,
                },
            ],
        }
    }

    fn text(format: ResponseFormat) -> String {
        String::from_utf8(render(&transcript(), Task::Transcribe, format)).unwrap()
    }

    #[test]
    fn json_is_the_text_alone() {
        let v: Value = serde_json::from_str(&text(ResponseFormat::Json)).unwrap();
        assert_eq!(v, json!({"text": "Hello there. General Kenobi."}));
    }

    #[test]
    fn text_is_the_transcript_and_a_newline() {
        assert_eq!(text(ResponseFormat::Text), "Hello there. General Kenobi.\n");
    }

    #[test]
    fn srt_numbers_its_cues_with_comma_milliseconds() {
        assert_eq!(
            text(ResponseFormat::Srt),
            "1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n\
             2\n01:02:03,250 --> 01:02:05,500\nGeneral Kenobi.\n\n"
        );
    }

    #[test]
    fn vtt_starts_with_its_signature_and_uses_dots() {
        assert_eq!(
            text(ResponseFormat::Vtt),
            "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n\n\
             01:02:03.250 --> 01:02:05.500\nGeneral Kenobi.\n\n"
        );
    }

    #[test]
    fn verbose_json_has_openais_fields() {
        let v: Value = serde_json::from_str(&text(ResponseFormat::VerboseJson)).unwrap();
        assert_eq!(v["task"], "transcribe");
        assert_eq!(v["language"], "english");
        assert_eq!(v["duration"], 3725.5);
        assert_eq!(v["segments"][1]["start"], 3723.25);
        assert_eq!(v["segments"][1]["text"], " General Kenobi.");
        assert_eq!(v["segments"][1]["tokens"], json!([3611, 14094, 13]));
        assert_eq!(v["segments"][1]["avg_logprob"], -0.5);
        assert_eq!(v["segments"][0]["no_speech_prob"], 0.01);
        // Nothing whisper.cpp does not compute is made up.
        assert!(v["segments"][0].get("compression_ratio").is_none());
        assert!(v["segments"][0].get("seek").is_none());
        assert_eq!(
            v["words"],
            json!([{"word": "Hello", "start": 0.0, "end": 0.5}])
        );
    }

    #[test]
    fn only_openais_names_parse() {
        for name in ResponseFormat::NAMES {
            assert_eq!(
                ResponseFormat::parse(name).map(ResponseFormat::name),
                Some(name)
            );
        }
        assert_eq!(ResponseFormat::parse("xml"), None);
    }
}
