//! Ownership records: how a later Arcane finds, and stops, an engine that an earlier
//! Arcane started and then lost (it was killed before it could stop its child, and the
//! parent-death signal was not armed or not delivered).
//!
//! # The record
//!
//! `<workspace>/.arcane/engines/<id>.json`, written atomically (temporary file, fsync,
//! rename) right after the spawn and removed after the stop, both under the workspace
//! operation lock (held only for that mutation, never for the server's life):
//!
//! ```json
//! {"schemaVersion": 1, "kind": "arcane-engine-ownership", "id": "llama.cpp",
//!  "engine": "llama.cpp", "url": "http://127.0.0.1:8080", "port": 8080,
//!  "pid": 4242, "startTime": 123456, "exe": "/…/llama-server",
//!  "executable": "/…/llama-server", "nonce": "9f…",
//!  "owner": {"pid": 4200, "startTime": 123400}, "createdAt": "…"}
//! ```
//!
//! # The proof
//!
//! [`arcane_process::ownership`]'s, shared with the ONNX workers: pid with the
//! recorded start time, the recorded executable, the recorded `ARCANE_ENGINE_NONCE` in
//! its environment, and its owner gone (a live owner still supervises its engine,
//! which is then left alone and may be adopted).
//!
//! A record whose process is gone, or fails the proof, is stale and is removed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arcane_report::event_types;
use arcane_report::{Event, EventSink};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::process;
use crate::Error;

const KIND: &str = "arcane-engine-ownership";

/// How long a record write waits for another operation's workspace lock.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The Arcane process that spawned an engine.
pub(crate) use arcane_process::ownership::Owner;

/// One ownership record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Record {
    pub schema_version: u32,
    pub kind: String,
    pub id: String,
    pub engine: String,
    pub url: String,
    pub port: u16,
    pub pid: u32,
    pub start_time: u64,
    pub exe: PathBuf,
    pub executable: PathBuf,
    pub nonce: String,
    pub owner: Owner,
    pub created_at: String,
}

/// What a record says about its process now.
pub(crate) use arcane_process::ownership::Judgement;

/// Creates the workspace (mode 0700, private to the user like the lock's own directory)
/// when nothing exists there: a first `serve` may run before anything else created it.
fn ensure_workspace(workspace: &Path) -> Result<(), Error> {
    if workspace.is_dir() {
        return Ok(());
    }
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(workspace)
        .map_err(|source| Error::Io {
            operation: "create",
            path: workspace.to_path_buf(),
            source,
        })
}

/// Checks, before an engine starts, that `.arcane/engines` is a physical directory of the
/// workspace (created 0700 when missing), so no record is ever written through a link.
pub(crate) async fn check_dir(workspace: &Path) -> Result<(), Error> {
    let workspace = workspace.to_path_buf();
    let engines = arcane_workspace::layout::engines_dir(&workspace);
    let checked = tokio::task::spawn_blocking(move || {
        ensure_workspace(&workspace)?;
        arcane_lock::state_subdir(&workspace, "engines")
            .map(|_| ())
            .map_err(|source| Error::RecordsRefused {
                path: arcane_workspace::layout::engines_dir(&workspace),
                source,
            })
    })
    .await;
    checked.unwrap_or_else(|_| {
        Err(Error::Io {
            operation: "check",
            path: engines,
            source: std::io::Error::other("the check did not finish"),
        })
    })
}

/// The record file of server `id`.
pub(crate) fn path(workspace: &Path, id: &str) -> PathBuf {
    arcane_workspace::layout::engine_record(workspace, id)
}

/// This process as an owner.
pub(crate) fn current_owner() -> Owner {
    Owner::current()
}

/// Reads the record of `id`; a missing or unreadable record is `None`.
pub(crate) fn read(workspace: &Path, id: &str) -> Option<Record> {
    let bytes = std::fs::read(path(workspace, id)).ok()?;
    let record: Record = serde_json::from_slice(&bytes).ok()?;
    (record.kind == KIND && record.schema_version == 1).then_some(record)
}

