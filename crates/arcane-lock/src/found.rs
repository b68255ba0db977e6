//! What an acquirer finds in `.arcane`: an existing record, the facts its holder
//! wrote into the sentinel, the verdict on them, and how a stale record is replaced.

use std::ffi::CStr;
use std::os::fd::{AsFd, OwnedFd};

use arcane_report::{Event, EventSink};
use serde_json::json;

use crate::error::{Error, PolicyReason};
use crate::holder::Holder;
use crate::lease::{RECORD, SENTINEL, STALE};
use crate::record;
use crate::recovery::{self, Found, Scope, Verdict};
use crate::sys::{self, Kind, Stamp};
use crate::workspace::{classify, regular_file, Workspace};

/// The bytes of an existing record.
pub(crate) enum RecordBytes {
    /// The whole file (at most 64 KiB), as written.
    Bytes(Vec<u8>),
    /// Larger than 64 KiB.
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
    let stamp = regular_file(fd.as_fd(), &path, "inspect the lock record")?;
    let (bytes, oversized) = sys::read_limited(fd.as_fd(), record::MAX_RECORD_BYTES)
        .map_err(|e| Error::io("read the lock record", &path, e))?;
    let found = if oversized {
        RecordBytes::Oversized
    } else {
        RecordBytes::Bytes(bytes)
    };
    Ok(Some((found, stamp)))
}

/// The nonce a readable record names (an inherited lease's claim is checked against it).
pub(crate) fn nonce_of(found: &RecordBytes) -> Option<String> {
    match found {
        RecordBytes::Bytes(bytes) => record::parse(bytes).ok().and_then(|p| p.holder.nonce),
        RecordBytes::Oversized => None,
    }
}

/// Applies the recovery rule to a record found with `stamp`, merging the holder's
/// `facts` (from the sentinel) when they are its own.
pub(crate) fn judge(
    ws: &Workspace,
    found: &RecordBytes,
    stamp: &Stamp,
    facts: Option<&[u8]>,
) -> Verdict {
    let scope = Scope {
        canonical: &ws.canonical,
        identity: ws.identity,
    };
    let written = sys::time_of(stamp.mtime);
    match found {
        RecordBytes::Bytes(bytes) => {
            let merged = record::with_facts(bytes.clone(), facts);
            recovery::judge(Found::Bytes(&merged), &scope, written)
        }
        RecordBytes::Oversized => recovery::judge(Found::Oversized, &scope, written),
    }
}

/// The facts in the sentinel, read through a descriptor of it (best effort).
pub(crate) fn read_facts_from(sentinel: &OwnedFd) -> Option<Vec<u8>> {
    let (bytes, oversized) =
        sys::read_limited_at(sentinel.as_fd(), record::MAX_RECORD_BYTES).ok()?;
    (!oversized && !bytes.is_empty()).then_some(bytes)
}

/// The facts in the sentinel, opened by name (best effort: `None` when there are none
/// or it is not a small regular file).
pub(crate) fn read_facts(arcane: &OwnedFd) -> Option<Vec<u8>> {
    let fd = sys::open_read_at(arcane.as_fd(), SENTINEL).ok()?;
    if sys::stat_fd(fd.as_fd()).ok()?.kind != Kind::Regular {
        return None;
    }
    read_facts_from(&fd)
}

/// Writes this holder's facts into the sentinel it has locked, in place (they are
/// padded, so they cover whatever an earlier holder wrote).
pub(crate) fn write_facts(sentinel: &OwnedFd, bytes: &[u8]) -> std::io::Result<()> {
    sys::write_all_at(sentinel.as_fd(), bytes, 0)
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
