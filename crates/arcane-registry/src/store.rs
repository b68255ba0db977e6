//! The registry file, `.arcane/registry.json`, and the file-system steps every mutation
//! shares.
//!
//! The file is `{"version": 1, "runtimes": [...], "models": [...], "<kind>Runtimes": [...]}`
//! (the library runtimes of each kind, `onnxRuntimes`, only once one is registered). Paths under the
//! workspace are stored relative to it (so a moved workspace keeps working) and are
//! absolute in memory. Writes go through [`arcane_files::write_atomic`] (a temporary
//! name, fsync, rename over the old file, fsync of the directory, mode 0644): a reader
//! sees the old or the new file, never a mix. Writers hold the workspace operation lock and re-read the file inside it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::{Engine, Error, LibraryRuntime, Model, Runtime};

/// The registry file format version this build reads and writes.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// Prefix of a staging directory: an operation in progress (or one that crashed).
pub(crate) const STAGING_PREFIX: &str = ".staging-";
/// Prefix of a directory being removed.
pub(crate) const TRASH_PREFIX: &str = ".trash-";

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Document {
    pub version: u32,
    #[serde(default)]
    pub runtimes: Vec<Runtime>,
    #[serde(default)]
    pub models: Vec<Model>,
    /// The library runtimes of each kind, under [`Engine::runtimes_key`]
    /// (`onnxRuntimes`).
    #[serde(flatten)]
    pub libraries: BTreeMap<String, Vec<LibraryRuntime>>,
}

impl Document {
    /// The library runtimes of `kind`, in registration order.
    pub(crate) fn libraries(&self, kind: Engine) -> &[LibraryRuntime] {
        self.libraries
            .get(&kind.runtimes_key())
            .map_or(&[], Vec::as_slice)
    }

    /// The library runtimes of `kind`, to change.
    pub(crate) fn libraries_mut(&mut self, kind: Engine) -> &mut Vec<LibraryRuntime> {
        self.libraries.entry(kind.runtimes_key()).or_default()
    }
}

fn relative(path: &mut PathBuf, workspace: &Path) {
    if let Ok(rest) = path.strip_prefix(workspace) {
        *path = rest.to_path_buf();
    }
}

fn absolute(path: &mut PathBuf, workspace: &Path) {
    if path.is_relative() {
        *path = workspace.join(&*path);
    }
}

fn map_paths(document: &mut Document, workspace: &Path, f: fn(&mut PathBuf, &Path)) {
    for runtime in &mut document.runtimes {
        f(&mut runtime.executable, workspace);
        for dir in &mut runtime.library_dirs {
            f(dir, workspace);
        }
        if let Some(root) = &mut runtime.root {
            f(root, workspace);
        }
    }
    for model in &mut document.models {
        f(&mut model.path, workspace);
    }
    for runtime in document.libraries.values_mut().flatten() {
        f(&mut runtime.library, workspace);
    }
}

/// Reads the registry (an absent file is an empty registry).
pub(crate) fn load(workspace: &Path, path: &Path) -> Result<Document, Error> {
    // The registry names the programs Arcane runs: only this user (or root) may write it.
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if let Err(untrusted) = arcane_files::trust::check_owner_and_mode(path, &meta) {
            return Err(Error::Untrusted {
                path: path.to_path_buf(),
                detail: untrusted.describe(),
                fix: untrusted.fix(),
            });
        }
    }
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Document {
                version: FORMAT_VERSION,
                ..Document::default()
            })
        }
        Err(e) => return Err(Error::io("read", path, e)),
    };
    #[derive(Deserialize)]
    struct Probe {
        version: u32,
    }
    let probe: Probe = serde_json::from_slice(&bytes).map_err(|source| Error::RegistryCorrupt {
        path: path.to_path_buf(),
        source,
    })?;
    if probe.version != FORMAT_VERSION {
        return Err(Error::RegistryVersion {
            path: path.to_path_buf(),
            found: probe.version,
            supported: FORMAT_VERSION,
        });
    }
    let mut document: Document =
        serde_json::from_slice(&bytes).map_err(|source| Error::RegistryCorrupt {
            path: path.to_path_buf(),
            source,
        })?;
    map_paths(&mut document, workspace, absolute);
    Ok(document)
}

