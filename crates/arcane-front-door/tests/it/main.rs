//! Integration tests of the Core host: the host itself (services, ids, cancellation,
//! replay, shutdown), the stdio transport, the HTTP transport (auth, RPC, SSE,
//! passthrough) and, with the real `llama-server` and SmolLM2, the local-AI service.

// Tests drive real processes and files directly (start, signal, rename): the fences
// in clippy.toml guard the libraries, not the tests that check them.
#![allow(clippy::disallowed_methods)]

mod support;

mod drain;
mod host;
mod http;
mod llama;
mod ollama;
mod router;
mod stdio;
mod ui;
