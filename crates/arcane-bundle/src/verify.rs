//! Strict verification: the manifest, the tree and every byte.
//!
//! [`verify`] checks, in this order, and reports *every* failure it finds (up to
//! [`MAX_FAILURES`]), each with a stable `BUNDLE_*` code and the bundle path:
//!
//! 1. the manifest: a regular, single-link file of at most 16 MiB that parses strictly
//!    ([`Manifest::parse`]) and passes [`Manifest::check`] (path grammar, set rules,
//!    cross-references). A path that fails here is never opened;
//! 2. the target: the manifest's `os-arch` must be this host's;
//! 3. the tree: walked from the root with `openat(O_NOFOLLOW | O_DIRECTORY)` and
//!    `fstatat(AT_SYMLINK_NOFOLLOW)`, so no symlink is ever followed. Symlinks
//!    (`BUNDLE_SYMLINK`), files with more than one link (`BUNDLE_HARDLINK`), FIFOs,
//!    sockets and devices (`BUNDLE_SPECIAL_FILE`), and files or directories that no
//!    listed path accounts for (`BUNDLE_UNLISTED`) are failures. So is anything (the
//!    root, the manifest and every directory and regular file included) that someone
//!    other than the verifier could change before launch: writable by group or others
//!    (`BUNDLE_WRITABLE`; a sticky bit does not excuse it inside a bundle), a file with
//!    a setuid or setgid bit (`BUNDLE_SETID`), or owned by a user other than the
//!    verifier or root (`BUNDLE_FOREIGN_OWNER`); each names the path, its mode or
//!    owner and the fix. The identity of every listed file is recorded for launch
//!    ([`crate::pinned`]);
//! 4. every listed file: present as a regular file (`BUNDLE_MISSING`), of the listed
//!    size (`BUNDLE_SIZE_MISMATCH`, decided before any hashing), with the listed
//!    executable bit (`BUNDLE_MODE_MISMATCH`);
//! 5. content: SHA-256 of every remaining file on every core ([`crate::hash`]), with
//!    identity re-checks (`BUNDLE_FILE_CHANGED`) and `BUNDLE_HASH_MISMATCH`.
//!
//! Nothing is written, so verification works on a read-only bundle. The whole bundle
//! is hashed on every call (there is no verify cache yet).

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use arcane_report::{codes, CancelToken, Event, EventSink};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use serde::Serialize;
use serde_json::json;

use crate::error::Error;
use crate::failure::Failure;
use crate::hash::{self, Job, Outcome, Progress};
use crate::manifest::{FileEntry, Manifest, Target, MANIFEST_NAME, MAX_MANIFEST_BYTES};
use crate::pinned::{identity_of_stat, FileIdentity, Identities};

/// The most failures a report keeps; the rest are counted in `omitted`.
pub const MAX_FAILURES: usize = 1000;
/// The deepest directory nesting walked.
const MAX_DEPTH: usize = 128;

/// Options of [`verify`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct VerifyOptions {
    /// Refuse a bundle built for another OS or architecture (default: yes).
    pub check_target: bool,
    /// Hashing threads (default: every core, at most 8).
    pub threads: Option<usize>,
    /// Require a signature by this key over the manifest (see [`crate::sign`]).
    pub trusted_key: Option<crate::sign::PublicKey>,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        Self {
            check_target: true,
            threads: None,
            trusted_key: None,
        }
    }
}

impl VerifyOptions {
    /// Sets the number of hashing threads.
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = Some(threads.max(1));
        self
    }

    /// Whether to check the target against this host.
    pub fn check_target(mut self, check: bool) -> Self {
        self.check_target = check;
        self
    }
}

/// The outcome of [`verify`]: clean when `failures` is empty.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyReport {
    /// The bundle root, canonicalized.
    pub root: PathBuf,
    /// The manifest, when it could be parsed.
    #[serde(skip)]
    pub manifest: Option<Manifest>,
    /// The manifest's `bundleId`, when it could be parsed.
    pub bundle_id: Option<String>,
    /// Every failure, in check order.
    pub failures: Vec<Failure>,
    /// Failures found beyond [`MAX_FAILURES`] and not kept.
    pub omitted: usize,
    /// Files whose content was hashed.
    pub files_hashed: u64,
    /// Bytes hashed.
    pub bytes_hashed: u64,
    /// The identity of every listed file the walk saw, for launch ([`crate::pinned`]).
    #[serde(skip)]
    identities: Identities,
}

