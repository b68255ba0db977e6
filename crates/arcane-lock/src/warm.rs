//! Warm handles: the workspace, `.arcane` and sentinel descriptors an acquisition
//! opened, kept for the next acquisition of the same workspace in this process.
//!
//! Opening a workspace safely costs more than the rest of an acquisition: opening the
//! path without following a final link, asking the kernel for its canonical path,
//! opening `.arcane` relative to it, checking its owner, mode and filesystem, and
//! opening the sentinel. A process that locks the same workspace again (a host, a
//! library, a benchmark) reuses those descriptors after proving, with three `stat`
//! calls, that the names still lead to them:
//!
//! * the path as given (and the canonical path, when they differ) still names the same
//!   directory, not a link;
//! * `.arcane` in it is still the same directory, owned and writable as the rule for
//!   trusting it demands (`arcane_files::trust`);
//! * after locking, the sentinel's name still names the locked inode (checked on every
//!   acquisition, warm or not).
//!
//! Anything else opens afresh, as the first acquisition did. Handles are only used by
//! the process that opened them (a child forked without `exec` shares their open file
//! descriptions, and with them the lock), never while a lease holds them, never after
//! their sentinel was handed to a child process, at most [`CAPACITY`] workspaces, and
//! for at most [`IDLE`] after their last use: the background thread of the `renew`
//! module closes them, so a filesystem is not kept busy (unmountable) for long.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arcane_workspace::layout;

use crate::error::{Error, PolicyReason};
use crate::lease::SENTINEL;
use crate::published::Spare;
use crate::sys::{self, Identity, Kind};
use crate::workspace::{classify, normalise, regular_file, Workspace, ARCANE_DIR};

/// How many workspaces' handles are kept.
const CAPACITY: usize = 8;
/// How long unused handles are kept.
const IDLE: Duration = Duration::from_secs(30);

/// The open descriptors of one workspace's lock.
#[derive(Debug)]
pub(crate) struct Handles {
    /// The workspace (canonical path, identity, directory).
    pub(crate) ws: Workspace,
    /// The path as the caller gave it (normalised): the cache key.
    requested: PathBuf,
    /// The canonical path as the record's `scope` carries it.
    pub(crate) scope_json: String,
    /// `.arcane`.
    pub(crate) arcane: Arc<OwnedFd>,
    arcane_identity: Identity,
    /// The sentinel, unlocked while the handles are cached.
    pub(crate) sentinel: OwnedFd,
    sentinel_identity: Identity,
    /// This process (the one that opened them: checked before every reuse).
    pub(crate) pid: i32,
    last_used: Instant,
    /// Opened by this acquisition rather than reused.
    pub(crate) fresh: bool,
    /// This process's spare record file (the `published` module).
    pub(crate) spare: Option<Spare>,
}

fn cache() -> MutexGuard<'static, Vec<Handles>> {
    static CACHE: Mutex<Vec<Handles>> = Mutex::new(Vec::new());
    // Pushes, removals and truncation only: a poisoned cache is still a list.
    CACHE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The handles of the workspace at `path`: cached ones that are still valid, or fresh
/// ones (creating `.arcane` and the sentinel when missing).
pub(crate) fn open(path: &Path) -> Result<Handles, Error> {
    let requested = normalise(path);
    let cached = {
        let mut cache = cache();
        cache
            .iter()
            .position(|h| h.requested == requested)
            .map(|i| cache.remove(i))
    };
    if let Some(mut handles) = cached.filter(Handles::still_valid) {
        handles.fresh = false;
        return Ok(handles);
    }
    Handles::open(path, requested)
}

/// Keeps `handles` for the next acquisition of the same path (their sentinel unlocked).
pub(crate) fn keep(mut handles: Handles) {
    let now = Instant::now();
    handles.last_used = now;
    {
        let mut cache = cache();
        cache.retain(|h| h.requested != handles.requested);
        cache.insert(0, handles);
        cache.truncate(CAPACITY);
    }
    crate::renew::look_by(now + IDLE);
}

/// Closes the handles unused for [`IDLE`]; when the next ones will be due.
pub(crate) fn expire_idle(now: Instant) -> Option<Instant> {
    let mut cache = cache();
    cache.retain(|h| now.saturating_duration_since(h.last_used) < IDLE);
    cache.iter().map(|h| h.last_used + IDLE).min()
}

impl Handles {
    fn open(path: &Path, requested: PathBuf) -> Result<Handles, Error> {
        let ws = Workspace::open(path)?;
        let state = layout::state_dir(&ws.canonical);
        let Some(arcane) = ws.open_arcane(true)? else {
            return Err(Error::io(
                "open",
                state,
                std::io::Error::from_raw_os_error(sys::ENOENT),
            ));
        };
        let fs = sys::unsupported_filesystem(arcane.as_fd())
            .map_err(|e| Error::io("inspect the filesystem of", &state, e))?;
        if let Some(filesystem) = fs {
            return Err(Error::policy(
                state,
                PolicyReason::UnsupportedFilesystem {
                    filesystem: filesystem.to_string(),
                },
                None,
            ));
        }
        let sentinel = open_sentinel(&ws, &arcane)?;
        Handles::assemble(ws, requested, arcane, sentinel, true)
    }

