//! Mono audio in and out for Arcane's speech engines.
//!
//! * [`Resampler`]: a band-limited resampler fed piece by piece (Whisper reads 16 kHz
//!   whatever was uploaded; Opus encodes 48 kHz whatever a voice makes).
//! * [`Encoder`]: the encodings of OpenAI's `/v1/audio/speech` ([`AudioFormat`]: MP3,
//!   Ogg Opus, WAV, FLAC, raw PCM), either whole or [`Framing::Streamed`], where each
//!   piece of audio pushed gives the bytes a client can play at once.
//!
//! Why these encoders: MP3 is OpenAI's default `response_format`, and what clients
//! such as Open WebUI expect; LAME is its reference encoder, built from source by the
//! `mp3lame-encoder` crate. Opus is libopus, built from source by the `opus` crate,
//! in Ogg pages written by the `ogg` crate. WAV and FLAC need no codec and are written
//! here. AAC is not offered: the one well-kept AAC encoder, Fraunhofer's FDK, is under a
//! license Debian does not count as free.
#![warn(missing_docs)]

mod encode;
mod format;
mod resample;

pub use encode::{encode, to_i16, EncodeError, Encoder, Framing};
pub use format::AudioFormat;
pub use resample::{resample, Resampler, MAX_RATE, MIN_RATE};
