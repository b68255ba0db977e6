//! Piper voices: text to speech on ONNX Runtime, run by Arcane itself (`arcane
//! __piper-worker`) on the private socket, answering OpenAI's `POST /v1/audio/speech`.
//!
//! The worker loads the registered ONNX Runtime library (`arcane runtime add onnx
//! --library PATH`), phonemizes text with espeak-ng (the phonemizer the voices were
//! trained with) and runs the voice on the CPU; a GPU target is refused.

use crate::engine::{
    CommandLine, DevicePlan, EngineKind, Launch, ModelFormat, OwnedListen, Readiness, Starts,
};
use crate::kinds::builtin;

/// The Piper descriptor.
#[derive(Debug)]
pub(crate) struct Piper;

impl EngineKind for Piper {
    fn id(&self) -> &'static str {
        "piper"
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["piper-tts"]
    }

    fn starts(&self) -> Starts {
        Starts::Builtin {
            subcommand: "__piper-worker",
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
        &[ModelFormat::PiperVoice]
    }

    fn takes_model_file(&self) -> bool {
        true
    }

    fn api_paths(&self) -> &'static [&'static str] {
        &["/v1/audio/speech"]
    }

    fn command_line(&self, launch: &Launch<'_>) -> CommandLine {
        builtin::command_line("__piper-worker", launch)
    }
}
