//! The Arcane Core host: services, the arcane/1 protocol over stdio and loopback HTTP, events, OpenAI-compatible passthrough.
//!
//! (Being built; see the open issue for this crate.)
#![warn(missing_docs)]
