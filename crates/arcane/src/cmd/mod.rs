//! One module per command: each holds its clap `Args` and a `run` that validates them,
//! calls one library function and renders the result.

use arcane_report::Event;
use clap::Subcommand;

use crate::config::Context;
use crate::error::CliError;

pub mod bridge;
pub mod bundle;
pub mod chat;
pub mod core;
pub mod devices;
pub mod engine_worker;
pub mod gateway;
pub mod image;
pub mod launch;
pub mod lock;
pub mod logs;
pub mod model;
pub mod onnx;
pub mod open;
pub mod piper;
pub mod runtime;
pub mod sd;
pub mod serve;
pub mod speech;
pub mod status;
pub mod token;
pub mod whisper;

/// Every `arcane` command.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Hold the workspace operation lock, inspect it, or recover a stale one.
    Lock(lock::Args),
    /// List this machine's execution devices, or resolve a target into a launch plan.
    Devices(devices::Args),
    /// Register, install, list and remove inference runtimes (llama.cpp, Ollama).
    Runtime(runtime::Args),
    /// Register, list and remove GGUF and ONNX models.
    Model(model::Args),
    /// Run the Core host: a model gateway (the `[[model]]` tables of `arcane.toml`, or
    /// the one model the flags or the embedded default name), the `arcane/1` protocol
    /// on loopback HTTP, and the engines' OpenAI/Anthropic API behind the token.
    Serve(Box<serve::Args>),
    /// Run the Core host speaking `arcane/1` over stdio.
    Core(core::Args),
    /// Show the running Core host's engines, devices and states.
    Status(status::Args),
    /// Send a prompt to the running Core host and stream the answer.
    Chat(chat::Args),
    /// Transcribe an audio file with the running host's speech-to-text model.
    ///
    /// Example: `arcane transcribe meeting.flac --model whisper-1 --format srt`
    Transcribe(speech::TranscribeArgs),
    /// Speak text with the running host's voice model and write the audio to a file.
    ///
    /// Example: `arcane speak "Hello there." --model tts-1 --out hello.wav`
    Speak(speech::SpeakArgs),
    /// Draw an image with the running host's image model and write it to a file.
    ///
    /// Example: `arcane imagine "a lighthouse at dusk" --out lighthouse.png --size 512x512`
    Imagine(image::ImagineArgs),
    /// List the running host's models (`[[model]]`, or the main job's one model): state,
    /// device, pid, memory, requests in flight, when each unloads, why one failed.
    Ps(gateway::PsArgs),
    /// Show what the running host kept of its engines' output and its own lines (one
    /// model's, or all), and with `-f` follow them.
    Logs(logs::Args),
    /// Load a model of the running host now (returns once it answers), or say what a
    /// load would do (`--dry-run`).
    Load(gateway::LoadArgs),
    /// Unload a model of the running host (refused while it has requests in flight).
    Unload(gateway::ModelArgs),
    /// Open the running host's dashboard in the browser, logged in by a one-time link.
    ///
    /// The dashboard (`/ui`) shows the models with their state, device, memory and
    /// requests in flight (with load and unload buttons), the devices, requests and
    /// tokens, live events, each model's logs, and a chat playground.
    ///
    /// The link carries a one-time login code in its fragment (`/ui#code=…`), never the
    /// token: a browser does not send the fragment to any server, the page removes it
    /// at once, and the code is good once, for 60 seconds. The browser then holds a
    /// session cookie that only the dashboard's own paths accept; `arcane token rotate`,
    /// logging out, or restarting the host ends it.
    ///
    /// Opens the link with `xdg-open` when it is installed (and it succeeds); otherwise,
    /// or with `--print`, prints it.
    Open(open::Args),
    /// Make the running host read `arcane.toml` again (as SIGHUP does): added models
    /// become available, removed ones unload when idle, changed ones reload when idle.
    Reload(gateway::ReloadArgs),
    /// Build or verify a portable bundle.
    Bundle(bundle::Args),
    /// Launch a bundle's Core host or app (run from `<bundle>/bin/arcane`).
    Launch(launch::Args),
    /// The workspace's bearer token (show, rotate) and a key per application (add,
    /// list, revoke).
    Token(token::Args),
    /// Run ONNX models on NumPy `.npy` tensors.
    Onnx(onnx::Args),
    /// The worker processes the Core host starts (internal, hidden).
    #[command(flatten)]
    Worker(Worker),
}

