//! The other APIs the front door speaks beside the engines' own, each translated onto
//! the engines' OpenAI endpoints for every gateway model: one module per API, its rows
//! in [`ROWS`] and its requests answered through [`handle`]. The route table
//! ([`crate::router::TABLE`]) and the HTTP server ([`crate::http`]) reach them only
//! through this table, so a new API is a module here and a row in each of the three
//! items below.

use hyper::body::Incoming;
use hyper::{Request, Response};

use crate::host::Host;
use crate::passthrough::Upstream;
use crate::router::Row;
use crate::upstream::{EngineClient, HttpBody};

pub mod ollama;

/// One endpoint of a translated API (the handler of its row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// Ollama's API (`/api/*`): [`ollama`].
    Ollama(ollama::Endpoint),
}

/// The rows of every translated API, before the engines' own paths (so a llama.cpp
/// model answers `/api/chat` too).
pub const ROWS: &[Row] = ollama::ROWS;

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
