//! [`Registry`]: reading the registry, and the mutations (each under the workspace
//! operation lock, each atomic).

// Moving a finished, verified runtime or model tree into place (and a removed one
// to the trash and back) is a directory rename, which `arcane_files::write_atomic`
// (files only) cannot do; clippy.toml fences `fs::rename` everywhere else.
#![allow(clippy::disallowed_methods)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use arcane_devices::Backend;
use arcane_report::{CancelToken, Event, EventSink};
use arcane_workspace::layout;
use serde_json::json;

use crate::id::{check_id, check_version, normalize_sha256};
use crate::store::{self, Document, Staging};
use crate::types::{is_under, safe_file_name};
use crate::{archive, download, hash, probe, progress};
use crate::{
    ArchiveOrigin, Engine, Error, FileStamp, LibraryRuntime, Model, Runtime, Source, Storage,
};

/// The ids of every runtime, engines and libraries alike.
fn runtime_ids(document: &Document) -> Vec<String> {
    let engines = document.runtimes.iter().map(|r| r.id.clone());
    engines
        .chain(document.libraries.values().flatten().map(|r| r.id.clone()))
        .collect()
}

/// The default time limit for `<executable> --version`.
pub const DEFAULT_VERSION_TIMEOUT: Duration = Duration::from_secs(20);

/// Options of [`Registry::add_runtime`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AddRuntime {
    /// The engine the executable is.
    pub engine: Engine,
    /// The server executable (`llama-server` or `ollama`); made absolute.
    pub executable: PathBuf,
    /// The backend it was built for; `None` detects it from its libraries (llama.cpp)
    /// or records `auto` (Ollama).
    pub backend: Option<Backend>,
    /// The id; `None` means the engine's name.
    pub id: Option<String>,
    /// The time limit for `--version`.
    pub version_timeout: Duration,
    /// The loader search path the caller was started with (the value of
    /// [`arcane_process::LOADER_PATH_VARIABLE`]); `--version` runs with the runtime's
    /// own library directories first, then this ([`arcane_process::loader_path`]).
    pub inherited_loader_path: Option<OsString>,
}

impl AddRuntime {
    /// Registers `executable` as `engine` with the defaults.
    pub fn new(engine: Engine, executable: impl Into<PathBuf>) -> Self {
        Self {
            engine,
            executable: executable.into(),
            backend: None,
            id: None,
            version_timeout: DEFAULT_VERSION_TIMEOUT,
            inherited_loader_path: None,
        }
    }

    /// Sets the backend.
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Sets the id.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Sets the loader search path the caller was started with.
    pub fn inherited_loader_path(mut self, value: Option<OsString>) -> Self {
        self.inherited_loader_path = value;
        self
    }
}

/// Options of [`Registry::install_runtime`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct InstallRuntime {
    /// The engine in the archive.
    pub engine: Engine,
    /// The archive: a local file or an `http(s)://` URL.
    pub archive: Source,
    /// The archive's expected SHA-256 (checked before anything is extracted).
    pub sha256: String,
    /// The version tag; `None` takes it from the executable's `--version` (or, without
    /// the run check, from the archive's name).
    pub version: Option<String>,
    /// The backend the archive was built for; `None` means `cpu` (`metal` on macOS),
    /// and then the id and directory carry no backend suffix.
    pub backend: Option<Backend>,
    /// The id; `None` means `<engine>-<version>[-<backend>]`.
    pub id: Option<String>,
    /// The time limit for `--version`.
    pub version_timeout: Duration,
    /// The loader search path the caller was started with (the value of
    /// [`arcane_process::LOADER_PATH_VARIABLE`]); `--version` runs with the runtime's
    /// own library directories first, then this ([`arcane_process::loader_path`]).
    pub inherited_loader_path: Option<OsString>,
    /// Whether to check that the installed executable runs here (`--version`). Turn it
    /// off only to install a build for another machine (a CUDA build on a host without
    /// a GPU, say); the version must then be given or be in the archive's name
    /// (`llama-b4500-bin-…`).
    pub check_runs: bool,
    /// The most bytes the archive may expand to, all files together (default
    /// [`DEFAULT_MAX_EXTRACTED_BYTES`]); past it the install fails with
    /// [`Error::ArchiveTooLarge`] and leaves nothing.
    pub max_extracted_bytes: u64,
    /// The most the archive may expand to as a multiple of its own size (default
    /// [`DEFAULT_MAX_EXPANSION_RATIO`]): real releases expand 2-5 times, a
    /// decompression bomb a thousand.
    pub max_expansion_ratio: u64,
}

/// The default of [`InstallRuntime::max_extracted_bytes`]: 4 GiB (a CUDA build of
/// llama.cpp extracts to well under 2 GiB).
pub const DEFAULT_MAX_EXTRACTED_BYTES: u64 = 4 << 30;

/// The default of [`InstallRuntime::max_expansion_ratio`].
pub const DEFAULT_MAX_EXPANSION_RATIO: u64 = 200;

impl InstallRuntime {
    /// Installs `engine` from `archive`, which must hash to `sha256`.
    pub fn new(engine: Engine, archive: Source, sha256: impl Into<String>) -> Self {
        Self {
            engine,
            archive,
            sha256: sha256.into(),
            version: None,
            backend: None,
            id: None,
            version_timeout: DEFAULT_VERSION_TIMEOUT,
            inherited_loader_path: None,
            check_runs: true,
            max_extracted_bytes: DEFAULT_MAX_EXTRACTED_BYTES,
            max_expansion_ratio: DEFAULT_MAX_EXPANSION_RATIO,
        }
    }

    /// Sets the most bytes the archive may expand to.
    pub fn max_extracted_bytes(mut self, bytes: u64) -> Self {
        self.max_extracted_bytes = bytes;
        self
    }

    /// Sets the most the archive may expand to as a multiple of its size.
    pub fn max_expansion_ratio(mut self, ratio: u64) -> Self {
        self.max_expansion_ratio = ratio;
        self
    }

