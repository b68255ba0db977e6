//! The path grammar of a bundle: which strings may name a file inside a bundle.
//!
//! Every path in `arcane-bundle.json` is a *bundle-root-relative POSIX path*. A path
//! that passes [`check_path`] can be joined to the bundle root without escaping it on
//! any supported OS, means the same file on Linux, macOS and Windows, and can be
//! created on case-insensitive file systems next to every other path of the same
//! bundle ([`check_path_set`]). The rules (packaging-spec §4.3):
//!
//! * `/` is the only separator; no leading `/`, no `\`, no `:` (drive letters, ADS);
//! * no empty, `.` or `..` segment (so no `a//b`, no trailing `/`);
//! * no NUL or other control character (U+0000–U+001F, U+007F–U+009F);
//! * no segment ending in `.` or ` ` (Windows strips them silently);
//! * no Windows device name as a segment (`CON`, `PRN`, `AUX`, `NUL`, `COM1`–`COM9`,
//!   `LPT1`–`LPT9`, also with an extension such as `CON.txt`, in any case);
//! * at most [`MAX_PATH_BYTES`] bytes;
//! * within one set of paths: no duplicates, no case-fold duplicates, and no path that
//!   is both a file and a directory prefix of another path.
//!
//! Unicode normalisation is not enforced (no NFC table is linked in); case folding
//! uses Unicode's lowercase mapping.

use std::collections::{HashMap, HashSet};

/// The longest path allowed, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;

/// Why a path was refused; [`PathProblem::reason`] is its stable machine name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PathProblem {
    /// The path is empty.
    Empty,
    /// The path is longer than [`MAX_PATH_BYTES`].
    TooLong,
    /// The path starts with `/`.
    Absolute,
    /// The path contains a `\`.
    Backslash,
    /// The path contains a `:`.
    Colon,
    /// The path contains NUL or another control character.
    ControlCharacter,
    /// The path has an empty segment (`a//b`, a trailing `/`).
    EmptySegment,
    /// The path has a `.` segment.
    DotSegment,
    /// The path has a `..` segment.
    ParentSegment,
    /// A segment ends in a dot or a space.
    TrailingDotOrSpace,
    /// A segment is a Windows device name (with or without an extension).
    DeviceName(String),
}

impl PathProblem {
    /// A stable machine name for the problem, e.g. `parent-segment`.
    pub fn reason(&self) -> &'static str {
        match self {
            PathProblem::Empty => "empty",
            PathProblem::TooLong => "too-long",
            PathProblem::Absolute => "absolute",
            PathProblem::Backslash => "backslash",
            PathProblem::Colon => "colon",
            PathProblem::ControlCharacter => "control-character",
            PathProblem::EmptySegment => "empty-segment",
            PathProblem::DotSegment => "dot-segment",
            PathProblem::ParentSegment => "parent-segment",
            PathProblem::TrailingDotOrSpace => "trailing-dot-or-space",
            PathProblem::DeviceName(_) => "device-name",
        }
    }

    /// A short human description.
    pub fn describe(&self) -> String {
        match self {
            PathProblem::Empty => "is empty".into(),
            PathProblem::TooLong => format!("is longer than {MAX_PATH_BYTES} bytes"),
            PathProblem::Absolute => "is absolute".into(),
            PathProblem::Backslash => "contains a backslash".into(),
            PathProblem::Colon => "contains a colon".into(),
            PathProblem::ControlCharacter => "contains a NUL or control character".into(),
            PathProblem::EmptySegment => "has an empty segment".into(),
            PathProblem::DotSegment => "has a `.` segment".into(),
            PathProblem::ParentSegment => "has a `..` segment".into(),
            PathProblem::TrailingDotOrSpace => "has a segment ending in a dot or a space".into(),
            PathProblem::DeviceName(name) => {
                format!("has the Windows device name `{name}` as a segment")
            }
        }
    }
}

/// Checks one path against the grammar; the first problem found is returned.
pub fn check_path(path: &str) -> Result<(), PathProblem> {
    if path.is_empty() {
        return Err(PathProblem::Empty);
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(PathProblem::TooLong);
    }
    if path.chars().any(|c| c.is_control()) {
        return Err(PathProblem::ControlCharacter);
    }
    if path.starts_with('/') {
        return Err(PathProblem::Absolute);
    }
    if path.contains('\\') {
        return Err(PathProblem::Backslash);
    }
    if path.contains(':') {
        return Err(PathProblem::Colon);
    }
    for segment in path.split('/') {
        match segment {
            "" => return Err(PathProblem::EmptySegment),
            "." => return Err(PathProblem::DotSegment),
            ".." => return Err(PathProblem::ParentSegment),
            _ => {}
        }
        if segment.ends_with('.') || segment.ends_with(' ') {
            return Err(PathProblem::TrailingDotOrSpace);
        }
        if is_device_name(segment) {
            return Err(PathProblem::DeviceName(segment.to_string()));
        }
    }
    Ok(())
}

