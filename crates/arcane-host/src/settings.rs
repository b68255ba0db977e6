//! `arcane.toml` and the flags of `arcane serve`, turned into what a host runs: its
//! schema ([`ConfigFile`], [`EngineTable`], the `[[model]]` tables of
//! [`crate::models`]), the checks that refuse a bad value naming it before anything
//! starts, and the rules that pick the mode: the model gateway of `[[model]]` tables
//! (or of a repeated `--model`), supervised `[[engine]]`s, or one model (the flags' or
//! the embedded default's) served as a gateway of one.
//!
//! With nothing configured (no `arcane.toml`, no `--runtime`/`--model`/`--models-dir`/
//! `--device`/`--backend`/`--executable`), the embedded default runs: the registered
//! runtime `llama.cpp` with the registered model `smollm2-135m` on the CPU target.

use std::path::{Path, PathBuf};
use std::time::Duration;

use arcane_localai::{Backend, Engine, EngineConfig, RestartPolicy};
use arcane_registry::Registry;
use arcane_report::codes;
use serde::Deserialize;
use serde_json::json;

use crate::error::{Error, Refusal};
use crate::start::ServeOptions;
use crate::Context;

/// The model the embedded default serves.
pub const DEFAULT_MODEL: &str = "smollm2-135m";
/// The execution target of the embedded default.
pub const DEFAULT_DEVICE: &str = "cpu";

/// The flags of `arcane serve`: each overrides what `arcane.toml` says (with the
/// `clap` feature, they are the command's flags and these comments its help).
#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[cfg_attr(feature = "clap", command(disable_version_flag = true))]
pub struct Flags {
    /// Read the configuration from this TOML file (see `docs/arcane.toml.example`).
    /// Default: `arcane.toml` in the current directory when there is one (`arcane
    /// serve` only), else `<workspace>/arcane.toml` when it exists; `serve` names the
    /// file it read on its first line.
    #[cfg_attr(feature = "clap", arg(long, value_name = "FILE"))]
    pub config: Option<PathBuf>,

    /// The engine to run: `llama.cpp` or `ollama`, or a registered runtime id.
    #[cfg_attr(feature = "clap", arg(long, value_name = "RUNTIME"))]
    pub runtime: Option<String>,

    /// The engine's url (default `http://127.0.0.1:8080`, Ollama `:11434`); clients do
    /// not use it (they use the Core's address, `--listen`). A server that already
    /// answers there is adopted as it is (even with nothing registered, when no other
    /// flag is given). When nothing answers, Arcane starts llama.cpp on that port with a
    /// random API key only the Core knows; without `--url`, it starts llama.cpp on a
    /// private Unix socket and no port at all.
    #[cfg_attr(feature = "clap", arg(long, value_name = "URL"))]
    pub url: Option<String>,

    /// The model: a registered model id or a GGUF file path (llama.cpp). Given more
    /// than once, `arcane serve` is a model gateway over them (as `[[model]]` tables):
    /// `--model ID=MODEL` names one, else its id is the registered id or the file's stem;
    /// `--device` and the engine arguments after `--` apply to each.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "[ID=]ID|PATH", conflicts_with = "models_dir")
    )]
    pub model: Vec<String>,

    /// Router mode: serve every model in DIR (`--models-dir`; Ollama: `OLLAMA_MODELS`).
    #[cfg_attr(feature = "clap", arg(long, value_name = "DIR"))]
    pub models_dir: Option<PathBuf>,

    /// The model name clients use (`--alias`; default: the model id).
    #[cfg_attr(feature = "clap", arg(long, value_name = "NAME"))]
    pub alias: Option<String>,

    /// Run on exactly this device: an id from `arcane devices`, or `cpu`. An external
    /// server cannot honour it, so it is refused rather than adopted.
    #[cfg_attr(feature = "clap", arg(long, value_name = "TARGET"))]
    pub device: Option<String>,

    /// The compute backend to require: auto, cpu, cuda, vulkan or metal.
    #[cfg_attr(feature = "clap", arg(long, value_name = "BACKEND"))]
    pub backend: Option<String>,

    /// The engine version to require (checked against what the running server reports).
    #[cfg_attr(feature = "clap", arg(long = "version", value_name = "VERSION"))]
    pub engine_version: Option<String>,

    /// Start this engine executable instead of the registered runtime's.
    #[cfg_attr(feature = "clap", arg(long, value_name = "FILE"))]
    pub executable: Option<PathBuf>,

    /// Restart an owned engine that crashes after it was ready.
    #[cfg_attr(feature = "clap", arg(long, value_name = "POLICY", value_parser = ["never", "on-failure"]))]
    pub restart: Option<String>,

    /// Test only: do not arm the parent-death signal (simulates an orphan).
    #[cfg_attr(feature = "clap", arg(long, hide = true))]
    pub no_parent_death_signal: bool,

    /// The Core's own address, the one clients use: `127.0.0.1`, `::1`, `localhost`,
    /// optionally with a port (`127.0.0.1:9000`, `[::1]:9000`); loopback only. Default:
    /// `listen` in `arcane.toml`, else `127.0.0.1` on the workspace's saved port.
    #[cfg_attr(feature = "clap", arg(long, value_name = "ADDR"))]
    pub listen: Option<String>,

    /// Read the bearer token clients must present from FILE (one line, 16 or more
    /// visible characters, mode 0600) instead of the workspace's own `.arcane/core-token`
    /// (`ARCANE_API_KEY` sets it directly; this flag wins).
    #[cfg_attr(feature = "clap", arg(long, value_name = "FILE"))]
    pub api_key_file: Option<PathBuf>,

    /// Serve the application's packaged web, the static files in DIR (its
    /// `index.html` at the top), at `/ui/app/` (`/app/` redirects there), to a browser
    /// logged in with `arcane open --app`. Adds to nothing: replaces `web` in
    /// `arcane.toml`.
    #[cfg_attr(feature = "clap", arg(long, value_name = "DIR"))]
    pub web: Option<PathBuf>,

    /// Let web pages of ORIGIN (`http://localhost:3000`, exactly as the browser sends
    /// it) read the Core's answers (CORS); repeat for more. Their requests still need
    /// the token; a wildcard is refused. Adds to `allowed_origins` in `arcane.toml`.
    #[cfg_attr(feature = "clap", arg(long = "allow-origin", value_name = "ORIGIN"))]
    pub allow_origin: Vec<String>,

    /// Listen on this port for this run instead of the saved one (which is chosen once
    /// and kept, so clients' URLs stay valid; a busy saved port is an error).
    #[cfg_attr(feature = "clap", arg(long, value_name = "PORT"))]
    pub port: Option<u16>,

    /// Seconds a shutdown (Ctrl-C, SIGTERM) waits for in-flight passthrough responses
    /// (`/v1/chat/completions` and the rest, streamed ones included) to finish before
    /// it cuts them; only then are the engines stopped (default 30). A second signal
    /// stops waiting at once.
    #[cfg_attr(feature = "clap", arg(long, value_name = "SECONDS"))]
    pub drain_timeout: Option<f64>,

    /// Extra engine arguments, after `--` (those that decide where or how the engine
    /// listens or authenticates, such as `--host` or `--port`, are refused: use `--url`,
    /// or a `command` model).
    #[cfg_attr(feature = "clap", arg(last = true, value_name = "ENGINE_ARGS"))]
    pub engine_args: Vec<String>,
}

