//! `bundle build`: assemble a bundle from an app directory and the workspace registry.
//!
//! Theory of operation:
//!
//! 1. **Validate** every input before any side effect: `--out` must not exist (a
//!    bundle never overwrites an earlier build; its missing parent directories are
//!    created in step 3, and removed again if the build fails) and must not lie inside the app
//!    directory; the app directory holds only regular files and directories whose
//!    relative paths pass the bundle path grammar.
//! 2. **Resolve** runtimes and models from the registry while holding the workspace
//!    operation lock (`bundle-build`). The lock is released before copying: copying
//!    gigabytes must not block other tools, and a model or runtime that changes
//!    afterwards is caught because the copied bytes are hashed and a model's digest
//!    must equal the one the registry recorded.
//! 3. **Assemble** in a fresh temporary sibling `.<out>.partial-<random>` of `--out`:
//!    `bin/arcane` (the running binary), `app/`, `runtimes/<id>/<os>-<arch>-<backend>/`
//!    (the executable and the shared libraries it needs, by `DT_NEEDED` name, symlinks
//!    materialised as regular files, plus the engine's dynamically loaded backend
//!    libraries), `models/<id>/<file>`. Each file is created exclusively, hashed while
//!    it is copied, and fsynced; modes are normalised to 0755/0644.
//! 4. **Write the manifest last**, then rename the directory into place with
//!    `RENAME_NOREPLACE`, so `--out` either does not exist or is complete.
//!
//! A failure or cancellation removes the temporary directory and nothing else; if
//! that removal fails too, [`Error::Cleanup`] reports both with the leftover path.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use arcane_report::{CancelToken, Event, EventSink};
use serde_json::json;

use crate::error::Error;
use crate::hash::Progress;
use crate::manifest::{
    self, AppInfo, Builder, FileEntry, LaunchDefaults, LibraryEntry, Manifest, ModelEntry,
    RuntimeEntry, Target, LAUNCHER_PATH, MANIFEST_NAME,
};
use crate::path::{check_path, check_path_set};

/// The optional app descriptor read from the app directory (`arcane-app.json`):
/// `{"id", "name", "version", "start"}`, every field optional.
pub const APP_DESCRIPTOR: &str = "arcane-app.json";

/// What a `--runtime` names: an engine's runtime, or a kind's runtime library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeKind {
    /// An engine executable (`llama.cpp`, `ollama`).
    Engine(arcane_registry::Engine),
    /// The runtime library of a kind whose sessions run in Arcane's own workers
    /// (`onnx`: ONNX Runtime).
    Library(arcane_registry::Engine),
}

/// `--runtime ENGINE[=ID]`: an engine (or `onnx`) and optionally the registry id of
/// the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeRequest {
    /// The engine, or ONNX Runtime.
    pub kind: RuntimeKind,
    /// The runtime id; `None` takes the default runtime of that kind.
    pub id: Option<String>,
}

impl RuntimeRequest {
    /// Parses `llama.cpp`, `llama.cpp=ID`, `onnx` or `onnx=ID`.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let (engine, id) = match text.split_once('=') {
            Some((engine, id)) => (engine, Some(id.to_string())),
            None => (text, None),
        };
        let parsed: arcane_registry::Engine = engine.parse().map_err(|_| {
            Error::input(
                format!("unknown engine `{engine}` in `--runtime {text}`"),
                json!({"runtime": text}),
            )
        })?;
        let kind = match parsed.kind().runtime_library() {
            Some(_) => RuntimeKind::Library(parsed),
            None => RuntimeKind::Engine(parsed),
        };
        if id.as_deref() == Some("") {
            return Err(Error::input(
                format!("empty runtime id in `--runtime {text}`"),
                json!({"runtime": text}),
            ));
        }
        Ok(Self { kind, id })
    }
}

/// App fields given on the command line; each overrides `arcane-app.json`.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct AppOverrides {
    /// `--app-id`.
    pub id: Option<String>,
    /// `--app-name`.
    pub name: Option<String>,
    /// `--app-version`.
    pub version: Option<String>,
    /// `--app-start` (relative to the app directory).
    pub start: Option<String>,
}

impl AppOverrides {
    /// No overrides.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Everything `bundle build` needs, validated by [`build`] before any side effect.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BuildRequest {
    /// The workspace whose registry provides runtimes and models.
    pub workspace: PathBuf,
    /// The app directory, copied to `app/`.
    pub app_dir: PathBuf,
    /// App identity overrides.
    pub app: AppOverrides,
    /// Runtimes to bundle.
    pub runtimes: Vec<RuntimeRequest>,
    /// Model ids to bundle.
    pub models: Vec<String>,
    /// The output directory; must not exist.
    pub out: PathBuf,
    /// The launcher to copy to `bin/arcane` (the running `arcane` binary).
    pub launcher: PathBuf,
    /// The packaged execution target default, if any.
    pub execution_target: Option<String>,
    /// The builder's version, recorded in the manifest.
    pub builder_version: String,
    /// Sign the manifest with this key (`arcane-bundle.json.minisig`; see [`crate::sign`]).
    pub sign: Option<std::sync::Arc<crate::sign::SecretKey>>,
}

impl BuildRequest {
    /// A request with no overrides and no execution target.
    pub fn new(workspace: PathBuf, app_dir: PathBuf, out: PathBuf, launcher: PathBuf) -> Self {
        Self {
            workspace,
            app_dir,
            app: AppOverrides::default(),
            runtimes: Vec::new(),
            models: Vec::new(),
            out,
            launcher,
            execution_target: None,
            builder_version: env!("CARGO_PKG_VERSION").to_string(),
            sign: None,
        }
    }
}

