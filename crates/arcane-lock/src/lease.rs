//! Taking, holding and releasing the lock: [`WorkspaceLock`], [`NestedLease`],
//! [`AcquireOptions`] and [`with_workspace_lock`].

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use arcane_report::{error_json, CancelToken, Event, EventSink};
use arcane_workspace::layout;
use serde_json::json;

use crate::attempt::{self, Attempt, HandOff, Won};
use crate::error::{BusyReason, Error, PolicyReason};
use crate::found::{self, RecordBytes};
use crate::holder::{human_duration, Holder};
use crate::inherit::{self, Claim};
use crate::published::{spare_name, Drift, Published, Spare};
use crate::record::{self, Rendered};
use crate::registry;
use crate::registry::Reservation;
use crate::sys::{self, TryLock};
use crate::warm::{self, Handles};
use crate::workspace::{classify, regular_file, Workspace};

/// The sentinel that carries the advisory lock (and its holder's facts); created once,
/// never removed.
pub(crate) const SENTINEL: &CStr = layout::LOCK_SENTINEL_NAME;
/// The published JSON record.
pub(crate) const RECORD: &CStr = layout::LOCK_RECORD_NAME;
/// Where a stale record is moved before it is removed (debris is overwritten).
pub(crate) const STALE: &CStr = c".workspace-operation.lock.json.stale";

/// How to take the lock: the operation's name, how long to wait, and a cancellation
/// token. Built with [`AcquireOptions::new`] and the builder methods.
#[derive(Debug, Clone)]
pub struct AcquireOptions {
    operation: String,
    wait: Option<Duration>,
    cancel: Option<CancelToken>,
}

impl AcquireOptions {
    /// Options for `operation`, which must match `[a-z0-9][a-z0-9._-]*` (at most 64
    /// bytes). Fails fast on contention unless [`wait`](Self::wait) is set.
    pub fn new(operation: &str) -> Result<Self, Error> {
        validate_operation(operation)?;
        Ok(Self {
            operation: operation.to_string(),
            wait: None,
            cancel: None,
        })
    }

    /// Waits up to `duration` for a busy workspace, emitting `workspace.operation.waiting`
    /// once. A holder's flock is waited for in the kernel, which hands it over the moment
    /// it is released; a record that says busy on its own (a JavaScript SDK holder) is
    /// polled with jittered back-off. `Duration::ZERO` tries once.
    pub fn wait(mut self, duration: Duration) -> Self {
        self.wait = Some(duration);
        self
    }

    /// Stops waiting promptly with `ARCANE_CANCELLED` when `token` fires.
    pub fn cancel(mut self, token: CancelToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// The operation name.
    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// The wait limit (`None`: fail fast).
    pub fn wait_limit(&self) -> Option<Duration> {
        self.wait
    }

    pub(crate) fn cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(CancelToken::is_cancelled)
    }
}

/// An operation name as the SDK accepts it (`^[a-z0-9][a-z0-9.-]*$`), at most 64 bytes:
/// a record naming anything else would not be one the SDK can recover.
fn validate_operation(operation: &str) -> Result<(), Error> {
    let bytes = operation.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= 64
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidOperation {
            operation: operation.to_string(),
        })
    }
}

/// A lease: proof that the workspace lock is held, by a root [`WorkspaceLock`] or a
/// [`NestedLease`] borrowed from one. Sealed: no other type can claim to be a lease,
/// so a function that takes `&impl Lease` (or `&dyn Lease`) cannot be called without
/// the lock (lock-spec.md W12, case 59).
pub trait Lease: sealed::Sealed {
    /// The canonical workspace root.
    fn workspace(&self) -> &Path;
    /// This lease's operation.
    fn operation(&self) -> &str;
    /// This lease's nonce (the root's nonce is the one in the record).
    fn nonce(&self) -> &str;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::WorkspaceLock {}
    impl Sealed for super::NestedLease<'_> {}
}