impl VerifyReport {
    /// Whether the bundle passed every check.
    pub fn is_clean(&self) -> bool {
        self.failures.is_empty() && self.omitted == 0
    }

    /// The verified bundle, or [`Error::Integrity`] with every failure.
    pub fn into_verified(self) -> Result<VerifiedBundle, Error> {
        match self.manifest {
            Some(manifest) if self.failures.is_empty() && self.omitted == 0 => Ok(VerifiedBundle {
                root: self.root,
                manifest,
                identities: self.identities,
            }),
            _ => Err(Error::Integrity {
                root: self.root,
                failures: self.failures,
            }),
        }
    }

    fn push(&mut self, failure: Failure) {
        if self.failures.len() < MAX_FAILURES {
            self.failures.push(failure);
        } else {
            self.omitted += 1;
        }
    }
}

/// A bundle that passed [`verify`]: its root and manifest, and the identity of every
/// file as verified (launch re-checks it, see [`crate::pinned`]).
#[derive(Debug, Clone)]
pub struct VerifiedBundle {
    /// The bundle root (absolute, canonical).
    pub root: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// Every listed file's identity as the verifying walk saw it.
    pub(crate) identities: Identities,
}

impl VerifiedBundle {
    /// The absolute path of a bundle-relative manifest path.
    pub fn resolve(&self, relative: &str) -> PathBuf {
        relative
            .split('/')
            .fold(self.root.clone(), |path, segment| path.join(segment))
    }
}

/// Verifies the bundle at `root` (see the module docs for every check).
///
/// Returns the report, clean or not; `Err` only when the root itself cannot be opened
/// or `cancel` fires. Emits `bundle.verify.started`, `bundle.verify.progress`
/// `{filesDone, filesTotal, bytesDone, bytesTotal}` and `bundle.verify.finished`
/// `{failures}`.
pub fn verify(
    root: &Path,
    options: &VerifyOptions,
    events: &dyn EventSink,
    cancel: &CancelToken,
) -> Result<VerifyReport, Error> {
    let (root, root_fd) = open_root(root)?;
    events.emit(Event::new(
        arcane_report::event_types::BUNDLE_VERIFY_STARTED,
        json!({"root": root}),
    ));
    let mut report = VerifyReport {
        root: root.clone(),
        manifest: None,
        bundle_id: None,
        failures: Vec::new(),
        omitted: 0,
        files_hashed: 0,
        bytes_hashed: 0,
        identities: Identities::new(),
    };

    // 1. The manifest (and, with a trusted key, its signature).
    let (manifest, manifest_bytes) = match read_manifest(&root_fd) {
        Ok(read) => read,
        Err(failure) => {
            report.push(failure);
            finish(events, &report);
            return Ok(report);
        }
    };
    for failure in manifest.check() {
        report.push(failure);
    }
    report.bundle_id = Some(manifest.bundle_id.clone());
    if let Some(trusted) = &options.trusted_key {
        check_signature(&root_fd, &manifest_bytes, trusted, &mut report);
    }

    // 2. The target.
    if options.check_target {
        check_target(&manifest, &mut report);
    }

    // 3. The tree.
    let listed = manifest.openable(&report.failures);
    let (seen, present) = walk_tree(&root_fd, &listed, &mut report, cancel)?;

    // 4. Presence, size and mode of every listed file.
    let (jobs, entries) = check_listed_files(&root, &listed, &seen, &present, &mut report);

    // 5. Content.
    check_content(&jobs, &entries, options, events, cancel, &mut report)?;
    report.identities = seen
        .into_iter()
        .map(|(path, seen)| (path, seen.identity))
        .collect();
    report.manifest = Some(manifest);
    finish(events, &report);
    Ok(report)
}

