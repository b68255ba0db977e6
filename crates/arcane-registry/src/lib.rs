//! The runtime and model registry of a workspace: which engine executables
//! (`llama-server`, `ollama`), runtime libraries (ONNX Runtime, stable-diffusion.cpp)
//! and models (GGUF, ONNX, whisper.cpp, Piper, Stable Diffusion) Arcane may use,
//! verified.
//!
//! # What it owns
//!
//! * `.arcane/registry.json`: the records ([`Runtime`], [`Model`]), written atomically
//!   (temp name, fsync, rename, fsync of the directory);
//! * `.arcane/runtimes/<engine>/<version>[-<backend>]/`: runtimes installed from release
//!   archives;
//! * `.arcane/models/<id>/<file>`: model files (hard links, copies or downloads).
//!
//! It does not start engines (that is the supervisor's job in `arcane-localai`) and
//! does not resolve devices (`arcane-devices`); it only records a runtime's
//! [`Backend`](arcane_devices::Backend).
//!
//! # Guarantees
//!
//! * Reads ([`Registry::runtimes`], [`Registry::model`], …) take no lock: the file is
//!   only ever replaced by a rename, so a reader sees a whole registry.
//! * Every mutation holds the workspace operation lock (`arcane-lock`) under its own
//!   operation name (`runtime-add`, `runtime-install`, `runtime-remove`, `model-add`,
//!   `model-remove`), re-reads the registry inside the lock, and either completes or
//!   leaves nothing behind: work happens in `.staging-*` directories that are renamed
//!   into place last and removed on error or cancellation (and swept by the next
//!   operation after a crash). An earlier install or model is never overwritten.
//! * Everything is verified: a runtime must run `--version` and print its engine's
//!   version; a runtime library must be loaded by its kind's own loader and report its
//!   version; a model must be read by its format's reader ([`FormatReader`]: GGUF
//!   v2/v3, ONNX, whisper.cpp's ggml, a Piper voice, a Stable Diffusion checkpoint in
//!   safetensors or GGUF), bounded against hostile files; an archive must match
//!   its SHA-256 *before* extraction, and extraction refuses absolute paths, `..`,
//!   special files and links leaving the install directory; a download must match its
//!   `Content-Length` and SHA-256.
//! * Ids match `[a-z0-9][a-z0-9._-]*`; every error has a stable code and names the
//!   offending value (see [`Error`]).
//!
//! # Events
//!
//! Progress and outcomes go to an [`EventSink`](arcane_report::EventSink):
//! `registry.hash.progress` `{path, action, done, total}`, `download.started|progress|finished`,
//! `registry.runtime.probing|extracting|added|installed|removed`,
//! `registry.model.added|removed`.
//!
//! # Example
//!
//! ```no_run
//! use arcane_registry::{AddModel, AddRuntime, Engine, Registry};
//! use arcane_report::{CancelToken, NullSink};
//!
//! let registry = Registry::new("/srv/arcane".as_ref());
//! let cancel = CancelToken::new();
//! registry.add_runtime(&AddRuntime::new(Engine::LlamaCpp, "/opt/llama/llama-server"), &NullSink, &cancel)?;
//! let model = registry.add_model(&AddModel::file("smollm2-135m", "SmolLM2.gguf"), &NullSink, &cancel)?;
//! println!("{} {} {}", model.id, model.size, model.sha256);
//! let server = registry.default_runtime(Engine::LlamaCpp)?;
//! assert!(server.executable.is_absolute());
//! # Ok::<(), arcane_registry::Error>(())
//! ```
//!
//! # Benchmark
//!
//! `ARCANE_TEST_MODEL=path/to/model.gguf cargo bench -p arcane-registry --bench hash`
//! prints the MB/s of [`sha256_file`] and of `sha256sum` on the same file, and their ratio.
#![warn(missing_docs)]

mod archive;
mod download;
mod error;
mod estimate;
mod gguf;
mod hash;
mod header;
mod id;
mod onnx;
mod piper;
mod probe;
mod progress;
mod registry;
mod sd;
mod store;
mod types;
mod whisper;

