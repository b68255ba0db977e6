//! What each model's engine printed and what the host did with it, kept in memory so
//! `GET /v1/logs` and `arcane logs` can show it.
//!
//! # Where lines come from
//!
//! The [`LogBook`] is an [`EventSink`] the host feeds every broadcast event to (its
//! observer, see [`crate::server::ServerBuilder`]). It keeps:
//!
//! * an engine's output (`process.stdout` / `process.stderr`), under the model its
//!   launcher tagged the event with ([`ModelTag`]: the gateway tags each model's
//!   engine, the plain local-AI service each engine);
//! * the host's own lines: the model gateway's and the supervisor's events
//!   (`local-ai.*`), orphans stopped (`process.orphan-stopped`), `core.error` and the
//!   HTTP transport's notices, rendered as `event key=value …`, under their model, or
//!   under `host` when they have none.
//!
//! State snapshots (`localai.state`, `core.state`, …) are not lines: they describe,
//! they do not happen.
//!
//! # Bounded
//!
//! All sources together hold at most the budget (default 1 MiB, `log_buffer` in
//! `arcane.toml`). Over it, the oldest line of the source holding the most bytes goes
//! first, so a chatty engine cannot wipe out a quiet one's lines.
//!
//! # Reading and following
//!
//! [`LogBook::read_and_follow`] returns the kept lines and a subscription taken under
//! the same lock as recording, so a follower sees every line exactly once. Lines are
//! ordered by a sequence number, not by the clock.

mod route;

pub use route::{answer as http_answer, parse_query, LogQuery, HEARTBEAT};

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arcane_report::{event_types, Event, EventSink};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::broadcast;

/// The default budget of all sources together, in bytes.
pub const DEFAULT_BUDGET: usize = 1024 * 1024;

/// The source of lines that name no model.
pub const HOST_SOURCE: &str = "host";

/// What a line's bytes are counted as beyond its text (time, names, bookkeeping).
const LINE_OVERHEAD: usize = 64;

/// How many lines a follower may fall behind before it is told it missed some.
const FOLLOW_BACKLOG: usize = 4096;

/// Which stream a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogStream {
    /// The engine's standard output.
    Stdout,
    /// The engine's standard error.
    Stderr,
    /// The host's own line about the model (or about itself).
    Host,
}

/// One kept line (serialized as `{time, model, stream, line}`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogLine {
    /// When it was recorded (RFC 3339 UTC).
    pub time: String,
    /// The model (or engine) it belongs to, or [`HOST_SOURCE`].
    pub model: String,
    /// Where it came from.
    pub stream: LogStream,
    /// The text.
    pub line: String,
    /// When it was recorded, for `since`.
    #[serde(skip)]
    pub at: SystemTime,
    /// Its place among all lines.
    #[serde(skip)]
    pub sequence: u64,
}

impl LogLine {
    fn bytes(&self) -> usize {
        self.line.len() + self.model.len() + LINE_OVERHEAD
    }
}

/// Which lines a reader wants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogFilter {
    /// One model's (or `host`'s) lines; all when `None`.
    pub model: Option<String>,
    /// Only lines recorded at or after this moment.
    pub since: Option<SystemTime>,
}

impl LogFilter {
    /// Whether `line` passes.
    pub fn accepts(&self, line: &LogLine) -> bool {
        self.model.as_deref().is_none_or(|m| m == line.model)
            && self.since.is_none_or(|since| line.at >= since)
    }
}

#[derive(Default)]
struct Rings {
    sources: HashMap<String, Ring>,
    total: usize,
    next: u64,
}

#[derive(Default)]
struct Ring {
    lines: VecDeque<Arc<LogLine>>,
    bytes: usize,
}

/// The bounded per-model rings of log lines (see the module documentation).
pub struct LogBook {
    budget: std::sync::atomic::AtomicUsize,
    rings: Mutex<Rings>,
    follow: broadcast::Sender<Arc<LogLine>>,
}

