//! `arcane core --stdio`: the Core host speaking `arcane/1` over stdin/stdout
//! (`Content-Length` framing), for a parent process that owns this one.
//!
//! Also home of what `arcane serve` shares with it: building the host from a runtime
//! selection ([`build_host`]) and turning signals into the host's draining shutdown.

use std::sync::Arc;

use arcane_core::localai::{DevicesService, EngineLauncher, LocalAiService, ModelAssetsService};
use arcane_core::selection::{plan, Runtime};
use arcane_core::supervised::{LiveDevices, SupervisedLauncher};
use arcane_core::{AppInfo, Host};
use arcane_localai::{Engine, EngineConfig};
use arcane_report::{codes, Event, EventSink};
use serde_json::json;

use crate::config::Context;
use crate::error::{CliError, CommandError};

/// Arguments of `arcane core`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Speak `arcane/1` on stdin/stdout with `Content-Length` framing (the only
    /// transport of this command; `arcane serve` offers loopback HTTP). End of input
    /// drains and stops the host.
    #[arg(long)]
    pub stdio: bool,

    /// Local-AI runtimes to host (`llama.cpp`, `ollama`), comma-separated or repeated.
    /// `whisper.cpp`, `stable-diffusion.cpp` and `onnx` are refused as unsupported.
    #[arg(long = "runtime", value_name = "ID", value_delimiter = ',')]
    pub runtimes: Vec<String>,

    /// The largest accepted frame, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = arcane_core::framing::DEFAULT_MAX_FRAME)]
    pub max_frame: usize,
}

/// The services a host gets, built by the caller from the runtime selection.
pub struct HostParts {
    /// The host, not started.
    pub host: Host,
    /// The local-AI service, when a runtime was selected (the HTTP passthrough's upstream).
    pub local_ai: Option<Arc<LocalAiService>>,
}

/// Builds the host for `runtimes`: `execution-devices` and `local-ai` when llama.cpp or
/// Ollama is selected, `model-assets` when llama.cpp is; unsupported runtimes are a
/// usage error before anything starts. `launcher` makes the engine launcher for each
/// selected engine; `drain` bounds how long a shutdown waits for passthrough work.
pub fn build_host(
    context: &Context,
    runtimes: &[String],
    observer: Arc<dyn EventSink>,
    drain: std::time::Duration,
    launcher: &dyn Fn(Runtime) -> Result<Arc<dyn EngineLauncher>, CliError>,
) -> Result<HostParts, CliError> {
    let plan = plan(runtimes)?;
    let mut builder = Host::builder(AppInfo::default())
        .version(env!("CARGO_PKG_VERSION"))
        .observer(observer)
        .drain_deadline(drain);
    let mut local_ai = None;
    if plan.local_ai {
        builder = builder.service(DevicesService::new(LiveDevices::new()))?;
        let launchers = plan
            .engines
            .iter()
            .map(|runtime| launcher(*runtime))
            .collect::<Result<Vec<_>, _>>()?;
        let service = LocalAiService::new(launchers);
        builder = builder.service(service.clone())?;
        local_ai = Some(service);
    }
    if plan.model_assets {
        builder = builder.service(model_assets(&context.workspace))?;
    }
    Ok(HostParts {
        host: builder.build(),
        local_ai,
    })
}

/// Fires the host's shutdown when the CLI's cancel token fires (first SIGINT/SIGTERM;
/// a second signal exits at once, see `config`).
pub fn shutdown_on_signal(context: &Context, host: &Host) {
    let cancel = context.cancel.clone();
    let handle = host.shutdown_handle();
    std::thread::spawn(move || {
        while !cancel.wait_timeout(std::time::Duration::from_secs(3600)) {}
        handle.shutdown();
    });
}

/// A tokio runtime for a host.
pub fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| {
            CommandError::new(
                codes::ARCANE_IO,
                "cannot start the async runtime",
                json!({}),
            )
            .caused_by(e)
            .into()
        })
}

