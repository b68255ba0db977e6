//! Tests of `arcane core`.
