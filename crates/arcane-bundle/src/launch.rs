//! Launching a bundle: where it is, where its state goes, what it runs.
//!
//! The launcher is `<bundle>/bin/arcane`; the bundle root is found from the launcher's
//! own location ([`bundle_root_from_launcher`]), never from the working directory or
//! the environment, so a moved or renamed bundle launches the same way.
//!
//! **Launch context** ([`resolve_context`]), lowest precedence first (packaging-spec
//! §2.2, §4.4): the manifest's `launch` defaults and the per-OS default state root,
//! then `--state-root`, then the launch file. The per-OS default state root is
//! Linux `$XDG_DATA_HOME/Arcane/<appId>` when `XDG_DATA_HOME` is absolute, else
//! `~/.local/share/Arcane/<appId>`; macOS `~/Library/Application Support/Arcane/<appId>`;
//! Windows `%LOCALAPPDATA%\Arcane\<appId>`.
//!
//! **Launch file** (`--launch-config FILE`): a JSON object whose keys may set state and
//! listener options only — `stateRoot` (relative paths resolve against the file's
//! directory), `port` (the Core host's loopback port), `executionTarget` and
//! `trustedKey` (a public key file, relative to the file's directory: the bundle must
//! carry that key's signature, see [`crate::sign`]). Keys that
//! would redirect bundle-owned paths (`appRoot`, `bundleRoot`, `runtimes`, `runtime`,
//! `models`, `model`, `executable`, `libraryDirs`, …) are refused with `ARCANE_USAGE`
//! naming the key, unlike the SDK, which let a launch file override them; unknown keys
//! are refused too, so a typo is never silently ignored.
//!
//! **App entry** ([`resolve_app_entry`]): `--arcane-app-entry REL` names a file under
//! `app/`. `REL` must pass the bundle path grammar (no absolute path, no `..`, no
//! backslash, …) — `BUNDLE_PATH_INVALID` otherwise — and `app/REL` must be listed in
//! the verified manifest with `exec: true` — `ARCANE_USAGE` otherwise.
//! [`open_app_entry`] then opens it as verified ([`crate::pinned`]), for launch to run
//! through its descriptor.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::error::Error;
use crate::manifest::{LAUNCHER_PATH, MANIFEST_NAME};
use crate::path::check_path;
use crate::pinned::PinnedFile;
use crate::verify::VerifiedBundle;

/// Launch-file keys that would redirect a bundle-owned path.
pub const BUNDLE_OWNED_KEYS: &[&str] = &[
    "appRoot",
    "bundleRoot",
    "webRoot",
    "runtimes",
    "runtime",
    "localAIRuntimes",
    "models",
    "model",
    "modelPath",
    "modelsDirectory",
    "executable",
    "libraryDirs",
    "app",
    "files",
];

/// Launch-file keys that are allowed.
pub const ALLOWED_KEYS: &[&str] = &["stateRoot", "port", "executionTarget", "trustedKey"];

/// Per-user directories the CLI read from the environment (libraries never do).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct HostDirs {
    /// `$HOME`.
    pub home: Option<PathBuf>,
    /// `$XDG_DATA_HOME` (used only when absolute).
    pub xdg_data_home: Option<PathBuf>,
    /// `%LOCALAPPDATA%`.
    pub local_app_data: Option<PathBuf>,
}

impl HostDirs {
    /// Directories as given.
    pub fn new(
        home: Option<PathBuf>,
        xdg_data_home: Option<PathBuf>,
        local_app_data: Option<PathBuf>,
    ) -> Self {
        Self {
            home,
            xdg_data_home,
            local_app_data,
        }
    }
}