/// Canonicalizes `root` and opens it as a directory.
fn open_root(root: &Path) -> Result<(PathBuf, OwnedFd), Error> {
    let root = std::fs::canonicalize(root).map_err(|e| Error::io("open bundle", root, e))?;
    let root_fd = rustix::fs::open(
        &root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io("open bundle", &root, e.into()))?;
    Ok((root, root_fd))
}

/// Step 2 of [`verify`]: the bundle targets this host.
fn check_target(manifest: &Manifest, report: &mut VerifyReport) {
    let host = Target::host();
    if manifest.target != host {
        report.push(Failure::whole(
            codes::BUNDLE_TARGET_MISMATCH,
            format!(
                "the bundle targets `{}` but this host is `{host}`",
                manifest.target
            ),
            json!({"expected": manifest.target, "host": host}),
        ));
    }
}

/// Step 3 of [`verify`]: walks the tree, reporting what is not listed; returns the
/// regular files it saw and the listed paths present as something else.
fn walk_tree(
    root_fd: &OwnedFd,
    listed: &HashMap<String, FileEntry>,
    report: &mut VerifyReport,
    cancel: &CancelToken,
) -> Result<(HashMap<String, Seen>, HashSet<String>), Error> {
    let directories = listed_directories(listed);
    match rustix::fs::fstat(root_fd) {
        Ok(stat) => check_permissions(".", &stat, report),
        Err(error) => return Err(Error::io("inspect", ".", error.into())),
    }
    let mut walk = Walk {
        listed,
        directories: &directories,
        seen: HashMap::new(),
        present: HashSet::new(),
        report,
        cancel,
    };
    walk.directory(root_fd, "", 0)?;
    let Walk { seen, present, .. } = walk;
    Ok((seen, present))
}

/// Every directory a listed path lies in (`a`, `a/b` for `a/b/c`).
fn listed_directories(listed: &HashMap<String, FileEntry>) -> HashSet<String> {
    let mut directories: HashSet<String> = HashSet::new();
    for path in listed.keys() {
        let mut end = 0;
        while let Some(offset) = path[end..].find('/') {
            end += offset;
            directories.insert(path[..end].to_string());
            end += 1;
        }
    }
    directories
}

/// Step 4 of [`verify`]: presence, size and mode of every listed file, in path order.
/// Returns the hashing jobs and, index for index, the entries they check.
fn check_listed_files<'m>(
    root: &Path,
    listed: &'m HashMap<String, FileEntry>,
    seen: &HashMap<String, Seen>,
    present: &HashSet<String>,
    report: &mut VerifyReport,
) -> (Vec<Job>, Vec<&'m FileEntry>) {
    let mut jobs = Vec::new();
    let mut entries: Vec<&FileEntry> = Vec::new();
    let mut sorted: Vec<&FileEntry> = listed.values().collect();
    sorted.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    for entry in sorted {
        let Some(stat) = seen.get(&entry.path) else {
            if !present.contains(&entry.path) {
                report.push(Failure::at(
                    codes::BUNDLE_MISSING,
                    &entry.path,
                    "is listed but missing",
                    json!({"size": entry.size}),
                ));
            }
            continue;
        };
        if !check_listed_file(entry, stat, report) {
            continue;
        }
        let path = entry
            .path
            .split('/')
            .fold(root.to_path_buf(), |path, segment| path.join(segment));
        jobs.push(Job {
            path,
            size: entry.size,
            identity: Some((stat.dev, stat.ino)),
        });
        entries.push(entry);
    }
    (jobs, entries)
}

