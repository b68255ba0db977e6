//! Speech to text for Arcane.
//!
//! * [`audio`]: an uploaded file (WAV, FLAC, MP3, Ogg/Vorbis) to 16 kHz mono, with
//!   bounds on its size and duration.
//! * [`transcribe`]: whisper.cpp, through `whisper-rs` (built from its bundled
//!   source with cmake, CPU only), on those samples.
//! * [`request`]: OpenAI's multipart fields of one request, checked.
//! * [`format`]: OpenAI's response formats (`json`, `text`, `srt`, `verbose_json`,
//!   `vtt`) of a transcript.

pub mod audio;
pub mod format;
pub mod request;
pub mod transcribe;
mod vad;

pub use audio::{decode, Audio, AudioError, Limits};
pub use request::{upload, Field, RequestError, Upload};
pub use transcribe::{Model, OnSegment, Options, Segment, Task, TranscribeError, Transcript, Word};
