//! `GET /v1/logs?model=ID&since=5m&follow=1`: the kept lines as NDJSON
//! (`{"time", "model", "stream", "line"}` per line, oldest first), and with `follow`
//! every new line as it is recorded, until the client goes or the host closes.
//!
//! A followed stream sends an empty line every [`HEARTBEAT`] while nothing happens,
//! so a client (and its idle deadline) can tell a quiet model from a dead
//! connection; NDJSON readers skip empty lines. A follower that falls more than the
//! backlog behind gets a `host` line saying how many lines it missed, not a silent
//! gap.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arcane_report::codes;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::header::HeaderValue;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};

use super::{LogBook, LogFilter, LogLine, LogStream, HOST_SOURCE};
use crate::upstream::HttpBody;
use crate::Host;

/// How often a followed stream says it is alive while nothing happens.
pub const HEARTBEAT: Duration = Duration::from_secs(15);

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
                let back =
                    crate::duration::parse(&value).map_err(|why| format!("`since`: {why}"))?;
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
    let body = if parsed.follow {
        follow(book, host, parsed.filter)
    } else {
        let text: String = book
            .read(&parsed.filter)
            .iter()
            .map(|l| ndjson(l))
            .collect();
        crate::upstream::full(text)
    };
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

/// The followed stream: the backlog, then each new line that passes `filter`.
fn follow(book: &Arc<LogBook>, host: &Host, filter: LogFilter) -> HttpBody {
    let (backlog, mut lines) = book.read_and_follow(&filter);
    let (sender, receiver) = mpsc::channel::<Bytes>(256);
    let host = host.clone();
    tokio::spawn(async move {
        let text: String = backlog.iter().map(|l| ndjson(l)).collect();
        if sender.send(Bytes::from(text)).await.is_err() {
            return;
        }
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        heartbeat.tick().await;
        loop {
            let piece = tokio::select! {
                line = lines.recv() => match line {
                    Ok(line) if filter.accepts(&line) => ndjson(&line),
                    Ok(_) => continue,
                    Err(broadcast::error::RecvError::Lagged(missed)) => ndjson(&missed_line(missed)),
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = heartbeat.tick() => "\n".to_string(),
                _ = host.closed() => return,
            };
            if sender.send(Bytes::from(piece)).await.is_err() {
                return;
            }
        }
    });
    crate::upstream::ChannelBody::new(receiver).boxed()
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
