//! The lease's own record file: prepared before the lock is taken, published under it,
//! renewed while it is held, checked, and removed on release.
//!
//! # Why the record is written before the lock is taken
//!
//! The record must be durable before its name appears (lock-spec.md W4: a name over an
//! empty or partial file would block the workspace forever), so it is fsynced before it
//! is published. An fsync takes hundreds of microseconds on a disk; done under the
//! lock, it would be paid once per holder *in turn* by everyone waiting. So each
//! acquirer writes and fsyncs its record as an **unnamed file** (`O_TMPFILE`) in
//! `.arcane` first, in parallel with the others, and under the lock only gives it its
//! name with one exclusive `linkat` (failing when a record exists, exactly like the
//! SDK's `O_EXCL` create). A writer killed before that leaves nothing: an unnamed file
//! vanishes with its last descriptor. On a filesystem without unnamed files the record
//! is written to an unpredictable temporary name (`.workspace-operation.lock.json.<16
//! hex>.tmp`, debris the sweep removes if its writer dies) and published with
//! `RENAME_NOREPLACE`.
//!
//! # A spare instead of a new file per lease
//!
//! Creating and deleting a file costs more than the rest of an acquisition. A process
//! that takes the lock again and again (a host, a library) keeps its last record as a
//! **spare** under a name of its own, `.workspace-operation.lock.json.spare-<pid>-<start
//! time>`, and the next lease rewrites it in place, fsyncs it, and publishes it as a
//! second (hard) link; release removes only the record's link. The spare lives with
//! the process's cached handles (the `warm` module): it is removed when they are closed
//! (unused for a while), and a spare whose process is gone is debris the sweep removes
//! at once (the `debris` module). A process's first lease never makes one, so a
//! command that locks once leaves nothing.
//!
//! # What "still ours" means
//!
//! A holder knows its record by identity (device and inode), size and modification
//! time. Any change the holder did not make itself is a compromise, except a renewal: a
//! rewrite of the two times alone ([`Rendered::renewed_as`]), which an inherited lease
//! sees its ancestor make. Renewals rewrite the times in place, same length, without
//! an fsync: after a power cut every holder is gone, and the record is complete in
//! either version.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use crate::error::Error;
use crate::lease::RECORD;
use crate::record::{self, Fields, Rendered};
use crate::sys::{self, Stamp};
use crate::workspace::{classify, Workspace};

/// A prepared record older than this is given fresh times when it is published (its
/// holder waited for the lock).
const REFRESH_AFTER: Duration = Duration::from_secs(1);

/// A record written and fsynced, not yet published.
#[derive(Debug)]
pub(crate) struct Prepared {
    arcane: Arc<OwnedFd>,
    file: OwnedFd,
    temporary: Temporary,
    /// The spare name the file also has, when it was a spare.
    spare: Option<SpareName>,
    rendered: Rendered,
    stamp: Stamp,
    written: Instant,
}

/// The record's name while unpublished, on a filesystem without unnamed files: removed
/// when dropped unless publication took it.
#[derive(Debug)]
struct Temporary {
    arcane: Arc<OwnedFd>,
    name: Option<CString>,
}

impl Drop for Temporary {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            let _ = sys::unlink_at(self.arcane.as_fd(), &name);
        }
    }
}

/// A spare record file (see the module documentation) and its descriptor.
#[derive(Debug)]
pub(crate) struct Spare {
    file: OwnedFd,
    /// Its size (the last record's length).
    len: usize,
    name: SpareName,
}

/// A spare's name: removed when dropped by the process that made it, if it still
/// names the spare's inode.
#[derive(Debug)]
struct SpareName {
    arcane: Arc<OwnedFd>,
    name: CString,
    identity: sys::Identity,
    pid: i32,
}

impl Drop for SpareName {
    fn drop(&mut self) {
        // A child forked without `exec` drops its copy of the parent's handles: the
        // parent's spare is not its to remove.
        if sys::own_pid() == self.pid
            && sys::stat_at(self.arcane.as_fd(), &self.name)
                .is_ok_and(|at| at.identity == self.identity)
        {
            let _ = sys::unlink_at(self.arcane.as_fd(), &self.name);
        }
    }
}

/// The spare name of the process `pid` started at `start_time` (clock ticks since boot).
pub(crate) fn spare_name(pid: i32, start_time: u64) -> Option<CString> {
    CString::new(format!("{SPARE_PREFIX}{pid}-{start_time}")).ok()
}

