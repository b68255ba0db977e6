//! `add_model` / `remove_model` with local files: GGUF checks, storage, digests, ids,
//! concurrency; and the real SmolLM2 file.

use std::sync::Arc;

use arcane_registry::{AddModel, Error, Registry, Storage};
use arcane_report::{codes, CancelToken, Collector, Diagnostic, NullSink};

use crate::support::*;

#[test]
fn the_real_smollm2_is_added_with_its_metadata_and_digest() {
    let model_file = smollm2();
    let dir = tempdir();
    let registry = Registry::new(dir.path());
    let events = Collector::default();
    let model = registry
        .add_model(
            &AddModel::file("smollm2-135m", &model_file),
            &events,
            &CancelToken::new(),
        )
        .unwrap();
    assert_eq!(
        model.sha256,
        sha256sum(&model_file),
        "digest must match an independent sha256sum"
    );
    assert_eq!(model.size, std::fs::metadata(&model_file).unwrap().len());
    assert_eq!(
        model.path,
        dir.path()
            .join(".arcane/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf")
    );
    assert_eq!(sha256sum(&model.path), model.sha256);
    assert_eq!(model.gguf().unwrap().architecture.as_deref(), Some("llama"));
    assert_eq!(model.gguf().unwrap().quantization.as_deref(), Some("Q4_1"));
    assert_eq!(model.gguf().unwrap().context_length, Some(8192));
    // SmolLM2-135M: 30 layers, 576 wide, 9 heads sharing 3 key/value heads.
    let gguf = model.gguf().unwrap();
    assert_eq!(
        (
            gguf.block_count,
            gguf.embedding_length,
            gguf.head_count,
            gguf.head_count_kv
        ),
        (Some(30), Some(576), Some(9), Some(3))
    );
    assert_eq!(gguf.kv_cache_bytes(1024), Some(2 * 30 * 1024 * 192 * 2));
    let parameters = model.gguf().unwrap().parameter_count.unwrap();
    assert!(
        (100_000_000..200_000_000).contains(&parameters),
        "{parameters}"
    );
    assert!(matches!(model.gguf().unwrap().version, 2 | 3));
    assert!(events.types().iter().any(|t| t == "registry.hash.progress"));
    assert_eq!(registry.model("smollm2-135m").unwrap(), model);
}

#[test]
fn a_file_is_hard_linked_on_the_same_file_system() {
    let dir = tempdir();
    let source = dir.path().join("tiny.gguf");
    write_gguf(&source, "Tiny");
    let workspace = dir.path().join("ws");
    let model = Registry::new(&workspace)
        .add_model(
            &AddModel::file("tiny", &source),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
    assert_eq!(model.storage, Storage::HardLink);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(&model.path).unwrap().ino(),
        std::fs::metadata(&source).unwrap().ino()
    );
    assert_eq!(model.sha256, sha256sum(&source));
    assert_eq!(model.gguf().unwrap().architecture.as_deref(), Some("llama"));
    assert_eq!(model.gguf().unwrap().context_length, Some(2048));
    assert_eq!(model.gguf().unwrap().parameter_count, Some(4096));
    assert_eq!(model.source, source.display().to_string());
}

