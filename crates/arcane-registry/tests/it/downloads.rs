//! downloads tests.
