//! The hidden `arcane __piper-worker`: a Piper voice on ONNX Runtime serving OpenAI's
//! `POST /v1/audio/speech` for one voice, started and owned by the Core host as the
//! `piper` engine on the private socket.
//!
//! The request is OpenAI's JSON: `input` (the text, at most 4096 characters), `model`
//! (the gateway's), `voice` (accepted and not used: the voice is the model),
//! `response_format` (`mp3`, OpenAI's default, `opus`, `wav`, `flac` or `pcm`; `aac`
//! is refused by name), `speed` (0.25 to 4) and `stream_format`:
//!
//! * `audio` sends the audio as each sentence is made, chunk by chunk; it is what an
//!   `mp3`, `opus` or `pcm` answer does without being asked, since their bytes need no
//!   length up front. A `wav` or `flac` answer is whole (exact sizes in its header)
//!   unless `audio` is asked for: then its header says the length is unknown.
//! * `sse` sends OpenAI's events: `speech.audio.delta` with each sentence's audio in
//!   base64, then `speech.audio.done` (or `error`).
//!
//! The text is checked and phonemized before anything is sent, so a bad request is a
//! 400 even when streamed. One synthesis runs at a time; a client that goes away
//! cancels its own.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use arcane_piper::{AudioFormat, Encoder, Framing, Phonemizer, Script, Voice};
use arcane_report::codes;
use arcane_worker_http::{
    body_stream, bytes_response, sse_frame, ApiError, WorkerRequest, WorkerResponse, WorkerServer,
};
use base64::Engine as _;
use bytes::Bytes;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::sync::OwnedSemaphorePermit;

use crate::cmd::engine_worker::{self, EngineArgs};

/// Arguments of the hidden `arcane __piper-worker`.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    engine: EngineArgs,

    /// The ONNX Runtime library (`libonnxruntime.so.<version>`).
    #[arg(long, value_name = "PATH")]
    library: PathBuf,

    /// espeak-ng (default: `espeak-ng` on `PATH`).
    #[arg(long, value_name = "PATH")]
    espeak: Option<PathBuf>,
}

/// The largest request body read (the text is at most 4096 characters).
const MAX_BODY: usize = 1 << 20;

/// How an answer is sent (OpenAI's `stream_format`, and whether the format streams).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// One body with its length.
    Whole,
    /// The encoded audio, chunk by chunk as sentences are made.
    Audio,
    /// Server-sent events carrying the audio in base64.
    Sse,
}

/// What one request asks for.
struct Speech {
    input: String,
    format: AudioFormat,
    speed: f32,
    delivery: Delivery,
}

/// The voice, its phonemizer and the one turn to use them.
struct Worker {
    voice: Voice,
    phonemizer: Phonemizer,
    turn: Arc<tokio::sync::Semaphore>,
}

/// One synthesis under way: what it needs on its blocking thread.
struct Run {
    worker: Arc<Worker>,
    script: Script,
    format: AudioFormat,
    cancel: arcane_onnx::RunCancel,
    _turn: OwnedSemaphorePermit,
}

/// Loads the voice, then serves until stopped; what does not load is said on stderr
/// and exits 1.
#[allow(clippy::print_stderr)]
pub fn worker(args: &WorkerArgs) -> u8 {
    let (voice, phonemizer) = match load(args) {
        Ok(loaded) => loaded,
        Err(error) => {
            eprintln!("piper: {error}");
            return 1;
        }
    };
    eprintln!(
        "piper: voice `{}` loaded ({} Hz, espeak-ng voice `{}`, phonemizer `{}`), CPU",
        args.engine.model.display(),
        voice.sample_rate(),
        voice.espeak_voice(),
        phonemizer.executable().display()
    );
    let shared = Arc::new(Worker {
        voice,
        phonemizer,
        turn: Arc::new(tokio::sync::Semaphore::new(1)),
    });
    let server = WorkerServer::new(MAX_BODY).route(
        Method::POST,
        "/v1/audio/speech",
        Arc::new(move |request| {
            let worker = shared.clone();
            Box::pin(async move {
                speak(worker, request)
                    .await
                    .unwrap_or_else(|error| error.response())
            })
        }),
    );
    engine_worker::serve("piper", &args.engine, server)
}