/// The root lease on a workspace: while it lives, no other process (Arcane or the
/// JavaScript SDK) and no other root lease in this process holds the workspace.
///
/// Dropping it releases the lock; a failure there is swallowed (it never panics). Call
/// [`release`](Self::release) or [`release_with_events`](Self::release_with_events) to
/// learn the outcome.
#[must_use = "the workspace lock is released as soon as this value is dropped"]
#[derive(Debug)]
pub struct WorkspaceLock {
    workspace: PathBuf,
    identity: sys::Identity,
    operation: String,
    nonce: String,
    acquired_at: String,
    held: Option<Held>,
    child: Mutex<Option<String>>,
}

#[derive(Debug)]
struct Held {
    /// The workspace's descriptors, the sentinel's locked (for an inherited lease, a
    /// close-on-exec duplicate of the inherited one).
    handles: Handles,
    /// The record as this lease knows it (renewed while held, for a root lease).
    record: Arc<Published>,
    reservation: Reservation,
    /// Inherited from an ancestor: never unlock, never remove the record.
    inherited: bool,
    /// The locked description was passed to a child ([`WorkspaceLock::inheritance`]):
    /// never unlock it explicitly, so it stays locked while that child (or anything it
    /// left behind) lives.
    shared: AtomicBool,
}

/// What a child process needs to inherit a lease: keep `fd` open across `exec` and set
/// `variable=value` in its environment (see the inheritance rule in the crate docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inheritance {
    /// The locked descriptor, to pass to the child as the same number.
    pub fd: RawFd,
    /// The environment variable's name ([`crate::LEASE_VARIABLE`]).
    pub variable: &'static str,
    /// Its value.
    pub value: String,
}

impl WorkspaceLock {
    /// Takes the workspace lock for `options.operation()`.
    ///
    /// Tries once; on contention fails with `ARCANE_WORKSPACE_BUSY` (naming the holder)
    /// unless [`AcquireOptions::wait`] was given. Emits `workspace.operation.stale-recovered`
    /// when it replaces a stale record, `workspace.operation.waiting` once when it starts
    /// waiting, and `workspace.operation.locked` when it holds the lock.
    pub fn acquire(
        workspace: &Path,
        options: &AcquireOptions,
        events: &dyn EventSink,
    ) -> Result<WorkspaceLock, Error> {
        let cancelled = || Error::Cancelled {
            workspace: workspace.to_path_buf(),
            operation: options.operation.clone(),
        };
        if options.cancelled() {
            return Err(cancelled());
        }
        if inherit::claimed() {
            let ws = Workspace::open(workspace)?;
            if let Some(claim) = inherit::claim_for(&ws) {
                let lock = adopt(ws, claim?, options)?;
                return locked(lock, None, options, events).map_err(|()| cancelled());
            }
        }
        let started = Instant::now();
        let deadline = options.wait.map(|wait| started + wait);
        let mut announced = false;
        let mut backoff = None;
        let mut handed = None;
        let mut attempt = Attempt::start(workspace, options)?;
        loop {
            if options.cancelled() {
                attempt.give_back();
                return Err(cancelled());
            }
            let busy;
            (attempt, busy) = match attempt.try_lock(options, events, handed.take())? {
                Ok(won) => {
                    let waited = announced.then(|| started.elapsed());
                    let lock = WorkspaceLock::won(won, options);
                    return locked(lock, waited, options, events).map_err(|()| cancelled());
                }
                Err(busy) => busy,
            };
            let now = Instant::now();
            let Some(deadline) = deadline.filter(|d| now < *d) else {
                attempt.give_back();
                return Err(waited_for(busy, options.wait.map(|_| started.elapsed())));
            };
            if !announced {
                announced = true;
                announce_wait(attempt.ws(), &busy, options, events);
            }
            if matches!(
                &busy,
                Error::Busy {
                    reason: BusyReason::Locked,
                    ..
                }
            ) {
                // Another Arcane process holds the flock: let the kernel hand it over
                // the moment it is released, instead of polling.
                match attempt::hand_off(&attempt, deadline, options.cancel.as_ref())? {
                    HandOff::Locked(fd) => handed = Some(fd),
                    HandOff::Cancelled => {
                        attempt.give_back();
                        return Err(cancelled());
                    }
                    HandOff::TimedOut => {}
                }
                continue;
            }
            // Busy for a reason the record gives (an SDK holder): poll with back-off.
            let delay = backoff
                .get_or_insert_with(Backoff::new)
                .next()
                .min(deadline - now);
            match &options.cancel {
                Some(token) => {
                    if token.wait_timeout(delay) {
                        attempt.give_back();
                        return Err(cancelled());
                    }
                }
                None => std::thread::sleep(delay),
            }
        }
    }