/// What [`build`] produced.
#[derive(Debug, Clone)]
pub struct BuildOutcome {
    /// The finished bundle directory (`--out`).
    pub root: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// Total bytes of its files.
    pub bytes: u64,
}

/// One file to place in the bundle.
#[derive(Debug, Clone)]
struct Planned {
    destination: String,
    source: PathBuf,
    exec: bool,
}

/// Builds a bundle (see the module docs). Emits `bundle.build.started`,
/// `bundle.build.resolved`, `bundle.build.progress` and `bundle.build.finished`, and
/// the lock's `workspace.operation.*` events.
pub fn build(
    request: &BuildRequest,
    events: &dyn EventSink,
    cancel: &CancelToken,
) -> Result<BuildOutcome, Error> {
    // 1. Validate.
    let output = validate(request)?;
    events.emit(Event::new(
        arcane_report::event_types::BUNDLE_BUILD_STARTED,
        json!({"out": output.out, "app": output.app_dir}),
    ));
    let mut plan: Vec<Planned> = vec![Planned {
        destination: LAUNCHER_PATH.into(),
        source: request.launcher.clone(),
        exec: true,
    }];
    let app = plan_app(&output.app_dir, &request.app, &mut plan)?;

    // 2. Resolve runtimes and models under the workspace lock.
    let Resolved {
        runtimes,
        libraries,
        models,
    } = resolve(request, events, cancel)?;
    let host = Target::host();
    let mut runtime_entries = Vec::new();
    for runtime in &runtimes {
        runtime_entries.push(plan_runtime(runtime, &host, &mut plan)?);
    }
    let mut library_entries: BTreeMap<String, Vec<LibraryEntry>> = BTreeMap::new();
    for (kind, runtime) in &libraries {
        library_entries
            .entry(kind.runtimes_key())
            .or_default()
            .push(plan_library(*kind, runtime, &host, &mut plan)?);
    }
    let model_entries = plan_models(&models, &mut plan)?;
    let sizes = check_plan(&plan)?;
    events.emit(Event::new(
        arcane_report::event_types::BUNDLE_BUILD_RESOLVED,
        json!({"runtimes": runtimes.iter().map(|r| &r.id).chain(libraries.iter().map(|(_, r)| &r.id)).collect::<Vec<_>>(), "models": models.iter().map(|m| &m.id).collect::<Vec<_>>(), "files": plan.len(), "bytes": sizes}),
    ));

    // 3. Assemble in a temporary sibling (creating the missing parents of `--out`).
    let skeleton = Manifest {
        schema_version: manifest::SCHEMA_VERSION,
        kind: manifest::KIND.into(),
        bundle_id: uuid_v4()?,
        builder: Builder {
            name: "arcane".into(),
            version: request.builder_version.clone(),
        },
        app,
        target: host,
        runtimes: runtime_entries,
        models: model_entries,
        libraries: library_entries,
        launch: LaunchDefaults {
            runtime: None,
            model: None,
            execution_target: request.execution_target.clone(),
        },
        files: Vec::new(),
    };
    assemble_into_place(
        &output,
        &plan,
        skeleton,
        sizes,
        request.sign.as_deref(),
        events,
        cancel,
    )
}

/// Where a build goes, once validated.
struct Output {
    /// The bundle's final path (under the physical parent).
    out: PathBuf,
    /// The physical parent of `out`.
    parent: PathBuf,
    /// The last component of `out`.
    out_name: std::ffi::OsString,
    /// The parents of `out` that do not exist yet, outermost first.
    missing_parents: Vec<PathBuf>,
    /// The app directory (canonical).
    app_dir: PathBuf,
}

/// Step 1 of [`build`]: `--out` does not exist, has a parent outside the app
/// directory, and the app directory is a directory.
fn validate(request: &BuildRequest) -> Result<Output, Error> {
    let out =
        std::path::absolute(&request.out).map_err(|e| Error::io("resolve", &request.out, e))?;
    if out.symlink_metadata().is_ok() {
        return Err(Error::OutputExists { path: out });
    }
    let (Some(parent), Some(out_name)) = (out.parent(), out.file_name()) else {
        return Err(Error::input(
            format!("`--out {}` has no parent directory", out.display()),
            json!({"out": out}),
        ));
    };
    let (parent, missing_parents) = physical_parent(&out, parent)?;
    let app_dir = std::fs::canonicalize(&request.app_dir)
        .map_err(|e| Error::io("open app directory", &request.app_dir, e))?;
    if !app_dir.is_dir() {
        return Err(Error::input(
            format!("app directory `{}` is not a directory", app_dir.display()),
            json!({"app": app_dir}),
        ));
    }
    if parent.starts_with(&app_dir) {
        return Err(Error::input(
            format!(
                "`--out {}` lies inside the app directory `{}`",
                out.display(),
                app_dir.display()
            ),
            json!({"out": out, "app": app_dir}),
        ));
    }
    let out_name = out_name.to_os_string();
    Ok(Output {
        out: parent.join(&out_name),
        parent,
        out_name,
        missing_parents,
        app_dir,
    })
}

