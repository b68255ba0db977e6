//! Throttling of progress events: the first update, then at most one every 100 ms, and
//! always the last one, so a fast hash of a big file does not flood the event stream.

use std::time::{Duration, Instant};

use arcane_report::{Event, EventSink};
use serde_json::json;

const INTERVAL: Duration = Duration::from_millis(100);

/// Decides which progress updates become events.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    last: Option<Instant>,
}

impl Throttle {
    /// Whether the update `done` of `total` should be emitted.
    pub(crate) fn ready(&mut self, done: u64, total: Option<u64>) -> bool {
        let now = Instant::now();
        let due = match self.last {
            None => true,
            Some(last) => now.duration_since(last) >= INTERVAL || total == Some(done),
        };
        if due {
            self.last = Some(now);
        }
        due
    }
}

/// Emits `registry.hash.progress` `{path, action, done, total}` events, throttled.
pub(crate) fn hash_reporter<'a>(
    events: &'a dyn EventSink,
    path: &'a std::path::Path,
    action: &'static str,
) -> impl FnMut(u64, u64) + 'a {
    let mut throttle = Throttle::default();
    move |done, total| {
        if throttle.ready(done, Some(total)) {
            events.emit(Event::new(
                arcane_report::event_types::REGISTRY_HASH_PROGRESS,
                json!({"path": path, "action": action, "done": done, "total": total}),
            ));
        }
    }
}