/// The size and mode of one listed file that exists; `false` when its content is not
/// to be hashed (a hard link, or the wrong size).
fn check_listed_file(entry: &FileEntry, stat: &Seen, report: &mut VerifyReport) -> bool {
    if stat.nlink > 1 {
        return false; // Reported as BUNDLE_HARDLINK by the walk; its content is not trusted.
    }
    if stat.size != entry.size {
        report.push(Failure::at(
            codes::BUNDLE_SIZE_MISMATCH,
            &entry.path,
            format!("has {} bytes, the manifest lists {}", stat.size, entry.size),
            json!({"expected": entry.size, "actual": stat.size}),
        ));
        return false;
    }
    let executable = stat.mode & 0o111 != 0;
    if executable != entry.exec {
        report.push(Failure::at(
            codes::BUNDLE_MODE_MISMATCH,
            &entry.path,
            if entry.exec {
                "is listed as executable but is not".to_string()
            } else {
                "is executable but not listed as such".to_string()
            },
            json!({"expectedExec": entry.exec, "mode": format!("{:o}", stat.mode & 0o7777)}),
        ));
    }
    true
}

/// Step 5 of [`verify`]: hashes the files on every core and compares the digests.
fn check_content(
    jobs: &[Job],
    entries: &[&FileEntry],
    options: &VerifyOptions,
    events: &dyn EventSink,
    cancel: &CancelToken,
    report: &mut VerifyReport,
) -> Result<(), Error> {
    let bytes_total: u64 = jobs.iter().map(|j| j.size).sum();
    let progress = Progress::new(
        arcane_report::event_types::BUNDLE_VERIFY_PROGRESS,
        events,
        jobs.len() as u64,
        bytes_total,
    );
    let threads = options.threads.unwrap_or_else(hash::default_threads);
    let outcomes = hash::hash_all(jobs, threads, &progress, cancel).ok_or(Error::Cancelled {
        operation: "bundle verify",
    })?;
    for (entry, outcome) in entries.iter().zip(outcomes) {
        match outcome {
            Outcome::Digest(digest) => {
                report.files_hashed += 1;
                report.bytes_hashed += entry.size;
                if digest != entry.sha256 {
                    report.push(Failure::at(
                        codes::BUNDLE_HASH_MISMATCH,
                        &entry.path,
                        "content differs from the manifest's SHA-256",
                        json!({"expected": entry.sha256, "actual": digest}),
                    ));
                }
            }
            Outcome::Changed(reason) => report.push(Failure::at(
                codes::BUNDLE_FILE_CHANGED,
                &entry.path,
                format!("changed during verification: {reason}"),
                json!({"reason": reason}),
            )),
            Outcome::Io(error) => report.push(Failure::at(
                codes::BUNDLE_MISSING,
                &entry.path,
                format!("cannot be read ({error})"),
                json!({"reason": "unreadable", "error": error.to_string()}),
            )),
        }
    }
    Ok(())
}

/// Verifies and returns the bundle, or [`Error::Integrity`] listing every failure.
pub fn verify_strict(
    root: &Path,
    options: &VerifyOptions,
    events: &dyn EventSink,
    cancel: &CancelToken,
) -> Result<VerifiedBundle, Error> {
    verify(root, options, events, cancel)?.into_verified()
}

fn finish(events: &dyn EventSink, report: &VerifyReport) {
    events.emit(Event::new(
        arcane_report::event_types::BUNDLE_VERIFY_FINISHED,
        json!({"root": report.root, "failures": report.failures.len() + report.omitted, "filesHashed": report.files_hashed, "bytesHashed": report.bytes_hashed}),
    ));
}

