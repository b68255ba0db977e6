//! Stale records: the recovery rule applied end to end, crash states, and `recover`.

use std::sync::Arc;

use arcane_lock::{
    recover, status, BusyReason, Error, LockStatus, RecoverOptions, Recovered, WorkspaceLock,
};
use arcane_report::{codes, Diagnostic, NullSink};

use crate::support::*;

fn stale_event(sink: &arcane_report::Collector) -> serde_json::Value {
    sink.events()
        .into_iter()
        .find(|e| e.kind == "workspace.operation.stale-recovered")
        .expect("a stale-recovered event")
        .data
}

#[test]
fn an_arcane_record_of_a_dead_owner_is_recovered_at_once() {
    let ws = workspace();
    let dead = dead_pid();
    plant_record(
        ws.path(),
        &arcane_record(ws.path(), dead, 12345, &hostname(), &boot_id(), "serve"),
    );
    assert_eq!(status(ws.path()).unwrap().to_json()["state"], "stale");
    let sink = events();
    let lock = WorkspaceLock::acquire(ws.path(), &options("build"), &sink).unwrap();
    let data = stale_event(&sink);
    assert_eq!(data["previousOwner"]["pid"], dead);
    assert_eq!(data["previousOperation"], "serve");
    assert_eq!(data["reason"], "owner-exited");
    assert_eq!(read_record(ws.path())["nonce"], lock.nonce());
    assert_eq!(
        sink.types(),
        [
            "workspace.operation.stale-recovered",
            "workspace.operation.locked"
        ]
    );
}

#[test]
fn a_reused_pid_with_another_start_time_is_recovered() {
    let ws = workspace();
    let unrelated = Sleeper::start();
    let wrong_start = start_time(unrelated.pid()) + 1;
    plant_record(
        ws.path(),
        &arcane_record(
            ws.path(),
            unrelated.pid(),
            wrong_start,
            &hostname(),
            &boot_id(),
            "serve",
        ),
    );
    let sink = events();
    let _lock = WorkspaceLock::acquire(ws.path(), &options("build"), &sink).unwrap();
    assert_eq!(stale_event(&sink)["reason"], "pid-reused");
}

#[test]
fn a_live_owner_with_its_own_start_time_is_never_displaced() {
    let ws = workspace();
    let owner = Sleeper::start();
    let bytes = arcane_record(
        ws.path(),
        owner.pid(),
        start_time(owner.pid()),
        &hostname(),
        &boot_id(),
        "serve",
    );
    plant_record(ws.path(), &bytes);
    let err = WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Busy {
                reason: BusyReason::OwnerAliveWithoutLock,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(std::fs::read(record_path(ws.path())).unwrap(), bytes);
}

#[test]
fn a_record_from_before_a_reboot_of_this_host_is_recovered() {
    let ws = workspace();
    let me = std::process::id();
    plant_record(
        ws.path(),
        &arcane_record(
            ws.path(),
            me,
            start_time(me),
            &hostname(),
            "0-previous-boot",
            "serve",
        ),
    );
    let sink = events();
    let _lock = WorkspaceLock::acquire(ws.path(), &options("build"), &sink).unwrap();
    assert_eq!(stale_event(&sink)["reason"], "rebooted");
}

#[test]
fn a_record_from_another_host_is_busy_names_the_host_and_breaks_only_on_request() {
    let ws = workspace();
    let bytes = arcane_record(
        ws.path(),
        dead_pid(),
        1,
        "build-42.example",
        "other-boot",
        "serve",
    );
    plant_record(ws.path(), &bytes);
    let err = WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink).unwrap_err();
    assert_eq!(err.code(), codes::ARCANE_WORKSPACE_BUSY);
    assert!(err.to_string().contains("build-42.example"), "{err}");
    assert_eq!(err.details()["hostname"], "build-42.example");
    assert_eq!(std::fs::read(record_path(ws.path())).unwrap(), bytes);
    // `recover` refuses without the explicit host, and breaks it with it.
    assert!(recover(ws.path(), &RecoverOptions::default(), &NullSink)
        .unwrap_err()
        .is_busy());
    let wrong = RecoverOptions::default().break_foreign_host("other");
    assert!(recover(ws.path(), &wrong, &NullSink).is_err());
    let right = RecoverOptions::default().break_foreign_host("build-42.example");
    assert!(matches!(
        recover(ws.path(), &right, &NullSink).unwrap(),
        Recovered::Removed { .. }
    ));
    assert!(!record_path(ws.path()).exists());
}

