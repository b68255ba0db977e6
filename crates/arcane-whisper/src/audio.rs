//! Uploaded audio to what Whisper reads: 16 kHz mono `f32` samples.
//!
//! WAV (integer or float samples), FLAC, MP3 and Ogg/Vorbis are decoded by
//! `symphonia`; channels are averaged to mono and the result is resampled to 16 kHz by
//! a band-limited FFT resampler (`arcane_audio::Resampler`), packet by packet as it is decoded. The
//! container is recognised by its first bytes, so a file whose format is not one of
//! these is refused naming the format it is (MP4/M4A, WebM, …) rather than a decoder's
//! error.
//!
//! A hostile file decides nothing about memory: the upload is bounded in size
//! ([`MAX_UPLOAD_BYTES`]); its sample rate must lie in [`MIN_SAMPLE_RATE`]..=
//! [`MAX_SAMPLE_RATE`] and its channels be at most [`MAX_CHANNELS`], both checked from
//! the header before a decoder or resampler exists (a resampler's FFT is as long as the
//! rate's ratio to 16 kHz); the *decoded* duration is counted packet by packet and
//! bounded by [`MAX_DURATION_SECONDS`], so a small FLAC of silence that expands to days
//! is refused after one hour of it; only the 16 kHz result is held (at most
//! `MAX_DURATION_SECONDS × 16000` samples, 230 MB). A sample that is not finite (a
//! float WAV of NaN or infinity) is refused. Decoding and resampling look at a cancel
//! flag between packets, so a client that goes away stops them.

use std::io::Cursor;
use std::sync::atomic::{AtomicBool, Ordering};

use arcane_audio::Resampler;
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

/// The longest audio accepted, in seconds (one hour), counted on the decoded samples.
pub const MAX_DURATION_SECONDS: f64 = 3600.0;

/// The lowest sample rate accepted (telephone audio).
pub const MIN_SAMPLE_RATE: u32 = 8_000;

/// The highest sample rate accepted (studio audio).
pub const MAX_SAMPLE_RATE: u32 = 192_000;

/// The most channels accepted (7.1 surround).
pub const MAX_CHANNELS: usize = 8;

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
    /// A sample rate outside [`MIN_SAMPLE_RATE`]..=[`MAX_SAMPLE_RATE`].
    #[error("the {format} audio says its sample rate is {rate} Hz; rates from {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz are accepted")]
    BadRate {
        /// The format.
        format: String,
        /// The rate it declares.
        rate: u32,
    },
    /// More channels than [`MAX_CHANNELS`].
    #[error("the {format} audio has {channels} channels; at most {MAX_CHANNELS} are accepted")]
    TooManyChannels {
        /// The format.
        format: String,
        /// The channels it declares.
        channels: usize,
    },
    /// A sample that is NaN or infinite.
    #[error(
        "the {format} audio holds a sample that is not a finite number ({value}) at {seconds:.3} s"
    )]
    NotFinite {
        /// The format.
        format: String,
        /// The sample (`NaN`, `inf`, `-inf`).
        value: String,
        /// Where it is, in seconds from the start.
        seconds: f64,
    },
    /// The cancel flag was set.
    #[error("the decoding was cancelled")]
    Cancelled,
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
    decode_cancellable(bytes, limits, &AtomicBool::new(false))
}

/// Decodes `bytes` to 16 kHz mono within `limits`, stopping with
/// [`AudioError::Cancelled`] once `cancel` is set (looked at between packets).
pub fn decode_cancellable(
    bytes: &[u8],
    limits: &Limits,
    cancel: &AtomicBool,
) -> Result<Audio, AudioError> {
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
    let mut source = Source::open(bytes, format)?;
    let mut decoding = Decoding::new(format, limits);
    while let Some(packet) = source.next(decoding.started())? {
        if cancel.load(Ordering::Relaxed) {
            return Err(AudioError::Cancelled);
        }
        decoding.push(&packet)?;
    }
    decoding.finish()
}

