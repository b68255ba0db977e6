//! `GET /v1/logs?model=ID&since=5m&follow=1`: the kept lines as NDJSON
//! (`{"time", "model", "stream", "line"}` per line, oldest first), and with `follow`
//! every new line as it is recorded, until the client goes or the host closes.
//!
//! A followed stream sends an empty line every [`HEARTBEAT`] while nothing happens,
//! so a client (and its idle deadline) can tell a quiet model from a dead
//! connection; NDJSON readers skip empty lines. A follower that falls more than
//! [`arcane_core::logs::FOLLOW_BYTES`] behind gets a `host` line saying how many lines it missed,
//! not a silent gap.
//!
//! Each reader (following or not) is a [`arcane_core::logs::Follower`]: a task renders its lines
//! a [`PIECE_BYTES`] piece at a time into a channel of [`PIECES_QUEUED`] pieces that
//! the connection drains, so a slow or stalled client holds a few pieces, never a
//! copy of the book; the task ends, and frees them, when the client goes.

use std::sync::Arc;
use std::time::SystemTime;

use arcane_report::codes;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::header::HeaderValue;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use arcane_core::logs::{Follower, LogBook, LogFilter, LogLine, LogStream, HEARTBEAT, HOST_SOURCE};
use arcane_core::upstream::HttpBody;
use arcane_core::Host;

/// About how many bytes of log lines one piece of a reader's stream carries (at least
/// one line).
const PIECE_BYTES: usize = 16 * 1024;

/// How many pieces wait for a reader's connection before its task waits.
const PIECES_QUEUED: usize = 1;

/// What a request asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogQuery {
    /// Which lines.
    pub filter: LogFilter,
    /// Whether to keep streaming new lines.
    pub follow: bool,
}

/// Reads `model`, `since` and `follow` from a query string; the error names the
/// offending value.
pub fn parse_query(query: Option<&str>, now: SystemTime) -> Result<LogQuery, String> {
    let mut parsed = LogQuery {
        filter: LogFilter::default(),
        follow: false,
    };
    let pairs = query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty());
    for pair in pairs {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = crate::passthrough::percent_decode(value);
        match key {
            "model" if !value.is_empty() => parsed.filter.model = Some(value),
            "model" => {}
            "since" => {
                let back = arcane_core::duration::parse(&value)
                    .map_err(|why| format!("`since`: {why}"))?;
                parsed.filter.since = Some(now.checked_sub(back).unwrap_or(SystemTime::UNIX_EPOCH));
            }
            "follow" => {
                parsed.follow = match value.as_str() {
                    "" | "1" | "true" => true,
                    "0" | "false" => false,
                    other => return Err(format!("`follow` is `1` or `0`, not `{other}`")),
                }
            }
            other => {
                return Err(format!(
                    "unknown parameter `{other}` (known: model, since, follow)"
                ))
            }
        }
    }
    Ok(parsed)
}

/// The answer to `GET /v1/logs`: 400 for a bad query, 404 for a model that is
/// neither served (`known`) nor has lines, else the lines.
pub fn answer(
    book: &Arc<LogBook>,
    host: &Host,
    query: Option<&str>,
    known: &[String],
) -> Response<HttpBody> {
    let parsed = match parse_query(query, SystemTime::now()) {
        Ok(parsed) => parsed,
        Err(why) => {
            let details = json!({"query": query});
            return error(StatusCode::BAD_REQUEST, codes::ARCANE_USAGE, why, details);
        }
    };
    if let Some(model) = &parsed.filter.model {
        let mut sources = book.sources();
        sources.extend(known.iter().cloned());
        sources.push(HOST_SOURCE.into());
        sources.sort();
        sources.dedup();
        if !sources.contains(model) {
            let message = format!(
                "no model `{model}` has logs here (known: {})",
                sources.join(", ")
            );
            let details = json!({"model": model, "known": sources});
            return error(
                StatusCode::NOT_FOUND,
                codes::ARCANE_NOT_FOUND,
                message,
                details,
            );
        }
    }
    let body = stream(book, host, parsed.filter, parsed.follow);
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    headers.insert(
        hyper::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    response
}

fn error(status: StatusCode, code: &str, message: String, details: Value) -> Response<HttpBody> {
    crate::http::json_response(
        status,
        &json!({"error": {"code": code, "message": message, "details": details}}),
    )
}

fn ndjson(line: &LogLine) -> String {
    let mut text = serde_json::to_string(line).unwrap_or_default();
    text.push('\n');
    text
}

/// The kept lines that pass `filter` and, when `follow`, each new one: rendered by a
/// task, a bounded piece at a time (see the module documentation).
fn stream(book: &Arc<LogBook>, host: &Host, filter: LogFilter, follow: bool) -> HttpBody {
    let follower = book.follow(filter, follow);
    let (sender, receiver) = mpsc::channel::<Bytes>(PIECES_QUEUED);
    let host = host.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = pump(follower, &sender) => {}
            () = host.closed() => {}
        }
    });
    arcane_core::upstream::ChannelBody::new(receiver).boxed()
}

/// Sends `follower`'s lines to `sender` until it is done or the client goes.
async fn pump(mut follower: Follower, sender: &mpsc::Sender<Bytes>) {
    // The first piece goes at once, even empty, so the client sees the answer start.
    let mut first = true;
    let mut quiet_since = tokio::time::Instant::now();
    loop {
        let batch = follower.next_batch(PIECE_BYTES);
        let piece = if !batch.is_empty() || first {
            let mut text = String::new();
            if batch.missed > 0 {
                text.push_str(&ndjson(&missed_line(batch.missed)));
            }
            for line in &batch.lines {
                text.push_str(&ndjson(line));
            }
            text
        } else if follower.is_done() {
            return;
        } else {
            tokio::select! {
                () = follower.changed() => continue,
                () = tokio::time::sleep_until(quiet_since + HEARTBEAT) => "\n".to_string(),
                // The client went while nothing happened: end now, not at the next line.
                () = sender.closed() => return,
            }
        };
        drop(batch);
        first = false;
        if sender.send(Bytes::from(piece)).await.is_err() {
            return;
        }
        quiet_since = tokio::time::Instant::now();
    }
}

fn missed_line(missed: u64) -> LogLine {
    LogLine {
        time: arcane_report::time::now_rfc3339(),
        model: HOST_SOURCE.into(),
        stream: LogStream::Host,
        line: format!("{missed} lines were not sent: this reader fell behind"),
        at: SystemTime::now(),
        sequence: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_query_is_read_and_bad_values_are_named() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let parsed = parse_query(Some("model=smol%2Da&since=5m&follow=1"), now).unwrap();
        assert_eq!(parsed.filter.model.as_deref(), Some("smol-a"));
        assert_eq!(parsed.filter.since, Some(now - Duration::from_secs(300)));
        assert!(parsed.follow);
        assert_eq!(parse_query(None, now).unwrap().filter, LogFilter::default());
        for (query, named) in [
            ("since=soon", "soon"),
            ("follow=maybe", "maybe"),
            ("lines=10", "lines"),
        ] {
            let error = parse_query(Some(query), now).unwrap_err();
            assert!(error.contains(named), "{query}: {error}");
        }
    }
}
