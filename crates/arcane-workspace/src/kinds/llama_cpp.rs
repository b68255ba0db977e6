//! llama.cpp's `llama-server`.
//!
//! * **Listens** on the private socket by default (`--host PATH.sock`), or on a
//!   loopback port with `--api-key-file` when the user asked for a url.
//! * **Ready** when `GET /health` answers `200 {"status":"ok"}`; `503` with
//!   `{"error":{"message":"Loading model"}}` (current builds) or
//!   `{"status":"loading model"}` (older builds) is loading. A 200 that is not `ok`
//!   (KoboldCpp answers 200 everywhere) is not llama.cpp.
//! * **Version** from `--version` (`version: 4589 (…)` → `b4589`; packaged builds print
//!   a semantic version), or `/props` `build_info` over HTTP.
//! * **Command line**, in the SDK's order: 1. the listen arguments, `--api-key-file`,
//!   `--jinja`; 2. the user's args when a managed selection is required; 3. `--model`
//!   or `--models-dir`; 4. the user's args otherwise; 5. `--alias`; 6. the resolver's
//!   device arguments, always last.

use serde_json::Value;

use crate::engine::{
    CommandLine, DevicePlan, EngineKind, Launch, ListenAt, ModelFormat, OwnedListen, Probed,
    Readiness, Starts,
};

/// The llama.cpp descriptor.
/// GGUF, llama.cpp's model format.
pub(crate) const GGUF: ModelFormat = ModelFormat {
    id: "gguf",
    label: "GGUF",
    bundled: true,
    companions: &[],
};

#[derive(Debug)]
pub(crate) struct LlamaCpp;

/// The paths `llama-server` answers of the APIs the front door speaks (OpenAI's and
/// Anthropic's).
const SPOKEN_PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/rerank",
    "/v1/models",
    "/models",
];

/// Its own names for the work it queues: generation, embeddings, reranking.
const OWN_WORK_PATHS: &[&str] = &[
    "/chat/completions",
    "/completions",
    "/completion",
    "/embeddings",
    "/embedding",
    "/rerank",
    "/v1/reranking",
    "/reranking",
    "/infill",
];

/// Its own inference paths that it answers beside the work in its slots.
const LIGHT_PATHS: &[&str] = &["/tokenize", "/detokenize", "/apply-template"];

/// Its control paths: what it holds and how busy it is (an admin key's).
const CONTROL_PATHS: &[&str] = &["/props", "/slots", "/slots/", "/lora-adapters", "/metrics"];

/// Its own names for inference ([`EngineKind::inference_paths`]): each path is listed
/// once above, in its group.
static INFERENCE_PATHS: std::sync::LazyLock<Vec<&str>> =
    std::sync::LazyLock::new(|| [OWN_WORK_PATHS, LIGHT_PATHS].concat());

/// Every path it answers ([`EngineKind::api_paths`]).
static API_PATHS: std::sync::LazyLock<Vec<&str>> =
    std::sync::LazyLock::new(|| [SPOKEN_PATHS, &INFERENCE_PATHS, CONTROL_PATHS].concat());

