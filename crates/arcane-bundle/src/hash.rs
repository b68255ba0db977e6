//! SHA-256 of many files on every core, with progress and cancellation.
//!
//! One SHA-256 stream cannot be split, so parallelism is per file: the files are
//! taken largest first from a shared queue by `threads` workers (longest-processing-
//! time-first scheduling keeps the cores busy until the end). Each file is opened
//! with `O_NOFOLLOW`, its identity (device, inode), type, link count and size are
//! checked against what the tree walk saw before a byte is read, and checked again
//! after the last byte, so a file swapped or changed during hashing is reported
//! instead of trusted (packaging-spec §4.3, case 16).

use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use arcane_report::{CancelToken, Event, EventSink};
use serde_json::json;

/// Read size per `read(2)`.
const CHUNK: usize = arcane_files::CHUNK;
/// Least time between two progress events.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// One file to hash.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    /// Absolute path to open.
    pub path: PathBuf,
    /// Expected size.
    pub size: u64,
    /// (device, inode) the walk recorded; `None` skips the identity check.
    pub identity: Option<(u64, u64)>,
}

/// What hashing one file found.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The lowercase hex digest.
    Digest(String),
    /// The file is not the one the walk saw, or changed while being read.
    Changed(String),
    /// It could not be opened or read.
    Io(std::io::Error),
}

/// Emits `<kind>` progress events `{filesDone, filesTotal, bytesDone, bytesTotal}`
/// at most every 200 ms, plus one at the end.
pub(crate) struct Progress<'a> {
    kind: &'static str,
    events: &'a dyn EventSink,
    files_total: u64,
    bytes_total: u64,
    files_done: AtomicU64,
    bytes_done: AtomicU64,
    last: Mutex<Instant>,
}

impl<'a> Progress<'a> {
    pub(crate) fn new(
        kind: &'static str,
        events: &'a dyn EventSink,
        files_total: u64,
        bytes_total: u64,
    ) -> Self {
        Self {
            kind,
            events,
            files_total,
            bytes_total,
            files_done: AtomicU64::new(0),
            bytes_done: AtomicU64::new(0),
            last: Mutex::new(Instant::now()),
        }
    }

    pub(crate) fn add_bytes(&self, bytes: u64) {
        self.bytes_done.fetch_add(bytes, Ordering::Relaxed);
        self.maybe_emit(false);
    }

    pub(crate) fn file_done(&self) {
        self.files_done.fetch_add(1, Ordering::Relaxed);
        self.maybe_emit(false);
    }

    pub(crate) fn finish(&self) {
        self.maybe_emit(true);
    }

    fn maybe_emit(&self, force: bool) {
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        if !force && last.elapsed() < PROGRESS_EVERY {
            return;
        }
        *last = Instant::now();
        self.events.emit(Event::new(
            self.kind,
            json!({
                "filesDone": self.files_done.load(Ordering::Relaxed),
                "filesTotal": self.files_total,
                "bytesDone": self.bytes_done.load(Ordering::Relaxed),
                "bytesTotal": self.bytes_total,
            }),
        ));
    }
}

/// The default number of hashing threads: every available core, at most 8.
pub(crate) fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(1, 8)
}

/// Hashes every job on `threads` workers. Returns one outcome per job, in job order,
/// or `None` when `cancel` fired.
pub(crate) fn hash_all(
    jobs: &[Job],
    threads: usize,
    progress: &Progress<'_>,
    cancel: &CancelToken,
) -> Option<Vec<Outcome>> {
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by(|a, b| jobs[*b].size.cmp(&jobs[*a].size));
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let results: Vec<Mutex<Option<Outcome>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    let workers = threads.clamp(1, jobs.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                let mut buffer = vec![0u8; CHUNK];
                loop {
                    if stop.load(Ordering::Relaxed) || cancel.is_cancelled() {
                        stop.store(true, Ordering::Relaxed);
                        return;
                    }
                    let slot = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&index) = order.get(slot) else {
                        return;
                    };
                    let outcome = hash_one(&jobs[index], &mut buffer, progress, cancel, &stop);
                    progress.file_done();
                    if let Ok(mut result) = results[index].lock() {
                        *result = Some(outcome);
                    }
                }
            });
        }
    });
    progress.finish();
    if stop.load(Ordering::Relaxed) || cancel.is_cancelled() {
        return None;
    }
    Some(
        results
            .into_iter()
            .map(|m| {
                m.into_inner()
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| Outcome::Changed("the file was not hashed".into()))
            })
            .collect(),
    )
}

