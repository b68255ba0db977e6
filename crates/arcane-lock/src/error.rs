//! The crate's one error type, with a stable code per variant.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use arcane_report::{codes, Diagnostic};
use serde_json::{json, Value};

use crate::holder::Holder;

/// Why a workspace counts as busy.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BusyReason {
    /// Another process holds the advisory lock (the kernel says so).
    Locked,
    /// Another lease of this process holds the workspace.
    SameProcess,
    /// A record written without an advisory lock (the JavaScript SDK) names a live pid.
    OwnerAlive,
    /// An Arcane record names a live process with the same start time although we hold
    /// the advisory lock: a live owner is never displaced.
    OwnerAliveWithoutLock,
    /// Whether the recorded owner is alive could not be determined (`EPERM`, no `/proc`).
    OwnerUndeterminable,
    /// The record was written on another host; it is never broken automatically.
    ForeignHost {
        /// The host named in the record.
        hostname: String,
    },
    /// The record is empty, not JSON, not a lock record, or larger than 64 KiB.
    UnreadableRecord {
        /// What is wrong with it.
        problem: String,
    },
    /// The record belongs to another workspace (neither its path nor its directory
    /// identity match).
    OtherScope {
        /// The scope named in the record.
        scope: String,
    },
    /// A record appeared while we were publishing ours (a JavaScript SDK process won).
    RecordAppeared,
    /// A nested lease of the same parent is still active.
    NestedActive {
        /// The parent's operation.
        parent: String,
        /// The active child's operation.
        active: String,
    },
}

impl BusyReason {
    /// A stable kebab-case name (`locked`, `owner-alive`, `foreign-host`, …), as in the
    /// error's `details.reason`.
    pub fn name(&self) -> &'static str {
        match self {
            BusyReason::Locked => "locked",
            BusyReason::SameProcess => "same-process",
            BusyReason::OwnerAlive => "owner-alive",
            BusyReason::OwnerAliveWithoutLock => "owner-alive-without-lock",
            BusyReason::OwnerUndeterminable => "owner-undeterminable",
            BusyReason::ForeignHost { .. } => "foreign-host",
            BusyReason::UnreadableRecord { .. } => "unreadable-record",
            BusyReason::OtherScope { .. } => "other-scope",
            BusyReason::RecordAppeared => "record-appeared",
            BusyReason::NestedActive { .. } => "nested-active",
        }
    }
}

/// Why a path or lease was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyReason {
    /// The workspace directory does not exist.
    Missing,
    /// The path is a symbolic link where a physical directory or file is required.
    SymbolicLink,
    /// The path is not of the required kind (a file where a directory is required, a
    /// directory, FIFO or device where a regular file is required).
    WrongKind {
        /// What was found.
        found: &'static str,
    },
    /// Permission denied (e.g. `.arcane` owned by another user with mode 0700).
    PermissionDenied,
    /// The filesystem cannot give a dependable advisory lock.
    UnsupportedFilesystem {
        /// The filesystem's name (`nfs`, `fuse`, …) or the failing call.
        filesystem: String,
    },
    /// The workspace path is empty.
    Empty,
    /// Something Arcane did not create occupies a name the lock writes its own debris to
    /// (for example a directory at the stale record's aside name).
    InTheWay {
        /// What was found.
        found: &'static str,
    },
    /// Another user owns it, or group or others may write to it (`StrictModes`).
    Untrusted {
        /// Path, owner and mode, in words.
        detail: String,
        /// The command that fixes it.
        fix: String,
    },
    /// A lease claimed through the environment could not be proven (see the
    /// inheritance rule in the crate documentation).
    InheritedLease {
        /// Which check failed.
        why: String,
    },
}

impl PolicyReason {
    fn as_str(&self) -> &'static str {
        match self {
            PolicyReason::Missing => "missing",
            PolicyReason::SymbolicLink => "symbolic-link",
            PolicyReason::WrongKind { .. } => "wrong-kind",
            PolicyReason::PermissionDenied => "permission-denied",
            PolicyReason::UnsupportedFilesystem { .. } => "unsupported-filesystem",
            PolicyReason::Empty => "empty",
            PolicyReason::InTheWay { .. } => "in-the-way",
            PolicyReason::Untrusted { .. } => "untrusted",
            PolicyReason::InheritedLease { .. } => "inherited-lease",
        }
    }

    fn describe(&self) -> String {
        match self {
            PolicyReason::Missing => "it does not exist".into(),
            PolicyReason::SymbolicLink => "it is a symbolic link".into(),
            PolicyReason::WrongKind { found } => format!("it is {found}"),
            PolicyReason::PermissionDenied => "permission denied".into(),
            PolicyReason::UnsupportedFilesystem { filesystem } => {
                format!("it is on a `{filesystem}` filesystem, where advisory locks do not work dependably")
            }
            PolicyReason::Empty => "the path is empty".into(),
            PolicyReason::Untrusted { detail, .. } => {
                format!("another user could change it: {detail}")
            }
            PolicyReason::InTheWay { found } => {
                format!("it is {found} where the lock keeps its own temporary files")
            }
            PolicyReason::InheritedLease { why } => {
                format!("an inherited lease was claimed but not proven: {why}")
            }
        }
    }
}