fn load(args: &WorkerArgs) -> Result<(Voice, Phonemizer), String> {
    let runtime = arcane_onnx::Runtime::load(&args.library).map_err(|e| e.to_string())?;
    let phonemizer = match &args.espeak {
        Some(path) => Phonemizer::new(path.clone()),
        None => Phonemizer::find().ok_or(
            "espeak-ng is not on PATH: install it (Debian: `apt install espeak-ng`), Piper voices are phonemized with it",
        )?,
    };
    match arcane_files::trust::check_program(phonemizer.executable(), &[]) {
        Ok(Ok(())) => {}
        Ok(Err(untrusted)) => {
            return Err(format!(
                "refusing espeak-ng at `{}`: {}",
                phonemizer.executable().display(),
                untrusted.describe()
            ))
        }
        Err(error) => return Err(format!("cannot inspect espeak-ng: {error}")),
    }
    let threads = Some(args.engine.threads());
    let voice = Voice::load(&runtime, &args.engine.model, threads).map_err(|e| e.to_string())?;
    Ok((voice, phonemizer))
}

/// One request: its JSON read, its text checked and phonemized, then spoken whole or
/// streamed.
async fn speak(worker: Arc<Worker>, request: WorkerRequest) -> Result<WorkerResponse, ApiError> {
    let speech = parse(&request.body)?;
    let turn = worker
        .turn
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ApiError::failed("the worker is closing"))?;
    let prepared = {
        let (worker, input, speed) = (worker.clone(), speech.input, speech.speed);
        tokio::task::spawn_blocking(move || worker.voice.prepare(&worker.phonemizer, &input, speed))
    };
    let script = prepared
        .await
        .map_err(|e| ApiError::failed(e.to_string()))?
        .map_err(|e| voice_error(&e))?;
    let run = Run {
        worker,
        script,
        format: speech.format,
        cancel: arcane_onnx::RunCancel::new(),
        _turn: turn,
    };
    Ok(match speech.delivery {
        Delivery::Whole => whole(run, &request).await?,
        streamed => stream(run, streamed == Delivery::Sse),
    })
}

/// Names the voice's rate in `X-Sample-Rate` (what a `pcm` answer needs to be played).
fn name_rate(response: &mut WorkerResponse, rate: u32) {
    if let Ok(rate) = hyper::header::HeaderValue::from_str(&rate.to_string()) {
        response.headers_mut().insert("x-sample-rate", rate);
    }
}

/// Speaks the whole text, then answers with it encoded.
#[allow(clippy::print_stderr)]
async fn whole(run: Run, request: &WorkerRequest) -> Result<WorkerResponse, ApiError> {
    // The run's own cancel follows the request's: a client that goes away stops it.
    let watch = {
        let (cancel, gone) = (run.cancel.clone(), request.cancel.clone());
        tokio::spawn(async move {
            gone.cancelled().await;
            cancel.cancel();
        })
    };
    let started = Instant::now();
    let rate = run.worker.voice.sample_rate();
    let format = run.format;
    let spoken = tokio::task::spawn_blocking(move || {
        let mut audio = Vec::new();
        let spoken = run
            .worker
            .voice
            .speak(&run.script, &run.cancel, |sentence| {
                audio.extend_from_slice(&sentence);
                Ok(())
            })
            .and_then(|()| {
                let seconds = audio.len() as f64 / f64::from(rate);
                Ok((seconds, arcane_piper::encode(&audio, rate, format)?))
            });
        // The samples are gone: what they and the runs took goes back to the system.
        drop(audio);
        arcane_piper::release_memory();
        spoken
    })
    .await;
    watch.abort();
    let (seconds, body) = spoken
        .map_err(|e| ApiError::failed(e.to_string()))?
        .map_err(|e| voice_error(&e))?;
    eprintln!(
        "spoke {seconds:.1} s of audio in {:.2} s ({format})",
        started.elapsed().as_secs_f64(),
    );
    let mut response = bytes_response(StatusCode::OK, format.content_type(), body.into());
    name_rate(&mut response, rate);
    Ok(response)
}

