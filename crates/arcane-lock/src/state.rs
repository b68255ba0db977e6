//! [`state_subdir`]: a directory under `.arcane` that Arcane writes into by path (engine
//! ownership records, for example), checked with the same physical-path rules as the
//! lock itself before anything is written there.

use std::ffi::CString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use crate::error::{Error, PolicyReason};
use crate::sys;
use crate::workspace::{classify, Workspace};

/// Makes sure `<workspace>/.arcane/<name>` is a physical directory (creating it, and
/// `.arcane`, with mode 0700 when missing) and returns its path. A symbolic link, a file
/// or anything else at either name is `ARCANE_POLICY_DENIED` naming it, and nothing is
/// created through it. `name` is one plain component.
pub fn state_subdir(workspace: &Path, name: &str) -> Result<PathBuf, Error> {
    let ws = Workspace::open(workspace)?;
    let Some(arcane) = ws.open_arcane(true)? else {
        return Err(Error::policy(
            arcane_workspace::layout::state_dir(&ws.canonical),
            PolicyReason::Missing,
            None,
        ));
    };
    let path = arcane_workspace::layout::state_dir(&ws.canonical).join(name);
    let plain = !name.is_empty() && !name.contains('/') && name != "." && name != "..";
    let cname = CString::new(name)
        .ok()
        .filter(|_| plain)
        .ok_or_else(|| Error::policy(&path, PolicyReason::Empty, None))?;
    match sys::open_directory_at(arcane.as_fd(), &cname) {
        Ok(_) => return Ok(path),
        Err(e) if sys::errno(&e) == sys::ENOENT => {}
        Err(e) => {
            let kind = sys::stat_at(arcane.as_fd(), &cname).map(|s| s.kind).ok();
            return Err(classify(&path, e, kind, "open"));
        }
    }
    match sys::make_directory_at(arcane.as_fd(), &cname, 0o700) {
        Ok(()) => {}
        Err(e) if sys::errno(&e) == sys::EEXIST => {}
        Err(e) => return Err(Error::io("create", &path, e)),
    }
    match sys::open_directory_at(arcane.as_fd(), &cname) {
        Ok(_) => Ok(path),
        Err(e) => {
            let kind = sys::stat_at(arcane.as_fd(), &cname).map(|s| s.kind).ok();
            Err(classify(&path, e, kind, "open"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linked_or_misplaced_subdirectory_is_refused_and_a_missing_one_created() {
        let dir = tempfile::tempdir().unwrap();
        let created = state_subdir(dir.path(), "engines").unwrap();
        assert!(std::fs::symlink_metadata(&created).unwrap().is_dir());
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::remove_dir(&created).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), &created).unwrap();
        let error = state_subdir(dir.path(), "engines").unwrap_err();
        assert!(error.is_policy_denied(), "{error}");
        std::fs::remove_file(&created).unwrap();
        std::fs::write(&created, b"").unwrap();
        assert!(state_subdir(dir.path(), "engines")
            .unwrap_err()
            .is_policy_denied());
        assert!(state_subdir(dir.path(), "a/b").is_err());
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }
}
