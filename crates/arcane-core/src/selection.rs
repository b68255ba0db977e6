//! Which services a runtime selection registers, as the SDK's generated Core entry
//! decides (0.89 `portable-layout.mjs`):
//!
//! | selected | services |
//! |---|---|
//! | `llama.cpp` or `ollama` | `execution-devices` (`localai.devices`, `localai.resolveTarget`) and `local-ai` (`localai.*`, `llama.*`, `ollama.*`) |
//! | `llama.cpp` (0.89; later also `onnx`, `stable-diffusion.cpp`) | `model-assets` |
//! | `onnx` | `onnx` (`onnx.status`, `onnx.load`, `onnx.run`, `onnx.unload`) |
//!
//! Runtimes the SDK knows but Arcane does not support yet (`whisper.cpp`,
//! `stable-diffusion.cpp`) are an `ARCANE_USAGE` error at start, never a silent skip;
//! unknown ids are too.

use serde_json::json;

use crate::error::Error;

/// A runtime id from a selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Runtime {
    /// llama.cpp's `llama-server`.
    LlamaCpp,
    /// `ollama serve`.
    Ollama,
    /// ONNX sessions in worker processes.
    Onnx,
    /// stable-diffusion.cpp image generation (not supported yet).
    StableDiffusionCpp,
    /// whisper.cpp speech-to-text (not supported yet).
    WhisperCpp,
}

impl Runtime {
    /// The SDK id.
    pub fn id(self) -> &'static str {
        match self {
            Self::LlamaCpp => "llama.cpp",
            Self::Ollama => "ollama",
            Self::Onnx => "onnx",
            Self::StableDiffusionCpp => "stable-diffusion.cpp",
            Self::WhisperCpp => "whisper.cpp",
        }
    }

    /// Parses an SDK runtime id (exact spelling, as in `arcane-app.json`).
    pub fn parse(id: &str) -> Result<Self, Error> {
        match id.trim() {
            "llama.cpp" => Ok(Self::LlamaCpp),
            "ollama" => Ok(Self::Ollama),
            "onnx" => Ok(Self::Onnx),
            "stable-diffusion.cpp" => Ok(Self::StableDiffusionCpp),
            "whisper.cpp" => Ok(Self::WhisperCpp),
            other => Err(Error::usage(
                format!("unknown local AI runtime `{other}`"),
                json!({"runtime": other, "known": ["llama.cpp", "ollama", "onnx", "stable-diffusion.cpp", "whisper.cpp"]}),
            )),
        }
    }

    /// Whether Arcane can host this runtime today.
    pub fn is_supported(self) -> bool {
        matches!(self, Self::LlamaCpp | Self::Ollama | Self::Onnx)
    }
}

/// The services to register for a selection.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServicePlan {
    /// The engines the `local-ai` service supervises, in selection order, deduplicated
    /// (`onnx` is not one: its sessions run in the `onnx` service's workers).
    pub engines: Vec<Runtime>,
    /// Register `execution-devices` and `local-ai`.
    pub local_ai: bool,
    /// Register `model-assets`.
    pub model_assets: bool,
    /// Register `onnx`.
    pub onnx: bool,
}

/// Plans the services for `selection` (runtime ids). Fails with `ARCANE_USAGE` for an
/// unknown id or a runtime Arcane does not support yet.
pub fn plan(selection: &[String]) -> Result<ServicePlan, Error> {
    let mut plan = ServicePlan::default();
    for id in selection {
        let runtime = Runtime::parse(id)?;
        if !runtime.is_supported() {
            return Err(Error::usage(
                format!("runtime `{}` is not supported by Arcane yet", runtime.id()),
                json!({"runtime": runtime.id(), "supported": ["llama.cpp", "ollama", "onnx"]}),
            ));
        }
        if runtime == Runtime::Onnx {
            plan.onnx = true;
        } else if !plan.engines.contains(&runtime) {
            plan.engines.push(runtime);
        }
    }
    plan.local_ai = plan
        .engines
        .iter()
        .any(|r| matches!(r, Runtime::LlamaCpp | Runtime::Ollama));
    plan.model_assets = plan.engines.contains(&Runtime::LlamaCpp);
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arcane_report::Diagnostic;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn llama_registers_devices_local_ai_and_model_assets() {
        let plan = plan(&ids(&["llama.cpp"])).unwrap();
        assert!(plan.local_ai && plan.model_assets);
        let plan = super::plan(&ids(&["ollama"])).unwrap();
        assert!(plan.local_ai && !plan.model_assets);
        let plan = super::plan(&[]).unwrap();
        assert!(!plan.local_ai && !plan.model_assets);
        let plan = super::plan(&ids(&["onnx"])).unwrap();
        assert!(plan.onnx && !plan.local_ai && !plan.model_assets);
    }

    #[test]
    fn unsupported_runtimes_are_usage_errors() {
        for id in ["whisper.cpp", "stable-diffusion.cpp", "mystery"] {
            let error = plan(&ids(&["llama.cpp", id])).unwrap_err();
            assert_eq!(error.code(), arcane_report::codes::ARCANE_USAGE, "{id}");
            assert!(error.to_string().contains(id));
        }
    }
}
