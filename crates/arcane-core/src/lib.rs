//! The Arcane Core host: the one process an application talks to.
//!
//! This crate owns the service registry and lifecycle, the `arcane/1` protocol, its
//! transports (stdio `Content-Length` framing and authenticated loopback HTTP with a
//! Server-Sent-Events stream), the OpenAI-compatible passthrough to the ready
//! llama.cpp engine, and the built-in local-AI services (`localai.*`, `llama.*`,
//! `ollama.*`). It does not supervise processes itself (that is `arcane-localai`) and
//! never prints, exits or reads the environment.
//!
//! # Main types
//!
//! * [`Host`] / [`HostBuilder`]: services with states
//!   (`registered|starting|ready|failed|draining|closed`), dispatch, connections with
//!   their own request-id spaces, event routing, replay, the draining shutdown.
//! * [`Service`]: what plugs into the host (name, methods with a [`Lifetime`],
//!   `start`, `call`, `drain`, `dispose`, `replay`).
//! * [`protocol`]: the frames, documented on their types; [`framing`]: stdio framing.
//! * [`dispatch::Dispatch`]: the one `arcane/1` endpoint both transports serve (the
//!   [`Host`], or a host in another process).
//! * [`stdio::serve`], [`http::serve`]: the transports; [`endpoint`]: `core.json`, the
//!   stable port and the one-owner-per-workspace lock; [`client`]: a small client for
//!   the CLI's `arcane status` and `arcane chat`.
//!
//! The full protocol reference is below (from `docs/protocol.md`).
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use arcane_core::{AppInfo, Host, protocol::Request};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let host = Host::builder(AppInfo::default()).build();
//! host.start();
//! let connection = host.connect("example");
//! let response = connection
//!     .dispatch(Request { id: "1".into(), method: "system.ping".into(), parameters: serde_json::json!({}) })
//!     .await;
//! assert!(response.is_ok());
//! host.close().await.unwrap();
//! # });
//! ```
//!
//! Benchmarks: `cargo bench -p arcane-core --bench host` (with `LLAMA_SERVER` and
//! `ARCANE_TEST_MODEL` set for the passthrough part); `--bench ollama_api` compares
//! Ollama's `/api/chat` with the same request on `/v1/chat/completions`.
#![warn(missing_docs)]
#![doc = include_str!("../../../docs/protocol.md")]

pub mod apis;
pub mod bridge;
pub mod client;
pub mod dispatch;
pub mod duration;
pub mod endpoint;
mod error;
pub mod framing;
pub mod gateway;
pub mod host;
pub mod http;
pub mod limits;
pub mod localai;
pub mod logs;
pub mod origins;
pub mod passthrough;
pub mod protocol;
pub mod request_model;
pub mod response_lines;
pub mod router;
pub mod selection;
pub mod server;
pub mod service;
pub mod stdio;
pub mod supervised;
pub mod ui;
pub mod upstream;
pub mod web;

pub use error::{Error, FrameProblem, Peer, TimeoutPhase, Unready};
pub use host::{AppInfo, Connection, Host, HostBuilder, HostState, Prepared, ShutdownHandle, Work};
pub use service::{
    BoxError, BoxFuture, Lifetime, MethodResult, MethodSpec, RequestContext, Service,
    ServiceContext, ServiceState,
};