/// Places every model under `models/<id>/` (a Piper voice with its `.onnx.json`) and
/// returns their manifest entries; a model of a format bundles do not carry (a plain
/// ONNX graph, which the `onnx` service loads by path) is refused by name.
fn plan_models(
    models: &[arcane_registry::Model],
    plan: &mut Vec<Planned>,
) -> Result<Vec<ModelEntry>, Error> {
    let mut model_entries = Vec::new();
    for model in models {
        let carried = model.format().and_then(|format| {
            crate::manifest::model_formats().find(|(carried, _)| *carried == format)
        });
        let Some((format, engine)) = carried else {
            let carried: Vec<&str> = crate::manifest::model_formats()
                .map(|(format, _)| format.label)
                .collect();
            return Err(Error::input(
                format!(
                    "model `{}` is a `{}` model: bundles carry {} models",
                    model.id,
                    model.kind(),
                    carried.join(", ")
                ),
                json!({"model": model.id, "kind": model.kind()}),
            ));
        };
        let file_name = model
            .file_name()
            .filter(|n| check_path(n).is_ok())
            .unwrap_or("model.gguf")
            .to_string();
        let destination = format!("models/{}/{file_name}", model.id);
        plan.push(Planned {
            destination: destination.clone(),
            source: model.path.clone(),
            exec: false,
        });
        for (source, companion) in model
            .companions()
            .into_iter()
            .zip(format.companions_of(&destination))
        {
            plan.push(Planned {
                destination: companion,
                source,
                exec: false,
            });
        }
        model_entries.push(ModelEntry {
            id: model.id.clone(),
            engine: engine.as_str().into(),
            path: destination,
            sha256: model.sha256.clone(),
            format: format.id.into(),
        });
    }
    Ok(model_entries)
}

/// No two planned paths collide; returns the total size of the sources.
fn check_plan(plan: &[Planned]) -> Result<u64, Error> {
    let conflicts = check_path_set(plan.iter().map(|p| p.destination.as_str()));
    if let Some(conflict) = conflicts.first() {
        return Err(Error::input(
            format!(
                "bundle paths `{}` and `{}` collide ({})",
                conflict.path, conflict.other, conflict.reason
            ),
            json!({"path": conflict.path, "other": conflict.other, "reason": conflict.reason}),
        ));
    }
    let mut sizes = 0u64;
    for planned in plan {
        sizes += std::fs::metadata(&planned.source)
            .map_err(|e| Error::io("inspect", &planned.source, e))?
            .len();
    }
    Ok(sizes)
}

/// Step 3 of [`build`]: creates the missing parents and a temporary sibling of `out`,
/// assembles the bundle there and renames it into place. On failure the temporary
/// directory (and the parents this build created) are removed.
fn assemble_into_place(
    output: &Output,
    plan: &[Planned],
    skeleton: Manifest,
    sizes: u64,
    sign: Option<&crate::sign::SecretKey>,
    events: &dyn EventSink,
    cancel: &CancelToken,
) -> Result<BuildOutcome, Error> {
    let out = &output.out;
    let mut created_parents = CreatedDirs::create(&output.missing_parents)?;
    let out_name = output.out_name.to_string_lossy();
    remove_dead_partials(&output.parent, &out_name);
    // Named by this builder's pid and start time, so a later build can prove a partial
    // tree's builder gone (killed mid-way) and remove it.
    let me = std::process::id();
    let temporary = output.parent.join(format!(
        ".{out_name}.partial-{me}-{}-{}",
        arcane_process::start_time(me).unwrap_or(0),
        random_hex(8)?
    ));
    std::fs::create_dir(&temporary).map_err(|e| Error::io("create", &temporary, e))?;
    let mut guard = RemoveOnDrop(Some(temporary.clone()));
    match assemble(&temporary, plan, skeleton, sizes, sign, events, cancel).and_then(|manifest| {
        commit(&temporary, out)?;
        Ok(manifest)
    }) {
        Ok(manifest) => {
            guard.0 = None;
            created_parents.keep();
            let bytes = manifest.files.iter().map(|f| f.size).sum();
            events.emit(Event::new(
                arcane_report::event_types::BUNDLE_BUILD_FINISHED,
                json!({"root": out, "bundleId": manifest.bundle_id, "files": manifest.files.len(), "bytes": bytes}),
            ));
            Ok(BuildOutcome {
                root: out.clone(),
                manifest,
                bytes,
            })
        }
        Err(error) => {
            guard.0 = None;
            match std::fs::remove_dir_all(&temporary) {
                Ok(()) => Err(error),
                Err(source) if source.kind() == std::io::ErrorKind::NotFound => Err(error),
                Err(source) => Err(Error::Cleanup {
                    original: Box::new(error),
                    leftover: temporary,
                    source,
                }),
            }
        }
    }
}

/// The physical path of `--out`'s parent, and the directories on the way to it that do
/// not exist yet (outermost first, physical paths), which the build creates just before
/// assembling. A missing part that is not a plain name (`..`) is refused.
fn physical_parent(out: &Path, parent: &Path) -> Result<(PathBuf, Vec<PathBuf>), Error> {
    let mut missing = Vec::new();
    let mut existing = parent;
    let physical = loop {
        match std::fs::canonicalize(existing) {
            Ok(physical) => break physical,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let (Some(name), Some(up)) = (existing.file_name(), existing.parent()) else {
                    return Err(Error::input(
                        format!(
                            "`--out {}` climbs out of a directory that does not exist",
                            out.display()
                        ),
                        json!({"out": out}),
                    ));
                };
                missing.push(name.to_os_string());
                existing = up;
            }
            Err(error) => return Err(Error::io("open the parent of `--out`", existing, error)),
        }
    };
    let mut dirs = Vec::new();
    let mut path = physical;
    for name in missing.iter().rev() {
        path.push(name);
        dirs.push(path.clone());
    }
    Ok((path, dirs))
}

