//! The host's files in the workspace's `.arcane/`: who owns the workspace
//! (`core.lock`), where it listens (`core-port.json`, the stable port) and how to reach
//! it (`core.json`: URL, pid and a fresh token, mode 0600).
//!
//! # One owner per workspace
//!
//! The owner is whoever holds the workspace lock crate's owner lease for the role
//! `core` (`.arcane/core.lock`, an `flock` held for the host's whole life; see
//! `arcane_lock::OwnerLease` for the rule). Every host — `arcane serve`, `arcane core
//! --stdio`, a bundle's background Core — takes it before anything else; a second one
//! gets [`Error::AlreadyRunning`] naming the running host's URL and pid. A crash frees
//! it (the kernel drops the lock), and no content of `core.lock` can keep a workspace
//! stuck.
//!
//! A client trusts `core.json` only while the lease is held ([`running_endpoint`]): a
//! file left by a dead host is never believed, so its token is never sent to whatever
//! listens on that port now.
//!
//! # The stable port
//!
//! The first host to bind saves its port in `core-port.json` (exclusive create); later
//! hosts bind that port again, and a busy saved port is [`Error::PortInUse`], never a
//! silent move, so clients' saved URLs stay valid.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::Error;

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
    /// The registered files its engines use, so that removing them can be refused
    /// while it runs ([`serving_host`]).
    #[serde(default)]
    pub serving: Serving,
}

/// The files a running host's engines use: model files and engine executables.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Serving {
    /// Model files (GGUF).
    pub models: Vec<PathBuf>,
    /// Engine executables.
    pub executables: Vec<PathBuf>,
}

impl Serving {
    /// Whether `path` is one of these files (compared as given and canonicalized).
    pub fn uses(&self, path: &Path) -> bool {
        let canonical = std::fs::canonicalize(path).ok();
        self.models.iter().chain(&self.executables).any(|used| {
            used == path || canonical.is_some() && std::fs::canonicalize(used).ok() == canonical
        })
    }
}

/// The running host (lease-proven, see [`running_endpoint`]) whose engines use `path`,
/// if any: what a removal of a registered model or runtime must refuse.
pub fn serving_host(workspace: &Path, path: &Path) -> Option<EndpointRecord> {
    running_endpoint(workspace)
        .ok()
        .filter(|record| record.serving.uses(path))
}

/// The path of `core.json` in `workspace`.
pub fn endpoint_path(workspace: &Path) -> PathBuf {
    arcane_workspace::layout::core_endpoint(workspace)
}

/// The path of the saved port in `workspace`.
pub fn port_path(workspace: &Path) -> PathBuf {
    arcane_workspace::layout::core_port(workspace)
}

/// The path of the owner lock in `workspace`.
pub fn lock_path(workspace: &Path) -> PathBuf {
    arcane_workspace::layout::core_lock(workspace)
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
    arcane_files::secret_hex(32).map_err(|source| Error::Io {
        operation: "read random bytes for",
        path: "the token".into(),
        source,
    })
}

/// The path of the workspace's token file.
pub fn token_path(workspace: &Path) -> PathBuf {
    arcane_workspace::layout::core_token(workspace)
}

/// The workspace's bearer token: read from `.arcane/core-token`, or created there (32
/// random bytes, hex, mode 0600) the first time, so it survives restarts and a client
/// configured with it keeps working. A token file others may read is refused (it is a
/// secret), as is one that is empty or not hex.
pub fn workspace_token(workspace: &Path) -> Result<String, Error> {
    let path = token_path(workspace);
    match read_token_file(&path)? {
        Some(token) => Ok(token),
        None => {
            let token = new_token()?;
            write_private_atomic(&path, format!("{token}\n").as_bytes())?;
            Ok(token)
        }
    }
}

