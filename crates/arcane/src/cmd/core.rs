//! `arcane core --stdio`: the Core host speaking `arcane/1` over stdin/stdout
//! (`Content-Length` framing), for a parent process that owns this one.
//!
//! Also home of what `arcane serve` shares with it: building the host from a runtime
//! selection ([`build_host`]) and turning signals into the host's draining shutdown.

use std::sync::Arc;

use arcane_core::localai::{EngineLauncher, EngineStatus, LocalAiStatus, ModelAssetsService};
use arcane_core::selection::plan;
use arcane_core::server::{self, FirstStartWatch, Next, Outcome, ServerBuilder};
use arcane_core::supervised::{LiveDevices, SupervisedLauncher};
use arcane_core::{AppInfo, Host};
use arcane_localai::{Engine, EngineConfig};
use arcane_report::event_types;
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

    /// Local-AI runtimes to host (`llama.cpp`, `ollama`, `onnx`), comma-separated or
    /// repeated. `whisper.cpp` and `stable-diffusion.cpp` are refused as unsupported.
    #[arg(long = "runtime", value_name = "ID", value_delimiter = ',')]
    pub runtimes: Vec<String>,

    /// The services of the kinds whose sessions run in Arcane's own workers.
    #[command(flatten)]
    pub workers: crate::cmd::WorkerOptions,

    /// The largest accepted frame, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = arcane_core::framing::DEFAULT_MAX_FRAME)]
    pub max_frame: usize,
}

/// The services a host gets (built by [`build_host`]).
pub use arcane_core::server::HostParts;

