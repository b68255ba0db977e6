//! Integration tests of the supervisor: protocol-faithful fakes (`tests/fakes/`) for
//! faults and for Ollama, and the real `llama-server` + SmolLM2 for the main path.

mod support;

mod decide;
mod lifecycle;
mod ollama;
mod orphans;
mod real;
