//! Voice activity detection with whisper.cpp's voice-activity model (Silero VAD in
//! ggml): [`Vad::speech`] finds where speech is, and Whisper then decodes only that,
//! with the times of what it finds mapped back onto the original audio.
//!
//! whisper.cpp applies its VAD only in `whisper_full`, on the context's one shared
//! state, which would serialise every transcription of a worker's pool; and whisper-rs
//! 0.16 copies the model's path into memory it never frees on each use. So the VAD is
//! run here through whisper.cpp's own VAD functions, the way `whisper_full` runs it:
//! each speech segment (its end extended by the parameters' overlap) is kept in order,
//! with 0.1 s of silence between two.

use std::ffi::CString;
use std::path::Path;

use crate::audio::SAMPLE_RATE;
use crate::transcribe::TranscribeError;

/// Silence put between two kept pieces of speech, in seconds (whisper.cpp's).
const GAP_SECONDS: f64 = 0.1;

/// A voice-activity model: its path, and the contexts loaded from it that no run is
/// using (a context serves one run at a time; the pool grows to the runs at once).
#[derive(Debug)]
pub(crate) struct Vad {
    path: CString,
    idle: std::sync::Mutex<Vec<Context>>,
}

/// One piece of speech kept: where it starts in the kept audio and in the original,
/// and how long it lasts, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Piece {
    kept: f64,
    original: f64,
    seconds: f64,
}

/// The speech of some audio: its samples, and where each piece came from.
#[derive(Debug, Default)]
pub(crate) struct Speech {
    /// The kept samples (16 kHz mono), pieces joined by short silences.
    pub samples: Vec<f32>,
    pieces: Vec<Piece>,
}

impl Speech {
    /// A time `t` of the kept audio, in seconds, as a time of the original audio (a
    /// time in a gap belongs to the end of the piece before it).
    pub fn original(&self, t: f64) -> f64 {
        let Some(piece) = self.pieces.iter().rev().find(|p| p.kept <= t) else {
            return self.pieces.first().map_or(t, |p| p.original);
        };
        piece.original + (t - piece.kept).clamp(0.0, piece.seconds)
    }
}

/// Owns a whisper.cpp VAD context.
#[derive(Debug)]
struct Context(*mut whisper_rs_sys::whisper_vad_context);

// SAFETY: a context is used by one thread at a time (taken out of the pool for one
// run, then put back), and whisper.cpp keeps no thread-local state in it.
unsafe impl Send for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the pointer came from whisper_vad_init_from_file_with_params, is not
        // null, and is freed once, here.
        unsafe { whisper_rs_sys::whisper_vad_free(self.0) }
    }
}

/// Owns a whisper.cpp list of VAD segments.
struct Segments(*mut whisper_rs_sys::whisper_vad_segments);

impl Drop for Segments {
    fn drop(&mut self) {
        // SAFETY: the pointer came from whisper_vad_segments_from_samples, is not null,
        // and is freed once, here.
        unsafe { whisper_rs_sys::whisper_vad_free_segments(self.0) }
    }
}

