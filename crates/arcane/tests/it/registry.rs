//! Tests of `arcane runtime` and `arcane model` through the real binary: the real
//! llama-server and SmolLM2, archives served on loopback, concurrent processes, exit
//! codes and cancellation.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

fn sha256sum(path: &Path) -> String {
    let output = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("run sha256sum");
    assert!(output.status.success());
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Kills and reaps a child process when dropped (also on panic).
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Serves `body` to every request on 127.0.0.1; when `stall_after` is set, sends only
/// that many bytes of it and keeps the connection open (silent) until the test ends.
fn serve(body: Vec<u8>, stall_after: Option<usize>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut open = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            let mut request = Vec::new();
            let mut buffer = [0u8; 1024];
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buffer[..n]),
                }
            }
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let sent = stall_after.unwrap_or(body.len());
            let _ = stream.write_all(&body[..sent]);
            let _ = stream.flush();
            if stall_after.is_some() {
                open.push(stream);
            }
        }
    });
    format!("http://{address}")
}

/// A release-style `tar.gz` of the real llama-server and its libraries
/// (`build/bin/...`, symlinks kept), written under `dir`.
fn real_release_archive(dir: &Path) -> PathBuf {
    let server = llama_server();
    let staging = dir.join("release");
    std::fs::create_dir_all(staging.join("build")).unwrap();
    let status = Command::new("cp")
        .arg("-a")
        .arg(server.parent().unwrap())
        .arg(staging.join("build/bin"))
        .status()
        .unwrap();
    assert!(status.success());
    let archive = dir.join("llama-bin-ubuntu-x64.tar.gz");
    let status = Command::new("tar")
        .arg("-czf")
        .arg(&archive)
        .arg("-C")
        .arg(&staging)
        .arg("build")
        .status()
        .unwrap();
    assert!(status.success());
    archive
}

fn error_of(output: &std::process::Output) -> serde_json::Value {
    json(output)["error"].clone()
}

#[test]
fn the_real_runtime_and_model_register_and_list_with_version_size_and_digest() {
    let server = llama_server();
    let model_file = smollm2();
    let ws = TestWorkspace::new();

    // Exactly the invocations scripts/run.sh uses.
    let added = run(ws
        .arcane()
        .args(["runtime", "add", "llama.cpp", "--executable"])
        .arg(&server)
        .args(["--backend", "cpu"]));
    assert!(added.status.success(), "{}", stderr(&added));
    assert!(
        stdout(&added).contains("registered runtime `llama.cpp`"),
        "{}",
        stdout(&added)
    );
    let added = run(ws
        .arcane()
        .args(["model", "add", "smollm2-135m", "--file"])
        .arg(&model_file));
    assert!(added.status.success(), "{}", stderr(&added));

    let listed = run(ws.arcane().args(["runtime", "list", "--output", "json"]));
    assert!(listed.status.success());
    assert!(
        stdout(&listed).contains("\"id\": \"llama.cpp\""),
        "scripts/run.sh greps for this: {}",
        stdout(&listed)
    );
    let runtime = json(&listed)["runtimes"][0].clone();
    assert_eq!(runtime["engine"], "llama.cpp");
    assert_eq!(runtime["backend"], "cpu");
    assert_eq!(
        runtime["executable"],
        std::fs::canonicalize(&server)
            .unwrap()
            .display()
            .to_string()
    );
    let version = runtime["version"].as_str().unwrap().to_string();
    let printed = Command::new(&server).arg("--version").output().unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&printed.stdout),
        String::from_utf8_lossy(&printed.stderr)
    );
    assert!(
        printed.contains(version.trim_start_matches('b')),
        "version {version} not in {printed}"
    );

    let listed = run(ws.arcane().args(["model", "list", "--output", "json"]));
    assert!(
        stdout(&listed).contains("\"id\": \"smollm2-135m\""),
        "scripts/run.sh greps for this: {}",
        stdout(&listed)
    );
    let model = json(&listed)["models"][0].clone();
    let digest = sha256sum(&model_file);
    assert_eq!(
        model["sha256"], digest,
        "digest must equal an independent sha256sum"
    );
    assert_eq!(model["size"], std::fs::metadata(&model_file).unwrap().len());
    assert_eq!(model["gguf"]["quantization"], "Q4_1");
    assert_eq!(model["gguf"]["architecture"], "llama");
    assert!(Path::new(model["path"].as_str().unwrap())
        .starts_with(ws.path().join(".arcane/models/smollm2-135m")));

    // Human lists: version and backend; size and digest prefix.
    let human = stdout(&run(ws.arcane().args(["runtime", "list"])));
    let row = human
        .lines()
        .find(|l| l.starts_with("llama.cpp "))
        .unwrap_or_else(|| panic!("{human}"));
    assert!(row.contains(&version) && row.contains("cpu"), "{row}");
    let human = stdout(&run(ws.arcane().args(["model", "list"])));
    let row = human
        .lines()
        .find(|l| l.starts_with("smollm2-135m "))
        .unwrap_or_else(|| panic!("{human}"));
    assert!(row.contains(&digest[..12]), "{row}");
    assert!(row.contains(" MB"), "{row}");
    assert!(row.contains("Q4_1"), "{row}");
}

