//! Stale-lock recovery: the one place that decides whether an existing lock record may
//! be replaced. This module's documentation is the specification.
//!
//! # When the rule runs
//!
//! Only a process that **holds the advisory lock** (`flock(LOCK_EX)`) on the sentinel
//! `.arcane/workspace-operation.lock` ever judges, replaces or removes the record
//! `.arcane/workspace-operation.lock.json`. Arcane holders publish their record only
//! while holding that lock and remove it before unlocking, and the kernel drops the lock
//! on any exit (`kill -9` included). So when we hold the lock, **no Arcane process on
//! this kernel holds the workspace**; the only possible live owners are a process of the
//! JavaScript SDK (which holds no advisory lock), an Arcane process on another host
//! (filesystems that could share the workspace between hosts are refused, but a disk
//! can be moved), or a holder whose sentinel was swapped behind its back.
//!
//! Serialising judges with the advisory lock closes the races of the JavaScript SDK
//! (lock-spec.md W5, W6): two recoverers can never both win, because only one of them
//! holds the lock, and neither can delete a lock a third process has just taken,
//! because an Arcane third process would need the lock first and an SDK third process
//! can only create the record when it is absent (we move the record aside atomically
//! and check that what we moved is what we judged; see [`Verdict::Stale`]).
//!
//! # The rule
//!
//! The record is read without following links (a link, directory, FIFO or other
//! non-file at the record path is refused with `ARCANE_POLICY_DENIED` before this rule
//! runs, and left alone). Then, in order:
//!
//! 1. **Unreadable** — larger than 64 KiB, empty, not JSON, not an object, another
//!    `schemaVersion` or `kind`, or missing `operation`, `owner.pid` (a positive safe
//!    integer), `nonce` or `scope` → **busy**, bytes untouched. Such a file cannot have
//!    been written by Arcane (Arcane publishes complete, fsynced records with an atomic
//!    rename, so a crash never leaves an empty or partial Arcane record), and an SDK
//!    process may be between its exclusive create and its write right now. Overwriting
//!    would risk two holders and lose the bytes. `arcane lock recover
//!    --quarantine-unreadable` moves it aside under a preserved name on request.
//! 2. **Other scope** — neither `scope` equals the canonical workspace path nor
//!    `workspaceIdentity` equals the workspace directory's `(dev, ino)` → **busy**,
//!    untouched (it was copied here from another workspace). Matching by identity lets a
//!    moved or renamed workspace recover its own stale record (lock-spec.md W8).
//! 3. **Arcane record** (`advisoryLock.kind == "flock"`), judged by where it was written:
//!    * same kernel (`owner.bootId` equals ours; or, when the record has no boot id, the
//!      same host name): the advisory lock is authoritative, so the record is stale —
//!      except that an owner pid that is **alive with the same start time** is never
//!      displaced (**busy**: its sentinel may have been replaced behind its back), and an
//!      owner whose start time cannot be read is **busy** (undeterminable). An alive pid
//!      with a *different* start time is PID reuse → **stale**. An absent pid, or a
//!      zombie (it has exited; its parent has not reaped it yet) → **stale**.
//!    * same host name, different boot id: written before a reboot → **stale** (every
//!      process of the previous boot is gone; otherwise a power cut would leave the
//!      workspace stuck).
//!    * another host name and another (or no) boot id → **busy**, naming the host. Never
//!      broken automatically; `arcane lock recover --break-foreign-host HOST` breaks it
//!      on explicit request.
//! 4. **SDK record** (no advisory lock), judged by the SDK 0.89 rule on this host:
//!    `kill(pid, 0)` fails with `ESRCH` → **stale**; succeeds → **busy** (owner alive),
//!    unless the process at that pid started after the record's `acquiredAt` (by more
//!    than the two seconds of the boot time's rounding): then it cannot have written the
//!    record, the pid was reused → **stale**; any other answer (`EPERM`: another user's
//!    process) → **busy** (undeterminable). "Written" is the later of its `acquiredAt`
//!    and its modification time: an Arcane record renews its times in place and keeps
//!    `acquiredAt` six hours before its expiry (the `record` module), so when its facts
//!    are missing (its sentinel was swapped) only the modification time still says when
//!    its writer lived.
//!    Expiry times are ignored (lock-spec.md W3).
//!
//! # Replacing a stale record
//!
//! The judge renames the record to the fixed debris name
//! `.workspace-operation.lock.json.stale` (replacing earlier debris), checks that the
//! moved file is the inode it judged, emits `workspace.operation.stale-recovered` with
//! the previous owner and operation, and unlinks it. If the moved file is a different
//! inode (an SDK process deleted the stale record and created its own in between), it is
//! moved back with `RENAME_NOREPLACE` and the result is **busy**. A crash at any point
//! leaves either the stale record (judged again next time) or debris that the next
//! holder overwrites; never a stuck workspace.

