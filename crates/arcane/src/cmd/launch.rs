//! `<bundle>/bin/arcane launch`: verify the bundle this binary belongs to, then run the
//! Core host on the bundle's runtime and model, or an app program against it.
//!
//! **Core mode** (`launch [--state-root DIR] [--launch-config FILE]`): the bundle
//! root is `current_exe()/../..`. The whole bundle is verified first; after any
//! failure nothing starts (exit 2, every failure listed). The launch context is
//! resolved (manifest defaults < `--state-root` < launch file; per-OS default state
//! root `~/.local/share/Arcane/<appId>` on Linux), the state root is created, and this
//! process becomes `<bundle>/bin/arcane --workspace <state-root> serve --runtime
//! llama.cpp --executable <bundle runtime> --url http://127.0.0.1:<free port> --model
//! <bundle model> [--device TARGET] [--port PORT] [--web <bundle>/app/web]` (the
//! app's packaged web, when `app/web/index.html` is in the bundle) through `exec`, so signals reach
//! the Core host directly. Right before that `exec`, every listed file is checked to be
//! the very file verification saw (device, inode, size, mtime, ctime; see
//! `arcane_bundle::pinned`); any change is `BUNDLE_FILE_CHANGED` and nothing starts.
//! The launcher itself is executed through the descriptor that was checked. Its loader path is the runtime's library directories first,
//! then the inherited value ([`arcane_process::loader_path`]). Nothing is written
//! inside the bundle.
//!
//! A core-mode launch while another instance of the app already runs the Core host on
//! the same state root joins it: it says so and lasts as long as that host.
//!
//! **App-entry mode** (`launch --arcane-app-entry REL [ARGS…]`, which must come last):
//! after the same verification, `app/REL` must be a listed `exec` file (escapes and
//! absolute paths are refused with `BUNDLE_PATH_INVALID`); it is opened once, checked
//! to be the verified file, hashed again from that descriptor and executed through it
//! (`/proc/self/fd/N`, so its `$0` is that path; `ARCANE_APP_ENTRY` holds the bundle
//! path), so a program swapped after verification never runs (`BUNDLE_FILE_CHANGED`,
//! nothing started). "The running Core" is the
//! Core host whose endpoint file `<state-root>/.arcane/core.json` names a live
//! process. If there is none, launch starts one in the background (the Core mode
//! above, as a child in its own process group), waits until its endpoint file
//! appears, runs the app program with `ARCANE_CORE_ENDPOINT=<endpoint file>`,
//! `ARCANE_STATE_ROOT` and `ARCANE_BUNDLE_ROOT` in its environment, and stops the Core
//! host it started (SIGTERM, then SIGKILL after 15 s) when the program exits. A Core
//! host that was already running is used and left running. The exit code is the
//! program's (128 + signal when it was killed).

// `launch` replaces itself (`exec`) with the bundle's own `serve`: not a child, so
// not `arcane_process::spawn`'s job; clippy.toml fences `Command::new` elsewhere.
#![allow(clippy::disallowed_methods)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use arcane_bundle::{LaunchContext, VerifyOptions};
use arcane_report::event_types;
use arcane_report::{codes, Event};
use serde_json::json;

use crate::config::{env_path, Context};
use crate::error::{CliError, CommandError};

/// How long app-entry mode waits for a Core host it started to publish its endpoint.
const CORE_START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a Core host started for an app entry may drain after SIGTERM.
const CORE_STOP_GRACE: Duration = Duration::from_secs(15);

/// Arguments of `arcane launch`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where all mutable state goes (the Core host's workspace). Default:
    /// `$XDG_DATA_HOME/Arcane/<appId>` (absolute only), else `~/.local/share/Arcane/<appId>`.
    #[arg(long, value_name = "DIR")]
    pub state_root: Option<PathBuf>,

    /// A JSON object of launch options: `stateRoot`, `port`, `executionTarget`. Keys
    /// that would redirect bundle-owned paths (`appRoot`, `runtimes`, `model`, …) are refused.
    #[arg(long, value_name = "FILE")]
    pub launch_config: Option<PathBuf>,

    /// Run the app program `app/REL` (a listed executable) with the running Core's
    /// endpoint file in `ARCANE_CORE_ENDPOINT`, instead of the Core host. Everything
    /// after `REL` is passed to the program; this option must come last.
    #[arg(long = "arcane-app-entry", value_name = "REL [ARGS]", num_args = 1.., allow_hyphen_values = true)]
    pub app_entry: Option<Vec<String>>,

    /// Launch only a bundle signed by this public key (`KEY.pub`). Also settable as
    /// `trustedKey` in the launch file, or for every bundle in
    /// `$XDG_CONFIG_HOME/arcane/trusted-bundle-key.pub` (`~/.config/...`); the first of
    /// these that is set wins.
    #[arg(long, value_name = "KEY.pub")]
    pub trusted_key: Option<PathBuf>,
}

