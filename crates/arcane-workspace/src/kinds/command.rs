//! The `command` kind: any OpenAI-compatible server, started from the command line the
//! configuration gives (llama-swap's `cmd`).
//!
//! ```toml
//! [[model]]
//! id = "custom"
//! command = ["/path/to/server", "--host", "127.0.0.1", "--port", "${PORT}", "-m", "${MODEL}"]
//! model = "smollm2-135m"     # optional: ${MODEL} is its registered file
//! env = { OMP_NUM_THREADS = "2" }
//! health = "/health"          # readiness path: 200 ready, 503 loading
//! ```
//!
//! Placeholders, expanded in the arguments and in `env` values at each start
//! ([`expand`]):
//!
//! | placeholder | value | where the server listens |
//! |---|---|---|
//! | `${PORT}` | a free loopback port Arcane chose | `127.0.0.1:${PORT}`: reachable without the token, unless `${API_KEY_FILE}` is used too |
//! | `${SOCKET}` | a path in the private run directory (0700) | a Unix socket: only through the Core |
//! | `${API_KEY_FILE}` | a 0600 file holding a random key only the Core knows, sent upstream as the bearer token | behind that key, once the server is seen to demand it: the supervisor asks `GET /v1/models` without it when the server is ready, and one that answers 2xx is reported reachable without the token (or refused with `require_key = true`) |
//! | `${MODEL}` | the `model` entry's file | — |
//!
//! A template names exactly one of `${PORT}` and `${SOCKET}` (Arcane must know where the
//! server answers); an unknown `${…}` is refused before anything starts.
//!
//! Devices: the server's own flags are unknown to Arcane, so it is pinned by the
//! resolver's environment only (`CUDA_VISIBLE_DEVICES` to the chosen GPU's UUID, or
//! every GPU hidden for the CPU); a conflicting `CUDA_VISIBLE_DEVICES` in `env` is
//! refused.

use std::collections::BTreeMap;

use crate::engine::{
    CommandLine, DevicePlan, EngineKind, Launch, ListenAt, ModelFormat, OwnedListen, Starts,
};

/// The command descriptor.
/// Whatever the command's server reads (Arcane passes the file's path).
pub(crate) const ANY: ModelFormat = ModelFormat {
    id: "any",
    label: "any file",
    bundled: false,
    companions: &[],
};

#[derive(Debug)]
pub(crate) struct Command;

impl EngineKind for Command {
    fn id(&self) -> &'static str {
        "command"
    }

    fn starts(&self) -> Starts {
        Starts::Command
    }

    fn default_listen(&self) -> OwnedListen {
        // Decided by the template's placeholders ([`TemplateNeeds::listen`]).
        OwnedListen::OpenPort
    }

    fn can_close_its_door(&self) -> bool {
        true
    }

    fn device_plan(&self) -> DevicePlan {
        DevicePlan::EnvOnly
    }

    fn formats(&self) -> &'static [ModelFormat] {
        &[ANY]
    }

    fn takes_model_file(&self) -> bool {
        true
    }

    fn model_list(&self) -> Option<(&'static str, &'static str)> {
        Some(("/v1/models", "data"))
    }

    fn api_paths(&self) -> &'static [&'static str] {
        &["/v1/"]
    }

    /// Most commands serve a GGUF model (a llama-server built otherwise, another
    /// llama.cpp server); any other file is estimated as the file and a tenth more.
    fn memory_model(&self) -> crate::MemoryModel {
        crate::MemoryModel::Gguf
    }

    fn command_line(&self, launch: &Launch<'_>) -> CommandLine {
        CommandLine {
            args: launch.template.iter().map(|a| expand(a, launch)).collect(),
            env: launch
                .template_env
                .iter()
                .map(|(name, value)| (name.clone(), expand(value, launch)))
                .collect(),
        }
    }
}

/// The placeholders a template may use.
pub const PLACEHOLDERS: [&str; 4] = ["PORT", "SOCKET", "API_KEY_FILE", "MODEL"];

/// What a command template needs from Arcane, read from its placeholders.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TemplateNeeds {
    /// `${PORT}`: a free loopback port.
    pub port: bool,
    /// `${SOCKET}`: a socket path in the private run directory.
    pub socket: bool,
    /// `${API_KEY_FILE}`: a key file only the Core knows.
    pub key_file: bool,
    /// `${MODEL}`: the model file.
    pub model: bool,
}

impl TemplateNeeds {
    /// Where the server listens: a socket, a port behind a key, or an open port.
    pub fn listen(&self) -> OwnedListen {
        match (self.socket, self.key_file) {
            (true, _) => OwnedListen::PrivateSocket,
            (false, true) => OwnedListen::KeyedPort,
            (false, false) => OwnedListen::OpenPort,
        }
    }
}

/// A template Arcane cannot run: the offending value and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError {
    /// The argument or variable value at fault (empty for a missing listen
    /// placeholder).
    pub value: String,
    /// Why, in words.
    pub why: String,
}

