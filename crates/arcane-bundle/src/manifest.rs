//! `arcane-bundle.json`: the manifest types, strict parsing and the checks that need
//! no file system (path grammar, cross-references, target).
//!
//! The manifest is the bundle's single source of truth. It lists every file with its
//! size, SHA-256 and executable bit, sorted by raw UTF-8 bytes; it is not listed in
//! its own `files[]`. Every path in it is a bundle-root-relative POSIX path that
//! passes [`crate::path::check_path`], so the bundle keeps working after being moved
//! or renamed. Unknown fields are refused: a reader of schema version 1 never ignores
//! something a writer meant.

use std::collections::{BTreeMap, HashMap, HashSet};

use arcane_report::codes;
use arcane_workspace::{Engine, ModelFormat};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::failure::Failure;
use crate::path::{check_path, check_path_set};

/// The manifest's file name at the bundle root.
pub const MANIFEST_NAME: &str = "arcane-bundle.json";
/// The schema version this crate reads and writes.
pub const SCHEMA_VERSION: u32 = 1;
/// The manifest's `kind`.
pub const KIND: &str = "arcane-bundle";
/// The largest manifest accepted, in bytes.
pub const MAX_MANIFEST_BYTES: u64 = 16 * 1024 * 1024;
/// The most files a bundle may list.
pub const MAX_FILES: usize = 200_000;
/// The launcher's path inside a bundle.
pub const LAUNCHER_PATH: &str = "bin/arcane";
/// The top-level directories a bundle may contain.
pub const TOP_LEVEL: [&str; 4] = ["app", "bin", "models", "runtimes"];

/// The whole manifest (`schemaVersion: 1`, `kind: "arcane-bundle"`). Unknown fields are
/// refused by [`Manifest::parse`] (its library sections are keyed by kind, so serde's
/// own refusal cannot apply here).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Always [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Always [`KIND`].
    pub kind: String,
    /// A random UUID naming this build of the bundle.
    pub bundle_id: String,
    /// Who built it (informational).
    pub builder: Builder,
    /// The app.
    pub app: AppInfo,
    /// The OS and architecture the bundle runs on.
    pub target: Target,
    /// The bundled inference runtimes.
    pub runtimes: Vec<RuntimeEntry>,
    /// The bundled models.
    pub models: Vec<ModelEntry>,
    /// The bundled runtime libraries of each kind whose sessions run in Arcane's own
    /// workers, under [`Engine::runtimes_key`] (`onnxRuntimes`; absent when none).
    #[serde(flatten)]
    pub libraries: BTreeMap<String, Vec<LibraryEntry>>,
    /// What `launch` uses unless the launch file or flags say otherwise.
    pub launch: LaunchDefaults,
    /// Every file of the bundle except the manifest, sorted by raw UTF-8 bytes.
    pub files: Vec<FileEntry>,
}

/// `builder`: the program that built the bundle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Builder {
    /// `arcane`.
    pub name: String,
    /// The builder's version.
    pub version: String,
}

/// `app`: the app shipped under `app/`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AppInfo {
    /// `[a-z0-9][a-z0-9.-]{0,63}`; names the default state root.
    pub id: String,
    /// A display name.
    pub name: String,
    /// The app's version.
    pub version: String,
    /// The start file (bundle-relative, under `app/`), if the app has one.
    pub start: Option<String>,
}

/// `target`: where the bundle runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Target {
    /// `linux`, `macos` or `windows`.
    pub os: String,
    /// `x64` or `arm64`.
    pub arch: String,
}

impl Target {
    /// The host this program runs on, in manifest spelling.
    pub fn host() -> Self {
        let os = std::env::consts::OS;
        let arch = match std::env::consts::ARCH {
            "x86_64" => "x64",
            "aarch64" => "arm64",
            other => other,
        };
        Self {
            os: os.to_string(),
            arch: arch.to_string(),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.os, self.arch)
    }
}

/// One entry of `runtimes[]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuntimeEntry {
    /// The runtime's id (a single path segment).
    pub id: String,
    /// `llama.cpp` or `ollama`.
    pub engine: String,
    /// The runtime's version.
    pub version: String,
    /// `cpu`, `cuda`, `vulkan`, `metal` or `auto`.
    pub backend: String,
    /// The executable: `runtimes/<id>/<os>-<arch>-<backend>/<name>`, listed with `exec`.
    pub executable: String,
    /// Directories holding its shared libraries (bundle-relative).
    pub library_dirs: Vec<String>,
}

/// The kind whose libraries `key` lists ([`Engine::runtimes_key`]), if any.
fn library_kind(key: &str) -> Option<Engine> {
    Engine::library_kinds().find(|e| e.runtimes_key() == key)
}