/// Runs a client command's exchange with the host (`status`, `chat`) on a fresh
/// runtime. The first SIGINT/SIGTERM ends it at once with `ARCANE_CANCELLED` (`what`
/// names it in the message), whatever the host is doing.
pub fn block_on_client<T>(
    context: &Context,
    what: &str,
    exchange: impl std::future::Future<Output = Result<T, CliError>>,
) -> Result<T, CliError> {
    let runtime = runtime()?;
    let cancel = context.cancel.clone();
    let outcome = runtime.block_on(async {
        // The token is a blocking primitive: poll it.
        let cancelled = async {
            while !cancel.is_cancelled() {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        };
        tokio::select! {
            outcome = exchange => Some(outcome),
            () = cancelled => None,
        }
    });
    // A connection task may still wait on a host that does not answer: do not join it.
    runtime.shutdown_background();
    outcome.unwrap_or_else(|| {
        Err(CommandError::new(
            codes::ARCANE_CANCELLED,
            format!("{what} was cancelled"),
            json!({}),
        )
        .into())
    })
}

/// Per-engine choices that override what the registry implies.
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    /// The llama.cpp listener URL (default `http://127.0.0.1:8080`).
    pub llama_url: Option<String>,
    /// The Ollama listener URL (default `http://127.0.0.1:11434`).
    pub ollama_url: Option<String>,
    /// The registered model id llama.cpp serves (default: the first registered one).
    pub model: Option<String>,
    /// The execution target (`cpu` or a device id from `arcane devices`).
    pub device: Option<String>,
}

/// The engine configuration for `runtime` from the workspace registry: the registered
/// executable of that engine (none registered: adopt-only) and, for llama.cpp, the
/// chosen (or first) registered model.
pub fn engine_config(
    context: &Context,
    runtime: Runtime,
    options: &EngineOptions,
) -> Result<EngineConfig, CliError> {
    let registry = arcane_registry::Registry::new(&context.workspace);
    let (engine, registry_engine) = match runtime {
        Runtime::Ollama => (Engine::Ollama, arcane_registry::Engine::Ollama),
        _ => (Engine::LlamaCpp, arcane_registry::Engine::LlamaCpp),
    };
    let mut config = EngineConfig::new(engine);
    config.inherited_loader_path = crate::config::inherited_loader_path();
    let url = match engine {
        Engine::LlamaCpp => options.llama_url.clone(),
        Engine::Ollama => options.ollama_url.clone(),
    };
    if let Some(url) = url {
        config.url = url;
    }
    if let Some(record) = registry
        .runtimes()?
        .into_iter()
        .find(|r| r.engine == registry_engine)
    {
        config.executable = Some(record.executable);
        config.library_dirs = record.library_dirs;
        config.runtime_backend = record.backend;
        config.runtime_version = Some(record.version);
    }
    if engine == Engine::LlamaCpp {
        let model = match &options.model {
            Some(id) => Some(registry.model(id)?),
            None => registry.models()?.into_iter().next(),
        };
        if let Some(model) = model {
            registry.check_model_file(&model, &context.cancel)?;
            config.alias = Some(model.id);
            config.model = Some(model.path);
        }
        config.device = options.device.clone();
    }
    Ok(config)
}

/// The production launcher for `runtime`: the supervisor over [`engine_config`].
pub fn launcher(
    context: &Context,
    runtime: Runtime,
    options: &EngineOptions,
) -> Result<Arc<dyn EngineLauncher>, CliError> {
    let config = engine_config(context, runtime, options)?;
    Ok(SupervisedLauncher::new(&context.workspace, config))
}

/// The `model-assets` service over the workspace's registered models.
pub fn model_assets(workspace: &std::path::Path) -> Arc<ModelAssetsService> {
    let workspace = workspace.to_path_buf();
    ModelAssetsService::new(move || {
        let models = arcane_registry::Registry::new(&workspace)
            .models()
            .map_err(|e| Box::new(e) as arcane_core::BoxError)?;
        Ok(serde_json::to_value(models).unwrap_or_default())
    })
}

