//! Looking at a lock without taking it ([`status`]) and recovering a stale one on
//! request ([`recover`]).

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use arcane_report::{Event, EventSink};
use serde_json::{json, Value};

use crate::error::{BusyReason, Error};
use crate::found::{self, read_holder, read_record, remove_stale, RecordBytes};
use crate::holder::Holder;
use crate::lease::{lock_sentinel, Locked, RECORD, STALE};
use crate::recovery::Verdict;
use crate::sys;
use crate::sys::Stamp;
use crate::workspace::Workspace;

/// The state of a workspace's lock, as [`status`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockStatus {
    /// Nobody holds it.
    Free,
    /// Someone holds it (or it cannot be judged safely; `reason` says which).
    Held {
        /// Who, as far as the record tells (`None`: no readable record yet).
        holder: Option<Holder>,
        /// Why it counts as held.
        reason: BusyReason,
    },
    /// A record remains whose owner is provably gone; the next acquirer replaces it.
    Stale {
        /// Who held it.
        holder: Holder,
    },
}

impl LockStatus {
    /// `free`, `held` or `stale`.
    pub fn state(&self) -> &'static str {
        match self {
            LockStatus::Free => "free",
            LockStatus::Held { .. } => "held",
            LockStatus::Stale { .. } => "stale",
        }
    }

    /// `{"state", "holder", "reason"}`, the shape of `arcane lock status --output json`.
    pub fn to_json(&self) -> Value {
        match self {
            LockStatus::Free => json!({"state": "free", "holder": null}),
            LockStatus::Held { holder, reason } => json!({
                "state": "held",
                "holder": holder.as_ref().map(Holder::to_json),
                "reason": reason.name(),
            }),
            LockStatus::Stale { holder } => json!({"state": "stale", "holder": holder.to_json()}),
        }
    }
}

/// Reports whether the workspace's lock is free, held or stale. Creates nothing: a
/// workspace without `.arcane` is free. It takes the advisory lock for an instant to
/// ask the kernel whether an Arcane holder exists (an acquirer failing fast in that
/// instant sees busy; one with a wait does not notice).
pub fn status(workspace: &Path) -> Result<LockStatus, Error> {
    let ws = Workspace::open(workspace)?;
    let Some(arcane) = ws.open_arcane(false)? else {
        return Ok(LockStatus::Free);
    };
    let locked = lock_sentinel(&ws, &arcane, false)?;
    if let Locked::No = locked {
        let mut holder = read_holder(&arcane);
        if let Some(holder) = holder.as_mut() {
            holder.alive = Some(true);
        }
        return Ok(LockStatus::Held {
            holder,
            reason: BusyReason::Locked,
        });
    }
    let status = match read_record(&ws, &arcane)? {
        None => LockStatus::Free,
        Some((found, stamp)) => match judge(&ws, &arcane, &found, &stamp) {
            Verdict::Stale { previous, .. } => LockStatus::Stale { holder: previous },
            Verdict::Busy { reason, holder } => LockStatus::Held { holder, reason },
        },
    };
    if let Locked::Yes(fd) = locked {
        let _ = sys::unlock(fd.as_fd());
    }
    Ok(status)
}

/// The recovery rule's verdict on a record, with the facts its holder left in the
/// sentinel.
fn judge(
    ws: &Workspace,
    arcane: &std::os::fd::OwnedFd,
    found: &RecordBytes,
    stamp: &Stamp,
) -> Verdict {
    found::judge(ws, found, stamp, found::read_facts(arcane).as_deref())
}

/// What [`recover`] may do beyond removing a provably stale record.
#[derive(Debug, Clone, Default)]
pub struct RecoverOptions {
    quarantine_unreadable: bool,
    break_foreign_host: Option<String>,
}

impl RecoverOptions {
    /// Also move an unreadable or other-scope record aside (its bytes are kept under a
    /// `workspace-operation.lock.json.quarantined-*` name) when no Arcane process holds
    /// the lock.
    pub fn quarantine_unreadable(mut self, yes: bool) -> Self {
        self.quarantine_unreadable = yes;
        self
    }

    /// Also break a record written on the host named `hostname` (an explicit decision
    /// by a person who knows that host no longer uses the workspace).
    pub fn break_foreign_host(mut self, hostname: impl Into<String>) -> Self {
        self.break_foreign_host = Some(hostname.into());
        self
    }
}

