//! What Arcane's own engines ([`Starts::Builtin`](crate::Starts::Builtin)) share: the
//! command line of `arcane <subcommand>` and the arguments that open its door.
//!
//! A builtin engine is the `arcane` executable itself, run as an HTTP server for one
//! model: it listens on the private socket (or, when the user asked for a url, on a
//! loopback port that demands the key in a file), answers `GET /health` with
//! `{"status":"ok"}` once its model is loaded, and is supervised, reaped and listed
//! like any server Arcane starts. Its flags are Arcane's own, so they are written once
//! here for every builtin kind.

use crate::engine::{
    AuxModel, CommandLine, DevicePlan, EngineKind, Launch, ListenAt, ModelFormat, OwnedListen,
    Readiness, RuntimeLibrary, Starts,
};

/// The arguments that decide where a builtin engine listens and how it authenticates:
/// set by Arcane, refused in a user's `args`.
pub(crate) const DOOR_ARGS: &[&str] = &["--socket", "--host", "--port", "--api-key-file"];

/// A builtin kind: everything but these fields is the same for all of them (the
/// private socket, a closable door, `{"status":"ok"}` readiness, the CPU, one model
/// file), so a new one is a constant of this type in its own module.
#[derive(Debug)]
pub(crate) struct BuiltinKind {
    /// The kind's id.
    pub id: &'static str,
    /// Its other names.
    pub aliases: &'static [&'static str],
    /// The hidden `arcane` subcommand that serves it.
    pub subcommand: &'static str,
    /// The model formats it serves.
    pub formats: &'static [ModelFormat],
    /// The API paths it answers.
    pub api_paths: &'static [&'static str],
    /// The kind whose runtime library its worker loads ([`EngineKind::needs_library`]).
    pub library: Option<crate::Engine>,
    /// The library that is its own runtime, when it has one
    /// ([`EngineKind::runtime_library`]).
    pub runtime: Option<RuntimeLibrary>,
    /// Whether selecting it registers `model-assets` ([`EngineKind::model_assets`]).
    pub model_assets: bool,
    /// The second models it can use ([`EngineKind::aux_models`]).
    pub aux_models: &'static [AuxModel],
    /// The flags of its worker that set how many requests it serves at once
    /// ([`EngineKind::parallel_flags`]).
    pub parallel_flags: &'static [&'static str],
    /// How its models' memory is estimated ([`EngineKind::memory_model`]).
    pub memory: crate::MemoryModel,
}

impl EngineKind for BuiltinKind {
    fn id(&self) -> &'static str {
        self.id
    }

    fn aliases(&self) -> &'static [&'static str] {
        self.aliases
    }

    fn starts(&self) -> Starts {
        Starts::Builtin {
            subcommand: self.subcommand,
        }
    }

    fn default_listen(&self) -> OwnedListen {
        OwnedListen::PrivateSocket
    }

    fn can_close_its_door(&self) -> bool {
        true
    }

    fn classify(&self, status: u16, body: &[u8]) -> Readiness {
        classify(status, body)
    }

    fn door_args(&self) -> &'static [&'static str] {
        DOOR_ARGS
    }

    fn device_plan(&self) -> DevicePlan {
        DevicePlan::CpuOnly
    }

    fn formats(&self) -> &'static [ModelFormat] {
        self.formats
    }

    fn takes_model_file(&self) -> bool {
        true
    }

    fn needs_library(&self) -> Option<crate::Engine> {
        self.library
    }

    fn runtime_library(&self) -> Option<RuntimeLibrary> {
        self.runtime
    }

    fn model_assets(&self) -> bool {
        self.model_assets
    }

    fn api_paths(&self) -> &'static [&'static str] {
        self.api_paths
    }

    fn aux_models(&self) -> &'static [AuxModel] {
        self.aux_models
    }

    fn parallel_flags(&self) -> &'static [&'static str] {
        self.parallel_flags
    }

    fn memory_model(&self) -> crate::MemoryModel {
        self.memory
    }

    fn command_line(&self, launch: &Launch<'_>) -> CommandLine {
        command_line(self.subcommand, launch)
    }
}

