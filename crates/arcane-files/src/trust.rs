//! Whose files Arcane trusts, the way OpenSSH's `StrictModes` does: state it reads and
//! programs it runs must belong to the current user (or root) and must not be writable
//! by anyone else. Otherwise another local user could rewrite the registry, or swap the
//! engine's executable, and have Arcane (perhaps running as root) run their code.
//!
//! * [`check_owner_and_mode`]: one file or directory (its metadata already in hand, from
//!   an open descriptor where possible, so the answer is about the object itself).
//! * [`check_executable`]: a program and every directory above it. A directory that
//!   others may write to is acceptable only with the sticky bit (`/tmp`): there they can
//!   add entries but not rename or remove ours.
//!
//! There is no switch to weaken this: a refusal names the path, its owner and mode, and
//! the command that fixes it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why a path is not trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// Another user owns it.
    OwnedByOther,
    /// Its group may write to it.
    GroupWritable,
    /// Everyone may write to it.
    WorldWritable,
    /// A regular file with more than one hard link: the same file may also sit
    /// outside the directory checked, where another user put or changes it.
    HardLinked {
        /// Its link count.
        links: u64,
    },
}

/// A refusal: what, whose, which mode, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Untrusted {
    /// The path refused.
    pub path: PathBuf,
    /// Its owner's uid.
    pub owner: u32,
    /// Its permission bits (`0o7777`).
    pub mode: u32,
    /// What is wrong.
    pub problem: Problem,
}

impl Untrusted {
    /// `"/w/.arcane is writable by its group (owner uid 1000, mode 0775)"`.
    pub fn describe(&self) -> String {
        let what = match self.problem {
            Problem::OwnedByOther => format!("is owned by another user (uid {})", self.owner),
            Problem::GroupWritable => "is writable by its group".to_string(),
            Problem::WorldWritable => "is writable by everyone".to_string(),
            Problem::HardLinked { links } => {
                format!("has {links} hard links (it may be a file from elsewhere)")
            }
        };
        format!(
            "`{}` {what} (owner uid {}, mode {:04o})",
            self.path.display(),
            self.owner,
            self.mode
        )
    }

    /// The command that fixes it.
    pub fn fix(&self) -> String {
        match self.problem {
            Problem::OwnedByOther => format!(
                "make it yours (`chown {} '{}'`, as root) or use a path you own",
                current_uid(),
                self.path.display()
            ),
            Problem::GroupWritable | Problem::WorldWritable => {
                format!("run `chmod go-w '{}'`", self.path.display())
            }
            Problem::HardLinked { .. } => format!(
                "replace it with a copy of its own (`cp --remove-destination` from where it came, or remove the other links to `{}`)",
                self.path.display()
            ),
        }
    }
}

/// The effective uid of this process.
pub fn current_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Checks that `meta` (of `path`) belongs to this user or root and is not writable by
/// group or others.
pub fn check_owner_and_mode(path: &Path, meta: &std::fs::Metadata) -> Result<(), Untrusted> {
    match problem(meta.uid(), meta.mode()) {
        None => Ok(()),
        Some(problem) => Err(Untrusted {
            path: path.to_path_buf(),
            owner: meta.uid(),
            mode: meta.mode() & 0o7777,
            problem,
        }),
    }
}

/// Why a file that holds a secret (a token, keys' fingerprints) may not be used, with
/// the fix: another user owns it (root excepted), or anyone but its owner may read or
/// write it; `None` when it is fine. The text follows the file's name: `is readable or
/// writable by others (mode 0644); run `chmod 600 '…'``.
pub fn secret_file_problem(path: &Path, meta: &std::fs::Metadata) -> Option<String> {
    if let Err(untrusted) = check_owner_and_mode(path, meta) {
        if untrusted.problem == Problem::OwnedByOther {
            return Some(format!(
                "is owned by another user (uid {}); {}",
                untrusted.owner,
                untrusted.fix()
            ));
        }
    }
    (meta.mode() & 0o077 != 0).then(|| {
        format!(
            "is readable or writable by others (mode {:04o}); run `chmod 600 '{}'`",
            meta.mode() & 0o7777,
            path.display()
        )
    })
}

