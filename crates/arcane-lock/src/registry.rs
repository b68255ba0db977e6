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
use crate::sys::Identity;

fn table() -> MutexGuard<'static, HashMap<Identity, Holder>> {
    static TABLE: OnceLock<Mutex<HashMap<Identity, Holder>>> = OnceLock::new();
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

/// Reserves `identity` for `holder`, or returns the current holder.
pub(crate) fn reserve(identity: Identity, holder: Holder) -> Result<Reservation, Box<Holder>> {
    let mut table = table();
    if let Some(existing) = table.get(&identity) {
        return Err(Box::new(existing.clone()));
    }
    table.insert(identity, holder);
    Ok(Reservation { identity })
}

impl Reservation {
    /// Updates the holder description (once the nonce is known).
    pub(crate) fn update(&self, holder: Holder) {
        table().insert(self.identity, holder);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        table().remove(&self.identity);
    }
}