fn hash_one(
    job: &Job,
    buffer: &mut [u8],
    progress: &Progress<'_>,
    cancel: &CancelToken,
    stop: &AtomicBool,
) -> Outcome {
    let mut file = match File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(&job.path)
    {
        Ok(file) => file,
        Err(error) if error.raw_os_error() == Some(libc::ELOOP) => {
            return Outcome::Changed("it became a symlink".into())
        }
        Err(error) => return Outcome::Io(error),
    };
    let before = match file.metadata() {
        Ok(metadata) => metadata,
        Err(error) => return Outcome::Io(error),
    };
    if !before.file_type().is_file() {
        return Outcome::Changed("it is no longer a regular file".into());
    }
    if let Some((dev, ino)) = job.identity {
        if before.dev() != dev || before.ino() != ino {
            return Outcome::Changed("it was replaced by another file".into());
        }
    }
    if before.nlink() > 1 {
        return Outcome::Changed(format!("it gained a hard link (nlink {})", before.nlink()));
    }
    if before.len() != job.size {
        return Outcome::Changed(format!("its size changed to {}", before.len()));
    }
    // Reading stops one chunk past the expected size: a file that grew is reported
    // below without reading all of it.
    let streamed = arcane_files::stream_sha256(
        &mut file,
        buffer,
        arcane_files::Stream {
            copy_to: None,
            limit: Some(job.size),
            stop: &|| cancel.is_cancelled() || stop.load(Ordering::Relaxed),
            on_chunk: &mut |n| progress.add_bytes(n),
        },
    );
    let streamed = match streamed {
        Ok(streamed) => streamed,
        Err(arcane_files::StreamError::Stopped) => {
            return Outcome::Changed("hashing was cancelled".into())
        }
        Err(arcane_files::StreamError::Read(error) | arcane_files::StreamError::Write(error)) => {
            return Outcome::Io(error)
        }
    };
    let after = match file.metadata() {
        Ok(metadata) => metadata,
        Err(error) => return Outcome::Io(error),
    };
    if streamed.bytes != job.size
        || after.len() != before.len()
        || after.mtime() != before.mtime()
        || after.mtime_nsec() != before.mtime_nsec()
        || after.ctime() != before.ctime()
        || after.ctime_nsec() != before.ctime_nsec()
    {
        return Outcome::Changed("it changed while it was being read".into());
    }
    Outcome::Digest(streamed.sha256)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arcane_report::Collector;
    use sha2::{Digest, Sha256};

    #[test]
    fn hashes_many_files_in_job_order_on_several_threads() {
        let dir = tempfile::tempdir().unwrap();
        let mut jobs = Vec::new();
        let mut expected = Vec::new();
        for i in 0..9u8 {
            let path = dir.path().join(format!("f{i}"));
            let content = vec![i; 1000 * usize::from(i) + 3];
            std::fs::write(&path, &content).unwrap();
            let metadata = std::fs::metadata(&path).unwrap();
            jobs.push(Job {
                path,
                size: content.len() as u64,
                identity: Some((metadata.dev(), metadata.ino())),
            });
            expected.push(hex::encode(Sha256::digest(&content)));
        }
        let sink = Collector::default();
        let progress = Progress::new("test.progress", &sink, 9, 0);
        let outcomes = hash_all(&jobs, 3, &progress, &CancelToken::new()).unwrap();
        for (outcome, want) in outcomes.iter().zip(&expected) {
            match outcome {
                Outcome::Digest(got) => assert_eq!(got, want),
                other => panic!("{other:?}"),
            }
        }
        let last = sink.events().pop().unwrap();
        assert_eq!(last.data["filesDone"], 9);
    }

    #[test]
    fn a_swapped_or_resized_file_is_reported_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"hello").unwrap();
        let metadata = std::fs::metadata(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"hello").unwrap();
        let jobs = [
            Job {
                path: path.clone(),
                size: 5,
                identity: Some((metadata.dev(), metadata.ino())),
            },
            Job {
                path,
                size: 4,
                identity: None,
            },
        ];
        let progress = Progress::new("test.progress", &arcane_report::NullSink, 2, 0);
        let outcomes = hash_all(&jobs, 2, &progress, &CancelToken::new()).unwrap();
        // The inode may be reused by the file system; then only the second check applies.
        if metadata.ino() != std::fs::metadata(&jobs[0].path).unwrap().ino() {
            assert!(
                matches!(&outcomes[0], Outcome::Changed(_)),
                "{:?}",
                outcomes[0]
            );
        }
        assert!(
            matches!(&outcomes[1], Outcome::Changed(_)),
            "{:?}",
            outcomes[1]
        );
    }

    #[test]
    fn cancellation_returns_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let cancel = CancelToken::new();
        cancel.cancel();
        let progress = Progress::new("test.progress", &arcane_report::NullSink, 1, 1);
        assert!(hash_all(
            &[Job {
                path,
                size: 1,
                identity: None
            }],
            2,
            &progress,
            &cancel
        )
        .is_none());
    }
}
