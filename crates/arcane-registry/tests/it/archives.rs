//! Installing runtimes from local archives: a good archive installs, and every unsafe
//! or wrong archive fails with its code and leaves no partial install.

use arcane_registry::{Engine, Error, ExtractLimit, InstallRuntime, Registry, Source};
use arcane_report::{codes, CancelToken, Collector, Diagnostic, NullSink};

use crate::support::*;

fn install(
    workspace: &std::path::Path,
    archive: &[u8],
    options: impl FnOnce(InstallRuntime) -> InstallRuntime,
) -> Result<arcane_registry::Runtime, Error> {
    let file = workspace
        .parent()
        .unwrap()
        .join(format!("archive-{}.bin", sha256(archive)));
    std::fs::write(&file, archive).unwrap();
    let registry = Registry::new(workspace);
    let request = options(InstallRuntime::new(
        Engine::LlamaCpp,
        Source::File(file),
        sha256(archive),
    ));
    registry.install_runtime(&request, &NullSink, &CancelToken::new())
}

fn workspace_in(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let workspace = dir.path().join("ws");
    std::fs::create_dir(&workspace).unwrap();
    workspace
}

#[test]
fn a_good_tar_gz_installs_under_its_version_and_registers() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let archive = tar_gz(&release_entries(4500));
    let events = Collector::default();
    let file = dir.path().join("llama-b4500-bin-ubuntu-x64.tar.gz");
    std::fs::write(&file, &archive).unwrap();
    let registry = Registry::new(&workspace);
    let runtime = registry
        .install_runtime(
            &InstallRuntime::new(
                Engine::LlamaCpp,
                Source::File(file.clone()),
                sha256(&archive).to_uppercase(),
            ),
            &events,
            &CancelToken::new(),
        )
        .unwrap();
    // The version comes from the executable's `--version`, the id and directory from it.
    assert_eq!(runtime.id, "llama.cpp-b4500");
    assert_eq!(runtime.version, "b4500");
    assert!(runtime.installed);
    let root = workspace.join(".arcane/runtimes/llama.cpp/b4500");
    assert_eq!(runtime.root.as_deref(), Some(root.as_path()));
    assert_eq!(runtime.executable, root.join("build/bin/llama-server"));
    assert_eq!(
        runtime.library_dirs,
        vec![std::fs::canonicalize(root.join("build/bin")).unwrap()]
    );
    assert_eq!(runtime.archive.as_ref().unwrap().sha256, sha256(&archive));
    assert_eq!(
        std::fs::read_link(root.join("build/bin/libllama.so"))
            .unwrap()
            .to_str(),
        Some("libllama.so.0.0.1")
    );
    assert_eq!(
        tree(&root),
        [
            "LICENSE",
            "build/",
            "build/bin/",
            "build/bin/libllama.so",
            "build/bin/libllama.so.0.0.1",
            "build/bin/llama-server"
        ]
    );
    // Nothing else is left in `.arcane/runtimes` (no staging directory, no archive copy).
    assert_eq!(
        tree(&workspace.join(".arcane/runtimes")),
        ["llama.cpp/", "llama.cpp/b4500/"]
            .into_iter()
            .map(String::from)
            .chain(
                tree(&root)
                    .into_iter()
                    .map(|p| format!("llama.cpp/b4500/{p}"))
            )
            .collect::<Vec<_>>()
    );
    assert_eq!(registry.runtime("llama.cpp-b4500").unwrap(), runtime);
    let types = events.types();
    for expected in [
        "workspace.operation.locked",
        "registry.hash.progress",
        "registry.runtime.extracting",
        "registry.runtime.probing",
        "workspace.operation.released",
        "registry.runtime.installed",
    ] {
        assert!(
            types.iter().any(|t| t == expected),
            "missing {expected} in {types:?}"
        );
    }
    let locked = events
        .events()
        .into_iter()
        .find(|e| e.kind == "workspace.operation.locked")
        .unwrap();
    assert_eq!(locked.data["operation"], "runtime-install");
}

