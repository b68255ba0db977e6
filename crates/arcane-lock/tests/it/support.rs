//! Shared helpers: a fresh workspace per test and record fixtures.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use arcane_report::Collector;

pub const RECORD: &str = ".arcane/workspace-operation.lock.json";
pub const SENTINEL: &str = ".arcane/workspace-operation.lock";

/// A fresh workspace directory.
pub fn workspace() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("arcane-lock-it-")
        .tempdir()
        .expect("temp dir")
}

pub fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap()
}

pub fn record_path(ws: &Path) -> PathBuf {
    ws.join(RECORD)
}

pub fn read_record(ws: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(record_path(ws)).unwrap()).unwrap()
}

/// The names in `dir`, sorted.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The holder's facts Arcane writes into the sentinel (JSON padded with spaces).
pub fn sentinel_facts(ws: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(ws.join(SENTINEL)).unwrap()).unwrap()
}

pub fn options(op: &str) -> arcane_lock::AcquireOptions {
    arcane_lock::AcquireOptions::new(op).unwrap()
}

/// Polls `condition` every 10 ms until it holds; panics naming `what` after 30 s.
/// Tests wait on the state a sleep would only hope for.
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn events() -> Collector {
    Collector::default()
}

/// A pid that does not exist any more: a child we spawned and reaped.
pub fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// A live process we own, killed and reaped on drop.
pub struct Sleeper(pub std::process::Child);

impl Sleeper {
    pub fn start() -> Self {
        Sleeper(
            std::process::Command::new("sleep")
                .arg("600")
                .spawn()
                .unwrap(),
        )
    }
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The start time (clock ticks since boot) of `pid`, from /proc.
pub fn start_time(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &text[text.rfind(')').unwrap() + 1..];
    after
        .split_ascii_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap()
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}

pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .to_string()
}

/// A record as an Arcane holder writes it (with the advisory-lock marker).
pub fn arcane_record(
    ws: &Path,
    pid: u32,
    start: u64,
    host: &str,
    boot: &str,
    operation: &str,
) -> Vec<u8> {
    let v = serde_json::json!({
        "schemaVersion": 1,
        "kind": "arcane-workspace-operation-lock",
        "operation": operation,
        "owner": {"pid": pid, "hostname": host, "bootId": boot, "startTime": start, "uid": 0, "command": "arcane serve"},
        "scope": canonical(ws),
        "nonce": "00000000-0000-4000-8000-000000000000",
        "acquiredAt": "2026-11-29T10:02:11.000Z",
        "expiresAt": "2026-11-29T16:02:11.000Z",
        "ttlMilliseconds": 21600000,
        "advisoryLock": {"kind": "flock", "sentinel": "workspace-operation.lock"}
    });
    let mut bytes = serde_json::to_vec_pretty(&v).unwrap();
    bytes.push(b'\n');
    bytes
}

/// A record as the JavaScript SDK (0.89) writes it: no advisory lock, owner {pid}.
pub fn sdk_record(ws: &Path, pid: u32, operation: &str) -> Vec<u8> {
    let v = serde_json::json!({
        "schemaVersion": 1,
        "kind": "arcane-workspace-operation-lock",
        "operation": operation,
        "owner": {"pid": pid},
        "scope": canonical(ws),
        "nonce": "5b0c6a52-8d8e-4c1e-9a51-0a7d1c2e3f40",
        "acquiredAt": arcane_report::time::now_rfc3339(),
        "expiresAt": "2026-11-29T16:00:00.000Z",
        "ttlMilliseconds": 21600000,
        "releaseProcedure": "The owning Arcane process removes this cooperative lock after the operation settles.",
        "staleRecovery": "After expiresAt, confirm the recorded owner process is absent."
    });
    let mut bytes = serde_json::to_vec_pretty(&v).unwrap();
    bytes.push(b'\n');
    bytes
}

/// Writes `bytes` as the record (creating `.arcane`).
pub fn plant_record(ws: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(ws.join(".arcane")).unwrap();
    std::fs::write(record_path(ws), bytes).unwrap();
}
