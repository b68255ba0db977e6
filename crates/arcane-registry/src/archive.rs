//! Safe extraction of runtime release archives (`.zip` and gzip-compressed `.tar`).
//!
//! Rules, checked for every entry before anything of it is written:
//!
//! * an entry path must be relative: a leading `/`, a drive letter or a backslash is
//!   refused, and so is any `..` component (entries are never silently "sanitized");
//! * every directory an entry goes through must be a real directory created by this
//!   extraction: writes never pass through a symbolic link;
//! * a symbolic link's target must be relative and stay inside the destination, both
//!   lexically when it is created and physically (canonicalized) after extraction;
//! * a hard link (tar) must point at a regular file already extracted;
//! * device files, FIFOs and the like are refused; files never overwrite each other.
//!
//! Files are created with mode 0755 when the archive marks them executable and 0644
//! otherwise (no setuid, no world-writable files). The caller extracts into a staging
//! directory and removes it on any error, so a refused archive leaves nothing behind.
//!
//! The size is bounded too, because a small archive whose digest matches can still be
//! a bomb (2 MB of zip expanding to 2 GB and more): the bytes actually written are
//! counted as they stream out of the decompressor (the sizes entries declare are never
//! trusted), and so is a tar's whole decompressed stream (headers, and the data of
//! entries that are skipped rather than written); extraction stops with
//! [`Error::ArchiveTooLarge`] as soon as either count passes [`Limits::max_bytes`] or
//! [`Limits::max_ratio`] times the archive's own size.

use std::cell::Cell;
use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use arcane_report::CancelToken;

use crate::error::ExtractLimit;
use crate::Error;

/// The archive formats understood, recognized by their first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// A zip file (`PK\x03\x04`, or `PK\x05\x06` for an empty one).
    Zip,
    /// A gzip stream holding a tar (`\x1f\x8b`).
    TarGz,
}

/// Recognizes the format from the first bytes of `file` (read from its start; the file
/// is rewound afterwards).
pub(crate) fn detect(file: &mut File, label: &str) -> Result<Format, Error> {
    file.seek(SeekFrom::Start(0))
        .map_err(|e| invalid(label, "cannot rewind it", Some(Box::new(e))))?;
    let mut magic = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match file.read(&mut magic[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(invalid(label, "cannot read it", Some(Box::new(e)))),
        }
    }
    file.seek(SeekFrom::Start(0))
        .map_err(|e| invalid(label, "cannot rewind it", Some(Box::new(e))))?;
    match &magic[..got] {
        [b'P', b'K', 3, 4] | [b'P', b'K', 5, 6] => Ok(Format::Zip),
        [0x1f, 0x8b, ..] => Ok(Format::TarGz),
        other => Err(invalid(
            label,
            &format!(
                "not a zip or tar.gz archive (starts with hex `{}`)",
                hex::encode(other)
            ),
            None,
        )),
    }
}

fn invalid(
    label: &str,
    reason: &str,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
) -> Error {
    Error::ArchiveInvalid {
        archive: label.to_string(),
        reason: reason.to_string(),
        source,
    }
}

fn unsafe_entry(label: &str, entry: &str, reason: &'static str) -> Error {
    Error::UnsafeArchiveEntry {
        archive: label.to_string(),
        entry: entry.to_string(),
        reason,
    }
}

/// Checks an entry name and returns it as a clean relative path (`None`: the entry is
/// the archive root itself, e.g. `./`).
pub(crate) fn safe_relative(name: &str) -> Result<Option<PathBuf>, &'static str> {
    if name.contains('\0') {
        return Err("the path contains a NUL byte");
    }
    if name.starts_with('/') {
        return Err("the path is absolute");
    }
    if name.contains('\\') {
        return Err("the path contains a backslash");
    }
    let bytes = name.as_bytes();
    if bytes.len() >= 2 && bytes[1] == b':' && bytes[0].is_ascii_alphabetic() {
        return Err("the path starts with a drive letter");
    }
    let mut clean = PathBuf::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err("the path has a `..` component"),
            part => clean.push(part),
        }
    }
    Ok((!clean.as_os_str().is_empty()).then_some(clean))
}