#[test]
fn a_good_zip_installs_with_explicit_version_and_backend() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let archive = zip(&[
        Entry::exe("llama-server", fake_llama_server_script(7)),
        Entry::file("libggml-cuda.so", "x"),
    ]);
    let runtime = install(&workspace, &archive, |o| {
        o.version("b7").backend(arcane_devices::Backend::Cuda)
    })
    .unwrap();
    assert_eq!(runtime.id, "llama.cpp-b7-cuda");
    assert_eq!(runtime.backend, arcane_devices::Backend::Cuda);
    assert_eq!(
        runtime.executable,
        workspace.join(".arcane/runtimes/llama.cpp/b7-cuda/llama-server")
    );
    // The executable bit survives the zip.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&runtime.executable)
            .unwrap()
            .permissions()
            .mode()
            & 0o111,
        0o111
    );
}

#[test]
fn a_wrong_checksum_is_refused_before_anything_is_extracted() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let archive = tar_gz(&release_entries(1));
    let file = dir.path().join("a.tar.gz");
    std::fs::write(&file, &archive).unwrap();
    let wrong = "0".repeat(64);
    let error = Registry::new(&workspace)
        .install_runtime(
            &InstallRuntime::new(Engine::LlamaCpp, Source::File(file), wrong.clone()),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_INTEGRITY_FAILED);
    assert_eq!(error.details()["expected"], wrong);
    assert_eq!(error.details()["actual"], sha256(&archive));
    assert_clean(&workspace);
    assert!(Registry::new(&workspace).runtimes().unwrap().is_empty());
}

fn assert_refused(archive: Vec<u8>, entry: &str) {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let error = install(&workspace, &archive, |o| o.version("b1")).unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_POLICY_DENIED, "{error}");
    assert_eq!(error.details()["entry"], entry, "{error}");
    assert_clean(&workspace);
    // Nothing escaped next to the workspace either.
    assert!(!dir.path().join("escaped").exists());
    assert!(!dir.path().join("ws/escaped").exists());
    assert!(Registry::new(&workspace).runtimes().unwrap().is_empty());
}

#[test]
fn a_parent_directory_entry_is_refused() {
    let mut entries = release_entries(1);
    entries.push(Entry::file("build/../../escaped", "pwned"));
    assert_refused(tar_gz(&entries), "build/../../escaped");
    assert_refused(zip(&entries), "build/../../escaped");
}

#[test]
fn an_absolute_entry_is_refused() {
    let dir = tempdir();
    let target = dir.path().join("escaped");
    let name = target.to_str().unwrap().to_string();
    let mut entries = release_entries(1);
    entries.push(Entry::file(&name, "pwned"));
    assert_refused(tar_gz(&entries), &name);
    assert!(!target.exists());
    assert_refused(zip(&entries), &name);
    assert!(!target.exists());
}

#[test]
fn a_symlink_escaping_the_directory_is_refused() {
    // `build/bin/../../..` is one level above the install directory.
    for link in ["../../../escaped", "/tmp"] {
        let mut entries = release_entries(1);
        entries.push(Entry::symlink("build/bin/evil", link));
        assert_refused(tar_gz(&entries), "build/bin/evil");
        assert_refused(zip(&entries), "build/bin/evil");
    }
}

#[test]
fn writing_through_an_extracted_symlink_is_refused() {
    // `lib` points inside (allowed), but a later entry must not be written through it.
    let mut entries = release_entries(1);
    entries.push(Entry::symlink("lib", "build"));
    entries.push(Entry::file("lib/extra", "x"));
    assert_refused(tar_gz(&entries), "lib/extra");
}

