//! Hostile files through the real binary (issue 19 §9): a GGUF whose metadata nests
//! arrays 50,000 deep, and a small runtime archive with a matching SHA-256 that expands
//! far past its size, each refused with a clean error that leaves nothing registered or
//! installed, never a crash.

use std::path::Path;
use std::process::Command;

use crate::support::*;

/// A GGUF v3 file (about 600 KB) whose one metadata key holds an array nested `depth`
/// levels deep, with one small F32 tensor and its data.
fn deeply_nested_gguf(depth: usize) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&1u64.to_le_bytes());
    out.extend_from_slice(&1u64.to_le_bytes());
    let key = "evil.nest";
    out.extend_from_slice(&(key.len() as u64).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&9u32.to_le_bytes());
    for _ in 1..depth {
        out.extend_from_slice(&9u32.to_le_bytes());
        out.extend_from_slice(&1u64.to_le_bytes());
    }
    out.extend_from_slice(&4u32.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    let name = "token_embd.weight";
    out.extend_from_slice(&(name.len() as u64).to_le_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&16u64.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.resize(out.len().div_ceil(32) * 32 + 64, 0);
    out
}

#[test]
fn model_add_of_a_gguf_nesting_arrays_50000_deep_fails_cleanly_not_with_a_crash() {
    // Issue 19 §9: this file overflowed the stack in `model add` (exit 134).
    let ws = TestWorkspace::new();
    let file = ws.path().join("deep.gguf");
    let bytes = deeply_nested_gguf(50_000);
    assert!(bytes.len() > 590_000);
    std::fs::write(&file, &bytes).unwrap();
    let out = run(ws
        .arcane()
        .args(["--output", "json", "model", "add", "deep", "--file"])
        .arg(&file));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    insta::assert_snapshot!(
        "model_add_deeply_nested_gguf_json",
        ws.redactions().json(&json(&out))
    );
    let out = run(ws.arcane().args(["--output", "json", "model", "list"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["models"], serde_json::json!([]));
}

#[test]
fn runtime_install_of_a_small_archive_expanding_past_the_limit_fails_and_leaves_nothing() {
    // Issue 19 §9: a 2 MB zip with a matching SHA-256 expanded to 2.1 GB.
    let ws = TestWorkspace::new();
    let release = ws.path().join("release");
    std::fs::create_dir(&release).unwrap();
    std::fs::write(release.join("llama-server"), "#!/bin/sh\necho b1\n").unwrap();
    std::fs::write(release.join("zeros"), vec![0u8; 10 << 20]).unwrap();
    let archive = ws.path().join("llama-b1-bin-ubuntu-x64.tar.gz");
    let status = Command::new("tar")
        .arg("-czf")
        .arg(&archive)
        .arg("-C")
        .arg(&release)
        .args(["llama-server", "zeros"])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(std::fs::metadata(&archive).unwrap().len() < 100_000);
    let digest = arcane_registry_sha256(&archive);
    for (flags, limit) in [
        // The default ratio (200x) stops a thousandfold expansion.
        (vec![], "ratio"),
        // A size limit set low stops it too.
        (
            vec![
                "--max-extracted-size",
                "1MiB",
                "--max-expansion-ratio",
                "100000",
            ],
            "size",
        ),
    ] {
        let out = run(ws
            .arcane()
            .args(["--output", "json", "runtime", "install", "llama.cpp"])
            .arg("--archive")
            .arg(&archive)
            .args(["--sha256", &digest, "--version", "b1", "--skip-run-check"])
            .args(&flags));
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let error = json(&out)["error"].clone();
        assert_eq!(error["code"], "ARCANE_POLICY_DENIED", "{error}");
        assert_eq!(error["details"]["limit"], limit, "{error}");
        // The archive's size depends on the system's gzip: a placeholder.
        let size = std::fs::metadata(&archive).unwrap().len().to_string();
        assert_eq!(error["details"]["archiveBytes"].to_string(), size);
        let redactions = ws.redactions().text(size, "[ARCHIVE_BYTES]");
        insta::assert_snapshot!(
            format!("runtime_install_archive_too_large_{limit}_json"),
            redactions.json(&json(&out))
        );
        // No install, no staging directory.
        let runtimes = ws.path().join(".arcane/runtimes");
        assert_eq!(tree(&runtimes), Vec::<String>::new(), "left behind");
    }
    let out = run(ws.arcane().args(["--output", "json", "runtime", "list"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["runtimes"], serde_json::json!([]));
}

pub(crate) fn arcane_registry_sha256(path: &Path) -> String {
    let output = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(output.status.success());
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}