/// Runs `arcane launch`.
pub fn run(context: &Context, args: Args) -> Result<u8, CliError> {
    let launcher = std::env::current_exe().map_err(|e| {
        CommandError::new(
            codes::ARCANE_IO,
            "cannot locate the running `arcane` binary",
            json!({}),
        )
        .caused_by(e)
    })?;
    let root = arcane_bundle::bundle_root_from_launcher(&launcher)?;
    let mut options = VerifyOptions::default();
    if let Some(key) = trusted_key_file(&args)? {
        options.trusted_key = Some(crate::cmd::bundle::trusted_key(&key)?);
    }
    let sink = crate::cmd::bundle::ProgressSink::new(&context.output, "verifying");
    let report = arcane_bundle::verify(&root, &options, &sink, &context.cancel);
    sink.finish();
    let report = report?;
    if !report.is_clean() {
        crate::cmd::bundle::render_report(&context.output, &report);
        let code = crate::cmd::bundle::report_exit_code(&report);
        context.output.note("nothing was started");
        return Ok(code);
    }
    let bundle = report.into_verified()?;
    context.output.event(&Event::new(
        event_types::BUNDLE_LAUNCH_VERIFIED,
        json!({"bundle": bundle.root}),
    ));
    let dirs = arcane_bundle::HostDirs::new(
        env_path("HOME"),
        env_path("XDG_DATA_HOME"),
        env_path("LOCALAPPDATA"),
    );
    let launch = arcane_bundle::resolve_context(
        bundle,
        args.state_root.as_deref(),
        args.launch_config.as_deref(),
        &dirs,
    )?;
    match args.app_entry {
        Some(ref entry) => app_entry(context, &launch, &args, entry),
        None => core(context, &launch),
    }
}

/// The trusted key for this launch: `--trusted-key`, else the launch file's
/// `trustedKey`, else the user's `trusted-bundle-key.pub` (see [`Args::trusted_key`]).
fn trusted_key_file(args: &Args) -> Result<Option<PathBuf>, CliError> {
    if let Some(key) = &args.trusted_key {
        return Ok(Some(key.clone()));
    }
    if let Some(file) = &args.launch_config {
        if let Some(key) = arcane_bundle::launch::launch_file_trusted_key(file)? {
            return Ok(Some(key));
        }
    }
    Ok(crate::config::user_trusted_bundle_key())
}

/// The `serve` command line that runs the Core host for `launch`: the bundle's own
/// launcher, state in the state root, the bundle's executable, model and ONNX Runtime
/// library passed explicitly, its libraries first on the loader path, and the engine on a free
/// loopback port (so it never adopts a stranger's server on the default port).
///
/// The launcher is executed through `launcher`, its verified descriptor
/// (`/proc/self/fd/N`, an ELF binary, so the descriptor may stay close-on-exec), with
/// its bundle path as `argv[0]`.
fn serve_command(
    launch: &LaunchContext,
    launcher: &arcane_bundle::PinnedFile,
) -> Result<Command, CliError> {
    let mut command = Command::new(launcher.exec_path());
    command
        .arg0(launcher.path())
        .arg("--workspace")
        .arg(&launch.state_root)
        .arg("serve")
        // `serve` reads an `arcane.toml` in its current directory: a bundle's host is
        // configured by the bundle alone, never by a file where the user stands.
        .current_dir(&launch.state_root);
    if let Some(runtime) = &launch.runtime {
        command
            .arg("--runtime")
            .arg(&runtime.engine)
            .arg("--executable")
            .arg(&runtime.executable);
        let port = free_loopback_port()?;
        command.arg("--url").arg(format!("http://127.0.0.1:{port}"));
        let inherited = crate::config::inherited_loader_path();
        match arcane_process::loader_path(&runtime.library_dirs, inherited.as_deref()) {
            (variable, Some(value)) => command.env(variable, value),
            (variable, None) => command.env_remove(variable),
        };
    }
    // One model is the main job's; several make a gateway of them all (`--model
    // ID=PATH` each, the launch model first and the default), each served by its
    // engine kind: a bundle may carry a chat model, a whisper.cpp model and a voice.
    match launch.models.as_slice() {
        [] => {}
        [model] => {
            command.arg("--model").arg(&model.path);
        }
        models => {
            for model in models {
                let mut given = std::ffi::OsString::from(format!("{}=", model.id));
                given.push(&model.path);
                command.arg("--model").arg(given);
            }
        }
    }
    for (kind, library) in &launch.libraries {
        // The kind's own service's library (its flag), and the one the kinds that need
        // it run on (its variable: ONNX Runtime for Piper voices).
        if let Some(flag) = crate::cmd::WorkerOptions::library_flag(*kind) {
            command.arg(format!("--{flag}")).arg(library);
        }
        if let Some(described) = kind.kind().runtime_library() {
            command.env(described.variable, library);
        }
    }
    if let Some(target) = &launch.execution_target {
        command.arg("--device").arg(target);
    }
    if let Some(port) = launch.port {
        command.arg("--port").arg(port.to_string());
    }
    // The app's packaged web, when the bundle carries one (verified with the rest):
    // served at `/ui/app/`, opened with `arcane open --app`.
    let web = launch.bundle.root.join("app").join("web");
    if web.join("index.html").is_file() {
        command.arg("--web").arg(web);
    }
    command
        .env("ARCANE_BUNDLE_ROOT", &launch.bundle.root)
        .env("ARCANE_STATE_ROOT", &launch.state_root);
    Ok(command)
}