#[test]
fn an_archive_without_the_server_is_refused() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let archive = tar_gz(&[Entry::exe("bin/llama-cli", fake_llama_server_script(1))]);
    let error = install(&workspace, &archive, |o| o).unwrap_err();
    assert_eq!(error.code(), codes::LOCAL_AI_RUNTIME_INVALID);
    assert_eq!(error.details()["executable"], "llama-server");
    assert_clean(&workspace);
}

#[test]
fn a_server_that_does_not_run_is_refused() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let archive = tar_gz(&[Entry::exe(
        "llama-server",
        "#!/bin/sh\necho 'error while loading shared libraries' >&2\nexit 127\n",
    )]);
    let error = install(&workspace, &archive, |o| o.version("b1")).unwrap_err();
    assert_eq!(error.code(), codes::LOCAL_AI_RUNTIME_INVALID);
    assert!(error.details()["output"]
        .as_str()
        .unwrap()
        .contains("shared libraries"));
    assert_clean(&workspace);
}

#[test]
fn something_that_is_not_an_archive_is_refused() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let error = install(&workspace, b"just text", |o| o.version("b1")).unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_OPERATION_FAILED);
    assert_clean(&workspace);
}

#[test]
fn an_earlier_install_is_never_overwritten() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let first = install(&workspace, &tar_gz(&release_entries(9)), |o| o).unwrap();
    let before = tree(&workspace.join(".arcane/runtimes"));
    let marker = std::fs::read(&first.executable).unwrap();
    // Same version, different content: refused, the first install is untouched.
    let mut entries = release_entries(9);
    entries.push(Entry::file("NEW", "new"));
    let error = install(&workspace, &tar_gz(&entries), |o| o.version("b9")).unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_ALREADY_EXISTS, "{error}");
    // Without `--version` the conflict is found after extraction, and still refused.
    let error = install(&workspace, &tar_gz(&entries), |o| o).unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_ALREADY_EXISTS, "{error}");
    assert_eq!(tree(&workspace.join(".arcane/runtimes")), before);
    assert_eq!(std::fs::read(&first.executable).unwrap(), marker);
    assert_eq!(Registry::new(&workspace).runtimes().unwrap(), vec![first]);
}

#[test]
fn removing_an_installed_runtime_deletes_its_directory() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let runtime = install(&workspace, &tar_gz(&release_entries(3)), |o| o).unwrap();
    let registry = Registry::new(&workspace);
    let removed = registry
        .remove_runtime(&runtime.id, &NullSink, &CancelToken::new())
        .unwrap();
    assert_eq!(removed, runtime);
    assert!(!runtime.root.unwrap().exists());
    assert!(registry.runtimes().unwrap().is_empty());
    assert_eq!(tree(&workspace.join(".arcane/runtimes")), ["llama.cpp/"]);
    let error = registry
        .remove_runtime(&runtime.id, &NullSink, &CancelToken::new())
        .unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_NOT_FOUND);
}

#[test]
fn bad_inputs_are_refused_before_any_side_effect() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let registry = Registry::new(&workspace);
    let file = Source::File(dir.path().join("missing.tar.gz"));
    let bad_digest = InstallRuntime::new(Engine::LlamaCpp, file.clone(), "xyz");
    assert!(
        matches!(registry.install_runtime(&bad_digest, &NullSink, &CancelToken::new()), Err(Error::InvalidDigest { value }) if value == "xyz")
    );
    let bad_version = InstallRuntime::new(Engine::LlamaCpp, file, "0".repeat(64)).version("B 1/..");
    let error = registry
        .install_runtime(&bad_version, &NullSink, &CancelToken::new())
        .unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_USAGE);
    assert_eq!(error.details()["version"], "B 1/..");
    assert!(tree(&workspace).is_empty());
}