/// Answers at once and sends each sentence's audio as it is made: the encoded bytes,
/// or (`sse`) OpenAI's `speech.audio.delta` events and a `speech.audio.done`.
fn stream(run: Run, sse: bool) -> WorkerResponse {
    let content_type = if sse {
        "text/event-stream"
    } else {
        run.format.content_type()
    };
    let (sender, mut response) = body_stream(content_type, 4);
    name_rate(&mut response, run.worker.voice.sample_rate());
    // A client that goes away drops the body: the channel closes, the run stops.
    let watch = {
        let (cancel, sender) = (run.cancel.clone(), sender.clone());
        tokio::spawn(async move {
            sender.closed().await;
            cancel.cancel();
        })
    };
    tokio::task::spawn_blocking(move || {
        stream_run(run, sse, &sender);
        // The last sender goes with the watch: the body ends.
        watch.abort();
    });
    response
}

/// The streamed run on its blocking thread: each sentence encoded and sent, then the
/// end (`speech.audio.done`, or an `error` event with `sse`; a plain audio stream that
/// fails ends early, and the worker's log says why).
#[allow(clippy::print_stderr)]
fn stream_run(run: Run, sse: bool, sender: &tokio::sync::mpsc::Sender<Bytes>) {
    let started = Instant::now();
    let voice = &run.worker.voice;
    let rate = voice.sample_rate();
    let mut first_audio = None;
    let mut seconds = 0.0;
    let mut send = |bytes: Vec<u8>| -> Result<(), arcane_piper::Error> {
        if bytes.is_empty() {
            return Ok(());
        }
        first_audio.get_or_insert_with(|| started.elapsed());
        let chunk = if sse {
            let audio = base64::engine::general_purpose::STANDARD.encode(&bytes);
            sse_frame(
                "speech.audio.delta",
                &json!({"type": "speech.audio.delta", "audio": audio}),
            )
        } else {
            Bytes::from(bytes)
        };
        sender
            .blocking_send(chunk)
            .map_err(|_| arcane_piper::Error::Cancelled)
    };
    let outcome = Encoder::new(run.format, rate, Framing::Streamed)
        .map_err(arcane_piper::Error::from)
        .and_then(|mut encoder| {
            voice.speak(&run.script, &run.cancel, |sentence| {
                seconds += sentence.len() as f64 / f64::from(rate);
                send(encoder.push(&sentence)?)
            })?;
            send(encoder.finish()?)
        });
    arcane_piper::release_memory();
    let end = match &outcome {
        Ok(()) => {
            eprintln!(
                "spoke {seconds:.1} s of audio in {:.2} s ({}, streamed; first audio after {:.2} s)",
                started.elapsed().as_secs_f64(),
                run.format,
                first_audio.unwrap_or_default().as_secs_f64()
            );
            let phonemes = run.script.phonemes();
            json!({
                "type": "speech.audio.done",
                "usage": {"input_tokens": phonemes, "output_tokens": 0, "total_tokens": phonemes},
            })
        }
        Err(error) => {
            eprintln!(
                "{}: {error} (after {seconds:.1} s of audio were sent)",
                error.code()
            );
            json!({"type": "error", "error": voice_error(error).body()})
        }
    };
    if sse {
        let name = end["type"].as_str().unwrap_or("error").to_string();
        let _ = sender.blocking_send(sse_frame(&name, &end));
    }
}

/// OpenAI's request body, checked; a bad field is a 400 naming it and its value.
fn parse(body: &[u8]) -> Result<Speech, ApiError> {
    let json: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::usage("input", format!("the body is not JSON: {e}"), json!({})))?;
    let input = match &json["input"] {
        Value::String(text) => text.clone(),
        Value::Null => {
            return Err(ApiError::usage(
                "input",
                "the field `input` (the text to speak) is required",
                json!({"field": "input"}),
            ))
        }
        other => {
            return Err(ApiError::usage(
                "input",
                format!("`input` must be text, not `{other}`"),
                json!({"field": "input", "value": other}),
            ))
        }
    };
    let format = response_format(&json["response_format"])?;
    let delivery = match &json["stream_format"] {
        Value::Null if matches!(format, AudioFormat::Wav | AudioFormat::Flac) => Delivery::Whole,
        Value::Null => Delivery::Audio,
        Value::String(name) if name == "audio" => Delivery::Audio,
        Value::String(name) if name == "sse" => Delivery::Sse,
        other => {
            let shown = other
                .as_str()
                .map_or_else(|| other.to_string(), str::to_string);
            return Err(ApiError::usage(
                "stream_format",
                format!("`stream_format` is `audio` or `sse`, not `{shown}`"),
                json!({"field": "stream_format", "value": other, "supported": ["audio", "sse"]}),
            ));
        }
    };
    let speed = match &json["speed"] {
        Value::Null => 1.0,
        Value::Number(n) => n.as_f64().unwrap_or(f64::NAN) as f32,
        other => {
            return Err(ApiError::usage(
                "speed",
                format!("`speed` must be a number from 0.25 to 4, not `{other}`"),
                json!({"field": "speed", "value": other}),
            ))
        }
    };
    Ok(Speech {
        input,
        format,
        speed,
        delivery,
    })
}

