//! MP3 by LAME: constant bit rate, no Xing/LAME tag (a tag is written back at the
//! start once the length is known, which a stream cannot do), so whole and streamed
//! answers are the same bytes.

use mp3lame_encoder::{Bitrate, Builder, FlushGap, MonoPcm, Quality};

use super::{pcm16, Encode, EncodeError};
use crate::AudioFormat;

/// The bit rate: ample for one voice (OpenAI's speech is 32 kbit/s per channel at
/// 24 kHz; LAME at 22.05 kHz with 64 kbit/s is transparent for speech).
const BITRATE: Bitrate = Bitrate::Kbps64;

/// The most bytes a final flush writes (LAME's documented bound).
const FLUSH_BYTES: usize = 7200;

pub(super) struct Mp3 {
    lame: mp3lame_encoder::Encoder,
}

fn failed(error: impl std::fmt::Debug) -> EncodeError {
    EncodeError::codec(AudioFormat::Mp3, format!("{error:?}"))
}

impl Mp3 {
    /// A mono encoder for `rate` Hz (LAME keeps an MPEG rate as it is and resamples
    /// any other to the nearest one).
    pub(super) fn new(rate: u32) -> Result<Self, EncodeError> {
        let mut builder = Builder::new().ok_or_else(|| failed("lame_init failed"))?;
        builder.set_num_channels(1).map_err(failed)?;
        builder.set_sample_rate(rate).map_err(failed)?;
        builder.set_brate(BITRATE).map_err(failed)?;
        builder.set_quality(Quality::Good).map_err(failed)?;
        builder.set_to_write_vbr_tag(false).map_err(failed)?;
        Ok(Mp3 {
            lame: builder.build().map_err(failed)?,
        })
    }
}

impl Encode for Mp3 {
    fn push(&mut self, samples: &[f32], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let pcm = pcm16(samples);
        // LAME takes at most `i32::MAX` samples a call; a piece is seconds long.
        for piece in pcm.chunks(1 << 20) {
            out.reserve(mp3lame_encoder::max_required_buffer_size(piece.len()));
            self.lame
                .encode_to_vec(MonoPcm(piece), out)
                .map_err(failed)?;
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        out.reserve(FLUSH_BYTES);
        self.lame.flush_to_vec::<FlushGap>(out).map_err(failed)?;
        Ok(())
    }
}