/// The worker processes the Core host starts, one hidden subcommand each (the
/// subcommand a builtin kind's descriptor names).
#[derive(Debug, Subcommand)]
pub enum Worker {
    /// The ONNX worker process the Core host starts (internal).
    #[command(name = "__onnx-worker", hide = true)]
    Onnx(onnx::WorkerArgs),
    /// The speech-to-text worker process the Core host starts (internal).
    #[command(name = "__whisper-worker", hide = true)]
    Whisper(whisper::WorkerArgs),
    /// The text-to-speech worker process the Core host starts (internal).
    #[command(name = "__piper-worker", hide = true)]
    Piper(piper::WorkerArgs),
    /// The image-generation worker process the Core host starts (internal).
    #[command(name = "__sd-worker", hide = true)]
    Sd(sd::WorkerArgs),
}

/// What `arcane core` and `arcane serve` take for the services of the kinds whose
/// sessions run in Arcane's own worker processes: each such kind's own flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct WorkerOptions {
    /// The `onnx` service's.
    #[command(flatten)]
    pub onnx: onnx::OnnxOptions,
}

impl WorkerOptions {
    /// The worker kinds whose runtime library is known (named by a flag, or found by
    /// [`Self::or_registered`]): hosted even when the selection does not name them.
    pub fn named(&self) -> Vec<arcane_localai::Engine> {
        let onnx = self.onnx.library.as_ref().map(|_| onnx::KIND);
        onnx.into_iter().collect()
    }

    /// Fills in, for each worker kind no flag named a library for, its registered
    /// default library: `arcane serve` hosts every worker kind it has a library for
    /// (their workers start only when a session is loaded).
    pub fn or_registered(&mut self, context: &Context) -> Result<(), CliError> {
        if self.onnx.library.is_none() {
            self.onnx.library = arcane_registry::Registry::new(&context.workspace)
                .default_library_runtime(onnx::KIND)?
                .map(|runtime| runtime.library);
        }
        Ok(())
    }

    /// The flag that names the runtime library of the worker kind `kind` (`onnx-library`,
    /// without its `--`), for a command line that hands one on.
    pub fn library_flag(kind: arcane_localai::Engine) -> Option<&'static str> {
        (kind == onnx::KIND).then_some(onnx::LIBRARY_FLAG)
    }
}

impl arcane_host::Workers for WorkerOptions {
    fn named(&self) -> Vec<arcane_localai::Engine> {
        WorkerOptions::named(self)
    }

    fn service(
        &self,
        engine: arcane_localai::Engine,
        workspace: &std::path::Path,
    ) -> Result<std::sync::Arc<dyn arcane_core::service::Service>, CliError> {
        if engine == onnx::KIND {
            return Ok(onnx::service(workspace, &self.onnx)?);
        }
        Err(crate::error::CommandError::usage(
            format!("`{engine}` has no worker service"),
            serde_json::json!({"runtime": engine}),
        )
        .into())
    }
}

impl Worker {
    /// Runs the worker; returns its exit code.
    pub fn run(&self) -> u8 {
        match self {
            Worker::Onnx(args) => onnx::worker(args),
            Worker::Whisper(args) => whisper::worker(args),
            Worker::Piper(args) => piper::worker(args),
            Worker::Sd(args) => sd::worker(args),
        }
    }
}

impl Command {
    /// Runs the command at once when it is a worker the Core host starts, and returns
    /// its exit code: a worker speaks only to its host (frames on stdout, or its
    /// private socket) and is stopped by it, so it needs no workspace and no signal
    /// handlers. `None` for every other command.
    pub fn run_worker(&self) -> Option<u8> {
        match self {
            Command::Worker(worker) => Some(worker.run()),
            _ => None,
        }
    }

