//! The file-system primitives every Arcane crate shares, each written once:
//!
//! * [`write_atomic`]: a file is replaced whole or not at all. The bytes go to a
//!   temporary name in the same directory (created exclusively, with the final mode),
//!   are fsynced, renamed over the target, and the directory is fsynced so the rename
//!   survives a crash. A failure removes only the temporary file it created.
//! * [`stream_sha256`]: the one streaming SHA-256 loop (chunked reads, `EINTR` retried,
//!   a stop check before every chunk, per-chunk progress, an optional copy of the bytes
//!   to a writer, an optional size limit). Callers wrap it with their own errors,
//!   cancellation and progress reporting.
//! * [`sync_dir`]: fsync a directory (after a rename or creation inside it).
//! * [`open_regular`]: open a file a user named without ever blocking (a FIFO would
//!   block a plain open until a writer appears) and refuse anything that is not a
//!   regular file, naming what it is.
//! * [`read_regular_unchanged`]: read a small file a user named and refuse it when it
//!   changed while it was read (a configuration saved during a reload), comparing
//!   [`FileIdentity`]s taken before and after.
//!
//! * [`trust`]: whose files Arcane trusts (owner and mode, `StrictModes`-style).
//! * [`secret_bytes`], [`secret_hex`], [`uuid_v4`]: the one source of secrets and
//!   unique ids (tokens, engine keys, nonces, bundle ids): bytes from the kernel's
//!   random generator, never a fallback that could repeat.
//!
//! No function here follows policy (who may write where); the callers' containment and
//! ownership checks decide the paths.
#![warn(missing_docs)]

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub mod trust;

/// `N` random bytes from the kernel (`getrandom(2)`). Fails rather than fall back to
/// anything guessable.
pub fn secret_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut buffer = [0u8; N];
    getrandom::getrandom(&mut buffer).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(buffer)
}

/// `bytes` random bytes from the kernel, hex-encoded (tokens, keys, nonces).
pub fn secret_hex(bytes: usize) -> io::Result<String> {
    let mut buffer = vec![0u8; bytes];
    getrandom::getrandom(&mut buffer).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(hex::encode(buffer))
}

/// A random (version 4) UUID, lowercase, from the kernel's random bytes.
pub fn uuid_v4() -> io::Result<String> {
    let mut b: [u8; 16] = secret_bytes()?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            text.push('-');
        }
        text.push(char::from(HEX[usize::from(byte >> 4)]));
        text.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    Ok(text)
}

/// The chunk size of every streaming read (large enough to keep the hasher busy).
pub const CHUNK: usize = 1 << 20;

/// Replaces `path` with `bytes` atomically, with permission bits `mode` (applied
/// explicitly, so the umask cannot widen or narrow them). The parent directory must
/// exist. On error the target is untouched and the temporary file is removed.
#[allow(clippy::disallowed_methods)] // the one atomic write owns the rename (clippy.toml)
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let directory = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let (mut file, temporary) = create_temporary(directory, &name, mode)?;
    let result = (|| {
        file.write_all(bytes)?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temporary, path)?;
        sync_dir(directory)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
}

/// Creates a new temporary file beside `name` in `directory`: `.NAME.<random>.tmp`,
/// an unpredictable name, so neither another user nor a file left by a killed writer
/// whose pid was reused can be in its way (a name that exists all the same is skipped
/// for another, a few times).
fn create_temporary(directory: &Path, name: &str, mode: u32) -> io::Result<(File, PathBuf)> {
    let mut last = None;
    for _ in 0..8 {
        let temporary = directory.join(format!(".{name}.{}.tmp", secret_hex(8)?));
        match File::options()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&temporary)
        {
            Ok(file) => return Ok((file, temporary)),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => last = Some(error),
            Err(error) => return Err(error),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free temporary name")))
}

/// Creates `dir` and its missing parents with mode 0700 (only this user can enter
/// them, whatever the umask: it can only narrow the mode); existing ones are left as
/// they are. Every directory of Arcane's state (`.arcane` and below) is made here.
pub fn create_private_dirs(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Fsyncs the directory `dir`, so entries created or renamed in it survive a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// What kind of file `meta` describes, for messages: `a FIFO`, `a socket`, ….
pub fn describe_kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let kind = meta.file_type();
    if kind.is_file() {
        "a regular file"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        "a special file"
    }
}

/// Opens `path` for reading without blocking (`O_NONBLOCK`, which has no effect on a
/// regular file) and insists it is a regular file; anything else is an
/// [`io::ErrorKind::InvalidInput`] error whose message names what it is
/// (`is a FIFO, not a regular file`). A final symbolic link is followed.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("is {}, not a regular file", describe_kind(&meta)),
        ));
    }
    Ok(file)
}

