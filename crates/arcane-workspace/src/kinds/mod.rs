//! The table of engine kinds: [`Engine`], its [`Engine::ALL`], and [`Engine::kind`],
//! the one place that maps a kind's identity to its descriptor. One module per kind,
//! each implementing [`crate::EngineKind`] and defining its model formats ([`formats`]).
//! A new kind is a new module here, a variant and a row below; every other crate
//! iterates this table and never names a kind (a kind Arcane serves itself is a
//! `builtin::BuiltinKind` constant).

use serde::{Deserialize, Serialize};

use crate::engine::EngineKind;

mod builtin;
pub(crate) mod command;
mod llama_cpp;
mod ollama;
mod onnx;
mod piper;
mod stable_diffusion;
mod whisper;

/// An engine kind Arcane can run. Serialized by its id: `"llama.cpp"`, `"ollama"`,
/// `"onnx"`, `"whisper.cpp"`, `"piper"`, `"stable-diffusion.cpp"` or `"command"`. Everything about a kind is in
/// its descriptor ([`Engine::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Engine {
    /// llama.cpp's `llama-server`.
    #[serde(rename = "llama.cpp")]
    LlamaCpp,
    /// Ollama's `ollama serve`.
    #[serde(rename = "ollama")]
    Ollama,
    /// ONNX Runtime sessions in Arcane's own worker processes.
    #[serde(rename = "onnx")]
    Onnx,
    /// whisper.cpp speech recognition, served by Arcane's own worker.
    #[serde(rename = "whisper.cpp")]
    Whisper,
    /// Piper voices (text to speech on ONNX Runtime), served by Arcane's own worker.
    #[serde(rename = "piper")]
    Piper,
    /// stable-diffusion.cpp image generation, served by Arcane's own worker.
    #[serde(rename = "stable-diffusion.cpp")]
    StableDiffusion,
    /// Any OpenAI-compatible server started from a command line the user gives.
    #[serde(rename = "command")]
    Command,
}

impl Engine {
    /// Every kind, in the order they are listed to users.
    pub const ALL: [Engine; 7] = [
        Engine::LlamaCpp,
        Engine::Ollama,
        Engine::Onnx,
        Engine::Whisper,
        Engine::Piper,
        Engine::StableDiffusion,
        Engine::Command,
    ];

    /// The kind meant where none is named (a runtime, a model, a request): llama.cpp,
    /// the embedded default.
    pub const DEFAULT: Engine = Engine::LlamaCpp;

    /// The descriptor of this kind: the one table from identity to behaviour.
    pub fn kind(self) -> &'static dyn EngineKind {
        match self {
            Engine::LlamaCpp => &llama_cpp::LlamaCpp,
            Engine::Ollama => &ollama::Ollama,
            Engine::Onnx => &onnx::Onnx,
            Engine::Whisper => &whisper::WHISPER,
            Engine::Piper => &piper::PIPER,
            Engine::StableDiffusion => &stable_diffusion::STABLE_DIFFUSION,
            Engine::Command => &command::Command,
        }
    }
}

/// Every model format a kind loads, by name, for the code that reads or writes one
/// format (the registry's readers, a bundle's entries); each is defined in its kind's
/// module.
pub mod formats {
    use crate::engine::ModelFormat;

    /// GGUF, served by llama.cpp.
    pub const GGUF: ModelFormat = super::llama_cpp::GGUF;
    /// Ollama's own store.
    pub const OLLAMA_STORE: ModelFormat = super::ollama::STORE;
    /// An ONNX graph.
    pub const ONNX: ModelFormat = super::onnx::GRAPH;
    /// A whisper.cpp speech-recognition model.
    pub const WHISPER_GGML: ModelFormat = super::whisper::GGML;
    /// whisper.cpp's voice-activity model (an auxiliary model of whisper.cpp's).
    pub const WHISPER_VAD: ModelFormat = super::whisper::VAD;
    /// A Piper voice.
    pub const PIPER_VOICE: ModelFormat = super::piper::VOICE;
    /// A diffusion model for image generation.
    pub const DIFFUSION: ModelFormat = super::stable_diffusion::DIFFUSION;
    /// Whatever a command's server reads.
    pub const ANY: ModelFormat = super::command::ANY;
}

/// The directory under `.arcane` of the ownership records of each worker kind's
/// workers (one record per running worker), defined in its kind's module.
pub mod worker_records {
    /// The ONNX sessions' workers'.
    pub const ONNX: &str = super::onnx::WORKER_RECORDS;
}