/// Resolves a link target lexically against the link's directory (both relative to the
/// destination); `None` when it would leave the destination or is absolute.
pub(crate) fn resolve_link(link: &Path, target: &str) -> Option<PathBuf> {
    if target.is_empty()
        || target.starts_with('/')
        || target.contains('\\')
        || target.contains('\0')
    {
        return None;
    }
    let mut parts: Vec<String> = link
        .parent()
        .map(|p| {
            p.components()
                .filter_map(|c| match c {
                    Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part.to_string()),
        }
    }
    Some(parts.iter().collect())
}

/// How much an archive may expand to (see the module docs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// The most bytes all extracted files may hold together.
    pub(crate) max_bytes: u64,
    /// The most the extracted bytes may be, as a multiple of the archive's size.
    pub(crate) max_ratio: u64,
}

/// Writes entries under `root`, enforcing the module's rules.
struct Writer<'a> {
    root: &'a Path,
    label: &'a str,
    dirs: HashSet<PathBuf>,
    links: Vec<(String, PathBuf)>,
    cancel: &'a CancelToken,
    limits: Limits,
    /// The archive's size in bytes.
    compressed: u64,
    /// The bytes written so far, all files together.
    written: u64,
    /// The bytes decompressed so far (a tar's whole stream, headers and the data of
    /// entries not written included), counted by [`Counted`].
    streamed: Rc<Cell<u64>>,
}

/// A reader that counts the bytes it yields into `total` and fails once they pass
/// `cap`, so a compressed stream is never expanded past the limits, whatever its
/// headers declare.
struct Counted<R> {
    inner: R,
    total: Rc<Cell<u64>>,
    cap: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        if self.total.get() > self.cap {
            return Err(std::io::Error::other("the archive expands past its limit"));
        }
        let n = self.inner.read(buffer)?;
        self.total.set(self.total.get().saturating_add(n as u64));
        Ok(n)
    }
}