/// Runs `arcane core`.
pub fn run(context: &Context, args: Args) -> Result<u8, CliError> {
    if !args.stdio {
        return Err(CommandError::usage(
            "`arcane core` needs `--stdio` (use `arcane serve` for loopback HTTP)",
            json!({}),
        )
        .hint("run `arcane core --stdio`")
        .into());
    }
    // One owner per workspace, as for `arcane serve`: a second host would start engines
    // twice and overwrite the first one's ownership records.
    crate::cmd::ensure_workspace(context)?;
    let _owner = arcane_core::endpoint::OwnerLock::acquire(&context.workspace)?;
    let runtime = runtime()?;
    let outcome = runtime.block_on(async {
        // Events never go to stdout here: it carries frames.
        let observer: Arc<dyn EventSink> = Arc::new(arcane_report::NullSink);
        let engines = EngineOptions::default();
        let drain = arcane_core::host::DEFAULT_DRAIN_DEADLINE;
        let parts = build_host(context, &args.runtimes, observer, drain, &|runtime| {
            launcher(context, runtime, &engines)
        })?;
        let host = parts.host;
        host.start();
        shutdown_on_signal(context, &host);
        let mut options = arcane_core::stdio::StdioOptions::default();
        options.max_frame = args.max_frame;
        arcane_core::stdio::serve(&host, tokio::io::stdin(), tokio::io::stdout(), options)
            .await
            .map_err(CliError::from)
    });
    // stdin is read on a blocking thread that may still wait for input.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    outcome.map(|()| 0)
}

/// What `arcane serve` asks of the Core host (its flags map onto this).
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The engines to supervise (validated by `arcane serve`), at most one per runtime.
    pub configs: Vec<EngineConfig>,
    /// The loopback address to listen on.
    pub listen: std::net::IpAddr,
    /// A port that overrides the saved one for this run (not saved).
    pub port: Option<u16>,
    /// How long a shutdown waits for in-flight passthrough responses.
    pub drain_deadline: std::time::Duration,
}

impl ServeOptions {
    /// Options for `configs`, on `127.0.0.1` and the saved port.
    pub fn new(configs: Vec<EngineConfig>) -> Self {
        Self {
            configs,
            listen: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            port: None,
            drain_deadline: arcane_core::host::DEFAULT_DRAIN_DEADLINE,
        }
    }
}

/// Runs the Core host on loopback HTTP until SIGINT/SIGTERM or `core.host.shutdown`:
/// one owner per workspace (a second one reports the first and exits 75), the stable
/// saved port (a busy one is `CORE_PORT_IN_USE`), `core.json` with a fresh token, the
/// services of the runtime selection, the passthrough, then the draining shutdown.
///
/// Exit: 0 after a requested stop; the engine's error when its first start fails (the
/// host drains and closes first); 130 when stopped while an engine was still starting;
/// 1 when a service failed to dispose.
///
/// `owner` is the workspace's owner lock, taken by the caller before anything else (so
/// a second `arcane serve` reports the running one even when its own flags would fail).
pub fn serve(
    context: &Context,
    options: ServeOptions,
    owner: arcane_core::endpoint::OwnerLock,
) -> Result<u8, CliError> {
    let runtimes: Vec<String> = options
        .configs
        .iter()
        .map(|c| c.engine.as_str().to_string())
        .collect();
    let plan = plan(&runtimes)?;
    if plan.engines.len() != options.configs.len() {
        return Err(CommandError::usage(
            "the Core host supervises at most one engine per runtime",
            json!({"runtimes": runtimes}),
        )
        .into());
    }
    if !options.listen.is_loopback() {
        return Err(CommandError::usage(
            format!(
                "`{}` is not a loopback address; the Core host listens on loopback only",
                options.listen
            ),
            json!({"listen": options.listen.to_string()}),
        )
        .into());
    }
    let runtime = runtime()?;
    let outcome = runtime.block_on(serve_async(context, &options, &runtimes));
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    drop(owner);
    outcome
}

/// How the engines' first starts went.
enum FirstStart {
    Pending,
    Ready,
    Failed(serde_json::Value),
}

