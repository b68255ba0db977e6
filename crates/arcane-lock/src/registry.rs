//! The in-process registry: at most one root lease per workspace per process.
//!
//! `flock` already excludes two descriptors of one process from each other, but the
//! registry answers first, without touching the filesystem, and knows the in-process
//! holder's operation for the busy message. It is keyed by the workspace directory's
//! `(dev, ino)`, so two spellings of one directory (a linked ancestor, a bind mount)
//! are one workspace (lock-spec.md W8).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::holder::Holder;
use crate::sys::{self, Identity};

/// What the registry knows of an in-process holder: enough to describe it.
#[derive(Debug, Clone)]
struct Entry {
    operation: String,
    since: Option<String>,
    nonce: Option<String>,
}

impl Entry {
    /// The holder as a busy message names it (this process).
    fn holder(&self) -> Holder {
        Holder {
            pid: Some(i64::from(sys::own_pid())),
            hostname: Some(sys::hostname().to_string()),
            command: sys::own_command().map(str::to_string),
            operation: Some(self.operation.clone()),
            since: self.since.clone(),
            nonce: self.nonce.clone(),
            advisory_lock: true,
            alive: Some(true),
            ..Holder::default()
        }
    }
}

fn table() -> MutexGuard<'static, HashMap<Identity, Entry>> {
    static TABLE: OnceLock<Mutex<HashMap<Identity, Entry>>> = OnceLock::new();
    let mutex = TABLE.get_or_init(Default::default);
    // A panic while holding this mutex cannot leave the map inconsistent (single
    // insert/remove), so a poisoned lock is still usable.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A reserved registry slot; removing it on drop.
#[derive(Debug)]
pub(crate) struct Reservation {
    identity: Identity,
}

/// Reserves `identity` for `operation` (since `since`, when known), or returns the
/// current holder.
pub(crate) fn reserve(
    identity: Identity,
    operation: &str,
    since: Option<&str>,
) -> Result<Reservation, Box<Holder>> {
    let mut table = table();
    if let Some(existing) = table.get(&identity) {
        return Err(Box::new(existing.holder()));
    }
    table.insert(
        identity,
        Entry {
            operation: operation.to_string(),
            since: since.map(str::to_string),
            nonce: None,
        },
    );
    Ok(Reservation { identity })
}

impl Reservation {
    /// Records when the lease was taken and its nonce, once known.
    pub(crate) fn update(&self, since: &str, nonce: &str) {
        if let Some(entry) = table().get_mut(&self.identity) {
            entry.since = Some(since.to_string());
            entry.nonce = Some(nonce.to_string());
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        table().remove(&self.identity);
    }
}