/// `response_format`: a format encoded here (default `mp3`, as OpenAI's), or a 400
/// naming the value and the formats there are (and, for `aac`, why it is not one).
fn response_format(value: &Value) -> Result<AudioFormat, ApiError> {
    let supported = AudioFormat::names();
    match value {
        Value::Null => Ok(AudioFormat::Mp3),
        Value::String(name) => AudioFormat::parse(name).ok_or_else(|| {
            let why = if name.eq_ignore_ascii_case("aac") {
                " (no AAC encoder is built in: the one well-kept encoder, Fraunhofer's FDK, is not free software)"
            } else {
                ""
            };
            ApiError::usage(
                "response_format",
                format!(
                    "`{name}` is not a response format this voice gives{why}: use {}",
                    supported.join(", ")
                ),
                json!({"field": "response_format", "value": name, "supported": supported}),
            )
        }),
        other => Err(ApiError::usage(
            "response_format",
            format!("`response_format` must be text, not `{other}`"),
            json!({"field": "response_format", "value": other}),
        )),
    }
}

fn voice_error(error: &arcane_piper::Error) -> ApiError {
    let code = error.code();
    let (status, param) = match code {
        codes::ARCANE_USAGE => (StatusCode::BAD_REQUEST, Some("input")),
        codes::ARCANE_CANCELLED => (
            StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            None,
        ),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, None),
    };
    let param = match error {
        arcane_piper::Error::BadSpeed { .. } => Some("speed"),
        _ => param,
    };
    ApiError {
        status,
        code,
        message: error.to_string(),
        param,
        details: arcane_report::Diagnostic::details(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_as_openai_sends_them() {
        let speech = parse(br#"{"model":"tts-1","input":"Hi.","voice":"alloy","response_format":"flac","speed":1.5}"#).unwrap();
        assert_eq!(speech.input, "Hi.");
        assert_eq!(speech.format, AudioFormat::Flac);
        assert_eq!(speech.speed, 1.5);
        assert_eq!(speech.delivery, Delivery::Whole);
        // mp3 is the default, as OpenAI's, and streams unless asked otherwise.
        let speech = parse(br#"{"input":"Hi.","voice":"alloy"}"#).unwrap();
        assert_eq!(speech.format, AudioFormat::Mp3);
        assert_eq!(speech.delivery, Delivery::Audio);
        for (body, delivery) in [
            (
                &br#"{"input":"Hi.","response_format":"wav","stream_format":"audio"}"#[..],
                Delivery::Audio,
            ),
            (
                br#"{"input":"Hi.","response_format":"pcm","stream_format":"sse"}"#,
                Delivery::Sse,
            ),
            (
                br#"{"input":"Hi.","response_format":"opus"}"#,
                Delivery::Audio,
            ),
            (
                br#"{"input":"Hi.","response_format":"wav"}"#,
                Delivery::Whole,
            ),
        ] {
            assert_eq!(
                parse(body).unwrap().delivery,
                delivery,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        for (body, param, value) in [
            (
                &br#"{"input":"Hi.","response_format":"aac"}"#[..],
                "response_format",
                "Fraunhofer",
            ),
            (
                br#"{"input":"Hi.","response_format":"ogg"}"#,
                "response_format",
                "mp3, opus, wav, flac, pcm",
            ),
            (
                br#"{"input":"Hi.","stream_format":"chunks"}"#,
                "stream_format",
                "chunks",
            ),
            (br#"{"input":7}"#, "input", "7"),
            (br#"{"voice":"alloy"}"#, "input", "input"),
            (br#"{"input":"Hi.","speed":"fast"}"#, "speed", "fast"),
        ] {
            let error = match parse(body) {
                Err(error) => error,
                Ok(_) => panic!("{}", String::from_utf8_lossy(body)),
            };
            assert_eq!(error.param, Some(param));
            assert_eq!(error.status, StatusCode::BAD_REQUEST);
            assert!(error.message.contains(value), "{}", error.message);
        }
    }
}
