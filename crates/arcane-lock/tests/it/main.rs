//! Integration tests of `arcane-lock`: one module per area.

// Tests drive real processes and files directly (start, signal, rename): the fences
// in clippy.toml guard the libraries, not the tests that check them.
#![allow(clippy::disallowed_methods)]

mod support;

mod basics;
mod nested;
mod paths;
mod processes;
mod renewal;
mod stale;
mod wait;
mod warm;
