//! The crash-safe, symlink-safe workspace operation lock shared by every mutating operation and every process.
//!
//! (Being built; see the open issue for this crate.)
#![warn(missing_docs)]