    /// Skips (`false`) or keeps the check that the executable runs here.
    pub fn check_runs(mut self, check: bool) -> Self {
        self.check_runs = check;
        self
    }

    /// Sets the version tag.
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// Sets the backend.
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Sets the id.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Sets the loader search path the caller was started with.
    pub fn inherited_loader_path(mut self, value: Option<OsString>) -> Self {
        self.inherited_loader_path = value;
        self
    }
}

/// Options of [`Registry::add_model`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AddModel {
    /// The id.
    pub id: String,
    /// A local GGUF file or an `http(s)://` URL.
    pub source: Source,
    /// The expected SHA-256: required for a URL, checked when given for a file.
    pub sha256: Option<String>,
}

impl AddModel {
    /// Adds the local file `path` as `id`.
    pub fn file(id: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        Self {
            id: id.into(),
            source: Source::File(path.into()),
            sha256: None,
        }
    }

    /// Downloads `url` as `id`, verifying it against `sha256`.
    pub fn url(id: impl Into<String>, url: impl Into<String>, sha256: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            source: Source::Url(url.into()),
            sha256: Some(sha256.into()),
        }
    }

    /// Sets the expected SHA-256.
    pub fn sha256(mut self, sha256: impl Into<String>) -> Self {
        self.sha256 = Some(sha256.into());
        self
    }
}

/// Options of the workspace lock the mutations take.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LockSettings {
    /// How long to wait for another operation to release the lock.
    pub wait: Duration,
}

impl Default for LockSettings {
    fn default() -> Self {
        Self {
            wait: Duration::from_secs(600),
        }
    }
}

/// The runtime and model registry of one workspace (`<workspace>/.arcane/`).
#[derive(Debug, Clone)]
pub struct Registry {
    workspace: PathBuf,
    lock: LockSettings,
}

impl Registry {
    /// The registry of `workspace` (the directory holding `.arcane/`). Does no I/O.
    pub fn new(workspace: &Path) -> Registry {
        Registry {
            workspace: workspace.to_path_buf(),
            lock: LockSettings::default(),
        }
    }

    /// Changes how mutations wait for the workspace lock.
    pub fn with_lock_settings(mut self, settings: LockSettings) -> Registry {
        self.lock = settings;
        self
    }

    /// The workspace root.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// `<workspace>/.arcane/registry.json`.
    pub fn file(&self) -> PathBuf {
        layout::registry_file(&self.workspace)
    }

    /// `<workspace>/.arcane/runtimes`: installed runtimes, `<engine>/<version>[-<backend>]/`.
    pub fn runtimes_dir(&self) -> PathBuf {
        layout::runtimes_dir(&self.workspace)
    }

    /// `<workspace>/.arcane/models`: model files, `<id>/<file name>`.
    pub fn models_dir(&self) -> PathBuf {
        layout::models_dir(&self.workspace)
    }

    fn load(&self) -> Result<Document, Error> {
        store::load(&self.workspace, &self.file())
    }

    fn save(&self, document: &Document) -> Result<(), Error> {
        store::save(&self.workspace, &self.file(), document)
    }

    /// Every registered runtime, in registration order.
    pub fn runtimes(&self) -> Result<Vec<Runtime>, Error> {
        Ok(self.load()?.runtimes)
    }

    /// The runtime `id`; [`Error::RuntimeNotFound`] names it and lists the known ids.
    pub fn runtime(&self, id: &str) -> Result<Runtime, Error> {
        let runtimes = self.runtimes()?;
        find_runtime(&runtimes, id).cloned()
    }

    /// The runtime to use for `engine` when none is named: the one whose id is the
    /// engine's name, else the only runtime of that engine.
    pub fn default_runtime(&self, engine: Engine) -> Result<Runtime, Error> {
        let runtimes = self.runtimes()?;
        if let Some(runtime) = runtimes
            .iter()
            .find(|r| r.id == engine.as_str() && r.engine == engine)
        {
            return Ok(runtime.clone());
        }
        let candidates: Vec<&Runtime> = runtimes.iter().filter(|r| r.engine == engine).collect();
        match candidates.as_slice() {
            [] => Err(Error::NoRuntimeForEngine {
                engine: engine.to_string(),
            }),
            [only] => Ok((*only).clone()),
            many => Err(Error::AmbiguousRuntime {
                engine: engine.to_string(),
                candidates: many.iter().map(|r| r.id.clone()).collect(),
            }),
        }
    }

    /// Every registered library runtime of `kind` (ONNX Runtime for `onnx`), in
    /// registration order.
    pub fn library_runtimes(&self, kind: Engine) -> Result<Vec<LibraryRuntime>, Error> {
        Ok(self.load()?.libraries(kind).to_vec())
    }

    /// The library runtime of `kind` to use when none is named: the one whose id is the
    /// kind's, else the only one; `None` when none (or several, none so called) is
    /// registered.
    pub fn default_library_runtime(&self, kind: Engine) -> Result<Option<LibraryRuntime>, Error> {
        let runtimes = self.library_runtimes(kind)?;
        if let Some(runtime) = runtimes.iter().find(|r| r.id == kind.as_str()) {
            return Ok(Some(runtime.clone()));
        }
        Ok(match runtimes.as_slice() {
            [only] => Some(only.clone()),
            _ => None,
        })
    }

