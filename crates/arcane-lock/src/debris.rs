//! What killed writers leave in `.arcane`, and when it is cleared.
//!
//! Every atomic write in `.arcane` goes through a temporary file with an unpredictable
//! name (`.NAME.<16 hex>.tmp`, `arcane_files::write_atomic`, and the lock record on a
//! filesystem without unnamed files); a writer killed mid-write leaves it behind. Such
//! debris is in nobody's way (the names are random), so clearing it is housekeeping,
//! not part of taking the lock, and costs a directory scan. It runs under the lock:
//!
//! * when an acquisition found a holder that died (it recovered a stale record): a
//!   process that was killed holding the lock is the likeliest writer to have been
//!   killed mid-write;
//! * on a process's first acquisition of a workspace (not on the later ones, whose
//!   handles are reused: the `warm` module), so debris of a writer that died without
//!   the lock is gone by the next command.
//!
//! Only regular files of that form older than [`DEBRIS_AGE`] go (a live write takes
//! milliseconds), unlinked relative to `.arcane` (never through a link); the spare
//! record files of processes that are gone (their names carry the pid and start time:
//! the `published` module), whatever their age; and the fixed names earlier Arcane
//! versions wrote under the lock, which no live writer can be using while we hold it.

use std::ffi::CStr;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use arcane_workspace::layout;

use crate::published;
use crate::sys;
use crate::workspace::Workspace;

/// How old a temporary file must be before it counts as a killed writer's debris.
pub(crate) const DEBRIS_AGE: Duration = Duration::from_secs(600);

/// Names earlier versions wrote under the lock: the record's and the facts' fixed
/// temporary names, and the facts file (the facts now live in the sentinel).
const EARLIER: [&CStr; 3] = [
    c".workspace-operation.lock.json.tmp",
    c".workspace-operation.lock.arcane.json.tmp",
    layout::LOCK_FACTS_NAME,
];

/// Removes the debris in `.arcane` (`arcane`). Best effort: the caller holds the lock.
pub(crate) fn sweep(ws: &Workspace, arcane: &OwnedFd) {
    for name in EARLIER {
        if sys::stat_at(arcane.as_fd(), name).is_ok_and(|s| s.kind == sys::Kind::Regular) {
            let _ = sys::unlink_at(arcane.as_fd(), name);
        }
    }
    let Ok(entries) = std::fs::read_dir(layout::state_dir(&ws.canonical)) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        // The name first: only a candidate costs a `stat`.
        let Some(text) = name.to_str() else {
            continue;
        };
        let debris: fn(&sys::Stamp) -> bool = if is_temporary(text) {
            |s| sys::age_of(s.mtime).is_some_and(|age| age >= DEBRIS_AGE)
        } else if let Some((pid, start_time)) = published::spare_owner(text) {
            let gone = arcane_process::Identity { pid, start_time }.liveness()
                != arcane_process::Liveness::Alive;
            if !gone {
                continue;
            }
            |_| true
        } else {
            continue;
        };
        let Ok(name) = std::ffi::CString::new(text) else {
            continue;
        };
        let remove = sys::stat_at(arcane.as_fd(), &name)
            .is_ok_and(|s| s.kind == sys::Kind::Regular && debris(&s));
        if remove {
            let _ = sys::unlink_at(arcane.as_fd(), &name);
        }
    }
}

/// `.NAME.<16 hex>.tmp`: an atomic write's temporary name.
fn is_temporary(name: &str) -> bool {
    let random = name
        .strip_suffix(".tmp")
        .and_then(|rest| rest.rsplit_once('.'))
        .map(|(_, random)| random);
    name.starts_with('.')
        && random.is_some_and(|r| r.len() == 16 && r.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_names_carry_their_owner() {
        let name = published::spare_name(412, 98765).unwrap();
        assert_eq!(
            published::spare_owner(name.to_str().unwrap()),
            Some((412, 98765))
        );
        for other in [
            ".workspace-operation.lock.json.spare-412",
            ".workspace-operation.lock.json.spare-412-",
            ".workspace-operation.lock.json.spare--1-2",
            ".workspace-operation.lock.json.spare-4x-2",
            "workspace-operation.lock.json",
        ] {
            assert_eq!(published::spare_owner(other), None, "{other}");
        }
    }

    #[test]
    fn only_the_atomic_writes_temporary_names_are_candidates() {
        assert!(is_temporary(".core.json.0123456789abcdef.tmp"));
        assert!(is_temporary(
            ".workspace-operation.lock.json.0123456789ABCDEF.tmp"
        ));
        for other in [
            "core.json.0123456789abcdef.tmp",
            ".core.json.0123456789abcde.tmp",
            ".core.json.0123456789abcdeg.tmp",
            ".not-ours.tmp",
            ".workspace-operation.lock.json.tmp",
            "workspace-operation.lock",
        ] {
            assert!(!is_temporary(other), "{other}");
        }
    }
}