    /// The lease a won attempt holds.
    fn won(won: Won, options: &AcquireOptions) -> WorkspaceLock {
        WorkspaceLock {
            workspace: won.handles.ws.canonical.clone(),
            identity: won.handles.ws.identity,
            operation: options.operation.clone(),
            nonce: won.nonce,
            acquired_at: won.acquired_at,
            held: Some(Held {
                handles: won.handles,
                record: won.record,
                reservation: won.reservation,
                inherited: false,
                shared: AtomicBool::new(false),
            }),
            child: Mutex::new(None),
        }
    }

    /// The canonical workspace root.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// The operation holding the lock.
    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// The lease nonce written in the record.
    pub fn nonce(&self) -> &str {
        &self.nonce
    }

    /// When the lock was taken (RFC 3339 UTC).
    pub fn acquired_at(&self) -> &str {
        &self.acquired_at
    }

    /// Starts a nested operation that borrows this lease. One child per parent at a time:
    /// a second concurrent child is `ARCANE_WORKSPACE_BUSY`. No file I/O, no events.
    pub fn nested(&self, operation: &str) -> Result<NestedLease<'_>, Error> {
        NestedLease::start(&self.workspace, &self.operation, &self.child, operation)
    }

    /// Lets a child process inherit this lease (see the inheritance rule in the crate
    /// docs): the caller passes [`Inheritance::fd`] and the variable to the child. From
    /// then on the lock is never unlocked explicitly: the kernel releases it when the
    /// last process holding the descriptor ends. `None` once released.
    pub fn inheritance(&self) -> Option<Inheritance> {
        let held = self.held.as_ref()?;
        held.shared.store(true, Ordering::SeqCst);
        Some(Inheritance {
            fd: held.handles.sentinel.as_raw_fd(),
            variable: inherit::LEASE_VARIABLE,
            value: Claim {
                fd: held.handles.sentinel.as_raw_fd(),
                workspace: self.identity,
                nonce: self.nonce.clone(),
            }
            .render(),
        })
    }

    /// Whether this lease was inherited from an ancestor process.
    pub fn is_inherited(&self) -> bool {
        self.held.as_ref().is_some_and(|held| held.inherited)
    }

    /// Checks that the lock is still intact: the sentinel we hold is the one at the path
    /// and our record is still in place, unmodified (its renewals aside).
    /// `ARCANE_LOCK_COMPROMISED` otherwise (lock-spec.md W16); long-running holders call
    /// this periodically.
    pub fn check(&self) -> Result<(), Error> {
        let Some(held) = &self.held else {
            return Ok(());
        };
        let path = layout::lock_record(&self.workspace);
        let compromised = |what| Error::Compromised {
            path: path.clone(),
            operation: self.operation.clone(),
            what,
        };
        if let Some(what) = held.handles.sentinel_drift()? {
            return Err(compromised(what));
        }
        match held.record.drift() {
            Ok(Drift::None) => Ok(()),
            Ok(drift) => Err(compromised(drift.describe())),
            Err(e) => Err(Error::io("inspect the lock record", &path, e)),
        }
    }

    /// Releases the lock: removes our record (only if it is still ours, identity-checked)
    /// and unlocks. Emits nothing; see [`release_with_events`](Self::release_with_events).
    pub fn release(mut self) -> Result<(), Error> {
        self.release_inner()
    }

    /// Releases the lock like [`release`](Self::release) and, on success, emits
    /// `workspace.operation.released`.
    pub fn release_with_events(mut self, events: &dyn EventSink) -> Result<(), Error> {
        let result = self.release_inner();
        if result.is_ok() {
            events.emit(Event::new(
                arcane_report::event_types::WORKSPACE_OPERATION_RELEASED,
                json!({"workspaceRoot": self.workspace, "operation": self.operation}),
            ));
        }
        result
    }

    fn release_inner(&mut self) -> Result<(), Error> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        if held.inherited {
            // The ancestor that took the lock releases it; we only stop using it.
            return Ok(());
        }
        // Our inode is removed even if it was rewritten (which is then reported); a
        // file that replaced it is someone else's and stays. A process that locks
        // again and again keeps it as its spare (the `published` module).
        let path = || layout::lock_record(&self.workspace);
        let keep = (!held.handles.fresh && !held.shared.load(Ordering::SeqCst))
            .then(|| sys::own_start_time().and_then(|s| spare_name(held.handles.pid, s)))
            .flatten();
        let (result, spare) = match held.record.remove(keep) {
            Ok((Drift::None, spare)) => (Ok(()), spare),
            Ok((drift, _)) => (
                Err(Error::Compromised {
                    path: path(),
                    operation: self.operation.clone(),
                    what: drift.describe(),
                }),
                None,
            ),
            Err(e) => (Err(Error::io("remove the lock record", path(), e)), None),
        };
        finish(held, result, spare)
    }
}