#[test]
fn a_build_for_another_machine_installs_without_the_run_check() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    // This "server" cannot run here (as a CUDA build on a host without a GPU would not).
    let archive = zip(&[Entry::exe("llama-server", "#!/bin/sh\nexit 127\n")]);
    let named = dir.path().join("llama-b77-bin-win-cuda-x64.zip");
    std::fs::write(&named, &archive).unwrap();
    let registry = Registry::new(&workspace);
    let request = InstallRuntime::new(Engine::LlamaCpp, Source::File(named), sha256(&archive));
    let error = registry
        .install_runtime(&request, &NullSink, &CancelToken::new())
        .unwrap_err();
    assert_eq!(
        error.code(),
        codes::LOCAL_AI_RUNTIME_INVALID,
        "checked by default"
    );
    let runtime = registry
        .install_runtime(&request.check_runs(false), &NullSink, &CancelToken::new())
        .unwrap();
    assert_eq!(
        (
            runtime.id.as_str(),
            runtime.version.as_str(),
            runtime.build_info.as_deref()
        ),
        ("llama.cpp-b77", "b77", None)
    );
    // Without a version in the name, one must be given.
    let error = install(&workspace, &archive, |o| o.check_runs(false)).unwrap_err();
    assert!(matches!(error, Error::VersionRequired { .. }), "{error:?}");
    assert_eq!(error.code(), codes::ARCANE_USAGE);
}

#[test]
fn a_link_chain_escaping_through_a_target_that_does_not_exist_yet_is_refused() {
    // Issue: `a/…/h/up -> ../../../../../../../..` (inside) and
    // `build/bin/libllama.so -> ../../a/…/h/up/../../tmp/x/not-yet-lib` installed with
    // rc 0: `up` is the install root, so `up/../..` leaves it; the same chain to an
    // existing file was refused.
    let mut entries: Vec<Entry> = vec![
        Entry::dir("build/"),
        Entry::dir("build/bin/"),
        Entry::exe("build/bin/llama-server", fake_llama_server_script(1)),
    ];
    let mut deep = String::new();
    for part in ["a", "b", "c", "d", "e", "f", "g", "h"] {
        deep.push_str(part);
        deep.push('/');
        entries.push(Entry::dir(&deep));
    }
    entries.push(Entry::symlink(
        &format!("{deep}up"),
        "../../../../../../../..",
    ));
    let escape = format!("../../{deep}up/../../tmp/x/not-yet-lib");
    entries.push(Entry::symlink("build/bin/libllama.so", &escape));
    assert_refused(tar_gz(&entries), "build/bin/libllama.so");
    assert_refused(zip(&entries), "build/bin/libllama.so");
    // The same kind of chain that stays inside is fine: `up/build` is `build`.
    let mut inside = entries.clone();
    inside.pop();
    inside.push(Entry::file("build/bin/libllama.so.0", "lib"));
    inside.push(Entry::symlink(
        "build/bin/libllama.so",
        &format!("../../{deep}up/build/bin/libllama.so.0"),
    ));
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    install(&workspace, &tar_gz(&inside), |o| o.version("b1")).unwrap();
}

#[test]
fn a_zip_with_an_entry_name_twice_is_refused_like_tar() {
    let mut entries = release_entries(1);
    entries.push(Entry::file("LICENSX", "the second LICENSE"));
    let mut archive = zip(&entries);
    // Rename the second entry to the first one's name in its local header and in the
    // central directory (same length, so every offset stays valid).
    let mut i = 0;
    while let Some(at) = archive[i..].windows(7).position(|w| w == b"LICENSX") {
        archive[i + at..i + at + 7].copy_from_slice(b"LICENSE");
        i += at + 7;
    }
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let error = install(&workspace, &archive, |o| o.version("b1")).unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_POLICY_DENIED, "{error}");
    assert!(error.to_string().contains("appears twice"), "{error}");
    assert_clean(&workspace);
    // tar refuses the same case.
    let mut entries = release_entries(1);
    entries.push(Entry::file("LICENSE", "the second LICENSE"));
    let error = install(&workspace, &tar_gz(&entries), |o| o.version("b1")).unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_POLICY_DENIED, "{error}");
}

