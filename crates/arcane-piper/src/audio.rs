//! Encoding synthesized audio the ways OpenAI's `/v1/audio/speech` offers in its
//! `response_format` that need no lossy codec: WAV, raw PCM and FLAC, all mono 16-bit.
//!
//! FLAC is written here rather than by a library: the stream uses VERBATIM subframes
//! (the samples as they are, which every decoder reads), so the encoder is a header,
//! frame headers and two CRCs, with no dependency to build. The MD5 signature in
//! STREAMINFO is left zero, which the format defines as "not computed".

/// Output encodings (OpenAI's `response_format` for /v1/audio/speech: wav, pcm, flac).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AudioFormat {
    /// RIFF WAVE, PCM 16-bit mono.
    Wav,
    /// Raw little-endian signed 16-bit samples, no header.
    Pcm,
    /// FLAC, 16-bit mono.
    Flac,
}

impl AudioFormat {
    /// Every format.
    pub const ALL: [AudioFormat; 3] = [Self::Wav, Self::Pcm, Self::Flac];

    /// The format named `s` (`wav`, `pcm`, `flac`; case-insensitive), if supported.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|f| f.as_str().eq_ignore_ascii_case(s))
    }

    /// The HTTP `Content-Type` of the encoding.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Wav => "audio/wav",
            Self::Pcm => "audio/pcm",
            Self::Flac => "audio/flac",
        }
    }

    /// The name OpenAI's `response_format` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Wav => "wav",
            Self::Pcm => "pcm",
            Self::Flac => "flac",
        }
    }
}

impl std::fmt::Display for AudioFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One sample in [-1, 1] as 16-bit: clamped, scaled by 32767 and rounded (NaN is 0).
pub fn to_i16(sample: f32) -> i16 {
    if sample.is_nan() {
        return 0;
    }
    (sample.clamp(-1.0, 1.0) * 32767.0).round() as i16
}

/// Encodes mono samples as 16-bit: WAV (RIFF PCM), raw little-endian s16 (`pcm`), or
/// FLAC.
pub fn encode(samples: &[f32], sample_rate: u32, format: AudioFormat) -> Vec<u8> {
    let pcm: Vec<i16> = samples.iter().copied().map(to_i16).collect();
    match format {
        AudioFormat::Wav => wav(&pcm, sample_rate),
        AudioFormat::Pcm => pcm.iter().flat_map(|s| s.to_le_bytes()).collect(),
        AudioFormat::Flac => flac(&pcm, sample_rate),
    }
}

/// A 44-byte RIFF header and the samples. Sizes past 4 GiB saturate (no WAV reader
/// copes with them anyway; 4096 characters of speech are a few megabytes).
fn wav(pcm: &[i16], sample_rate: u32) -> Vec<u8> {
    let data_len = u32::try_from(pcm.len() * 2).unwrap_or(u32::MAX - 36);
    let mut out = Vec::with_capacity(44 + pcm.len() * 2);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data_len).to_le_bytes());
    out.extend_from_slice(b"WAVE");
    out.extend_from_slice(b"fmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes()); // PCM
    out.extend_from_slice(&1u16.to_le_bytes()); // mono
    out.extend_from_slice(&sample_rate.to_le_bytes());
    out.extend_from_slice(&(sample_rate.saturating_mul(2)).to_le_bytes()); // byte rate
    out.extend_from_slice(&2u16.to_le_bytes()); // block align
    out.extend_from_slice(&16u16.to_le_bytes()); // bits per sample
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    out.extend(pcm.iter().flat_map(|s| s.to_le_bytes()));
    out
}

/// Samples per FLAC frame (the format's common choice).
const FLAC_BLOCK: usize = 4096;

/// A FLAC stream: `fLaC`, STREAMINFO, then one frame per [`FLAC_BLOCK`] samples with a
/// VERBATIM subframe.
fn flac(pcm: &[i16], sample_rate: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(42 + pcm.len() * 2 + pcm.len() / FLAC_BLOCK * 16);
    out.extend_from_slice(b"fLaC");
    // Metadata block header: last block, type 0 (STREAMINFO), 34 bytes.
    out.extend_from_slice(&[0x80, 0, 0, 34]);
    out.extend_from_slice(&(FLAC_BLOCK as u16).to_be_bytes()); // minimum block size
    out.extend_from_slice(&(FLAC_BLOCK as u16).to_be_bytes()); // maximum block size
    out.extend_from_slice(&[0; 3]); // minimum frame size: unknown
    out.extend_from_slice(&[0; 3]); // maximum frame size: unknown
                                    // 20 bits rate, 3 bits channels - 1, 5 bits bits per sample - 1, 36 bits samples.
    let total = (pcm.len() as u64).min((1 << 36) - 1);
    let packed = (u64::from(sample_rate & 0xF_FFFF) << 44) | (15 << 36) | total;
    out.extend_from_slice(&packed.to_be_bytes());
    out.extend_from_slice(&[0; 16]); // MD5: not computed
    let (rate_code, rate_tail) = rate_code(sample_rate);
    for (number, block) in pcm.chunks(FLAC_BLOCK).enumerate() {
        let start = out.len();
        out.extend_from_slice(&[0xFF, 0xF8]); // sync, fixed block size
        out.push((7 << 4) | rate_code); // block size: 16 bits at the end of the header
        out.push(0b1000); // mono, 16 bits per sample
        push_coded_number(&mut out, number as u64);
        out.extend_from_slice(&((block.len() - 1) as u16).to_be_bytes());
        out.extend_from_slice(&rate_tail);
        let crc = crc8(&out[start..]);
        out.push(crc);
        out.push(0b0000_0010); // VERBATIM subframe, no wasted bits
        out.extend(block.iter().flat_map(|s| s.to_be_bytes()));
        let crc = crc16(&out[start..]);
        out.extend_from_slice(&crc.to_be_bytes());
    }
    out
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
    fn formats_parse_and_name_themselves() {
        for format in AudioFormat::ALL {
            assert_eq!(AudioFormat::parse(format.as_str()), Some(format));
        }
        assert_eq!(AudioFormat::parse("FLAC"), Some(AudioFormat::Flac));
        assert_eq!(AudioFormat::parse("mp3"), None);
        assert_eq!(AudioFormat::Wav.content_type(), "audio/wav");
    }

    #[test]
    fn samples_clamp_and_round() {
        assert_eq!(to_i16(1.5), 32767);
        assert_eq!(to_i16(-1.5), -32767);
        assert_eq!(to_i16(0.5), 16384);
        assert_eq!(to_i16(f32::NAN), 0);
    }

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
