//! The records the registry keeps: [`Runtime`], [`Model`] and their parts. They are
//! serialized (camelCase) both in `.arcane/registry.json` and in `--output json`.

use std::path::{Path, PathBuf};

use arcane_devices::Backend;
use serde::{Deserialize, Serialize};

use crate::Error;

pub use arcane_workspace::Engine;

/// Where an installed runtime's archive came from, and the digest it was checked against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveOrigin {
    /// The archive's path or URL, as given.
    pub location: String,
    /// The archive's SHA-256 (verified before extraction).
    pub sha256: String,
}

/// A registered engine runtime: an executable Arcane can start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Runtime {
    /// The registry id (`llama.cpp`, `ollama`, `llama.cpp-b4500-cuda`, …).
    pub id: String,
    /// Which engine it is.
    pub engine: Engine,
    /// The engine version: `b<build>` for llama.cpp release builds (the release tag) or
    /// the version a packaged build prints (`0.6.0-dev`), the release for Ollama, or the
    /// `--version` given at install.
    pub version: String,
    /// The line of `--version` output the version came from (e.g. `version: 4500 (adef0123)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_info: Option<String>,
    /// The compute backend the runtime was built for (`auto` when unknown, as for Ollama).
    pub backend: Backend,
    /// The server executable (absolute).
    pub executable: PathBuf,
    /// Directories holding the runtime's shared libraries: first on the loader's search
    /// path of the engine (the rule is [`arcane_process::loader_path`]).
    #[serde(default)]
    pub library_dirs: Vec<PathBuf>,
    /// Whether Arcane installed it under `.arcane/runtimes/` (and removes it with the record).
    pub installed: bool,
    /// The install directory, for installed runtimes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<PathBuf>,
    /// The verified archive it was installed from, for installed runtimes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<ArchiveOrigin>,
    /// When it was registered (RFC 3339 UTC).
    pub added_at: String,
}

/// A registered runtime that is a shared library the Core loads in its worker
/// processes (`arcane runtime add <kind> --library PATH`: ONNX Runtime), not an engine
/// executable it supervises, hence a record of its own, listed per kind
/// ([`crate::Registry::library_runtimes`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LibraryRuntime {
    /// The id (default: its kind's id), unique among all runtimes.
    pub id: String,
    /// The version the library reports (`1.31.1`).
    pub version: String,
    /// The library (`libonnxruntime.so.<version>`), absolute.
    pub library: PathBuf,
    /// When it was registered (RFC 3339 UTC).
    pub added_at: String,
}

/// How a model's file came into `.arcane/models/<id>/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Storage {
    /// A hard link to the source file (same file system; no extra space used).
    HardLink,
    /// A copy of the source file.
    Copy,
    /// Downloaded from a URL and verified against its SHA-256.
    Download,
}

/// What a file looked like when it was registered: enough to notice, without reading
/// it, that it changed (a hard-linked source edited in place keeps its inode but not
/// its modification or change time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileStamp {
    /// Device number.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub modified_ns: i64,
    /// Status change time, nanoseconds since the epoch.
    pub changed_ns: i64,
}

impl FileStamp {
    /// The stamp of the file at `path` (not following a final symbolic link).
    pub fn of(path: &std::path::Path) -> std::io::Result<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(path)?;
        let ns = |secs: i64, nanos: i64| secs.saturating_mul(1_000_000_000).saturating_add(nanos);
        Ok(FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            modified_ns: ns(meta.mtime(), meta.mtime_nsec()),
            changed_ns: ns(meta.ctime(), meta.ctime_nsec()),
        })
    }
}

/// A registered model: a GGUF file (served by llama.cpp), an ONNX graph (run by the
/// `onnx` service) or a whisper.cpp speech-recognition model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Model {
    /// The registry id (`smollm2-135m`, …).
    pub id: String,
    /// The model file (absolute), `<workspace>/.arcane/models/<id>/<file name>`.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256, 64 lowercase hex digits.
    pub sha256: String,
    /// What its header said when it was added, under its format reader's keys
    /// (`gguf`, `onnx`, `whisper`, a Piper voice's `onnx` and `piper`): see
    /// [`crate::FormatReader`].
    #[serde(flatten)]
    pub header: crate::Header,
    /// The path or URL it was added from.
    pub source: String,
    /// How the file was stored.
    pub storage: Storage,
    /// When it was registered (RFC 3339 UTC).
    pub added_at: String,
    /// The stored file's stamp when it was registered (absent in records written before
    /// stamps were kept: then only the size is compared cheaply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stamp: Option<FileStamp>,
}

