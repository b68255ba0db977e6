//! The registry file, `.arcane/registry.json`, and the file-system steps every mutation
//! shares.
//!
//! The file is `{"version": 1, "runtimes": [...], "models": [...]}`. Paths under the
//! workspace are stored relative to it (so a moved workspace keeps working) and are
//! absolute in memory. Writes go to `registry.json.tmp-<pid>`, are fsynced, renamed over
//! the old file, and the directory is fsynced: a reader sees the old or the new file,
//! never a mix. Writers hold the workspace operation lock and re-read the file inside it.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Error, Model, Runtime};

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
}

/// Reads the registry (an absent file is an empty registry).
pub(crate) fn load(workspace: &Path, path: &Path) -> Result<Document, Error> {
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

/// Writes the registry atomically (temp name, fsync, rename, fsync of the directory).
pub(crate) fn save(workspace: &Path, path: &Path, document: &Document) -> Result<(), Error> {
    let mut stored = Document {
        version: FORMAT_VERSION,
        runtimes: document.runtimes.clone(),
        models: document.models.clone(),
    };
    map_paths(&mut stored, workspace, relative);
    let mut text = serde_json::to_vec_pretty(&stored)
        .map_err(|e| Error::io("serialize", path, std::io::Error::other(e)))?;
    text.push(b'\n');
    let dir = path.parent().unwrap_or(workspace);
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    let temp = dir.join(format!(
        "{}.tmp-{}",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("registry.json"),
        std::process::id()
    ));
    let result = (|| {
        let mut file = File::create(&temp).map_err(|e| Error::io("create", &temp, e))?;
        file.write_all(&text)
            .map_err(|e| Error::io("write", &temp, e))?;
        file.sync_all().map_err(|e| Error::io("sync", &temp, e))?;
        std::fs::rename(&temp, path).map_err(|e| Error::io("rename", &temp, e))?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// Fsyncs a directory so a rename inside it survives a crash.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), Error> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("sync", dir, e))
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
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
        let path = staging_path(dir, label);
        std::fs::create_dir(&path).map_err(|e| Error::io("create", &path, e))?;
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