/// Parent directories of `--out` that this build created; removed again (innermost
/// first, only if still empty) unless [`CreatedDirs::keep`] is called, so a failed or
/// cancelled build leaves only what was there before.
struct CreatedDirs(Vec<PathBuf>);

impl CreatedDirs {
    /// Creates each of `dirs` (outermost first); one that appeared meanwhile is not ours.
    fn create(dirs: &[PathBuf]) -> Result<Self, Error> {
        let mut created = CreatedDirs(Vec::new());
        for dir in dirs {
            match std::fs::create_dir(dir) {
                Ok(()) => created.0.push(dir.clone()),
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(error) => return Err(Error::io("create", dir, error)),
            }
        }
        Ok(created)
    }

    /// Keeps the directories (the build succeeded).
    fn keep(&mut self) {
        self.0.clear();
    }
}

impl Drop for CreatedDirs {
    fn drop(&mut self) {
        for dir in self.0.drain(..).rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Removes a directory on drop (a panic mid-build); disarmed on every normal path.
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

/// What the registry gave for a build.
struct Resolved {
    runtimes: Vec<arcane_registry::Runtime>,
    libraries: Vec<(arcane_registry::Engine, arcane_registry::LibraryRuntime)>,
    models: Vec<arcane_registry::Model>,
}

fn resolve(
    request: &BuildRequest,
    events: &dyn EventSink,
    cancel: &CancelToken,
) -> Result<Resolved, Error> {
    let workspace = &request.workspace;
    let options = arcane_lock::AcquireOptions::new("bundle-build")
        .map_err(|source| Error::Lock {
            workspace: workspace.clone(),
            source: Box::new(source),
        })?
        .wait(std::time::Duration::from_secs(30))
        .cancel(cancel.clone());
    let lock =
        arcane_lock::WorkspaceLock::acquire(workspace, &options, events).map_err(|source| {
            Error::Lock {
                workspace: workspace.clone(),
                source: Box::new(source),
            }
        })?;
    let result = (|| {
        let registry = arcane_registry::Registry::new(workspace);
        let registry_error = |source| Error::Registry {
            workspace: workspace.clone(),
            source: Box::new(source),
        };
        let mut runtimes = Vec::new();
        let mut libraries: Vec<(arcane_registry::Engine, arcane_registry::LibraryRuntime)> =
            Vec::new();
        for wanted in &request.runtimes {
            let engine = match wanted.kind {
                RuntimeKind::Engine(engine) => engine,
                RuntimeKind::Library(kind) => {
                    let runtime = library_runtime(&registry, kind, wanted.id.as_deref())
                        .map_err(registry_error)?;
                    if !libraries.iter().any(|(_, r)| r.id == runtime.id) {
                        libraries.push((kind, runtime));
                    }
                    continue;
                }
            };
            let runtime = match &wanted.id {
                Some(id) => registry.runtime(id),
                None => registry.default_runtime(engine),
            }
            .map_err(registry_error)?;
            if runtime.engine != engine {
                return Err(Error::input(
                    format!(
                        "runtime `{}` is a {} runtime, not {}",
                        runtime.id, runtime.engine, engine
                    ),
                    json!({"runtime": runtime.id, "engine": runtime.engine, "requested": engine}),
                ));
            }
            if !runtimes
                .iter()
                .any(|r: &arcane_registry::Runtime| r.id == runtime.id)
            {
                runtimes.push(runtime);
            }
        }
        let mut models = Vec::new();
        for id in &request.models {
            let model = registry.model(id).map_err(|source| Error::Registry {
                workspace: workspace.clone(),
                source: Box::new(source),
            })?;
            if !models
                .iter()
                .any(|m: &arcane_registry::Model| m.id == model.id)
            {
                models.push(model);
            }
        }
        Ok(Resolved {
            runtimes,
            libraries,
            models,
        })
    })();
    let released = lock
        .release_with_events(events)
        .map_err(|source| Error::Lock {
            workspace: workspace.clone(),
            source: Box::new(source),
        });
    let resolved = result?;
    released?;
    Ok(resolved)
}

/// Reads `arcane-app.json` (optional), applies overrides, and plans `app/**`.
fn plan_app(
    app_dir: &Path,
    overrides: &AppOverrides,
    plan: &mut Vec<Planned>,
) -> Result<AppInfo, Error> {
    let descriptor_path = app_dir.join(APP_DESCRIPTOR);
    let descriptor: serde_json::Map<String, serde_json::Value> =
        match std::fs::read(&descriptor_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                Error::input(
                    format!("`{}` is not a JSON object ({e})", descriptor_path.display()),
                    json!({"path": descriptor_path}),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::Map::new(),
            Err(e) => return Err(Error::io("read", descriptor_path, e)),
        };
    let field = |name: &str| {
        descriptor
            .get(name)
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    let id = overrides
        .id
        .clone()
        .or_else(|| field("id"))
        .ok_or_else(|| Error::InvalidInput {
            message: "the app has no id".into(),
            details: json!({"app": app_dir}),
            hint: Some(format!(
                "pass `--app-id ID` or add `\"id\"` to `{APP_DESCRIPTOR}` in the app directory"
            )),
        })?;
    if !manifest::is_app_id(&id) {
        return Err(Error::input(
            format!("app id `{id}` does not match `[a-z0-9][a-z0-9.-]{{0,63}}`"),
            json!({"id": id}),
        ));
    }
    let mut files = Vec::new();
    collect_app(app_dir, "", &mut files)?;
    files.sort();
    let start = match overrides.start.clone().or_else(|| field("start")) {
        Some(start) => {
            let start = start.trim_start_matches("./").to_string();
            if !files.contains(&start) {
                return Err(Error::input(
                    format!("app start file `{start}` is not a file of the app directory"),
                    json!({"start": start}),
                ));
            }
            Some(format!("app/{start}"))
        }
        None => files
            .iter()
            .any(|f| f == "index.html")
            .then(|| "app/index.html".to_string()),
    };
    for relative in files {
        let source = relative
            .split('/')
            .fold(app_dir.to_path_buf(), |p, s| p.join(s));
        let exec = std::fs::symlink_metadata(&source)
            .map(|m| m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false);
        plan.push(Planned {
            destination: format!("app/{relative}"),
            source,
            exec,
        });
    }
    Ok(AppInfo {
        name: overrides
            .name
            .clone()
            .or_else(|| field("name"))
            .unwrap_or_else(|| id.clone()),
        version: overrides
            .version
            .clone()
            .or_else(|| field("version"))
            .unwrap_or_else(|| "0.0.0".into()),
        id,
        start,
    })
}

fn collect_app(dir: &Path, prefix: &str, files: &mut Vec<String>) -> Result<(), Error> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io("read directory", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("read directory", dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            return Err(Error::input(
                format!("app file name `{}` is not UTF-8", entry.path().display()),
                json!({"path": entry.path()}),
            ));
        };
        let relative = if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}/{name}")
        };
        if let Err(problem) = check_path(&format!("app/{relative}")) {
            return Err(Error::input(
                format!("app path `{relative}` {}", problem.describe()),
                json!({"path": relative, "reason": problem.reason()}),
            ));
        }
        let kind = entry
            .file_type()
            .map_err(|e| Error::io("inspect", entry.path(), e))?;
        if kind.is_dir() {
            collect_app(&entry.path(), &relative, files)?;
        } else if kind.is_file() {
            files.push(relative);
        } else {
            return Err(Error::InvalidInput {
                message: format!("app path `{relative}` is a symlink or special file; bundles hold only regular files"),
                details: json!({"path": relative}),
                hint: Some("replace the symlink with the file it points to".into()),
            });
        }
    }
    Ok(())
}

/// Plans a runtime's directory and returns its manifest entry.
fn plan_runtime(
    runtime: &arcane_registry::Runtime,
    host: &Target,
    plan: &mut Vec<Planned>,
) -> Result<RuntimeEntry, Error> {
    if !manifest::is_segment_id(&runtime.id) {
        return Err(Error::input(
            format!("runtime id `{}` cannot name a bundle directory", runtime.id),
            json!({"runtime": runtime.id}),
        ));
    }
    let backend = runtime.backend.to_string();
    let dir = format!(
        "runtimes/{}/{}-{}-{backend}",
        runtime.id, host.os, host.arch
    );
    let named = match runtime.engine.kind().starts() {
        arcane_workspace::Starts::Server { executable } => executable,
        _ => "server",
    };
    let executable_name = runtime
        .executable
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(named)
        .to_string();
    let executable = format!("{dir}/{executable_name}");
    plan.push(Planned {
        destination: executable.clone(),
        source: runtime.executable.clone(),
        exec: true,
    });

    let mut search: Vec<PathBuf> = Vec::new();
    if let Some(parent) = runtime.executable.parent() {
        search.push(parent.to_path_buf());
    }
    for dir in &runtime.library_dirs {
        if !search.contains(dir) {
            search.push(dir.clone());
        }
    }
    // ggml's backends (`libggml-*`) are loaded at run time, not named in `DT_NEEDED`.
    let libraries = needed_libraries(&runtime.executable, &search, "libggml")?;
    for (name, source) in libraries {
        if name == executable_name {
            continue;
        }
        let exec = std::fs::metadata(&source)
            .map(|m| m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false);
        plan.push(Planned {
            destination: format!("{dir}/{name}"),
            source,
            exec,
        });
    }
    Ok(RuntimeEntry {
        id: runtime.id.clone(),
        engine: runtime.engine.to_string(),
        version: runtime.version.clone(),
        backend,
        executable,
        library_dirs: vec![dir],
    })
}

/// The shared libraries `binary` needs, by the names the loader asks for (its
/// `DT_NEEDED` closure, found in `search`; system libraries elsewhere are not
/// bundled), plus the libraries in `search` whose names start with `dynamic` (loaded
/// at run time, so named nowhere; regular files only, never an alias symlink). When a
/// binary cannot be parsed, every library in `search` is taken. Name → source.
fn needed_libraries(
    binary: &Path,
    search: &[PathBuf],
    dynamic: &str,
) -> Result<BTreeMap<String, PathBuf>, Error> {
    // name → source, for every library the bundle will hold.
    let mut libraries: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut resolved_targets: HashSet<PathBuf> = HashSet::new();
    let mut queue = vec![binary.to_path_buf()];
    let mut parsed_all = true;
    while let Some(binary) = queue.pop() {
        let bytes = std::fs::read(&binary).map_err(|e| Error::io("read", &binary, e))?;
        let Some(needed) = crate::elf::needed_libraries(&bytes) else {
            parsed_all = false;
            continue;
        };
        for name in needed {
            if libraries.contains_key(&name) || check_path(&name).is_err() || name.contains('/') {
                continue;
            }
            let Some(found) = search.iter().map(|d| d.join(&name)).find(|p| p.is_file()) else {
                continue; // A system library (libc, libstdc++, libgomp): not bundled.
            };
            if let Ok(target) = std::fs::canonicalize(&found) {
                resolved_targets.insert(target);
            }
            libraries.insert(name, found.clone());
            queue.push(found);
        }
    }
    // Libraries loaded at run time are regular files beside the binary or in a
    // library directory; symlinks that nothing needs are aliases, and other tools'
    // libraries (`libllama-bench-impl.so`) are not the binary's.
    for dir in search {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if !is_shared_library(&name)
                || libraries.contains_key(&name)
                || check_path(&name).is_err()
            {
                continue;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let is_alias = kind.is_symlink();
            let real = std::fs::canonicalize(entry.path()).unwrap_or_else(|_| entry.path());
            // With the `DT_NEEDED` closure known, only the dynamically loaded ones are
            // added; without it, every library is.
            let wanted = !parsed_all || (!is_alias && name.starts_with(dynamic));
            if !wanted || !real.is_file() || resolved_targets.contains(&real) {
                continue;
            }
            libraries.insert(name, entry.path());
        }
    }
    Ok(libraries)
}

/// Places a runtime library of `kind` under `runtimes/<id>/<os>-<arch>/`: the library,
/// the libraries it needs from its own directory, and the plugins it loads at run time
/// from beside it (ONNX Runtime's execution providers, `libonnxruntime_providers_*`).
fn plan_library(
    kind: arcane_registry::Engine,
    runtime: &arcane_registry::LibraryRuntime,
    host: &Target,
    plan: &mut Vec<Planned>,
) -> Result<LibraryEntry, Error> {
    if !manifest::is_segment_id(&runtime.id) {
        return Err(Error::input(
            format!("runtime id `{}` cannot name a bundle directory", runtime.id),
            json!({"runtime": runtime.id}),
        ));
    }
    let dir = format!("runtimes/{}/{}-{}", runtime.id, host.os, host.arch);
    let Some(described) = kind.kind().runtime_library() else {
        return Err(Error::input(
            format!("`{kind}` has no runtime library to bundle"),
            json!({"runtime": runtime.id, "engine": kind}),
        ));
    };
    let name = runtime
        .library
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| check_path(n).is_ok())
        .unwrap_or(described.file)
        .to_string();
    let library = format!("{dir}/{name}");
    plan.push(Planned {
        destination: library.clone(),
        source: runtime.library.clone(),
        exec: false,
    });
    let search: Vec<PathBuf> = runtime
        .library
        .parent()
        .map(Path::to_path_buf)
        .into_iter()
        .collect();
    for (needed, source) in needed_libraries(&runtime.library, &search, described.plugins)? {
        if needed != name {
            plan.push(Planned {
                destination: format!("{dir}/{needed}"),
                source,
                exec: false,
            });
        }
    }
    Ok(LibraryEntry {
        id: runtime.id.clone(),
        version: runtime.version.clone(),
        library,
    })
}

