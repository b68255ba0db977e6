//! Integration tests of the Core host: the host itself (services, ids, cancellation,
//! replay, shutdown), the stdio transport, the HTTP transport (auth, RPC, SSE,
//! passthrough) and, with the real `llama-server` and SmolLM2, the local-AI service.

mod support;

mod drain;
mod host;
mod http;
mod llama;
mod ollama;
mod router;
mod stdio;
