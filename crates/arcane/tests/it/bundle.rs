//! Tests of `arcane bundle build|verify` and `<bundle>/bin/arcane launch`, on a real
//! bundle: the real `llama-server` and SmolLM2 registered through `arcane runtime add`
//! and `arcane model add`, built with `arcane bundle build`, moved, renamed and made
//! read-only before use.
//!
//! Tests run as root, for whom `chmod -R a-w` does not stop writes; so read-only-ness
//! is checked the honest way: a full listing of the bundle (path, size, mode, mtime,
//! content digest of the manifest) is taken before and compared after.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::serve::{Serve, START};
use crate::support::{self, TestWorkspace};

/// A workspace with the real runtime and model registered, an app, and a built bundle
/// moved to `<tmp>/moved/<renamed>`.
struct RealBundle {
    workspace: TestWorkspace,
    dir: tempfile::TempDir,
    bundle: PathBuf,
}

/// Writes the Core host's pid (from the endpoint record) to `$1`, then waits.
const HOLD: &str = "#!/bin/sh\nsed -n 's/.*\"pid\": *\\([0-9]*\\).*/\\1/p' \"$ARCANE_CORE_ENDPOINT\" > \"$1.tmp\"\nmv \"$1.tmp\" \"$1\"\nexec sleep 600\n";

const SHOW_ENDPOINT: &str = "#!/bin/sh\nprintf 'endpoint=%s\\n' \"$ARCANE_CORE_ENDPOINT\"\nprintf 'args=%s\\n' \"$*\"\nprintf 'entry=%s\\n' \"$ARCANE_APP_ENTRY\"\ncat \"$ARCANE_CORE_ENDPOINT\"\n";

impl RealBundle {
    fn new() -> Self {
        Self::build(None, false, false)
    }

    /// [`RealBundle::new`] with ONNX Runtime `library` registered and bundled too.
    fn with_onnx(library: &Path) -> Self {
        Self::build(Some(library), false, false)
    }

    /// [`RealBundle::with_onnx`] with the whisper.cpp model `tiny-en` and the Piper
    /// voice `joe` bundled beside the chat model.
    fn with_speech() -> Self {
        Self::build(
            Some(&support::provisioned("ARCANE_ONNXRUNTIME")),
            true,
            false,
        )
    }

    /// [`RealBundle::new`] with stable-diffusion.cpp's library and the random-weight
    /// image model `sdxs` bundled beside the chat model.
    fn with_image() -> Self {
        Self::build(None, false, true)
    }

    fn build(onnx: Option<&Path>, speech: bool, image: bool) -> Self {
        let workspace = TestWorkspace::new();
        let dir = tempfile::Builder::new()
            .prefix("arcane-bundle-cli-")
            .tempdir()
            .unwrap();
        let output = support::run(
            workspace
                .arcane()
                .args(["runtime", "add", "llama.cpp", "--executable"])
                .arg(support::llama_server()),
        );
        assert!(
            output.status.success(),
            "runtime add: {}",
            support::stderr(&output)
        );
        let mut runtimes = vec!["--runtime", "llama.cpp"];
        if let Some(library) = onnx {
            let output = support::run(
                workspace
                    .arcane()
                    .args(["runtime", "add", "onnx", "--library"])
                    .arg(library),
            );
            assert!(output.status.success(), "{}", support::stderr(&output));
            runtimes.extend(["--runtime", "onnx"]);
        }
        let output = support::run(
            workspace
                .arcane()
                .args(["model", "add", "smollm2", "--file"])
                .arg(support::smollm2()),
        );
        assert!(
            output.status.success(),
            "model add: {}",
            support::stderr(&output)
        );

        let mut models = vec!["--model", "smollm2"];
        if speech {
            for (id, file) in [
                ("tiny-en", support::whisper_model()),
                ("joe", support::piper_voice()),
            ] {
                let output = support::run(
                    workspace
                        .arcane()
                        .args(["model", "add", id, "--file"])
                        .arg(file),
                );
                assert!(
                    output.status.success(),
                    "model add: {}",
                    support::stderr(&output)
                );
            }
            models.extend(["--model", "tiny-en", "--model", "joe"]);
        }

        if image {
            for (args, file) in [
                (
                    ["runtime", "add", "stable-diffusion.cpp", "--library"],
                    "ARCANE_SD_LIBRARY",
                ),
                (["model", "add", "sdxs", "--file"], "ARCANE_SD_MODEL"),
            ] {
                let output = support::run(
                    workspace
                        .arcane()
                        .args(args)
                        .arg(support::provisioned(file)),
                );
                assert!(
                    output.status.success(),
                    "{args:?}: {}",
                    support::stderr(&output)
                );
            }
            runtimes.extend(["--runtime", "stable-diffusion.cpp"]);
            models.extend(["--model", "sdxs"]);
        }

        let app = dir.path().join("app");
        std::fs::create_dir_all(app.join("tools")).unwrap();
        std::fs::write(
            app.join("index.html"),
            b"<!doctype html><title>demo</title>",
        )
        .unwrap();
        std::fs::write(app.join("data.txt"), b"not a program").unwrap();
        // The app's packaged web, which its launcher serves at `/ui/app/`.
        crate::web::copy_app(&app.join("web"));
        std::fs::write(
            app.join("arcane-app.json"),
            br#"{"id": "demo-app", "name": "Demo", "version": "1.0.0"}"#,
        )
        .unwrap();
        std::fs::write(app.join("tools/show-endpoint"), SHOW_ENDPOINT).unwrap();
        std::fs::write(app.join("tools/hold"), HOLD).unwrap();
        std::fs::set_permissions(
            app.join("tools/hold"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::fs::set_permissions(
            app.join("tools/show-endpoint"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();

        let out = dir.path().join("built");
        let output = support::run(
            workspace
                .arcane()
                .args(["--output", "json", "bundle", "build", "--app"])
                .arg(&app)
                .args(&runtimes)
                .args(&models)
                .args(["--execution-target", "cpu", "--out"])
                .arg(&out),
        );
        assert!(
            output.status.success(),
            "bundle build: {}\n{}",
            support::stdout(&output),
            support::stderr(&output)
        );
        let result = support::json(&output);
        assert_eq!(result["manifest"]["app"]["id"], "demo-app");

        // Move and rename: nothing in the bundle may depend on where it was built.
        std::fs::create_dir(dir.path().join("moved")).unwrap();
        let bundle = dir.path().join("moved").join("Demo App (copy)");
        std::fs::rename(&out, &bundle).unwrap();
        Self {
            workspace,
            dir,
            bundle,
        }
    }

    /// `launch --state-root STATE` in core mode, its lines as NDJSON (the launcher
    /// becomes the bundle's `serve`).
    fn launch_core(&self, state_root: &Path) -> Serve {
        let mut command = self.launch();
        command
            .args(["--output", "ndjson", "launch", "--state-root"])
            .arg(state_root)
            .stdin(Stdio::null());
        Serve::spawn(command)
    }

    fn launcher(&self) -> PathBuf {
        self.bundle.join("bin/arcane")
    }

    /// `<bundle>/bin/arcane` with a clean environment, run where a user stands beside an
    /// `arcane.toml` that does not parse: a bundle's host is configured by the bundle
    /// alone, so no launch may read it.
    fn launch(&self) -> Command {
        let here = self.dir.path().join("where-the-user-stands");
        std::fs::create_dir_all(&here).unwrap();
        std::fs::write(here.join("arcane.toml"), "not toml [").unwrap();
        let mut command = Command::new(self.launcher());
        command
            .env_remove("ARCANE_WORKSPACE")
            .env("NO_COLOR", "1")
            .current_dir(here);
        command
    }

    fn verify_json(&self) -> (i32, Value) {
        let output = support::run(
            self.workspace
                .arcane()
                .args(["bundle", "verify"])
                .arg(&self.bundle)
                .arg("--json"),
        );
        (output.status.code().unwrap_or(-1), support::json(&output))
    }

    fn manifest(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.bundle.join("arcane-bundle.json")).unwrap())
            .unwrap()
    }

    fn runtime_executable(&self) -> String {
        self.manifest()["runtimes"][0]["executable"]
            .as_str()
            .unwrap()
            .to_string()
    }

    fn model_path(&self) -> String {
        self.manifest()["models"][0]["path"]
            .as_str()
            .unwrap()
            .to_string()
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.bundle.join(relative)
    }
}

/// Every entry under `root`: path, type, size, mode, mtime (and for the manifest, its bytes).
fn snapshot(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let metadata = entry.path().symlink_metadata().unwrap();
            if metadata.is_dir() {
                stack.push(entry.path());
            }
            out.push(format!(
                "{} {:o} {} {}.{}",
                entry.path().strip_prefix(root).unwrap().display(),
                metadata.mode(),
                metadata.len(),
                metadata.mtime(),
                metadata.mtime_nsec()
            ));
        }
    }
    out.sort();
    out
}

