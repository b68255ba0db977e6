//! Supervision of llama.cpp and Ollama servers: probe first, adopt or own, exact device,
//! readiness, events, clean stop, no orphans.
//!
//! # What this crate owns
//!
//! * [`Supervisor`]: starts one engine from an [`EngineConfig`] and returns a ready
//!   [`Server`]: [`Server::Adopted`] when a healthy server already answered (Arcane
//!   never signals it; [`AdoptedServer`] has no stop method), or [`Server::Owned`] when
//!   nothing listened on a loopback host and Arcane spawned the configured executable.
//! * The decision after the first probe ([`probe::decide`]), the engine command line
//!   (in the SDK's order), readiness (listening line + `/health` polling with backoff,
//!   startup and load-stall timeouts), crash detection and restart, and stopping
//!   (SIGTERM to the process group, grace, SIGKILL).
//! * No orphans: each owned child has its own process group and a parent-death signal
//!   (Linux), and an ownership record under `<workspace>/.arcane/engines/` lets the next
//!   start stop a server a previous Arcane provably owned.
//!
//! It does not own device discovery (`arcane-devices`), the runtime and model registry
//! (`arcane-registry`), or the Core host's protocol (`arcane-core`).
//!
//! # Events
//!
//! Every state change goes through one table ([`transition`]: which [`Change`] is
//! allowed in which [`EngineState`]; the host and the gateway use the same one) and is
//! published exactly once as `local-ai.server.<state>` (a supervisor enters
//! `starting`, `loading`, `ready`, `error` and `stopped`) with
//! a [`ServerSnapshot`] as data (camelCase:
//! `{id, engine, url, state, available, owned, managed, external, execution, error, pid,
//! version, restarts, stopStep, exit}`). Process events: `process.starting {command,
//! args, cwd}`, `process.stdout|stderr {pid, line}`, `process.cancellation.requested
//! {pid}`, `process.cancellation.escalated {pid, signal}`, `process.exited {pid, code,
//! signal, stopStep}`, `process.orphan.stopped {id, pid, executable, port,
//! previousOwner, stopStep}`. A change the table refuses (a bug) is not applied and is
//! reported as `local-ai.transition.refused {id, engine, from, change, message}`.
//!
//! Readiness is decided in one place, [`probe::classify`] (through [`probe::probe`]):
//! the supervisor's first probe, its readiness polling, and any adopter use it.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use arcane_localai::{Engine, EngineConfig, Server, Supervisor};
//! use arcane_report::{CancelToken, NullSink};
//!
//! # async fn demo() -> Result<(), arcane_localai::Error> {
//! let mut config = EngineConfig::new(Engine::LlamaCpp);
//! config.url = "http://127.0.0.1:8080".into();
//! config.model = Some("/models/smollm2.gguf".into());
//! config.device = Some("cpu".into());
//! config.executable = Some("/opt/llama/llama-server".into());
//! let supervisor = Supervisor::new("/var/lib/arcane", Arc::new(NullSink));
//! let server = supervisor.start(config, CancelToken::new()).await?;
//! println!("ready at {}", server.url());
//! if let Server::Owned(owned) = &server {
//!     let report = owned.stop().await;
//!     println!("stopped by {:?}", report.step);
//! }
//! # Ok(()) }
//! ```
//!
//! # Benchmark
//!
//! `LLAMA_SERVER=… ARCANE_TEST_MODEL=… cargo bench -p arcane-localai --bench serve`
//! compares start-to-ready of `arcane serve` with raw `llama-server` polled directly.
#![warn(missing_docs)]

mod command;
mod config;
mod endpoint;
mod error;
mod execution;
mod http;
mod listen;
pub mod probe;
mod process;
pub mod records;
mod state;
mod supervisor;

pub use arcane_workspace::{
    command_template, serves_path, EngineKind, ForwardedMethod, ModelFormat, RuntimeLibrary,
    Starts, Takes,
};
pub use command::{DeviceLaunch, EngineCommand, NONCE_VARIABLE};
pub use config::{Engine, EngineConfig, OwnedListen, RestartPolicy};
pub use endpoint::{ApiKey, ConnectFailure, Endpoint, EngineAddress, EngineStream};
pub use error::Error;
pub use execution::{check_target, SharedDeviceSource};
pub use listen::private_run_dir;
pub use process::{ExitInfo, StopStep};
pub use state::{
    is_valid_transition, transition, Change, EngineState, InvalidTransition, ServerSnapshot,
    Subject,
};
pub use supervisor::{
    AdoptedServer, ExitHook, OwnedServer, Server, StateObserver, StopReport, Supervisor,
    TRANSITION_REFUSED,
};

/// Re-exported so callers can set [`EngineConfig::backend`] without another dependency.
pub use arcane_devices::Backend;