impl std::fmt::Debug for LogBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogBook")
            .field("budget", &self.budget())
            .finish()
    }
}

impl LogBook {
    /// A log book holding at most `budget` bytes in all.
    pub fn new(budget: usize) -> Arc<Self> {
        Arc::new(Self {
            budget: std::sync::atomic::AtomicUsize::new(budget),
            rings: Mutex::new(Rings::default()),
            follow: broadcast::channel(FOLLOW_BACKLOG).0,
        })
    }

    /// The most bytes kept, all sources together.
    pub fn budget(&self) -> usize {
        self.budget.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Changes the budget (`log_buffer` in `arcane.toml`), evicting what no longer
    /// fits.
    pub fn set_budget(&self, bytes: usize) {
        let mut rings = self.rings();
        self.budget
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
        while rings.total > bytes && evict_one(&mut rings) {}
    }

    fn rings(&self) -> std::sync::MutexGuard<'_, Rings> {
        self.rings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps one line of `model` (evicting what the budget needs) and hands it to
    /// followers.
    pub fn record(&self, model: &str, stream: LogStream, line: &str) {
        let mut rings = self.rings();
        let line = Arc::new(LogLine {
            time: arcane_report::time::now_rfc3339(),
            model: model.to_string(),
            stream,
            line: line.to_string(),
            at: SystemTime::now(),
            sequence: rings.next,
        });
        rings.next += 1;
        let bytes = line.bytes();
        let ring = rings.sources.entry(line.model.clone()).or_default();
        ring.lines.push_back(Arc::clone(&line));
        ring.bytes += bytes;
        rings.total += bytes;
        let budget = self.budget();
        while rings.total > budget && evict_one(&mut rings) {}
        // Sent under the lock, so a follower's backlog and its stream meet exactly.
        let _ = self.follow.send(line);
    }

    /// The kept lines that pass `filter`, oldest first.
    pub fn read(&self, filter: &LogFilter) -> Vec<Arc<LogLine>> {
        collect(&self.rings(), filter)
    }

    /// [`read`](Self::read), and a subscription to every line recorded after them.
    pub fn read_and_follow(
        &self,
        filter: &LogFilter,
    ) -> (Vec<Arc<LogLine>>, broadcast::Receiver<Arc<LogLine>>) {
        let rings = self.rings();
        (collect(&rings, filter), self.follow.subscribe())
    }

    /// The sources that have lines now (models, engines, `host`), sorted.
    pub fn sources(&self) -> Vec<String> {
        let mut sources: Vec<String> = self.rings().sources.keys().cloned().collect();
        sources.sort();
        sources
    }

    /// The bytes kept now (never more than the budget once a line was recorded).
    pub fn bytes(&self) -> usize {
        self.rings().total
    }
}

/// Reads a byte count a person writes: `1048576`, `512KiB`, `2MiB`, `1GiB` (also
/// `KB`, `MB`, `GB` as powers of 1000, and `B`); the error names the text.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let bad = || format!("`{text}` is not a size (bytes, or like `512KiB`, `2MiB`)");
    let number: usize = number.parse().map_err(|_| bad())?;
    let unit: usize = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return Err(bad()),
    };
    number.checked_mul(unit).ok_or_else(bad)
}

/// Removes the oldest line of the source holding the most bytes; `false` when there
/// is none.
fn evict_one(rings: &mut Rings) -> bool {
    let largest = rings
        .sources
        .iter()
        .max_by_key(|(_, ring)| ring.bytes)
        .map(|(name, _)| name.clone());
    let Some(name) = largest else { return false };
    let Some(ring) = rings.sources.get_mut(&name) else {
        return false;
    };
    let Some(line) = ring.lines.pop_front() else {
        rings.sources.remove(&name);
        return false;
    };
    ring.bytes -= line.bytes();
    rings.total -= line.bytes();
    if ring.lines.is_empty() {
        rings.sources.remove(&name);
    }
    true
}