fn set_read_only(root: &Path, read_only: bool) {
    let status = Command::new("chmod")
        .arg("-R")
        .arg(if read_only { "a-w" } else { "u+w" })
        .arg(root)
        .status()
        .unwrap();
    assert!(status.success());
}

/// The (code, path) pairs of a verify report.
fn failures(report: &Value) -> Vec<(String, Option<String>)> {
    report["failures"]
        .as_array()
        .unwrap_or_else(|| panic!("no failures in {report}"))
        .iter()
        .map(|f| {
            (
                f["code"].as_str().unwrap().to_string(),
                f["path"].as_str().map(str::to_string),
            )
        })
        .collect()
}

fn flip_byte(path: &Path, offset: u64) {
    let mut file = std::fs::File::options()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8];
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(offset)).unwrap();
    file.read_exact(&mut byte).unwrap();
    byte[0] ^= 0x20;
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(offset)).unwrap();
    file.write_all(&byte).unwrap();
}

#[test]
fn a_moved_renamed_read_only_bundle_verifies_and_verification_writes_nothing() {
    let real = RealBundle::new();
    set_read_only(&real.bundle, true);
    let before = snapshot(&real.bundle);
    let (code, report) = real.verify_json();
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["ok"], true);
    assert!(report["filesHashed"].as_u64().unwrap() >= 8, "{report:#}");
    // The bundle's own launcher verifies it too, with the global `--output json`.
    let output = support::run(
        real.launch()
            .args(["--output", "json", "bundle", "verify"])
            .arg(&real.bundle),
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        support::stderr(&output)
    );
    assert_eq!(support::json(&output)["ok"], true);
    assert_eq!(
        snapshot(&real.bundle),
        before,
        "verification wrote inside the bundle"
    );
    // The manifest holds no absolute path: the bundle never knew where it was built.
    let text = std::fs::read_to_string(real.bundle.join("arcane-bundle.json")).unwrap();
    assert!(!text.contains(real.dir.path().to_str().unwrap()));
    assert!(!text.contains(real.workspace.path().to_str().unwrap()));
    set_read_only(&real.bundle, false);
}

#[test]
fn an_existing_out_directory_is_refused_and_left_untouched() {
    let workspace = TestWorkspace::new();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("app")).unwrap();
    std::fs::create_dir(dir.path().join("out")).unwrap();
    std::fs::write(dir.path().join("out/keep"), b"earlier build").unwrap();
    let output = support::run(
        workspace
            .arcane()
            .args([
                "--output", "json", "bundle", "build", "--app-id", "demo", "--model", "smollm2",
                "--app",
            ])
            .arg(dir.path().join("app"))
            .arg("--out")
            .arg(dir.path().join("out")),
    );
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        support::stdout(&output)
    );
    insta::assert_snapshot!(
        "bundle_build_existing_out_json",
        workspace
            .redactions()
            .path(dir.path(), "[DIR]")
            .json(&support::json(&output))
    );
    assert_eq!(
        std::fs::read(dir.path().join("out/keep")).unwrap(),
        b"earlier build"
    );
}

