//! Piper voices: text to speech on ONNX Runtime, run by Arcane itself (`arcane
//! __piper-worker`) on the private socket, answering OpenAI's `POST /v1/audio/speech`.
//!
//! The worker loads the registered ONNX Runtime library (`arcane runtime add onnx
//! --library PATH`), phonemizes text with espeak-ng (the phonemizer the voices were
//! trained with) and runs the voice on the CPU; a GPU target is refused.

use crate::engine::ModelFormat;
use crate::kinds::builtin::BuiltinKind;

/// A Piper voice: an ONNX graph with its configuration beside it (`voice.onnx` and
/// `voice.onnx.json`), which travels with it.
pub(crate) const VOICE: ModelFormat = ModelFormat {
    id: "piper-voice",
    label: "Piper voice",
    bundled: true,
    companions: &[".json"],
};

/// The Piper descriptor.
pub(crate) const PIPER: BuiltinKind = BuiltinKind {
    id: "piper",
    aliases: &["piper-tts"],
    subcommand: "__piper-worker",
    formats: &[VOICE],
    api_paths: &["/v1/audio/speech"],
    library: Some(crate::Engine::Onnx),
    runtime: None,
    model_assets: false,
    aux_models: &[],
    parallel_flags: &[],
    // Measured with en_US-joe-medium (63 MB): 166 MB at its peak while it speaks.
    memory: crate::MemoryModel::File {
        compute_percent: 140,
        per_request: false,
        runtime: 16 << 20,
    },
};