/// The library runtime of `kind` that `id` names, or its default one.
fn library_runtime(
    registry: &arcane_registry::Registry,
    kind: arcane_registry::Engine,
    id: Option<&str>,
) -> Result<arcane_registry::LibraryRuntime, arcane_registry::Error> {
    let runtimes = registry.library_runtimes(kind)?;
    let found = match id {
        Some(id) => runtimes.iter().find(|r| r.id == id).cloned(),
        None => registry.default_library_runtime(kind)?,
    };
    found.ok_or_else(|| arcane_registry::Error::RuntimeNotFound {
        id: id.unwrap_or(kind.as_str()).to_string(),
        known: runtimes.iter().map(|r| r.id.clone()).collect(),
    })
}

fn is_shared_library(name: &str) -> bool {
    name.ends_with(".so")
        || name.contains(".so.")
        || name.ends_with(".dylib")
        || name.ends_with(".dll")
}

/// Copies every planned file into `root`, hashing as it goes, then writes the manifest.
fn assemble(
    root: &Path,
    plan: &[Planned],
    mut manifest: Manifest,
    total: u64,
    sign: Option<&crate::sign::SecretKey>,
    events: &dyn EventSink,
    cancel: &CancelToken,
) -> Result<Manifest, Error> {
    let progress = Progress::new(
        arcane_report::event_types::BUNDLE_BUILD_PROGRESS,
        events,
        plan.len() as u64,
        total,
    );
    let mut files = Vec::with_capacity(plan.len());
    let mut buffer = vec![0u8; arcane_files::CHUNK];
    let mut created_dirs: HashSet<PathBuf> = HashSet::new();
    for planned in plan {
        let destination = planned
            .destination
            .split('/')
            .fold(root.to_path_buf(), |p, s| p.join(s));
        if let Some(parent) = destination.parent() {
            if created_dirs.insert(parent.to_path_buf()) {
                std::fs::create_dir_all(parent).map_err(|e| Error::io("create", parent, e))?;
            }
        }
        let (size, sha256) = copy_hashing(
            &planned.source,
            &destination,
            planned.exec,
            &mut buffer,
            &progress,
            cancel,
        )?;
        progress.file_done();
        files.push(FileEntry {
            path: planned.destination.clone(),
            size,
            sha256,
            exec: planned.exec,
        });
    }
    progress.finish();
    files.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    for model in &manifest.models {
        let Some(entry) = files.iter().find(|f| f.path == model.path) else {
            continue;
        };
        if entry.sha256 != model.sha256 {
            return Err(Error::input(
                format!("model `{}` changed since it was registered: its SHA-256 is `{}`, the registry recorded `{}`", model.id, entry.sha256, model.sha256),
                json!({"model": model.id, "expected": model.sha256, "actual": entry.sha256}),
            ));
        }
    }
    manifest.files = files;
    let failures = manifest.check();
    if !failures.is_empty() {
        return Err(Error::Integrity {
            root: root.to_path_buf(),
            failures,
        });
    }
    let manifest_path = root.join(MANIFEST_NAME);
    let manifest_bytes = manifest.to_bytes();
    arcane_files::write_atomic(&manifest_path, &manifest_bytes, 0o644)
        .map_err(|e| Error::io("write", &manifest_path, e))?;
    if let Some(key) = sign {
        // The trusted comment is signed too: it says what was signed, and when.
        let comment = format!(
            "arcane bundle {} {}@{} signed {}",
            manifest.bundle_id,
            manifest.app.id,
            manifest.app.version,
            arcane_report::time::now_rfc3339()
        );
        let path = root.join(crate::sign::SIGNATURE_NAME);
        arcane_files::write_atomic(&path, key.sign(&manifest_bytes, &comment).as_bytes(), 0o644)
            .map_err(|e| Error::io("write", &path, e))?;
    }
    sync_tree_dirs(root)?;
    Ok(manifest)
}

