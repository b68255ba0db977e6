//! What an Arcane workspace holds, named once for every crate:
//!
//! * [`layout`]: the `.arcane` directory and every path under it (the operation lock,
//!   the Core host's files, the registry, installed runtimes and models, engine
//!   ownership records). No other crate spells one of these names.
//! * [`Engine`]: the identity of an inference engine Arcane runs (`llama.cpp`,
//!   `ollama`), as recorded in the registry and spoken on the wire.
//!
//! A leaf crate: it depends on nothing of Arcane's, so the lock, the registry, the
//! supervisor, the Core host and the bundle all agree on one layout.
#![warn(missing_docs)]

mod engine;
pub mod layout;

pub use engine::{Engine, UnknownEngine};
