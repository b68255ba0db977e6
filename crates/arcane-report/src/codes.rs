//! The one table of stable error codes.
//!
//! Every library error's [`Diagnostic::code`](crate::Diagnostic::code) returns one of
//! these constants. A code never changes after release; to retire one, stop using it
//! but keep it in [`ALL`]. The CLI maps codes to exit codes in one function
//! (`0` success, `2` usage, `75` busy, `130` cancelled, `1` anything else).
//!
//! Add a code by adding a constant *and* a row in [`ALL`]; a unit test fails when a
//! constant is missing from the table or listed twice.

macro_rules! codes {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        $( $(#[$doc])* pub const $name: &str = stringify!($name); )*
        /// Every code, with its one-line meaning (the constant's doc comment).
        pub const ALL: &[&str] = &[$($name),*];
    };
}

codes! {
    // --- general ---------------------------------------------------------------------
    /// The command line, a configuration file or an argument is invalid.
    ARCANE_USAGE,
    /// Another operation holds the workspace operation lock (or a lock could not be judged).
    ARCANE_WORKSPACE_BUSY,
    /// The thing to remove is in use by a running Core host (a served model or runtime).
    ARCANE_IN_USE,
    /// A path or file failed a safety rule (a symlink where none is allowed, a workspace
    /// that changed identity, a forged lease, a filesystem without working locks).
    ARCANE_POLICY_DENIED,
    /// The operation was cancelled (Ctrl-C, SIGTERM or a cancellation token).
    ARCANE_CANCELLED,
    /// Something Arcane needs is missing (an executable, a library, a compiler).
    ARCANE_PREREQUISITE_MISSING,
    /// An operation failed for a reason given in its message and causes.
    ARCANE_OPERATION_FAILED,
    /// Bytes did not match their expected digest or size.
    ARCANE_INTEGRITY_FAILED,
    /// A file system or I/O operation failed; details name the path.
    ARCANE_IO,
    /// Something that was asked for does not exist (an unknown model, runtime, device).
    ARCANE_NOT_FOUND,
    /// Something with that name already exists.
    ARCANE_ALREADY_EXISTS,
    /// A held lock was deleted or replaced behind its holder's back.
    ARCANE_LOCK_COMPROMISED,
    /// The workspace named by `--workspace` or `ARCANE_WORKSPACE` does not exist (a
    /// command that only reads it never creates it). Exits 2, like a usage error.
    ARCANE_WORKSPACE_NOT_FOUND,
    /// A file changed, was replaced or was removed while it was being read (a
    /// configuration saved during `arcane reload`): nothing read from it was used.
    ARCANE_FILE_CHANGED,

    // --- local AI --------------------------------------------------------------------
    /// The execution target cannot be honoured by this runtime or backend.
    LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED,
    /// The execution target names a device that is not present.
    LOCAL_AI_EXECUTION_TARGET_UNAVAILABLE,
    /// A managed selection (target, backend) was requested but an external server answers.
    LOCAL_AI_EXTERNAL_SELECTION_UNSUPPORTED,
    /// The server's port is taken by a process that is not the expected engine.
    LOCAL_AI_PORT_IN_USE,
    /// Something answered on the engine's URL but it is not the expected engine.
    LOCAL_AI_SERVICE_CONFLICT,
    /// The engine did not start, exited early, stalled or timed out.
    LOCAL_AI_SERVER_FAILED,
    /// The engine is not ready yet (loading).
    LOCAL_AI_SERVER_NOT_READY,
    /// The running engine's version does not match the requested one.
    LOCAL_AI_VERSION_MISMATCH,
    /// A placement check found the engine on a different device than configured.
    LOCAL_AI_PLACEMENT_MISMATCH,
    /// The engine returned an error to a request.
    LOCAL_AI_REQUEST_FAILED,
    /// A file is not a valid GGUF model.
    LOCAL_AI_MODEL_INVALID,
    /// An executable is not a working engine runtime: it does not start, fails or times
    /// out on `--version`, prints no engine version, or is missing from its archive.
    LOCAL_AI_RUNTIME_INVALID,
    /// A model's memory estimate is more than its device's whole `memory` budget: it can
    /// never load there, whatever is evicted (the details name the bytes it needs and
    /// the budget). Refused before anything starts.
    LOCAL_AI_MODEL_TOO_LARGE,
    /// A model cannot load: its device is held by pinned models (`keep_alive = -1`,
    /// `load = "on-start"`, `pin = true`), which are never evicted to make room.
    LOCAL_AI_DEVICE_PINNED,
    /// A request names a model that does not serve its API path (speech from a chat
    /// model): refused before anything loads; the details name the paths it serves
    /// and the models that serve the path.
    LOCAL_AI_PATH_NOT_SERVED,

    // --- speech -----------------------------------------------------------------------
    /// Uploaded audio is in a format Arcane does not decode (the format is named).
    AUDIO_UNSUPPORTED,
    /// Uploaded audio is damaged or holds no samples.
    AUDIO_INVALID,
    /// Uploaded audio is larger than the upload bound.
    AUDIO_TOO_LARGE,
    /// Uploaded audio is longer than the duration bound.
    AUDIO_TOO_LONG,
    /// The text-to-speech phonemizer (espeak-ng) is missing, failed, printed something
    /// unusable or outlived its deadline.
    TTS_PHONEMIZER_FAILED,
    // --- Core host and arcane/1 ------------------------------------------------------
    /// A request id is already active on this connection.
    RPC_REQUEST_ID_ACTIVE,
    /// A frame is malformed (bad length, invalid UTF-8 or JSON, too large).
    RPC_FRAME_INVALID,
    /// The method is unknown or not allowed.
    METHOD_NOT_ALLOWED,
    /// The request lacks a valid token, or comes with a bad Host or Origin.
    CORE_UNAUTHORIZED,
    /// A service is not ready or has failed.
    CORE_SERVICE_UNAVAILABLE,
    /// The host is shutting down and refuses new requests.
    CORE_SHUTTING_DOWN,
    /// Another Core host already serves this workspace.
    CORE_ALREADY_RUNNING,
    /// The Core host's saved port is taken by another process (the host never moves).
    CORE_PORT_IN_USE,
    /// No Core host is running for the workspace (client commands such as `arcane chat`).
    CORE_NOT_RUNNING,
    /// The Core host or an engine did not answer within its deadline (connect, response
    /// head, or a streamed body that stalled).
    CORE_TIMEOUT,
    /// The request's application key may not call this endpoint: an `inference` key
    /// outside the inference paths of the APIs (`arcane token add --scope`).
    CORE_SCOPE_DENIED,
    /// The request's application key may not use the model it names (the key's
    /// `--models` list, which the details name).
    CORE_MODEL_DENIED,
    /// The model's queue is full, or the wait ahead of the request is longer than its
    /// own deadline (`X-Stainless-Timeout`, `X-Arcane-Deadline`): retry after the
    /// `Retry-After` the answer carries.
    CORE_OVERLOADED,
    /// A dashboard login code is unknown or was used already (`arcane open` gives a new one).
    UI_CODE_INVALID,
    /// A dashboard login code was presented after it expired.
    UI_CODE_EXPIRED,
    /// A dashboard call came without a valid session (none, ended, or from before a
    /// token rotation).
    UI_SESSION_REQUIRED,
    /// A dashboard call did not come from the Core's own origin (cross-site request).
    UI_ORIGIN_REFUSED,

    // --- bundles ---------------------------------------------------------------------
    /// A manifest path is invalid (absolute, `..`, empty segment, device name, …).
    BUNDLE_PATH_INVALID,
    /// A symlink was found inside the bundle.
    BUNDLE_SYMLINK,
    /// A file has more than one hard link.
    BUNDLE_HARDLINK,
    /// A special file (FIFO, socket, device) was found inside the bundle.
    BUNDLE_SPECIAL_FILE,
    /// A file listed in the manifest is missing.
    BUNDLE_MISSING,
    /// A file's size differs from the manifest.
    BUNDLE_SIZE_MISMATCH,
    /// A file's SHA-256 differs from the manifest.
    BUNDLE_HASH_MISMATCH,
    /// A file in the bundle is not listed in the manifest.
    BUNDLE_UNLISTED,
    /// The bundle was built for another OS or architecture.
    BUNDLE_TARGET_MISMATCH,
    /// The manifest itself is missing, unreadable or malformed.
    BUNDLE_MANIFEST_INVALID,
    /// A runtime's executable or library directory is not listed in the manifest's files.
    BUNDLE_RUNTIME_MISSING,
    /// A model's file is not listed in the manifest's files.
    BUNDLE_MODEL_MISSING,
    /// A file's executable bit differs from the manifest's `exec`.
    BUNDLE_MODE_MISMATCH,
    /// A file was replaced or changed while it was being verified.
    BUNDLE_FILE_CHANGED,
    /// A trusted key is configured but the bundle carries no signature.
    BUNDLE_UNSIGNED,
    /// The bundle's signature is malformed, by another key, or does not match its manifest.
    BUNDLE_SIGNATURE_INVALID,
    /// A file or directory of the bundle (its root included) is writable by its group or
    /// by others, who could rewrite it between verification and launch.
    BUNDLE_WRITABLE,
    /// A file of the bundle has its setuid or setgid bit set.
    BUNDLE_SETID,
    /// A file or directory of the bundle belongs to a user other than the verifier or root.
    BUNDLE_FOREIGN_OWNER,
}

/// The table's constant for `code`, or `None` for a code this build does not know (a
/// newer peer's). Lets a client keep the code a host sent instead of replacing it.
pub fn known(code: &str) -> Option<&'static str> {
    ALL.iter().copied().find(|known| *known == code)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    #[test]
    fn known_codes_are_found_and_others_are_not() {
        assert_eq!(
            super::known("LOCAL_AI_SERVER_NOT_READY"),
            Some(super::LOCAL_AI_SERVER_NOT_READY)
        );
        assert_eq!(super::known("NOT_A_CODE"), None);
    }

    #[test]
    fn every_code_is_listed_once_and_well_formed() {
        let mut seen = HashSet::new();
        for code in super::ALL {
            assert!(seen.insert(*code), "code {code} is listed twice");
            assert!(
                code.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'),
                "code {code} is not SCREAMING_SNAKE_CASE"
            );
        }
        // Every constant in this file must appear in ALL: the macro guarantees it, and
        // this check guards against someone adding a bare `pub const` by hand.
        let source = include_str!("codes.rs");
        let declared = source
            .lines()
            .filter_map(|l| l.trim().strip_suffix(','))
            .filter(|l| {
                !l.is_empty()
                    && l.bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            })
            .count();
        assert_eq!(declared, super::ALL.len());
    }
}