/// Whether `path` is `root` or lies under it *physically*: the longest existing prefix of
/// `path` is resolved by the kernel (links followed), the rest is applied lexically (it
/// does not exist, so it holds no link; `..` removes a component), and every existing
/// ancestor of the result is compared with `root` by device and inode. So
/// `../dist/good/app`, `../dist/good/.` and a link to `root` are all inside, whatever
/// their spelling.
pub fn physically_inside(path: &Path, root: &Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata(root)?;
    let identity = (root.dev(), root.ino());
    let resolved = resolve_existing_prefix(&std::path::absolute(path)?)?;
    for ancestor in resolved.ancestors() {
        match std::fs::metadata(ancestor) {
            Ok(meta) if (meta.dev(), meta.ino()) == identity => return Ok(true),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// `path` with its longest existing prefix canonicalized and the rest applied lexically.
fn resolve_existing_prefix(path: &Path) -> io::Result<std::path::PathBuf> {
    use std::path::Component;
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    let base = loop {
        match std::fs::canonicalize(&existing) {
            Ok(base) => break base,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let Some(name) = existing.file_name().map(|n| n.to_os_string()) else {
                    return Err(e);
                };
                rest.push(name);
                if !existing.pop() {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    };
    let mut resolved = base;
    for name in rest.iter().rev() {
        match Path::new(name).components().next() {
            Some(Component::ParentDir) => {
                resolved.pop();
            }
            Some(Component::CurDir) | None => {}
            Some(_) => resolved.push(name),
        }
    }
    Ok(resolved)
}

/// Reads a small file a user named ([`open_regular`]: never blocks, refuses anything but
/// a regular file), at most `limit` bytes (more is an [`io::ErrorKind::InvalidData`]
/// error: a configuration or key file that large is a mistake).
pub fn read_regular(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("is larger than {limit} bytes"),
        ));
    }
    Ok(bytes)
}

/// [`read_regular`] as UTF-8 text.
pub fn read_regular_text(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read_regular(path, limit)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "is not UTF-8 text"))
}

/// What identifies a file's content without reading it: a file with the same device,
/// inode, size, modification time and change time (both to the nanosecond) has not been
/// written since. (The change time also moves on a write that resets the modification
/// time, and on a `chmod` or `chown`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    /// The device.
    pub dev: u64,
    /// The inode.
    pub ino: u64,
    /// The size in bytes.
    pub size: u64,
    /// The modification time: seconds and nanoseconds.
    pub mtime: (i64, i64),
    /// The change time: seconds and nanoseconds.
    pub ctime: (i64, i64),
}

impl FileIdentity {
    /// The identity `meta` describes.
    pub fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// How `now` differs from this identity, in words, or `None` when it does not.
    pub fn difference(&self, now: &Self) -> Option<&'static str> {
        if (self.dev, self.ino) != (now.dev, now.ino) {
            Some("it was replaced by another file")
        } else if self.size != now.size {
            Some("its size changed")
        } else if self.mtime != now.mtime || self.ctime != now.ctime {
            Some("it was written, or its mode or owner changed")
        } else {
            None
        }
    }
}

