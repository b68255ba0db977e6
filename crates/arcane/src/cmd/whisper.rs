//! The hidden `arcane __whisper-worker`: whisper.cpp (built in, CPU only) serving
//! OpenAI's `POST /v1/audio/transcriptions` and `/v1/audio/translations` for one model,
//! started and owned by the Core host as the `whisper.cpp` engine (see
//! `arcane_workspace`'s whisper kind for why it is not whisper.cpp's own server).
//!
//! Transcriptions run in a pool of at most `--max-workers` at once, each on its own
//! whisper.cpp state and `--threads` threads (by default as many as the CPUs allow:
//! the CPUs over the threads each one takes); others wait their turn. With
//! `stream=true` the text is sent as OpenAI's `transcript.text.delta` events as each
//! segment is decoded, then `transcript.text.done`. A client that goes away cancels
//! its transcription, waiting or running. Each one is logged on stderr, which the Core
//! keeps as the engine's log.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use arcane_report::codes;
use arcane_whisper::format;
use arcane_whisper::{AudioError, Field, Model, RequestError, Task, TranscribeError};
use arcane_worker_http::{
    bytes_response, event_stream, form_fields, sse_frame, ApiError, WorkerRequest, WorkerResponse,
    WorkerServer,
};
use hyper::{Method, StatusCode};
use serde_json::json;
use tokio::sync::OwnedSemaphorePermit;

use crate::cmd::engine_worker::{self, EngineArgs};

/// Arguments of the hidden `arcane __whisper-worker`.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    engine: EngineArgs,

    /// Transcriptions run at once, each on its own `--threads` (default: the CPUs this
    /// process may use over the threads each one takes, at least 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    max_workers: Option<u16>,

    /// whisper.cpp's voice-activity model (Silero VAD in ggml): silence is skipped
    /// before decoding. Set by the Core from the model's `vad`, never by a user's
    /// `args` (the file is the registered, verified one).
    #[arg(long, value_name = "PATH")]
    vad_model: Option<std::path::PathBuf>,
}

/// How many transcriptions run at once, and on how many threads each, from the flags
/// given and the CPUs there are: a count not given is what the CPUs allow.
fn pool(threads: Option<usize>, workers: Option<usize>, cpus: usize) -> (usize, usize) {
    let cpus = cpus.max(1);
    match (threads, workers) {
        (Some(threads), Some(workers)) => (threads.max(1), workers.max(1)),
        (None, Some(workers)) => ((cpus / workers.max(1)).max(1), workers.max(1)),
        (Some(threads), None) => (threads.max(1), (cpus / threads.max(1)).max(1)),
        (None, None) => {
            let threads = cpus.min(8);
            (threads, (cpus / threads).max(1))
        }
    }
}

/// The largest request body read: the upload bound and room for the other fields.
const MAX_BODY: usize = arcane_whisper::audio::MAX_UPLOAD_BYTES + (1 << 20);

/// Loads the model, then serves until stopped; a model that does not load is said on
/// stderr and exits 1.
#[allow(clippy::print_stderr)]
pub fn worker(args: &WorkerArgs) -> u8 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (threads, workers) = pool(args.engine.threads, args.max_workers.map(usize::from), cpus);
    let loaded = Model::load(&args.engine.model, threads).and_then(|model| match &args.vad_model {
        Some(vad) => model.with_vad(vad),
        None => Ok(model),
    });
    let model = match loaded {
        Ok(model) => Arc::new(model),
        Err(error) => {
            eprintln!("whisper.cpp: {error}");
            return 1;
        }
    };
    eprintln!(
        "whisper.cpp {}: `{}` loaded ({}{}), {workers} at once on {threads} threads each, CPU",
        whisper_rs::get_whisper_version(),
        args.engine.model.display(),
        if model.english_only() {
            "English only"
        } else {
            "multilingual"
        },
        match &args.vad_model {
            Some(vad) => format!(", silence skipped by `{}`", vad.display()),
            None => String::new(),
        },
    );
    let turns = Arc::new(tokio::sync::Semaphore::new(workers));
    let mut server = WorkerServer::new(MAX_BODY);
    for (path, task) in [
        ("/v1/audio/transcriptions", Task::Transcribe),
        ("/v1/audio/translations", Task::Translate),
    ] {
        let (model, turns) = (model.clone(), turns.clone());
        server = server.route(
            Method::POST,
            path,
            Arc::new(move |request| {
                let (model, turns) = (model.clone(), turns.clone());
                Box::pin(async move {
                    answer(model, turns, request, task)
                        .await
                        .unwrap_or_else(|error| error.response())
                })
            }),
        );
    }
    engine_worker::serve("whisper.cpp", &args.engine, server)
}