impl EngineKind for LlamaCpp {
    fn id(&self) -> &'static str {
        "llama.cpp"
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["llama", "llama-cpp", "llamacpp"]
    }

    fn default_url(&self) -> Option<&'static str> {
        Some("http://127.0.0.1:8080")
    }

    fn starts(&self) -> Starts {
        Starts::Server {
            executable: "llama-server",
        }
    }

    fn default_listen(&self) -> OwnedListen {
        OwnedListen::PrivateSocket
    }

    fn can_close_its_door(&self) -> bool {
        true
    }

    fn classify(&self, status: u16, body: &[u8]) -> Readiness {
        let json: Option<Value> = serde_json::from_slice(body).ok();
        let field = |pointer: &str| {
            json.as_ref()
                .and_then(|j| j.pointer(pointer))
                .and_then(Value::as_str)
                .map(str::to_ascii_lowercase)
        };
        if (200..300).contains(&status) && field("/status").as_deref() == Some("ok") {
            return Readiness::Ready { version: None };
        }
        let loading = field("/error/message").as_deref() == Some("loading model")
            || field("/status").as_deref() == Some("loading model");
        if status == 503 && loading {
            return Readiness::Loading;
        }
        Readiness::Other
    }

    fn parse_version(&self, output: &str) -> Option<Probed> {
        output.lines().find_map(|line| {
            let line = line.trim();
            let token = line.strip_prefix("version:")?.split_whitespace().next()?;
            let version = if token.bytes().all(|b| b.is_ascii_digit()) {
                // Release builds print their build number, which is the release tag `b<N>`.
                format!("b{token}")
            } else {
                // Packaged builds print a semantic version (`0.6.0-dev (build 0, …)`).
                token.trim_start_matches('v').to_ascii_lowercase()
            };
            crate::ids::is_valid_id(&version).then(|| Probed {
                version,
                build_info: line.to_string(),
            })
        })
    }

    fn door_args(&self) -> &'static [&'static str] {
        &[
            "--host",
            "--port",
            "--path",
            "--api-prefix",
            "--api-key*",
            "--ssl-*",
        ]
    }

    fn reports_build_over_http(&self) -> bool {
        true
    }

    fn device_plan(&self) -> DevicePlan {
        DevicePlan::ArgsAndEnv
    }

    fn formats(&self) -> &'static [ModelFormat] {
        &[GGUF]
    }

    fn takes_model_file(&self) -> bool {
        true
    }

    fn model_list(&self) -> Option<(&'static str, &'static str)> {
        Some(("/v1/models", "data"))
    }

    fn model_assets(&self) -> bool {
        true
    }

    fn api_paths(&self) -> &'static [&'static str] {
        &API_PATHS
    }

    fn inference_paths(&self) -> &'static [&'static str] {
        &INFERENCE_PATHS
    }

    fn light_paths(&self) -> &'static [&'static str] {
        LIGHT_PATHS
    }

    fn rpc_namespace(&self) -> Option<&'static str> {
        Some("llama")
    }

    fn parallel_flags(&self) -> &'static [&'static str] {
        &["-np", "--parallel"]
    }

    fn thread_flags(&self) -> &'static [&'static str] {
        &["-t", "--threads"]
    }

    fn memory_model(&self) -> crate::MemoryModel {
        crate::MemoryModel::Gguf
    }

    /// `-np N -kvu`: N slots sharing one KV buffer, so each request may still use the
    /// whole context, as with llama-server's automatic slots (`-np N` alone would give
    /// each slot a Nth of it).
    fn parallel_args(&self, parallel: usize) -> Vec<String> {
        vec!["-np".into(), parallel.to_string(), "-kvu".into()]
    }

    fn command_line(&self, launch: &Launch<'_>) -> CommandLine {
        let mut args = Vec::new();
        match launch.listen {
            ListenAt::Socket(socket) => {
                args.extend(["--host".to_string(), socket.display().to_string()]);
            }
            ListenAt::Tcp { host, port, .. } => args.extend([
                "--host".to_string(),
                host.to_string(),
                "--port".to_string(),
                port.to_string(),
            ]),
        }
        if let Some(file) = launch.key_file {
            args.extend(["--api-key-file".to_string(), file.display().to_string()]);
        }
        args.push("--jinja".to_string());
        if launch.managed {
            args.extend(launch.user_args.iter().cloned());
        }
        match (launch.model, launch.models_dir) {
            (Some(model), _) => {
                args.push("--model".into());
                args.push(model.display().to_string());
            }
            (None, Some(dir)) => {
                args.push("--models-dir".into());
                args.push(dir.display().to_string());
            }
            (None, None) => {}
        }
        if !launch.managed {
            args.extend(launch.user_args.iter().cloned());
        }
        if let Some(alias) = launch.alias {
            args.push("--alias".into());
            args.push(alias.to_string());
        }
        args.extend(launch.device_args.iter().cloned());
        CommandLine {
            args,
            env: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_loading_shapes_are_loading_and_only_ok_is_ready() {
        let new = br#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#;
        assert_eq!(LlamaCpp.classify(503, new), Readiness::Loading);
        let old = br#"{"status":"loading model"}"#;
        assert_eq!(LlamaCpp.classify(503, old), Readiness::Loading);
        assert_eq!(
            LlamaCpp.classify(200, br#"{"status":"ok"}"#),
            Readiness::Ready { version: None }
        );
        // A 200 that is not `ok` (KoboldCpp answers 200 everywhere) is not ready.
        assert_eq!(LlamaCpp.classify(200, b"<html>"), Readiness::Other);
        assert_eq!(LlamaCpp.classify(502, br#"{"x":1}"#), Readiness::Other);
    }

    #[test]
    fn versions_from_release_and_packaged_builds() {
        let llama = "load_backend: loaded CPU backend\nversion: 4589 (1d1e6a90)\nbuilt with cc";
        let probed = LlamaCpp.parse_version(llama).unwrap();
        assert_eq!(probed.version, "b4589");
        assert_eq!(probed.build_info, "version: 4589 (1d1e6a90)");
        let packaged = "version: v0.6.0-dev (build 0, abc)";
        assert_eq!(
            LlamaCpp.parse_version(packaged).unwrap().version,
            "0.6.0-dev"
        );
        assert_eq!(LlamaCpp.parse_version("version:"), None);
        assert_eq!(LlamaCpp.parse_version("version: ???"), None);
        assert_eq!(LlamaCpp.parse_version("echo (GNU coreutils) 9.1"), None);
    }
}