/// Why [`read_regular_unchanged`] returned nothing.
#[derive(Debug)]
pub enum UnchangedReadError {
    /// The file could not be opened or read ([`read_regular`]'s errors).
    Io(io::Error),
    /// The file changed while it was read: how, in words (`its size changed`, `it was
    /// removed`, …). What was read is a mix of two versions, or a version being written.
    Changed(&'static str),
}

/// [`read_regular`], refusing a file that changed while it was read: a file an editor
/// or a script is writing in place (truncate, then write) would otherwise be read half
/// written, and its valid prefix taken for the whole.
///
/// The identity ([`FileIdentity`]) of the open descriptor is taken before the read and
/// again after it, and the path is looked up again after the read (a file renamed over
/// it, or its removal, leaves the descriptor unchanged); the bytes read must also be as
/// many as the file's size. Any difference is [`UnchangedReadError::Changed`].
///
/// What this cannot see: a writer that pauses between two writes for the whole read
/// leaves a consistent prefix on disk, which is read as it is. Writing the file under
/// another name and renaming it over (as most editors do) never shows a reader a
/// partial file.
pub fn read_regular_unchanged(path: &Path, limit: u64) -> Result<Vec<u8>, UnchangedReadError> {
    read_unchanged(path, limit, || {})
}

/// [`read_regular_unchanged`], calling `after_read` between the read and the second
/// look at the file (where a test changes it).
fn read_unchanged(
    path: &Path,
    limit: u64,
    after_read: impl FnOnce(),
) -> Result<Vec<u8>, UnchangedReadError> {
    use std::os::unix::fs::MetadataExt;
    let file = open_regular(path).map_err(UnchangedReadError::Io)?;
    let identity = |file: &File| {
        file.metadata()
            .map(|meta| FileIdentity::of(&meta))
            .map_err(UnchangedReadError::Io)
    };
    let before = identity(&file)?;
    let mut bytes = Vec::new();
    (&file)
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(UnchangedReadError::Io)?;
    if bytes.len() as u64 > limit {
        return Err(UnchangedReadError::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("is larger than {limit} bytes"),
        )));
    }
    after_read();
    // The path first: a removal or a rename over it also moves the old file's change
    // time, and the reason given should be the one that happened.
    match std::fs::metadata(path) {
        Ok(meta) if (meta.dev(), meta.ino()) == (before.dev, before.ino) => {}
        Ok(_) => {
            return Err(UnchangedReadError::Changed(
                "another file was renamed over it",
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(UnchangedReadError::Changed("it was removed"))
        }
        Err(e) => return Err(UnchangedReadError::Io(e)),
    }
    if let Some(how) = before.difference(&identity(&file)?) {
        return Err(UnchangedReadError::Changed(how));
    }
    if bytes.len() as u64 != before.size {
        return Err(UnchangedReadError::Changed("its size changed"));
    }
    Ok(bytes)
}

/// What [`stream_sha256`] read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Streamed {
    /// How many bytes were read.
    pub bytes: u64,
    /// Their SHA-256, 64 lowercase hex digits.
    pub sha256: String,
}

/// Why [`stream_sha256`] did not finish.
#[derive(Debug)]
pub enum StreamError {
    /// `stop` returned true before a chunk.
    Stopped,
    /// Reading the source failed.
    Read(io::Error),
    /// Writing the copy failed.
    Write(io::Error),
}

/// Options of [`stream_sha256`].
pub struct Stream<'a> {
    /// Also write every byte here (a copy being made while it is hashed).
    pub copy_to: Option<&'a mut dyn Write>,
    /// Stop reading once more than this many bytes were read (a file that grew).
    pub limit: Option<u64>,
    /// Checked before every chunk; `true` ends the stream with [`StreamError::Stopped`].
    pub stop: &'a dyn Fn() -> bool,
    /// Called with the size of every chunk after it was hashed.
    pub on_chunk: &'a mut dyn FnMut(u64),
}

/// Hashes everything `reader` yields (see the crate documentation).
#[allow(clippy::disallowed_methods)] // the one streaming SHA-256 owns the hasher (clippy.toml)
pub fn stream_sha256(
    reader: &mut dyn Read,
    buffer: &mut [u8],
    options: Stream<'_>,
) -> Result<Streamed, StreamError> {
    let Stream {
        mut copy_to,
        limit,
        stop,
        on_chunk,
    } = options;
    let mut hasher = Sha256::new();
    let mut bytes = 0u64;
    loop {
        if stop() {
            return Err(StreamError::Stopped);
        }
        let n = match reader.read(buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(StreamError::Read(e)),
        };
        hasher.update(&buffer[..n]);
        if let Some(copy) = copy_to.as_mut() {
            copy.write_all(&buffer[..n]).map_err(StreamError::Write)?;
        }
        bytes += n as u64;
        on_chunk(n as u64);
        if limit.is_some_and(|limit| bytes > limit) {
            break;
        }
    }
    Ok(Streamed {
        bytes,
        sha256: hex::encode(hasher.finalize()),
    })
}

