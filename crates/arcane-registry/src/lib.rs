//! The runtime and model registry of a workspace.
//!
//! (Being built; see the open issue for this crate.)
#![warn(missing_docs)]
