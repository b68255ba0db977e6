//! One ONNX worker process as the host sees it: started through the process module
//! (own group, parent-death signal), spoken to in [`arcane_onnx::wire`] frames over
//! its stdin and stdout, one request id per frame so runs overlap. Both pipes are
//! driven by the host's async runtime (non-blocking, woken by the reactor): a frame is
//! written by the task that sends it and answers are read by one task, so no thread
//! hand-off sits between a caller and the worker.
//!
//! When the worker's stdout ends (it exited, crashed or was killed) every request in
//! flight fails with `LOCAL_AI_SERVER_FAILED` naming the worker and how it ended, and
//! the worker is marked dead: the service then fails its sessions and starts a fresh
//! worker on the next `onnx.load` for that target.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arcane_onnx::wire::Response;
use arcane_process::{Spec, StdioMode};
use arcane_report::codes;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use crate::records::{Record, Records};
use arcane_core::service::BoxError;
use arcane_core::Error;
use arcane_localai::records::OwnershipRecord;

/// How a worker is started.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// The program (the `arcane` binary) and its arguments up to the library path
    /// (`["__onnx-worker", "--library"]` is appended by nobody: give them all).
    pub program: PathBuf,
    /// Its arguments, the library path included.
    pub args: Vec<String>,
    /// Variables set for this target (`CUDA_VISIBLE_DEVICES`).
    pub env: BTreeMap<String, String>,
    /// Variables removed.
    pub env_remove: Vec<String>,
    /// Arm the parent-death signal (off only in tests that make an orphan).
    pub parent_death_signal: bool,
    /// The workspace whose `.arcane/onnx-workers/` gets the worker's ownership record
    /// (`None`: no record).
    pub records: Option<PathBuf>,
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Response>>>>;

/// A running worker.
pub struct Worker {
    target: String,
    pid: u32,
    next_id: AtomicU64,
    pending: Pending,
    /// The worker's stdin (`None` once closed by [`Worker::close_input`]).
    writer: tokio::sync::Mutex<Option<pipe::Sender>>,
    dead: Arc<AtomicBool>,
    ended: Arc<Mutex<Option<String>>>,
    child: Mutex<Option<arcane_process::Child>>,
    hello: Value,
}

fn failed(message: String, details: Value) -> BoxError {
    Box::new(Error::Remote {
        code: codes::LOCAL_AI_SERVER_FAILED.into(),
        message,
        details,
        hints: vec![],
        cause: None,
    })
}

