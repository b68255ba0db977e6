//! Acquire, hold, release: the record, the events, same-process exclusion, release checks.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arcane_lock::{status, with_workspace_lock, BusyReason, Error, LockStatus, WorkspaceLock};
use arcane_report::{codes, Diagnostic, NullSink};

use crate::support::*;

#[test]
fn the_record_exists_while_held_and_is_gone_after_release() {
    let ws = workspace();
    let sink = events();
    let lock = WorkspaceLock::acquire(ws.path(), &options("build"), &sink).unwrap();
    assert!(record_path(ws.path()).is_file());
    assert_eq!(lock.workspace(), canonical(ws.path()));
    assert_eq!(lock.operation(), "build");
    lock.release_with_events(&sink).unwrap();
    assert!(!record_path(ws.path()).exists());
    // The sentinel is never removed (two inodes would break exclusion).
    assert!(ws.path().join(SENTINEL).is_file());
    assert_eq!(
        sink.types(),
        ["workspace.operation.locked", "workspace.operation.released"]
    );
}

#[test]
fn the_record_is_the_sdk_document_and_arcanes_facts_are_in_the_sentinel() {
    let ws = workspace();
    let before = std::time::SystemTime::now();
    let lock = WorkspaceLock::acquire(ws.path(), &options("model.add"), &NullSink).unwrap();
    let bytes = std::fs::read(record_path(ws.path())).unwrap();
    assert!(
        bytes.starts_with(b"{\n  \"schemaVersion\": 1,"),
        "2-space indented JSON"
    );
    assert!(bytes.ends_with(b"}\n"), "trailing newline");
    let v = read_record(ws.path());
    assert_eq!(v["kind"], "arcane-workspace-operation-lock");
    assert_eq!(v["operation"], "model.add");
    // The SDK's owner: the pid only (its exact key check refuses anything more).
    assert_eq!(v["owner"], serde_json::json!({"pid": std::process::id()}));
    assert_eq!(v["scope"], canonical(ws.path()).to_str().unwrap());
    assert_eq!(v["nonce"], lock.nonce());
    assert_eq!(v["ttlMilliseconds"], 21_600_000);
    assert!(v.get("advisoryLock").is_none() && v.get("workspaceIdentity").is_none());
    assert!(v["securityBoundary"]
        .as_str()
        .is_some_and(|s| s.contains("JavaScript")));
    // The SDK's TTL between the two times, and an expiry a short horizon ahead (which
    // the holder renews), so an SDK 0.1.1 recovers a killed holder within it.
    let acquired = arcane_report::time::parse_rfc3339(v["acquiredAt"].as_str().unwrap()).unwrap();
    let expires = arcane_report::time::parse_rfc3339(v["expiresAt"].as_str().unwrap()).unwrap();
    assert_eq!(
        expires.duration_since(acquired).unwrap(),
        Duration::from_millis(21_600_000)
    );
    let ahead = expires.duration_since(before).unwrap();
    assert!(ahead <= Duration::from_secs(31), "{ahead:?}");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(record_path(ws.path())).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // Arcane's own facts, under the same nonce, in the sentinel the holder locks.
    let facts = sentinel_facts(ws.path());
    assert_eq!(facts["nonce"], lock.nonce());
    assert_eq!(facts["acquiredAt"], lock.acquired_at(), "the real time");
    assert_eq!(facts["owner"]["pid"], std::process::id());
    assert_eq!(facts["owner"]["hostname"], hostname());
    assert_eq!(facts["owner"]["bootId"], boot_id());
    assert_eq!(facts["owner"]["startTime"], start_time(std::process::id()));
    assert_eq!(facts["advisoryLock"]["kind"], "flock");
    assert_eq!(
        facts["workspaceIdentity"]["ino"],
        std::fs::metadata(ws.path()).unwrap().ino()
    );
    // Nothing else was written beside the record (no second file per lease).
    assert_eq!(
        names_in(&ws.path().join(".arcane")),
        ["workspace-operation.lock", "workspace-operation.lock.json"]
    );
    drop(lock);
    assert!(!record_path(ws.path()).exists(), "drop releases");
}