/// Unlocks and forgets a released lease, keeping the workspace's handles (and `spare`)
/// for the next acquisition; returns `result`.
fn finish(held: Held, result: Result<(), Error>, spare: Option<Spare>) -> Result<(), Error> {
    let Held {
        mut handles,
        record,
        reservation,
        inherited,
        shared,
    } = held;
    drop(record);
    // Unlock explicitly (a forked child might share the descriptor); but a description
    // handed to a child on purpose stays locked until that child is gone, and is never
    // used again.
    if !inherited && !shared.load(Ordering::SeqCst) {
        let _ = sys::unlock(handles.sentinel.as_fd());
        handles.spare = spare;
        warm::keep(handles);
    }
    drop(reservation);
    result
}

impl Drop for WorkspaceLock {
    fn drop(&mut self) {
        // Never panics; a failure here is only observable through `release`.
        let _ = self.release_inner();
    }
}

impl Lease for WorkspaceLock {
    fn workspace(&self) -> &Path {
        &self.workspace
    }
    fn operation(&self) -> &str {
        &self.operation
    }
    fn nonce(&self) -> &str {
        &self.nonce
    }
}

/// A nested operation under a held lease. It borrows its parent, so it can neither be
/// forged nor outlive it, and the parent cannot be released while it is active:
///
/// ```compile_fail
/// # fn demo(workspace: &std::path::Path) -> Result<(), arcane_lock::Error> {
/// use arcane_lock::{AcquireOptions, WorkspaceLock};
/// let lock = WorkspaceLock::acquire(workspace, &AcquireOptions::new("build")?, &arcane_report::NullSink)?;
/// let child = lock.nested("compile")?;
/// lock.release()?; // error: cannot move out of `lock` because it is borrowed
/// drop(child);
/// # Ok(()) }
/// ```
#[must_use = "the nested lease ends as soon as this value is dropped"]
#[derive(Debug)]
pub struct NestedLease<'parent> {
    workspace: &'parent Path,
    parent_slot: &'parent Mutex<Option<String>>,
    operation: String,
    nonce: String,
    child: Mutex<Option<String>>,
}

impl<'parent> NestedLease<'parent> {
    fn start(
        workspace: &'parent Path,
        parent_operation: &str,
        slot: &'parent Mutex<Option<String>>,
        operation: &str,
    ) -> Result<Self, Error> {
        validate_operation(operation)?;
        let mut active = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(active) = active.as_ref() {
            return Err(Error::busy(
                workspace,
                BusyReason::NestedActive {
                    parent: parent_operation.to_string(),
                    active: active.clone(),
                },
                None,
            ));
        }
        *active = Some(operation.to_string());
        Ok(NestedLease {
            workspace,
            parent_slot: slot,
            operation: operation.to_string(),
            nonce: record::new_nonce(),
            child: Mutex::new(None),
        })
    }

