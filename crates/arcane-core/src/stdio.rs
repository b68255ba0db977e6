//! The stdio transport: `arcane/1` over `Content-Length` framing on a byte stream pair.
//!
//! One peer, one [`Session`] of whatever [`Dispatch`] it serves (this process's
//! [`Host`](crate::Host), or a host in another process). On connect the peer gets the
//! replay. Requests are dispatched concurrently; responses and the request's events
//! share one ordered channel, so a stream's chunks always precede its response.
//! End of input (or a decode error, which is reported as a `core.error` event first)
//! closes the transport and what it serves ([`Dispatch::close`]): a host, as in the
//! SDK, refuses new requests, cancels request-lifetime work, writes accepted
//! responses, drains its services and publishes `closed`; queued output is flushed
//! before [`serve`] returns.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::Arc;

use arcane_report::error_json;
use arcane_report::event_types;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::dispatch::{Client, Dispatch, FrameSink, Session};
use crate::error::Error;
use crate::framing::{encode, Decoder};
use crate::protocol::{parse_incoming, EventFrame, Incoming, Response};

/// Options of the stdio transport.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StdioOptions {
    /// The largest accepted frame body, in bytes.
    pub max_frame: usize,
}

impl Default for StdioOptions {
    fn default() -> Self {
        Self {
            max_frame: crate::framing::DEFAULT_MAX_FRAME,
        }
    }
}

/// A reader for [`serve`].
pub type StdioReader = Box<dyn AsyncRead + Unpin + Send>;
/// A writer for [`serve`].
pub type StdioWriter = Box<dyn AsyncWrite + Unpin + Send>;

/// This process's stdin and stdout for [`serve`]. A pipe (what a parent process
/// gives its child) is driven by the async runtime's reactor, so a frame is read and
/// written by the task that handles it instead of being handed to a blocking thread
/// and back; anything else (a terminal, a file) goes through tokio's blocking stdio.
/// Call it inside the runtime. The pipes are put in non-blocking mode while the guard
/// lives and back in blocking mode when it drops (they are shared with whoever gave
/// them to this process).
pub fn process_stdio() -> (StdioReader, StdioWriter, BlockingGuard) {
    let mut guard = BlockingGuard(Vec::new());
    let stdin = std::io::stdin();
    let reader: StdioReader = match stdin
        .as_fd()
        .try_clone_to_owned()
        .and_then(tokio::net::unix::pipe::Receiver::from_owned_fd)
    {
        Ok(pipe) => {
            guard.0.push(stdin.as_raw_fd());
            Box::new(pipe)
        }
        Err(_) => Box::new(tokio::io::stdin()),
    };
    let stdout = std::io::stdout();
    let writer: StdioWriter = match stdout
        .as_fd()
        .try_clone_to_owned()
        .and_then(tokio::net::unix::pipe::Sender::from_owned_fd)
    {
        Ok(pipe) => {
            guard.0.push(stdout.as_raw_fd());
            Box::new(pipe)
        }
        Err(_) => Box::new(tokio::io::stdout()),
    };
    (reader, writer, guard)
}

/// Puts the stdio pipes [`process_stdio`] made non-blocking back in blocking mode.
#[must_use = "dropping it restores blocking mode at once"]
pub struct BlockingGuard(Vec<RawFd>);

impl Drop for BlockingGuard {
    fn drop(&mut self) {
        for fd in &self.0 {
            // SAFETY: `fd` is this process's stdin or stdout, open for its whole life;
            // F_GETFL/F_SETFL only read and change its status flags.
            unsafe {
                let flags = libc::fcntl(*fd, libc::F_GETFL);
                if flags >= 0 {
                    libc::fcntl(*fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
                }
            }
        }
    }
}

/// Serves one peer on `reader`/`writer` until end of input, a decode error or the
/// endpoint's shutdown, then closes the endpoint and flushes. Returns the decode
/// error, if any, or the endpoint's shutdown failure.
pub async fn serve<R, W>(
    host: &dyn Dispatch,
    mut reader: R,
    writer: W,
    options: StdioOptions,
) -> Result<(), Error>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (sender, mut receiver) = mpsc::unbounded_channel::<Arc<str>>();
    let session: Arc<dyn Session> = host.open(Client::Private("stdio"));
    session.subscribe(FrameSink::Unbounded(sender.clone()));
    let writer_task = tokio::spawn(async move {
        let mut writer = writer;
        while let Some(frame) = receiver.recv().await {
            if writer.write_all(&encode(frame.as_bytes())).await.is_err() {
                break;
            }
            // Flush per frame only when nothing else is queued (keeps streams prompt).
            if receiver.is_empty() && writer.flush().await.is_err() {
                break;
            }
        }
        let _ = writer.flush().await;
    });

    let mut decoder = Decoder::new(options.max_frame);
    let mut tasks = tokio::task::JoinSet::new();
    let mut buffer = vec![0u8; 64 * 1024];
    let mut failure: Option<Error> = None;
    'read: loop {
        let read = tokio::select! {
            read = reader.read(&mut buffer) => read,
            _ = host.closed() => break 'read,
        };
        let n = match read {
            Ok(0) => {
                if let Err(error) = decoder.finish() {
                    failure = Some(error);
                }
                break;
            }
            Ok(n) => n,
            Err(source) => {
                failure = Some(Error::Io {
                    operation: "read",
                    path: "stdin".into(),
                    source,
                });
                break;
            }
        };
        decoder.push(&buffer[..n]);
        loop {
            match decoder.next_frame() {
                Ok(None) => break,
                Ok(Some(value)) => match parse_incoming(value) {
                    Ok(Incoming::Request(request)) => {
                        let sender = sender.clone();
                        let deliver = Box::new(move |response: Response| {
                            let _ = sender.send(Arc::from(response.to_frame().to_string()));
                        });
                        // Admitted here, in the order read; run concurrently.
                        tasks.spawn(Arc::clone(&session).submit(request, deliver));
                    }
                    Ok(Incoming::Control(control)) => {
                        // Applied when called (a local host's effect is at once);
                        // its result is not sent, as before.
                        let applied = Arc::clone(&session).control(control);
                        tasks.spawn(async move {
                            applied.await;
                        });
                    }
                    Err(error) => {
                        let id = match &error {
                            Error::InvalidFrame { id, .. } => id.clone(),
                            _ => None,
                        };
                        let response = Response::error(id, &error);
                        let _ = sender.send(Arc::from(response.to_frame().to_string()));
                    }
                },
                Err(error) => {
                    failure = Some(error);
                    break 'read;
                }
            }
        }
        while tasks.try_join_next().is_some() {}
    }
    if let Some(error) = &failure {
        let frame = EventFrame {
            event: event_types::CORE_ERROR.into(),
            data: json!({"transport": "stdio", "error": error_json(error)}),
            request_id: None,
            time: arcane_report::time::now_rfc3339(),
        };
        let _ = sender.send(Arc::from(frame.to_frame().to_string()));
    }
    let closed = host.close().await;
    while tasks.join_next().await.is_some() {}
    drop(sender);
    drop(session);
    let _ = writer_task.await;
    match failure {
        Some(error) => Err(error),
        None => closed,
    }
}