#[test]
fn a_second_root_in_the_same_process_is_busy_at_once_and_names_the_holder() {
    let ws = workspace();
    let _lock = WorkspaceLock::acquire(ws.path(), &options("serve"), &NullSink).unwrap();
    let before = std::fs::read(record_path(ws.path())).unwrap();
    let err = WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink).unwrap_err();
    assert_eq!(err.code(), codes::ARCANE_WORKSPACE_BUSY);
    match &err {
        Error::Busy {
            reason,
            holder,
            waited,
            ..
        } => {
            assert_eq!(*reason, BusyReason::SameProcess);
            assert_eq!(holder.as_ref().unwrap().operation.as_deref(), Some("serve"));
            assert_eq!(*waited, None);
        }
        other => panic!("{other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains(&format!("pid {}", std::process::id())),
        "{message}"
    );
    assert!(message.contains("operation `serve`"), "{message}");
    // Issue 10, item 10: the library names no flag; only a command with `--wait` may.
    assert!(!err.hints().is_empty());
    assert!(
        !err.hints().iter().any(|h| h.contains("--wait")),
        "{:?}",
        err.hints()
    );
    assert_eq!(
        std::fs::read(record_path(ws.path())).unwrap(),
        before,
        "record untouched"
    );
}

#[test]
fn two_spellings_of_one_workspace_are_one_workspace() {
    let ws = workspace();
    let alias = workspace();
    let link = alias.path().join("link");
    std::os::unix::fs::symlink(ws.path(), &link).unwrap();
    let _lock = WorkspaceLock::acquire(ws.path(), &options("a"), &NullSink).unwrap();
    // `link/sub/..` names the workspace through a linked ancestor.
    std::fs::create_dir(ws.path().join("sub")).unwrap();
    let err =
        WorkspaceLock::acquire(&link.join("sub").join(".."), &options("b"), &NullSink).unwrap_err();
    assert!(err.is_busy(), "{err}");
}

