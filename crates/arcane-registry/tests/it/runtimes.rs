//! runtimes tests.
