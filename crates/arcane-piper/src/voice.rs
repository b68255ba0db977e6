//! [`Voice`]: a Piper voice opened on ONNX Runtime's CPU provider, and synthesis the
//! way Piper does it: each sentence's phonemes become ids, the graph turns them into
//! audio, each sentence's audio is scaled so its peak fills the range, and sentences
//! are joined by [`SENTENCE_SILENCE_SECONDS`] of silence.
//!
//! What one request costs is bounded: the graph's memory grows with the audio of one
//! run (about 0.6 MB a phoneme at the voice's pace: 819 unpunctuated words in one run
//! took 4.7 GB), so a sentence is run in pieces of at most [`MAX_CHUNK_PHONEMES`]
//! phonemes (fewer below speed 1, which lengthens each phoneme), cut at words; a text
//! of more than [`MAX_REQUEST_PHONEMES`] phonemes is refused; and the session hands
//! its arena's memory back after every run, so a worker does not keep its largest
//! request's memory until it is unloaded.
//!
//! The graph's inputs (`input` int64 `[1, N]`, `input_lengths` int64 `[1]`, `scales`
//! float32 `[3]`, and `sid` int64 `[1]` for multi-speaker voices) are checked when the
//! voice is opened, so a graph that is not a Piper voice fails at load, naming the
//! input, rather than at the first request.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arcane_onnx::{Provider, RunCancel, Runtime, Session, SessionOptions, Tensor, TensorData};

use crate::config::{config_path, read_config, VoiceConfig};
use crate::phonemize::{phoneme_ids, split_phonemes, PhonemeIds};
use crate::{Error, Phonemizer};

/// The longest text accepted, in characters (OpenAI's limit for `/v1/audio/speech`).
pub const MAX_TEXT_CHARS: usize = 4096;

/// The slowest `speed` accepted.
pub const MIN_SPEED: f32 = 0.25;

/// The fastest `speed` accepted.
pub const MAX_SPEED: f32 = 4.0;

/// The most phonemes run through the graph at once at speed 1 or faster; at a slower
/// speed, that times the speed (each phoneme lasts longer), and never fewer than 32.
pub const MAX_CHUNK_PHONEMES: usize = 192;

/// The most phonemes one request may make at speed 1 or faster (about 14 minutes of
/// speech at the voice's own pace; a 4096-character English text makes about 5000);
/// at a slower speed, that times the speed.
pub const MAX_REQUEST_PHONEMES: usize = 24_576;

/// Silence between two sentences, in seconds (Piper's default).
pub const SENTENCE_SILENCE_SECONDS: f32 = 0.2;

/// A text checked and phonemized by [`Voice::prepare`], ready for [`Voice::speak`]:
/// each sentence as the ids of the runs it takes.
#[derive(Debug, Clone)]
pub struct Script {
    runs: Vec<Vec<Vec<i64>>>,
    speed: f32,
    phonemes: usize,
}

impl Script {
    /// How many phonemes the text made.
    pub fn phonemes(&self) -> usize {
        self.phonemes
    }
}

/// A loaded voice: the ONNX graph plus its `.onnx.json` beside it.
pub struct Voice {
    model: PathBuf,
    config: VoiceConfig,
    session: Session,
    output: String,
    has_speaker_input: bool,
}

impl std::fmt::Debug for Voice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Voice")
            .field("model", &self.model)
            .field("sample_rate", &self.config.sample_rate)
            .field("espeak_voice", &self.config.espeak_voice)
            .finish()
    }
}

