//! Uploaded audio to what Whisper reads: 16 kHz mono `f32` samples.
//!
//! WAV (any rate, any channel count, integer or float samples), FLAC, MP3 and
//! Ogg/Vorbis are decoded by `symphonia`; channels are averaged to mono and the result
//! is resampled to 16 kHz by `rubato`'s band-limited FFT resampler. The container is
//! recognised by its first bytes, so a file whose format is not one of these is
//! refused naming the format it is (MP4/M4A, WebM, …) rather than a decoder's error.
//! Uploads are bounded in size ([`MAX_UPLOAD_BYTES`]) and in duration
//! ([`MAX_DURATION_SECONDS`]); the duration is checked while decoding, so a long file
//! is refused before it is held whole.

use std::io::Cursor;

use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Resampler};
use symphonia::core::codecs::audio::AudioDecoderOptions;
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, TrackType};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;

/// Whisper's sample rate.
pub const SAMPLE_RATE: u32 = 16_000;

/// The largest upload accepted (OpenAI's bound: 25 MiB).
pub const MAX_UPLOAD_BYTES: usize = 25 * 1024 * 1024;

/// The longest audio accepted, in seconds (one hour).
pub const MAX_DURATION_SECONDS: f64 = 3600.0;

/// Why audio could not be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AudioError {
    /// The bytes are in a format Arcane does not decode (or in none it recognises).
    #[error(
        "cannot decode the file (format: {format}): the formats understood are WAV, FLAC, MP3 and Ogg/Vorbis"
    )]
    Unsupported {
        /// The format the bytes are in, as far as their first bytes tell.
        format: String,
    },
    /// A recognised format whose contents are broken.
    #[error("the {format} audio is damaged: {reason}")]
    Damaged {
        /// The format.
        format: String,
        /// The decoder's words.
        reason: String,
    },
    /// No samples at all.
    #[error("the {format} file holds no audio")]
    Empty {
        /// The format.
        format: String,
    },
    /// More bytes than [`MAX_UPLOAD_BYTES`].
    #[error("the upload is {size} bytes; at most {limit} are accepted")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The bound.
        limit: usize,
    },
    /// Longer than [`MAX_DURATION_SECONDS`].
    #[error("the audio is longer than {limit} seconds")]
    TooLong {
        /// The bound.
        limit: f64,
    },
}

/// Decoded audio, ready for Whisper.
#[derive(Debug, Clone)]
pub struct Audio {
    /// 16 kHz mono samples in [-1, 1].
    pub samples: Vec<f32>,
    /// The format it came in (`wav`, `flac`, `mp3`, `ogg`).
    pub format: &'static str,
    /// Its own sample rate.
    pub source_rate: u32,
    /// Its own channel count.
    pub source_channels: usize,
}

impl Audio {
    /// Its duration in seconds.
    pub fn duration(&self) -> f64 {
        self.samples.len() as f64 / f64::from(SAMPLE_RATE)
    }
}

/// The format the first bytes say, and whether it is one Arcane decodes.
pub fn sniff(bytes: &[u8]) -> (&'static str, bool) {
    let starts = |magic: &[u8]| bytes.starts_with(magic);
    if starts(b"RIFF") && bytes.get(8..12) == Some(b"WAVE") {
        ("wav", true)
    } else if starts(b"fLaC") {
        ("flac", true)
    } else if starts(b"OggS") {
        // Ogg/Opus is not decoded; the first page's codec header says which.
        if bytes.windows(8).take(64).any(|w| w == b"OpusHead") {
            ("Ogg/Opus", false)
        } else {
            ("ogg", true)
        }
    } else if starts(b"ID3") || (bytes.len() > 1 && bytes[0] == 0xFF && bytes[1] & 0xE0 == 0xE0) {
        ("mp3", true)
    } else if bytes.get(4..8) == Some(b"ftyp") {
        ("MP4/M4A", false)
    } else if starts(&[0x1A, 0x45, 0xDF, 0xA3]) {
        ("WebM/Matroska", false)
    } else if starts(b"RIFF") {
        ("RIFF (not WAVE)", false)
    } else if starts(b"FORM") {
        ("AIFF", false)
    } else if starts(b"#!AMR") {
        ("AMR", false)
    } else {
        ("unknown", false)
    }
}