/// Replaces the workspace's token with a fresh one and returns it. A running host
/// (whose `core.json` is proven by its owner lease) is told through `core.json` and
/// switches at once: it rereads the token file on the next request.
pub fn rotate_token(workspace: &Path) -> Result<String, Error> {
    let token = new_token()?;
    write_private_atomic(&token_path(workspace), format!("{token}\n").as_bytes())?;
    if let Ok(mut record) = running_endpoint(workspace) {
        record.token = token.clone();
        write_endpoint(workspace, &record)?;
    }
    Ok(token)
}

/// Reads a token file: `Ok(None)` when it does not exist.
pub fn read_token_file(path: &Path) -> Result<Option<String>, Error> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(Error::Io {
                operation: "inspect",
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let refuse = |why: String| Error::Io {
        operation: "use",
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, why),
    };
    if !meta.is_file() {
        return Err(refuse("the token file is not a regular file".into()));
    }
    // A secret another user wrote is theirs to know: never taken as ours (root's
    // files are the exception, as for every trusted file); one others may read is no
    // secret.
    if let Some(problem) = arcane_files::trust::secret_file_problem(path, &meta) {
        return Err(refuse(format!(
            "the token file `{}` {problem}",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        operation: "read",
        path: path.to_path_buf(),
        source,
    })?;
    let token = text.trim().to_string();
    if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(refuse(
            "the token file holds no usable token (16 or more visible characters)".into(),
        ));
    }
    Ok(Some(token))
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

/// Writes `bytes` to `path` atomically with mode 0600 (through
/// [`arcane_files::write_atomic`]), creating the parent directory first.
pub fn write_private_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let directory = path.parent().unwrap_or(Path::new("."));
    arcane_files::create_private_dirs(directory).map_err(io("create", directory))?;
    arcane_files::write_atomic(path, bytes, 0o600).map_err(io("write", path))
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

/// Reads the running host's record, failing with [`Error::NotRunning`] unless the
/// process it names provably is the host that owns the workspace now: the owner lease
/// is held, by the recorded pid (as its holder wrote in the lease's sentinel), that
/// pid still is the process that took the lease (its start time), and the listening
/// socket at the recorded address is that process's and no other's. Only then may a
/// client send it the token: a file left by a dead host, a pid reused by another
/// user's program, or another program on the port while some other process (an
/// `arcane core --stdio`) holds the lease, is never believed.
pub fn running_endpoint(workspace: &Path) -> Result<EndpointRecord, Error> {
    let not_running = |reason: String| Error::NotRunning {
        workspace: workspace.to_path_buf(),
        reason,
    };
    let Some(record) = read_endpoint(workspace)? else {
        return Err(not_running(format!(
            "`{}` does not exist",
            endpoint_path(workspace).display()
        )));
    };
    let holder = arcane_lock::owner_lease_holder(workspace, OWNER_ROLE)
        .map_err(|e| Error::library("cannot check the Core host's owner lease", e))?;
    let Some(holder) = holder else {
        return Err(not_running(format!(
            "`{}` was left by a host that is gone (pid {}; nothing holds the owner lease `{}`)",
            endpoint_path(workspace).display(),
            record.pid,
            lock_path(workspace).display()
        )));
    };
    if let Some(reason) = not_the_holder(&record, &holder) {
        return Err(not_running(reason));
    }
    if !listens_alone(&record) {
        return Err(not_running(format!(
            "the recorded host (pid {}) is not the process listening on {}:{}",
            record.pid, record.host, record.port
        )));
    }
    Ok(record)
}

/// Why the lease's `holder` is not the host `record` names (`None` when it is).
fn not_the_holder(record: &EndpointRecord, holder: &arcane_lock::Holder) -> Option<String> {
    let holder_pid = holder.pid.and_then(|pid| u32::try_from(pid).ok());
    if holder_pid != Some(record.pid) {
        return Some(format!(
            "the owner lease is held by {}, not by the host `core.json` names (pid {})",
            holder_pid.map_or(
                "a process that has not said who it is".into(),
                |pid| format!("pid {pid}")
            ),
            record.pid
        ));
    }
    let now = arcane_process::start_time(record.pid);
    if now.is_none() || holder.start_time.is_none() || now != holder.start_time {
        return Some(format!(
            "the recorded host (pid {}) is not running (that pid is gone or now another process)",
            record.pid
        ));
    }
    None
}

/// Whether a connection to the record's address reaches the recorded process only.
fn listens_alone(record: &EndpointRecord) -> bool {
    let Ok(ip) = record
        .host
        .trim_matches(['[', ']'])
        .parse::<std::net::IpAddr>()
    else {
        return false;
    };
    ip.is_loopback()
        && arcane_process::sole_listener(record.pid, std::net::SocketAddr::new(ip, record.port))
            .unwrap_or(false)
}

/// The saved port, if one was saved. A file that holds no valid port (cut short by a
/// full disk or a crash of an older Arcane, which wrote it in place) counts as none:
/// the next [`save_port`] rebuilds it.
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
    Ok(serde_json::from_slice::<Saved>(&text)
        .ok()
        .map(|saved| saved.port)
        .filter(|port| *port != 0))
}

/// Saves `port` unless a valid port is already saved, atomically (a full disk leaves
/// the old file or none, never a cut one). Only the workspace's owner (the Core host
/// holding the owner lease) calls it.
pub fn save_port(workspace: &Path, port: u16) -> Result<(), Error> {
    if saved_port(workspace)?.is_some() {
        return Ok(());
    }
    let path = port_path(workspace);
    let directory = arcane_workspace::layout::state_dir(workspace);
    arcane_files::create_private_dirs(&directory).map_err(io("create", &directory))?;
    let text = format!("{}\n", json!({"port": port}));
    arcane_files::write_atomic(&path, text.as_bytes(), 0o600).map_err(io("write", &path))
}

/// The owner lease's role: its sentinel is `.arcane/core.lock`.
pub const OWNER_ROLE: &str = arcane_workspace::layout::CORE_OWNER_ROLE;

/// Proof that this process owns the workspace's Core host: the owner lease for
/// [`OWNER_ROLE`]. Dropping it removes `core.json` (if it is still this host's) and
/// releases the lease.
#[must_use = "dropping the owner lock releases the workspace at once"]
#[derive(Debug)]
pub struct OwnerLock {
    workspace: PathBuf,
    _lease: arcane_lock::OwnerLease,
}

impl OwnerLock {
    /// Takes the workspace's owner lease. Fails with [`Error::AlreadyRunning`] when a live
    /// host owns it (with the URL from `core.json` when it has written one, otherwise
    /// `(starting)`).
    pub fn acquire(workspace: &Path) -> Result<Self, Error> {
        match arcane_lock::OwnerLease::acquire(workspace, OWNER_ROLE) {
            Ok(lease) => Ok(Self {
                workspace: workspace.to_path_buf(),
                _lease: lease,
            }),
            Err(error) if error.is_busy() => {
                let owner_pid = match &error {
                    arcane_lock::Error::Busy { holder, .. } => holder
                        .as_ref()
                        .and_then(|h| h.pid)
                        .and_then(|pid| u32::try_from(pid).ok()),
                    _ => None,
                };
                let endpoint = read_endpoint(workspace)
                    .ok()
                    .flatten()
                    .filter(|r| owner_pid.is_none_or(|pid| pid == r.pid));
                Err(Error::AlreadyRunning {
                    url: endpoint
                        .as_ref()
                        .map(|r| r.url.clone())
                        .unwrap_or_else(|| "(starting)".into()),
                    pid: owner_pid.or(endpoint.map(|r| r.pid)).unwrap_or(0),
                    endpoint_file: endpoint_path(workspace),
                })
            }
            Err(error) => Err(Error::library(
                "cannot take the Core host's owner lease",
                error,
            )),
        }
    }
}

impl Drop for OwnerLock {
    fn drop(&mut self) {
        // Remove the endpoint record only if it is still ours; the lease is released
        // after it (field drop order), so no reader trusts a half-removed host.
        if read_endpoint(&self.workspace)
            .ok()
            .flatten()
            .is_some_and(|r| r.pid == std::process::id())
        {
            let _ = std::fs::remove_file(endpoint_path(&self.workspace));
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

    /// A record naming this process, with a fresh token.
    fn test_record() -> EndpointRecord {
        EndpointRecord {
            protocol: "arcane/1".into(),
            url: "http://127.0.0.1:1".into(),
            host: "127.0.0.1".into(),
            port: 1,
            pid: std::process::id(),
            token: new_token().unwrap(),
            started_at: "2026-01-01T00:00:00.000Z".into(),
            serving: Serving::default(),
        }
    }

    #[test]
    fn the_workspace_token_is_kept_private_and_a_readable_token_file_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let token = workspace_token(dir.path()).unwrap();
        assert_eq!(
            workspace_token(dir.path()).unwrap(),
            token,
            "kept across calls"
        );
        let path = token_path(dir.path());
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let rotated = rotate_token(dir.path()).unwrap();
        assert_ne!(rotated, token);
        assert_eq!(workspace_token(dir.path()).unwrap(), rotated);
        // A secret others can read is not used.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = workspace_token(dir.path()).unwrap_err();
        assert!(
            error.to_string().contains(&path.display().to_string()),
            "{error}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "short").unwrap();
        assert!(
            workspace_token(dir.path()).is_err(),
            "too short to be a token"
        );
    }

    #[test]
    fn endpoint_is_private_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let record = test_record();
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
    fn a_live_owner_refuses_a_second_one_and_no_file_content_keeps_a_workspace_stuck() {
        let dir = tempfile::tempdir().unwrap();
        let first = OwnerLock::acquire(dir.path()).unwrap();
        let err = OwnerLock::acquire(dir.path()).unwrap_err();
        assert!(matches!(err, Error::AlreadyRunning { pid, .. } if pid == std::process::id()));
        drop(first);
        // Issue: an empty `core.lock` (a crash between create and write) and one naming a
        // live unrelated pid each kept every later host out, forever.
        for content in [
            "".to_string(),
            r#"{"pid":1,"nonce":"x","startedAt":"t"}"#.to_string(),
        ] {
            std::fs::write(lock_path(dir.path()), content).unwrap();
            let owner = OwnerLock::acquire(dir.path()).unwrap();
            drop(owner);
        }
    }

    #[test]
    fn an_endpoint_file_is_believed_only_while_its_owner_lease_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let record = test_record();
        // Left behind with nobody holding the lease: not believed, although its pid lives.
        write_endpoint(dir.path(), &record).unwrap();
        assert!(matches!(
            running_endpoint(dir.path()),
            Err(Error::NotRunning { .. })
        ));
        let owner = OwnerLock::acquire(dir.path()).unwrap();
        write_endpoint(dir.path(), &record).unwrap();
        // Held by this process, which does not listen on the recorded port.
        assert!(matches!(
            running_endpoint(dir.path()),
            Err(Error::NotRunning { .. })
        ));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let record = EndpointRecord {
            port: listener.local_addr().unwrap().port(),
            ..record
        };
        write_endpoint(dir.path(), &record).unwrap();
        assert_eq!(running_endpoint(dir.path()).unwrap(), record);
        // A record naming another pid than the lease's holder is not believed.
        let other = EndpointRecord {
            pid: 1,
            ..record.clone()
        };
        write_endpoint(dir.path(), &other).unwrap();
        match running_endpoint(dir.path()) {
            Err(Error::NotRunning { reason, .. }) => {
                assert!(reason.contains("not by the host"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        write_endpoint(dir.path(), &record).unwrap();
        drop(owner);
        assert!(!endpoint_path(dir.path()).exists());
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