/// One `[[engine]]` table of `arcane.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineTable {
    /// `llama.cpp`, `ollama`, or a registered runtime id.
    pub runtime: Option<String>,
    /// Listener url.
    pub url: Option<String>,
    /// Registered model id or GGUF path (relative to the file's directory).
    pub model: Option<String>,
    /// Router-mode models directory (relative to the file's directory).
    pub models_dir: Option<PathBuf>,
    /// `--alias`.
    pub alias: Option<String>,
    /// Execution target.
    pub device: Option<String>,
    /// Required backend.
    pub backend: Option<String>,
    /// Required version.
    pub version: Option<String>,
    /// Engine executable (instead of the registered runtime).
    pub executable: Option<PathBuf>,
    /// Extra engine arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Seconds an owned engine may take to become ready.
    pub startup_timeout: Option<f64>,
    /// Seconds an owned engine may stay loading without output.
    pub stall_timeout: Option<f64>,
    /// Seconds between SIGTERM and SIGKILL.
    pub stop_grace: Option<f64>,
    /// `never` or `on-failure`.
    pub restart: Option<String>,
    /// The most restarts under `on-failure`.
    pub max_restarts: Option<u32>,
    /// Seconds before the first restart (doubling).
    pub restart_backoff: Option<f64>,
}

/// The whole `arcane.toml`: `listen` and `[[engine]]`; any other key is refused.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// The Core's own address (as `--listen`).
    pub listen: Option<String>,
    /// The model gateway's models (instead of `[[engine]]`).
    #[serde(default)]
    pub model: Vec<crate::models::ModelTable>,
    /// Per-device limits of the model gateway (`[devices.cpu] max_loaded = 1`).
    #[serde(default)]
    pub devices: std::collections::HashMap<String, crate::models::DeviceTable>,
    /// The model gateway's exclusive groups (`[[group]]`).
    #[serde(default)]
    pub group: Vec<crate::models::GroupTable>,
    /// The engines to run.
    #[serde(default)]
    pub engine: Vec<EngineTable>,
    /// Origins whose web pages may read the Core's answers (CORS), as `--allow-origin`.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Bytes of log lines the host keeps, all models together: a number or a size
    /// (`"4MiB"`); default 1 MiB.
    pub log_buffer: Option<toml::Value>,
    /// The application's packaged web (as `--web`), relative to this file.
    pub web: Option<PathBuf>,
    /// Whether the file has any setting at all (not empty, not only comments): set by
    /// the reader, never read from the file.
    #[serde(skip)]
    pub has_settings: bool,
    /// The file it was read from (absolute): set by the reader.
    #[serde(skip)]
    pub path: PathBuf,
}

/// What a host runs for `arcane.toml` and `flags`, validated before anything starts:
/// the Core's address first (a bad one is reported before any engine is looked up),
/// then the mode and its models or engines, the origins, the packaged web and the API
/// key. The worker kinds are the caller's ([`ServeOptions::workers`]).
pub fn options(context: &Context, flags: &Flags) -> Result<ServeOptions, Error> {
    let (file, base) = load_config(&context.workspace, flags)?;
    let (listen, port) = listen_address(flags, file.as_ref())?;
    let allowed_origins = allowed_origins(flags, file.as_ref())?;
    let log_budget = log_budget(file.as_ref())?;
    let web = packaged_web(flags, file.as_ref(), &base)?;
    let had_file = file.as_ref().is_some_and(|f| f.has_settings);
    let config_file = file.as_ref().map(|f| f.path.clone());
    let mut gateway = model_gateway(context, flags, file.as_ref(), &base)?;
    let mut one_model = false;
    let configs = if gateway.is_some() {
        Vec::new()
    } else {
        let engine_tables = file.as_ref().is_some_and(|f| !f.engine.is_empty());
        let mut configs = engine_configs(context, flags, file, &base)?;
        if !engine_tables && configs.len() == 1 && serves_one_model(&configs[0]) {
            let config = configs.remove(0);
            gateway = Some(single_gateway(context, flags, config, had_file));
            one_model = true;
        }
        configs
    };
    let mut options = ServeOptions::new(configs);
    options.config_file = config_file;
    options.one_model = one_model;
    options.gateway = gateway;
    if let Some(listen) = listen {
        options.listen = listen;
    }
    options.port = port;
    options.allowed_origins = allowed_origins;
    options.log_budget = log_budget;
    options.web = web;
    options.api_key = api_key(context, flags)?;
    options.drain_deadline = seconds(
        "--drain-timeout",
        flags.drain_timeout,
        arcane_core::host::DEFAULT_DRAIN_DEADLINE,
    )?;
    Ok(options)
}

/// The bearer token of `--api-key-file`, else the environment's, checked; `None`: the
/// workspace's own.
fn api_key(context: &Context, flags: &Flags) -> Result<Option<String>, Error> {
    let key = match &flags.api_key_file {
        Some(file) => Some(
            arcane_core::endpoint::read_token_file(file)?.ok_or_else(|| {
                Error::from(Refusal::usage(
                    format!("the API key file `{}` does not exist", file.display()),
                    json!({"path": file}),
                ))
            })?,
        ),
        None => context.environment.api_key.clone(),
    };
    if let Some(key) = &key {
        if key.len() < 16 || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Refusal::usage(
                "the API key must be 16 or more visible characters (no spaces)",
                json!({"length": key.len()}),
            )
            .into());
        }
    }
    Ok(key)
}