impl Voice {
    /// Opens `model` (`en_US-joe-medium.onnx`) on the CPU with `runtime`, reading
    /// `<model>.json` beside it. `threads`: intra-op threads (None: ORT default).
    ///
    /// Errors: `ARCANE_NOT_FOUND` naming the model or the configuration when one is
    /// missing; `LOCAL_AI_MODEL_INVALID` for a configuration or graph that is not a
    /// Piper voice; `LOCAL_AI_SERVER_FAILED` when ONNX Runtime fails otherwise.
    pub fn load(runtime: &Runtime, model: &Path, threads: Option<usize>) -> Result<Voice, Error> {
        if !model.exists() {
            return Err(Error::NotFound {
                path: model.to_path_buf(),
            });
        }
        let config = read_config(&config_path(model))?;
        let options = SessionOptions {
            intra_op_threads: threads,
            inter_op_threads: None,
        };
        let mut session = Session::open(runtime, model, Provider::Cpu, &options)
            .map_err(|e| Error::onnx(format!("opening `{}`", model.display()), e))?;
        session.shrink_arena_after_runs();
        let invalid = |reason: String| Error::VoiceInvalid {
            path: model.to_path_buf(),
            reason,
        };
        for (name, element_type, rank) in [
            ("input", "int64", 2),
            ("input_lengths", "int64", 1),
            ("scales", "float32", 1),
        ] {
            let spec = session
                .inputs()
                .iter()
                .find(|s| s.name == name)
                .ok_or_else(|| {
                    invalid(format!(
                        "the graph has no input `{name}` (a Piper voice has input, input_lengths, scales)"
                    ))
                })?;
            let rank_fits = spec.shape.as_ref().is_none_or(|dims| dims.len() == rank);
            if spec.element_type != element_type || !rank_fits {
                return Err(invalid(format!(
                    "its input `{name}` is {} {}, not {element_type} of rank {rank}",
                    spec.element_type,
                    spec.shape_text()
                )));
            }
        }
        let has_speaker_input = session.inputs().iter().any(|s| s.name == "sid");
        let output = session
            .outputs()
            .iter()
            .find(|s| s.element_type == "float32")
            .map(|s| s.name.clone())
            .ok_or_else(|| invalid("the graph has no float32 output (audio)".into()))?;
        Ok(Voice {
            model: model.to_path_buf(),
            config,
            session,
            output,
            has_speaker_input,
        })
    }

    /// The rate of the audio it produces (Hz).
    pub fn sample_rate(&self) -> u32 {
        self.config.sample_rate
    }

    /// The espeak-ng voice that phonemizes its text (`en-us`).
    pub fn espeak_voice(&self) -> &str {
        &self.config.espeak_voice
    }

    /// `num_speakers` from the configuration (1 for most voices; speaker 0 is used).
    pub fn num_speakers(&self) -> u32 {
        self.config.num_speakers
    }

    /// The model file.
    pub fn model(&self) -> &Path {
        &self.model
    }

    /// The ids the voice's map gives `phoneme` (one codepoint), if any.
    pub fn phoneme_id(&self, phoneme: char) -> Option<&[i64]> {
        self.config.phoneme_ids.get(&phoneme).map(Vec::as_slice)
    }

    /// `phonemes` (as [`Phonemizer::phonemize`] prints them) as the graph's input ids:
    /// BOS, pad, each known phoneme's ids and a pad, EOS; unknown phonemes are skipped
    /// and counted.
    pub fn phoneme_ids(&self, phonemes: &str) -> PhonemeIds {
        phoneme_ids(&self.config.phoneme_ids, phonemes)
    }

    /// Text to mono f32 samples in [-1, 1] at `sample_rate()`, all at once: what
    /// [`Voice::prepare`] and [`Voice::speak`] give, joined.
    ///
    /// Errors: those of [`Voice::prepare`] and [`Voice::speak`].
    pub fn synthesize(
        &self,
        phonemizer: &Phonemizer,
        text: &str,
        speed: f32,
        cancel: &RunCancel,
    ) -> Result<Vec<f32>, Error> {
        if cancel.is_cancelled() {
            return Err(Error::Cancelled);
        }
        let script = self.prepare(phonemizer, text, speed)?;
        let mut audio = Vec::new();
        self.speak(&script, cancel, |sentence| {
            audio.extend_from_slice(&sentence);
            Ok(())
        })?;
        Ok(audio)
    }