    /// The canonical workspace root.
    pub fn workspace(&self) -> &Path {
        self.workspace
    }

    /// This nested operation's name.
    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// Starts a deeper nested operation (one child per parent).
    pub fn nested(&self, operation: &str) -> Result<NestedLease<'_>, Error> {
        NestedLease::start(self.workspace, &self.operation, &self.child, operation)
    }

    /// Ends this nested operation (the same as dropping it).
    pub fn release(self) -> Result<(), Error> {
        Ok(())
    }
}

impl Drop for NestedLease<'_> {
    fn drop(&mut self) {
        *self.parent_slot.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

impl Lease for NestedLease<'_> {
    fn workspace(&self) -> &Path {
        self.workspace
    }
    fn operation(&self) -> &str {
        &self.operation
    }
    fn nonce(&self) -> &str {
        &self.nonce
    }
}

/// Runs `work` while holding the workspace lock, then releases it and emits
/// `workspace.operation.released`.
///
/// * work succeeds, release succeeds: the work's value;
/// * work succeeds, release fails: the release error;
/// * work fails: the work's own error, unchanged; a release failure is then reported as
///   a `workspace.operation.release-failed` event rather than hiding the work's error.
pub fn with_workspace_lock<T, E: From<Error>>(
    workspace: &Path,
    options: &AcquireOptions,
    events: &dyn EventSink,
    work: impl FnOnce(&WorkspaceLock) -> Result<T, E>,
) -> Result<T, E> {
    let lock = WorkspaceLock::acquire(workspace, options, events)?;
    let root = lock.workspace.clone();
    let operation = lock.operation.clone();
    let outcome = work(&lock);
    let released = lock.release_with_events(events);
    match (outcome, released) {
        (Ok(value), Ok(())) => Ok(value),
        (Ok(_), Err(error)) => Err(error.into()),
        (Err(error), Ok(())) => Err(error),
        (Err(error), Err(release_error)) => {
            events.emit(Event::new(
                arcane_report::event_types::WORKSPACE_OPERATION_RELEASE_FAILED,
                json!({"workspaceRoot": root, "operation": operation, "error": error_json(&release_error)}),
            ));
            Err(error)
        }
    }
}

/// Emits `workspace.operation.locked` for a lease just taken (or inherited, which the
/// event says); `Err(())` when cancellation
/// came while it was taken (the lease is given back before any work runs).
fn locked(
    lock: WorkspaceLock,
    waited: Option<Duration>,
    options: &AcquireOptions,
    events: &dyn EventSink,
) -> Result<WorkspaceLock, ()> {
    if events.enabled() {
        events.emit(Event::new(
            arcane_report::event_types::WORKSPACE_OPERATION_LOCKED,
            json!({
                "workspaceRoot": lock.workspace,
                "operation": lock.operation,
                "lockPath": layout::lock_record(&lock.workspace),
                "nonce": lock.nonce,
                "pid": sys::own_pid(),
                "waitedMilliseconds": waited.map(|w| w.as_millis() as u64),
                "inherited": lock.is_inherited(),
            }),
        ));
    }
    if options.cancelled() {
        let _ = lock.release_with_events(events);
        return Err(());
    }
    Ok(lock)
}

/// A busy error that says how long it waited.
fn waited_for(busy: Error, waited: Option<Duration>) -> Error {
    match busy {
        Error::Busy {
            workspace,
            reason,
            holder,
            ..
        } => Error::Busy {
            workspace,
            reason,
            holder,
            waited,
        },
        other => other,
    }
}

