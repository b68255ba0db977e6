//! The workspace layout: `<root>/.arcane` and everything Arcane keeps in it.
//!
//! ```text
//! <root>/.arcane/                      mode 0700
//!   workspace-operation.lock           the operation lock's flock sentinel (never removed)
//!   workspace-operation.lock.json      its record (the JavaScript SDK's schema 1)
//!   core.lock                          the Core host's owner lease (flock sentinel)
//!   core.json                          how to reach the running host (0600: holds the token)
//!   core-token                         the workspace's bearer token, kept across restarts (0600)
//!   core-port.json                     the host's stable port, chosen once
//!   registry.json                      registered runtimes and models
//!   runtimes/<engine>/<version>/       installed runtimes
//!   models/<id>/<file>                 registered model files
//!   models/<engine>/                   an engine's own model store (router mode, Ollama)
//!   engines/<id>.json                  ownership records of engines Arcane started
//!   <kind>-workers/<pid>.json          ownership records of a worker kind's workers a host
//!                                      started (`crate::worker_records`)
//! ```
//!
//! Functions take the workspace root and return full paths; the `*_NAME` constants are
//! the bare names for code that opens files relative to a directory descriptor.

use std::ffi::CStr;
use std::path::{Path, PathBuf};

/// The state directory's name under the workspace root.
pub const STATE_DIR: &str = ".arcane";
/// [`STATE_DIR`] for `*at` system calls.
pub const STATE_DIR_C: &CStr = c".arcane";
/// The operation lock's sentinel, inside [`STATE_DIR`].
pub const LOCK_SENTINEL_NAME: &CStr = c"workspace-operation.lock";
/// The operation lock's record, inside [`STATE_DIR`].
pub const LOCK_RECORD_NAME: &CStr = c"workspace-operation.lock.json";
/// Arcane's own facts about the operation lock's holder (beside the record, which keeps
/// exactly the SDK's schema), inside [`STATE_DIR`].
pub const LOCK_FACTS_NAME: &CStr = c"workspace-operation.lock.arcane.json";
/// The Core host's owner-lease role (its sentinel is `<role>.lock`).
pub const CORE_OWNER_ROLE: &str = "core";

/// `<root>/.arcane`.
pub fn state_dir(root: &Path) -> PathBuf {
    root.join(STATE_DIR)
}

/// `<root>/.arcane/<name>`, for a name given as one of the `*_NAME` constants.
pub fn state_file(root: &Path, name: &CStr) -> PathBuf {
    state_dir(root).join(name.to_string_lossy().as_ref())
}

/// `<root>/.arcane/workspace-operation.lock.json`.
pub fn lock_record(root: &Path) -> PathBuf {
    state_file(root, LOCK_RECORD_NAME)
}

/// The sentinel of an owner-lease `role`: `<root>/.arcane/<role>.lock`.
pub fn owner_sentinel(root: &Path, role: &str) -> PathBuf {
    state_dir(root).join(format!("{role}.lock"))
}

/// `<root>/.arcane/core.lock`: the Core host's owner lease.
pub fn core_lock(root: &Path) -> PathBuf {
    owner_sentinel(root, CORE_OWNER_ROLE)
}

/// `<root>/.arcane/core.json`: the running host's endpoint and token.
pub fn core_endpoint(root: &Path) -> PathBuf {
    state_dir(root).join("core.json")
}

/// `<root>/.arcane/core-token`: the workspace's bearer token (0600), kept across
/// restarts so a configured client keeps working.
pub fn core_token(root: &Path) -> PathBuf {
    state_dir(root).join("core-token")
}

/// `<root>/.arcane/keys.json`: the applications' keys (names, scopes, priorities, models
/// and the SHA-256 of each key, never a key), mode 0600.
pub fn keys_file(root: &Path) -> PathBuf {
    state_dir(root).join("keys.json")
}

/// `<root>/.arcane/keys-used.json`: when the running host last saw each application key,
/// written by the host (mode 0600).
pub fn keys_used_file(root: &Path) -> PathBuf {
    state_dir(root).join("keys-used.json")
}

