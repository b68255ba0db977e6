//! The routing contract between the front door and what serves its requests: an
//! [`Upstream`] (the local-AI service's one engine, or the model gateway) turns one
//! request ([`RouteRequest`]) into a [`Route`] (how to reach the engine, and a [`Lease`]
//! held until the answer is sent) or a [`NoRoute`] (the status and body to answer
//! with), and describes its models ([`ModelFacts`]) for the APIs that list them.
//!
//! It lives here, below both, so that the gateway implements it and the front door
//! calls it without either importing the other.

use hyper::StatusCode;
use serde_json::Value;

use crate::error::{Error, Unready};
use crate::service::BoxFuture;
use crate::upstream::EngineAccess;

/// Where the passthrough sends requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamTarget {
    /// The engine is ready; this is how to reach it.
    Ready {
        /// Its address and key.
        access: EngineAccess,
    },
    /// Not ready; a retry may succeed after `retry_after` seconds (`None`: it will
    /// not by itself, e.g. failed or not selected).
    Unavailable {
        /// The runtime id.
        runtime: String,
        /// Why it is not ready.
        state: Unready,
        /// Seconds until a retry makes sense.
        retry_after: Option<u64>,
    },
}

/// What one forwarded request asks for: the model its body (or `?model=`) names, and
/// a JSON body's `keep_alive` (Ollama's override of the model's idle time); see
/// the front door's `request_model`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteRequest {
    /// The model or alias asked for (`None`: the first model that serves `path`).
    pub model: Option<String>,
    /// The API path the request is for (`/v1/audio/speech`): a model that does not
    /// serve it is refused without being loaded (`None`: any path, e.g. a load).
    pub path: Option<String>,
    /// `keep_alive` from the body, as given (seconds or a duration string).
    pub keep_alive: Option<Value>,
    /// Who asks ([`crate::keys::Principal`]: the workspace token's admin, or an
    /// application key): the models it may use, its place in a model's queue.
    pub caller: crate::keys::Principal,
    /// Whether it is work that takes one of the model's `parallel` slots (a generation,
    /// an embedding, a transcription, …) and so waits its turn in the model's queue;
    /// `false` for what the engine answers beside its slots (a listing, `/slots`,
    /// `/tokenize`) and for a load.
    pub queued: bool,
    /// How long the client will wait for the answer to begin (`X-Stainless-Timeout`,
    /// `X-Arcane-Deadline`): a request whose expected wait in the model's queue is
    /// longer is refused at once (`None`: no deadline).
    pub deadline: Option<std::time::Duration>,
}

/// What the front door knows of one served model, for the APIs that describe models
/// themselves (Ollama's `/api/tags`, `/api/ps`, `/api/show`: the front door's `apis::ollama`).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelFacts {
    /// The id clients name.
    pub id: String,
    /// Other names that select it.
    pub aliases: Vec<String>,
    /// The engine kind that serves it.
    pub kind: arcane_localai::Engine,
    /// Its model file, when it has one.
    pub file: Option<std::path::PathBuf>,
    /// The registered SHA-256 of its file (`None`: not registered).
    pub digest: Option<String>,
    /// The engine's own arguments (`--embeddings`, `--mmproj …`).
    pub args: Vec<String>,
    /// The device it runs on (`cpu`, a GPU id, `external`).
    pub device: String,
    /// Whether its engine is loaded and answering.
    pub loaded: bool,
    /// The resident memory of its engine process while loaded, in bytes.
    pub resident_bytes: Option<u64>,
    /// The memory it is estimated to need on its device, in bytes (0: unknown).
    pub memory: u64,
    /// Seconds until it unloads for idleness (`None`: never, or requests are in
    /// flight).
    pub unloads_in: Option<f64>,
    /// Its idle time in force, in seconds (`0`: after each request, `-1`: never).
    pub keep_alive: f64,
}

/// What a forwarded request holds until its answer is sent to the end (or dropped):
/// the gateway counts the model's requests in flight with it, and measures them.
pub trait Lease: Send + Sync {
    /// The engine answered with `status`.
    fn answered(&mut self, status: StatusCode) {
        let _ = status;
    }
    /// The answer reported this `usage` (`{prompt_tokens, completion_tokens, …}`).
    fn usage(&mut self, usage: &Value) {
        let _ = usage;
    }
    /// The answer was sent to the end.
    fn finished(&mut self) {}
    /// The engine could not be reached (or gave no answer).
    fn unreachable(&mut self) {}
    /// The engine went away before it answered: waits (bounded) until whoever serves
    /// the route has seen it die, and says whether it did, so the request may be sent
    /// once more to the engine that replaces it. A lease that says so is not counted as
    /// a request (the replay is), and says the replay in its events and log. The
    /// default: no replay.
    fn engine_gone(&mut self) -> crate::service::BoxFuture<'_, bool> {
        Box::pin(async { false })
    }
}

