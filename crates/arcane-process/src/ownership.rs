//! Ownership proofs: how a later Arcane recognises, and stops, a process an earlier
//! Arcane started and then lost (it was killed before it could stop its child, and the
//! parent-death signal was not armed or not delivered).
//!
//! Whoever starts such a process records a [`Claim`] (pid, start time, executable, a
//! random nonce passed to the child in an environment variable, and the starting
//! Arcane as [`Owner`]); where and how it keeps the record is its own business (engine
//! records in `arcane-localai`, ONNX worker records in `arcane-core`). [`judge`] is the
//! one proof. A claimed process is an orphan to stop only when ALL of these hold, so a
//! reused pid or a stranger is never signalled:
//!
//! 1. the pid is alive with the recorded start time (`/proc/<pid>/stat` field 22);
//! 2. `/proc/<pid>/exe` is the recorded executable;
//! 3. its environment (when readable) holds the recorded nonce;
//! 4. the recorded owner is gone: a live owner still supervises its child, which is
//!    then left alone.
//!
//! [`stop_orphan`] then signals the orphan's group, re-checking the start time before
//! every signal.

// Stopping what an earlier Arcane lost is this module's job: it signals a pid or
// group only after the ownership proof and start time matched (clippy.toml fences
// `kill`/`killpg` everywhere else).
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The Arcane process that started a claimed process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    /// Its pid.
    pub pid: u32,
    /// Its start time (clock ticks since boot, `/proc/<pid>/stat` field 22).
    pub start_time: u64,
}

impl Owner {
    /// This process.
    pub fn current() -> Owner {
        let pid = std::process::id();
        Owner {
            pid,
            start_time: crate::start_time(pid).unwrap_or(0),
        }
    }
}

/// What a record says about the process it claims.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    /// The pid.
    pub pid: u32,
    /// Its start time.
    pub start_time: u64,
    /// Its executable as `/proc/<pid>/exe` showed it after the spawn.
    pub exe: &'a Path,
    /// The environment variable that carries the nonce, and the nonce.
    pub nonce: (&'a str, &'a str),
    /// The Arcane that started it.
    pub owner: &'a Owner,
}

/// What a claim says about its process now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judgement {
    /// The process is gone, or the pid now belongs to someone else (the reason, e.g.
    /// `process-gone`): forget the record.
    Stale(&'static str),
    /// The starting Arcane is still alive and supervises it: leave both alone.
    OwnerAlive,
    /// A proven orphan of an earlier Arcane: stop it.
    Orphan,
}

/// Judges `claim` against the live system (see the module doc for the proof).
pub fn judge(claim: &Claim<'_>) -> Judgement {
    if crate::start_time(claim.pid) != Some(claim.start_time) {
        return Judgement::Stale("process-gone");
    }
    if crate::exe(claim.pid).as_deref() != Some(claim.exe) {
        return Judgement::Stale("executable-differs");
    }
    let (variable, nonce) = claim.nonce;
    if environ_has(claim.pid, variable, nonce) == Some(false) {
        return Judgement::Stale("nonce-differs");
    }
    let owner = claim.owner;
    if owner.pid != std::process::id() && crate::start_time(owner.pid) == Some(owner.start_time) {
        return Judgement::OwnerAlive;
    }
    Judgement::Orphan
}

/// Whether `pid`'s environment holds `name=value`; `None` when it cannot be read.
pub fn environ_has(pid: u32, name: &str, value: &str) -> Option<bool> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let wanted = format!("{name}={value}");
    Some(
        environ
            .split(|b| *b == 0)
            .any(|entry| entry == wanted.as_bytes()),
    )
}

/// Stops a proven orphan (see [`judge`]): SIGTERM to its group, SIGKILL after
/// `grace`, each sent only while the pid still has `start_time`. It is not our child,
/// so liveness is polled through `/proc`. Blocking.
pub fn stop_orphan(pid: u32, start_time: u64, grace: Duration) -> crate::StopStep {
    let alive = || crate::start_time(pid) == Some(start_time);
    let signal = |sig: libc::c_int| {
        if !alive() {
            return;
        }
        // SAFETY: plain syscalls. The pid was re-checked against the recorded start time
        // just above, so it names the orphan, which leads its own group (spawned with
        // `setpgid(0, 0)`); if it does not lead a group, only the pid is signalled.
        unsafe {
            if libc::getpgid(pid as libc::pid_t) == pid as libc::pid_t {
                libc::killpg(pid as libc::pid_t, sig);
            } else {
                libc::kill(pid as libc::pid_t, sig);
            }
        }
    };
    let wait_gone = |limit: Duration| {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if !alive() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        !alive()
    };
    if !alive() {
        return crate::StopStep::AlreadyExited;
    }
    signal(libc::SIGTERM);
    if wait_gone(grace) {
        return crate::StopStep::Sigterm;
    }
    signal(libc::SIGKILL);
    wait_gone(Duration::from_secs(5));
    crate::StopStep::Sigkill
}
