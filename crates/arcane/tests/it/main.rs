//! The `arcane` binary's integration tests: each module drives the real binary (and,
//! where behaviour depends on them, the real `llama-server` and SmolLM2 model).

mod support;

mod bundle;
mod command_kind;
mod core;
mod devices;
mod front_door;
mod gateway;
mod hardening;
mod lock;
mod onnx;
mod registry;
mod router;
mod serve;