#[test]
fn a_file_on_another_file_system_is_copied() {
    // /dev/shm is a tmpfs on Linux; the workspace is on the temp dir's file system.
    let shm = std::path::Path::new("/dev/shm");
    assert!(shm.is_dir(), "this test needs /dev/shm");
    let source_dir = tempfile::Builder::new()
        .prefix("arcane-registry-")
        .tempdir_in(shm)
        .unwrap();
    let source = source_dir.path().join("tiny.gguf");
    write_gguf(&source, "Tiny");
    let dir = tempdir();
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata(dir.path()).unwrap().dev()
        == std::fs::metadata(source_dir.path()).unwrap().dev()
    {
        panic!("/dev/shm and the temp dir share a file system; cannot test the copy path here");
    }
    let model = Registry::new(dir.path())
        .add_model(
            &AddModel::file("tiny", &source),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
    assert_eq!(model.storage, Storage::Copy);
    assert_eq!(
        std::fs::read(&model.path).unwrap(),
        std::fs::read(&source).unwrap()
    );
    assert_eq!(model.sha256, sha256sum(&source));
}

#[test]
fn a_file_that_is_not_gguf_is_refused_naming_it_and_its_bytes() {
    let dir = tempdir();
    let source = dir.path().join("llama-server.bin");
    std::fs::write(&source, b"\x7fELF\x02\x01\x01\x00rest").unwrap();
    let error = Registry::new(dir.path())
        .add_model(
            &AddModel::file("x", &source),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap_err();
    assert_eq!(error.code(), codes::LOCAL_AI_MODEL_INVALID);
    assert_eq!(error.details()["path"], source.display().to_string());
    assert_eq!(error.details()["found"], "7f454c46");
    assert!(error.to_string().contains("llama-server.bin"), "{error}");
    assert!(
        !dir.path().join(".arcane").exists(),
        "nothing is created for a refused file"
    );
}

#[test]
fn a_file_checked_against_a_wrong_digest_is_refused() {
    let dir = tempdir();
    let source = dir.path().join("tiny.gguf");
    write_gguf(&source, "Tiny");
    let workspace = dir.path().join("ws");
    let error = Registry::new(&workspace)
        .add_model(
            &AddModel::file("tiny", &source).sha256("ab".repeat(32)),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_INTEGRITY_FAILED);
    assert_eq!(error.details()["actual"], sha256sum(&source));
    assert_clean(&workspace);
    assert!(source.is_file(), "the source is never touched");
}

#[test]
fn ids_are_validated_and_unique() {
    let dir = tempdir();
    let source = dir.path().join("tiny.gguf");
    write_gguf(&source, "Tiny");
    let workspace = dir.path().join("ws");
    let registry = Registry::new(&workspace);
    for bad in ["Tiny", "../x", "a/b", "-x", ""] {
        let error = registry
            .add_model(
                &AddModel::file(bad, &source),
                &NullSink,
                &CancelToken::new(),
            )
            .unwrap_err();
        assert!(
            matches!(&error, Error::InvalidId { value, kind: "model" } if value == bad),
            "{error:?}"
        );
        assert_eq!(error.code(), codes::ARCANE_USAGE);
    }
    assert!(!workspace.exists());
    registry
        .add_model(
            &AddModel::file("tiny", &source),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
    let error = registry
        .add_model(
            &AddModel::file("tiny", &source),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_ALREADY_EXISTS);
    assert_eq!(registry.models().unwrap().len(), 1);
}

#[test]
fn unknown_ids_are_not_found_with_the_known_ones_listed() {
    let dir = tempdir();
    let source = dir.path().join("tiny.gguf");
    write_gguf(&source, "Tiny");
    let registry = Registry::new(dir.path());
    registry
        .add_model(
            &AddModel::file("tiny", &source),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
    let error = registry.model("huge").unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_NOT_FOUND);
    assert_eq!(error.details()["id"], "huge");
    assert_eq!(error.details()["known"], serde_json::json!(["tiny"]));
    let error = registry.runtime("llama.cpp").unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_NOT_FOUND);
    assert!(error.to_string().contains("`llama.cpp`"));
}

#[test]
fn remove_deletes_the_stored_file_but_never_the_source() {
    let dir = tempdir();
    let source = dir.path().join("tiny.gguf");
    write_gguf(&source, "Tiny");
    let workspace = dir.path().join("ws");
    let registry = Registry::new(&workspace);
    let model = registry
        .add_model(
            &AddModel::file("tiny", &source),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
    let events = Collector::default();
    let removed = registry
        .remove_model("tiny", &events, &CancelToken::new())
        .unwrap();
    assert_eq!(removed, model);
    assert!(!model.path.exists());
    assert!(source.is_file());
    assert!(registry.models().unwrap().is_empty());
    assert_eq!(
        tree(&workspace.join(".arcane/models")),
        Vec::<String>::new()
    );
    let locked = events
        .events()
        .into_iter()
        .find(|e| e.kind == "workspace.operation.locked")
        .unwrap();
    assert_eq!(locked.data["operation"], "model-remove");
    // The same id can be added again.
    registry
        .add_model(
            &AddModel::file("tiny", &source),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
}

#[test]
fn concurrent_adds_in_one_process_keep_every_model() {
    let dir = tempdir();
    let workspace = Arc::new(dir.path().join("ws"));
    let mut threads = Vec::new();
    for i in 0..6 {
        let source = dir.path().join(format!("m{i}.gguf"));
        write_gguf(&source, &format!("M{i}"));
        let workspace = workspace.clone();
        threads.push(std::thread::spawn(move || {
            Registry::new(&workspace).add_model(
                &AddModel::file(format!("m{i}"), &source),
                &NullSink,
                &CancelToken::new(),
            )
        }));
    }
    for thread in threads {
        thread.join().unwrap().unwrap();
    }
    let mut ids: Vec<String> = Registry::new(&workspace)
        .models()
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["m0", "m1", "m2", "m3", "m4", "m5"]);
}

#[test]
fn a_corrupt_registry_file_is_reported_not_overwritten() {
    let dir = tempdir();
    std::fs::create_dir_all(dir.path().join(".arcane")).unwrap();
    std::fs::write(
        dir.path().join(".arcane/registry.json"),
        b"{\"version\": 1, \"models\": [",
    )
    .unwrap();
    let registry = Registry::new(dir.path());
    let error = registry.models().unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_OPERATION_FAILED);
    let source = dir.path().join("tiny.gguf");
    write_gguf(&source, "Tiny");
    assert!(registry
        .add_model(
            &AddModel::file("tiny", &source),
            &NullSink,
            &CancelToken::new()
        )
        .is_err());
    assert_eq!(
        std::fs::read(dir.path().join(".arcane/registry.json")).unwrap(),
        b"{\"version\": 1, \"models\": ["
    );
}

#[test]
fn verify_notices_a_hard_linked_source_edited_in_place() {
    let dir = tempdir();
    let source = dir.path().join("tiny.gguf");
    write_gguf(&source, "Tiny");
    let registry = Registry::new(&dir.path().join("ws"));
    let model = registry
        .add_model(
            &AddModel::file("tiny", &source),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
    assert_eq!(
        registry
            .verify_model("tiny", &NullSink, &CancelToken::new())
            .unwrap(),
        model
    );
    // Editing the source in place edits the stored hard link too.
    let mut bytes = std::fs::read(&source).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&source)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &bytes))
        .unwrap();
    let error = registry
        .verify_model("tiny", &NullSink, &CancelToken::new())
        .unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_INTEGRITY_FAILED);
    assert_eq!(error.details()["expected"], model.sha256);
    assert_eq!(error.details()["actual"], sha256sum(&source));
}