/// An opened container and the decoder of its audio track, its rate and channels
/// checked.
struct Source {
    format: &'static str,
    reader: Box<dyn symphonia::core::formats::FormatReader>,
    decoder: Box<dyn symphonia::core::codecs::audio::AudioDecoder>,
    track_id: u32,
}

/// The interleaved samples of one decoded packet, with their rate and channels.
struct Packet {
    samples: Vec<f32>,
    rate: u32,
    channels: usize,
}

impl Source {
    fn open(bytes: &[u8], format: &'static str) -> Result<Source, AudioError> {
        let mut hint = Hint::new();
        hint.with_extension(format);
        let stream =
            MediaSourceStream::new(Box::new(Cursor::new(bytes.to_vec())), Default::default());
        let reader = symphonia::default::get_probe()
            .probe(
                &hint,
                stream,
                FormatOptions::default(),
                MetadataOptions::default(),
            )
            .map_err(|e| match e {
                SymphoniaError::Unsupported(_) => AudioError::Unsupported {
                    format: format.to_string(),
                },
                e => damaged(format, e.to_string()),
            })?;
        let empty = || AudioError::Empty {
            format: format.to_string(),
        };
        let track = reader.default_track(TrackType::Audio).ok_or_else(empty)?;
        let track_id = track.id;
        let params = track
            .codec_params
            .as_ref()
            .and_then(|p| p.audio())
            .ok_or_else(empty)?
            .clone();
        if let Some(rate) = params.sample_rate {
            check_rate(format, rate)?;
        }
        if let Some(channels) = &params.channels {
            check_channels(format, channels.count())?;
        }
        let decoder = symphonia::default::get_codecs()
            .make_audio_decoder(&params, &AudioDecoderOptions::default())
            .map_err(|_| AudioError::Unsupported {
                format: format!("{format} (its codec)"),
            })?;
        Ok(Source {
            format,
            reader,
            decoder,
            track_id,
        })
    }

    /// The next packet of the track, decoded; `None` at the end. `started`: samples
    /// came before, so a truncated last packet ends the stream, as players treat it.
    fn next(&mut self, started: bool) -> Result<Option<Packet>, AudioError> {
        loop {
            let packet = match self.reader.next_packet() {
                Ok(Some(packet)) => packet,
                Ok(None) => return Ok(None),
                Err(SymphoniaError::IoError(_)) if started => return Ok(None),
                Err(e) => return Err(damaged(self.format, e.to_string())),
            };
            if packet.track_id != self.track_id {
                continue;
            }
            let decoded = match self.decoder.decode(&packet) {
                Ok(decoded) => decoded,
                // One bad packet is skipped, as players do.
                Err(SymphoniaError::DecodeError(_)) => continue,
                Err(e) => return Err(damaged(self.format, e.to_string())),
            };
            let spec = decoded.spec();
            let (rate, channels) = (spec.rate(), spec.channels().count().max(1));
            check_rate(self.format, rate)?;
            check_channels(self.format, channels)?;
            let mut samples = vec![0.0; decoded.samples_interleaved()];
            decoded.copy_to_slice_interleaved(&mut samples);
            return Ok(Some(Packet {
                samples,
                rate,
                channels,
            }));
        }
    }
}

fn damaged(format: &str, reason: String) -> AudioError {
    AudioError::Damaged {
        format: format.to_string(),
        reason,
    }
}

/// Refuses a rate outside [`MIN_SAMPLE_RATE`]..=[`MAX_SAMPLE_RATE`].
fn check_rate(format: &str, rate: u32) -> Result<(), AudioError> {
    if (MIN_SAMPLE_RATE..=MAX_SAMPLE_RATE).contains(&rate) {
        Ok(())
    } else {
        Err(AudioError::BadRate {
            format: format.to_string(),
            rate,
        })
    }
}

/// Refuses more than [`MAX_CHANNELS`] channels.
fn check_channels(format: &str, channels: usize) -> Result<(), AudioError> {
    if channels <= MAX_CHANNELS {
        Ok(())
    } else {
        Err(AudioError::TooManyChannels {
            format: format.to_string(),
            channels,
        })
    }
}

