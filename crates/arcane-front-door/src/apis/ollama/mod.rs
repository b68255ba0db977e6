//! Ollama's API (`/api/*`) on the front door, for every gateway model.
//!
//! Ollama's clients (the `ollama` Python and JavaScript packages, litellm's
//! `ollama_chat/`, editors and UIs that only speak Ollama) should reach a llama.cpp
//! model behind the gateway as they reach Ollama. Rather than a second front door,
//! the translation is a few rows of the one route table ([`ROWS`])
//! and this one handler kind: a request is read and checked here, routed by the
//! gateway exactly as a forwarded request is ([`Upstream::route`]: load on demand,
//! `keep_alive`, the lease that counts it in flight and measures it), sent to the
//! engine's OpenAI endpoint (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/embeddings`) with [`crate::passthrough::exchange`], and its answer rewritten on
//! its way back by a [`Rewrite`] ([`reply`]) that the passthrough's own body drives: the
//! same drain, the same metrics, no second passthrough.
//!
//! A model of the `ollama` kind (a real Ollama as a gateway model) gets the request as
//! it came, as before this module; so do the listing endpoints when the default model
//! is one.
//!
//! One module per concern: [`names`] (`name:tag` → a model), [`options`] (Ollama's
//! `options`, `format`, `think` → the engine's fields), [`chat`] and [`generate`]
//! (requests), [`reply`] (answers, streamed as NDJSON or whole), [`embed`], [`models`]
//! (`/api/tags`, `/api/ps`, `/api/show`). What differs from Ollama and why is in
//! `docs/ollama-api.md`.

use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use crate::passthrough::{ModelFacts, NoRoute, RouteRequest, Upstream};
use crate::response_lines::Rewrite;
use crate::router::{Handler, PathPattern, Row, Scope, Verb};
use arcane_core::host::Host;
use arcane_core::upstream::{Deadlines, EngineAccess, EngineClient, HttpBody};
use arcane_core::Peer;

pub mod chat;
pub mod embed;
pub mod generate;
pub mod models;
pub mod names;
pub mod options;
pub mod reply;

/// The Ollama API level this translation follows (what `GET /api/version` says).
pub const OLLAMA_VERSION: &str = "0.9.0";

const fn row(verb: Verb, path: &'static str, endpoint: Endpoint) -> Row {
    Row {
        verb,
        path: PathPattern::Exact(path),
        scope: Scope::RoutingByModel,
        handler: Handler::Api(crate::apis::Endpoint::Ollama(endpoint)),
    }
}

/// Where Ollama's API lives: every path under it answers errors in Ollama's shape
/// ([`error_body`]), the front door's own refusals included.
pub const PREFIX: &str = "/api/";

/// The path an Ollama client meant when it was given the OpenAI base URL (`…/v1`)
/// instead of the host's root (`/v1/api/chat` for `/api/chat`).
pub fn meant(path: &str) -> Option<&str> {
    path.strip_prefix("/v1")
        .filter(|rest| rest.starts_with(PREFIX))
}

/// An error in Ollama's shape, `{"error": "…"}`, with Arcane's stable `code` beside it
/// (Ollama's clients read `error` as a string and ignore the rest).
pub fn error_body(code: &str, message: &str) -> Value {
    json!({"error": message, "code": code})
}

/// The paths of Ollama's API an `inference` key may call: the models' use and their
/// listings, not `pull`, `push`, `create`, `copy` or `delete`.
pub const INFERENCE_PATHS: &[&str] = &[
    "/api/chat",
    "/api/generate",
    "/api/embed",
    "/api/embeddings",
    "/api/tags",
    "/api/show",
    "/api/ps",
    "/api/version",
];

/// Ollama's API on the front door, for every gateway model (this module):
/// before the engines' rows, so a llama.cpp model answers `/api/chat` too; a model of
/// the `ollama` kind still gets the request as it came. Any other `/api/` path is an
/// engine's (Ollama's) or the Core's 404.
pub const ROWS: &[Row] = {
    use Endpoint as E;
    &[
        row(Verb::Get, "/api/version", E::Version),
        row(Verb::Get, "/api/tags", E::Tags),
        row(Verb::Get, "/api/ps", E::Ps),
        row(Verb::Post, "/api/show", E::Show),
        row(Verb::Post, "/api/chat", E::Chat),
        row(Verb::Post, "/api/generate", E::Generate),
        row(Verb::Post, "/api/embed", E::Embed),
        row(Verb::Post, "/api/embeddings", E::Embeddings),
        row(Verb::Post, "/api/pull", E::Pull),
        row(Verb::Post, "/api/push", E::Push),
        row(Verb::Post, "/api/create", E::Create),
        row(Verb::Post, "/api/copy", E::Copy),
        row(Verb::Delete, "/api/delete", E::Delete),
    ]
};

