//! Speech to text for Arcane.
//!
//! * [`audio`]: an uploaded file (WAV, FLAC, MP3, Ogg/Vorbis) to 16 kHz mono, with
//!   bounds on its size and duration.
//! * [`transcribe`]: whisper.cpp, through `whisper-rs` (built from its bundled
//!   source with cmake, CPU only), on those samples.
//! * [`worker`]: the worker process the Core host owns and its line protocol (the
//!   engine is reachable only through the Core: no port, no socket).
//! * [`format`]: OpenAI's response formats (`json`, `text`, `srt`, `verbose_json`,
//!   `vtt`) of a transcript.

pub mod audio;
pub mod format;
pub mod transcribe;
pub mod worker;

pub use audio::{decode, Audio, AudioError, Limits};
pub use transcribe::{Model, Options, Segment, Task, TranscribeError, Transcript};