/// The bundle root for a launcher at `launcher` (`<root>/bin/arcane`): the launcher's
/// directory must be `bin` and the root must hold `arcane-bundle.json`.
pub fn bundle_root_from_launcher(launcher: &Path) -> Result<PathBuf, Error> {
    let launcher = std::fs::canonicalize(launcher)
        .map_err(|e| Error::io("resolve the launcher", launcher, e))?;
    let root = launcher
        .parent()
        .filter(|bin| bin.file_name().is_some_and(|n| n == "bin"))
        .and_then(Path::parent)
        .filter(|root| root.join(MANIFEST_NAME).symlink_metadata().is_ok());
    root.map(Path::to_path_buf).ok_or_else(|| {
        Error::usage(
            format!("`{}` is not a bundle's launcher: `arcane launch` runs as `<bundle>/{LAUNCHER_PATH}` next to `<bundle>/{MANIFEST_NAME}`", launcher.display()),
            json!({"launcher": launcher}),
        )
    })
}

/// The per-OS default state root for `app_id` (see the module docs).
pub fn default_state_root(os: &str, app_id: &str, dirs: &HostDirs) -> Result<PathBuf, Error> {
    let missing = |what: &str| {
        Error::usage(
            format!("no default state root: {what} is not set; pass `--state-root DIR`"),
            json!({"os": os, "appId": app_id}),
        )
    };
    let base = match os {
        "windows" => dirs
            .local_app_data
            .clone()
            .ok_or_else(|| missing("`LOCALAPPDATA`"))?,
        "macos" => dirs
            .home
            .clone()
            .ok_or_else(|| missing("`HOME`"))?
            .join("Library")
            .join("Application Support"),
        _ => match dirs.xdg_data_home.clone().filter(|p| p.is_absolute()) {
            Some(xdg) => xdg,
            None => dirs
                .home
                .clone()
                .ok_or_else(|| missing("`HOME`"))?
                .join(".local")
                .join("share"),
        },
    };
    Ok(base.join("Arcane").join(app_id))
}

/// The resolved runtime a launch starts (absolute paths inside the bundle).
#[derive(Debug, Clone)]
pub struct LaunchRuntime {
    /// The runtime's id.
    pub id: String,
    /// Its engine (`llama.cpp`).
    pub engine: String,
    /// Its backend (`cpu`, …).
    pub backend: String,
    /// The executable.
    pub executable: PathBuf,
    /// Its library directories.
    pub library_dirs: Vec<PathBuf>,
}

/// The resolved model a launch loads.
#[derive(Debug, Clone)]
pub struct LaunchModel {
    /// The model's id.
    pub id: String,
    /// The model file.
    pub path: PathBuf,
    /// The engine kind that serves it (`llama.cpp`, `whisper.cpp`, `piper`).
    pub engine: String,
}

/// Everything a launch needs, resolved from the verified bundle and the layers.
#[derive(Debug, Clone)]
pub struct LaunchContext {
    /// The verified bundle.
    pub bundle: VerifiedBundle,
    /// Where all mutable state goes (the Core host's workspace).
    pub state_root: PathBuf,
    /// The Core host's loopback port, if pinned by the launch file.
    pub port: Option<u16>,
    /// The execution target (launch file, else the manifest's default).
    pub execution_target: Option<String>,
    /// The runtime to start, if the bundle has one.
    pub runtime: Option<LaunchRuntime>,
    /// The model to load, if the bundle has one.
    pub model: Option<LaunchModel>,
    /// Every model of the bundle, the launch model first: all are served, each by its
    /// engine kind (a chat model, a speech-to-text model, a voice).
    pub models: Vec<LaunchModel>,
    /// The bundled runtime library of each kind whose sessions run in Arcane's own
    /// workers (the first of each kind's: ONNX Runtime for `onnx`).
    pub libraries: Vec<(arcane_workspace::Engine, PathBuf)>,
}

impl LaunchContext {
    /// The Core host's endpoint file under the state root: `<state-root>/.arcane/core.json`.
    pub fn endpoint_file(&self) -> PathBuf {
        arcane_workspace::layout::core_endpoint(&self.state_root)
    }

