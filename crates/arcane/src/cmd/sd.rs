//! The hidden `arcane __sd-worker`: stable-diffusion.cpp (its library, loaded from the
//! registered path) serving OpenAI's `POST /v1/images/generations` for one model,
//! started and owned by the Core host as the `stable-diffusion.cpp` engine.
//!
//! One generation runs at a time (it already uses every thread it is given); others
//! wait their turn. Each image is drawn in the generator, a child process of the worker ([`arcane_stable_diffusion::Model::
//! generate_isolated`]), so a client that goes away — waiting or while its image is
//! drawn — stops the work at once. With `stream: true` the answer is server-sent
//! events: `image_generation.step` after each sampling step (`{step, steps, index}`),
//! `image_generation.completed` for each image (OpenAI's event, with `b64_json`), and
//! `error` if it fails. Each image is logged on stderr, which the Core keeps as the
//! engine's log.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use arcane_report::{codes, Diagnostic};
use arcane_stable_diffusion::{Event, Generation, ImageRequest, Library, Model};
use arcane_worker_http::{
    event_stream, json_response, sse_frame, ApiError, WorkerRequest, WorkerResponse, WorkerServer,
};
use base64::Engine as _;
use bytes::Bytes;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};

use crate::cmd::engine_worker::{self, EngineArgs};

/// Arguments of the hidden `arcane __sd-worker`.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    engine: EngineArgs,

    /// stable-diffusion.cpp's library (`libstable-diffusion.so`).
    #[arg(long, value_name = "PATH")]
    library: PathBuf,
}

/// The largest request body read (two prompts of at most 4000 characters).
const MAX_BODY: usize = 1 << 20;

/// The route this worker answers.
const PATH: &str = "/v1/images/generations";

/// What every request shares: the model and the one turn.
struct Shared {
    model: Model,
    turn: Semaphore,
}

impl Shared {
    /// Waits for the one turn to draw.
    async fn turn(&self) -> Result<tokio::sync::SemaphorePermit<'_>, ApiError> {
        self.turn
            .acquire()
            .await
            .map_err(|_| ApiError::failed("the worker is closing"))
    }
}

/// Loads the library and the model, then serves until stopped; what does not load is
/// said on stderr and exits 1.
#[allow(clippy::print_stderr)]
pub fn worker(args: &WorkerArgs) -> u8 {
    let model = match load(args) {
        Ok(model) => model,
        Err(error) => {
            eprintln!("stable-diffusion.cpp: {error}");
            return 1;
        }
    };
    eprintln!(
        "stable-diffusion.cpp {}: `{}` loaded, {} threads, CPU",
        model.library().version(),
        args.engine.model.display(),
        args.engine.threads()
    );
    let shared = Arc::new(Shared {
        model,
        turn: Semaphore::new(1),
    });
    let server = WorkerServer::new(MAX_BODY).route(
        Method::POST,
        PATH,
        Arc::new(move |request| {
            let shared = shared.clone();
            Box::pin(async move { answer(shared, request).await })
        }),
    );
    engine_worker::serve("stable-diffusion.cpp", &args.engine, server)
}

fn load(args: &WorkerArgs) -> Result<Model, String> {
    match arcane_files::trust::check_program(&args.library, &[]) {
        Ok(Ok(())) => {}
        Ok(Err(untrusted)) => {
            return Err(format!(
                "refusing the library `{}`: {}",
                args.library.display(),
                untrusted.describe()
            ))
        }
        Err(error) => return Err(format!("cannot inspect the library: {error}")),
    }
    let library = Library::load(&args.library).map_err(|e| e.to_string())?;
    Model::load(library, &args.engine.model, args.engine.threads()).map_err(|e| e.to_string())
}

/// One request: checked, then answered whole or as a stream.
async fn answer(shared: Arc<Shared>, request: WorkerRequest) -> WorkerResponse {
    let parsed = match ImageRequest::parse(&request.body, random_seed()) {
        Ok(parsed) => parsed,
        Err(error) => return api_error(&error).response(),
    };
    if parsed.stream {
        return stream(shared, parsed.generation);
    }
    let generation = parsed.generation;
    let gone = request.cancel.clone();
    let run = async {
        let _turn = shared.turn().await?;
        let mut data = Vec::new();
        for index in 0..generation.count {
            let image = draw(&shared, &generation, index, None).await?;
            data.push(datum(&generation, index, &image));
        }
        Ok::<_, ApiError>(data)
    };
    let data = tokio::select! {
        data = run => data,
        () = gone.cancelled() => Err(ApiError::cancelled("the client went away")),
    };
    match data {
        Ok(data) => json_response(StatusCode::OK, &answer_json(&generation, data)),
        Err(error) => error.response(),
    }
}

