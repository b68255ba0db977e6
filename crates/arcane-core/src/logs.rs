//! What each model's engine printed and what the host did with it, kept in memory so
//! `GET /v1/logs` and `arcane logs` can show it.
//!
//! # Where lines come from
//!
//! The [`LogBook`] is an [`EventSink`] the host feeds every broadcast event to (its
//! observer, see the front door's `server::ServerBuilder`). It keeps:
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
//! The host's memory for logs is the budget plus a constant, however much engines
//! print and however many readers follow:
//!
//! * an engine's line arrives capped (`arcane-localai` keeps at most 64 KiB of one
//!   line and says how many bytes it dropped), and the engine waits when the host is
//!   behind, so nothing queues without bound before the book;
//! * followers do not get copies: they share one tail of the latest lines, at most
//!   [`FOLLOW_BYTES`], kept only while someone follows, and each reads it (and the
//!   kept lines before it) through a cursor, a batch of bounded size at a time. A
//!   follower that falls more than the tail behind is told how many lines it missed.
//!   What one follower holds is its cursor and the batch it is sending; when it goes,
//!   so does that, and the tail goes with the last follower.
//!
//! # Reading and following
//!
//! [`LogBook::follow`] starts a [`Follower`] at the oldest kept line; the lines kept
//! then and every line recorded after reach it exactly once, in order. Lines are
//! ordered by a sequence number, not by the clock.

/// How often a followed stream of log lines says it is alive while nothing happens
/// (the front door's `GET /v1/logs?follow=1`; a client waits a few times as long).
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(15);

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arcane_report::{event_types, Event, EventSink};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::watch;

/// The default budget of all sources together, in bytes.
pub const DEFAULT_BUDGET: usize = 1024 * 1024;

/// The source of lines that name no model.
pub const HOST_SOURCE: &str = "host";

/// What a line's bytes are counted as beyond its text (time, names, bookkeeping).
const LINE_OVERHEAD: usize = 64;

/// How far behind the newest line, in bytes (a line's text plus bookkeeping), a
/// follower may fall before it is told it missed some: the size of the tail all
/// followers share, on top of the budget.
pub const FOLLOW_BYTES: usize = 1024 * 1024;

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
    /// The latest lines, with contiguous sequence numbers, while anyone follows (at
    /// most [`FOLLOW_BYTES`], never less than the newest line).
    tail: VecDeque<Arc<LogLine>>,
    tail_bytes: usize,
    /// How many [`Follower`]s exist.
    followers: usize,
    /// The most that existed at once since the last one left.
    followers_peak: usize,
}

impl Rings {
    /// Keeps `line` in the followers' tail, dropping what falls beyond
    /// [`FOLLOW_BYTES`].
    fn push_tail(&mut self, line: &Arc<LogLine>) {
        if self.followers == 0 {
            return;
        }
        self.tail_bytes += line.bytes();
        self.tail.push_back(Arc::clone(line));
        while self.tail_bytes > FOLLOW_BYTES && self.tail.len() > 1 {
            if let Some(old) = self.tail.pop_front() {
                self.tail_bytes -= old.bytes();
            }
        }
    }
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
    /// The sequence number of the newest line; followers wait on its changes.
    recorded: watch::Sender<u64>,
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
            recorded: watch::Sender::new(0),
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
        rings.push_tail(&line);
        drop(rings);
        self.recorded.send_replace(line.sequence);
    }

    /// The kept lines that pass `filter`, oldest first.
    pub fn read(&self, filter: &LogFilter) -> Vec<Arc<LogLine>> {
        collect(&self.rings(), filter)
    }

    /// A reader of the kept lines that pass `filter` and, when `live`, of every line
    /// recorded after them (see [`Follower`]).
    pub fn follow(self: &Arc<Self>, filter: LogFilter, live: bool) -> Follower {
        let mut rings = self.rings();
        rings.followers += 1;
        rings.followers_peak = rings.followers_peak.max(rings.followers);
        Follower {
            book: Arc::clone(self),
            filter,
            cursor: 0,
            kept_until: rings.next,
            live,
            recorded: self.recorded.subscribe(),
        }
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

/// What a [`Follower`] reads at once.
#[derive(Debug, Default)]
pub struct Batch {
    /// How many lines were recorded and are gone before this reader got to them
    /// (it fell more than [`FOLLOW_BYTES`] behind); they came before `lines`.
    pub missed: u64,
    /// The next lines that pass the filter, oldest first.
    pub lines: Vec<Arc<LogLine>>,
}

impl Batch {
    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.missed == 0 && self.lines.is_empty()
    }
}