/// One transcription, its audio decoded and its turn in the pool taken.
struct Run {
    model: Arc<Model>,
    audio: arcane_whisper::Audio,
    options: arcane_whisper::Options,
    _turn: OwnedSemaphorePermit,
}

/// One request: its fields, the audio decoded, the transcript rendered or streamed.
async fn answer(
    model: Arc<Model>,
    turns: Arc<tokio::sync::Semaphore>,
    request: WorkerRequest,
    task: Task,
) -> Result<WorkerResponse, ApiError> {
    let fields = form_fields(&request).await?;
    let upload = arcane_whisper::upload(
        fields.iter().map(|f| Field {
            name: &f.name,
            file_name: f.file_name.as_deref(),
            data: &f.data,
        }),
        task,
    )
    .map_err(|e| request_error(&e))?;
    drop(fields);
    if task == Task::Translate && model.english_only() {
        return Err(ApiError::usage(
            "model",
            "this model is English only: it cannot translate (use a multilingual Whisper model)",
            json!({"task": "translate"}),
        ));
    }
    let turn = turns
        .acquire_owned()
        .await
        .map_err(|_| ApiError::failed("the worker is closing"))?;
    // The audio is decoded before any answer, so a bad file is a 400 even streamed.
    let cancel = request.cancel.flag();
    let (format, stream) = (upload.format, upload.stream);
    // The uploaded file goes once it is decoded: only the 16 kHz samples are kept.
    let (audio, options) = tokio::task::spawn_blocking(move || {
        let audio = decode(&upload, &cancel)?;
        Ok::<_, ApiError>((audio, upload.options))
    })
    .await
    .map_err(|e| ApiError::failed(e.to_string()))??;
    let run = Run {
        model,
        audio,
        options,
        _turn: turn,
    };
    if stream {
        return Ok(stream_text(run));
    }
    whole(run, request.cancel.flag(), task, format).await
}

/// Transcribes, then answers with the transcript rendered.
#[allow(clippy::print_stderr)]
async fn whole(
    run: Run,
    cancel: Arc<AtomicBool>,
    task: Task,
    format: arcane_whisper::format::ResponseFormat,
) -> Result<WorkerResponse, ApiError> {
    // The run holds its turn and logs its own outcome: the request's future is gone
    // when the client is, the run ends a moment later.
    let transcript = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let outcome = run
            .model
            .transcribe(&run.audio.samples, &run.options, cancel)
            .map_err(|e| transcribe_error(&e));
        log(&run.audio, started, &outcome);
        outcome
    })
    .await
    .map_err(|e| ApiError::failed(e.to_string()))??;
    let body = format::render(&transcript, task, format);
    Ok(bytes_response(
        StatusCode::OK,
        format.content_type(),
        body.into(),
    ))
}

/// Answers at once with OpenAI's events: a `transcript.text.delta` per segment as it
/// is decoded (the deltas joined are the final text), then `transcript.text.done` with
/// the text and the audio's duration as `usage`, or an `error` event.
fn stream_text(run: Run) -> WorkerResponse {
    let (sender, response) = event_stream(16);
    let cancel = Arc::new(AtomicBool::new(false));
    // A client that goes away drops the body: the channel closes, the run stops.
    let watch = {
        let (cancel, sender) = (cancel.clone(), sender.clone());
        tokio::spawn(async move {
            sender.closed().await;
            cancel.store(true, Ordering::Relaxed);
        })
    };
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let mut first = true;
        let mut each = |text: &str| {
            let text = text.trim();
            if text.is_empty() {
                return;
            }
            let delta = if std::mem::take(&mut first) {
                text.to_string()
            } else {
                format!(" {text}")
            };
            let event = json!({"type": "transcript.text.delta", "delta": delta});
            let _ = sender.blocking_send(sse_frame("transcript.text.delta", &event));
        };
        let outcome = run
            .model
            .transcribe_streamed(&run.audio.samples, &run.options, cancel, &mut each)
            .map_err(|e| transcribe_error(&e));
        log(&run.audio, started, &outcome);
        let end = match outcome {
            Ok(transcript) => json!({
                "type": "transcript.text.done",
                "text": transcript.text,
                "usage": {"type": "duration", "seconds": transcript.duration.ceil()},
            }),
            Err(error) => json!({"type": "error", "error": error.body()}),
        };
        let name = end["type"].as_str().unwrap_or("error").to_string();
        let _ = sender.blocking_send(sse_frame(&name, &end));
        // The last sender goes with the watch: the body ends.
        watch.abort();
    });
    response
}