/// Judges a record against the live system (the proof of
/// [`arcane_process::ownership`]).
pub(crate) fn judge(record: &Record) -> Judgement {
    arcane_process::ownership::judge(&arcane_process::ownership::Claim {
        pid: record.pid,
        start_time: record.start_time,
        exe: &record.exe,
        nonce: (crate::command::NONCE_VARIABLE, &record.nonce),
        owner: &record.owner,
    })
}

/// The permission bits of an ownership record.
const RECORD_MODE: u32 = 0o644;

/// Writes `record` atomically (through [`arcane_files::write_atomic`]).
pub(crate) fn write(workspace: &Path, record: &Record) -> Result<(), Error> {
    let target = path(workspace, &record.id);
    let Some(dir) = target.parent() else {
        return Ok(());
    };
    let io = |operation, path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io {
            operation,
            path,
            source,
        }
    };
    arcane_files::create_private_dirs(dir).map_err(io("create", dir))?;
    let mut bytes = serde_json::to_vec_pretty(record).map_err(|e| Error::Io {
        operation: "serialize",
        path: target.clone(),
        source: std::io::Error::other(e),
    })?;
    bytes.push(b'\n');
    arcane_files::write_atomic(&target, &bytes, RECORD_MODE).map_err(io("write", &target))
}

/// Removes the record of `id` if it still carries `nonce` (never someone else's).
pub(crate) fn remove(workspace: &Path, id: &str, nonce: &str) -> Result<(), Error> {
    match read(workspace, id) {
        Some(record) if record.nonce == nonce => remove_file(workspace, id),
        _ => Ok(()),
    }
}

/// Removes the record of `id` unconditionally (a stale or reaped record).
pub(crate) fn remove_file(workspace: &Path, id: &str) -> Result<(), Error> {
    let target = path(workspace, id);
    match std::fs::remove_file(&target) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Io {
            operation: "remove",
            path: target,
            source,
        }),
    }
}

/// A fresh random nonce (128 bits from the kernel, as hex).
pub(crate) fn new_nonce() -> std::io::Result<String> {
    arcane_files::secret_hex(16)
}

/// Runs `f` while holding the workspace operation lock (`operation` names it), on a
/// blocking thread: the lock is held only for this one mutation.
pub(crate) async fn with_lock<T: Send + 'static>(
    workspace: &Path,
    engine: &str,
    events: &Arc<dyn EventSink>,
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    let workspace = workspace.to_path_buf();
    let engine = engine.to_string();
    let events = events.clone();
    tokio::task::spawn_blocking(move || {
        ensure_workspace(&workspace)?;
        let lock_error = |source| Error::Lock {
            engine: engine.clone(),
            source,
        };
        // Another operation (a model being added) may hold the lock briefly: wait for it.
        let options = arcane_lock::AcquireOptions::new("serve")
            .map_err(lock_error)?
            .wait(LOCK_WAIT);
        // Only waiting and recovery are worth telling; locked/released on every record
        // write would drown the server's own events.
        let filtered = |event: Event| {
            if event.kind == event_types::WORKSPACE_OPERATION_WAITING
                || event.kind == event_types::WORKSPACE_OPERATION_STALE_RECOVERED
            {
                events.emit(event);
            }
        };
        let lock = arcane_lock::WorkspaceLock::acquire(&workspace, &options, &filtered)
            .map_err(lock_error)?;
        let result = f();
        let released = lock.release().map_err(lock_error);
        let value = result?;
        released?;
        Ok(value)
    })
    .await
    .map_err(|e| Error::Io {
        operation: "lock",
        path: PathBuf::new(),
        source: std::io::Error::other(e),
    })?
}

/// Emits the event that says a proven orphan was stopped.
pub(crate) fn orphan_event(events: &dyn EventSink, record: &Record, step: process::StopStep) {
    events.emit(Event::new(
        event_types::PROCESS_ORPHAN_STOPPED,
        json!({
            "id": record.id, "pid": record.pid, "executable": record.executable,
            "port": record.port, "previousOwner": record.owner.pid, "stopStep": step,
        }),
    ));
}
