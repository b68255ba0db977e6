//! Piper text-to-speech on ONNX Runtime, as a library (the HTTP worker that serves
//! `/v1/audio/speech` calls it).
//!
//! * [`Voice`]: a Piper voice (the ONNX graph and its `.onnx.json`) opened on the CPU
//!   with an [`arcane_onnx::Runtime`]; [`Voice::synthesize`] turns text into mono
//!   samples in [-1, 1] the way Piper does, sentence by sentence; [`Voice::prepare`] and [`Voice::speak`] give each sentence
//!   as soon as it is made, for an answer that streams.
//! * [`Phonemizer`]: espeak-ng run as a child process with a deadline on every call,
//!   its IPA output given back the clause punctuation Piper's own phonemizer keeps.
//! * [`Encoder`] and [`encode`] (from `arcane-audio`, re-exported): the samples as MP3,
//!   Ogg Opus, WAV, FLAC or raw PCM ([`AudioFormat`]), whole or streamed.
//! * [`Error`]: one stable code per variant ([`Error::code`]).
//!
//! The crate never prints or exits; it reads the environment only in
//! [`Phonemizer::find`], which looks up `PATH` because that is what it is asked to do.
#![warn(missing_docs)]

mod config;
mod error;
mod phonemize;
mod voice;

pub use arcane_audio::{encode, to_i16, AudioFormat, EncodeError, Encoder, Framing};
pub use config::{
    config_path, parse_config, read_config, VoiceConfig, MAX_CONFIG_BYTES, MAX_IDS_PER_PHONEME,
    MAX_PHONEMES,
};
pub use error::Error;
pub use phonemize::{PhonemeIds, Phonemizer, DEFAULT_TIMEOUT};
pub use voice::{
    release_memory, Script, Voice, MAX_CHUNK_PHONEMES, MAX_REQUEST_PHONEMES, MAX_SPEED,
    MAX_TEXT_CHARS, MIN_SPEED, SENTENCE_SILENCE_SECONDS,
};

#[cfg(test)]
mod tests {
    /// The HTTP worker shares one voice and one phonemizer between request threads.
    #[test]
    fn voices_and_phonemizers_can_be_shared_between_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<super::Voice>();
        shared::<super::Phonemizer>();
        shared::<super::Error>();
    }
}
