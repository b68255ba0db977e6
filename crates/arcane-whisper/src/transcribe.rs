//! whisper.cpp (through `whisper-rs`, built from its bundled source, CPU only) on
//! 16 kHz mono samples.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use whisper_rs::{FullParams, SamplingStrategy, WhisperContext, WhisperContextParameters};

use crate::audio::SAMPLE_RATE;

/// Why a transcription failed.
#[derive(Debug, thiserror::Error)]
pub enum TranscribeError {
    /// The model file did not load.
    #[error("whisper.cpp could not load the model `{path}`: {reason}")]
    Model {
        /// The file.
        path: String,
        /// whisper.cpp's words.
        reason: String,
    },
    /// A language whisper.cpp does not know.
    #[error("unknown language `{0}`: give an ISO-639-1 code such as `en`")]
    Language(String),
    /// The run was cancelled.
    #[error("the transcription was cancelled")]
    Cancelled,
    /// whisper.cpp failed.
    #[error("whisper.cpp failed: {0}")]
    Failed(String),
}

/// What to do with the audio.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// Text in the spoken language.
    #[default]
    Transcribe,
    /// English text.
    Translate,
}

/// The options of one transcription (OpenAI's fields).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Options {
    /// Transcribe or translate.
    #[serde(default)]
    pub task: Task,
    /// The spoken language (ISO-639-1); `None` detects it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Text that came before (style, spelling of names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The sampling temperature (0: greedy, with whisper.cpp's fallback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Time each word too (whisper.cpp's token timestamps).
    #[serde(default)]
    pub word_timestamps: bool,
}

/// One word and when it was said.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Word {
    /// The word, without the punctuation around it.
    pub word: String,
    /// Its start, in seconds.
    pub start: f64,
    /// Its end, in seconds.
    pub end: f64,
}

/// One segment of a transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    /// Its index.
    pub id: usize,
    /// Its start, in seconds.
    pub start: f64,
    /// Its end, in seconds.
    pub end: f64,
    /// Its text, as whisper.cpp wrote it (a leading space included).
    pub text: String,
    /// The ids of its text tokens (special tokens left out).
    pub tokens: Vec<i32>,
    /// The mean log probability of its text tokens (0 when it has none).
    pub avg_logprob: f64,
    /// whisper.cpp's probability that it holds no speech.
    pub no_speech_prob: f64,
}

/// A transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transcript {
    /// The language (ISO-639-1 code) spoken, or the one asked for.
    pub language: String,
    /// The audio's duration, in seconds.
    pub duration: f64,
    /// The whole text, segments joined and trimmed.
    pub text: String,
    /// The sampling temperature it started from.
    pub temperature: f64,
    /// The segments.
    pub segments: Vec<Segment>,
    /// Every word with its times, when they were asked for ([`Options::word_timestamps`]).
    pub words: Option<Vec<Word>>,
}

/// whisper.cpp's abort callback: whether the run's cancel flag (`data`) is set.
unsafe extern "C" fn abort_requested(data: *mut std::ffi::c_void) -> bool {
    // SAFETY: `data` is the `AtomicBool` of an `Arc` that outlives the run (see
    // `Model::transcribe`).
    let flag = unsafe { &*(data as *const AtomicBool) };
    flag.load(Ordering::Relaxed)
}

/// What a streamed transcription calls with the text of each segment as it is
/// decoded (whisper.cpp finds segments one 30-second window at a time).
pub type OnSegment<'a> = &'a mut dyn FnMut(&str);

