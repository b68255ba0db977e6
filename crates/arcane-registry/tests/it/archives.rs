//! archives tests.
