//! The hidden `arcane __piper-worker`: a Piper voice on ONNX Runtime serving OpenAI's
//! `POST /v1/audio/speech` for one voice, started and owned by the Core host as the
//! `piper` engine on the private socket.
//!
//! The request is OpenAI's JSON: `input` (the text, at most 4096 characters), `model`
//! (the gateway's), `voice` (accepted and not used: the voice is the model),
//! `response_format` (`wav`, the default here, `pcm` — 16-bit little-endian mono at
//! the voice's rate — or `flac`; `mp3`, `opus` and `aac` are refused by name) and
//! `speed` (0.25 to 4). One synthesis runs at a time; a client that goes away cancels
//! its own.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use arcane_piper::{AudioFormat, Phonemizer, Voice};
use arcane_report::codes;
use arcane_worker_http::{bytes_response, ApiError, WorkerRequest, WorkerResponse, WorkerServer};
use hyper::{Method, StatusCode};
use serde_json::{json, Value};

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

/// What one request asks for.
struct Speech {
    input: String,
    format: AudioFormat,
    speed: f32,
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
    let shared = Arc::new((voice, phonemizer, tokio::sync::Semaphore::new(1)));
    let server = WorkerServer::new(MAX_BODY).route(
        Method::POST,
        "/v1/audio/speech",
        Arc::new(move |request| {
            let shared = shared.clone();
            Box::pin(async move {
                speak(shared, request)
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

/// One request: its JSON read, the text spoken, the audio encoded.
#[allow(clippy::print_stderr)]
async fn speak(
    shared: Arc<(Voice, Phonemizer, tokio::sync::Semaphore)>,
    request: WorkerRequest,
) -> Result<WorkerResponse, ApiError> {
    let speech = parse(&request.body)?;
    let _turn = shared
        .2
        .acquire()
        .await
        .map_err(|_| ApiError::failed("the worker is closing"))?;
    let cancel = arcane_onnx::RunCancel::new();
    // The run's own cancel follows the request's: a client that goes away stops it.
    let watch = {
        let (cancel, gone) = (cancel.clone(), request.cancel.clone());
        tokio::spawn(async move {
            gone.cancelled().await;
            cancel.cancel();
        })
    };
    let started = Instant::now();
    let worker = shared.clone();
    let run = tokio::task::spawn_blocking(move || {
        let (voice, phonemizer, _) = &*worker;
        let spoken = voice
            .synthesize(phonemizer, &speech.input, speech.speed, &cancel)
            .map(|samples| {
                let seconds = samples.len() as f64 / f64::from(voice.sample_rate());
                let body = arcane_piper::encode(&samples, voice.sample_rate(), speech.format);
                (seconds, body, speech.format)
            });
        // The samples are gone: what they and the runs took goes back to the system.
        arcane_piper::release_memory();
        spoken
    })
    .await;
    watch.abort();
    let (seconds, body, format) = run
        .map_err(|e| ApiError::failed(e.to_string()))?
        .map_err(|e| voice_error(&e))?;
    eprintln!(
        "spoke {seconds:.1} s of audio in {:.2} s ({})",
        started.elapsed().as_secs_f64(),
        format.as_str()
    );
    let mut response = bytes_response(StatusCode::OK, format.content_type(), body.into());
    if let Ok(rate) = hyper::header::HeaderValue::from_str(&shared.0.sample_rate().to_string()) {
        response.headers_mut().insert("x-sample-rate", rate);
    }
    Ok(response)
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
    let format = match &json["response_format"] {
        Value::Null => AudioFormat::Wav,
        Value::String(name) => AudioFormat::parse(name).ok_or_else(|| {
            ApiError::usage(
                "response_format",
                format!("`{name}` is not a response format this voice gives: use `wav`, `pcm` or `flac`"),
                json!({"field": "response_format", "value": name, "supported": ["wav", "pcm", "flac"]}),
            )
        })?,
        other => {
            return Err(ApiError::usage(
                "response_format",
                format!("`response_format` must be text, not `{other}`"),
                json!({"field": "response_format", "value": other}),
            ))
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
    })
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
        // wav is the default: this worker encodes no mp3.
        let speech = parse(br#"{"input":"Hi.","voice":"alloy"}"#).unwrap();
        assert_eq!(speech.format, AudioFormat::Wav);
        for (body, param, value) in [
            (
                &br#"{"input":"Hi.","response_format":"mp3"}"#[..],
                "response_format",
                "mp3",
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
