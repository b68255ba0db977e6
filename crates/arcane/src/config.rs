//! The only place the CLI reads the process environment (STYLE.md §8): global
//! configuration is resolved here once and passed down as values.
#![allow(clippy::disallowed_methods)] // this module is the sanctioned reader of the environment

use std::path::PathBuf;

use arcane_report::CancelToken;
use serde_json::json;

use crate::cli::GlobalArgs;
use crate::error::{CliError, CommandError};
use crate::output::Output;

/// Everything a command needs from the outside world, resolved once.
pub struct Context {
    /// Where and how to print.
    pub output: Output,
    /// The workspace root (may not exist yet).
    pub workspace: PathBuf,
    /// What named the workspace (`--workspace`, `ARCANE_WORKSPACE`); `None` for the
    /// platform default.
    pub workspace_named_by: Option<&'static str>,
    /// Fired by the first SIGINT/SIGTERM; commands pass it to long library calls.
    pub cancel: CancelToken,
}

impl Context {
    /// Resolves the workspace (flag, `ARCANE_WORKSPACE`, XDG data dir, home) and
    /// installs the signal handlers that fire [`Context::cancel`].
    pub fn resolve(global: &GlobalArgs, output: Output) -> Result<Self, CliError> {
        let (workspace, workspace_named_by) = match &global.workspace {
            Some(dir) => (dir.clone(), Some("--workspace")),
            None => match env_path("ARCANE_WORKSPACE") {
                Some(dir) => (dir, Some("ARCANE_WORKSPACE")),
                None => (default_workspace()?, None),
            },
        };
        let workspace = absolute(workspace)?;
        // A lease passed down by `arcane lock run` (proven before use, see arcane-lock).
        arcane_lock::inherit(std::env::var(arcane_lock::LEASE_VARIABLE).ok().as_deref());
        let cancel = CancelToken::new();
        install_signal_handlers(&cancel);
        Ok(Self {
            output,
            workspace,
            workspace_named_by,
            cancel,
        })
    }

    /// The host library's context: this workspace and cancel token, and what a host
    /// takes from the environment (read here, the one place that reads it).
    pub fn host(&self) -> arcane_host::Context {
        arcane_host::Context {
            workspace: self.workspace.clone(),
            cancel: self.cancel.clone(),
            environment: arcane_host::Environment {
                api_key: api_key(),
                inherited_loader_path: inherited_loader_path(),
                libraries: arcane_localai::Engine::ALL
                    .into_iter()
                    .filter_map(|kind| Some((kind, library_override(kind)?)))
                    .collect(),
                path: std::env::var_os("PATH"),
                worker_executable: std::env::current_exe().ok(),
            },
        }
    }

    /// Fails with `ARCANE_WORKSPACE_NOT_FOUND` when the workspace was named
    /// (`--workspace`, `ARCANE_WORKSPACE`) and nothing exists at that path: a misspelt
    /// name must not read as an empty workspace. The platform default may be missing
    /// (a fresh machine), which reads as empty.
    pub fn require_named_workspace(&self) -> Result<(), CliError> {
        let Some(named_by) = self.workspace_named_by else {
            return Ok(());
        };
        match std::fs::symlink_metadata(&self.workspace) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Err(CommandError::new(
                arcane_report::codes::ARCANE_WORKSPACE_NOT_FOUND,
                format!("the workspace `{}` does not exist", self.workspace.display()),
                json!({"path": self.workspace, "namedBy": named_by}),
            )
            .hint(format!("check the directory given by `{named_by}`; commands that change a workspace (`arcane model add`, `arcane runtime add`, `arcane serve`) create it, commands that read one never do"))
            .into()),
            _ => Ok(()),
        }
    }
}

/// `$XDG_DATA_HOME/arcane`, else `$HOME/.local/share/arcane`.
fn default_workspace() -> Result<PathBuf, CliError> {
    if let Some(dir) = env_path("XDG_DATA_HOME") {
        return Ok(dir.join("arcane"));
    }
    if let Some(home) = env_path("HOME") {
        return Ok(home.join(".local/share/arcane"));
    }
    Err(CommandError::usage(
        "no workspace directory: none of `--workspace`, `ARCANE_WORKSPACE`, `XDG_DATA_HOME` or `HOME` is set",
        json!({}),
    )
    .hint("pass `--workspace DIR`")
    .into())
}

/// A non-empty environment variable as a path.
pub fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The first executable file called `name` in a directory of `PATH` (absolute
/// directories only: an empty or relative entry would mean the working directory).
pub fn search_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH");
    arcane_host::Environment {
        path,
        ..Default::default()
    }
    .find_program(name)
}

/// The runtime library of `kind` its environment variable names
/// ([`arcane_localai::RuntimeLibrary::variable`]: `ARCANE_ONNXRUNTIME`), the default of
/// its service and of its CLI verb when no flag names one.
pub fn library_override(kind: arcane_localai::Engine) -> Option<PathBuf> {
    env_path(kind.kind().runtime_library()?.variable)
}

/// The loader search path this process was started with (`LD_LIBRARY_PATH`,
/// `DYLD_LIBRARY_PATH` on macOS), passed to every child that runs a runtime, after the
/// runtime's own directories ([`arcane_process::loader_path`]).
pub fn inherited_loader_path() -> Option<std::ffi::OsString> {
    std::env::var_os(arcane_process::LOADER_PATH_VARIABLE)
}

/// Whether colour is allowed (`NO_COLOR` unset).
pub fn color_allowed() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn absolute(path: PathBuf) -> Result<PathBuf, CliError> {
    std::path::absolute(&path).map_err(|e| {
        CommandError::usage(
            format!("cannot make `{}` absolute", path.display()),
            json!({"path": path}),
        )
        .caused_by(e)
        .into()
    })
}

/// First SIGINT or SIGTERM fires the token; a second one escalates: it stops waiting,
/// SIGKILLs every engine this process owns (none is left behind, whatever the drain
/// was waiting for) and exits at once with 130.
fn install_signal_handlers(cancel: &CancelToken) {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
        return;
    };
    let cancel = cancel.clone();
    std::thread::spawn(move || {
        for _ in signals.forever() {
            if cancel.is_cancelled() {
                // Second signal: the user insists.
                arcane_process::kill_all_now();
                #[allow(clippy::exit)]
                std::process::exit(130);
            }
            cancel.cancel();
        }
    });
}

/// The user's trusted bundle key, `$XDG_CONFIG_HOME/arcane/trusted-bundle-key.pub`
/// (else `~/.config/arcane/...`), when that file exists.
pub fn user_trusted_bundle_key() -> Option<PathBuf> {
    let base = env_path("XDG_CONFIG_HOME")
        .filter(|p| p.is_absolute())
        .or_else(|| env_path("HOME").map(|home| home.join(".config")))?;
    let path = base.join("arcane").join("trusted-bundle-key.pub");
    path.is_file().then_some(path)
}

/// A bearer token the user supplies in `ARCANE_API_KEY` (16 or more visible characters),
/// used by `arcane serve` instead of the workspace's own.
pub fn api_key() -> Option<String> {
    std::env::var("ARCANE_API_KEY")
        .ok()
        .map(|key| key.trim().to_string())
        .filter(|key| !key.is_empty())
}