/// One entry of `<kind>Runtimes[]` (`onnxRuntimes[]`): a runtime library the Core's
/// workers load (not an executable the Core starts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LibraryEntry {
    /// The runtime's id (a single path segment, unique among all runtimes).
    pub id: String,
    /// The version the library reports.
    pub version: String,
    /// The library: `runtimes/<id>/<os>-<arch>/<name>`, a listed file.
    pub library: String,
}

/// One entry of `models[]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelEntry {
    /// The model's id (a single path segment).
    pub id: String,
    /// The engine that serves it (`llama.cpp`, `whisper.cpp`, `piper`: see
    /// [`model_formats`]).
    pub engine: String,
    /// The model file: `models/<id>/<file>`.
    pub path: String,
    /// Its SHA-256 (equal to its `files[]` entry).
    pub sha256: String,
    /// `gguf`, `whisper-ggml` or `piper-voice` ([`model_formats`]); its format's companions (a
    /// Piper voice's configuration, `<path>.json`) are listed files beside it.
    pub format: String,
}

/// The model formats a bundle carries ([`ModelFormat::bundled`]), each with the engine
/// kind that serves it, from the kinds' table.
pub fn model_formats() -> impl Iterator<Item = (ModelFormat, Engine)> {
    Engine::formats()
        .filter(|format| format.bundled)
        .filter_map(|format| Engine::for_format(format).map(|engine| (format, engine)))
}

/// `launch`: the packaged launch defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LaunchDefaults {
    /// The runtime `launch` starts (an id from `runtimes[]`; default: the first).
    pub runtime: Option<String>,
    /// The model `launch` loads (an id from `models[]`; default: the first).
    pub model: Option<String>,
    /// The execution target (`cpu` or a device id), if the app pins one.
    pub execution_target: Option<String>,
}

/// One entry of `files[]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileEntry {
    /// Bundle-relative POSIX path.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Lowercase hex SHA-256 of the content.
    pub sha256: String,
    /// Whether the file is executable (mode 0755 rather than 0644).
    #[serde(default)]
    pub exec: bool,
}