/// Whether `segment` is a Windows reserved device name, alone or with an extension
/// (`CON`, `con.txt`, `LPT1.tar.gz`), compared without regard to case.
pub fn is_device_name(segment: &str) -> bool {
    let stem = segment
        .split('.')
        .next()
        .unwrap_or(segment)
        .trim_end_matches(' ');
    let upper = stem.to_ascii_uppercase();
    match upper.as_str() {
        "CON" | "PRN" | "AUX" | "NUL" | "CONIN$" | "CONOUT$" => true,
        _ => {
            let bytes = upper.as_bytes();
            bytes.len() == 4
                && (upper.starts_with("COM") || upper.starts_with("LPT"))
                && matches!(bytes[3], b'1'..=b'9')
        }
    }
}

/// The case-fold key of a path (Unicode lowercase mapping).
pub fn fold(path: &str) -> String {
    path.chars().flat_map(char::to_lowercase).collect()
}

/// A conflict between paths of one set, found by [`check_path_set`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetConflict {
    /// The path that conflicts.
    pub path: String,
    /// The earlier path it conflicts with.
    pub other: String,
    /// `duplicate`, `case-fold-duplicate` or `file-is-directory-prefix`.
    pub reason: &'static str,
}

/// Checks a set of file paths (each already grammatical) for exact duplicates,
/// case-fold duplicates, and a file that is also a directory prefix of another path
/// (compared case-folded too). Returns every conflict, each naming both paths.
pub fn check_path_set<'a>(paths: impl IntoIterator<Item = &'a str>) -> Vec<SetConflict> {
    let paths: Vec<&str> = paths.into_iter().collect();
    let mut conflicts = Vec::new();
    let mut exact: HashSet<&str> = HashSet::new();
    let mut folded: HashMap<String, &str> = HashMap::new();
    // Every directory prefix (case-folded) → one path that has it.
    let mut prefixes: HashMap<String, &str> = HashMap::new();
    for path in &paths {
        if !exact.insert(path) {
            conflicts.push(SetConflict {
                path: path.to_string(),
                other: path.to_string(),
                reason: "duplicate",
            });
            continue;
        }
        let key = fold(path);
        if let Some(other) = folded.get(&key) {
            conflicts.push(SetConflict {
                path: path.to_string(),
                other: other.to_string(),
                reason: "case-fold-duplicate",
            });
            continue;
        }
        folded.insert(key.clone(), path);
        let mut end = 0;
        while let Some(offset) = key[end..].find('/') {
            end += offset;
            prefixes.entry(key[..end].to_string()).or_insert(path);
            end += 1;
        }
    }
    for (key, path) in &folded {
        if let Some(child) = prefixes.get(key) {
            conflicts.push(SetConflict {
                path: path.to_string(),
                other: child.to_string(),
                reason: "file-is-directory-prefix",
            });
        }
    }
    conflicts.sort_by(|a, b| a.path.cmp(&b.path));
    conflicts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_paths() {
        for good in [
            "app/index.html",
            "bin/arcane",
            "models/smollm2/model.gguf",
            "a/b c/d.e",
            "app/über.txt",
            "app/.hidden",
            "app/CONSOLE.txt",
            "app/COM0",
            "app/LPT10",
        ] {
            assert_eq!(check_path(good), Ok(()), "{good}");
        }
    }

    #[test]
    fn refuses_each_rule() {
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("/etc/passwd", "absolute"),
            ("C:/x", "colon"),
            ("C:\\x", "backslash"),
            ("\\\\srv\\share\\x", "backslash"),
            ("app\\x", "backslash"),
            ("../outside.txt", "parent-segment"),
            ("app/../../x", "parent-segment"),
            ("app//x", "empty-segment"),
            ("app/", "empty-segment"),
            ("app/./x", "dot-segment"),
            ("app/x\0y", "control-character"),
            ("app/x\ny", "control-character"),
            ("app/x\u{7f}", "control-character"),
            ("app/name.", "trailing-dot-or-space"),
            ("app/name ", "trailing-dot-or-space"),
            ("app/CON.txt", "device-name"),
            ("app/con", "device-name"),
            ("app/Lpt9.tar.gz", "device-name"),
            ("app/COM1", "device-name"),
            ("nul/x", "device-name"),
        ];
        for (path, reason) in cases {
            let problem = check_path(path).expect_err(path);
            assert_eq!(problem.reason(), *reason, "{path:?}");
        }
        assert_eq!(
            check_path(&"a/".repeat(600)).unwrap_err().reason(),
            "too-long"
        );
    }

    #[test]
    fn set_conflicts_are_found_and_named() {
        let conflicts = check_path_set([
            "App/Index.html",
            "app/index.html",
            "models/m",
            "models/m/x",
            "a/b",
            "a/b",
        ]);
        let reasons: Vec<(&str, &str)> = conflicts
            .iter()
            .map(|c| (c.path.as_str(), c.reason))
            .collect();
        assert!(
            reasons.contains(&("app/index.html", "case-fold-duplicate")),
            "{reasons:?}"
        );
        assert!(
            reasons.contains(&("models/m", "file-is-directory-prefix")),
            "{reasons:?}"
        );
        assert!(reasons.contains(&("a/b", "duplicate")), "{reasons:?}");
        assert_eq!(conflicts.len(), 3);
        // Prefix conflicts are case-insensitive too.
        let conflicts = check_path_set(["models/M", "models/m/x"]);
        assert_eq!(conflicts.len(), 1);
        assert!(check_path_set(["a/b", "a/c", "ab/c"]).is_empty());
    }
}
