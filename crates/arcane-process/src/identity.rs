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
}
