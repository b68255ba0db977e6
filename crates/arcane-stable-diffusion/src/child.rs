//! Images are drawn in a child process of the worker — the *generator* — forked with
//! the model already loaded (its memory shared copy-on-write), so that:
//!
//! * a client that goes away stops the computation at once: stable-diffusion.cpp has no
//!   way to interrupt a generation, but its process can be killed ([`Cancel`]); the next
//!   request forks a fresh generator;
//! * a generation that crashes the library fails one request, not the worker.
//!
//! The generator draws one image per request and waits for the next, so that it reuses
//! what the last one allocated (as a generation in the worker itself would: forking one
//! child per image cost about 6 % more, in the page faults of a fresh address space).
//!
//! Requests go down a pipe as `u32 length (LE), JSON`; the generator answers over
//! another in records `tag, u32 length (LE), payload`: `S` a sampling step (`u32 step,
//! u32 steps`), then `I` the encoded image or `E` an error message. It writes with
//! write(2) only, ends with `_exit`, keeps no descriptor but its two pipes and standard
//! error (a client connection the worker closes is closed), and never touches a lock
//! another thread of the parent may have held at the fork (the worker's log lines go to
//! standard error the same way). The library is built without OpenMP, whose thread pool
//! does not survive a fork; ggml starts its compute threads afresh for each graph. The
//! generator ends when its request pipe closes (the worker ended or dropped the model),
//! when a write fails, and at the first step after its parent is gone.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::{encode, Error, Generation, ImageFormat, Model};

/// The largest record accepted from the generator (an encoded 1024×1024 PNG is about
/// 3 MB).
const MAX_RECORD: u32 = 64 << 20;

/// What a generation reports as it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A sampling step has finished.
    Step {
        /// Steps done (1-based).
        step: u32,
        /// Steps in all.
        steps: u32,
    },
}

/// Cancels a generation running in the generator: kills the generator if it is
/// drawing for this token, and makes any later generation with it fail at once.
/// Cloned to whoever may cancel.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<Mutex<CancelState>>);

#[derive(Debug, Default)]
struct CancelState {
    cancelled: bool,
    // The generator drawing for this token, unreaped (so its pid cannot have been
    // reused).
    drawing: Option<libc::pid_t>,
}

impl Cancel {
    /// A token nothing has cancelled.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Cancels: the generator drawing for it, if any, is killed.
    pub fn cancel(&self) {
        let mut state = self.state();
        state.cancelled = true;
        if let Some(pid) = state.drawing {
            kill(pid);
        }
    }

    /// Whether [`cancel`](Cancel::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.state().cancelled
    }

    fn state(&self) -> std::sync::MutexGuard<'_, CancelState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks `pid` as drawing for this token; `false` when it is already cancelled.
    fn start(&self, pid: libc::pid_t) -> bool {
        let mut state = self.state();
        state.drawing = Some(pid);
        !state.cancelled
    }

    /// Nothing draws for this token any more.
    fn finish(&self) {
        self.state().drawing = None;
    }
}

/// SIGKILL to our own child, which is not reaped yet (reaping happens only while no
/// [`Cancel`] names it, under the turn), so `pid` names that child and no other
/// process: the one signal this crate sends.
fn kill(pid: libc::pid_t) {
    #[allow(clippy::disallowed_methods)]
    // SAFETY: kill(2) with a pid and a signal number.
    unsafe {
        libc::kill(pid, libc::SIGKILL)
    };
}

/// The generator process: its pid and its two pipes.
#[derive(Debug)]
pub(crate) struct Generator {
    pid: libc::pid_t,
    requests: File,
    records: File,
}

impl Generator {
    /// Forks a generator for `model`; the caller holds the model's turn.
    fn fork(model: &Model) -> Result<Generator, Error> {
        let (request_read, request_write) = pipe()?;
        let (record_read, record_write) = pipe()?;
        let parent = std::process::id();
        // SAFETY: see the module docs: the child only generates, reads and writes its
        // pipes with read(2)/write(2) and `_exit`s.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let keep = [request_read.as_raw_fd(), record_write.as_raw_fd()];
            drop((request_write, record_read));
            serve(model, parent, keep);
        }
        if pid < 0 {
            return Err(Error::Io {
                action: "forking the image generator",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Generator {
            pid,
            requests: File::from(request_write),
            records: File::from(record_read),
        })
    }

    /// Whether it still runs (reaped when it does not).
    fn alive(&self) -> bool {
        let mut status = 0;
        // SAFETY: `pid` is our unreaped child; WNOHANG only reports.
        unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) == 0 }
    }

    /// Ends it: killed and reaped. What its exit status says.
    pub(crate) fn stop(self) -> String {
        kill(self.pid);
        drop(self.requests);
        reap(self.pid)
    }
}

