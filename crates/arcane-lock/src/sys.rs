//! The only module that makes system calls: directory-relative opens, `flock`, stat,
//! exclusive publication, liveness probes and process identity.
//!
//! Everything above this module works with directory file descriptors and plain values,
//! so every path-safety rule is enforced by the kernel (`O_NOFOLLOW`, `O_DIRECTORY`,
//! `*at` calls relative to an already-verified directory) rather than by check-then-use
//! path sequences (lock-spec.md W9).
//!
//! Quirks handled here, with their sources:
//! * `flock(2)`: locks belong to the open file description, are released by the kernel
//!   when the last descriptor closes (so on `kill -9` too), and on Linux NFS ≥ 2.6.12 are
//!   emulated with byte-range locks or, under `nolock`/`local_lock=all`, are purely
//!   local (nfs(5), tox-dev/filelock#6). `ENOLCK`, `EOPNOTSUPP` and `ENOSYS` mean "this
//!   filesystem cannot lock", not a transient failure (cargo `src/cargo/util/flock.rs`).
//!   `EINTR` is retried.
//! * `open(2)` with `O_NOFOLLOW` fails with `ELOOP` when the last component is a symbolic
//!   link; a trailing `/` would force following, so callers pass normalised paths.
//! * Opening a FIFO read-only blocks until a writer appears, so reads use `O_NONBLOCK`
//!   and then insist on a regular file via `fstat` (fifo(7)).
//! * `renameat2(RENAME_NOREPLACE)` is not supported everywhere (`EINVAL` on some
//!   filesystems, `ENOSYS` on old kernels; rename(2)); the fallback is `link(2)` +
//!   `unlink(2)`, which is just as exclusive.

// The lock's own syscalls live here, its `kill(pid, 0)` liveness probe of a recorded
// holder among them (it must tell EPERM, alive, from ESRCH); clippy.toml fences it
// everywhere else. Its tests start throwaway processes.
#![allow(clippy::disallowed_methods)]

use std::ffi::CStr;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

/// The identity of a file: device and inode numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Identity {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
}

/// What kind of file a stat describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Regular,
    Directory,
    Symlink,
    Fifo,
    Other,
}

impl Kind {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Kind::Regular => "a regular file",
            Kind::Directory => "a directory",
            Kind::Symlink => "a symbolic link",
            Kind::Fifo => "a FIFO",
            Kind::Other => "a special file",
        }
    }
}

/// The parts of a `stat` the lock compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) identity: Identity,
    pub(crate) kind: Kind,
    pub(crate) size: u64,
    pub(crate) mtime: (i64, u64),
    pub(crate) nlink: u64,
    /// The owner's user id.
    pub(crate) uid: u32,
    /// The permission bits and file type (`st_mode`).
    pub(crate) mode: u32,
}

#[allow(clippy::unnecessary_cast)] // field widths differ between architectures
fn stamp(st: &rustix::fs::Stat) -> Stamp {
    let kind = match FileType::from_raw_mode(st.st_mode as _) {
        FileType::RegularFile => Kind::Regular,
        FileType::Directory => Kind::Directory,
        FileType::Symlink => Kind::Symlink,
        FileType::Fifo => Kind::Fifo,
        _ => Kind::Other,
    };
    Stamp {
        identity: Identity {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
        },
        kind,
        size: st.st_size.max(0) as u64,
        mtime: (st.st_mtime as i64, st.st_mtime_nsec as u64),
        nlink: st.st_nlink as u64,
        uid: st.st_uid as u32,
        mode: st.st_mode as u32,
    }
}

fn retry<T>(mut f: impl FnMut() -> rustix::io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(Errno::INTR) => continue,
            other => return other.map_err(io::Error::from),
        }
    }
}

/// The wall-clock time of a `stat` time stamp (`(seconds, nanoseconds)`).
pub(crate) fn time_of((seconds, nanos): (i64, u64)) -> SystemTime {
    let offset = Duration::new(seconds.unsigned_abs(), nanos.min(999_999_999) as u32);
    if seconds >= 0 {
        SystemTime::UNIX_EPOCH + offset
    } else {
        SystemTime::UNIX_EPOCH - offset
    }
}

/// How long ago a `stat` time stamp was (`None` when it lies in the future).
pub(crate) fn age_of(stamp: (i64, u64)) -> Option<Duration> {
    time_of(stamp).elapsed().ok()
}