/// Everything that can go wrong while taking, holding or releasing the lock.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The operation name is not `[a-z0-9][a-z0-9._-]*` (at most 64 bytes).
    #[error("operation name `{operation}` is invalid: use lowercase letters, digits, `.` and `-`, starting with a letter or digit (the SDK's rule)")]
    InvalidOperation {
        /// The rejected name.
        operation: String,
    },

    /// Another operation holds the workspace, or the lock could not be judged safely.
    #[error("workspace `{}` is busy: {}", workspace.display(), busy_text(.reason, .holder.as_deref(), *.waited))]
    Busy {
        /// The canonical workspace root.
        workspace: PathBuf,
        /// Why it counts as busy.
        reason: BusyReason,
        /// Who holds it, as far as the record tells (boxed: it is large).
        holder: Option<Box<Holder>>,
        /// How long we waited before giving up (`None`: failed fast).
        waited: Option<Duration>,
    },

    /// A path failed a safety rule; nothing was followed, written or removed.
    #[error("refusing to lock at `{}`: {}", path.display(), reason.describe())]
    PolicyDenied {
        /// The offending path.
        path: PathBuf,
        /// What is wrong with it.
        reason: PolicyReason,
        /// The underlying system error, if any.
        #[source]
        source: Option<io::Error>,
    },

    /// Cancellation fired before the lock was taken; nothing was left behind.
    #[error("taking the workspace lock on `{}` for `{operation}` was cancelled", workspace.display())]
    Cancelled {
        /// The workspace root.
        workspace: PathBuf,
        /// The operation that was waiting.
        operation: String,
    },

    /// The lock record was deleted, replaced or rewritten behind its holder's back.
    #[error("the workspace lock record `{}` was {what} while `{operation}` held it", path.display())]
    Compromised {
        /// The record path.
        path: PathBuf,
        /// The holder's operation.
        operation: String,
        /// `deleted`, `replaced by another file` or `modified`.
        what: &'static str,
    },

    /// A system call failed.
    #[error("cannot {action} `{}`", path.display())]
    Io {
        /// What we were doing (`read the lock record`).
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The system error.
        #[source]
        source: io::Error,
    },
}

fn busy_text(reason: &BusyReason, holder: Option<&Holder>, waited: Option<Duration>) -> String {
    let who = holder.map(|h| h.to_string());
    let mut text = match reason {
        BusyReason::Locked | BusyReason::SameProcess | BusyReason::RecordAppeared => match &who {
            Some(who) => format!("held by {who}"),
            None => "held by another process that has not published its record yet".into(),
        },
        BusyReason::OwnerAlive => format!(
            "held by {} (a lock written without an advisory lock, e.g. by the JavaScript SDK; its owner is alive)",
            who.unwrap_or_else(|| "another process".into())
        ),
        BusyReason::OwnerAliveWithoutLock => format!(
            "the record names {}, which is alive although it holds no advisory lock; a live owner is never displaced",
            who.unwrap_or_else(|| "another process".into())
        ),
        BusyReason::OwnerUndeterminable => format!(
            "the record names {}, and whether it is alive cannot be determined",
            who.unwrap_or_else(|| "another process".into())
        ),
        BusyReason::ForeignHost { hostname } => format!(
            "held by {} on another host; a lock from another host is never broken automatically",
            who.unwrap_or_else(|| format!("a process on host `{hostname}`"))
        ),
        BusyReason::UnreadableRecord { problem } => {
            format!("the lock record is {problem}; it was left untouched")
        }
        BusyReason::OtherScope { scope } => format!(
            "the lock record belongs to another workspace (`{scope}`); it was left untouched"
        ),
        BusyReason::NestedActive { parent, active } => format!(
            "the nested operation `{active}` is still active under `{parent}` (one child per parent)"
        ),
    };
    if let Some(waited) = waited {
        text.push_str(&format!(
            " (gave up after waiting {})",
            crate::holder::human_duration(waited)
        ));
    }
    text
}