pub use error::{Error, ExtractLimit};
pub use estimate::{estimate, MemoryEstimate};
#[doc(hidden)]
pub use gguf::write_test_gguf;
pub use gguf::{quantization_name, read_gguf, GgufInfo};
pub use hash::{sha256_file, sha256_reader};
pub use header::{
    format_of_file, human_count, read_header, reader_of_record, FormatReader, Header, Summary,
};
pub use id::{is_valid_id, normalize_sha256, MAX_ID_LEN};
pub use piper::{
    piper_config_path, read_piper_config, PiperVoiceInfo, MAX_CONFIG_BYTES, MAX_IDS_PER_PHONEME,
    MAX_PHONEMES,
};
pub use registry::{
    AddModel, AddRuntime, InstallRuntime, LockSettings, Registry, DEFAULT_MAX_EXPANSION_RATIO,
    DEFAULT_MAX_EXTRACTED_BYTES, DEFAULT_VERSION_TIMEOUT,
};
pub use sd::{
    read_diffusion, DiffusionError, DiffusionInfo, MAX_SAFETENSORS_DIMS, MAX_SAFETENSORS_HEADER,
    MAX_SAFETENSORS_TENSORS,
};
pub use types::{
    ArchiveOrigin, Engine, FileStamp, LibraryRuntime, Model, Runtime, Source, Storage,
};
pub use whisper::{
    looks_like_vad, looks_like_whisper, read_vad, read_whisper, VadInfo, WhisperError, WhisperInfo,
    MAX_MEL_FFT, MAX_NAME_BYTES, MAX_TENSORS, MAX_TOKEN_BYTES, MAX_VAD_LAYERS, MAX_VAD_TYPE_BYTES,
    WHISPER_MAGIC,
};
#[doc(hidden)]
pub use whisper::{test_whisper_bytes, TINY_EN};

/// The reader of every model format the registry records, in the order a file is
/// tried: the longest signatures first — whisper.cpp's four-byte magic, then
/// safetensors' nine bytes (before ONNX, whose two-byte claim one safetensors header
/// length in 512 also matches); a Piper voice before the plain ONNX graph whose bytes
/// it shares; GGUF last, so a file no reader claims is refused naming the magic it has
/// ([`header::reader_of_file`]), and a GGUF of diffusion tensors is claimed before it.
/// A new format is a reader in its kind's module and a row here.
pub(crate) const READERS: &[&dyn FormatReader] = &[
    &whisper::Vad,
    &whisper::Ggml,
    &sd::Checkpoint,
    &piper::Voice,
    &onnx::Graph,
    &gguf::Gguf,
];

/// How the version of a library runtime is read.
type LibraryProbe = fn(&std::path::Path) -> Result<String, Error>;

/// Each kind whose runtime is a library, with its own loader's probe. A new library
/// kind is a probe in its kind's module and a row here.
const LIBRARY_PROBES: &[(Engine, LibraryProbe)] = &[
    (Engine::Onnx, onnx::library_version),
    (Engine::StableDiffusion, sd::library_version),
];

/// The version the library runtime of `kind` at `library` reports, read by the kind's
/// own loader ([`LIBRARY_PROBES`]); a kind whose runtime is no library is
/// `ARCANE_USAGE`.
pub(crate) fn library_version(kind: Engine, library: &std::path::Path) -> Result<String, Error> {
    let probe = LIBRARY_PROBES
        .iter()
        .find(|(engine, _)| *engine == kind)
        .map(|(_, probe)| probe);
    match probe {
        Some(probe) => probe(library),
        None => Err(Error::UnknownEngine {
            value: kind.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arcane_report::Diagnostic;

    #[test]
    fn every_library_kind_has_its_own_probe() {
        for kind in Engine::library_kinds() {
            let rows = LIBRARY_PROBES.iter().filter(|(e, _)| *e == kind).count();
            assert_eq!(rows, 1, "{kind}");
        }
        let missing = std::path::Path::new("/nonexistent/libstable-diffusion.so");
        // stable-diffusion.cpp's loader answers for its kind, not ONNX Runtime's.
        let error = library_version(Engine::StableDiffusion, missing).unwrap_err();
        assert!(
            error.to_string().contains("stable-diffusion.cpp"),
            "{error}"
        );
        let error = library_version(Engine::Onnx, missing).unwrap_err();
        assert!(
            !error.to_string().contains("stable-diffusion.cpp"),
            "{error}"
        );
        let error = library_version(Engine::LlamaCpp, missing).unwrap_err();
        assert_eq!(error.code(), arcane_report::codes::ARCANE_USAGE);
    }
}