    /// Checks `text` and `speed` and phonemizes the text into a [`Script`], before any
    /// audio is made: whatever is wrong with a request is found here, so a streamed
    /// answer never fails for its input after its first byte. `speed` 0.25..=4.0
    /// (OpenAI's `speed`; 1.0 = the voice's own length_scale, which is divided by it).
    ///
    /// Errors: `ARCANE_USAGE` for empty or too long text, a bad speed or text with
    /// nothing to speak; `TTS_PHONEMIZER_FAILED` when espeak-ng fails.
    pub fn prepare(
        &self,
        phonemizer: &Phonemizer,
        text: &str,
        speed: f32,
    ) -> Result<Script, Error> {
        check_text(text)?;
        if !(MIN_SPEED..=MAX_SPEED).contains(&speed) {
            return Err(Error::BadSpeed {
                speed,
                min: MIN_SPEED,
                max: MAX_SPEED,
            });
        }
        let sentences = phonemizer.sentences(self.espeak_voice(), text)?;
        let phonemes: usize = sentences.iter().map(|s| s.chars().count()).sum();
        let max = request_phonemes(speed);
        if phonemes > max {
            return Err(Error::TooManyPhonemes { phonemes, max });
        }
        let runs: Vec<Vec<Vec<i64>>> = sentences
            .iter()
            .map(|s| self.chunk_ids(s, speed))
            .filter(|chunks| !chunks.is_empty())
            .collect();
        if runs.is_empty() {
            return Err(Error::NothingToSay {
                text: text.chars().take(64).collect(),
            });
        }
        Ok(Script {
            runs,
            speed,
            phonemes,
        })
    }

