//! How much resolution costs on top of a bare catalog lookup.
//!
//! Run: `cargo bench -p arcane-devices --bench resolve`. Prints the time per resolve
//! of a GPU target against a 9-device inventory, the time per bare `Catalog::device`
//! lookup plus clone (the baseline, measured in the same run), and their ratio.
//! Resolution clones the catalog once per launch by design (it runs afresh), so the
//! ratio shows what "afresh" costs when the source is a fixed inventory.
#![allow(clippy::print_stdout)]

use std::hint::black_box;
use std::time::Instant;

use arcane_devices::{resolve, Backend, Catalog, ResolveRequest};

fn inventory() -> Catalog {
    let mut devices = vec![serde_json::json!({
        "deviceId": "cpu", "identitySource": "host-cpu", "kind": "cpu", "vendor": "amd",
        "name": "AMD EPYC", "present": true, "cores": 64, "logicalProcessors": 128
    })];
    for index in 0..8 {
        let uuid = format!("GPU-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f6071{index}");
        devices.push(serde_json::json!({
            "deviceId": format!("nvidia-{}", uuid.to_ascii_lowercase()),
            "identitySource": "nvml-uuid", "kind": "gpu", "vendor": "nvidia",
            "name": "NVIDIA H100 80GB HBM3", "present": true,
            "addresses": {"uuid": uuid, "pci": format!("0000:{:02x}:00.0", 0x17 + index)},
            "dedicatedMemoryMiB": 81559, "driverVersion": "560.35.03"
        }));
    }
    let document = serde_json::json!({
        "schemaVersion": 1, "platform": "linux", "state": "ready", "devices": devices, "issues": []
    });
    Catalog::from_json(&document.to_string()).unwrap_or_else(|e| panic!("inventory: {e}"))
}

fn per_iteration(iterations: u32, mut body: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..iterations {
        body();
    }
    start.elapsed().as_secs_f64() / f64::from(iterations)
}

fn main() {
    let catalog = inventory();
    let target = "nvidia-gpu-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60717";
    let request = ResolveRequest {
        target: Some(target.to_string()),
        runtime_backend: Backend::Cuda,
        requested_backend: Backend::Auto,
    };
    let iterations = 20_000;
    // Warm up both paths.
    per_iteration(1_000, || {
        black_box(resolve(black_box(&request), &catalog).ok());
    });
    let baseline = per_iteration(iterations, || {
        black_box(catalog.device(black_box(target)).cloned());
    });
    let resolved = per_iteration(iterations, || {
        black_box(resolve(black_box(&request), &catalog).ok());
    });
    println!(
        "baseline (lookup + clone of one device): {:.2} µs",
        baseline * 1e6
    );
    println!(
        "resolve (fresh catalog copy + plan):     {:.2} µs",
        resolved * 1e6
    );
    println!(
        "ratio resolve / baseline:                {:.1}x",
        resolved / baseline
    );
}