fn copy_hashing(
    source: &Path,
    destination: &Path,
    exec: bool,
    buffer: &mut [u8],
    progress: &Progress<'_>,
    cancel: &CancelToken,
) -> Result<(u64, String), Error> {
    // Never blocks (a FIFO is refused by name), and remembers what the file was so a
    // change during the copy is caught.
    let mut input = arcane_files::open_regular(source).map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidInput {
            Error::input(
                format!("`{}` {e}", source.display()),
                json!({"path": source}),
            )
        } else {
            Error::io("open", source, e)
        }
    })?;
    let before = input
        .metadata()
        .map_err(|e| Error::io("inspect", source, e))?;
    let mode = if exec { 0o755 } else { 0o644 };
    let mut output = File::options()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(destination)
        .map_err(|e| Error::io("create", destination, e))?;
    let streamed = arcane_files::stream_sha256(
        &mut input,
        buffer,
        arcane_files::Stream {
            copy_to: Some(&mut output),
            limit: None,
            stop: &|| cancel.is_cancelled(),
            on_chunk: &mut |n| progress.add_bytes(n),
        },
    )
    .map_err(|e| match e {
        arcane_files::StreamError::Stopped => Error::Cancelled {
            operation: "bundle build",
        },
        arcane_files::StreamError::Read(e) => Error::io("read", source, e),
        arcane_files::StreamError::Write(e) => Error::io("write", destination, e),
    })?;
    unchanged_during_copy(source, &input, &before, streamed.bytes)?;
    // The umask may have cleared bits; set the normalised mode explicitly.
    output
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io("chmod", destination, e))?;
    output
        .sync_all()
        .map_err(|e| Error::io("fsync", destination, e))?;
    Ok((streamed.bytes, streamed.sha256))
}

