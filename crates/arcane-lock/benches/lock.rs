//! Benchmark (placeholder).
fn main() {}