impl Manifest {
    /// Parses manifest bytes strictly: JSON object, `schemaVersion` 1, `kind`
    /// `arcane-bundle`, no unknown fields. The failure is `BUNDLE_MANIFEST_INVALID`
    /// naming the offending value.
    pub fn parse(bytes: &[u8]) -> Result<Self, Failure> {
        let invalid = |message: String, details: Value| {
            Failure::at(
                codes::BUNDLE_MANIFEST_INVALID,
                MANIFEST_NAME,
                message,
                details,
            )
        };
        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
            invalid(
                format!("is not valid JSON ({e})"),
                json!({"reason": "json"}),
            )
        })?;
        let Some(object) = value.as_object() else {
            return Err(invalid(
                "is not a JSON object".into(),
                json!({"reason": "not-object"}),
            ));
        };
        match object.get("schemaVersion") {
            Some(Value::Number(n)) if n.as_u64() == Some(u64::from(SCHEMA_VERSION)) => {}
            other => {
                return Err(invalid(
                    format!(
                        "has schemaVersion `{}`, this launcher reads `{SCHEMA_VERSION}`",
                        other.cloned().unwrap_or(Value::Null)
                    ),
                    json!({"field": "schemaVersion", "value": other, "expected": SCHEMA_VERSION}),
                ))
            }
        }
        match object.get("kind") {
            Some(Value::String(kind)) if kind == KIND => {}
            other => {
                return Err(invalid(
                    format!(
                        "has kind `{}`, expected `{KIND}`",
                        other.cloned().unwrap_or(Value::Null)
                    ),
                    json!({"field": "kind", "value": other, "expected": KIND}),
                ))
            }
        }
        let manifest: Manifest = serde_json::from_value(value).map_err(|e| {
            invalid(
                format!("does not match schema version 1 ({e})"),
                json!({"reason": "schema"}),
            )
        })?;
        if let Some(key) = manifest
            .libraries
            .keys()
            .find(|k| library_kind(k).is_none())
        {
            return Err(invalid(
                format!("does not match schema version 1 (unknown field `{key}`)"),
                json!({"reason": "schema", "field": key}),
            ));
        }
        Ok(manifest)
    }

    /// Serializes the manifest as pretty JSON with a trailing newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// The `files[]` entry for `path`, if listed.
    pub fn file(&self, path: &str) -> Option<&FileEntry> {
        self.files
            .binary_search_by(|f| f.path.as_bytes().cmp(path.as_bytes()))
            .ok()
            .map(|i| &self.files[i])
    }

    /// The runtime `launch` uses: `launch.runtime`, else the first.
    pub fn launch_runtime(&self) -> Option<&RuntimeEntry> {
        match &self.launch.runtime {
            Some(id) => self.runtimes.iter().find(|r| &r.id == id),
            None => self.runtimes.first(),
        }
    }

    /// Every bundled runtime library, with its kind.
    pub fn library_entries(&self) -> impl Iterator<Item = (Engine, &LibraryEntry)> {
        self.libraries.iter().flat_map(|(key, entries)| {
            library_kind(key)
                .into_iter()
                .flat_map(move |kind| entries.iter().map(move |entry| (kind, entry)))
        })
    }

    /// The libraries `launch` hands the Core: the first of each kind's.
    pub fn launch_libraries(&self) -> Vec<(Engine, &LibraryEntry)> {
        let mut first: Vec<(Engine, &LibraryEntry)> = Vec::new();
        for (kind, entry) in self.library_entries() {
            if !first.iter().any(|(k, _)| *k == kind) {
                first.push((kind, entry));
            }
        }
        first
    }

    /// The model `launch` uses: `launch.model`, else the first.
    pub fn launch_model(&self) -> Option<&ModelEntry> {
        match &self.launch.model {
            Some(id) => self.models.iter().find(|m| &m.id == id),
            None => self.models.first(),
        }
    }

    /// Every check that needs no file system, in a stable order: identity fields,
    /// `files[]` path grammar and set rules, cross-references of runtimes, models and
    /// the app, and the launch defaults. Paths that fail here must never be opened.
    pub fn check(&self) -> Vec<Failure> {
        let mut failures = Vec::new();
        // 1. Identity fields.
        self.check_identity(&mut failures);
        // 2. files[]: grammar, layout, digest syntax, order, set rules.
        self.check_files(&mut failures);
        // 3. The launcher.
        self.check_launcher(&mut failures);
        // 4. Runtimes.
        self.check_runtimes(&mut failures);
        // 5. Models.
        self.check_models(&mut failures);
        // 6. The app's start file.
        self.check_app_start(&mut failures);
        // 7. Launch defaults refer to entries that exist.
        self.check_launch_defaults(&mut failures);
        failures
    }

    /// Step 1 of [`Manifest::check`]: the bundle id, app id, target and file count.
    fn check_identity(&self, failures: &mut Vec<Failure>) {
        if !is_uuid(&self.bundle_id) {
            failures.push(manifest_invalid(
                format!("bundleId `{}` is not a UUID", self.bundle_id),
                json!({"field": "bundleId", "value": self.bundle_id}),
            ));
        }
        if !is_app_id(&self.app.id) {
            failures.push(manifest_invalid(
                format!(
                    "app id `{}` does not match `[a-z0-9][a-z0-9.-]{{0,63}}`",
                    self.app.id
                ),
                json!({"field": "app.id", "value": self.app.id}),
            ));
        }
        if !["linux", "macos", "windows"].contains(&self.target.os.as_str())
            || !["x64", "arm64"].contains(&self.target.arch.as_str())
        {
            failures.push(manifest_invalid(
                format!("target `{}` is not a known os-arch", self.target),
                json!({"field": "target", "value": self.target}),
            ));
        }
        if self.files.len() > MAX_FILES {
            failures.push(manifest_invalid(
                format!(
                    "lists {} files, at most {MAX_FILES} are allowed",
                    self.files.len()
                ),
                json!({"field": "files", "count": self.files.len()}),
            ));
        }
    }

    /// Step 2 of [`Manifest::check`]: every `files[]` entry's path and digest, the
    /// order of the list and the path-set rules.
    fn check_files(&self, failures: &mut Vec<Failure>) {
        for entry in &self.files {
            if let Some(failure) = path_failure(&entry.path, "files[]") {
                failures.push(failure);
                continue;
            }
            let top = entry.path.split('/').next().unwrap_or("");
            if !entry.path.contains('/') || !TOP_LEVEL.contains(&top) {
                failures.push(Failure::at(
                    codes::BUNDLE_PATH_INVALID,
                    &entry.path,
                    format!(
                        "is outside the bundle layout (files live under {})",
                        TOP_LEVEL.map(|t| format!("`{t}/`")).join(", ")
                    ),
                    json!({"reason": "outside-layout", "field": "files[]"}),
                ));
            }
            if !is_sha256(&entry.sha256) {
                failures.push(Failure::at(
                    codes::BUNDLE_MANIFEST_INVALID,
                    &entry.path,
                    format!(
                        "has sha256 `{}`, which is not 64 lowercase hex digits",
                        entry.sha256
                    ),
                    json!({"field": "files[].sha256", "value": entry.sha256}),
                ));
            }
        }
        if let Some(pair) = self
            .files
            .windows(2)
            .find(|w| w[0].path.as_bytes() > w[1].path.as_bytes())
        {
            failures.push(manifest_invalid(
                format!("files[] is not sorted by raw UTF-8 bytes (`{}` comes before `{}`)", pair[0].path, pair[1].path),
                json!({"field": "files", "reason": "unsorted", "first": pair[0].path, "second": pair[1].path}),
            ));
        }
        let grammatical: Vec<&str> = self
            .files
            .iter()
            .map(|f| f.path.as_str())
            .filter(|p| check_path(p).is_ok())
            .collect();
        for conflict in check_path_set(grammatical) {
            failures.push(Failure::at(
                codes::BUNDLE_PATH_INVALID,
                &conflict.path,
                match conflict.reason {
                    "duplicate" => "is listed twice".to_string(),
                    "case-fold-duplicate" => {
                        format!("differs from `{}` only by case", conflict.other)
                    }
                    _ => format!(
                        "is a file and also a directory prefix of `{}`",
                        conflict.other
                    ),
                },
                json!({"reason": conflict.reason, "other": conflict.other}),
            ));
        }
    }

    /// Step 3 of [`Manifest::check`]: the launcher is listed as executable.
    fn check_launcher(&self, failures: &mut Vec<Failure>) {
        match self.file(LAUNCHER_PATH) {
            Some(entry) if entry.exec => {}
            _ => failures.push(Failure::at(
                codes::BUNDLE_MANIFEST_INVALID,
                LAUNCHER_PATH,
                "the launcher is not listed as an executable file".to_string(),
                json!({"field": "files[]", "reason": "launcher-missing"}),
            )),
        }
    }

    /// Step 4 of [`Manifest::check`]: runtime ids are valid and unique, and each
    /// runtime passes [`Manifest::check_runtime`].
    fn check_runtimes(&self, failures: &mut Vec<Failure>) {
        let mut runtime_ids = HashSet::new();
        for runtime in &self.runtimes {
            if !is_segment_id(&runtime.id) || !runtime_ids.insert(runtime.id.as_str()) {
                failures.push(manifest_invalid(
                    format!("runtime id `{}` is invalid or repeated", runtime.id),
                    json!({"field": "runtimes[].id", "value": runtime.id}),
                ));
                continue;
            }
            self.check_runtime(runtime, failures);
        }
        for (kind, runtime) in self.library_entries() {
            let key = kind.runtimes_key();
            if !is_segment_id(&runtime.id) || !runtime_ids.insert(runtime.id.as_str()) {
                failures.push(manifest_invalid(
                    format!("runtime id `{}` is invalid or repeated", runtime.id),
                    json!({"field": format!("{key}[].id"), "value": runtime.id}),
                ));
                continue;
            }
            self.check_library(kind, runtime, failures);
        }
    }

    /// One runtime library: a listed file under `runtimes/<id>/`.
    fn check_library(&self, kind: Engine, runtime: &LibraryEntry, failures: &mut Vec<Failure>) {
        let field = format!("{}[{}]", kind.runtimes_key(), runtime.id);
        let area = format!("runtimes/{}/", runtime.id);
        if let Some(failure) = path_failure(&runtime.library, &field)
            .or_else(|| outside_area(&runtime.library, &area, &field))
        {
            failures.push(failure);
        } else if self.file(&runtime.library).is_none() {
            failures.push(Failure::at(
                codes::BUNDLE_RUNTIME_MISSING,
                &runtime.library,
                format!(
                    "the library of `{kind}` runtime `{}` is not listed in files[]",
                    runtime.id
                ),
                json!({"runtime": runtime.id, "reason": "not-listed"}),
            ));
        }
    }

    /// One runtime: engine, backend, executable and library directories.
    fn check_runtime(&self, runtime: &RuntimeEntry, failures: &mut Vec<Failure>) {
        let field = format!("runtimes[{}]", runtime.id);
        if !Engine::registrable().any(|engine| engine.as_str() == runtime.engine) {
            failures.push(manifest_invalid(
                format!(
                    "runtime `{}` has unknown engine `{}`",
                    runtime.id, runtime.engine
                ),
                json!({"field": "runtimes[].engine", "value": runtime.engine}),
            ));
        }
        if !["cpu", "cuda", "vulkan", "metal", "rocm", "auto"].contains(&runtime.backend.as_str()) {
            failures.push(manifest_invalid(
                format!(
                    "runtime `{}` has unknown backend `{}`",
                    runtime.id, runtime.backend
                ),
                json!({"field": "runtimes[].backend", "value": runtime.backend}),
            ));
        }
        let area = format!("runtimes/{}/", runtime.id);
        if let Some(failure) = path_failure(&runtime.executable, &field)
            .or_else(|| outside_area(&runtime.executable, &area, &field))
        {
            failures.push(failure);
        } else {
            match self.file(&runtime.executable) {
                Some(entry) if entry.exec => {}
                Some(_) => failures.push(Failure::at(
                    codes::BUNDLE_RUNTIME_MISSING,
                    &runtime.executable,
                    format!(
                        "the executable of runtime `{}` is listed without `exec`",
                        runtime.id
                    ),
                    json!({"runtime": runtime.id, "reason": "not-executable"}),
                )),
                None => failures.push(Failure::at(
                    codes::BUNDLE_RUNTIME_MISSING,
                    &runtime.executable,
                    format!(
                        "the executable of runtime `{}` is not listed in files[]",
                        runtime.id
                    ),
                    json!({"runtime": runtime.id, "reason": "not-listed"}),
                )),
            }
        }
        for dir in &runtime.library_dirs {
            if let Some(failure) =
                path_failure(dir, &field).or_else(|| outside_area(dir, &area, &field))
            {
                failures.push(failure);
                continue;
            }
            let prefix = format!("{dir}/");
            if !self.files.iter().any(|f| f.path.starts_with(&prefix)) {
                failures.push(Failure::at(
                    codes::BUNDLE_RUNTIME_MISSING,
                    dir,
                    format!(
                        "library directory of runtime `{}` holds no listed file",
                        runtime.id
                    ),
                    json!({"runtime": runtime.id, "reason": "library-dir-empty"}),
                ));
            }
        }
    }

    /// Step 5 of [`Manifest::check`]: model ids are valid and unique, and each model
    /// passes [`Manifest::check_model`].
    fn check_models(&self, failures: &mut Vec<Failure>) {
        let mut model_ids = HashSet::new();
        for model in &self.models {
            if !is_segment_id(&model.id) || !model_ids.insert(model.id.as_str()) {
                failures.push(manifest_invalid(
                    format!("model id `{}` is invalid or repeated", model.id),
                    json!({"field": "models[].id", "value": model.id}),
                ));
                continue;
            }
            self.check_model(model, failures);
        }
    }

    /// One model: format, path and the digest `files[]` records for it.
    fn check_model(&self, model: &ModelEntry, failures: &mut Vec<Failure>) {
        let field = format!("models[{}]", model.id);
        let format = model_formats().find(|(format, _)| format.id == model.format);
        match format {
            None => failures.push(manifest_invalid(
                format!("model `{}` has unknown format `{}`", model.id, model.format),
                json!({"field": "models[].format", "value": model.format}),
            )),
            Some((_, engine)) if engine.as_str() != model.engine => {
                failures.push(manifest_invalid(
                    format!(
                        "model `{}` of format `{}` is served by `{engine}`, not `{}`",
                        model.id, model.format, model.engine
                    ),
                    json!({"field": "models[].engine", "value": model.engine, "expected": engine}),
                ))
            }
            Some(_) => {}
        }
        for companion in format
            .map(|(f, _)| f.companions_of(&model.path))
            .unwrap_or_default()
        {
            if self.file(&companion).is_none() {
                failures.push(Failure::at(
                    codes::BUNDLE_MODEL_MISSING,
                    &companion,
                    format!(
                        "`{companion}`, which travels with model `{}`, is not listed in files[]",
                        model.id
                    ),
                    json!({"model": model.id, "file": companion}),
                ));
            }
        }
        let area = format!("models/{}/", model.id);
        if let Some(failure) =
            path_failure(&model.path, &field).or_else(|| outside_area(&model.path, &area, &field))
        {
            failures.push(failure);
            return;
        }
        match self.file(&model.path) {
            Some(entry) if entry.sha256 == model.sha256 => {}
            Some(entry) => failures.push(Failure::at(
                codes::BUNDLE_MANIFEST_INVALID,
                &model.path,
                format!(
                    "model `{}` records sha256 `{}` but files[] records `{}`",
                    model.id, model.sha256, entry.sha256
                ),
                json!({"model": model.id, "expected": entry.sha256, "actual": model.sha256}),
            )),
            None => failures.push(Failure::at(
                codes::BUNDLE_MODEL_MISSING,
                &model.path,
                format!("the file of model `{}` is not listed in files[]", model.id),
                json!({"model": model.id}),
            )),
        }
    }

    /// Step 6 of [`Manifest::check`]: the app's start file is a listed file under `app/`.
    fn check_app_start(&self, failures: &mut Vec<Failure>) {
        if let Some(start) = &self.app.start {
            if let Some(failure) = path_failure(start, "app.start")
                .or_else(|| outside_area(start, "app/", "app.start"))
            {
                failures.push(failure);
            } else if self.file(start).is_none() {
                failures.push(Failure::at(
                    codes::BUNDLE_MISSING,
                    start,
                    "the app's start file is not listed in files[]",
                    json!({"field": "app.start"}),
                ));
            }
        }
    }

    /// Step 7 of [`Manifest::check`]: `launch.runtime` and `launch.model` name entries.
    fn check_launch_defaults(&self, failures: &mut Vec<Failure>) {
        if let Some(id) = &self.launch.runtime {
            if !self.runtimes.iter().any(|r| &r.id == id) {
                failures.push(manifest_invalid(
                    format!("launch.runtime `{id}` is not in runtimes[]"),
                    json!({"field": "launch.runtime", "value": id}),
                ));
            }
        }
        if let Some(id) = &self.launch.model {
            if !self.models.iter().any(|m| &m.id == id) {
                failures.push(manifest_invalid(
                    format!("launch.model `{id}` is not in models[]"),
                    json!({"field": "launch.model", "value": id}),
                ));
            }
        }
    }

    /// The paths of `files[]` that passed [`Manifest::check`]'s path rules, mapped to
    /// their entries: the only ones verification may open. Both sides of a case-fold or
    /// prefix conflict are excluded: neither entry is trusted.
    pub(crate) fn openable(&self, failures: &[Failure]) -> HashMap<String, FileEntry> {
        let bad: HashSet<&str> = failures
            .iter()
            .filter(|f| f.code == codes::BUNDLE_PATH_INVALID)
            // Only failures about files[] entries themselves: a bad `app.start` or
            // runtime field that names a listed file leaves that file listed.
            .filter(|f| {
                f.details
                    .get("field")
                    .and_then(|field| field.as_str())
                    .is_none_or(|field| field == "files[]")
            })
            .flat_map(|f| {
                [
                    f.path.as_deref(),
                    f.details.get("other").and_then(|o| o.as_str()),
                ]
            })
            .flatten()
            .collect();
        self.files
            .iter()
            .filter(|f| check_path(&f.path).is_ok() && !bad.contains(f.path.as_str()))
            .map(|f| (f.path.clone(), f.clone()))
            .collect()
    }
}

