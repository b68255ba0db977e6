//! One acquisition, attempt by attempt: the record written before the lock is tried,
//! the advisory lock taken (or handed over by a waiter), the record published or the
//! one in its way judged, and the holder's facts written.
//!
//! The order is what keeps the work under the lock short: everything that does not
//! need the lock (opening the workspace, writing and fsyncing the record) happens
//! before it is tried, and a record is published with one exclusive link. A record
//! found in the way is judged with the facts its holder left in the sentinel, before
//! this holder writes its own there.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arcane_report::{CancelToken, EventSink};

use crate::debris;
use crate::error::{BusyReason, Error};
use crate::found;
use crate::holder::Holder;
use crate::lease::{replaced_repeatedly, try_flock, AcquireOptions, SENTINEL};
use crate::published::{Prepared, Published};
use crate::record::{self, Fields};
use crate::recovery::Verdict;
use crate::registry::{self, Reservation};
use crate::sys;
use crate::warm::{self, Handles};
use crate::workspace::{classify, Workspace};

/// An acquisition in progress: the workspace's handles and the prepared record.
pub(crate) struct Attempt {
    handles: Handles,
    prepared: Prepared,
    nonce: String,
}

/// What a won attempt holds.
pub(crate) struct Won {
    pub(crate) handles: Handles,
    pub(crate) record: Arc<Published>,
    pub(crate) reservation: Reservation,
    pub(crate) nonce: String,
    pub(crate) acquired_at: String,
}

/// The outcome of one attempt: won, or busy (with the attempt, to try again).
pub(crate) type Outcome = Result<Won, (Attempt, Error)>;

impl Attempt {
    /// Opens the workspace at `path` and writes the record `options` will publish.
    pub(crate) fn start(path: &Path, options: &AcquireOptions) -> Result<Attempt, Error> {
        let mut handles = warm::open(path)?;
        let nonce = record::new_nonce();
        let prepared = Prepared::new(
            &handles.ws,
            &handles.arcane,
            handles.spare.take(),
            &Fields {
                operation: options.operation(),
                nonce: &nonce,
                scope: &handles.scope_json,
                pid: handles.pid,
            },
        )?;
        Ok(Attempt {
            handles,
            prepared,
            nonce,
        })
    }

    /// The workspace.
    pub(crate) fn ws(&self) -> &Workspace {
        &self.handles.ws
    }

    /// Gives the workspace's handles back for the next acquisition (the lock is not
    /// held by them: the attempt ended busy or cancelled).
    pub(crate) fn give_back(self) {
        let mut handles = self.handles;
        handles.spare = self.prepared.into_spare();
        warm::keep(handles);
    }

    /// One try. `handed` is a descriptor of the sentinel a waiter got locked.
    pub(crate) fn try_lock(
        mut self,
        options: &AcquireOptions,
        events: &dyn EventSink,
        handed: Option<OwnedFd>,
    ) -> Result<Outcome, Error> {
        let identity = self.handles.ws.identity;
        let reservation = match registry::reserve(identity, options.operation(), None) {
            Ok(reservation) => reservation,
            Err(holder) => return Ok(Err(self.busy(BusyReason::SameProcess, Some(*holder)))),
        };
        if let Some(fd) = handed {
            // Counts only if it still is the sentinel these handles lock.
            self.handles.adopt_sentinel(fd);
        }
        if !self.lock()? {
            let holder = found::read_holder(&self.handles.arcane);
            return Ok(Err(self.busy(BusyReason::Locked, holder)));
        }
        // We hold the advisory lock: no Arcane process on this kernel holds the
        // workspace. Every way out that is not a win unlocks.
        match self.publish(options, events) {
            Ok(()) => {}
            Err(Attempted::Busy(busy)) => {
                let _ = sys::unlock(self.handles.sentinel.as_fd());
                return Ok(Err((self, busy)));
            }
            Err(Attempted::Failed(error)) => {
                let _ = sys::unlock(self.handles.sentinel.as_fd());
                return Err(error);
            }
        }
        let Attempt {
            handles,
            prepared,
            nonce,
        } = self;
        let acquired_at = arcane_report::time::now_rfc3339();
        let record = Arc::new(prepared.into_published());
        let facts = record::render_facts(handles.pid, &nonce, &acquired_at, handles.ws.identity);
        if let Err(e) = found::write_facts(&handles.sentinel, &facts) {
            let _ = record.remove(None);
            let _ = sys::unlock(handles.sentinel.as_fd());
            return Err(Error::io(
                "write the lock holder's facts into",
                handles.ws.arcane_path(SENTINEL),
                e,
            ));
        }
        reservation.update(&acquired_at, &nonce);
        crate::renew::watch(&record);
        Ok(Ok(Won {
            handles,
            record,
            reservation,
            nonce,
            acquired_at,
        }))
    }

