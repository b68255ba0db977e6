//! Where an owned engine listens, prepared before each spawn and cleaned up after each
//! exit: the one place that decides what a started engine exposes.
//!
//! * A Unix socket (llama.cpp's default): `.arcane/run/<id>.sock` in the private run
//!   directory. The directory is a physical directory of the workspace (never a link),
//!   owned by this user and mode 0700, so only this user can connect; a socket file
//!   left by a crashed engine (nothing accepts on it) is removed; one something still
//!   accepts on is [`Error::SocketInUse`]; anything else at that name is refused.
//! * A keyed TCP port (llama.cpp on a url the user asked for): the key goes to
//!   `.arcane/run/<id>.key` (mode 0600, written atomically) for `--api-key-file`; the
//!   port must be free.
//! * An open TCP port (Ollama, which has no authentication): the port must be free.
//!
//! Why a socket and not a port with a key: a web page can reach any loopback port (a
//! `text/plain` POST needs no CORS preflight, and DNS rebinding lets it read answers),
//! and any local user can too. A socket in a 0700 directory is reachable by nobody but
//! this user's processes, and the Core's token guards the only front door.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::config::Owned;
use crate::endpoint::{Endpoint, EngineAddress};
use crate::Error;

/// Makes `owned` ready for a spawn (see the module documentation). Blocking file-system
/// work: call it off the async threads.
pub(crate) fn prepare(workspace: &Path, id: &str, owned: &Owned) -> Result<(), Error> {
    match (&owned.address, &owned.key) {
        (EngineAddress::Unix(socket), _) => {
            private_run_dir(workspace)?;
            clear_stale_socket(socket)
        }
        (EngineAddress::Tcp(endpoint), Some(key)) => {
            private_run_dir(workspace)?;
            let path = arcane_workspace::layout::engine_key(workspace, id);
            refuse_non_regular(&path)?;
            arcane_files::write_atomic(&path, format!("{}\n", key.expose()).as_bytes(), 0o600)
                .map_err(|source| Error::Io {
                    operation: "write",
                    path,
                    source,
                })?;
            port_is_free(endpoint)
        }
        (EngineAddress::Tcp(endpoint), None) => port_is_free(endpoint),
    }
}