/// [`check_owner_and_mode`] for an owner and mode already at hand (a `stat` the caller
/// made): whether they pass.
pub fn owner_and_mode_trusted(uid: u32, mode: u32) -> bool {
    problem(uid, mode).is_none()
}

/// The one rule: this user's (or root's), and writable by no one else.
fn problem(uid: u32, mode: u32) -> Option<Problem> {
    if uid != current_uid() && uid != 0 {
        Some(Problem::OwnedByOther)
    } else if mode & 0o002 != 0 {
        Some(Problem::WorldWritable)
    } else if mode & 0o020 != 0 {
        Some(Problem::GroupWritable)
    } else {
        None
    }
}

/// Checks an object already open (a file or directory reached by descriptor, walking
/// down from a trusted directory, so no path can be swapped under the answer), named
/// `path` in a refusal: a directory as the directories above a path in [`check_path`]
/// (others may write to it only with the sticky bit), anything else as
/// [`check_owner_and_mode`], and a regular file must have a single link: a hard link
/// could be a file from outside (another user's, or one they may change) that merely
/// appears inside. Its metadata when it passes, for the caller to go on with;
/// `Err` is a failure to `fstat` it.
pub fn check_opened(
    path: &Path,
    fd: std::os::fd::BorrowedFd<'_>,
) -> std::io::Result<Result<std::fs::Metadata, Untrusted>> {
    // A duplicate of the descriptor: `fstat` of the same open object.
    let meta = std::fs::File::from(fd.try_clone_to_owned()?).metadata()?;
    let checked = if meta.is_dir() {
        check_directory(path, &meta)
    } else {
        check_owner_and_mode(path, &meta)
    };
    if let Err(untrusted) = checked {
        return Ok(Err(untrusted));
    }
    let links = meta.nlink();
    if meta.is_file() && links > 1 {
        return Ok(Err(Untrusted {
            path: path.to_path_buf(),
            owner: meta.uid(),
            mode: meta.mode() & 0o7777,
            problem: Problem::HardLinked { links },
        }));
    }
    Ok(Ok(meta))
}

/// [`check_owner_and_mode`] for a directory that holds what is trusted: others may add
/// entries to a sticky one (`/tmp`), but not replace ours.
fn check_directory(path: &Path, meta: &std::fs::Metadata) -> Result<(), Untrusted> {
    match check_owner_and_mode(path, meta) {
        Err(Untrusted {
            problem: Problem::GroupWritable | Problem::WorldWritable,
            ..
        }) if meta.mode() & 0o1000 != 0 => Ok(()),
        other => other,
    }
}

/// Checks a program before it runs (or a directory it loads libraries from): see
/// [`check_path`], the one rule.
pub fn check_executable(program: &Path) -> std::io::Result<Result<(), Untrusted>> {
    check_path(program)
}

/// Checks a path Arcane is about to trust (a program to run, a library directory, a
/// configuration file that decides what runs and where it listens): the path itself
/// (links followed) and every directory above its real path belong to this user or
/// root and are not writable by others (a sticky directory such as `/tmp` may be).
/// `Ok(Err(_))` names the first untrusted one; `Err` is an I/O failure to inspect it.
pub fn check_path(path: &Path) -> std::io::Result<Result<(), Untrusted>> {
    let real = std::fs::canonicalize(path)?;
    let meta = std::fs::metadata(&real)?;
    if let Err(untrusted) = check_owner_and_mode(&real, &meta) {
        return Ok(Err(untrusted));
    }
    for dir in real.ancestors().skip(1) {
        if let Err(untrusted) = check_directory(dir, &std::fs::metadata(dir)?) {
            return Ok(Err(untrusted));
        }
    }
    Ok(Ok(()))
}

