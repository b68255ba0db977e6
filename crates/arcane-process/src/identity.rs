//! Who a pid is: its start time since boot, read from `/proc/<pid>/stat`.
//!
//! A pid alone names nothing durable: it is reused as soon as its process is reaped.
//! The pair (pid, start time) is unique for the life of a boot, so it is what Arcane
//! records and compares.

use std::path::PathBuf;

/// A process's start time in clock ticks since boot (`/proc/<pid>/stat` field 22,
/// proc(5)), or `None` when there is no such process, it has exited (a zombie), or
/// `/proc` cannot be read.
///
/// A zombie leader whose other threads still run has not exited yet: its threads
/// still hold its descriptors (a listening socket keeps accepting), so it still has
/// its start time. Only once its last thread is gone is it gone.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = crate::procfs::Stat::of(pid)?;
    (!stat.is_zombie() || crate::procfs::threads_left(pid)).then_some(stat.start_time)
}

/// Whether `pid` is stopped (`SIGSTOP`, `SIGTSTP`, a tracer): it answers nothing until
/// resumed. `false` when there is no such process or `/proc` cannot be read.
pub fn is_stopped(pid: u32) -> bool {
    crate::procfs::Stat::of(pid).is_some_and(|stat| stat.is_stopped())
}

/// The resident memory of `pid` in bytes (`VmRSS` of `/proc/<pid>/status`), or `None`
/// when it cannot be read.
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// When `pid` started, on the wall clock (the boot time `btime` of `/proc/stat` plus its
/// start time in clock ticks); whole-second precision at best. `None` when either
/// cannot be read.
pub fn started_at(pid: u32) -> Option<std::time::SystemTime> {
    let ticks = start_time(pid)?;
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let boot: u64 = stat
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|hz| *hz > 0)?;
    let since_epoch = std::time::Duration::from_secs(boot)
        + std::time::Duration::from_millis(ticks.saturating_mul(1000) / hz);
    Some(std::time::UNIX_EPOCH + since_epoch)
}

/// What `/proc/<pid>/exe` points to.
pub fn exe(pid: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe")).ok()
}

/// A process identified by pid and start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// The process id.
    pub pid: u32,
    /// Its start time in clock ticks since boot.
    pub start_time: u64,
}

/// What the system says about a recorded process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The pid runs and has the recorded start time: it is that process.
    Alive,
    /// No process has the pid, or it is a zombie.
    Gone,
    /// The pid runs with another start time: it was reused by an unrelated process.
    Reused,
}

impl Identity {
    /// This process.
    pub fn current() -> Option<Identity> {
        let pid = std::process::id();
        Some(Identity {
            pid,
            start_time: start_time(pid)?,
        })
    }

    /// The identity of `pid` now, if it runs.
    pub fn of(pid: u32) -> Option<Identity> {
        Some(Identity {
            pid,
            start_time: start_time(pid)?,
        })
    }

    /// Whether the recorded process still runs.
    pub fn liveness(&self) -> Liveness {
        match start_time(self.pid) {
            Some(now) if now == self.start_time => Liveness::Alive,
            Some(_) => Liveness::Reused,
            None => Liveness::Gone,
        }
    }

    /// Whether the recorded process still runs (neither gone nor reused).
    pub fn is_alive(&self) -> bool {
        self.liveness() == Liveness::Alive
    }
}

/// Blocks until one of `processes` has ended or `until` passes; returns at once when
/// one already has. A pidfd (pidfd_open(2)) becomes readable when its process has
/// ended, whoever its parent is, so a process that is not our child is waited for as
/// an event, not polled. On a kernel without pidfds (before Linux 5.3) it waits a
/// short while instead, and the caller looks again.
pub fn wait_for_an_end(processes: &[Identity], until: std::time::Instant) {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let left = until.saturating_duration_since(std::time::Instant::now());
    let mut pidfds = Vec::with_capacity(processes.len());
    for process in processes {
        // SAFETY: a plain syscall; the descriptor it returns is owned just below.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, process.pid as libc::pid_t, 0) };
        let Ok(fd) = i32::try_from(fd) else { continue };
        if fd < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
                return; // already gone
            }
            continue;
        }
        // SAFETY: `fd` was just returned by pidfd_open and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // The pid may have ended, and been reused, between the look and the open.
        if !process.is_alive() {
            return;
        }
        pidfds.push(fd);
    }
    if pidfds.is_empty() {
        std::thread::sleep(left.min(std::time::Duration::from_millis(20)));
        return;
    }
    let mut polled: Vec<libc::pollfd> = pidfds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let timeout = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: `polled` is a valid array of `polled.len()` pollfds over open descriptors.
    unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, timeout) };
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests start a throwaway process
mod tests {
    use super::*;

    #[test]
    fn start_time_of_self_is_readable_and_stable() {
        let me = Identity::current().unwrap();
        assert_eq!(me.liveness(), Liveness::Alive);
        assert_eq!(start_time(me.pid), Some(me.start_time));
        assert_eq!(start_time(u32::MAX - 1), None);
    }

    #[test]
    fn this_process_started_in_the_past() {
        let started = started_at(std::process::id()).unwrap();
        let now = std::time::SystemTime::now();
        // `btime` is rounded to a second.
        assert!(started <= now + std::time::Duration::from_secs(2));
    }

    #[test]
    fn another_start_time_is_a_reused_pid_and_a_reaped_child_is_gone() {
        let me = Identity::current().unwrap();
        let impostor = Identity {
            pid: me.pid,
            start_time: me.start_time + 1,
        };
        assert_eq!(impostor.liveness(), Liveness::Reused);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let gone = Identity { pid, start_time: 1 };
        // The pid may have been reused in between; it can never be our record's process.
        assert_ne!(gone.liveness(), Liveness::Alive);
    }

    #[test]
    fn waiting_for_an_end_blocks_until_the_process_ends() {
        use std::time::{Duration, Instant};
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let running = Identity::of(child.id()).unwrap();
        let (done, finished) = std::sync::mpsc::channel();
        let (told, tid) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            told.send(unsafe { libc::gettid() }).unwrap();
            wait_for_an_end(&[running], Instant::now() + Duration::from_secs(600));
            done.send(()).unwrap();
        });
        let tid = tid.recv().unwrap();
        // It blocks in poll(2) on the pidfd (it neither returned nor spins).
        let deadline = Instant::now() + Duration::from_secs(30);
        let wchan = format!("/proc/self/task/{tid}/wchan");
        while !std::fs::read_to_string(&wchan).is_ok_and(|w| w.contains("poll")) {
            assert!(Instant::now() < deadline, "never waited in poll");
            assert!(finished.try_recv().is_err(), "returned before the end");
            std::thread::yield_now();
        }
        child.kill().unwrap();
        finished
            .recv_timeout(Duration::from_secs(60))
            .expect("the end of the process ends the wait, not its deadline");
        child.wait().unwrap();
        assert!(!running.is_alive());
    }
}