#[test]
fn each_tampering_fails_with_its_code_naming_the_path_and_launch_starts_nothing() {
    let real = RealBundle::new();
    let runtime = real.runtime_executable();
    let model = real.model_path();
    let library = format!("{}/libllama.so.0", runtime.rsplit_once('/').unwrap().0);
    let state_root = real.dir.path().join("state");

    let expect = |what: &str, code: &str, path: Option<&str>| {
        let (exit, report) = real.verify_json();
        assert_eq!(exit, 2, "{what}: {report:#}");
        let found = failures(&report);
        assert!(
            found.contains(&(code.to_string(), path.map(str::to_string))),
            "{what}: expected {code} at {path:?}, found {found:?}"
        );
    };
    // The whole refusal is compared with its snapshot where the case names one (the
    // others name digests of the provisioned runtime, which vary).
    let expect_launch_refused = |what: &str, snapshot: Option<&str>| {
        let output = support::run(
            real.launch()
                .arg("launch")
                .arg("--state-root")
                .arg(&state_root),
        );
        assert_eq!(
            output.status.code(),
            Some(2),
            "{what}: {}",
            support::stderr(&output)
        );
        assert!(
            support::stderr(&output).contains("nothing was started"),
            "{what}: {}",
            support::stderr(&output)
        );
        if let Some(name) = snapshot {
            let redactions = real.workspace.redactions().path(real.dir.path(), "[DIR]");
            insta::assert_snapshot!(name, redactions.apply(&support::stderr(&output)));
        }
        assert!(
            !state_root.exists(),
            "{what}: launch created the state root after a failed verification"
        );
    };
    let clean = |what: &str| {
        let (exit, report) = real.verify_json();
        assert_eq!(exit, 0, "after restoring {what}: {report:#}");
    };

    // One flipped byte in the runtime, then in the model.
    flip_byte(&real.path(&runtime), 4096);
    expect("runtime byte", "BUNDLE_HASH_MISMATCH", Some(&runtime));
    expect_launch_refused("runtime byte", None);
    flip_byte(&real.path(&runtime), 4096);
    clean("runtime byte");
    flip_byte(&real.path(&model), 1_000_000);
    expect("model byte", "BUNDLE_HASH_MISMATCH", Some(&model));
    flip_byte(&real.path(&model), 1_000_000);

    // A truncated file.
    let original = std::fs::read(real.path(&library)).unwrap();
    std::fs::File::options()
        .write(true)
        .open(real.path(&library))
        .unwrap()
        .set_len(original.len() as u64 - 1)
        .unwrap();
    expect("truncated library", "BUNDLE_SIZE_MISMATCH", Some(&library));
    std::fs::write(real.path(&library), &original).unwrap();

    // A deleted file.
    std::fs::rename(
        real.path("app/index.html"),
        real.dir.path().join("index.html"),
    )
    .unwrap();
    expect("deleted file", "BUNDLE_MISSING", Some("app/index.html"));
    std::fs::rename(
        real.dir.path().join("index.html"),
        real.path("app/index.html"),
    )
    .unwrap();

    // An added file.
    std::fs::write(real.path("app/evil.js"), b"alert(1)").unwrap();
    expect("added file", "BUNDLE_UNLISTED", Some("app/evil.js"));
    expect_launch_refused("added file", Some("bundle_launch_unlisted_file"));
    std::fs::remove_file(real.path("app/evil.js")).unwrap();

    // A symlink swapped in for a shared library.
    let saved = real.dir.path().join("saved-library");
    std::fs::rename(real.path(&library), &saved).unwrap();
    std::os::unix::fs::symlink(&saved, real.path(&library)).unwrap();
    expect("symlink", "BUNDLE_SYMLINK", Some(&library));
    expect_launch_refused("symlink", Some("bundle_launch_symlinked_library"));
    std::fs::remove_file(real.path(&library)).unwrap();
    std::fs::rename(&saved, real.path(&library)).unwrap();

    // A hard link to the model.
    let second = real.dir.path().join("second-name.gguf");
    std::fs::hard_link(real.path(&model), &second).unwrap();
    expect("hard link", "BUNDLE_HARDLINK", Some(&model));
    std::fs::remove_file(&second).unwrap();
    clean("everything");

    // Manifest entries: `../`, an absolute path, a device name, a case-fold collision.
    let manifest_bytes = std::fs::read(real.path("arcane-bundle.json")).unwrap();
    for (entry, reason) in [
        ("../outside.txt", "parent-segment"),
        ("/etc/passwd", "absolute"),
        ("app/CON.txt", "device-name"),
        ("app/INDEX.html", "case-fold-duplicate"),
    ] {
        let mut manifest: Value = serde_json::from_slice(&manifest_bytes).unwrap();
        let files = manifest["files"].as_array_mut().unwrap();
        files.push(
            serde_json::json!({"path": entry, "size": 1, "sha256": "0".repeat(64), "exec": false}),
        );
        files.sort_by(|a, b| {
            a["path"]
                .as_str()
                .unwrap()
                .as_bytes()
                .cmp(b["path"].as_str().unwrap().as_bytes())
        });
        std::fs::write(
            real.path("arcane-bundle.json"),
            serde_json::to_vec_pretty(&manifest).unwrap(),
        )
        .unwrap();
        let (exit, report) = real.verify_json();
        assert_eq!(exit, 2, "{entry}: {report:#}");
        let failure = report["failures"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["code"] == "BUNDLE_PATH_INVALID")
            .unwrap_or_else(|| panic!("{entry}: {report:#}"));
        assert_eq!(failure["details"]["reason"], reason, "{entry}: {report:#}");
        if entry != "app/INDEX.html" {
            assert_eq!(failure["path"], entry);
        }
        // Nothing outside the bundle was opened: the bad entry is not reported missing.
        assert!(
            !failures(&report)
                .iter()
                .any(|(code, path)| code == "BUNDLE_MISSING" && path.as_deref() == Some(entry)),
            "{report:#}"
        );
    }
    std::fs::write(real.path("arcane-bundle.json"), &manifest_bytes).unwrap();
    clean("the manifest");
}