/// Emits `workspace.operation.waiting` (once per acquisition).
fn announce_wait(ws: &Workspace, busy: &Error, options: &AcquireOptions, events: &dyn EventSink) {
    let (holder, reason) = match busy {
        Error::Busy { holder, reason, .. } => (holder.as_deref().cloned(), reason.clone()),
        _ => (None, BusyReason::Locked),
    };
    events.emit(Event::new(
        arcane_report::event_types::WORKSPACE_OPERATION_WAITING,
        json!({
            "workspaceRoot": ws.canonical,
            "operation": options.operation,
            "lockPath": ws.arcane_path(RECORD),
            "holder": holder.as_ref().map(Holder::to_json),
            "reason": reason.name(),
            "waitMilliseconds": options.wait.map(|w| w.as_millis() as u64),
            "wait": options.wait.map(human_duration),
        }),
    ));
}

/// Takes the lease an ancestor passed down, once `inherit::verify` proves it.
fn adopt(ws: Workspace, claim: &Claim, options: &AcquireOptions) -> Result<WorkspaceLock, Error> {
    let acquired_at = arcane_report::time::now_rfc3339();
    let reservation = registry::reserve(ws.identity, &options.operation, Some(&acquired_at))
        .map_err(|h| Error::busy(&ws.canonical, BusyReason::SameProcess, Some(*h)))?;
    let Some(arcane) = ws.open_arcane(false)? else {
        return Err(Error::io(
            "open",
            layout::state_dir(&ws.canonical),
            std::io::Error::from_raw_os_error(sys::ENOENT),
        ));
    };
    let record = found::read_record(&ws, &arcane)?;
    let record_nonce = record
        .as_ref()
        .and_then(|(found, _)| found::nonce_of(found));
    inherit::verify(&ws, arcane.as_fd(), claim, record_nonce.as_deref())?;
    // A verified claim has a readable record (its nonce matched).
    let Some((RecordBytes::Bytes(bytes), stamp)) = record else {
        unreachable_missing(&ws)?
    };
    let sentinel = sys::duplicate(claim.fd)
        .map_err(|e| Error::io("duplicate the inherited lock", ws.arcane_path(SENTINEL), e))?;
    let handles = Handles::inherited(ws, arcane, sentinel)?;
    let rendered = Rendered {
        times: record::locate_times(&bytes),
        bytes,
    };
    let published = Published::new(Arc::clone(&handles.arcane), None, rendered, stamp);
    Ok(WorkspaceLock {
        workspace: handles.ws.canonical.clone(),
        identity: handles.ws.identity,
        operation: options.operation.clone(),
        nonce: claim.nonce.clone(),
        acquired_at,
        held: Some(Held {
            handles,
            record: Arc::new(published),
            reservation,
            inherited: true,
            shared: AtomicBool::new(false),
        }),
        child: Mutex::new(None),
    })
}

fn unreachable_missing<T>(ws: &Workspace) -> Result<T, Error> {
    Err(Error::io(
        "open the lock sentinel",
        ws.arcane_path(SENTINEL),
        std::io::Error::from_raw_os_error(sys::ENOENT),
    ))
}

/// The outcome of trying the advisory lock.
pub(crate) enum Locked {
    /// We hold it, on this descriptor.
    Yes(OwnedFd),
    /// Another open file description holds it.
    No,
    /// There is no sentinel (only when not creating).
    Missing,
}

/// Opens the sentinel and tries `flock(LOCK_EX|LOCK_NB)`, then checks that the path
/// still names the inode we locked; if a third party replaced the sentinel between our
/// open and our lock, retries on the new file (lock-spec.md case 55, arti fslock-guard).
pub(crate) fn lock_sentinel(
    ws: &Workspace,
    arcane: &OwnedFd,
    create: bool,
) -> Result<Locked, Error> {
    lock_sentinel_named(ws, arcane, SENTINEL, create)
}

