//! The keys file, `.arcane/keys.json` (mode 0600): one record per application key.
//!
//! ```json
//! {"version": 1, "keys": [{"name": "chat-app", "hash": "sha256:…", "scope": "inference",
//!   "priority": "normal", "models": ["smol"], "created": "2026-12-07T13:00:00.000Z"}]}
//! ```
//!
//! Changes ([`add`], [`revoke`]) hold the workspace operation lock, reread the file
//! inside it and replace it atomically (a temporary name, then a rename), so two
//! `arcane token add` at once both land and a reader never sees half a file. The file
//! is a secret's fingerprint list: one that another user owns, or that others may read
//! or write, is refused like the token file. When each key was last used is the host's
//! to write, in a file of its own ([`super::book`]), so a request never rewrites this
//! one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arcane_report::{codes, Diagnostic};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{key_hash, Priority, Scope, WORKSPACE_PRINCIPAL};

/// The largest keys file read (a few thousand keys).
const MAX_FILE: u64 = 4 << 20;

/// The format version written.
const VERSION: u32 = 1;

/// What a key starts with, so a leaked one is recognisable (secret scanners, logs).
pub const KEY_PREFIX: &str = "arc_";

/// One application key as the file keeps it (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// Its name (`[a-z0-9][a-z0-9._-]*`, at most 64 characters).
    pub name: String,
    /// `sha256:<hex>` of the key ([`key_hash`]).
    pub hash: String,
    /// What it may call.
    pub scope: Scope,
    /// Its place in a model's queue.
    pub priority: Priority,
    /// The only models it may use (`None`: every model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// When it was made (RFC 3339, UTC).
    pub created: String,
}

impl KeyRecord {
    /// The record as `arcane token list` shows it: everything but the hash.
    pub fn public_json(&self, last_used: Option<&str>) -> Value {
        json!({
            "name": self.name,
            "scope": self.scope,
            "priority": self.priority,
            "models": self.models,
            "created": self.created,
            "lastUsed": last_used,
        })
    }
}

/// A key just made: its record and the key, which is never stored or shown again.
#[derive(Debug, Clone)]
pub struct NewKey {
    /// What the file keeps.
    pub record: KeyRecord,
    /// The key itself (`arc_` and 64 hex digits).
    pub key: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Document {
    version: u32,
    keys: Vec<KeyRecord>,
}

/// Why a key could not be added, listed or revoked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The name breaks the naming rule.
    #[error("`{name}` is not a valid key name: {why}")]
    InvalidName {
        /// The name given.
        name: String,
        /// Which rule it breaks.
        why: &'static str,
    },
    /// A key of that name exists.
    #[error("a key named `{name}` already exists")]
    Exists {
        /// The name given.
        name: String,
    },
    /// No key has that name.
    #[error("no key is named `{name}`")]
    Unknown {
        /// The name given.
        name: String,
        /// The names there are.
        known: Vec<String>,
    },
    /// `--models` named no model, or an empty name.
    #[error("`--models` must name one or more model ids, separated by commas")]
    NoModels,
    /// The keys file is not one Arcane may trust or read.
    #[error("the keys file `{path}` {why}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the fix.
        why: String,
    },
    /// Reading or writing failed.
    #[error("cannot {operation} `{path}`")]
    Io {
        /// What was being done.
        operation: &'static str,
        /// The file.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The workspace operation lock could not be taken.
    #[error("cannot change the keys file")]
    Lock(#[from] arcane_lock::Error),
}

impl Diagnostic for KeyError {
    fn code(&self) -> &'static str {
        match self {
            Self::InvalidName { .. } | Self::NoModels => codes::ARCANE_USAGE,
            Self::Exists { .. } => codes::ARCANE_ALREADY_EXISTS,
            Self::Unknown { .. } => codes::ARCANE_NOT_FOUND,
            Self::BadFile { .. } => codes::ARCANE_POLICY_DENIED,
            Self::Io { .. } => codes::ARCANE_IO,
            Self::Lock(error) => error.code(),
        }
    }

    fn details(&self) -> Value {
        match self {
            Self::InvalidName { name, why } => json!({"name": name, "reason": why}),
            Self::Exists { name } => json!({"name": name}),
            Self::Unknown { name, known } => json!({"name": name, "known": known}),
            Self::NoModels => json!({"option": "--models"}),
            Self::BadFile { path, .. } | Self::Io { path, .. } => json!({"path": path}),
            Self::Lock(error) => error.details(),
        }
    }

    fn hints(&self) -> Vec<String> {
        match self {
            Self::Exists { name } => vec![format!(
                "revoke it first (`arcane token revoke {name}`), or choose another name"
            )],
            Self::Unknown { .. } => vec!["`arcane token list` shows the keys there are".into()],
            Self::Lock(error) => error.hints(),
            _ => Vec::new(),
        }
    }
}

