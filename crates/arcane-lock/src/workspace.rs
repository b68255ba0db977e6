//! Opening the workspace and its `.arcane` directory safely, as directory descriptors.
//!
//! * The workspace path must name a physical directory: its last component may not be a
//!   symbolic link (linked *ancestors* are allowed, as in SDK 0.1.1, and the workspace
//!   binds to its canonical path and `(dev, ino)` identity).
//! * `.arcane` must be a physical directory directly inside it, opened relative to the
//!   workspace descriptor with `O_NOFOLLOW | O_DIRECTORY`, so a link planted there is
//!   refused rather than followed, and nothing is ever created outside the workspace.
//! * Every later file operation is relative to the `.arcane` descriptor, so renaming or
//!   re-linking the path while a lease is held cannot redirect a write (lock-spec.md W9).

use std::ffi::CStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, PolicyReason};
use crate::sys::{self, Identity, Kind};

/// The lock directory's name inside the workspace.
pub(crate) const ARCANE_DIR: &CStr = arcane_workspace::layout::STATE_DIR_C;

/// An opened, verified workspace directory.
#[derive(Debug)]
pub(crate) struct Workspace {
    /// The canonical path.
    pub(crate) canonical: PathBuf,
    /// `(dev, ino)` of the directory.
    pub(crate) identity: Identity,
    /// The open directory.
    pub(crate) dir: OwnedFd,
}

impl Workspace {
    /// Opens `path` as a workspace (it must exist).
    pub(crate) fn open(path: &Path) -> Result<Workspace, Error> {
        if path.as_os_str().is_empty() {
            return Err(Error::policy(path, PolicyReason::Empty, None));
        }
        let normalised = normalise(path);
        let dir = sys::open_directory_nofollow(&normalised)
            .map_err(|e| refusal(&normalised, e, "open the workspace"))?;
        let stamp = sys::stat_fd(dir.as_fd())
            .map_err(|e| Error::io("inspect the workspace", &normalised, e))?;
        let canonical = match sys::path_of(dir.as_fd()) {
            Ok(p) if p.is_absolute() => p,
            _ => {
                // No /proc: canonicalize by path, then insist it names the opened inode.
                let p = std::fs::canonicalize(&normalised)
                    .map_err(|e| Error::io("resolve the workspace", &normalised, e))?;
                match sys::stat_path_nofollow(&p) {
                    Ok(s) if s.identity == stamp.identity => p,
                    _ => return Err(Error::policy(&normalised, PolicyReason::SymbolicLink, None)),
                }
            }
        };
        Ok(Workspace {
            canonical,
            identity: stamp.identity,
            dir,
        })
    }

    /// The path of a file inside `.arcane`, for messages and events.
    pub(crate) fn arcane_path(&self, name: &CStr) -> PathBuf {
        arcane_workspace::layout::state_file(&self.canonical, name)
    }

    /// Opens `.arcane`, creating it (mode 0700) when `create` is set. `Ok(None)` when it
    /// does not exist and `create` is not set.
    pub(crate) fn open_arcane(&self, create: bool) -> Result<Option<OwnedFd>, Error> {
        let path = arcane_workspace::layout::state_dir(&self.canonical);
        match sys::open_directory_at(self.dir.as_fd(), ARCANE_DIR) {
            Ok(fd) => return trusted(&path, fd).map(Some),
            Err(e) if sys::errno(&e) == sys::ENOENT => {
                if !create {
                    return Ok(None);
                }
            }
            Err(e) => return Err(self.refuse_at(ARCANE_DIR, &path, e, "open")),
        }
        match sys::make_directory_at(self.dir.as_fd(), ARCANE_DIR, 0o700) {
            Ok(()) => {}
            Err(e) if sys::errno(&e) == sys::EEXIST => {}
            Err(e) if matches!(sys::errno(&e), sys::EACCES | sys::EPERM) => {
                return Err(Error::policy(
                    &path,
                    PolicyReason::PermissionDenied,
                    Some(e),
                ))
            }
            Err(e) => return Err(Error::io("create", &path, e)),
        }
        let fd = sys::open_directory_at(self.dir.as_fd(), ARCANE_DIR)
            .map_err(|e| self.refuse_at(ARCANE_DIR, &path, e, "open"))?;
        trusted(&path, fd).map(Some)
    }