impl Writer<'_> {
    /// Counts `n` more bytes about to be written, refusing them past either limit.
    fn count(&mut self, n: usize) -> Result<(), Error> {
        let written = self.written.saturating_add(n as u64);
        if let Some(error) = self.past_limit(written) {
            return Err(error);
        }
        self.written = written;
        Ok(())
    }

    /// The error for `bytes` (written, or decompressed) when they pass a limit.
    fn past_limit(&self, bytes: u64) -> Option<Error> {
        let limit = if bytes > self.limits.max_bytes {
            ExtractLimit::Size
        } else if bytes > self.compressed.saturating_mul(self.limits.max_ratio) {
            ExtractLimit::Ratio
        } else {
            return None;
        };
        Some(Error::ArchiveTooLarge {
            archive: self.label.to_string(),
            limit,
            max_bytes: self.limits.max_bytes,
            max_ratio: self.limits.max_ratio,
            archive_bytes: self.compressed,
        })
    }

    /// The limit error when the decompressed stream was stopped at a limit (its read
    /// error then says only that), else `other`.
    fn stopped_or(&self, other: Error) -> Error {
        self.past_limit(self.streamed.get()).unwrap_or(other)
    }

    fn check_cancel(&self) -> Result<(), Error> {
        if self.cancel.is_cancelled() {
            Err(Error::cancelled("extraction"))
        } else {
            Ok(())
        }
    }

    /// Makes sure every ancestor of `relative` is a real directory made by us.
    fn parents(&mut self, name: &str, relative: &Path) -> Result<(), Error> {
        let mut current = PathBuf::new();
        let components: Vec<_> = relative.components().collect();
        for component in components.iter().take(components.len().saturating_sub(1)) {
            current.push(component);
            self.directory(name, &current)?;
        }
        Ok(())
    }

    fn directory(&mut self, name: &str, relative: &Path) -> Result<(), Error> {
        if self.dirs.contains(relative) {
            return Ok(());
        }
        let path = self.root.join(relative);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(unsafe_entry(
                    self.label,
                    name,
                    "the path goes through a link or a file",
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(parent) = relative.parent().filter(|p| !p.as_os_str().is_empty()) {
                    self.directory(name, parent)?;
                }
                std::fs::create_dir(&path).map_err(|e| Error::io("create", &path, e))?;
                // A fixed mode, whatever the umask (under `umask 000` the tree was 0777,
                // which `serve` then refused): the engine's directories are this user's.
                set_mode(&path, 0o755)?;
            }
            Err(e) => return Err(Error::io("inspect", &path, e)),
        }
        self.dirs.insert(relative.to_path_buf());
        Ok(())
    }

    fn file(
        &mut self,
        name: &str,
        relative: &Path,
        mode: u32,
        data: &mut dyn Read,
    ) -> Result<(), Error> {
        self.parents(name, relative)?;
        let path = self.root.join(relative);
        let mut file = match File::options().write(true).create_new(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(unsafe_entry(
                    self.label,
                    name,
                    "the entry appears twice or overwrites another",
                ))
            }
            Err(e) => return Err(Error::io("create", &path, e)),
        };
        let mut buffer = vec![0u8; crate::hash::CHUNK];
        loop {
            self.check_cancel()?;
            let n = match data.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(self.stopped_or(invalid(
                        self.label,
                        &format!("entry `{name}` cannot be read"),
                        Some(Box::new(e)),
                    )))
                }
            };
            self.count(n)?;
            std::io::Write::write_all(&mut file, &buffer[..n])
                .map_err(|e| Error::io("write", &path, e))?;
        }
        set_mode(&path, if mode & 0o111 != 0 { 0o755 } else { 0o644 })
    }

    fn symlink(&mut self, name: &str, relative: &Path, target: &str) -> Result<(), Error> {
        if target.starts_with('/') {
            return Err(unsafe_entry(
                self.label,
                name,
                "the link target is absolute",
            ));
        }
        if resolve_link(relative, target).is_none() {
            return Err(unsafe_entry(
                self.label,
                name,
                "the link points outside the install directory",
            ));
        }
        self.parents(name, relative)?;
        let path = self.root.join(relative);
        make_symlink(target, &path).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => unsafe_entry(
                self.label,
                name,
                "the entry appears twice or overwrites another",
            ),
            _ => Error::io("create link", &path, e),
        })?;
        self.links.push((name.to_string(), relative.to_path_buf()));
        Ok(())
    }

    fn hard_link(&mut self, name: &str, relative: &Path, target: &str) -> Result<(), Error> {
        let target_relative = match safe_relative(target) {
            Ok(Some(t)) => t,
            _ => {
                return Err(unsafe_entry(
                    self.label,
                    name,
                    "the hard link points outside the install directory",
                ))
            }
        };
        let target_path = self.root.join(&target_relative);
        match std::fs::symlink_metadata(&target_path) {
            Ok(meta) if meta.is_file() => {}
            _ => {
                return Err(unsafe_entry(
                    self.label,
                    name,
                    "the hard link does not point at an extracted file",
                ))
            }
        }
        // The target's parents must be ours too (not reached through a link).
        for ancestor in target_relative.ancestors().skip(1) {
            if !ancestor.as_os_str().is_empty() && !self.dirs.contains(ancestor) {
                return Err(unsafe_entry(
                    self.label,
                    name,
                    "the hard link does not point at an extracted file",
                ));
            }
        }
        self.parents(name, relative)?;
        let path = self.root.join(relative);
        std::fs::hard_link(&target_path, &path).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => unsafe_entry(
                self.label,
                name,
                "the entry appears twice or overwrites another",
            ),
            _ => Error::io("create link", &path, e),
        })
    }

    /// After extraction: every link must resolve inside the root, following the links
    /// the archive created the way the kernel would, whether or not the final target
    /// exists (a link to a name that does not exist *yet* is no safer: anything may be
    /// created there later).
    fn check_links(&self) -> Result<(), Error> {
        for (name, relative) in &self.links {
            if resolve_inside(self.root, relative).is_none() {
                return Err(unsafe_entry(
                    self.label,
                    name,
                    "the link points outside the install directory",
                ));
            }
        }
        Ok(())
    }
}