/// [`stream_sha256`] with no copy, no limit, no stop and no progress.
pub fn sha256_of(reader: &mut dyn Read) -> io::Result<Streamed> {
    let mut buffer = vec![0u8; CHUNK];
    stream_sha256(
        reader,
        &mut buffer,
        Stream {
            copy_to: None,
            limit: None,
            stop: &|| false,
            on_chunk: &mut |_| {},
        },
    )
    .map_err(|e| match e {
        StreamError::Read(e) | StreamError::Write(e) => e,
        StreamError::Stopped => io::Error::from(io::ErrorKind::Interrupted),
    })
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests make a FIFO with `mkfifo`
mod tests {
    use super::*;

    #[test]
    fn uuids_have_the_version_4_form() {
        for _ in 0..64 {
            let id = uuid_v4().unwrap();
            let groups: Vec<&str> = id.split('-').collect();
            assert_eq!(
                groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
                [8, 4, 4, 4, 12],
                "{id}"
            );
            assert!(id
                .bytes()
                .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
            assert_eq!(&groups[2][..1], "4", "{id}");
            assert!(matches!(&groups[3][..1], "8" | "9" | "a" | "b"), "{id}");
        }
        assert_ne!(uuid_v4().unwrap(), uuid_v4().unwrap());
    }

    #[test]
    fn private_dirs_are_0700_whatever_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("ws/.arcane/run");
        // SAFETY: umask(2) only changes this process's file-creation mask; restored
        // below (tests of this crate create files with explicit modes).
        let old = unsafe { libc::umask(0) };
        let made = create_private_dirs(&deep);
        unsafe { libc::umask(old) };
        made.unwrap();
        for path in [dir.path().join("ws"), dir.path().join("ws/.arcane"), deep] {
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", path.display());
        }
    }

    #[test]
    fn a_temporary_name_left_by_an_earlier_writer_with_this_pid_is_not_in_the_way() {
        // A writer killed mid-write leaves `.NAME.<pid>.<n>.tmp`; when a later process
        // gets that pid, predictable names collide (`File exists`).
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("core.json");
        for n in 0..1000 {
            let debris = dir
                .path()
                .join(format!(".core.json.{}.{n}.tmp", std::process::id()));
            std::fs::write(debris, b"debris").unwrap();
        }
        write_atomic(&target, b"{}", 0o600).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"{}");
        // Nothing of its own is left beside the target.
        let left = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(left, 1001);
    }

    #[test]
    fn atomic_writes_replace_whole_files_with_the_mode_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record.json");
        write_atomic(&path, b"first", 0o600).unwrap();
        write_atomic(&path, b"second", 0o640).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        // Nothing but the target is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_failed_atomic_write_leaves_the_target_and_no_debris() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("taken");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("inside"), b"x").unwrap();
        // Renaming a file over a non-empty directory fails.
        assert!(write_atomic(&target, b"new", 0o600).is_err());
        assert!(target.join("inside").exists());
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "the temporary file was removed");
    }

    #[test]
    fn containment_is_decided_by_identity_not_spelling() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("dist/good");
        std::fs::create_dir_all(bundle.join("app")).unwrap();
        std::fs::create_dir_all(dir.path().join("work")).unwrap();
        let work = dir.path().join("work");
        let link = dir.path().join("state-link");
        std::os::unix::fs::symlink(&bundle, &link).unwrap();
        for inside in [
            work.join("../dist/good/app"),
            work.join("../dist/good/."),
            work.join("../dist/good/app/not-yet/state"),
            link.clone(),
            link.join("new"),
            bundle.clone(),
        ] {
            assert!(
                physically_inside(&inside, &bundle).unwrap(),
                "{}",
                inside.display()
            );
        }
        for outside in [
            work.join("state"),
            dir.path().join("dist/goodness"),
            work.join("../dist"),
        ] {
            assert!(
                !physically_inside(&outside, &bundle).unwrap(),
                "{}",
                outside.display()
            );
        }
    }

    #[test]
    fn a_fifo_is_refused_without_blocking_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("model.gguf");
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success());
        // Would block forever with a plain open (no writer ever comes).
        let error = open_regular(&fifo).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        assert!(error.to_string().contains("a FIFO"), "{error}");
        let error = open_regular(dir.path()).unwrap_err();
        assert!(error.to_string().contains("a directory"), "{error}");
        let file = dir.path().join("ok");
        std::fs::write(&file, b"x").unwrap();
        assert!(open_regular(&file).is_ok());
    }

    #[test]
    fn streaming_hashes_copies_limits_and_stops() {
        let data = vec![7u8; 3 * 1024 + 5];
        let expected = hex::encode(Sha256::digest(&data));
        assert_eq!(sha256_of(&mut &data[..]).unwrap().sha256, expected);
        let mut copy = Vec::new();
        let mut chunks = 0u64;
        let mut buffer = vec![0u8; 1024];
        let streamed = stream_sha256(
            &mut &data[..],
            &mut buffer,
            Stream {
                copy_to: Some(&mut copy),
                limit: None,
                stop: &|| false,
                on_chunk: &mut |n| chunks += n,
            },
        )
        .unwrap();
        assert_eq!(streamed.bytes, data.len() as u64);
        assert_eq!(chunks, data.len() as u64);
        assert_eq!(copy, data);
        let limited = stream_sha256(
            &mut &data[..],
            &mut buffer,
            Stream {
                copy_to: None,
                limit: Some(1000),
                stop: &|| false,
                on_chunk: &mut |_| {},
            },
        )
        .unwrap();
        assert_eq!(
            limited.bytes, 1024,
            "stops at the first chunk past the limit"
        );
        let stopped = stream_sha256(
            &mut &data[..],
            &mut buffer,
            Stream {
                copy_to: None,
                limit: None,
                stop: &|| true,
                on_chunk: &mut |_| {},
            },
        );
        assert!(matches!(stopped, Err(StreamError::Stopped)));
    }

    /// A file and what `read_unchanged` says when `change` runs between the read and
    /// the second look.
    fn read_changed_by(change: impl FnOnce(&Path)) -> Result<Vec<u8>, UnchangedReadError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("arcane.toml");
        std::fs::write(&path, "[[model]]\nid = \"a\"\n").unwrap();
        read_unchanged(&path, 1 << 20, || change(&path))
    }

    fn changed(result: Result<Vec<u8>, UnchangedReadError>) -> &'static str {
        match result {
            Err(UnchangedReadError::Changed(how)) => how,
            other => panic!("expected a change, got {other:?}"),
        }
    }

    #[test]
    fn an_unchanged_file_is_read_whole() {
        let read = read_changed_by(|_| {}).unwrap();
        assert_eq!(read, b"[[model]]\nid = \"a\"\n");
    }

    /// Issue 27, item 7: a file written while it is read is refused, whatever the
    /// write: appended to, truncated, rewritten in place at the same size, renamed
    /// over, removed.
    #[test]
    fn a_file_that_changes_while_it_is_read_is_refused_saying_how() {
        let append = |path: &Path| {
            let mut file = File::options().append(true).open(path).unwrap();
            file.write_all(b"[[model]]\nid = \"b\"\n").unwrap();
        };
        assert_eq!(changed(read_changed_by(append)), "its size changed");
        let truncate = |path: &Path| {
            File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_len(0)
                .unwrap();
        };
        assert_eq!(changed(read_changed_by(truncate)), "its size changed");
        // Same size, new bytes; its time set apart so the change is certain even
        // within one tick of the file system's clock.
        let rewrite = |path: &Path| {
            let file = File::options().write(true).open(path).unwrap();
            (&file).write_all(b"[[model]]\nid = \"z\"\n").unwrap();
            let then = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1);
            file.set_modified(then).unwrap();
        };
        assert_eq!(
            changed(read_changed_by(rewrite)),
            "it was written, or its mode or owner changed"
        );
        let rename_over = |path: &Path| {
            let other = path.with_extension("new");
            std::fs::write(&other, "[[model]]\nid = \"a\"\n").unwrap();
            std::fs::rename(&other, path).unwrap();
        };
        assert_eq!(
            changed(read_changed_by(rename_over)),
            "another file was renamed over it"
        );
        let remove = |path: &Path| std::fs::remove_file(path).unwrap();
        assert_eq!(changed(read_changed_by(remove)), "it was removed");
    }

    #[test]
    fn identities_differ_by_what_changed() {
        let base = FileIdentity {
            dev: 1,
            ino: 2,
            size: 3,
            mtime: (4, 5),
            ctime: (6, 7),
        };
        assert_eq!(base.difference(&base), None);
        let moved = |f: fn(&mut FileIdentity)| {
            let mut now = base;
            f(&mut now);
            base.difference(&now)
        };
        assert_eq!(
            moved(|n| n.ino = 9),
            Some("it was replaced by another file")
        );
        assert_eq!(moved(|n| n.size = 9), Some("its size changed"));
        let written = Some("it was written, or its mode or owner changed");
        assert_eq!(moved(|n| n.mtime.1 = 6), written);
        assert_eq!(moved(|n| n.ctime.1 = 8), written);
    }
}