    /// Registers a library runtime of `kind` after reading its version with the kind's
    /// own loader (ONNX Runtime's: a missing library, one that is not ONNX Runtime or
    /// one older than its minimum is `ARCANE_PREREQUISITE_MISSING` naming the path and
    /// the minimum; a kind whose runtime is no library is `ARCANE_USAGE`). `id`
    /// defaults to the kind's id and shares the runtimes' namespace. Holds the lock as
    /// `runtime-add`; emits `registry.runtime.added` `{runtime}`.
    pub fn add_library_runtime(
        &self,
        kind: Engine,
        library: &Path,
        id: Option<&str>,
        events: &dyn EventSink,
        cancel: &CancelToken,
    ) -> Result<LibraryRuntime, Error> {
        let id = id.unwrap_or(kind.as_str()).to_string();
        check_id("runtime", &id)?;
        let library = std::path::absolute(library).map_err(|e| Error::io("resolve", library, e))?;
        // A missing file is reported by the version check, with the minimum.
        let library = std::fs::canonicalize(&library).unwrap_or(library);
        // Loading a library runs its constructors: one another user controls (or one
        // beside it) is refused before it is loaded. A missing file is left to the
        // version check.
        if library.exists() {
            let beside = library
                .parent()
                .map(Path::to_path_buf)
                .into_iter()
                .collect::<Vec<_>>();
            trusted_program(&library, &beside)?;
        }
        let version = crate::library_version(kind, &library)?;
        let runtime = LibraryRuntime {
            id: id.clone(),
            version,
            library,
            added_at: arcane_report::time::now_rfc3339(),
        };
        self.register_runtime(
            &id,
            json!({"runtime": runtime}),
            events,
            cancel,
            |document| document.libraries_mut(kind).push(runtime.clone()),
        )?;
        Ok(runtime)
    }

    /// Unregisters the library runtime `id`, of whatever kind (its library is never
    /// touched). Holds the lock as `runtime-remove`; emits `registry.runtime.removed`
    /// `{runtime}`.
    pub fn remove_library_runtime(
        &self,
        id: &str,
        events: &dyn EventSink,
        cancel: &CancelToken,
    ) -> Result<LibraryRuntime, Error> {
        let runtime = self.locked("runtime-remove", events, cancel, || {
            let mut document = self.load()?;
            let found = document
                .libraries
                .values()
                .flatten()
                .find(|r| r.id == id)
                .cloned();
            let Some(runtime) = found else {
                return Err(Error::RuntimeNotFound {
                    id: id.to_string(),
                    known: runtime_ids(&document),
                });
            };
            for runtimes in document.libraries.values_mut() {
                runtimes.retain(|r| r.id != id);
            }
            self.save(&document)?;
            Ok(runtime)
        })?;
        events.emit(Event::new(
            arcane_report::event_types::REGISTRY_RUNTIME_REMOVED,
            json!({"runtime": runtime}),
        ));
        Ok(runtime)
    }

    /// Every registered model, in registration order.
    pub fn models(&self) -> Result<Vec<Model>, Error> {
        Ok(self.load()?.models)
    }

    /// The model `id`; [`Error::ModelNotFound`] names it and lists the known ids.
    pub fn model(&self, id: &str) -> Result<Model, Error> {
        let models = self.models()?;
        models
            .iter()
            .find(|m| m.id == id)
            .cloned()
            .ok_or_else(|| Error::ModelNotFound {
                id: id.to_string(),
                known: models.iter().map(|m| m.id.clone()).collect(),
            })
    }

    /// Runs `f` holding the workspace operation lock as `operation`, after removing
    /// what crashed operations left behind.
    /// Adds a runtime record under the lock as `runtime-add` (`push` puts it in the
    /// document), refusing an id any runtime of any kind already has, then emits
    /// `registry.runtime.added` with `added`.
    fn register_runtime(
        &self,
        id: &str,
        added: serde_json::Value,
        events: &dyn EventSink,
        cancel: &CancelToken,
        push: impl FnOnce(&mut Document),
    ) -> Result<(), Error> {
        self.locked("runtime-add", events, cancel, || {
            let mut document = self.load()?;
            if runtime_ids(&document).iter().any(|taken| taken == id) {
                return Err(Error::RuntimeExists { id: id.to_string() });
            }
            push(&mut document);
            self.save(&document)
        })?;
        events.emit(Event::new(
            arcane_report::event_types::REGISTRY_RUNTIME_ADDED,
            added,
        ));
        Ok(())
    }

    fn locked<T>(
        &self,
        operation: &'static str,
        events: &dyn EventSink,
        cancel: &CancelToken,
        f: impl FnOnce() -> Result<T, Error>,
    ) -> Result<T, Error> {
        let options = arcane_lock::AcquireOptions::new(operation)?
            .wait(self.lock.wait)
            .cancel(cancel.clone());
        arcane_files::create_private_dirs(&self.workspace)
            .map_err(|e| Error::io("create", &self.workspace, e))?;
        let lock = arcane_lock::WorkspaceLock::acquire(&self.workspace, &options, events)?;
        store::sweep(&self.models_dir());
        store::sweep(&self.runtimes_dir());
        let result = f();
        let released = lock.release_with_events(events);
        let value = result?;
        released?;
        Ok(value)
    }

    /// Registers an existing executable after checking it runs (`--version`), recording
    /// its version, backend and library directories. Holds the lock as `runtime-add`.
    ///
    /// Emits `registry.runtime.probing` `{executable}` and `registry.runtime.added` `{runtime}`.
    pub fn add_runtime(
        &self,
        options: &AddRuntime,
        events: &dyn EventSink,
        cancel: &CancelToken,
    ) -> Result<Runtime, Error> {
        server_executable(options.engine)?;
        let id = options
            .id
            .clone()
            .unwrap_or_else(|| options.engine.as_str().to_string());
        check_id("runtime", &id)?;
        let executable = std::path::absolute(&options.executable)
            .map_err(|e| Error::io("resolve", &options.executable, e))?;
        let executable =
            std::fs::canonicalize(&executable).map_err(|source| Error::ExecutableDoesNotRun {
                executable: executable.clone(),
                source,
            })?;
        if !executable.is_file() {
            return Err(Error::ExecutableDoesNotRun {
                executable,
                source: std::io::Error::other("it is not a file"),
            });
        }
        // Fail fast, before the lock, on an id that is plainly taken.
        if self.runtimes()?.iter().any(|r| r.id == id) {
            return Err(Error::RuntimeExists { id });
        }
        let library_dirs = archive::library_dirs(&executable);
        // Nothing another user controls runs here (`--version` runs the program and
        // loads its libraries): checked before the probe, as `serve` checks it.
        trusted_program(&executable, &library_dirs)?;
        events.emit(Event::new(
            arcane_report::event_types::REGISTRY_RUNTIME_PROBING,
            json!({"executable": executable}),
        ));
        let probed = probe::probe(
            options.engine,
            &executable,
            &library_dirs,
            options.inherited_loader_path.as_deref(),
            options.version_timeout,
            cancel,
        )?;
        let backend = options
            .backend
            .unwrap_or_else(|| detect_backend(options.engine, &library_dirs));
        let runtime = Runtime {
            id: id.clone(),
            engine: options.engine,
            version: probed.version,
            build_info: Some(probed.build_info),
            backend,
            executable,
            library_dirs,
            installed: false,
            root: None,
            archive: None,
            added_at: arcane_report::time::now_rfc3339(),
        };
        self.register_runtime(
            &id,
            json!({"runtime": runtime}),
            events,
            cancel,
            |document| document.runtimes.push(runtime.clone()),
        )?;
        Ok(runtime)
    }

