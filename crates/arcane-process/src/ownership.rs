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
//! 2. `/proc/<pid>/exe` (when readable) is the recorded executable;
//! 3. its environment (when readable) holds the recorded nonce;
//! 4. the recorded owner is gone: a live owner still supervises its child, which is
//!    then left alone.
//!
//! When 1–3 fail because the recorded process is gone, what it started may still run:
//! an engine a wrapper forked (`sh -c "llama-server …"`) is not killed by the
//! parent-death signal, which is armed on the wrapper only. Every process of this user
//! whose environment holds the recorded nonce (a random value no other process has)
//! and that started after the recorded one is its descendant; while one runs, the
//! claim is still an orphan to stop (4 still applies).
//!
//! [`stop_orphan`] then signals the whole [`Tree`]: the recorded process's group while
//! it still leads one, and every nonce carrier by pid, re-checking each start time
//! before every signal and looking for carriers again before each round.

// Stopping what an earlier Arcane lost is this module's job: it signals a pid or
// group only after the ownership proof and start time matched (clippy.toml fences
// `kill`/`killpg` everywhere else).
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::Identity;

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
    if let Err(reason) = prove_leader(claim) {
        // The leader is gone (or its pid is another process now); what it started may
        // not be: a process carrying its nonce is its descendant.
        if Tree::of(claim).carriers().is_empty() {
            return Judgement::Stale(reason);
        }
    }
    let owner = claim.owner;
    if owner.pid != std::process::id() && crate::start_time(owner.pid) == Some(owner.start_time) {
        return Judgement::OwnerAlive;
    }
    Judgement::Orphan
}

/// Whether the claimed pid is still the claimed process: its start time, executable
/// and (when readable) nonce; else why not.
fn prove_leader(claim: &Claim<'_>) -> Result<(), &'static str> {
    if crate::start_time(claim.pid) != Some(claim.start_time) {
        return Err("process-gone");
    }
    if !crate::procfs::is_ours(claim.pid) {
        return Err("another-user");
    }
    // Unreadable is not different: a process that is exiting has released its memory,
    // and with it its `exe` link and environment, while it still holds its descriptors.
    if crate::exe(claim.pid).is_some_and(|exe| exe != claim.exe) {
        return Err("executable-differs");
    }
    let (variable, nonce) = claim.nonce;
    if environ_has(claim.pid, variable, nonce) == Some(false) {
        return Err("nonce-differs");
    }
    Ok(())
}

/// A claimed process and everything it started that still carries its nonce, even
/// after the claimed process is gone (an engine a wrapper forked): what
/// [`stop_orphan`] stops. Owned, so it can move to a blocking thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    leader: Identity,
    variable: String,
    nonce: String,
}

impl Tree {
    /// The tree `claim` names.
    pub fn of(claim: &Claim<'_>) -> Tree {
        Tree {
            leader: Identity {
                pid: claim.pid,
                start_time: claim.start_time,
            },
            variable: claim.nonce.0.to_string(),
            nonce: claim.nonce.1.to_string(),
        }
    }

    /// The processes carrying the nonce, born no earlier than the leader.
    fn carriers(&self) -> Vec<Identity> {
        crate::carriers(&self.variable, &self.nonce, self.leader.start_time)
    }

    /// The live members now: the leader while its pid has its start time, and every
    /// carrier. Liveness is the start time alone, never the executable or the
    /// environment: a process that is exiting has already released its memory (its
    /// `exe` link and `environ` read as nothing) while its descriptors, a listening
    /// socket among them, are still open; it is gone only once it is a zombie.
    fn members(&self) -> Vec<Identity> {
        let mut members = self.carriers();
        if self.leader.is_alive() && !members.contains(&self.leader) {
            members.push(self.leader);
        }
        members
    }

    /// Signals every member still alive with its recorded start time: the leader's
    /// whole group when it leads one (reaching members whose environment was
    /// cleared), every other member by pid.
    fn signal(&self, members: &[Identity], sig: libc::c_int) {
        for member in members {
            if !member.is_alive() {
                continue;
            }
            let pid = member.pid as libc::pid_t;
            // SAFETY: plain syscalls. The pid was re-checked against its start time just
            // above, so it names a member of the tree (the nonce or the claim proved it);
            // the leader leads its own group (spawned with `setpgid(0, 0)`).
            unsafe {
                if *member == self.leader && libc::getpgid(pid) == pid {
                    libc::killpg(pid, sig);
                } else {
                    libc::kill(pid, sig);
                }
            }
        }
    }

    /// Stops the tree: SIGTERM to every member, SIGKILL to what is left after `grace`
    /// (members looked for again before each round: one may have forked meanwhile).
    /// It is not our child, so liveness is polled through `/proc`. Blocking.
    pub fn stop(&self, grace: Duration) -> crate::StopStep {
        let mut known = Vec::new();
        if !self.still_running(&mut known) {
            return crate::StopStep::AlreadyExited;
        }
        self.signal(&known, libc::SIGTERM);
        if self.wait_gone(&mut known, grace, None) {
            return crate::StopStep::Sigterm;
        }
        self.wait_gone(&mut known, Duration::from_secs(5), Some(libc::SIGKILL));
        crate::StopStep::Sigkill
    }

    /// Adds the members found now to `known` and keeps those that still run (a carrier
    /// that is exiting no longer shows its environment, but keeps its start time until
    /// it is gone); whether any does.
    fn still_running(&self, known: &mut Vec<Identity>) -> bool {
        for member in self.members() {
            if !known.contains(&member) {
                known.push(member);
            }
        }
        known.retain(Identity::is_alive);
        !known.is_empty()
    }

    /// Waits until no member is left or `limit` passed, looking for members again
    /// whenever one ends and sending `resend` to whatever is found on each round.
    /// Returns whether none is left.
    fn wait_gone(
        &self,
        known: &mut Vec<Identity>,
        limit: Duration,
        resend: Option<libc::c_int>,
    ) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if !self.still_running(known) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            if let Some(sig) = resend {
                self.signal(known, sig);
            }
            crate::wait_for_an_end(known, deadline);
        }
    }
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

/// Stops a proven orphan (see [`judge`]) and everything it started: [`Tree::stop`].
pub fn stop_orphan(claim: &Claim<'_>, grace: Duration) -> crate::StopStep {
    Tree::of(claim).stop(grace)
}
