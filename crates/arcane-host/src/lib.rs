//! The Arcane host as a library: `arcane.toml`'s schema and its validation, the flags
//! that override it, and the startup order of a Core host, so that `arcane serve`,
//! `arcane core --stdio` and an application that embeds a host all run the same code.
//!
//! Two stages, as in the CLI: [`settings::options`] turns `arcane.toml` (and the
//! [`Flags`] of `arcane serve`) into validated [`ServeOptions`] (the registry read,
//! nothing started); [`serve`] runs the host on them until its [`Context::cancel`]
//! fires. [`Host`] does both for a workspace:
//!
//! ```no_run
//! let host = arcane_host::Host::new("/srv/my-app/workspace");
//! let code = host.serve(&arcane_host::Silent)?; // until `host.cancel()` fires
//! # Ok::<(), arcane_host::Error>(())
//! ```
//!
//! A library never reads the process environment: what the CLI takes from it (a
//! user's API key, the loader path, runtime libraries, `PATH`) arrives as an
//! [`Environment`].

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arcane_localai::Engine;
use arcane_report::CancelToken;

pub mod error;
pub mod groups;
mod keys;
pub mod models;
pub mod settings;
pub mod start;

pub use error::{Error, Refusal};
pub use settings::{ConfigFile, EngineTable, Flags};
pub use start::{
    serve, serve_stdio, Listening, NoWorkers, Presenter, Ready, ServeOptions, Silent, Workers,
};

/// Everything a host needs from its embedder, resolved once.
#[derive(Debug, Clone)]
pub struct Context {
    /// The workspace root (`arcane.toml`, the registry, `.arcane/`); may not exist yet.
    pub workspace: PathBuf,
    /// Fired to stop: the host drains its requests, stops the engines it owns and
    /// returns.
    pub cancel: CancelToken,
    /// What the host takes from its process's environment.
    pub environment: Environment,
}

impl Context {
    /// A context for `workspace` (made absolute), with a fresh cancel token and an
    /// empty environment.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        let workspace = workspace.into();
        Self {
            workspace: std::path::absolute(&workspace).unwrap_or(workspace),
            cancel: CancelToken::new(),
            environment: Environment::default(),
        }
    }
}

/// What a host takes from its process's environment, resolved by the caller (the CLI
/// reads it in its `config` module): libraries never read it themselves.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    /// A bearer token the user supplies (`ARCANE_API_KEY`) instead of the workspace's
    /// own (`.arcane/core-token`).
    pub api_key: Option<String>,
    /// The loader search path this process started with (`LD_LIBRARY_PATH`), handed on
    /// to every runtime after its own directories.
    pub inherited_loader_path: Option<OsString>,
    /// Runtime libraries named for kinds that load one (`ARCANE_ONNXRUNTIME`,
    /// `ARCANE_SD_LIBRARY`, …): used instead of the registered ones.
    pub libraries: Vec<(Engine, PathBuf)>,
    /// `PATH`: where the bare program name of a `command` model is looked up.
    pub path: Option<OsString>,
    /// The executable that runs the workers of Arcane's own kinds (whisper.cpp, Piper,
    /// stable-diffusion.cpp): the `arcane` binary, whose hidden subcommands they are.
    /// `None`: a model of those kinds is refused.
    pub worker_executable: Option<PathBuf>,
}

impl Environment {
    /// The runtime library named for `kind`, if any.
    pub fn library(&self, kind: Engine) -> Option<&Path> {
        self.libraries
            .iter()
            .find(|(named, _)| *named == kind)
            .map(|(_, path)| path.as_path())
    }

    /// The first executable file called `name` in a directory of [`Self::path`]
    /// (absolute directories only: an empty or relative entry would mean the working
    /// directory).
    pub fn find_program(&self, name: &str) -> Option<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        std::env::split_paths(self.path.as_ref()?)
            .filter(|dir| dir.is_absolute())
            .map(|dir| dir.join(name))
            .find(|candidate| {
                std::fs::metadata(candidate)
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
    }
}

/// A Core host on loopback HTTP for one workspace, configured by its `arcane.toml`
/// (as `arcane serve` with no flags): the embedding in one call.
pub struct Host {
    context: Context,
    flags: Flags,
    workers: Arc<dyn Workers>,
}

impl Host {
    /// A host for `workspace`, with no flags and no worker kinds.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        Self::with_context(Context::new(workspace))
    }

    /// A host with a context of the caller's (its environment, its cancel token).
    pub fn with_context(context: Context) -> Self {
        Self {
            context,
            flags: Flags::default(),
            workers: Arc::new(NoWorkers),
        }
    }

    /// The same host with `arcane serve`'s flags (they override `arcane.toml`).
    pub fn flags(mut self, flags: Flags) -> Self {
        self.flags = flags;
        self
    }

    /// The same host with the services of these worker kinds.
    pub fn workers(mut self, workers: Arc<dyn Workers>) -> Self {
        self.workers = workers;
        self
    }

    /// The token that stops the host when fired (from a signal handler, another
    /// thread): it drains, stops the engines it owns, and [`Host::serve`] returns.
    pub fn cancel(&self) -> CancelToken {
        self.context.cancel.clone()
    }

    /// Serves until the cancel token fires: the workspace is created if missing and
    /// owned (a second host for it is `CORE_ALREADY_RUNNING`), `arcane.toml` is read
    /// and validated, then the host starts. Returns 0 after a requested stop; a failed
    /// first start is its error.
    pub fn serve(self, presenter: &dyn Presenter) -> Result<u8, Error> {
        let owner = own(&self.context.workspace)?;
        let mut options = settings::options(&self.context, &self.flags)?;
        options.workers = self.workers;
        serve(&self.context, options, owner, presenter)
    }
}

/// Creates the workspace when it is missing and takes its owner lock, before anything
/// else is read: one host per workspace, and a second one is `CORE_ALREADY_RUNNING`
/// naming the first, whatever its own settings would say.
pub fn own(workspace: &Path) -> Result<arcane_core::endpoint::OwnerLock, Error> {
    ensure_workspace(workspace)?;
    Ok(arcane_core::endpoint::OwnerLock::acquire(workspace)?)
}

/// Creates the workspace directory (mode 0700, parents included) when nothing is at
/// `path`; anything there is left for the callers' own checks.
pub fn ensure_workspace(path: &Path) -> Result<(), Error> {
    match std::fs::symlink_metadata(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
                .map_err(|e| {
                    Refusal::new(
                        arcane_report::codes::ARCANE_IO,
                        format!("cannot create the workspace `{}`", path.display()),
                        serde_json::json!({"path": path}),
                    )
                    .caused_by(e)
                    .into()
                })
        }
        _ => Ok(()),
    }
}