    /// Installs a release archive into `.arcane/runtimes/<engine>/<version>[-<backend>]/`
    /// and registers it. Holds the lock as `runtime-install`.
    ///
    /// The archive's SHA-256 is checked before anything is extracted; extraction follows
    /// the rules of the `archive` module; everything happens in a staging directory
    /// inside `.arcane/runtimes/` that is renamed into place at the end, so a failed or
    /// cancelled install leaves nothing behind and an earlier install is never
    /// overwritten. Emits `download.*` events for a URL, `registry.hash.progress` for a
    /// file, then `registry.runtime.extracting`, `registry.runtime.probing` and
    /// `registry.runtime.installed` `{runtime}`.
    pub fn install_runtime(
        &self,
        options: &InstallRuntime,
        events: &dyn EventSink,
        cancel: &CancelToken,
    ) -> Result<Runtime, Error> {
        let plan = InstallPlan::new(self, options)?;
        // Fail fast, before the lock and the download, when the version is known.
        if let Some(version) = &options.version {
            self.check_install_free(&plan, version)?;
        }
        let runtime = self.locked("runtime-install", events, cancel, || {
            let staging = Staging::create(&self.runtimes_dir(), "install")?;
            // 1. Get the archive's bytes and check their digest.
            let file = plan.fetch_verified(staging.path(), events, cancel)?;
            // 2. Extract it into the staging directory.
            let root = plan.extract(file, staging.path(), events, cancel)?;
            // 3. Find the server and check it runs.
            let staged = plan.find_server(&root, events, cancel)?;
            // 4. Move it into place, never over an earlier install.
            let runtime = self.move_into_place(&plan, &root, staged)?;
            drop(staging);
            Ok(runtime)
        })?;
        events.emit(Event::new(
            arcane_report::event_types::REGISTRY_RUNTIME_INSTALLED,
            json!({"runtime": runtime}),
        ));
        Ok(runtime)
    }

    /// Neither the id nor the directory of `plan`'s install of `version` is taken.
    fn check_install_free(&self, plan: &InstallPlan<'_>, version: &str) -> Result<(), Error> {
        let (dir_name, id) = plan.names(version);
        check_id("runtime", &id)?;
        if self.runtimes()?.iter().any(|r| r.id == id) {
            return Err(Error::RuntimeExists { id });
        }
        if plan.engine_dir.join(&dir_name).exists() {
            return Err(Error::DestinationExists {
                path: plan.engine_dir.join(dir_name),
            });
        }
        Ok(())
    }

    /// Step 4 of [`Registry::install_runtime`] (under the lock): renames the extracted
    /// `root` to its final directory and records it; a failed save removes the
    /// directory again.
    fn move_into_place(
        &self,
        plan: &InstallPlan<'_>,
        root: &Path,
        staged: StagedServer,
    ) -> Result<Runtime, Error> {
        let (dir_name, id) = plan.names(&staged.version);
        check_id("runtime", &id)?;
        let mut document = self.load()?;
        if document.runtimes.iter().any(|r| r.id == id) {
            return Err(Error::RuntimeExists { id });
        }
        let engine_dir = &plan.engine_dir;
        let destination = engine_dir.join(&dir_name);
        if std::fs::symlink_metadata(&destination).is_ok() {
            return Err(Error::DestinationExists { path: destination });
        }
        arcane_files::create_private_dirs(engine_dir)
            .map_err(|e| Error::io("create", engine_dir, e))?;
        let relative_executable = staged
            .executable
            .strip_prefix(root)
            .unwrap_or(&staged.executable)
            .to_path_buf();
        let canonical_root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        let relative_libraries: Vec<PathBuf> = staged
            .libraries
            .iter()
            .map(|d| d.strip_prefix(&canonical_root).unwrap_or(d).to_path_buf())
            .collect();
        std::fs::rename(root, &destination).map_err(|e| Error::io("rename", root, e))?;
        let runtime = Runtime {
            id,
            engine: plan.options.engine,
            version: staged.version,
            build_info: staged.probed.map(|p| p.build_info),
            backend: plan.backend,
            executable: destination.join(relative_executable),
            library_dirs: relative_libraries
                .iter()
                .map(|d| destination.join(d))
                .collect(),
            installed: true,
            root: Some(destination.clone()),
            archive: Some(ArchiveOrigin {
                location: plan.label.clone(),
                sha256: plan.expected.clone(),
            }),
            added_at: arcane_report::time::now_rfc3339(),
        };
        document.runtimes.push(runtime.clone());
        let saved = store::sync_dir(engine_dir).and_then(|()| self.save(&document));
        if let Err(error) = saved {
            let _ = store::remove_tree(&destination);
            return Err(error);
        }
        Ok(runtime)
    }