#[test]
fn launch_files_may_not_redirect_bundle_paths_and_the_launcher_must_live_in_a_bundle() {
    let real = RealBundle::new();
    let state_root = real.dir.path().join("state");
    let config = real.dir.path().join("launch.json");
    std::fs::write(
        &config,
        br#"{"stateRoot": "elsewhere", "appRoot": "/tmp/evil"}"#,
    )
    .unwrap();
    let output = support::run(
        real.launch()
            .args(["--output", "json", "launch", "--state-root"])
            .arg(&state_root)
            .arg("--launch-config")
            .arg(&config),
    );
    assert_eq!(
        output.status.code(),
        Some(2),
        "{}",
        support::stderr(&output)
    );
    let error = support::json(&output)["error"].clone();
    assert_eq!(error["code"], "ARCANE_USAGE");
    assert_eq!(error["details"]["key"], "appRoot");
    assert!(!state_root.exists() && !real.dir.path().join("elsewhere").exists());

    std::fs::write(&config, b"[]").unwrap();
    let output = support::run(
        real.launch()
            .args(["--output", "json", "launch", "--launch-config"])
            .arg(&config),
    );
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(support::json(&output)["error"]["code"], "ARCANE_USAGE");

    // The development binary is not inside a bundle.
    let output = support::run(real.workspace.arcane().args(["--output", "json", "launch"]));
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(support::json(&output)["error"]["code"], "ARCANE_USAGE");
}

