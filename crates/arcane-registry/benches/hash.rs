//! Hashing throughput of `arcane_registry::sha256_file` (what `model add` and every
//! verification spend their time on) against `sha256sum` on the same file, in the same
//! run, with their ratio.
//!
//! Run: `ARCANE_TEST_MODEL=path/to/model.gguf cargo bench -p arcane-registry --bench hash`
//! (or pass the file as the first argument). Without either, a 256 MiB temporary file
//! of pseudo-random bytes is used. Each side runs three times after a warm-up read (so
//! both hash from the page cache); the best run counts.

#![allow(clippy::disallowed_methods)] // it runs `sha256sum` as its baseline

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use arcane_report::CancelToken;

#[allow(clippy::print_stdout)]
fn main() {
    // The benchmark takes its input from the command line or the environment.
    #[allow(clippy::disallowed_methods)]
    let from_env = std::env::var_os("ARCANE_TEST_MODEL").map(PathBuf::from);
    let from_args = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .map(PathBuf::from);
    let _temp;
    let path = match from_args.or(from_env) {
        Some(path) => path,
        None => {
            let dir = tempfile::tempdir().expect("temp dir");
            let path = dir.path().join("random.bin");
            let mut state = 0x9e37_79b9_7f4a_7c15u64;
            let data: Vec<u8> = (0..256usize << 20)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            std::fs::write(&path, data).expect("write temp file");
            _temp = dir;
            path
        }
    };
    let size = std::fs::metadata(&path).expect("input file").len();
    let megabytes = size as f64 / 1e6;
    // Warm the page cache so both sides read from memory.
    std::fs::read(&path).expect("read input");

    let cancel = CancelToken::new();
    let mut ours = Duration::MAX;
    let mut our_digest = String::new();
    for _ in 0..3 {
        let started = Instant::now();
        our_digest = arcane_registry::sha256_file(&path, &cancel, &mut |_, _| {}).expect("hash");
        ours = ours.min(started.elapsed());
    }
    let mut theirs = Duration::MAX;
    let mut their_digest = String::new();
    for _ in 0..3 {
        let started = Instant::now();
        let output = Command::new("sha256sum")
            .arg(&path)
            .output()
            .expect("run sha256sum");
        theirs = theirs.min(started.elapsed());
        their_digest = String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_string();
    }
    assert_eq!(our_digest, their_digest, "digests differ");
    let ours_mbps = megabytes / ours.as_secs_f64();
    let theirs_mbps = megabytes / theirs.as_secs_f64();
    println!("file:          {} ({:.1} MB)", path.display(), megabytes);
    println!(
        "sha256_file:   {ours_mbps:8.1} MB/s  ({:.3} s)",
        ours.as_secs_f64()
    );
    println!(
        "sha256sum:     {theirs_mbps:8.1} MB/s  ({:.3} s)",
        theirs.as_secs_f64()
    );
    println!(
        "ratio:         {:.2}x (sha256_file / sha256sum)",
        ours_mbps / theirs_mbps
    );
}