/// The raw errno of an I/O error, or 0.
pub(crate) fn errno(error: &io::Error) -> i32 {
    error.raw_os_error().unwrap_or(0)
}

pub(crate) const ENOENT: i32 = libc::ENOENT;
pub(crate) const EEXIST: i32 = libc::EEXIST;
pub(crate) const ELOOP: i32 = libc::ELOOP;
pub(crate) const ENOTDIR: i32 = libc::ENOTDIR;
pub(crate) const EISDIR: i32 = libc::EISDIR;
pub(crate) const EACCES: i32 = libc::EACCES;
pub(crate) const EPERM: i32 = libc::EPERM;
pub(crate) const ENXIO: i32 = libc::ENXIO;

/// Opens `path` as a directory without following a symbolic link in its *last*
/// component (ancestors may be links; the caller binds to the canonical identity).
pub(crate) fn open_directory_nofollow(path: &Path) -> io::Result<OwnedFd> {
    retry(|| {
        rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
    })
}

/// Opens the directory `name` inside `dir`, never following a link.
pub(crate) fn open_directory_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    retry(|| {
        rustix::fs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
    })
}

/// Creates the directory `name` inside `dir` with `mode`.
pub(crate) fn make_directory_at(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    retry(|| rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(mode)))
}

/// The path the kernel associates with an open directory (its canonical path).
pub(crate) fn path_of(fd: BorrowedFd<'_>) -> io::Result<PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// `fstat`.
pub(crate) fn stat_fd(fd: BorrowedFd<'_>) -> io::Result<Stamp> {
    retry(|| rustix::fs::fstat(fd)).map(|st| stamp(&st))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub(crate) fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Stamp> {
    retry(|| rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)).map(|st| stamp(&st))
}

/// `lstat` of a path (used only to describe a refused path in an error message).
pub(crate) fn stat_path_nofollow(path: &Path) -> io::Result<Stamp> {
    retry(|| rustix::fs::lstat(path)).map(|st| stamp(&st))
}

/// Returns the name of the filesystem holding `fd` when it is one on which `flock`
/// is known not to exclude other hosts or not to work at all, else `None`.
///
/// Magic numbers from statfs(2) / `linux/magic.h`. NFS is refused outright because
/// `flock` there is either byte-range emulation that can hang (rust-lang/cargo#2615) or,
/// with `nolock`/`local_lock=all`, local only (tox-dev/filelock#6); SMB/CIFS, FUSE and
/// 9p give no dependable cross-client `flock`.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn unsupported_filesystem(fd: BorrowedFd<'_>) -> io::Result<Option<&'static str>> {
    let fs = retry(|| rustix::fs::fstatfs(fd))?;
    let magic = fs.f_type as i64 as u32;
    Ok(match magic {
        0x6969 => Some("nfs"),
        0x517B => Some("smb"),
        0xFE53_4D42 => Some("smb2"),
        0xFF53_4D42 => Some("cifs"),
        0x6573_5546 => Some("fuse"),
        0x0102_1997 => Some("9p"),
        0x5346_414F => Some("afs"),
        0x0BD0_0BD0 => Some("lustre"),
        _ => None,
    })
}

/// Opens (creating if needed, mode 0600) the sentinel `name` in `dir` for locking.
pub(crate) fn open_sentinel(dir: BorrowedFd<'_>, name: &CStr, create: bool) -> io::Result<OwnedFd> {
    // Only a sentinel that may be created is opened for writing: `flock` needs no write
    // access, so looking (`lock status`) works on a read-only workspace too.
    let mut flags = OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
    if create {
        flags |= OFlags::RDWR | OFlags::CREATE;
    } else {
        flags |= OFlags::RDONLY;
    }
    retry(|| rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600)))
}

/// The outcome of a non-blocking lock attempt.
#[derive(Debug)]
pub(crate) enum TryLock {
    /// We hold the lock now.
    Locked,
    /// Someone else holds it.
    WouldBlock,
    /// The filesystem cannot lock (`ENOLCK`, `EOPNOTSUPP`, `ENOSYS`).
    Unsupported(io::Error),
}