fn collect(rings: &Rings, filter: &LogFilter) -> Vec<Arc<LogLine>> {
    let mut lines: Vec<Arc<LogLine>> = rings
        .sources
        .iter()
        .filter(|(name, _)| filter.model.as_deref().is_none_or(|m| m == name.as_str()))
        .flat_map(|(_, ring)| ring.lines.iter())
        .filter(|line| filter.accepts(line))
        .cloned()
        .collect();
    lines.sort_by_key(|line| line.sequence);
    lines
}

impl EventSink for LogBook {
    fn emit(&self, event: Event) {
        if let Some((model, stream, line)) = line_of(&event) {
            self.record(&model, stream, &line);
        }
    }
}

/// The line an event makes, if it is one (see the module documentation).
fn line_of(event: &Event) -> Option<(String, LogStream, String)> {
    let kind = event.kind.as_str();
    let (stream, line) = match kind {
        event_types::PROCESS_STDOUT => (LogStream::Stdout, event.data["line"].as_str()?.into()),
        event_types::PROCESS_STDERR => (LogStream::Stderr, event.data["line"].as_str()?.into()),
        _ if kind.starts_with("local-ai.")
            || kind.starts_with("process.")
            || kind.starts_with("core.http.")
            || kind == event_types::CORE_ERROR =>
        {
            (LogStream::Host, describe(kind, &event.data))
        }
        // A snapshot (`localai.state`, `core.state`, …) describes; it is not a line.
        _ => return None,
    };
    let model = event.data["model"]
        .as_str()
        .or_else(|| event.data["id"].as_str())
        .unwrap_or(HOST_SOURCE);
    Some((model.to_string(), stream, line))
}

/// `event key=value …`: the event's scalar fields (and an error's message), without
/// the model it is filed under.
fn describe(kind: &str, data: &Value) -> String {
    let mut text = kind.to_string();
    let Some(fields) = data.as_object() else {
        return text;
    };
    for (key, value) in fields {
        let shown = match value {
            _ if key == "model" => None,
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Object(_) if value["message"].is_string() => {
                value["message"].as_str().map(str::to_string)
            }
            _ => None,
        };
        if let Some(shown) = shown {
            text.push_str(&format!(" {key}={shown}"));
        }
    }
    text
}

/// An [`EventSink`] that files every event of one launcher under `model` (it adds
/// `"model"` to the event's data when absent) before passing it on: engine output
/// carries only a pid, and the log book and clients need to know whose it is.
pub struct ModelTag {
    model: String,
    inner: Arc<dyn EventSink>,
}

impl ModelTag {
    /// Tags what goes to `inner` with `model`.
    pub fn wrap(model: impl Into<String>, inner: Arc<dyn EventSink>) -> Arc<dyn EventSink> {
        Arc::new(Self {
            model: model.into(),
            inner,
        })
    }
}

impl EventSink for ModelTag {
    fn emit(&self, mut event: Event) {
        if let Some(data) = event.data.as_object_mut() {
            data.entry("model")
                .or_insert_with(|| Value::String(self.model.clone()));
        }
        self.inner.emit(event);
    }
}

/// Feeds every event to each of two sinks (the log book and the caller's observer).
pub struct Tee(pub Arc<dyn EventSink>, pub Arc<dyn EventSink>);