fn read_manifest(root_fd: &OwnedFd) -> Result<(Manifest, Vec<u8>), Failure> {
    let invalid = |message: String, details: serde_json::Value| {
        Failure::at(
            codes::BUNDLE_MANIFEST_INVALID,
            MANIFEST_NAME,
            message,
            details,
        )
    };
    let stat = match rustix::fs::statat(root_fd, MANIFEST_NAME, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(rustix::io::Errno::NOENT) => {
            return Err(invalid("is missing".into(), json!({"reason": "missing"})))
        }
        Err(error) => {
            return Err(invalid(
                format!("cannot be inspected ({})", std::io::Error::from(error)),
                json!({"reason": "unreadable"}),
            ))
        }
    };
    match FileType::from_raw_mode(stat.st_mode as _) {
        FileType::RegularFile => {}
        FileType::Symlink => {
            return Err(Failure::at(
                codes::BUNDLE_SYMLINK,
                MANIFEST_NAME,
                "the manifest is a symlink",
                json!({}),
            ))
        }
        _ => {
            return Err(Failure::at(
                codes::BUNDLE_SPECIAL_FILE,
                MANIFEST_NAME,
                "the manifest is not a regular file",
                json!({}),
            ))
        }
    }
    if stat.st_nlink as u64 > 1 {
        return Err(Failure::at(
            codes::BUNDLE_HARDLINK,
            MANIFEST_NAME,
            format!("the manifest has {} hard links", stat.st_nlink),
            json!({"nlink": stat.st_nlink as u64}),
        ));
    }
    if stat.st_size as u64 > MAX_MANIFEST_BYTES {
        return Err(invalid(
            format!("is larger than {MAX_MANIFEST_BYTES} bytes"),
            json!({"reason": "too-large", "size": stat.st_size as u64}),
        ));
    }
    let fd = rustix::fs::openat(
        root_fd,
        MANIFEST_NAME,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| {
        invalid(
            format!("cannot be opened ({})", std::io::Error::from(e)),
            json!({"reason": "unreadable"}),
        )
    })?;
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| {
            invalid(
                format!("cannot be read ({e})"),
                json!({"reason": "unreadable"}),
            )
        })?;
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(invalid(
            format!("is larger than {MAX_MANIFEST_BYTES} bytes"),
            json!({"reason": "too-large"}),
        ));
    }
    Manifest::parse(&bytes).map(|manifest| (manifest, bytes))
}

/// Step 1b of [`verify`]: with a trusted key, the manifest's signature
/// (`arcane-bundle.json.minisig`, a regular file read without following a link) must be
/// that key's over these exact manifest bytes.
fn check_signature(
    root_fd: &OwnedFd,
    manifest: &[u8],
    trusted: &crate::sign::PublicKey,
    report: &mut VerifyReport,
) {
    use crate::sign::{SignError, SIGNATURE_NAME};
    let signature = match rustix::fs::openat(
        root_fd,
        SIGNATURE_NAME,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    ) {
        Ok(fd) => {
            let file = std::fs::File::from(fd);
            let regular = file.metadata().map(|m| m.is_file()).unwrap_or(false);
            let mut bytes = Vec::new();
            let read = file.take(8192).read_to_end(&mut bytes).is_ok();
            Some(if regular && read { bytes } else { Vec::new() })
        }
        Err(rustix::io::Errno::NOENT) => None,
        Err(_) => Some(Vec::new()),
    };
    let Err(error) = crate::sign::check(manifest, signature.as_deref(), trusted) else {
        return;
    };
    let (code, reason, signed_by) = match &error {
        SignError::Unsigned { .. } => (codes::BUNDLE_UNSIGNED, "unsigned", None),
        SignError::WrongKey { signed_by, .. } => (
            codes::BUNDLE_SIGNATURE_INVALID,
            "other-key",
            Some(signed_by.clone()),
        ),
        SignError::Invalid { .. } => (codes::BUNDLE_SIGNATURE_INVALID, "mismatch", None),
        _ => (codes::BUNDLE_SIGNATURE_INVALID, "malformed", None),
    };
    report.push(Failure::at(
        code,
        SIGNATURE_NAME,
        error.to_string(),
        json!({"reason": reason, "trustedKey": trusted.id(), "signedBy": signed_by}),
    ));
}

/// What the walk recorded about a regular file.
struct Seen {
    dev: u64,
    ino: u64,
    size: u64,
    mode: u32,
    nlink: u64,
    identity: FileIdentity,
}

struct Walk<'a> {
    listed: &'a HashMap<String, FileEntry>,
    directories: &'a HashSet<String>,
    /// Regular files by relative path.
    seen: HashMap<String, Seen>,
    /// Listed paths that exist as something other than a regular file (already reported).
    present: HashSet<String>,
    report: &'a mut VerifyReport,
    cancel: &'a CancelToken,
}

