//! Opus in Ogg (RFC 7845), as OpenAI's `opus` answers: the voice's audio resampled to
//! 48 kHz, 20 ms packets from libopus, an `OpusHead` page, an `OpusTags` page, then
//! the audio pages. The last page's granule position ends the stream exactly where
//! the audio does (decoders drop the encoder's padding), and the first `pre-skip`
//! samples are the encoder's lookahead, which decoders drop too. Streamed, every push
//! ends a page, so what was pushed can be played at once.

use ogg::{PacketWriteEndInfo, PacketWriter};
use opus::{Application, Channels};

use super::{Encode, EncodeError, Framing};
use crate::{AudioFormat, Resampler};

/// The rate Opus runs at (and granule positions count in).
const RATE: u32 = 48_000;

/// Samples per packet: 20 ms at 48 kHz.
const FRAME: usize = 960;

/// The largest packet libopus is given room for (its recommended bound).
const MAX_PACKET: usize = 4000;

/// What the stream says encoded it.
const VENDOR: &str = concat!("arcane ", env!("CARGO_PKG_VERSION"), " (libopus)");

pub(super) struct OggOpus {
    framing: Framing,
    opus: opus::Encoder,
    resampler: Resampler,
    writer: PacketWriter<'static, Vec<u8>>,
    serial: u32,
    pre_skip: u32,
    /// 48 kHz samples not yet in a packet (less than a frame).
    pending: Vec<f32>,
    /// 48 kHz samples of the input (what the last granule position counts).
    input_48k: u64,
    /// 48 kHz samples sent to the encoder (whole packets).
    encoded: u64,
}

fn failed(error: impl std::fmt::Display) -> EncodeError {
    EncodeError::codec(AudioFormat::Opus, error)
}

impl OggOpus {
    pub(super) fn new(rate: u32, framing: Framing) -> Result<Self, EncodeError> {
        let mut opus =
            opus::Encoder::new(RATE, Channels::Mono, Application::Audio).map_err(failed)?;
        let pre_skip = u32::try_from(opus.get_lookahead().map_err(failed)?).unwrap_or(0);
        let resampler = Resampler::new(rate, RATE).map_err(failed)?;
        let serial = serial();
        let mut writer = PacketWriter::new(Vec::new());
        writer
            .write_packet(head(rate, pre_skip), serial, PacketWriteEndInfo::EndPage, 0)
            .map_err(failed)?;
        writer
            .write_packet(tags(), serial, PacketWriteEndInfo::EndPage, 0)
            .map_err(failed)?;
        Ok(OggOpus {
            framing,
            opus,
            resampler,
            writer,
            serial,
            pre_skip,
            pending: Vec::new(),
            input_48k: 0,
            encoded: 0,
        })
    }

    /// Encodes every whole frame pending; the last one ends a page when `end` says so.
    fn packets(&mut self, end: PacketWriteEndInfo) -> Result<(), EncodeError> {
        let frames = self.pending.len() / FRAME;
        let pending = std::mem::take(&mut self.pending);
        for (i, frame) in pending.chunks_exact(FRAME).enumerate() {
            let mut packet = vec![0; MAX_PACKET];
            let len = self.opus.encode_float(frame, &mut packet).map_err(failed)?;
            packet.truncate(len);
            self.encoded += FRAME as u64;
            let last = i + 1 == frames;
            let (info, granule) = match end {
                PacketWriteEndInfo::EndStream if last => {
                    // The end trims the padding: the stream lasts as long as the input.
                    (end, u64::from(self.pre_skip) + self.input_48k)
                }
                _ if last => (end, u64::from(self.pre_skip).max(self.encoded)),
                _ => (
                    PacketWriteEndInfo::NormalPacket,
                    u64::from(self.pre_skip).max(self.encoded),
                ),
            };
            self.writer
                .write_packet(packet, self.serial, info, granule)
                .map_err(failed)?;
        }
        self.pending = pending[frames * FRAME..].to_vec();
        Ok(())
    }

    /// The bytes the writer has made so far, appended to `out`.
    fn drain(&mut self, out: &mut Vec<u8>) {
        out.append(self.writer.inner_mut());
    }
}

impl Encode for OggOpus {
    fn push(&mut self, samples: &[f32], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        self.resampler.push(samples).map_err(failed)?;
        let resampled = self.resampler.take();
        self.input_48k += resampled.len() as u64;
        self.pending.extend(resampled);
        let end = match self.framing {
            Framing::Streamed => PacketWriteEndInfo::EndPage,
            Framing::Whole => PacketWriteEndInfo::NormalPacket,
        };
        self.packets(end)?;
        self.drain(out);
        Ok(())
    }

    fn finish(mut self: Box<Self>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let rest = std::mem::replace(
            &mut self.resampler,
            Resampler::new(RATE, RATE).map_err(failed)?,
        )
        .finish()
        .map_err(failed)?;
        self.input_48k += rest.len() as u64;
        self.pending.extend(rest);
        // The encoder's lookahead still holds the last `pre_skip` samples: encode
        // silence past them, up to a whole frame.
        let total = self.pending.len() + self.pre_skip as usize;
        let padded = total.div_ceil(FRAME).max(1) * FRAME;
        self.pending.resize(padded, 0.0);
        self.packets(PacketWriteEndInfo::EndStream)?;
        self.drain(out);
        Ok(())
    }
}

/// The identification header: version 1, mono, pre-skip, the input's rate, no gain,
/// channel mapping family 0.
fn head(input_rate: u32, pre_skip: u32) -> Vec<u8> {
    let mut head = b"OpusHead".to_vec();
    head.push(1);
    head.push(1);
    head.extend_from_slice(&(pre_skip as u16).to_le_bytes());
    head.extend_from_slice(&input_rate.to_le_bytes());
    head.extend_from_slice(&0i16.to_le_bytes());
    head.push(0);
    head
}

/// The comment header: the vendor and no comments.
fn tags() -> Vec<u8> {
    let mut tags = b"OpusTags".to_vec();
    tags.extend_from_slice(&(VENDOR.len() as u32).to_le_bytes());
    tags.extend_from_slice(VENDOR.as_bytes());
    tags.extend_from_slice(&0u32.to_le_bytes());
    tags
}

/// A stream serial number that differs between streams (RFC 3533 asks for a random
/// one, so that streams can be chained).
fn serial() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_headers_are_rfc_7845s() {
        let head = head(22_050, 312);
        assert_eq!(head.len(), 19);
        assert_eq!(&head[..8], b"OpusHead");
        assert_eq!(u16::from_le_bytes([head[10], head[11]]), 312);
        assert_eq!(
            u32::from_le_bytes([head[12], head[13], head[14], head[15]]),
            22_050
        );
        let tags = tags();
        assert_eq!(&tags[..8], b"OpusTags");
        assert_eq!(tags.len(), 8 + 4 + VENDOR.len() + 4);
    }
}
