//! The workspace operation lock: at most one mutating operation per workspace, across
//! threads, processes, `kill -9`, PID reuse and the JavaScript SDK.
//!
//! Every mutating Arcane operation (installing a runtime, adding a model, building a
//! bundle, serving) runs under this lock. This crate owns the lock's files, liveness,
//! stale recovery, nested leases, waiting and cancellation; it does not own what the
//! operations do.
//!
//! # Theory of operation
//!
//! Under the workspace root, in `.arcane/` (mode 0700):
//!
//! * `workspace-operation.lock` — the **sentinel**. Created once, never removed (removing
//!   it would let two holders lock two different inodes; tox-dev/filelock#577). A holder
//!   keeps `flock(LOCK_EX)` on it for the whole lease, so the kernel tells a live holder
//!   from a dead one, even after `kill -9` or PID reuse. After locking, the holder checks
//!   that the path still names the inode it locked and retries otherwise. The holder
//!   writes Arcane's facts about itself into it (host, boot id, process start time, the
//!   real acquisition time, the workspace's directory identity), under the record's
//!   nonce: the `record` module.
//! * `workspace-operation.lock.json` — the **record**, exactly the JavaScript SDK's
//!   schema-1 document. It is written and fsynced *before* the lock is tried (as an
//!   unnamed file, or the process's spare record file), and the flock holder publishes
//!   it with one exclusive link — so it is still created *exclusively*: an SDK process
//!   sees our lock, and we see its lock (the `published` module). The holder removes it
//!   on release (only if it is still its own inode) *before* unlocking, and while it
//!   holds the lock a background thread keeps its `expiresAt` a short horizon ahead (the
//!   `renew` module), so an SDK 0.1.1 recovers a killed holder within that horizon.
//!
//! A process keeps the descriptors of a workspace it locked (and its spare record file)
//! for its next acquisition, after proving with a few `stat` calls that the names still
//! lead to them (the `warm` module); that and writing the record outside the lock keep
//! an acquisition within twice the cost of the bare system calls any lock file needs.
//!
//! When a holder finds a record it did not write, the rule in the `recovery` module
//! (whose documentation is its specification) decides: a record from an Arcane holder is
//! stale by definition once we hold the flock (same kernel; or the same host after a
//! reboot), an SDK record is stale only when its pid is absent, and everything else —
//! unreadable, oversized, another workspace's, another host's, a live owner — is busy and
//! left byte-for-byte untouched.
//!
//! # Guarantees
//!
//! * **Exclusive**: between Arcane processes by `flock`; against the SDK by the
//!   exclusive publication of the record; within a process by a registry keyed by the
//!   workspace's `(dev, ino)`.
//! * **Crash-safe**: a crash at any instant leaves either nothing, a harmless sentinel,
//!   debris the sweep removes (the `debris` module: when a holder died, and on a
//!   process's first acquisition), or a complete record whose writer no longer holds the
//!   flock — which the next acquirer recovers at once, emitting
//!   `workspace.operation.stale-recovered` with the previous owner.
//! * **Symlink-safe**: the workspace must be a physical directory (linked ancestors are
//!   allowed; the lease binds to the canonical path); `.arcane`, the sentinel and the
//!   record are opened relative to directory descriptors with `O_NOFOLLOW`, and a link,
//!   directory, FIFO or other non-file where a file belongs is `ARCANE_POLICY_DENIED`
//!   with nothing touched.
//! * **No silent unlocked runs**: on NFS, SMB/CIFS, FUSE, 9p, AFS and Lustre (detected
//!   with `fstatfs`), or when `flock` answers `ENOLCK`/`EOPNOTSUPP`/`ENOSYS`, acquisition
//!   fails with `ARCANE_POLICY_DENIED` (reason `unsupported-filesystem`) instead of
//!   running without exclusion, as cargo does.
//! * **No wall clocks**: `expiresAt` is written (and renewed) for the SDK and never read.
//! * **Holder self-check**: [`WorkspaceLock::check`] verifies that the sentinel and the
//!   record are still ours (`ARCANE_LOCK_COMPROMISED` otherwise); `arcane lock run` calls
//!   it every second and stops its command when the lock was taken from under it.
//!
//! # Inheritance
//!
//! A command run under a held lease (`arcane lock run`) inherits the locked descriptor
//! and a variable naming it, so nested Arcane operations in it run at once and the lock
//! stays held for exactly as long as the command, or anything it leaves behind, lives.
//! The rule (what is proven before an inherited lease is used) is the `inherit`
//! module's documentation; [`WorkspaceLock::inheritance`] hands a lease down and
//! [`inherit`] takes the variable the process started with.
//!
//! # Limits
//!
//! * Linux only for now (it reads `/proc` for the canonical path, boot id and process
//!   start times, and uses `renameat2`). Windows would lock a byte range of the sentinel
//!   with `LockFileEx`, which keeps the record readable; that is not implemented.
//! * `flock` is per open file description: a process that `fork`s *without* `exec` while
//!   holding the lock shares it with the child (descriptors are `O_CLOEXEC`, so an
//!   `exec`ed child never inherits it).
//! * The JavaScript SDK cannot see the advisory lock, so it judges an Arcane record as
//!   one of its own, by the recorded pid: the SDK 0.89 deletes it as soon as that pid
//!   is gone, the SDK 0.1.1 once it has also expired, which a live holder never lets
//!   happen (within 30 seconds of the holder's death). An `arcane lock
//!   run` killed while the command it started still runs (holding the inherited lock)
//!   is therefore taken for dead by the SDK; Arcane in turn judges SDK records by the
//!   SDK's own rule.
//! * Cached descriptors keep the workspace's filesystem busy (it cannot be unmounted)
//!   for up to 30 seconds after the last acquisition; a process that locks the same
//!   workspace repeatedly keeps a spare record file there as long (and a killed one
//!   leaves it for the next command to sweep).
//! * [`status`] takes the advisory lock for an instant when it looks free, so an
//!   acquirer failing fast in that instant reports busy.
//!
//! # Events
//!
//! | type | data | when |
//! |---|---|---|
//! | `workspace.operation.locked` | `workspaceRoot`, `operation`, `lockPath`, `nonce`, `pid`, `waitedMilliseconds`, `inherited` | the lock is held (`inherited`: through a lease an ancestor passed down) |
//! | `workspace.operation.released` | `workspaceRoot`, `operation` | after [`WorkspaceLock::release_with_events`] or [`with_workspace_lock`] |
//! | `workspace.operation.stale-recovered` | `workspaceRoot`, `lockPath`, `previousOwner` {`pid`, `hostname`, `bootId`, `startTime`, `command`}, `previousOperation`, `previousAcquiredAt`, `reason` | a stale record was replaced |
//! | `workspace.operation.waiting` | `workspaceRoot`, `operation`, `lockPath`, `holder`, `reason`, `waitMilliseconds`, `wait` | once, when a waiting acquisition first meets contention |
//! | `workspace.operation.stale-quarantined` | `workspaceRoot`, `quarantinePath`, `problem` | [`recover`] moved an unreadable record aside |
//! | `workspace.operation.release-failed` | `workspaceRoot`, `operation`, `error` | [`with_workspace_lock`]: release failed after the work failed |
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use arcane_lock::{with_workspace_lock, AcquireOptions, Error};
//! use arcane_report::Collector;
//!
//! # fn main() -> Result<(), Error> {
//! let dir = tempfile::tempdir().unwrap();
//! let events = Collector::default();
//! let options = AcquireOptions::new("demo")?.wait(Duration::from_secs(5));
//! let answer = with_workspace_lock(dir.path(), &options, &events, |lock| {
//!     // Only one process at a time gets here. Nested work borrows the lease:
//!     let child = lock.nested("demo.step")?;
//!     assert_eq!(child.workspace(), lock.workspace());
//!     Ok::<_, Error>(42)
//! })?;
//! assert_eq!(answer, 42);
//! assert_eq!(events.types(), ["workspace.operation.locked", "workspace.operation.released"]);
//! # Ok(()) }
//! ```
//!
//! Benchmark (acquire+release against the raw syscall floor, and latency under 8
//! contending processes): `cargo bench -p arcane-lock --bench lock`.
#![warn(missing_docs)]

mod attempt;
mod debris;
mod error;
mod found;
mod holder;
mod inherit;
mod inspect;
mod lease;
mod owner;
mod published;
mod record;
mod recovery;
mod registry;
mod renew;
mod state;
mod sys;
mod warm;
mod workspace;

pub use error::{BusyReason, Error, PolicyReason};
pub use holder::Holder;
pub use inherit::{inherit, LEASE_VARIABLE};
pub use inspect::{recover, status, LockStatus, RecoverOptions, Recovered};
pub use lease::{
    with_workspace_lock, AcquireOptions, Inheritance, Lease, NestedLease, WorkspaceLock,
};
pub use owner::{owner_lease_held, owner_lease_holder, OwnerLease};
pub use state::state_subdir;

// A lease can move to another thread (e.g. `spawn_blocking`) and errors cross threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<WorkspaceLock>();
    assert_send_sync::<NestedLease<'static>>();
    assert_send_sync::<Error>();
    assert_send_sync::<AcquireOptions>();
    assert_send_sync::<OwnerLease>();
};
