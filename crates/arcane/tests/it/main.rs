//! The `arcane` binary's integration tests: each module drives the real binary (and,
//! where behaviour depends on them, the real `llama-server` and SmolLM2 model).

// Tests drive real processes and files directly (start, signal, rename): the fences
// in clippy.toml guard the libraries, not the tests that check them.
#![allow(clippy::disallowed_methods)]

mod support;

mod admission;
mod bridge;
mod browser;
mod bundle;
mod clients_doc;
mod command_kind;
mod core;
mod cpus;
mod devices;
mod doors;
mod estimate;
mod faults;
mod front_door;
mod gateway;
mod hardening;
mod hostile_files;
mod images;
mod keys;
mod local_users;
mod lock;
mod logs;
mod ollama_api;
mod onnx;
mod registry;
mod replay;
mod router;
mod serve;
mod speech;
mod ui;
mod uploads;
mod web;
