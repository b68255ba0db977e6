//! The engine command line: the kind's descriptor builds its arguments
//! ([`arcane_workspace::EngineKind::command_line`]: llama.cpp's in the SDK's order,
//! Ollama's `serve` with `OLLAMA_HOST` and `OLLAMA_MODELS`, the `command` kind's
//! template with its placeholders expanded); this module adds what every owned engine
//! gets, whatever its kind.
//!
//! The child inherits Arcane's environment with these additions on top: the kind's
//! variables, the resolver's device variables (for kinds pinned by arguments or
//! environment), minus the variables the resolver removes (e.g. other vendors' device
//! selectors), plus `ARCANE_ENGINE_NONCE`, which lets a later Arcane prove it started
//! the process, and the loader search path of [`arcane_process::loader_path`] (the
//! runtime's library directories first, then the inherited value).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arcane_workspace::{DevicePlan, Launch, ListenAt};

use crate::config::{EngineConfig, Validated};
use crate::endpoint::EngineAddress;

/// The variable that carries an owned engine's ownership nonce.
pub const NONCE_VARIABLE: &str = "ARCANE_ENGINE_NONCE";

/// A complete engine invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineCommand {
    /// The executable.
    pub program: PathBuf,
    /// The arguments, in order.
    pub args: Vec<String>,
    /// Variables set on top of the inherited environment.
    pub env: BTreeMap<String, String>,
    /// Variables removed from the inherited environment.
    pub env_remove: Vec<String>,
}

/// Device arguments and environment from the resolver.
#[derive(Debug, Clone, Default)]
pub struct DeviceLaunch {
    /// Arguments appended last.
    pub args: Vec<String>,
    /// Variables to set.
    pub env: BTreeMap<String, String>,
    /// Variables to remove.
    pub env_remove: Vec<String>,
}