/// One endpoint of Ollama's API (a row of [`ROWS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `GET /api/version`.
    Version,
    /// `GET /api/tags`: every model.
    Tags,
    /// `GET /api/ps`: the loaded models.
    Ps,
    /// `POST /api/show`: one model's details.
    Show,
    /// `POST /api/chat`.
    Chat,
    /// `POST /api/generate`.
    Generate,
    /// `POST /api/embed`.
    Embed,
    /// `POST /api/embeddings` (the older, single-prompt form).
    Embeddings,
    /// `POST /api/pull`: refused, naming the Arcane command.
    Pull,
    /// `POST /api/push`: refused.
    Push,
    /// `POST /api/create`: refused, naming the Arcane command.
    Create,
    /// `POST /api/copy`: refused, naming the Arcane configuration.
    Copy,
    /// `DELETE /api/delete`: refused, naming the Arcane command.
    Delete,
}

impl Endpoint {
    /// Whether the request body names a model (else it lists, or is refused).
    fn names_a_model(self) -> bool {
        matches!(
            self,
            Self::Show | Self::Chat | Self::Generate | Self::Embed | Self::Embeddings
        )
    }
}

/// Why an Ollama request is refused: answered in Ollama's shape `{"error": "…"}` (with
/// a stable `code` beside it, which Ollama's clients ignore).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OllamaError {
    /// No model answers to the name.
    #[error("model \"{asked}\" not found; the models are: {known}")]
    UnknownModel {
        /// The name asked for.
        asked: String,
        /// The names `/api/tags` lists, comma-separated.
        known: String,
    },
    /// The request is malformed or asks for what the model cannot do.
    #[error("{0}")]
    BadRequest(String),
    /// `num_ctx` is more than the context the model is loaded with.
    #[error("num_ctx {asked} is more than the context `{model}` is loaded with ({loaded} tokens per request); Arcane does not reload a model per request: set its context in `arcane.toml` (`args = [\"-c\", \"{asked}\"]` in its [[model]] table), run `arcane reload`, or ask for at most {loaded}")]
    ContextMismatch {
        /// The model.
        model: String,
        /// The context asked for.
        asked: u64,
        /// The context it is loaded with.
        loaded: u64,
    },
    /// Images for a model without vision.
    #[error("model `{model}` cannot read images: its engine has no vision (a llama.cpp model needs its multimodal projector, `args = [\"--mmproj\", \"FILE\"]` in its [[model]] table)")]
    NoVision {
        /// The model.
        model: String,
    },
    /// An endpoint Arcane does not serve through Ollama's API.
    #[error("`{endpoint}` is not served through Ollama's API: {instead}")]
    Refused {
        /// The endpoint.
        endpoint: &'static str,
        /// The Arcane command or configuration that does the job.
        instead: &'static str,
    },
    /// The caller's key may not use the model (its `--models` list).
    #[error("the key `{key}` may not use the model `{model}`; it may use {allowed}")]
    Denied {
        /// The key's name.
        key: String,
        /// The model asked for.
        model: String,
        /// The models it may use, comma-separated.
        allowed: String,
    },
    /// The gateway or the engine refused or failed (its message, its status).
    #[error("{message}")]
    Upstream {
        /// The status to answer with.
        status: StatusCode,
        /// What it said.
        message: String,
        /// `Retry-After` seconds, when a retry may succeed.
        retry_after: Option<u64>,
    },
}

