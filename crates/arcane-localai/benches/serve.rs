//! Start-to-ready benchmark (being written).
fn main() {}
