//! Streaming SHA-256 for the registry: archives, models and (through [`sha256_file`])
//! bundles. The loop itself is [`arcane_files::stream_sha256`] (1 MiB chunks); this
//! module wraps it with the registry's errors, its cancellation token (checked before
//! every chunk) and its `progress(done, total)` callback (called after every chunk).

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use arcane_files::{Stream, StreamError};
use arcane_report::CancelToken;

use crate::Error;

/// The chunk size of every streaming read (large enough to keep the hasher busy).
pub(crate) const CHUNK: usize = arcane_files::CHUNK;

/// Hashes the file at `path`, returning its SHA-256 as 64 lowercase hex digits.
///
/// `progress(done, total)` is called after every chunk (`total` is the file's size when
/// hashing started). Returns [`Error::Cancelled`] promptly when `cancel` fires.
///
/// ```no_run
/// # use arcane_report::CancelToken;
/// let digest = arcane_registry::sha256_file("model.gguf".as_ref(), &CancelToken::new(), &mut |_, _| {})?;
/// assert_eq!(digest.len(), 64);
/// # Ok::<(), arcane_registry::Error>(())
/// ```
pub fn sha256_file(
    path: &Path,
    cancel: &CancelToken,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<String, Error> {
    let mut file = arcane_files::open_regular(path).map_err(|e| Error::io("open", path, e))?;
    let total = file
        .metadata()
        .map_err(|e| Error::io("inspect", path, e))?
        .len();
    sha256_reader(&mut file, total, path, cancel, progress)
}

/// Hashes everything `reader` yields; `total` is only passed through to `progress`, and
/// `path` only names the source in errors.
pub fn sha256_reader(
    reader: &mut dyn Read,
    total: u64,
    path: &Path,
    cancel: &CancelToken,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<String, Error> {
    stream(reader, None, total, cancel, progress)
        .map(|(_, sha256)| sha256)
        .map_err(|e| stream_error(e, "hashing", path, path))
}

/// Runs the shared loop with the registry's cancellation and progress.
fn stream(
    reader: &mut dyn Read,
    copy_to: Option<&mut dyn Write>,
    total: u64,
    cancel: &CancelToken,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(u64, String), StreamError> {
    let mut buffer = vec![0u8; CHUNK];
    let mut done = 0u64;
    let streamed = arcane_files::stream_sha256(
        reader,
        &mut buffer,
        Stream {
            // Reborrowed, so the stream's lifetime can be this call's.
            copy_to: copy_to.map(|w| w as &mut dyn Write),
            limit: None,
            stop: &|| cancel.is_cancelled(),
            on_chunk: &mut |n| {
                done += n;
                progress(done, total);
            },
        },
    )?;
    Ok((streamed.bytes, streamed.sha256))
}

/// The registry's error for a stream that did not finish: `operation` names what was
/// cancelled, `from` the source of a failed read, `to` the target of a failed write.
fn stream_error(error: StreamError, operation: &'static str, from: &Path, to: &Path) -> Error {
    match error {
        StreamError::Stopped => Error::cancelled(operation),
        StreamError::Read(e) => Error::io("read", from, e),
        StreamError::Write(e) => Error::io("write", to, e),
    }
}

/// Copies `from` to the new file `to` (which must not exist), hashing the bytes on the
/// way; fsyncs the copy. Returns `(bytes, sha256)`. On error or cancellation the
/// partial copy is removed.
pub(crate) fn copy_and_hash(
    from: &Path,
    to: &Path,
    cancel: &CancelToken,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(u64, String), Error> {
    let result = copy_and_hash_inner(from, to, cancel, progress);
    if result.is_err() {
        let _ = std::fs::remove_file(to);
    }
    result
}

fn copy_and_hash_inner(
    from: &Path,
    to: &Path,
    cancel: &CancelToken,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(u64, String), Error> {
    let mut source = arcane_files::open_regular(from).map_err(|e| Error::io("open", from, e))?;
    let total = source
        .metadata()
        .map_err(|e| Error::io("inspect", from, e))?
        .len();
    // The copy is this user's and nobody else may write it, whatever the umask.
    let mut target = File::options()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(to)
        .map_err(|e| Error::io("create", to, e))?;
    target
        .set_permissions(std::fs::Permissions::from_mode(0o644))
        .map_err(|e| Error::io("chmod", to, e))?;
    let (done, sha256) = stream(&mut source, Some(&mut target), total, cancel, progress)
        .map_err(|e| stream_error(e, "copying", from, to))?;
    target.sync_all().map_err(|e| Error::io("sync", to, e))?;
    Ok((done, sha256))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digests() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abc");
        std::fs::write(&path, b"abc").unwrap();
        let mut calls = Vec::new();
        let digest =
            sha256_file(&path, &CancelToken::new(), &mut |d, t| calls.push((d, t))).unwrap();
        assert_eq!(
            digest,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(calls, vec![(3, 3)]);

        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert_eq!(
            sha256_file(&empty, &CancelToken::new(), &mut |_, _| {}).unwrap(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn copy_hashes_what_it_writes_and_cleans_up_on_cancel() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("from");
        let data: Vec<u8> = (0..(3 * CHUNK + 17)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&from, &data).unwrap();
        let to = dir.path().join("to");
        let (bytes, digest) =
            copy_and_hash(&from, &to, &CancelToken::new(), &mut |_, _| {}).unwrap();
        assert_eq!(bytes, data.len() as u64);
        assert_eq!(std::fs::read(&to).unwrap(), data);
        assert_eq!(
            digest,
            sha256_file(&from, &CancelToken::new(), &mut |_, _| {}).unwrap()
        );

        let cancel = CancelToken::new();
        let again = dir.path().join("again");
        let error = copy_and_hash(&from, &again, &cancel, &mut |done, _| {
            if done >= CHUNK as u64 {
                cancel.cancel()
            }
        })
        .unwrap_err();
        assert!(error.is_cancelled());
        assert!(!again.exists());
    }
}
