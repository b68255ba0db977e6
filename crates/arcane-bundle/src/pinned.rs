//! Launch runs exactly what verification checked.
//!
//! Verification and launch happen one after the other, by path: without this module a
//! file swapped (renamed over) or rewritten between the two would run unverified, as
//! the launching user. Two layers close that window:
//!
//! 1. [`crate::verify()`] refuses what anyone but the verifier (or root) could change:
//!    group- or world-writable files and directories, setuid/setgid files, and files
//!    owned by another user. So only the launching user and root can still swap a file.
//! 2. The walk records every listed file's identity — device, inode, size, mtime and
//!    ctime (which no user can set, and which every write, `chmod`, `chown` or new link
//!    moves) — and launch checks it again, on an open descriptor, right before use:
//!    * the program launch itself runs (an app entry) is opened once
//!      ([`VerifiedBundle::open_program`]), its identity checked, its content hashed
//!      again *from that descriptor* against the manifest, and it is executed through
//!      that same descriptor (`/proc/self/fd/N`). The path is never looked up again, so
//!      a swap after the check changes nothing: the bytes hashed are the bytes run.
//!      (`fexecve` on a re-opened path, or a re-check followed by an exec by path, would
//!      each leave a window between the check and the exec.)
//!    * the launcher (`bin/arcane`), which launch `exec`s as the Core host or starts as
//!      the background Core of an app entry, is opened and checked the same way
//!      ([`VerifiedBundle::open_verified`]; not re-hashed: it is large, and its
//!      identity on the open descriptor proves it unwritten since it was hashed) and
//!      executed through that descriptor;
//!    * files another process loads by path (the runtime and its libraries, the
//!      model, the ONNX library) are re-checked by identity right before the exec
//!      that hands them over ([`VerifiedBundle::recheck_all`]): handing
//!      descriptors through the Core host to the engine it spawns is not supported by
//!      the engines, and re-hashing a multi-gigabyte model on every launch would repeat
//!      verification. What remains (a swap between that check and the engine's open)
//!      needs the launching user's or root's rights, by layer 1.
//!
//! Any difference is [`Error::Integrity`] with one `BUNDLE_FILE_CHANGED` failure naming
//! the path and what changed; nothing is started.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use arcane_report::codes;
use serde_json::json;

use crate::error::Error;
use crate::failure::Failure;
use crate::verify::VerifiedBundle;

pub(crate) use arcane_files::FileIdentity;

/// The identities the verifying walk recorded, by bundle-relative path.
pub(crate) type Identities = HashMap<String, FileIdentity>;

/// A verified file held open by descriptor (see the module docs).
#[derive(Debug)]
pub struct PinnedFile {
    file: File,
    path: PathBuf,
    relative: String,
}

impl PinnedFile {
    /// The file's path in the bundle (for messages; never opened again).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The manifest path, e.g. `app/tools/run.sh`.
    pub fn relative(&self) -> &str {
        &self.relative
    }

    /// The descriptor (close-on-exec): a child that executes [`PinnedFile::exec_path`]
    /// must inherit it (`arcane_process::Spec::keep_fds`), and it must stay open until
    /// the child was started.
    pub fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// The path that executes exactly this open file: `/proc/self/fd/N`. An interpreter
    /// started for a script opens the same path in the child, so the descriptor must be
    /// inherited (see [`PinnedFile::raw_fd`]).
    pub fn exec_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.raw_fd()))
    }
}

impl VerifiedBundle {
    /// Opens the listed file `relative` (without following a symlink) and checks that
    /// it is still the file verification saw.
    pub fn open_verified(&self, relative: &str) -> Result<PinnedFile, Error> {
        let path = self.resolve(relative);
        let changed = |reason: String| self.changed(relative, reason);
        let Some(expected) = self.identities.get(relative) else {
            return Err(changed("it was not verified".into()));
        };
        let file = File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK)
            .open(&path)
            .map_err(|e| changed(format!("it cannot be opened ({e})")))?;
        let metadata = file
            .metadata()
            .map_err(|e| changed(format!("it cannot be inspected ({e})")))?;
        if !metadata.file_type().is_file() {
            return Err(changed("it is no longer a regular file".into()));
        }
        if metadata.nlink() > 1 {
            return Err(changed(format!(
                "it gained a hard link (nlink {})",
                metadata.nlink()
            )));
        }
        if let Some(reason) = expected.difference(&FileIdentity::of(&metadata)) {
            return Err(changed(reason.into()));
        }
        Ok(PinnedFile {
            file,
            path,
            relative: relative.to_string(),
        })
    }

    /// [`VerifiedBundle::open_verified`], then the content hashed again from the open
    /// descriptor against the manifest: the program to execute through
    /// [`PinnedFile::exec_path`].
    pub fn open_program(&self, relative: &str) -> Result<PinnedFile, Error> {
        let mut pinned = self.open_verified(relative)?;
        let Some(entry) = self.manifest.file(relative) else {
            return Err(self.changed(relative, "it is not listed".into()));
        };
        let mut buffer = vec![0u8; arcane_files::CHUNK];
        let streamed = arcane_files::stream_sha256(
            &mut pinned.file,
            &mut buffer,
            arcane_files::Stream {
                copy_to: None,
                limit: Some(entry.size),
                stop: &|| false,
                on_chunk: &mut |_| {},
            },
        )
        .map_err(|e| match e {
            arcane_files::StreamError::Read(e) | arcane_files::StreamError::Write(e) => {
                self.changed(relative, format!("it cannot be read ({e})"))
            }
            arcane_files::StreamError::Stopped => self.changed(relative, "reading stopped".into()),
        })?;
        if streamed.bytes != entry.size || streamed.sha256 != entry.sha256 {
            return Err(self.changed(
                relative,
                "its content no longer matches the manifest's SHA-256".into(),
            ));
        }
        Ok(pinned)
    }

    /// Checks every listed file's identity again (see the module docs): for files
    /// another process opens by path, right before handing them over.
    pub fn recheck_all(&self) -> Result<(), Error> {
        let mut paths: Vec<&str> = self
            .manifest
            .files
            .iter()
            .map(|f| f.path.as_str())
            .collect();
        paths.sort_unstable();
        for relative in paths {
            self.open_verified(relative)?;
        }
        Ok(())
    }

    fn changed(&self, relative: &str, reason: String) -> Error {
        Error::Integrity {
            root: self.root.clone(),
            failures: vec![Failure::at(
                codes::BUNDLE_FILE_CHANGED,
                relative,
                format!("changed after verification: {reason}; nothing was started"),
                json!({"reason": reason, "when": "after-verification"}),
            )],
        }
    }
}

/// The identity of a file the walk saw.
// `stat`'s field types differ between platforms, so the casts are needed there.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn identity_of_stat(stat: &rustix::fs::Stat) -> FileIdentity {
    FileIdentity {
        dev: stat.st_dev as u64,
        ino: stat.st_ino as u64,
        size: stat.st_size as u64,
        mtime: (stat.st_mtime as i64, stat.st_mtime_nsec as i64),
        ctime: (stat.st_ctime as i64, stat.st_ctime_nsec as i64),
    }
}
