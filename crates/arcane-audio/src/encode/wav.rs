//! WAV (RIFF PCM 16-bit mono) and raw PCM.

use super::{pcm16, Encode, EncodeError, Framing};

/// The size fields of a streamed WAV: unknown (what OpenAI's streamed WAV carries;
/// readers then read to the end of the data).
const UNKNOWN: u32 = u32::MAX;

/// WAV: whole, the samples are kept and the header written with their size at the
/// end; streamed, the header (sizes unknown) goes out with the first samples.
pub(super) struct Wav {
    rate: u32,
    framing: Framing,
    kept: Vec<i16>,
    header_sent: bool,
}

impl Wav {
    pub(super) fn new(rate: u32, framing: Framing) -> Self {
        Wav {
            rate,
            framing,
            kept: Vec::new(),
            header_sent: false,
        }
    }

    fn header(&mut self, data_len: u32, out: &mut Vec<u8>) {
        self.header_sent = true;
        let riff_len = if data_len == UNKNOWN {
            UNKNOWN
        } else {
            36 + data_len
        };
        out.extend_from_slice(b"RIFF");
        out.extend_from_slice(&riff_len.to_le_bytes());
        out.extend_from_slice(b"WAVE");
        out.extend_from_slice(b"fmt ");
        out.extend_from_slice(&16u32.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes()); // PCM
        out.extend_from_slice(&1u16.to_le_bytes()); // mono
        out.extend_from_slice(&self.rate.to_le_bytes());
        out.extend_from_slice(&self.rate.saturating_mul(2).to_le_bytes()); // byte rate
        out.extend_from_slice(&2u16.to_le_bytes()); // block align
        out.extend_from_slice(&16u16.to_le_bytes()); // bits per sample
        out.extend_from_slice(b"data");
        out.extend_from_slice(&data_len.to_le_bytes());
    }
}

impl Encode for Wav {
    fn push(&mut self, samples: &[f32], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        match self.framing {
            Framing::Whole => self.kept.extend(pcm16(samples)),
            Framing::Streamed => {
                if !self.header_sent {
                    self.header(UNKNOWN, out);
                }
                Pcm.push(samples, out)?;
            }
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        match self.framing {
            Framing::Streamed if !self.header_sent => self.header(UNKNOWN, out),
            Framing::Streamed => {}
            Framing::Whole => {
                // Sizes past 4 GiB saturate (no WAV reader copes with them anyway;
                // 4096 characters of speech are a few megabytes).
                let data_len = u32::try_from(self.kept.len() * 2).unwrap_or(UNKNOWN - 36);
                self.header(data_len, out);
                out.extend(self.kept.iter().flat_map(|s| s.to_le_bytes()));
            }
        }
        Ok(())
    }
}

/// Raw little-endian signed 16-bit samples: nothing to wait for.
pub(super) struct Pcm;

impl Encode for Pcm {
    fn push(&mut self, samples: &[f32], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        out.extend(pcm16(samples).iter().flat_map(|s| s.to_le_bytes()));
        Ok(())
    }

    fn finish(self: Box<Self>, _out: &mut Vec<u8>) -> Result<(), EncodeError> {
        Ok(())
    }
}
