//! Portable bundles: layout, manifest, build, strict verification and launch modes.
//!
//! (Being built; see the open issue for this crate.)
#![warn(missing_docs)]