async fn serve_async(
    context: &Context,
    options: &ServeOptions,
    runtimes: &[String],
) -> Result<u8, CliError> {
    use arcane_core::endpoint;
    let workspace = &context.workspace;
    let saved = endpoint::saved_port(workspace)?;
    let port = options.port.or(saved).unwrap_or(0);
    let address = std::net::SocketAddr::new(options.listen, port);
    let listener = arcane_core::http::bind(address, &endpoint::port_path(workspace)).await?;
    let local = listener.local_addr().map_err(|e| {
        CommandError::new(
            codes::ARCANE_IO,
            "cannot read the listener's address",
            json!({}),
        )
        .caused_by(e)
    })?;
    if options.port.is_none() && saved.is_none() {
        endpoint::save_port(workspace, local.port())?;
    }
    let host_name = match local {
        std::net::SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
        std::net::SocketAddr::V4(v4) => v4.ip().to_string(),
    };
    let url = format!("http://{host_name}:{}", local.port());
    let token = endpoint::new_token()?;
    let record = endpoint::EndpointRecord {
        protocol: arcane_core::protocol::PROTOCOL.into(),
        url: url.clone(),
        host: host_name,
        port: local.port(),
        pid: std::process::id(),
        token: token.clone(),
        started_at: arcane_report::time::now_rfc3339(),
        serving: endpoint::Serving {
            models: options
                .configs
                .iter()
                .filter_map(|c| c.model.clone())
                .collect(),
            executables: options
                .configs
                .iter()
                .filter_map(|c| c.executable.clone())
                .collect(),
        },
    };
    let endpoint_file = endpoint::write_endpoint(workspace, &record)?;
    // The host's events come back here to be printed on this thread's `Output`.
    let (events, mut printed) = tokio::sync::mpsc::unbounded_channel::<Event>();
    let observer: Arc<dyn EventSink> = Arc::new(move |event: Event| {
        let _ = events.send(event);
    });
    let configs = options.configs.clone();
    let parts = build_host(
        context,
        runtimes,
        observer,
        options.drain_deadline,
        &|runtime| {
            let config = configs
                .iter()
                .find(|c| c.engine.as_str() == runtime.id())
                .cloned()
                .ok_or_else(|| {
                    CliError::from(CommandError::usage(
                        format!("no configuration for `{}`", runtime.id()),
                        json!({}),
                    ))
                })?;
            Ok(SupervisedLauncher::new(&context.workspace, config) as Arc<dyn EngineLauncher>)
        },
    )?;
    let host = parts.host;
    let mut http_options = arcane_core::http::HttpOptions::new(token);
    if let Some(local_ai) = &parts.local_ai {
        http_options = http_options.upstream(local_ai.clone());
    }
    host.start();
    shutdown_on_signal(context, &host);
    let server = tokio::spawn(arcane_core::http::serve(
        host.clone(),
        listener,
        http_options,
    ));
    context.output.note(&format!(
        "Core host listening on {url} (endpoint and token in `{}`)",
        endpoint_file.display()
    ));
    let summary = json!({"url": url, "pid": record.pid, "endpointFile": endpoint_file});
    if context.output.mode == crate::cli::OutputMode::Ndjson {
        context
            .output
            .result("", &json!({"type": "core.listening", "data": summary}));
    }
    let mut announced = false;
    let mut ready_events = 0;
    let mut first = if parts.local_ai.is_none() {
        FirstStart::Ready
    } else {
        FirstStart::Pending
    };
    if matches!(first, FirstStart::Ready) {
        announced = true;
        announce(context, &url, &endpoint_file, None);
    }
    let mut engines: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    loop {
        tokio::select! {
            event = printed.recv() => {
                let Some(event) = event else { break };
                context.output.event(&event);
                if event.kind != "localai.state" {
                    continue;
                }
                let list = event.data["runtimes"].as_array().cloned().unwrap_or_default();
                if matches!(first, FirstStart::Pending) {
                    for engine in &list {
                        engines.insert(engine["id"].as_str().unwrap_or("?").to_string(), engine["state"].as_str().unwrap_or("?").to_string());
                    }
                    if let Some(failed) = list.iter().find(|e| e["state"] == "error") {
                        // A failed first start ends the host: a person sees the error at once.
                        first = FirstStart::Failed(failed["error"].clone());
                        host.shutdown_handle().shutdown();
                    } else if list.iter().all(|e| e["state"] == "ready") {
                        first = FirstStart::Ready;
                    }
                }
                // Announce once the engines are ready and llama.cpp's models are known
                // (they are fetched right after it turns ready; announce anyway on the
                // event after that).
                if matches!(first, FirstStart::Ready) && !announced {
                    let llama = list.iter().find(|e| e["id"] == "llama.cpp");
                    let models_known = llama.is_none_or(|l| l["models"].as_array().is_some_and(|m| !m.is_empty()));
                    if models_known || ready_events > 0 {
                        announced = true;
                        announce(context, &url, &endpoint_file, llama);
                    }
                    ready_events += 1;
                }
            }
            _ = host.closed() => break,
        }
    }
    let closed = host.close().await;
    let _ = server.await;
    while let Ok(event) = printed.try_recv() {
        context.output.event(&event);
    }
    match first {
        FirstStart::Failed(error) => return Err(remote_error(&error).into()),
        FirstStart::Pending => {
            return Err(CommandError::new(
                codes::ARCANE_CANCELLED,
                "stopped while the engines were starting",
                json!({"engines": engines}),
            )
            .into());
        }
        FirstStart::Ready => {}
    }
    closed?;
    if context.output.mode == crate::cli::OutputMode::Json {
        context.output.result(
            "",
            &json!({"url": url, "pid": record.pid, "state": "closed"}),
        );
    }
    Ok(0)
}

