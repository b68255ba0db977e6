//! What `/proc/<pid>/stat` says about a process, parsed by one rule, and the two
//! questions Arcane asks of many processes at once: what a process group is doing
//! ([`group_activity`]), and which processes carry a claimed process's nonce
//! ([`carriers`]).
//!
//! Why a group's activity: an engine that does not answer its readiness probe may be
//! busy (its CPU time grows: it is computing a long prompt on a loaded machine) or dead
//! to the world (stopped by `SIGSTOP`, or blocked forever: its CPU time stands still).
//! Only the second may be stopped; probe latency alone proves nothing. The group, not
//! the leader: a `command` engine's leader may be a shell that only waits for the
//! server it forked.
//!
//! Why carriers: an engine forked by a wrapper (`sh -c "llama-server …"`) is not killed
//! by the parent-death signal when its host is killed (the signal is armed on the
//! wrapper only, and is not inherited by a fork), and once the wrapper is gone its
//! record's pid proves nothing. Its environment still holds the nonce Arcane gave the
//! wrapper, and no other process can hold that random value.

use crate::Identity;

/// The fields of `/proc/<pid>/stat` Arcane reads (proc(5)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    /// Field 3: `R`, `S`, `D`, `T` (stopped), `t` (traced), `Z` (zombie), …
    pub state: u8,
    /// Field 5: the process group.
    pub pgrp: u32,
    /// Fields 14 to 17: user and system time, its own and its reaped children's, in
    /// clock ticks.
    pub cpu_ticks: u64,
    /// Field 22: the start time in clock ticks since boot.
    pub start_time: u64,
}

impl Stat {
    /// Reads and parses `/proc/<pid>/stat`; `None` when there is no such process or
    /// the file cannot be read or parsed.
    pub(crate) fn of(pid: u32) -> Option<Stat> {
        Stat::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }

    /// Parses the text of a `stat` file. The command name (field 2) may contain spaces
    /// and parentheses: fields are read after the last `)`.
    pub(crate) fn parse(text: &str) -> Option<Stat> {
        let rest = &text[text.rfind(')')? + 1..];
        // `fields[0]` is field 3.
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let number = |field: usize| -> Option<u64> { fields.get(field - 3)?.parse().ok() };
        Some(Stat {
            state: *fields.first()?.as_bytes().first()?,
            pgrp: u32::try_from(number(5)?).ok()?,
            cpu_ticks: (14..=17).map(number).sum::<Option<u64>>()?,
            start_time: number(22)?,
        })
    }

    /// Whether the process is a zombie (it has exited and waits to be reaped).
    pub(crate) fn is_zombie(&self) -> bool {
        self.state == b'Z'
    }

    /// Whether the process is stopped (`SIGSTOP`, `SIGTSTP`) or stopped by a tracer.
    pub(crate) fn is_stopped(&self) -> bool {
        matches!(self.state, b'T' | b't')
    }
}

/// Whether a process whose leader is a zombie still has other threads running
/// (`/proc/<pid>/task` lists every thread of the group, the zombie leader included):
/// it is still exiting, with its descriptors open.
pub(crate) fn threads_left(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .is_ok_and(|tasks| tasks.flatten().nth(1).is_some())
}

/// Every process visible in `/proc` with its parsed `stat`.
fn processes() -> impl Iterator<Item = (u32, Stat)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, Stat::of(pid)?)))
}

/// What a process group is doing at one moment (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupActivity {
    /// How many live (not zombie) processes are in the group.
    pub members: usize,
    /// The CPU time of all of them (their own and their reaped children's), in clock
    /// ticks: a sum that grows while any of them works.
    pub cpu_ticks: u64,
    /// How many of them are stopped (`SIGSTOP`) or stopped by a tracer.
    pub stopped: usize,
}

impl GroupActivity {
    /// Whether every live member is stopped (and there is one): nothing in the group
    /// can answer until someone sends `SIGCONT`.
    pub fn all_stopped(&self) -> bool {
        self.members > 0 && self.stopped == self.members
    }