#[test]
fn an_app_entry_runs_a_listed_program_with_the_running_core_endpoint_and_escapes_are_refused() {
    let real = RealBundle::new();
    set_read_only(&real.bundle, true);
    let before = snapshot(&real.bundle);
    let state_root = real.dir.path().join("state");

    for (entry, code) in [
        ("../bin/arcane", "BUNDLE_PATH_INVALID"),
        ("/usr/bin/env", "BUNDLE_PATH_INVALID"),
        ("tools\\show-endpoint", "BUNDLE_PATH_INVALID"),
        ("data.txt", "ARCANE_USAGE"),
        ("tools/missing", "ARCANE_USAGE"),
    ] {
        let output = support::run(
            real.launch()
                .args(["--output", "json", "launch", "--state-root"])
                .arg(&state_root)
                .args(["--arcane-app-entry", entry]),
        );
        assert_eq!(
            output.status.code(),
            Some(2),
            "{entry}: {}",
            support::stderr(&output)
        );
        assert_eq!(support::json(&output)["error"]["code"], code, "{entry}");
    }

    // A Core host is running for this state root: it holds the owner lease, listens,
    // and its endpoint file names it (this test stands in for the host, which this
    // test does not exercise).
    std::fs::create_dir_all(state_root.join(".arcane")).unwrap();
    let _host = arcane_lock::OwnerLease::acquire(&state_root, "core").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let endpoint = state_root.join(".arcane/core.json");
    let record = serde_json::json!({"protocol": "arcane/1", "url": format!("http://127.0.0.1:{port}"), "host": "127.0.0.1", "port": port, "pid": std::process::id(), "token": "t0ken", "startedAt": "2026-11-29T00:00:00.000Z"});
    std::fs::write(&endpoint, serde_json::to_vec(&record).unwrap()).unwrap();
    let output = support::run(
        real.launch()
            .arg("launch")
            .arg("--state-root")
            .arg(&state_root)
            .args([
                "--arcane-app-entry",
                "tools/show-endpoint",
                "--flag",
                "value",
            ]),
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        support::stderr(&output)
    );
    let stdout = support::stdout(&output);
    assert!(
        stdout.contains(&format!("endpoint={}", endpoint.display())),
        "{stdout}"
    );
    assert!(stdout.contains("args=--flag value"), "{stdout}");
    // Run through its verified descriptor, the program learns its bundle path here.
    let entry = real
        .bundle
        .canonicalize()
        .unwrap()
        .join("app/tools/show-endpoint");
    assert!(
        stdout.contains(&format!("entry={}\n", entry.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains("t0ken"),
        "the program could not read the endpoint file: {stdout}"
    );
    assert_eq!(
        snapshot(&real.bundle),
        before,
        "launch wrote inside the bundle"
    );
    set_read_only(&real.bundle, false);
}

/// Kills a process group on drop (the launched Core host and its engine).
struct GroupGuard(Child);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let pid = self.0.id() as i32;
        // SAFETY: signals the process group the test created for the child.
        unsafe {
            libc::kill(-pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: as above.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
        let _ = self.0.wait();
    }
}

/// The endpoint record of the host running on `state_root`.
fn endpoint_of(state_root: &Path) -> Value {
    let bytes = std::fs::read(state_root.join(".arcane/core.json")).expect("core.json");
    serde_json::from_slice(&bytes).expect("a JSON endpoint record")
}

/// One HTTP/1.1 request over loopback; returns (status, body).
fn http(url: &str, method: &str, path: &str, token: &str, body: &str) -> (u16, String) {
    let address = url.trim_start_matches("http://").trim_end_matches('/');
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    support::http_exchange(address, &request)
}

#[test]
fn a_launched_read_only_bundle_answers_a_chat_completion_and_writes_only_its_state_root() {
    let real = RealBundle::new();
    set_read_only(&real.bundle, true);
    let before = snapshot(&real.bundle);
    let state_root = real.dir.path().join("state");
    let mut host = real.launch_core(&state_root);
    host.wait_for("local-ai.model.ready", START);
    let record = endpoint_of(&state_root);
    let url = record["url"].as_str().unwrap();
    let token = record["token"].as_str().unwrap();
    let body = r#"{"messages":[{"role":"user","content":"Say hello."}],"max_tokens":8}"#;
    let (status, answer) = http(url, "POST", "/v1/chat/completions", token, body);
    assert_eq!(status, 200, "{answer}");
    let completion: Value =
        serde_json::from_str(answer.trim()).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert!(
        completion["choices"][0]["message"]["content"].is_string(),
        "{completion:#}"
    );
    // Stop the Core host (SIGTERM, a clean exit), then compare: nothing was written.
    host.terminate();
    assert_eq!(
        snapshot(&real.bundle),
        before,
        "launch wrote inside the bundle"
    );
    assert!(
        state_root.join(".arcane").is_dir(),
        "the state went elsewhere"
    );
    set_read_only(&real.bundle, false);
}

#[test]
fn an_app_entry_without_a_running_core_starts_one_for_the_program_and_stops_it_after() {
    let real = RealBundle::new();
    set_read_only(&real.bundle, true);
    let before = snapshot(&real.bundle);
    let state_root = real.dir.path().join("state");
    let mut command = real.launch();
    command
        .arg("launch")
        .arg("--state-root")
        .arg(&state_root)
        .args(["--arcane-app-entry", "tools/show-endpoint", "one"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let guard = GroupGuard(command.spawn().unwrap());
    let mut child = guard;
    let status = support::wait_for_exit(
        &mut child.0,
        Duration::from_secs(180),
        "launch --arcane-app-entry",
    );
    let mut stdout = String::new();
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let mut stderr = String::new();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        status.success(),
        "{status}: {stdout}\n{stderr}\nlog: {}",
        std::fs::read_to_string(state_root.join("logs/core.log")).unwrap_or_default()
    );
    let endpoint = state_root.join(".arcane/core.json");
    assert!(
        stdout.contains(&format!("endpoint={}", endpoint.display())),
        "{stdout}"
    );
    assert!(stdout.contains("args=one"), "{stdout}");
    // Issue 14, item 13: the state root launch created is private (0700), like its logs.
    for dir in [state_root.clone(), state_root.join("logs")] {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", dir.display());
    }
    // The program read the live endpoint record of the Core host launch started for it.
    let json_start = stdout
        .find('{')
        .unwrap_or_else(|| panic!("the program printed no endpoint record: {stdout}"));
    let record: Value = serde_json::from_str(stdout[json_start..].trim()).unwrap();
    assert!(
        record["token"].as_str().is_some_and(|t| !t.is_empty()),
        "{record:#}"
    );
    let pid = record["pid"].as_i64().unwrap() as i32;
    // That Core host is gone once the program has exited.
    // SAFETY: signal 0 only probes whether the process exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    assert!(
        !alive,
        "the Core host (pid {pid}) started for the app entry is still running"
    );
    assert_eq!(
        snapshot(&real.bundle),
        before,
        "launch wrote inside the bundle"
    );
    set_read_only(&real.bundle, false);
}

#[test]
fn ctrl_c_during_a_build_removes_only_what_the_build_created() {
    let workspace = TestWorkspace::new();
    let output = support::run(
        workspace
            .arcane()
            .args(["runtime", "add", "llama.cpp", "--executable"])
            .arg(support::llama_server()),
    );
    assert!(
        output.status.success(),
        "runtime add: {}",
        support::stderr(&output)
    );
    let output = support::run(
        workspace
            .arcane()
            .args(["model", "add", "smollm2", "--file"])
            .arg(support::smollm2()),
    );
    assert!(
        output.status.success(),
        "model add: {}",
        support::stderr(&output)
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("app")).unwrap();
    std::fs::write(dir.path().join("app/index.html"), b"hi").unwrap();
    std::fs::write(dir.path().join("earlier"), b"not ours").unwrap();
    let mut child = workspace
        .arcane()
        .args([
            "--output", "ndjson", "bundle", "build", "--app-id", "demo", "--model", "smollm2",
            "--app",
        ])
        .arg(dir.path().join("app"))
        .arg("--out")
        .arg(dir.path().join("out"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupt as soon as copying is under way.
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let copying = line.contains("\"bundle.build.progress\"");
        seen.push(line);
        if copying {
            // SAFETY: sends SIGINT to the child this test spawned.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGINT);
            }
            break;
        }
    }
    seen.extend(lines.map_while(Result::ok));
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{seen:#?}");
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["app", "earlier"],
        "the build left something behind: {seen:#?}"
    );
    assert_eq!(
        std::fs::read(dir.path().join("earlier")).unwrap(),
        b"not ours"
    );
}

#[test]
fn the_background_core_of_an_app_entry_dies_with_a_killed_launch() {
    // Issue: the background Core host of `launch --arcane-app-entry` had no
    // parent-death signal and was orphaned when its launch died (a second Ctrl-C).
    let real = RealBundle::new();
    let state_root = real.dir.path().join("state");
    let pidfile = real.dir.path().join("core.pid");
    let mut command = real.launch();
    command
        .arg("launch")
        .arg("--state-root")
        .arg(&state_root)
        .args(["--arcane-app-entry", "tools/hold"])
        .arg(&pidfile)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut launch = GroupGuard(command.spawn().unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let core: i32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            break pid;
        }
        assert!(
            launch.0.try_wait().unwrap().is_none(),
            "launch exited early; log: {}",
            std::fs::read_to_string(state_root.join("logs/core.log")).unwrap_or_default()
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the Core host never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // SAFETY: SIGKILL to the launch process this test started (not its group).
    unsafe { libc::kill(launch.0.id() as libc::pid_t, libc::SIGKILL) };
    let _ = launch.0.wait();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while arcane_process::start_time(core as u32).is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the Core host (pid {core}) outlived its killed launch"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn signed_bundles_round_trip_and_an_unsigned_tampered_or_foreign_one_is_refused() {
    // Issue 14: flipping a model byte and rewriting both digests in the manifest
    // verified and launched. With a trusted key it is refused, naming the key ids.
    let real = RealBundle::new();
    let keys = real.dir.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    let mut ids = Vec::new();
    for name in ["mine", "theirs"] {
        let out = support::run(
            real.workspace
                .arcane()
                .args(["--output", "json", "bundle", "keygen", "--out"])
                .arg(keys.join(name)),
        );
        assert!(out.status.success(), "{}", support::stderr(&out));
        ids.push(support::json(&out)["keyId"].as_str().unwrap().to_string());
        let mode = std::fs::metadata(keys.join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "the secret key is private");
    }
    // keygen never overwrites a key.
    let again = support::run(
        real.workspace
            .arcane()
            .args(["bundle", "keygen", "--out"])
            .arg(keys.join("mine")),
    );
    assert!(!again.status.success());
    let app = real.dir.path().join("app");
    let signed = real.dir.path().join("signed");
    let out = support::run(
        real.workspace
            .arcane()
            .args(["bundle", "build", "--app"])
            .arg(&app)
            .args(["--model", "smollm2", "--execution-target", "cpu", "--sign"])
            .arg(keys.join("mine"))
            .arg("--out")
            .arg(&signed),
    );
    assert!(out.status.success(), "{}", support::stderr(&out));
    let verify = |dir: &Path, key: Option<&str>| {
        let mut command = real.workspace.arcane();
        command
            .args(["--output", "json", "bundle", "verify"])
            .arg(dir);
        if let Some(key) = key {
            command
                .arg("--trusted-key")
                .arg(keys.join(format!("{key}.pub")));
        }
        let out = support::run(&mut command);
        (out.status.code(), support::json(&out))
    };
    let first_code = |report: &Value| report["failures"][0]["code"].as_str().map(str::to_string);
    // Signed, trusted key: clean. Another key: refused naming both ids.
    assert_eq!(verify(&signed, Some("mine")).0, Some(0));
    let (code, report) = verify(&signed, Some("theirs"));
    assert_eq!(code, Some(2));
    assert_eq!(
        first_code(&report).as_deref(),
        Some("BUNDLE_SIGNATURE_INVALID"),
        "{report}"
    );
    let message = report["failures"][0]["message"].as_str().unwrap();
    assert!(
        message.contains(&ids[0]) && message.contains(&ids[1]),
        "{message}"
    );
    // Unsigned with a trusted key: refused.
    let (code, report) = verify(&real.bundle, Some("mine"));
    assert_eq!(code, Some(2));
    assert_eq!(
        first_code(&report).as_deref(),
        Some("BUNDLE_UNSIGNED"),
        "{report}"
    );
    // The attack: a model byte flipped and both digests rewritten in the manifest.
    let manifest_path = signed.join("arcane-bundle.json");
    let mut manifest: Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    let model_path = manifest["models"][0]["path"].as_str().unwrap().to_string();
    let model_file = signed.join(&model_path);
    let mut bytes = std::fs::read(&model_file).unwrap();
    bytes[1000] ^= 0xFF;
    std::fs::write(&model_file, &bytes).unwrap();
    let digest = {
        let out = Command::new("sha256sum").arg(&model_file).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    manifest["models"][0]["sha256"] = Value::String(digest.clone());
    for file in manifest["files"].as_array_mut().unwrap() {
        if file["path"] == model_path.as_str() {
            file["sha256"] = Value::String(digest.clone());
        }
    }
    std::fs::write(
        &manifest_path,
        serde_json::to_vec_pretty(&manifest).unwrap(),
    )
    .unwrap();
    assert_eq!(
        verify(&signed, None).0,
        Some(0),
        "integrity alone cannot tell"
    );
    let (code, report) = verify(&signed, Some("mine"));
    assert_eq!(code, Some(2));
    assert_eq!(
        first_code(&report).as_deref(),
        Some("BUNDLE_SIGNATURE_INVALID"),
        "{report}"
    );
    // launch refuses it too, by flag and by launch file, and starts nothing.
    let launch_file = real.dir.path().join("launch.json");
    std::fs::write(
        &launch_file,
        serde_json::json!({"trustedKey": keys.join("mine.pub")}).to_string(),
    )
    .unwrap();
    for extra in [
        vec![
            "--trusted-key".to_string(),
            keys.join("mine.pub").display().to_string(),
        ],
        vec![
            "--launch-config".to_string(),
            launch_file.display().to_string(),
        ],
    ] {
        let out = support::run(
            Command::new(signed.join("bin/arcane"))
                .env_remove("ARCANE_WORKSPACE")
                .args(["--output", "json", "launch", "--state-root"])
                .arg(real.dir.path().join("state-signed"))
                .args(&extra),
        );
        assert_eq!(
            out.status.code(),
            Some(2),
            "{extra:?}: {}",
            support::stdout(&out)
        );
        assert!(
            support::stdout(&out).contains("BUNDLE_SIGNATURE_INVALID"),
            "{}",
            support::stdout(&out)
        );
        assert!(!real
            .dir
            .path()
            .join("state-signed/.arcane/core.json")
            .exists());
    }
}

/// `--runtime onnx` copies the registered ONNX Runtime library (and its provider
/// library) into the bundle, listed and verified like every file (a flipped byte is
/// a hash mismatch naming it), and `launch` hands the bundled copy to the Core host.
#[test]
fn a_bundle_carries_the_onnx_library_verified_and_launch_hands_it_to_the_core() {
    let library = support::provisioned("ARCANE_ONNXRUNTIME");
    let real = RealBundle::with_onnx(&library);
    let manifest = real.manifest();
    let entry = &manifest["onnxRuntimes"][0];
    assert_eq!(entry["id"], "onnx", "{manifest:#}");
    assert!(
        entry["version"].as_str().unwrap().starts_with("1.31"),
        "{entry}"
    );
    let relative = entry["library"].as_str().unwrap().to_string();
    let name = library.file_name().unwrap().to_str().unwrap();
    assert!(
        relative.starts_with("runtimes/onnx/") && relative.ends_with(name),
        "{relative}"
    );
    assert_eq!(
        std::fs::read(real.path(&relative)).unwrap(),
        std::fs::read(&library).unwrap()
    );
    let listed: Vec<&str> = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert!(listed.contains(&relative.as_str()), "{listed:?}");
    let providers = library.with_file_name("libonnxruntime_providers_shared.so");
    if providers.is_file() {
        let dir = relative.rsplit_once('/').unwrap().0;
        assert!(
            listed.contains(&format!("{dir}/libonnxruntime_providers_shared.so").as_str()),
            "{listed:?}"
        );
    }
    let (code, report) = real.verify_json();
    assert_eq!(code, 0, "{report:#}");

    let state_root = real.dir.path().join("state");
    let mut command = real.launch();
    command
        .arg("launch")
        .arg("--state-root")
        .arg(&state_root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(real.dir.path().join("launch.log")).unwrap());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut guard = GroupGuard(command.spawn().unwrap());
    let log = || std::fs::read_to_string(real.dir.path().join("launch.log")).unwrap_or_default();
    let endpoint = state_root.join(".arcane/core.json");
    let deadline = Instant::now() + Duration::from_secs(120);
    let record: Value = loop {
        if let Some(record) = std::fs::read(&endpoint)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        {
            break record;
        }
        if let Ok(Some(status)) = guard.0.try_wait() {
            panic!("launch exited ({status}): {}", log());
        }
        assert!(Instant::now() < deadline, "no endpoint file: {}", log());
        std::thread::sleep(Duration::from_millis(100));
    };
    let body = r#"{"protocol":"arcane/1","type":"request","id":"s","method":"onnx.status"}"#;
    let (status, answer) = http(
        record["url"].as_str().unwrap(),
        "POST",
        "/v1/rpc",
        record["token"].as_str().unwrap(),
        body,
    );
    assert_eq!(status, 200, "{answer}");
    let frame: Value =
        serde_json::from_str(answer.trim()).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(
        frame["result"]["runtime"]["library"],
        real.path(&relative).display().to_string(),
        "{frame:#}"
    );
    drop(guard);

    flip_byte(&real.path(&relative), 4096);
    let (code, report) = real.verify_json();
    assert_eq!(code, 2, "{report:#}");
    assert!(
        failures(&report).contains(&("BUNDLE_HASH_MISMATCH".to_string(), Some(relative.clone()))),
        "{report:#}"
    );
}

/// Issue 19, item 5: a bundle whose program, model directory or runtime another user
/// could change before it runs fails `bundle verify` with its own code, the path and
/// the fix, and `launch` runs nothing (the program's output never appears).
#[test]
fn a_bundle_another_user_could_change_fails_verification_and_launch_runs_nothing() {
    let real = RealBundle::new();
    let (exit, report) = real.verify_json();
    assert_eq!(exit, 0, "a built bundle verifies: {report:#}");
    let state_root = real.dir.path().join("state");
    let chmod = |relative: &str, mode: u32| {
        std::fs::set_permissions(real.path(relative), std::fs::Permissions::from_mode(mode))
            .unwrap()
    };
    let refused = |what: &str, code: &str, path: &str, fix: &str| {
        let (exit, report) = real.verify_json();
        assert_eq!(exit, 2, "{what}: {report:#}");
        let failure = report["failures"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["code"] == code && f["path"] == path)
            .unwrap_or_else(|| panic!("{what}: expected {code} at {path}: {report:#}"));
        assert!(
            failure["details"]["fix"].as_str().unwrap().starts_with(fix),
            "{what}: {failure:#}"
        );
        // The app entry is not run.
        let output = support::run(
            real.launch()
                .args(["launch", "--state-root"])
                .arg(&state_root)
                .args(["--arcane-app-entry", "tools/show-endpoint"]),
        );
        assert_eq!(
            output.status.code(),
            Some(2),
            "{what}: {}",
            support::stderr(&output)
        );
        assert!(
            !support::stdout(&output).contains("endpoint="),
            "{what}: the program ran: {}",
            support::stdout(&output)
        );
        assert!(
            support::stderr(&output).contains(code),
            "{what}: {}",
            support::stderr(&output)
        );
    };

    chmod("app/tools/show-endpoint", 0o777);
    refused(
        "a world-writable program",
        "BUNDLE_WRITABLE",
        "app/tools/show-endpoint",
        "chmod go-w",
    );
    chmod("app/tools/show-endpoint", 0o755);

    chmod("models/smollm2", 0o777);
    refused(
        "a world-writable model directory",
        "BUNDLE_WRITABLE",
        "models/smollm2",
        "chmod go-w",
    );
    chmod("models/smollm2", 0o755);

    let runtime = real.runtime_executable();
    chmod(&runtime, 0o4755);
    refused(
        "a setuid runtime",
        "BUNDLE_SETID",
        &runtime,
        "chmod u-s,g-s",
    );
    chmod(&runtime, 0o755);

    std::os::unix::fs::chown(real.path("app/tools/show-endpoint"), Some(65534), None).unwrap();
    refused(
        "a program another user owns",
        "BUNDLE_FOREIGN_OWNER",
        "app/tools/show-endpoint",
        "chown",
    );
    std::os::unix::fs::chown(real.path("app/tools/show-endpoint"), Some(0), None).unwrap();
    let (exit, report) = real.verify_json();
    assert_eq!(exit, 0, "fixed: {report:#}");
}

/// Issue 19, item 13: a build killed mid-way (`kill -9`) left its `.partial-*` tree
/// (107 MB) for good; the next build of the same output removes it — and only a tree
/// whose builder is provably gone.
#[test]
fn a_partial_tree_left_by_a_killed_build_is_removed_by_the_next_build() {
    let workspace = TestWorkspace::new();
    for args in [
        vec!["runtime", "add", "llama.cpp", "--executable"],
        vec!["model", "add", "smollm2", "--file"],
    ] {
        let file = if args[0] == "runtime" {
            support::llama_server()
        } else {
            support::smollm2()
        };
        let output = support::run(workspace.arcane().args(&args).arg(file));
        assert!(output.status.success(), "{}", support::stderr(&output));
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("app")).unwrap();
    std::fs::write(dir.path().join("app/index.html"), b"hi").unwrap();
    let build = |ws: &TestWorkspace| {
        let mut command = ws.arcane();
        command
            .args([
                "--output", "ndjson", "bundle", "build", "--app-id", "demo", "--model", "smollm2",
                "--app",
            ])
            .arg(dir.path().join("app"))
            .arg("--out")
            .arg(dir.path().join("out"));
        command
    };
    let partials = || -> Vec<String> {
        std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".out.partial-"))
            .collect()
    };
    let mut child = build(&workspace)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    for line in lines {
        if line.unwrap().contains("\"bundle.build.progress\"") {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let left = partials();
    assert_eq!(left.len(), 1, "{left:?}");
    // A partial tree of a build still running (this test process) is not touched.
    let me = std::process::id();
    let start = arcane_process::start_time(me).unwrap();
    let live = format!(".out.partial-{me}-{start}-0123456789abcdef");
    std::fs::create_dir(dir.path().join(&live)).unwrap();
    let output = support::run(&mut build(&workspace));
    assert!(output.status.success(), "{}", support::stderr(&output));
    assert_eq!(partials(), vec![live.clone()]);
    std::fs::remove_dir(dir.path().join(live)).unwrap();
}

/// A bundle's packaged web (`app/web/`), served by its launched Core: `arcane open
/// --app` logs a real browser in, and the app lists the bundle's model and streams a
/// chat from it.
#[test]
fn a_launched_bundle_serves_its_web_app_which_lists_the_models_and_streams_a_chat() {
    let real = RealBundle::new();
    let state_root = real.dir.path().join("state");
    let mut host = real.launch_core(&state_root);
    host.wait_for("local-ai.model.ready", START);
    let mut open = Command::new(support::arcane_bin());
    open.arg("--workspace")
        .arg(&state_root)
        .args(["open", "--app", "--print"])
        .env_remove("ARCANE_WORKSPACE");
    let open = support::run(&mut open);
    assert!(open.status.success(), "{}", support::stderr(&open));
    let result = crate::web::app_in_browser(support::stdout(&open).trim());
    assert_eq!(result["error"], Value::Null, "{result}");
    assert!(
        !result["models"].as_str().unwrap_or_default().is_empty(),
        "{result}"
    );
    assert!(
        !result["answer"].as_str().unwrap_or_default().is_empty(),
        "{result}"
    );
    assert!(result["reads"].as_u64() >= Some(2), "streamed: {result}");
}

/// A second launch of the same app on the same state root joins the running Core host
/// (not refused): it says so, and ends when that host does.
#[test]
fn a_second_launch_on_the_same_state_root_joins_the_running_host() {
    let real = RealBundle::new();
    let state_root = real.dir.path().join("state");
    let mut first = real.launch_core(&state_root);
    first.wait_for("local-ai.model.ready", START);
    let record = endpoint_of(&state_root);
    let mut second = real.launch_core(&state_root);
    let said = second.wait_line("the joined line", Duration::from_secs(30), |line| {
        line["joined"].is_object()
    });
    assert_eq!(said["joined"]["pid"], record["pid"], "{said}");
    assert!(
        crate::serve::alive(second.pid()),
        "it lasts while the host runs"
    );
    // The first (the host) ends: the joined launch ends with it, exit 0.
    first.terminate();
    assert_eq!(second.wait_exit(Duration::from_secs(30)), Some(0));
}

#[test]
fn a_bundle_carries_whisper_models_and_voices_and_its_launcher_serves_them_beside_chat() {
    let real = RealBundle::with_speech();
    let manifest = real.manifest();
    let models: Vec<(String, String, String)> = manifest["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let text = |k: &str| m[k].as_str().unwrap().to_string();
            (text("id"), text("engine"), text("format"))
        })
        .collect();
    let expected = [
        ("smollm2", "llama.cpp", "gguf"),
        ("tiny-en", "whisper.cpp", "whisper-ggml"),
        ("joe", "piper", "piper-voice"),
    ]
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()));
    assert_eq!(models, expected, "{manifest:#}");
    // The voice's configuration travels with it, verified like every file.
    let voice = manifest["models"][2]["path"].as_str().unwrap();
    assert!(
        manifest["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["path"] == format!("{voice}.json")),
        "{manifest:#}"
    );
    let (code, report) = real.verify_json();
    assert_eq!(code, 0, "{report:#}");
    // A voice without its configuration is not a bundle that verifies.
    let config = real.path(&format!("{voice}.json"));
    std::fs::rename(&config, config.with_extension("moved")).unwrap();
    let (code, report) = real.verify_json();
    assert_ne!(code, 0, "{report:#}");
    assert!(report.to_string().contains("BUNDLE_MISSING"), "{report:#}");
    std::fs::rename(config.with_extension("moved"), &config).unwrap();

    let state_root = real.dir.path().join("state");
    let mut host = real.launch_core(&state_root);
    host.wait_for("core.listening", START);
    let arcane = |args: &[&str]| {
        let mut command = Command::new(support::arcane_bin());
        command
            .env_remove("ARCANE_WORKSPACE")
            .arg("--workspace")
            .arg(&state_root)
            .args(args);
        command
    };
    let spoken = real.dir.path().join("spoken.wav");
    let said = support::run(
        arcane(&["speak", crate::speech::SENTENCE, "--model", "joe", "--out"]).arg(&spoken),
    );
    assert!(said.status.success(), "{}", support::stderr(&said));
    let heard = support::json(&support::run(
        arcane(&["--output", "json", "transcribe", "--model", "tiny-en"]).arg(&spoken),
    ));
    let rate = crate::speech::word_error_rate(
        crate::speech::SENTENCE,
        heard["text"].as_str().unwrap_or_default(),
    );
    assert!(rate <= 0.1, "word error rate {rate}: {heard}");
    // The chat model is the default, as before.
    let record = endpoint_of(&state_root);
    let body = r#"{"messages":[{"role":"user","content":"Say hello."}],"max_tokens":4}"#;
    let (status, answer) = http(
        record["url"].as_str().unwrap(),
        "POST",
        "/v1/chat/completions",
        record["token"].as_str().unwrap(),
        body,
    );
    assert_eq!(status, 200, "{answer}");
    host.terminate();
}

#[test]
fn a_bundle_carries_the_image_library_and_model_and_its_launcher_draws_with_them() {
    let real = RealBundle::with_image();
    let manifest = real.manifest();
    let image = manifest["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "sdxs")
        .unwrap_or_else(|| panic!("no image model: {manifest:#}"));
    assert_eq!(image["engine"], "stable-diffusion.cpp", "{manifest:#}");
    assert_eq!(image["format"], "diffusion", "{manifest:#}");
    let library = manifest["stableDiffusionCppRuntimes"][0]["library"]
        .as_str()
        .unwrap_or_else(|| panic!("no image library: {manifest:#}"))
        .to_string();
    let (code, report) = real.verify_json();
    assert_eq!(code, 0, "{report:#}");

    let state_root = real.dir.path().join("state");
    // The launcher hands the core the bundled library, never the variable's.
    let mut command = real.launch();
    command
        .env_remove("ARCANE_SD_LIBRARY")
        .args(["--output", "ndjson", "launch", "--state-root"])
        .arg(&state_root)
        .stdin(Stdio::null());
    let mut host = Serve::spawn(command);
    host.wait_for("core.listening", START);
    let out = real.dir.path().join("drawn.png");
    let drawn = support::run(
        Command::new(support::arcane_bin())
            .env_remove("ARCANE_WORKSPACE")
            .arg("--workspace")
            .arg(&state_root)
            .args([
                "imagine",
                "a lighthouse",
                "--model",
                "sdxs",
                "--size",
                "64x64",
            ])
            .args(["--steps", "1", "--cfg-scale", "1", "--out"])
            .arg(&out),
    );
    assert!(drawn.status.success(), "{}", support::stderr(&drawn));
    assert_eq!(&std::fs::read(&out).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
    let worker = crate::front_door::process_tree(host.pid())
        .into_iter()
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("__sd-worker"))
        })
        .expect("the image worker runs");
    let cmdline = std::fs::read(format!("/proc/{worker}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(
        cmdline.contains(&*real.path(&library).to_string_lossy()),
        "the worker loads {library} of the bundle: {cmdline}"
    );
    host.terminate();
}