impl Model {
    /// Generates image `index` of `generation` in the generator process (forked on
    /// first use, and again after a cancellation or a crash) and returns it encoded as
    /// the request asks; `on_event` sees each step as it happens. Blocks; `cancel`
    /// stops it from another thread ([`Error::Cancelled`]).
    pub fn generate_isolated(
        &self,
        generation: &Generation,
        index: u32,
        cancel: &Cancel,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Vec<u8>, Error> {
        let mut turn = self.turn();
        if cancel.is_cancelled() {
            return Err(Error::Cancelled);
        }
        let mut generator = match turn.take() {
            Some(generator) if generator.alive() => generator,
            _ => Generator::fork(self)?,
        };
        if !cancel.start(generator.pid) {
            cancel.finish();
            *turn = Some(generator);
            return Err(Error::Cancelled);
        }
        let outcome = request(&mut generator, generation, index)
            .and_then(|()| read_records(&mut generator.records, on_event));
        cancel.finish();
        match outcome {
            Ok(Some(Ok(image))) => {
                *turn = Some(generator);
                Ok(image)
            }
            Ok(Some(Err(message))) => {
                *turn = Some(generator);
                Err(Error::Failed { reason: message })
            }
            // The generator died (killed by the cancel, or crashed): reaped, replaced
            // by the next request.
            Ok(None) | Err(_) if cancel.is_cancelled() => {
                generator.stop();
                Err(Error::Cancelled)
            }
            Ok(None) => Err(Error::Failed {
                reason: format!(
                    "the process that generated it ended without an image ({})",
                    generator.stop()
                ),
            }),
            Err(error) => {
                generator.stop();
                Err(error)
            }
        }
    }
}

/// Sends one request to the generator.
fn request(generator: &mut Generator, generation: &Generation, index: u32) -> Result<(), Error> {
    let body = json!({
        "prompt": generation.prompt,
        "negativePrompt": generation.negative_prompt,
        "width": generation.width,
        "height": generation.height,
        "steps": generation.steps,
        "cfgScale": generation.cfg_scale,
        "seed": generation.seed,
        "format": generation.format.as_str(),
        "quality": generation.quality,
        "index": index,
    })
    .to_string();
    let mut framed = u32::try_from(body.len())
        .unwrap_or(u32::MAX)
        .to_le_bytes()
        .to_vec();
    framed.extend_from_slice(body.as_bytes());
    generator
        .requests
        .write_all(&framed)
        .map_err(|source| Error::Io {
            action: "sending a request to the image generator",
            source,
        })
}

/// Reads the generator's records for one request: the image, or its error message, or
/// nothing when it ended first.
fn read_records(
    pipe: &mut File,
    on_event: &mut dyn FnMut(Event),
) -> Result<Option<Result<Vec<u8>, String>>, Error> {
    let io = |source| Error::Io {
        action: "reading a generation's output",
        source,
    };
    loop {
        let mut head = [0u8; 5];
        match pipe.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(io(e)),
        }
        let length = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
        if length > MAX_RECORD {
            return Err(Error::Failed {
                reason: format!("the image generator sent a record of {length} bytes"),
            });
        }
        let mut payload = vec![0u8; length as usize];
        pipe.read_exact(&mut payload).map_err(io)?;
        match (head[0], payload.as_slice()) {
            (b'S', [a, b, c, d, e, f, g, h]) => on_event(Event::Step {
                step: u32::from_le_bytes([*a, *b, *c, *d]),
                steps: u32::from_le_bytes([*e, *f, *g, *h]),
            }),
            (b'I', _) => return Ok(Some(Ok(payload))),
            (b'E', _) => return Ok(Some(Err(String::from_utf8_lossy(&payload).into_owned()))),
            (tag, _) => {
                return Err(Error::Failed {
                    reason: format!("the image generator sent an unknown record {tag:#04x}"),
                })
            }
        }
    }
}

/// Waits for our child `pid` (killed, or ending): what its exit status says.
fn reap(pid: libc::pid_t) -> String {
    let mut status: libc::c_int = 0;
    let reaped = loop {
        // SAFETY: `pid` is our unreaped child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break r;
        }
    };
    if reaped < 0 {
        "its exit was not seen".into()
    } else if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("exit status {}", libc::WEXITSTATUS(status))
    }
}

