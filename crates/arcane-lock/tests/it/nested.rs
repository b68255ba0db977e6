//! Nested leases: one child per parent, unlimited depth, no file I/O, no events.

use arcane_lock::{BusyReason, Error, Lease, WorkspaceLock};
use arcane_report::{codes, Diagnostic};

use crate::support::*;

fn needs_a_lease(lease: &impl Lease) -> String {
    format!("{} {}", lease.workspace().display(), lease.operation())
}

#[test]
fn one_child_per_parent_and_a_new_child_after_it_ends() {
    let ws = workspace();
    let lock = WorkspaceLock::acquire(ws.path(), &options("build"), &events()).unwrap();
    let child = lock.nested("compile").unwrap();
    let err = lock.nested("link").unwrap_err();
    assert_eq!(err.code(), codes::ARCANE_WORKSPACE_BUSY);
    match &err {
        Error::Busy {
            reason: BusyReason::NestedActive { parent, active },
            ..
        } => {
            assert_eq!(parent, "build");
            assert_eq!(active, "compile");
        }
        other => panic!("{other:?}"),
    }
    child.release().unwrap();
    let again = lock.nested("link").unwrap();
    assert_eq!(again.operation(), "link");
    drop(again);
    lock.release().unwrap();
}

#[test]
fn root_child_grandchild_touch_no_files_and_emit_no_events() {
    let ws = workspace();
    let sink = events();
    let lock = WorkspaceLock::acquire(ws.path(), &options("build"), &sink).unwrap();
    let before = std::fs::read(record_path(ws.path())).unwrap();
    {
        let child = lock.nested("compile").unwrap();
        let grandchild = child.nested("compile.unit").unwrap();
        assert_eq!(grandchild.workspace(), lock.workspace());
        assert_ne!(grandchild.nonce(), lock.nonce());
        // A grandchild occupies only the child's slot, not the root's.
        assert!(child.nested("second").is_err());
        assert!(lock.nested("sibling").is_err());
        assert!(needs_a_lease(&grandchild).ends_with("compile.unit"));
        assert!(needs_a_lease(&lock).ends_with("build"));
    }
    assert_eq!(std::fs::read(record_path(ws.path())).unwrap(), before);
    lock.release_with_events(&sink).unwrap();
    assert_eq!(
        sink.types(),
        ["workspace.operation.locked", "workspace.operation.released"]
    );
}

#[test]
fn nested_names_are_validated() {
    let ws = workspace();
    let lock = WorkspaceLock::acquire(ws.path(), &options("build"), &events()).unwrap();
    assert_eq!(lock.nested("Bad").unwrap_err().code(), codes::ARCANE_USAGE);
    // A rejected name does not occupy the slot.
    let _good = lock.nested("good").unwrap();
}