impl Vad {
    /// The voice-activity model at `path` (checked by the registry before it gets
    /// here; whisper.cpp reads it at each use).
    pub fn new(path: &Path) -> Result<Vad, TranscribeError> {
        let invalid = |reason: &str| TranscribeError::Model {
            path: path.display().to_string(),
            reason: reason.to_string(),
        };
        let text = path
            .to_str()
            .ok_or_else(|| invalid("the voice-activity model's path is not UTF-8 text"))?;
        let path_c = CString::new(text)
            .map_err(|_| invalid("the voice-activity model's path holds a NUL byte"))?;
        if !path.is_file() {
            return Err(invalid("the voice-activity model is not a file"));
        }
        Ok(Vad {
            path: path_c,
            idle: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// An idle context, or a new one loaded from the model.
    fn context(&self, threads: i32) -> Result<Context, TranscribeError> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        if let Some(context) = idle {
            return Ok(context);
        }
        // SAFETY: a plain function returning a struct by value.
        let mut params = unsafe { whisper_rs_sys::whisper_vad_default_context_params() };
        params.n_threads = threads;
        params.use_gpu = false;
        // SAFETY: `path` is a NUL-terminated string that outlives the call, which
        // copies what it needs; a null result is checked.
        let context = unsafe {
            whisper_rs_sys::whisper_vad_init_from_file_with_params(self.path.as_ptr(), params)
        };
        if context.is_null() {
            return Err(TranscribeError::Failed(
                "voice activity: whisper.cpp could not load the voice-activity model".into(),
            ));
        }
        Ok(Context(context))
    }

    /// The speech in `samples` (16 kHz mono), found with whisper.cpp's default VAD
    /// parameters on `threads` threads.
    pub fn speech(&self, samples: &[f32], threads: i32) -> Result<Speech, TranscribeError> {
        let failed = |what: &str| TranscribeError::Failed(format!("voice activity: {what}"));
        let length = i32::try_from(samples.len()).map_err(|_| failed("the audio is too long"))?;
        // SAFETY: a plain function returning a struct by value.
        let params = unsafe { whisper_rs_sys::whisper_vad_default_params() };
        let context = self.context(threads)?;
        // SAFETY: the context is live; `samples` holds `length` floats and outlives the
        // call; a null result is checked.
        let segments = unsafe {
            whisper_rs_sys::whisper_vad_segments_from_samples(
                context.0,
                params,
                samples.as_ptr(),
                length,
            )
        };
        // The context is reset at each use: it goes back to the pool.
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(context);
        if segments.is_null() {
            return Err(failed("whisper.cpp could not find the speech"));
        }
        let segments = Segments(segments);
        // SAFETY: the segments are live; each index is below their count.
        let spans: Vec<(f64, f64)> = unsafe {
            let count = whisper_rs_sys::whisper_vad_segments_n_segments(segments.0);
            (0..count)
                .map(|i| {
                    (
                        f64::from(whisper_rs_sys::whisper_vad_segments_get_segment_t0(
                            segments.0, i,
                        )) / 100.0,
                        f64::from(whisper_rs_sys::whisper_vad_segments_get_segment_t1(
                            segments.0, i,
                        )) / 100.0,
                    )
                })
                .collect()
        };
        Ok(keep(samples, &spans, f64::from(params.samples_overlap)))
    }
}

/// The `spans` (start, end in seconds) of `samples`, each but the last extended by
/// `overlap` seconds, joined by [`GAP_SECONDS`] of silence.
fn keep(samples: &[f32], spans: &[(f64, f64)], overlap: f64) -> Speech {
    let rate = f64::from(SAMPLE_RATE);
    let at = |t: f64| ((t.max(0.0) * rate) as usize).min(samples.len());
    let gap = (GAP_SECONDS * rate) as usize;
    let mut speech = Speech::default();
    for (i, &(start, end)) in spans.iter().enumerate() {
        let end = if i + 1 < spans.len() {
            end + overlap
        } else {
            end
        };
        let (from, to) = (at(start), at(end));
        if to <= from {
            continue;
        }
        if !speech.pieces.is_empty() {
            speech.samples.resize(speech.samples.len() + gap, 0.0);
        }
        speech.pieces.push(Piece {
            kept: speech.samples.len() as f64 / rate,
            original: from as f64 / rate,
            seconds: (to - from) as f64 / rate,
        });
        speech.samples.extend_from_slice(&samples[from..to]);
    }
    speech
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_speech_maps_back_to_the_original_times() {
        // 30 s of audio with speech at 20-25 s and 27-29 s.
        let samples: Vec<f32> = (0..30 * 16_000).map(|i| i as f32).collect();
        let speech = keep(&samples, &[(20.0, 25.0), (27.0, 29.0)], 0.1);
        // 5.1 s, a 0.1 s gap, 2 s.
        assert_eq!(
            speech.samples.len(),
            (5.1 * 16_000.0) as usize + 1_600 + 32_000
        );
        assert_eq!(speech.samples[0], (20 * 16_000) as f32);
        assert_eq!(speech.original(0.0), 20.0);
        assert!((speech.original(2.5) - 22.5).abs() < 1e-9);
        // In the gap: the end of the first piece.
        assert!((speech.original(5.15) - 25.1).abs() < 1e-9);
        assert!((speech.original(5.2 + 1.0) - 28.0).abs() < 1e-6);
        // Nothing found: nothing kept.
        let none = keep(&samples, &[], 0.1);
        assert!(none.samples.is_empty());
        assert_eq!(none.original(3.0), 3.0);
    }
}