/// The most links one resolution follows (Linux's own limit, `MAXSYMLINKS`).
const MAX_LINK_HOPS: usize = 40;

/// Resolves `relative` (a path under `root`) component by component as the kernel would,
/// reading each symbolic link met on the way (never letting the system follow one) and
/// splicing its target in, but lexically: components that do not exist are kept as
/// names. `None` when the path leaves `root` (through `..` or an absolute target) or
/// loops.
pub(crate) fn resolve_inside(root: &Path, relative: &Path) -> Option<PathBuf> {
    use std::collections::VecDeque;
    let mut pending: VecDeque<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let mut resolved: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(part) = pending.pop_front() {
        match part.as_str() {
            "" | "." => continue,
            ".." => {
                resolved.pop()?;
                continue;
            }
            "/" => return None,
            _ => {}
        }
        let candidate = resolved
            .iter()
            .fold(root.to_path_buf(), |path, part| path.join(part))
            .join(&part);
        let is_link = std::fs::symlink_metadata(&candidate)
            .map(|meta| meta.file_type().is_symlink())
            .unwrap_or(false);
        if !is_link {
            resolved.push(part);
            continue;
        }
        hops += 1;
        if hops > MAX_LINK_HOPS {
            return None;
        }
        let target = std::fs::read_link(&candidate).ok()?;
        let target = target.to_str()?;
        if target.starts_with('/') {
            return None;
        }
        for piece in target.split('/').rev() {
            pending.push_front(piece.to_string());
        }
    }
    Some(resolved.iter().collect())
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io("set permissions of", path, e))
}

#[cfg(not(unix))]
fn set_mode(_path: &Path, _mode: u32) -> Result<(), Error> {
    Ok(())
}

#[cfg(unix)]
fn make_symlink(target: &str, path: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, path)
}

#[cfg(not(unix))]
fn make_symlink(_target: &str, _path: &Path) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "symbolic links in archives are only supported on Unix",
    ))
}

/// Extracts `file` (already verified) into the existing, empty directory `root`, within
/// `limits`.
pub(crate) fn extract(
    file: &mut File,
    label: &str,
    root: &Path,
    limits: Limits,
    cancel: &CancelToken,
) -> Result<(), Error> {
    let format = detect(file, label)?;
    let compressed = file
        .metadata()
        .map_err(|e| invalid(label, "cannot inspect it", Some(Box::new(e))))?
        .len();
    let mut writer = Writer {
        root,
        label,
        dirs: HashSet::new(),
        links: Vec::new(),
        cancel,
        limits,
        compressed,
        written: 0,
        streamed: Rc::new(Cell::new(0)),
    };
    match format {
        Format::TarGz => extract_tar(file, &mut writer)?,
        Format::Zip => extract_zip(file, &mut writer)?,
    }
    writer.check_links()
}

fn entry_path(writer: &Writer<'_>, name: &str) -> Result<Option<PathBuf>, Error> {
    safe_relative(name).map_err(|reason| unsafe_entry(writer.label, name, reason))
}

