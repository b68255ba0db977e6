//! Item 5: symlink safety and odd files. Every refusal leaves everything untouched.

use std::os::unix::fs::symlink;
use std::path::Path;

use arcane_lock::{status, BusyReason, Error, PolicyReason, WorkspaceLock};
use arcane_report::{codes, Diagnostic};

use crate::support::*;

fn acquire(path: &Path) -> Result<WorkspaceLock, Error> {
    WorkspaceLock::acquire(path, &options("build"), &events())
}

fn assert_policy(err: &Error, expected: fn(&PolicyReason) -> bool) {
    assert_eq!(err.code(), codes::ARCANE_POLICY_DENIED, "{err}");
    match err {
        Error::PolicyDenied { reason, .. } => assert!(expected(reason), "{reason:?}"),
        other => panic!("{other:?}"),
    }
}

/// A listing of every path under `dir` with its bytes (or link target).
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        let name = p.strip_prefix(dir).unwrap().display().to_string();
        if meta.file_type().is_symlink() {
            out.push((
                name,
                std::fs::read_link(&p)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes(),
            ));
        } else if meta.is_dir() {
            out.push((name + "/", Vec::new()));
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        } else if meta.is_file() {
            out.push((name, std::fs::read(&p).unwrap()));
        } else {
            out.push((name + "|special", Vec::new()));
        }
    }
    out.sort();
    out
}

#[test]
fn a_missing_workspace_is_denied_and_nothing_is_created() {
    let parent = workspace();
    let missing = parent.path().join("nope");
    let err = acquire(&missing).unwrap_err();
    assert_policy(&err, |r| *r == PolicyReason::Missing);
    assert!(!missing.exists());
    assert_policy(&acquire(Path::new("")).unwrap_err(), |r| {
        *r == PolicyReason::Empty
    });
}

#[test]
fn a_workspace_that_is_a_symlink_is_denied_and_its_target_gets_nothing() {
    let target = workspace();
    let links = workspace();
    let link = links.path().join("ws");
    symlink(target.path(), &link).unwrap();
    for spelling in [link.clone(), link.join(""), link.join(".")] {
        let err = acquire(&spelling).unwrap_err();
        assert_policy(&err, |r| *r == PolicyReason::SymbolicLink);
    }
    assert!(!target.path().join(".arcane").exists());
}

#[test]
fn a_linked_ancestor_is_allowed_and_the_lease_binds_to_the_canonical_path() {
    let real = workspace();
    std::fs::create_dir(real.path().join("ws")).unwrap();
    let links = workspace();
    let alias = links.path().join("alias");
    symlink(real.path(), &alias).unwrap();
    let lock = acquire(&alias.join("ws")).unwrap();
    assert_eq!(lock.workspace(), canonical(&real.path().join("ws")));
    assert_eq!(
        read_record(&real.path().join("ws"))["scope"],
        canonical(&real.path().join("ws")).to_str().unwrap()
    );
}

#[test]
fn dot_arcane_as_a_symlink_to_an_outside_directory_is_denied() {
    let ws = workspace();
    let outside = workspace();
    std::fs::write(outside.path().join("keep"), b"x").unwrap();
    symlink(outside.path(), ws.path().join(".arcane")).unwrap();
    let before = snapshot(outside.path());
    let err = acquire(ws.path()).unwrap_err();
    assert_policy(&err, |r| *r == PolicyReason::SymbolicLink);
    assert_eq!(snapshot(outside.path()), before);
    assert!(status(ws.path()).is_err(), "status refuses too");
    assert_eq!(snapshot(outside.path()), before);
}

#[test]
fn dot_arcane_as_a_regular_file_is_denied_and_kept() {
    let ws = workspace();
    std::fs::write(ws.path().join(".arcane"), b"not a dir").unwrap();
    let err = acquire(ws.path()).unwrap_err();
    assert_policy(&err, |r| matches!(r, PolicyReason::WrongKind { .. }));
    assert_eq!(
        std::fs::read(ws.path().join(".arcane")).unwrap(),
        b"not a dir"
    );
}

#[test]
fn a_lock_path_that_is_a_symlink_is_never_followed() {
    for name in [RECORD, SENTINEL] {
        for dangling in [true, false] {
            let ws = workspace();
            let outside = workspace();
            std::fs::create_dir(ws.path().join(".arcane")).unwrap();
            let target = outside.path().join("target");
            if !dangling {
                std::fs::write(&target, b"precious").unwrap();
            }
            symlink(&target, ws.path().join(name)).unwrap();
            let before = snapshot(outside.path());
            let err = acquire(ws.path()).unwrap_err();
            assert_policy(&err, |r| *r == PolicyReason::SymbolicLink);
            assert_eq!(
                snapshot(outside.path()),
                before,
                "{name} dangling={dangling}"
            );
            assert!(std::fs::symlink_metadata(ws.path().join(name))
                .unwrap()
                .file_type()
                .is_symlink());
        }
    }
}