/// An error serialized by `error_json` (an engine's first-start failure), with its code.
fn remote_error(error: &serde_json::Value) -> CommandError {
    let code = error["code"]
        .as_str()
        .and_then(codes::known)
        .unwrap_or(codes::ARCANE_OPERATION_FAILED);
    let mut command = CommandError::new(
        code,
        error["message"]
            .as_str()
            .unwrap_or("the engine failed to start"),
        error["details"].clone(),
    );
    for hint in error["hints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h.as_str())
    {
        command = command.hint(hint);
    }
    let causes = error["causes"].as_array().into_iter().flatten();
    if let Some(cause) = crate::error::Cause::chain(causes.filter_map(|c| c.as_str())) {
        command = command.caused_by(cause);
    }
    command
}

/// Tells a person how to talk to the host once it (and its engine) is ready.
fn announce(
    context: &Context,
    url: &str,
    endpoint_file: &std::path::Path,
    llama: Option<&serde_json::Value>,
) {
    let output = &context.output;
    if let Some(llama) = llama {
        let model = llama["models"][0]["id"].as_str().unwrap_or("the model");
        output.note(&format!(
            "ready: llama.cpp serves `{model}` ({})",
            llama["url"].as_str().unwrap_or("?")
        ));
    } else {
        output.note("ready");
    }
    let workspace = context.workspace.display();
    // Name this very binary: `arcane` is often not on PATH (e.g. `target/release/arcane`).
    let arcane = std::env::current_exe()
        .map(|path| path.display().to_string())
        .unwrap_or_else(|_| "arcane".to_string());
    output.note("talk to it from another terminal:");
    output.note(&format!(
        "  {arcane} --workspace '{workspace}' chat \"Why is the sky blue?\""
    ));
    output.note(&format!("  {arcane} --workspace '{workspace}' status"));
    output.note(&format!(
        "  TOKEN=$(sed -n 's/.*\"token\": *\"\\([0-9a-f]*\\)\".*/\\1/p' '{}')",
        endpoint_file.display()
    ));
    output.note(&format!(
        "  curl -sN {url}/v1/chat/completions -H \"Authorization: Bearer $TOKEN\" -H 'Content-Type: application/json' -d '{{\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}],\"stream\":true}}'"
    ));
    output.note("stop it with Ctrl-C (drains requests, stops the engines it owns)");
}

/// The human line for one of the host's events.
pub fn human_event(event: &Event, _verbose: u8) -> Option<String> {
    let data = &event.data;
    match event.kind.as_str() {
        "core.service.state" => Some(format!(
            "service `{}` is {}",
            data["name"].as_str().unwrap_or("?"),
            data["state"].as_str().unwrap_or("?")
        )),
        "core.state" => match data["state"].as_str() {
            Some("draining") => Some("shutting down: draining requests and services".into()),
            Some("closed") => Some("Core host closed".into()),
            _ => None,
        },
        "core.http.connection-limit" => Some(format!(
            "warning: {}",
            data["message"].as_str().unwrap_or("refusing new connections")
        )),
        "core.error" => Some(format!(
            "error in `{}`: {}",
            data["service"].as_str().unwrap_or("core"),
            data["error"]["message"].as_str().unwrap_or("?")
        )),
        _ => None,
    }
}
