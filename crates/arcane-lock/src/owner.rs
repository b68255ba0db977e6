//! Named owner leases: "at most one live process owns this role in this workspace",
//! for as long as that process lives (the Core host is the one user: role `core`).
//!
//! # The rule
//!
//! The role's sentinel is `.arcane/<role>.lock`, opened like the operation lock's (no
//! links followed, a regular file required, a local filesystem required). Its owner is
//! whoever holds `flock(LOCK_EX)` on it; nothing else decides. So:
//!
//! * a crash at any instant frees the role (the kernel drops the lock with the last
//!   descriptor, `kill -9` included); no content of the file, empty, garbage or naming
//!   a live unrelated pid, can keep a workspace stuck;
//! * the file is never removed (removing it would let two owners lock two inodes);
//! * the owner writes `{pid, startTime, startedAt}` into it after locking, for messages
//!   only: it is never trusted for liveness;
//! * anyone can ask whether the role is held ([`owner_lease_held`]) with a non-blocking
//!   shared lock that is released at once, without ever writing.
//!
//! A process that owns the role publishes how to reach it elsewhere (the Core host's
//! `core.json`); a reader trusts that file only while [`owner_lease_held`] says the
//! role is held, so a file left by a dead owner is never believed.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::FlockOperation;

use crate::error::{BusyReason, Error, PolicyReason};
use crate::holder::Holder;
use crate::lease::{lock_sentinel_named, Locked};
use crate::sys;
use crate::workspace::Workspace;

/// A held owner lease: while it lives, no other process owns the role in this
/// workspace. Dropping it releases the role.
#[must_use = "the role is released as soon as this value is dropped"]
#[derive(Debug)]
pub struct OwnerLease {
    workspace: PathBuf,
    role: String,
    _sentinel: OwnedFd,
}

/// How long an acquisition retries a role that looks held: a reader's momentary shared
/// probe ([`owner_lease_held`]) must not make a new owner fail.
const PROBE_GRACE: Duration = Duration::from_millis(250);

fn sentinel_name(role: &str) -> Result<CString, Error> {
    let valid = !role.is_empty()
        && role.len() <= 32
        && role.bytes().all(|b| b.is_ascii_lowercase() || b == b'-');
    if !valid {
        return Err(Error::InvalidOperation {
            operation: role.to_string(),
        });
    }
    CString::new(format!("{role}.lock")).map_err(|_| Error::InvalidOperation {
        operation: role.to_string(),
    })
}

impl OwnerLease {
    /// Takes the role `role` (`[a-z-]+`) in `workspace`, creating `.arcane` (0700) and
    /// the sentinel when missing. Fails with `ARCANE_WORKSPACE_BUSY` (the holder is the
    /// pid the owner wrote, when readable) when a live process owns it.
    pub fn acquire(workspace: &Path, role: &str) -> Result<OwnerLease, Error> {
        let name = sentinel_name(role)?;
        let ws = Workspace::open(workspace)?;
        let Some(arcane) = ws.open_arcane(true)? else {
            return Err(Error::io(
                "open",
                arcane_workspace::layout::state_dir(&ws.canonical),
                std::io::Error::from_raw_os_error(sys::ENOENT),
            ));
        };
        if let Some(filesystem) = sys::unsupported_filesystem(arcane.as_fd()).map_err(|e| {
            Error::io(
                "inspect the filesystem of",
                arcane_workspace::layout::state_dir(&ws.canonical),
                e,
            )
        })? {
            return Err(Error::policy(
                arcane_workspace::layout::state_dir(&ws.canonical),
                PolicyReason::UnsupportedFilesystem {
                    filesystem: filesystem.to_string(),
                },
                None,
            ));
        }
        let deadline = Instant::now() + PROBE_GRACE;
        let sentinel = loop {
            match lock_sentinel_named(&ws, &arcane, &name, true)? {
                Locked::Yes(fd) => break fd,
                Locked::No if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    return Err(Error::busy(
                        &ws.canonical,
                        BusyReason::Locked,
                        read_owner(&arcane, &name),
                    ))
                }
            }
        };
        write_owner(&sentinel);
        Ok(OwnerLease {
            workspace: ws.canonical,
            role: role.to_string(),
            _sentinel: sentinel,
        })
    }

    /// The canonical workspace root.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// The role held.
    pub fn role(&self) -> &str {
        &self.role
    }
}

/// Whether some live process owns `role` in `workspace`. `Ok(false)` when the workspace,
/// its `.arcane` or the sentinel does not exist. Never creates or writes anything.
pub fn owner_lease_held(workspace: &Path, role: &str) -> Result<bool, Error> {
    Ok(probe(workspace, role)?.is_some())
}

/// The live owner of `role` in `workspace`, as it described itself in the sentinel
/// (`pid`, `start_time`), or `None` when no process owns the role. The description is
/// only as good as the owner's word: it is written right after the lock is taken, by a
/// process of the user who owns `.arcane` (0700), so it tells which process holds the
/// role, not whether that process is alive; a caller that acts on the pid checks its
/// start time (a dead owner's pid may be reused). A holder that has not written yet is
/// described by what its predecessor left, or by nothing.
pub fn owner_lease_holder(workspace: &Path, role: &str) -> Result<Option<Holder>, Error> {
    Ok(probe(workspace, role)?.map(|(arcane, name)| {
        read_owner(&arcane, &name).unwrap_or(Holder {
            advisory_lock: true,
            alive: Some(true),
            ..Holder::default()
        })
    }))
}

/// The `.arcane` descriptor and the sentinel's name when `role` is held; never
/// creates or writes anything.
fn probe(workspace: &Path, role: &str) -> Result<Option<(OwnedFd, CString)>, Error> {
    let name = sentinel_name(role)?;
    let ws = match Workspace::open(workspace) {
        Ok(ws) => ws,
        Err(error) if error.is_missing() => return Ok(None),
        Err(error) => return Err(error),
    };
    let Some(arcane) = ws.open_arcane(false)? else {
        return Ok(None);
    };
    let fd = match sys::open_read_at(arcane.as_fd(), &name) {
        Ok(fd) => fd,
        Err(e) if sys::errno(&e) == sys::ENOENT => return Ok(None),
        Err(e) => return Err(Error::io("open", ws.arcane_path(&name), e)),
    };
    match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockShared) {
        Ok(()) => {
            let _ = rustix::fs::flock(&fd, FlockOperation::Unlock);
            Ok(None)
        }
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(Some((arcane, name))),
        Err(e) => Err(Error::io("probe", ws.arcane_path(&name), e.into())),
    }
}

/// Writes who we are into the locked sentinel (informational; errors are ignored).
fn write_owner(sentinel: &OwnedFd) {
    let text = serde_json::json!({
        "pid": sys::own_pid(),
        "startTime": sys::own_start_time(),
        "startedAt": arcane_report::time::now_rfc3339(),
    })
    .to_string();
    let _ = rustix::fs::ftruncate(sentinel, 0);
    let _ = rustix::io::pwrite(sentinel, text.as_bytes(), 0);
}

/// Best effort: the pid the current owner wrote.
fn read_owner(arcane: &OwnedFd, name: &CString) -> Option<Holder> {
    let fd = sys::open_read_at(arcane.as_fd(), name).ok()?;
    let (bytes, _) = sys::read_limited(fd.as_fd(), 4096).ok()?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    Some(Holder {
        pid: value["pid"].as_i64(),
        start_time: value["startTime"].as_u64(),
        since: value["startedAt"].as_str().map(str::to_string),
        advisory_lock: true,
        alive: Some(true),
        ..Holder::default()
    })
}
