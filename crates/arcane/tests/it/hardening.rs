//! Issue 19 (nothing reopens a door, nothing gets stuck), the cases fixed so far, each
//! through the real binary: state directories and the token under a loose umask or
//! another user's hand, a FIFO in place of `arcane.toml`, and the small messages that
//! sent people the wrong way.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

use crate::support::{json, run, stderr, stdout, TestWorkspace};

/// `arcane` with `args` under `umask 000` (through the shell: `Command` has no umask).
fn under_umask_000(ws: &TestWorkspace, args: &[&str]) -> std::process::Output {
    let command = ws.arcane();
    let program = command.get_program().to_owned();
    let mut shell = Command::new("sh");
    shell
        .arg("-c")
        .arg("umask 000; exec \"$0\" \"$@\"")
        .arg(program)
        .args(command.get_args())
        .args(args);
    for (name, value) in command.get_envs() {
        match value {
            Some(value) => shell.env(name, value),
            None => shell.env_remove(name),
        };
    }
    run(&mut shell)
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Item 6: `.arcane` is 0700 whoever creates it (here `token show` on a fresh
/// workspace under `umask 000`, which made it 0777); the token file is 0600.
#[test]
fn state_is_private_under_a_loose_umask() {
    let ws = TestWorkspace::new();
    let out = under_umask_000(&ws, &["token", "show"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let state = ws.path().join(".arcane");
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join("core-token")), 0o600);
}

/// Item 6: a token file another user owns is not taken as this workspace's secret.
#[test]
fn another_users_token_file_is_refused() {
    let ws = TestWorkspace::new();
    let out = run(ws.arcane().args(["token", "show"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let token = ws.path().join(".arcane/core-token");
    // uid 65534 (nobody): a second user, as root can make one.
    std::os::unix::fs::chown(&token, Some(65534), None).unwrap();
    assert_eq!(std::fs::metadata(&token).unwrap().uid(), 65534);
    let out = run(ws.arcane().args(["--output", "json", "token", "show"]));
    assert!(!out.status.success(), "{}", stdout(&out));
    let error = json(&out)["error"].clone();
    let text = error.to_string();
    assert!(text.contains("owned by another user (uid 65534)"), "{text}");
    assert!(text.contains("core-token"), "{text}");
}

/// Item 16: a FIFO at `<workspace>/arcane.toml` is refused as `--config FIFO` is (it
/// was silently ignored), and promptly: nothing blocks on it.
#[test]
fn a_fifo_in_place_of_arcane_toml_is_refused() {
    let ws = TestWorkspace::new();
    let fifo = ws.path().join("arcane.toml");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let out = run(ws.arcane().args(["--output", "json", "serve"]));
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let error = json(&out)["error"].clone();
    assert_eq!(error["code"], "ARCANE_USAGE", "{error}");
    assert!(error.to_string().contains("arcane.toml"), "{error}");
}

/// Item 16, now that the image kind is hosted: `serve --runtime stable-diffusion.cpp`
/// without a model asks for the model file, not to `runtime add` the kind (which has no
/// executable).
#[test]
fn a_runtime_of_arcanes_own_without_a_model_asks_for_one() {
    let ws = TestWorkspace::new();
    let out = run(ws.arcane().args([
        "--output",
        "json",
        "serve",
        "--runtime",
        "stable-diffusion.cpp",
    ]));
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let error = json(&out)["error"].clone();
    assert_eq!(error["code"], "ARCANE_USAGE", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("serves one model file"),
        "{error}"
    );
    assert!(!error.to_string().contains("runtime add"), "{error}");
}

/// Item 16: one problem is "1 problem".
#[test]
fn a_bundle_without_a_manifest_has_one_problem() {
    let ws = TestWorkspace::new();
    let dir = ws.path().join("not-a-bundle");
    std::fs::create_dir(&dir).unwrap();
    let out = run(ws.arcane().args(["bundle", "verify"]).arg(&dir));
    assert!(!out.status.success());
    let text = stdout(&out) + &stderr(&out);
    assert!(text.contains("(1 problem)"), "{text}");
}

/// Item 2: `arcane.toml` decides what runs, where it listens and what it writes; one
/// another user wrote (or could have: its directory is writable by others) is refused
/// before anything starts, naming the path and the fix.
#[test]
fn an_arcane_toml_another_user_controls_is_refused() {
    let ws = TestWorkspace::new();
    let config = ws.path().join("arcane.toml");
    std::fs::write(
        &config,
        "[[engine]]\nruntime = \"llama.cpp\"\nargs = [\"-c\", \"512\"]\n",
    )
    .unwrap();
    // Owned by another user (uid 65534).
    std::os::unix::fs::chown(&config, Some(65534), None).unwrap();
    let out = run(ws.arcane().args(["--output", "json", "serve"]));
    assert!(!out.status.success());
    let error = json(&out)["error"].clone();
    assert_eq!(error["code"], "ARCANE_POLICY_DENIED", "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("uid 65534"),
        "{error}"
    );
    // Ours, but in a workspace directory everyone may write to.
    std::os::unix::fs::chown(&config, Some(0), None).unwrap();
    std::fs::set_permissions(ws.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = run(ws.arcane().args(["--output", "json", "serve"]));
    assert!(!out.status.success());
    let error = json(&out)["error"].clone();
    assert_eq!(error["code"], "ARCANE_POLICY_DENIED", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("writable by everyone"),
        "{error}"
    );
    assert!(error["hints"].to_string().contains("chmod go-w"), "{error}");
    // The same for `--config FILE`.
    std::fs::set_permissions(ws.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = run(ws
        .arcane()
        .args(["--output", "json", "serve", "--config"])
        .arg(&config));
    assert_eq!(json(&out)["error"]["code"], "ARCANE_POLICY_DENIED");
}

/// Item 3: nothing another user controls runs or loads: `runtime add --executable`
/// checks the program and the libraries beside it *before* running `--version` (it ran
/// the file first), and ONNX Runtime libraries another user owns are not loaded.
#[test]
fn code_another_user_controls_is_refused_before_it_runs() {
    let ws = TestWorkspace::new();
    let bin = ws.path().join("rt");
    std::fs::create_dir(&bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let marker = ws.path().join("it-ran");
    let program = bin.join("llama-server");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\ntouch '{}'\necho 'version: 4589 (abc)'\n",
            marker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Another user's library beside the engine (its constructor would run as root).
    let library = bin.join("libggml-cpu.so");
    std::fs::write(&library, b"\x7fELF").unwrap();
    std::os::unix::fs::chown(&library, Some(65534), None).unwrap();
    let add = |ws: &TestWorkspace| {
        run(ws
            .arcane()
            .args([
                "--output",
                "json",
                "runtime",
                "add",
                "llama.cpp",
                "--executable",
            ])
            .arg(&program))
    };
    let out = add(&ws);
    assert!(!out.status.success(), "{}", stdout(&out));
    let error = json(&out)["error"].clone();
    assert_eq!(error["code"], "ARCANE_POLICY_DENIED", "{error}");
    assert!(error.to_string().contains("libggml-cpu.so"), "{error}");
    assert!(!marker.exists(), "the program ran before it was checked");
    // The program itself, writable by everyone.
    std::fs::remove_file(&library).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = add(&ws);
    assert_eq!(json(&out)["error"]["code"], "ARCANE_POLICY_DENIED");
    assert!(!marker.exists(), "the program ran before it was checked");
    // Once it is ours and closed, it is registered (and only then run).
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = add(&ws);
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(marker.exists());

    // An ONNX Runtime library another user owns is not loaded.
    let onnx = bin.join("libonnxruntime.so.1.31.1");
    std::fs::write(&onnx, b"\x7fELF").unwrap();
    std::os::unix::fs::chown(&onnx, Some(65534), None).unwrap();
    let out = run(ws
        .arcane()
        .args(["--output", "json", "runtime", "add", "onnx", "--library"])
        .arg(&onnx));
    assert_eq!(
        json(&out)["error"]["code"],
        "ARCANE_POLICY_DENIED",
        "{}",
        stdout(&out)
    );
    let out = run(ws
        .arcane()
        .args([
            "--output",
            "json",
            "core",
            "--stdio",
            "--runtime",
            "onnx",
            "--onnx-library",
        ])
        .arg(&onnx)
        .stdin(std::process::Stdio::null()));
    assert_eq!(
        json(&out)["error"]["code"],
        "ARCANE_POLICY_DENIED",
        "{}",
        stdout(&out)
    );
}

/// The registry record of model `id` (`model list --output json`).
fn model_record(ws: &TestWorkspace, id: &str) -> serde_json::Value {
    let out = run(ws.arcane().args(["--output", "json", "model", "list"]));
    assert!(out.status.success(), "{}", stderr(&out));
    json(&out)["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no model {id}"))
}

/// Item 4: a file another user owns (or anyone may write) is copied, never hard-linked
/// (a link kept its owner, who could rewrite it in place); the same file of this user
/// added under two names flags neither as changed.
#[test]
fn a_model_someone_else_can_write_is_copied_and_a_second_name_changes_nothing() {
    let ws = TestWorkspace::new();
    let model = crate::support::smollm2();
    for (name, owner, mode) in [("theirs", 65534, 0o644), ("open", 0, 0o666)] {
        let source = ws.path().join(format!("{name}.gguf"));
        std::fs::copy(&model, &source).unwrap();
        std::fs::set_permissions(&source, std::fs::Permissions::from_mode(mode)).unwrap();
        std::os::unix::fs::chown(&source, Some(owner), None).unwrap();
        let out = run(ws
            .arcane()
            .args(["model", "add", name, "--file"])
            .arg(&source));
        assert!(out.status.success(), "{}", stderr(&out));
        let record = model_record(&ws, name);
        assert_eq!(record["storage"], "copy", "{record}");
        let stored = std::path::PathBuf::from(record["path"].as_str().unwrap());
        let meta = std::fs::metadata(&stored).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o644), "{record}");
        // Whatever its owner does to the source now, the registered model stays.
        std::fs::write(&source, b"GGUF rewritten").unwrap();
        assert_eq!(model_record(&ws, name)["changed"], false);
    }
    // This user's own file, added twice: two hard links, neither flagged changed.
    let mine = ws.path().join("mine.gguf");
    std::fs::copy(&model, &mine).unwrap();
    std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o644)).unwrap();
    for name in ["one", "two"] {
        let out = run(ws
            .arcane()
            .args(["model", "add", name, "--file"])
            .arg(&mine));
        assert!(out.status.success(), "{}", stderr(&out));
    }
    for name in ["one", "two"] {
        let record = model_record(&ws, name);
        assert_eq!(record["storage"], "hard-link", "{record}");
        assert_eq!(record["changed"], false, "{record}");
    }
}

/// Item 4: the model file is checked at every load, not only when `serve` starts: one
/// edited in place while the host runs is refused at its next load.
#[test]
fn a_model_file_changed_while_serving_is_refused_at_its_next_load() {
    let ws = crate::gateway::gateway_workspace("");
    let source = ws.path().join("m.gguf");
    std::fs::copy(crate::support::smollm2(), &source).unwrap();
    std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run(ws
        .arcane()
        .args(["model", "add", "m", "--file"])
        .arg(&source));
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::write(
        ws.path().join("arcane.toml"),
        "[[model]]\nid = \"m\"\nmodel = \"m\"\n",
    )
    .unwrap();
    let _serve = crate::gateway::start(&ws);
    let load = |ws: &TestWorkspace| run(ws.arcane().args(["--output", "json", "load", "m"]));
    let out = load(&ws);
    assert!(out.status.success(), "{}", stdout(&out));
    let out = run(ws.arcane().args(["unload", "m"]));
    assert!(out.status.success(), "{}", stderr(&out));
    // The registered file is a link to `m.gguf` (this user's own): edit it in place.
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&source)
        .unwrap();
    std::io::Write::write_all(&mut file, b"tampered").unwrap();
    drop(file);
    let out = load(&ws);
    assert!(!out.status.success(), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(text.contains("changed since it was registered"), "{text}");
    let rows = crate::gateway::ps(&ws);
    assert_eq!(
        crate::gateway::row(&rows, "m")["state"],
        "error",
        "{rows:#?}"
    );
}

/// Item 16: with `ARCANE_API_KEY` set, `token show` printed the workspace's token,
/// which that host refuses; it shows the key the running host accepts, and `token
/// rotate` says it would change nothing the host accepts.
#[test]
fn token_show_names_the_key_a_host_started_with_its_own_key_accepts() {
    let ws = TestWorkspace::new();
    let key = "a-key-of-my-own-0123456789abcdef";
    let (host, endpoint) = serve_beside_ollama(&ws, &[("ARCANE_API_KEY", key)]);
    assert_eq!(endpoint["token"], key);
    // `token show`, run without the variable (another terminal), prints the host's key.
    let out = run(ws
        .arcane()
        .env_remove("ARCANE_API_KEY")
        .args(["token", "show"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), key);
    let out = run(ws
        .arcane()
        .env_remove("ARCANE_API_KEY")
        .args(["--output", "json", "token", "rotate"]));
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(json(&out)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("its own key"));
    crate::core::terminate(host);
}

/// Item 14: `lock status` reports on a workspace its user may only read (it opened the
/// lock sentinel for writing, and failed).
#[test]
fn lock_status_reports_on_a_read_only_workspace() {
    let ws = TestWorkspace::new();
    let out = run(ws.arcane().args(["token", "show"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(ws
        .arcane()
        .args(["lock", "run", "--operation", "test", "--", "true"]));
    assert!(out.status.success(), "{}", stderr(&out));
    // The workspace of user 65534, which it may read but not write.
    let chown = Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(ws.path())
        .status()
        .unwrap();
    assert!(chown.success());
    for entry in walk(ws.path()) {
        let mode = if entry.is_dir() { 0o500 } else { 0o400 };
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let command = ws.arcane();
    let out = run(Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(command.get_program())
        .args(command.get_args())
        .args(["--output", "json", "lock", "status"]));
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(json(&out)["state"], "free", "{}", stdout(&out));
    // Given back, so the temporary directory can be removed.
    for entry in walk(ws.path()) {
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
}

/// Every path under `root`, `root` included (directories before their entries).
fn walk(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut all = vec![root.to_path_buf()];
    let mut index = 0;
    while index < all.len() {
        if all[index].is_dir() {
            let entries: Vec<_> = std::fs::read_dir(&all[index])
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            all.extend(entries);
        }
        index += 1;
    }
    all
}

/// Item 14: `arcane load|unload` against a host that stopped answering end at their
/// `--timeout` (they hung 600 s, then hinted a flag they did not have).
#[test]
fn load_and_unload_against_a_stopped_host_end_at_their_timeout() {
    let ws = TestWorkspace::new();
    let (host, endpoint) = serve_beside_ollama(&ws, &[]);
    let pid = endpoint["pid"].as_i64().unwrap() as i32;
    // SAFETY: SIGSTOP, then SIGCONT below, to the host this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    for command in ["load", "unload"] {
        let out = run(ws
            .arcane()
            .args(["--output", "json", command, "m", "--timeout", "1"]));
        assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
        let error = json(&out)["error"].clone();
        assert_eq!(error["code"], "CORE_TIMEOUT", "{error}");
        assert_eq!(error["details"]["deadlineSeconds"], 1.0, "{error}");
    }
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    crate::core::terminate(host);
}

/// `arcane serve` adopting a fake Ollama (no engine to start), with `env` set: the
/// running host and its endpoint record once published.
pub(crate) fn serve_beside_ollama(
    ws: &TestWorkspace,
    env: &[(&str, &str)],
) -> (crate::core::Guard, serde_json::Value) {
    let mut command = ws.arcane();
    for (name, value) in env {
        command.env(name, value);
    }
    let child = command
        .args([
            "serve",
            "--runtime",
            "ollama",
            "--url",
            &crate::core::fake_ollama(),
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut host = crate::core::Guard(child);
    let endpoint = crate::core::wait_for_endpoint(ws, &mut host);
    (host, endpoint)
}

/// Item 7: `token rotate` ends every stream and connection the old token opened (an
/// open `/v1/events` stream went on receiving lines), and the old token is refused.
#[test]
fn a_token_rotation_ends_the_streams_the_old_token_opened() {
    use std::io::{Read, Write};
    let ws = TestWorkspace::new();
    let (host, endpoint) = serve_beside_ollama(&ws, &[]);
    let port = endpoint["port"].as_u64().unwrap() as u16;
    let old = endpoint["token"].as_str().unwrap().to_string();
    let mut events = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        events,
        "GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {old}\r\n\r\n"
    )
    .unwrap();
    let mut head = [0u8; 256];
    let n = events.read(&mut head).unwrap();
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"));
    let out = run(ws.arcane().args(["token", "rotate"]));
    assert!(out.status.success(), "{}", stderr(&out));
    // The stream ends (end of file), within a bounded wait.
    events
        .set_read_timeout(Some(std::time::Duration::from_secs(1)))
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut buffer = [0u8; 4096];
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the old stream kept going"
        );
        match events.read(&mut buffer) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
    let (status, _) = crate::support::http_exchange(
        &format!("127.0.0.1:{port}"),
        &format!("GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {old}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(status, 401);
    crate::core::terminate(host);
}

/// Item 6: `runtime install` under `umask 000` made 0777 directories that `serve` then
/// refused; installed trees get fixed modes.
#[test]
fn an_installed_runtime_has_fixed_modes_whatever_the_umask() {
    let ws = TestWorkspace::new();
    let release = ws.path().join("release");
    std::fs::create_dir_all(release.join("lib")).unwrap();
    std::fs::write(
        release.join("llama-server"),
        "#!/bin/sh\necho 'version: 7 (x)'\n",
    )
    .unwrap();
    std::fs::set_permissions(
        release.join("llama-server"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(release.join("lib/libggml-cpu.so"), b"\x7fELF").unwrap();
    let archive = ws.path().join("llama-b7-bin-ubuntu-x64.tar.gz");
    let status = Command::new("tar")
        .arg("-czf")
        .arg(&archive)
        .arg("-C")
        .arg(&release)
        .args(["llama-server", "lib"])
        .status()
        .unwrap();
    assert!(status.success());
    let digest = crate::hostile_files::arcane_registry_sha256(&archive);
    let archive_arg = archive.display().to_string();
    let out = under_umask_000(
        &ws,
        &[
            "--output",
            "json",
            "runtime",
            "install",
            "llama.cpp",
            "--archive",
            &archive_arg,
            "--sha256",
            &digest,
            "--version",
            "b7",
        ],
    );
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let root = ws.path().join(".arcane/runtimes");
    for path in walk(&root) {
        let mode = mode(&path);
        assert_eq!(mode & 0o022, 0, "{} is {mode:04o}", path.display());
    }
}

/// Item 2: a model file an `arcane.toml` names by path is trusted like the
/// configuration: one another user can write is refused before anything starts.
#[test]
fn a_model_path_another_user_can_write_is_refused() {
    let ws = TestWorkspace::new();
    let model = ws.path().join("m.gguf");
    std::fs::copy(crate::support::smollm2(), &model).unwrap();
    std::fs::set_permissions(&model, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::fs::write(
        ws.path().join("arcane.toml"),
        format!("[[model]]\nid = \"m\"\nmodel = \"{}\"\n", model.display()),
    )
    .unwrap();
    let out = run(ws.arcane().args(["--output", "json", "serve"]));
    assert!(!out.status.success());
    let error = json(&out)["error"].clone();
    assert_eq!(error["code"], "ARCANE_POLICY_DENIED", "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("m.gguf"),
        "{error}"
    );
}

/// Item 13: what writers killed mid-write left in `.arcane` (their temporary files) is
/// cleared under the lock by the next operation; a temporary file of a write still
/// under way (fresh) is left alone, and so is anything else.
#[test]
fn debris_of_killed_writers_is_cleared_under_the_lock() {
    let ws = TestWorkspace::new();
    let out = run(ws.arcane().args(["token", "show"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let state = ws.path().join(".arcane");
    let old = state.join(".core.json.0123456789abcdef.tmp");
    let fresh = state.join(".core-token.fedcba9876543210.tmp");
    let other = state.join(".not-ours.tmp");
    for path in [&old, &fresh, &other] {
        std::fs::write(path, b"cut short").unwrap();
    }
    for path in [&old, &other] {
        let status = Command::new("touch")
            .args(["-d", "2 hours ago"])
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
    }
    let out = run(ws
        .arcane()
        .args(["lock", "run", "--operation", "sweep", "--", "true"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!old.exists(), "the old debris stayed");
    assert!(fresh.exists(), "a fresh temporary file was removed");
    assert!(other.exists(), "a file of another form was removed");
}