    /// Turns a failed open of `name` (relative to the workspace) into the right error,
    /// describing what is at the path.
    fn refuse_at(
        &self,
        name: &CStr,
        path: &Path,
        error: std::io::Error,
        action: &'static str,
    ) -> Error {
        let kind = sys::stat_at(self.dir.as_fd(), name).map(|s| s.kind).ok();
        classify(path, error, kind, action)
    }
}

/// The error for a failed open: links and wrong kinds are policy refusals.
/// `.arcane` as opened must belong to this user (or root) and be writable by no one
/// else (`arcane_files::trust`): another user who can write it could rewrite the
/// registry or the lock record.
fn trusted(path: &Path, fd: OwnedFd) -> Result<OwnedFd, Error> {
    let file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(|e| Error::io("inspect", path, e))?;
    if let Err(untrusted) = arcane_files::trust::check_owner_and_mode(path, &meta) {
        return Err(Error::policy(
            path,
            PolicyReason::Untrusted {
                detail: untrusted.describe(),
                fix: untrusted.fix(),
            },
            None,
        ));
    }
    Ok(OwnedFd::from(file))
}

pub(crate) fn classify(
    path: &Path,
    error: std::io::Error,
    kind: Option<Kind>,
    action: &'static str,
) -> Error {
    match (sys::errno(&error), kind) {
        (_, Some(Kind::Symlink)) | (sys::ELOOP, _) => {
            Error::policy(path, PolicyReason::SymbolicLink, Some(error))
        }
        (sys::EACCES | sys::EPERM, _) => {
            Error::policy(path, PolicyReason::PermissionDenied, Some(error))
        }
        (sys::ENOTDIR | sys::EISDIR | sys::ENXIO, k) => Error::policy(
            path,
            PolicyReason::WrongKind {
                found: k
                    .map(Kind::describe)
                    .unwrap_or("not the expected kind of file"),
            },
            Some(error),
        ),
        _ => Error::io(
            match action {
                "open" => "open",
                other => other,
            },
            path,
            error,
        ),
    }
}

/// The `fstat` of `fd`, an opened lock file at `path` (`what` names it for an error),
/// which must be a regular file: a directory, FIFO or device there is
/// `ARCANE_POLICY_DENIED` naming what it is.
pub(crate) fn regular_file(
    fd: std::os::fd::BorrowedFd<'_>,
    path: &Path,
    what: &'static str,
) -> Result<sys::Stamp, Error> {
    let stamp = sys::stat_fd(fd).map_err(|e| Error::io(what, path, e))?;
    if stamp.kind != Kind::Regular {
        return Err(Error::policy(
            path,
            PolicyReason::WrongKind {
                found: stamp.kind.describe(),
            },
            None,
        ));
    }
    Ok(stamp)
}

fn refusal(path: &Path, error: std::io::Error, action: &'static str) -> Error {
    match sys::errno(&error) {
        sys::ENOENT => Error::policy(path, PolicyReason::Missing, Some(error)),
        _ => {
            let kind = sys::stat_path_nofollow(path).map(|s| s.kind).ok();
            classify(path, error, kind, action)
        }
    }
}

/// Rebuilds a path from its components so that a trailing `/` or `/.` (which would
/// make the kernel follow a final symbolic link) disappears.
pub(crate) fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir if !out.as_os_str().is_empty() => {}
            other => out.push(other.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalising_drops_trailing_slashes_and_dots() {
        assert_eq!(normalise(Path::new("/a/b/")), PathBuf::from("/a/b"));
        assert_eq!(normalise(Path::new("/a/b/.")), PathBuf::from("/a/b"));
        assert_eq!(normalise(Path::new("./x/")), PathBuf::from("./x"));
    }
}