impl Walk<'_> {
    fn directory(&mut self, fd: &OwnedFd, prefix: &str, depth: usize) -> Result<(), Error> {
        if self.cancel.is_cancelled() {
            return Err(Error::Cancelled {
                operation: "bundle verify",
            });
        }
        for name in sorted_names(fd, prefix)? {
            self.entry(fd, prefix, &name, depth)?;
        }
        Ok(())
    }

    /// One entry `name` of the directory `fd` (at `prefix`, `depth` levels down).
    fn entry(
        &mut self,
        fd: &OwnedFd,
        prefix: &str,
        name: &[u8],
        depth: usize,
    ) -> Result<(), Error> {
        let shown = String::from_utf8_lossy(name).into_owned();
        let relative = if prefix.is_empty() {
            shown.clone()
        } else {
            format!("{prefix}/{shown}")
        };
        let Ok(text) = std::str::from_utf8(name) else {
            self.report.push(Failure::at(
                codes::BUNDLE_PATH_INVALID,
                &relative,
                "is not valid UTF-8",
                json!({"reason": "not-utf8"}),
            ));
            return Ok(());
        };
        let stat = match rustix::fs::statat(fd, OsStr::from_bytes(name), AtFlags::SYMLINK_NOFOLLOW)
        {
            Ok(stat) => stat,
            Err(rustix::io::Errno::NOENT) => return Ok(()), // Vanished since the listing; judged below as missing if listed.
            Err(error) => return Err(Error::io("inspect", shown_dir(&relative), error.into())),
        };
        check_permissions(&relative, &stat, self.report);
        if prefix.is_empty() && (text == MANIFEST_NAME || text == crate::sign::SIGNATURE_NAME) {
            return Ok(()); // Otherwise checked by read_manifest and check_signature.
        }
        match FileType::from_raw_mode(stat.st_mode as _) {
            FileType::Symlink => {
                self.present.insert(relative.clone());
                let target = rustix::fs::readlinkat(fd, OsStr::from_bytes(name), Vec::new())
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_default();
                self.report.push(Failure::at(
                    codes::BUNDLE_SYMLINK,
                    &relative,
                    format!("is a symlink (to `{target}`)"),
                    json!({"target": target}),
                ));
            }
            FileType::Directory => self.subdirectory(fd, name, relative, depth)?,
            FileType::RegularFile => self.regular_file(relative, &stat),
            _ => {
                self.present.insert(relative.clone());
                self.report.push(Failure::at(
                    codes::BUNDLE_SPECIAL_FILE,
                    &relative,
                    "is a special file (FIFO, socket or device)",
                    json!({"mode": format!("{:o}", stat.st_mode as u32)}),
                ));
            }
        }
        Ok(())
    }

    /// A directory entry: reported when it holds no listed file or lies too deep,
    /// otherwise opened (without following a link swapped in) and walked.
    fn subdirectory(
        &mut self,
        fd: &OwnedFd,
        name: &[u8],
        relative: String,
        depth: usize,
    ) -> Result<(), Error> {
        self.present.insert(relative.clone());
        if !self.directories.contains(&relative) {
            self.report.push(Failure::at(
                codes::BUNDLE_UNLISTED,
                &relative,
                "is a directory that holds no listed file",
                json!({"kind": "directory"}),
            ));
        }
        if depth >= MAX_DEPTH {
            self.report.push(Failure::at(
                codes::BUNDLE_PATH_INVALID,
                &relative,
                "is nested too deeply",
                json!({"reason": "too-deep"}),
            ));
            return Ok(());
        }
        let child = match rustix::fs::openat(
            fd,
            OsStr::from_bytes(name),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(child) => child,
            Err(rustix::io::Errno::LOOP) | Err(rustix::io::Errno::NOTDIR) => {
                self.report.push(Failure::at(
                    codes::BUNDLE_FILE_CHANGED,
                    &relative,
                    "was replaced while the bundle was walked",
                    json!({}),
                ));
                return Ok(());
            }
            Err(error) => {
                return Err(Error::io(
                    "open directory",
                    shown_dir(&relative),
                    error.into(),
                ))
            }
        };
        self.directory(&child, &relative, depth + 1)
    }

    /// A regular file: reported when hard-linked or unlisted, otherwise remembered for
    /// the size, mode and content checks.
    // `stat`'s field types differ between platforms (`st_nlink` is 32 bits on some), so
    // the casts are needed there even where they are not here.
    #[allow(clippy::unnecessary_cast)]
    fn regular_file(&mut self, relative: String, stat: &rustix::fs::Stat) {
        let nlink = stat.st_nlink as u64;
        if nlink > 1 {
            self.report.push(Failure::at(
                codes::BUNDLE_HARDLINK,
                &relative,
                format!("has {nlink} hard links"),
                json!({"nlink": nlink}),
            ));
        }
        if !self.listed.contains_key(&relative) {
            self.report.push(Failure::at(
                codes::BUNDLE_UNLISTED,
                &relative,
                "is not listed in the manifest",
                json!({"kind": "file", "size": stat.st_size as u64}),
            ));
            return;
        }
        self.seen.insert(
            relative,
            Seen {
                dev: stat.st_dev as u64,
                ino: stat.st_ino as u64,
                size: stat.st_size as u64,
                mode: stat.st_mode as u32,
                nlink,
                identity: identity_of_stat(stat),
            },
        );
    }
}

