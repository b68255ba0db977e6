//! [`AudioFormat`]: the encodings `/v1/audio/speech` answers in, as one table of
//! names and content types.

/// An encoding of mono 16-bit audio (OpenAI's `response_format` for
/// `/v1/audio/speech`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AudioFormat {
    /// MPEG-1/2 Layer III at a constant bit rate (LAME), OpenAI's default.
    Mp3,
    /// Opus in an Ogg container (RFC 7845), at 48 kHz.
    Opus,
    /// RIFF WAVE, PCM 16-bit.
    Wav,
    /// FLAC, 16-bit, stored as it is (VERBATIM subframes).
    Flac,
    /// Raw little-endian signed 16-bit samples, no header.
    Pcm,
}

/// One row of the table: the format, its `response_format` name, its `Content-Type`.
struct Row(AudioFormat, &'static str, &'static str);

const TABLE: [Row; 5] = [
    Row(AudioFormat::Mp3, "mp3", "audio/mpeg"),
    Row(AudioFormat::Opus, "opus", "audio/ogg; codecs=opus"),
    Row(AudioFormat::Wav, "wav", "audio/wav"),
    Row(AudioFormat::Flac, "flac", "audio/flac"),
    Row(AudioFormat::Pcm, "pcm", "audio/pcm"),
];

impl AudioFormat {
    /// Every format, OpenAI's default first.
    pub const ALL: [AudioFormat; 5] = [Self::Mp3, Self::Opus, Self::Wav, Self::Flac, Self::Pcm];

    /// The format named `s` (case-insensitive), if one is encoded here.
    pub fn parse(s: &str) -> Option<Self> {
        TABLE
            .iter()
            .find(|row| row.1.eq_ignore_ascii_case(s))
            .map(|row| row.0)
    }

    fn row(self) -> &'static Row {
        // Every variant has its row (a test checks the table).
        TABLE.iter().find(|row| row.0 == self).unwrap_or(&TABLE[0])
    }

    /// The name `response_format` uses (`mp3`, `opus`, `wav`, `flac`, `pcm`).
    pub fn as_str(self) -> &'static str {
        self.row().1
    }

    /// The HTTP `Content-Type` of the encoding.
    pub fn content_type(self) -> &'static str {
        self.row().2
    }

    /// The names of every format, for an error that lists them.
    pub fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|f| f.as_str()).collect()
    }
}

impl std::fmt::Display for AudioFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_has_its_own_row() {
        for format in AudioFormat::ALL {
            assert_eq!(format.row().0, format);
            assert_eq!(AudioFormat::parse(format.as_str()), Some(format));
        }
        assert_eq!(AudioFormat::parse("MP3"), Some(AudioFormat::Mp3));
        assert_eq!(AudioFormat::parse("aac"), None);
        assert_eq!(AudioFormat::Mp3.content_type(), "audio/mpeg");
        assert_eq!(AudioFormat::names(), ["mp3", "opus", "wav", "flac", "pcm"]);
    }
}
