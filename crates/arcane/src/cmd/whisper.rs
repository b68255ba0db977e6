//! The hidden `arcane __whisper-worker`: whisper.cpp (built in, CPU only) serving
//! OpenAI's `POST /v1/audio/transcriptions` and `/v1/audio/translations` for one model,
//! started and owned by the Core host as the `whisper.cpp` engine (see
//! `arcane_workspace`'s whisper kind for why it is not whisper.cpp's own server).
//!
//! One transcription runs at a time (whisper.cpp already uses every thread it is
//! given); others wait their turn. A client that goes away cancels its transcription,
//! waiting or running. Each one is logged on stderr, which the Core keeps as the
//! engine's log.

use std::sync::Arc;
use std::time::Instant;

use arcane_report::codes;
use arcane_whisper::format;
use arcane_whisper::{AudioError, Field, Model, RequestError, Task, TranscribeError};
use arcane_worker_http::{
    bytes_response, form_fields, ApiError, Cancel, WorkerRequest, WorkerResponse, WorkerServer,
};
use hyper::{Method, StatusCode};
use serde_json::json;

use crate::cmd::engine_worker::{self, EngineArgs};

/// Arguments of the hidden `arcane __whisper-worker`.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    engine: EngineArgs,
}

/// The largest request body read: the upload bound and room for the other fields.
const MAX_BODY: usize = arcane_whisper::audio::MAX_UPLOAD_BYTES + (1 << 20);

/// Loads the model, then serves until stopped; a model that does not load is said on
/// stderr and exits 1.
#[allow(clippy::print_stderr)]
pub fn worker(args: &WorkerArgs) -> u8 {
    let model = match Model::load(&args.engine.model, args.engine.threads()) {
        Ok(model) => Arc::new(model),
        Err(error) => {
            eprintln!("whisper.cpp: {error}");
            return 1;
        }
    };
    eprintln!(
        "whisper.cpp {}: `{}` loaded ({}), {} threads, CPU",
        whisper_rs::get_whisper_version(),
        args.engine.model.display(),
        if model.english_only() {
            "English only"
        } else {
            "multilingual"
        },
        args.engine.threads()
    );
    let turn = Arc::new(tokio::sync::Semaphore::new(1));
    let mut server = WorkerServer::new(MAX_BODY);
    for (path, task) in [
        ("/v1/audio/transcriptions", Task::Transcribe),
        ("/v1/audio/translations", Task::Translate),
    ] {
        let (model, turn) = (model.clone(), turn.clone());
        server = server.route(
            Method::POST,
            path,
            Arc::new(move |request| {
                let (model, turn) = (model.clone(), turn.clone());
                Box::pin(async move {
                    answer(model, turn, request, task)
                        .await
                        .unwrap_or_else(|error| error.response())
                })
            }),
        );
    }
    engine_worker::serve("whisper.cpp", &args.engine, server)
}

/// One request: its fields, the audio decoded, the transcript rendered.
#[allow(clippy::print_stderr)]
async fn answer(
    model: Arc<Model>,
    turn: Arc<tokio::sync::Semaphore>,
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
    if task == Task::Translate && model.english_only() {
        return Err(ApiError::usage(
            "model",
            "this model is English only: it cannot translate (use a multilingual Whisper model)",
            json!({"task": "translate"}),
        ));
    }
    let turn = turn
        .acquire_owned()
        .await
        .map_err(|_| ApiError::failed("the worker is closing"))?;
    let cancel: Cancel = request.cancel.clone();
    // The run holds the turn and logs its own outcome: the request's future is gone
    // when the client is, the run ends a moment later.
    let run = tokio::task::spawn_blocking(move || {
        let _turn = turn;
        let started = Instant::now();
        let outcome = transcribe(&model, &upload, cancel);
        match &outcome {
            Ok((audio, _)) => eprintln!(
                "transcribed {:.1} s of {} audio in {:.2} s",
                audio.duration(),
                audio.format,
                started.elapsed().as_secs_f64()
            ),
            Err(error) => eprintln!("{}: {}", error.code, error.message),
        }
        outcome.map(|(_, transcript)| (transcript, upload.format))
    });
    let (transcript, format) = run.await.map_err(|e| ApiError::failed(e.to_string()))??;
    let body = format::render(&transcript, task, format);
    Ok(bytes_response(
        StatusCode::OK,
        format.content_type(),
        body.into(),
    ))
}

/// Decodes and transcribes one upload (on a blocking thread).
#[allow(clippy::print_stderr)]
fn transcribe(
    model: &Model,
    upload: &arcane_whisper::Upload,
    cancel: Cancel,
) -> Result<(arcane_whisper::Audio, arcane_whisper::Transcript), ApiError> {
    let limits = arcane_whisper::Limits::default();
    let audio = arcane_whisper::audio::decode_cancellable(&upload.file, &limits, &cancel.flag())
        .map_err(|e| audio_error(&e))?;
    eprintln!(
        "transcribing {:.1} s of {} audio ({} Hz, {} channels)",
        audio.duration(),
        audio.format,
        audio.source_rate,
        audio.source_channels
    );
    let transcript = model
        .transcribe(&audio.samples, &upload.options, cancel.flag())
        .map_err(|e| transcribe_error(&e))?;
    Ok((audio, transcript))
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