impl OllamaError {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::UnknownModel { .. } => StatusCode::NOT_FOUND,
            Self::BadRequest(_) | Self::ContextMismatch { .. } | Self::NoVision { .. } => {
                StatusCode::BAD_REQUEST
            }
            Self::Refused { .. } => StatusCode::NOT_IMPLEMENTED,
            Self::Denied { .. } => StatusCode::FORBIDDEN,
            Self::Upstream { status, .. } => *status,
        }
    }

    /// The stable code beside the message.
    pub fn code(&self) -> &'static str {
        match self {
            Self::UnknownModel { .. } => "OLLAMA_MODEL_NOT_FOUND",
            Self::BadRequest(_) => "OLLAMA_BAD_REQUEST",
            Self::ContextMismatch { .. } => "OLLAMA_CONTEXT_MISMATCH",
            Self::NoVision { .. } => "OLLAMA_NO_VISION",
            Self::Refused { .. } => "OLLAMA_NOT_SERVED",
            Self::Denied { .. } => arcane_report::codes::CORE_MODEL_DENIED,
            Self::Upstream { .. } => "OLLAMA_UPSTREAM",
        }
    }

    /// The body: `{"error": "…", "code": "…"}`.
    pub fn body(&self) -> Value {
        error_body(self.code(), &self.to_string())
    }

    /// The response.
    pub fn response(&self) -> Response<HttpBody> {
        let mut response = crate::http::json_response(self.status(), &self.body());
        if let Self::Upstream {
            retry_after: Some(seconds),
            ..
        } = self
        {
            response
                .headers_mut()
                .insert(hyper::header::RETRY_AFTER, HeaderValue::from(*seconds));
        }
        response
    }

    /// The refusal of a model `caller`'s key may not use.
    pub fn denied(caller: &arcane_core::keys::Principal, model: &str) -> Self {
        Self::Denied {
            key: caller.name.to_string(),
            model: model.to_string(),
            allowed: caller.models.as_deref().unwrap_or_default().join(", "),
        }
    }

    /// A gateway refusal (not ready, a failed load, a bad `keep_alive`) in Ollama's shape.
    pub fn from_no_route(no_route: NoRoute) -> Self {
        Self::Upstream {
            status: no_route.status,
            message: error_message(&no_route.body),
            retry_after: no_route.retry_after,
        }
    }
}

/// The message of an error body of any shape (OpenAI's `{error: {message}}`, Arcane's
/// `{error: {code, message}}`, Ollama's `{error: "…"}`), else the body itself.
pub fn error_message(body: &Value) -> String {
    match &body["error"] {
        Value::String(message) => message.clone(),
        Value::Object(error) => error
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| Value::Object(error.clone()).to_string(), str::to_string),
        _ => body.to_string(),
    }
}

/// Answers one admitted request to Ollama's API (see the module documentation).
pub async fn handle(
    host: &Host,
    upstream: &dyn Upstream,
    client: &EngineClient,
    endpoint: Endpoint,
    request: Request<Incoming>,
) -> Response<HttpBody> {
    let caller = crate::caller::principal(request.extensions());
    let deadline = crate::caller::deadline(request.headers());
    let mut catalog = upstream.catalog();
    let default_is_ollama = catalog
        .first()
        .is_some_and(|m| m.kind == arcane_localai::Engine::Ollama);
    // What the caller's key may not use is not shown, as if it were not there.
    let everything = catalog.clone();
    catalog.retain(|m| caller.may_use(&m.id));
    if !endpoint.names_a_model() {
        return match endpoint {
            _ if default_is_ollama => {
                crate::passthrough::forward(host, Some(upstream), client, request).await
            }
            Endpoint::Version => crate::http::json_response(
                StatusCode::OK,
                &json!({"version": OLLAMA_VERSION, "arcane": env!("CARGO_PKG_VERSION")}),
            ),
            Endpoint::Tags => models::tags(&catalog).await,
            Endpoint::Ps => models::ps(&catalog).await,
            _ => refused(endpoint).response(),
        };
    }
    let (parts, body) = request.into_parts();
    let bytes = match read_body(body).await {
        Ok(bytes) => bytes,
        Err(error) => return error.response(),
    };
    let parsed = match parse_object(&bytes) {
        Ok(parsed) => parsed,
        Err(error) => return error.response(),
    };
    // `/api/show` and the older clients say `name`, the rest `model`.
    let asked = parsed
        .get("model")
        .or_else(|| parsed.get("name"))
        .cloned()
        .unwrap_or(Value::Null);
    let facts = match names::resolve(&asked, &catalog) {
        Ok(facts) => facts.clone(),
        Err(error) => match names::resolve(&asked, &everything) {
            Ok(denied) => return OllamaError::denied(&caller, &denied.id).response(),
            Err(_) => return error.response(),
        },
    };
    if facts.kind == arcane_localai::Engine::Ollama {
        // A real Ollama: its own API, the request as it came.
        let request = Request::from_parts(parts, arcane_core::upstream::full(bytes));
        return crate::passthrough::forward(host, Some(upstream), client, request).await;
    }
    let asked = asked.as_str().unwrap_or_default().to_string();
    let exchange = Exchange {
        host,
        upstream,
        client,
        facts: &facts,
        asked: &asked,
        caller,
        deadline,
    };
    let result = match endpoint {
        Endpoint::Show => models::show(&facts, &asked).await,
        Endpoint::Chat => chat::handle(&exchange, &parsed).await,
        Endpoint::Generate => generate::handle(&exchange, &parsed).await,
        Endpoint::Embed => embed::handle(&exchange, &parsed, embed::Form::Embed).await,
        Endpoint::Embeddings => embed::handle(&exchange, &parsed, embed::Form::Embeddings).await,
        _ => Err(refused(endpoint)),
    };
    result.unwrap_or_else(|error| error.response())
}

