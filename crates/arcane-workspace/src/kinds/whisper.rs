//! whisper.cpp speech recognition, run by Arcane itself (`arcane __whisper-worker`).
//!
//! whisper.cpp's own `whisper-server` answers every origin (`Access-Control-Allow-Origin:
//! *`), has an unauthenticated `POST /load` that loads any path, and can neither listen
//! on a Unix socket nor demand a key: on a loopback port any web page could use it. So
//! Arcane runs whisper.cpp (built into the `arcane` executable through `whisper-rs`) as
//! a builtin engine on the private socket, reachable only through the Core, and serves
//! OpenAI's transcription API itself. It is built without a GPU backend: a GPU target
//! is refused, never silently run on the CPU.

use crate::engine::{AuxModel, ModelFormat};
use crate::kinds::builtin::BuiltinKind;

/// whisper.cpp's ggml model format (`ggml-tiny.en.bin`), told by its magic.
pub(crate) const GGML: ModelFormat = ModelFormat {
    id: "whisper-ggml",
    label: "whisper.cpp",
    bundled: true,
    companions: &[],
};

/// whisper.cpp's voice-activity model (Silero VAD converted to ggml,
/// `ggml-silero-v6.2.0.bin`): not served by itself, but named by a whisper model's
/// `vad` so that silence is skipped before decoding.
pub(crate) const VAD: ModelFormat = ModelFormat {
    id: "whisper-vad",
    label: "whisper.cpp VAD",
    bundled: true,
    companions: &[],
};

/// The whisper.cpp descriptor.
pub(crate) const WHISPER: BuiltinKind = BuiltinKind {
    id: "whisper.cpp",
    aliases: &["whisper", "whisper-cpp", "whispercpp"],
    subcommand: "__whisper-worker",
    formats: &[GGML],
    api_paths: &["/v1/audio/transcriptions", "/v1/audio/translations"],
    library: None,
    runtime: None,
    model_assets: false,
    aux_models: &[AuxModel {
        key: "vad",
        what: "a voice-activity model",
        format: VAD,
        flag: "--vad-model",
    }],
    parallel_flags: &["--max-workers"],
    // Measured with tiny.en (78 MB): 225 MB at its peak while one worker transcribes.
    memory: crate::MemoryModel::File {
        compute_percent: 160,
        per_request: true,
        runtime: 16 << 20,
    },
};
