//! The crate's one error type. Every variant names the offending value in its
//! message and in [`Diagnostic::details`], and maps to one stable code.

use std::path::PathBuf;

use arcane_report::{codes, Diagnostic};
use arcane_workspace::Engine;
use serde_json::{json, Value};

/// Everything that can go wrong while reading or changing the registry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An id does not match `[a-z0-9][a-z0-9._-]*` (at most 100 characters).
    #[error("invalid {kind} id `{value}`: use lowercase letters, digits, `.`, `_` and `-`, starting with a letter or digit")]
    InvalidId {
        /// `runtime` or `model`.
        kind: &'static str,
        /// The rejected id.
        value: String,
    },
    /// A version tag is not usable in an id or a directory name.
    #[error("invalid version `{value}`: use lowercase letters, digits, `.`, `_` and `-`, starting with a letter or digit")]
    InvalidVersion {
        /// The rejected version.
        value: String,
    },
    /// An install without the run check has no version to go by.
    #[error("the version of `{archive}` is unknown: it is not in the archive's name and the executable was not run")]
    VersionRequired {
        /// The archive (path or URL).
        archive: String,
    },
    /// A SHA-256 digest is not 64 hexadecimal digits.
    #[error("invalid SHA-256 digest `{value}`: expected 64 hexadecimal digits")]
    InvalidDigest {
        /// The rejected digest.
        value: String,
    },
    /// A URL was given without the SHA-256 it must match.
    #[error("`{url}` needs `--sha256`: downloads are always verified")]
    MissingDigest {
        /// The URL.
        url: String,
    },
    /// An engine kind that is not registered as a server executable (or no kind at
    /// all).
    #[error(
        "`{value}` is not an engine registered by its executable: expected {}",
        registrable()
    )]
    UnknownEngine {
        /// The rejected name.
        value: String,
    },
    /// A URL is not `http://` or `https://`.
    #[error("unsupported URL `{url}`: only `http://` and `https://` are supported")]
    InvalidUrl {
        /// The rejected URL.
        url: String,
    },
    /// No runtime has this id.
    #[error("no runtime `{id}` is registered{}", known_list(known))]
    RuntimeNotFound {
        /// The id asked for.
        id: String,
        /// Every registered runtime id.
        known: Vec<String>,
    },
    /// A runtime library is missing, is not what its kind loads, or is too old (its
    /// kind's own error: the message names the path and the minimum version).
    #[error("{0}")]
    Library(Box<dyn Diagnostic>),
    /// No model has this id.
    #[error("no model `{id}` is registered{}", known_list(known))]
    ModelNotFound {
        /// The id asked for.
        id: String,
        /// Every registered model id.
        known: Vec<String>,
    },
    /// No runtime of this engine is registered.
    #[error("no `{engine}` runtime is registered")]
    NoRuntimeForEngine {
        /// The engine asked for.
        engine: String,
    },
    /// Several runtimes of this engine are registered and none has the engine's name as id.
    #[error("several `{engine}` runtimes are registered ({}) and none is called `{engine}`", candidates.join(", "))]
    AmbiguousRuntime {
        /// The engine asked for.
        engine: String,
        /// The ids of its runtimes.
        candidates: Vec<String>,
    },
    /// A runtime with this id is already registered.
    #[error("a runtime `{id}` is already registered")]
    RuntimeExists {
        /// The id.
        id: String,
    },
    /// A model with this id is already registered.
    #[error("a model `{id}` is already registered")]
    ModelExists {
        /// The id.
        id: String,
    },
    /// The destination of an install or a model already exists on disk.
    #[error("`{}` already exists; an earlier install is never overwritten", path.display())]
    DestinationExists {
        /// The existing path.
        path: PathBuf,
    },
    /// The executable could not be started.
    #[error("runtime executable `{}` does not run", executable.display())]
    ExecutableDoesNotRun {
        /// The executable.
        executable: PathBuf,
        /// Why it could not be started.
        #[source]
        source: std::io::Error,
    },
    /// The executable ran but `--version` failed.
    #[error("runtime executable `{}` failed `--version` ({status}){}", executable.display(), last_line(output))]
    ExecutableFailed {
        /// The executable.
        executable: PathBuf,
        /// How it exited.
        status: String,
        /// The end of what it printed.
        output: String,
    },
    /// The executable did not finish `--version` in time.
    #[error("runtime executable `{}` did not finish `--version` within {seconds} s", executable.display())]
    ExecutableTimedOut {
        /// The executable.
        executable: PathBuf,
        /// The limit.
        seconds: u64,
    },
    /// The executable's `--version` output names no version of the expected engine.
    #[error("`{} --version` printed no `{engine}` version", executable.display())]
    VersionUnknown {
        /// The executable.
        executable: PathBuf,
        /// The engine it was expected to be.
        engine: String,
        /// The end of what it printed.
        output: String,
    },
    /// An archive holds no engine executable.
    #[error("archive `{archive}` contains no `{name}` executable")]
    ExecutableNotInArchive {
        /// The archive (path or URL).
        archive: String,
        /// The executable's file name.
        name: String,
    },
    /// A file is not a GGUF model this crate can read.
    #[error("`{}` is not a valid GGUF model: {reason}", path.display())]
    ModelInvalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
        /// The bytes found where the problem is, in hex (the magic for a non-GGUF file).
        found: Option<String>,
    },
    /// A file its format's reader claims that is not a usable model of that format (a
    /// hostile count, a truncation, an impossible tensor): `details.check` is the
    /// refusal's own stable code, `details.format` the format's record key.
    #[error("`{}` is not a valid {label} model: {reason}", path.display())]
    FormatInvalid {
        /// The file.
        path: PathBuf,
        /// What users call the format (`whisper.cpp`).
        label: &'static str,
        /// The key its header is recorded under (`whisper`).
        format: &'static str,
        /// Why, naming the offending field and value.
        reason: String,
        /// The refusal's fields, `check` (its stable code) among them.
        details: serde_json::Value,
    },
    /// Bytes did not hash to the expected SHA-256.
    #[error("SHA-256 of `{subject}` is {actual}, expected {expected}")]
    IntegrityFailed {
        /// The file or URL.
        subject: String,
        /// The digest that was asked for.
        expected: String,
        /// The digest of the bytes received.
        actual: String,
    },
    /// A registered model's file no longer has the bytes it was registered with (a
    /// hard-linked source edited in place, or the stored file replaced).
    #[error("model `{id}` changed since it was registered: `{}` {}", path.display(), match actual { Some(actual) => format!("now has SHA-256 {actual}, not {expected}"), None => "is missing or not a regular file".to_string() })]
    ModelChanged {
        /// The model id.
        id: String,
        /// The stored file.
        path: PathBuf,
        /// Where it was added from.
        source_path: String,
        /// The SHA-256 recorded when it was added.
        expected: String,
        /// What it hashes to now (`None`: missing or not a regular file).
        actual: Option<String>,
    },
    /// A registry file another user could have written (`StrictModes`).
    #[error("refusing to read `{}`: {detail}", path.display())]
    Untrusted {
        /// The file.
        path: PathBuf,
        /// What is wrong (owner, mode).
        detail: String,
        /// How to fix it.
        fix: String,
    },
    /// The file changed while it was being read (hashed or copied).
    #[error("`{}` changed while it was being read; nothing was registered", path.display())]
    SourceChanged {
        /// The file.
        path: PathBuf,
    },
    /// A download ended before `Content-Length` bytes arrived.
    #[error("download of `{url}` was truncated: received {received} of {expected} bytes")]
    Truncated {
        /// The URL.
        url: String,
        /// The announced length.
        expected: u64,
        /// The bytes received.
        received: u64,
    },
    /// An archive entry would land outside the install directory, or is not allowed.
    #[error("archive `{archive}` has an unsafe entry `{entry}`: {reason}")]
    UnsafeArchiveEntry {
        /// The archive (path or URL).
        archive: String,
        /// The entry's path as stored.
        entry: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// An archive is neither a zip nor a gzip-compressed tar, or could not be read.
    #[error("cannot read archive `{archive}`: {reason}")]
    ArchiveInvalid {
        /// The archive (path or URL).
        archive: String,
        /// What is wrong.
        reason: String,
        /// The underlying error, if any.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// An archive expands past a limit of [`crate::InstallRuntime`]: extraction stopped
    /// there and everything it wrote was removed.
    #[error("{}", too_large(archive, *limit, *max_bytes, *max_ratio, *archive_bytes))]
    ArchiveTooLarge {
        /// The archive (path or URL).
        archive: String,
        /// Which limit it passed.
        limit: ExtractLimit,
        /// The limit on the extracted bytes, all files together.
        max_bytes: u64,
        /// The limit on the extracted bytes as a multiple of the archive's size.
        max_ratio: u64,
        /// The archive's own size in bytes.
        archive_bytes: u64,
    },
    /// An HTTP download failed.
    #[error("download of `{url}` failed")]
    Download {
        /// The URL.
        url: String,
        /// The transport error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// An HTTP server answered with an error status.
    #[error("download of `{url}` failed with HTTP status {status}")]
    HttpStatus {
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
    },
    /// The operation was cancelled; everything it created was removed.
    #[error("{operation} was cancelled")]
    Cancelled {
        /// What was cancelled (`model-add`, `runtime-install`, `hashing`).
        operation: String,
    },
    /// A file system operation failed.
    #[error("cannot {action} `{}`", path.display())]
    Io {
        /// What was being done (`read`, `create`, `rename`, …).
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The registry file is not valid JSON of the expected shape.
    #[error("the registry file `{}` is corrupt", path.display())]
    RegistryCorrupt {
        /// The registry file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The registry file was written by a newer Arcane.
    #[error("the registry file `{}` has format version {found}, this Arcane reads version {supported}", path.display())]
    RegistryVersion {
        /// The registry file.
        path: PathBuf,
        /// The version found.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The workspace operation lock could not be taken or kept.
    #[error(transparent)]
    Lock(Box<arcane_lock::Error>),
}

impl From<arcane_lock::Error> for Error {
    fn from(error: arcane_lock::Error) -> Self {
        Error::Lock(Box::new(error))
    }
}

/// `: <last line>` of a program's output, or nothing when it printed nothing.
fn last_line(output: &str) -> String {
    output
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .map(|l| format!(": {l}"))
        .unwrap_or_default()
}

fn registrable() -> String {
    let names: Vec<String> = Engine::registrable().map(|e| format!("`{e}`")).collect();
    names.join(" or ")
}

fn known_list(known: &[String]) -> String {
    if known.is_empty() {
        " (none are registered)".to_string()
    } else {
        format!(" (known: {})", known.join(", "))
    }
}

impl Error {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn cancelled(operation: impl Into<String>) -> Self {
        Error::Cancelled {
            operation: operation.into(),
        }
    }

    /// Whether this error means the operation was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.code() == codes::ARCANE_CANCELLED
    }
}

impl Diagnostic for Error {
    fn code(&self) -> &'static str {
        match self {
            Error::InvalidId { .. }
            | Error::InvalidVersion { .. }
            | Error::VersionRequired { .. }
            | Error::InvalidDigest { .. }
            | Error::MissingDigest { .. }
            | Error::UnknownEngine { .. }
            | Error::InvalidUrl { .. }
            | Error::AmbiguousRuntime { .. } => codes::ARCANE_USAGE,
            Error::RuntimeNotFound { .. }
            | Error::ModelNotFound { .. }
            | Error::NoRuntimeForEngine { .. } => codes::ARCANE_NOT_FOUND,
            Error::RuntimeExists { .. }
            | Error::ModelExists { .. }
            | Error::DestinationExists { .. } => codes::ARCANE_ALREADY_EXISTS,
            Error::ExecutableDoesNotRun { .. }
            | Error::ExecutableFailed { .. }
            | Error::ExecutableTimedOut { .. }
            | Error::VersionUnknown { .. }
            | Error::ExecutableNotInArchive { .. } => codes::LOCAL_AI_RUNTIME_INVALID,
            Error::ModelInvalid { .. } | Error::FormatInvalid { .. } => {
                codes::LOCAL_AI_MODEL_INVALID
            }
            Error::IntegrityFailed { .. }
            | Error::Truncated { .. }
            | Error::ModelChanged { .. } => codes::ARCANE_INTEGRITY_FAILED,
            Error::UnsafeArchiveEntry { .. }
            | Error::ArchiveTooLarge { .. }
            | Error::Untrusted { .. } => codes::ARCANE_POLICY_DENIED,
            Error::ArchiveInvalid { .. }
            | Error::Download { .. }
            | Error::HttpStatus { .. }
            | Error::RegistryCorrupt { .. }
            | Error::RegistryVersion { .. }
            | Error::SourceChanged { .. } => codes::ARCANE_OPERATION_FAILED,
            Error::Cancelled { .. } => codes::ARCANE_CANCELLED,
            Error::Io { .. } => codes::ARCANE_IO,
            Error::Lock(error) => error.code(),
            Error::Library(error) => error.code(),
        }
    }

    fn details(&self) -> Value {
        match self {
            Error::InvalidId { kind, value } => json!({"kind": kind, "id": value}),
            Error::InvalidVersion { value } => json!({"version": value}),
            Error::VersionRequired { archive } => json!({"archive": archive}),
            Error::InvalidDigest { value } => json!({"sha256": value}),
            Error::MissingDigest { url } => json!({"url": url}),
            Error::UnknownEngine { value } => json!({"engine": value}),
            Error::InvalidUrl { url } => json!({"url": url}),
            Error::RuntimeNotFound { id, known } => json!({"id": id, "known": known}),
            Error::ModelNotFound { id, known } => json!({"id": id, "known": known}),
            Error::NoRuntimeForEngine { engine } => json!({"engine": engine}),
            Error::AmbiguousRuntime { engine, candidates } => {
                json!({"engine": engine, "candidates": candidates})
            }
            Error::RuntimeExists { id } => json!({"id": id}),
            Error::ModelExists { id } => json!({"id": id}),
            Error::DestinationExists { path } => json!({"path": path}),
            Error::ExecutableDoesNotRun { executable, source } => {
                json!({"executable": executable, "error": source.to_string()})
            }
            Error::ExecutableFailed {
                executable,
                status,
                output,
            } => json!({"executable": executable, "status": status, "output": output}),
            Error::ExecutableTimedOut {
                executable,
                seconds,
            } => json!({"executable": executable, "seconds": seconds}),
            Error::VersionUnknown {
                executable,
                engine,
                output,
            } => json!({"executable": executable, "engine": engine, "output": output}),
            Error::ExecutableNotInArchive { archive, name } => {
                json!({"archive": archive, "executable": name})
            }
            Error::ModelInvalid {
                path,
                reason,
                found,
            } => json!({"path": path, "reason": reason, "found": found}),
            Error::FormatInvalid {
                path,
                format,
                reason,
                details,
                ..
            } => {
                let mut details = details.clone();
                details["path"] = json!(path);
                details["format"] = json!(format);
                details["reason"] = json!(reason);
                details
            }
            Error::IntegrityFailed {
                subject,
                expected,
                actual,
            } => json!({"subject": subject, "expected": expected, "actual": actual}),
            Error::SourceChanged { path } => json!({"path": path}),
            Error::Untrusted { path, detail, .. } => {
                json!({"path": path, "reason": "untrusted", "detail": detail})
            }
            Error::ModelChanged {
                id,
                path,
                source_path,
                expected,
                actual,
            } => {
                json!({"id": id, "path": path, "source": source_path, "expected": expected, "actual": actual})
            }
            Error::Truncated {
                url,
                expected,
                received,
            } => json!({"url": url, "expectedBytes": expected, "receivedBytes": received}),
            Error::UnsafeArchiveEntry {
                archive,
                entry,
                reason,
            } => {
                json!({"archive": archive, "entry": entry, "reason": reason})
            }
            Error::ArchiveInvalid {
                archive, reason, ..
            } => json!({"archive": archive, "reason": reason}),
            Error::ArchiveTooLarge {
                archive,
                limit,
                max_bytes,
                max_ratio,
                archive_bytes,
            } => json!({
                "archive": archive,
                "limit": limit.as_str(),
                "maxExtractedBytes": max_bytes,
                "maxExpansionRatio": max_ratio,
                "archiveBytes": archive_bytes,
            }),
            Error::Download { url, .. } => json!({"url": url}),
            Error::HttpStatus { url, status } => json!({"url": url, "status": status}),
            Error::Cancelled { operation } => json!({"operation": operation}),
            Error::Io {
                action,
                path,
                source,
            } => {
                json!({"action": action, "path": path, "kind": format!("{:?}", source.kind())})
            }
            Error::RegistryCorrupt { path, source } => {
                json!({"path": path, "line": source.line(), "column": source.column()})
            }
            Error::RegistryVersion {
                path,
                found,
                supported,
            } => {
                json!({"path": path, "found": found, "supported": supported})
            }
            Error::Lock(error) => error.details(),
            Error::Library(error) => error.details(),
        }
    }

    fn hints(&self) -> Vec<String> {
        match self {
            Error::InvalidId { .. } => {
                vec![format!("ids look like `smollm2-135m` or `{}-b4500`", Engine::DEFAULT)]
            }
            Error::VersionRequired { .. } => {
                vec!["pass `--version TAG` (e.g. `--version b4500`)".into()]
            }
            Error::RuntimeNotFound { .. } => {
                vec!["list runtimes with `arcane runtime list`; register one with `arcane runtime add`".into()]
            }
            Error::UnknownEngine { value } => {
                let builtin = value.parse::<arcane_workspace::Engine>().is_ok_and(|e| {
                    matches!(e.kind().starts(), arcane_workspace::Starts::Builtin { .. })
                });
                if builtin {
                    vec![format!("`{value}` runs inside arcane, nothing to register: add its model (`arcane model add ID --file FILE`) and name it in a `[[model]]` table (docs/speech.md)")]
                } else {
                    Vec::new()
                }
            }
            Error::ModelNotFound { .. } => {
                vec![
                    "list models with `arcane model list`; register one with `arcane model add`"
                        .into(),
                ]
            }
            Error::NoRuntimeForEngine { engine } => {
                vec![format!(
                    "register one with `arcane runtime add {engine} --executable PATH`"
                )]
            }
            Error::AmbiguousRuntime { .. } => vec!["name the runtime by its id".into()],
            Error::RuntimeExists { .. } => {
                vec!["pass `--id` to register another runtime, or `arcane runtime remove` the old one first".into()]
            }
            Error::ModelExists { id } => vec![format!(
                "remove it first with `arcane model remove {id}`, or pick another id"
            )],
            Error::DestinationExists { path } => vec![
                format!(
                    "if no registered runtime or model uses `{}`, it is left over from an interrupted operation: delete it, or choose another id or `--version`",
                    path.display()
                ),
            ],
            Error::ExecutableDoesNotRun { .. }
            | Error::ExecutableFailed { .. }
            | Error::VersionUnknown { .. } => {
                let executables: Vec<String> = Engine::registrable()
                    .filter_map(|e| match e.kind().starts() {
                        arcane_workspace::Starts::Server { executable } => {
                            Some(format!("`{executable}`"))
                        }
                        _ => None,
                    })
                    .collect();
                vec![format!(
                    "pass the engine's own executable ({}), built for this machine",
                    executables.join(" or ")
                )]
            }
            Error::IntegrityFailed { .. } | Error::Truncated { .. } => {
                vec![
                    "check the `--sha256` value against the publisher's checksum, then try again"
                        .into(),
                ]
            }
            Error::ArchiveTooLarge { limit, .. } => vec![match limit {
                ExtractLimit::Size => "if you trust this archive, raise the limit: `arcane runtime install … --max-extracted-size SIZE` (e.g. `8GiB`)".into(),
                ExtractLimit::Ratio => "if you trust this archive, raise the limit: `arcane runtime install … --max-expansion-ratio N`".into(),
            }],
            Error::Untrusted { fix, .. } => vec![fix.clone()],
            Error::SourceChanged { .. } => vec![
                "something wrote to the file while Arcane read it: let that finish, then run the command again".into(),
            ],
            Error::ModelChanged { id, source_path, .. } => vec![format!(
                "if the new bytes are what you want, re-register it: `arcane model remove {id}` then `arcane model add {id} --file {source_path}`"
            )],
            Error::Cancelled { .. } => Vec::new(),
            Error::Lock(error) => error.hints(),
            Error::Library(error) => error.hints(),
            _ => Vec::new(),
        }
    }
}

/// The limit an archive passed while it was extracted ([`Error::ArchiveTooLarge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExtractLimit {
    /// The total of the extracted bytes.
    Size,
    /// The extracted bytes as a multiple of the archive's size.
    Ratio,
}

impl ExtractLimit {
    /// The limit's name in [`Diagnostic::details`]: `size` or `ratio`.
    pub fn as_str(self) -> &'static str {
        match self {
            ExtractLimit::Size => "size",
            ExtractLimit::Ratio => "ratio",
        }
    }
}

fn too_large(
    archive: &str,
    limit: ExtractLimit,
    max_bytes: u64,
    max_ratio: u64,
    archive_bytes: u64,
) -> String {
    match limit {
        ExtractLimit::Size => format!(
            "archive `{archive}` expands to more than {max_bytes} bytes, the limit for an install; nothing was installed"
        ),
        ExtractLimit::Ratio => format!(
            "archive `{archive}` expands to more than {max_ratio} times its size of {archive_bytes} bytes, the limit for an install; nothing was installed"
        ),
    }
}

impl From<arcane_workspace::UnknownEngine> for Error {
    fn from(error: arcane_workspace::UnknownEngine) -> Self {
        Error::UnknownEngine { value: error.value }
    }
}