/// Checks a key name: `[a-z0-9][a-z0-9._-]*`, 64 characters at most, not `workspace`
/// (the workspace token's name in metrics and logs).
pub fn check_name(name: &str) -> Result<(), KeyError> {
    let invalid = |why| {
        Err(KeyError::InvalidName {
            name: name.to_string(),
            why,
        })
    };
    let first_ok = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !first_ok {
        return invalid("it must start with a lowercase letter or a digit");
    }
    if name.len() > 64 {
        return invalid("it must be 64 characters or fewer");
    }
    let allowed = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b);
    if !name.bytes().all(allowed) {
        return invalid("only lowercase letters, digits, `.`, `_` and `-` are allowed");
    }
    if name == WORKSPACE_PRINCIPAL {
        return invalid("`workspace` names the workspace token");
    }
    Ok(())
}

/// The path of the keys file.
pub fn path(workspace: &Path) -> PathBuf {
    arcane_workspace::layout::keys_file(workspace)
}

/// Every key of the workspace, oldest first (none when there is no keys file).
pub fn list(workspace: &Path) -> Result<Vec<KeyRecord>, KeyError> {
    read_file(&path(workspace))
}

/// Reads a keys file: empty when it does not exist; refused when another user owns it,
/// others may read or write it, or it is not a regular file (a symbolic link included).
pub fn read_file(path: &Path) -> Result<Vec<KeyRecord>, KeyError> {
    let bad = |why: String| KeyError::BadFile {
        path: path.to_path_buf(),
        why,
    };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(KeyError::Io {
                operation: "inspect",
                path: path.to_path_buf(),
                source,
            })
        }
    };
    if !meta.is_file() {
        return Err(bad(format!(
            "is {}, not a regular file",
            arcane_files::describe_kind(&meta)
        )));
    }
    if let Some(problem) = arcane_files::trust::secret_file_problem(path, &meta) {
        return Err(bad(problem));
    }
    let bytes = arcane_files::read_regular(path, MAX_FILE).map_err(|source| KeyError::Io {
        operation: "read",
        path: path.to_path_buf(),
        source,
    })?;
    let document: Document = serde_json::from_slice(&bytes)
        .map_err(|error| bad(format!("is not a keys file Arcane wrote: {error}")))?;
    Ok(document.keys)
}

fn write_file(path: &Path, keys: Vec<KeyRecord>) -> Result<(), KeyError> {
    let document = Document {
        version: VERSION,
        keys,
    };
    let mut text = serde_json::to_vec_pretty(&document).unwrap_or_default();
    text.push(b'\n');
    crate::endpoint::write_private_atomic(path, &text).map_err(|error| KeyError::Io {
        operation: "write",
        path: path.to_path_buf(),
        source: std::io::Error::other(error.to_string()),
    })
}

/// Runs `change` on the workspace's keys under the operation lock (as `operation`),
/// writing what it returns.
fn locked<T>(
    workspace: &Path,
    operation: &'static str,
    change: impl FnOnce(&mut Vec<KeyRecord>) -> Result<T, KeyError>,
) -> Result<T, KeyError> {
    let options = arcane_lock::AcquireOptions::new(operation)?;
    let lock = arcane_lock::WorkspaceLock::acquire(workspace, &options, &arcane_report::NullSink)?;
    let file = path(workspace);
    let result = read_file(&file).and_then(|mut keys| {
        let value = change(&mut keys)?;
        write_file(&file, keys)?;
        Ok(value)
    });
    let released = lock.release();
    let value = result?;
    released?;
    Ok(value)
}