use std::path::Path;
use std::time::SystemTime;

use crate::error::BusyReason;
use crate::holder::Holder;
use crate::record::{self, Parsed};
use crate::sys::{self, Identity, Probe};
use arcane_process::Liveness;

/// What the rule decided about an existing record.
#[derive(Debug, Clone)]
pub(crate) enum Verdict {
    /// The record's owner is provably gone: the record may be replaced.
    Stale {
        /// Who held it.
        previous: Holder,
        /// Why it is stale, for the event (`owner-exited`, `pid-reused`, `rebooted`).
        why: &'static str,
    },
    /// The record must be left alone.
    Busy {
        /// Why.
        reason: BusyReason,
        /// Who it names, when readable.
        holder: Option<Holder>,
    },
}

/// The bytes found at the record path.
pub(crate) enum Found<'a> {
    /// The whole file (at most 64 KiB).
    Bytes(&'a [u8]),
    /// The file is larger than 64 KiB.
    Oversized,
}

/// The workspace being judged for.
pub(crate) struct Scope<'a> {
    /// Its canonical path.
    pub(crate) canonical: &'a Path,
    /// Its directory identity.
    pub(crate) identity: Identity,
}

/// Applies the rule above to a record last modified at `written`. The caller holds the
/// advisory lock.
pub(crate) fn judge(found: Found<'_>, scope: &Scope<'_>, written: SystemTime) -> Verdict {
    let bytes = match found {
        Found::Bytes(bytes) => bytes,
        Found::Oversized => {
            return Verdict::Busy {
                reason: BusyReason::UnreadableRecord {
                    problem: format!("larger than {} KiB", record::MAX_RECORD_BYTES / 1024),
                },
                holder: None,
            }
        }
    };
    let parsed = match record::parse(bytes) {
        Ok(parsed) => parsed,
        Err(problem) => {
            return Verdict::Busy {
                reason: BusyReason::UnreadableRecord { problem },
                holder: None,
            }
        }
    };
    if !same_scope(&parsed, scope) {
        return Verdict::Busy {
            reason: BusyReason::OtherScope {
                scope: parsed.scope.clone(),
            },
            holder: Some(parsed.holder),
        };
    }
    let mut holder = parsed.holder;
    let Some(pid) = holder.pid.and_then(|pid| i32::try_from(pid).ok()) else {
        return busy(BusyReason::OwnerUndeterminable, holder, None);
    };
    if holder.advisory_lock {
        judge_arcane(holder, pid)
    } else {
        match sys::probe(pid) {
            Probe::Absent => {
                holder.alive = Some(false);
                Verdict::Stale {
                    previous: holder,
                    why: "owner-exited",
                }
            }
            Probe::Present if started_after_record(pid, &holder, written) => {
                holder.alive = Some(false);
                Verdict::Stale {
                    previous: holder,
                    why: "pid-reused",
                }
            }
            Probe::Present => busy(BusyReason::OwnerAlive, holder, Some(true)),
            Probe::Undeterminable => busy(BusyReason::OwnerUndeterminable, holder, None),
        }
    }
}

fn judge_arcane(mut holder: Holder, pid: i32) -> Verdict {
    let our_boot = sys::boot_id();
    let same_kernel = match (holder.boot_id.as_deref(), our_boot) {
        (Some(theirs), Some(ours)) => theirs == ours,
        // Without boot ids, fall back to the host name.
        _ => holder.hostname.as_deref() == Some(sys::hostname()),
    };
    if !same_kernel {
        if holder.hostname.as_deref() == Some(sys::hostname()) {
            holder.alive = Some(false);
            return Verdict::Stale {
                previous: holder,
                why: "rebooted",
            };
        }
        let hostname = holder
            .hostname
            .clone()
            .unwrap_or_else(|| "an unknown host".to_string());
        return busy(BusyReason::ForeignHost { hostname }, holder, None);
    }
    // Same kernel: we hold the advisory lock, so the writer does not. Only a live owner
    // with the recorded start time (a swapped sentinel) is protected; a zombie has
    // exited, and a pid with another start time was reused.
    let Some(recorded) = holder.start_time else {
        return match sys::probe(pid) {
            Probe::Absent => {
                holder.alive = Some(false);
                Verdict::Stale {
                    previous: holder,
                    why: "owner-exited",
                }
            }
            _ => busy(BusyReason::OwnerUndeterminable, holder, None),
        };
    };
    let identity = arcane_process::Identity {
        pid: pid as u32,
        start_time: recorded,
    };
    match identity.liveness() {
        Liveness::Alive => busy(BusyReason::OwnerAliveWithoutLock, holder, Some(true)),
        Liveness::Gone if matches!(sys::probe(pid), Probe::Undeterminable) => {
            busy(BusyReason::OwnerUndeterminable, holder, None)
        }
        Liveness::Gone => {
            holder.alive = Some(false);
            Verdict::Stale {
                previous: holder,
                why: "owner-exited",
            }
        }
        Liveness::Reused => {
            holder.alive = Some(false);
            Verdict::Stale {
                previous: holder,
                why: "pid-reused",
            }
        }
    }
}

