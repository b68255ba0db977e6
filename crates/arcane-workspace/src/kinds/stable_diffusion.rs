//! stable-diffusion.cpp image generation, run by Arcane itself (`arcane
//! __sd-worker`) on the private socket, answering OpenAI's `POST
//! /v1/images/generations`.
//!
//! stable-diffusion.cpp's own `sd-server` listens on a TCP port with no key, so any web
//! page or local user could use it; Arcane never runs it. Its runtime is the library
//! (`libstable-diffusion.so`, registered with `arcane runtime add stable-diffusion.cpp
//! --library PATH`), which the worker loads and drives through its C API: the model is
//! loaded once, and images are drawn in a child process of the worker, so that a client
//! that goes away stops the computation at once (the child is killed). The library is built for the CPU here; a GPU target is
//! refused, never silently run on the CPU.

use crate::engine::{ModelFormat, RuntimeLibrary};
use crate::kinds::builtin::BuiltinKind;

/// A diffusion model stable-diffusion.cpp loads whole (UNet or DiT, text encoders and
/// autoencoder in one file): safetensors, or a GGUF of diffusion tensors, told by
/// their content.
pub(crate) const DIFFUSION: ModelFormat = ModelFormat {
    id: "diffusion",
    label: "Stable Diffusion",
    bundled: true,
    companions: &[],
};

/// The stable-diffusion.cpp descriptor.
pub(crate) const STABLE_DIFFUSION: BuiltinKind = BuiltinKind {
    id: "stable-diffusion.cpp",
    aliases: &["stable-diffusion", "sd.cpp", "sdcpp"],
    subcommand: "__sd-worker",
    formats: &[DIFFUSION],
    api_paths: &["/v1/images/generations"],
    library: Some(crate::Engine::StableDiffusion),
    runtime: Some(RuntimeLibrary {
        label: "stable-diffusion.cpp",
        file: "libstable-diffusion.so",
        plugins: "libggml-",
        variable: "ARCANE_SD_LIBRARY",
    }),
    model_assets: true,
    aux_models: &[],
    parallel_flags: &[],
    // Measured with the 883 MB random-weight SDXS: the worker holds the file; each image
    // is drawn in a child that shares it and adds its own buffers.
    memory: crate::MemoryModel::File {
        compute_percent: 25,
        per_request: false,
        runtime: 16 << 20,
    },
};