/// Whether an engine configuration is one model (a kind that serves one model file,
/// with one): `arcane serve` then runs it as a gateway of that one model. An engine
/// without a model file (adopt-only, llama.cpp's router mode, Ollama, which manage
/// their own models) keeps the plain supervised engine.
fn serves_one_model(config: &EngineConfig) -> bool {
    config.engine.kind().takes_model_file() && config.model.is_some() && config.models_dir.is_none()
}

/// The gateway of one model for the engine the flags (or the embedded default) name;
/// `arcane reload` derives it again from the same flags and `arcane.toml` (`had_file`:
/// whether there was one at the start).
fn single_gateway(
    context: &Context,
    flags: &Flags,
    config: EngineConfig,
    had_file: bool,
) -> std::sync::Arc<arcane_gateway::Gateway> {
    let configuration = crate::models::single(config, &context.workspace);
    let gateway = arcane_gateway::Gateway::configured(configuration);
    let (context, flags) = (context.clone(), flags.clone());
    gateway.set_reloader(std::sync::Arc::new(move || {
        let again = || -> Result<_, Error> {
            let (file, base) = reload_config(&context.workspace, &flags, had_file)?;
            if file.as_ref().is_some_and(|f| !f.model.is_empty() || !f.engine.is_empty()) {
                return Err(Refusal::usage(
                    "`arcane.toml` now has `[[model]]` or `[[engine]]` tables; the running host keeps its one model (restart to change modes)",
                    json!({}),
                )
                .into());
            }
            let mut configs = engine_configs(&context, &flags, file, &base)?;
            let config = configs.remove(0);
            Ok(crate::models::single(config, &context.workspace))
        };
        again().map_err(|error| error.0 as arcane_core::BoxError)
    }));
    gateway
}

/// The gateway of the workspace's `arcane.toml` (its `[[model]]` tables), as `arcane
/// serve` with no flags would make it, or `None` without such tables: `arcane core
/// --stdio` serves the same models.
pub(crate) fn workspace_gateway(
    context: &Context,
) -> Result<Option<std::sync::Arc<arcane_gateway::Gateway>>, Error> {
    let flags = Flags::default();
    let (file, base) = load_config(&context.workspace, &flags)?;
    model_gateway(context, &flags, file.as_ref(), &base)
}

/// The model gateway when `arcane.toml` has `[[model]]` tables (then neither
/// `[[engine]]` nor engine flags may be given), with a reloader that reads the file
/// again (`arcane reload`, SIGHUP).
fn model_gateway(
    context: &Context,
    flags: &Flags,
    file: Option<&ConfigFile>,
    base: &Path,
) -> Result<Option<std::sync::Arc<arcane_gateway::Gateway>>, Error> {
    let Some(configuration) = gateway_models(context, flags, file, base)? else {
        return Ok(None);
    };
    let gateway = arcane_gateway::Gateway::configured(configuration);
    let (context, flags) = (context.clone(), flags.clone());
    let had_file = file.is_some_and(|f| f.has_settings);
    gateway.set_reloader(std::sync::Arc::new(move || {
        let read = reload_config(&context.workspace, &flags, had_file)
            .and_then(|(file, base)| gateway_models(&context, &flags, file.as_ref(), &base));
        match read {
            Ok(Some(models)) => Ok(models),
            Ok(None) => Err(Box::new(Refusal::usage(
                "the configuration no longer has `[[model]]` tables; a running gateway keeps its models (restart to change modes)",
                json!({}),
            )) as arcane_core::BoxError),
            Err(error) => Err(error.0),
        }
    }));
    Ok(Some(gateway))
}

/// The gateway's models, device limits and groups from the configuration file, or
/// `None` without `[[model]]` tables.
fn gateway_models(
    context: &Context,
    flags: &Flags,
    file: Option<&ConfigFile>,
    base: &Path,
) -> Result<Option<arcane_gateway::Configuration>, Error> {
    if flags.model.len() > 1 {
        if file
            .as_ref()
            .is_some_and(|f| !f.model.is_empty() || !f.engine.is_empty())
        {
            return Err(Refusal::usage(
                "`--model` given more than once makes a gateway of its own; it excludes `[[model]]` and `[[engine]]` in arcane.toml",
                json!({"models": flags.model}),
            )
            .into());
        }
        let tables = flag_models(flags, &Registry::new(&context.workspace), base)?;
        let devices = file.map(|f| f.devices.clone()).unwrap_or_default();
        let groups = file.map(|f| f.group.clone()).unwrap_or_default();
        return crate::models::models(
            context,
            &tables,
            &devices,
            &groups,
            base,
            !flags.no_parent_death_signal,
        )
        .map(Some);
    }
    if let Some(file) = file.filter(|f| f.model.is_empty() && !f.group.is_empty()) {
        // Groups of models that are not there would silently do nothing.
        let ids: Vec<&str> = file.group.iter().map(|g| g.id.as_str()).collect();
        return Err(Refusal::usage(
            "`[[group]]` tables group `[[model]]` tables, and arcane.toml has none",
            json!({"groups": ids}),
        )
        .hint("add the members as `[[model]]` tables, or remove the `[[group]]` tables")
        .into());
    }
    let Some(file) = file.filter(|f| !f.model.is_empty()) else {
        return Ok(None);
    };
    if !file.engine.is_empty() || configures_an_engine(flags) || flags.url.is_some() {
        return Err(Refusal::usage(
            "`[[model]]` (the model gateway) and `[[engine]]` or engine flags (`--model`, `--url`, …) exclude each other",
            json!({"models": file.model.len(), "engines": file.engine.len()}),
        )
        .hint("put every model in a `[[model]]` table, or use `[[engine]]` only")
        .into());
    }
    crate::models::models(
        context,
        &file.model,
        &file.devices,
        &file.group,
        base,
        !flags.no_parent_death_signal,
    )
    .map(Some)
}