/// Builds the host for `runtimes`: `execution-devices` and `local-ai` when llama.cpp or
/// Ollama is selected, `model-assets` when llama.cpp is; unsupported runtimes are a
/// usage error before anything starts. `launcher` makes the engine launcher for each
/// selected engine; `drain` bounds how long a shutdown waits for passthrough work.
pub fn build_host(
    context: &Context,
    runtimes: &[String],
    observer: Arc<dyn EventSink>,
    drain: std::time::Duration,
    launcher: &dyn Fn(Engine) -> Result<Arc<dyn EngineLauncher>, CliError>,
    workers: &crate::cmd::WorkerOptions,
    gateway: Option<Arc<arcane_core::gateway::Gateway>>,
) -> Result<HostParts, CliError> {
    let plan = plan(runtimes)?;
    // With `[[model]]` tables the gateway serves the engines (and answers `localai.*`
    // and `llama.*` for them): an app's selection of `llama.cpp` is served by it, not
    // by a second engine of its own; the selection still decides the other services.
    let engines = match gateway {
        Some(_) => Vec::new(),
        None => plan
            .engines
            .iter()
            .map(|runtime| launcher(*runtime))
            .collect::<Result<Vec<_>, _>>()?,
    };
    let serves_engines = gateway.is_some() || !engines.is_empty();
    let mut builder = ServerBuilder::new(AppInfo::default())
        .version(env!("CARGO_PKG_VERSION"))
        .observer(observer)
        .drain_deadline(drain)
        .engines(engines)
        .gateway(gateway)
        .devices(LiveDevices::new());
    if serves_engines {
        // Every engine record of the workspace, whatever model it names, is settled
        // when the host starts (an orphan a killed host left is stopped).
        builder = builder.service(arcane_core::localai::EngineRecordsService::new(
            &context.workspace,
        ));
    }
    if plan.model_assets {
        builder = builder.service(model_assets(&context.workspace));
    }
    for engine in &plan.workers {
        builder = builder.service(workers.service(*engine, context)?);
    }
    Ok(builder.build()?)
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

/// The longest a client command waits for the host's answer to one call unless it
/// says otherwise (`--timeout`): a stopped or hung host is an error within this.
/// `arcane load` (it waits for the model: 600 s), `chat` and the speech commands
/// (generation) document longer defaults of their own.
pub const CLIENT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs a client command's exchange with the host (`status`, `chat`) on a fresh
/// runtime. The first SIGINT/SIGTERM ends it at once with `ARCANE_CANCELLED` (`what`
/// names it in the message), whatever the host is doing. Every call of the exchange
/// has its deadline (the client's); when the host passes one, the error
/// ([`host_timeout`]) names the host's pid, its URL and the deadline.
pub fn block_on_client<T>(
    context: &Context,
    what: &str,
    exchange: impl std::future::Future<Output = Result<T, CliError>>,
) -> Result<T, CliError> {
    let runtime = runtime()?;
    let cancel = context.cancel.clone();
    let outcome = runtime.block_on(async {
        tokio::select! {
            outcome = exchange => Some(outcome),
            () = cancel.cancelled() => None,
        }
    });
    // A connection task may still wait on a host that does not answer: do not join it.
    runtime.shutdown_background();
    outcome
        .unwrap_or_else(|| {
            Err(CommandError::new(
                codes::ARCANE_CANCELLED,
                format!("{what} was cancelled"),
                json!({}),
            )
            .into())
        })
        .map_err(|error| host_timeout(context, what, error))
}

/// A `CORE_TIMEOUT` of a call to the host, said for the command: the call's own
/// message and details (which URL, which deadline, which phase) with the host's pid,
/// whether its process is stopped, and what to do. The host may be waiting on an
/// engine itself, so it is not blamed unless its process is stopped. Any other error
/// is returned as it is.
fn host_timeout(context: &Context, what: &str, error: CliError) -> CliError {
    let mut details = error.0.details();
    if error.0.code() != codes::CORE_TIMEOUT || details["peer"] != "host" {
        return error;
    }
    let Some(record) = arcane_core::endpoint::read_endpoint(&context.workspace)
        .ok()
        .flatten()
    else {
        return error;
    };
    let stopped = arcane_process::is_stopped(record.pid);
    let state = if stopped {
        ", which is stopped (SIGSTOP)"
    } else {
        ""
    };
    details["pid"] = json!(record.pid);
    details["port"] = json!(record.port);
    details["stopped"] = json!(stopped);
    let mut refusal = CommandError::new(
        codes::CORE_TIMEOUT,
        format!(
            "{what}: {} (the Core host is pid {}{state})",
            error.0, record.pid
        ),
        details,
    );
    if stopped {
        refusal = refusal.hint(format!(
            "the host's process is stopped: resume it with `kill -CONT {}`, or stop it",
            record.pid
        ));
    }
    for hint in error.0.hints() {
        refusal = refusal.hint(hint);
    }
    refusal
        .hint(format!(
            "check the host's process (`ps -o pid,stat,cmd -p {}`); a busy host or a slow model may need a longer `--timeout SECONDS`",
            record.pid
        ))
        .into()
}

/// Per-engine choices that override what the registry implies.
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    /// The engine's listener URL (default: its kind's, [`Engine::default_url`]).
    pub url: Option<String>,
    /// The registered model id llama.cpp serves (default: the first registered one).
    pub model: Option<String>,
    /// The execution target (`cpu` or a device id from `arcane devices`).
    pub device: Option<String>,
}