    fn busy(self, reason: BusyReason, holder: Option<Holder>) -> (Attempt, Error) {
        let error = Error::busy(&self.handles.ws.canonical, reason, holder);
        (self, error)
    }

    /// Takes the advisory lock on the sentinel and checks that its name still names the
    /// locked inode; a sentinel a third party replaced between our open and our lock is
    /// opened again (lock-spec.md case 55, arti fslock-guard). `false`: another open
    /// file description holds it.
    fn lock(&mut self) -> Result<bool, Error> {
        for _ in 0..16 {
            let path = || self.handles.ws.arcane_path(SENTINEL);
            if !try_flock(self.handles.sentinel.as_fd(), &path)? {
                return Ok(false);
            }
            if self.handles.sentinel_drift()?.is_none() {
                return Ok(true);
            }
            let _ = sys::unlock(self.handles.sentinel.as_fd());
            self.handles.reopen_sentinel()?;
        }
        Err(replaced_repeatedly(self.ws().arcane_path(SENTINEL)))
    }

    /// Publishes the record under the lock, judging (and, when stale, replacing) a
    /// record in its way; sweeps debris when a holder died or on this process's first
    /// acquisition of the workspace.
    fn publish(
        &mut self,
        options: &AcquireOptions,
        events: &dyn EventSink,
    ) -> Result<(), Attempted> {
        let ws = &self.handles.ws;
        let arcane = &self.handles.arcane;
        let busy = |reason, holder| Attempted::Busy(Error::busy(&ws.canonical, reason, holder));
        if options.cancelled() {
            return Err(Attempted::Failed(Error::Cancelled {
                workspace: ws.canonical.clone(),
                operation: options.operation().to_string(),
            }));
        }
        let mut swept = false;
        let mut published = self.prepared.publish(ws)?;
        if !published {
            // The record in the way is judged with the facts its holder left.
            if let Some((found, stamp)) = found::read_record(ws, arcane)? {
                let facts = found::read_facts_from(&self.handles.sentinel);
                match found::judge(ws, &found, &stamp, facts.as_deref()) {
                    Verdict::Busy { reason, holder } => return Err(busy(reason, holder)),
                    Verdict::Stale { previous, why } => {
                        let removed =
                            found::remove_stale(ws, arcane, stamp, &previous, why, events)?;
                        if let Err(holder) = removed {
                            return Err(busy(BusyReason::RecordAppeared, holder));
                        }
                        // Its holder died: so may a writer in the middle of a write.
                        debris::sweep(ws, arcane);
                        swept = true;
                    }
                }
            }
            published = self.prepared.publish(ws)?;
        }
        if !published {
            return Err(busy(BusyReason::RecordAppeared, found::read_holder(arcane)));
        }
        if self.handles.fresh && !swept {
            debris::sweep(ws, arcane);
        }
        Ok(())
    }
}

/// Why an attempt under the lock did not win.
enum Attempted {
    Busy(Error),
    Failed(Error),
}

impl From<Error> for Attempted {
    fn from(error: Error) -> Self {
        Attempted::Failed(error)
    }
}

/// How a kernel hand-off of the flock ended.
pub(crate) enum HandOff {
    /// We hold the flock on this descriptor (the attempt re-checks the path).
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
pub(crate) fn hand_off(
    attempt: &Attempt,
    deadline: Instant,
    cancel: Option<&CancelToken>,
) -> Result<HandOff, Error> {
    let path = attempt.ws().arcane_path(SENTINEL);
    let arcane = &attempt.handles.arcane;
    // Read and write, as the lease's own descriptor: the holder writes its facts there.
    let fd = sys::open_sentinel(arcane.as_fd(), SENTINEL, true).map_err(|e| {
        let kind = sys::stat_at(arcane.as_fd(), SENTINEL).map(|s| s.kind).ok();
        classify(&path, e, kind, "open the lock sentinel")
    })?;
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