/// The process a spare name names, `(pid, start time)`.
pub(crate) fn spare_owner(name: &str) -> Option<(u32, u64)> {
    let (pid, start) = name.strip_prefix(SPARE_PREFIX)?.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(pid) && digits(start)).then(|| Some((pid.parse().ok()?, start.parse().ok()?)))?
}

const SPARE_PREFIX: &str = ".workspace-operation.lock.json.spare-";

impl Prepared {
    /// Writes and fsyncs the record of `fields` in `.arcane` (`arcane`): into `spare`
    /// when there is one, else into a new unnamed file.
    pub(crate) fn new(
        ws: &Workspace,
        arcane: &Arc<OwnedFd>,
        spare: Option<Spare>,
        fields: &Fields<'_>,
    ) -> Result<Prepared, Error> {
        let path = || ws.arcane_path(RECORD);
        let rendered = record::render(fields, SystemTime::now());
        let (file, temporary, spare) = match spare {
            Some(Spare { file, len, name }) => {
                // Rewritten in place; a longer earlier record is cut to this one.
                sys::write_all_at(file.as_fd(), &rendered.bytes, 0)
                    .and_then(|()| {
                        if len > rendered.bytes.len() {
                            sys::truncate(file.as_fd(), rendered.bytes.len() as u64)
                        } else {
                            Ok(())
                        }
                    })
                    .map_err(|e| Error::io("write the lock record", path(), e))?;
                let temporary = Temporary {
                    arcane: Arc::clone(arcane),
                    name: None,
                };
                (file, temporary, Some(name))
            }
            None => {
                let (file, name) = match sys::create_unnamed_at(arcane.as_fd())
                    .map_err(|e| classify(&path(), e, None, "write the lock record"))?
                {
                    Some(file) => (file, None),
                    None => named(ws, arcane)?,
                };
                // From here on a failure removes the temporary name (if any).
                let temporary = Temporary {
                    arcane: Arc::clone(arcane),
                    name,
                };
                sys::write_all(file.as_fd(), &rendered.bytes)
                    .map_err(|e| Error::io("write the lock record", path(), e))?;
                (file, temporary, None)
            }
        };
        let stamp = sys::sync(file.as_fd())
            .and_then(|()| sys::stat_fd(file.as_fd()))
            .map_err(|e| Error::io("write the lock record", path(), e))?;
        Ok(Prepared {
            arcane: Arc::clone(arcane),
            file,
            temporary,
            spare,
            rendered,
            stamp,
            written: Instant::now(),
        })
    }

    /// Gives the record its name, exclusively: `Ok(false)` when a record is already
    /// there. A record that waited for the lock gets fresh times first.
    pub(crate) fn publish(&mut self, ws: &Workspace) -> Result<bool, Error> {
        let path = || ws.arcane_path(RECORD);
        if self.written.elapsed() > REFRESH_AFTER {
            self.refresh()
                .map_err(|e| Error::io("write the lock record", path(), e))?;
        }
        let arcane = self.arcane.as_fd();
        let result = match &self.temporary.name {
            // An unnamed file, or a spare: one more (exclusive) link.
            None => sys::link_at(self.file.as_fd(), arcane, RECORD),
            Some(name) => sys::rename_noreplace_at(arcane, name, RECORD),
        };
        match result {
            Ok(()) => {
                self.temporary.name = None;
                Ok(true)
            }
            Err(e) if sys::errno(&e) == sys::EEXIST => Ok(false),
            Err(e) => Err(Error::io("publish the lock record", path(), e)),
        }
    }

    /// The published record, to hold (call only after [`publish`](Self::publish)
    /// answered `true`).
    pub(crate) fn into_published(self) -> Published {
        let published = Published::new(
            Arc::clone(&self.arcane),
            Some(self.file),
            self.rendered,
            self.stamp,
        );
        published.known().spare = self.spare;
        published
    }

    /// The spare this record was written into, to keep for the next attempt (the
    /// acquisition gave up); `None` for a new file (which goes with this value).
    pub(crate) fn into_spare(self) -> Option<Spare> {
        let name = self.spare?;
        Some(Spare {
            file: self.file,
            len: self.rendered.bytes.len(),
            name,
        })
    }

