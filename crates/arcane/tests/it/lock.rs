//! Tests of `arcane lock`.
