//! Ollama's `ollama serve`.
//!
//! * **Listens** on its loopback port with no authentication (Ollama has none):
//!   reported as reachable without the token. `OLLAMA_HOST` and `OLLAMA_MODELS` place
//!   it.
//! * **Ready** when `GET /api/version` answers 2xx with a non-empty `version`.
//! * **Devices**: Ollama chooses its own; a device or backend selection is refused.

use serde_json::Value;

use crate::engine::{
    CommandLine, DevicePlan, EngineKind, ForwardedMethod, Launch, ListenAt, ModelFormat, Probed,
    Readiness, Starts, Takes,
};

/// The Ollama descriptor.
/// The SDK's `ollama.*` methods: each Ollama's own endpoint, its answer as Ollama gives
/// it (streamed chat and generation assembled into one answer).
const FORWARDED: &[ForwardedMethod] = &[
    get("ollama.version", "/api/version"),
    get("ollama.models", "/api/tags"),
    get("ollama.running", "/api/ps"),
    ForwardedMethod {
        takes: Takes::Quick,
        ..post("ollama.show", "/api/show")
    },
    ForwardedMethod {
        streams: true,
        text: Some("/message/content"),
        ..post("ollama.chat", "/api/chat")
    },
    ForwardedMethod {
        streams: true,
        text: Some("/response"),
        ..post("ollama.generate", "/api/generate")
    },
    post("ollama.embed", "/api/embed"),
    ForwardedMethod {
        takes: Takes::Transfer,
        streams: true,
        changes_models: true,
        ..post("ollama.pull", "/api/pull")
    },
];

/// A quick `GET`.
const fn get(name: &'static str, path: &'static str) -> ForwardedMethod {
    ForwardedMethod {
        post: false,
        takes: Takes::Quick,
        ..post(name, path)
    }
}

/// A `POST` that generates, answered whole.
const fn post(name: &'static str, path: &'static str) -> ForwardedMethod {
    ForwardedMethod {
        name,
        post: true,
        path,
        takes: Takes::Generation,
        streams: false,
        text: None,
        changes_models: false,
    }
}

/// Ollama's own model store (models pulled by Ollama, named by Ollama's tags).
pub(crate) const STORE: ModelFormat = ModelFormat {
    id: "ollama-store",
    label: "Ollama store",
    bundled: false,
    companions: &[],
};

#[derive(Debug)]
pub(crate) struct Ollama;

impl EngineKind for Ollama {
    fn id(&self) -> &'static str {
        "ollama"
    }

    fn default_url(&self) -> Option<&'static str> {
        Some("http://127.0.0.1:11434")
    }

    fn starts(&self) -> Starts {
        Starts::Server {
            executable: "ollama",
        }
    }

    fn health_path(&self) -> &'static str {
        "/api/version"
    }

    fn classify(&self, status: u16, body: &[u8]) -> Readiness {
        let json: Option<Value> = serde_json::from_slice(body).ok();
        let version = json
            .as_ref()
            .and_then(|j| j.get("version"))
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty());
        match (status, version) {
            (200..=299, Some(version)) => Readiness::Ready {
                version: Some(version.to_string()),
            },
            _ => Readiness::Other,
        }
    }

    fn parse_version(&self, output: &str) -> Option<Probed> {
        output.lines().find_map(|line| {
            let line = line.trim();
            let (_, rest) = line
                .split_once("ollama version is ")
                .or_else(|| line.split_once("client version is "))?;
            let version = rest.trim().trim_start_matches('v');
            let valid = version.chars().next().is_some_and(|c| c.is_ascii_digit())
                && version
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'));
            valid.then(|| Probed {
                version: version.to_ascii_lowercase(),
                build_info: line.to_string(),
            })
        })
    }

    fn device_plan(&self) -> DevicePlan {
        DevicePlan::EngineChooses
    }

    fn formats(&self) -> &'static [ModelFormat] {
        &[STORE]
    }

    fn model_list(&self) -> Option<(&'static str, &'static str)> {
        Some(("/api/tags", "models"))
    }

    fn api_paths(&self) -> &'static [&'static str] {
        &[
            "/api/",
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/models",
        ]
    }

    fn rpc_namespace(&self) -> Option<&'static str> {
        Some("ollama")
    }

    fn forwarded_methods(&self) -> &'static [ForwardedMethod] {
        FORWARDED
    }

    fn command_line(&self, launch: &Launch<'_>) -> CommandLine {
        let mut args = vec!["serve".to_string()];
        args.extend(launch.user_args.iter().cloned());
        let mut env = std::collections::BTreeMap::new();
        if let ListenAt::Tcp { origin, .. } = launch.listen {
            env.insert("OLLAMA_HOST".into(), origin.to_string());
        }
        if let Some(dir) = launch.models_dir {
            env.insert("OLLAMA_MODELS".into(), dir.display().to_string());
        }
        CommandLine { args, env }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_needs_a_non_empty_version() {
        assert_eq!(Ollama.classify(200, br#"{"version":""}"#), Readiness::Other);
        assert_eq!(
            Ollama.classify(200, br#"{"version":"0.5.1"}"#),
            Readiness::Ready {
                version: Some("0.5.1".into())
            }
        );
    }

    #[test]
    fn versions_from_both_spellings() {
        assert_eq!(
            Ollama
                .parse_version("ollama version is 0.5.7")
                .unwrap()
                .version,
            "0.5.7"
        );
        let warned = "Warning: could not connect to a running Ollama instance\nWarning: client version is 0.5.7";
        assert_eq!(Ollama.parse_version(warned).unwrap().version, "0.5.7");
        assert_eq!(Ollama.parse_version("version: 4589 (1d1e6a90)"), None);
    }
}
