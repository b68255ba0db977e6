//! The other APIs the front door speaks beside the engines' own, each translated onto
//! the engines' OpenAI endpoints for every gateway model: one module per API, its rows
//! in [`ROWS`] and its requests answered through [`handle`]. The route table
//! ([`crate::router::TABLE`]) and the HTTP server ([`crate::http`]) reach them only
//! through this table, so a new API is a module here and a row in each of the three
//! items below.

use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::Value;

use crate::passthrough::Upstream;
use crate::router::Row;
use arcane_core::host::Host;
use arcane_core::upstream::{EngineClient, HttpBody};

pub mod anthropic;
pub mod ollama;

/// One endpoint of a translated API (the handler of its row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// Ollama's API (`/api/*`): [`ollama`].
    Ollama(ollama::Endpoint),
}

/// The inference paths of every translated API, by API name: what an `inference` key
/// may call there ([`crate::scopes`]).
pub const INFERENCE_PATHS: &[(&str, &[&str])] = &[("Ollama", ollama::INFERENCE_PATHS)];

/// The rows of every translated API, before the engines' own paths (so a llama.cpp
/// model answers `/api/chat` too).
pub const ROWS: &[Row] = ollama::ROWS;

/// An API's error body, made from a stable code and a message.
type ErrorShape = fn(&str, &str) -> Value;

/// Each API's error shape: a path under the prefix gets errors in the body its function
/// makes.
const ERROR_SHAPES: &[(&str, ErrorShape)] = &[
    (ollama::PREFIX, ollama::error_body),
    (anthropic::PREFIX, anthropic::error_body),
];

/// The body of an error the front door answers itself for `path` (a refusal of the
/// token, `Host` or `Origin`; an unknown path or method) in the shape of the API the
/// path belongs to, so that API's clients can read it; `None` outside every API.
pub fn error_body(path: &str, code: &str, message: &str) -> Option<Value> {
    ERROR_SHAPES
        .iter()
        .find(|(prefix, _)| path.starts_with(prefix))
        .map(|(_, body)| body(code, message))
}

/// For a path no row serves that a translated API's client reaches when it is given the
/// OpenAI base URL (`…/v1`) instead of the host's root: the API's name and the path it
/// meant, for a 404 that says what to change.
pub fn misplaced(path: &str) -> Option<(&'static str, &str)> {
    ollama::meant(path).map(|meant| ("Ollama", meant))
}

/// Answers a request of `endpoint`'s API.
pub async fn handle(
    host: &Host,
    upstream: &dyn Upstream,
    client: &EngineClient,
    endpoint: Endpoint,
    request: Request<Incoming>,
) -> Response<HttpBody> {
    match endpoint {
        Endpoint::Ollama(endpoint) => {
            ollama::handle(host, upstream, client, endpoint, request).await
        }
    }
}