/// Checks everything a program will run or load before it starts: the program
/// ([`check_path`]), each directory its loader is pointed at (`library_dirs`: a
/// runtime's own library directories), the directories beside it that a loader finds
/// without being pointed at them ([`beside`]: an `$ORIGIN` run path, as llama.cpp's
/// release builds carry), and every shared library in them (`*.so*`, links followed).
/// A library directory that does not exist holds nothing to load. This is the one rule
/// for every program Arcane starts, however it was named (`runtime add`, `serve
/// --executable`, a workspace's engine).
pub fn check_program(
    program: &Path,
    library_dirs: &[PathBuf],
) -> std::io::Result<Result<(), Untrusted>> {
    if let Err(untrusted) = check_path(program)? {
        return Ok(Err(untrusted));
    }
    let beside = beside(program)?;
    for dir in library_dirs.iter().chain(&beside) {
        match check_library_dir(dir) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            other => {
                if let Err(untrusted) = other? {
                    return Ok(Err(untrusted));
                }
            }
        }
    }
    Ok(Ok(()))
}

/// The directories a program's loader may take libraries from without being told:
/// its real directory and `../lib` beside it (`$ORIGIN`, `$ORIGIN/../lib`).
pub fn beside(program: &Path) -> std::io::Result<Vec<PathBuf>> {
    let real = std::fs::canonicalize(program)?;
    let Some(dir) = real.parent() else {
        return Ok(Vec::new());
    };
    Ok(vec![dir.to_path_buf(), dir.join("..").join("lib")])
}