    /// Whether the command needs the workspace to exist already: it only reads it (or
    /// removes from it), so a directory named by `--workspace` or `ARCANE_WORKSPACE`
    /// that does not exist is a mistake to report, not an empty workspace. The commands
    /// that change a workspace create it; `devices`, `bundle verify` and `launch` do not
    /// use it.
    fn needs_existing_workspace(&self) -> bool {
        match self {
            Command::Lock(args) => args.needs_existing_workspace(),
            Command::Model(args) => args.needs_existing_workspace(),
            Command::Runtime(args) => args.needs_existing_workspace(),
            Command::Bundle(args) => matches!(args.command, bundle::BundleCommand::Build(_)),
            Command::Status(_)
            | Command::Chat(_)
            | Command::Transcribe(_)
            | Command::Speak(_)
            | Command::Imagine(_)
            | Command::Ps(_)
            | Command::Logs(_)
            | Command::Load(_)
            | Command::Unload(_)
            | Command::Open(_)
            | Command::Reload(_) => true,
            Command::Devices(_)
            | Command::Serve(_)
            | Command::Core(_)
            | Command::Launch(_)
            | Command::Token(_)
            | Command::Onnx(_)
            | Command::Worker(_) => false,
        }
    }
}

/// Runs `command`; returns the process exit code on success.
pub fn run(context: &Context, command: Command) -> Result<u8, CliError> {
    if command.needs_existing_workspace() {
        context.require_named_workspace()?;
    }
    match command {
        Command::Lock(args) => lock::run(context, args),
        Command::Token(args) => token::run(context, args),
        Command::Devices(args) => devices::run(context, args),
        Command::Runtime(args) => runtime::run(context, args),
        Command::Model(args) => model::run(context, args),
        Command::Serve(args) => serve::run(context, *args),
        Command::Core(args) => core::run(context, args),
        Command::Status(args) => status::run(context, args),
        Command::Chat(args) => chat::run(context, args),
        Command::Transcribe(args) => speech::transcribe(context, args),
        Command::Speak(args) => speech::speak(context, args),
        Command::Imagine(args) => image::imagine(context, args),
        Command::Ps(args) => gateway::ps(context, args),
        Command::Logs(args) => logs::run(context, args),
        Command::Load(args) if args.dry_run => gateway::plan(context, args.model),
        Command::Load(args) => gateway::load(context, args.model, false),
        Command::Unload(args) => gateway::load(context, args, true),
        Command::Reload(args) => gateway::reload(context, args),
        Command::Open(args) => open::run(context, args),
        Command::Bundle(args) => bundle::run(context, args),
        Command::Launch(args) => launch::run(context, args),
        Command::Onnx(args) => onnx::run(context, args),
        Command::Worker(worker) => Ok(worker.run()),
    }
}

/// The human line for an event, rendered by the module that owns its subsystem.
pub fn human_event(event: &Event, verbose: u8) -> Option<String> {
    let kind = event.kind.as_str();
    if kind.starts_with("workspace.") {
        lock::human_event(event, verbose)
    } else if kind.starts_with("local-ai.") || kind.starts_with("process.") {
        serve::human_event(event, verbose)
    } else if kind.starts_with("core.") {
        core::human_event(event, verbose)
    } else if kind.starts_with("bundle.") {
        bundle::human_event(event, verbose)
    } else if kind.starts_with("registry.") || kind.starts_with("download.") {
        runtime::human_event(event, verbose)
    } else {
        None
    }
}

/// Creates the workspace directory (mode 0700) when nothing exists at its path, so the
/// default workspace works on a fresh machine. Anything that does exist there (a link,
/// a file) is left for the lock's own checks to refuse.
pub fn ensure_workspace(context: &crate::config::Context) -> Result<(), crate::error::CliError> {
    arcane_host::ensure_workspace(&context.workspace)
}

/// Refuses to remove `path` (the registered `kind` `id`) while a running Core host's
/// engines use it (`ARCANE_IN_USE`, exit 75, naming the host), unless `force` is set.
pub fn refuse_in_use(
    context: &crate::config::Context,
    kind: &str,
    id: &str,
    path: &std::path::Path,
    force: bool,
) -> Result<(), crate::error::CliError> {
    if force {
        return Ok(());
    }
    let Some(host) = arcane_core::endpoint::serving_host(&context.workspace, path) else {
        return Ok(());
    };
    Err(crate::error::CommandError::new(
        arcane_report::codes::ARCANE_IN_USE,
        format!(
            "{kind} `{id}` is in use by the Core host at {} (pid {})",
            host.url, host.pid
        ),
        serde_json::json!({"kind": kind, "id": id, "path": path, "url": host.url, "pid": host.pid}),
    )
    .hint("stop that host (Ctrl-C in its terminal, or `kill -TERM PID`) and run this again, or pass `--force` to remove it anyway")
    .into())
}