/// Whether the flags configure an engine (and so replace the embedded default):
/// `--runtime`, `--model`, `--models-dir`, `--device`, `--backend`, `--executable`.
fn configures_an_engine(flags: &Flags) -> bool {
    flags.runtime.is_some()
        || !flags.model.is_empty()
        || flags.models_dir.is_some()
        || flags.device.is_some()
        || flags.backend.is_some()
        || flags.executable.is_some()
}

/// `[[model]]` tables from a repeated `--model`.
fn flag_models(
    flags: &Flags,
    registry: &Registry,
    base: &Path,
) -> Result<Vec<crate::models::ModelTable>, Error> {
    flags
        .model
        .iter()
        .map(|given| {
            let (id, model) = match given.split_once('=') {
                Some((id, model)) => (id.to_string(), model.to_string()),
                None => {
                    let stem = Path::new(given)
                        .file_stem()
                        .map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_else(|| given.clone());
                    let id = if given.contains('/') || given.ends_with(".gguf") {
                        stem
                    } else {
                        given.clone()
                    };
                    (id, given.clone())
                }
            };
            // A speech model goes to its own kind (named here, so it is not looked up
            // again); the runtime flags are the others'.
            let speech = served_by(registry, &model, base);
            let executable = speech.is_none().then(|| flags.executable.clone()).flatten();
            Ok(crate::models::ModelTable {
                id,
                runtime: speech.or_else(|| flags.runtime.clone()),
                executable,
                model: Some(model),
                device: flags.device.clone(),
                args: flags.engine_args.clone(),
                ..Default::default()
            })
        })
        .collect()
}

/// The Core's listen address and port from `--listen` (else `listen` in
/// `arcane.toml`) and `--port`; a port in the address that contradicts `--port` is a
/// usage error.
/// The origins of `allowed_origins` in `arcane.toml` and of `--allow-origin`, checked
/// before anything starts (a wildcard or a value that is not an origin is refused,
/// naming it).
fn allowed_origins(
    flags: &Flags,
    file: Option<&ConfigFile>,
) -> Result<arcane_front_door::origins::AllowedOrigins, Error> {
    let from_file = file
        .map(|f| f.allowed_origins.as_slice())
        .unwrap_or_default();
    let all: Vec<&String> = from_file.iter().chain(&flags.allow_origin).collect();
    Ok(arcane_front_door::origins::AllowedOrigins::parse(&all)?)
}

/// The packaged web of `--web` or `web` in `arcane.toml` (relative to the file),
/// opened now: a missing, linked or writable-by-others directory is refused before
/// anything starts.
fn packaged_web(
    flags: &Flags,
    file: Option<&ConfigFile>,
    base: &Path,
) -> Result<Option<std::sync::Arc<arcane_front_door::web::WebRoot>>, Error> {
    let dir = match (&flags.web, file.and_then(|f| f.web.as_ref())) {
        (Some(flag), _) => std::path::absolute(flag).unwrap_or_else(|_| flag.clone()),
        (None, Some(configured)) => base.join(configured),
        (None, None) => return Ok(None),
    };
    Ok(Some(std::sync::Arc::new(
        arcane_front_door::web::WebRoot::open(&dir)?,
    )))
}

