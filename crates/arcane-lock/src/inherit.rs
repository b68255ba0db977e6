//! Lease inheritance: a command run under a held lease (by `arcane lock run`) runs
//! nested Arcane operations at once instead of waiting for its own parent.
//!
//! # The rule
//!
//! The holder passes two things to the command: the **locked descriptor** itself (the
//! sentinel's open file description, which carries the `flock`) and the variable
//! [`LEASE_VARIABLE`] = `v1:<fd>:<dev>:<ino>:<nonce>` naming that descriptor, the
//! workspace directory's identity and the lease's nonce. A process that finds the
//! variable (the CLI hands it to [`inherit`] once at start-up; libraries never read the
//! environment) acquires the same workspace only after proving all of:
//!
//! 1. the named descriptor is open and is the workspace's sentinel (same inode);
//! 2. `flock(LOCK_EX | LOCK_NB)` on *that* descriptor succeeds: the lock belongs to its
//!    open file description, so another description held by someone else fails here;
//! 3. the published record carries the claimed nonce.
//!
//! A claim that fails any check is refused (`ARCANE_POLICY_DENIED`, reason
//! `inherited-lease`); copying the variable without the descriptor gets nothing. A claim
//! for another workspace is ignored.
//!
//! Because the descriptor is inherited, the kernel keeps the lock held for exactly as
//! long as any process holding it lives: the command, or anything it leaves behind. An
//! inherited lease therefore never unlocks and never removes the record; the root
//! holder does that when its command has ended.

use std::os::fd::{BorrowedFd, RawFd};
use std::sync::OnceLock;

use crate::error::{Error, PolicyReason};
use crate::sys::{self, Identity, TryLock};
use crate::workspace::Workspace;

/// The environment variable that names an inherited lease.
pub const LEASE_VARIABLE: &str = "ARCANE_WORKSPACE_LEASE";

/// A claim to a lease held by an ancestor, parsed from [`LEASE_VARIABLE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Claim {
    pub(crate) fd: RawFd,
    pub(crate) workspace: Identity,
    pub(crate) nonce: String,
}

impl Claim {
    /// Renders the variable's value.
    pub(crate) fn render(&self) -> String {
        format!(
            "v1:{}:{}:{}:{}",
            self.fd, self.workspace.dev, self.workspace.ino, self.nonce
        )
    }

    fn parse(value: &str) -> Option<Claim> {
        let mut parts = value.splitn(5, ':');
        if parts.next()? != "v1" {
            return None;
        }
        let fd = parts.next()?.parse().ok().filter(|fd| *fd >= 0)?;
        let dev = parts.next()?.parse().ok()?;
        let ino = parts.next()?.parse().ok()?;
        let nonce = parts.next().filter(|n| !n.is_empty())?.to_string();
        Some(Claim {
            fd,
            workspace: Identity { dev, ino },
            nonce,
        })
    }
}

static CLAIM: OnceLock<Option<Claim>> = OnceLock::new();

/// Records the value of [`LEASE_VARIABLE`] this process was started with (`None` when
/// unset). Call once, before the first acquisition; later calls are ignored. A value
/// that does not parse is kept as a claim that every acquisition of any workspace
/// refuses, so a damaged variable is never silently ignored.
pub fn inherit(value: Option<&str>) {
    let claim = value.map(|v| {
        Claim::parse(v).unwrap_or(Claim {
            fd: -1,
            workspace: Identity { dev: 0, ino: 0 },
            nonce: String::new(),
        })
    });
    let _ = CLAIM.set(claim);
}

/// Whether this process inherited a lease variable at all (most do not: they skip the
/// claim check).
pub(crate) fn claimed() -> bool {
    CLAIM.get().is_some_and(Option::is_some)
}

/// The claim for `ws`, if this process inherited one: `Some(Ok)` for a claim on this
/// workspace, `Some(Err)` for a damaged variable, `None` otherwise.
pub(crate) fn claim_for(ws: &Workspace) -> Option<Result<&'static Claim, Error>> {
    let claim = CLAIM.get()?.as_ref()?;
    if claim.fd < 0 {
        return Some(Err(refused(ws, format!("`{LEASE_VARIABLE}` is malformed"))));
    }
    (claim.workspace == ws.identity).then_some(Ok(claim))
}

/// Proves `claim` (steps 1–3 of the module rule); `Ok(())` when this process may use
/// the lease.
pub(crate) fn verify(
    ws: &Workspace,
    arcane: BorrowedFd<'_>,
    claim: &Claim,
    record_nonce: Option<&str>,
) -> Result<(), Error> {
    // SAFETY: F_GETFD only reads the descriptor's flags; an unopened number gives EBADF.
    if unsafe { libc::fcntl(claim.fd, libc::F_GETFD) } < 0 {
        return Err(refused(
            ws,
            format!(
                "descriptor {} named by `{LEASE_VARIABLE}` is not open",
                claim.fd
            ),
        ));
    }
    // SAFETY: the descriptor is open (checked above) and this process never closes it,
    // so the borrow cannot outlive it.
    let fd = unsafe { BorrowedFd::borrow_raw(claim.fd) };
    let sentinel = sys::stat_at(arcane, crate::lease::SENTINEL).map_err(|e| {
        Error::io(
            "inspect the lock sentinel",
            ws.arcane_path(crate::lease::SENTINEL),
            e,
        )
    })?;
    match sys::stat_fd(fd) {
        Ok(stamp) if stamp.identity == sentinel.identity => {}
        _ => {
            return Err(refused(
                ws,
                format!("descriptor {} is not this workspace's lock", claim.fd),
            ))
        }
    }
    match sys::try_lock_exclusive(fd) {
        Ok(TryLock::Locked) => {}
        _ => {
            return Err(refused(
                ws,
                format!("descriptor {} does not hold the lock", claim.fd),
            ))
        }
    }
    if record_nonce != Some(claim.nonce.as_str()) {
        return Err(refused(
            ws,
            "the lock record does not name the inherited lease".into(),
        ));
    }
    Ok(())
}

fn refused(ws: &Workspace, why: String) -> Error {
    Error::policy(
        ws.arcane_path(crate::lease::SENTINEL),
        PolicyReason::InheritedLease { why },
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_round_trip_and_garbage_does_not_parse() {
        let claim = Claim {
            fd: 7,
            workspace: Identity { dev: 1, ino: 2 },
            nonce: "n-1:x".into(),
        };
        assert_eq!(Claim::parse(&claim.render()), Some(claim));
        for bad in [
            "",
            "v1",
            "v2:7:1:2:n",
            "v1:-1:1:2:n",
            "v1:x:1:2:n",
            "v1:7:1:2:",
        ] {
            assert_eq!(Claim::parse(bad), None, "{bad}");
        }
    }
}
