//! Integration tests of the supervisor: protocol-faithful fakes (`tests/fakes/`) for
//! faults and for Ollama, and the real `llama-server` + SmolLM2 for the main path.

// Tests drive real processes and files directly (start, signal, rename): the fences
// in clippy.toml guard the libraries, not the tests that check them.
#![allow(clippy::disallowed_methods)]

mod support;

mod decide;
mod lifecycle;
mod ollama;
mod orphans;
mod real;
mod watchdog;
