//! The Arcane Core host: the one process an application talks to.
//!
//! This crate owns the service registry and lifecycle, the `arcane/1` protocol and its
//! stdio transport (`Content-Length` framing), the one HTTP client every exchange with
//! an engine or a host goes through ([`upstream`]), the built-in local-AI services
//! (`localai.*`, `llama.*`, `ollama.*`: [`localai`]) and the routing contract the
//! front door and the model gateway meet at ([`route`]). It does not supervise
//! processes itself (that is `arcane-localai`) and never prints, exits or reads the
//! environment.
//!
//! The crates above it, each with one job and no import running backwards:
//! `arcane-gateway` (many models, each on its own device, routed by model and path)
//! implements [`route::Upstream`]; `arcane-front-door` (the loopback HTTP listener and
//! its admission, the route table, the passthrough, Ollama's API, the dashboard and the
//! web root) serves a [`Host`] and calls an [`route::Upstream`]; `arcane-host` starts
//! them from `arcane.toml`.
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
//! * [`stdio::serve`]: the stdio transport; [`endpoint`]: `core.json`, the stable port
//!   and the one-owner-per-workspace lock; [`client`]: a small client for the CLI's
//!   `arcane status` and `arcane chat`; [`bridge`]: stdio to a host over HTTP.
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
//! Its benchmarks run through the front door: `cargo bench -p arcane-front-door`.
#![warn(missing_docs)]
#![doc = include_str!("../../../docs/protocol.md")]

pub mod bridge;
pub mod client;
pub mod dispatch;
pub mod duration;
pub mod endpoint;
mod error;
pub mod framing;
pub mod host;
pub mod keys;
pub mod localai;
pub mod logs;
pub mod protocol;
pub mod route;
pub mod selection;
pub mod service;
pub mod stdio;
pub mod supervised;
pub mod upstream;

pub use error::{Error, FrameProblem, Peer, TimeoutPhase, Unready};
pub use host::{AppInfo, Connection, Host, HostBuilder, HostState, Prepared, ShutdownHandle, Work};
pub use service::{
    BoxError, BoxFuture, Lifetime, MethodResult, MethodSpec, RequestContext, Service,
    ServiceContext, ServiceState,
};