fn extract_tar(file: &mut File, writer: &mut Writer<'_>) -> Result<(), Error> {
    let label = writer.label.to_string();
    let stream = Counted {
        inner: flate2::read::GzDecoder::new(file),
        total: Rc::clone(&writer.streamed),
        cap: writer
            .limits
            .max_bytes
            .min(writer.compressed.saturating_mul(writer.limits.max_ratio)),
    };
    let mut archive = tar::Archive::new(stream);
    let entries = archive.entries().map_err(|e| {
        writer.stopped_or(invalid(
            &label,
            "cannot read its entries",
            Some(Box::new(e)),
        ))
    })?;
    for entry in entries {
        writer.check_cancel()?;
        let mut entry = entry.map_err(|e| {
            writer.stopped_or(invalid(
                &label,
                "cannot read its entries",
                Some(Box::new(e)),
            ))
        })?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions()
            || kind.is_pax_local_extensions()
            || kind.is_gnu_longname()
            || kind.is_gnu_longlink()
        {
            continue;
        }
        let Some(relative) = entry_path(writer, &name)? else {
            continue;
        };
        if kind.is_dir() {
            writer.directory(&name, &relative)?;
        } else if kind.is_file() || kind.is_contiguous() {
            let mode = entry.header().mode().unwrap_or(0o644);
            writer.file(&name, &relative, mode, &mut entry)?;
        } else if kind.is_symlink() {
            let target = entry
                .link_name_bytes()
                .map(|t| String::from_utf8_lossy(&t).into_owned())
                .unwrap_or_default();
            writer.symlink(&name, &relative, &target)?;
        } else if kind.is_hard_link() {
            let target = entry
                .link_name_bytes()
                .map(|t| String::from_utf8_lossy(&t).into_owned())
                .unwrap_or_default();
            writer.hard_link(&name, &relative, &target)?;
        } else {
            return Err(unsafe_entry(
                &label,
                &name,
                "special files (devices, FIFOs) are not allowed",
            ));
        }
    }
    // The last read may have passed the cap without another read to refuse.
    match writer.past_limit(writer.streamed.get()) {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

fn extract_zip(file: &mut File, writer: &mut Writer<'_>) -> Result<(), Error> {
    let label = writer.label.to_string();
    let declared = central_directory_entries(file)
        .map_err(|e| invalid(&label, "cannot read its directory", Some(Box::new(e))))?;
    let mut archive = zip::ZipArchive::new(file)
        .map_err(|e| invalid(&label, "cannot read its directory", Some(Box::new(e))))?;
    // The reader keeps one entry per name (the last); the directory itself says how many
    // there are. A difference is a name that appears twice, which tar refuses too.
    if declared != Some(archive.len() as u64) {
        return Err(unsafe_entry(
            &label,
            "(central directory)",
            "an entry name appears twice",
        ));
    }
    for index in 0..archive.len() {
        writer.check_cancel()?;
        let mut entry = archive
            .by_index(index)
            .map_err(|e| invalid(&label, "cannot read an entry", Some(Box::new(e))))?;
        let name = String::from_utf8_lossy(entry.name_raw()).into_owned();
        let Some(relative) = entry_path(writer, &name)? else {
            continue;
        };
        if entry.is_dir() {
            writer.directory(&name, &relative)?;
        } else if entry.is_symlink() {
            let mut target = String::new();
            entry
                .by_ref()
                .take(4096)
                .read_to_string(&mut target)
                .map_err(|e| {
                    invalid(
                        &label,
                        &format!("entry `{name}` cannot be read"),
                        Some(Box::new(e)),
                    )
                })?;
            writer.symlink(&name, &relative, &target)?;
        } else {
            let mode = entry.unix_mode().unwrap_or(0o644);
            const S_IFMT: u32 = 0o170000;
            const S_IFREG: u32 = 0o100000;
            if mode & S_IFMT != 0 && mode & S_IFMT != S_IFREG {
                return Err(unsafe_entry(
                    &label,
                    &name,
                    "special files (devices, FIFOs) are not allowed",
                ));
            }
            writer.file(&name, &relative, mode, &mut entry)?;
        }
    }
    Ok(())
}

/// How many entries a zip's central directory declares (from the end-of-central-directory
/// record, or its zip64 form), without interpreting names. `None` when the record is
/// missing.
fn central_directory_entries(file: &mut File) -> std::io::Result<Option<u64>> {
    use std::io::{Seek, SeekFrom};
    let length = file.seek(SeekFrom::End(0))?;
    let tail_length = length.min(22 + 65_535 + 20);
    file.seek(SeekFrom::Start(length - tail_length))?;
    let mut tail = vec![0u8; tail_length as usize];
    file.read_exact(&mut tail)?;
    file.seek(SeekFrom::Start(0))?;
    let Some(eocd) = (0..tail.len().saturating_sub(21))
        .rev()
        .find(|&i| tail[i..i + 4] == [0x50, 0x4b, 0x05, 0x06])
    else {
        return Ok(None);
    };
    let total = u64::from(u16::from_le_bytes([tail[eocd + 10], tail[eocd + 11]]));
    if total != 0xFFFF {
        return Ok(Some(total));
    }
    // Zip64: the locator sits just before the record and points at the zip64 record,
    // whose entry count is a u64 at offset 32.
    let Some(locator) = eocd.checked_sub(20) else {
        return Ok(None);
    };
    if tail[locator..locator + 4] != [0x50, 0x4b, 0x06, 0x07] {
        return Ok(None);
    }
    let mut offset = [0u8; 8];
    offset.copy_from_slice(&tail[locator + 8..locator + 16]);
    let mut record = [0u8; 40];
    file.seek(SeekFrom::Start(u64::from_le_bytes(offset)))?;
    file.read_exact(&mut record)?;
    file.seek(SeekFrom::Start(0))?;
    if record[..4] != [0x50, 0x4b, 0x06, 0x06] {
        return Ok(None);
    }
    let mut count = [0u8; 8];
    count.copy_from_slice(&record[32..40]);
    Ok(Some(u64::from_le_bytes(count)))
}

/// Finds the shallowest regular file (or link to one inside `root`) called `name`
/// under `root`, breadth first, in name order at each depth.
pub(crate) fn find_executable(root: &Path, name: &str) -> Option<PathBuf> {
    let mut level = vec![root.to_path_buf()];
    let canonical_root = std::fs::canonicalize(root).ok()?;
    while !level.is_empty() {
        let mut next = Vec::new();
        let mut found = Vec::new();
        for dir in &level {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                let path = entry.path();
                if kind.is_dir() {
                    next.push(path);
                } else if entry.file_name() == name {
                    let inside = std::fs::canonicalize(&path)
                        .is_ok_and(|p| p.starts_with(&canonical_root) && p.is_file());
                    if inside {
                        found.push(path);
                    }
                }
            }
        }
        found.sort();
        if let Some(first) = found.into_iter().next() {
            return Some(first);
        }
        next.sort();
        level = next;
    }
    None
}

/// The directories holding shared libraries for an executable in `dir`: `dir` itself
/// and `dir/../lib` when they hold `lib*.so*` or `*.dylib` files.
pub(crate) fn library_dirs(executable: &Path) -> Vec<PathBuf> {
    let Some(dir) = executable.parent() else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    for candidate in [dir.to_path_buf(), dir.join("..").join("lib")] {
        if has_libraries(&candidate) {
            let candidate = std::fs::canonicalize(&candidate).unwrap_or(candidate);
            if !dirs.contains(&candidate) {
                dirs.push(candidate);
            }
        }
    }
    dirs
}

/// Whether `dir` directly holds shared libraries.
pub(crate) fn has_libraries(dir: &Path) -> bool {
    library_names(dir).next().is_some()
}

/// The shared-library file names directly in `dir`.
pub(crate) fn library_names(dir: &Path) -> impl Iterator<Item = String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            (n.starts_with("lib") && (n.contains(".so") || n.ends_with(".dylib")))
                || n.ends_with(".dll")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_are_checked_not_sanitized() {
        assert_eq!(
            safe_relative("a/./b//c").unwrap(),
            Some(PathBuf::from("a/b/c"))
        );
        assert_eq!(safe_relative("./").unwrap(), None);
        for bad in [
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a/..",
            "C:/x",
            "a\\..\\x",
            "a\0",
        ] {
            assert!(safe_relative(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn link_targets_must_stay_inside() {
        assert_eq!(
            resolve_link(Path::new("lib/libx.so"), "libx.so.1"),
            Some(PathBuf::from("lib/libx.so.1"))
        );
        assert_eq!(
            resolve_link(Path::new("bin/tool"), "../lib/x"),
            Some(PathBuf::from("lib/x"))
        );
        assert_eq!(resolve_link(Path::new("tool"), "../x"), None);
        assert_eq!(resolve_link(Path::new("bin/tool"), "../../x"), None);
        assert_eq!(resolve_link(Path::new("tool"), "/etc/passwd"), None);
    }
}
