//! The speech worker: a process the Core host starts (`arcane __whisper-worker
//! --model PATH`), spoken to in one JSON object per line on its stdin (requests) and
//! stdout (responses), like the ONNX worker.
//!
//! * The first line is the hello: `{"id":0,"result":{"whisper","model","multilingual"}}`,
//!   or `{"id":0,"error":{…}}` when the model did not load (then it exits 1).
//! * Requests carry an `op` and a host-chosen `id`:
//!
//! | op | fields | result |
//! |---|---|---|
//! | `transcribe` | `audio` (the uploaded file, base64), `options` ([`Options`]) | a [`Transcript`] |
//! | `cancel` | `run` (the transcription's id) | none: the run answers `ARCANE_CANCELLED` |
//!
//! * Transcriptions run one at a time on their own thread (whisper.cpp already uses
//!   every thread it is given); the reading thread stays free to read a `cancel`.
//! * An error is `{"id", "error": {code, message, details}}`: `AUDIO_UNSUPPORTED`
//!   (the format is named), `AUDIO_INVALID`, `AUDIO_TOO_LARGE`, `AUDIO_TOO_LONG`,
//!   `ARCANE_USAGE` (a bad field), `ARCANE_CANCELLED`, `LOCAL_AI_SERVER_FAILED`.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::audio::{self, AudioError};
use crate::transcribe::{Model, Options, TranscribeError, Transcript};

/// A request to the worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    /// Decode and transcribe an uploaded file.
    Transcribe {
        /// The request id.
        id: u64,
        /// The file's bytes, base64.
        audio: String,
        /// What to do.
        #[serde(default)]
        options: Options,
    },
    /// Stop a transcription.
    Cancel {
        /// The request id (never answered).
        id: u64,
        /// The transcription's id.
        run: u64,
    },
}

/// A response from the worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    /// The request's id (`0` for the hello).
    pub id: u64,
    /// The result, on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The error (`{code, message, details}`), on failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}

/// An error frame's body.
fn error(code: &str, message: String, details: Value) -> Value {
    json!({"code": code, "message": message, "details": details})
}

fn audio_error(e: &AudioError) -> Value {
    let code = match e {
        AudioError::Unsupported { .. } => "AUDIO_UNSUPPORTED",
        AudioError::Damaged { .. } | AudioError::Empty { .. } => "AUDIO_INVALID",
        AudioError::TooLarge { .. } => "AUDIO_TOO_LARGE",
        AudioError::TooLong { .. } => "AUDIO_TOO_LONG",
    };
    let details = match e {
        AudioError::Unsupported { format }
        | AudioError::Damaged { format, .. }
        | AudioError::Empty { format } => json!({"format": format}),
        AudioError::TooLarge { size, limit } => json!({"size": size, "limit": limit}),
        AudioError::TooLong { limit } => json!({"limitSeconds": limit}),
    };
    error(code, e.to_string(), details)
}

fn transcribe_error(e: &TranscribeError) -> Value {
    match e {
        TranscribeError::Language(code) => {
            error("ARCANE_USAGE", e.to_string(), json!({"language": code}))
        }
        TranscribeError::Cancelled => error("ARCANE_CANCELLED", e.to_string(), json!({})),
        TranscribeError::Model { path, .. } => error(
            "LOCAL_AI_SERVER_FAILED",
            e.to_string(),
            json!({"model": path}),
        ),
        TranscribeError::Failed(_) => error("LOCAL_AI_SERVER_FAILED", e.to_string(), json!({})),
    }
}

fn write_line<W: Write>(output: &Mutex<W>, response: &Response) {
    let Ok(mut line) = serde_json::to_vec(response) else {
        return;
    };
    line.push(b'\n');
    let mut out = output.lock().unwrap_or_else(|e| e.into_inner());
    // A failed write means the host is gone; the read side ends the loop.
    let _ = out.write_all(&line).and_then(|()| out.flush());
}

fn answer<W: Write>(output: &Mutex<W>, id: u64, result: Result<Value, Value>) {
    let response = match result {
        Ok(value) => Response {
            id,
            result: Some(value),
            error: None,
        },
        Err(error) => Response {
            id,
            result: None,
            error: Some(error),
        },
    };
    write_line(output, &response);
}

/// Decodes and transcribes one upload.
pub fn run(
    model: &Model,
    audio_base64: &str,
    options: &Options,
    cancel: Arc<AtomicBool>,
) -> Result<Transcript, Value> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(audio_base64)
        .map_err(|e| {
            error(
                "ARCANE_USAGE",
                format!("`audio` is not base64: {e}"),
                json!({}),
            )
        })?;
    let audio = audio::decode(&bytes).map_err(|e| audio_error(&e))?;
    model
        .transcribe(&audio.samples, options, cancel)
        .map_err(|e| transcribe_error(&e))
}

struct Job {
    id: u64,
    audio: String,
    options: Options,
    cancel: Arc<AtomicBool>,
}

/// Runs the worker: loads the model at `model_path`, writes the hello and serves
/// requests from `input` until it ends; what was asked before the end is still
/// answered (a host that wants the worker gone stops the process).
/// Returns `false` when the model did not load (after saying so in the hello).
pub fn serve<R, W>(model_path: &Path, threads: usize, input: R, output: W) -> bool
where
    R: BufRead,
    W: Write + Send + 'static,
{
    let output = Arc::new(Mutex::new(output));
    let model = match Model::load(model_path, threads) {
        Ok(model) => model,
        Err(e) => {
            answer(&output, 0, Err(transcribe_error(&e)));
            return false;
        }
    };
    answer(
        &output,
        0,
        Ok(json!({
            "whisper": whisper_rs::get_whisper_version(),
            "model": model_path,
            "multilingual": !model.english_only(),
        })),
    );
    let runs: Arc<Mutex<HashMap<u64, Arc<AtomicBool>>>> = Arc::default();
    let (jobs, queue) = mpsc::channel::<Job>();
    let runner = {
        let output = output.clone();
        let runs = runs.clone();
        std::thread::spawn(move || {
            for job in queue {
                let result = if job.cancel.load(Ordering::Relaxed) {
                    Err(transcribe_error(&TranscribeError::Cancelled))
                } else {
                    run(&model, &job.audio, &job.options, job.cancel).and_then(|t| {
                        serde_json::to_value(t)
                            .map_err(|e| error("LOCAL_AI_SERVER_FAILED", e.to_string(), json!({})))
                    })
                };
                runs.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&job.id);
                answer(&output, job.id, result);
            }
        })
    };
    for line in input.lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Request>(&line) {
            Ok(Request::Transcribe { id, audio, options }) => {
                let cancel = Arc::new(AtomicBool::new(false));
                runs.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id, cancel.clone());
                let _ = jobs.send(Job {
                    id,
                    audio,
                    options,
                    cancel,
                });
            }
            Ok(Request::Cancel { run, .. }) => {
                if let Some(flag) = runs.lock().unwrap_or_else(|e| e.into_inner()).get(&run) {
                    flag.store(true, Ordering::Relaxed);
                }
            }
            Err(e) => {
                let id = serde_json::from_str::<Value>(&line)
                    .ok()
                    .and_then(|v| v["id"].as_u64())
                    .unwrap_or(0);
                answer(
                    &output,
                    id,
                    Err(error(
                        "ARCANE_USAGE",
                        format!("not a worker request: {e}"),
                        json!({}),
                    )),
                );
            }
        }
    }
    drop(jobs);
    let _ = runner.join();
    true
}