    /// Unregisters the runtime `id`; an installed runtime's directory is deleted too
    /// (an external executable is left alone). Holds the lock as `runtime-remove`.
    /// Emits `registry.runtime.removed` `{runtime}`.
    pub fn remove_runtime(
        &self,
        id: &str,
        events: &dyn EventSink,
        cancel: &CancelToken,
    ) -> Result<Runtime, Error> {
        let runtime = self.locked("runtime-remove", events, cancel, || {
            let mut document = self.load()?;
            let runtime = find_runtime(&document.runtimes, id)?.clone();
            document.runtimes.retain(|r| r.id != id);
            let owned_root = runtime
                .root
                .clone()
                .filter(|root| runtime.installed && is_under(root, &self.runtimes_dir()));
            self.remove_with_record(owned_root.as_deref(), &self.runtimes_dir(), id, &document)?;
            Ok(runtime)
        })?;
        events.emit(Event::new(
            arcane_report::event_types::REGISTRY_RUNTIME_REMOVED,
            json!({"runtime": runtime}),
        ));
        Ok(runtime)
    }

    /// Moves `dir` (if any) to the trash, saves `document`, then deletes the trash; if
    /// saving fails the directory is moved back.
    fn remove_with_record(
        &self,
        dir: Option<&Path>,
        trash_in: &Path,
        label: &str,
        document: &Document,
    ) -> Result<(), Error> {
        let trashed = match dir.filter(|d| std::fs::symlink_metadata(d).is_ok()) {
            Some(dir) => {
                let trash = store::trash_path(trash_in, label);
                std::fs::rename(dir, &trash).map_err(|e| Error::io("move", dir, e))?;
                Some((dir.to_path_buf(), trash))
            }
            None => None,
        };
        if let Err(error) = self.save(document) {
            if let Some((dir, trash)) = &trashed {
                let _ = std::fs::rename(trash, dir);
            }
            return Err(error);
        }
        if let Some((_, trash)) = trashed {
            // A failure here leaves only a `.trash-*` entry, swept by the next operation.
            let _ = store::remove_tree(&trash);
        }
        Ok(())
    }

    /// Adds a GGUF model: checks its magic, version and metadata, stores it in
    /// `.arcane/models/<id>/` (hard link on the same file system, else a copy; or a
    /// download verified against its SHA-256) and registers it with its size and
    /// SHA-256. Holds the lock as `model-add`.
    ///
    /// Emits `registry.hash.progress` (file) or `download.*` (URL) events, then
    /// `registry.model.added` `{model}`.
    pub fn add_model(
        &self,
        options: &AddModel,
        events: &dyn EventSink,
        cancel: &CancelToken,
    ) -> Result<Model, Error> {
        check_id("model", &options.id)?;
        let expected = options
            .sha256
            .as_deref()
            .map(normalize_sha256)
            .transpose()?;
        let mut checked = None;
        let source = match &options.source {
            Source::File(path) => {
                let path = std::path::absolute(path).map_err(|e| Error::io("resolve", path, e))?;
                // A symbolic link is resolved to the file it names, which is what gets
                // linked or copied and recorded as the source (never the link itself).
                let path = match std::fs::symlink_metadata(&path) {
                    Ok(meta) if meta.file_type().is_symlink() => std::fs::canonicalize(&path)
                        .map_err(|e| Error::io("resolve the link", &path, e))?,
                    _ => path,
                };
                // Refuse a file no format reader can read (or a FIFO, socket, device)
                // before anything else, companions included (a Piper voice whose
                // configuration is broken).
                checked = Some(crate::read_header(&path)?);
                Source::File(path)
            }
            Source::Url(url) => {
                if expected.is_none() {
                    return Err(Error::MissingDigest { url: url.clone() });
                }
                Source::Url(url.clone())
            }
        };
        let id = options.id.as_str();
        if self.models()?.iter().any(|m| m.id == id) {
            return Err(Error::ModelExists { id: id.to_string() });
        }
        let label = source.display();
        let model = self.locked("model-add", events, cancel, || {
            let mut document = self.load()?;
            if document.models.iter().any(|m| m.id == id) {
                return Err(Error::ModelExists { id: id.to_string() });
            }
            let destination = self.models_dir().join(id);
            if std::fs::symlink_metadata(&destination).is_ok() {
                return Err(Error::DestinationExists { path: destination });
            }
            let staging = Staging::create(&self.models_dir(), id)?;
            let file_name = safe_file_name(source.file_name());
            let staged = staging.path().join(&file_name);
            // A hard link shares the file with its owner: only a file nobody else can
            // write is linked; any other is copied (the copy is this user's, 0644).
            let linkable = |path: &Path| {
                std::fs::metadata(path).is_ok_and(|meta| {
                    use std::os::unix::fs::MetadataExt;
                    arcane_files::trust::check_owner_and_mode(path, &meta).is_ok()
                        && meta.uid() == arcane_files::trust::current_uid()
                })
            };
            let (storage, actual) = match &source {
                Source::File(path) => match if linkable(path) {
                    std::fs::hard_link(path, &staged)
                } else {
                    Err(std::io::Error::other("copied, not linked"))
                } {
                    Ok(()) => {
                        let mut report = progress::hash_reporter(events, path, "hash");
                        let digest =
                            unchanged_while(path, &staged, cancel, String::as_str, || {
                                hash::sha256_file(&staged, cancel, &mut report)
                            })?;
                        (Storage::HardLink, digest)
                    }
                    Err(_) => {
                        let mut report = progress::hash_reporter(events, path, "copy");
                        let (_, digest) = unchanged_while(
                            path,
                            path,
                            cancel,
                            |(_, digest): &(u64, String)| digest.as_str(),
                            || hash::copy_and_hash(path, &staged, cancel, &mut report),
                        )?;
                        (Storage::Copy, digest)
                    }
                },
                Source::Url(url) => (
                    Storage::Download,
                    download::download(url, &staged, events, cancel)?.1,
                ),
            };
            if let Some(expected) = &expected {
                if &actual != expected {
                    return Err(Error::IntegrityFailed {
                        subject: label.clone(),
                        expected: expected.clone(),
                        actual,
                    });
                }
            }
            if let (Source::File(path), Some((reader, _))) = (&source, &checked) {
                stage_companions(reader.format(), path, &staged)?;
            }
            let header = read_staged_header(&staged, &label)?;
            // What was staged must say what the source said when it was checked, else
            // the source (or a companion) changed meanwhile.
            if let (Source::File(path), Some((_, checked))) = (&source, &checked) {
                if &header != checked {
                    return Err(Error::SourceChanged { path: path.clone() });
                }
            }
            let size = std::fs::metadata(&staged)
                .map_err(|e| Error::io("inspect", &staged, e))?
                .len();
            std::fs::rename(staging.path(), &destination)
                .map_err(|e| Error::io("rename", staging.path(), e))?;
            staging.keep();
            let path = destination.join(&file_name);
            let stamp = FileStamp::of(&path).map_err(|e| Error::io("inspect", &path, e))?;
            let model = Model {
                id: id.to_string(),
                path,
                size,
                sha256: actual,
                header,
                source: label.clone(),
                storage,
                added_at: arcane_report::time::now_rfc3339(),
                stamp: Some(stamp),
            };
            document.models.push(model.clone());
            let saved = store::sync_dir(&self.models_dir()).and_then(|()| self.save(&document));
            if let Err(error) = saved {
                let _ = store::remove_tree(&destination);
                return Err(error);
            }
            Ok(model)
        })?;
        events.emit(Event::new(
            arcane_report::event_types::REGISTRY_MODEL_ADDED,
            json!({"model": model}),
        ));
        Ok(model)
    }

