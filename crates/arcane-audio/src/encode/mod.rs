//! [`Encoder`]: mono samples in [-1, 1] to the bytes of an [`AudioFormat`], whole or
//! streamed.
//!
//! Each format is a module with one type implementing [`Encode`]; [`Encoder::new`]
//! picks it from the table in [`encoder_for`]. A streamed encoder gives, for every
//! piece pushed, the bytes a player can use at once: WAV and FLAC then write a header
//! whose length is unknown (WAV's sizes `0xFFFFFFFF`, as OpenAI's streamed WAV has
//! them; FLAC's total samples 0, which the format defines as unknown), MP3 its frames,
//! Opus its Ogg pages. Whole, WAV and FLAC headers carry the exact length.

mod flac;
mod mp3;
mod opus;
mod wav;

use crate::AudioFormat;

/// How the bytes are given out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// As one answer: headers carry the exact length.
    Whole,
    /// Piece by piece as audio is pushed: headers say the length is unknown.
    Streamed,
}

/// An encoder that failed (a codec refusing its input or settings): a bug or a
/// broken build, never the client's doing.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// The codec library failed.
    #[error("the {format} encoder failed: {message}")]
    Codec {
        /// The format being encoded.
        format: AudioFormat,
        /// What the library said.
        message: String,
    },
}

impl EncodeError {
    /// The stable code: `LOCAL_AI_SERVER_FAILED` (the engine failed, not the request).
    pub fn code(&self) -> &'static str {
        arcane_report::codes::LOCAL_AI_SERVER_FAILED
    }

    pub(crate) fn codec(format: AudioFormat, message: impl std::fmt::Display) -> Self {
        Self::Codec {
            format,
            message: message.to_string(),
        }
    }
}

/// One format's encoder (see the module docs).
trait Encode: Send {
    /// Encodes `samples`, appending the bytes ready now to `out`.
    fn push(&mut self, samples: &[f32], out: &mut Vec<u8>) -> Result<(), EncodeError>;

    /// Ends the stream, appending the rest to `out`.
    fn finish(self: Box<Self>, out: &mut Vec<u8>) -> Result<(), EncodeError>;
}

/// The encoder of `format` (the one place a format is matched to its code).
fn encoder_for(
    format: AudioFormat,
    sample_rate: u32,
    framing: Framing,
) -> Result<Box<dyn Encode>, EncodeError> {
    Ok(match format {
        AudioFormat::Mp3 => Box::new(mp3::Mp3::new(sample_rate)?),
        AudioFormat::Opus => Box::new(opus::OggOpus::new(sample_rate, framing)?),
        AudioFormat::Wav => Box::new(wav::Wav::new(sample_rate, framing)),
        AudioFormat::Flac => Box::new(flac::Flac::new(sample_rate, framing)),
        AudioFormat::Pcm => Box::new(wav::Pcm),
    })
}

/// Mono samples in, encoded bytes out (see the module docs).
pub struct Encoder {
    format: AudioFormat,
    inner: Box<dyn Encode>,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

impl Encoder {
    /// An encoder of `format` for audio at `sample_rate` Hz.
    pub fn new(
        format: AudioFormat,
        sample_rate: u32,
        framing: Framing,
    ) -> Result<Encoder, EncodeError> {
        Ok(Encoder {
            format,
            inner: encoder_for(format, sample_rate, framing)?,
        })
    }

    /// Encodes `samples`; the bytes ready now (streamed: playable as they come; whole:
    /// possibly nothing until [`Encoder::finish`]).
    pub fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::new();
        self.inner.push(samples, &mut out)?;
        Ok(out)
    }

    /// Ends the stream: the bytes that are left.
    pub fn finish(self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::new();
        self.inner.finish(&mut out)?;
        Ok(out)
    }
}

/// Encodes mono `samples` at `sample_rate` Hz as one whole `format` answer.
pub fn encode(
    samples: &[f32],
    sample_rate: u32,
    format: AudioFormat,
) -> Result<Vec<u8>, EncodeError> {
    let mut encoder = Encoder::new(format, sample_rate, Framing::Whole)?;
    let mut out = encoder.push(samples)?;
    out.extend(encoder.finish()?);
    Ok(out)
}

/// One sample in [-1, 1] as 16-bit: clamped, scaled by 32767 and rounded (NaN is 0).
pub fn to_i16(sample: f32) -> i16 {
    if sample.is_nan() {
        return 0;
    }
    (sample.clamp(-1.0, 1.0) * 32767.0).round() as i16
}

/// Samples in [-1, 1] as 16-bit ([`to_i16`]).
fn pcm16(samples: &[f32]) -> Vec<i16> {
    samples.iter().copied().map(to_i16).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_clamp_and_round() {
        assert_eq!(to_i16(1.5), 32767);
        assert_eq!(to_i16(-1.5), -32767);
        assert_eq!(to_i16(0.5), 16384);
        assert_eq!(to_i16(f32::NAN), 0);
    }
}
