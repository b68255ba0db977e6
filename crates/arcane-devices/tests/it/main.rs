//! Integration tests of `arcane-devices`: fixture inventories through the public API,
//! the real probe of this machine, and the placement check.

// Tests drive real processes and files directly (start, signal, rename): the fences
// in clippy.toml guard the libraries, not the tests that check them.
#![allow(clippy::disallowed_methods)]

mod catalog;
mod placement;
mod probe;
mod resolve;

use std::path::PathBuf;

use arcane_devices::Catalog;

/// The path of a fixture inventory.
pub fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A fixture inventory, loaded through the public loader.
pub fn fixture(name: &str) -> Catalog {
    Catalog::from_inventory_file(&fixture_path(name))
        .unwrap_or_else(|e| panic!("fixture {name} does not load: {e:?}"))
}