/// Bounds on an upload.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Its size in bytes.
    pub max_bytes: usize,
    /// Its duration in seconds.
    pub max_seconds: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: MAX_UPLOAD_BYTES,
            max_seconds: MAX_DURATION_SECONDS,
        }
    }
}

/// Decodes `bytes` (a whole uploaded file) to 16 kHz mono, within the default
/// [`Limits`].
pub fn decode(bytes: &[u8]) -> Result<Audio, AudioError> {
    decode_with(bytes, &Limits::default())
}

/// Decodes `bytes` to 16 kHz mono within `limits`.
pub fn decode_with(bytes: &[u8], limits: &Limits) -> Result<Audio, AudioError> {
    if bytes.len() > limits.max_bytes {
        return Err(AudioError::TooLarge {
            size: bytes.len(),
            limit: limits.max_bytes,
        });
    }
    let (format, supported) = sniff(bytes);
    if !supported {
        return Err(AudioError::Unsupported {
            format: format.to_string(),
        });
    }
    let damaged = |reason: String| AudioError::Damaged {
        format: format.to_string(),
        reason,
    };
    let mut hint = Hint::new();
    hint.with_extension(format);
    let source = MediaSourceStream::new(Box::new(Cursor::new(bytes.to_vec())), Default::default());
    let mut reader = symphonia::default::get_probe()
        .probe(
            &hint,
            source,
            FormatOptions::default(),
            MetadataOptions::default(),
        )
        .map_err(|e| match e {
            SymphoniaError::Unsupported(_) => AudioError::Unsupported {
                format: format.to_string(),
            },
            e => damaged(e.to_string()),
        })?;
    let track = reader
        .default_track(TrackType::Audio)
        .ok_or_else(|| AudioError::Empty {
            format: format.to_string(),
        })?;
    let track_id = track.id;
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .ok_or_else(|| AudioError::Empty {
            format: format.to_string(),
        })?
        .clone();
    let mut decoder = symphonia::default::get_codecs()
        .make_audio_decoder(&params, &AudioDecoderOptions::default())
        .map_err(|_| AudioError::Unsupported {
            format: format!("{format} (its codec)"),
        })?;

    let mut mono: Vec<f32> = Vec::new();
    let mut rate = params.sample_rate.unwrap_or(0);
    let mut channels = 0usize;
    let mut interleaved: Vec<f32> = Vec::new();
    loop {
        let packet = match reader.next_packet() {
            Ok(Some(packet)) => packet,
            Ok(None) => break,
            // A truncated last packet ends the stream, as players treat it.
            Err(SymphoniaError::IoError(_)) if !mono.is_empty() => break,
            Err(e) => return Err(damaged(e.to_string())),
        };
        if packet.track_id != track_id {
            continue;
        }
        let decoded = match decoder.decode(&packet) {
            Ok(decoded) => decoded,
            // One bad packet is skipped, as players do.
            Err(SymphoniaError::DecodeError(_)) => continue,
            Err(e) => return Err(damaged(e.to_string())),
        };
        let spec = decoded.spec();
        rate = spec.rate();
        channels = spec.channels().count().max(1);
        interleaved.resize(decoded.samples_interleaved(), 0.0);
        decoded.copy_to_slice_interleaved(&mut interleaved);
        mono.extend(
            interleaved
                .chunks_exact(channels)
                .map(|frame| frame.iter().sum::<f32>() / channels as f32),
        );
        if rate > 0 && mono.len() as f64 / f64::from(rate) > limits.max_seconds {
            return Err(AudioError::TooLong {
                limit: limits.max_seconds,
            });
        }
    }
    if mono.is_empty() || rate == 0 {
        return Err(AudioError::Empty {
            format: format.to_string(),
        });
    }
    let samples = resample(&mono, rate).map_err(damaged)?;
    Ok(Audio {
        samples,
        format,
        source_rate: rate,
        source_channels: channels,
    })
}

