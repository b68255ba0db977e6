//! The vocabulary every Arcane crate shares, and nothing else.
//!
//! Arcane's libraries never print and never exit: they return typed errors and emit
//! events, and the `arcane` binary (or the Core host) renders both. For that to work
//! across crates, three things must be common to all of them, and they live here:
//!
//! * [`codes`]: the one documented table of stable error codes (`ARCANE_WORKSPACE_BUSY`,
//!   `LOCAL_AI_EXECUTION_TARGET_UNAVAILABLE`, …). Codes never change once released;
//!   messages may.
//! * [`Diagnostic`]: what every library error exposes on top of `std::error::Error`: its
//!   stable code, structured details and hints a user can act on.
//! * [`event_types`]: the one table of event types (`local-ai.server.ready`,
//!   `workspace.operation.locked`, …), like the codes.
//! * [`Event`] and [`EventSink`]: the `{type, time, data}` event that the CLI renders as
//!   human lines or NDJSON, the Core host streams over SSE, and tests collect.
//!
//! This crate depends on nothing of Arcane's, so every other crate can depend on it
//! without breaking the one-way layering (lock ← localai ← core ← bundle ← cli).
//!
//! ```
//! use arcane_report::{Event, EventSink, Collector};
//!
//! let sink = Collector::default();
//! sink.emit(Event::new(arcane_report::event_types::WORKSPACE_OPERATION_LOCKED, serde_json::json!({"operation": "demo"})));
//! assert_eq!(sink.types(), vec!["workspace.operation.locked"]);
//! ```
#![warn(missing_docs)]

pub mod cancel;
pub mod codes;
mod diagnostic;
mod event;
pub mod event_types;
pub mod time;

pub use cancel::{CancelToken, Cancelled};
pub use diagnostic::{error_json, Cause, Diagnostic};
pub use event::{Collector, Event, EventSink, NullSink};
