//! HTTP(S) downloads into a new file, hashed on the way, with progress events and
//! prompt cancellation.
//!
//! The network is read on a worker thread that hands chunks over a bounded channel;
//! the calling thread writes and hashes them and waits on the channel in short slices,
//! so a cancellation is honoured at once even while the server is silent (the worker
//! then ends at its read timeout). A body shorter than its `Content-Length` is an
//! [`Error::Truncated`]. Events:
//!
//! * `download.started` `{url, total}` (`total` is `null` without a `Content-Length`)
//! * `download.progress` `{url, received, total}` (first chunk, then at most every 100 ms)
//! * `download.finished` `{url, bytes, sha256}`

// A download is hashed chunk by chunk as the worker thread hands the bytes over (a
// push), which the pull-based `arcane_files::stream_sha256` cannot take; clippy.toml
// fences `Sha256::new` everywhere else.
#![allow(clippy::disallowed_methods)]

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::mpsc::{sync_channel, RecvTimeoutError};
use std::time::Duration;

use arcane_report::{CancelToken, Event, EventSink};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::progress::Throttle;
use crate::Error;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const READ_TIMEOUT: Duration = Duration::from_secs(60);

enum Message {
    Started(Option<u64>),
    Chunk(Vec<u8>),
    Done,
    Failed(Error),
}

/// Downloads `url` into the new file `dest`; returns `(bytes, sha256)`. On any error or
/// cancellation the partial file is removed.
pub(crate) fn download(
    url: &str,
    dest: &Path,
    events: &dyn EventSink,
    cancel: &CancelToken,
) -> Result<(u64, String), Error> {
    let result = download_inner(url, dest, events, cancel);
    if result.is_err() {
        let _ = std::fs::remove_file(dest);
    }
    result
}

fn download_inner(
    url: &str,
    dest: &Path,
    events: &dyn EventSink,
    cancel: &CancelToken,
) -> Result<(u64, String), Error> {
    let mut file = File::options()
        .write(true)
        .create_new(true)
        .open(dest)
        .map_err(|e| Error::io("create", dest, e))?;
    let (sender, receiver) = sync_channel::<Message>(8);
    let worker_url = url.to_string();
    let worker_cancel = cancel.clone();
    std::thread::spawn(move || fetch(&worker_url, &worker_cancel, &sender));

    let mut hasher = Sha256::new();
    let mut received = 0u64;
    let mut total = None;
    let mut throttle = Throttle::default();
    loop {
        if cancel.is_cancelled() {
            return Err(Error::cancelled("download"));
        }
        let message = match receiver.recv_timeout(Duration::from_millis(50)) {
            Ok(message) => message,
            Err(RecvTimeoutError::Timeout) => continue,
            // The worker also watches the token and stops without a message when it
            // fires, so a cancellation between our check above and this receive shows
            // up as a disconnect: it is still a cancellation, not a failure.
            Err(RecvTimeoutError::Disconnected) if cancel.is_cancelled() => {
                return Err(Error::cancelled("download"));
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Error::Download {
                    url: url.to_string(),
                    source: "the download worker stopped unexpectedly".into(),
                })
            }
        };
        match message {
            Message::Started(length) => {
                total = length;
                events.emit(Event::new(
                    arcane_report::event_types::DOWNLOAD_STARTED,
                    json!({"url": url, "total": total}),
                ));
            }
            Message::Chunk(bytes) => {
                hasher.update(&bytes);
                file.write_all(&bytes)
                    .map_err(|e| Error::io("write", dest, e))?;
                received += bytes.len() as u64;
                if throttle.ready(received, total) {
                    events.emit(Event::new(
                        arcane_report::event_types::DOWNLOAD_PROGRESS,
                        json!({"url": url, "received": received, "total": total}),
                    ));
                }
            }
            Message::Done => break,
            Message::Failed(error) => return Err(error),
        }
    }
    if let Some(expected) = total {
        if received != expected {
            return Err(Error::Truncated {
                url: url.to_string(),
                expected,
                received,
            });
        }
    }
    file.sync_all().map_err(|e| Error::io("sync", dest, e))?;
    let sha256 = hex::encode(hasher.finalize());
    events.emit(Event::new(
        arcane_report::event_types::DOWNLOAD_FINISHED,
        json!({"url": url, "bytes": received, "sha256": sha256}),
    ));
    Ok((received, sha256))
}

/// The worker: performs the request and streams the body into `sender`.
fn fetch(url: &str, cancel: &CancelToken, sender: &std::sync::mpsc::SyncSender<Message>) {
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(CONNECT_TIMEOUT)
        .timeout_read(READ_TIMEOUT)
        .build();
    let response = match agent.get(url).set("User-Agent", "arcane-registry").call() {
        Ok(response) => response,
        Err(ureq::Error::Status(status, _)) => {
            let _ = sender.send(Message::Failed(Error::HttpStatus {
                url: url.to_string(),
                status,
            }));
            return;
        }
        Err(error) => {
            let _ = sender.send(Message::Failed(Error::Download {
                url: url.to_string(),
                source: Box::new(error),
            }));
            return;
        }
    };
    // A content-encoded body is decoded on the fly, so its length is not the
    // announced one; the SHA-256 still checks every byte.
    let encoded = response
        .header("Content-Encoding")
        .is_some_and(|v| !v.trim().eq_ignore_ascii_case("identity"));
    let total = response
        .header("Content-Length")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|_| !encoded);
    if sender.send(Message::Started(total)).is_err() {
        return;
    }
    let mut reader = response.into_reader();
    let mut received = 0u64;
    loop {
        if cancel.is_cancelled() {
            return;
        }
        let mut buffer = vec![0u8; 256 * 1024];
        let message = match reader.read(&mut buffer) {
            Ok(0) => Message::Done,
            Ok(n) => {
                buffer.truncate(n);
                received += n as u64;
                Message::Chunk(buffer)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && total.is_some() => {
                Message::Failed(Error::Truncated {
                    url: url.to_string(),
                    expected: total.unwrap_or_default(),
                    received,
                })
            }
            Err(e) => Message::Failed(Error::Download {
                url: url.to_string(),
                source: Box::new(e),
            }),
        };
        let last = matches!(message, Message::Done | Message::Failed(_));
        if sender.send(message).is_err() || last {
            return;
        }
    }
}