/// `<root>/.arcane/core-port.json`: the host's saved port.
pub fn core_port(root: &Path) -> PathBuf {
    state_dir(root).join("core-port.json")
}

/// `<root>/.arcane/registry.json`.
pub fn registry_file(root: &Path) -> PathBuf {
    state_dir(root).join("registry.json")
}

/// `<root>/.arcane/runtimes`.
pub fn runtimes_dir(root: &Path) -> PathBuf {
    state_dir(root).join("runtimes")
}

/// `<root>/.arcane/models`.
pub fn models_dir(root: &Path) -> PathBuf {
    state_dir(root).join("models")
}

/// `<root>/.arcane/models/<engine>`: an engine's own model store.
pub fn engine_models_dir(root: &Path, engine: crate::Engine) -> PathBuf {
    models_dir(root).join(engine.as_str())
}

/// The name of the directory of engine ownership records, under `.arcane`.
pub const ENGINES_DIR_NAME: &str = "engines";

/// `<root>/.arcane/engines`.
pub fn engines_dir(root: &Path) -> PathBuf {
    records_dir(root, ENGINES_DIR_NAME)
}

/// `<root>/.arcane/engines/<id>.json`: the ownership record of engine `id`.
pub fn engine_record(root: &Path, id: &str) -> PathBuf {
    ownership_record(root, ENGINES_DIR_NAME, id)
}

/// `<root>/.arcane/<name>`: a directory of ownership records ([`ENGINES_DIR_NAME`], a
/// worker kind's [`crate::worker_records`]).
pub fn records_dir(root: &Path, name: &str) -> PathBuf {
    state_dir(root).join(name)
}

/// `<root>/.arcane/<name>/<key>.json`: the ownership record `key` (an engine id, a
/// worker pid) in the records directory `name`.
pub fn ownership_record(root: &Path, name: &str, key: &str) -> PathBuf {
    records_dir(root, name).join(format!("{key}.json"))
}

/// The name of the private run directory (mode 0700): engine sockets and keys.
pub const RUN_DIR_NAME: &str = "run";

/// `<root>/.arcane/run`: the private directory (mode 0700) of owned engines' sockets
/// and API keys; only this user can reach what is inside.
pub fn run_dir(root: &Path) -> PathBuf {
    state_dir(root).join(RUN_DIR_NAME)
}

/// `<root>/.arcane/run/<id>.sock`: the Unix socket owned engine `id` listens on
/// (llama-server takes a `--host` ending in `.sock` as a socket path).
pub fn engine_socket(root: &Path, id: &str) -> PathBuf {
    run_dir(root).join(format!("{id}.sock"))
}

/// `<root>/.arcane/run/<id>.key`: the API key file (mode 0600) of owned engine `id`
/// when it listens on a TCP port.
pub fn engine_key(root: &Path, id: &str) -> PathBuf {
    run_dir(root).join(format!("{id}.key"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_lives_under_the_state_directory() {
        let root = Path::new("/w");
        let state = Path::new("/w/.arcane");
        for path in [
            lock_record(root),
            core_lock(root),
            core_endpoint(root),
            core_port(root),
            registry_file(root),
            runtimes_dir(root),
            models_dir(root),
            engine_models_dir(root, crate::Engine::Ollama),
            engine_record(root, "llama.cpp"),
            records_dir(root, crate::worker_records::ONNX),
        ] {
            assert!(path.starts_with(state), "{}", path.display());
        }
        assert_eq!(core_lock(root), Path::new("/w/.arcane/core.lock"));
        assert_eq!(
            lock_record(root),
            Path::new("/w/.arcane/workspace-operation.lock.json")
        );
        assert_eq!(
            engine_record(root, "llama.cpp"),
            Path::new("/w/.arcane/engines/llama.cpp.json")
        );
        assert_eq!(
            ownership_record(root, crate::worker_records::ONNX, "42"),
            Path::new("/w/.arcane/onnx-workers/42.json")
        );
        assert_eq!(STATE_DIR_C.to_str().unwrap(), STATE_DIR);
    }
}
