//! The CLI's errors (the host library's, see `arcane_host::error`) and the one
//! function that maps error codes to exit codes.

use arcane_report::codes;

/// Any library error, boxed behind [`arcane_report::Diagnostic`] so the CLI renders its
/// code, message, details, causes and hints uniformly.
pub use arcane_host::Error as CliError;
/// An error raised by the CLI itself (bad flag combinations, unreadable files).
pub use arcane_host::Refusal as CommandError;
/// A cause known only by its text (as `error_json` sent it in `causes`).
pub use arcane_report::Cause;

/// The exit code for an error code: 2 usage (and a named workspace that does not
/// exist), 75 busy (EX_TEMPFAIL), 130 cancelled,
/// 1 anything else. Bundle integrity failures exit 2 as `arcane bundle verify` documents.
pub fn exit_code(code: &str) -> u8 {
    match code {
        codes::ARCANE_USAGE | codes::ARCANE_WORKSPACE_NOT_FOUND => 2,
        codes::ARCANE_WORKSPACE_BUSY | codes::CORE_ALREADY_RUNNING | codes::ARCANE_IN_USE => 75,
        codes::ARCANE_CANCELLED => 130,
        c if c.starts_with("BUNDLE_") => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_documented_exit_codes() {
        assert_eq!(exit_code(codes::ARCANE_USAGE), 2);
        assert_eq!(exit_code(codes::ARCANE_WORKSPACE_NOT_FOUND), 2);
        assert_eq!(exit_code(codes::ARCANE_WORKSPACE_BUSY), 75);
        assert_eq!(exit_code(codes::ARCANE_CANCELLED), 130);
        assert_eq!(exit_code(codes::ARCANE_POLICY_DENIED), 1);
        assert_eq!(exit_code(codes::BUNDLE_HASH_MISMATCH), 2);
        for code in codes::ALL {
            assert_ne!(exit_code(code), 0, "{code} must not exit 0");
        }
    }
}