    /// The handles of an inherited lease: the workspace as opened, its `.arcane`, and a
    /// duplicate of the descriptor the ancestor passed down (never cached: its open
    /// file description is the ancestor's).
    pub(crate) fn inherited(
        ws: Workspace,
        arcane: OwnedFd,
        sentinel: OwnedFd,
    ) -> Result<Handles, Error> {
        let identity = sys::stat_fd(sentinel.as_fd())
            .map_err(|e| Error::io("inspect the lock sentinel", ws.arcane_path(SENTINEL), e))?
            .identity;
        let requested = ws.canonical.clone();
        Handles::assemble(ws, requested, arcane, (sentinel, identity), false)
    }

    fn assemble(
        ws: Workspace,
        requested: PathBuf,
        arcane: OwnedFd,
        (sentinel, sentinel_identity): (OwnedFd, Identity),
        fresh: bool,
    ) -> Result<Handles, Error> {
        let arcane_identity = sys::stat_fd(arcane.as_fd())
            .map_err(|e| Error::io("inspect", layout::state_dir(&ws.canonical), e))?
            .identity;
        Ok(Handles {
            scope_json: crate::record::scope_json(&ws.canonical),
            ws,
            requested,
            arcane: Arc::new(arcane),
            arcane_identity,
            sentinel,
            sentinel_identity,
            pid: sys::own_pid(),
            last_used: Instant::now(),
            fresh,
            spare: None,
        })
    }

    /// Whether the names still lead to these descriptors (see the module rule).
    fn still_valid(&self) -> bool {
        let names_it = |path: &Path| {
            sys::stat_path_nofollow(path)
                .is_ok_and(|s| s.kind == Kind::Directory && s.identity == self.ws.identity)
        };
        self.pid == sys::own_pid()
            && names_it(&self.requested)
            && (self.requested == self.ws.canonical || names_it(&self.ws.canonical))
            && sys::stat_at(self.ws.dir.as_fd(), ARCANE_DIR).is_ok_and(|s| {
                s.kind == Kind::Directory
                    && s.identity == self.arcane_identity
                    && arcane_files::trust::owner_and_mode_trusted(s.uid, s.mode)
            })
    }

    /// How the sentinel's name differs from the inode these handles lock (`None`: it
    /// names it). Checked after every lock, since a third party may replace the file,
    /// and by a holder's self-check.
    pub(crate) fn sentinel_drift(&self) -> Result<Option<&'static str>, Error> {
        match sys::stat_at(self.arcane.as_fd(), SENTINEL) {
            Ok(at) if at.identity == self.sentinel_identity => Ok(None),
            Ok(_) => Ok(Some("left without its sentinel (replaced)")),
            Err(e) if sys::errno(&e) == sys::ENOENT => {
                Ok(Some("left without its sentinel (deleted)"))
            }
            Err(e) => Err(Error::io(
                "inspect the lock sentinel",
                self.ws.arcane_path(SENTINEL),
                e,
            )),
        }
    }

    /// Opens the sentinel again (after it was replaced), creating it when missing.
    pub(crate) fn reopen_sentinel(&mut self) -> Result<(), Error> {
        let (sentinel, identity) = open_sentinel(&self.ws, &self.arcane)?;
        self.sentinel = sentinel;
        self.sentinel_identity = identity;
        Ok(())
    }

    /// Uses `fd`, a descriptor of the sentinel locked elsewhere (a waiter's), instead
    /// of the current one, if it is the sentinel's inode (else drops it, unlocking it).
    pub(crate) fn adopt_sentinel(&mut self, fd: OwnedFd) {
        if sys::stat_fd(fd.as_fd()).is_ok_and(|s| s.identity == self.sentinel_identity) {
            self.sentinel = fd;
        }
    }
}

/// Opens (creating when missing, mode 0600) the sentinel for locking and writing the
/// holder's facts; anything but a regular file there is refused.
fn open_sentinel(ws: &Workspace, arcane: &OwnedFd) -> Result<(OwnedFd, Identity), Error> {
    let path = ws.arcane_path(SENTINEL);
    let fd = sys::open_sentinel(arcane.as_fd(), SENTINEL, true).map_err(|e| {
        let kind = sys::stat_at(arcane.as_fd(), SENTINEL).map(|s| s.kind).ok();
        classify(&path, e, kind, "open the lock sentinel")
    })?;
    let stamp = regular_file(fd.as_fd(), &path, "inspect the lock sentinel")?;
    Ok((fd, stamp.identity))
}
