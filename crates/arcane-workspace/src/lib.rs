//! What an Arcane workspace holds, named once for every crate:
//!
//! * [`layout`]: the `.arcane` directory and every path under it (the operation lock,
//!   the Core host's files, the registry, installed runtimes and models, engine
//!   ownership records). No other crate spells one of these names.
//! * [`Engine`]: the identity of an engine kind Arcane runs (`llama.cpp`, `ollama`,
//!   `onnx`, `command`), as recorded in the registry and spoken on the wire, and its
//!   descriptor [`EngineKind`] (one module per kind under `kinds/`): everything that
//!   differs between kinds, so no other crate matches on the kind.
//!
//! A leaf crate: it depends on nothing of Arcane's, so the lock, the registry, the
//! supervisor, the Core host and the bundle all agree on one layout and one set of
//! kinds.
#![warn(missing_docs)]

mod engine;
pub mod ids;
mod kinds;
mod kinds_table;
pub mod layout;

pub use engine::{
    context_arg, door_arg, parallel_in, request_context, serves_only_vectors, serves_path,
    threads_in, AuxModel, CommandLine, DevicePlan, Engine, EngineKind, ForwardedMethod, Launch,
    ListenAt, MemoryModel, ModelFormat, OwnedListen, Probed, Readiness, RuntimeLibrary, Starts,
    Takes, UnknownEngine,
};
pub use kinds::{formats, worker_records};
pub use kinds_table::kinds_table;

/// The `command` kind's template: its placeholders, what they require, their
/// expansion.
pub mod command_template {
    pub use crate::kinds::command::{expand, needs, TemplateError, TemplateNeeds, PLACEHOLDERS};
}
