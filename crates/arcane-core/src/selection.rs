//! Which services a runtime selection registers, as the SDK's generated Core entry
//! decides (0.89 `portable-layout.mjs`):
//!
//! | selected | services |
//! |---|---|
//! | a server kind (`llama.cpp`, `ollama`, and Arcane's own `whisper.cpp`, `piper`, `stable-diffusion.cpp`) | `execution-devices` (`localai.devices`, `localai.resolveTarget`) and `local-ai` (`localai.*`, `llama.*`, `ollama.*`) |
//! | a kind whose model the app may bring ([`EngineKind::model_assets`](arcane_localai::EngineKind::model_assets): `llama.cpp`, the image kind) | `model-assets` |
//! | a worker kind (`onnx`) | `onnx` (`onnx.status`, `onnx.load`, `onnx.run`, `onnx.unload`) |
//!
//! A selection names engine kinds by their exact id ([`Engine`], the one identity type;
//! what each kind is comes from its descriptor). The SDK's image service is Arcane's
//! image kind, supervised by `local-ai` like the speech kinds: its models answer
//! `/v1/images/generations` through the front door. Unknown ids are an `ARCANE_USAGE`
//! error at start, never a silent skip, and so is `command`, which needs a command
//! line (a `[[model]]` table), not a selection.

use arcane_localai::{Engine, Starts};
use serde_json::json;

use crate::error::Error;

/// Parses a runtime id of a selection (the kind's exact id, as in
/// `arcane-app.json`).
pub fn parse(id: &str) -> Result<Engine, Error> {
    let id = id.trim();
    if let Some(engine) = Engine::ALL.into_iter().find(|e| e.as_str() == id) {
        return Ok(engine);
    }
    let known: Vec<&str> = Engine::ALL.iter().map(|e| e.as_str()).collect();
    Err(Error::usage(
        format!("unknown local AI runtime `{id}`"),
        json!({"runtime": id, "known": known}),
    ))
}

/// The kinds a selection may name.
fn supported() -> Vec<&'static str> {
    Engine::ALL
        .into_iter()
        .filter(|e| e.kind().starts() != Starts::Command)
        .map(Engine::as_str)
        .collect()
}

/// The services to register for a selection.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServicePlan {
    /// The engines the `local-ai` service supervises, in selection order, deduplicated
    /// (worker kinds such as `onnx` are not: their sessions run in their own service).
    pub engines: Vec<Engine>,
    /// Register `execution-devices` and `local-ai`.
    pub local_ai: bool,
    /// Register `model-assets`.
    pub model_assets: bool,
    /// The worker kinds whose service to register (sessions in Arcane's own worker
    /// processes: [`Starts::Worker`]), in selection order.
    pub workers: Vec<Engine>,
}

/// Plans the services for `selection` (runtime ids). Fails with `ARCANE_USAGE` for an
/// unknown id or a runtime Arcane does not support (here) yet.
pub fn plan(selection: &[String]) -> Result<ServicePlan, Error> {
    let mut plan = ServicePlan::default();
    for id in selection {
        let engine = parse(id)?;
        match engine.kind().starts() {
            Starts::Worker => {
                if !plan.workers.contains(&engine) {
                    plan.workers.push(engine);
                }
            }
            Starts::Server { .. } | Starts::Builtin { .. } => {
                if !plan.engines.contains(&engine) {
                    plan.engines.push(engine);
                }
            }
            Starts::Command => {
                return Err(Error::usage(
                    "the `command` kind is configured per model (`[[model]] command = [...]` in `arcane.toml`), not selected as a runtime",
                    json!({"runtime": id, "supported": supported()}),
                ))
            }
        }
    }
    plan.local_ai = !plan.engines.is_empty();
    plan.model_assets = plan.engines.iter().any(|e| e.kind().model_assets());
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
        assert_eq!(plan.engines, [Engine::LlamaCpp]);
        let plan = super::plan(&ids(&["ollama", "ollama"])).unwrap();
        assert!(plan.local_ai && !plan.model_assets);
        assert_eq!(plan.engines, [Engine::Ollama]);
        let plan = super::plan(&[]).unwrap();
        assert!(!plan.local_ai && !plan.model_assets);
        let plan = super::plan(&ids(&["onnx"])).unwrap();
        assert!(!plan.workers.is_empty() && !plan.local_ai && !plan.model_assets);
        // Arcane's own engines are supervised like servers, without model assets.
        let plan = super::plan(&ids(&["whisper.cpp", "piper"])).unwrap();
        assert!(plan.local_ai && plan.workers.is_empty() && !plan.model_assets);
        assert_eq!(plan.engines, [Engine::Whisper, Engine::Piper]);
        // The image kind is supervised the same way, with the app's model assets.
        let image = Engine::ALL
            .into_iter()
            .find(|e| e.kind().api_paths().contains(&"/v1/images/generations"))
            .unwrap();
        let plan = super::plan(&ids(&[image.as_str()])).unwrap();
        assert!(plan.local_ai && plan.model_assets && plan.workers.is_empty());
        assert_eq!(plan.engines, [image]);
    }

    #[test]
    fn unsupported_runtimes_are_usage_errors() {
        for id in ["mystery", "command", "LLAMA.CPP", "nemo-speech"] {
            let error = plan(&ids(&["llama.cpp", id])).unwrap_err();
            assert_eq!(error.code(), arcane_report::codes::ARCANE_USAGE, "{id}");
            assert!(error.to_string().contains(id), "{error}");
        }
    }
}
