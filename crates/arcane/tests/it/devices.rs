//! Tests of `arcane devices`.