impl Diagnostic for Error {
    fn code(&self) -> &'static str {
        match self {
            Error::InvalidOperation { .. } => codes::ARCANE_USAGE,
            Error::Busy { .. } => codes::ARCANE_WORKSPACE_BUSY,
            Error::PolicyDenied { .. } => codes::ARCANE_POLICY_DENIED,
            Error::Cancelled { .. } => codes::ARCANE_CANCELLED,
            Error::Compromised { .. } => codes::ARCANE_LOCK_COMPROMISED,
            Error::Io { .. } => codes::ARCANE_IO,
        }
    }

    fn details(&self) -> Value {
        match self {
            Error::InvalidOperation { operation } => json!({"operation": operation}),
            Error::Busy {
                workspace,
                reason,
                holder,
                waited,
            } => {
                let mut details = json!({
                    "workspace": workspace,
                    "reason": reason.name(),
                    "holder": holder.as_deref().map(Holder::to_json),
                    "waitedMilliseconds": waited.map(|w| w.as_millis() as u64),
                });
                match reason {
                    BusyReason::ForeignHost { hostname } => details["hostname"] = json!(hostname),
                    BusyReason::UnreadableRecord { problem } => details["problem"] = json!(problem),
                    BusyReason::OtherScope { scope } => details["scope"] = json!(scope),
                    BusyReason::NestedActive { parent, active } => {
                        details["parent"] = json!(parent);
                        details["active"] = json!(active);
                    }
                    _ => {}
                }
                details
            }
            Error::PolicyDenied { path, reason, .. } => {
                let mut details = json!({"path": path, "reason": reason.as_str()});
                if let PolicyReason::UnsupportedFilesystem { filesystem } = reason {
                    details["filesystem"] = json!(filesystem);
                }
                details
            }
            Error::Cancelled {
                workspace,
                operation,
            } => json!({"workspace": workspace, "operation": operation}),
            Error::Compromised {
                path,
                operation,
                what,
            } => json!({"path": path, "operation": operation, "what": what}),
            Error::Io {
                action,
                path,
                source,
            } => json!({"action": action, "path": path, "errno": source.raw_os_error()}),
        }
    }

    fn hints(&self) -> Vec<String> {
        match self {
            Error::Busy { reason, waited, .. } => match reason {
                BusyReason::UnreadableRecord { .. } | BusyReason::OtherScope { .. } => vec![
                    "inspect the record; `arcane lock recover --quarantine-unreadable` moves it aside (its bytes are kept) when no Arcane process holds the lock".into(),
                ],
                BusyReason::ForeignHost { hostname } => vec![format!(
                    "if host `{hostname}` no longer uses this workspace, run `arcane lock recover --break-foreign-host {hostname}`"
                )],
                BusyReason::NestedActive { .. } => {
                    vec!["finish or release the active nested lease first".into()]
                }
                // Neutral on purpose: only the caller knows whether its command has a
                // flag that waits longer (`arcane lock run --wait`), so it adds that hint.
                _ if waited.is_none() => vec![
                    "wait for the holder to finish, then try again (`arcane lock status` shows it)".into(),
                ],
                _ => vec![
                    "check what the holder is doing (`arcane lock status` shows it), then try again".into(),
                ],
            },
            Error::PolicyDenied { reason, .. } => match reason {
                PolicyReason::UnsupportedFilesystem { .. } => vec![
                    "put the workspace on a local filesystem (ext4, xfs, btrfs, tmpfs, APFS)".into(),
                ],
                PolicyReason::PermissionDenied => {
                    vec!["check the owner and mode of the workspace and its `.arcane` directory".into()]
                }
                PolicyReason::Missing => vec!["create the workspace directory first".into()],
                PolicyReason::Untrusted { fix, .. } => vec![fix.clone()],
                PolicyReason::InTheWay { .. } => vec![
                    "nothing of Arcane's is there: inspect it, move it elsewhere, and run the command again".into(),
                ],
                PolicyReason::InheritedLease { .. } => vec![format!(
                    "run nested operations as the command of `arcane lock run`, which passes the locked descriptor; unset `{}` otherwise",
                    crate::inherit::LEASE_VARIABLE
                )],
                _ => vec!["use a physical directory and remove the offending link or file by hand".into()],
            },
            _ => Vec::new(),
        }
    }
}

impl Error {
    pub(crate) fn busy(
        workspace: impl Into<PathBuf>,
        reason: BusyReason,
        holder: Option<Holder>,
    ) -> Self {
        Error::Busy {
            workspace: workspace.into(),
            reason,
            holder: holder.map(Box::new),
            waited: None,
        }
    }

    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn policy(
        path: impl Into<PathBuf>,
        reason: PolicyReason,
        source: Option<io::Error>,
    ) -> Self {
        Error::PolicyDenied {
            path: path.into(),
            reason,
            source,
        }
    }

    /// Whether this is `ARCANE_WORKSPACE_BUSY`.
    pub fn is_busy(&self) -> bool {
        matches!(self, Error::Busy { .. })
    }

    /// Whether this is `ARCANE_CANCELLED`.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Error::Cancelled { .. })
    }

    /// Whether the workspace directory does not exist.
    pub fn is_missing(&self) -> bool {
        matches!(
            self,
            Error::PolicyDenied {
                reason: PolicyReason::Missing,
                ..
            }
        )
    }

    /// Whether this is a refusal of the path or lease (`ARCANE_POLICY_DENIED`).
    pub fn is_policy_denied(&self) -> bool {
        matches!(self, Error::PolicyDenied { .. })
    }
}