/// Builds the command that starts `config`'s engine at `validated`'s endpoint.
pub(crate) fn engine_command(
    config: &EngineConfig,
    validated: &Validated,
    executable: &Path,
    device: &DeviceLaunch,
    nonce: &str,
    key_file: Option<&Path>,
) -> EngineCommand {
    let kind = config.engine.kind();
    let socket;
    let (host, origin);
    let listen = match &validated.owned.address {
        EngineAddress::Unix(path) => {
            socket = path.clone();
            ListenAt::Socket(&socket)
        }
        EngineAddress::Tcp(endpoint) => {
            host = endpoint.host().to_string();
            origin = endpoint.origin();
            ListenAt::Tcp {
                host: &host,
                port: endpoint.port(),
                origin: &origin,
            }
        }
    };
    let plan = kind.device_plan();
    let device_args = match plan {
        DevicePlan::ArgsAndEnv => device.args.as_slice(),
        DevicePlan::EnvOnly | DevicePlan::EngineChooses | DevicePlan::CpuOnly => &[],
    };
    let line = kind.command_line(&Launch {
        listen,
        key_file,
        model: validated.model.as_deref(),
        models_dir: validated.models_dir.as_deref(),
        alias: config.alias.as_deref(),
        user_args: &config.extra_args,
        managed: validated.selection.is_some(),
        device_args,
        template: &config.template,
        template_env: &config.template_env,
        runtime_library: config.runtime_library.as_deref(),
        aux_models: &config.aux_models,
    });
    let args = line.args;
    let mut env = line.env;
    let mut env_remove = Vec::new();
    if plan != DevicePlan::EngineChooses {
        env.extend(device.env.clone());
        env_remove.extend(device.env_remove.iter().cloned());
    }
    let inherited = config.inherited_loader_path.as_deref();
    match arcane_process::loader_path(&config.library_dirs, inherited) {
        // Environment values are text here; a non-UTF-8 directory name is written
        // lossily (as every path on the command line is).
        (variable, Some(value)) => {
            env.insert(variable.into(), value.to_string_lossy().into_owned());
        }
        // Nothing to search: the child must not inherit an empty (current-directory)
        // entry either.
        (variable, None) if inherited.is_some() => env_remove.push(variable.into()),
        (_, None) => {}
    }
    env.insert(NONCE_VARIABLE.into(), nonce.into());
    env_remove.extend(
        arcane_process::CREDENTIAL_VARIABLES
            .iter()
            .map(|name| name.to_string()),
    );
    env_remove.retain(|name| !env.contains_key(name));
    EngineCommand {
        program: executable.to_path_buf(),
        args,
        env,
        env_remove,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Engine;

    fn build(config: &EngineConfig, device: &DeviceLaunch) -> EngineCommand {
        let validated = config.validate(Path::new("/app")).unwrap();
        let key = crate::listen::key_file(Path::new("/app"), &config.id, &validated.owned);
        engine_command(
            config,
            &validated,
            Path::new("/bin/llama-server"),
            device,
            "n",
            key.as_deref(),
        )
    }

    /// A llama.cpp config on the url's port (with its key), as when a url is given.
    fn on_port() -> EngineConfig {
        let mut config = EngineConfig::new(Engine::LlamaCpp);
        config.listen = crate::OwnedListen::KeyedPort;
        config
    }

    fn cpu() -> DeviceLaunch {
        DeviceLaunch {
            args: ["--device", "none", "--gpu-layers", "0"]
                .map(String::from)
                .to_vec(),
            ..DeviceLaunch::default()
        }
    }

    #[test]
    fn router_mode_on_the_private_socket_by_default() {
        let command = build(
            &EngineConfig::new(Engine::LlamaCpp),
            &DeviceLaunch::default(),
        );
        assert_eq!(
            command.args,
            [
                "--host",
                "/app/.arcane/run/llama.cpp.sock",
                "--jinja",
                "--models-dir",
                "/app/.arcane/models/llama.cpp"
            ]
        );
        assert_eq!(
            command.env.get(NONCE_VARIABLE).map(String::as_str),
            Some("n")
        );
        // The Core's own credential never reaches an engine.
        assert!(command.env_remove.iter().any(|n| n == "ARCANE_API_KEY"));
    }

    #[test]
    fn a_port_gets_its_key_file_and_ipv6_hosts_lose_their_brackets() {
        let mut config = on_port();
        config.url = "http://[::1]:9000".into();
        let command = build(&config, &DeviceLaunch::default());
        assert_eq!(
            &command.args[..6],
            [
                "--host",
                "::1",
                "--port",
                "9000",
                "--api-key-file",
                "/app/.arcane/run/llama.cpp.key"
            ]
        );
        // A port without a key is only ever asked for explicitly.
        config.listen = crate::OwnedListen::OpenPort;
        let command = build(&config, &DeviceLaunch::default());
        assert_eq!(
            &command.args[..5],
            ["--host", "::1", "--port", "9000", "--jinja"]
        );
    }

    #[test]
    fn user_args_follow_the_model_without_a_managed_selection() {
        let mut config = on_port();
        config.model = Some("models/a.gguf".into());
        config.alias = Some("m".into());
        config.extra_args = vec!["-c".into(), "4096".into()];
        let command = build(&config, &DeviceLaunch::default());
        assert_eq!(
            command.args,
            [
                "--host",
                "127.0.0.1",
                "--port",
                "8080",
                "--api-key-file",
                "/app/.arcane/run/llama.cpp.key",
                "--jinja",
                "--model",
                "/app/models/a.gguf",
                "-c",
                "4096",
                "--alias",
                "m"
            ]
        );
    }

    #[test]
    fn user_args_precede_the_model_with_a_managed_selection_and_device_args_come_last() {
        let mut config = on_port();
        config.model = Some("/m.gguf".into());
        config.alias = Some("m".into());
        config.device = Some("cpu".into());
        config.extra_args = vec!["-c".into(), "4096".into()];
        let command = build(&config, &cpu());
        assert_eq!(
            command.args,
            [
                "--host",
                "127.0.0.1",
                "--port",
                "8080",
                "--api-key-file",
                "/app/.arcane/run/llama.cpp.key",
                "--jinja",
                "-c",
                "4096",
                "--model",
                "/m.gguf",
                "--alias",
                "m",
                "--device",
                "none",
                "--gpu-layers",
                "0"
            ]
        );
    }

    #[test]
    fn ollama_gets_serve_and_its_variables() {
        let mut config = EngineConfig::new(Engine::Ollama);
        config.url = "http://127.0.0.1:11500".into();
        config.extra_args = vec!["--x".into()];
        let validated = config.validate(Path::new("/app")).unwrap();
        let command = engine_command(
            &config,
            &validated,
            Path::new("/bin/ollama"),
            &DeviceLaunch::default(),
            "n",
            None,
        );
        assert_eq!(command.args, ["serve", "--x"]);
        assert_eq!(command.env["OLLAMA_HOST"], "http://127.0.0.1:11500");
        assert_eq!(command.env["OLLAMA_MODELS"], "/app/.arcane/models/ollama");
    }

    #[test]
    fn the_runtime_libraries_come_first_and_the_inherited_loader_path_is_kept() {
        let variable = arcane_process::LOADER_PATH_VARIABLE;
        let mut config = EngineConfig::new(Engine::LlamaCpp);
        config.library_dirs = vec!["/r/lib".into()];
        config.inherited_loader_path = Some("/usr/cuda/lib::/r/lib".into());
        let command = build(&config, &DeviceLaunch::default());
        assert_eq!(command.env[variable], "/r/lib:/usr/cuda/lib");

        // An inherited value with nothing but empty (current-directory) entries is
        // removed, not passed on.
        config.library_dirs.clear();
        config.inherited_loader_path = Some(":".into());
        let command = build(&config, &DeviceLaunch::default());
        assert!(!command.env.contains_key(variable));
        assert!(command.env_remove.iter().any(|name| name == variable));

        // A caller that passes no inherited value leaves the child's variable alone.
        config.inherited_loader_path = None;
        let command = build(&config, &DeviceLaunch::default());
        assert!(!command.env.contains_key(variable));
        assert!(!command.env_remove.iter().any(|name| name == variable));
    }
}
