//! FLAC, written here rather than by a library: the stream uses VERBATIM subframes (the
//! samples as they are, which every decoder reads), so the encoder is a header, frame
//! headers and two CRCs, with no dependency to build. The MD5 signature in STREAMINFO
//! is left zero, which the format defines as "not computed"; streamed, the total
//! number of samples is 0 too, "unknown".

use super::{pcm16, Encode, EncodeError, Framing};

/// Samples per FLAC frame (the format's common choice).
const BLOCK: usize = 4096;

/// A FLAC stream: `fLaC`, STREAMINFO, then one frame per [`BLOCK`] samples (the last
/// one shorter) with a VERBATIM subframe.
pub(super) struct Flac {
    rate: u32,
    framing: Framing,
    /// Samples not yet in a frame: whole, all of them; streamed, less than a block.
    pending: Vec<i16>,
    frames: u64,
    header_sent: bool,
}

impl Flac {
    pub(super) fn new(rate: u32, framing: Framing) -> Self {
        Flac {
            rate,
            framing,
            pending: Vec::new(),
            frames: 0,
            header_sent: false,
        }
    }

    /// `fLaC` and STREAMINFO; `total` samples (0: unknown).
    fn header(&mut self, total: u64, out: &mut Vec<u8>) {
        self.header_sent = true;
        out.extend_from_slice(b"fLaC");
        // Metadata block header: last block, type 0 (STREAMINFO), 34 bytes.
        out.extend_from_slice(&[0x80, 0, 0, 34]);
        out.extend_from_slice(&(BLOCK as u16).to_be_bytes()); // minimum block size
        out.extend_from_slice(&(BLOCK as u16).to_be_bytes()); // maximum block size
        out.extend_from_slice(&[0; 3]); // minimum frame size: unknown
        out.extend_from_slice(&[0; 3]); // maximum frame size: unknown
                                        // 20 bits rate, 3 bits channels - 1, 5 bits bits per sample - 1, 36 bits samples.
        let total = total.min((1 << 36) - 1);
        let packed = (u64::from(self.rate & 0xF_FFFF) << 44) | (15 << 36) | total;
        out.extend_from_slice(&packed.to_be_bytes());
        out.extend_from_slice(&[0; 16]); // MD5: not computed
    }

    /// One frame of `block` (at most [`BLOCK`] samples).
    fn frame(&mut self, block: &[i16], out: &mut Vec<u8>) {
        let (rate_code, rate_tail) = rate_code(self.rate);
        let start = out.len();
        out.extend_from_slice(&[0xFF, 0xF8]); // sync, fixed block size
        out.push((7 << 4) | rate_code); // block size: 16 bits at the end of the header
        out.push(0b1000); // mono, 16 bits per sample
        push_coded_number(out, self.frames);
        out.extend_from_slice(&((block.len() - 1) as u16).to_be_bytes());
        out.extend_from_slice(&rate_tail);
        let crc = crc8(&out[start..]);
        out.push(crc);
        out.push(0b0000_0010); // VERBATIM subframe, no wasted bits
        out.extend(block.iter().flat_map(|s| s.to_be_bytes()));
        let crc = crc16(&out[start..]);
        out.extend_from_slice(&crc.to_be_bytes());
        self.frames += 1;
    }
}

impl Encode for Flac {
    fn push(&mut self, samples: &[f32], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        self.pending.extend(pcm16(samples));
        if self.framing == Framing::Whole {
            return Ok(());
        }
        if !self.header_sent {
            self.header(0, out);
        }
        let pending = std::mem::take(&mut self.pending);
        let mut blocks = pending.chunks_exact(BLOCK);
        for block in &mut blocks {
            self.frame(block, out);
        }
        self.pending = blocks.remainder().to_vec();
        Ok(())
    }

    fn finish(mut self: Box<Self>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        if !self.header_sent {
            self.header(self.pending.len() as u64, out);
        }
        let pending = std::mem::take(&mut self.pending);
        for block in pending.chunks(BLOCK) {
            self.frame(block, out);
        }
        Ok(())
    }
}

/// The frame header's sample-rate code and the bytes it appends, for `rate`.
fn rate_code(rate: u32) -> (u8, Vec<u8>) {
    let table = [
        (88_200, 1),
        (176_400, 2),
        (192_000, 3),
        (8_000, 4),
        (16_000, 5),
        (22_050, 6),
        (24_000, 7),
        (32_000, 8),
        (44_100, 9),
        (48_000, 10),
        (96_000, 11),
    ];
    if let Some((_, code)) = table.iter().find(|(r, _)| *r == rate) {
        return (*code, Vec::new());
    }
    if let Ok(hz) = u16::try_from(rate) {
        return (13, hz.to_be_bytes().to_vec());
    }
    match u16::try_from(rate / 10) {
        Ok(tens) if rate.is_multiple_of(10) => (14, tens.to_be_bytes().to_vec()),
        // From STREAMINFO.
        _ => (0, Vec::new()),
    }
}

/// The frame number in FLAC's extended UTF-8 coding (up to 36 bits).
fn push_coded_number(out: &mut Vec<u8>, n: u64) {
    if n < 0x80 {
        out.push(n as u8);
        return;
    }
    let continuation = match n {
        0..0x800 => 1,
        0x800..0x1_0000 => 2,
        0x1_0000..0x20_0000 => 3,
        0x20_0000..0x400_0000 => 4,
        0x400_0000..0x8000_0000 => 5,
        _ => 6,
    };
    let lead_marker: u8 = !(0xFFu8 >> (continuation + 1));
    let lead_bits = n >> (6 * continuation);
    out.push(lead_marker | lead_bits as u8);
    for i in (0..continuation).rev() {
        out.push(0x80 | ((n >> (6 * i)) & 0x3F) as u8);
    }
}

const fn crc8_table() -> [u8; 256] {
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x80 != 0 {
                (crc << 1) ^ 0x07
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

const fn crc16_table() -> [u16; 256] {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x8005
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

static CRC8: [u8; 256] = crc8_table();
static CRC16: [u16; 256] = crc16_table();

/// FLAC's frame-header CRC-8 (polynomial 0x07, initial 0).
fn crc8(data: &[u8]) -> u8 {
    data.iter().fold(0, |crc, b| CRC8[usize::from(crc ^ b)])
}

/// FLAC's frame CRC-16 (polynomial 0x8005, initial 0).
fn crc16(data: &[u8]) -> u16 {
    data.iter().fold(0, |crc, b| {
        (crc << 8) ^ CRC16[usize::from((crc >> 8) as u8 ^ b)]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crcs_match_known_values() {
        // The CRC-8/SMBUS and CRC-16/UMTS (BUYPASS) check values of "123456789".
        assert_eq!(crc8(b"123456789"), 0xF4);
        assert_eq!(crc16(b"123456789"), 0xFEE8);
    }

    #[test]
    fn frame_numbers_use_the_utf8_coding() {
        let coded = |n| {
            let mut out = Vec::new();
            push_coded_number(&mut out, n);
            out
        };
        assert_eq!(coded(0x7F), vec![0x7F]);
        assert_eq!(coded(0x80), vec![0xC2, 0x80]);
        assert_eq!(coded(0x20AC), "€".as_bytes().to_vec());
        assert_eq!(coded(0x1F600), "😀".as_bytes().to_vec());
        assert_eq!(coded(0x7FFF_FFFF), vec![0xFD, 0xBF, 0xBF, 0xBF, 0xBF, 0xBF]);
    }
}
