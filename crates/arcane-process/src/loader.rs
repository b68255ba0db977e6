//! The dynamic loader's search path of a child that runs a runtime's executable: the
//! one rule, used by the registry's version probe, the supervisor's engine command and
//! `launch`'s Core host.
//!
//! The value of [`LOADER_PATH_VARIABLE`] (`LD_LIBRARY_PATH`, `DYLD_LIBRARY_PATH` on
//! macOS) is
//!
//! 1. the runtime's own library directories, in the order given, so the libraries it
//!    ships win over any other copy;
//! 2. then the entries of the inherited value (what the variable held when Arcane
//!    started), so libraries the user points the loader at (a CUDA toolkit, say) still
//!    resolve;
//! 3. each directory once (its first occurrence wins);
//! 4. with every empty entry dropped: the loader reads an empty entry (`a::b`, a leading
//!    or trailing `:`) as the current directory, which would let whatever directory the
//!    child runs in supply its libraries. A directory that cannot be written in the list
//!    (its name contains `:`) is dropped too.
//!
//! When nothing is left the value is `None`: the variable is then removed from the
//! child's environment rather than set to an empty string.
//!
//! Libraries never read the environment: the caller passes the inherited value in
//! (only the CLI's configuration module reads it).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// The name of the dynamic loader's search-path variable on this platform.
pub const LOADER_PATH_VARIABLE: &str = if cfg!(target_os = "macos") {
    "DYLD_LIBRARY_PATH"
} else {
    "LD_LIBRARY_PATH"
};

/// The loader's search-path variable and its value for a child that runs an
/// executable whose libraries live in `dirs`, given the `inherited` value (see the
/// module documentation for the rule). A `None` value means "remove the variable".
///
/// ```
/// use std::ffi::OsString;
/// let (name, value) = arcane_process::loader_path(
///     &["/opt/llama/lib".into()],
///     Some("/usr/local/cuda/lib64::/opt/llama/lib".as_ref()),
/// );
/// assert_eq!(name, arcane_process::LOADER_PATH_VARIABLE);
/// assert_eq!(value, Some(OsString::from("/opt/llama/lib:/usr/local/cuda/lib64")));
/// ```
pub fn loader_path(
    dirs: &[PathBuf],
    inherited: Option<&OsStr>,
) -> (&'static str, Option<OsString>) {
    let inherited = inherited.into_iter().flat_map(std::env::split_paths);
    let mut entries: Vec<PathBuf> = Vec::new();
    for entry in dirs.iter().cloned().chain(inherited) {
        if entry.as_os_str().is_empty() || entries.contains(&entry) || !joinable(&entry) {
            continue;
        }
        entries.push(entry);
    }
    let value = if entries.is_empty() {
        None
    } else {
        std::env::join_paths(entries).ok()
    };
    (LOADER_PATH_VARIABLE, value)
}

/// Whether `entry` can stand in a `:`-separated list.
fn joinable(entry: &Path) -> bool {
    std::env::join_paths([entry]).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(dirs: &[&str], inherited: Option<&str>) -> Option<String> {
        let dirs: Vec<PathBuf> = dirs.iter().map(PathBuf::from).collect();
        loader_path(&dirs, inherited.map(OsStr::new))
            .1
            .map(|v| v.to_string_lossy().into_owned())
    }

    #[test]
    fn the_runtime_directories_come_first_then_the_inherited_value() {
        assert_eq!(
            value(&["/r/lib", "/r/bin"], Some("/usr/lib:/opt/cuda")).as_deref(),
            Some("/r/lib:/r/bin:/usr/lib:/opt/cuda")
        );
        assert_eq!(value(&["/r/lib"], None).as_deref(), Some("/r/lib"));
        assert_eq!(value(&[], Some("/usr/lib")).as_deref(), Some("/usr/lib"));
    }

    #[test]
    fn every_directory_appears_once_at_its_first_place() {
        assert_eq!(
            value(&["/r/lib", "/r/lib"], Some("/usr/lib:/r/lib:/usr/lib")).as_deref(),
            Some("/r/lib:/usr/lib")
        );
    }

    #[test]
    fn empty_entries_never_reach_the_loader_as_the_current_directory() {
        for inherited in [":/usr/lib", "/usr/lib:", "/usr/lib::/opt", "::"] {
            let joined = value(&["/r/lib", ""], Some(inherited)).unwrap();
            assert!(
                !joined.split(':').any(str::is_empty),
                "`{inherited}` gave `{joined}`"
            );
            assert!(joined.starts_with("/r/lib"), "{joined}");
        }
    }

    #[test]
    fn nothing_left_means_remove_the_variable() {
        assert_eq!(value(&[], None), None);
        assert_eq!(value(&[], Some("")), None);
        assert_eq!(value(&[""], Some(":")), None);
    }

    #[test]
    fn a_directory_with_a_separator_in_its_name_is_left_out() {
        assert_eq!(
            value(&["/odd:name", "/r/lib"], None).as_deref(),
            Some("/r/lib")
        );
    }

    #[test]
    fn the_variable_is_the_platforms_own() {
        let (name, _) = loader_path(&[], None);
        if cfg!(target_os = "macos") {
            assert_eq!(name, "DYLD_LIBRARY_PATH");
        } else {
            assert_eq!(name, "LD_LIBRARY_PATH");
        }
    }
}