/// A `BUNDLE_MANIFEST_INVALID` failure located at the manifest itself.
fn manifest_invalid(message: String, details: Value) -> Failure {
    Failure::at(
        codes::BUNDLE_MANIFEST_INVALID,
        MANIFEST_NAME,
        message,
        details,
    )
}

fn path_failure(path: &str, field: &str) -> Option<Failure> {
    check_path(path).err().map(|problem| {
        Failure::at(
            codes::BUNDLE_PATH_INVALID,
            path,
            format!("{} ({field})", problem.describe()),
            json!({"reason": problem.reason(), "field": field}),
        )
    })
}

fn outside_area(path: &str, area: &str, field: &str) -> Option<Failure> {
    (!path.starts_with(area)).then(|| {
        Failure::at(
            codes::BUNDLE_PATH_INVALID,
            path,
            format!("is not under `{area}` ({field})"),
            json!({"reason": "outside-area", "field": field, "area": area}),
        )
    })
}

/// `[a-z0-9][a-z0-9.-]{0,63}`.
pub fn is_app_id(id: &str) -> bool {
    let bytes = id.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 64
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'.' || *b == b'-')
}

/// A runtime or model id usable as one path segment: `[A-Za-z0-9][A-Za-z0-9._+-]{0,127}`,
/// passing the path grammar.
pub fn is_segment_id(id: &str) -> bool {
    let bytes = id.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 128
        && bytes[0].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+'))
        && check_path(id).is_ok()
}

