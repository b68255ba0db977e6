//! The worker's loop: load the runtime, say hello, then answer [`wire`](crate::wire)
//! requests from `input` on `output` until `input` ends. Every request runs on its own
//! thread, so runs on different sessions run in parallel and a cancel arrives while a
//! run is going.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use arcane_report::error_json;
use serde_json::{json, Value};

use crate::wire::{Request, Response};
use crate::{Error, JsonTensor, RunCancel, Runtime, Session, Tensor};

struct State<W> {
    runtime: Runtime,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    runs: Mutex<HashMap<u64, RunCancel>>,
    output: Mutex<W>,
}

impl<W: Write> State<W> {
    fn send(&self, response: &Response) {
        let Ok(mut line) = serde_json::to_vec(response) else {
            return;
        };
        line.push(b'\n');
        let mut out = self.output.lock().unwrap_or_else(|e| e.into_inner());
        // A failed write means the host is gone; the read side ends the loop.
        let _ = out.write_all(&line).and_then(|()| out.flush());
    }

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
        self.send(&response);
    }
}

/// Runs the worker: loads ONNX Runtime from `library`, writes the hello, and serves
/// requests until `input` ends. Returns the load error (after reporting it as the hello)
/// when the runtime cannot be used.
pub fn serve<R, W>(library: &Path, input: R, output: W) -> Result<(), Error>
where
    R: BufRead,
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
            if let Ok(mut line) = serde_json::to_vec(&hello) {
                line.push(b'\n');
                let mut out = output.lock().unwrap_or_else(|e| e.into_inner());
                let _ = out.write_all(&line).and_then(|()| out.flush());
            }
            return Err(error);
        }
    };
    let state = Arc::new(State {
        runtime,
        sessions: Mutex::new(HashMap::new()),
        runs: Mutex::new(HashMap::new()),
        output,
    });
    state.answer(
        0,
        Ok(json!({
            "version": state.runtime.version(),
            "providers": state.runtime.providers(),
            "pid": std::process::id(),
        })),
    );
    for line in input.lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Request>(&line) {
            Ok(request) => dispatch(&state, request),
            Err(e) => {
                let id = serde_json::from_str::<Value>(&line)
                    .ok()
                    .and_then(|v| v["id"].as_u64())
                    .unwrap_or(0);
                state.answer(
                    id,
                    Err(Error::usage(
                        format!("malformed worker request: {e}"),
                        Value::Null,
                    )),
                );
            }
        }
    }
    Ok(())
}

fn dispatch<W: Write + Send + 'static>(state: &Arc<State<W>>, request: Request) {
    if let Request::Cancel { run, .. } = &request {
        if let Some(cancel) = state
            .runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(run)
        {
            cancel.cancel();
        }
        return;
    }
    if let Request::Run { id, .. } = &request {
        state
            .runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(*id, RunCancel::new());
    }
    let state = Arc::clone(state);
    std::thread::spawn(move || handle(&state, request));
}

fn handle<W: Write>(state: &State<W>, request: Request) {
    match request {
        Request::Load {
            id,
            session,
            model,
            provider,
            options,
        } => {
            let result = Session::open(&state.runtime, &model, provider, &options).map(|opened| {
                let described = json!({"inputs": opened.inputs(), "outputs": opened.outputs()});
                state
                    .sessions
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(session, Arc::new(opened));
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
            let cancel = state
                .runs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&id)
                .cloned()
                .unwrap_or_default();
            let result = find(state, &session).and_then(|opened| {
                let inputs = parse_inputs(&inputs)?;
                let produced = opened.run(&inputs, outputs.as_deref(), &cancel)?;
                let outputs: BTreeMap<String, JsonTensor> = produced
                    .into_iter()
                    .map(|(name, tensor)| (name, tensor.to_json(encoding)))
                    .collect();
                Ok(json!({"outputs": outputs}))
            });
            state
                .runs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            state.answer(id, result);
        }
        Request::Unload { id, session } => {
            let removed = state
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&session);
            let result = match removed {
                Some(_) => Ok(json!({})),
                None => Err(unknown_session(&session)),
            };
            state.answer(id, result);
        }
        Request::Cancel { .. } => {}
    }
}

fn unknown_session(session: &str) -> Error {
    Error::usage(
        format!("no session `{session}` in this worker"),
        json!({"session": session}),
    )
}

fn find<W>(state: &State<W>, session: &str) -> Result<Arc<Session>, Error> {
    state
        .sessions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(session)
        .cloned()
        .ok_or_else(|| unknown_session(session))
}

/// Parses the wire inputs (`{name: {type, shape, data}}`).
pub fn parse_inputs(inputs: &BTreeMap<String, Value>) -> Result<BTreeMap<String, Tensor>, Error> {
    inputs
        .iter()
        .map(|(name, value)| {
            let json: JsonTensor =
                serde_json::from_value(value.clone()).map_err(|e| Error::BadData {
                    name: name.clone(),
                    reason: format!("expected {{type, shape, data}}: {e}"),
                })?;
            Ok((name.clone(), Tensor::from_json(name, &json)?))
        })
        .collect()
}
