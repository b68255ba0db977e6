//! The one place Arcane starts, watches, signals and identifies processes.
//!
//! Every process Arcane starts — an engine, the background Core of `launch`, the
//! command of `arcane lock run`, a runtime's version probe — is created by [`spawn`],
//! which always
//!
//! * puts the child in a new process group (`setpgid(0, 0)`), so a stop reaches the
//!   child and anything it started;
//! * arms `PR_SET_PDEATHSIG(SIGKILL)` on Linux (prctl(2)) unless the caller opts out, so
//!   `kill -9` of Arcane takes the child down too. The signal fires when the *thread*
//!   that forked exits, not the process (prctl(2), "the parent thread"), so every fork
//!   happens on one dedicated spawner thread that lives as long as the process;
//! * passes exactly the descriptors named in [`Spec::keep_fds`] across `exec` (everything
//!   else Rust opens is close-on-exec);
//! * watches the leader from a waiter thread with `waitid(WNOWAIT)`: the zombie still
//!   holds the pid, so the group id cannot have been reused when the waiter sends a final
//!   SIGKILL to any leftover group member, and only then reaps the leader. No signal is
//!   ever sent after the reap ([`Child::signal`] checks under the same lock).
//!
//! Stopping ([`Child::terminate`]) sends SIGTERM to the group, waits out the grace
//! period, then sends SIGKILL. Dropping a [`Child`] without a stop kills its group
//! (kill-on-drop).
//!
//! The dynamic loader's search path of a child that runs a runtime ([`loader_path`])
//! is built by one rule, in `loader.rs`: the runtime's directories first, then the
//! inherited value, de-duplicated, with no empty entry.
//!
//! A child may be kept to a set of CPUs ([`Spec::cpus`], [`CpuSet`]): it sets its own
//! affinity before `exec`, so every thread it starts inherits it.
//!
//! Which TCP ports a process listens on ([`tcp_listeners`]) is read from `/proc`, the
//! evidence that an owned engine has no open port.
//!
//! A process an earlier Arcane started and lost is recognised by one proof
//! ([`ownership`]: pid, start time, executable, nonce, owner gone) before it is stopped.
//!
//! A process Arcane did not start is never signalled through this crate. A pid is
//! identified by its start time ([`Identity`]): a recorded pid whose start time
//! differs is another process, however alive it is.
#![warn(missing_docs)]

mod affinity;
mod identity;
mod loader;
pub mod ownership;
mod procfs;
mod sockets;
mod spawn;

pub use affinity::{CpuSet, CpuSetError};
pub use identity::{
    exe, is_stopped, resident_bytes, start_time, started_at, wait_for_an_end, Identity, Liveness,
};
pub use loader::{loader_path, LOADER_PATH_VARIABLE};
pub use procfs::{carriers, group_activity, GroupActivity};
pub use sockets::{sole_listener, tcp_listeners};

/// Variables that carry the Core's credentials: removed from the environment of every
/// engine and worker Arcane starts (an engine has no business with the Core's token).
pub const CREDENTIAL_VARIABLES: &[&str] = &["ARCANE_API_KEY"];
pub use spawn::{kill_all_now, spawn, Child, ExitInfo, Spec, StdioMode, StopStep};