#[test]
fn a_file_that_changes_while_it_is_hashed_or_copied_is_not_registered() {
    // Issue: overwriting 16 bytes of a GGUF during `model add` registered a digest that
    // matches neither the old nor the new file.
    let shm = tempfile::Builder::new()
        .prefix("arcane-registry-")
        .tempdir_in("/dev/shm")
        .unwrap();
    let dir = tempdir();
    for (place, storage) in [(dir.path(), "hard link"), (shm.path(), "copy")] {
        let source = place.join(format!("changing-{}.gguf", storage.len()));
        std::fs::copy(smollm2(), &source).unwrap();
        let written = std::sync::Mutex::new(false);
        let target = source.clone();
        let sink = move |event: arcane_report::Event| {
            let mut done = written.lock().unwrap();
            if event.kind == "registry.hash.progress" && !*done {
                *done = true;
                use std::io::{Seek, SeekFrom, Write};
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&target)
                    .unwrap();
                file.seek(SeekFrom::Start(50_000_000)).unwrap();
                file.write_all(&[0x55; 16]).unwrap();
            }
        };
        let workspace = dir.path().join(format!("ws-{}", storage.len()));
        let registry = Registry::new(&workspace);
        let error = registry
            .add_model(&AddModel::file("m", &source), &sink, &CancelToken::new())
            .unwrap_err();
        assert!(
            matches!(error, Error::SourceChanged { .. }),
            "{storage}: {error}"
        );
        assert!(error
            .to_string()
            .contains("changed while it was being read"));
        assert!(!error.hints().is_empty());
        assert!(registry.models().unwrap().is_empty(), "{storage}");
    }
}