/// [`lock_sentinel`] for the sentinel `name` (the owner leases' `<role>.lock` too).
pub(crate) fn lock_sentinel_named(
    ws: &Workspace,
    arcane: &OwnedFd,
    name: &CStr,
    create: bool,
) -> Result<Locked, Error> {
    let path = ws.arcane_path(name);
    for _ in 0..16 {
        let fd = match sys::open_sentinel(arcane.as_fd(), name, create) {
            Ok(fd) => fd,
            Err(e) if !create && sys::errno(&e) == sys::ENOENT => return Ok(Locked::Missing),
            Err(e) => {
                let kind = sys::stat_at(arcane.as_fd(), name).map(|s| s.kind).ok();
                return Err(classify(&path, e, kind, "open the lock sentinel"));
            }
        };
        let ours = regular_file(fd.as_fd(), &path, "inspect the lock sentinel")?;
        if !try_flock(fd.as_fd(), &|| path.clone())? {
            return Ok(Locked::No);
        }
        match sys::stat_at(arcane.as_fd(), name) {
            Ok(at) if at.identity == ours.identity => return Ok(Locked::Yes(fd)),
            // Replaced or removed behind us: our lock is on an orphan inode. Retry.
            Ok(_) => continue,
            Err(e) if sys::errno(&e) == sys::ENOENT => continue,
            Err(e) => return Err(Error::io("inspect the lock sentinel", &path, e)),
        }
    }
    Err(replaced_repeatedly(path))
}

/// `flock(LOCK_EX | LOCK_NB)` on a sentinel (`path` names it in an error): whether this
/// descriptor holds the lock now. A filesystem that cannot lock is
/// `ARCANE_POLICY_DENIED` (reason `unsupported-filesystem`).
pub(crate) fn try_flock(
    fd: std::os::fd::BorrowedFd<'_>,
    path: &dyn Fn() -> PathBuf,
) -> Result<bool, Error> {
    match sys::try_lock_exclusive(fd).map_err(|e| Error::io("lock", path(), e))? {
        TryLock::Locked => Ok(true),
        TryLock::WouldBlock => Ok(false),
        TryLock::Unsupported(e) => Err(Error::policy(
            path(),
            PolicyReason::UnsupportedFilesystem {
                filesystem: "flock unsupported".into(),
            },
            Some(e),
        )),
    }
}

/// A sentinel swapped under every one of an acquirer's attempts to lock it.
pub(crate) fn replaced_repeatedly(path: PathBuf) -> Error {
    Error::Compromised {
        path,
        operation: String::new(),
        what: "replaced repeatedly while being locked",
    }
}

/// Jittered back-off: 1 ms doubling to 8 ms, ±25 % (git's lockfile.c jitters by ±25 %
/// too). The cap stays small during the first 10 s of a wait because exponential
/// back-off is unfair: fresh waiters poll often and starve old ones; after that it grows
/// to 100 ms so a long wait costs little.
struct Backoff {
    next: Duration,
    state: u64,
    started: Instant,
}

impl Backoff {
    fn new() -> Self {
        let seed = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos() as u64
            ^ ((sys::own_pid() as u64) << 32)
            | 1;
        Backoff {
            next: Duration::from_millis(1),
            state: seed,
            started: Instant::now(),
        }
    }

    fn next(&mut self) -> Duration {
        // xorshift64
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let base = self.next;
        let cap = if self.started.elapsed() < Duration::from_secs(10) {
            Duration::from_millis(8)
        } else {
            Duration::from_millis(100)
        };
        self.next = (self.next * 2).min(cap);
        let permille = 750 + (self.state % 501); // 0.75 ..= 1.25
        base * permille as u32 / 1000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_names_follow_the_sdk_pattern() {
        for ok in ["build", "a", "0x", "install.runtime", "scaffold-create"] {
            assert!(AcquireOptions::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Build",
            "-x",
            ".x",
            "_x",
            // The SDK's pattern has no underscore: it could not recover such a record.
            "model_add",
            "a b",
            "a/b",
            "é",
            &"a".repeat(65),
        ] {
            assert!(
                matches!(
                    AcquireOptions::new(bad),
                    Err(Error::InvalidOperation { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn backoff_grows_to_a_cap_with_jitter() {
        let mut b = Backoff::new();
        let delays: Vec<_> = (0..12).map(|_| b.next()).collect();
        assert!(delays[0] <= Duration::from_micros(1250));
        assert!(delays.iter().all(|d| *d <= Duration::from_micros(10_000)));
        assert!(delays[11] >= Duration::from_micros(6_000));
    }
}