/// Whether the process now at `pid` started after the record was written (the later
/// of `acquiredAt` and `written`, its modification time), so it cannot be the record's
/// writer. Two seconds of slack cover the boot time's whole-second rounding.
fn started_after_record(pid: i32, holder: &Holder, written: SystemTime) -> bool {
    let acquired = holder
        .since
        .as_deref()
        .and_then(arcane_report::time::parse_rfc3339);
    let written = acquired.map_or(written, |a| a.max(written));
    u32::try_from(pid)
        .ok()
        .and_then(arcane_process::started_at)
        .is_some_and(|started| started > written + std::time::Duration::from_secs(2))
}

fn busy(reason: BusyReason, mut holder: Holder, alive: Option<bool>) -> Verdict {
    holder.alive = alive;
    Verdict::Busy {
        reason,
        holder: Some(holder),
    }
}

fn same_scope(parsed: &Parsed, scope: &Scope<'_>) -> bool {
    Path::new(&parsed.scope) == scope.canonical || parsed.workspace_identity == Some(scope.identity)
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests start a throwaway process
mod tests {
    use super::*;

    /// A modification time older than every process, so only `acquiredAt` speaks.
    fn long_ago() -> SystemTime {
        SystemTime::UNIX_EPOCH
    }

    fn scope() -> Scope<'static> {
        Scope {
            canonical: Path::new("/w"),
            identity: Identity { dev: 1, ino: 2 },
        }
    }

    fn arcane_record(
        pid: i64,
        host: &str,
        boot: Option<&str>,
        start: Option<u64>,
        scope: &str,
    ) -> Vec<u8> {
        let mut owner = serde_json::json!({"pid": pid, "hostname": host});
        if let Some(boot) = boot {
            owner["bootId"] = boot.into();
        }
        if let Some(start) = start {
            owner["startTime"] = start.into();
        }
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 1, "kind": record::KIND, "operation": "demo", "owner": owner,
            "scope": scope, "nonce": "n", "acquiredAt": "2026-01-01T00:00:00.000Z",
            "advisoryLock": {"kind": "flock"}
        }))
        .unwrap()
    }

    /// An SDK record written now.
    fn sdk_record(pid: i64) -> Vec<u8> {
        sdk_record_at(pid, &arcane_report::time::now_rfc3339())
    }

    fn sdk_record_at(pid: i64, acquired_at: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 1, "kind": record::KIND, "operation": "package",
            "owner": {"pid": pid}, "scope": "/w", "nonce": "n",
            "acquiredAt": acquired_at, "expiresAt": "2999-01-01T00:00:00.000Z"
        }))
        .unwrap()
    }

    /// A pid that certainly does not exist: a child we spawned and reaped.
    fn dead_pid() -> i64 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        i64::from(pid)
    }

    fn is_stale(v: &Verdict, expected_why: &str) -> bool {
        matches!(v, Verdict::Stale { why, .. } if *why == expected_why)
    }

    fn busy_reason(v: &Verdict) -> Option<&BusyReason> {
        match v {
            Verdict::Busy { reason, .. } => Some(reason),
            Verdict::Stale { .. } => None,
        }
    }

    #[test]
    fn unreadable_records_are_busy() {
        for bytes in [&b""[..], b"not json", b"{}", b"[]"] {
            let v = judge(Found::Bytes(bytes), &scope(), long_ago());
            assert!(
                matches!(busy_reason(&v), Some(BusyReason::UnreadableRecord { .. })),
                "{bytes:?}"
            );
        }
        assert!(matches!(
            busy_reason(&judge(Found::Oversized, &scope(), long_ago())),
            Some(BusyReason::UnreadableRecord { .. })
        ));
    }

    #[test]
    fn a_record_of_another_workspace_is_busy_but_a_moved_workspace_matches_by_identity() {
        let me = i64::from(sys::own_pid());
        let other = arcane_record(me, sys::hostname(), sys::boot_id(), Some(1), "/elsewhere");
        assert!(matches!(
            busy_reason(&judge(Found::Bytes(&other), &scope(), long_ago())),
            Some(BusyReason::OtherScope { .. })
        ));
        // Same bytes but carrying our directory identity: a moved workspace.
        let mut moved: serde_json::Value = serde_json::from_slice(&other).unwrap();
        moved["workspaceIdentity"] = serde_json::json!({"dev": 1, "ino": 2});
        moved["owner"]["pid"] = dead_pid().into();
        let moved = serde_json::to_vec(&moved).unwrap();
        assert!(is_stale(
            &judge(Found::Bytes(&moved), &scope(), long_ago()),
            "owner-exited"
        ));
    }

    #[test]
    fn an_arcane_record_of_a_dead_owner_is_stale() {
        let bytes = arcane_record(dead_pid(), sys::hostname(), sys::boot_id(), Some(5), "/w");
        assert!(is_stale(
            &judge(Found::Bytes(&bytes), &scope(), long_ago()),
            "owner-exited"
        ));
    }

    #[test]
    fn a_reused_pid_with_another_start_time_is_stale() {
        let me = i64::from(sys::own_pid());
        let start = sys::own_start_time().unwrap();
        let bytes = arcane_record(me, sys::hostname(), sys::boot_id(), Some(start + 1), "/w");
        assert!(is_stale(
            &judge(Found::Bytes(&bytes), &scope(), long_ago()),
            "pid-reused"
        ));
    }

    #[test]
    fn a_live_owner_with_its_start_time_is_never_displaced() {
        let me = i64::from(sys::own_pid());
        let bytes = arcane_record(
            me,
            sys::hostname(),
            sys::boot_id(),
            sys::own_start_time(),
            "/w",
        );
        assert_eq!(
            busy_reason(&judge(Found::Bytes(&bytes), &scope(), long_ago())),
            Some(&BusyReason::OwnerAliveWithoutLock)
        );
    }

    #[test]
    fn a_record_from_before_a_reboot_on_this_host_is_stale() {
        let me = i64::from(sys::own_pid());
        let bytes = arcane_record(
            me,
            sys::hostname(),
            Some("another-boot"),
            sys::own_start_time(),
            "/w",
        );
        assert!(is_stale(
            &judge(Found::Bytes(&bytes), &scope(), long_ago()),
            "rebooted"
        ));
    }

    #[test]
    fn a_record_from_another_host_is_never_broken() {
        let bytes = arcane_record(
            dead_pid(),
            "elsewhere.example",
            Some("another-boot"),
            Some(1),
            "/w",
        );
        let v = judge(Found::Bytes(&bytes), &scope(), long_ago());
        assert_eq!(
            busy_reason(&v),
            Some(&BusyReason::ForeignHost {
                hostname: "elsewhere.example".into()
            })
        );
    }

    #[test]
    fn sdk_records_follow_the_sdk_rule() {
        let alive = sdk_record(i64::from(sys::own_pid()));
        assert_eq!(
            busy_reason(&judge(Found::Bytes(&alive), &scope(), long_ago())),
            Some(&BusyReason::OwnerAlive)
        );
        let dead = sdk_record(dead_pid());
        assert!(is_stale(
            &judge(Found::Bytes(&dead), &scope(), long_ago()),
            "owner-exited"
        ));
    }

    #[test]
    fn an_sdk_record_whose_pid_now_names_a_younger_process_is_stale() {
        // Issue: such a record stayed busy forever. This test process started after
        // the record's acquiredAt, so it cannot be the record's writer.
        let reused = sdk_record_at(i64::from(sys::own_pid()), "2020-01-01T00:00:00.000Z");
        assert!(is_stale(
            &judge(Found::Bytes(&reused), &scope(), long_ago()),
            "pid-reused"
        ));
    }

    #[test]
    fn a_record_modified_after_its_owner_started_is_not_taken_for_pid_reuse() {
        // An Arcane record without its facts (its sentinel was swapped) looks like an
        // SDK record whose `acquiredAt` lies six hours back; its live writer started
        // after that but before it last wrote the record, so it stays busy.
        let backdated = sdk_record_at(i64::from(sys::own_pid()), "2020-01-01T00:00:00.000Z");
        assert_eq!(
            busy_reason(&judge(
                Found::Bytes(&backdated),
                &scope(),
                SystemTime::now()
            )),
            Some(&BusyReason::OwnerAlive)
        );
    }

    #[test]
    fn an_sdk_record_whose_owner_cannot_be_probed_is_busy() {
        // pid 1 belongs to root; unprivileged probes get EPERM. As root the probe
        // succeeds, which is busy too.
        let v = judge(Found::Bytes(&sdk_record(1)), &scope(), long_ago());
        assert!(matches!(
            busy_reason(&v),
            Some(BusyReason::OwnerUndeterminable | BusyReason::OwnerAlive)
        ));
    }
}