/// Who may change `relative` (`.` for the root) besides the verifier and root: its
/// mode and owner. Regular files and directories only (symlinks and special files are
/// failures of their own). Reports `BUNDLE_WRITABLE`, `BUNDLE_SETID` and
/// `BUNDLE_FOREIGN_OWNER`, each with the mode or owner and the fix.
// `stat`'s field types differ between platforms, so the casts are needed there.
#[allow(clippy::unnecessary_cast)]
fn check_permissions(relative: &str, stat: &rustix::fs::Stat, report: &mut VerifyReport) {
    let kind = match FileType::from_raw_mode(stat.st_mode as _) {
        FileType::RegularFile => "file",
        FileType::Directory => "directory",
        _ => return,
    };
    let mode = stat.st_mode as u32 & 0o7777;
    let shown = format!("{mode:04o}");
    if mode & 0o022 != 0 {
        report.push(Failure::at(
            codes::BUNDLE_WRITABLE,
            relative,
            format!("is a {kind} writable by its group or others (mode {shown}), who could change it before it runs; fix: `chmod go-w`"),
            json!({"kind": kind, "mode": shown, "fix": "chmod go-w"}),
        ));
    }
    if kind == "file" && mode & 0o6000 != 0 {
        report.push(Failure::at(
            codes::BUNDLE_SETID,
            relative,
            format!("has its setuid or setgid bit set (mode {shown}); fix: `chmod u-s,g-s`"),
            json!({"kind": kind, "mode": shown, "fix": "chmod u-s,g-s"}),
        ));
    }
    let verifier = rustix::process::geteuid().as_raw();
    let owner = stat.st_uid as u32;
    if owner != verifier && owner != 0 {
        report.push(Failure::at(
            codes::BUNDLE_FOREIGN_OWNER,
            relative,
            format!("is a {kind} owned by uid {owner}, not by the verifying user (uid {verifier}) or root, so its owner could change it before it runs; fix: `chown {verifier}`"),
            json!({"kind": kind, "owner": owner, "verifier": verifier, "fix": format!("chown {verifier}")}),
        ));
    }
}

/// A directory's relative path as errors show it (`.` for the root).
fn shown_dir(prefix: &str) -> String {
    if prefix.is_empty() {
        ".".to_string()
    } else {
        prefix.to_string()
    }
}

/// The names in the directory `fd` (at `prefix`), without `.` and `..`, sorted.
fn sorted_names(fd: &OwnedFd, prefix: &str) -> Result<Vec<Vec<u8>>, Error> {
    let dir = rustix::fs::Dir::read_from(fd)
        .map_err(|e| Error::io("read directory", shown_dir(prefix), e.into()))?;
    let mut names = Vec::new();
    for entry in dir {
        let entry = entry.map_err(|e| Error::io("read directory", shown_dir(prefix), e.into()))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        names.push(name.to_vec());
    }
    names.sort();
    Ok(names)
}