impl Model {
    /// What kind of model it is, from the header it was registered with (`gguf`,
    /// `onnx`, `whisper`, `piper-voice`: [`crate::FormatReader::kind`]), or `unknown`.
    pub fn kind(&self) -> &'static str {
        crate::reader_of_record(&self.header).map_or("unknown", |r| r.kind())
    }

    /// The format its header says it is in (`None`: unknown): what decides which engine
    /// kind serves it ([`arcane_workspace::Engine::for_format`]).
    pub fn format(&self) -> Option<arcane_workspace::ModelFormat> {
        crate::reader_of_record(&self.header).map(|r| r.format())
    }

    /// What `arcane model list` and `show` say of it, from its header.
    pub fn summary(&self) -> crate::Summary {
        crate::reader_of_record(&self.header)
            .map(|r| r.summary(&self.header))
            .unwrap_or_else(|| crate::Summary {
                family: "-".into(),
                description: "unknown format".into(),
                ..crate::Summary::default()
            })
    }

    /// The files that travel with its model file, beside it (a Piper voice's
    /// configuration): [`arcane_workspace::ModelFormat::companions`].
    pub fn companions(&self) -> Vec<PathBuf> {
        let (Some(format), Some(name)) = (self.format(), self.file_name()) else {
            return Vec::new();
        };
        format
            .companions_of(name)
            .into_iter()
            .map(|companion| self.path.with_file_name(companion))
            .collect()
    }

    /// The model file's name.
    pub fn file_name(&self) -> Option<&str> {
        self.path.file_name().and_then(|n| n.to_str())
    }
}

/// A file on this machine or an `http(s)://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A local file.
    File(PathBuf),
    /// An `http://` or `https://` URL.
    Url(String),
}

impl Source {
    /// `http://…` and `https://…` are URLs; any other `scheme://` is refused; the rest is a path.
    pub fn parse(value: &str) -> Result<Source, Error> {
        let lower = value.to_ascii_lowercase();
        if lower.starts_with("http://") || lower.starts_with("https://") {
            Ok(Source::Url(value.to_string()))
        } else if lower.contains("://") {
            Err(Error::InvalidUrl {
                url: value.to_string(),
            })
        } else {
            Ok(Source::File(PathBuf::from(value)))
        }
    }

    /// The path or URL as text.
    pub fn display(&self) -> String {
        match self {
            Source::File(path) => path.display().to_string(),
            Source::Url(url) => url.clone(),
        }
    }

    /// The last path segment (a file name) of the path or URL, if any.
    pub(crate) fn file_name(&self) -> Option<String> {
        match self {
            Source::File(path) => path.file_name().map(|n| n.to_string_lossy().into_owned()),
            Source::Url(url) => {
                let path = url.split(['?', '#']).next().unwrap_or("");
                let after_scheme = path.split_once("://").map(|(_, rest)| rest).unwrap_or(path);
                let (_, path) = after_scheme.split_once('/')?;
                path.rsplit('/')
                    .next()
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
            }
        }
    }
}

/// Makes a file name safe for `.arcane/models/<id>/`: keeps `[A-Za-z0-9._-]`, replaces
/// anything else with `_`, never starts with `.`; falls back to `model.gguf`.
pub(crate) fn safe_file_name(name: Option<String>) -> String {
    let cleaned: String = name
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let cleaned = cleaned.trim_start_matches('.').to_string();
    if cleaned.is_empty() {
        "model.gguf".to_string()
    } else {
        cleaned
    }
}

/// Whether `path` lies under `dir` (lexically).
pub(crate) fn is_under(path: &Path, dir: &Path) -> bool {
    path.starts_with(dir) && path != dir
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_and_file_names() {
        assert_eq!(
            Source::parse("https://h/x/m.gguf?d=1")
                .unwrap()
                .file_name()
                .as_deref(),
            Some("m.gguf")
        );
        assert_eq!(Source::parse("http://h").unwrap().file_name(), None);
        assert_eq!(
            Source::parse("/a/b.gguf").unwrap(),
            Source::File("/a/b.gguf".into())
        );
        assert!(matches!(
            Source::parse("ftp://h/x"),
            Err(Error::InvalidUrl { .. })
        ));
        assert_eq!(
            safe_file_name(Some("..evil name?.gguf".into())),
            "evil_name_.gguf"
        );
        assert_eq!(safe_file_name(None), "model.gguf");
    }
}