/// The refusal of an endpoint Arcane does not serve, naming what does the job.
pub fn refused(endpoint: Endpoint) -> OllamaError {
    let (endpoint, instead) = match endpoint {
        Endpoint::Pull => ("/api/pull", "register a model file with `arcane model add ID --file PATH` (or `--url URL`), then name it in a [[model]] table of `arcane.toml` and run `arcane reload`"),
        Endpoint::Push => ("/api/push", "Arcane serves local models and publishes none; copy the registered file (`arcane model list` shows its path)"),
        Endpoint::Create => ("/api/create", "add a [[model]] table to `arcane.toml` (its `model`, `args`, `keep_alive`) and run `arcane reload`"),
        Endpoint::Copy => ("/api/copy", "give the model another name with `aliases = [\"NAME\"]` in its [[model]] table of `arcane.toml`, then `arcane reload`"),
        Endpoint::Delete => ("/api/delete", "remove its [[model]] table from `arcane.toml` and run `arcane reload`; `arcane model remove ID` deletes a registered file"),
        _ => ("/api/", "this endpoint is not part of the translation"),
    };
    OllamaError::Refused { endpoint, instead }
}

/// The body, up to [`crate::request_model::MAX_BUFFERED`] bytes (images included).
async fn read_body(body: Incoming) -> Result<Bytes, OllamaError> {
    let limit = crate::request_model::MAX_BUFFERED;
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error)
            if error
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(OllamaError::Upstream {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                message: format!("the request body is larger than {limit} bytes"),
                retry_after: None,
            })
        }
        Err(_) => Err(OllamaError::BadRequest(
            "the request body could not be read".into(),
        )),
    }
}

/// The body as a JSON object (an empty body is an empty object).
pub fn parse_object(bytes: &[u8]) -> Result<serde_json::Map<String, Value>, OllamaError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(other) => Err(OllamaError::BadRequest(format!(
            "the request body must be a JSON object, not `{}`",
            kind_of(&other)
        ))),
        Err(error) => Err(OllamaError::BadRequest(format!(
            "the request body is not JSON: {error}"
        ))),
    }
}

/// A JSON value's kind, for messages.
pub(crate) fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// What one translated request needs: where to route it and what it asked for.
pub struct Exchange<'a> {
    host: &'a Host,
    upstream: &'a dyn Upstream,
    client: &'a EngineClient,
    /// The model it resolved to.
    pub facts: &'a ModelFacts,
    /// The name the client asked for (answers carry it).
    pub asked: &'a str,
    /// Who asks (the models it may use, its place in the queue).
    pub caller: arcane_core::keys::Principal,
    /// The client's deadline ([`crate::caller::deadline`]).
    pub deadline: Option<std::time::Duration>,
}

/// Checks a routed engine must pass before the request is sent.
#[derive(Debug, Default, Clone, Copy)]
pub struct Needs {
    /// `num_ctx` asked for: it must be at most the loaded context.
    pub context: Option<u64>,
    /// Images sent: the engine must have vision.
    pub vision: bool,
}

