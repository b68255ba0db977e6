//! The host's files in the workspace's `.arcane/`: who owns the workspace
//! (`core.lock`), where it listens (`core-port.json`, the stable port) and how to reach
//! it (`core.json`: URL, pid and a fresh token, mode 0600).
//!
//! # One owner per workspace
//!
//! The owner creates `core.lock` exclusively, holding `{pid, nonce, startedAt}`. A
//! second host finding the lock checks the recorded pid: alive (or undeterminable) →
//! [`Error::AlreadyRunning`] naming the running host's URL and pid from `core.json`;
//! absent (`ESRCH`) → the lock is stale and is removed, but only if a re-read shows
//! the same nonce, so two recovering hosts never both win. Staleness never depends on
//! time. The lock is removed when the [`OwnerLock`] drops.
//!
//! # The stable port
//!
//! The first host to bind saves its port in `core-port.json` (exclusive create); later
//! hosts bind that port again, and a busy saved port is [`Error::PortInUse`], never a
//! silent move, so clients' saved URLs stay valid.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::Error;

/// The directory under the workspace root holding Arcane's state.
pub const STATE_DIR: &str = ".arcane";

/// `core.json`: how clients reach the running host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointRecord {
    /// Always `arcane/1`.
    pub protocol: String,
    /// The base URL, e.g. `http://127.0.0.1:41234`.
    pub url: String,
    /// The loopback address.
    pub host: String,
    /// The port.
    pub port: u16,
    /// The host's process id.
    pub pid: u32,
    /// The bearer token (hex, 32 random bytes), new for every host lifetime.
    pub token: String,
    /// When the host started (RFC 3339 UTC).
    #[serde(rename = "startedAt")]
    pub started_at: String,
}

/// The path of `core.json` in `workspace`.
pub fn endpoint_path(workspace: &Path) -> PathBuf {
    workspace.join(STATE_DIR).join("core.json")
}

/// The path of the saved port in `workspace`.
pub fn port_path(workspace: &Path) -> PathBuf {
    workspace.join(STATE_DIR).join("core-port.json")
}

/// The path of the owner lock in `workspace`.
pub fn lock_path(workspace: &Path) -> PathBuf {
    workspace.join(STATE_DIR).join("core.lock")
}

fn io<'a>(operation: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::Io {
        operation,
        path: path.to_path_buf(),
        source,
    }
}

/// A fresh token: 32 random bytes from the OS, hex-encoded.
pub fn new_token() -> Result<String, Error> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(|e| Error::Io {
        operation: "read random bytes for",
        path: "the token".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Compares two secrets in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut difference = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for (i, byte) in a.iter().enumerate() {
        // Compare against `a` itself when `b` is shorter, so the loop length depends
        // only on the candidate's length.
        let other = b.get(i).copied().unwrap_or(!*byte);
        difference |= byte ^ other;
    }
    difference == 0
}

/// Writes `bytes` to `path` atomically with mode 0600: a temporary file in the same
/// directory, fsynced, renamed into place.
pub fn write_private_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let directory = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(directory).map_err(io("create", directory))?;
    let temporary = directory.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("record"),
        std::process::id()
    ));
    let result = (|| {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let _ = std::fs::remove_file(&temporary);
        let mut file = options.open(&temporary).map_err(io("create", &temporary))?;
        file.write_all(bytes).map_err(io("write", &temporary))?;
        file.sync_all().map_err(io("sync", &temporary))?;
        std::fs::rename(&temporary, path).map_err(io("rename into", path))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
}

/// Writes `core.json` (mode 0600, atomically).
pub fn write_endpoint(workspace: &Path, record: &EndpointRecord) -> Result<PathBuf, Error> {
    let path = endpoint_path(workspace);
    let mut text = serde_json::to_vec_pretty(record).unwrap_or_default();
    text.push(b'\n');
    write_private_atomic(&path, &text)?;
    Ok(path)
}

/// Reads `core.json`; `Ok(None)` when it does not exist.
pub fn read_endpoint(workspace: &Path) -> Result<Option<EndpointRecord>, Error> {
    let path = endpoint_path(workspace);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(Error::Io {
                operation: "read",
                path,
                source,
            })
        }
    };
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|source| Error::InvalidRecord {
            path,
            what: "Core endpoint record",
            source,
        })
}

