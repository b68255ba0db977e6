//! The startup order of a Core host, in one place: the services the runtime selection
//! names (local AI or the model gateway, devices, model assets, the worker kinds'
//! services), then, for a host on loopback HTTP ([`serve`]), the listener on the
//! saved port, the endpoint record (`core.json`) with the token, the host's start, the
//! HTTP front door, SIGHUP reloads, the engines' first start, and the draining close;
//! for a host on stdio ([`serve_stdio`]), the `arcane/1` frames on stdin/stdout.
//!
//! What a person sees is the caller's: the host reports through a [`Presenter`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arcane_core::localai::{EngineLauncher, EngineStatus, LocalAiStatus, ModelAssetsService};
use arcane_core::selection::plan;
use arcane_core::service::Service;
use arcane_core::supervised::{LiveDevices, SupervisedLauncher};
use arcane_core::{AppInfo, Host};
use arcane_front_door::server::{self, FirstStartWatch, Next, Outcome, ServerBuilder};
use arcane_localai::{Engine, EngineConfig};
use arcane_report::{codes, Event, EventSink};
use serde_json::json;

use crate::error::{Error, Refusal};
use crate::Context;

use arcane_front_door::server::HostParts;

/// What a host tells the person or program that runs it, in order. Every method has a
/// default that says nothing.
pub trait Presenter {
    /// One of the host's events.
    fn event(&self, _event: &Event) {}
    /// The host listens (before any engine is ready).
    fn listening(&self, _listening: &Listening) {}
    /// The engines (or the on-start models) of the first start are ready.
    fn ready(&self, _ready: &Ready<'_>) {}
    /// The host closed after a requested stop.
    fn closed(&self, _listening: &Listening) {}
}

/// A presenter that says nothing.
pub struct Silent;

impl Presenter for Silent {}

/// Where a host listens.
#[derive(Debug, Clone)]
pub struct Listening {
    /// The URL clients use (`http://127.0.0.1:PORT`; OpenAI's base URL is `{url}/v1`).
    pub url: String,
    /// The host's process id.
    pub pid: u32,
    /// The endpoint record (`.arcane/core.json`): URL, pid and where the token is.
    pub endpoint_file: PathBuf,
}

/// What is ready once the first start succeeded.
pub struct Ready<'a> {
    /// Where the host listens.
    pub listening: &'a Listening,
    /// The supervised llama.cpp engine's status, when the host runs one.
    pub llama: Option<&'a EngineStatus>,
    /// The model gateway, when the host has one.
    pub gateway: Option<&'a arcane_gateway::Gateway>,
}

/// The services of the kinds whose sessions run in Arcane's own workers (ONNX
/// sessions): the embedder decides which it hosts and how their workers start.
pub trait Workers: Send + Sync {
    /// The worker kinds whose runtime library is known: hosted even when the runtime
    /// selection does not name them.
    fn named(&self) -> Vec<Engine>;
    /// The Core host's service of the worker kind `engine`, for `workspace`.
    fn service(&self, engine: Engine, workspace: &Path) -> Result<Arc<dyn Service>, Error>;
}

/// No worker kind is hosted.
pub struct NoWorkers;

impl Workers for NoWorkers {
    fn named(&self) -> Vec<Engine> {
        Vec::new()
    }

    fn service(&self, engine: Engine, _workspace: &Path) -> Result<Arc<dyn Service>, Error> {
        Err(Refusal::usage(
            format!("`{engine}` has no worker service in this host"),
            json!({"runtime": engine}),
        )
        .into())
    }
}

/// Builds the host for `runtimes`: `execution-devices` and `local-ai` when llama.cpp or
/// Ollama is selected, `model-assets` when llama.cpp is; unsupported runtimes are a
/// usage error before anything starts. `launcher` makes the engine launcher for each
/// selected engine; `drain` bounds how long a shutdown waits for passthrough work.
fn build_host(
    context: &Context,
    runtimes: &[String],
    observer: Arc<dyn EventSink>,
    drain: std::time::Duration,
    launcher: &dyn Fn(Engine) -> Result<Arc<dyn EngineLauncher>, Error>,
    workers: &dyn Workers,
    gateway: Option<Arc<arcane_gateway::Gateway>>,
) -> Result<HostParts, Error> {
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
        builder = builder.service(workers.service(*engine, &context.workspace)?);
    }
    Ok(builder.build()?)
}