/// A loopback port nothing listens on right now.
fn free_loopback_port() -> Result<u16, CliError> {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|e| {
            CommandError::new(
                codes::ARCANE_IO,
                "cannot find a free loopback port for the engine",
                json!({}),
            )
            .caused_by(e)
            .into()
        })
}

fn core(context: &Context, launch: &LaunchContext) -> Result<u8, CliError> {
    // Another instance of this app already runs the Core host on this state root: this
    // launch joins it instead of being refused (`CORE_ALREADY_RUNNING`).
    if let Ok(record) = arcane_core::endpoint::running_endpoint(&launch.state_root) {
        return join_running(context, &record);
    }
    arcane_bundle::prepare_state_root(launch)?;
    context.output.event(&Event::new(
        event_types::BUNDLE_LAUNCH_CORE,
        launch.summary(),
    ));
    // The launcher runs through its verified descriptor; what the Core host and its
    // engine will open by path must still be what was verified (see the module docs).
    let launcher = launch
        .bundle
        .open_verified(arcane_bundle::manifest::LAUNCHER_PATH)?;
    launch.bundle.recheck_all()?;
    let mut command = serve_command(launch, &launcher)?;
    // Pass the output mode through so the Core host prints what the caller asked for.
    command.arg("--output").arg(match context.output.mode {
        crate::cli::OutputMode::Human => "human",
        crate::cli::OutputMode::Json => "json",
        crate::cli::OutputMode::Ndjson => "ndjson",
    });
    let error = command.exec();
    Err(CommandError::new(
        codes::ARCANE_IO,
        "cannot start the Core host",
        json!({"command": format!("{command:?}")}),
    )
    .caused_by(error)
    .into())
}

/// How often a joined launch looks whether the host it joined still runs.
const JOINED_CHECK: Duration = Duration::from_millis(250);

/// Core mode next to a running instance: say so, and last as long as that host (Ctrl-C
/// leaves it running): a launcher that keeps "its" Core alive behaves the same whether
/// it started the host or joined it.
fn join_running(
    context: &Context,
    record: &arcane_core::endpoint::EndpointRecord,
) -> Result<u8, CliError> {
    let Some(host) = arcane_process::Identity::of(record.pid) else {
        return Ok(0);
    };
    context.output.result(
        &format!(
            "another instance runs this app's Core host (pid {}, {}): joined it; this launch ends when it does (Ctrl-C leaves it running)",
            record.pid, record.url
        ),
        &json!({"joined": {"pid": record.pid, "url": record.url}}),
    );
    while host.is_alive() {
        if context.cancel.wait_timeout(JOINED_CHECK) {
            return Err(CommandError::new(
                codes::ARCANE_CANCELLED,
                "stopped; the Core host it joined goes on",
                json!({"pid": record.pid}),
            )
            .into());
        }
    }
    context
        .output
        .note("the Core host this launch joined has ended");
    Ok(0)
}