    /// Whether the group did real work since `earlier`, taken `window` before: at
    /// least 2 % of one CPU over the window, and never less than [`MIN_WORK_TICKS`]
    /// clock ticks. A sleeping process's housekeeping (a timer wake-up, a thread that
    /// accepts a connection) costs a tick now and then, and is no sign of work; an
    /// engine computing for its clients on an overloaded machine still gets far more.
    pub fn worked_since(&self, earlier: &GroupActivity, window: std::time::Duration) -> bool {
        let used = self.cpu_ticks.saturating_sub(earlier.cpu_ticks);
        let share = (window.as_secs_f64() * clock_ticks_per_second() as f64 * 0.02) as u64;
        used >= share.max(MIN_WORK_TICKS)
    }
}

/// The fewest clock ticks that count as work (see [`GroupActivity::worked_since`]).
pub const MIN_WORK_TICKS: u64 = 2;

/// The kernel's clock ticks per second (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|hz| *hz > 0)
        .unwrap_or(100)
}

/// What the processes of group `pgid` are doing now (one pass over `/proc`).
pub fn group_activity(pgid: u32) -> GroupActivity {
    processes()
        .filter(|(_, stat)| stat.pgrp == pgid && !stat.is_zombie())
        .fold(GroupActivity::default(), |mut sum, (_, stat)| {
            sum.members += 1;
            sum.cpu_ticks += stat.cpu_ticks;
            sum.stopped += usize::from(stat.is_stopped());
            sum
        })
}

/// The processes of this user (other than this process) whose environment holds
/// `name=value` and that started no earlier than `born`: what a process carrying that
/// nonce started, wherever it is now (see the module documentation). Processes of other
/// users are never read.
pub fn carriers(name: &str, value: &str, born: u64) -> Vec<Identity> {
    let me = std::process::id();
    processes()
        .filter(|(pid, stat)| *pid != me && !stat.is_zombie() && stat.start_time >= born)
        .filter(|(pid, _)| is_ours(*pid))
        .filter(|(pid, _)| crate::ownership::environ_has(*pid, name, value) == Some(true))
        .map(|(pid, stat)| Identity {
            pid,
            start_time: stat.start_time,
        })
        .collect()
}

/// Whether `pid` runs as this process's user (the owner of `/proc/<pid>`, its
/// effective user).
pub(crate) fn is_ours(pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    std::fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_name_with_spaces_and_parentheses_is_skipped() {
        let line = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 2 1 20 0 1 0 12345 1000 10";
        let stat = Stat::parse(line).unwrap();
        assert_eq!(stat.state, b'S');
        assert_eq!(stat.pgrp, 42);
        assert_eq!(stat.cpu_ticks, 7 + 3 + 2 + 1);
        assert_eq!(stat.start_time, 12345);
        assert!(!stat.is_stopped() && !stat.is_zombie());
        assert!(Stat::parse("42 (x) T 1 2").is_none(), "truncated");
        assert!(Stat::parse(&line.replace(" S ", " T "))
            .unwrap()
            .is_stopped());
    }

    #[test]
    fn this_process_is_seen_in_its_group_and_works() {
        let me = Stat::of(std::process::id()).unwrap();
        let before = group_activity(me.pgrp);
        assert!(before.members >= 1);
        assert_eq!(before.stopped, 0);
        // Burn CPU until the kernel's tick accounting moves (a few ticks at most).
        let mut spin = 0u64;
        let mut after = group_activity(me.pgrp);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !after.worked_since(&before, std::time::Duration::ZERO) {
            assert!(
                std::time::Instant::now() < deadline,
                "a minute of spinning never showed as CPU time: {before:?} {after:?}"
            );
            for i in 0..1_000_000u64 {
                spin = spin.wrapping_add(std::hint::black_box(i));
            }
            after = group_activity(me.pgrp);
        }
        assert!(
            after.cpu_ticks >= before.cpu_ticks + MIN_WORK_TICKS,
            "{spin}"
        );
        // A tick is housekeeping, not work; a long window asks for more.
        let one_tick = GroupActivity {
            cpu_ticks: before.cpu_ticks + 1,
            ..before
        };
        assert!(!one_tick.worked_since(&before, std::time::Duration::ZERO));
        let hour = std::time::Duration::from_secs(3600);
        assert!(
            !after.worked_since(&before, hour),
            "2 % of an hour is 72 s of CPU"
        );
    }
}
