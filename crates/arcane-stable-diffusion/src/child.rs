//! Each generation runs in a child process of the worker, forked with the model already
//! loaded (its memory shared copy-on-write), so that:
//!
//! * a client that goes away stops the computation at once: stable-diffusion.cpp has no
//!   way to interrupt a generation, but its child can be killed ([`Cancel`]);
//! * what a generation allocates is given back to the system when it ends, whatever
//!   the allocator keeps;
//! * a generation that crashes the library fails one request, not the worker.
//!
//! The child reports over a pipe in records `tag, u32 length (LE), payload`: `S` a
//! sampling step (`u32 step, u32 steps`), `I` the encoded image, `E` an error message.
//! It writes with write(2) only and ends with `_exit`, never running the parent's
//! destructors or touching a lock another thread of the parent may have held at the
//! fork (the worker's log lines go to standard error the same way). The library is
//! built without OpenMP, whose thread pool does not survive a fork; ggml starts its
//! compute threads afresh for each graph. The child dies with the thread that forked
//! it (`PR_SET_PDEATHSIG`), which waits for it, so it never outlives its worker.

use std::fs::File;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use crate::{encode, Error, Generation, Model};

/// The largest record accepted from a child (an encoded 1024×1024 PNG is about 3 MB).
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

/// Cancels a generation running in a child: kills the child if one runs, and makes any
/// later generation with this token fail at once. Cloned to whoever may cancel.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<Mutex<CancelState>>);

#[derive(Debug, Default)]
struct CancelState {
    cancelled: bool,
    // The running child, unreaped (so its pid cannot have been reused).
    child: Option<libc::pid_t>,
}

impl Cancel {
    /// A token nothing has cancelled.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Cancels: the running child, if any, is killed.
    pub fn cancel(&self) {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        state.cancelled = true;
        if let Some(pid) = state.child {
            // The one signal this crate sends: to its own child, which is not reaped
            // yet (reaping clears it under this lock), so `pid` names that child and no
            // other process.
            #[allow(clippy::disallowed_methods)]
            // SAFETY: kill(2) with a pid and a signal number.
            unsafe {
                libc::kill(pid, libc::SIGKILL)
            };
        }
    }

    /// Whether [`cancel`](Cancel::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).cancelled
    }
}

impl Model {
    /// Generates image `index` of `generation` in a child process and returns it
    /// encoded as the request asks; `on_event` sees each step as it happens. Blocks;
    /// `cancel` stops it from another thread ([`Error::Cancelled`]).
    pub fn generate_isolated(
        &self,
        generation: &Generation,
        index: u32,
        cancel: &Cancel,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Vec<u8>, Error> {
        let _turn = self.turn();
        let (read, write) = pipe()?;
        let pid = {
            let mut state = cancel.0.lock().unwrap_or_else(|p| p.into_inner());
            if state.cancelled {
                return Err(Error::Cancelled);
            }
            let parent = std::process::id();
            // SAFETY: see the module docs: the child only generates, writes with
            // write(2) and `_exit`s.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                drop(read);
                run_child(self, generation, index, parent, write);
            }
            if pid < 0 {
                return Err(Error::Io {
                    action: "forking a generation",
                    source: std::io::Error::last_os_error(),
                });
            }
            state.child = Some(pid);
            pid
        };
        drop(write);
        let outcome = read_records(File::from(read), on_event);
        let status = reap(cancel, pid);
        if cancel.is_cancelled() {
            return Err(Error::Cancelled);
        }
        match outcome? {
            Some(Ok(image)) => Ok(image),
            Some(Err(message)) => Err(Error::Failed { reason: message }),
            None => Err(Error::Failed {
                reason: format!("the process that generated it ended without an image ({status})"),
            }),
        }
    }
}

/// Reads the child's records until it closes the pipe: the image, or its error
/// message, or nothing.
fn read_records(
    mut pipe: File,
    on_event: &mut dyn FnMut(Event),
) -> Result<Option<Result<Vec<u8>, String>>, Error> {
    let io = |source| Error::Io {
        action: "reading a generation's output",
        source,
    };
    let mut result = None;
    loop {
        let mut head = [0u8; 5];
        match pipe.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(result),
            Err(e) => return Err(io(e)),
        }
        let length = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
        if length > MAX_RECORD {
            return Err(Error::Failed {
                reason: format!("the generating process sent a record of {length} bytes"),
            });
        }
        let mut payload = vec![0u8; length as usize];
        pipe.read_exact(&mut payload).map_err(io)?;
        match (head[0], payload.as_slice()) {
            (b'S', [a, b, c, d, e, f, g, h]) => on_event(Event::Step {
                step: u32::from_le_bytes([*a, *b, *c, *d]),
                steps: u32::from_le_bytes([*e, *f, *g, *h]),
            }),
            (b'I', _) => result = Some(Ok(payload)),
            (b'E', _) => result = Some(Err(String::from_utf8_lossy(&payload).into_owned())),
            (tag, _) => {
                return Err(Error::Failed {
                    reason: format!("the generating process sent an unknown record {tag:#04x}"),
                })
            }
        }
    }
}

/// Waits for the child (which has closed its pipe, so is exiting or killed) and clears
/// it from `cancel` under its lock: what its exit status says.
fn reap(cancel: &Cancel, pid: libc::pid_t) -> String {
    let mut state = cancel.0.lock().unwrap_or_else(|p| p.into_inner());
    let mut status: libc::c_int = 0;
    let reaped = loop {
        // SAFETY: `pid` is our unreaped child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break r;
        }
    };
    state.child = None;
    if reaped < 0 {
        "its exit was not seen".into()
    } else if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("exit status {}", libc::WEXITSTATUS(status))
    }
}

/// The child: generates, reports, exits. Never returns.
fn run_child(model: &Model, generation: &Generation, index: u32, parent: u32, pipe: OwnedFd) -> ! {
    use std::os::fd::AsRawFd;
    let fd = pipe.as_raw_fd();
    // SAFETY: prctl and getppid are async-signal-safe system calls.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() as u32 != parent {
            libc::_exit(1);
        }
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut on_step = |step: u32, steps: u32| {
            let mut payload = [0u8; 8];
            payload[..4].copy_from_slice(&step.to_le_bytes());
            payload[4..].copy_from_slice(&steps.to_le_bytes());
            record(fd, b'S', &payload);
        };
        model
            .generate_unlocked(generation, index, &mut on_step)
            .and_then(|rgb| {
                encode::encode(
                    &rgb,
                    generation.width,
                    generation.height,
                    generation.format,
                    generation.quality,
                )
            })
    }));
    let code = match outcome {
        Ok(Ok(image)) => {
            record(fd, b'I', &image);
            0
        }
        Ok(Err(error)) => {
            record(fd, b'E', error.to_string().as_bytes());
            1
        }
        Err(_) => {
            record(fd, b'E', b"the generation panicked");
            1
        }
    };
    // SAFETY: `_exit` ends the process without running the parent's atexit handlers or
    // destructors.
    unsafe { libc::_exit(code) }
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
            action: "creating a pipe for a generation",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: both descriptors were just created and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