/// A translated request: the engine path and body, and how its answer is rewritten.
#[derive(Debug)]
pub struct Outgoing {
    /// The engine's OpenAI path.
    pub path: &'static str,
    /// The engine's request body.
    pub body: Value,
    /// Whether the answer streams (NDJSON) or comes whole (JSON).
    pub stream: bool,
}

impl Exchange<'_> {
    /// Routes the request through the gateway (loading the model on demand, applying
    /// `keep_alive`, holding the lease), checks `needs` against the engine, sends
    /// `outgoing` and rewrites the answer with the rewrite `make` builds from the load
    /// time; an engine error becomes Ollama's shape with the engine's status.
    pub async fn send(
        &self,
        keep_alive: Option<Value>,
        needs: Needs,
        outgoing: Outgoing,
        make: impl FnOnce(std::time::Duration) -> Box<dyn Rewrite>,
    ) -> Result<Response<HttpBody>, OllamaError> {
        let started = Instant::now();
        let Some(work) = self.host.accept_work() else {
            return Err(OllamaError::Upstream {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: "the Core host is shutting down".into(),
                retry_after: None,
            });
        };
        let wanted = RouteRequest {
            model: Some(self.facts.id.clone()),
            keep_alive,
            path: Some(outgoing.path.to_string()),
            caller: self.caller.clone(),
            deadline: self.deadline,
            queued: true,
        };
        let mut route = self
            .upstream
            .route(wanted.clone())
            .await
            .map_err(OllamaError::from_no_route)?;
        let load = started.elapsed();
        if needs.context.is_some() || needs.vision {
            let props = self.props(&route.access).await?;
            check_needs(&props, needs, &self.facts.id)?;
        }
        let body = bytes::Bytes::from(outgoing.body.to_string());
        let request = Request::post(outgoing.path)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(arcane_core::upstream::full(body.clone()))
            .map_err(|error| {
                OllamaError::BadRequest(format!("the request cannot be sent: {error}"))
            })?;
        let replay = crate::replay::Replay::of_built(&wanted, &request, body);
        let request =
            crate::passthrough::forwarded_request(&route.access, request).map_err(|_| {
                OllamaError::BadRequest(format!("`{}` cannot be forwarded", outgoing.path))
            })?;
        let answer = crate::passthrough::exchange(
            self.client,
            self.upstream,
            &mut route,
            request,
            Some(replay),
            Deadlines::GENERATION,
            &work,
        )
        .await
        .map_err(|response| OllamaError::Upstream {
            status: response.status(),
            message: format!("the engine of `{}` could not be reached", self.facts.id),
            retry_after: None,
        })?;
        let success = answer.status().is_success();
        let rewrite: Box<dyn Rewrite> = if success {
            make(load)
        } else {
            Box::new(reply::Whole::new(|bytes: &[u8]| {
                let body = serde_json::from_slice::<Value>(bytes)
                    .unwrap_or_else(|_| json!({"error": String::from_utf8_lossy(bytes)}));
                (
                    json!({"error": error_message(&body), "code": "OLLAMA_ENGINE"}),
                    None,
                )
            }))
        };
        let streams = success && outgoing.stream;
        let api = streams.then_some(crate::passthrough::StreamApi::JsonLines);
        let mut response = crate::passthrough::answer_rewritten(answer, route, work, rewrite, api);
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            HeaderValue::from_static(if streams {
                "application/x-ndjson"
            } else {
                "application/json; charset=utf-8"
            }),
        );
        Ok(response)
    }

    /// Routes the request (loading the model) and answers at once with `answer`, for
    /// Ollama's load and unload requests (an empty prompt or no messages).
    pub async fn load_only(
        &self,
        keep_alive: Option<Value>,
        answer: impl FnOnce(std::time::Duration) -> Value,
    ) -> Result<Response<HttpBody>, OllamaError> {
        let started = Instant::now();
        let mut route = self
            .upstream
            .route(RouteRequest {
                model: Some(self.facts.id.clone()),
                keep_alive,
                path: None,
                caller: self.caller.clone(),
                deadline: self.deadline,
                queued: false,
            })
            .await
            .map_err(OllamaError::from_no_route)?;
        let body = answer(started.elapsed());
        // The lease ends here, answered: a `keep_alive` of 0 unloads the model now.
        if let Some(lease) = route.lease.as_mut() {
            lease.answered(StatusCode::OK);
            lease.finished();
        }
        drop(route);
        Ok(crate::http::json_response(StatusCode::OK, &body))
    }

    /// The engine's `GET /props` (llama-server: its context and modalities).
    async fn props(&self, access: &EngineAccess) -> Result<Value, OllamaError> {
        let path = "/props";
        let failed = |why: String| OllamaError::Upstream {
            status: StatusCode::BAD_GATEWAY,
            message: format!(
                "`{}`'s engine did not describe itself: {why}",
                self.facts.id
            ),
            retry_after: None,
        };
        let request = access
            .request(Method::GET, path)
            .body(arcane_core::upstream::full(Bytes::new()))
            .map_err(|e| failed(e.to_string()))?;
        let response = self
            .client
            .send_to(access, request, Deadlines::QUICK, Peer::Engine)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let bytes = arcane_core::upstream::collect(response, &access.url_of(path), Peer::Engine)
            .await
            .map_err(|e| failed(e.to_string()))?;
        serde_json::from_slice(&bytes).map_err(|e| failed(e.to_string()))
    }
}