    /// Re-hashes the model `id`'s file and checks it still has its recorded size and
    /// SHA-256 (a hard-linked file changes when its source is edited in place). Takes
    /// no lock: it only reads. Emits `registry.hash.progress` events.
    pub fn verify_model(
        &self,
        id: &str,
        events: &dyn EventSink,
        cancel: &CancelToken,
    ) -> Result<Model, Error> {
        let model = self.model(id)?;
        let actual = {
            let mut report = progress::hash_reporter(events, &model.path, "verify");
            hash::sha256_file(&model.path, cancel, &mut report)?
        };
        if actual != model.sha256 {
            return Err(Error::IntegrityFailed {
                subject: model.path.display().to_string(),
                expected: model.sha256.clone(),
                actual,
            });
        }
        Ok(model)
    }

    /// Whether `model`'s file still looks as it did when it was registered: same inode,
    /// size and modification time (only the size for records without a stamp).
    /// Reads no file content.
    pub fn model_unchanged(model: &Model) -> bool {
        let Ok(now) = FileStamp::of(&model.path) else {
            return false;
        };
        // The change time is not compared: another hard link to the same file (the
        // same file added under a second name) moves it without changing a byte. Only
        // files this user alone can write are linked, so a rewrite that forged the
        // modification time back could only be this user's own.
        let same = |recorded: &FileStamp| {
            (
                recorded.dev,
                recorded.ino,
                recorded.size,
                recorded.modified_ns,
            ) == (now.dev, now.ino, now.size, now.modified_ns)
        };
        match model.stamp {
            Some(recorded) => same(&recorded),
            None => now.size == model.size,
        }
    }

    /// Checks, before a model is served, that its file is the one registered: the cheap
    /// check of [`model_unchanged`](Self::model_unchanged) first, and only when that
    /// fails a full re-hash. A file whose bytes changed is `ARCANE_INTEGRITY_FAILED`
    /// ([`Error::ModelChanged`]) with a hint to re-add it.
    pub fn check_model_file(&self, model: &Model, cancel: &CancelToken) -> Result<(), Error> {
        if Self::model_unchanged(model) {
            return Ok(());
        }
        let changed = |actual: Option<String>| Error::ModelChanged {
            id: model.id.clone(),
            path: model.path.clone(),
            source_path: model.source.clone(),
            expected: model.sha256.clone(),
            actual,
        };
        match std::fs::symlink_metadata(&model.path) {
            Ok(meta) if meta.is_file() => {}
            _ => return Err(changed(None)),
        }
        let actual = {
            let mut report =
                progress::hash_reporter(&arcane_report::NullSink, &model.path, "verify");
            hash::sha256_file(&model.path, cancel, &mut report)?
        };
        if actual == model.sha256 {
            // Touched but identical (e.g. `touch`): serve it.
            return Ok(());
        }
        Err(changed(Some(actual)))
    }

    /// Unregisters the model `id` and deletes its directory under `.arcane/models/`.
    /// Holds the lock as `model-remove`. Emits `registry.model.removed` `{model}`.
    pub fn remove_model(
        &self,
        id: &str,
        events: &dyn EventSink,
        cancel: &CancelToken,
    ) -> Result<Model, Error> {
        let model = self.locked("model-remove", events, cancel, || {
            let mut document = self.load()?;
            let Some(model) = document.models.iter().find(|m| m.id == id).cloned() else {
                return Err(Error::ModelNotFound {
                    id: id.to_string(),
                    known: document.models.iter().map(|m| m.id.clone()).collect(),
                });
            };
            document.models.retain(|m| m.id != id);
            let dir = model
                .path
                .parent()
                .filter(|d| is_under(d, &self.models_dir()))
                .map(Path::to_path_buf);
            self.remove_with_record(dir.as_deref(), &self.models_dir(), id, &document)?;
            Ok(model)
        })?;
        events.emit(Event::new(
            arcane_report::event_types::REGISTRY_MODEL_REMOVED,
            json!({"model": model}),
        ));
        Ok(model)
    }
}