/// The worker's log line for one transcription.
#[allow(clippy::print_stderr)]
fn log<T>(audio: &arcane_whisper::Audio, started: Instant, outcome: &Result<T, ApiError>) {
    match outcome {
        Ok(_) => eprintln!(
            "transcribed {:.1} s of {} audio in {:.2} s",
            audio.duration(),
            audio.format,
            started.elapsed().as_secs_f64()
        ),
        Err(error) => eprintln!("{}: {}", error.code, error.message),
    }
}

/// Decodes one upload's audio (on a blocking thread).
#[allow(clippy::print_stderr)]
fn decode(
    upload: &arcane_whisper::Upload,
    cancel: &AtomicBool,
) -> Result<arcane_whisper::Audio, ApiError> {
    let limits = arcane_whisper::Limits::default();
    let audio =
        arcane_whisper::audio::decode_cancellable(&upload.file, &limits, cancel).map_err(|e| {
            let error = audio_error(&e);
            eprintln!("{}: {}", error.code, error.message);
            error
        })?;
    eprintln!(
        "transcribing {:.1} s of {} audio ({} Hz, {} channels)",
        audio.duration(),
        audio.format,
        audio.source_rate,
        audio.source_channels
    );
    Ok(audio)
}

fn request_error(error: &RequestError) -> ApiError {
    let details = match error {
        RequestError::Missing { field } => json!({"field": field}),
        RequestError::Invalid { field, value, .. } => json!({"field": field, "value": value}),
        RequestError::TooLong {
            name, size, limit, ..
        } => json!({"field": name, "size": size, "limit": limit}),
    };
    ApiError::usage(error.field(), error.to_string(), details)
}

fn audio_error(error: &AudioError) -> ApiError {
    let invalid = |details| (StatusCode::BAD_REQUEST, codes::AUDIO_INVALID, details);
    let (status, code, details) = match error {
        AudioError::Cancelled => {
            return ApiError::cancelled("the decoding was cancelled: the client went away")
        }
        AudioError::BadRate { format, rate } => invalid(json!({
            "format": format,
            "sampleRate": rate,
            "accepted": [arcane_whisper::audio::MIN_SAMPLE_RATE, arcane_whisper::audio::MAX_SAMPLE_RATE],
        })),
        AudioError::TooManyChannels { format, channels } => invalid(json!({
            "format": format,
            "channels": channels,
            "limit": arcane_whisper::audio::MAX_CHANNELS,
        })),
        AudioError::NotFinite {
            format,
            value,
            seconds,
        } => invalid(json!({"format": format, "value": value, "seconds": seconds})),
        AudioError::Unsupported { format } => (
            StatusCode::BAD_REQUEST,
            codes::AUDIO_UNSUPPORTED,
            json!({"format": format, "supported": ["wav", "flac", "mp3", "ogg/vorbis"]}),
        ),
        AudioError::Damaged { format, .. } | AudioError::Empty { format } => (
            StatusCode::BAD_REQUEST,
            codes::AUDIO_INVALID,
            json!({"format": format}),
        ),
        AudioError::TooLarge { size, limit } => (
            StatusCode::PAYLOAD_TOO_LARGE,
            codes::AUDIO_TOO_LARGE,
            json!({"size": size, "limit": limit}),
        ),
        AudioError::TooLong { limit } => (
            StatusCode::PAYLOAD_TOO_LARGE,
            codes::AUDIO_TOO_LONG,
            json!({"limitSeconds": limit}),
        ),
    };
    ApiError {
        status,
        code,
        message: error.to_string(),
        param: Some("file"),
        details,
    }
}

fn transcribe_error(error: &TranscribeError) -> ApiError {
    match error {
        TranscribeError::Language(code) => {
            ApiError::usage("language", error.to_string(), json!({"language": code}))
        }
        TranscribeError::Cancelled => {
            ApiError::cancelled("the transcription was cancelled: the client went away")
        }
        TranscribeError::Model { .. } | TranscribeError::Failed(_) => {
            ApiError::failed(error.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pool;

    #[test]
    fn the_pool_takes_what_the_cpus_allow() {
        // Nothing given: threads up to 8, and as many runs as the CPUs hold.
        assert_eq!(pool(None, None, 2), (2, 1));
        assert_eq!(pool(None, None, 16), (8, 2));
        assert_eq!(pool(None, None, 0), (1, 1));
        // Workers given: the CPUs shared between them.
        assert_eq!(pool(None, Some(4), 2), (1, 4));
        assert_eq!(pool(None, Some(2), 8), (4, 2));
        // Threads given: as many runs as fit.
        assert_eq!(pool(Some(1), None, 4), (1, 4));
        assert_eq!(pool(Some(4), None, 2), (4, 1));
        // Both given: as given.
        assert_eq!(pool(Some(3), Some(5), 2), (3, 5));
    }
}