/// 64 lowercase hex digits.
pub fn is_sha256(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lowercase hex.
pub fn is_uuid(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(b),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(byte: char) -> String {
        std::iter::repeat_n(byte, 64).collect()
    }

    pub(crate) fn sample() -> Manifest {
        let file = |path: &str, exec: bool| FileEntry {
            path: path.into(),
            size: 1,
            sha256: digest('a'),
            exec,
        };
        Manifest {
            schema_version: 1,
            kind: KIND.into(),
            bundle_id: "01234567-89ab-4def-8123-456789abcdef".into(),
            builder: Builder {
                name: "arcane".into(),
                version: "0.1.0".into(),
            },
            app: AppInfo {
                id: "demo".into(),
                name: "Demo".into(),
                version: "1.0.0".into(),
                start: Some("app/index.html".into()),
            },
            target: Target::host(),
            runtimes: vec![RuntimeEntry {
                id: "llama.cpp-b1".into(),
                engine: "llama.cpp".into(),
                version: "b1".into(),
                backend: "cpu".into(),
                executable: "runtimes/llama.cpp-b1/linux-x64-cpu/llama-server".into(),
                library_dirs: vec!["runtimes/llama.cpp-b1/linux-x64-cpu".into()],
            }],
            models: vec![ModelEntry {
                id: "smollm2".into(),
                engine: "llama.cpp".into(),
                path: "models/smollm2/m.gguf".into(),
                sha256: digest('a'),
                format: "gguf".into(),
            }],
            libraries: BTreeMap::new(),
            launch: LaunchDefaults::default(),
            files: vec![
                file("app/index.html", false),
                file("bin/arcane", true),
                file("models/smollm2/m.gguf", false),
                file("runtimes/llama.cpp-b1/linux-x64-cpu/libllama.so", false),
                file("runtimes/llama.cpp-b1/linux-x64-cpu/llama-server", true),
            ],
        }
    }

    #[test]
    fn a_sound_manifest_round_trips_and_checks_clean() {
        let manifest = sample();
        assert_eq!(manifest.check(), vec![]);
        let parsed = Manifest::parse(&manifest.to_bytes()).unwrap();
        assert_eq!(parsed, manifest);
    }

    #[test]
    fn schema_version_kind_and_unknown_fields_are_refused_by_name() {
        let mut value = serde_json::to_value(sample()).unwrap();
        value["schemaVersion"] = json!(2);
        let failure = Manifest::parse(&serde_json::to_vec(&value).unwrap()).unwrap_err();
        assert_eq!(failure.code, codes::BUNDLE_MANIFEST_INVALID);
        assert_eq!(failure.details["value"], json!(2));
        let mut value = serde_json::to_value(sample()).unwrap();
        value["kind"] = json!("arcane-portable-native");
        let failure = Manifest::parse(&serde_json::to_vec(&value).unwrap()).unwrap_err();
        assert!(
            failure.message.contains("arcane-portable-native"),
            "{failure}"
        );
        let mut value = serde_json::to_value(sample()).unwrap();
        value["app"]["appRoot"] = json!("/etc");
        assert!(Manifest::parse(&serde_json::to_vec(&value).unwrap()).is_err());
        assert!(Manifest::parse(b"null").is_err());
        assert!(Manifest::parse(b"[1]").is_err());
    }

    #[test]
    fn cross_references_are_checked() {
        let mut manifest = sample();
        manifest.files.retain(|f| !f.path.ends_with("llama-server"));
        manifest.files.retain(|f| !f.path.ends_with(".gguf"));
        manifest.launch.model = Some("nope".into());
        let codes: Vec<&str> = manifest.check().iter().map(|f| f.code).collect();
        assert!(codes.contains(&codes::BUNDLE_RUNTIME_MISSING), "{codes:?}");
        assert!(codes.contains(&codes::BUNDLE_MODEL_MISSING), "{codes:?}");
        assert!(codes.contains(&codes::BUNDLE_MANIFEST_INVALID), "{codes:?}");

        let mut manifest = sample();
        manifest.runtimes[0].executable = "runtimes/other/llama-server".into();
        manifest.models[0].path = "/etc/passwd".into();
        let failures = manifest.check();
        assert!(
            failures
                .iter()
                .any(|f| f.code == codes::BUNDLE_PATH_INVALID
                    && f.details["reason"] == "outside-area"),
            "{failures:?}"
        );
        assert!(
            failures.iter().any(|f| f.code == codes::BUNDLE_PATH_INVALID
                && f.path.as_deref() == Some("/etc/passwd")),
            "{failures:?}"
        );
    }

    /// A model whose format carries companions (a Piper voice's `.json`) needs each
    /// listed beside it.
    #[test]
    fn a_models_companions_must_be_listed() {
        let (format, engine) = model_formats()
            .find(|(format, _)| !format.companions.is_empty())
            .expect("a bundled format with companions");
        let mut manifest = sample();
        manifest.models[0].format = format.id.into();
        manifest.models[0].engine = engine.as_str().into();
        let companions = format.companions_of(&manifest.models[0].path);
        assert!(!companions.is_empty());
        let failures = manifest.check();
        for companion in &companions {
            assert!(
                failures
                    .iter()
                    .any(|f| f.code == codes::BUNDLE_MODEL_MISSING
                        && f.path.as_deref() == Some(companion.as_str())),
                "{companion}: {failures:?}"
            );
        }
        for companion in companions {
            manifest.files.push(FileEntry {
                path: companion,
                size: 1,
                sha256: digest('b'),
                exec: false,
            });
        }
        manifest
            .files
            .sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        assert_eq!(manifest.check(), Vec::new());
    }

    /// A kind's libraries are read and written under `<kind>Runtimes` (`onnxRuntimes`,
    /// as schema version 1 always had them); a key of no library kind is refused by
    /// name.
    #[test]
    fn library_sections_keep_their_names_and_unknown_fields_are_refused() {
        let mut manifest = sample();
        let entry = LibraryEntry {
            id: "onnx".into(),
            version: "1.31.1".into(),
            library: "runtimes/onnx/linux-x64/libonnxruntime.so".into(),
        };
        manifest.libraries = BTreeMap::from([(Engine::Onnx.runtimes_key(), vec![entry.clone()])]);
        let bytes = manifest.to_bytes();
        let value: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(value["onnxRuntimes"][0]["id"], "onnx", "{value}");
        let parsed = Manifest::parse(&bytes).unwrap();
        assert_eq!(parsed.launch_libraries(), vec![(Engine::Onnx, &entry)]);
        for unknown in ["vllmRuntimes", "extra"] {
            let mut value = value.clone();
            value[unknown] = json!([]);
            let failure = Manifest::parse(&serde_json::to_vec(&value).unwrap()).unwrap_err();
            assert_eq!(failure.code, codes::BUNDLE_MANIFEST_INVALID);
            assert!(failure.message.contains(unknown), "{failure}");
        }
    }

    /// An ONNX Runtime's library must be a listed file in its own runtime area, and
    /// its id is unique among all runtimes.
    #[test]
    fn onnx_runtimes_are_cross_checked() {
        let mut manifest = sample();
        let onnx = |id: &str, library: &str| LibraryEntry {
            id: id.into(),
            version: "1.31.1".into(),
            library: library.into(),
        };
        let key = Engine::Onnx.runtimes_key();
        manifest.libraries = BTreeMap::from([(
            key.clone(),
            vec![onnx("onnx", "runtimes/onnx/linux-x64/libonnxruntime.so")],
        )]);
        let failures = manifest.check();
        assert!(
            failures
                .iter()
                .any(|f| f.code == codes::BUNDLE_RUNTIME_MISSING
                    && f.path.as_deref() == Some("runtimes/onnx/linux-x64/libonnxruntime.so")),
            "{failures:?}"
        );
        manifest.libraries = BTreeMap::from([(
            key.clone(),
            vec![
                onnx(
                    "llama.cpp-b1",
                    "runtimes/llama.cpp-b1/linux-x64-cpu/libllama.so",
                ),
                onnx(
                    "elsewhere",
                    "runtimes/llama.cpp-b1/linux-x64-cpu/libllama.so",
                ),
            ],
        )]);
        let failures = manifest.check();
        assert!(
            failures
                .iter()
                .any(|f| f.details["field"] == "onnxRuntimes[].id"),
            "{failures:?}"
        );
        assert!(
            failures
                .iter()
                .any(|f| f.details["reason"] == "outside-area"),
            "{failures:?}"
        );
    }

    #[test]
    fn unsorted_files_and_bad_digests_are_refused() {
        let mut manifest = sample();
        manifest.files.swap(0, 1);
        manifest.files[2].sha256 = "ABC".into();
        let failures = manifest.check();
        assert!(
            failures.iter().any(|f| f.details["reason"] == "unsorted"),
            "{failures:?}"
        );
        assert!(
            failures
                .iter()
                .any(|f| f.details["field"] == "files[].sha256"),
            "{failures:?}"
        );
    }

    #[test]
    fn ids_and_uuids() {
        assert!(is_app_id("com.example.demo-1"));
        assert!(!is_app_id("Demo"));
        assert!(!is_app_id(""));
        assert!(is_segment_id("llama.cpp-b4567"));
        assert!(!is_segment_id("a/b"));
        assert!(!is_segment_id(".."));
        assert!(!is_segment_id("CON"));
        assert!(is_uuid("01234567-89ab-4def-8123-456789abcdef"));
        assert!(!is_uuid("01234567-89ab-4def-8123-456789abcdeF"));
    }
}