/// whisper.cpp's new-segment callback: hands the text of each new segment of `state`
/// to the [`OnSegment`] in `data`.
unsafe extern "C" fn new_segments(
    _context: *mut whisper_rs_sys::whisper_context,
    state: *mut whisper_rs_sys::whisper_state,
    new: std::os::raw::c_int,
    data: *mut std::ffi::c_void,
) {
    // SAFETY: `data` is the address of an `OnSegment` on the stack of
    // `Model::run`, alive for the whole of `state.full`, the only time whisper.cpp
    // calls this; `state` is the state being run, which whisper.cpp hands us.
    unsafe {
        let each = &mut *(data as *mut OnSegment<'_>);
        let count = whisper_rs_sys::whisper_full_n_segments_from_state(state);
        for i in (count - new).max(0)..count {
            let text = whisper_rs_sys::whisper_full_get_segment_text_from_state(state, i);
            if !text.is_null() {
                each(&std::ffi::CStr::from_ptr(text).to_string_lossy());
            }
        }
    }
}

/// A loaded model; transcriptions on it each get a fresh whisper.cpp state, so
/// several may run at once (each on its own thread).
pub struct Model {
    context: WhisperContext,
    threads: i32,
    vad: Option<crate::vad::Vad>,
}

impl Model {
    /// Loads the ggml model at `path` on the CPU.
    pub fn load(path: &Path, threads: usize) -> Result<Model, TranscribeError> {
        // whisper.cpp's log lines go to the `log` facade (nothing listens): stdout
        // and stderr stay the worker's.
        whisper_rs::install_logging_hooks();
        let mut params = WhisperContextParameters::default();
        params.use_gpu(false);
        let context =
            WhisperContext::new_with_params(path, params).map_err(|e| TranscribeError::Model {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
        Ok(Model {
            context,
            threads: threads.clamp(1, 64) as i32,
            vad: None,
        })
    }

    /// The model with voice activity detection: whisper.cpp's voice-activity model at
    /// `vad` (Silero VAD in ggml) finds the speech first, and only the speech is
    /// decoded (timestamps still count from the start of the audio). The file is
    /// checked by the registry before it gets here; whisper.cpp loads it at each run.
    pub fn with_vad(mut self, vad: &Path) -> Result<Model, TranscribeError> {
        self.vad = Some(crate::vad::Vad::new(vad)?);
        Ok(self)
    }

    /// Whether the model can only transcribe English (`.en` models).
    pub fn english_only(&self) -> bool {
        !self.context.is_multilingual()
    }

    /// Transcribes `samples` (16 kHz mono); `cancel` set stops it
    /// ([`TranscribeError::Cancelled`]).
    pub fn transcribe(
        &self,
        samples: &[f32],
        options: &Options,
        cancel: Arc<AtomicBool>,
    ) -> Result<Transcript, TranscribeError> {
        self.run(samples, options, cancel, None)
    }

    /// Transcribes `samples` as [`Model::transcribe`] does, calling `each` with the
    /// text of every segment as soon as whisper.cpp has decoded it.
    pub fn transcribe_streamed(
        &self,
        samples: &[f32],
        options: &Options,
        cancel: Arc<AtomicBool>,
        each: OnSegment<'_>,
    ) -> Result<Transcript, TranscribeError> {
        self.run(samples, options, cancel, Some(each))
    }

    fn run(
        &self,
        samples: &[f32],
        options: &Options,
        cancel: Arc<AtomicBool>,
        mut each: Option<OnSegment<'_>>,
    ) -> Result<Transcript, TranscribeError> {
        let language = match options.language.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(code) => {
                let code = code.to_ascii_lowercase();
                if whisper_rs::get_lang_id(&code).is_none() {
                    return Err(TranscribeError::Language(code));
                }
                Some(code)
            }
        };
        let language = match (language, self.english_only()) {
            (_, true) => Some("en".to_string()),
            (language, false) => language,
        };
        let mut state = self
            .context
            .create_state()
            .map_err(|e| TranscribeError::Failed(e.to_string()))?;
        let duration = samples.len() as f64 / f64::from(SAMPLE_RATE);
        let speech = match &self.vad {
            Some(vad) => Some(vad.speech(samples, self.threads)?),
            None => None,
        };
        let samples = speech.as_ref().map_or(samples, |s| s.samples.as_slice());
        if samples.is_empty() {
            // The voice-activity model heard nobody: nothing to decode.
            return Ok(Transcript {
                language: language.unwrap_or_else(|| "en".into()),
                duration,
                text: String::new(),
                temperature: f64::from(options.temperature.unwrap_or(0.0)),
                segments: Vec::new(),
                words: options.word_timestamps.then(Vec::new),
            });
        }
        let mut params = FullParams::new(SamplingStrategy::Greedy { best_of: 1 });
        params.set_n_threads(self.threads);
        params.set_translate(options.task == Task::Translate);
        params.set_language(Some(language.as_deref().unwrap_or("auto")));
        params.set_print_special(false);
        params.set_print_progress(false);
        params.set_print_realtime(false);
        params.set_print_timestamps(false);
        if let Some(temperature) = options.temperature {
            params.set_temperature(temperature.clamp(0.0, 1.0));
        }
        params.set_token_timestamps(options.word_timestamps);
        if let Some(prompt) = options.prompt.as_deref().filter(|p| !p.is_empty()) {
            params.set_initial_prompt(prompt);
        }
        // whisper-rs 0.16's `set_abort_callback_safe` hands whisper.cpp a pointer to
        // a boxed trait object but reads it back as the closure itself (so the flag it
        // reads is garbage and runs abort at random): pass the flag's address directly.
        // SAFETY: `cancel` (an `Arc` held until this function returns) outlives
        // `state.full`, the only time whisper.cpp calls the callback; the callback
        // only reads the atomic through a shared reference.
        unsafe {
            params.set_abort_callback(Some(abort_requested));
            params.set_abort_callback_user_data(Arc::as_ptr(&cancel) as *mut std::ffi::c_void);
        }
        if let Some(each) = &mut each {
            // SAFETY: `each` lives on this stack frame until this function returns,
            // after `state.full`; `new_segments` reads it through that address only
            // while whisper.cpp runs (see there).
            unsafe {
                params.set_new_segment_callback(Some(new_segments));
                params.set_new_segment_callback_user_data(
                    each as *mut OnSegment<'_> as *mut std::ffi::c_void,
                );
            }
        }
        let ran = state.full(params, samples);
        if cancel.load(Ordering::Relaxed) {
            return Err(TranscribeError::Cancelled);
        }
        ran.map_err(|e| TranscribeError::Failed(e.to_string()))?;
        let language = language.unwrap_or_else(|| {
            whisper_rs::get_lang_str(state.full_lang_id_from_state())
                .unwrap_or("en")
                .to_string()
        });
        let mut segments = Vec::new();
        let mut words = WordsBuilder::default();
        for (id, segment) in state.as_iter().enumerate() {
            let text = segment
                .to_str_lossy()
                .map_err(|e| TranscribeError::Failed(e.to_string()))?
                .into_owned();
            let eot = self.context.token_eot();
            let (mut tokens, mut logprob) = (Vec::new(), 0.0);
            for token in (0..segment.n_tokens()).filter_map(|i| segment.get_token(i)) {
                // Ids from end-of-text on are special (timestamps, language, task).
                if token.token_id() < eot {
                    tokens.push(token.token_id());
                    let data = token.token_data();
                    logprob += f64::from(data.plog);
                    if options.word_timestamps {
                        let text = token
                            .to_str_lossy()
                            .map_err(|e| TranscribeError::Failed(e.to_string()))?;
                        words.push(&text, data.t0 as f64 / 100.0, data.t1 as f64 / 100.0);
                    }
                }
            }
            segments.push(Segment {
                id,
                start: segment.start_timestamp() as f64 / 100.0,
                end: segment.end_timestamp() as f64 / 100.0,
                text,
                avg_logprob: if tokens.is_empty() {
                    0.0
                } else {
                    logprob / tokens.len() as f64
                },
                tokens,
                no_speech_prob: f64::from(segment.no_speech_probability()),
            });
        }
        let text = segments
            .iter()
            .map(|s| s.text.trim())
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        let mut words = options.word_timestamps.then(|| words.finish());
        if let Some(speech) = &speech {
            // Times of the kept speech, back onto the audio as it was sent.
            for segment in &mut segments {
                (segment.start, segment.end) =
                    (speech.original(segment.start), speech.original(segment.end));
            }
            for word in words.iter_mut().flatten() {
                (word.start, word.end) = (speech.original(word.start), speech.original(word.end));
            }
        }
        Ok(Transcript {
            language,
            duration,
            text,
            temperature: f64::from(options.temperature.unwrap_or(0.0)),
            words,
            segments,
        })
    }
}

/// Words from whisper.cpp's tokens: a token that starts with a space starts a word,
/// any other continues the one before (`Americ` + `ans`); punctuation around a word is
/// not part of it, and a word of punctuation alone is none.
#[derive(Debug, Default)]
struct WordsBuilder {
    words: Vec<Word>,
    current: Option<Word>,
}

impl WordsBuilder {
    fn push(&mut self, text: &str, start: f64, end: f64) {
        let starts_word = text.starts_with(char::is_whitespace);
        match &mut self.current {
            Some(word) if !starts_word => {
                word.word.push_str(text);
                word.end = end.max(word.end);
            }
            _ => {
                self.flush();
                self.current = Some(Word {
                    word: text.trim_start().to_string(),
                    start,
                    end: end.max(start),
                });
            }
        }
    }

    fn flush(&mut self) {
        if let Some(mut word) = self.current.take() {
            word.word = word
                .word
                .trim_matches(|c: char| !c.is_alphanumeric() && c != '\'')
                .to_string();
            if !word.word.is_empty() {
                self.words.push(word);
            }
        }
    }

    fn finish(mut self) -> Vec<Word> {
        self.flush();
        self.words
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_become_words_without_their_punctuation() {
        let mut words = WordsBuilder::default();
        for (text, start, end) in [
            (" And", 0.3, 0.5),
            (" Americ", 1.0, 1.2),
            ("ans", 1.2, 1.6),
            (",", 1.6, 1.6),
            (" ask", 1.7, 1.9),
            (" country", 2.0, 2.5),
            (".", 2.5, 2.5),
            (" -", 2.6, 2.6),
        ] {
            words.push(text, start, end);
        }
        let words = words.finish();
        let texts: Vec<&str> = words.iter().map(|w| w.word.as_str()).collect();
        assert_eq!(texts, ["And", "Americans", "ask", "country"]);
        assert_eq!((words[1].start, words[1].end), (1.0, 1.6));
    }
}
