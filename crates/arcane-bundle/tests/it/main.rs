//! Integration tests of `arcane-bundle`: real directories, real files, real tampering.

mod build;
mod fixture;
mod launch;
mod verify;