/// Checks `needs` against the engine's `/props`: the loaded context (a `num_ctx` up to
/// it is served; more is a 400 naming both), vision for images.
pub fn check_needs(props: &Value, needs: Needs, model: &str) -> Result<(), OllamaError> {
    if let Some(asked) = needs.context {
        let loaded = props["default_generation_settings"]["n_ctx"]
            .as_u64()
            .or_else(|| props["n_ctx"].as_u64());
        if let Some(loaded) = loaded.filter(|loaded| asked > *loaded) {
            return Err(OllamaError::ContextMismatch {
                model: model.to_string(),
                asked,
                loaded,
            });
        }
    }
    if needs.vision && props["modalities"]["vision"] != Value::Bool(true) {
        return Err(OllamaError::NoVision {
            model: model.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_have_ollamas_shape_and_status() {
        let unknown = OllamaError::UnknownModel {
            asked: "x".into(),
            known: "smol:latest".into(),
        };
        assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
        let body = unknown.body();
        assert!(
            body["error"].as_str().unwrap().contains("smol:latest"),
            "{body}"
        );
        assert_eq!(body["code"], "OLLAMA_MODEL_NOT_FOUND");
        let pull = refused(Endpoint::Pull);
        assert_eq!(pull.status(), StatusCode::NOT_IMPLEMENTED);
        assert!(pull.to_string().contains("arcane model add"), "{pull}");
        for endpoint in [
            Endpoint::Push,
            Endpoint::Create,
            Endpoint::Copy,
            Endpoint::Delete,
        ] {
            assert!(
                refused(endpoint).to_string().contains("arcane"),
                "{endpoint:?}"
            );
        }
    }

    #[test]
    fn error_messages_are_found_in_every_shape() {
        assert_eq!(error_message(&json!({"error": "plain"})), "plain");
        assert_eq!(
            error_message(&json!({"error": {"code": 400, "message": "openai"}})),
            "openai"
        );
        assert_eq!(error_message(&json!({"other": 1})), r#"{"other":1}"#);
    }

    #[test]
    fn bodies_must_be_objects() {
        assert!(parse_object(b"").unwrap().is_empty());
        assert!(matches!(
            parse_object(b"[1]"),
            Err(OllamaError::BadRequest(_))
        ));
        assert!(matches!(
            parse_object(b"{"),
            Err(OllamaError::BadRequest(_))
        ));
    }

    #[test]
    fn a_num_ctx_over_the_loaded_one_is_refused_naming_both_and_one_under_it_served() {
        let props = json!({"default_generation_settings": {"n_ctx": 2048}, "modalities": {"vision": false}});
        let needs = Needs {
            context: Some(8192),
            vision: false,
        };
        let error = check_needs(&props, needs, "smol").unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("8192") && text.contains("2048") && text.contains("arcane reload"),
            "{text}"
        );
        for served in [2048, 512] {
            let needs = Needs {
                context: Some(served),
                vision: false,
            };
            assert!(check_needs(&props, needs, "smol").is_ok(), "{served}");
        }
        let images = Needs {
            context: None,
            vision: true,
        };
        assert!(matches!(
            check_needs(&props, images, "smol"),
            Err(OllamaError::NoVision { .. })
        ));
    }
}