/// Where one forwarded request goes, and what it holds until its answer is sent.
pub struct Route {
    /// How to reach the engine.
    pub access: EngineAccess,
    /// Held until the response body is sent to the end or dropped.
    pub lease: Option<Box<dyn Lease>>,
    /// The name the client asked for: every `"model"` the answer names becomes it.
    pub rename: Option<String>,
    /// The model name the engine is sent instead of the client's: a JSON body's
    /// `model` is replaced (the body is written again, its `Content-Length` with it);
    /// a multipart field or `?model=` is sent as the client wrote it.
    pub upstream_model: Option<String>,
}

/// Why a request has no route: the HTTP status and the error to answer with.
pub struct NoRoute {
    /// The status (404 unknown model, 503 not ready, …).
    pub status: StatusCode,
    /// The JSON body.
    pub body: Value,
    /// `Retry-After` seconds, when a retry may succeed.
    pub retry_after: Option<u64>,
    /// The same wait to the millisecond, when it is known that finely: sent as
    /// `retry-after-ms` too, which the official OpenAI and Anthropic clients prefer.
    pub retry_after_ms: Option<u64>,
}

impl NoRoute {
    /// 503 `LOCAL_AI_SERVER_NOT_READY`: the engine of `runtime` is not ready.
    pub fn not_ready(runtime: String, state: Unready, retry_after: Option<u64>) -> Self {
        let error = Error::EngineNotReady {
            runtime,
            state,
            retry_after,
        };
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            body: serde_json::json!({"error": arcane_report::error_json(&error)}),
            retry_after,
            retry_after_ms: None,
        }
    }
}

/// Supplies the passthrough's target: the local-AI service (one engine) or the model
/// gateway (a model per request).
pub trait Upstream: Send + Sync {
    /// The current target of a request that names no model (also what `/health`
    /// reports).
    fn openai_target(&self) -> UpstreamTarget;

    /// Whether requests are routed by the model they name; the passthrough then reads
    /// `model` from request bodies (the front door's `request_model`), the front door answers
    /// `GET /v1/models[/{id}]` from [`Upstream::models`] (an entry's `aliases` name it
    /// too) and a path its table does not serve with its own 404.
    fn routes_by_model(&self) -> bool {
        false
    }

    /// The route of one request (the default: [`Upstream::openai_target`]).
    fn route(&self, request: RouteRequest) -> BoxFuture<'_, Result<Route, NoRoute>> {
        let _ = request;
        Box::pin(async move {
            match self.openai_target() {
                UpstreamTarget::Ready { access } => Ok(Route {
                    access,
                    lease: None,
                    rename: None,
                    upstream_model: None,
                }),
                UpstreamTarget::Unavailable {
                    runtime,
                    state,
                    retry_after,
                } => Err(NoRoute::not_ready(runtime, state, retry_after)),
            }
        })
    }

    /// Whether the front door is healthy whatever [`Upstream::openai_target`] says: the
    /// gateway, whose models load on demand.
    fn loads_on_demand(&self) -> bool {
        false
    }

    /// Whether an engine behind this upstream answers `path`
    /// ([`arcane_localai::EngineKind::api_paths`]): the front door's engine routes
    /// (the front door's `router`). The default is the default kind's paths (OpenAI's,
    /// Anthropic's and llama-server's own).
    fn serves(&self, path: &str) -> bool {
        arcane_localai::serves_path(arcane_localai::Engine::DEFAULT.kind().api_paths(), path)
    }

    /// Arcane's own `GET /metrics` answer (the gateway's Prometheus text), when it
    /// routes by model.
    fn metrics(&self) -> Option<String> {
        None
    }

    /// Arcane's own `GET /v1/models` answer (`{object: "list", data: [...]}`), when it
    /// routes by model.
    fn models(&self) -> Option<Value> {
        None
    }

    /// What is known of each model it routes to (the default model first); empty when
    /// it does not route by model.
    fn catalog(&self) -> Vec<ModelFacts> {
        Vec::new()
    }
}

/// OpenAI's 404 for an unknown model, listing the known ids.
pub fn model_not_found(id: &str, entries: &[Value]) -> Value {
    let known: Vec<&str> = entries.iter().filter_map(|m| m["id"].as_str()).collect();
    serde_json::json!({"error": {
        "message": format!("The model `{id}` does not exist; known: {}", known.join(", ")),
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }})
}