/// Makes a key named `name` and records it; the key is in the result and nowhere else.
pub fn add(
    workspace: &Path,
    name: &str,
    scope: Scope,
    priority: Priority,
    models: Option<Vec<String>>,
) -> Result<NewKey, KeyError> {
    check_name(name)?;
    if models
        .as_ref()
        .is_some_and(|m| m.is_empty() || m.iter().any(|id| id.trim().is_empty()))
    {
        return Err(KeyError::NoModels);
    }
    let secret = arcane_files::secret_hex(32).map_err(|source| KeyError::Io {
        operation: "read random bytes for",
        path: "the key".into(),
        source,
    })?;
    let key = format!("{KEY_PREFIX}{secret}");
    let record = KeyRecord {
        name: name.to_string(),
        hash: key_hash(&key),
        scope,
        priority,
        models,
        created: arcane_report::time::now_rfc3339(),
    };
    let kept = record.clone();
    locked(workspace, "token-add", move |keys| {
        if keys.iter().any(|k| k.name == kept.name) {
            return Err(KeyError::Exists { name: kept.name });
        }
        keys.push(kept);
        Ok(())
    })?;
    Ok(NewKey { record, key })
}

/// Removes the key named `name` (a running host refuses it from its next request on and
/// closes its connections) and returns its record.
pub fn revoke(workspace: &Path, name: &str) -> Result<KeyRecord, KeyError> {
    locked(workspace, "token-revoke", |keys| {
        match keys.iter().position(|k| k.name == name) {
            Some(index) => Ok(keys.remove(index)),
            None => Err(KeyError::Unknown {
                name: name.to_string(),
                known: keys.iter().map(|k| k.name.clone()).collect(),
            }),
        }
    })
}

/// When the host last saw each key (name → RFC 3339), as far as it has written down
/// (at most a few seconds behind); empty when it never has.
pub fn last_used(workspace: &Path) -> BTreeMap<String, String> {
    let file = arcane_workspace::layout::keys_used_file(workspace);
    arcane_files::read_regular(&file, MAX_FILE)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rule() {
        for good in ["chat-app", "a", "app.v2_x", "0day"] {
            check_name(good).unwrap();
        }
        for bad in ["", "-x", "Chat", "a b", "workspace", &"x".repeat(65), "é"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn add_list_revoke_keep_only_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let made = add(dir.path(), "chat", Scope::Inference, Priority::High, None).unwrap();
        assert!(made.key.starts_with(KEY_PREFIX) && made.key.len() == 4 + 64);
        let text = std::fs::read_to_string(path(dir.path())).unwrap();
        assert!(!text.contains(&made.key), "the key itself is never stored");
        assert!(text.contains(&key_hash(&made.key)));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path(dir.path()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = add(dir.path(), "chat", Scope::Admin, Priority::Low, None).unwrap_err();
        assert_eq!(again.code(), codes::ARCANE_ALREADY_EXISTS);
        add(
            dir.path(),
            "batch",
            Scope::Inference,
            Priority::Low,
            Some(vec!["smol".into()]),
        )
        .unwrap();
        let names: Vec<_> = list(dir.path())
            .unwrap()
            .into_iter()
            .map(|k| k.name)
            .collect();
        assert_eq!(names, ["chat", "batch"]);
        assert_eq!(revoke(dir.path(), "chat").unwrap().priority, Priority::High);
        let unknown = revoke(dir.path(), "chat").unwrap_err();
        assert_eq!(unknown.code(), codes::ARCANE_NOT_FOUND);
        assert_eq!(unknown.details()["known"], json!(["batch"]));
    }

    #[test]
    fn a_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        add(dir.path(), "chat", Scope::Inference, Priority::Normal, None).unwrap();
        let file = path(dir.path());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let refused = list(dir.path()).unwrap_err();
        assert_eq!(refused.code(), codes::ARCANE_POLICY_DENIED);
        assert!(refused.to_string().contains("chmod 600"), "{refused}");
    }

    #[test]
    fn a_symlinked_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        add(
            other.path(),
            "chat",
            Scope::Inference,
            Priority::Normal,
            None,
        )
        .unwrap();
        std::fs::create_dir_all(path(dir.path()).parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(path(other.path()), path(dir.path())).unwrap();
        let refused = list(dir.path()).unwrap_err();
        assert_eq!(refused.code(), codes::ARCANE_POLICY_DENIED, "{refused}");
    }

    #[test]
    fn empty_models_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let refused = add(
            dir.path(),
            "x",
            Scope::Inference,
            Priority::Normal,
            Some(vec![]),
        )
        .unwrap_err();
        assert_eq!(refused.code(), codes::ARCANE_USAGE);
    }
}