/// One reader of a [`LogBook`]: first the lines kept when it started (those still kept
/// when it gets to them), then, when live, each line recorded since, exactly once and
/// in order. It holds a cursor, not lines: what it has not read yet stays in the book
/// (or the followers' shared tail), so a slow reader costs the host no memory of its
/// own. Dropping it ends the subscription.
pub struct Follower {
    book: Arc<LogBook>,
    filter: LogFilter,
    /// The sequence number of the next line to read.
    cursor: u64,
    /// Lines before this one were kept when the reader started: they are read from
    /// the book, the later ones from the tail.
    kept_until: u64,
    live: bool,
    recorded: watch::Receiver<u64>,
}

impl std::fmt::Debug for Follower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follower")
            .field("filter", &self.filter)
            .field("cursor", &self.cursor)
            .finish_non_exhaustive()
    }
}

impl Follower {
    /// The next lines, about `max_bytes` of them (at least one line when there is
    /// one); empty when there is nothing new. Never waits.
    pub fn next_batch(&mut self, max_bytes: usize) -> Batch {
        // Seen before reading, so a line recorded from here on wakes `changed`.
        self.recorded.borrow_and_update();
        let book = Arc::clone(&self.book);
        let rings = book.rings();
        let mut batch = Batch::default();
        if self.cursor < self.kept_until {
            self.read_kept(&rings, max_bytes, &mut batch);
            if !batch.lines.is_empty() || !self.live {
                return batch;
            }
        }
        if self.live {
            self.read_tail(&rings, max_bytes, &mut batch);
        }
        batch
    }

    /// Whether every line this reader will ever give was given (not live, and the
    /// kept lines were read).
    pub fn is_done(&self) -> bool {
        !self.live && self.cursor >= self.kept_until
    }

    /// Waits until a line was recorded since the last [`next_batch`](Self::next_batch)
    /// (it may not pass the filter).
    pub async fn changed(&mut self) {
        // The sender lives in the book, which this reader keeps alive: never an error.
        let _ = self.recorded.changed().await;
    }

    /// The kept lines from the cursor on, merged across sources by sequence.
    fn read_kept(&mut self, rings: &Rings, max_bytes: usize, batch: &mut Batch) {
        let cursor = self.cursor;
        let mut heads: Vec<(&VecDeque<Arc<LogLine>>, usize)> = rings
            .sources
            .iter()
            .filter(|(name, _)| {
                self.filter
                    .model
                    .as_deref()
                    .is_none_or(|m| m == name.as_str())
            })
            .map(|(_, ring)| {
                let start = ring.lines.partition_point(|l| l.sequence < cursor);
                (&ring.lines, start)
            })
            .collect();
        let mut bytes = 0;
        loop {
            let next = heads
                .iter_mut()
                .filter_map(|head| {
                    let line = head.0.get(head.1)?;
                    (line.sequence < self.kept_until).then_some((line.sequence, head))
                })
                .min_by_key(|(sequence, _)| *sequence);
            let Some((_, head)) = next else {
                self.cursor = self.kept_until;
                return;
            };
            let Some(line) = head.0.get(head.1) else {
                return;
            };
            if !batch.lines.is_empty() && bytes + line.bytes() > max_bytes {
                return;
            }
            head.1 += 1;
            self.cursor = line.sequence + 1;
            if self.filter.accepts(line) {
                bytes += line.bytes();
                batch.lines.push(Arc::clone(line));
            }
        }
    }

    /// The lines recorded since the reader started, from the cursor on.
    fn read_tail(&mut self, rings: &Rings, max_bytes: usize, batch: &mut Batch) {
        self.cursor = self.cursor.max(self.kept_until);
        let first = rings.tail.front().map_or(rings.next, |l| l.sequence);
        if self.cursor < first {
            batch.missed = first - self.cursor;
            self.cursor = first;
        }
        let start = usize::try_from(self.cursor - first).unwrap_or(usize::MAX);
        let mut bytes = 0;
        for line in rings.tail.iter().skip(start) {
            if !batch.lines.is_empty() && bytes + line.bytes() > max_bytes {
                return;
            }
            self.cursor = line.sequence + 1;
            if self.filter.accepts(line) {
                bytes += line.bytes();
                batch.lines.push(Arc::clone(line));
            }
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let mut rings = self.book.rings();
        rings.followers = rings.followers.saturating_sub(1);
        if rings.followers == 0 {
            // Nobody follows: the tail (and the memory it held) goes.
            rings.tail = VecDeque::new();
            rings.tail_bytes = 0;
            let many = std::mem::take(&mut rings.followers_peak) >= TRIM_AFTER_FOLLOWERS;
            drop(rings);
            if many {
                give_back_freed_memory();
            }
        }
    }
}

/// How many readers must have followed at once for the last one's leaving to hand
/// freed memory back to the system (see [`give_back_freed_memory`]).
const TRIM_AFTER_FOLLOWERS: usize = 64;

/// Hands the heap's free pages back to the system (glibc's `malloc_trim`).
///
/// Why: the memory of many followers (their pieces, their connections' buffers) is
/// freed when they leave, but glibc keeps it in its per-thread arenas, where the
/// fragments left between live allocations are never returned on their own. Measured
/// (1024 followers of a full 1 MiB book, then gone): the host's RSS stayed at 105 MB;
/// with this call when the last one left it fell back to 29 MB, where it was before
/// they came. It runs only after at least [`TRIM_AFTER_FOLLOWERS`] followed at once,
/// so an `arcane logs` now and then costs nothing. Not needed (and not available)
/// with other allocators.
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes the allocator's own locks and only releases free
    // pages; it has no preconditions (malloc_trim(3)).
    unsafe {
        libc::malloc_trim(0);
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
        let mut follower = book.follow(LogFilter::default(), true);
        book.record("m", LogStream::Stderr, "after");
        // The kept lines first, then what was recorded since.
        assert_eq!(texts(&follower.next_batch(usize::MAX)), ["old", "new"]);
        let batch = follower.next_batch(usize::MAX);
        assert_eq!(batch.missed, 0);
        assert_eq!(texts(&batch), ["after"]);
        assert!(follower.next_batch(usize::MAX).is_empty());
    }

