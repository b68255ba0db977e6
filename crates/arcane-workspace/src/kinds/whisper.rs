//! whisper.cpp speech recognition, run by Arcane itself (`arcane __whisper-worker`).
//!
//! whisper.cpp's own `whisper-server` answers every origin (`Access-Control-Allow-Origin:
//! *`), has an unauthenticated `POST /load` that loads any path, and can neither listen
//! on a Unix socket nor demand a key: on a loopback port any web page could use it. So
//! Arcane runs whisper.cpp (built into the `arcane` executable through `whisper-rs`) as
//! a builtin engine on the private socket, reachable only through the Core, and serves
//! OpenAI's transcription API itself. It is built without a GPU backend: a GPU target
//! is refused, never silently run on the CPU.

use crate::engine::{
    CommandLine, DevicePlan, EngineKind, Launch, ModelFormat, OwnedListen, Readiness, Starts,
};
use crate::kinds::builtin;

/// The whisper.cpp descriptor.
#[derive(Debug)]
pub(crate) struct Whisper;

impl EngineKind for Whisper {
    fn id(&self) -> &'static str {
        "whisper.cpp"
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["whisper", "whisper-cpp", "whispercpp"]
    }

    fn starts(&self) -> Starts {
        Starts::Builtin {
            subcommand: "__whisper-worker",
        }
    }

    fn default_listen(&self) -> OwnedListen {
        OwnedListen::PrivateSocket
    }

    fn can_close_its_door(&self) -> bool {
        true
    }

    fn classify(&self, status: u16, body: &[u8]) -> Readiness {
        builtin::classify(status, body)
    }

    fn door_args(&self) -> &'static [&'static str] {
        builtin::DOOR_ARGS
    }

    fn device_plan(&self) -> DevicePlan {
        DevicePlan::CpuOnly
    }

    fn formats(&self) -> &'static [ModelFormat] {
        &[ModelFormat::WhisperGgml]
    }

    fn takes_model_file(&self) -> bool {
        true
    }

    fn api_paths(&self) -> &'static [&'static str] {
        &["/v1/audio/transcriptions", "/v1/audio/translations"]
    }

    fn command_line(&self, launch: &Launch<'_>) -> CommandLine {
        builtin::command_line("__whisper-worker", launch)
    }
}
