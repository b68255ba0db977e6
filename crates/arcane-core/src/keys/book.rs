//! The running host's view of the keys file: which presented key is which
//! [`Principal`], kept in step with the file without a restart.
//!
//! Each lookup compares the file's identity (device, inode, size, times: one `stat`)
//! with the one it was read at and rereads it when it changed, so `arcane token add`
//! works on the next request and `arcane token revoke` refuses the key on its next
//! request. The front door also polls [`KeyBook::refresh`] to close the connections
//! and streams a revoked key holds.
//!
//! A keys file Arcane may not trust (another user's, readable by others, a link) or
//! cannot parse admits no key at all: failing closed, the workspace token still works
//! and `arcane token list` says what is wrong.
//!
//! When each key was last used is kept in memory and written to
//! `.arcane/keys-used.json` by [`KeyBook::flush_used`], which the front door calls from
//! its poll: never on a request's path.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use arcane_files::FileIdentity;

use super::{key_hash, store, Principal};

/// The keys in force, as read from the file at `version`.
#[derive(Default)]
struct Loaded {
    version: Option<FileIdentity>,
    by_hash: HashMap<String, Principal>,
}

/// When keys were last used, not yet written.
#[derive(Default)]
struct Used {
    times: BTreeMap<String, SystemTime>,
    dirty: bool,
}

/// The host's application keys, reread when the keys file changes.
pub struct KeyBook {
    file: PathBuf,
    used_file: PathBuf,
    loaded: RwLock<Loaded>,
    used: Mutex<Used>,
}

impl KeyBook {
    /// The keys of `workspace` (`.arcane/keys.json`), read now.
    pub fn new(workspace: &Path) -> Self {
        let book = Self {
            file: store::path(workspace),
            used_file: arcane_workspace::layout::keys_used_file(workspace),
            loaded: RwLock::new(Loaded::default()),
            used: Mutex::new(Used {
                // What earlier hosts wrote down: kept, and written again with the rest.
                times: store::last_used(workspace)
                    .into_iter()
                    .filter_map(|(name, time)| {
                        Some((name, arcane_report::time::parse_rfc3339(&time)?))
                    })
                    .collect(),
                dirty: false,
            }),
        };
        book.reload();
        book
    }

    fn identity(&self) -> Option<FileIdentity> {
        std::fs::symlink_metadata(&self.file)
            .ok()
            .map(|meta| FileIdentity::of(&meta))
    }

    /// Rereads the file when it changed since it was read; whether it did.
    pub fn refresh(&self) -> bool {
        let now = self.identity();
        let current = self.loaded.read().unwrap_or_else(|p| p.into_inner());
        if current.version == now {
            return false;
        }
        drop(current);
        self.reload();
        true
    }

    fn reload(&self) {
        let version = self.identity();
        // Untrusted or unreadable: no key is admitted (the workspace token still is).
        let records = store::read_file(&self.file).unwrap_or_default();
        let by_hash = records
            .into_iter()
            .map(|record| {
                let principal = Principal {
                    name: Arc::from(record.name.as_str()),
                    scope: record.scope,
                    priority: record.priority,
                    models: record.models.map(Arc::from),
                };
                (record.hash, principal)
            })
            .collect();
        *self.loaded.write().unwrap_or_else(|p| p.into_inner()) = Loaded { version, by_hash };
    }

    /// The principal of a presented key (`None`: no key in force is that one). Notes the
    /// use for [`KeyBook::flush_used`].
    pub fn principal(&self, presented: &str) -> Option<Principal> {
        if !presented.starts_with(store::KEY_PREFIX) {
            return None;
        }
        self.refresh();
        let hash = key_hash(presented);
        let principal = self
            .loaded
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_hash
            .get(&hash)
            .cloned()?;
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        used.times
            .insert(principal.name.to_string(), SystemTime::now());
        used.dirty = true;
        Some(principal)
    }

    /// The names of the keys in force.
    pub fn names(&self) -> HashSet<Arc<str>> {
        self.loaded
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_hash
            .values()
            .map(|p| Arc::clone(&p.name))
            .collect()
    }

    /// Writes when the keys in force were last used to `.arcane/keys-used.json`
    /// (atomically, 0600), when anything changed since the last write. Errors are
    /// dropped: the times are a convenience for `arcane token list`.
    pub fn flush_used(&self) {
        let times = {
            let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
            if !std::mem::take(&mut used.dirty) {
                return;
            }
            used.times.clone()
        };
        let known = self.names();
        let written: BTreeMap<String, String> = times
            .into_iter()
            .filter(|(name, _)| known.iter().any(|k| **k == **name))
            .map(|(name, time)| (name, arcane_report::time::format_rfc3339(time)))
            .collect();
        if let Ok(mut text) = serde_json::to_vec_pretty(&written) {
            text.push(b'\n');
            let _ = crate::endpoint::write_private_atomic(&self.used_file, &text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Priority, Scope};
    use super::*;

    #[test]
    fn an_added_key_works_and_a_revoked_one_stops_without_a_new_book() {
        let dir = tempfile::tempdir().unwrap();
        let book = KeyBook::new(dir.path());
        let made = store::add(dir.path(), "app", Scope::Inference, Priority::Low, None).unwrap();
        let principal = book.principal(&made.key).expect("the new key is admitted");
        assert_eq!(&*principal.name, "app");
        assert_eq!(principal.priority, Priority::Low);
        assert!(book.principal("arc_0000").is_none());
        assert!(book.principal(&made.key[..made.key.len() - 1]).is_none());
        store::revoke(dir.path(), "app").unwrap();
        assert!(book.principal(&made.key).is_none(), "revoked at once");
    }

    #[test]
    fn last_use_is_written_for_known_keys_only() {
        let dir = tempfile::tempdir().unwrap();
        let made = store::add(dir.path(), "app", Scope::Inference, Priority::Normal, None).unwrap();
        let book = KeyBook::new(dir.path());
        assert!(store::last_used(dir.path()).is_empty());
        book.principal(&made.key).unwrap();
        book.flush_used();
        let used = store::last_used(dir.path());
        assert_eq!(used.keys().collect::<Vec<_>>(), ["app"]);
        // A later host keeps what the earlier one wrote beside its own.
        let other = store::add(
            dir.path(),
            "other",
            Scope::Inference,
            Priority::Normal,
            None,
        )
        .unwrap();
        let later = KeyBook::new(dir.path());
        later.principal(&other.key).unwrap();
        later.flush_used();
        let now = store::last_used(dir.path());
        assert_eq!(now.keys().collect::<Vec<_>>(), ["app", "other"]);
        assert_eq!(now["app"], used["app"]);
    }
}