/// Fires the host's shutdown when the CLI's cancel token fires (first SIGINT/SIGTERM;
/// a second signal exits at once, see `config`).
fn shutdown_on_signal(context: &Context, host: &Host) {
    let cancel = context.cancel.clone();
    let handle = host.shutdown_handle();
    std::thread::spawn(move || {
        while !cancel.wait_timeout(std::time::Duration::from_secs(3600)) {}
        handle.shutdown();
    });
}

/// A tokio runtime for a host.
pub fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| {
            Refusal::new(
                codes::ARCANE_IO,
                "cannot start the async runtime",
                json!({}),
            )
            .caused_by(e)
            .into()
        })
}

/// The engine configuration for `engine` from the workspace registry (`arcane core
/// --stdio`'s runtime selection): the registered executable of that engine (none
/// registered: adopt-only at its kind's url) and, for a kind that serves one model
/// file, the first registered model of a format it loads.
fn engine_config(context: &Context, engine: Engine) -> Result<EngineConfig, Error> {
    let registry = arcane_registry::Registry::new(&context.workspace);
    let mut config = EngineConfig::new(engine);
    config.inherited_loader_path = context.environment.inherited_loader_path.clone();
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
        let model = registry.models()?.into_iter().find(|m| {
            m.format()
                .is_some_and(|format| engine.kind().formats().contains(&format))
        });
        if let Some(model) = model {
            registry.check_model_file(&model, &context.cancel)?;
            config.alias = Some(model.id);
            config.model = Some(model.path);
        }
    }
    Ok(config)
}

/// The `model-assets` service over the workspace's registered models.
fn model_assets(workspace: &std::path::Path) -> Arc<ModelAssetsService> {
    let workspace = workspace.to_path_buf();
    ModelAssetsService::new(move || {
        let models = arcane_registry::Registry::new(&workspace)
            .models()
            .map_err(|e| Box::new(e) as arcane_core::BoxError)?;
        Ok(serde_json::to_value(models).unwrap_or_default())
    })
}

/// Runs a Core host speaking `arcane/1` on this process's stdin/stdout
/// (`Content-Length` framing, frames up to `max_frame` bytes) for the runtimes named,
/// with the gateway of `arcane.toml`'s `[[model]]` tables when it has them, until end
/// of input or the context's cancel token. The caller holds the workspace's owner lock.
pub fn serve_stdio(
    context: &Context,
    runtimes: &[String],
    workers: &dyn Workers,
    max_frame: usize,
) -> Result<(), Error> {
    let runtime = runtime()?;
    let outcome = runtime.block_on(async {
        // Events never go to stdout here: it carries frames.
        let observer: Arc<dyn EventSink> = Arc::new(arcane_report::NullSink);
        let drain = arcane_core::host::DEFAULT_DRAIN_DEADLINE;
        // `[[model]]` tables in `arcane.toml` make the same gateway as `arcane serve`.
        let gateway = crate::settings::workspace_gateway(context)?;
        let parts = build_host(
            context,
            runtimes,
            observer,
            drain,
            &|runtime| {
                let config = engine_config(context, runtime)?;
                Ok(SupervisedLauncher::new(&context.workspace, config) as Arc<dyn EngineLauncher>)
            },
            workers,
            gateway,
        )?;
        let host = parts.host;
        host.start();
        shutdown_on_signal(context, &host);
        let mut options = arcane_core::stdio::StdioOptions::default();
        options.max_frame = max_frame;
        let (stdin, stdout, _blocking) = arcane_core::stdio::process_stdio();
        arcane_core::stdio::serve(&host, stdin, stdout, options)
            .await
            .map_err(Error::from)
    });
    // stdin may be read on a blocking thread that still waits for input.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    outcome
}