#[test]
fn a_file_only_linked_by_someone_else_while_it_is_hashed_is_registered() {
    // Another process hard-linking the same source (parallel `model add`s of one file)
    // changes only its change time: the bytes are hashed again and decide.
    let dir = tempdir();
    let source = dir.path().join("shared.gguf");
    std::fs::copy(smollm2(), &source).unwrap();
    let linked = std::sync::Mutex::new(false);
    let (from, to) = (source.clone(), dir.path().join("other-link.gguf"));
    let sink = move |event: arcane_report::Event| {
        let mut done = linked.lock().unwrap();
        if event.kind == "registry.hash.progress" && !*done {
            *done = true;
            std::fs::hard_link(&from, &to).unwrap();
        }
    };
    let model = Registry::new(&dir.path().join("ws"))
        .add_model(&AddModel::file("m", &source), &sink, &CancelToken::new())
        .unwrap();
    assert_eq!(model.sha256, sha256sum(&source));
}

/// A GGUF v3 file whose one metadata key is an array nested `depth` levels deep, with
/// one small F32 tensor `dims` (its data present when it fits the usual sizes).
fn hostile_gguf(depth: usize, dims: &[u64]) -> Vec<u8> {
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
    out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for dim in dims {
        out.extend_from_slice(&dim.to_le_bytes());
    }
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.resize(out.len().div_ceil(32) * 32 + 64, 0);
    out
}

fn assert_refused_model(bytes: &[u8], says: &[&str]) {
    let dir = tempdir();
    let source = dir.path().join("hostile.gguf");
    std::fs::write(&source, bytes).unwrap();
    let error = Registry::new(dir.path())
        .add_model(
            &AddModel::file("hostile", &source),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap_err();
    assert_eq!(error.code(), codes::LOCAL_AI_MODEL_INVALID, "{error}");
    assert_eq!(error.details()["path"], source.display().to_string());
    for word in says {
        assert!(error.to_string().contains(word), "{word}: {error}");
    }
    assert!(
        !dir.path().join(".arcane").exists(),
        "nothing is created for a refused file"
    );
}

#[test]
fn a_gguf_nesting_arrays_50000_deep_is_refused_not_a_crash() {
    // Issue 19 §9: 600 KB of nested arrays overflowed the stack (exit 134).
    let bytes = hostile_gguf(50_000, &[16]);
    assert!(bytes.len() > 590_000);
    assert_refused_model(&bytes, &["evil.nest", "8 levels"]);
}

#[test]
fn a_gguf_tensor_of_impossible_size_is_refused_naming_it() {
    // Issue 19 §9: dimensions of 2^62 elements registered as "18446744073.7B parameters".
    assert_refused_model(
        &hostile_gguf(1, &[1 << 31, 1 << 31]),
        &["token_embd.weight", "[2147483648, 2147483648]"],
    );
    assert_refused_model(
        &hostile_gguf(1, &[1 << 62, 1 << 62]),
        &["token_embd.weight", "64 bits"],
    );
}
