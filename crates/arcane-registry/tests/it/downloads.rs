//! Installing runtimes and adding models from loopback HTTP servers: good downloads,
//! and truncated, cancelled and failed ones that leave nothing behind.

use std::time::Duration;

use arcane_registry::{AddModel, Engine, InstallRuntime, Registry, Source};
use arcane_report::{codes, CancelToken, Collector, Diagnostic, Event, EventSink, NullSink};

use crate::support::*;

fn workspace_in(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let workspace = dir.path().join("ws");
    std::fs::create_dir(&workspace).unwrap();
    workspace
}

/// Padding so the archive spans several chunks and progress events.
fn big_release(build: u32) -> Vec<u8> {
    let mut entries = release_entries(build);
    let noise: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    entries.push(Entry::file("build/bin/libggml-base.so", noise));
    tar_gz(&entries)
}

#[test]
fn a_good_download_installs_with_progress() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let archive = big_release(4600);
    let server = Server::start(Reply::Full(archive.clone()));
    let url = server.url("llama-b4600-bin-ubuntu-x64.tar.gz");
    let events = Collector::default();
    let runtime = Registry::new(&workspace)
        .install_runtime(
            &InstallRuntime::new(Engine::LlamaCpp, Source::Url(url.clone()), sha256(&archive)),
            &events,
            &CancelToken::new(),
        )
        .unwrap();
    assert_eq!(runtime.id, "llama.cpp-b4600");
    assert_eq!(runtime.archive.as_ref().unwrap().location, url);
    assert!(runtime.executable.is_file());
    let all = events.events();
    let started = all
        .iter()
        .find(|e| e.kind == "download.started")
        .expect("download.started");
    assert_eq!(started.data["total"], archive.len() as u64);
    let progress: Vec<&Event> = all
        .iter()
        .filter(|e| e.kind == "download.progress")
        .collect();
    assert!(!progress.is_empty());
    assert_eq!(
        progress.last().unwrap().data["received"],
        archive.len() as u64,
        "the last progress event reports completion"
    );
    let finished = all
        .iter()
        .find(|e| e.kind == "download.finished")
        .expect("download.finished");
    assert_eq!(finished.data["sha256"], sha256(&archive));
    // The downloaded archive itself is not kept.
    let kept: Vec<String> = tree(&workspace.join(".arcane/runtimes"))
        .into_iter()
        .filter(|p| p.contains("archive") || p.contains(".staging"))
        .collect();
    assert!(kept.is_empty(), "{kept:?}");
}

#[test]
fn a_truncated_download_fails_cleanly() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let archive = big_release(1);
    let server = Server::start(Reply::Truncated {
        body: archive.clone(),
        sent: archive.len() / 2,
    });
    let error = Registry::new(&workspace)
        .install_runtime(
            &InstallRuntime::new(
                Engine::LlamaCpp,
                Source::Url(server.url("a.tar.gz")),
                sha256(&archive),
            ),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_INTEGRITY_FAILED, "{error}");
    assert_eq!(error.details()["expectedBytes"], archive.len() as u64);
    assert_eq!(error.details()["receivedBytes"], (archive.len() / 2) as u64);
    assert_clean(&workspace);
}

/// Cancels its token as soon as a download reports progress.
struct CancelOnProgress {
    cancel: CancelToken,
    seen: Collector,
}

impl EventSink for CancelOnProgress {
    fn emit(&self, event: Event) {
        if event.kind == "download.progress" {
            self.cancel.cancel();
        }
        self.seen.emit(event);
    }
}

#[test]
fn a_cancelled_download_stops_promptly_and_fails_cleanly() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let archive = big_release(1);
    // The server sends a little, then goes silent: only cancellation can end the wait
    // before the client's read timeout.
    let server = Server::start(Reply::Stall {
        body: archive.clone(),
        sent: 100_000,
    });
    let cancel = CancelToken::new();
    let sink = CancelOnProgress {
        cancel: cancel.clone(),
        seen: Collector::default(),
    };
    let (sender, receiver) = std::sync::mpsc::channel();
    let url = server.url("a.tar.gz");
    let worker_workspace = workspace.clone();
    let digest = sha256(&archive);
    std::thread::spawn(move || {
        let result = Registry::new(&worker_workspace).install_runtime(
            &InstallRuntime::new(Engine::LlamaCpp, Source::Url(url), digest),
            &sink,
            &cancel,
        );
        let _ = sender.send((result, sink.seen.types()));
    });
    // Generous bound: the point is that it returns without waiting for the 60 s read timeout.
    let (result, types) = receiver
        .recv_timeout(Duration::from_secs(30))
        .expect("a cancelled download must return promptly");
    let error = result.unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_CANCELLED, "{error}");
    assert!(types.iter().any(|t| t == "download.progress"));
    assert!(
        types.iter().any(|t| t == "workspace.operation.released"),
        "the lock is released: {types:?}"
    );
    assert_clean(&workspace);
    drop(server);
}

#[test]
fn an_http_error_fails_cleanly() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let server = Server::start(Reply::Status(404));
    let url = server.url("missing.tar.gz");
    let error = Registry::new(&workspace)
        .install_runtime(
            &InstallRuntime::new(Engine::LlamaCpp, Source::Url(url.clone()), "0".repeat(64)),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_OPERATION_FAILED);
    assert_eq!(error.details()["status"], 404);
    assert_eq!(error.details()["url"], url);
    assert_clean(&workspace);
}

#[test]
fn a_model_downloads_verifies_and_registers() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let file = dir.path().join("tiny.gguf");
    write_gguf(&file, "Tiny");
    let bytes = std::fs::read(&file).unwrap();
    let server = Server::start(Reply::Full(bytes.clone()));
    let url = server.url("models/tiny-q4_1.gguf?download=1");
    let registry = Registry::new(&workspace);
    let model = registry
        .add_model(
            &AddModel::url("tiny", url.clone(), sha256(&bytes)),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
    assert_eq!(
        model.path,
        workspace.join(".arcane/models/tiny/tiny-q4_1.gguf")
    );
    assert_eq!(model.sha256, sha256(&bytes));
    assert_eq!(model.size, bytes.len() as u64);
    assert_eq!(model.source, url);
    assert_eq!(model.storage, arcane_registry::Storage::Download);
    assert_eq!(model.gguf().unwrap().name.as_deref(), Some("Tiny"));
    assert_eq!(std::fs::read(&model.path).unwrap(), bytes);
}

#[test]
fn a_model_with_the_wrong_digest_is_not_kept() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let file = dir.path().join("tiny.gguf");
    write_gguf(&file, "Tiny");
    let bytes = std::fs::read(&file).unwrap();
    let server = Server::start(Reply::Full(bytes.clone()));
    let wrong = sha256(b"something else");
    let error = Registry::new(&workspace)
        .add_model(
            &AddModel::url("tiny", server.url("tiny.gguf"), wrong.clone()),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_INTEGRITY_FAILED);
    assert_eq!(error.details()["expected"], wrong);
    assert_eq!(error.details()["actual"], sha256(&bytes));
    assert_clean(&workspace);
}

#[test]
fn a_url_without_a_digest_is_refused_without_a_request() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let server = Server::start(Reply::Status(500));
    let mut request = AddModel::url("tiny", server.url("tiny.gguf"), "");
    request.sha256 = None;
    let error = Registry::new(&workspace)
        .add_model(&request, &NullSink, &CancelToken::new())
        .unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_USAGE);
    assert_eq!(server.requests(), 0);
    assert!(tree(&workspace).is_empty());
}