/// The engine configuration for `engine` from the workspace registry: the registered
/// executable of that engine (none registered: adopt-only) and, for a kind that serves
/// one model file, the chosen (or first) registered model of a format it loads.
pub fn engine_config(
    context: &Context,
    engine: Engine,
    options: &EngineOptions,
) -> Result<EngineConfig, CliError> {
    let registry = arcane_registry::Registry::new(&context.workspace);
    let mut config = EngineConfig::new(engine);
    config.inherited_loader_path = crate::config::inherited_loader_path();
    if let Some(url) = &options.url {
        config.url = url.clone();
    }
    if let Some(record) = registry
        .runtimes()?
        .into_iter()
        .find(|r| r.engine == engine)
    {
        config.executable = Some(record.executable);
        config.library_dirs = record.library_dirs;
        config.runtime_backend = record.backend;
        config.runtime_version = Some(record.version);
    }
    if engine.kind().takes_model_file() {
        let model = match &options.model {
            Some(id) => Some(registry.model(id)?),
            // The first registered model of a format this kind serves.
            None => registry.models()?.into_iter().find(|m| {
                m.format()
                    .is_some_and(|format| engine.kind().formats().contains(&format))
            }),
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
    engine: Engine,
    options: &EngineOptions,
) -> Result<Arc<dyn EngineLauncher>, CliError> {
    let config = engine_config(context, engine, options)?;
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
    // twice and overwrite the first one's ownership records. When one runs, this
    // process joins it as a bridge instead.
    crate::cmd::ensure_workspace(context)?;
    let _owner = match arcane_core::endpoint::OwnerLock::acquire(&context.workspace) {
        Ok(owner) => owner,
        Err(arcane_core::Error::AlreadyRunning { pid, .. }) => {
            return crate::cmd::bridge::run(context, pid, args.max_frame)
        }
        Err(error) => return Err(error.into()),
    };
    let runtime = runtime()?;
    let outcome = runtime.block_on(async {
        // Events never go to stdout here: it carries frames.
        let observer: Arc<dyn EventSink> = Arc::new(arcane_report::NullSink);
        let engines = EngineOptions::default();
        let drain = arcane_core::host::DEFAULT_DRAIN_DEADLINE;
        // `[[model]]` tables in `arcane.toml` make the same gateway as `arcane serve`.
        let gateway = crate::cmd::serve::workspace_gateway(context)?;
        let parts = build_host(
            context,
            &args.runtimes,
            observer,
            drain,
            &|runtime| launcher(context, runtime, &engines),
            &args.workers,
            gateway,
        )?;
        let host = parts.host;
        host.start();
        shutdown_on_signal(context, &host);
        let mut options = arcane_core::stdio::StdioOptions::default();
        options.max_frame = args.max_frame;
        let (stdin, stdout, _blocking) = arcane_core::stdio::process_stdio();
        arcane_core::stdio::serve(&host, stdin, stdout, options)
            .await
            .map_err(CliError::from)
    });
    // stdin may be read on a blocking thread that still waits for input.
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
    /// A bearer token the user supplied (`ARCANE_API_KEY`, `--api-key-file`) instead of
    /// the workspace's own (`.arcane/core-token`, kept across restarts).
    pub api_key: Option<String>,
    /// The worker kinds' services: each one a library is given for is hosted too.
    pub workers: crate::cmd::WorkerOptions,
    /// The model gateway (`[[model]]`), instead of `configs`.
    pub gateway: Option<Arc<arcane_core::gateway::Gateway>>,
    /// The gateway is the one model of the flags or the embedded default: the host is
    /// announced once it is loaded, and its failed first load is the command's error
    /// (as for a single engine).
    pub one_model: bool,
    /// Origins whose web pages may read answers (CORS), besides the listener's own.
    pub allowed_origins: arcane_core::origins::AllowedOrigins,
    /// Bytes of log lines kept, all models together (default 1 MiB).
    pub log_budget: Option<usize>,
    /// The application's packaged web, opened (served at `/ui/app/`).
    pub web: Option<Arc<arcane_core::web::WebRoot>>,
}

impl ServeOptions {
    /// Options for `configs`, on `127.0.0.1` and the saved port.
    pub fn new(configs: Vec<EngineConfig>) -> Self {
        Self {
            configs,
            listen: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            port: None,
            drain_deadline: arcane_core::host::DEFAULT_DRAIN_DEADLINE,
            api_key: None,
            workers: crate::cmd::WorkerOptions::default(),
            gateway: None,
            one_model: false,
            allowed_origins: Default::default(),
            log_budget: None,
            web: None,
        }
    }
}

/// Runs the Core host on loopback HTTP until SIGINT/SIGTERM or `core.host.shutdown`:
/// one owner per workspace (a second one reports the first and exits 75), the stable
/// saved port (a busy one is `CORE_PORT_IN_USE`), `core.json` with the workspace's token, the
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
    let mut runtimes = runtimes;
    runtimes.extend(options.workers.named().iter().map(|k| k.to_string()));
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

/// The exit a first start ended with: the engine's error, a cancellation while the
/// engines were starting, or success.
fn first_start_result(outcome: Outcome) -> Result<(), CliError> {
    match outcome {
        Outcome::Started => Ok(()),
        Outcome::Failed(error) => Err(remote_error(&error).into()),
        Outcome::Cancelled(engines) => Err(CommandError::new(
            codes::ARCANE_CANCELLED,
            "stopped while the engines were starting",
            json!({"engines": engines}),
        )
        .into()),
    }
}

/// Step 3: builds the host over the configured engines (their events go to
/// `observer`) and starts it.
fn start_host(
    context: &Context,
    options: &ServeOptions,
    runtimes: &[String],
    observer: Arc<dyn EventSink>,
) -> Result<HostParts, CliError> {
    let configs = options.configs.clone();
    let parts = build_host(
        context,
        runtimes,
        observer,
        options.drain_deadline,
        &|runtime| {
            let config = configs
                .iter()
                .find(|c| c.engine == runtime)
                .cloned()
                .ok_or_else(|| {
                    CliError::from(CommandError::usage(
                        format!("no configuration for `{}`", runtime),
                        json!({}),
                    ))
                })?;
            Ok(SupervisedLauncher::new(&context.workspace, config) as Arc<dyn EngineLauncher>)
        },
        &options.workers,
        options.gateway.clone(),
    )?;
    if let Some(bytes) = options.log_budget {
        parts.logs.set_budget(bytes);
    }
    parts.host.start();
    shutdown_on_signal(context, &parts.host);
    Ok(parts)
}

/// Step 5: prints the host's events until it closes; follows the engines' first
/// starts on the typed status watch (a failed one shuts the host down) and announces
/// the host once they are ready.
async fn follow(
    context: &Context,
    parts: &HostParts,
    printed: &mut tokio::sync::mpsc::UnboundedReceiver<Event>,
    url: &str,
    one_model: bool,
) -> FirstStartWatch {
    let on_start: Vec<String> = parts
        .gateway
        .as_ref()
        .filter(|_| one_model)
        .map(|g| g.on_start_models())
        .unwrap_or_default();
    let mut watch = FirstStartWatch::new(parts.local_ai.is_some()).waiting_for_models(on_start);
    let waits_for_models = watch.follows_models();
    let mut status = parts.local_ai.as_ref().map(|service| {
        let mut status = service.watch();
        // The engines may have changed before this subscribed: judge the current one too.
        status.mark_changed();
        status
    });
    let act = |next: Next| match next {
        Next::Announce(llama) => announce(context, url, llama.as_deref(), parts.gateway.as_deref()),
        Next::Shutdown => parts.host.shutdown_handle().shutdown(),
        Next::Wait => {}
    };
    if status.is_none() && !waits_for_models {
        act(watch.observe(LocalAiStatus::default()));
    }
    loop {
        tokio::select! {
            event = printed.recv() => {
                let Some(event) = event else { break };
                context.output.event(&event);
                if waits_for_models {
                    act(watch.observe_event(&event));
                }
            }
            changed = async { status.as_mut()?.changed().await.ok() }, if status.is_some() => {
                let Some(()) = changed else { status = None; continue };
                let current = status.as_mut().map(|s| s.borrow_and_update().clone()).unwrap_or_default();
                // The events that led here are printed first: the note sums them up.
                while let Ok(event) = printed.try_recv() {
                    context.output.event(&event);
                }
                act(watch.observe(current));
            }
            _ = parts.host.closed() => break,
        }
    }
    watch
}

/// Runs the Core host until it closes; see [`serve`].
async fn serve_async(
    context: &Context,
    options: &ServeOptions,
    runtimes: &[String],
) -> Result<u8, CliError> {
    let listening = server::listen(&context.workspace, options.listen, options.port).await?;
    let serving = server::serving(
        options.gateway.as_deref(),
        options
            .configs
            .iter()
            .map(|c| (c.model.clone(), c.executable.clone())),
    );
    let (record, endpoint_file) = server::publish_endpoint(
        &context.workspace,
        &listening,
        options.api_key.as_deref(),
        serving,
    )?;
    let url = listening.url.clone();
    // The host's events come back here to be printed on this thread's `Output`.
    let (events, mut printed) = tokio::sync::mpsc::unbounded_channel::<Event>();
    let observer: Arc<dyn EventSink> = Arc::new(move |event: Event| {
        let _ = events.send(event);
    });
    let parts = start_host(context, options, runtimes, observer)?;
    let token_file = options
        .api_key
        .is_none()
        .then(|| arcane_core::endpoint::token_path(&context.workspace));
    let http = server::serve_http(
        &parts,
        listening.listener,
        record.token.clone(),
        token_file,
        options.allowed_origins.clone(),
        options.web.clone(),
    );
    if let Some(gateway) = &parts.gateway {
        server::reload_on_sighup(gateway.clone());
    }
    context.output.note(&format!(
        "Core host listening on {url}: clients use this address (OpenAI base URL {url}/v1) with the token `arcane token show` prints (endpoint in `{}`)",
        endpoint_file.display()
    ));
    if context.output.mode == crate::cli::OutputMode::Ndjson {
        let summary = json!({"url": url, "pid": record.pid, "endpointFile": endpoint_file});
        context.output.result(
            "",
            &json!({"type": event_types::CORE_LISTENING, "data": summary}),
        );
    }
    let first = follow(context, &parts, &mut printed, &url, options.one_model).await;
    // Step 6: drain and close, then print what the shutdown reported.
    let closed = parts.host.close().await;
    let _ = http.await;
    while let Ok(event) = printed.try_recv() {
        context.output.event(&event);
    }
    first_start_result(first.outcome())?;
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
    llama: Option<&EngineStatus>,
    gateway: Option<&arcane_core::gateway::Gateway>,
) {
    let output = &context.output;
    let one_model = gateway.filter(|g| g.rows().len() == 1 && !g.on_start_models().is_empty());
    let engine = one_model
        .and_then(|g| g.engines().into_iter().next())
        .and_then(|e| serde_json::from_value::<EngineStatus>(e).ok());
    if let (Some(gateway), Some(engine)) = (one_model, engine) {
        let id = gateway.on_start_models().join(", ");
        output.note(&format!(
            "ready: {} serves `{id}` at {} ({}; `arcane ps` shows it)",
            engine
                .process
                .as_ref()
                .map_or("the engine", |p| p.engine.as_str()),
            engine.url,
            engine.exposure()
        ));
    } else if let Some(gateway) = gateway {
        let ids: Vec<String> = gateway
            .rows()
            .iter()
            .filter_map(|row| row["id"].as_str().map(|id| format!("`{id}`")))
            .collect();
        output.note(&format!(
            "ready: the gateway serves {} (each loaded when a request names it; `arcane ps` shows them)",
            ids.join(", ")
        ));
    } else if let Some(llama) = llama {
        let model = llama
            .models
            .first()
            .and_then(|m| m["id"].as_str())
            .unwrap_or("the model");
        output.note(&format!(
            "ready: {} serves `{model}` at {} ({})",
            arcane_localai::Engine::DEFAULT,
            llama.url,
            llama.exposure()
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
        "  TOKEN=$({arcane} --workspace '{workspace}' token show)"
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
        event_types::CORE_SERVICE_STATE => Some(format!(
            "service `{}` is {}",
            data["name"].as_str().unwrap_or("?"),
            data["state"].as_str().unwrap_or("?")
        )),
        event_types::CORE_STATE => match data["state"].as_str() {
            Some("draining") => Some("shutting down: draining requests and services".into()),
            Some("closed") => Some("Core host closed".into()),
            _ => None,
        },
        event_types::CORE_HTTP_CONNECTION_LIMIT => Some(format!(
            "warning: {}",
            data["message"]
                .as_str()
                .unwrap_or("refusing new connections")
        )),
        event_types::CORE_ERROR => Some(format!(
            "error in `{}`: {}",
            data["service"].as_str().unwrap_or("core"),
            data["error"]["message"].as_str().unwrap_or("?")
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed first start is the engine's error, with its own code and message; one
    /// stopped while starting is a cancellation naming what was starting.
    #[test]
    fn a_failed_or_interrupted_first_start_is_the_exit() {
        let failed = json!({"code": "LOCAL_AI_SERVER_NOT_READY", "message": "it died"});
        let error = first_start_result(Outcome::Failed(failed)).unwrap_err();
        assert_eq!(error.0.code(), codes::LOCAL_AI_SERVER_NOT_READY);
        assert_eq!(error.0.to_string(), "it died");
        let engines = json!({"llama.cpp": "loading"});
        let error = first_start_result(Outcome::Cancelled(engines)).unwrap_err();
        assert_eq!(error.0.code(), codes::ARCANE_CANCELLED);
        assert_eq!(error.0.details()["engines"]["llama.cpp"], "loading");
        assert!(first_start_result(Outcome::Started).is_ok());
    }
}
