//! Ownership records of ONNX workers, so a later host stops a worker an earlier one
//! lost (the host was killed and the parent-death signal was not armed or not
//! delivered), with the proof of [`arcane_process::ownership`].
//!
//! `<workspace>/.arcane/onnx-workers/<pid>.json`, written atomically right after the
//! worker's spawn and removed when it exits; only the workspace's one host (it holds
//! the owner lock) writes them:
//!
//! ```json
//! {"schemaVersion": 1, "kind": "arcane-onnx-worker-ownership", "target": "cpu",
//!  "pid": 4242, "startTime": 123456, "exe": "/…/arcane", "nonce": "9f…",
//!  "owner": {"pid": 4200, "startTime": 123400}, "createdAt": "…"}
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use arcane_process::ownership::{self, Judgement, Owner};
use serde::{Deserialize, Serialize};

/// The variable that carries a worker's nonce.
pub const NONCE_VARIABLE: &str = "ARCANE_ONNX_WORKER_NONCE";

const KIND: &str = "arcane-onnx-worker-ownership";

/// One worker's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// Always 1.
    pub schema_version: u32,
    /// Always `arcane-onnx-worker-ownership`.
    pub kind: String,
    /// The target (device id, or `<device>/<session>` for an isolated worker).
    pub target: String,
    /// The worker's pid.
    pub pid: u32,
    /// Its start time.
    pub start_time: u64,
    /// Its executable as `/proc/<pid>/exe` showed it.
    pub exe: PathBuf,
    /// The nonce in its environment ([`NONCE_VARIABLE`]).
    pub nonce: String,
    /// The host that started it.
    pub owner: Owner,
    /// When it was written (RFC 3339 UTC).
    pub created_at: String,
}

/// A stopped orphan: its record and how it ended.
#[derive(Debug, Clone)]
pub struct Reaped {
    /// The orphan's record.
    pub record: Record,
    /// The step that stopped it.
    pub step: arcane_process::StopStep,
}

impl Record {
    /// The record of a worker just started with `nonce`; `None` when its identity
    /// cannot be read (it already exited).
    pub fn of(target: &str, pid: u32, nonce: &str) -> Option<Record> {
        Some(Record {
            schema_version: 1,
            kind: KIND.into(),
            target: target.into(),
            pid,
            start_time: arcane_process::start_time(pid)?,
            exe: arcane_process::exe(pid)?,
            nonce: nonce.into(),
            owner: Owner::current(),
            created_at: arcane_report::time::now_rfc3339(),
        })
    }
}

fn path(workspace: &Path, pid: u32) -> PathBuf {
    arcane_workspace::layout::onnx_workers_dir(workspace).join(format!("{pid}.json"))
}

/// The records directory, checked to be a physical directory of the workspace
/// (created 0700 when missing), so no record is written through a link.
fn dir(workspace: &Path) -> std::io::Result<PathBuf> {
    arcane_lock::state_subdir(workspace, arcane_workspace::layout::ONNX_WORKERS_DIR_NAME)
        .map_err(std::io::Error::other)?;
    Ok(arcane_workspace::layout::onnx_workers_dir(workspace))
}

/// Writes `record` atomically.
pub fn write(workspace: &Path, record: &Record) -> std::io::Result<()> {
    dir(workspace)?;
    let mut bytes = serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    arcane_files::write_atomic(&path(workspace, record.pid), &bytes, 0o644)
}

/// Removes the record of `pid` if it still carries `nonce` (never another's).
pub fn remove(workspace: &Path, pid: u32, nonce: &str) {
    let target = path(workspace, pid);
    let ours = std::fs::read(&target)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Record>(&bytes).ok())
        .is_some_and(|r| r.nonce == nonce);
    if ours {
        let _ = std::fs::remove_file(target);
    }
}

/// Stops every proven orphan recorded in `workspace` (SIGTERM, SIGKILL after
/// `grace`) and removes its record and every stale one; records of workers whose host
/// is alive are left alone. Blocking.
pub fn reap_orphans(workspace: &Path, grace: Duration) -> Vec<Reaped> {
    let Ok(entries) = std::fs::read_dir(arcane_workspace::layout::onnx_workers_dir(workspace))
    else {
        return Vec::new();
    };
    let mut reaped = Vec::new();
    for entry in entries.flatten() {
        let file = entry.path();
        let record = std::fs::read(&file)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Record>(&bytes).ok())
            .filter(|r| r.kind == KIND && r.schema_version == 1);
        let Some(record) = record else { continue };
        let claim = ownership::Claim {
            pid: record.pid,
            start_time: record.start_time,
            exe: &record.exe,
            nonce: (NONCE_VARIABLE, &record.nonce),
            owner: &record.owner,
        };
        match ownership::judge(&claim) {
            Judgement::OwnerAlive => continue,
            Judgement::Stale(_) => {}
            Judgement::Orphan => {
                let step = ownership::stop_orphan(record.pid, record.start_time, grace);
                reaped.push(Reaped {
                    record: record.clone(),
                    step,
                });
            }
        }
        let _ = std::fs::remove_file(&file);
    }
    reaped
}
