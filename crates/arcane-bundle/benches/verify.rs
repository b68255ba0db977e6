//! `bundle verify` throughput against `sha256sum` over the same files, same run.
//!
//! Builds a bundle of 8 × 16 MiB files (plus the launcher) in a temporary directory,
//! warms the page cache, then times, best of 3 each: `sha256sum` over every listed
//! file (one process, as a person would run it), `verify` on one thread, and `verify`
//! on every core (the default). Prints throughput and the ratio against `sha256sum`
//! (target: ≥ 1.5× on 2 cores). `verify` does strictly more than `sha256sum`: the
//! manifest, path rules, the no-follow walk, link counts, sizes and modes.
//!
//! Run: `cargo bench -p arcane-bundle --bench verify`.
#![allow(clippy::print_stdout, clippy::disallowed_methods)] // it runs `sha256sum` as its baseline

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use arcane_bundle::manifest::{
    AppInfo, Builder, FileEntry, LaunchDefaults, Manifest, Target, MANIFEST_NAME,
};
use arcane_bundle::{verify, VerifyOptions};
use arcane_report::{CancelToken, NullSink};
use sha2::{Digest, Sha256};

const FILES: usize = 8;
const FILE_SIZE: usize = 16 << 20;
const ROUNDS: usize = 3;

fn main() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let root = dir.path().join("bundle");
    let paths = write_bundle(&root);
    let total: u64 = paths
        .iter()
        .map(|p| {
            std::fs::metadata(root.join(p))
                .map(|m| m.len())
                .unwrap_or(0)
        })
        .sum();

    // Warm the page cache so both sides read from memory.
    sha256sum(&root, &paths);

    let baseline = best(|| sha256sum(&root, &paths));
    let one = best(|| run_verify(&root, 1));
    let all = best(|| run_verify(&root, 0));
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let rate = |d: Duration| total as f64 / d.as_secs_f64() / (1 << 20) as f64;
    println!(
        "bundle verify benchmark: {} files, {} MiB, {cores} cores",
        paths.len(),
        total >> 20
    );
    println!(
        "  sha256sum            {:>8.1} ms  {:>8.1} MiB/s",
        baseline.as_secs_f64() * 1e3,
        rate(baseline)
    );
    println!(
        "  verify (1 thread)    {:>8.1} ms  {:>8.1} MiB/s  ratio {:.2}x",
        one.as_secs_f64() * 1e3,
        rate(one),
        baseline.as_secs_f64() / one.as_secs_f64()
    );
    println!(
        "  verify (all cores)   {:>8.1} ms  {:>8.1} MiB/s  ratio {:.2}x (target >= 1.5x)",
        all.as_secs_f64() * 1e3,
        rate(all),
        baseline.as_secs_f64() / all.as_secs_f64()
    );
}

fn best(mut f: impl FnMut()) -> Duration {
    (0..ROUNDS)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn run_verify(root: &Path, threads: usize) {
    let mut options = VerifyOptions::default();
    if threads > 0 {
        options = options.threads(threads);
    }
    let report = verify(root, &options, &NullSink, &CancelToken::new()).expect("verify runs");
    assert!(report.is_clean(), "{:?}", report.failures);
}

fn sha256sum(root: &Path, paths: &[String]) {
    let status = Command::new("sha256sum")
        .current_dir(root)
        .args(paths)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run sha256sum");
    assert!(status.success());
}

fn write_bundle(root: &Path) -> Vec<String> {
    let mut entries = Vec::new();
    let mut write = |path: &str, content: &[u8], exec: bool| {
        let full = root.join(path);
        std::fs::create_dir_all(full.parent().expect("parent")).expect("create directory");
        std::fs::write(&full, content).expect("write file");
        std::fs::set_permissions(
            &full,
            std::fs::Permissions::from_mode(if exec { 0o755 } else { 0o644 }),
        )
        .expect("chmod");
        entries.push(FileEntry {
            path: path.to_string(),
            size: content.len() as u64,
            sha256: hex::encode(Sha256::digest(content)),
            exec,
        });
    };
    write("bin/arcane", b"#!/bin/sh\n", true);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..FILES {
        let content: Vec<u8> = (0..FILE_SIZE)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        write(&format!("app/data/part-{i}.bin"), &content, false);
    }
    entries.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    let paths = entries.iter().map(|e| e.path.clone()).collect();
    let manifest = Manifest {
        schema_version: 1,
        kind: "arcane-bundle".into(),
        bundle_id: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9".into(),
        builder: Builder {
            name: "arcane".into(),
            version: "bench".into(),
        },
        app: AppInfo {
            id: "bench".into(),
            name: "bench".into(),
            version: "0".into(),
            start: None,
        },
        target: Target::host(),
        runtimes: Vec::new(),
        models: Vec::new(),
        libraries: Default::default(),
        launch: LaunchDefaults::default(),
        files: entries,
    };
    std::fs::write(root.join(MANIFEST_NAME), manifest.to_bytes()).expect("write manifest");
    paths
}
