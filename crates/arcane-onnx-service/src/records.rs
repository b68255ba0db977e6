//! Ownership records of ONNX workers, so a later host stops a worker an earlier one
//! lost (the host was killed and the parent-death signal was not armed or not
//! delivered), with the proof of [`arcane_process::ownership`]. They are kept in the
//! one store engines' records are kept in ([`RecordStore`]); this module only says
//! what a worker's record is.
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

use std::path::PathBuf;

use arcane_localai::records::{OwnershipRecord, RecordStore, SCHEMA_VERSION};
use arcane_process::ownership::{Claim, Owner};
use serde::{Deserialize, Serialize};

/// The store of the workers' records in a workspace.
pub type Records = RecordStore<Record>;

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
    /// The nonce in its environment ([`Record::NONCE_VARIABLE`]).
    pub nonce: String,
    /// The host that started it.
    pub owner: Owner,
    /// When it was written (RFC 3339 UTC).
    pub created_at: String,
}

impl OwnershipRecord for Record {
    const KIND: &'static str = "arcane-onnx-worker-ownership";
    const NONCE_VARIABLE: &'static str = "ARCANE_ONNX_WORKER_NONCE";
    const DIR_NAME: &'static str = arcane_workspace::worker_records::ONNX;

    fn key(&self) -> String {
        self.pid.to_string()
    }

    fn claim(&self) -> Claim<'_> {
        Claim {
            pid: self.pid,
            start_time: self.start_time,
            exe: &self.exe,
            nonce: (Self::NONCE_VARIABLE, &self.nonce),
            owner: &self.owner,
        }
    }

    fn kind(&self) -> &str {
        &self.kind
    }

    fn schema_version(&self) -> u32 {
        self.schema_version
    }
}

impl Record {
    /// The record of a worker just started with `nonce`; `None` when its identity
    /// cannot be read (it already exited).
    pub fn of(target: &str, pid: u32, nonce: &str) -> Option<Record> {
        Some(Record {
            schema_version: SCHEMA_VERSION,
            kind: Self::KIND.into(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_record_roundtrips_through_the_store_in_the_unchanged_format() {
        let workspace = tempfile::tempdir().unwrap();
        let store = Records::new(workspace.path());
        let pid = std::process::id();
        let record = Record::of("cpu", pid, "9f9f").expect("this process's identity");
        store.write(&record).unwrap();
        assert_eq!(store.read(&pid.to_string()), Some(record.clone()));

        let file = workspace
            .path()
            .join(format!(".arcane/onnx-workers/{pid}.json"));
        assert_eq!(store.path(&record.key()), file);
        let value: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(value["kind"], "arcane-onnx-worker-ownership");
        assert_eq!(value["schemaVersion"], 1);
        assert_eq!(value["target"], "cpu");
        assert_eq!(value["startTime"], record.start_time);
        assert_eq!(value["owner"]["pid"], pid);
        assert_eq!(
            record.claim().nonce,
            ("ARCANE_ONNX_WORKER_NONCE", "9f9f"),
            "the variable the worker is started with"
        );

        store.remove(&record.key(), "not-its-nonce").unwrap();
        assert!(file.exists());
        store.remove(&record.key(), "9f9f").unwrap();
        assert!(!file.exists());
    }
}