/// `log_buffer` of `arcane.toml`: a number of bytes or a size string.
fn log_budget(file: Option<&ConfigFile>) -> Result<Option<usize>, Error> {
    let Some(value) = file.and_then(|f| f.log_buffer.as_ref()) else {
        return Ok(None);
    };
    let text = match value {
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    arcane_core::logs::parse_size(&text)
        .map(Some)
        .map_err(|why| {
            Refusal::usage(
                format!("`log_buffer` in arcane.toml: {why}"),
                json!({"log_buffer": text}),
            )
            .into()
        })
}

fn listen_address(
    flags: &Flags,
    file: Option<&ConfigFile>,
) -> Result<(Option<std::net::IpAddr>, Option<u16>), Error> {
    let listen = match &flags.listen {
        Some(flag) => Some(("--listen", flag.clone())),
        None => file
            .and_then(|file| file.listen.clone())
            .map(|value| ("`listen` in arcane.toml", value)),
    };
    let Some((source, text)) = listen else {
        return Ok((None, flags.port));
    };
    let (ip, port) = parse_listen(source, &text)?;
    match (port, flags.port) {
        (Some(named), Some(flag)) if named != flag => Err(Refusal::usage(
            format!("{source} `{text}` names port {named} but `--port` says {flag}"),
            json!({"listen": text, "port": flag}),
        )
        .into()),
        (named, flag) => Ok((Some(ip), named.or(flag))),
    }
}

/// Parses a listen address: `IP`, `IP:PORT`, `[IPv6]:PORT`, `localhost[:PORT]`,
/// optionally as `http://…`. Only loopback addresses are accepted (the Core's `Host`
/// check and its threat model assume one machine).
pub fn parse_listen(source: &str, text: &str) -> Result<(std::net::IpAddr, Option<u16>), Error> {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    let bad = |why: &str| -> Error {
        Refusal::usage(format!("{source} `{text}` {why}"), json!({"listen": text}))
            .hint("use `127.0.0.1`, `[::1]:PORT` or `localhost:PORT`")
            .into()
    };
    let trimmed = text.trim();
    let bare = trimmed
        .strip_prefix("http://")
        .unwrap_or(trimmed)
        .trim_end_matches('/');
    let (ip, port) = if let Ok(ip) = bare.parse::<IpAddr>() {
        (ip, None)
    } else if let Ok(address) = bare.parse::<SocketAddr>() {
        (address.ip(), Some(address.port()))
    } else if bare.eq_ignore_ascii_case("localhost") {
        (IpAddr::V4(Ipv4Addr::LOCALHOST), None)
    } else if let Some(port) = bare
        .split_once(':')
        .filter(|(host, _)| host.eq_ignore_ascii_case("localhost"))
        .map(|(_, port)| port)
    {
        let port = port
            .parse::<u16>()
            .map_err(|_| bad("has a port that is not a number from 1 to 65535"))?;
        (IpAddr::V4(Ipv4Addr::LOCALHOST), Some(port))
    } else {
        return Err(bad(
            "is not an address (an IP or `localhost`, with an optional port)",
        ));
    };
    if !ip.is_loopback() {
        return Err(bad(
            "is not a loopback address; the Core host listens on loopback only",
        ));
    }
    if port == Some(0) {
        return Err(bad("names port 0; leave the port out to use the saved one"));
    }
    Ok((ip, port))
}

/// Builds the engine configurations from `arcane.toml` and the flags, validating every
/// value and reading the registry, before anything is started.
pub fn engine_configs(
    context: &Context,
    flags: &Flags,
    file: Option<ConfigFile>,
    base: &Path,
) -> Result<Vec<EngineConfig>, Error> {
    let flags_configure = configures_an_engine(flags);
    let mut tables = match file {
        Some(file) if !file.engine.is_empty() => file.engine,
        _ => Vec::new(),
    };
    let embedded = tables.is_empty() && !flags_configure;
    if let Some(runtime) = &flags.runtime {
        // `--runtime` picks (or adds) one engine and serves only that one.
        let wanted = engine_of(runtime);
        let position = tables.iter().position(|t| {
            t.runtime.as_deref() == Some(runtime.as_str())
                || (wanted.is_some() && t.runtime.as_deref().and_then(engine_of) == wanted)
        });
        let mut table = position.map(|i| tables.swap_remove(i)).unwrap_or_default();
        table.runtime = Some(runtime.clone());
        tables = vec![table];
    }
    if tables.is_empty() {
        tables.push(EngineTable::default());
    }
    let registry = Registry::new(&context.workspace);
    // The embedded default pointed at a url adopts whatever answers there; its model
    // and device apply only if Arcane has to start the engine itself.
    let adopt_first = embedded && flags.url.is_some();
    let mut cannot_start = None;
    if embedded {
        if adopt_first && registry.model(DEFAULT_MODEL).is_err() {
            cannot_start = Some(format!(
                "no model is given and the default model `{DEFAULT_MODEL}` is not registered (`arcane model add {DEFAULT_MODEL} --file PATH`)"
            ));
        } else {
            tables[0].model = Some(DEFAULT_MODEL.into());
        }
        tables[0].device = Some(DEFAULT_DEVICE.into());
    }
    // Flags override the first (or the selected) engine.
    let first = &mut tables[0];
    let model = flags.model.first().cloned();
    let overrides: [(&Option<String>, &mut Option<String>); 5] = [
        (&flags.url, &mut first.url),
        (&model, &mut first.model),
        (&flags.alias, &mut first.alias),
        (&flags.device, &mut first.device),
        (&flags.backend, &mut first.backend),
    ];
    for (flag, field) in overrides {
        if flag.is_some() {
            *field = flag.clone();
        }
    }
    if flags.engine_version.is_some() {
        first.version = flags.engine_version.clone();
    }
    if flags.models_dir.is_some() {
        first.models_dir = flags.models_dir.clone();
        first.model = None;
    }
    if flags.executable.is_some() {
        first.executable = flags.executable.clone();
    }
    if flags.restart.is_some() {
        first.restart = flags.restart.clone();
    }
    if !flags.engine_args.is_empty() {
        first.args = flags.engine_args.clone();
    }
    let mut configs = Vec::new();
    for table in tables {
        let mut config = table_config(&registry, &table, base, context)?;
        config.parent_death_signal = !flags.no_parent_death_signal;
        configs.push(config);
    }
    if let Some(first) = configs.first_mut() {
        first.adopt_any = adopt_first;
        first.cannot_start = cannot_start;
    }
    let mut ids: Vec<&str> = configs.iter().map(|c| c.id.as_str()).collect();
    ids.sort_unstable();
    if ids.windows(2).any(|w| w[0] == w[1]) {
        return Err(Refusal::usage(
            "two engines of the same runtime are configured; give each its own `runtime` id",
            json!({"engines": ids}),
        )
        .into());
    }
    Ok(configs)
}

/// Reads `--config FILE`, or `<workspace>/arcane.toml` when present. Returns the file
/// and the directory relative paths in it resolve against.
fn load_config(workspace: &Path, flags: &Flags) -> Result<(Option<ConfigFile>, PathBuf), Error> {
    read_config(workspace, flags, Reading::Start)
}

/// When the configuration is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// `arcane serve` starts: no `arcane.toml` means the flags alone (or the embedded
    /// default).
    Start,
    /// `arcane reload` or SIGHUP, on a running host. Stricter, because what is read
    /// replaces what runs: when the file read at the start had settings, a file that is
    /// gone now, and one with no settings at all (empty, or only blank lines and
    /// comments), are refused and the models stay. A reload of such a file can only
    /// mean a file being written (truncated, not yet filled) or removed by mistake: in
    /// a gateway it would remove every model. (A file that had no settings at the
    /// start, and has none now, changes nothing: the reload says so.)
    Reload {
        /// Whether the configuration file read when the host started had settings.
        had_file: bool,
    },
}

/// The configuration read again by a reload (see [`Reading::Reload`]).
fn reload_config(
    workspace: &Path,
    flags: &Flags,
    had_file: bool,
) -> Result<(Option<ConfigFile>, PathBuf), Error> {
    read_config(workspace, flags, Reading::Reload { had_file })
}