    /// A JSON summary (for `--output json` and logs).
    pub fn summary(&self) -> Value {
        let mut summary = json!({
            "bundle": self.bundle.root,
            "bundleId": self.bundle.manifest.bundle_id,
            "app": self.bundle.manifest.app.id,
            "stateRoot": self.state_root,
            "endpointFile": self.endpoint_file(),
            "port": self.port,
            "executionTarget": self.execution_target,
            "runtime": self.runtime.as_ref().map(|r| json!({"id": r.id, "executable": r.executable, "libraryDirs": r.library_dirs, "backend": r.backend})),
            "model": self.model.as_ref().map(|m| json!({"id": m.id, "path": m.path})),
        });
        // Each kind's library under `<kind>Library` (`onnxLibrary`).
        for (kind, library) in &self.libraries {
            summary[format!("{kind}Library")] = json!(library);
        }
        summary
    }
}

/// Resolves the launch context of a verified bundle (see the module docs for the
/// layering). Reads the launch file, if any; writes nothing.
pub fn resolve_context(
    bundle: VerifiedBundle,
    state_root: Option<&Path>,
    launch_file: Option<&Path>,
    dirs: &HostDirs,
) -> Result<LaunchContext, Error> {
    let manifest = &bundle.manifest;
    let mut root = match state_root {
        Some(dir) => absolute(dir)?,
        None => default_state_root(&manifest.target.os, &manifest.app.id, dirs)?,
    };
    let mut port = None;
    let mut execution_target = manifest.launch.execution_target.clone();
    if let Some(file) = launch_file {
        let layer = read_launch_file(file)?;
        if let Some(dir) = layer.state_root {
            root = dir;
        }
        port = layer.port.or(port);
        execution_target = layer.execution_target.or(execution_target);
    }
    // By identity, not by spelling: `../dist/good/app`, `good/.` and a link to the bundle
    // are all inside it.
    let inside = arcane_files::physically_inside(&root, &bundle.root)
        .map_err(|e| Error::io("resolve the state root", &root, e))?;
    if inside {
        return Err(Error::usage(
            format!(
                "state root `{}` lies inside the bundle `{}`; bundles are read-only",
                root.display(),
                bundle.root.display()
            ),
            json!({"stateRoot": root, "bundle": bundle.root}),
        ));
    }
    let runtime = manifest.launch_runtime().map(|r| LaunchRuntime {
        id: r.id.clone(),
        engine: r.engine.clone(),
        backend: r.backend.clone(),
        executable: bundle.resolve(&r.executable),
        library_dirs: r.library_dirs.iter().map(|d| bundle.resolve(d)).collect(),
    });
    let resolve = |m: &crate::manifest::ModelEntry| LaunchModel {
        id: m.id.clone(),
        path: bundle.resolve(&m.path),
        engine: m.engine.clone(),
    };
    let model = manifest.launch_model().map(resolve);
    let models: Vec<LaunchModel> = model
        .iter()
        .cloned()
        .chain(
            manifest
                .models
                .iter()
                .filter(|m| model.as_ref().is_none_or(|first| first.id != m.id))
                .map(resolve),
        )
        .collect();
    let libraries = manifest
        .launch_libraries()
        .into_iter()
        .map(|(kind, r)| (kind, bundle.resolve(&r.library)))
        .collect();
    Ok(LaunchContext {
        bundle,
        state_root: root,
        port,
        execution_target,
        runtime,
        model,
        models,
        libraries,
    })
}

/// What a launch file may set.
#[derive(Debug, Default)]
struct LaunchLayer {
    state_root: Option<PathBuf>,
    port: Option<u16>,
    execution_target: Option<String>,
    trusted_key: Option<PathBuf>,
}

/// The public key file a launch file names as `trustedKey` (relative paths resolve
/// against the file's directory): a bundle launched with it must carry that key's
/// signature. `None` when the file sets none.
pub fn launch_file_trusted_key(file: &Path) -> Result<Option<PathBuf>, Error> {
    Ok(read_launch_file(file)?.trusted_key)
}