    fn refresh(&mut self) -> std::io::Result<()> {
        let times = Rendered::times_at(SystemTime::now());
        sys::write_all_at(self.file.as_fd(), &times, self.rendered.times.start as u64)?;
        self.rendered.bytes[self.rendered.times.clone()].copy_from_slice(&times);
        self.stamp = sys::stat_fd(self.file.as_fd())?;
        self.written = Instant::now();
        Ok(())
    }
}

/// Removes the record's name (gone already is fine).
fn unlink_record(arcane: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    match sys::unlink_at(arcane, RECORD) {
        Err(e) if sys::errno(&e) != sys::ENOENT => Err(e),
        _ => Ok(()),
    }
}

/// Creates the record under an unpredictable temporary name (no unnamed files here).
fn named(ws: &Workspace, arcane: &Arc<OwnedFd>) -> Result<(OwnedFd, Option<CString>), Error> {
    let path = ws.arcane_path(RECORD);
    let mut last = None;
    for _ in 0..8 {
        let random = arcane_files::secret_hex(8).map_err(|e| Error::io("name", &path, e))?;
        let name = CString::new(format!(".workspace-operation.lock.json.{random}.tmp"))
            .map_err(|e| Error::io("name", &path, std::io::Error::other(e)))?;
        match sys::create_exclusive_at(arcane.as_fd(), &name) {
            Ok(fd) => return Ok((fd, Some(name))),
            Err(e) if sys::errno(&e) == sys::EEXIST => last = Some(e),
            Err(e) => return Err(classify(&path, e, None, "write the lock record")),
        }
    }
    Err(Error::io(
        "write the lock record",
        path,
        last.unwrap_or_else(|| std::io::Error::other("no free temporary name")),
    ))
}

/// A published record as its holder knows it, shared with the renewer.
#[derive(Debug)]
pub(crate) struct Published {
    arcane: Arc<OwnedFd>,
    known: Mutex<Known>,
}

/// What the holder last wrote or saw.
#[derive(Debug)]
struct Known {
    /// The record's own descriptor (a root lease's), for renewing and reading it.
    file: Option<OwnedFd>,
    rendered: Rendered,
    stamp: Stamp,
    renewed: Instant,
    /// Released (or given up): never written again.
    done: bool,
    /// The spare name the record's inode also has (a root lease that reused its spare).
    spare: Option<SpareName>,
}

/// How a record differs from what its holder knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Drift {
    /// As the holder left it (or only renewed).
    None,
    /// Removed.
    Deleted,
    /// Another file has its name.
    Replaced,
    /// Its contents were changed.
    Modified,
}

impl Drift {
    /// The words of `ARCANE_LOCK_COMPROMISED`.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Drift::None => "unchanged",
            Drift::Deleted => "deleted",
            Drift::Replaced => "replaced by another file",
            Drift::Modified => "modified",
        }
    }
}

impl Published {
    /// A record known by `stamp` with contents `rendered`; `file` is its descriptor when
    /// this process wrote it (and renews it).
    pub(crate) fn new(
        arcane: Arc<OwnedFd>,
        file: Option<OwnedFd>,
        rendered: Rendered,
        stamp: Stamp,
    ) -> Published {
        Published {
            arcane,
            known: Mutex::new(Known {
                file,
                rendered,
                stamp,
                renewed: Instant::now(),
                done: false,
                spare: None,
            }),
        }
    }

    fn known(&self) -> MutexGuard<'_, Known> {
        // Every update of `Known` is a plain assignment; a panic cannot leave it half
        // written, so a poisoned mutex is still usable.
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How the record at the path differs from what the holder knows; a renewal made
    /// by another process (the ancestor of an inherited lease) is learnt, not reported.
    pub(crate) fn drift(&self) -> std::io::Result<Drift> {
        let mut known = self.known();
        self.drift_locked(&mut known)
    }

    fn drift_locked(&self, known: &mut Known) -> std::io::Result<Drift> {
        // A renewal by another process can be read half written: look again.
        for _ in 0..3 {
            let at = match sys::stat_at(self.arcane.as_fd(), RECORD) {
                Ok(at) => at,
                Err(e) if sys::errno(&e) == sys::ENOENT => return Ok(Drift::Deleted),
                Err(e) => return Err(e),
            };
            if at.identity != known.stamp.identity {
                return Ok(Drift::Replaced);
            }
            if at.size == known.stamp.size && at.mtime == known.stamp.mtime {
                return Ok(Drift::None);
            }
            let Some(current) = self.read(known)? else {
                return Ok(Drift::Replaced);
            };
            if known.rendered.renewed_as(&current) {
                known.rendered.bytes = current;
                known.stamp = at;
                return Ok(Drift::None);
            }
            std::thread::yield_now();
        }
        Ok(Drift::Modified)
    }

