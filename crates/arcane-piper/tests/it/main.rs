//! The library against the real Piper voice (`ARCANE_PIPER_VOICE`), the real
//! espeak-ng (`ARCANE_ESPEAK`) and the real ONNX Runtime (`ARCANE_ONNXRUNTIME`), all
//! provisioned by `scripts/provision.sh`. A test panics when one is not set: skipping
//! would let a broken setup pass.
// Tests read the provisioned paths from the environment and print the real-time factor.
#![allow(clippy::disallowed_methods, clippy::print_stderr)]

mod errors;
mod speech;

use std::path::PathBuf;
use std::sync::OnceLock;

use arcane_onnx::Runtime;
use arcane_piper::{Phonemizer, Voice};

/// The path in `var`; panics naming it when unset.
pub fn provisioned(var: &str) -> PathBuf {
    let value = std::env::var_os(var).unwrap_or_else(|| {
        panic!("{var} is not set: run through scripts/test.sh, which provisions it")
    });
    PathBuf::from(value)
}

/// The ONNX Runtime, loaded once (a process holds one).
pub fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        Runtime::load(&provisioned("ARCANE_ONNXRUNTIME")).expect("the provisioned runtime loads")
    })
}

/// The Joe voice, loaded once.
pub fn voice() -> &'static Voice {
    static VOICE: OnceLock<Voice> = OnceLock::new();
    VOICE.get_or_init(|| {
        Voice::load(runtime(), &provisioned("ARCANE_PIPER_VOICE"), None)
            .expect("the provisioned voice loads")
    })
}

/// The real espeak-ng.
pub fn phonemizer() -> Phonemizer {
    Phonemizer::new(provisioned("ARCANE_ESPEAK"))
}
