//! Integration tests of `arcane-registry`: real files, real archives, real HTTP servers
//! on 127.0.0.1 and (where behaviour depends on it) the real `llama-server` and SmolLM2.

// Tests drive real processes and files directly (start, signal, rename): the fences
// in clippy.toml guard the libraries, not the tests that check them.
#![allow(clippy::disallowed_methods)]

mod support;

mod archives;
mod downloads;
mod models;
mod runtimes;
mod sd;