/// Turns an error frame into the host's error, keeping its code.
pub fn remote(error: &Value) -> BoxError {
    Box::new(Error::Remote {
        code: error["code"]
            .as_str()
            .unwrap_or(codes::ARCANE_OPERATION_FAILED)
            .into(),
        message: error["message"]
            .as_str()
            .unwrap_or("the ONNX worker failed")
            .to_string(),
        details: error.get("details").cloned().unwrap_or(Value::Null),
        hints: error["hints"]
            .as_array()
            .map(|h| {
                h.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default(),
        cause: arcane_report::Cause::of_error_json(error).map(Box::new),
    })
}

impl Worker {
    /// Starts a worker for `target` and waits (up to `hello_timeout`) for its hello.
    /// Call it inside the host's async runtime (the pipes are registered with it).
    pub async fn start(
        target: &str,
        spec: &WorkerSpec,
        hello_timeout: Duration,
    ) -> Result<Arc<Worker>, BoxError> {
        let cannot_start = |e: &dyn std::fmt::Display| {
            failed(
                format!(
                    "could not start the ONNX worker `{}`: {e}",
                    spec.program.display()
                ),
                json!({"program": spec.program, "target": target}),
            )
        };
        // The token generator: a fresh 256-bit random value is as good a nonce.
        let nonce = arcane_core::endpoint::new_token().map_err(|e| cannot_start(&e))?;
        let record = spec
            .records
            .clone()
            .map(|workspace| (workspace, target.to_string()));
        let mut child = spawn_recorded(process_spec(spec, &nonce), record.clone(), nonce.clone())
            .await
            .map_err(|e| cannot_start(&e))?;
        let pid = child.pid();
        if let Some((workspace, _)) = record {
            let store = Records::new(workspace);
            child.on_exit(move |_| {
                let _ = store.remove(&pid.to_string(), &nonce);
            });
        }
        let pipes = match (child.stdin.take(), child.stdout.take()) {
            (Some(stdin), Some(stdout)) => pipe::Sender::from_owned_fd(OwnedFd::from(stdin))
                .and_then(|w| Ok((w, pipe::Receiver::from_owned_fd(OwnedFd::from(stdout))?))),
            _ => Err(std::io::Error::other("the ONNX worker has no pipes")),
        };
        let (stdin, stdout) = match pipes {
            Ok(pipes) => pipes,
            Err(e) => {
                child.signal(libc::SIGKILL);
                return Err(failed(
                    format!("the ONNX worker's pipes failed: {e}"),
                    json!({"pid": pid}),
                ));
            }
        };
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let dead = Arc::new(AtomicBool::new(false));
        let ended = Arc::new(Mutex::new(None));
        let (hello_tx, hello_rx) = oneshot::channel();
        pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(0, hello_tx);
        tokio::spawn(read_responses(
            stdout,
            Arc::clone(&pending),
            Arc::clone(&dead),
        ));
        {
            let ended = Arc::clone(&ended);
            child.on_exit(move |info| {
                *ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(info.describe());
            });
        }
        let hello = tokio::time::timeout(hello_timeout, hello_rx)
            .await
            .ok()
            .and_then(Result::ok);
        let worker = |hello: Value| Worker {
            target: target.to_string(),
            pid,
            next_id: AtomicU64::new(1),
            pending,
            writer: tokio::sync::Mutex::new(Some(stdin)),
            dead,
            ended,
            child: Mutex::new(Some(child)),
            hello,
        };
        match hello {
            Some(Response {
                result: Some(result),
                ..
            }) => Ok(Arc::new(worker(result))),
            Some(Response {
                error: Some(error), ..
            }) => Err(remote(&error)),
            _ => {
                let w = worker(Value::Null);
                w.kill();
                let end = tokio::task::spawn_blocking(move || w.end_text())
                    .await
                    .unwrap_or_default();
                Err(failed(
                    format!("the ONNX worker (pid {pid}) for `{target}` did not start: {end}"),
                    json!({"pid": pid, "target": target}),
                ))
            }
        }
    }

    /// The target it serves (a device id).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its hello: `{version, providers, pid}`.
    pub fn hello(&self) -> &Value {
        &self.hello
    }

    /// Whether its output ended (it exited or was killed).
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    /// How it ended, as text (`killed by signal 9`), or `still running`.
    pub fn end_text(&self) -> String {
        for _ in 0..50 {
            if let Some(text) = self.ended.lock().unwrap_or_else(|e| e.into_inner()).clone() {
                return text;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        "its output ended".into()
    }

    /// The error every request gets once the worker is gone.
    pub fn death(&self) -> BoxError {
        failed(
            format!(
                "the ONNX worker (pid {}) for `{}` ended: {}",
                self.pid,
                self.target,
                self.end_text()
            ),
            json!({"pid": self.pid, "target": self.target}),
        )
    }

    /// The next request id.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::SeqCst)
    }

    /// Sends `frame` (which carries `id`) and waits for its answer.
    pub async fn call(&self, id: u64, frame: Value) -> Result<Value, BoxError> {
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        if self.is_dead() || !self.send(&frame).await {
            self.forget(id);
            return Err(self.death());
        }
        match rx.await {
            Ok(Response {
                result: Some(result),
                ..
            }) => Ok(result),
            Ok(Response {
                error: Some(error), ..
            }) => Err(remote(&error)),
            Ok(_) => Ok(Value::Null),
            Err(_) => Err(self.death()),
        }
    }

    /// Writes `frame` as one line; `false` when the worker's input is closed or gone.
    /// A frame that gets no answer (a cancel) is sent with this alone.
    pub async fn send(&self, frame: &Value) -> bool {
        let Ok(mut line) = serde_json::to_vec(frame) else {
            return false;
        };
        line.push(b'\n');
        let mut writer = self.writer.lock().await;
        match writer.as_mut() {
            Some(stdin) => stdin.write_all(&line).await.is_ok(),
            None => false,
        }
    }

    /// Forgets a request whose caller gave up (its answer is dropped).
    pub fn forget(&self, id: u64) {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    /// Kills the worker's group now (a hung run, shutdown).
    pub fn kill(&self) {
        if let Some(child) = self
            .child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            child.signal(libc::SIGKILL);
        }
    }

    /// Closes the worker's input: it finishes what it is doing and exits.
    pub async fn close_input(&self) {
        self.writer.lock().await.take();
    }

    /// Waits up to `grace` for the worker to exit (after [`Worker::close_input`]),
    /// then TERM and KILL after another `grace`. Blocking: call it off the async
    /// threads.
    pub fn reap(&self, grace: Duration) {
        let child = self.child.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut child) = child {
            if child.wait_timeout(grace).is_none() {
                child.terminate(grace);
            }
        }
    }
}

/// The worker's process: piped stdin and stdout, the target's variables, `nonce`.
fn process_spec(spec: &WorkerSpec, nonce: &str) -> Spec {
    let mut process = Spec::new(&spec.program).args(&spec.args);
    process.stdin = StdioMode::Piped;
    process.stdout = StdioMode::Piped;
    process.stderr = StdioMode::Inherit;
    for (name, value) in &spec.env {
        process = process.env(name, value);
    }
    process.env_remove = spec
        .env_remove
        .iter()
        .map(String::as_str)
        .chain(arcane_process::CREDENTIAL_VARIABLES.iter().copied())
        .map(Into::into)
        .collect();
    process.parent_death_signal = spec.parent_death_signal;
    process.env(Record::NONCE_VARIABLE, nonce)
}

/// Spawns `process` off the async threads and, given `(workspace, target)`, writes
/// its ownership record before anything else happens (so a host killed from then on
/// leaves a record the next one can act on).
async fn spawn_recorded(
    process: Spec,
    record: Option<(PathBuf, String)>,
    nonce: String,
) -> std::io::Result<arcane_process::Child> {
    tokio::task::spawn_blocking(move || {
        let child = arcane_process::spawn(process)?;
        if let Some((workspace, target)) = &record {
            if let Some(record) = Record::of(target, child.pid(), &nonce) {
                Records::new(workspace)
                    .write(&record)
                    .map_err(std::io::Error::other)?;
            }
        }
        Ok(child)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Reads the worker's answers until its stdout ends, handing each to its waiter; then
/// marks the worker dead and fails every request still in flight.
async fn read_responses(stdout: pipe::Receiver, pending: Pending, dead: Arc<AtomicBool>) {
    let mut lines = BufReader::with_capacity(64 * 1024, stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(response) = serde_json::from_str::<Response>(&line) else {
            continue;
        };
        let waiter = pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&response.id);
        if let Some(waiter) = waiter {
            let _ = waiter.send(response);
        }
    }
    dead.store(true, Ordering::SeqCst);
    // Dropping the senders fails every request in flight.
    pending.lock().unwrap_or_else(|e| e.into_inner()).clear();
}