/// The registry file's permission bits (readable by the user's other tools, written
/// only by its owner).
const REGISTRY_MODE: u32 = 0o644;

/// Writes the registry atomically (through [`arcane_files::write_atomic`]).
pub(crate) fn save(workspace: &Path, path: &Path, document: &Document) -> Result<(), Error> {
    let mut stored = Document {
        version: FORMAT_VERSION,
        runtimes: document.runtimes.clone(),
        models: document.models.clone(),
        libraries: document
            .libraries
            .iter()
            .filter(|(_, runtimes)| !runtimes.is_empty())
            .map(|(key, runtimes)| (key.clone(), runtimes.clone()))
            .collect(),
    };
    map_paths(&mut stored, workspace, relative);
    let mut text = serde_json::to_vec_pretty(&stored)
        .map_err(|e| Error::io("serialize", path, std::io::Error::other(e)))?;
    text.push(b'\n');
    let dir = path.parent().unwrap_or(workspace);
    arcane_files::create_private_dirs(dir).map_err(|e| Error::io("create", dir, e))?;
    arcane_files::write_atomic(path, &text, REGISTRY_MODE).map_err(|e| Error::io("write", path, e))
}

/// Fsyncs a directory so a rename inside it survives a crash.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), Error> {
    arcane_files::sync_dir(dir).map_err(|e| Error::io("sync", dir, e))
}

/// A fresh, unique staging name inside `dir` for `label`.
pub(crate) fn staging_path(dir: &Path, label: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(
        "{STAGING_PREFIX}{label}-{}-{n}",
        std::process::id()
    ))
}

/// A fresh, unique trash name inside `dir` for `label`.
pub(crate) fn trash_path(dir: &Path, label: &str) -> PathBuf {
    let staging = staging_path(dir, label);
    let name = staging
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .replacen(STAGING_PREFIX, TRASH_PREFIX, 1);
    dir.join(name)
}

/// Removes leftovers of crashed operations (`.staging-*`, `.trash-*`) in `dir`.
/// Only called while holding the workspace lock, so no live operation owns them.
pub(crate) fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(STAGING_PREFIX) || name.starts_with(TRASH_PREFIX) {
            let path = entry.path();
            let _ = match entry.file_type() {
                Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
                _ => std::fs::remove_file(&path),
            };
        }
    }
}

/// Removes `path` (a file or a directory tree) if it exists.
pub(crate) fn remove_tree(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// A directory created for one operation, removed on drop unless [`Staging::keep`] is called.
pub(crate) struct Staging {
    path: Option<PathBuf>,
}

impl Staging {
    pub(crate) fn create(dir: &Path, label: &str) -> Result<Staging, Error> {
        arcane_files::create_private_dirs(dir).map_err(|e| Error::io("create", dir, e))?;
        let path = staging_path(dir, label);
        std::fs::create_dir(&path).map_err(|e| Error::io("create", &path, e))?;
        // The staged tree becomes the installed one: a fixed mode, whatever the umask.
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| Error::io("chmod", &path, e))?;
        Ok(Staging { path: Some(path) })
    }

    pub(crate) fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new(""))
    }

    /// Keeps the directory (it was renamed into place).
    pub(crate) fn keep(mut self) {
        self.path = None;
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = remove_tree(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn save_replaces_the_file_whole_with_its_mode_and_no_debris() {
        let workspace = tempfile::tempdir().unwrap();
        let path = workspace.path().join(".arcane/registry.json");
        let document = Document {
            version: FORMAT_VERSION,
            ..Document::default()
        };
        save(workspace.path(), &path, &document).unwrap();
        save(workspace.path(), &path, &document).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, REGISTRY_MODE);
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("registry.json")]);
        assert_eq!(
            load(workspace.path(), &path).unwrap().version,
            FORMAT_VERSION
        );
    }
}
