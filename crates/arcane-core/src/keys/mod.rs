//! Application keys: one credential per application, each with what it may do.
//!
//! The workspace token (`arcane token show`) opens every door of the host: it is the
//! *admin* key, and handing it to each application gives each the power to unload
//! another's model, read every log and issue dashboard logins. An application key
//! (`arcane token add NAME`) is a second kind of credential with a name, a [`Scope`], a
//! [`Priority`] and, optionally, the only models it may use. The front door turns
//! whichever credential a request presents into a [`Principal`] at the one place it
//! checks credentials; everything after that (the scope check, the model check, the
//! admission queue, the metrics) reads the principal and never the key.
//!
//! * [`store`]: the keys file (`.arcane/keys.json`, 0600) that `arcane token
//!   add|list|revoke` change under the workspace lock. It holds each key's SHA-256,
//!   never the key: a key is printed once, when it is made.
//! * [`book`]: the running host's view of that file, reread when it changes (an add or
//!   a revoke takes effect on the next request, without a restart), and when each key
//!   was last used.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub mod book;
pub mod store;

pub use book::KeyBook;
pub use store::{KeyError, KeyRecord, NewKey};

/// What a key may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// The inference paths of every API (OpenAI, Anthropic, Ollama, speech, images) and
    /// the model listings: what an application needs to use models.
    Inference,
    /// Everything the workspace token may do: `arcane/1`, events, logs, metrics, the
    /// dashboard's login codes, loads and unloads, shutdown.
    Admin,
}

impl Scope {
    /// Its name, as `--scope` takes it and listings show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Inference => "inference",
            Self::Admin => "admin",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whose requests a model's queue serves first when several wait: every waiting request
/// of a higher priority goes before any of a lower one; within one priority the
/// waiting keys take turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Served after every `normal` and `high` request (batch jobs).
    Low,
    /// The default.
    Normal,
    /// Served before every `normal` and `low` request (an interactive application).
    High,
}

impl Priority {
    /// Every priority, highest first: the order a queue serves them in.
    pub const HIGHEST_FIRST: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    /// Its name, as `--priority` takes it and listings show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Normal => "normal",
            Self::High => "high",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name the workspace token's requests carry in metrics, logs and queues.
pub const WORKSPACE_PRINCIPAL: &str = "workspace";

/// Who a request comes from, as the front door established it: the workspace token's
/// admin principal, or an application key's name, scope, priority and models.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The key's name ([`WORKSPACE_PRINCIPAL`] for the workspace token).
    pub name: Arc<str>,
    /// What it may call.
    pub scope: Scope,
    /// Its place in a model's queue.
    pub priority: Priority,
    /// The only models (ids) it may use; `None`: every model.
    pub models: Option<Arc<[String]>>,
}

impl Principal {
    /// The workspace token's principal: admin, normal priority, every model.
    pub fn workspace() -> Self {
        Self {
            name: Arc::from(WORKSPACE_PRINCIPAL),
            scope: Scope::Admin,
            priority: Priority::Normal,
            models: None,
        }
    }

    /// Whether it may call everything (the admin scope).
    pub fn is_admin(&self) -> bool {
        self.scope == Scope::Admin
    }

    /// Whether it may use the model `id` (an alias is resolved to its id first).
    pub fn may_use(&self, id: &str) -> bool {
        self.models
            .as_ref()
            .is_none_or(|models| models.iter().any(|m| m == id))
    }
}

impl Default for Principal {
    fn default() -> Self {
        Self::workspace()
    }
}

/// The SHA-256 of a presented key, as the keys file stores it (`sha256:<hex>`).
///
/// A plain hash (no salt, no slow function) is enough: a key is 32 random bytes, so
/// there is nothing to guess, and the hash only has to keep a copied keys file from
/// being a list of working keys. One short input hashed at once, on each request that
/// presents a key: not the streaming loop of `arcane_files::stream_sha256` (which
/// allocates a read buffer).
pub fn key_hash(key: &str) -> String {
    use sha2::{Digest, Sha256};
    format!("sha256:{}", hex::encode(Sha256::digest(key.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_order_highest_first() {
        assert!(Priority::High > Priority::Normal && Priority::Normal > Priority::Low);
        let mut sorted = Priority::HIGHEST_FIRST;
        sorted.sort();
        sorted.reverse();
        assert_eq!(sorted, Priority::HIGHEST_FIRST);
    }

    #[test]
    fn a_restricted_principal_uses_only_its_models() {
        let mut principal = Principal::workspace();
        assert!(principal.may_use("anything"));
        principal.models = Some(Arc::from(vec!["smol".to_string()]));
        assert!(principal.may_use("smol"));
        assert!(!principal.may_use("smol2"));
    }

    #[test]
    fn hashes_name_their_function_and_differ_by_key() {
        let a = key_hash("arc_aaaa");
        assert!(a.starts_with("sha256:") && a.len() == 71, "{a}");
        assert_ne!(a, key_hash("arc_aaab"));
        assert_eq!(a, key_hash("arc_aaaa"));
    }
}