/// Decoded packets mixed to mono, counted against the duration bound and resampled as
/// they come.
struct Decoding {
    format: &'static str,
    max_seconds: f64,
    frames: u64,
    rate: u32,
    channels: usize,
    mono: Vec<f32>,
    resampling: Option<Resampler>,
}

impl Decoding {
    fn new(format: &'static str, limits: &Limits) -> Decoding {
        Decoding {
            format,
            max_seconds: limits.max_seconds,
            frames: 0,
            rate: 0,
            channels: 0,
            mono: Vec::new(),
            resampling: None,
        }
    }

    fn started(&self) -> bool {
        self.frames > 0
    }

    fn push(&mut self, packet: &Packet) -> Result<(), AudioError> {
        if self.rate != 0 && packet.rate != self.rate {
            return Err(damaged(
                self.format,
                format!(
                    "its sample rate changes from {} to {} Hz",
                    self.rate, packet.rate
                ),
            ));
        }
        self.rate = packet.rate;
        self.channels = packet.channels;
        if let Some(at) = packet.samples.iter().position(|s| !s.is_finite()) {
            let frame = self.frames + (at / packet.channels) as u64;
            return Err(AudioError::NotFinite {
                format: self.format.to_string(),
                value: packet.samples[at].to_string(),
                seconds: frame as f64 / f64::from(packet.rate),
            });
        }
        let frames = packet.samples.len() / packet.channels;
        self.frames += frames as u64;
        if self.frames as f64 / f64::from(packet.rate) > self.max_seconds {
            return Err(AudioError::TooLong {
                limit: self.max_seconds,
            });
        }
        self.mono.clear();
        self.mono.extend(
            packet
                .samples
                .chunks_exact(packet.channels)
                .map(|frame| frame.iter().sum::<f32>() / packet.channels as f32),
        );
        if self.resampling.is_none() {
            let resampling = resampler(packet.rate).map_err(|e| damaged(self.format, e))?;
            self.resampling = Some(resampling);
        }
        if let Some(resampling) = &mut self.resampling {
            resampling
                .push(&self.mono)
                .map_err(|e| damaged(self.format, e))?;
        }
        Ok(())
    }

    fn finish(self) -> Result<Audio, AudioError> {
        let empty = AudioError::Empty {
            format: self.format.to_string(),
        };
        let Some(resampling) = self.resampling.filter(|_| self.frames > 0) else {
            return Err(empty);
        };
        let samples = resampling.finish().map_err(|e| damaged(self.format, e))?;
        Ok(Audio {
            samples,
            format: self.format,
            source_rate: self.rate,
            source_channels: self.channels,
        })
    }
}

/// Resamples mono `samples` at `rate` to [`SAMPLE_RATE`] (band-limited: what lies
/// above the lower Nyquist frequency is filtered out, not folded back). `rate` must
/// lie in [`MIN_SAMPLE_RATE`]..=[`MAX_SAMPLE_RATE`].
pub fn resample(samples: &[f32], rate: u32) -> Result<Vec<f32>, String> {
    let mut resampling = resampler(rate)?;
    resampling.push(samples)?;
    resampling.finish()
}