/// Fails when the file copied from `source` was replaced, grew, shrank or was rewritten
/// (another inode at the path, another size or modification time) while it was read:
/// its copy and digest would be of neither version.
fn unchanged_during_copy(
    source: &Path,
    input: &File,
    before: &std::fs::Metadata,
    copied: u64,
) -> Result<(), Error> {
    use std::os::unix::fs::MetadataExt;
    let after = input
        .metadata()
        .map_err(|e| Error::io("inspect", source, e))?;
    let at_path = std::fs::metadata(source).ok();
    let same = |a: &std::fs::Metadata, b: &std::fs::Metadata| {
        (a.dev(), a.ino(), a.len(), a.mtime(), a.mtime_nsec())
            == (b.dev(), b.ino(), b.len(), b.mtime(), b.mtime_nsec())
    };
    if same(before, &after) && copied == before.len() && at_path.is_some_and(|p| same(before, &p)) {
        return Ok(());
    }
    Err(Error::InvalidInput {
        message: format!(
            "`{}` changed while it was being copied; nothing was built",
            source.display()
        ),
        details: json!({"path": source, "reason": "changed"}),
        hint: Some("let whatever writes it finish, then build again".into()),
    })
}

/// fsyncs every directory of the tree, so the renamed bundle is durable.
fn sync_tree_dirs(dir: &Path) -> Result<(), Error> {
    for entry in std::fs::read_dir(dir)
        .map_err(|e| Error::io("read directory", dir, e))?
        .flatten()
    {
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            sync_tree_dirs(&entry.path())?;
        }
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| Error::io("chmod", dir, e))?;
    arcane_files::sync_dir(dir).map_err(|e| Error::io("fsync", dir, e))
}

/// Renames `temporary` to `out` without ever replacing an existing `out`.
fn commit(temporary: &Path, out: &Path) -> Result<(), Error> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        let result = rustix::fs::renameat_with(
            rustix::fs::CWD,
            temporary,
            rustix::fs::CWD,
            out,
            rustix::fs::RenameFlags::NOREPLACE,
        );
        match result {
            Ok(()) => {}
            Err(rustix::io::Errno::EXIST) | Err(rustix::io::Errno::NOTEMPTY) => {
                return Err(Error::OutputExists {
                    path: out.to_path_buf(),
                })
            }
            Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOSYS) => {
                rename_checked(temporary, out)?
            }
            Err(error) => return Err(Error::io("rename into place", out, error.into())),
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    rename_checked(temporary, out)?;
    if let Some(parent) = out.parent() {
        arcane_files::sync_dir(parent).map_err(|e| Error::io("fsync", parent, e))?;
    }
    Ok(())
}