/// The generator: closes every descriptor but its pipes and standard error, then draws
/// one image per request until its request pipe closes. Never returns.
fn serve(model: &Model, parent: u32, [requests, records]: [RawFd; 2]) -> ! {
    close_all_but(&[requests, records]);
    loop {
        let Some(body) = read_request(requests) else {
            // SAFETY: `_exit` ends the process without running the parent's atexit
            // handlers or destructors.
            unsafe { libc::_exit(0) }
        };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            draw(model, parent, records, &body)
        }));
        match outcome {
            Ok(Ok(image)) => record(records, b'I', &image),
            Ok(Err(error)) => record(records, b'E', error.to_string().as_bytes()),
            Err(_) => record(records, b'E', b"the generation panicked"),
        }
    }
}

/// One request: parsed, drawn, encoded.
fn draw(model: &Model, parent: u32, records: RawFd, body: &[u8]) -> Result<Vec<u8>, Error> {
    let (generation, index) = parse_request(body)?;
    let mut on_step = |step: u32, steps: u32| {
        // SAFETY: getppid and _exit are async-signal-safe system calls.
        if unsafe { libc::getppid() } as u32 != parent {
            unsafe { libc::_exit(1) }
        }
        let mut payload = [0u8; 8];
        payload[..4].copy_from_slice(&step.to_le_bytes());
        payload[4..].copy_from_slice(&steps.to_le_bytes());
        record(records, b'S', &payload);
    };
    let rgb = model.generate_unlocked(&generation, index, &mut on_step)?;
    encode::encode(
        &rgb,
        generation.width,
        generation.height,
        generation.format,
        generation.quality,
    )
}

/// The request [`request`] sent.
fn parse_request(body: &[u8]) -> Result<(Generation, u32), Error> {
    let bad = || Error::Failed {
        reason: "the image generator got a request it cannot read".into(),
    };
    let json: Value = serde_json::from_slice(body).map_err(|_| bad())?;
    let text = |key: &str| json[key].as_str().map(str::to_string).ok_or_else(bad);
    let number = |key: &str| json[key].as_u64().ok_or_else(bad);
    let generation = Generation {
        prompt: text("prompt")?,
        negative_prompt: text("negativePrompt")?,
        width: u32::try_from(number("width")?).map_err(|_| bad())?,
        height: u32::try_from(number("height")?).map_err(|_| bad())?,
        steps: u32::try_from(number("steps")?).map_err(|_| bad())?,
        cfg_scale: json["cfgScale"].as_f64().ok_or_else(bad)? as f32,
        seed: number("seed")?,
        count: 1,
        format: ImageFormat::parse(&text("format")?).ok_or_else(bad)?,
        quality: u8::try_from(number("quality")?).map_err(|_| bad())?,
    };
    Ok((
        generation,
        u32::try_from(number("index")?).map_err(|_| bad())?,
    ))
}

/// The next request from `fd`, or `None` when the pipe closed.
fn read_request(fd: RawFd) -> Option<Vec<u8>> {
    let mut length = [0u8; 4];
    read_exact(fd, &mut length)?;
    let mut body = vec![0u8; u32::from_le_bytes(length) as usize];
    read_exact(fd, &mut body)?;
    Some(body)
}

/// read(2) until `buffer` is full; `None` at the end of the pipe or on an error.
fn read_exact(fd: RawFd, mut buffer: &mut [u8]) -> Option<()> {
    while !buffer.is_empty() {
        // SAFETY: `buffer` is a valid writable slice.
        let n = unsafe { libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len()) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            return None;
        }
        buffer = &mut buffer[n.unsigned_abs()..];
    }
    Some(())
}

/// Closes every descriptor above standard error but `keep`.
fn close_all_but(keep: &[RawFd]) {
    let mut from: libc::c_uint = 3;
    let mut kept: Vec<libc::c_uint> = keep.iter().map(|fd| fd.unsigned_abs()).collect();
    kept.sort_unstable();
    for fd in kept {
        if fd > from {
            // SAFETY: close_range(2) closes descriptors only.
            unsafe { libc::syscall(libc::SYS_close_range, from, fd - 1, 0) };
        }
        from = fd + 1;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, from, libc::c_uint::MAX, 0) };
}

/// Writes one record to `fd`.
fn record(fd: RawFd, tag: u8, payload: &[u8]) {
    let mut head = [tag, 0, 0, 0, 0];
    head[1..].copy_from_slice(
        &u32::try_from(payload.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    write_all(fd, &head);
    write_all(fd, payload);
}

/// write(2) until all of `bytes` is written or the descriptor fails: no buffer, no lock.
pub(crate) fn write_all(fd: RawFd, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a valid readable slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        bytes = &bytes[n.unsigned_abs()..];
    }
}

/// A pipe whose ends close on exec.
fn pipe() -> Result<(OwnedFd, OwnedFd), Error> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Error::Io {
            action: "creating a pipe for the image generator",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: both descriptors were just created and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