/// Runs `read` (a hash or copy of `file` that yields the digest `digest` picks out) and
/// fails with [`Error::SourceChanged`] when `file` is not the same afterwards: another
/// inode, size or modification time. When only its change time moved (another process
/// linked or chmodded it, or rewrote it and forged the modification time back), the
/// bytes decide: the file is hashed again and must give the same digest. A digest of
/// bytes that changed under the reader matches neither the old nor the new file, so it
/// is never recorded. `source` names the file in errors.
fn unchanged_while<T>(
    source: &Path,
    file: &Path,
    cancel: &CancelToken,
    digest: impl Fn(&T) -> &str,
    read: impl FnOnce() -> Result<T, Error>,
) -> Result<T, Error> {
    let stamp = || FileStamp::of(file).map_err(|e| Error::io("inspect", file, e));
    let same_bytes = |a: &FileStamp, b: &FileStamp| {
        (a.dev, a.ino, a.size, a.modified_ns) == (b.dev, b.ino, b.size, b.modified_ns)
    };
    let changed = || Error::SourceChanged {
        path: source.to_path_buf(),
    };
    let before = stamp()?;
    let value = read()?;
    let after = stamp()?;
    if before == after {
        return Ok(value);
    }
    if !same_bytes(&before, &after) {
        return Err(changed());
    }
    let again = hash::sha256_file(file, cancel, &mut |_, _| {})?;
    if again != digest(&value) || !same_bytes(&before, &stamp()?) {
        return Err(changed());
    }
    Ok(value)
}

/// An install of [`Registry::install_runtime`] once its options are checked.
struct InstallPlan<'a> {
    options: &'a InstallRuntime,
    /// The archive's expected SHA-256 (normalized).
    expected: String,
    /// The backend recorded for the runtime.
    backend: Backend,
    /// The archive, with a file path made absolute.
    archive: Source,
    /// The archive as errors and events name it.
    label: String,
    /// `.arcane/runtimes/<engine>/`.
    engine_dir: PathBuf,
}

/// The server found in an extracted archive (step 3 of [`Registry::install_runtime`]).
struct StagedServer {
    executable: PathBuf,
    libraries: Vec<PathBuf>,
    probed: Option<probe::Probed>,
    version: String,
}

impl<'a> InstallPlan<'a> {
    /// Checks `options` (digest, version, id syntax) and resolves the defaults.
    fn new(registry: &Registry, options: &'a InstallRuntime) -> Result<Self, Error> {
        let expected = normalize_sha256(&options.sha256)?;
        if let Some(version) = &options.version {
            check_version(version)?;
        }
        if let Some(id) = &options.id {
            check_id("runtime", id)?;
        }
        let backend = options.backend.unwrap_or(if cfg!(target_os = "macos") {
            Backend::Metal
        } else {
            Backend::Cpu
        });
        let archive = match &options.archive {
            Source::File(path) => {
                Source::File(std::path::absolute(path).map_err(|e| Error::io("resolve", path, e))?)
            }
            url => url.clone(),
        };
        Ok(Self {
            options,
            expected,
            backend,
            label: archive.display(),
            archive,
            engine_dir: registry.runtimes_dir().join(options.engine.as_str()),
        })
    }

    /// The directory name and id of the install of `version`.
    fn names(&self, version: &str) -> (String, String) {
        let dir_name = match self.options.backend {
            Some(b) => format!("{version}-{b}"),
            None => version.to_string(),
        };
        let id = self
            .options
            .id
            .clone()
            .unwrap_or_else(|| format!("{}-{dir_name}", self.options.engine.as_str()));
        (dir_name, id)
    }

    /// Step 1: the archive's bytes (downloaded into `staging` for a URL), checked
    /// against the expected digest; returns the open archive.
    fn fetch_verified(
        &self,
        staging: &Path,
        events: &dyn EventSink,
        cancel: &CancelToken,
    ) -> Result<std::fs::File, Error> {
        let (file, actual) = match &self.archive {
            Source::Url(url) => {
                let path = staging.join("archive");
                let (_, actual) = download::download(url, &path, events, cancel)?;
                let file = std::fs::File::open(&path).map_err(|e| Error::io("open", &path, e))?;
                (file, actual)
            }
            Source::File(path) => {
                // A user-named archive: never blocks on a FIFO, regular files only.
                let mut file =
                    arcane_files::open_regular(path).map_err(|e| Error::io("open", path, e))?;
                let total = file
                    .metadata()
                    .map_err(|e| Error::io("inspect", path, e))?
                    .len();
                let mut report = progress::hash_reporter(events, path, "verify");
                let actual = hash::sha256_reader(&mut file, total, path, cancel, &mut report)?;
                (file, actual)
            }
        };
        if actual != self.expected {
            return Err(Error::IntegrityFailed {
                subject: self.label.clone(),
                expected: self.expected.clone(),
                actual,
            });
        }
        Ok(file)
    }

    /// Step 2: extracts the archive into `staging/root`; returns that directory.
    fn extract(
        &self,
        mut file: std::fs::File,
        staging: &Path,
        events: &dyn EventSink,
        cancel: &CancelToken,
    ) -> Result<PathBuf, Error> {
        let root = staging.join("root");
        std::fs::create_dir(&root).map_err(|e| Error::io("create", &root, e))?;
        // The installed tree's root: a fixed mode, whatever the umask.
        std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| Error::io("chmod", &root, e))?;
        events.emit(Event::new(
            arcane_report::event_types::REGISTRY_RUNTIME_EXTRACTING,
            json!({"archive": self.label, "destination": root}),
        ));
        let limits = archive::Limits {
            max_bytes: self.options.max_extracted_bytes,
            max_ratio: self.options.max_expansion_ratio,
        };
        archive::extract(&mut file, &self.label, &root, limits, cancel)?;
        Ok(root)
    }

    /// Step 3: finds the server under `root`, checks it runs (unless told not to) and
    /// settles the version.
    fn find_server(
        &self,
        root: &Path,
        events: &dyn EventSink,
        cancel: &CancelToken,
    ) -> Result<StagedServer, Error> {
        let options = self.options;
        let name = server_executable(options.engine)?;
        let executable =
            archive::find_executable(root, name).ok_or_else(|| Error::ExecutableNotInArchive {
                archive: self.label.clone(),
                name: name.to_string(),
            })?;
        make_executable(&executable)?;
        let libraries = archive::library_dirs(&executable);
        let probed = if options.check_runs {
            events.emit(Event::new(
                arcane_report::event_types::REGISTRY_RUNTIME_PROBING,
                json!({"executable": executable}),
            ));
            Some(probe::probe(
                options.engine,
                &executable,
                &libraries,
                options.inherited_loader_path.as_deref(),
                options.version_timeout,
                cancel,
            )?)
        } else {
            None
        };
        let version = match (&options.version, &probed) {
            (Some(version), _) => version.clone(),
            (None, Some(probed)) => {
                check_version(&probed.version)?;
                probed.version.clone()
            }
            (None, None) => {
                version_from_name(&self.archive).ok_or_else(|| Error::VersionRequired {
                    archive: self.label.clone(),
                })?
            }
        };
        Ok(StagedServer {
            executable,
            libraries,
            probed,
            version,
        })
    }
}