/// A resampler from `rate` (checked against Whisper's bounds) to [`SAMPLE_RATE`].
fn resampler(rate: u32) -> Result<Resampler, String> {
    if !(MIN_SAMPLE_RATE..=MAX_SAMPLE_RATE).contains(&rate) {
        return Err(format!("cannot resample from {rate} Hz"));
    }
    Resampler::new(rate, SAMPLE_RATE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A WAV file: a header for `channels` of `bits`-bit samples (`tag` 1: integer,
    /// 3: float) at `rate`, then `data`.
    fn wav_of(tag: u16, rate: u32, channels: u16, bits: u16, data: &[u8]) -> Vec<u8> {
        let block = channels * bits / 8;
        let mut out = Vec::new();
        out.extend_from_slice(b"RIFF");
        out.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
        out.extend_from_slice(b"WAVEfmt ");
        out.extend_from_slice(&16u32.to_le_bytes());
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&channels.to_le_bytes());
        out.extend_from_slice(&rate.to_le_bytes());
        out.extend_from_slice(&rate.wrapping_mul(u32::from(block)).to_le_bytes());
        out.extend_from_slice(&block.to_le_bytes());
        out.extend_from_slice(&bits.to_le_bytes());
        out.extend_from_slice(b"data");
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
        out
    }

    /// A WAV file of 16-bit samples (interleaved `frames` of `channels`).
    fn wav(rate: u32, channels: u16, samples: &[i16]) -> Vec<u8> {
        let data: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
        wav_of(1, rate, channels, 16, &data)
    }

    /// A WAV file of 32-bit float samples.
    fn float_wav(rate: u32, channels: u16, samples: &[f32]) -> Vec<u8> {
        let data: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
        wav_of(3, rate, channels, 32, &data)
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
        let flac = arcane_audio::encode(&samples, 44_100, arcane_audio::AudioFormat::Flac).unwrap();
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

    #[test]
    fn rates_outside_8_to_192_khz_are_refused_from_the_header() {
        // 64 KB of samples that declared 100000007 Hz took 10.5 GB to resample.
        for rate in [100_000_007, 2_147_483_647, 7_999, 192_001, 1] {
            let error = decode(&wav(rate, 1, &vec![0i16; 32 * 1024])).unwrap_err();
            assert_eq!(
                error,
                AudioError::BadRate {
                    format: "wav".into(),
                    rate
                },
                "{rate}"
            );
            assert!(error.to_string().contains(&rate.to_string()), "{error}");
        }
        for rate in [MIN_SAMPLE_RATE, 22_050, MAX_SAMPLE_RATE, 8_001] {
            let audio = decode(&wav(rate, 1, &vec![0i16; rate as usize / 4])).unwrap();
            assert!((audio.duration() - 0.25).abs() < 0.01, "{rate}");
        }
    }

    #[test]
    fn more_than_eight_channels_are_refused() {
        let error = decode(&wav(16_000, 9, &vec![0i16; 9 * 160])).unwrap_err();
        assert!(
            matches!(
                error,
                AudioError::TooManyChannels { channels: 9, .. } | AudioError::Damaged { .. }
            ),
            "{error:?}"
        );
        assert!(decode(&wav(16_000, 8, &vec![0i16; 8 * 160])).is_ok());
    }

    #[test]
    fn samples_that_are_not_finite_are_refused_naming_where() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut samples = vec![0.25f32; 16_000];
            samples[8_000] = bad;
            let error = decode(&float_wav(16_000, 1, &samples)).unwrap_err();
            match &error {
                AudioError::NotFinite { value, seconds, .. } => {
                    assert_eq!(value, &bad.to_string());
                    assert!((seconds - 0.5).abs() < 1e-6, "{seconds}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        let fine = decode(&float_wav(16_000, 1, &[0.5; 1600])).unwrap();
        assert!((fine.samples[800] - 0.5).abs() < 1e-6);
    }

    #[test]
    fn a_set_cancel_flag_stops_decoding() {
        let samples = vec![0i16; 44_100 * 2];
        let cancel = AtomicBool::new(true);
        assert_eq!(
            decode_cancellable(&wav(44_100, 1, &samples), &Limits::default(), &cancel).unwrap_err(),
            AudioError::Cancelled
        );
    }

    #[test]
    fn resampling_piece_by_piece_keeps_the_length_of_the_whole() {
        for (rate, seconds) in [(8_000u32, 0.01), (44_100, 3.3), (48_000, 0.5)] {
            let samples: Vec<f32> = tone(rate, 440.0, seconds, 0.5)
                .into_iter()
                .map(|x| x as f32)
                .collect();
            let whole = resample(&samples, rate).unwrap();
            let expected = (samples.len() as f64 * 16_000.0 / f64::from(rate)).ceil() as usize;
            assert_eq!(whole.len(), expected, "{rate}");
            let mut pieces = resampler(rate).unwrap();
            for piece in samples.chunks(777) {
                pieces.push(piece).unwrap();
            }
            assert_eq!(pieces.finish().unwrap(), whole, "{rate}");
        }
    }
}
