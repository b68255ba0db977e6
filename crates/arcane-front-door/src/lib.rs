//! Arcane's one HTTP front door: everything a client reaches over loopback HTTP goes
//! through here, behind one token.
//!
//! * [`http`]: the listener and its admission (Host, Origin, token or application key:
//!   [`origins`], [`limits`], [`scopes`]), the `arcane/1` endpoints (`/v1/rpc`, `/v1/control`, `/v1/events`)
//!   and the dispatch of everything else through the route table ([`router`]).
//! * [`passthrough`]: the engines' own APIs, forwarded unchanged (with the gateway,
//!   routed by the model a request names: [`request_model`], renamed and measured line
//!   by line: [`response_lines`]).
//! * [`replay`]: a request whose engine died before answering is sent once more.
//! * [`apis`]: the APIs translated onto the engines' (Ollama's `/api/*`).
//! * [`ui`]: the dashboard and its login; [`web`]: an application's packaged web root;
//!   [`logs`]: `GET /v1/logs`.
//! * [`server`]: the wiring of one served host (its transports, the log book, the
//!   first start), shared by `arcane serve` and the host library.
//!
//! It sits above `arcane-core` (the host, the HTTP client, the routing contract
//! [`arcane_core::route`]) and `arcane-gateway` (one [`arcane_core::route::Upstream`]),
//! and nothing below imports it.
//!
//! Benchmarks: `cargo bench -p arcane-front-door --bench host` (with `LLAMA_SERVER` and
//! `ARCANE_TEST_MODEL` set for the passthrough part); `--bench ollama_api` compares
//! Ollama's `/api/chat` with the same request on `/v1/chat/completions`; `--bench
//! gateway`, `--bench bridge` and `--bench overload` measure the gateway, the stdio
//! bridge and a busy engine.
#![warn(missing_docs)]

pub mod apis;
pub mod caller;
pub mod http;
pub mod limits;
pub mod logs;
pub mod origins;
pub mod passthrough;
pub mod replay;
pub mod request_model;
pub mod response_lines;
pub mod router;
pub mod scopes;
pub mod server;
pub mod ui;
pub mod web;