/// A best-effort no-replace rename for file systems without `RENAME_NOREPLACE`.
// Moving the finished bundle tree into place is a directory rename, which
// `arcane_files::write_atomic` (files only) cannot do; clippy.toml fences it elsewhere.
#[allow(clippy::disallowed_methods)]
fn rename_checked(temporary: &Path, out: &Path) -> Result<(), Error> {
    if out.symlink_metadata().is_ok() {
        return Err(Error::OutputExists {
            path: out.to_path_buf(),
        });
    }
    std::fs::rename(temporary, out).map_err(|e| Error::io("rename into place", out, e))
}

/// `bytes` random bytes as hex (a temporary name's suffix).
/// Removes the partial trees `.<out>.partial-<pid>-<start>-<random>` that a build of
/// the same `out` left when it was killed: only directories of this user whose
/// builder is provably gone (no process with that pid and start time). Anything else
/// (a live build, a name of another form, a link) is left alone.
fn remove_dead_partials(parent: &Path, out_name: &str) {
    use std::os::unix::fs::MetadataExt;
    let prefix = format!(".{out_name}.partial-");
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let mut fields = rest.splitn(3, '-');
        let (Some(pid), Some(start), Some(_)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
            continue;
        };
        let alive = arcane_process::start_time(pid) == Some(start);
        let path = entry.path();
        let ours = std::fs::symlink_metadata(&path)
            .is_ok_and(|m| m.is_dir() && m.uid() == arcane_files::trust::current_uid());
        if !alive && ours {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

fn random_hex(bytes: usize) -> Result<String, Error> {
    arcane_files::secret_hex(bytes)
        .map_err(|e| Error::io("read random bytes for", Path::new("a temporary name"), e))
}

/// A random (version 4) UUID: the bundle id.
fn uuid_v4() -> Result<String, Error> {
    arcane_files::uuid_v4()
        .map_err(|e| Error::io("read random bytes for", Path::new("the bundle id"), e))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_source_that_changes_while_it_is_copied_fails_the_build() {
        use std::io::Write;
        use std::os::unix::fs::FileExt;
        // Issue 14, item 4 (bundle builds): a file rewritten, grown or replaced during
        // the copy must not be recorded with a digest of neither version.
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("model.gguf");
        std::fs::write(&source, vec![1u8; 4096]).unwrap();
        let input = File::open(&source).unwrap();
        let before = input.metadata().unwrap();
        assert!(unchanged_during_copy(&source, &input, &before, 4096).is_ok());
        // Copied fewer bytes than it had: it shrank or the read was short.
        assert!(unchanged_during_copy(&source, &input, &before, 100).is_err());
        // Rewritten in place at the same length: only the modification time tells
        // (set explicitly, so the test does not depend on the clock's resolution).
        let writer = std::fs::OpenOptions::new()
            .write(true)
            .open(&source)
            .unwrap();
        writer.write_all_at(&[2u8; 4], 0).unwrap();
        writer
            .set_modified(before.modified().unwrap() + std::time::Duration::from_secs(1))
            .unwrap();
        let error = unchanged_during_copy(&source, &input, &before, 4096).unwrap_err();
        assert!(error
            .to_string()
            .contains("changed while it was being copied"));
        // Grown by an append.
        let input = File::open(&source).unwrap();
        let before = input.metadata().unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&source)
            .unwrap()
            .write_all(b"more")
            .unwrap();
        let error = unchanged_during_copy(&source, &input, &before, 4096).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("changed while it was being copied"),
            "{error}"
        );
        // Replaced by another file at the path.
        let input = File::open(&source).unwrap();
        let before = input.metadata().unwrap();
        std::fs::remove_file(&source).unwrap();
        std::fs::write(&source, vec![1u8; 4100]).unwrap();
        assert!(unchanged_during_copy(&source, &input, &before, 4100).is_err());
    }

    use super::*;

    #[test]
    fn uuids_are_well_formed_and_distinct() {
        let (a, b) = (uuid_v4().unwrap(), uuid_v4().unwrap());
        assert!(manifest::is_uuid(&a), "{a}");
        assert_ne!(a, b);
        assert_eq!(&a[14..15], "4");
    }

    #[test]
    fn runtime_requests_parse() {
        let plain = RuntimeRequest::parse("llama.cpp").unwrap();
        assert_eq!(
            plain.kind,
            RuntimeKind::Engine(arcane_registry::Engine::LlamaCpp)
        );
        assert_eq!(
            RuntimeRequest::parse("onnx").unwrap().kind,
            RuntimeKind::Library(arcane_registry::Engine::Onnx)
        );
        assert_eq!(plain.id, None);
        let named = RuntimeRequest::parse("llama.cpp=llama.cpp-b1").unwrap();
        assert_eq!(named.id.as_deref(), Some("llama.cpp-b1"));
        assert!(RuntimeRequest::parse("vllm").is_err());
        assert!(RuntimeRequest::parse("llama.cpp=").is_err());
    }

    #[test]
    fn shared_library_names() {
        for yes in [
            "libllama.so",
            "libllama.so.0",
            "libllama.so.0.6.0",
            "x.dylib",
            "x.dll",
        ] {
            assert!(is_shared_library(yes), "{yes}");
        }
        for no in ["llama-server", "libfoo.a", "README.md"] {
            assert!(!is_shared_library(no), "{no}");
        }
    }
}