#[test]
fn an_sdk_record_with_a_live_pid_is_busy_and_untouched() {
    let ws = workspace();
    let owner = Sleeper::start();
    let bytes = sdk_record(ws.path(), owner.pid(), "package");
    plant_record(ws.path(), &bytes);
    let err = WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Busy {
                reason: BusyReason::OwnerAlive,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains(&format!("pid {}", owner.pid())),
        "{err}"
    );
    assert_eq!(std::fs::read(record_path(ws.path())).unwrap(), bytes);
    match status(ws.path()).unwrap() {
        LockStatus::Held {
            holder: Some(h), ..
        } => assert!(!h.advisory_lock),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_sdk_record_naming_this_very_process_is_busy() {
    let ws = workspace();
    let bytes = sdk_record(ws.path(), std::process::id(), "package");
    plant_record(ws.path(), &bytes);
    assert!(
        WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink)
            .unwrap_err()
            .is_busy()
    );
    assert_eq!(std::fs::read(record_path(ws.path())).unwrap(), bytes);
}

#[test]
fn an_sdk_record_with_a_dead_pid_and_unknown_fields_is_recovered() {
    let ws = workspace();
    let dead = dead_pid();
    let mut v: serde_json::Value =
        serde_json::from_slice(&sdk_record(ws.path(), dead, "package")).unwrap();
    v["securityBoundary"] = "older prose".into();
    v["futureField"] = serde_json::json!({"x": 1});
    v["expiresAt"] = "2999-01-01T00:00:00.000Z".into(); // unexpired: expiry is ignored
    plant_record(ws.path(), &serde_json::to_vec(&v).unwrap());
    let sink = events();
    let _lock = WorkspaceLock::acquire(ws.path(), &options("build"), &sink).unwrap();
    let data = stale_event(&sink);
    assert_eq!(data["previousOwner"]["pid"], dead);
    assert_eq!(data["previousOperation"], "package");
    assert_eq!(data["previousAdvisoryLock"], false);
}

#[test]
fn a_moved_workspace_recovers_its_own_stale_record_by_directory_identity() {
    let parent = workspace();
    let old = parent.path().join("old");
    std::fs::create_dir(&old).unwrap();
    // A holder dies while the workspace lives at `old`...
    let mut v: serde_json::Value = serde_json::from_slice(&arcane_record(
        &old,
        dead_pid(),
        1,
        &hostname(),
        &boot_id(),
        "serve",
    ))
    .unwrap();
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&old).unwrap();
    v["workspaceIdentity"] = serde_json::json!({"dev": meta.dev(), "ino": meta.ino()});
    plant_record(&old, &serde_json::to_vec(&v).unwrap());
    // ...and the workspace is renamed.
    let new = parent.path().join("new");
    std::fs::rename(&old, &new).unwrap();
    let sink = events();
    let _lock = WorkspaceLock::acquire(&new, &options("build"), &sink).unwrap();
    stale_event(&sink);
}

#[test]
fn a_crash_between_create_and_write_leaves_nothing_that_blocks() {
    // Arcane's create-then-write happens on the temporary name; a crash there leaves an
    // empty sentinel, a partial temporary record and no published record.
    let ws = workspace();
    std::fs::create_dir(ws.path().join(".arcane")).unwrap();
    std::fs::write(ws.path().join(SENTINEL), b"").unwrap();
    std::fs::write(
        ws.path().join(".arcane/.workspace-operation.lock.json.tmp"),
        b"{\n  \"schemaVer",
    )
    .unwrap();
    assert_eq!(status(ws.path()).unwrap(), LockStatus::Free);
    let lock = WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink).unwrap();
    assert_eq!(read_record(ws.path())["nonce"], lock.nonce());
    assert!(!ws
        .path()
        .join(".arcane/.workspace-operation.lock.json.tmp")
        .exists());
}

