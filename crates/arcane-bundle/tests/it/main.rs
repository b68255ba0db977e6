//! Integration tests of `arcane-bundle`: real directories, real files, real tampering.

mod fixture;
mod verify;
