//! Tests of `arcane registry`.