    fn texts(batch: &Batch) -> Vec<&str> {
        batch.lines.iter().map(|l| l.line.as_str()).collect()
    }

    #[tokio::test]
    async fn a_follower_reads_kept_then_new_lines_in_bounded_batches_and_wakes_on_new_ones() {
        let book = LogBook::new(DEFAULT_BUDGET);
        for n in 0..10 {
            let model = if n % 2 == 0 { "a" } else { "b" };
            book.record(model, LogStream::Stdout, &format!("{model}{n}"));
        }
        let only_a = LogFilter {
            model: Some("a".into()),
            since: None,
        };
        let mut follower = book.follow(only_a.clone(), true);
        let mut plain = book.follow(only_a, false);
        // About two lines' worth of bytes a batch, merged across sources in order.
        let two = 2 * (LINE_OVERHEAD + 3);
        assert_eq!(texts(&follower.next_batch(two)), ["a0", "a2"]);
        assert_eq!(texts(&follower.next_batch(two)), ["a4", "a6"]);
        assert_eq!(texts(&follower.next_batch(two)), ["a8"]);
        assert!(follower.next_batch(two).is_empty());
        // A line is recorded: the follower wakes and gets it; the plain reader does
        // not (it reads what was kept when it started, then is done).
        let wake = tokio::spawn(async move {
            follower.changed().await;
            (texts(&follower.next_batch(two)).join(","), follower)
        });
        book.record("b", LogStream::Stdout, "b10");
        book.record("a", LogStream::Stdout, "a11");
        let (woken, mut follower) = wake.await.unwrap();
        let mut seen = woken;
        // It may have woken between the two lines.
        for line in texts(&follower.next_batch(two)) {
            seen.push_str(line);
        }
        assert_eq!(seen, "a11");
        assert_eq!(texts(&plain.next_batch(usize::MAX)).len(), 5);
        assert!(plain.next_batch(usize::MAX).is_empty() && plain.is_done());
        // At least one line a batch, whatever the size asked.
        book.record("a", LogStream::Stdout, "a12");
        assert_eq!(texts(&follower.next_batch(1)), ["a12"]);
    }

    #[test]
    fn a_stalled_follower_costs_at_most_the_tail_and_is_told_what_it_missed() {
        // 64 KiB lines, the most an engine line keeps: the old broadcast backlog
        // (4096 lines a follower) would have held 256 MiB for one stalled follower.
        let book = LogBook::new(DEFAULT_BUDGET);
        let big = "x".repeat(64 * 1024);
        let mut stalled = book.follow(LogFilter::default(), true);
        let _other = book.follow(LogFilter::default(), true);
        for n in 0..200 {
            book.record("m", LogStream::Stdout, &format!("{n:03}{big}"));
        }
        let tail_bytes = book.rings().tail_bytes;
        assert!(tail_bytes <= FOLLOW_BYTES, "{tail_bytes} > {FOLLOW_BYTES}");
        assert!(book.bytes() <= book.budget());
        // Whatever is still referenced from the book and the tail: the budget plus the
        // tail, shared by every follower.
        let batch = stalled.next_batch(usize::MAX);
        let kept = batch.lines.len() as u64;
        assert!(batch.missed > 0);
        assert_eq!(batch.missed + kept, 200, "every line is sent or counted");
        let last = batch.lines.last().map(|l| l.line[..3].to_string());
        assert_eq!(last.as_deref(), Some("199"));
        // Followers gone: so is the tail.
        drop(stalled);
        assert!(book.rings().tail_bytes > 0, "one follower is left");
        drop(_other);
        assert_eq!(book.rings().tail_bytes, 0);
        assert_eq!(book.rings().tail.len(), 0);
        book.record("m", LogStream::Stdout, "nobody follows");
        assert_eq!(book.rings().tail.len(), 0);
    }
}