    /// Speaks `script` sentence by sentence: `each` gets every sentence's samples as
    /// soon as they are made (after the first, preceded by
    /// [`SENTENCE_SILENCE_SECONDS`] of silence), each scaled so its peak fills the
    /// range. An error from `each` stops it and is returned; `cancel` stops it between
    /// runs and inside one.
    ///
    /// Errors: `ARCANE_CANCELLED`; `LOCAL_AI_SERVER_FAILED` when ONNX Runtime fails.
    pub fn speak(
        &self,
        script: &Script,
        cancel: &RunCancel,
        mut each: impl FnMut(Vec<f32>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let silence = (SENTENCE_SILENCE_SECONDS * self.sample_rate() as f32) as usize;
        for (i, chunks) in script.runs.iter().enumerate() {
            let mut audio = vec![0.0; if i > 0 { silence } else { 0 }];
            let start = audio.len();
            for ids in chunks {
                if cancel.is_cancelled() {
                    return Err(Error::Cancelled);
                }
                audio.extend(self.run(ids.clone(), script.speed, cancel)?);
            }
            normalize(&mut audio[start..]);
            each(audio)?;
        }
        Ok(())
    }

    /// One sentence's phonemes as the ids of the runs it takes: pieces of at most
    /// [`chunk_phonemes`] phonemes, those with nothing the voice knows left out.
    fn chunk_ids(&self, sentence: &str, speed: f32) -> Vec<Vec<i64>> {
        split_phonemes(sentence, chunk_phonemes(speed))
            .iter()
            .map(|piece| self.phoneme_ids(piece))
            .filter(|ids| ids.found > 0)
            .map(|ids| ids.ids)
            .collect()
    }

    /// One run of the graph on one sentence's ids.
    fn run(&self, ids: Vec<i64>, speed: f32, cancel: &RunCancel) -> Result<Vec<f32>, Error> {
        let count = ids.len() as i64;
        let mut inputs = BTreeMap::new();
        inputs.insert(
            "input".to_string(),
            Tensor {
                shape: vec![1, count],
                data: TensorData::Int64(ids),
            },
        );
        inputs.insert(
            "input_lengths".to_string(),
            Tensor {
                shape: vec![1],
                data: TensorData::Int64(vec![count]),
            },
        );
        inputs.insert(
            "scales".to_string(),
            Tensor {
                shape: vec![3],
                data: TensorData::Float32(vec![
                    self.config.noise_scale,
                    self.config.length_scale / speed,
                    self.config.noise_w,
                ]),
            },
        );
        if self.has_speaker_input {
            inputs.insert(
                "sid".to_string(),
                Tensor {
                    shape: vec![1],
                    data: TensorData::Int64(vec![0]),
                },
            );
        }
        let wanted = [self.output.clone()];
        let mut outputs = self
            .session
            .run(&inputs, Some(&wanted), cancel)
            .map_err(|e| Error::onnx(format!("running the voice `{}`", self.model.display()), e))?;
        match outputs.remove(&self.output).map(|t| t.data) {
            Some(TensorData::Float32(samples)) => Ok(samples),
            _ => Err(Error::Runtime {
                context: format!("running the voice `{}`", self.model.display()),
                message: format!("output `{}` is not float32 audio", self.output),
            }),
        }
    }
}

/// Hands the memory the allocator holds free back to the system (glibc keeps what a
/// long synthesis freed in its arenas otherwise; elsewhere this does nothing). Call it
/// once a synthesis's samples are dropped.
pub fn release_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes no
    // pointer and may be called at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The most phonemes of one run at `speed`: [`MAX_CHUNK_PHONEMES`] at speed 1 or
/// more, proportionally fewer below (the audio of a run, not its phonemes, decides its
/// memory), at least 32.
fn chunk_phonemes(speed: f32) -> usize {
    ((MAX_CHUNK_PHONEMES as f32 * speed.min(1.0)) as usize).max(32)
}

/// The most phonemes one request may make at `speed`: [`MAX_REQUEST_PHONEMES`] at
/// speed 1 or more, proportionally fewer below, so that the audio (what the answer
/// holds) stays within about 14 minutes whatever the speed.
fn request_phonemes(speed: f32) -> usize {
    (MAX_REQUEST_PHONEMES as f32 * speed.min(1.0)) as usize
}

/// Checks the text's bounds: non-empty after trimming, at most [`MAX_TEXT_CHARS`].
fn check_text(text: &str) -> Result<(), Error> {
    if text.trim().is_empty() {
        return Err(Error::EmptyText);
    }
    let chars = text.chars().count();
    if chars > MAX_TEXT_CHARS {
        return Err(Error::TextTooLong {
            chars,
            max: MAX_TEXT_CHARS,
        });
    }
    Ok(())
}

/// Scales `samples` so the peak fills [-1, 1], as Piper does (never by more than
/// 100×), and maps anything not finite to silence.
fn normalize(samples: &mut [f32]) {
    let peak = samples
        .iter()
        .filter(|s| s.is_finite())
        .fold(0.01f32, |peak, s| peak.max(s.abs()));
    for s in samples {
        *s = if s.is_finite() {
            (*s / peak).clamp(-1.0, 1.0)
        } else {
            0.0
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_bounds() {
        assert!(matches!(check_text(" \n"), Err(Error::EmptyText)));
        assert!(check_text(&"a".repeat(MAX_TEXT_CHARS)).is_ok());
        assert!(matches!(
            check_text(&"é".repeat(MAX_TEXT_CHARS + 1)),
            Err(Error::TextTooLong { chars: 4097, .. })
        ));
    }

    #[test]
    fn a_slower_speed_runs_fewer_phonemes_at_once() {
        assert_eq!(chunk_phonemes(1.0), MAX_CHUNK_PHONEMES);
        assert_eq!(chunk_phonemes(4.0), MAX_CHUNK_PHONEMES);
        assert_eq!(chunk_phonemes(0.5), MAX_CHUNK_PHONEMES / 2);
        assert_eq!(chunk_phonemes(0.25), MAX_CHUNK_PHONEMES / 4);
        assert_eq!(request_phonemes(2.0), MAX_REQUEST_PHONEMES);
        assert_eq!(request_phonemes(0.25), MAX_REQUEST_PHONEMES / 4);
    }

    #[test]
    fn normalizing_fills_the_range_and_drops_non_finite_samples() {
        let mut samples = vec![0.25, -0.5, f32::NAN, 0.1];
        normalize(&mut samples);
        assert_eq!(samples, vec![0.5, -1.0, 0.0, 0.2]);
        let mut quiet = vec![0.001];
        normalize(&mut quiet);
        assert!((quiet[0] - 0.1).abs() < 1e-6);
    }
}