/// `flock(fd, LOCK_EX | LOCK_NB)`.
pub(crate) fn try_lock_exclusive(fd: BorrowedFd<'_>) -> io::Result<TryLock> {
    match retry(|| rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive)) {
        Ok(()) => Ok(TryLock::Locked),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(TryLock::WouldBlock),
        Err(e) if matches!(errno(&e), libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS) => {
            Ok(TryLock::Unsupported(e))
        }
        Err(e) => Err(e),
    }
}

/// A close-on-exec duplicate of `fd` (the same open file description).
pub(crate) fn duplicate(fd: std::os::fd::RawFd) -> io::Result<OwnedFd> {
    // SAFETY: the caller checked that `fd` is open; the borrow ends with this call.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    retry(|| rustix::io::fcntl_dupfd_cloexec(borrowed, 0))
}

/// `flock(fd, LOCK_EX)`, blocking until it is ours (`EINTR` retried).
pub(crate) fn lock_exclusive_blocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    retry(|| rustix::fs::flock(fd, FlockOperation::LockExclusive))
}

/// `flock(fd, LOCK_UN)`.
pub(crate) fn unlock(fd: BorrowedFd<'_>) -> io::Result<()> {
    retry(|| rustix::fs::flock(fd, FlockOperation::Unlock))
}

/// Opens `name` in `dir` read-only without following links or blocking on a FIFO.
pub(crate) fn open_read_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    retry(|| {
        rustix::fs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
        )
    })
}

/// Reads at most `limit` bytes; the flag says whether more were there.
pub(crate) fn read_limited(fd: BorrowedFd<'_>, limit: usize) -> io::Result<(Vec<u8>, bool)> {
    let mut bytes = Vec::with_capacity(1024);
    let mut chunk = [0u8; 8192];
    loop {
        let n = retry(|| rustix::io::read(fd, &mut chunk))?;
        if n == 0 {
            return Ok((bytes, false));
        }
        bytes.extend_from_slice(&chunk[..n]);
        if bytes.len() > limit {
            bytes.truncate(limit);
            return Ok((bytes, true));
        }
    }
}

/// Creates `name` in `dir` for reading and writing (mode 0600); `EEXIST` if anything is
/// there. Never truncates an existing file, which might be a hard link to a file
/// elsewhere.
pub(crate) fn create_exclusive_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    retry(|| {
        rustix::fs::openat(
            dir,
            name,
            OFlags::RDWR
                | OFlags::CREATE
                | OFlags::EXCL
                | OFlags::NOFOLLOW
                | OFlags::CLOEXEC
                | OFlags::NONBLOCK,
            Mode::from_raw_mode(0o600),
        )
    })
}

/// Creates an unnamed regular file in `dir` (`O_TMPFILE`, mode 0600) for reading and
/// writing: it has no name until [`link_at`] gives it one, so a writer killed before
/// then leaves nothing behind. `Ok(None)` when the filesystem cannot (`EOPNOTSUPP`, or
/// `EISDIR`/`EINVAL` from kernels and filesystems without it).
pub(crate) fn create_unnamed_at(dir: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    match retry(|| {
        rustix::fs::openat(
            dir,
            c".",
            OFlags::RDWR | OFlags::TMPFILE | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
    }) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if matches!(errno(&e), libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Gives the unnamed file `fd` (from [`create_unnamed_at`]) the name `name` in `dir`,
/// failing with `EEXIST` when anything has that name (the link is exclusive).
///
/// `linkat(fd, "", AT_EMPTY_PATH)` needs `CAP_DAC_READ_SEARCH` before Linux 6.10; without
/// it the kernel answers `ENOENT`, and the file is linked through its `/proc/self/fd`
/// entry instead (which the kernel allows for an `O_TMPFILE` file).
pub(crate) fn link_at(fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    static EMPTY_PATH_REFUSED: AtomicBool = AtomicBool::new(false);
    if !EMPTY_PATH_REFUSED.load(Ordering::Relaxed) {
        match retry(|| rustix::fs::linkat(fd, c"", dir, name, AtFlags::EMPTY_PATH)) {
            Err(e) if matches!(errno(&e), libc::ENOENT | libc::EPERM) => {
                EMPTY_PATH_REFUSED.store(true, Ordering::Relaxed);
            }
            other => return other,
        }
    }
    link_through_proc(fd, dir, name)
}

/// [`link_at`] through the descriptor's `/proc/self/fd` entry.
fn link_through_proc(fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let proc = format!("/proc/self/fd/{}", fd.as_raw_fd());
    retry(|| {
        rustix::fs::linkat(
            rustix::fs::CWD,
            proc.as_str(),
            dir,
            name,
            AtFlags::SYMLINK_FOLLOW,
        )
    })
}

/// `ftruncate`: cuts (or extends) the file to `len` bytes.
pub(crate) fn truncate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    retry(|| rustix::fs::ftruncate(fd, len))
}

/// Writes all of `bytes` at `offset`, without moving the file position.
pub(crate) fn write_all_at(
    fd: BorrowedFd<'_>,
    mut bytes: &[u8],
    mut offset: u64,
) -> io::Result<()> {
    while !bytes.is_empty() {
        let n = retry(|| rustix::io::pwrite(fd, bytes, offset))?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0"));
        }
        bytes = &bytes[n..];
        offset += n as u64;
    }
    Ok(())
}

/// Reads at most `limit` bytes from offset 0 (the flag says whether more were there),
/// without moving the file position.
pub(crate) fn read_limited_at(fd: BorrowedFd<'_>, limit: usize) -> io::Result<(Vec<u8>, bool)> {
    let mut bytes = vec![0u8; limit + 1];
    let mut filled = 0;
    while filled < bytes.len() {
        let n = retry(|| rustix::io::pread(fd, &mut bytes[filled..], filled as u64))?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    let oversized = filled > limit;
    bytes.truncate(filled.min(limit));
    Ok((bytes, oversized))
}

/// Writes all of `bytes`.
pub(crate) fn write_all(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        let n = retry(|| rustix::io::write(fd, bytes))?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0"));
        }
        bytes = &bytes[n..];
    }
    Ok(())
}

