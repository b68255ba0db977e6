//! The one id rule: every value that becomes a registry key, a directory name or a
//! version tag matches `[a-z0-9][a-z0-9._-]*` and is at most [`MAX_ID_LEN`] long.

/// The longest id accepted (ids become directory names).
pub const MAX_ID_LEN: usize = 100;

/// Whether `value` matches `[a-z0-9][a-z0-9._-]*` and is at most [`MAX_ID_LEN`] long.
pub fn is_valid_id(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_ID_LEN
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes.iter().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
}
