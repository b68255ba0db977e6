//! The one event type, `{type, time, data}`, and the sinks that receive it.
//!
//! Event types are dotted names grouped by subsystem:
//! `workspace.operation.locked|released|stale-recovered|waiting`,
//! `local-ai.server.starting|loading|ready|error|stopped`, `process.*`, `core.*`.
//! `data` is a JSON object whose fields are documented where each event is emitted.

use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One event: a dotted `type`, the RFC 3339 UTC `time` it happened, and its `data`.
///
/// Serialized exactly as `{"type": …, "time": …, "data": …}`; this is the NDJSON line
/// the CLI prints and the payload the Core host streams.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The dotted event type, e.g. `workspace.operation.locked`.
    #[serde(rename = "type")]
    pub kind: String,
    /// When it happened, RFC 3339 in UTC with milliseconds.
    pub time: String,
    /// The event's payload.
    pub data: Value,
}

impl Event {
    /// Creates an event of type `kind` stamped with the current time.
    pub fn new(kind: impl Into<String>, data: Value) -> Self {
        Self {
            kind: kind.into(),
            time: crate::time::now_rfc3339(),
            data,
        }
    }
}

/// Receives events. Libraries take a `&dyn EventSink` and never print.
///
/// Implementations must be cheap and must not block for long: events are emitted from
/// inside lock acquisition and supervision loops.
pub trait EventSink: Send + Sync {
    /// Delivers one event.
    fn emit(&self, event: Event);

    /// Whether events are wanted at all: an emitter on a hot path may skip building
    /// one when not (`false` only for [`NullSink`]).
    fn enabled(&self) -> bool {
        true
    }
}

impl<F: Fn(Event) + Send + Sync> EventSink for F {
    fn emit(&self, event: Event) {
        self(event)
    }
}

/// A sink that drops every event.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullSink;

impl EventSink for NullSink {
    fn emit(&self, _event: Event) {}

    fn enabled(&self) -> bool {
        false
    }
}

/// A sink that keeps every event in memory, in order; for tests and for replaying.
#[derive(Debug, Default)]
pub struct Collector {
    events: Mutex<Vec<Event>>,
}

impl Collector {
    /// A copy of every event received so far.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// The types of every event received so far, in order.
    pub fn types(&self) -> Vec<String> {
        self.events().into_iter().map(|e| e.kind).collect()
    }
}

impl EventSink for Collector {
    fn emit(&self, event: Event) {
        if let Ok(mut events) = self.events.lock() {
            events.push(event);
        }
    }
}