/// The pid of the Core host serving `state_root`, when its endpoint file is proven by
/// a held owner lease (see `arcane_core::endpoint`).
fn running_core(state_root: &Path) -> Option<u32> {
    arcane_core::endpoint::running_endpoint(state_root)
        .ok()
        .map(|record| record.pid)
}

/// A Core host this launch started (through the shared process module: its own group,
/// and it dies with this launch); stopped (group SIGTERM, grace, SIGKILL) on drop.
struct StartedCore {
    child: arcane_process::Child,
}

impl StartedCore {
    fn stop(&mut self) {
        let _ = self.child.terminate(CORE_STOP_GRACE);
    }
}

impl Drop for StartedCore {
    fn drop(&mut self) {
        self.stop();
    }
}

/// App-entry mode (see the module docs): 1. resolve the entry, 2. start a Core host
/// unless one is running, 3. run the program against it, 4. stop the host it started.
fn app_entry(
    context: &Context,
    launch: &LaunchContext,
    args: &Args,
    entry: &[String],
) -> Result<u8, CliError> {
    // 1. The entry: a listed `exec` file under `app/`.
    let Some((relative, program_args)) = entry.split_first() else {
        return Err(CommandError::usage(
            "`--arcane-app-entry` needs an app-relative path",
            json!({}),
        )
        .into());
    };
    // Opened and re-checked before anything starts; run through this descriptor.
    let program = arcane_bundle::open_app_entry(&launch.bundle, relative)?;
    // 2. The running Core, or one started in the background (in a state root that is
    // private to the user, like every workspace).
    arcane_bundle::prepare_state_root(launch)?;
    let started = match running_core(&launch.state_root) {
        Some(_) => None,
        None => Some(start_core(context, launch, args)?),
    };
    // 3. The program.
    let status = run_app(context, launch, relative, &program, program_args)?;
    // 4. The Core host this launch started stops with it.
    drop(started);
    Ok(status.shell_code())
}

/// An `ARCANE_IO` error with `message`, caused by `error`.
fn io_failure(message: impl Into<String>, error: std::io::Error) -> CliError {
    CommandError::new(codes::ARCANE_IO, message, json!({}))
        .caused_by(error)
        .into()
}

/// Starts the Core host in the background (this same launcher in Core mode, run
/// through its verified descriptor, its output in `<state-root>/logs/core.log`) and
/// waits until it publishes its endpoint.
fn start_core(
    context: &Context,
    launch: &LaunchContext,
    args: &Args,
) -> Result<StartedCore, CliError> {
    // Through its verified descriptor (an ELF binary: it may stay close-on-exec), so a
    // launcher swapped since verification never runs; it verifies the bundle again.
    let launcher = launch
        .bundle
        .open_verified(arcane_bundle::manifest::LAUNCHER_PATH)?;
    let mut command = arcane_process::Spec::new(launcher.exec_path()).args([
        std::ffi::OsStr::new("launch"),
        "--state-root".as_ref(),
        launch.state_root.as_os_str(),
        "--output".as_ref(),
        "ndjson".as_ref(),
    ]);
    if let Some(file) = &args.launch_config {
        command = command.args([std::ffi::OsStr::new("--launch-config"), file.as_os_str()]);
    }
    let (log_path, log) = open_core_log(launch)?;
    let log_err = log
        .try_clone()
        .map_err(|e| io_failure("cannot duplicate the log handle", e))?;
    command.stdout = arcane_process::StdioMode::File(log.into());
    command.stderr = arcane_process::StdioMode::File(log_err.into());
    let child =
        arcane_process::spawn(command).map_err(|e| io_failure("cannot start the Core host", e))?;
    let mut core = StartedCore { child };
    context.output.event(&Event::new(
        arcane_report::event_types::BUNDLE_LAUNCH_CORE_STARTED,
        json!({"pid": core.child.pid(), "log": log_path}),
    ));
    wait_for_core(context, launch, &mut core, &log_path)?;
    Ok(core)
}

/// Opens (appending) `<state-root>/logs/core.log`, creating its directory.
fn open_core_log(launch: &LaunchContext) -> Result<(PathBuf, std::fs::File), CliError> {
    let log_dir = launch.state_root.join("logs");
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(&log_dir)
        .map_err(|e| io_failure(format!("cannot create `{}`", log_dir.display()), e))?;
    let log_path = log_dir.join("core.log");
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| io_failure(format!("cannot open `{}`", log_path.display()), e))?;
    Ok((log_path, log))
}