/// A release whose LICENSE is 10 MiB of zeros: a few kilobytes compressed, a
/// thousandfold expansion.
fn bomb_entries() -> Vec<Entry> {
    let mut entries = release_entries(1);
    entries.push(Entry::file("LICENSE.bomb", vec![0u8; 10 << 20]));
    entries
}

/// Installs `archive` (with its right digest) under `options` and checks it is refused
/// by `limit`, naming the archive and the way to raise the limit, leaving nothing.
fn assert_too_large(
    archive: &[u8],
    limit: ExtractLimit,
    options: impl FnOnce(InstallRuntime) -> InstallRuntime,
) {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    assert!(archive.len() < 200_000, "the test archive stays small");
    let error = install(&workspace, archive, |o| options(o.version("b1"))).unwrap_err();
    assert!(
        matches!(&error, Error::ArchiveTooLarge { limit: l, .. } if *l == limit),
        "{error:?}"
    );
    assert_eq!(error.code(), codes::ARCANE_POLICY_DENIED, "{error}");
    assert_eq!(error.details()["limit"], limit.as_str());
    assert_eq!(error.details()["archiveBytes"], archive.len() as u64);
    let message = error.to_string();
    assert!(message.contains("archive-"), "names the archive: {message}");
    let flag = match limit {
        ExtractLimit::Size => "--max-extracted-size",
        _ => "--max-expansion-ratio",
    };
    assert!(
        error.hints().iter().any(|h| h.contains(flag)),
        "{:?}",
        error.hints()
    );
    // No install, no staging directory, nothing registered.
    assert_clean(&workspace);
    assert!(Registry::new(&workspace).runtimes().unwrap().is_empty());
}

#[test]
fn an_archive_expanding_past_the_default_ratio_is_refused_and_leaves_nothing() {
    // Issue 19 §9: a small zip with a matching SHA-256 expanded to 2.1 GB.
    for archive in [zip(&bomb_entries()), tar_gz(&bomb_entries())] {
        assert_too_large(&archive, ExtractLimit::Ratio, |o| o);
    }
}

#[test]
fn an_archive_expanding_past_the_size_limit_is_refused_and_leaves_nothing() {
    for archive in [zip(&bomb_entries()), tar_gz(&bomb_entries())] {
        assert_too_large(&archive, ExtractLimit::Size, |o| {
            o.max_expansion_ratio(1 << 20).max_extracted_bytes(1 << 20)
        });
    }
}

#[test]
fn a_tar_gz_whose_unwritten_entry_data_expands_is_stopped_while_decompressing() {
    // A directory entry declaring 10 MiB of data: nothing is written, but the
    // decompressor would still expand it all to skip it.
    let encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let mut builder = tar::Builder::new(encoder);
    let header = raw_header("build/", tar::EntryType::Directory, 10 << 20, 0o755);
    builder
        .append(&header, std::io::Read::take(std::io::repeat(0), 10 << 20))
        .unwrap();
    for entry in release_entries(1) {
        if let Entry::File { path, data, mode } = entry {
            let header = raw_header(&path, tar::EntryType::Regular, data.len() as u64, mode);
            builder.append(&header, data.as_slice()).unwrap();
        }
    }
    let archive = builder.into_inner().unwrap().finish().unwrap();
    assert_too_large(&archive, ExtractLimit::Size, |o| {
        o.max_expansion_ratio(1 << 20).max_extracted_bytes(1 << 20)
    });
}

#[test]
fn raised_limits_let_a_trusted_compressible_archive_install() {
    let dir = tempdir();
    let workspace = workspace_in(&dir);
    let runtime = install(&workspace, &zip(&bomb_entries()), |o| {
        o.max_expansion_ratio(100_000).max_extracted_bytes(64 << 20)
    })
    .unwrap();
    let root = runtime.root.unwrap();
    assert_eq!(
        std::fs::metadata(root.join("LICENSE.bomb")).unwrap().len(),
        10 << 20
    );
}