/// `fsync`.
pub(crate) fn sync(fd: BorrowedFd<'_>) -> io::Result<()> {
    retry(|| rustix::fs::fsync(fd))
}

/// Moves `from` to `to` inside `dir` only if `to` does not exist (`EEXIST` otherwise).
pub(crate) fn rename_noreplace_at(dir: BorrowedFd<'_>, from: &CStr, to: &CStr) -> io::Result<()> {
    match retry(|| rustix::fs::renameat_with(dir, from, dir, to, RenameFlags::NOREPLACE)) {
        Err(e) if matches!(errno(&e), libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => {
            retry(|| rustix::fs::linkat(dir, from, dir, to, AtFlags::empty()))?;
            unlink_at(dir, from)
        }
        other => other,
    }
}

/// Moves `from` to `to` inside `dir`, replacing `to`.
pub(crate) fn rename_at(dir: BorrowedFd<'_>, from: &CStr, to: &CStr) -> io::Result<()> {
    retry(|| rustix::fs::renameat(dir, from, dir, to))
}

/// Removes the file `name` from `dir`.
pub(crate) fn unlink_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    retry(|| rustix::fs::unlinkat(dir, name, AtFlags::empty()))
}

/// What a `kill(pid, 0)` probe says about a process.
#[derive(Debug)]
pub(crate) enum Probe {
    /// The pid exists (it may be a zombie or an unrelated process).
    Present,
    /// `ESRCH`: no such process on this host (in our pid namespace).
    Absent,
    /// Any other answer (`EPERM`: another user's process; anything else).
    Undeterminable,
}

/// `kill(pid, 0)`.
pub(crate) fn probe(pid: i32) -> Probe {
    // `Pid::from_raw` asserts a non-negative value; zero and negatives name groups.
    if pid < 1 {
        return Probe::Undeterminable;
    }
    let Some(pid) = rustix::process::Pid::from_raw(pid) else {
        return Probe::Undeterminable;
    };
    match rustix::process::test_kill_process(pid) {
        Ok(()) => Probe::Present,
        Err(Errno::SRCH) => Probe::Absent,
        Err(_) => Probe::Undeterminable,
    }
}

/// This process's id.
pub(crate) fn own_pid() -> i32 {
    rustix::process::getpid().as_raw_nonzero().get()
}

/// This process's start time, read once.
pub(crate) fn own_start_time() -> Option<u64> {
    static START: OnceLock<Option<u64>> = OnceLock::new();
    *START.get_or_init(|| arcane_process::start_time(own_pid() as u32))
}