/// Waits until the Core host `core` publishes its endpoint; fails when it exits first,
/// does not publish within [`CORE_START_TIMEOUT`], or the launch is cancelled (then it
/// is stopped).
fn wait_for_core(
    context: &Context,
    launch: &LaunchContext,
    core: &mut StartedCore,
    log_path: &Path,
) -> Result<(), CliError> {
    let endpoint = launch.endpoint_file();
    let deadline = Instant::now() + CORE_START_TIMEOUT;
    loop {
        if running_core(&launch.state_root).is_some() {
            return Ok(());
        }
        if let Some(status) = core.child.exit_status() {
            return Err(CommandError::new(
                codes::ARCANE_OPERATION_FAILED,
                format!(
                    "the Core host exited ({}) before publishing `{}`",
                    status.describe(),
                    endpoint.display()
                ),
                json!({"status": status.code, "log": log_path}),
            )
            .hint(format!("see `{}`", log_path.display()))
            .into());
        }
        if Instant::now() > deadline || context.cancel.wait_timeout(Duration::from_millis(100)) {
            core.stop();
            let cancelled = context.cancel.is_cancelled();
            return Err(CommandError::new(
                if cancelled {
                    codes::ARCANE_CANCELLED
                } else {
                    codes::ARCANE_OPERATION_FAILED
                },
                if cancelled {
                    "launch was cancelled while the Core host started".to_string()
                } else {
                    format!(
                        "the Core host did not publish `{}` in time",
                        endpoint.display()
                    )
                },
                json!({"log": log_path}),
            )
            .into());
        }
    }
}

/// Runs the app program with the Core's endpoint file, the state root and the bundle
/// root in its environment, and waits for it. It is started through the process module
/// like every child (its own group, the terminal's foreground group when there is one,
/// and it dies with this launch); the first SIGTERM/Ctrl-C that reaches this launch is
/// passed on to its group.
fn run_app(
    context: &Context,
    launch: &LaunchContext,
    relative: &str,
    program: &arcane_bundle::PinnedFile,
    program_args: &[String],
) -> Result<arcane_process::ExitInfo, CliError> {
    let endpoint = launch.endpoint_file();
    context.output.event(&Event::new(
        event_types::BUNDLE_LAUNCH_APP_ENTRY,
        json!({"entry": relative, "program": program.path(), "endpointFile": endpoint}),
    ));
    // Executed through the descriptor that was verified, never by path again.
    let mut spec = arcane_process::Spec::new(program.exec_path())
        .args(program_args)
        .env("ARCANE_APP_ENTRY", program.path())
        .env("ARCANE_CORE_ENDPOINT", &endpoint)
        .env("ARCANE_STATE_ROOT", &launch.state_root)
        .env("ARCANE_BUNDLE_ROOT", &launch.bundle.root)
        .inherit_stdio();
    spec.foreground = true;
    spec.keep_fds.push(program.raw_fd());
    let mut child = arcane_process::spawn(spec).map_err(|e| {
        CliError::from(
            CommandError::new(
                codes::ARCANE_IO,
                format!("cannot run app entry `{}`", program.path().display()),
                json!({"program": program.path()}),
            )
            .caused_by(e),
        )
    })?;
    let mut signalled = false;
    loop {
        if let Some(info) = child.wait_timeout(Duration::from_millis(100)) {
            return Ok(info);
        }
        if context.cancel.is_cancelled() && !signalled {
            signalled = true;
            child.signal(libc::SIGTERM);
        }
    }
}

/// The human line for one of this command's events (`bundle.launch.*`, routed here by
/// `bundle::human_event`).
pub fn human_event(event: &Event, verbose: u8) -> Option<String> {
    let data = &event.data;
    let text = |key: &str| data[key].as_str().unwrap_or("?").to_string();
    match event.kind.as_str() {
        event_types::BUNDLE_LAUNCH_VERIFIED => {
            (verbose > 0).then(|| format!("bundle `{}` verified", text("bundle")))
        }
        event_types::BUNDLE_LAUNCH_CORE => Some(format!(
            "starting the Core host with state under `{}`",
            text("stateRoot")
        )),
        event_types::BUNDLE_LAUNCH_APP_ENTRY => Some(format!(
            "running app entry `{}` against `{}`",
            text("entry"),
            text("endpointFile")
        )),
        event_types::BUNDLE_LAUNCH_CORE_STARTED => Some(format!(
            "the Core host started in the background (pid {}); it stops when the app entry exits",
            data["pid"]
        )),
        _ => None,
    }
}