#[test]
fn two_processes_adding_models_at_once_leave_a_valid_registry_with_both() {
    let model_file = smollm2();
    let ws = TestWorkspace::new();
    let ids = ["first", "second", "third", "fourth"];
    let children: Vec<ChildGuard> = ids
        .iter()
        .map(|id| {
            ChildGuard(
                ws.arcane()
                    .args(["model", "add", id, "--file"])
                    .arg(&model_file)
                    .args(["--output", "json"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    for mut child in children {
        let mut out = String::new();
        child
            .0
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let status = child.0.wait().unwrap();
        assert!(status.success(), "{out}");
    }
    let text = std::fs::read_to_string(ws.path().join(".arcane/registry.json")).unwrap();
    let registry: serde_json::Value =
        serde_json::from_str(&text).expect("the registry file is valid JSON");
    let mut listed: Vec<String> = registry["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    listed.sort();
    let mut expected: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(listed, expected);
    for id in ids {
        assert!(ws
            .path()
            .join(".arcane/models")
            .join(id)
            .join("SmolLM2-135M-Instruct.Q4_1.gguf")
            .is_file());
    }
    // No staging directories are left.
    assert!(tree(&ws.path().join(".arcane/models"))
        .iter()
        .all(|p| !p.contains(".staging")));
}

#[test]
fn bad_input_exits_with_stable_codes_naming_the_value() {
    let ws = TestWorkspace::new();
    let not_gguf = ws.path().join("notes.txt");
    std::fs::write(&not_gguf, "hello world").unwrap();

    let out = run(ws
        .arcane()
        .args(["model", "add", "notes", "--file"])
        .arg(&not_gguf)
        .args(["--output", "json"]));
    assert_eq!(out.status.code(), Some(1));
    let redactions = ws.redactions();
    insta::assert_snapshot!("model_add_not_gguf_json", redactions.json(&json(&out)));

    let out = run(ws
        .arcane()
        .args(["model", "add", "Bad/Id", "--file"])
        .arg(&not_gguf)
        .args(["--output", "json"]));
    assert_eq!(out.status.code(), Some(2));
    insta::assert_snapshot!("model_add_bad_id_json", redactions.json(&json(&out)));

    let out = run(ws
        .arcane()
        .args(["runtime", "remove", "nope", "--output", "json"]));
    assert_eq!(out.status.code(), Some(1));
    insta::assert_snapshot!("runtime_remove_unknown_json", redactions.json(&json(&out)));
    let out = run(ws.arcane().args(["model", "remove", "nope"]));
    assert_eq!(out.status.code(), Some(1));
    insta::assert_snapshot!("model_remove_unknown", redactions.apply(&stderr(&out)));

    let fake = ws.path().join("fake-server");
    std::fs::write(&fake, "#!/bin/sh\necho 'I am not llama-server'\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = run(ws
        .arcane()
        .args(["runtime", "add", "llama.cpp", "--executable"])
        .arg(&fake));
    assert_eq!(out.status.code(), Some(1));
    insta::assert_snapshot!(
        "runtime_add_not_llama_server",
        redactions.apply(&stderr(&out))
    );
    let out = run(ws
        .arcane()
        .args([
            "runtime",
            "add",
            "llama.cpp",
            "--output",
            "json",
            "--executable",
        ])
        .arg(&fake));
    assert_eq!(out.status.code(), Some(1));
    insta::assert_snapshot!(
        "runtime_add_not_llama_server_json",
        redactions.json(&json(&out))
    );

    let out = run(ws
        .arcane()
        .args(["runtime", "add", "vllm", "--executable"])
        .arg(&fake));
    assert_eq!(
        out.status.code(),
        Some(2),
        "unknown engine is a usage error"
    );
    insta::assert_snapshot!(
        "runtime_add_unknown_engine",
        redactions.apply(&stderr(&out))
    );

    let archive = ws.path().join("a.tar.gz");
    std::fs::write(&archive, b"\x1f\x8bnot really").unwrap();
    let wrong = "1".repeat(64);
    let out = run(ws
        .arcane()
        .args(["runtime", "install", "llama.cpp", "--archive"])
        .arg(&archive)
        .args(["--sha256", &wrong, "--output", "json"]));
    assert_eq!(out.status.code(), Some(1));
    // The archive's bytes are fixed, so its digest is too: the snapshot names it.
    assert_eq!(error_of(&out)["details"]["actual"], sha256sum(&archive));
    insta::assert_snapshot!(
        "runtime_install_wrong_digest_json",
        redactions.json(&json(&out))
    );

    // Nothing was registered by any of these.
    assert_eq!(
        json(&run(ws
            .arcane()
            .args(["runtime", "list", "--output", "json"])))["runtimes"],
        serde_json::json!([])
    );
    assert_eq!(
        json(&run(ws
            .arcane()
            .args(["model", "list", "--output", "json"])))["models"],
        serde_json::json!([])
    );
}

#[test]
fn the_real_server_installs_from_a_loopback_url_runs_and_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let archive = real_release_archive(dir.path());
    let digest = sha256sum(&archive);
    let base = serve(std::fs::read(&archive).unwrap(), None);
    let ws = TestWorkspace::new();
    let url = format!("{base}/llama-bin-ubuntu-x64.tar.gz");
    let out = run(ws.arcane().args([
        "runtime",
        "install",
        "llama.cpp",
        "--archive",
        &url,
        "--sha256",
        &digest,
        "--output",
        "ndjson",
    ]));
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines.iter().any(|l| l["type"] == "download.progress"),
        "progress events are streamed"
    );
    let runtime = lines.last().unwrap()["runtime"].clone();
    let id = runtime["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("llama.cpp-"), "{id}");
    assert_eq!(runtime["installed"], true);
    let root = PathBuf::from(runtime["root"].as_str().unwrap());
    assert!(root.starts_with(ws.path().join(".arcane/runtimes/llama.cpp")));
    // The installed copy really runs, with its own libraries.
    let executable = PathBuf::from(runtime["executable"].as_str().unwrap());
    assert_eq!(executable, root.join("build/bin/llama-server"));
    let version = Command::new(&executable)
        .arg("--version")
        .env("LD_LIBRARY_PATH", root.join("build/bin"))
        .output()
        .unwrap();
    assert!(version.status.success());

    let out = run(ws.arcane().args(["runtime", "remove", &id]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!root.exists());
    assert_eq!(
        json(&run(ws
            .arcane()
            .args(["runtime", "list", "--output", "json"])))["runtimes"],
        serde_json::json!([])
    );
}

#[test]
fn ctrl_c_during_a_download_exits_130_and_leaves_no_partial_install() {
    let ws = TestWorkspace::new();
    let body: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
    let base = serve(body, Some(200_000));
    let url = format!("{base}/llama-b1-bin-ubuntu-x64.tar.gz");
    let mut child = ChildGuard(
        ws.arcane()
            .args([
                "runtime",
                "install",
                "llama.cpp",
                "--archive",
                &url,
                "--sha256",
                &"2".repeat(64),
                "--output",
                "ndjson",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let started = Instant::now();
    loop {
        let line = lines
            .next()
            .expect("the install ended before reporting progress")
            .unwrap();
        if line.contains("\"download.progress\"") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no progress event"
        );
    }
    let status = Command::new("kill")
        .args(["-INT", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.0.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{rest:?}");
    let last: serde_json::Value = serde_json::from_str(rest.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "ARCANE_CANCELLED");
    let left: Vec<String> = tree(&ws.path().join(".arcane"))
        .into_iter()
        .filter(|p| p != "workspace-operation.lock" && p != "runtimes")
        .collect();
    assert!(left.is_empty(), "a cancelled install left {left:?}");
}

/// A free loopback port.
fn free_loopback_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn a_model_or_runtime_a_running_host_serves_cannot_be_removed_without_force() {
    // Issue: `model remove` and `runtime remove` succeeded while a running host served
    // them; the next load, restart or recover failed.
    let ws = TestWorkspace::new();
    let added = run(ws
        .arcane()
        .args(["runtime", "add", "llama.cpp", "--executable"])
        .arg(llama_server())
        .args(["--backend", "cpu"]));
    assert!(added.status.success(), "{}", stderr(&added));
    let added = run(ws
        .arcane()
        .args(["model", "add", "smol", "--file"])
        .arg(smollm2()));
    assert!(added.status.success(), "{}", stderr(&added));
    let engine_url = format!("http://127.0.0.1:{}", free_loopback_port());
    let serve = ws
        .arcane()
        .args([
            "serve",
            "--model",
            "smol",
            "--device",
            "cpu",
            "--url",
            &engine_url,
        ])
        .args(["--port", &free_loopback_port().to_string()])
        .args(["--", "--ctx-size", "2048", "--threads", "2"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut serve = ChildGuard(serve);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status = run(ws.arcane().args(["--output", "json", "status"]));
        if status.status.success() && json(&status)["engines"][0]["state"] == "ready" {
            break;
        }
        assert!(Instant::now() < deadline, "serve did not become ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    let host_pid = serve.0.id();
    for (kind, id) in [("model", "smol"), ("runtime", "llama.cpp")] {
        let out = run(ws.arcane().args(["--output", "json", kind, "remove", id]));
        assert_eq!(out.status.code(), Some(75), "{kind}: {}", stdout(&out));
        let v = json(&out);
        assert_eq!(v["error"]["code"], "ARCANE_IN_USE", "{v}");
        assert_eq!(v["error"]["details"]["pid"], host_pid, "{v}");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("pid {host_pid}")));
    }
    let listed = run(ws.arcane().args(["--output", "json", "model", "list"]));
    assert_eq!(json(&listed)["models"].as_array().unwrap().len(), 1);
    // `--force` says the user means it.
    let out = run(ws.arcane().args(["model", "remove", "smol", "--force"]));
    assert!(out.status.success(), "{}", stderr(&out));
    // Once the host is gone, removal needs no force.
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(host_pid.to_string())
        .status();
    wait_for_exit(&mut serve.0, Duration::from_secs(60), "arcane serve");
    let out = run(ws.arcane().args(["runtime", "remove", "llama.cpp"]));
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_hard_linked_model_edited_in_place_is_flagged_and_refused_before_it_is_served() {
    let ws = TestWorkspace::new();
    let source = ws.path().join("source.gguf");
    std::fs::copy(smollm2(), &source).unwrap();
    let added = run(ws
        .arcane()
        .args(["--output", "json", "model", "add", "smol", "--file"])
        .arg(&source));
    assert!(added.status.success(), "{}", stderr(&added));
    assert_eq!(json(&added)["model"]["storage"], "hard-link");
    let listed = run(ws.arcane().args(["--output", "json", "model", "list"]));
    assert_eq!(json(&listed)["models"][0]["changed"], false);
    // Edit 16 bytes in the middle of the source: the registered hard link changes too.
    {
        use std::io::{Seek, SeekFrom};
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(&source)
            .unwrap();
        file.seek(SeekFrom::Start(50_000_000)).unwrap();
        file.write_all(&[0xAA; 16]).unwrap();
    }
    let listed = run(ws.arcane().args(["--output", "json", "model", "list"]));
    assert_eq!(
        json(&listed)["models"][0]["changed"],
        true,
        "{}",
        stdout(&listed)
    );
    let human = run(ws.arcane().args(["model", "list"]));
    assert!(
        stdout(&human).contains("changed since it was added"),
        "{}",
        stdout(&human)
    );
    // Serving it is refused before any engine starts, with the way out.
    let out = run(ws
        .arcane()
        .args(["--output", "json", "serve", "--executable"])
        .arg(llama_server())
        .args(["--model", "smol", "--device", "cpu"]));
    assert!(!out.status.success());
    let v = json(&out);
    assert_eq!(v["error"]["code"], "ARCANE_INTEGRITY_FAILED", "{v}");
    assert!(v.to_string().contains("arcane model remove smol"), "{v}");
    assert!(
        !ws.path().join(".arcane/engines").exists()
            || std::fs::read_dir(ws.path().join(".arcane/engines"))
                .unwrap()
                .next()
                .is_none()
    );
}

/// Issue 10, item 11: read commands on a misspelt `--workspace` (or `ARCANE_WORKSPACE`)
/// fail naming the missing directory instead of reporting an empty workspace, and
/// create nothing; a command that changes the workspace still creates it.
#[test]
fn read_commands_on_a_missing_named_workspace_name_it() {
    let parent = TestWorkspace::new();
    let missing = parent.path().join("worksapce");
    let read_commands: [&[&str]; 6] = [
        &["model", "list"],
        &["runtime", "list"],
        &["lock", "status"],
        &["status"],
        &["chat", "hello"],
        &["model", "remove", "x"],
    ];
    for args in read_commands {
        let output = run(Command::new(crate::support::arcane_bin())
            .arg("--output")
            .arg("json")
            .arg("--workspace")
            .arg(&missing)
            .args(args)
            .env_remove("ARCANE_WORKSPACE"));
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(!missing.exists(), "{args:?} created it");
        // The same error whatever the command.
        insta::assert_snapshot!(
            "missing_named_workspace_json",
            parent.redactions().json(&json(&output))
        );
    }
    let output = run(Command::new(crate::support::arcane_bin())
        .args(["model", "list"])
        .env("ARCANE_WORKSPACE", &missing));
    assert_eq!(output.status.code(), Some(2));
    insta::assert_snapshot!(
        "missing_workspace_from_the_environment",
        parent.redact(&stderr(&output))
    );
    // A mutating command creates the named workspace, after which reads work.
    let output = run(Command::new(crate::support::arcane_bin())
        .arg("--workspace")
        .arg(&missing)
        .args(["lock", "run", "--operation", "demo", "--", "true"]));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let output = run(Command::new(crate::support::arcane_bin())
        .arg("--workspace")
        .arg(&missing)
        .args(["model", "list"]));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

/// The platform default workspace may not exist yet (a fresh machine): reading it is
/// an empty workspace, not an error.
#[test]
fn read_commands_on_a_fresh_default_workspace_read_it_as_empty() {
    let home = TestWorkspace::new();
    let output = run(Command::new(crate::support::arcane_bin())
        .args(["--output", "json", "model", "list"])
        .env_remove("ARCANE_WORKSPACE")
        .env("XDG_DATA_HOME", home.path().join("data")));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!home.path().join("data").exists());
}

#[test]
fn model_add_of_a_symlink_registers_the_file_it_names() {
    // Issue: an absolute link was stored as the "hard link" itself; a relative one failed
    // naming an internal staging path.
    let ws = TestWorkspace::new();
    let real = ws.path().join("real.gguf");
    std::fs::copy(smollm2(), &real).unwrap();
    let links = ws.path().join("links");
    std::fs::create_dir(&links).unwrap();
    std::os::unix::fs::symlink(&real, links.join("absolute.gguf")).unwrap();
    std::os::unix::fs::symlink("../real.gguf", links.join("relative.gguf")).unwrap();
    for (id, link) in [("abs", "absolute.gguf"), ("rel", "relative.gguf")] {
        let out = run(ws
            .arcane()
            .args(["--output", "json", "model", "add", id, "--file"])
            .arg(links.join(link)));
        assert!(out.status.success(), "{id}: {}", stdout(&out));
        let model = json(&out)["model"].clone();
        assert_eq!(
            model["source"],
            std::fs::canonicalize(&real).unwrap().display().to_string(),
            "{model}"
        );
        let stored = std::path::PathBuf::from(model["path"].as_str().unwrap());
        let meta = std::fs::symlink_metadata(&stored).unwrap();
        assert!(
            meta.file_type().is_file(),
            "{id}: the stored model is a link"
        );
    }
}

#[test]
fn a_registry_file_others_can_write_is_refused_with_the_fix() {
    // Issue 14, item 1: the registry names the programs Arcane runs.
    use std::os::unix::fs::PermissionsExt;
    let ws = TestWorkspace::new();
    let added = run(ws
        .arcane()
        .args(["runtime", "add", "llama.cpp", "--executable"])
        .arg(llama_server()));
    assert!(added.status.success(), "{}", stderr(&added));
    let registry = ws.path().join(".arcane/registry.json");
    std::fs::set_permissions(&registry, std::fs::Permissions::from_mode(0o666)).unwrap();
    for args in [vec!["runtime", "list"], vec!["model", "list"]] {
        let out = run(ws.arcane().args(["--output", "json"]).args(&args));
        let v = json(&out);
        assert_eq!(v["error"]["code"], "ARCANE_POLICY_DENIED", "{args:?}: {v}");
        assert!(v.to_string().contains("chmod go-w"), "{v}");
    }
    std::fs::set_permissions(&registry, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(run(ws.arcane().args(["runtime", "list"])).status.success());
}

#[test]
fn every_user_named_file_that_is_a_fifo_is_refused_at_once() {
    // Issue 14, item 3: a FIFO where a file belongs must never block a command.
    let ws = TestWorkspace::new();
    let fifo = ws.path().join("named.fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let fifo_text = fifo.display().to_string();
    // Issue: `model add --file fifo.gguf` blocked in open, ignored SIGTERM and outlived
    // a 10-minute timeout.
    let cases: Vec<Vec<String>> = vec![
        vec![
            "model".into(),
            "add".into(),
            "f".into(),
            "--file".into(),
            fifo_text.clone(),
        ],
        vec!["serve".into(), "--config".into(), fifo_text.clone()],
        vec![
            "runtime".into(),
            "install".into(),
            "llama.cpp".into(),
            "--archive".into(),
            fifo_text.clone(),
            "--sha256".into(),
            "0".repeat(64),
        ],
        vec!["devices".into(), "--inventory".into(), fifo_text.clone()],
        vec![
            "bundle".into(),
            "verify".into(),
            ws.path().display().to_string(),
            "--trusted-key".into(),
            fifo_text.clone(),
        ],
    ];
    for case in cases {
        let mut child = ws
            .arcane()
            .args(&case)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = wait_for_exit(&mut child, Duration::from_secs(30), &case.join(" "));
        assert!(!status.success(), "{case:?}");
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(
            err.contains("a FIFO, not a regular file"),
            "{case:?}: {err}"
        );
    }
    let listed = run(ws.arcane().args(["--output", "json", "model", "list"]));
    assert!(json(&listed)["models"].as_array().unwrap().is_empty());
}

#[test]
fn the_real_whisper_model_registers_as_whisper_and_its_damaged_copies_are_refused() {
    let model_file = whisper_model();
    let ws = TestWorkspace::new();
    let added = run(ws
        .arcane()
        .args(["--output", "json", "model", "add", "tiny-en", "--file"])
        .arg(&model_file));
    assert!(added.status.success(), "{}", stderr(&added));
    assert_eq!(json(&added)["kind"], "whisper", "{}", stdout(&added));

    let listed = run(ws.arcane().args(["model", "list", "--output", "json"]));
    assert!(listed.status.success(), "{}", stderr(&listed));
    let models = json(&listed)["models"].clone();
    assert_eq!(models.as_array().map(Vec::len), Some(1), "{models}");
    let model = &models[0];
    assert_eq!(model["id"], "tiny-en");
    assert_eq!(model["kind"], "whisper");
    assert_eq!(
        model["sha256"],
        sha256sum(&model_file),
        "digest must equal an independent sha256sum"
    );
    assert_eq!(model["size"], std::fs::metadata(&model_file).unwrap().len());
    assert!(
        model["gguf"].is_null() && model["onnx"].is_null(),
        "{model}"
    );
    let whisper = &model["whisper"];
    assert_eq!(whisper["modelType"], "tiny", "{whisper}");
    assert_eq!(whisper["multilingual"], false);
    assert_eq!(whisper["nVocab"], 51_864);
    assert_eq!(whisper["nAudioLayer"], 4);
    assert_eq!(whisper["nTextLayer"], 4);
    assert_eq!(whisper["nAudioState"], 384);
    assert_eq!(whisper["nMels"], 80);
    assert_eq!(whisper["quantization"], "F16");
    assert_eq!(whisper["vocabTokens"], 50_257);
    // 67 encoder and 100 decoder tensors: every weight whisper.cpp loads for tiny.
    assert_eq!(whisper["tensorCount"], 167);
    let parameters = whisper["parameterCount"].as_u64().unwrap();
    assert!(
        (37_000_000..39_000_000).contains(&parameters),
        "{parameters}"
    );

    let human = stdout(&run(ws.arcane().args(["model", "list"])));
    let row = human
        .lines()
        .find(|l| l.starts_with("tiny-en "))
        .unwrap_or_else(|| panic!("{human}"));
    assert!(row.contains("whisper") && row.contains("F16"), "{row}");
    assert!(row.contains("38M"), "{row}");

    // Damaged copies of the real file: cut short, and with a hostile vocabulary size.
    let bytes = std::fs::read(&model_file).unwrap();
    let cut = ws.path().join("cut.bin");
    std::fs::write(&cut, &bytes[..bytes.len() - 1000]).unwrap();
    let hostile = ws.path().join("hostile.bin");
    let mut patched = bytes.clone();
    patched[4..8].copy_from_slice(&i32::MAX.to_le_bytes());
    std::fs::write(&hostile, &patched).unwrap();
    drop((bytes, patched));
    for (id, file, check, field, value) in [
        (
            "cut",
            &cut,
            "WHISPER_BAD_TENSOR",
            "tensor",
            serde_json::json!("decoder.ln.bias"),
        ),
        (
            "hostile",
            &hostile,
            "WHISPER_HPARAM_OUT_OF_RANGE",
            "field",
            serde_json::json!("n_vocab"),
        ),
    ] {
        let out = run(ws
            .arcane()
            .args(["--output", "json", "model", "add", id, "--file"])
            .arg(file));
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let error = error_of(&out);
        assert_eq!(error["code"], "LOCAL_AI_MODEL_INVALID", "{error}");
        assert_eq!(error["details"]["check"], check, "{error}");
        assert_eq!(error["details"][field], value, "{error}");
        assert_eq!(error["details"]["format"], "whisper", "{error}");
    }
    let error = error_of(&run(ws
        .arcane()
        .args(["--output", "json", "model", "add", "hostile", "--file"])
        .arg(&hostile)));
    assert_eq!(error["details"]["value"], i64::from(i32::MAX), "{error}");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("n_vocab") && m.contains("2147483647")),
        "{error}"
    );
    let listed = run(ws.arcane().args(["model", "list", "--output", "json"]));
    assert_eq!(
        json(&listed)["models"].as_array().map(Vec::len),
        Some(1),
        "refused files are never registered"
    );
}

#[test]
fn the_real_piper_voice_registers_with_its_configuration_beside_it() {
    let voice = piper_voice();
    let config = PathBuf::from(format!("{}.json", voice.display()));
    let ws = TestWorkspace::new();
    let added = run(ws
        .arcane()
        .args(["--output", "json", "model", "add", "joe", "--file"])
        .arg(&voice));
    assert!(added.status.success(), "{}", stderr(&added));
    let model = json(&added)["model"].clone();
    assert_eq!(json(&added)["kind"], "piper-voice", "{model}");
    assert_eq!(model["sha256"], sha256sum(&voice));
    assert!(model["onnx"]["irVersion"].is_number(), "{model}");
    let piper = &model["piper"];
    assert_eq!(piper["sampleRate"], 22_050, "{piper}");
    assert_eq!(piper["espeakVoice"], "en-us");
    assert_eq!(piper["quality"], "medium");
    assert_eq!(piper["configFile"], "en_US-joe-medium.onnx.json");
    assert_eq!(piper["configSha256"], sha256sum(&config));
    assert!(
        piper["phonemes"].as_u64().is_some_and(|n| n > 100),
        "{piper}"
    );
    // The configuration is stored beside the model, byte for byte.
    let stored = PathBuf::from(model["path"].as_str().unwrap());
    let stored_config = stored.with_file_name("en_US-joe-medium.onnx.json");
    assert_eq!(sha256sum(&stored_config), sha256sum(&config));
    let human = stdout(&run(ws.arcane().args(["model", "list"])));
    assert!(
        human
            .lines()
            .any(|l| l.starts_with("joe ") && l.contains("piper-voice")),
        "{human}"
    );

    // A copy whose configuration lacks the phoneme map is refused, naming the field.
    let dir = ws.path().join("broken");
    std::fs::create_dir(&dir).unwrap();
    let broken = dir.join("v.onnx");
    std::fs::hard_link(&voice, &broken)
        .or_else(|_| std::fs::copy(&voice, &broken).map(drop))
        .unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        dir.join("v.onnx.json"),
        text.replace("phoneme_id_map", "phoneme_map_gone"),
    )
    .unwrap();
    let out = run(ws
        .arcane()
        .args(["--output", "json", "model", "add", "broken", "--file"])
        .arg(&broken));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let error = error_of(&out);
    assert_eq!(error["code"], "LOCAL_AI_MODEL_INVALID", "{error}");
    assert!(
        error["details"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("phoneme_id_map")),
        "{error}"
    );

    // Removing the voice removes its configuration too.
    let removed = run(ws.arcane().args(["model", "remove", "joe"]));
    assert!(removed.status.success(), "{}", stderr(&removed));
    assert!(!stored_config.exists() && !stored.exists());
}