/// What [`recover`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Recovered {
    /// There was no record (the lock is free).
    Nothing,
    /// A stale record was removed.
    Removed {
        /// Who held it.
        previous: Holder,
    },
    /// An unreadable or foreign-scope record was moved aside, bytes intact.
    Quarantined {
        /// Where it now is.
        path: PathBuf,
        /// What was wrong with it.
        problem: String,
    },
}

/// Removes the lock record only when its owner is provably gone (the same rule as
/// acquisition, see the `recovery` module); otherwise fails with
/// `ARCANE_WORKSPACE_BUSY` saying why not. Also clears debris left by a crashed holder.
pub fn recover(
    workspace: &Path,
    options: &RecoverOptions,
    events: &dyn EventSink,
) -> Result<Recovered, Error> {
    let ws = Workspace::open(workspace)?;
    let Some(arcane) = ws.open_arcane(false)? else {
        return Ok(Recovered::Nothing);
    };
    let sentinel = match lock_sentinel(&ws, &arcane, true)? {
        Locked::Yes(fd) => fd,
        Locked::No | Locked::Missing => {
            let mut holder = read_holder(&arcane);
            if let Some(holder) = holder.as_mut() {
                holder.alive = Some(true);
            }
            return Err(Error::busy(&ws.canonical, BusyReason::Locked, holder));
        }
    };
    // Debris of a crashed holder: only a lock holder writes the aside name; and what
    // killed writers left.
    if let Ok(stamp) = sys::stat_at(arcane.as_fd(), STALE) {
        if stamp.kind == sys::Kind::Regular {
            let _ = sys::unlink_at(arcane.as_fd(), STALE);
        }
    }
    crate::debris::sweep(&ws, &arcane);
    let result = recover_locked(&ws, &arcane, options, events);
    let _ = sys::unlock(sentinel.as_fd());
    result
}

fn recover_locked(
    ws: &Workspace,
    arcane: &std::os::fd::OwnedFd,
    options: &RecoverOptions,
    events: &dyn EventSink,
) -> Result<Recovered, Error> {
    let Some((found, stamp)) = read_record(ws, arcane)? else {
        return Ok(Recovered::Nothing);
    };
    let busy = |reason, holder| Error::busy(&ws.canonical, reason, holder);
    let (previous, why) = match judge(ws, arcane, &found, &stamp) {
        Verdict::Stale { previous, why } => (previous, why),
        Verdict::Busy {
            reason: BusyReason::ForeignHost { hostname },
            holder: Some(holder),
        } if options.break_foreign_host.as_deref() == Some(hostname.as_str()) => {
            (holder, "foreign-host-broken")
        }
        Verdict::Busy {
            reason: reason @ (BusyReason::UnreadableRecord { .. } | BusyReason::OtherScope { .. }),
            holder,
        } => {
            if !options.quarantine_unreadable {
                return Err(busy(reason, holder));
            }
            return quarantine(ws, arcane, &reason, events);
        }
        Verdict::Busy { reason, holder } => return Err(busy(reason, holder)),
    };
    match remove_stale(ws, arcane, stamp, &previous, why, events)? {
        Ok(()) => Ok(Recovered::Removed { previous }),
        Err(holder) => Err(busy(BusyReason::RecordAppeared, holder)),
    }
}

fn quarantine(
    ws: &Workspace,
    arcane: &std::os::fd::OwnedFd,
    reason: &BusyReason,
    events: &dyn EventSink,
) -> Result<Recovered, Error> {
    let problem = match reason {
        BusyReason::UnreadableRecord { problem } => problem.clone(),
        BusyReason::OtherScope { scope } => format!("for another workspace (`{scope}`)"),
        _ => String::new(),
    };
    let stamp = arcane_report::time::now_rfc3339().replace([':', '.'], "");
    let name = format!(
        "workspace-operation.lock.json.quarantined-{stamp}-{}",
        &crate::record::new_nonce()[..8]
    );
    let cname = std::ffi::CString::new(name.clone()).map_err(|_| {
        Error::io(
            "quarantine the lock record",
            ws.arcane_path(RECORD),
            std::io::Error::from_raw_os_error(libc::EINVAL),
        )
    })?;
    sys::rename_noreplace_at(arcane.as_fd(), RECORD, &cname)
        .map_err(|e| Error::io("quarantine the lock record", ws.arcane_path(RECORD), e))?;
    let path = arcane_workspace::layout::state_dir(&ws.canonical).join(&name);
    events.emit(Event::new(
        arcane_report::event_types::WORKSPACE_OPERATION_STALE_QUARANTINED,
        json!({"workspaceRoot": ws.canonical, "quarantinePath": path, "problem": problem}),
    ));
    Ok(Recovered::Quarantined { path, problem })
}
