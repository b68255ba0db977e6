//! One module per engine kind, each implementing [`crate::EngineKind`]. A new kind is
//! a new module here and one row in [`crate::Engine::kind`]; a kind Arcane serves itself
//! is a `builtin::BuiltinKind` constant.

mod builtin;
pub(crate) mod command;
pub(crate) mod llama_cpp;
pub(crate) mod ollama;
pub(crate) mod onnx;
pub(crate) mod piper;
pub(crate) mod whisper;