/// `stream: true`: events as the images are drawn.
fn stream(shared: Arc<Shared>, generation: Generation) -> WorkerResponse {
    let (sender, response) = event_stream(64);
    tokio::spawn(async move {
        let gone = sender.clone();
        let run = async {
            let _turn = shared.turn().await?;
            for index in 0..generation.count {
                let image = draw(&shared, &generation, index, Some(&sender)).await?;
                let mut event = datum(&generation, index, &image);
                event["type"] = json!("image_generation.completed");
                event["index"] = json!(index);
                event["created_at"] = json!(now());
                event["size"] = json!(format!("{}x{}", generation.width, generation.height));
                event["output_format"] = json!(generation.format.as_str());
                let _ = sender
                    .send(sse_frame("image_generation.completed", &event))
                    .await;
            }
            Ok::<_, ApiError>(())
        };
        let outcome = tokio::select! {
            outcome = run => outcome,
            () = gone.closed() => Ok(()),
        };
        if let Err(error) = outcome {
            let body = json!({"type": "error", "error": error.body()});
            let _ = sender.send(sse_frame("error", &body)).await;
        }
    });
    response
}

/// Draws image `index` in the generator, sending each step to `steps` when the
/// request streams. Dropping the future (its client went away) kills the generator.
async fn draw(
    shared: &Arc<Shared>,
    generation: &Generation,
    index: u32,
    steps: Option<&mpsc::Sender<Bytes>>,
) -> Result<Vec<u8>, ApiError> {
    let cancel = arcane_stable_diffusion::Cancel::new();
    // Whatever ends this future early (a client gone) cancels the generation.
    let _guard = CancelOnDrop(cancel.clone());
    let (shared, generation, steps) = (shared.clone(), generation.clone(), steps.cloned());
    let started = Instant::now();
    let task = tokio::task::spawn_blocking(move || {
        let mut on_event = |event: Event| {
            let Event::Step { step, steps: of } = event;
            if let Some(sender) = &steps {
                let body = json!({"type": "image_generation.step", "step": step, "steps": of, "index": index});
                // A full channel waits (backpressure); a closed one means the client
                // went away, which the stream's own watch turns into a cancel.
                let _ = sender.blocking_send(sse_frame("image_generation.step", &body));
            }
        };
        let image = shared
            .model
            .generate_isolated(&generation, index, &cancel, &mut on_event);
        (image, generation)
    });
    let (image, generation) = task
        .await
        .map_err(|e| ApiError::failed(format!("the generation's thread failed: {e}")))?;
    let image = image.map_err(|e| api_error(&e))?;
    log_drawn(&generation, index, started);
    Ok(image)
}

#[allow(clippy::print_stderr)]
fn log_drawn(generation: &Generation, index: u32, started: Instant) {
    eprintln!(
        "drew image {}/{} ({}x{}, {} steps, seed {}) in {:.2} s",
        index + 1,
        generation.count,
        generation.width,
        generation.height,
        generation.steps,
        generation.seed.saturating_add(index.into()),
        started.elapsed().as_secs_f64()
    );
}

/// Cancels a generation when dropped.
struct CancelOnDrop(arcane_stable_diffusion::Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// One entry of `data`: the image, and the seed that draws it again.
fn datum(generation: &Generation, index: u32, image: &[u8]) -> Value {
    json!({
        "b64_json": base64::engine::general_purpose::STANDARD.encode(image),
        "revised_prompt": null,
        "seed": generation.seed.saturating_add(index.into()),
    })
}

/// OpenAI's `ImagesResponse`, with the size and format.
fn answer_json(generation: &Generation, data: Vec<Value>) -> Value {
    json!({
        "created": now(),
        "data": data,
        "output_format": generation.format.as_str(),
        "size": format!("{}x{}", generation.width, generation.height),
    })
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A seed for a request that names none (it is returned with each image).
fn random_seed() -> u64 {
    let mut bytes = [0u8; 4];
    let _ = getrandom::getrandom(&mut bytes);
    u64::from(u32::from_le_bytes(bytes) >> 1)
}

/// The OpenAI-shaped answer for a library error.
fn api_error(error: &arcane_stable_diffusion::Error) -> ApiError {
    let code = error.code();
    let status = match code {
        codes::ARCANE_USAGE => StatusCode::BAD_REQUEST,
        codes::ARCANE_CANCELLED => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ApiError {
        status,
        code,
        message: error.to_string(),
        param: error.field(),
        details: error.details(),
    }
}