/// Reads the configuration file (see [`load_config`] and [`Reading`]). A file that
/// changes while it is read is refused (`ARCANE_FILE_CHANGED`), never half-used.
fn read_config(
    workspace: &Path,
    flags: &Flags,
    reading: Reading,
) -> Result<(Option<ConfigFile>, PathBuf), Error> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| workspace.to_path_buf());
    let default = workspace.join("arcane.toml");
    let path = match &flags.config {
        Some(path) => Some(cwd.join(path)),
        None => {
            // Whatever is there is read as the configuration: a FIFO, a device or a
            // directory in its place is refused (as `--config` refuses it), never
            // silently skipped.
            std::fs::symlink_metadata(&default)
                .is_ok()
                .then_some(default.clone())
        }
    };
    let Some(path) = path else {
        if reading == (Reading::Reload { had_file: true }) {
            return Err(Refusal::new(
                codes::ARCANE_NOT_FOUND,
                format!(
                    "`{}` was removed; the running models stay as they are",
                    default.display()
                ),
                json!({"path": default}),
            )
            .hint("put the file back and reload again; to stop serving, stop the host")
            .into());
        }
        return Ok((None, cwd));
    };
    // The configuration decides what runs, where it listens and what it writes: one
    // another user could have written is refused, as `.arcane` would be.
    // (Anything but a regular file is refused by the read below.)
    let regular = std::fs::metadata(&path).is_ok_and(|m| m.is_file());
    if let (true, Ok(Err(untrusted))) = (regular, arcane_files::trust::check_path(&path)) {
        return Err(Refusal::new(
            codes::ARCANE_POLICY_DENIED,
            format!(
                "refusing the configuration file `{}`: {}",
                path.display(),
                untrusted.describe()
            ),
            json!({"path": path, "untrusted": untrusted.path, "owner": untrusted.owner, "mode": format!("{:04o}", untrusted.mode)}),
        )
        .hint(untrusted.fix())
        .into());
    }
    let text = read_config_text(&path)?;
    let invalid = |e: toml::de::Error| invalid_config(&path, &text, e);
    let table: toml::Table = toml::from_str(&text).map_err(invalid)?;
    if table.is_empty() && reading == (Reading::Reload { had_file: true }) {
        return Err(Refusal::usage(
            format!(
                "`{}` has no settings (it is empty, or only comments); the running models stay as they are",
                path.display()
            ),
            json!({"path": path, "bytes": text.len()}),
        )
        .hint("a file still being written reads this way: reload again once it is saved")
        .into());
    }
    check_keys(&path, &table)?;
    let mut file: ConfigFile = toml::from_str(&text).map_err(invalid)?;
    file.has_settings = !table.is_empty();
    file.path = path.clone();
    if table.contains_key("engine") && file.engine.is_empty() {
        return Err(Refusal::usage(
            format!("`engine` in `{}` lists no engines", path.display()),
            json!({"path": path, "key": "engine"}),
        )
        .hint("add an `[[engine]]` table (see `docs/arcane.toml.example`), or remove the `engine` key to run the built-in default")
        .into());
    }
    let base = path.parent().map(Path::to_path_buf).unwrap_or(cwd);
    Ok((Some(file), base))
}

/// The configuration file's text, read whole and unchanged while it was read.
fn read_config_text(path: &Path) -> Result<String, Refusal> {
    let bytes = arcane_files::read_regular_unchanged(path, 1 << 20)
        .map_err(|e| config_read_error(path, e))?;
    String::from_utf8(bytes).map_err(|_| {
        config_read_error(
            path,
            arcane_files::UnchangedReadError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "is not UTF-8 text",
            )),
        )
    })
}

/// Why the configuration file at `path` could not be read: a usage error with the
/// system's cause, or `ARCANE_FILE_CHANGED` when it changed while it was read.
fn config_read_error(path: &Path, error: arcane_files::UnchangedReadError) -> Refusal {
    match error {
        arcane_files::UnchangedReadError::Io(e) => Refusal::usage(
            format!("cannot read the configuration file `{}`", path.display()),
            json!({"path": path}),
        )
        .caused_by(e),
        arcane_files::UnchangedReadError::Changed(how) => Refusal::new(
            codes::ARCANE_FILE_CHANGED,
            format!(
                "the configuration file `{}` changed while it was read ({how}); nothing read from it was used",
                path.display()
            ),
            json!({"path": path, "change": how}),
        )
        .hint("read it again once it is saved (`arcane reload`); an editor that writes another file and renames it over never causes this"),
    }
}

/// The one form of a configuration that does not parse, at the start and on a reload
/// alike: the TOML error (which shows the line, the column and the offending text) as
/// its cause, and the place in `details` (`line` and `column` from 1, and the line's
/// text as `snippet`) for machines.
fn invalid_config(path: &Path, text: &str, error: toml::de::Error) -> Refusal {
    let mut details = json!({"path": path});
    if let Some(span) = error.span() {
        let (line, column, snippet) = position(text, span.start);
        details["line"] = json!(line);
        details["column"] = json!(column);
        details["snippet"] = json!(snippet);
    }
    Refusal::usage(
        format!("`{}` is not a valid Arcane configuration", path.display()),
        details,
    )
    .caused_by(error)
    .hint("see `docs/arcane.toml.example` for the format")
}

/// The line and column (from 1, the column in characters, as the TOML error counts
/// them) of byte `offset` in `text`, and that line's text.
fn position(text: &str, offset: usize) -> (usize, usize, &str) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[line_start..]
        .find('\n')
        .map_or(text.len(), |i| line_start + i);
    (
        before.matches('\n').count() + 1,
        before[line_start..].chars().count() + 1,
        text[line_start..line_end].trim_end_matches('\r'),
    )
}

/// Refuses unknown keys at the top level and in every `[[engine]]` table: a typo must
/// not silently fall back to the built-in default.
fn check_keys(path: &Path, table: &toml::Table) -> Result<(), Refusal> {
    use crate::keys::{field_names, refuse_unknown};
    refuse_unknown(path, "the top level", table, field_names::<ConfigFile>())?;
    let engines = table.get("engine").and_then(toml::Value::as_array);
    for (index, engine) in engines.into_iter().flatten().enumerate() {
        if let Some(engine) = engine.as_table() {
            let place = format!("`[[engine]]` #{}", index + 1);
            refuse_unknown(path, &place, engine, field_names::<EngineTable>())?;
        }
    }
    let models = table.get("model").and_then(toml::Value::as_array);
    for (index, model) in models.into_iter().flatten().enumerate() {
        if let Some(model) = model.as_table() {
            let place = format!("`[[model]]` #{}", index + 1);
            refuse_unknown(
                path,
                &place,
                model,
                field_names::<crate::models::ModelTable>(),
            )?;
        }
    }
    let groups = table.get("group").and_then(toml::Value::as_array);
    for (index, group) in groups.into_iter().flatten().enumerate() {
        if let Some(group) = group.as_table() {
            let place = format!("`[[group]]` #{}", index + 1);
            refuse_unknown(
                path,
                &place,
                group,
                field_names::<crate::models::GroupTable>(),
            )?;
        }
    }
    let devices = table.get("devices").and_then(toml::Value::as_table);
    for (id, device) in devices.into_iter().flatten() {
        if let Some(device) = device.as_table() {
            let place = format!("`[devices.{id}]`");
            refuse_unknown(
                path,
                &place,
                device,
                field_names::<crate::models::DeviceTable>(),
            )?;
        }
    }
    Ok(())
}