    /// The record's bytes: through its own descriptor, or by name (checking that the
    /// name still is its inode; `None` otherwise).
    fn read(&self, known: &Known) -> std::io::Result<Option<Vec<u8>>> {
        let limit = record::MAX_RECORD_BYTES;
        if let Some(file) = &known.file {
            return sys::read_limited_at(file.as_fd(), limit).map(|(bytes, _)| Some(bytes));
        }
        let fd = sys::open_read_at(self.arcane.as_fd(), RECORD)?;
        if sys::stat_fd(fd.as_fd())?.identity != known.stamp.identity {
            return Ok(None);
        }
        sys::read_limited(fd.as_fd(), limit).map(|(bytes, _)| Some(bytes))
    }

    /// Stops renewals and removes the record if it is still this inode (even when it
    /// was modified, which the answer says). Idempotent. The inode is kept as a spare
    /// when `keep` names one (or it already is one) and it was left as written; the
    /// spare comes back with the answer.
    pub(crate) fn remove(&self, keep: Option<CString>) -> std::io::Result<(Drift, Option<Spare>)> {
        let mut known = self.known();
        known.done = true;
        let drift = self.drift_locked(&mut known)?;
        let arcane = self.arcane.as_fd();
        let spare = match (drift, known.spare.take(), keep, known.file.take()) {
            (Drift::None, Some(name), _, Some(file)) => {
                // Already a spare under its own name: drop the record's link only.
                unlink_record(arcane)?;
                Some(Spare {
                    file,
                    len: known.rendered.bytes.len(),
                    name,
                })
            }
            (Drift::None, None, Some(name), Some(file)) => {
                // Becomes a spare: the record's name moves to the spare's.
                match sys::rename_noreplace_at(arcane, RECORD, &name) {
                    Ok(()) => Some(Spare {
                        file,
                        len: known.rendered.bytes.len(),
                        name: SpareName {
                            arcane: Arc::clone(&self.arcane),
                            name,
                            identity: known.stamp.identity,
                            pid: sys::own_pid(),
                        },
                    }),
                    Err(_) => {
                        unlink_record(arcane)?;
                        None
                    }
                }
            }
            (Drift::None | Drift::Modified, _, _, _) => {
                unlink_record(arcane)?;
                None
            }
            (Drift::Deleted | Drift::Replaced, _, _, _) => None,
        };
        Ok((drift, spare))
    }

    /// When the record is next due for renewal (`None`: never again).
    pub(crate) fn due(&self, every: Duration) -> Option<Instant> {
        let known = self.known();
        (!known.done && known.file.is_some()).then(|| known.renewed + every)
    }

    /// Rewrites the record's times if it is still exactly as this holder left it; gives
    /// up renewing (for good) when it is not, leaving the change for
    /// [`drift`](Self::drift) to report.
    pub(crate) fn renew(&self) {
        let mut known = self.known();
        if known.done {
            return;
        }
        let unchanged = sys::stat_at(self.arcane.as_fd(), RECORD).is_ok_and(|at| {
            at.identity == known.stamp.identity
                && at.size == known.stamp.size
                && at.mtime == known.stamp.mtime
        });
        let Some(file) = known.file.as_ref().filter(|_| unchanged) else {
            known.done = true;
            return;
        };
        let times = Rendered::times_at(SystemTime::now());
        let start = known.rendered.times.start;
        let written = sys::write_all_at(file.as_fd(), &times, start as u64)
            .and_then(|()| sys::stat_fd(file.as_fd()));
        match written {
            Ok(stamp) => {
                let range = known.rendered.times.clone();
                known.rendered.bytes[range].copy_from_slice(&times);
                known.stamp = stamp;
                known.renewed = Instant::now();
            }
            // A full disk cannot fail an in-place rewrite of allocated bytes; anything
            // else stops renewals (the record then expires, and the SDK still sees a
            // live owner pid).
            Err(_) => known.done = true,
        }
    }
}