/// Reads the running host's record, failing with [`Error::NotRunning`] when there is
/// none or its process is gone.
pub fn running_endpoint(workspace: &Path) -> Result<EndpointRecord, Error> {
    match read_endpoint(workspace)? {
        None => Err(Error::NotRunning {
            workspace: workspace.to_path_buf(),
            reason: format!("`{}` does not exist", endpoint_path(workspace).display()),
        }),
        Some(record) if process_is_absent(record.pid) => Err(Error::NotRunning {
            workspace: workspace.to_path_buf(),
            reason: format!("the recorded host (pid {}) is not running", record.pid),
        }),
        Some(record) => Ok(record),
    }
}

/// The saved port, if one was saved.
pub fn saved_port(workspace: &Path) -> Result<Option<u16>, Error> {
    let path = port_path(workspace);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(Error::Io {
                operation: "read",
                path,
                source,
            })
        }
    };
    #[derive(Deserialize)]
    struct Saved {
        port: u16,
    }
    let saved: Saved = serde_json::from_slice(&text).map_err(|source| Error::InvalidRecord {
        path,
        what: "saved Core port",
        source,
    })?;
    Ok(Some(saved.port))
}

/// Saves `port` unless a port is already saved (exclusive create).
pub fn save_port(workspace: &Path, port: u16) -> Result<(), Error> {
    let path = port_path(workspace);
    let directory = workspace.join(STATE_DIR);
    std::fs::create_dir_all(&directory).map_err(io("create", &directory))?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    match options.open(&path) {
        Ok(mut file) => {
            let text = format!("{}\n", json!({"port": port}));
            file.write_all(text.as_bytes())
                .map_err(io("write", &path))?;
            file.sync_all().map_err(io("sync", &path))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(Error::Io {
            operation: "create",
            path,
            source,
        }),
    }
}

/// Whether the OS reports no process with `pid` (`ESRCH`). Any other answer (alive,
/// not permitted, unknown) counts as present: an undeterminable owner is busy.
pub fn process_is_absent(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: `kill` with signal 0 sends nothing; it only checks that `pid` exists and
    // may be signalled (kill(2)). No memory is passed.
    let rc = unsafe { libc::kill(pid, 0) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

#[derive(Debug, Serialize, Deserialize)]
struct LockRecord {
    pid: u32,
    nonce: String,
    #[serde(rename = "startedAt")]
    started_at: String,
}

/// Proof that this process owns the workspace's Core host; removes `core.lock` and
/// `core.json` when dropped.
#[must_use = "dropping the owner lock releases the workspace at once"]
#[derive(Debug)]
pub struct OwnerLock {
    workspace: PathBuf,
    nonce: String,
}

impl OwnerLock {
    /// Takes the workspace's owner lock, recovering a stale one (owner absent, same
    /// nonce on re-read). Fails with [`Error::AlreadyRunning`] when a live host owns
    /// it.
    pub fn acquire(workspace: &Path) -> Result<Self, Error> {
        let path = lock_path(workspace);
        let directory = workspace.join(STATE_DIR);
        std::fs::create_dir_all(&directory).map_err(io("create", &directory))?;
        let nonce = new_token()?;
        let record = LockRecord {
            pid: std::process::id(),
            nonce: nonce.clone(),
            started_at: arcane_report::time::now_rfc3339(),
        };
        let text = serde_json::to_vec(&record).unwrap_or_default();
        for _attempt in 0..3 {
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            match options.open(&path) {
                Ok(mut file) => {
                    file.write_all(&text).map_err(io("write", &path))?;
                    file.sync_all().map_err(io("sync", &path))?;
                    return Ok(Self {
                        workspace: workspace.to_path_buf(),
                        nonce,
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(source) => {
                    return Err(Error::Io {
                        operation: "create",
                        path,
                        source,
                    })
                }
            }
            let holder = read_lock(&path)?;
            match holder {
                // Being written right now, or vanished: try again.
                None => std::thread::sleep(std::time::Duration::from_millis(50)),
                Some(holder) if process_is_absent(holder.pid) => {
                    // Stale: remove only if a re-read shows the same record.
                    if let Some(again) = read_lock(&path)? {
                        if again.nonce == holder.nonce {
                            let _ = std::fs::remove_file(&path);
                        }
                    }
                }
                Some(holder) => {
                    let endpoint = read_endpoint(workspace)
                        .ok()
                        .flatten()
                        .filter(|r| r.pid == holder.pid);
                    return Err(Error::AlreadyRunning {
                        url: endpoint
                            .map(|r| r.url)
                            .unwrap_or_else(|| "(starting)".into()),
                        pid: holder.pid,
                        endpoint_file: endpoint_path(workspace),
                    });
                }
            }
        }
        Err(Error::Io {
            operation: "create",
            path,
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "the owner lock keeps changing",
            ),
        })
    }
}

fn read_lock(path: &Path) -> Result<Option<LockRecord>, Error> {
    match std::fs::read(path) {
        Ok(text) => Ok(serde_json::from_slice(&text).ok()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Io {
            operation: "read",
            path: path.to_path_buf(),
            source,
        }),
    }
}

impl Drop for OwnerLock {
    fn drop(&mut self) {
        let path = lock_path(&self.workspace);
        // Remove our records only if they are still ours.
        if read_lock(&path)
            .ok()
            .flatten()
            .is_some_and(|r| r.nonce == self.nonce)
        {
            if read_endpoint(&self.workspace)
                .ok()
                .flatten()
                .is_some_and(|r| r.pid == std::process::id())
            {
                let _ = std::fs::remove_file(endpoint_path(&self.workspace));
            }
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_matches_only_equal_secrets() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(!constant_time_eq(b"ab", b"abc"));
        assert!(!constant_time_eq(b"", b"a"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn endpoint_is_private_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let record = EndpointRecord {
            protocol: "arcane/1".into(),
            url: "http://127.0.0.1:1".into(),
            host: "127.0.0.1".into(),
            port: 1,
            pid: std::process::id(),
            token: new_token().unwrap(),
            started_at: "2026-01-01T00:00:00.000Z".into(),
        };
        let path = write_endpoint(dir.path(), &record).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
        assert_eq!(read_endpoint(dir.path()).unwrap(), Some(record.clone()));
        assert_eq!(record.token.len(), 64);
        assert_ne!(record.token, new_token().unwrap());
    }

    #[test]
    fn a_live_owner_refuses_a_second_one_and_a_dead_one_is_recovered() {
        let dir = tempfile::tempdir().unwrap();
        let first = OwnerLock::acquire(dir.path()).unwrap();
        let err = OwnerLock::acquire(dir.path()).unwrap_err();
        assert!(matches!(err, Error::AlreadyRunning { pid, .. } if pid == std::process::id()));
        drop(first);
        assert!(!lock_path(dir.path()).exists());
        // A lock left by a process that no longer exists is stale.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        std::fs::write(
            lock_path(dir.path()),
            format!(r#"{{"pid":{dead},"nonce":"x","startedAt":"t"}}"#),
        )
        .unwrap();
        let _again = OwnerLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn the_first_saved_port_sticks() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(saved_port(dir.path()).unwrap(), None);
        save_port(dir.path(), 4000).unwrap();
        save_port(dir.path(), 5000).unwrap();
        assert_eq!(saved_port(dir.path()).unwrap(), Some(4000));
    }
}