fn engine_of(runtime: &str) -> Option<Engine> {
    runtime.parse::<Engine>().ok()
}

/// A positive number of seconds from a flag or `arcane.toml` field `name`, or `default`.
pub fn seconds(name: &str, value: Option<f64>, default: Duration) -> Result<Duration, Error> {
    match value {
        None => Ok(default),
        Some(v) if v.is_finite() && v > 0.0 && v < 1e7 => Ok(Duration::from_secs_f64(v)),
        Some(v) => Err(Refusal::usage(
            format!("`{name}` must be a positive number of seconds, not `{v}`"),
            json!({"field": name, "value": v}),
        )
        .into()),
    }
}

/// One engine table as an [`EngineConfig`]: resolves the runtime and model through the
/// registry, makes paths absolute.
pub(crate) fn table_config(
    registry: &Registry,
    table: &EngineTable,
    base: &Path,
    context: &Context,
) -> Result<EngineConfig, Error> {
    let runtime_name = table
        .runtime
        .clone()
        .or_else(|| served_by(registry, table.model.as_deref()?, base))
        .unwrap_or_else(|| Engine::DEFAULT.as_str().to_string());
    let absolute = |p: &Path| {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            base.join(p)
        }
    };
    // The registered runtime: by engine name (its default runtime) or by id; Arcane's
    // own engines have none.
    let (engine, registered) = match engine_of(&runtime_name) {
        Some(engine)
            if matches!(
                engine.kind().starts(),
                arcane_localai::Starts::Builtin { .. }
            ) =>
        {
            (engine, None)
        }
        Some(engine) => (engine, default_runtime(registry, engine)?),
        None => {
            let runtime = registry.runtime(&runtime_name)?;
            (runtime.engine, Some(runtime))
        }
    };
    let mut config = EngineConfig::new(engine);
    config.inherited_loader_path = context.environment.inherited_loader_path.clone();
    if let Some(url) = &table.url {
        config.url = url.clone();
        // A url the user asked for: an engine Arcane starts listens there, behind a key.
        if engine.kind().can_close_its_door() {
            config.listen = arcane_localai::OwnedListen::KeyedPort;
        }
    }
    if let Some(runtime) = &registered {
        config.executable = Some(runtime.executable.clone());
        config.library_dirs = runtime.library_dirs.clone();
        config.runtime_backend = runtime.backend;
        config.runtime_version = Some(runtime.version.clone());
        if registered.as_ref().is_some_and(|r| r.id != engine.as_str()) {
            config.id = runtime.id.clone();
        }
    }
    if let Some(executable) = &table.executable {
        config.executable = Some(absolute(executable));
        config.runtime_version = None;
        config.runtime_backend = Backend::Auto;
    }
    if let Some(model) = &table.model {
        let as_path = absolute(Path::new(model));
        let looks_like_path = model.contains('/') || model.ends_with(".gguf");
        if looks_like_path || as_path.is_file() {
            if !as_path.is_file() {
                return Err(Refusal::new(
                    codes::ARCANE_NOT_FOUND,
                    format!("the model file `{}` does not exist", as_path.display()),
                    json!({"model": model, "path": as_path}),
                )
                .into());
            }
            // A model file the configuration names is trusted like the configuration:
            // one another user can write is refused (a registered one was copied or
            // checked when it was added, and is checked at every load).
            if let Ok(Err(untrusted)) = arcane_files::trust::check_path(&as_path) {
                return Err(Refusal::new(
                    codes::ARCANE_POLICY_DENIED,
                    format!(
                        "refusing the model file `{}`: {}",
                        as_path.display(),
                        untrusted.describe()
                    ),
                    json!({"model": model, "path": as_path, "untrusted": untrusted.path}),
                )
                .hint(untrusted.fix())
                .hint("or register a copy: `arcane model add ID --file PATH` (a file others can write is copied)")
                .into());
            }
            config.model = Some(as_path);
        } else {
            let registered = registry.model(model).map_err(|e| {
                let hint = if model == DEFAULT_MODEL {
                    "register it with `arcane model add smollm2-135m --file PATH` (scripts/run.sh does this), pass `--model PATH`, or configure models in an `arcane.toml` (read from the current directory, else the workspace)"
                } else {
                    "list models with `arcane model list`, or pass a GGUF path"
                };
                Error(Box::new(Refusal::new(arcane_report::Diagnostic::code(&e), e.to_string(), arcane_report::Diagnostic::details(&e)).hint(hint)))
            })?;
            // A file edited in place since it was registered is refused before it runs.
            registry.check_model_file(&registered, &arcane_report::CancelToken::new())?;
            config.model = Some(registered.path);
            if table.alias.is_none() {
                config.alias = Some(model.clone());
            }
        }
    }
    if let Some(dir) = &table.models_dir {
        config.models_dir = Some(absolute(dir));
    }
    if table.alias.is_some() {
        config.alias = table.alias.clone();
    }
    config.device = table.device.clone();
    if let Some(backend) = &table.backend {
        config.backend = backend.parse::<Backend>()?;
    }
    config.version = table.version.clone();
    config.extra_args = table.args.clone();
    config.startup_timeout = seconds(
        "startup_timeout",
        table.startup_timeout,
        config.startup_timeout,
    )?;
    config.stall_timeout = seconds("stall_timeout", table.stall_timeout, config.stall_timeout)?;
    config.stop_grace = seconds("stop_grace", table.stop_grace, config.stop_grace)?;
    config.restart = match table.restart.as_deref() {
        None | Some("never") => RestartPolicy::Never,
        Some("on-failure") => RestartPolicy::OnFailure {
            max_restarts: table.max_restarts.unwrap_or(3),
            backoff: seconds(
                "restart_backoff",
                table.restart_backoff,
                Duration::from_secs(1),
            )?,
        },
        Some(other) => {
            return Err(Refusal::usage(
                format!("`restart` must be `never` or `on-failure`, not `{other}`"),
                json!({"restart": other}),
            )
            .into())
        }
    };
    if let arcane_localai::Starts::Builtin { .. } = engine.kind().starts() {
        builtin_engine(registry, &mut config, &context.environment)?;
    }
    Ok(config)
}