/// Resamples mono `samples` at `rate` to [`SAMPLE_RATE`] (band-limited: what lies
/// above the lower Nyquist frequency is filtered out, not folded back).
pub fn resample(samples: &[f32], rate: u32) -> Result<Vec<f32>, String> {
    if rate == SAMPLE_RATE {
        return Ok(samples.to_vec());
    }
    let mut resampler = Fft::<f32>::new(
        rate as usize,
        SAMPLE_RATE as usize,
        1024,
        1,
        FixedSync::Input,
    )
    .map_err(|e| e.to_string())?;
    let input = InterleavedSlice::new(samples, 1, samples.len()).map_err(|e| e.to_string())?;
    let output = resampler
        .process_all(&input, samples.len(), None)
        .map_err(|e| e.to_string())?;
    Ok(output.take_data())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A WAV file of 16-bit samples (interleaved `frames` of `channels`).
    fn wav(rate: u32, channels: u16, samples: &[i16]) -> Vec<u8> {
        let data_len = (samples.len() * 2) as u32;
        let mut out = Vec::new();
        out.extend_from_slice(b"RIFF");
        out.extend_from_slice(&(36 + data_len).to_le_bytes());
        out.extend_from_slice(b"WAVEfmt ");
        out.extend_from_slice(&16u32.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&channels.to_le_bytes());
        out.extend_from_slice(&rate.to_le_bytes());
        out.extend_from_slice(&(rate * u32::from(channels) * 2).to_le_bytes());
        out.extend_from_slice(&(channels * 2).to_le_bytes());
        out.extend_from_slice(&16u16.to_le_bytes());
        out.extend_from_slice(b"data");
        out.extend_from_slice(&data_len.to_le_bytes());
        for s in samples {
            out.extend_from_slice(&s.to_le_bytes());
        }
        out
    }

    fn tone(rate: u32, hz: f64, seconds: f64, amplitude: f64) -> Vec<f64> {
        let n = (f64::from(rate) * seconds) as usize;
        (0..n)
            .map(|i| {
                amplitude * (2.0 * std::f64::consts::PI * hz * i as f64 / f64::from(rate)).sin()
            })
            .collect()
    }

    fn to_i16(x: f64) -> i16 {
        (x * 32767.0).round() as i16
    }

    /// The amplitude of `hz` in `samples` (16 kHz), by correlation over the middle.
    fn amplitude_at(samples: &[f32], hz: f64) -> f64 {
        let middle = &samples[samples.len() / 4..samples.len() * 3 / 4];
        let (mut re, mut im) = (0.0, 0.0);
        for (i, s) in middle.iter().enumerate() {
            let phase = 2.0 * std::f64::consts::PI * hz * i as f64 / f64::from(SAMPLE_RATE);
            re += f64::from(*s) * phase.cos();
            im += f64::from(*s) * phase.sin();
        }
        2.0 * (re * re + im * im).sqrt() / middle.len() as f64
    }

    #[test]
    fn wav_at_8_khz_mono_is_resampled_to_16_khz_keeping_its_tone() {
        let samples: Vec<i16> = tone(8000, 440.0, 1.0, 0.5)
            .into_iter()
            .map(to_i16)
            .collect();
        let audio = decode(&wav(8000, 1, &samples)).unwrap();
        assert_eq!(audio.format, "wav");
        assert_eq!(audio.source_rate, 8000);
        assert_eq!(audio.source_channels, 1);
        assert!(
            (audio.duration() - 1.0).abs() < 0.01,
            "{}",
            audio.duration()
        );
        let a = amplitude_at(&audio.samples, 440.0);
        assert!((a - 0.5).abs() < 0.02, "440 Hz amplitude {a}");
    }

    #[test]
    fn wav_at_44_1_khz_stereo_is_mixed_to_mono_and_band_limited() {
        // Left: 440 Hz; right: 1000 Hz plus a 12 kHz tone above 16 kHz's Nyquist
        // frequency, which must be filtered out, not folded to 4 kHz.
        let left = tone(44_100, 440.0, 1.0, 0.4);
        let right: Vec<f64> = tone(44_100, 1000.0, 1.0, 0.4)
            .iter()
            .zip(tone(44_100, 12_000.0, 1.0, 0.4))
            .map(|(a, b)| a + b)
            .collect();
        let interleaved: Vec<i16> = left
            .iter()
            .zip(&right)
            .flat_map(|(l, r)| [to_i16(*l), to_i16(*r)])
            .collect();
        let audio = decode(&wav(44_100, 2, &interleaved)).unwrap();
        assert_eq!(audio.source_rate, 44_100);
        assert_eq!(audio.source_channels, 2);
        assert!(
            (audio.duration() - 1.0).abs() < 0.01,
            "{}",
            audio.duration()
        );
        let a440 = amplitude_at(&audio.samples, 440.0);
        let a1000 = amplitude_at(&audio.samples, 1000.0);
        let alias = amplitude_at(&audio.samples, 4000.0);
        assert!((a440 - 0.2).abs() < 0.02, "440 Hz amplitude {a440}");
        assert!((a1000 - 0.2).abs() < 0.02, "1000 Hz amplitude {a1000}");
        assert!(
            alias < 0.01,
            "12 kHz folded to 4 kHz with amplitude {alias}"
        );
    }

    #[test]
    fn audio_at_16_khz_is_kept_sample_for_sample() {
        let samples: Vec<i16> = (0..1600).map(|i| (i * 10) as i16).collect();
        let audio = decode(&wav(16_000, 1, &samples)).unwrap();
        assert_eq!(audio.samples.len(), 1600);
        assert!((audio.samples[100] - 1000.0 / 32768.0).abs() < 1e-6);
    }

    #[test]
    fn formats_arcane_does_not_decode_are_named() {
        let mp4 = b"\0\0\0\x20ftypM4A \0\0\0\0";
        assert_eq!(
            decode(mp4).unwrap_err(),
            AudioError::Unsupported {
                format: "MP4/M4A".into()
            }
        );
        let webm = [0x1A, 0x45, 0xDF, 0xA3, 0, 0, 0, 0];
        assert!(decode(&webm).unwrap_err().to_string().contains("WebM"));
        let text = b"hello, this is not audio";
        assert!(decode(text)
            .unwrap_err()
            .to_string()
            .contains("format: unknown"));
    }

    #[test]
    fn damaged_and_empty_files_are_refused() {
        let mut broken = wav(16_000, 1, &[0; 100]);
        broken.truncate(20);
        assert!(
            matches!(
                decode(&broken),
                Err(AudioError::Damaged { .. }) | Err(AudioError::Empty { .. })
            ),
            "{:?}",
            decode(&broken)
        );
        assert!(matches!(
            decode(&wav(16_000, 1, &[])),
            Err(AudioError::Empty { .. }) | Err(AudioError::Damaged { .. })
        ));
    }

    #[test]
    fn flac_is_decoded_and_resampled() {
        // Encoded by the FLAC writer of Arcane's voices (real FLAC from libsndfile is
        // decoded in tests/jfk.rs).
        let samples: Vec<f32> = tone(44_100, 440.0, 1.0, 0.5)
            .into_iter()
            .map(|x| x as f32)
            .collect();
        let flac = arcane_piper::encode(&samples, 44_100, arcane_piper::AudioFormat::Flac);
        let audio = decode(&flac).unwrap();
        assert_eq!(audio.format, "flac");
        assert_eq!(audio.source_rate, 44_100);
        assert!(
            (audio.duration() - 1.0).abs() < 0.01,
            "{}",
            audio.duration()
        );
        let a = amplitude_at(&audio.samples, 440.0);
        assert!((a - 0.5).abs() < 0.02, "440 Hz amplitude {a}");
    }

    #[test]
    fn audio_past_the_duration_bound_is_refused() {
        let samples = vec![0i16; 16_000 * 3];
        let limits = Limits {
            max_bytes: MAX_UPLOAD_BYTES,
            max_seconds: 2.0,
        };
        assert_eq!(
            decode_with(&wav(16_000, 1, &samples), &limits).unwrap_err(),
            AudioError::TooLong { limit: 2.0 }
        );
    }

    #[test]
    fn uploads_past_the_bound_are_refused_before_decoding() {
        let big = vec![0u8; MAX_UPLOAD_BYTES + 1];
        assert!(matches!(decode(&big), Err(AudioError::TooLarge { .. })));
    }
}
