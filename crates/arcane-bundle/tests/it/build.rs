//! `build` from a real registry: the real `llama-server` (`LLAMA_SERVER`) and SmolLM2
//! (`ARCANE_TEST_MODEL`) registered through `arcane_registry`, assembled into a bundle
//! that then verifies clean; refusals happen before any side effect; a failed or
//! cancelled build leaves nothing behind.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use arcane_bundle::{build, verify, BuildRequest, RuntimeRequest, VerifyOptions};
use arcane_registry::{AddModel, AddRuntime, Engine, Registry};
use arcane_report::{codes, CancelToken, Collector, Diagnostic, NullSink};

#[allow(clippy::disallowed_methods)]
pub(crate) fn real(var: &str) -> PathBuf {
    let value = std::env::var_os(var).unwrap_or_else(|| panic!("{var} is not set: run the tests through `./scripts/test.sh` (it provisions llama-server and SmolLM2)"));
    let path = PathBuf::from(value);
    assert!(path.is_file(), "{var}={} does not exist", path.display());
    path
}

/// A workspace with the real runtime and model registered, and an app directory.
pub(crate) struct Setup {
    pub(crate) dir: tempfile::TempDir,
}

impl Setup {
    pub(crate) fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("arcane-bundle-build-")
            .tempdir()
            .unwrap();
        let workspace = dir.path().join("workspace");
        std::fs::create_dir(&workspace).unwrap();
        let registry = Registry::new(&workspace);
        registry
            .add_runtime(
                &AddRuntime::new(Engine::LlamaCpp, real("LLAMA_SERVER")),
                &NullSink,
                &CancelToken::new(),
            )
            .expect("register llama-server");
        registry
            .add_model(
                &AddModel::file("smollm2", real("ARCANE_TEST_MODEL")),
                &NullSink,
                &CancelToken::new(),
            )
            .expect("register SmolLM2");
        let app = dir.path().join("app");
        std::fs::create_dir_all(app.join("tools")).unwrap();
        std::fs::write(
            app.join("index.html"),
            b"<!doctype html><title>demo</title>",
        )
        .unwrap();
        std::fs::write(
            app.join("arcane-app.json"),
            br#"{"id": "demo", "name": "Demo", "version": "1.2.3"}"#,
        )
        .unwrap();
        std::fs::write(app.join("tools/hello"), b"#!/bin/sh\necho hello\n").unwrap();
        std::fs::set_permissions(
            app.join("tools/hello"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        Self { dir }
    }

    fn workspace(&self) -> PathBuf {
        self.dir.path().join("workspace")
    }

    pub(crate) fn request(&self, out: &Path) -> BuildRequest {
        let mut request = BuildRequest::new(
            self.workspace(),
            self.dir.path().join("app"),
            out.to_path_buf(),
            launcher(),
        );
        request.runtimes = vec![RuntimeRequest::parse("llama.cpp").unwrap()];
        request.models = vec!["smollm2".into()];
        request
    }
}

/// Any real executable stands in for the launcher at library level.
fn launcher() -> PathBuf {
    std::env::current_exe().unwrap()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_real_runtime_and_model_build_into_a_bundle_that_verifies() {
    let setup = Setup::new();
    let out = setup.dir.path().join("out");
    let events = Collector::default();
    let outcome = build(&setup.request(&out), &events, &CancelToken::new()).expect("build");
    assert_eq!(outcome.root, out.canonicalize().unwrap());
    let manifest = &outcome.manifest;
    assert_eq!(manifest.app.id, "demo");
    assert_eq!(manifest.app.version, "1.2.3");
    assert_eq!(manifest.app.start.as_deref(), Some("app/index.html"));
    let runtime = &manifest.runtimes[0];
    assert!(
        runtime.executable.starts_with("runtimes/llama.cpp/linux-"),
        "{}",
        runtime.executable
    );
    assert!(runtime.executable.ends_with("/llama-server"));
    assert!(manifest.file(&runtime.executable).unwrap().exec);
    // The symlinked libraries arrive as regular files under the names the loader asks for.
    let runtime_dir = out.join(&runtime.library_dirs[0]);
    for needed in [
        "libllama.so.0",
        "libggml-base.so.0",
        "libllama-server-impl.so",
    ] {
        let metadata = std::fs::symlink_metadata(runtime_dir.join(needed))
            .unwrap_or_else(|e| panic!("{needed}: {e}; have {:?}", entries(&runtime_dir)));
        assert!(
            metadata.file_type().is_file(),
            "{needed} is not a regular file"
        );
    }
    assert!(
        !runtime_dir.join("libllama-bench-impl.so").exists(),
        "another tool's library was bundled: {:?}",
        entries(&runtime_dir)
    );
    // The model keeps its digest; the manifest has no absolute path anywhere.
    assert_eq!(
        manifest.models[0].path,
        "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    );
    let text = std::fs::read_to_string(out.join("arcane-bundle.json")).unwrap();
    assert!(
        !text.contains(setup.dir.path().to_str().unwrap()),
        "the manifest holds an absolute path"
    );
    assert!(!text.contains("\"/"), "the manifest holds an absolute path");
    // No temporary directory is left beside the output.
    assert_eq!(entries(setup.dir.path()), ["app", "out", "workspace"]);
    let types = events.types();
    assert!(
        types.contains(&"workspace.operation.locked".to_string()),
        "{types:?}"
    );
    assert!(
        types.contains(&"workspace.operation.released".to_string()),
        "{types:?}"
    );
    assert!(
        types.contains(&"bundle.build.progress".to_string()),
        "{types:?}"
    );
    assert_eq!(
        types.last().map(String::as_str),
        Some("bundle.build.finished")
    );
    // The built bundle runs: its llama-server finds its libraries relative to itself.
    let version = std::process::Command::new(out.join(&runtime.executable))
        .arg("--version")
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    assert!(
        version.status.success(),
        "{}",
        String::from_utf8_lossy(&version.stderr)
    );

    let report = verify(
        &out,
        &VerifyOptions::default(),
        &NullSink,
        &CancelToken::new(),
    )
    .unwrap();
    assert!(report.is_clean(), "{:#?}", report.failures);
}

#[test]
fn an_existing_output_is_never_overwritten() {
    let setup = Setup::new();
    for existing in ["empty-dir", "file"] {
        let out = setup.dir.path().join(existing);
        if existing == "file" {
            std::fs::write(&out, b"keep me").unwrap();
        } else {
            std::fs::create_dir(&out).unwrap();
        }
        let error = build(&setup.request(&out), &NullSink, &CancelToken::new()).unwrap_err();
        assert_eq!(error.code(), codes::ARCANE_ALREADY_EXISTS);
        if existing == "file" {
            assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
        } else {
            assert!(entries(&out).is_empty());
        }
    }
}

#[test]
fn a_cancelled_build_removes_only_what_it_created() {
    let setup = Setup::new();
    let out = setup.dir.path().join("out");
    let cancel = CancelToken::new();
    let canceller = cancel.clone();
    // Cancel as soon as copying starts.
    let events = move |event: arcane_report::Event| {
        if event.kind == "bundle.build.progress" || event.kind == "bundle.build.resolved" {
            canceller.cancel();
        }
    };
    let error = build(&setup.request(&out), &events, &cancel).unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_CANCELLED);
    assert_eq!(entries(setup.dir.path()), ["app", "workspace"]);
}

/// Issue 10, item 11: `--out ./dist/my-app` (the documented example) works when
/// `dist/` does not exist yet; a build that fails removes only the parents it created.
#[test]
fn missing_parents_of_the_output_are_created_and_removed_again_on_failure() {
    let setup = Setup::new();
    let out = setup.dir.path().join("dist/nested/my-app");
    let outcome = build(&setup.request(&out), &NullSink, &CancelToken::new()).expect("build");
    assert_eq!(outcome.root, out.canonicalize().unwrap());
    assert_eq!(entries(&setup.dir.path().join("dist/nested")), ["my-app"]);

    // A cancelled build into new parents under an existing one removes just the new ones.
    let out = setup.dir.path().join("dist/fresh/deeper/my-app");
    let cancel = CancelToken::new();
    let canceller = cancel.clone();
    let events = move |event: arcane_report::Event| {
        if event.kind == "bundle.build.progress" {
            canceller.cancel();
        }
    };
    let error = build(&setup.request(&out), &events, &cancel).unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_CANCELLED);
    assert_eq!(entries(&setup.dir.path().join("dist")), ["nested"]);

    // Refused before any side effect: nothing is created at all.
    let out = setup.dir.path().join("other/my-app");
    let mut request = setup.request(&out);
    request.models = vec!["no-such-model".into()];
    build(&request, &NullSink, &CancelToken::new()).unwrap_err();
    assert!(!setup.dir.path().join("other").exists());
    // A missing parent inside the app directory is still inside it.
    let out = setup.dir.path().join("app/build/my-app");
    let error = build(&setup.request(&out), &NullSink, &CancelToken::new()).unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_USAGE, "{error}");
    assert!(!setup.dir.path().join("app/build").exists());
}

#[test]
fn unknown_models_and_app_symlinks_fail_before_anything_is_written() {
    let setup = Setup::new();
    let out = setup.dir.path().join("out");
    let mut request = setup.request(&out);
    request.models = vec!["no-such-model".into()];
    let error = build(&request, &NullSink, &CancelToken::new()).unwrap_err();
    assert_ne!(error.code(), codes::ARCANE_ALREADY_EXISTS);
    assert!(
        error.to_string().contains("registry")
            || error.details().to_string().contains("no-such-model"),
        "{error}"
    );
    assert_eq!(entries(setup.dir.path()), ["app", "workspace"]);

    std::os::unix::fs::symlink("/etc/hostname", setup.dir.path().join("app/link")).unwrap();
    let error = build(&setup.request(&out), &NullSink, &CancelToken::new()).unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_USAGE);
    assert!(error.to_string().contains("link"), "{error}");
    assert_eq!(entries(setup.dir.path()), ["app", "workspace"]);
}

#[test]
fn an_output_inside_the_app_directory_is_refused() {
    let setup = Setup::new();
    let out = setup.dir.path().join("app/dist");
    let error = build(&setup.request(&out), &NullSink, &CancelToken::new()).unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_USAGE);
    assert!(!out.exists());
}
