//! Tests of `arcane serve`.