/// The kernel's boot id (`/proc/sys/kernel/random/boot_id`), read once.
pub(crate) fn boot_id() -> Option<&'static str> {
    static BOOT: OnceLock<Option<String>> = OnceLock::new();
    BOOT.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    })
    .as_deref()
}

/// The host name (`uname -n`), read once.
pub(crate) fn hostname() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned()
    })
}

/// The real user id, read once (it is informational: the holder's facts).
pub(crate) fn uid() -> u32 {
    static UID: OnceLock<u32> = OnceLock::new();
    *UID.get_or_init(|| rustix::process::getuid().as_raw())
}

/// A short description of this process's command (`arcane lock`), read once from
/// `/proc/self/cmdline`: the executable's file name and its first non-option word.
pub(crate) fn own_command() -> Option<&'static str> {
    static COMMAND: OnceLock<Option<String>> = OnceLock::new();
    COMMAND
        .get_or_init(|| {
            let raw = std::fs::read("/proc/self/cmdline").ok()?;
            let mut words = raw
                .split(|b| *b == 0)
                .filter(|w| !w.is_empty())
                .map(|w| String::from_utf8_lossy(w).into_owned());
            let exe = words.next()?;
            let exe = Path::new(&exe)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or(exe);
            let rest: Vec<String> = words.collect();
            Some(describe_command(&exe, &rest))
        })
        .as_deref()
}

/// `exe` plus the first word that looks like a subcommand: not an option, not a path,
/// and not the value of a preceding `--long` option (`arcane --output json lock` →
/// `arcane lock`).
fn describe_command(exe: &str, words: &[String]) -> String {
    let mut text = exe.to_string();
    let mut previous_takes_value = false;
    for word in words {
        if word.starts_with('-') {
            previous_takes_value = word.starts_with("--") && !word.contains('=');
            continue;
        }
        if previous_takes_value || word.contains('/') {
            previous_takes_value = false;
            continue;
        }
        text.push(' ');
        text.push_str(word);
        break;
    }
    text.chars().take(120).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn words(list: &[&str]) -> Vec<String> {
        list.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn the_command_description_skips_options_and_their_values() {
        assert_eq!(
            describe_command("arcane", &words(&["--output", "json", "lock", "run"])),
            "arcane lock"
        );
        assert_eq!(
            describe_command("arcane", &words(&["-v", "serve"])),
            "arcane serve"
        );
        assert_eq!(
            describe_command("arcane", &words(&["--workspace=/w", "model", "add"])),
            "arcane model"
        );
        assert_eq!(describe_command("node", &words(&["/x/cli.mjs"])), "node");
    }

    #[test]
    fn start_times_come_from_proc() {
        assert!(own_start_time().is_some());
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let theirs = arcane_process::start_time(child.id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(theirs.unwrap() >= own_start_time().unwrap());
    }

    #[test]
    fn an_unnamed_file_is_linked_exclusively_either_way() {
        let dir = tempfile::tempdir().unwrap();
        let dir_fd = open_directory_nofollow(dir.path()).unwrap();
        type Link = for<'a, 'b, 'c> fn(BorrowedFd<'a>, BorrowedFd<'b>, &'c CStr) -> io::Result<()>;
        let ways: [(&CStr, Link); 2] = [(c"direct", link_at), (c"through-proc", link_through_proc)];
        for (name, link) in ways {
            let file = create_unnamed_at(dir_fd.as_fd())
                .unwrap()
                .expect("tmpfs and ext4 have unnamed files");
            write_all(file.as_fd(), b"record").unwrap();
            link(file.as_fd(), dir_fd.as_fd(), name).unwrap();
            let path = dir.path().join(name.to_str().unwrap());
            assert_eq!(std::fs::read(&path).unwrap(), b"record");
            // A second link to the same name is refused, never replaces it.
            let other = create_unnamed_at(dir_fd.as_fd()).unwrap().unwrap();
            let err = link(other.as_fd(), dir_fd.as_fd(), name).unwrap_err();
            assert_eq!(errno(&err), libc::EEXIST);
            assert_eq!(std::fs::read(&path).unwrap(), b"record");
        }
    }

    #[test]
    fn probing_tells_present_from_absent() {
        assert!(matches!(probe(own_pid()), Probe::Present));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        assert!(matches!(probe(pid), Probe::Absent));
        assert!(matches!(probe(-1), Probe::Undeterminable));
    }
}