fn read_launch_file(file: &Path) -> Result<LaunchLayer, Error> {
    let bytes = arcane_files::read_regular(file, 1 << 20)
        .map_err(|e| Error::io("read launch file", file, e))?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| {
        Error::usage(
            format!("launch file `{}` is not valid JSON ({e})", file.display()),
            json!({"launchConfig": file}),
        )
    })?;
    let Value::Object(object) = value else {
        return Err(Error::usage(
            format!("launch file `{}` must hold a JSON object", file.display()),
            json!({"launchConfig": file, "found": kind(&value)}),
        ));
    };
    let mut layer = LaunchLayer::default();
    let mut keys: Vec<&String> = object.keys().collect();
    keys.sort();
    for key in keys {
        let value = &object[key];
        if BUNDLE_OWNED_KEYS.contains(&key.as_str()) {
            return Err(Error::usage(
                format!("launch file key `{key}` is refused: a launch file may set state and listener options, not redirect bundle-owned paths"),
                json!({"launchConfig": file, "key": key, "allowed": ALLOWED_KEYS}),
            ));
        }
        let wrong = |expected: &str| {
            Error::usage(
                format!("launch file key `{key}` must be {expected}"),
                json!({"launchConfig": file, "key": key, "value": value}),
            )
        };
        match key.as_str() {
            "stateRoot" => {
                let text = value
                    .as_str()
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| wrong("a non-empty string"))?;
                let path = PathBuf::from(text);
                let base = file.parent().unwrap_or(Path::new("."));
                layer.state_root = Some(absolute(&if path.is_absolute() {
                    path
                } else {
                    base.join(path)
                })?);
            }
            "port" => {
                layer.port = Some(
                    value
                        .as_u64()
                        .and_then(|p| u16::try_from(p).ok())
                        .filter(|p| *p > 0)
                        .ok_or_else(|| wrong("a port number (1-65535)"))?,
                )
            }
            "executionTarget" => {
                layer.execution_target = Some(
                    value
                        .as_str()
                        .filter(|t| !t.is_empty())
                        .ok_or_else(|| wrong("a non-empty string"))?
                        .to_string(),
                )
            }
            "trustedKey" => {
                let text = value
                    .as_str()
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| wrong("a non-empty string (a public key file)"))?;
                let path = PathBuf::from(text);
                let base = file.parent().unwrap_or(Path::new("."));
                layer.trusted_key = Some(absolute(&if path.is_absolute() {
                    path
                } else {
                    base.join(path)
                })?);
            }
            _ => {
                return Err(Error::usage(
                    format!("launch file key `{key}` is unknown"),
                    json!({"launchConfig": file, "key": key, "allowed": ALLOWED_KEYS}),
                ))
            }
        }
    }
    Ok(layer)
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn absolute(path: &Path) -> Result<PathBuf, Error> {
    std::path::absolute(path).map_err(|e| Error::io("resolve", path, e))
}

/// Resolves `--arcane-app-entry REL` to the absolute path of `app/REL`, which must be
/// a listed executable file of the verified bundle (see the module docs).
pub fn resolve_app_entry(bundle: &VerifiedBundle, entry: &str) -> Result<PathBuf, Error> {
    if entry.is_empty() {
        return Err(Error::usage(
            "`--arcane-app-entry` needs an app-relative path",
            json!({"entry": entry}),
        ));
    }
    let relative = entry.strip_prefix("./").unwrap_or(entry);
    if let Err(problem) = check_path(relative) {
        return Err(Error::AppEntryEscapes {
            entry: entry.to_string(),
            reason: problem.describe(),
        });
    }
    let listed = format!("app/{relative}");
    match bundle.manifest.file(&listed) {
        Some(file) if file.exec => Ok(bundle.resolve(&listed)),
        Some(_) => Err(Error::usage(
            format!("app entry `{listed}` is not listed as executable"),
            json!({"entry": entry, "path": listed}),
        )),
        None => Err(Error::usage(
            format!("app entry `{listed}` is not a file of the bundle"),
            json!({"entry": entry, "path": listed}),
        )),
    }
}

