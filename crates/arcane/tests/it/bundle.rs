//! Tests of `arcane bundle`.