/// A library directory and the shared libraries in it (see [`check_program`]).
pub fn check_library_dir(dir: &Path) -> std::io::Result<Result<(), Untrusted>> {
    if let Err(untrusted) = check_path(dir)? {
        return Ok(Err(untrusted));
    }
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let is_library = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.contains(".so"));
        if !is_library {
            continue;
        }
        match check_path(&path) {
            Ok(Err(untrusted)) => return Ok(Err(untrusted)),
            // A dangling link loads nothing.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            other => other?.unwrap_or(()),
        }
    }
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn writable_by_others_or_owned_by_another_user_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("registry.json");
        std::fs::write(&file, b"{}").unwrap();
        chmod(&file, 0o644);
        assert!(check_owner_and_mode(&file, &std::fs::metadata(&file).unwrap()).is_ok());
        chmod(&file, 0o664);
        let error = check_owner_and_mode(&file, &std::fs::metadata(&file).unwrap()).unwrap_err();
        assert_eq!(error.problem, Problem::GroupWritable);
        assert!(
            error.describe().contains("mode 0664"),
            "{}",
            error.describe()
        );
        assert!(error.fix().contains("chmod go-w"));
        chmod(&file, 0o646);
        let error = check_owner_and_mode(&file, &std::fs::metadata(&file).unwrap()).unwrap_err();
        assert_eq!(error.problem, Problem::WorldWritable);
        // Another owner: only root can make one here.
        chmod(&file, 0o644);
        if current_uid() == 0 && std::os::unix::fs::chown(&file, Some(65534), None).is_ok() {
            let error =
                check_owner_and_mode(&file, &std::fs::metadata(&file).unwrap()).unwrap_err();
            assert_eq!(error.problem, Problem::OwnedByOther);
            assert_eq!(error.owner, 65534);
        }
    }

    #[test]
    fn a_library_beside_the_program_that_another_user_owns_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("llama-server");
        std::fs::write(&program, b"#!/bin/sh\n").unwrap();
        chmod(&program, 0o755);
        chmod(dir.path(), 0o755);
        let library = dir.path().join("libggml-cpu.so.0");
        std::fs::write(&library, b"\x7fELF").unwrap();
        chmod(&library, 0o644);
        let dirs = vec![dir.path().to_path_buf(), dir.path().join("missing")];
        assert_eq!(check_program(&program, &dirs).unwrap(), Ok(()));
        chmod(&library, 0o666);
        let error = check_program(&program, &dirs).unwrap().unwrap_err();
        assert_eq!(error.path, std::fs::canonicalize(&library).unwrap());
        chmod(&library, 0o644);
        if current_uid() == 0 && std::os::unix::fs::chown(&library, Some(65534), None).is_ok() {
            let error = check_program(&program, &dirs).unwrap().unwrap_err();
            assert_eq!(error.problem, Problem::OwnedByOther);
        }
    }

    #[test]
    fn a_library_beside_the_program_is_checked_though_no_directory_is_named() {
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o755);
        for sub in ["bin", "lib"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
            chmod(&dir.path().join(sub), 0o755);
        }
        let program = dir.path().join("bin/llama-server");
        std::fs::write(&program, b"#!/bin/sh\n").unwrap();
        chmod(&program, 0o755);
        for library in ["bin/libllama.so", "lib/libggml.so.0"] {
            let library = dir.path().join(library);
            std::fs::write(&library, b"\x7fELF").unwrap();
            chmod(&library, 0o644);
        }
        assert_eq!(check_program(&program, &[]).unwrap(), Ok(()));
        for library in ["bin/libllama.so", "lib/libggml.so.0"] {
            let library = dir.path().join(library);
            chmod(&library, 0o666);
            let error = check_program(&program, &[]).unwrap().unwrap_err();
            assert_eq!(
                error.path.canonicalize().unwrap(),
                library.canonicalize().unwrap()
            );
            chmod(&library, 0o644);
        }
    }

    #[test]
    fn an_opened_file_with_another_link_or_owner_is_refused_and_a_sticky_directory_is_not() {
        use std::os::fd::AsFd;
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o755);
        let file = dir.path().join("app.js");
        std::fs::write(&file, b"1").unwrap();
        chmod(&file, 0o644);
        let opened = std::fs::File::open(&file).unwrap();
        assert!(check_opened(&file, opened.as_fd()).unwrap().is_ok());
        std::fs::hard_link(&file, dir.path().join("elsewhere")).unwrap();
        let error = check_opened(&file, opened.as_fd()).unwrap().unwrap_err();
        assert_eq!(error.problem, Problem::HardLinked { links: 2 });
        assert!(
            error.describe().contains("2 hard links"),
            "{}",
            error.describe()
        );
        std::fs::remove_file(dir.path().join("elsewhere")).unwrap();
        chmod(&file, 0o664);
        let error = check_opened(&file, opened.as_fd()).unwrap().unwrap_err();
        assert_eq!(error.problem, Problem::GroupWritable);
        chmod(&file, 0o644);

        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        chmod(&sub, 0o1777);
        let opened = std::fs::File::open(&sub).unwrap();
        assert!(check_opened(&sub, opened.as_fd()).unwrap().is_ok());
        chmod(&sub, 0o777);
        let error = check_opened(&sub, opened.as_fd()).unwrap().unwrap_err();
        assert_eq!(error.problem, Problem::WorldWritable);
        chmod(&sub, 0o755);
        if current_uid() == 0 && std::os::unix::fs::chown(&sub, Some(65534), None).is_ok() {
            let error = check_opened(&sub, opened.as_fd()).unwrap().unwrap_err();
            assert_eq!(error.problem, Problem::OwnedByOther);
        }
    }

    #[test]
    fn an_executable_in_a_directory_others_can_write_is_refused_unless_sticky() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let program = bin.join("llama-server");
        std::fs::write(&program, b"#!/bin/sh\n").unwrap();
        chmod(&program, 0o755);
        chmod(&bin, 0o755);
        assert_eq!(check_executable(&program).unwrap(), Ok(()));
        chmod(&bin, 0o777);
        let error = check_executable(&program).unwrap().unwrap_err();
        assert_eq!(error.path, std::fs::canonicalize(&bin).unwrap());
        chmod(&bin, 0o1777);
        assert_eq!(check_executable(&program).unwrap(), Ok(()));
        chmod(&program, 0o775);
        assert!(check_executable(&program).unwrap().is_err());
    }
}