#[test]
fn a_lock_path_that_is_a_directory_is_denied_and_kept() {
    for name in [RECORD, SENTINEL] {
        let ws = workspace();
        std::fs::create_dir_all(ws.path().join(name).join("inner")).unwrap();
        let err = acquire(ws.path()).unwrap_err();
        assert_policy(
            &err,
            |r| matches!(r, PolicyReason::WrongKind { found } if found.contains("directory")),
        );
        assert!(ws.path().join(name).join("inner").is_dir(), "{name}");
    }
}

#[test]
fn a_lock_path_that_is_a_fifo_is_denied_without_blocking() {
    for name in [RECORD, SENTINEL] {
        let ws = workspace();
        std::fs::create_dir(ws.path().join(".arcane")).unwrap();
        let fifo = ws.path().join(name);
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success());
        let err = acquire(ws.path()).unwrap_err();
        assert_policy(
            &err,
            |r| matches!(r, PolicyReason::WrongKind { found } if found.contains("FIFO")),
        );
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo());
    }
}

fn assert_busy_untouched(bytes: &[u8], expected: fn(&BusyReason) -> bool) {
    let ws = workspace();
    plant_record(ws.path(), bytes);
    let err = acquire(ws.path()).unwrap_err();
    assert_eq!(err.code(), codes::ARCANE_WORKSPACE_BUSY, "{err}");
    match &err {
        Error::Busy { reason, .. } => assert!(expected(reason), "{reason:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        std::fs::read(record_path(ws.path())).unwrap(),
        bytes,
        "bytes must be unchanged"
    );
    assert!(!err.hints().is_empty());
}

#[test]
fn garbage_empty_and_oversized_records_are_busy_and_byte_identical() {
    let unreadable = |r: &BusyReason| matches!(r, BusyReason::UnreadableRecord { .. });
    assert_busy_untouched(b"not json", unreadable);
    assert_busy_untouched(b"", unreadable);
    assert_busy_untouched(
        b"{\"schemaVersion\": 1, \"kind\": \"arcane-workspace-operation-lock\", \"oper",
        unreadable,
    );
    let mut big = sdk_record(Path::new("/"), dead_pid(), "package");
    big.truncate(big.len() - 2);
    big.extend(std::iter::repeat_n(b' ', 70 * 1024));
    big.extend_from_slice(b"}\n");
    assert_busy_untouched(&big, unreadable);
}

#[test]
fn a_record_for_another_workspace_is_busy_and_byte_identical() {
    let other = workspace();
    let bytes = sdk_record(other.path(), dead_pid(), "package");
    assert_busy_untouched(&bytes, |r| matches!(r, BusyReason::OtherScope { .. }));
}

#[test]
fn a_hard_link_planted_at_the_temporary_name_is_never_written_through() {
    let ws = workspace();
    let outside = workspace();
    let precious = outside.path().join("precious");
    std::fs::write(&precious, b"do not truncate").unwrap();
    std::fs::create_dir(ws.path().join(".arcane")).unwrap();
    std::fs::hard_link(
        &precious,
        ws.path().join(".arcane/.workspace-operation.lock.json.tmp"),
    )
    .unwrap();
    acquire(ws.path()).unwrap().release().unwrap();
    assert_eq!(std::fs::read(&precious).unwrap(), b"do not truncate");
}

#[test]
fn links_planted_at_the_names_the_lock_writes_are_never_followed() {
    // The fixed temporary name earlier versions used, and this process's spare name
    // (the record file a process that locks again and again reuses).
    let ws = workspace();
    let outside = workspace();
    std::fs::create_dir(ws.path().join(".arcane")).unwrap();
    let start = start_time(std::process::id());
    let names = [
        ".workspace-operation.lock.json.tmp".to_string(),
        format!(
            ".workspace-operation.lock.json.spare-{}-{start}",
            std::process::id()
        ),
    ];
    for (i, name) in names.iter().enumerate() {
        symlink(
            outside.path().join(format!("t{i}")),
            ws.path().join(".arcane").join(name),
        )
        .unwrap();
    }
    for _ in 0..4 {
        acquire(ws.path()).unwrap().release().unwrap();
    }
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "nothing was created through a link"
    );
    for name in &names {
        let meta = std::fs::symlink_metadata(ws.path().join(".arcane").join(name)).unwrap();
        assert!(meta.file_type().is_symlink(), "{name} was left as it was");
    }
    assert!(!record_path(ws.path()).exists());
}

#[test]
fn retargeting_a_linked_ancestor_during_work_writes_nothing_under_the_new_target() {
    let real = workspace();
    std::fs::create_dir(real.path().join("ws")).unwrap();
    let decoy = workspace();
    std::fs::create_dir(decoy.path().join("ws")).unwrap();
    let links = workspace();
    let alias = links.path().join("alias");
    symlink(real.path(), &alias).unwrap();
    let lock = acquire(&alias.join("ws")).unwrap();
    // Retarget the ancestor link while the lease is held.
    std::fs::remove_file(&alias).unwrap();
    symlink(decoy.path(), &alias).unwrap();
    lock.release().unwrap();
    assert!(
        !decoy.path().join("ws/.arcane").exists(),
        "nothing under the new target"
    );
    assert!(
        !real.path().join("ws").join(RECORD).exists(),
        "the real record was removed"
    );
}