#[test]
fn a_crash_mid_recovery_leaves_nothing_that_blocks() {
    // The recoverer died after moving the stale record aside.
    let ws = workspace();
    std::fs::create_dir(ws.path().join(".arcane")).unwrap();
    std::fs::write(
        ws.path()
            .join(".arcane/.workspace-operation.lock.json.stale"),
        b"old",
    )
    .unwrap();
    WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink)
        .unwrap()
        .release()
        .unwrap();
    // Or before moving it: the record is judged again.
    plant_record(
        ws.path(),
        &arcane_record(ws.path(), dead_pid(), 1, &hostname(), &boot_id(), "serve"),
    );
    WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink)
        .unwrap()
        .release()
        .unwrap();
}

#[test]
fn recover_removes_only_provably_stale_records() {
    let ws = workspace();
    assert_eq!(
        recover(ws.path(), &RecoverOptions::default(), &NullSink).unwrap(),
        Recovered::Nothing
    );
    // Held by a live Arcane holder (this process): never removed.
    let lock = WorkspaceLock::acquire(ws.path(), &options("serve"), &NullSink).unwrap();
    let err = recover(ws.path(), &RecoverOptions::default(), &NullSink).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Busy {
                reason: BusyReason::Locked,
                ..
            }
        ),
        "{err}"
    );
    assert!(record_path(ws.path()).exists());
    drop(lock);
    let dead = dead_pid();
    plant_record(
        ws.path(),
        &arcane_record(ws.path(), dead, 1, &hostname(), &boot_id(), "serve"),
    );
    let sink = events();
    match recover(ws.path(), &RecoverOptions::default(), &sink).unwrap() {
        Recovered::Removed { previous } => assert_eq!(previous.pid, Some(i64::from(dead))),
        other => panic!("{other:?}"),
    }
    assert_eq!(stale_event(&sink)["previousOwner"]["pid"], dead);
    assert!(!record_path(ws.path()).exists());
}

#[test]
fn recover_quarantines_an_unreadable_record_only_on_request_keeping_its_bytes() {
    let ws = workspace();
    plant_record(ws.path(), b"garbage \x00\xff");
    let err = recover(ws.path(), &RecoverOptions::default(), &NullSink).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Busy {
                reason: BusyReason::UnreadableRecord { .. },
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        std::fs::read(record_path(ws.path())).unwrap(),
        b"garbage \x00\xff"
    );
    let opts = RecoverOptions::default().quarantine_unreadable(true);
    match recover(ws.path(), &opts, &NullSink).unwrap() {
        Recovered::Quarantined { path, .. } => {
            assert_eq!(std::fs::read(&path).unwrap(), b"garbage \x00\xff");
            assert!(path.parent().unwrap().ends_with(".arcane"));
        }
        other => panic!("{other:?}"),
    }
    assert!(!record_path(ws.path()).exists());
    WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink)
        .unwrap()
        .release()
        .unwrap();
}

#[test]
fn two_simultaneous_recoverers_cannot_both_win() {
    for _ in 0..20 {
        let ws = Arc::new(workspace());
        plant_record(
            ws.path(),
            &arcane_record(ws.path(), dead_pid(), 1, &hostname(), &boot_id(), "serve"),
        );
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (ws, barrier) = (ws.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    recover(ws.path(), &RecoverOptions::default(), &NullSink)
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let removed = results
            .iter()
            .filter(|r| matches!(r, Ok(Recovered::Removed { .. })))
            .count();
        assert_eq!(removed, 1, "{results:?}");
        for r in &results {
            assert!(
                matches!(
                    r,
                    Ok(Recovered::Removed { .. } | Recovered::Nothing) | Err(Error::Busy { .. })
                ),
                "{r:?}"
            );
        }
    }
}

#[test]
fn busy_details_carry_the_holder_for_machines() {
    let ws = workspace();
    let owner = Sleeper::start();
    plant_record(ws.path(), &sdk_record(ws.path(), owner.pid(), "package"));
    let err = WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink).unwrap_err();
    let details = err.details();
    assert_eq!(details["holder"]["pid"], owner.pid());
    assert_eq!(details["holder"]["operation"], "package");
    assert_eq!(details["reason"], "owner-alive");
    assert_eq!(err.code(), codes::ARCANE_WORKSPACE_BUSY);
}
