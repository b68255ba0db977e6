//! The worker's loop: load the runtime, say hello, then answer [`wire`](crate::wire)
//! requests from `input` on `output` until `input` ends.
//!
//! Requests are read by a small pool of threads that take turns at `input`: the
//! thread that reads a request answers it itself (no hand-off, so a run starts as
//! soon as its frame is read), and the next thread in line is already waiting for the
//! following frame, so a cancel is read while a run is going and runs on different
//! sessions run in parallel. A thread is added when none is left waiting and leaves
//! when enough others are; runs on one session take turns at its ONNX Runtime lock.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arcane_report::error_json;
use serde_json::{json, Value};

use crate::wire::{Request, Response};
use crate::{Error, JsonTensor, RunCancel, Runtime, Session, Tensor};

/// Threads left waiting for the next frame beyond which a thread that finished a
/// request leaves the pool.
const SPARE_READERS: usize = 2;

struct State<R, W> {
    runtime: Runtime,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    runs: Mutex<HashMap<u64, RunCancel>>,
    output: Mutex<W>,
    input: Mutex<R>,
    /// Threads waiting for (or reading) the next frame.
    waiting: AtomicUsize,
    /// Set once `input` ended.
    ended: AtomicBool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn write_line<W: Write>(output: &Mutex<W>, response: &Response) {
    let Ok(mut line) = serde_json::to_vec(response) else {
        return;
    };
    line.push(b'\n');
    let mut out = lock(output);
    // A failed write means the host is gone; the read side ends the loop.
    let _ = out.write_all(&line).and_then(|()| out.flush());
}

impl<R, W: Write> State<R, W> {
    fn answer(&self, id: u64, result: Result<Value, Error>) {
        let response = match result {
            Ok(value) => Response {
                id,
                result: Some(value),
                error: None,
            },
            Err(error) => Response {
                id,
                result: None,
                error: Some(error_json(&error)),
            },
        };
        write_line(&self.output, &response);
    }
}

/// Runs the worker: loads ONNX Runtime from `library`, writes the hello, and serves
/// requests until `input` ends. Returns the load error (after reporting it as the hello)
/// when the runtime cannot be used.
pub fn serve<R, W>(library: &Path, input: R, output: W) -> Result<(), Error>
where
    R: BufRead + Send + 'static,
    W: Write + Send + 'static,
{
    let output = Mutex::new(output);
    let runtime = match Runtime::load(library) {
        Ok(runtime) => runtime,
        Err(error) => {
            let hello = Response {
                id: 0,
                result: None,
                error: Some(error_json(&error)),
            };
            write_line(&output, &hello);
            return Err(error);
        }
    };
    let state = Arc::new(State {
        runtime,
        sessions: Mutex::new(HashMap::new()),
        runs: Mutex::new(HashMap::new()),
        output,
        input: Mutex::new(input),
        waiting: AtomicUsize::new(1),
        ended: AtomicBool::new(false),
    });
    state.answer(
        0,
        Ok(json!({
            "version": state.runtime.version(),
            "providers": state.runtime.providers(),
            "pid": std::process::id(),
        })),
    );
    // This thread stays in the pool until the input ends; the others may leave.
    take_turns(&state, true);
    Ok(())
}

/// One pool thread: read a frame, make sure someone waits for the next, answer it.
fn take_turns<R, W>(state: &Arc<State<R, W>>, first: bool)
where
    R: BufRead + Send + 'static,
    W: Write + Send + 'static,
{
    loop {
        let frame = {
            let mut input = lock(&state.input);
            let mut line = String::new();
            match state.ended.load(Ordering::SeqCst) {
                true => None,
                false => match input.read_line(&mut line) {
                    // Registered in the order read, before the next reader may read:
                    // a cancel read first always finds (or leaves) its run's entry.
                    Ok(n) if n > 0 => Some(register(state, parse(&line))),
                    _ => None,
                },
            }
        };
        let Some(frame) = frame else {
            state.ended.store(true, Ordering::SeqCst);
            return;
        };
        if state.waiting.fetch_sub(1, Ordering::SeqCst) == 1 {
            // Nobody is left waiting for the next frame: add a thread that does.
            state.waiting.fetch_add(1, Ordering::SeqCst);
            let next = Arc::clone(state);
            std::thread::spawn(move || take_turns(&next, false));
        }
        match frame {
            Frame::Blank => {}
            Frame::Request(request) => handle(state, request),
            Frame::Malformed(id, error) => state.answer(id, Err(error)),
        }
        if !first && state.waiting.load(Ordering::SeqCst) >= SPARE_READERS {
            return;
        }
        state.waiting.fetch_add(1, Ordering::SeqCst);
    }
}

/// One line of input, parsed.
enum Frame {
    /// An empty line: ignored.
    Blank,
    /// A request to answer.
    Request(Request),
    /// Not a request: answered with this error (under the id it carried, or 0).
    Malformed(u64, Error),
}

fn parse(line: &str) -> Frame {
    if line.trim().is_empty() {
        return Frame::Blank;
    }
    match serde_json::from_str::<Request>(line) {
        Ok(request) => Frame::Request(request),
        Err(e) => {
            let id = serde_json::from_str::<Value>(line)
                .ok()
                .and_then(|v| v["id"].as_u64())
                .unwrap_or(0);
            let error = Error::usage(format!("malformed worker request: {e}"), Value::Null);
            Frame::Malformed(id, error)
        }
    }
}

/// What must happen in the order frames were read, while the input is still held: a
/// run's cancel entry exists before the next frame (its cancel) is read, and a cancel
/// takes effect before the next frame (its run) is read. Either way round, a run
/// whose cancel was sent before it or after it is cancelled, never missed.
fn register<R, W>(state: &State<R, W>, frame: Frame) -> Frame {
    match &frame {
        Frame::Request(Request::Run { id, .. }) => {
            lock(&state.runs).entry(*id).or_default();
        }
        Frame::Request(Request::Cancel { run, .. }) => {
            // A cancel that crosses its run's answer leaves one small entry behind.
            lock(&state.runs).entry(*run).or_default().cancel();
        }
        _ => {}
    }
    frame
}

fn handle<R, W: Write>(state: &State<R, W>, request: Request) {
    match request {
        // Applied by `register` as it was read.
        Request::Cancel { .. } => {}
        Request::Load {
            id,
            session,
            model,
            provider,
            options,
        } => {
            let result = Session::open(&state.runtime, &model, provider, &options).map(|opened| {
                let described = json!({"inputs": opened.inputs(), "outputs": opened.outputs()});
                lock(&state.sessions).insert(session, Arc::new(opened));
                described
            });
            state.answer(id, result);
        }
        Request::Run {
            id,
            session,
            inputs,
            outputs,
            encoding,
        } => {
            let cancel = lock(&state.runs).entry(id).or_default().clone();
            let result = find(state, &session).and_then(|opened| {
                let inputs = parse_inputs(&inputs)?;
                let produced = opened.run(&inputs, outputs.as_deref(), &cancel)?;
                let outputs: BTreeMap<String, JsonTensor> = produced
                    .into_iter()
                    .map(|(name, tensor)| (name, tensor.to_json(encoding)))
                    .collect();
                Ok(json!({"outputs": outputs}))
            });
            lock(&state.runs).remove(&id);
            state.answer(id, result);
        }
        Request::Unload { id, session } => {
            let result = match lock(&state.sessions).remove(&session) {
                Some(_) => Ok(json!({})),
                None => Err(unknown_session(&session)),
            };
            state.answer(id, result);
        }
    }
}

fn find<R, W>(state: &State<R, W>, session: &str) -> Result<Arc<Session>, Error> {
    lock(&state.sessions)
        .get(session)
        .cloned()
        .ok_or_else(|| unknown_session(session))
}

fn unknown_session(session: &str) -> Error {
    Error::usage(
        format!("no session `{session}` in this worker"),
        json!({"session": session}),
    )
}

/// Parses the wire inputs (`{name: {type, shape, data}}`).
pub fn parse_inputs(
    inputs: &BTreeMap<String, JsonTensor>,
) -> Result<BTreeMap<String, Tensor>, Error> {
    inputs
        .iter()
        .map(|(name, json)| Ok((name.clone(), Tensor::from_json(name, json)?)))
        .collect()
}