/// Reads the placeholders of `args` (the arguments after the program) and `env`:
/// unknown or unclosed ones, both or neither of `${PORT}` and `${SOCKET}`, are errors.
pub fn needs(
    args: &[String],
    env: &BTreeMap<String, String>,
) -> Result<TemplateNeeds, TemplateError> {
    let mut needs = TemplateNeeds::default();
    for text in args.iter().chain(env.values()) {
        for name in placeholders(text)? {
            match name {
                "PORT" => needs.port = true,
                "SOCKET" => needs.socket = true,
                "API_KEY_FILE" => needs.key_file = true,
                "MODEL" => needs.model = true,
                other => {
                    return Err(TemplateError {
                        value: text.clone(),
                        why: format!(
                            "`${{{other}}}` is not a placeholder Arcane knows (use {})",
                            PLACEHOLDERS.map(|p| format!("`${{{p}}}`")).join(", ")
                        ),
                    })
                }
            }
        }
    }
    match (needs.port, needs.socket) {
        (true, true) => Err(TemplateError {
            value: String::new(),
            why: "the command names both `${PORT}` and `${SOCKET}`; it listens on one of them".into(),
        }),
        (false, false) => Err(TemplateError {
            value: String::new(),
            why: "the command names neither `${PORT}` nor `${SOCKET}`, so Arcane cannot know where the server answers".into(),
        }),
        _ => Ok(needs),
    }
}

/// The `${NAME}` placeholders in `text`, in order.
fn placeholders(text: &str) -> Result<Vec<&str>, TemplateError> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            return Err(TemplateError {
                value: text.to_string(),
                why: "a `${` is not closed by `}`".into(),
            });
        };
        found.push(&after[..end]);
        rest = &after[end + 1..];
    }
    Ok(found)
}

/// `text` with its placeholders replaced by this start's values (a placeholder with no
/// value — `${MODEL}` without a model — becomes empty; [`needs`] refuses that case
/// earlier).
pub fn expand(text: &str, launch: &Launch<'_>) -> String {
    let value = |name: &str| -> String {
        match (name, launch.listen) {
            ("PORT", ListenAt::Tcp { port, .. }) => port.to_string(),
            ("SOCKET", ListenAt::Socket(path)) => path.display().to_string(),
            ("API_KEY_FILE", _) => launch
                .key_file
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            ("MODEL", _) => launch
                .model
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            _ => String::new(),
        }
    };
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        let Some(end) = rest[at + 2..].find('}') else {
            break;
        };
        out.push_str(&rest[..at]);
        out.push_str(&value(&rest[at + 2..at + 2 + end]));
        rest = &rest[at + 3 + end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_listen_placeholder_decides_where_and_how_it_listens() {
        let none = BTreeMap::new();
        let port = needs(&strings(&["--port", "${PORT}"]), &none).unwrap();
        assert_eq!(port.listen(), OwnedListen::OpenPort);
        let keyed = needs(
            &strings(&["--port=${PORT}", "--api-key-file", "${API_KEY_FILE}"]),
            &none,
        )
        .unwrap();
        assert_eq!(keyed.listen(), OwnedListen::KeyedPort);
        let socket = needs(&strings(&["--host", "${SOCKET}"]), &none).unwrap();
        assert_eq!(socket.listen(), OwnedListen::PrivateSocket);
        assert!(needs(&strings(&["-m", "${MODEL}"]), &none)
            .unwrap_err()
            .why
            .contains("neither"));
        assert!(needs(&strings(&["${PORT}", "${SOCKET}"]), &none)
            .unwrap_err()
            .why
            .contains("both"));
        let unknown = needs(&strings(&["${PORT}", "--x=${HOME}"]), &none).unwrap_err();
        assert_eq!(unknown.value, "--x=${HOME}");
        assert!(unknown.why.contains("`${HOME}`"), "{}", unknown.why);
        assert!(needs(&strings(&["${PORT"]), &none).is_err());
        // Placeholders in env values count too.
        let env = BTreeMap::from([("PORT".to_string(), "${PORT}".to_string())]);
        assert!(needs(&[], &env).unwrap().port);
    }

    #[test]
    fn expansion_fills_every_placeholder_and_leaves_other_dollars() {
        let env = BTreeMap::from([("ADDR".to_string(), "127.0.0.1:${PORT}".to_string())]);
        let template = strings(&[
            "--port=${PORT}",
            "-m",
            "${MODEL}",
            "--key",
            "${API_KEY_FILE}",
            "$HOME",
            "a${PORT}b${PORT}",
        ]);
        let launch = Launch {
            listen: ListenAt::Tcp {
                host: "127.0.0.1",
                port: 4242,
                origin: "http://127.0.0.1:4242",
            },
            key_file: Some(Path::new("/ws/.arcane/run/m.key")),
            model: Some(Path::new("/m.gguf")),
            models_dir: None,
            alias: None,
            user_args: &[],
            managed: false,
            device_args: &[],
            template: &template,
            template_env: &env,
            runtime_library: None,
            aux_models: &[],
        };
        let line = Command.command_line(&launch);
        assert_eq!(
            line.args,
            [
                "--port=4242",
                "-m",
                "/m.gguf",
                "--key",
                "/ws/.arcane/run/m.key",
                "$HOME",
                "a4242b4242"
            ]
        );
        assert_eq!(line.env["ADDR"], "127.0.0.1:4242");
        let socket = Launch {
            listen: ListenAt::Socket(Path::new("/ws/.arcane/run/m.sock")),
            ..launch
        };
        assert_eq!(
            expand("--host=${SOCKET}", &socket),
            "--host=/ws/.arcane/run/m.sock"
        );
    }
}
