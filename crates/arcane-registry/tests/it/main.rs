//! Integration tests of `arcane-registry`: real files, real archives, real HTTP servers
//! on 127.0.0.1 and (where behaviour depends on it) the real `llama-server` and SmolLM2.

mod support;

mod archives;
mod downloads;
mod models;
mod runtimes;
