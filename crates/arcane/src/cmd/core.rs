//! `arcane core --stdio`: the Core host speaking `arcane/1` over stdin/stdout
//! (`Content-Length` framing), for a parent process that owns this one; the host
//! library (`arcane_host`) runs it.
//!
//! Also home of what the CLI's commands share about a host: how `arcane serve` says
//! what the host does ([`Said`]) and how a client command waits for one
//! ([`block_on_client`]).

use arcane_core::localai::EngineStatus;
use arcane_host::{Listening, Presenter, Ready};
use arcane_report::event_types;
use arcane_report::{codes, Event};
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
    arcane_host::serve_stdio(
        &context.host(),
        &args.runtimes,
        &args.workers,
        args.max_frame,
    )?;
    Ok(0)
}

/// A tokio runtime for a host or a client.
pub use arcane_host::start::runtime;

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

/// How `arcane serve` says what its host does: events and notes on the CLI's output,
/// and the documented JSON lines (`core.listening` in `--output ndjson`, the closing
/// summary in `--output json`).
pub struct Said<'a> {
    /// The command's context (its output).
    pub context: &'a Context,
    /// The configuration file the host was configured from (`None`: none).
    pub config: Option<std::path::PathBuf>,
}

impl Presenter for Said<'_> {
    fn event(&self, event: &Event) {
        self.context.output.event(event);
    }

    fn listening(&self, listening: &Listening) {
        let (output, url) = (&self.context.output, &listening.url);
        output.note(&match &self.config {
            Some(path) => format!("configuration: `{}`", path.display()),
            None => "configuration: none (no `arcane.toml` here or in the workspace): the flags, else the embedded default".into(),
        });
        output.note(&format!(
            "Core host listening on {url}: clients use this address (OpenAI base URL {url}/v1) with the token `arcane token show` prints (endpoint in `{}`)",
            listening.endpoint_file.display()
        ));
        if output.mode == crate::cli::OutputMode::Ndjson {
            let summary = json!({"url": url, "pid": listening.pid,
                "endpointFile": listening.endpoint_file, "configFile": self.config});
            output.result(
                "",
                &json!({"type": event_types::CORE_LISTENING, "data": summary}),
            );
        }
    }

    fn ready(&self, ready: &Ready<'_>) {
        announce(
            self.context,
            &ready.listening.url,
            ready.llama,
            ready.gateway,
        );
    }

    fn closed(&self, listening: &Listening) {
        if self.context.output.mode == crate::cli::OutputMode::Json {
            self.context.output.result(
                "",
                &json!({"url": listening.url, "pid": listening.pid, "state": "closed"}),
            );
        }
    }
}

/// Tells a person how to talk to the host once it (and its engine) is ready.
fn announce(
    context: &Context,
    url: &str,
    llama: Option<&EngineStatus>,
    gateway: Option<&arcane_gateway::Gateway>,
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