#[test]
fn threads_of_one_process_never_overlap() {
    let ws = Arc::new(workspace());
    let inside = Arc::new(AtomicBool::new(false));
    let entered = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (ws, inside, entered) = (ws.clone(), inside.clone(), entered.clone());
            std::thread::spawn(move || {
                for _ in 0..25 {
                    let opts = options("t").wait(Duration::from_secs(60));
                    with_workspace_lock(ws.path(), &opts, &NullSink, |_| {
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                        entered.fetch_add(1, Ordering::SeqCst);
                        std::thread::yield_now();
                        inside.store(false, Ordering::SeqCst);
                        Ok::<_, Error>(())
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(entered.load(Ordering::SeqCst), 100);
    assert_eq!(status(ws.path()).unwrap(), LockStatus::Free);
}

#[test]
fn the_work_error_is_returned_unchanged_and_the_lock_is_gone() {
    #[derive(Debug, PartialEq)]
    enum WorkError {
        Mine(u32),
        Lock(String),
    }
    impl From<Error> for WorkError {
        fn from(e: Error) -> Self {
            WorkError::Lock(e.code().to_string())
        }
    }
    let ws = workspace();
    let sink = events();
    let result: Result<(), WorkError> =
        with_workspace_lock(ws.path(), &options("build"), &sink, |_| {
            Err(WorkError::Mine(7))
        });
    assert_eq!(result, Err(WorkError::Mine(7)));
    assert!(!record_path(ws.path()).exists());
    assert_eq!(
        sink.types(),
        ["workspace.operation.locked", "workspace.operation.released"]
    );
}

#[test]
fn a_record_deleted_during_work_makes_release_fail_without_hiding_the_work_error() {
    let ws = workspace();
    let sink = events();
    let result: Result<u8, Error> =
        with_workspace_lock(ws.path(), &options("build"), &sink, |lock| {
            std::fs::remove_file(record_path(lock.workspace())).unwrap();
            Ok(1)
        });
    let err = result.unwrap_err();
    assert_eq!(err.code(), codes::ARCANE_LOCK_COMPROMISED, "{err}");
    // With a failing work, the work's error wins and the release failure is an event.
    let sink = events();
    let result: Result<u8, Error> =
        with_workspace_lock(ws.path(), &options("build"), &sink, |lock| {
            std::fs::remove_file(record_path(lock.workspace())).unwrap();
            Err(Error::InvalidOperation {
                operation: "work-failed".into(),
            })
        });
    assert!(
        matches!(result, Err(Error::InvalidOperation { operation }) if operation == "work-failed")
    );
    assert!(sink
        .types()
        .contains(&"workspace.operation.release-failed".to_string()));
    // And the workspace is usable again.
    WorkspaceLock::acquire(ws.path(), &options("next"), &NullSink)
        .unwrap()
        .release()
        .unwrap();
}

#[test]
fn a_record_rewritten_in_place_is_removed_and_reported() {
    let ws = workspace();
    let lock = WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink).unwrap();
    let path = record_path(ws.path());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(b" ");
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.write_all(&bytes).unwrap();
    }
    let err = lock.release().unwrap_err();
    assert_eq!(err.code(), codes::ARCANE_LOCK_COMPROMISED);
    assert!(err.to_string().contains("modified"), "{err}");
    assert!(
        !path.exists(),
        "our own inode is removed even when modified"
    );
}

#[test]
fn a_foreign_file_renamed_over_the_record_is_left_alone() {
    let ws = workspace();
    let lock = WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink).unwrap();
    let path = record_path(ws.path());
    let foreign = ws.path().join(".arcane/foreign");
    std::fs::write(&foreign, b"someone else's").unwrap();
    std::fs::rename(&foreign, &path).unwrap();
    assert!(lock.check().is_err(), "the holder's self-check notices");
    let err = lock.release().unwrap_err();
    assert_eq!(err.code(), codes::ARCANE_LOCK_COMPROMISED);
    assert!(err.to_string().contains("replaced"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"someone else's");
}

#[test]
fn check_passes_while_the_lock_is_intact_and_fails_when_the_sentinel_is_replaced() {
    let ws = workspace();
    let lock = WorkspaceLock::acquire(ws.path(), &options("serve"), &NullSink).unwrap();
    lock.check().unwrap();
    let sentinel = ws.path().join(SENTINEL);
    std::fs::remove_file(&sentinel).unwrap();
    std::fs::write(&sentinel, b"").unwrap();
    let err = lock.check().unwrap_err();
    assert_eq!(err.code(), codes::ARCANE_LOCK_COMPROMISED);
}

#[test]
fn status_reports_free_and_held() {
    let ws = workspace();
    assert_eq!(status(ws.path()).unwrap(), LockStatus::Free);
    assert!(
        !ws.path().join(".arcane").exists(),
        "status creates nothing"
    );
    let lock = WorkspaceLock::acquire(ws.path(), &options("serve"), &NullSink).unwrap();
    match status(ws.path()).unwrap() {
        LockStatus::Held {
            holder: Some(holder),
            ..
        } => {
            assert_eq!(holder.pid, Some(i64::from(std::process::id())));
            assert_eq!(holder.operation.as_deref(), Some("serve"));
        }
        other => panic!("{other:?}"),
    }
    let json = status(ws.path()).unwrap().to_json();
    assert_eq!(json["state"], "held");
    drop(lock);
    assert_eq!(status(ws.path()).unwrap().to_json()["state"], "free");
}

#[test]
fn invalid_operation_names_are_usage_errors() {
    for bad in ["Build", "-x", "", "a b"] {
        let err = arcane_lock::AcquireOptions::new(bad).unwrap_err();
        assert_eq!(err.code(), codes::ARCANE_USAGE, "{bad}");
    }
}