/// The engine kind that serves `model` (a registered id, else a file) when no runtime
/// is named: the builtin kind whose descriptor lists its format; `None` for anything
/// else (the default kind applies).
pub(crate) fn served_by(registry: &Registry, model: &str, base: &Path) -> Option<String> {
    let format = match registry.model(model) {
        Ok(registered) => registered.format()?,
        Err(_) => arcane_registry::format_of_file(&base.join(model))?,
    };
    Engine::ALL
        .into_iter()
        .find(|engine| {
            let kind = engine.kind();
            kind.formats().contains(&format)
                && matches!(kind.starts(), arcane_localai::Starts::Builtin { .. })
        })
        .map(|engine| engine.as_str().to_string())
}

/// What an engine Arcane runs itself needs: this executable, a model, and the runtime
/// library its descriptor names (ONNX Runtime, for voices).
fn builtin_engine(
    registry: &Registry,
    config: &mut EngineConfig,
    environment: &crate::Environment,
) -> Result<(), Error> {
    let engine = config.engine;
    if config.model.is_none() {
        return Err(Refusal::usage(
            format!("`{engine}` serves one model file: name it (`model = \"ID\"` or `--model ID`)"),
            json!({"engine": engine}),
        )
        .into());
    }
    let executable = environment.worker_executable.clone().ok_or_else(|| {
        Refusal::new(
            codes::ARCANE_PREREQUISITE_MISSING,
            format!("`{engine}` runs in Arcane's own worker, and this host names no `arcane` executable to start it"),
            json!({"engine": engine}),
        )
        .hint("set `Environment::worker_executable` to the `arcane` binary (`arcane serve` is its own)")
    })?;
    config.executable = Some(executable);
    config.runtime_version = None;
    if let Some(kind) = engine.kind().needs_library() {
        // The library its variable names (a bundle's launcher sets it to the bundle's
        // own), else the registered one.
        if let Some(library) = environment.library(kind) {
            config.runtime_library = Some(library.to_path_buf());
            return Ok(());
        }
        let (label, file) = kind
            .kind()
            .runtime_library()
            .map_or(("its runtime library", "the library"), |l| {
                (l.label, l.file)
            });
        let runtime = registry.default_library_runtime(kind)?.ok_or_else(|| {
            Refusal::new(
                codes::ARCANE_PREREQUISITE_MISSING,
                format!("`{engine}` runs on {label}, and none is registered"),
                json!({"engine": engine, "runtime": kind}),
            )
            .hint(format!(
                "register it with `arcane runtime add {kind} --library PATH` ({file}.<version>)"
            ))
        })?;
        config.runtime_library = Some(runtime.library);
    }
    Ok(())
}

/// The registered default runtime of `engine`, or `None` when none is registered
/// (a running server can still be adopted).
fn default_runtime(
    registry: &Registry,
    engine: Engine,
) -> Result<Option<arcane_registry::Runtime>, Error> {
    match registry.default_runtime(engine) {
        Ok(runtime) => Ok(Some(runtime)),
        Err(arcane_registry::Error::NoRuntimeForEngine { .. }) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_configuration_parses() {
        let text = include_str!("../../../docs/arcane.toml.example");
        let file: ConfigFile = toml::from_str(text).expect("docs/arcane.toml.example parses");
        assert_eq!(file.engine.len(), 1);
        assert_eq!(file.engine[0].device.as_deref(), Some("cpu"));
        assert_eq!(file.engine[0].restart.as_deref(), Some("on-failure"));
    }

    #[test]
    fn the_documented_gateway_configuration_parses() {
        let text = include_str!("../../../docs/gateway.toml.example");
        let file: ConfigFile = toml::from_str(text).expect("docs/gateway.toml.example parses");
        let ids: Vec<&str> = file.model.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["smol-a", "smol-embed", "whisper-1", "tts-1"]);
        assert_eq!(file.model[0].aliases, ["fast"]);
        assert_eq!(file.devices["cpu"].max_loaded, Some(2));
        assert!(file.engine.is_empty());
    }

    /// Issue 27, item 7: a configuration that changed while it was read is its own
    /// error, naming the file and the change.
    #[test]
    fn a_configuration_that_changed_while_it_was_read_has_its_own_code() {
        let path = Path::new("/w/arcane.toml");
        let error = config_read_error(
            path,
            arcane_files::UnchangedReadError::Changed("its size changed"),
        );
        assert_eq!(error.code, codes::ARCANE_FILE_CHANGED);
        assert_eq!(error.details["path"], "/w/arcane.toml");
        assert_eq!(error.details["change"], "its size changed");
        assert!(
            error.message.contains("`/w/arcane.toml`"),
            "{}",
            error.message
        );
        let unreadable = config_read_error(
            path,
            arcane_files::UnchangedReadError::Io(std::io::ErrorKind::NotFound.into()),
        );
        assert_eq!(unreadable.code, codes::ARCANE_USAGE);
    }

    /// Issue 27, item 7: where a configuration does not parse is in the details, as
    /// the TOML error's own text says it.
    #[test]
    fn a_configuration_that_does_not_parse_names_its_line_column_and_text() {
        let text = "[[model]]\nid = \"é\"\nmodel = \n";
        let parsed = toml::from_str::<toml::Table>(text).unwrap_err();
        let said = parsed.to_string();
        let error = invalid_config(Path::new("/w/arcane.toml"), text, parsed);
        let (line, column) = (&error.details["line"], &error.details["column"]);
        assert_eq!(line, 3, "{said}");
        assert!(
            said.contains(&format!("at line {line}, column {column}")),
            "{said} vs {}",
            error.details
        );
        assert_eq!(error.details["snippet"], "model = ");
        assert_eq!(position("ab\ncé\nd", 6), (2, 3, "cé"));
        assert_eq!(position("ab\ncé\nd", 5), (2, 2, "cé"));
        assert_eq!(position("ab\n", 99), (2, 1, ""));
    }

    #[test]
    fn an_unknown_key_is_refused() {
        assert!(toml::from_str::<ConfigFile>("[[engine]]\nmodle = \"x\"\n").is_err());
    }
}
