//! Portable bundles: one directory holding an app, its inference runtimes and its
//! models, that can be copied anywhere, verified byte for byte, and launched.
//!
//! # Layout
//!
//! ```text
//! <bundle>/
//!   arcane-bundle.json                      the manifest (written last by a build)
//!   bin/arcane                              the launcher: the `arcane` binary itself
//!   app/…                                   the app, copied byte for byte
//!   runtimes/<id>/<os>-<arch>-<backend>/…   an engine executable and its shared libraries
//!   models/<id>/<file>.gguf                 the models
//! ```
//!
//! Every path in the manifest is a bundle-root-relative POSIX path ([`path`]); the
//! bundle holds no absolute path, so it keeps working after being moved or renamed,
//! and nothing is ever written inside it, so it works on a read-only file system.
//! Mutable state lives under a separate state root ([`launch`]). The manifest format
//! is documented in `docs/bundle.md` and on [`Manifest`].
//!
//! # What this crate guarantees
//!
//! * [`verify()`] never follows a symlink, never opens a path that failed the path
//!   grammar, checks every file's type, link count, size, mode and SHA-256 (on every
//!   core), refuses unlisted files, and reports *every* failure with a stable
//!   `BUNDLE_*` code naming the path.
//! * [`build()`] never overwrites: it assembles a temporary sibling of `--out`, writes
//!   the manifest last and renames the directory into place with `RENAME_NOREPLACE`;
//!   a failure or cancellation removes only that temporary directory.
//! * [`verify()`] refuses what another user could change before launch (group- or
//!   world-writable, setuid/setgid, owned by someone else), and launch runs exactly
//!   what it verified: identities re-checked before use, an app entry re-hashed and
//!   executed through its open descriptor ([`pinned`]).
//! * [`launch`] resolves the launch context without letting a launch file redirect a
//!   bundle-owned path, and resolves `--arcane-app-entry` only to a listed executable
//!   under `app/`.
//!
//! It does not own the Core host: the CLI starts it with the paths resolved here.
//!
//! # Example
//!
//! ```no_run
//! use arcane_bundle::{verify, VerifyOptions};
//! use arcane_report::{CancelToken, NullSink};
//!
//! let report = verify("/opt/my-app".as_ref(), &VerifyOptions::default(), &NullSink, &CancelToken::new())?;
//! for failure in &report.failures {
//!     eprintln!("{failure}"); // e.g. BUNDLE_HASH_MISMATCH: `models/smollm2/model.gguf`: …
//! }
//! # Ok::<(), arcane_bundle::Error>(())
//! ```
//!
//! Benchmark (verify throughput against `sha256sum` over the same files):
//! `cargo bench -p arcane-bundle --bench verify`.
#![warn(missing_docs)]

mod build;
mod elf;
mod error;
mod failure;
mod hash;
pub mod launch;
pub mod manifest;
pub mod path;
pub mod pinned;
pub mod sign;
mod verify;

pub use build::{
    build, AppOverrides, BuildOutcome, BuildRequest, RuntimeKind, RuntimeRequest, APP_DESCRIPTOR,
};
pub use error::Error;
pub use failure::Failure;
pub use launch::{
    bundle_root_from_launcher, default_state_root, open_app_entry, prepare_state_root,
    resolve_app_entry, resolve_context, HostDirs, LaunchContext, LaunchModel, LaunchRuntime,
};
pub use manifest::Manifest;
pub use pinned::PinnedFile;
pub use verify::{
    verify, verify_strict, VerifiedBundle, VerifyOptions, VerifyReport, MAX_FAILURES,
};