/// What a Core host on loopback HTTP is asked to run (`arcane serve`'s flags and
/// `arcane.toml` map onto this: [`crate::settings::options`]).
#[derive(Clone)]
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
    pub workers: Arc<dyn Workers>,
    /// The model gateway (`[[model]]`), instead of `configs`.
    pub gateway: Option<Arc<arcane_gateway::Gateway>>,
    /// The gateway is the one model of the flags or the embedded default: the host is
    /// announced once it is loaded, and its failed first load is the command's error
    /// (as for a single engine).
    pub one_model: bool,
    /// Origins whose web pages may read answers (CORS), besides the listener's own.
    pub allowed_origins: arcane_front_door::origins::AllowedOrigins,
    /// Bytes of log lines kept, all models together (default 1 MiB).
    pub log_budget: Option<usize>,
    /// The application's packaged web, opened (served at `/ui/app/`).
    pub web: Option<Arc<arcane_front_door::web::WebRoot>>,
    /// The configuration file these options were read from (`None`: no file; the flags
    /// or the embedded default).
    pub config_file: Option<PathBuf>,
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
            workers: Arc::new(NoWorkers),
            gateway: None,
            one_model: false,
            allowed_origins: Default::default(),
            log_budget: None,
            web: None,
            config_file: None,
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
    presenter: &dyn Presenter,
) -> Result<u8, Error> {
    let runtimes: Vec<String> = options
        .configs
        .iter()
        .map(|c| c.engine.as_str().to_string())
        .collect();
    let mut runtimes = runtimes;
    runtimes.extend(options.workers.named().iter().map(|k| k.to_string()));
    let plan = plan(&runtimes)?;
    if plan.engines.len() != options.configs.len() {
        return Err(Refusal::usage(
            "the Core host supervises at most one engine per runtime",
            json!({"runtimes": runtimes}),
        )
        .into());
    }
    if !options.listen.is_loopback() {
        return Err(Refusal::usage(
            format!(
                "`{}` is not a loopback address; the Core host listens on loopback only",
                options.listen
            ),
            json!({"listen": options.listen.to_string()}),
        )
        .into());
    }
    let runtime = runtime()?;
    let outcome = runtime.block_on(serve_async(context, &options, &runtimes, presenter));
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    drop(owner);
    outcome
}

/// The exit a first start ended with: the engine's error, a cancellation while the
/// engines were starting, or success.
fn first_start_result(outcome: Outcome) -> Result<(), Error> {
    match outcome {
        Outcome::Started => Ok(()),
        Outcome::Failed(error) => Err(remote_error(&error).into()),
        Outcome::Cancelled(engines) => Err(Refusal::new(
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
) -> Result<HostParts, Error> {
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
                    Error::from(Refusal::usage(
                        format!("no configuration for `{}`", runtime),
                        json!({}),
                    ))
                })?;
            Ok(SupervisedLauncher::new(&context.workspace, config) as Arc<dyn EngineLauncher>)
        },
        options.workers.as_ref(),
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
    presenter: &dyn Presenter,
    parts: &HostParts,
    printed: &mut tokio::sync::mpsc::UnboundedReceiver<Event>,
    listening: &Listening,
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
        Next::Announce(llama) => presenter.ready(&Ready {
            listening,
            llama: llama.as_deref(),
            gateway: parts.gateway.as_deref(),
        }),
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
                presenter.event(&event);
                if waits_for_models {
                    act(watch.observe_event(&event));
                }
            }
            changed = async { status.as_mut()?.changed().await.ok() }, if status.is_some() => {
                let Some(()) = changed else { status = None; continue };
                let current = status.as_mut().map(|s| s.borrow_and_update().clone()).unwrap_or_default();
                // The events that led here are printed first: the note sums them up.
                while let Ok(event) = printed.try_recv() {
                    presenter.event(&event);
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
    presenter: &dyn Presenter,
) -> Result<u8, Error> {
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
    // The host's events come back here to be presented on this thread.
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
        &context.workspace,
        listening.listener,
        record.token.clone(),
        token_file,
        options.allowed_origins.clone(),
        options.web.clone(),
    );
    if let Some(gateway) = &parts.gateway {
        server::reload_on_sighup(gateway.clone());
    }
    let listening = Listening {
        url,
        pid: record.pid,
        endpoint_file,
    };
    presenter.listening(&listening);
    let first = follow(
        presenter,
        &parts,
        &mut printed,
        &listening,
        options.one_model,
    )
    .await;
    // Step 6: drain and close, then print what the shutdown reported.
    let closed = parts.host.close().await;
    let _ = http.await;
    while let Ok(event) = printed.try_recv() {
        presenter.event(&event);
    }
    first_start_result(first.outcome())?;
    closed?;
    presenter.closed(&listening);
    Ok(0)
}

/// An error serialized by `error_json` (an engine's first-start failure), with its code.
fn remote_error(error: &serde_json::Value) -> Refusal {
    let code = error["code"]
        .as_str()
        .and_then(codes::known)
        .unwrap_or(codes::ARCANE_OPERATION_FAILED);
    let mut command = Refusal::new(
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
    if let Some(cause) = arcane_report::Cause::chain(causes.filter_map(|c| c.as_str())) {
        command = command.caused_by(cause);
    }
    command
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
