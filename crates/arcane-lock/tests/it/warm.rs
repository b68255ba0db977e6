//! Issue 31: a process that locks a workspace again reuses what it opened (and its
//! spare record file) only while the names still lead there; debris is swept when a
//! holder died and on a process's first acquisition, not on every one.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use arcane_lock::{Error, PolicyReason, WorkspaceLock};
use arcane_report::NullSink;

use crate::support::*;

fn lock_once(path: &Path) {
    WorkspaceLock::acquire(path, &options("build"), &NullSink)
        .unwrap()
        .release()
        .unwrap();
}

#[test]
fn a_workspace_replaced_between_acquisitions_is_opened_afresh() {
    let parent = workspace();
    let path = parent.path().join("ws");
    std::fs::create_dir(&path).unwrap();
    lock_once(&path);
    lock_once(&path);
    std::fs::rename(&path, parent.path().join("old")).unwrap();
    std::fs::create_dir(&path).unwrap();
    let lock = WorkspaceLock::acquire(&path, &options("build"), &NullSink).unwrap();
    assert!(
        record_path(&path).exists(),
        "the new directory holds the record"
    );
    assert!(!record_path(&parent.path().join("old")).exists());
    lock.release().unwrap();
}

#[test]
fn dot_arcane_replaced_between_acquisitions_is_opened_afresh() {
    let ws = workspace();
    lock_once(ws.path());
    lock_once(ws.path());
    let state = ws.path().join(".arcane");
    std::fs::rename(&state, ws.path().join(".arcane-old")).unwrap();
    let lock = WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink).unwrap();
    assert!(record_path(ws.path()).exists());
    assert!(ws.path().join(SENTINEL).is_file(), "a new sentinel");
    assert!(!ws
        .path()
        .join(".arcane-old/workspace-operation.lock.json")
        .exists());
    lock.release().unwrap();
}

#[test]
fn dot_arcane_turned_into_a_symlink_between_acquisitions_is_denied() {
    let ws = workspace();
    let outside = workspace();
    lock_once(ws.path());
    lock_once(ws.path());
    std::fs::rename(ws.path().join(".arcane"), ws.path().join(".arcane-old")).unwrap();
    symlink(outside.path(), ws.path().join(".arcane")).unwrap();
    let err = WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::PolicyDenied {
                reason: PolicyReason::SymbolicLink,
                ..
            }
        ),
        "{err}"
    );
    assert!(names_in(outside.path()).is_empty(), "nothing written there");
}

#[test]
fn dot_arcane_others_may_write_between_acquisitions_is_refused() {
    let ws = workspace();
    lock_once(ws.path());
    lock_once(ws.path());
    let state = ws.path().join(".arcane");
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::PolicyDenied {
                reason: PolicyReason::Untrusted { .. },
                ..
            }
        ),
        "{err}"
    );
    assert!(!record_path(ws.path()).exists());
}

#[test]
fn a_sentinel_deleted_between_acquisitions_is_made_again_and_locked() {
    let ws = workspace();
    lock_once(ws.path());
    lock_once(ws.path());
    std::fs::remove_file(ws.path().join(SENTINEL)).unwrap();
    let lock = WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink).unwrap();
    // The sentinel at the path is the one held: another description cannot lock it.
    let other = std::fs::File::open(ws.path().join(SENTINEL)).unwrap();
    assert!(
        rustix::fs::flock(&other, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err(),
        "the lock is held on the sentinel the path names"
    );
    lock.release().unwrap();
    rustix::fs::flock(&other, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        .expect("and released");
}

#[test]
fn a_process_that_locks_again_keeps_one_spare_record_file_and_only_one() {
    let ws = workspace();
    let state = ws.path().join(".arcane");
    lock_once(ws.path());
    assert_eq!(
        names_in(&state),
        ["workspace-operation.lock"],
        "a first lease leaves no spare"
    );
    for _ in 0..5 {
        lock_once(ws.path());
    }
    let spare = format!(
        ".workspace-operation.lock.json.spare-{}-{}",
        std::process::id(),
        start_time(std::process::id())
    );
    assert_eq!(
        names_in(&state),
        [spare.clone(), "workspace-operation.lock".into()]
    );
    // While held, the record is the spare's inode under the record's name too.
    let lock = WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink).unwrap();
    use std::os::unix::fs::MetadataExt;
    let record = std::fs::metadata(record_path(ws.path())).unwrap();
    assert_eq!(
        record.ino(),
        std::fs::metadata(state.join(&spare)).unwrap().ino()
    );
    assert_eq!(read_record(ws.path())["nonce"], lock.nonce());
    lock.release().unwrap();
    assert!(!record_path(ws.path()).exists());
}

#[test]
fn debris_goes_when_a_holder_died_or_on_a_first_acquisition_not_on_every_one() {
    let ws = workspace();
    let state = ws.path().join(".arcane");
    lock_once(ws.path());
    // Debris of a writer killed long ago, and the spare of a process that is gone.
    let plant_debris = || {
        let old = state.join(".core.json.0123456789abcdef.tmp");
        std::fs::write(&old, b"cut short").unwrap();
        let status = std::process::Command::new("touch")
            .args(["-d", "2 hours ago"])
            .arg(&old)
            .status()
            .unwrap();
        assert!(status.success());
        let spare = state.join(format!(
            ".workspace-operation.lock.json.spare-{}-1",
            dead_pid()
        ));
        std::fs::write(&spare, b"{}").unwrap();
        (old, spare)
    };
    let (old, spare) = plant_debris();
    // A later acquisition of this process reuses its handles and does not scan.
    lock_once(ws.path());
    assert!(
        old.exists() && spare.exists(),
        "not swept on every acquisition"
    );
    // A holder that died: its recovery sweeps.
    plant_record(
        ws.path(),
        &arcane_record(ws.path(), dead_pid(), 1, &hostname(), &boot_id(), "serve"),
    );
    lock_once(ws.path());
    assert!(!old.exists(), "the old debris went");
    assert!(!spare.exists(), "the dead process's spare went");
    // A first acquisition (another spelling of the path: nothing cached for it) sweeps too.
    let (old, spare) = plant_debris();
    lock_once(&ws.path().join(".arcane/.."));
    assert!(!old.exists() && !spare.exists());
}

#[test]
fn a_live_processs_spare_is_never_swept() {
    let ws = workspace();
    lock_once(ws.path());
    let live = ws.path().join(format!(
        ".arcane/.workspace-operation.lock.json.spare-{}-{}",
        std::process::id(),
        start_time(std::process::id())
    ));
    std::fs::write(&live, b"{}").unwrap();
    // Recovering a dead holder sweeps; this process is alive.
    plant_record(
        ws.path(),
        &arcane_record(ws.path(), dead_pid(), 1, &hostname(), &boot_id(), "serve"),
    );
    lock_once(ws.path());
    assert!(live.exists());
}
