//! Taking, holding and releasing the lock: [`WorkspaceLock`], [`NestedLease`],
//! [`AcquireOptions`] and [`with_workspace_lock`].

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use arcane_report::{error_json, CancelToken, Event, EventSink};
use arcane_workspace::layout;
use serde_json::json;

use crate::error::{BusyReason, Error, PolicyReason};
use crate::holder::{human_duration, Holder};
use crate::inherit::{self, Claim};
use crate::record;
use crate::recovery::{self, Found, Scope, Verdict};
use crate::registry::{self, Reservation};
use crate::sys::{self, Kind, Stamp, TryLock};
use crate::workspace::{classify, Workspace};

/// The sentinel that carries the advisory lock; created once, never removed.
pub(crate) const SENTINEL: &CStr = layout::LOCK_SENTINEL_NAME;
/// The published JSON record.
pub(crate) const RECORD: &CStr = layout::LOCK_RECORD_NAME;
/// Arcane's facts about the record's holder.
pub(crate) const FACTS: &CStr = layout::LOCK_FACTS_NAME;
/// Where the facts are written before they are renamed into place.
const FACTS_TEMPORARY: &CStr = c".workspace-operation.lock.arcane.json.tmp";
/// Where a record is written before it is published (debris is overwritten).
pub(crate) const TEMPORARY: &CStr = c".workspace-operation.lock.json.tmp";
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

    fn cancelled(&self) -> bool {
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
    arcane: OwnedFd,
    /// Our descriptor of the sentinel's locked open file description (for an inherited
    /// lease, a close-on-exec duplicate of the inherited one).
    sentinel: OwnedFd,
    record: Stamp,
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
        let ws = Workspace::open(workspace)?;
        if let Some(claim) = inherit::claim_for(&ws) {
            let lock = adopt(&ws, claim?, options)?;
            return locked(lock, &ws, None, options, events).map_err(|()| cancelled());
        }
        let started = Instant::now();
        let deadline = options.wait.map(|wait| started + wait);
        let mut announced = false;
        let mut backoff = Backoff::new();
        let mut handed = None;
        loop {
            if options.cancelled() {
                return Err(cancelled());
            }
            let busy = match try_once(&ws, options, events, handed.take())? {
                Ok(lock) => {
                    let waited = announced.then(|| started.elapsed());
                    return locked(lock, &ws, waited, options, events).map_err(|()| cancelled());
                }
                Err(busy) => busy,
            };
            let now = Instant::now();
            let Some(deadline) = deadline.filter(|d| now < *d) else {
                return Err(waited_for(busy, options.wait.map(|_| started.elapsed())));
            };
            if !announced {
                announced = true;
                announce_wait(&ws, &busy, options, events);
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
                match hand_off(&ws, deadline, options.cancel.as_ref())? {
                    HandOff::Locked(fd) => handed = Some(fd),
                    HandOff::Cancelled => return Err(cancelled()),
                    HandOff::TimedOut => {}
                }
                continue;
            }
            // Busy for a reason the record gives (an SDK holder): poll with back-off.
            let delay = backoff.next().min(deadline - now);
            match &options.cancel {
                Some(token) => {
                    if token.wait_timeout(delay) {
                        return Err(cancelled());
                    }
                }
                None => std::thread::sleep(delay),
            }
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
            fd: held.sentinel.as_raw_fd(),
            variable: inherit::LEASE_VARIABLE,
            value: Claim {
                fd: held.sentinel.as_raw_fd(),
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
    /// and our record is still in place, unmodified. `ARCANE_LOCK_COMPROMISED` otherwise
    /// (lock-spec.md W16); long-running holders call this periodically.
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
        let ours = sys::stat_fd(held.sentinel.as_fd())
            .map_err(|e| Error::io("inspect the lock sentinel", &path, e))?;
        match sys::stat_at(held.arcane.as_fd(), SENTINEL) {
            Ok(at) if at.identity == ours.identity => {}
            Ok(_) => return Err(compromised("left without its sentinel (replaced)")),
            Err(_) => return Err(compromised("left without its sentinel (deleted)")),
        }
        match sys::stat_at(held.arcane.as_fd(), RECORD) {
            Ok(at) if at.identity != held.record.identity => {
                Err(compromised("replaced by another file"))
            }
            Ok(at) if at.size != held.record.size || at.mtime != held.record.mtime => {
                Err(compromised("modified"))
            }
            Ok(_) => Ok(()),
            Err(e) if sys::errno(&e) == sys::ENOENT => Err(compromised("deleted")),
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
        let path = layout::lock_record(&self.workspace);
        let compromised = |what| Error::Compromised {
            path: path.clone(),
            operation: self.operation.clone(),
            what,
        };
        let result = match sys::stat_at(held.arcane.as_fd(), RECORD) {
            Err(e) if sys::errno(&e) == sys::ENOENT => Err(compromised("deleted")),
            Err(e) => Err(Error::io("inspect the lock record", &path, e)),
            // Someone else's file: never remove it.
            Ok(at) if at.identity != held.record.identity => {
                Err(compromised("replaced by another file"))
            }
            Ok(at) => {
                // Our inode: remove it even if it was rewritten, then say so; then our
                // facts (the record first: it never stands without them).
                match sys::unlink_at(held.arcane.as_fd(), RECORD) {
                    Ok(()) => {}
                    Err(e) if sys::errno(&e) == sys::ENOENT => {}
                    Err(e) => {
                        return finish(held, Err(Error::io("remove the lock record", &path, e)))
                    }
                }
                remove_facts(&held.arcane);
                if at.size != held.record.size || at.mtime != held.record.mtime {
                    Err(compromised("modified"))
                } else {
                    Ok(())
                }
            }
        };
        finish(held, result)
    }
}

/// Unlocks and forgets a released lease, keeping the first error.
fn finish(held: Held, result: Result<(), Error>) -> Result<(), Error> {
    // Unlock explicitly (a forked child might share the descriptor), then close; but a
    // description handed to a child on purpose stays locked until that child is gone.
    if !held.inherited && !held.shared.load(Ordering::SeqCst) {
        let _ = sys::unlock(held.sentinel.as_fd());
    }
    drop(held.sentinel);
    drop(held.arcane);
    drop(held.reservation);
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
    ws: &Workspace,
    waited: Option<Duration>,
    options: &AcquireOptions,
    events: &dyn EventSink,
) -> Result<WorkspaceLock, ()> {
    events.emit(Event::new(
        arcane_report::event_types::WORKSPACE_OPERATION_LOCKED,
        json!({
            "workspaceRoot": lock.workspace,
            "operation": lock.operation,
            "lockPath": ws.arcane_path(RECORD),
            "nonce": lock.nonce,
            "pid": sys::own_pid(),
            "waitedMilliseconds": waited.map(|w| w.as_millis() as u64),
            "inherited": lock.is_inherited(),
        }),
    ));
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

/// How a kernel hand-off of the flock ended.
enum HandOff {
    /// We hold the flock on this descriptor (the caller re-checks the path).
    Locked(OwnedFd),
    /// The deadline passed first.
    TimedOut,
    /// Cancellation fired first.
    Cancelled,
}

/// Waits for the sentinel's flock in the kernel (a blocking `flock(LOCK_EX)` on a fresh
/// descriptor, on a helper thread) until it is ours, `deadline` passes or `cancel`
/// fires. The kernel wakes a blocked waiter the moment the holder releases, so a waiter
/// gets the lock in microseconds instead of at its next poll.
///
/// `flock` has no timeout: a helper thread abandoned at the deadline stays blocked until
/// the holder releases, then drops its descriptor at once (its send fails), which
/// unlocks it. A timed-out or cancelled wait may therefore leave one blocked thread
/// behind until then; it holds nothing.
fn hand_off(
    ws: &Workspace,
    deadline: Instant,
    cancel: Option<&CancelToken>,
) -> Result<HandOff, Error> {
    let path = ws.arcane_path(SENTINEL);
    let Some(arcane) = ws.open_arcane(false)? else {
        return Ok(HandOff::TimedOut);
    };
    let fd = match sys::open_sentinel(arcane.as_fd(), SENTINEL, false) {
        Ok(fd) => fd,
        Err(e) => {
            let kind = sys::stat_at(arcane.as_fd(), SENTINEL).map(|s| s.kind).ok();
            return Err(classify(&path, e, kind, "open the lock sentinel"));
        }
    };
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("arcane-lock-wait".into())
        .spawn(move || {
            let outcome = sys::lock_exclusive_blocking(fd.as_fd()).map(|()| fd);
            let _ = sender.send(outcome);
        })
        .map_err(|e| Error::io("start a waiter for", &path, e))?;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(HandOff::TimedOut);
        }
        if cancel.is_some_and(CancelToken::is_cancelled) {
            return Ok(HandOff::Cancelled);
        }
        // Short slices so cancellation is noticed promptly.
        let slice = (deadline - now).min(Duration::from_millis(50));
        match receiver.recv_timeout(slice) {
            Ok(Ok(fd)) => return Ok(HandOff::Locked(fd)),
            Ok(Err(e)) => return Err(Error::io("lock", &path, e)),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return Ok(HandOff::TimedOut),
        }
    }
}

/// One attempt: `Ok(Ok(lock))`, `Ok(Err(busy))` on contention, `Err` on anything else.
fn try_once(
    ws: &Workspace,
    options: &AcquireOptions,
    events: &dyn EventSink,
    handed: Option<OwnedFd>,
) -> Result<Result<WorkspaceLock, Error>, Error> {
    let busy = |reason, holder| Error::busy(&ws.canonical, reason, holder);
    let acquired = SystemTime::now();
    let acquired_at = arcane_report::time::format_rfc3339(acquired);
    let me = myself(options, &acquired_at);
    let reservation = match registry::reserve(ws.identity, me.clone()) {
        Ok(reservation) => reservation,
        Err(holder) => return Ok(Err(busy(BusyReason::SameProcess, Some(*holder)))),
    };
    let Some(arcane) = ws.open_arcane(true)? else {
        return Err(Error::io(
            "open",
            layout::state_dir(&ws.canonical),
            std::io::Error::from_raw_os_error(sys::ENOENT),
        ));
    };
    let fs = sys::unsupported_filesystem(arcane.as_fd()).map_err(|e| {
        Error::io(
            "inspect the filesystem of",
            layout::state_dir(&ws.canonical),
            e,
        )
    })?;
    if let Some(filesystem) = fs {
        return Err(Error::policy(
            layout::state_dir(&ws.canonical),
            PolicyReason::UnsupportedFilesystem {
                filesystem: filesystem.to_string(),
            },
            None,
        ));
    }
    // A descriptor the kernel handed over counts only if the path still names it.
    let handed = handed.filter(|fd| {
        let ours = sys::stat_fd(fd.as_fd()).map(|s| s.identity).ok();
        ours.is_some()
            && sys::stat_at(arcane.as_fd(), SENTINEL)
                .map(|s| s.identity)
                .ok()
                == ours
    });
    let sentinel = match handed
        .map(Locked::Yes)
        .map_or_else(|| lock_sentinel(ws, &arcane, true), Ok)?
    {
        Locked::Yes(fd) => fd,
        Locked::No => return Ok(Err(busy(BusyReason::Locked, read_holder(&arcane)))),
        Locked::Missing => unreachable_missing(ws)?,
    };
    // We hold the advisory lock: no Arcane process on this kernel holds the workspace.
    sweep_debris(ws, &arcane);
    if let Some((found, stamp)) = read_record(ws, &arcane)? {
        let scope = Scope {
            canonical: &ws.canonical,
            identity: ws.identity,
        };
        let verdict = match &found {
            RecordBytes::Bytes(bytes) => recovery::judge(Found::Bytes(bytes), &scope),
            RecordBytes::Oversized => recovery::judge(Found::Oversized, &scope),
        };
        match verdict {
            Verdict::Busy { reason, holder } => return Ok(Err(busy(reason, holder))),
            Verdict::Stale { previous, why } => {
                if let Err(holder) = remove_stale(ws, &arcane, stamp, &previous, why, events)? {
                    return Ok(Err(busy(BusyReason::RecordAppeared, holder)));
                }
            }
        }
    }
    if options.cancelled() {
        return Err(Error::Cancelled {
            workspace: ws.canonical.clone(),
            operation: options.operation.clone(),
        });
    }
    let nonce = record::new_nonce();
    let bytes = record::render(
        &options.operation,
        &nonce,
        &ws.canonical,
        acquired,
        &acquired_at,
    );
    // Arcane's facts first, then the record (which is the SDK's document exactly): a
    // record is never without its facts while its holder lives.
    write_facts(ws, &arcane, &record::render_facts(&nonce, ws.identity))?;
    let stamp = match publish(ws, &arcane, &bytes)? {
        Some(stamp) => stamp,
        None => return Ok(Err(busy(BusyReason::RecordAppeared, read_holder(&arcane)))),
    };
    reservation.update(Holder {
        nonce: Some(nonce.clone()),
        ..me
    });
    Ok(Ok(WorkspaceLock {
        workspace: ws.canonical.clone(),
        identity: ws.identity,
        operation: options.operation.clone(),
        nonce,
        acquired_at,
        held: Some(Held {
            arcane,
            sentinel,
            record: stamp,
            reservation,
            inherited: false,
            shared: AtomicBool::new(false),
        }),
        child: Mutex::new(None),
    }))
}

/// This process as a holder of `options.operation`.
fn myself(options: &AcquireOptions, acquired_at: &str) -> Holder {
    Holder {
        pid: Some(i64::from(sys::own_pid())),
        hostname: Some(sys::hostname().to_string()),
        command: sys::own_command().map(str::to_string),
        operation: Some(options.operation.clone()),
        since: Some(acquired_at.to_string()),
        advisory_lock: true,
        alive: Some(true),
        ..Holder::default()
    }
}

/// Takes the lease an ancestor passed down, once `inherit::verify` proves it.
fn adopt(ws: &Workspace, claim: &Claim, options: &AcquireOptions) -> Result<WorkspaceLock, Error> {
    let acquired_at = arcane_report::time::now_rfc3339();
    let me = myself(options, &acquired_at);
    let reservation = registry::reserve(ws.identity, me)
        .map_err(|h| Error::busy(&ws.canonical, BusyReason::SameProcess, Some(*h)))?;
    let Some(arcane) = ws.open_arcane(false)? else {
        return Err(Error::io(
            "open",
            layout::state_dir(&ws.canonical),
            std::io::Error::from_raw_os_error(sys::ENOENT),
        ));
    };
    let record = read_record(ws, &arcane)?;
    let record_nonce = match &record {
        Some((RecordBytes::Bytes(bytes), _)) => record::parse(bytes)
            .ok()
            .and_then(|parsed| parsed.holder.nonce),
        _ => None,
    };
    inherit::verify(ws, arcane.as_fd(), claim, record_nonce.as_deref())?;
    let Some((_, stamp)) = record else {
        unreachable_missing(ws)?
    };
    let sentinel = sys::duplicate(claim.fd)
        .map_err(|e| Error::io("duplicate the inherited lock", ws.arcane_path(SENTINEL), e))?;
    Ok(WorkspaceLock {
        workspace: ws.canonical.clone(),
        identity: ws.identity,
        operation: options.operation.clone(),
        nonce: claim.nonce.clone(),
        acquired_at,
        held: Some(Held {
            arcane,
            sentinel,
            record: stamp,
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
        let ours = sys::stat_fd(fd.as_fd())
            .map_err(|e| Error::io("inspect the lock sentinel", &path, e))?;
        if ours.kind != Kind::Regular {
            return Err(Error::policy(
                &path,
                PolicyReason::WrongKind {
                    found: ours.kind.describe(),
                },
                None,
            ));
        }
        match sys::try_lock_exclusive(fd.as_fd()).map_err(|e| Error::io("lock", &path, e))? {
            TryLock::Locked => {}
            TryLock::WouldBlock => return Ok(Locked::No),
            TryLock::Unsupported(e) => {
                return Err(Error::policy(
                    &path,
                    PolicyReason::UnsupportedFilesystem {
                        filesystem: "flock unsupported".into(),
                    },
                    Some(e),
                ))
            }
        }
        match sys::stat_at(arcane.as_fd(), name) {
            Ok(at) if at.identity == ours.identity => return Ok(Locked::Yes(fd)),
            // Replaced or removed behind us: our lock is on an orphan inode. Retry.
            Ok(_) => continue,
            Err(e) if sys::errno(&e) == sys::ENOENT => continue,
            Err(e) => return Err(Error::io("inspect the lock sentinel", &path, e)),
        }
    }
    Err(Error::Compromised {
        path,
        operation: String::new(),
        what: "replaced repeatedly while being locked",
    })
}

/// The bytes of an existing record.
pub(crate) enum RecordBytes {
    Bytes(Vec<u8>),
    Oversized,
}

/// Reads the record without following links. `None` when there is none. A link,
/// directory, FIFO or other non-file there is `ARCANE_POLICY_DENIED`.
pub(crate) fn read_record(
    ws: &Workspace,
    arcane: &OwnedFd,
) -> Result<Option<(RecordBytes, Stamp)>, Error> {
    let path = ws.arcane_path(RECORD);
    let fd = match sys::open_read_at(arcane.as_fd(), RECORD) {
        Ok(fd) => fd,
        Err(e) if sys::errno(&e) == sys::ENOENT => return Ok(None),
        Err(e) => {
            let kind = sys::stat_at(arcane.as_fd(), RECORD).map(|s| s.kind).ok();
            return Err(classify(&path, e, kind, "read the lock record"));
        }
    };
    let stamp =
        sys::stat_fd(fd.as_fd()).map_err(|e| Error::io("inspect the lock record", &path, e))?;
    if stamp.kind != Kind::Regular {
        return Err(Error::policy(
            &path,
            PolicyReason::WrongKind {
                found: stamp.kind.describe(),
            },
            None,
        ));
    }
    let (bytes, oversized) = sys::read_limited(fd.as_fd(), record::MAX_RECORD_BYTES)
        .map_err(|e| Error::io("read the lock record", &path, e))?;
    Ok(Some((
        if oversized {
            RecordBytes::Oversized
        } else {
            RecordBytes::Bytes(record::with_facts(bytes, read_facts(arcane).as_deref()))
        },
        stamp,
    )))
}

/// How old a temporary file must be before it counts as a killed writer's debris (a
/// live write takes milliseconds).
const DEBRIS_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes what killed writers left in `.arcane`: temporary files of the atomic write
/// (`.NAME.<16 hex>.tmp`) older than [`DEBRIS_AGE`]. Runs under the sentinel's lock;
/// regular files only, never through a link (unlinked relative to the directory).
fn sweep_debris(ws: &Workspace, arcane: &OwnedFd) {
    let Ok(entries) = std::fs::read_dir(layout::state_dir(&ws.canonical)) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(text) = name.to_str() else {
            continue;
        };
        let random = text
            .strip_suffix(".tmp")
            .and_then(|rest| rest.rsplit_once('.'))
            .map(|(_, random)| random);
        let debris = text.starts_with('.')
            && random.is_some_and(|r| r.len() == 16 && r.bytes().all(|b| b.is_ascii_hexdigit()));
        let old = entry.metadata().is_ok_and(|m| {
            m.file_type().is_file()
                && m.modified()
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age >= DEBRIS_AGE)
        });
        if debris && old {
            if let Ok(name) = std::ffi::CString::new(text) {
                let _ = sys::unlink_at(arcane.as_fd(), &name);
            }
        }
    }
}

/// Arcane's facts about the holder, beside the record (best effort: `None` when there
/// are none or they are not a small regular file).
fn read_facts(arcane: &OwnedFd) -> Option<Vec<u8>> {
    let fd = sys::open_read_at(arcane.as_fd(), FACTS).ok()?;
    let stamp = sys::stat_fd(fd.as_fd()).ok()?;
    if stamp.kind != Kind::Regular {
        return None;
    }
    let (bytes, oversized) = sys::read_limited(fd.as_fd(), record::MAX_RECORD_BYTES).ok()?;
    (!oversized).then_some(bytes)
}

/// Writes Arcane's facts about this holder (replacing any left by an earlier one):
/// under the sentinel's advisory lock, which every Arcane writer holds.
fn write_facts(ws: &Workspace, arcane: &OwnedFd, bytes: &[u8]) -> Result<(), Error> {
    let path = ws.arcane_path(FACTS);
    let _ = sys::unlink_at(arcane.as_fd(), FACTS_TEMPORARY);
    let fd = sys::create_exclusive_at(arcane.as_fd(), FACTS_TEMPORARY).map_err(|e| {
        let kind = sys::stat_at(arcane.as_fd(), FACTS_TEMPORARY)
            .map(|s| s.kind)
            .ok();
        classify(&path, e, kind, "write the lock facts")
    })?;
    let written = sys::write_all(fd.as_fd(), bytes).and_then(|()| sys::sync(fd.as_fd()));
    drop(fd);
    let result = written.and_then(|()| sys::rename_at(arcane.as_fd(), FACTS_TEMPORARY, FACTS));
    if let Err(e) = result {
        let _ = sys::unlink_at(arcane.as_fd(), FACTS_TEMPORARY);
        return Err(Error::io("write the lock facts", &path, e));
    }
    Ok(())
}

/// Removes Arcane's facts about the holder once its record is gone (the record is
/// removed first, so a record is never left without its facts by Arcane).
pub(crate) fn remove_facts(arcane: &OwnedFd) {
    let _ = sys::unlink_at(arcane.as_fd(), FACTS);
}

/// Best effort: who the record names (for busy messages).
pub(crate) fn read_holder(arcane: &OwnedFd) -> Option<Holder> {
    let fd = sys::open_read_at(arcane.as_fd(), RECORD).ok()?;
    let stamp = sys::stat_fd(fd.as_fd()).ok()?;
    if stamp.kind != Kind::Regular {
        return None;
    }
    let (bytes, oversized) = sys::read_limited(fd.as_fd(), record::MAX_RECORD_BYTES).ok()?;
    if oversized {
        return None;
    }
    record::holder_hint(&record::with_facts(bytes, read_facts(arcane).as_deref()))
}

/// Moves a stale record aside, verifies it is the inode that was judged, reports it and
/// removes it. `Ok(Err(holder))` when something else had taken its place (restored).
pub(crate) fn remove_stale(
    ws: &Workspace,
    arcane: &OwnedFd,
    judged: Stamp,
    previous: &Holder,
    why: &str,
    events: &dyn EventSink,
) -> Result<Result<(), Option<Holder>>, Error> {
    let path = ws.arcane_path(RECORD);
    match sys::rename_at(arcane.as_fd(), RECORD, STALE) {
        Ok(()) => {}
        // Gone already (an SDK process removed it): nothing to recover.
        Err(e) if sys::errno(&e) == sys::ENOENT => return Ok(Ok(())),
        Err(e) => {
            // Something that is not our debris sits at the aside name (a directory, a
            // link): name *it*, not the record, so the person knows what to remove.
            return Err(match sys::stat_at(arcane.as_fd(), STALE) {
                Ok(stamp) if stamp.kind != Kind::Regular => Error::policy(
                    ws.arcane_path(STALE),
                    PolicyReason::InTheWay {
                        found: stamp.kind.describe(),
                    },
                    Some(e),
                ),
                _ => Error::io("move the stale lock record aside", &path, e),
            });
        }
    }
    let moved = sys::stat_at(arcane.as_fd(), STALE)
        .map_err(|e| Error::io("inspect the stale lock record", &path, e))?;
    if moved.identity != judged.identity || moved.size != judged.size || moved.mtime != judged.mtime
    {
        // Not what we judged: put it back without clobbering anything newer.
        let holder = read_holder_at(arcane, STALE);
        let _ = sys::rename_noreplace_at(arcane.as_fd(), STALE, RECORD);
        return Ok(Err(holder));
    }
    events.emit(Event::new(
        arcane_report::event_types::WORKSPACE_OPERATION_STALE_RECOVERED,
        json!({
            "workspaceRoot": ws.canonical,
            "lockPath": path,
            "previousOwner": {
                "pid": previous.pid,
                "hostname": previous.hostname,
                "bootId": previous.boot_id,
                "startTime": previous.start_time,
                "command": previous.command,
            },
            "previousOperation": previous.operation,
            "previousAcquiredAt": previous.since,
            "previousAdvisoryLock": previous.advisory_lock,
            "reason": why,
        }),
    ));
    // The stale holder's facts go with its record (removed under the sentinel's lock,
    // which no other Arcane writer holds now).
    remove_facts(arcane);
    match sys::unlink_at(arcane.as_fd(), STALE) {
        Ok(()) => Ok(Ok(())),
        Err(e) if sys::errno(&e) == sys::ENOENT => Ok(Ok(())),
        Err(e) => Err(Error::io(
            "remove the stale lock record",
            ws.arcane_path(STALE),
            e,
        )),
    }
}

fn read_holder_at(arcane: &OwnedFd, name: &CStr) -> Option<Holder> {
    let fd = sys::open_read_at(arcane.as_fd(), name).ok()?;
    let (bytes, _) = sys::read_limited(fd.as_fd(), record::MAX_RECORD_BYTES).ok()?;
    record::holder_hint(&bytes)
}

/// Writes the record to the temporary name, fsyncs it and renames it to the record
/// name only if none exists (`RENAME_NOREPLACE`, or `link`+`unlink`). `Ok(None)` when a
/// record appeared first (a JavaScript SDK process won the exclusive create).
///
/// The directory is not fsynced: after a power cut every holder is gone anyway, and the
/// file's data is durable before its name appears, so the record is either absent or
/// complete — never empty or partial (lock-spec.md W4).
fn publish(ws: &Workspace, arcane: &OwnedFd, bytes: &[u8]) -> Result<Option<Stamp>, Error> {
    let temporary = ws.arcane_path(TEMPORARY);
    let refuse = |e| {
        let kind = sys::stat_at(arcane.as_fd(), TEMPORARY).map(|s| s.kind).ok();
        classify(&temporary, e, kind, "write the lock record")
    };
    let fd = match sys::create_exclusive_at(arcane.as_fd(), TEMPORARY) {
        Ok(fd) => fd,
        // Debris of a crashed holder (only a lock holder writes this name): remove a
        // regular file and retry; refuse anything else (a link, directory, FIFO).
        Err(e) if sys::errno(&e) == sys::EEXIST => {
            match sys::stat_at(arcane.as_fd(), TEMPORARY) {
                Ok(stamp) if stamp.kind == Kind::Regular => {}
                Ok(stamp) => {
                    return Err(match stamp.kind {
                        Kind::Symlink => {
                            Error::policy(&temporary, PolicyReason::SymbolicLink, None)
                        }
                        other => Error::policy(
                            &temporary,
                            PolicyReason::WrongKind {
                                found: other.describe(),
                            },
                            None,
                        ),
                    })
                }
                Err(e) => return Err(refuse(e)),
            }
            let _ = sys::unlink_at(arcane.as_fd(), TEMPORARY);
            sys::create_exclusive_at(arcane.as_fd(), TEMPORARY).map_err(refuse)?
        }
        Err(e) => return Err(refuse(e)),
    };
    let written = sys::write_all(fd.as_fd(), bytes)
        .and_then(|()| sys::sync(fd.as_fd()))
        .and_then(|()| sys::stat_fd(fd.as_fd()));
    drop(fd);
    let stamp = match written {
        Ok(stamp) => stamp,
        Err(e) => {
            let _ = sys::unlink_at(arcane.as_fd(), TEMPORARY);
            return Err(Error::io("write the lock record", &temporary, e));
        }
    };
    match sys::rename_noreplace_at(arcane.as_fd(), TEMPORARY, RECORD) {
        Ok(()) => Ok(Some(stamp)),
        Err(e) if sys::errno(&e) == sys::EEXIST => {
            let _ = sys::unlink_at(arcane.as_fd(), TEMPORARY);
            Ok(None)
        }
        Err(e) => {
            let _ = sys::unlink_at(arcane.as_fd(), TEMPORARY);
            Err(Error::io(
                "publish the lock record",
                ws.arcane_path(RECORD),
                e,
            ))
        }
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