/// `b4500` from a release archive named `llama-b4500-bin-ubuntu-x64.zip`.
fn version_from_name(source: &Source) -> Option<String> {
    let name = source.file_name()?;
    let rest = name.strip_prefix("llama-")?;
    let tag = rest.split('-').next()?;
    let valid =
        tag.len() > 1 && tag.starts_with('b') && tag[1..].bytes().all(|b| b.is_ascii_digit());
    valid.then(|| tag.to_string())
}

/// Refuses a program (or library) another user controls, or a shared library beside
/// it that another user controls ([`arcane_files::trust::check_program`]).
fn trusted_program(program: &Path, library_dirs: &[PathBuf]) -> Result<(), Error> {
    match arcane_files::trust::check_program(program, library_dirs) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(untrusted)) => Err(Error::Untrusted {
            path: untrusted.path.clone(),
            detail: untrusted.describe(),
            fix: untrusted.fix(),
        }),
        Err(source) => Err(Error::io("inspect", program, source)),
    }
}

/// The executable's file name of a kind registered as a server, or
/// [`Error::UnknownEngine`] for a kind that is not (ONNX Runtime is a library, the
/// `command` kind names its own program).
fn server_executable(engine: Engine) -> Result<&'static str, Error> {
    match engine.kind().starts() {
        arcane_workspace::Starts::Server { executable } => Ok(executable),
        _ => Err(Error::UnknownEngine {
            value: engine.to_string(),
        }),
    }
}

fn find_runtime<'a>(runtimes: &'a [Runtime], id: &str) -> Result<&'a Runtime, Error> {
    runtimes
        .iter()
        .find(|r| r.id == id)
        .ok_or_else(|| Error::RuntimeNotFound {
            id: id.to_string(),
            known: runtimes.iter().map(|r| r.id.clone()).collect(),
        })
}

/// The backend a llama.cpp build was made for, from the ggml backend libraries next to
/// it (`libggml-cuda.so`, …); `cpu` when none is found. Ollama chooses its own: `auto`.
fn detect_backend(engine: Engine, library_dirs: &[PathBuf]) -> Backend {
    if engine.kind().device_plan() == arcane_workspace::DevicePlan::EngineChooses {
        return Backend::Auto;
    }
    let names: Vec<String> = library_dirs
        .iter()
        .flat_map(|d| archive::library_names(d))
        .collect();
    let has = |needle: &str| names.iter().any(|n| n.contains(needle));
    if has("ggml-cuda") {
        Backend::Cuda
    } else if has("ggml-vulkan") {
        Backend::Vulkan
    } else if has("ggml-metal") || cfg!(target_os = "macos") {
        Backend::Metal
    } else {
        Backend::Cpu
    }
}

#[cfg(unix)]
fn make_executable(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| Error::io("set permissions of", path, e))
}

#[cfg(not(unix))]
fn make_executable(_path: &Path) -> Result<(), Error> {
    Ok(())
}

/// Copies the companions of the model file `source` (those its `format` carries beside
/// it: a Piper voice's configuration) next to its staged copy `staged`. Anything at a
/// companion's name is copied (and then refused by the reader if it is not a file).
fn stage_companions(
    format: arcane_workspace::ModelFormat,
    source: &Path,
    staged: &Path,
) -> Result<(), Error> {
    let Some(name) = source.file_name().and_then(|n| n.to_str()) else {
        return Ok(());
    };
    let staged_name = staged.file_name().and_then(|n| n.to_str()).unwrap_or(name);
    for (companion, staged_companion) in format
        .companions_of(name)
        .into_iter()
        .zip(format.companions_of(staged_name))
    {
        let from = source.with_file_name(companion);
        if std::fs::symlink_metadata(&from).is_ok() {
            std::fs::copy(&from, staged.with_file_name(staged_companion))
                .map_err(|e| Error::io("copy", &from, e))?;
        }
    }
    Ok(())
}

/// The header of the staged model file, its refusals naming `label` (the source), not
/// the staging file.
fn read_staged_header(staged: &Path, label: &str) -> Result<crate::Header, Error> {
    crate::read_header(staged)
        .map(|(_, header)| header)
        .map_err(|error| match error {
            Error::ModelInvalid { reason, found, .. } => Error::ModelInvalid {
                path: PathBuf::from(label),
                reason,
                found,
            },
            Error::FormatInvalid {
                label: format_label,
                format,
                reason,
                details,
                ..
            } => Error::FormatInvalid {
                path: PathBuf::from(label),
                label: format_label,
                format,
                reason,
                details,
            },
            other => other,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_archive_names_carry_their_tag() {
        let named = |s: &str| version_from_name(&Source::parse(s).unwrap());
        assert_eq!(
            named("https://x/download/b4500/llama-b4500-bin-ubuntu-x64.zip").as_deref(),
            Some("b4500")
        );
        assert_eq!(
            named("/tmp/llama-b12-bin-macos-arm64.tar.gz").as_deref(),
            Some("b12")
        );
        assert_eq!(named("/tmp/llama-server.tar.gz"), None);
        assert_eq!(named("/tmp/ollama-linux-amd64.tgz"), None);
    }
}
