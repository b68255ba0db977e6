//! Id, version and digest validation: every value that becomes a registry key or a
//! directory name passes through here first, before any side effect.

use crate::Error;

pub use arcane_workspace::ids::{is_valid_id, MAX_ID_LEN};

/// Checks a runtime or model id (`kind` is `runtime` or `model`).
pub(crate) fn check_id(kind: &'static str, value: &str) -> Result<(), Error> {
    if is_valid_id(value) {
        Ok(())
    } else {
        Err(Error::InvalidId {
            kind,
            value: value.to_string(),
        })
    }
}

/// Checks a version tag used in an install directory and id.
pub(crate) fn check_version(value: &str) -> Result<(), Error> {
    if is_valid_id(value) {
        Ok(())
    } else {
        Err(Error::InvalidVersion {
            value: value.to_string(),
        })
    }
}

/// Normalizes a SHA-256 given by a person (`sha256:` prefix allowed, any case) to 64
/// lowercase hex digits.
pub fn normalize_sha256(value: &str) -> Result<String, Error> {
    let trimmed = value.trim();
    let hex = trimmed.strip_prefix("sha256:").unwrap_or(trimmed);
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(hex.to_ascii_lowercase())
    } else {
        Err(Error::InvalidDigest {
            value: value.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_documented_pattern() {
        for good in [
            "llama.cpp",
            "ollama",
            "smollm2-135m",
            "a",
            "0",
            "llama.cpp-b4500-cuda",
            "x_y",
        ] {
            assert!(is_valid_id(good), "{good}");
        }
        for bad in [
            "", "-a", ".hidden", "_x", "Upper", "a/b", "a b", "../x", "é", "a\0",
        ] {
            assert!(!is_valid_id(bad), "{bad:?}");
        }
        assert!(is_valid_id(&"a".repeat(MAX_ID_LEN)));
        assert!(!is_valid_id(&"a".repeat(MAX_ID_LEN + 1)));
    }

    #[test]
    fn digests_are_normalized_or_refused() {
        let hex = "AB".repeat(32);
        assert_eq!(normalize_sha256(&hex).unwrap(), "ab".repeat(32));
        assert_eq!(
            normalize_sha256(&format!("sha256:{}", "0".repeat(64))).unwrap(),
            "0".repeat(64)
        );
        for bad in ["", "abc", &"g".repeat(64), &"0".repeat(63), &"0".repeat(65)] {
            let error = normalize_sha256(bad).unwrap_err();
            assert!(matches!(error, Error::InvalidDigest { ref value } if value == bad));
        }
    }
}
