//! models tests.