impl EventSink for Tee {
    fn emit(&self, event: Event) {
        self.0.emit(event.clone());
        self.1.emit(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lines(book: &LogBook, model: Option<&str>) -> Vec<String> {
        let filter = LogFilter {
            model: model.map(str::to_string),
            since: None,
        };
        book.read(&filter).iter().map(|l| l.line.clone()).collect()
    }

    #[test]
    fn engine_output_and_host_lines_are_filed_under_their_model() {
        let book = LogBook::new(DEFAULT_BUDGET);
        let tagged = ModelTag::wrap("smol", book.clone());
        tagged.emit(Event::new(
            event_types::PROCESS_STDERR,
            json!({"pid": 7, "line": "loading model"}),
        ));
        book.emit(Event::new(
            event_types::LOCAL_AI_MODEL_READY,
            json!({"model": "smol", "device": "cpu", "pid": 7}),
        ));
        book.emit(Event::new(
            event_types::CORE_STATE,
            json!({"state": "ready"}),
        ));
        book.emit(Event::new(
            event_types::CORE_ERROR,
            json!({"error": {"message": "boom", "code": "X"}}),
        ));
        assert_eq!(
            lines(&book, Some("smol")),
            ["loading model", "local-ai.model.ready device=cpu pid=7"]
        );
        assert_eq!(lines(&book, Some(HOST_SOURCE)), ["core.error error=boom"]);
        assert_eq!(book.sources(), [HOST_SOURCE, "smol"]);
        let smol = book.read(&LogFilter {
            model: Some("smol".into()),
            since: None,
        });
        assert_eq!(smol[0].stream, LogStream::Stderr);
        assert_eq!(smol[1].stream, LogStream::Host);
    }

    #[test]
    fn the_budget_holds_and_a_chatty_source_loses_its_own_lines_first() {
        let budget = 20 * (LINE_OVERHEAD + 10);
        let book = LogBook::new(budget);
        book.record("quiet", LogStream::Stdout, "quiet-0001");
        for n in 0..1000 {
            book.record("chatty", LogStream::Stdout, &format!("chatty{n:04}"));
        }
        assert!(book.bytes() <= budget, "{} > {budget}", book.bytes());
        assert_eq!(lines(&book, Some("quiet")), ["quiet-0001"]);
        let chatty = lines(&book, Some("chatty"));
        assert_eq!(chatty.last().map(String::as_str), Some("chatty0999"));
        assert!(chatty.len() < 20 && !chatty.contains(&"chatty0000".to_string()));
        // All sources merge in the order lines were recorded.
        let all = lines(&book, None);
        assert_eq!(all[0], "quiet-0001");
        assert_eq!(all.last().map(String::as_str), Some("chatty0999"));
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("2MiB"), Ok(2 << 20));
        assert_eq!(parse_size("1MB"), Ok(1_000_000));
        for bad in ["", "MiB", "1.5MiB", "2 parsecs", "-1"] {
            assert!(parse_size(bad).unwrap_err().contains(bad), "{bad}");
        }
        let book = LogBook::new(DEFAULT_BUDGET);
        for n in 0..100 {
            book.record("m", LogStream::Stdout, &format!("line {n}"));
        }
        book.set_budget(10 * (LINE_OVERHEAD + 8));
        assert!(book.bytes() <= book.budget());
        assert_eq!(
            book.read(&LogFilter::default())
                .last()
                .map(|l| l.line.clone()),
            Some("line 99".into())
        );
    }

    #[test]
    fn since_keeps_only_newer_lines_and_a_follower_misses_nothing() {
        let book = LogBook::new(DEFAULT_BUDGET);
        book.record("m", LogStream::Stdout, "old");
        book.record("m", LogStream::Stdout, "new");
        let kept = book.read(&LogFilter::default());
        // Just after the old line, at or before the new one: whatever the clock did.
        let cut = (kept[0].at + std::time::Duration::from_nanos(1)).min(kept[1].at);
        let newer = book.read(&LogFilter {
            model: None,
            since: Some(cut),
        });
        assert_eq!(newer.len(), 1);
        assert_eq!(newer[0].line, "new");
        let (backlog, mut follow) = book.read_and_follow(&LogFilter::default());
        assert_eq!(backlog.len(), 2);
        book.record("m", LogStream::Stderr, "after");
        assert_eq!(
            follow.try_recv().map(|l| l.line.clone()),
            Ok("after".into())
        );
    }
}