/// Removes what [`prepare`] made once the engine has exited: the socket file or the key
/// file. Only regular files and sockets are removed (never through a link).
pub(crate) fn clean_up(workspace: &Path, id: &str, owned: &Owned) {
    let path = match (&owned.address, &owned.key) {
        (EngineAddress::Unix(socket), _) => socket.clone(),
        (EngineAddress::Tcp(_), Some(_)) => arcane_workspace::layout::engine_key(workspace, id),
        (EngineAddress::Tcp(_), None) => return,
    };
    if let Ok(meta) = std::fs::symlink_metadata(&path) {
        if meta.file_type().is_socket() || meta.file_type().is_file() {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// The path of the key file `--api-key-file` names, when the engine has a key.
pub(crate) fn key_file(workspace: &Path, id: &str, owned: &Owned) -> Option<PathBuf> {
    owned
        .key
        .as_ref()
        .map(|_| arcane_workspace::layout::engine_key(workspace, id))
}

/// `.arcane/run`: a physical directory (created 0700 by the lock crate's one rule for
/// state subdirectories), owned by this user, with its mode narrowed to 0700 if it was
/// wider: where a secret may sit as a file that only this user can open (an engine's
/// socket and key, `arcane open`'s login page).
pub fn private_run_dir(workspace: &Path) -> Result<PathBuf, Error> {
    let name = arcane_workspace::layout::RUN_DIR_NAME;
    let dir =
        arcane_lock::state_subdir(workspace, name).map_err(|source| Error::RunDirRefused {
            path: arcane_workspace::layout::run_dir(workspace),
            detail: source.to_string(),
            fix: "remove what is at that path; Arcane creates the directory itself".into(),
        })?;
    let meta = std::fs::symlink_metadata(&dir).map_err(|source| Error::Io {
        operation: "inspect",
        path: dir.clone(),
        source,
    })?;
    if meta.uid() != arcane_files::trust::current_uid() {
        return Err(Error::RunDirRefused {
            path: dir.clone(),
            detail: format!("it is owned by another user (uid {})", meta.uid()),
            fix: format!("remove `{}`; Arcane creates it again", dir.display()),
        });
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(
            |source| Error::Io {
                operation: "restrict to mode 0700",
                path: dir.clone(),
                source,
            },
        )?;
    }
    Ok(dir)
}

/// Removes a socket file nothing accepts on; refuses a live one and anything that is
/// not a socket.
fn clear_stale_socket(socket: &Path) -> Result<(), Error> {
    let meta = match std::fs::symlink_metadata(socket) {
        Ok(meta) => meta,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(Error::Io {
                operation: "inspect",
                path: socket.to_path_buf(),
                source,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(Error::RunDirRefused {
            path: socket.to_path_buf(),
            detail: format!(
                "it is a {}, not a socket",
                arcane_files::describe_kind(&meta)
            ),
            fix: format!("remove `{}`", socket.display()),
        });
    }
    match std::os::unix::net::UnixStream::connect(socket) {
        Ok(_) => Err(Error::SocketInUse {
            socket: socket.to_path_buf(),
        }),
        Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(socket).map_err(|source| Error::Io {
                operation: "remove the stale socket",
                path: socket.to_path_buf(),
                source,
            })
        }
        Err(source) => Err(Error::Io {
            operation: "connect to",
            path: socket.to_path_buf(),
            source,
        }),
    }
}

/// Refuses anything but a regular file (or nothing) at `path`.
fn refuse_non_regular(path: &Path) -> Result<(), Error> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_file() => Err(Error::RunDirRefused {
            path: path.to_path_buf(),
            detail: format!(
                "it is a {}, not a regular file",
                arcane_files::describe_kind(&meta)
            ),
            fix: format!("remove `{}`", path.display()),
        }),
        _ => Ok(()),
    }
}

/// Refuses to spawn when another process holds the port without listening on it (a
/// listener would have answered the probe). Binding with the default options detects a
/// socket bound by anyone else.
fn port_is_free(endpoint: &Endpoint) -> Result<(), Error> {
    let host = if endpoint.host() == "localhost" {
        "127.0.0.1"
    } else {
        endpoint.host()
    };
    match std::net::TcpListener::bind((host, endpoint.port())) {
        Ok(listener) => {
            drop(listener);
            Ok(())
        }
        Err(error) if error.kind() == io::ErrorKind::AddrInUse => Err(Error::PortInUse {
            port: endpoint.port(),
            url: endpoint.origin(),
            evidence: "bind".into(),
            last_lines: Vec::new(),
        }),
        // Other failures (no IPv6, permissions) are left to the engine to report.
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::ApiKey;

    fn workspace() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(".arcane")).unwrap();
        dir
    }

    fn socket_owned(ws: &Path) -> Owned {
        Owned {
            address: EngineAddress::Unix(arcane_workspace::layout::engine_socket(ws, "e")),
            key: None,
        }
    }

    #[test]
    fn the_run_dir_is_private_even_when_it_was_wider() {
        let ws = workspace();
        let run = arcane_workspace::layout::run_dir(ws.path());
        std::fs::create_dir(&run).unwrap();
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
        prepare(ws.path(), "e", &socket_owned(ws.path())).unwrap();
        let mode = std::fs::metadata(&run).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn a_linked_run_dir_is_refused_and_nothing_is_made_through_it() {
        let ws = workspace();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(
            elsewhere.path(),
            arcane_workspace::layout::run_dir(ws.path()),
        )
        .unwrap();
        let error = prepare(ws.path(), "e", &socket_owned(ws.path())).unwrap_err();
        assert!(matches!(error, Error::RunDirRefused { .. }), "{error:?}");
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_stale_socket_is_removed_a_live_one_refused_a_file_refused() {
        let ws = workspace();
        let owned = socket_owned(ws.path());
        let socket = owned.address.socket().unwrap().to_path_buf();
        prepare(ws.path(), "e", &owned).unwrap();
        // Stale: bound, then the listener closed.
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        prepare(ws.path(), "e", &owned).unwrap();
        assert!(!socket.exists());
        // Live.
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let error = prepare(ws.path(), "e", &owned).unwrap_err();
        assert!(matches!(error, Error::SocketInUse { .. }), "{error:?}");
        drop(listener);
        std::fs::remove_file(&socket).unwrap();
        // A regular file is never removed.
        std::fs::write(&socket, b"mine").unwrap();
        let error = prepare(ws.path(), "e", &owned).unwrap_err();
        assert!(matches!(error, Error::RunDirRefused { .. }), "{error:?}");
        assert_eq!(std::fs::read(&socket).unwrap(), b"mine");
    }

    #[test]
    fn a_key_file_is_0600_and_removed_after_the_exit() {
        let ws = workspace();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let owned = Owned {
            address: EngineAddress::Tcp(
                Endpoint::parse(&format!("http://127.0.0.1:{port}")).unwrap(),
            ),
            key: Some(ApiKey::generate().unwrap()),
        };
        prepare(ws.path(), "e", &owned).unwrap();
        let path = key_file(ws.path(), "e", &owned).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim(), owned.key.as_ref().unwrap().expose());
        clean_up(ws.path(), "e", &owned);
        assert!(!path.exists());
    }
}
