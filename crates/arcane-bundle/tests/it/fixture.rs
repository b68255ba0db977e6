//! A hand-made bundle: files written directly and a manifest computed from them, so
//! verification is tested independently of `build`.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use arcane_bundle::manifest::{
    AppInfo, Builder, FileEntry, LaunchDefaults, Manifest, ModelEntry, RuntimeEntry, Target,
    MANIFEST_NAME,
};
use sha2::{Digest, Sha256};

pub const RUNTIME_EXE: &str = "runtimes/llama.cpp/linux-x64-cpu/llama-server";
pub const RUNTIME_LIB: &str = "runtimes/llama.cpp/linux-x64-cpu/libllama.so.0";
pub const MODEL: &str = "models/smollm2/model.gguf";
pub const START: &str = "app/index.html";

/// A bundle in a fresh temporary directory (the bundle is `dir/bundle`).
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub manifest: Manifest,
}

impl Fixture {
    /// A complete, valid bundle.
    pub fn new() -> Self {
        // Files and directories the tests create get the modes a build gives them,
        // whatever umask the tests were started with: verification refuses group- or
        // world-writable ones. (Every test of this binary wants the same umask.)
        rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
        let dir = tempfile::Builder::new()
            .prefix("arcane-bundle-test-")
            .tempdir()
            .unwrap();
        let files: Vec<(&str, Vec<u8>, bool)> = vec![
            ("bin/arcane", b"#!/bin/sh\necho launcher\n".to_vec(), true),
            (START, b"<!doctype html><title>demo</title>".to_vec(), false),
            ("app/tools/hello", b"#!/bin/sh\necho hello\n".to_vec(), true),
            (
                RUNTIME_EXE,
                (0..200_000u32).map(|i| (i % 251) as u8).collect(),
                true,
            ),
            (RUNTIME_LIB, vec![7u8; 50_000], false),
            (
                MODEL,
                (0..300_000u32).map(|i| (i % 13) as u8).collect(),
                false,
            ),
        ];
        let root = dir.path().join("bundle");
        let mut entries = Vec::new();
        for (path, content, exec) in &files {
            let full = join(&root, path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(&full, content).unwrap();
            std::fs::set_permissions(
                &full,
                std::fs::Permissions::from_mode(if *exec { 0o755 } else { 0o644 }),
            )
            .unwrap();
            entries.push(FileEntry {
                path: path.to_string(),
                size: content.len() as u64,
                sha256: hex::encode(Sha256::digest(content)),
                exec: *exec,
            });
        }
        entries.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        let model_sha = entries
            .iter()
            .find(|e| e.path == MODEL)
            .unwrap()
            .sha256
            .clone();
        let manifest = Manifest {
            schema_version: 1,
            kind: "arcane-bundle".into(),
            bundle_id: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9".into(),
            builder: Builder {
                name: "arcane".into(),
                version: "test".into(),
            },
            app: AppInfo {
                id: "demo".into(),
                name: "Demo".into(),
                version: "1.0.0".into(),
                start: Some(START.into()),
            },
            target: Target::host(),
            runtimes: vec![RuntimeEntry {
                id: "llama.cpp".into(),
                engine: "llama.cpp".into(),
                version: "b1".into(),
                backend: "cpu".into(),
                executable: RUNTIME_EXE.into(),
                library_dirs: vec!["runtimes/llama.cpp/linux-x64-cpu".into()],
            }],
            models: vec![ModelEntry {
                id: "smollm2".into(),
                engine: "llama.cpp".into(),
                path: MODEL.into(),
                sha256: model_sha,
                format: "gguf".into(),
            }],
            libraries: Default::default(),
            launch: LaunchDefaults::default(),
            files: entries,
        };
        let fixture = Self { dir, manifest };
        fixture.write_manifest();
        fixture
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().join("bundle")
    }

    pub fn path(&self, relative: &str) -> PathBuf {
        join(&self.root(), relative)
    }

    /// Rewrites the manifest from `self.manifest` (sorting files first).
    pub fn write_manifest(&self) {
        let path = self.root().join(MANIFEST_NAME);
        std::fs::write(&path, self.manifest.to_bytes()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    }

    /// Adds a manifest entry without a file (for path-grammar cases).
    pub fn list(&mut self, path: &str) {
        self.manifest.files.push(FileEntry {
            path: path.into(),
            size: 1,
            sha256: "0".repeat(64),
            exec: false,
        });
        self.manifest
            .files
            .sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        self.write_manifest();
    }
}

pub fn join(root: &Path, relative: &str) -> PathBuf {
    relative
        .split('/')
        .fold(root.to_path_buf(), |p, s| p.join(s))
}