/// [`resolve_app_entry`], then `app/REL` opened, checked to be the file verification
/// saw, and hashed again from the open descriptor: the program to execute through
/// [`PinnedFile::exec_path`], so a file swapped after verification never runs (see
/// [`crate::pinned`]).
pub fn open_app_entry(bundle: &VerifiedBundle, entry: &str) -> Result<PinnedFile, Error> {
    resolve_app_entry(bundle, entry)?;
    let relative = entry.strip_prefix("./").unwrap_or(entry);
    bundle.open_program(&format!("app/{relative}"))
}

/// Prepares the state root for the Core host: creates it (mode 0700 when new). Only
/// the state root is written; the runtime and the model stay in the bundle and are
/// passed to the Core host by path.
pub fn prepare_state_root(context: &LaunchContext) -> Result<(), Error> {
    use std::os::unix::fs::DirBuilderExt;
    let root = &context.state_root;
    if !root.is_dir() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .map_err(|e| Error::io("create state root", root, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_state_roots_follow_each_os() {
        let dirs = HostDirs::new(
            Some("/home/u".into()),
            Some("relative/x".into()),
            Some("C:/Users/u/AppData/Local".into()),
        );
        assert_eq!(
            default_state_root("linux", "demo", &dirs).unwrap(),
            PathBuf::from("/home/u/.local/share/Arcane/demo")
        );
        let dirs = HostDirs::new(Some("/home/u".into()), Some("/data".into()), None);
        assert_eq!(
            default_state_root("linux", "demo", &dirs).unwrap(),
            PathBuf::from("/data/Arcane/demo")
        );
        assert_eq!(
            default_state_root("macos", "demo", &dirs).unwrap(),
            PathBuf::from("/home/u/Library/Application Support/Arcane/demo")
        );
        assert!(default_state_root("windows", "demo", &dirs).is_err());
        assert!(default_state_root("linux", "demo", &HostDirs::default()).is_err());
    }

    #[test]
    fn launch_files_set_state_but_never_bundle_paths() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("launch.json");
        std::fs::write(
            &file,
            br#"{"stateRoot": "state", "port": 4321, "executionTarget": "cpu"}"#,
        )
        .unwrap();
        let layer = read_launch_file(&file).unwrap();
        assert_eq!(layer.state_root, Some(dir.path().join("state")));
        assert_eq!(layer.port, Some(4321));
        assert_eq!(layer.execution_target.as_deref(), Some("cpu"));
        for (text, key) in [
            (r#"{"appRoot": "/tmp/evil"}"#, "appRoot"),
            (r#"{"runtimes": []}"#, "runtimes"),
            (r#"{"model": "/x.gguf"}"#, "model"),
            (r#"{"stateRot": "x"}"#, "stateRot"),
        ] {
            std::fs::write(&file, text).unwrap();
            let error = read_launch_file(&file).unwrap_err();
            assert_eq!(
                arcane_report::Diagnostic::code(&error),
                arcane_report::codes::ARCANE_USAGE
            );
            assert_eq!(
                arcane_report::Diagnostic::details(&error)["key"],
                key,
                "{text}"
            );
        }
        for text in ["null", "[]", "3", r#"{"port": 0}"#, r#"{"stateRoot": ""}"#] {
            std::fs::write(&file, text).unwrap();
            assert!(read_launch_file(&file).is_err(), "{text}");
        }
    }

    #[test]
    fn the_launcher_must_sit_in_a_bundle_bin_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        std::fs::write(dir.path().join("bin/arcane"), b"").unwrap();
        assert!(bundle_root_from_launcher(&dir.path().join("bin/arcane")).is_err());
        std::fs::write(dir.path().join(MANIFEST_NAME), b"{}").unwrap();
        assert_eq!(
            bundle_root_from_launcher(&dir.path().join("bin/arcane")).unwrap(),
            dir.path().canonicalize().unwrap()
        );
    }
}