/// `arcane <subcommand> --socket PATH | --host H --port P [--api-key-file F] --model M
/// [--library L] [aux flag PATH…] [user args…]`.
fn command_line(subcommand: &str, launch: &Launch<'_>) -> CommandLine {
    let mut args = vec![subcommand.to_string()];
    match launch.listen {
        ListenAt::Socket(socket) => {
            args.extend(["--socket".to_string(), socket.display().to_string()]);
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
    if let Some(model) = launch.model {
        args.extend(["--model".to_string(), model.display().to_string()]);
    }
    if let Some(library) = launch.runtime_library {
        args.extend(["--library".to_string(), library.display().to_string()]);
    }
    for (flag, path) in launch.aux_models {
        args.extend([flag.to_string(), path.display().to_string()]);
    }
    args.extend(launch.user_args.iter().cloned());
    CommandLine {
        args,
        env: Default::default(),
    }
}

/// Readiness of a builtin engine: `200 {"status":"ok"}`.
fn classify(status: u16, body: &[u8]) -> crate::Readiness {
    let ok = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .is_some_and(|json| json["status"] == "ok");
    if (200..300).contains(&status) && ok {
        crate::Readiness::Ready { version: None }
    } else if status == 503 {
        crate::Readiness::Loading
    } else {
        crate::Readiness::Other
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use super::*;

    fn launch<'a>(listen: ListenAt<'a>, user_args: &'a [String]) -> Launch<'a> {
        static EMPTY: BTreeMap<String, String> = BTreeMap::new();
        Launch {
            listen,
            key_file: None,
            model: Some(Path::new("/m/ggml-tiny.en.bin")),
            models_dir: None,
            alias: Some("whisper-1"),
            user_args,
            managed: true,
            device_args: &[],
            template: &[],
            template_env: &EMPTY,
            runtime_library: None,
            aux_models: &[],
        }
    }

    #[test]
    fn the_door_comes_first_and_the_user_args_last() {
        let user = vec!["--threads".to_string(), "2".to_string()];
        let line = command_line(
            "__whisper-worker",
            &launch(ListenAt::Socket(Path::new("/ws/.arcane/run/w.sock")), &user),
        );
        assert_eq!(
            line.args,
            [
                "__whisper-worker",
                "--socket",
                "/ws/.arcane/run/w.sock",
                "--model",
                "/m/ggml-tiny.en.bin",
                "--threads",
                "2"
            ]
        );
        let mut keyed = launch(
            ListenAt::Tcp {
                host: "127.0.0.1",
                port: 9000,
                origin: "http://127.0.0.1:9000",
            },
            &[],
        );
        keyed.key_file = Some(Path::new("/ws/.arcane/run/w.key"));
        keyed.runtime_library = Some(Path::new("/rt/libonnxruntime.so.1.31.1"));
        let line = command_line("__piper-worker", &keyed);
        assert_eq!(
            line.args,
            [
                "__piper-worker",
                "--host",
                "127.0.0.1",
                "--port",
                "9000",
                "--api-key-file",
                "/ws/.arcane/run/w.key",
                "--model",
                "/m/ggml-tiny.en.bin",
                "--library",
                "/rt/libonnxruntime.so.1.31.1"
            ]
        );
    }

    #[test]
    fn only_an_ok_status_is_ready() {
        assert_eq!(
            classify(200, br#"{"status":"ok"}"#),
            crate::Readiness::Ready { version: None }
        );
        assert_eq!(classify(200, b"<html>"), crate::Readiness::Other);
        assert_eq!(
            classify(503, br#"{"status":"loading"}"#),
            crate::Readiness::Loading
        );
        assert_eq!(classify(404, b""), crate::Readiness::Other);
    }
}
