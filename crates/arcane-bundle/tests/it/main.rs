//! Integration tests of `arcane-bundle`: real directories, real files, real tampering.

// Tests drive real processes and files directly (start, signal, rename): the fences
// in clippy.toml guard the libraries, not the tests that check them.
#![allow(clippy::disallowed_methods)]

mod build;
mod fixture;
mod launch;
mod pinned;
mod verify;
