//! Issue 28: what another local user can write or reach does not become Arcane's: web
//! directories, `command` engines' ports, engine libraries, a reload storm, a host
//! that stops answering.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::serve::{host_endpoint, real_socket_args, strs, wait_host_ready, Serve, START};
use crate::support::{run, stderr, stdout, TestWorkspace};

/// The other local user: `nobody`.
const OTHER: u32 = 65534;

/// `program args…` run as the other user (`setpriv`, no supplementary groups).
fn as_other(program: &str) -> Command {
    let mut command = Command::new("setpriv");
    command.args([
        &format!("--reuid={OTHER}"),
        &format!("--regid={OTHER}"),
        "--clear-groups",
        "--",
        program,
    ]);
    command
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// One raw HTTP/1.1 exchange with the host on loopback `port`: status, headers (as
/// sent) and body.
fn exchange(port: u16, request: &str) -> (u16, String, String) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

/// A dashboard session on the running host: the login code of `arcane open --print`
/// traded at `POST /ui/session` on the link's own host name. The host name (for
/// `Host`) and the `Cookie` header value.
fn session_cookie(ws: &TestWorkspace, port: u16) -> (String, String) {
    let open = run(ws.arcane().args(["open", "--print"]));
    assert!(open.status.success(), "{}", stderr(&open));
    let link = stdout(&open).trim().to_string();
    let (origin, code) = link
        .split_once("/ui#code=")
        .map(|(origin, rest)| {
            let code = rest.split('&').next().unwrap_or_default();
            (origin.to_string(), code.to_string())
        })
        .unwrap_or_else(|| panic!("no login code in {link}"));
    let authority = origin.trim_start_matches("http://").to_string();
    let body = serde_json::json!({ "code": code }).to_string();
    let (status, head, _) = exchange(
        port,
        &format!(
            "POST /ui/session HTTP/1.1\r\nHost: {authority}\r\nOrigin: {origin}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    );
    assert_eq!(status, 204, "{head}");
    let cookie = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("set-cookie").then(|| {
                value
                    .trim()
                    .split(';')
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
        })
        .unwrap_or_else(|| panic!("no session cookie in {head}"));
    (authority, cookie)
}

/// `GET /ui/app/<path>` with the session (`session_cookie`'s host name and cookie):
/// status and body.
fn app_get(port: u16, (authority, cookie): &(String, String), path: &str) -> (u16, String) {
    let (status, _, body) = exchange(
        port,
        &format!(
            "GET /ui/app/{path} HTTP/1.1\r\nHost: {authority}\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n"
        ),
    );
    (status, body)
}

/// Item 8: files another user writes into a subdirectory of the served web directory
/// (one they may add to, one of theirs), and a hard link to a file outside it, are
/// refused with 403 naming the path inside; none of their bytes reach the page; the
/// app's own files are still served.
#[test]
fn what_another_user_writes_below_the_web_directory_is_refused() {
    let ws = TestWorkspace::new();
    // The other user may reach the web directory (to write where they are allowed).
    chmod(ws.path(), 0o755);
    let web = ws.path().join("web");
    crate::web::copy_app(&web);
    let drop = web.join("drop");
    std::fs::create_dir(&drop).unwrap();
    chmod(&drop, 0o1777);
    let theirs = web.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(OTHER), Some(OTHER)).unwrap();
    let secret = ws.path().join("outside.txt");
    std::fs::write(&secret, "outside-secret").unwrap();
    std::fs::hard_link(&secret, web.join("linked.txt")).unwrap();

    let mut args = real_socket_args();
    args.extend(["--web".into(), web.display().to_string()]);
    let mut serve = Serve::start(&ws, &strs(&args));
    serve.wait_for("local-ai.server.ready", START);
    wait_host_ready(&ws);

    // After the host started (the top directory passed its check), the other user
    // writes where they can.
    for target in [drop.join("evil.js"), theirs.join("index.html")] {
        let out = run(as_other("sh")
            .arg("-c")
            .arg("echo planted-by-other > \"$1\"")
            .arg("sh")
            .arg(&target));
        assert!(out.status.success(), "{}", stderr(&out));
    }

    let (port, _) = host_endpoint(&ws);
    let session = session_cookie(&ws, port);
    let (status, body) = app_get(port, &session, "app.js");
    assert_eq!(status, 200, "the app's own files are served: {body}");
    for (path, inside) in [
        ("drop/evil.js", "drop/evil.js"),
        ("theirs/", "theirs"),
        ("theirs/index.html", "theirs"),
        ("linked.txt", "linked.txt"),
    ] {
        let (status, body) = app_get(port, &session, path);
        assert_eq!(status, 403, "{path}: {body}");
        assert!(
            !body.contains("planted-by-other") && !body.contains("outside-secret"),
            "{path}: {body}"
        );
        let error: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{body}"));
        assert_eq!(error["error"]["code"], "ARCANE_POLICY_DENIED", "{body}");
        assert_eq!(error["error"]["details"]["path"], inside, "{body}");
    }
    serve.terminate();
}

/// Item 12a: `serve --executable DIR/llama-server` refuses an engine whose library
/// beside it (found by its `$ORIGIN` run path, no library directory named) another
/// user owns, as `runtime add` does, naming the library; nothing is started.
#[test]
fn serve_refuses_an_executable_whose_library_beside_it_another_user_owns() {
    let ws = TestWorkspace::new();
    let real = crate::support::llama_server();
    let dir = ws.path().join("engine");
    std::fs::create_dir(&dir).unwrap();
    chmod(&dir, 0o755);
    let source = real.parent().expect("the engine's directory");
    let copied = run(Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", source.display()))
        .arg(&dir));
    assert!(copied.status.success(), "{}", stderr(&copied));
    let library = dir.join("libggml-cpu.so.0.26.0");
    assert!(library.is_file(), "the copy holds {}", library.display());
    std::os::unix::fs::chown(&library, Some(OTHER), Some(OTHER)).unwrap();
    let executable = dir.join(real.file_name().expect("a file name"));

    let model = crate::support::smollm2().display().to_string();
    let executable = executable.display().to_string();
    let mut serve = Serve::start(&ws, &["--model", &model, "--executable", &executable]);
    // Its error line, or (the bug) its engine ready.
    let error = serve.wait_line("an error or a ready engine", START, |line| {
        line["type"] == "error" || line["type"] == "local-ai.server.ready"
    });
    assert_eq!(error["error"]["code"], "ARCANE_POLICY_DENIED", "{error}");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("libggml-cpu.so.0.26.0") && message.contains(&OTHER.to_string()),
        "names the library and its owner: {error}"
    );
    assert_ne!(serve.wait_exit(START), Some(0));
    let started: Vec<&Value> = serve
        .seen()
        .iter()
        .filter(|line| {
            line["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("local-ai.server."))
                && line["data"]["pid"].is_u64()
        })
        .collect();
    assert!(started.is_empty(), "no engine was started: {started:?}");
}

/// The state letter of `pid` (`T`: stopped).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// `arcane --output json ARGS…` run to its end (bounded by `within`, then killed):
/// its exit code and JSON output.
fn client_command(ws: &TestWorkspace, args: &[&str], within: Duration) -> (Option<i32>, Value) {
    let child = ws
        .arcane()
        .args(["--output", "json"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn arcane");
    let mut child = crate::core::Guard(child);
    let what = format!("`arcane {}`", args.join(" "));
    let status = crate::support::wait_for_exit(&mut child.0, within, &what);
    let mut text = String::new();
    if let Some(mut out) = child.0.stdout.take() {
        let _ = out.read_to_string(&mut text);
    }
    let value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{what}: {text}"));
    (status.code(), value)
}

/// Item 12c: against a host that stopped answering (SIGSTOP), every client command
/// ends with `CORE_TIMEOUT` naming the host's pid, that it is stopped, and the
/// deadline: `unload` by its own default (it used `load`'s 600 s), `reload` and `ps`
/// at a `--timeout` they now have, `status` at its own. Then the host, resumed,
/// answers and stops.
#[test]
fn client_commands_against_a_stopped_host_end_at_their_deadline_naming_it() {
    let ws = TestWorkspace::new();
    let (host, endpoint) = crate::hardening::serve_beside_ollama(&ws, &[]);
    let pid = endpoint["pid"].as_u64().expect("the host's pid") as u32;
    crate::serve::signal(pid, "STOP");
    crate::support::wait_until(Duration::from_secs(10), "the host stopped", || {
        process_state(pid) == Some('T')
    });
    let timed_out = |args: &[&str], within: Duration| {
        let (code, output) = client_command(&ws, args, within);
        let error = &output["error"];
        assert_eq!(code, Some(1), "{args:?}: {output}");
        assert_eq!(error["code"], "CORE_TIMEOUT", "{args:?}: {error}");
        assert_eq!(error["details"]["pid"], pid, "{args:?}: {error}");
        assert_eq!(error["details"]["stopped"], true, "{args:?}: {error}");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("pid {pid}")) && message.contains("stopped"),
            "{args:?}: {error}"
        );
        assert!(
            error["hints"]
                .to_string()
                .contains(&format!("kill -CONT {pid}")),
            "{args:?}: {error}"
        );
        error["details"]["deadlineSeconds"]
            .as_f64()
            .unwrap_or(f64::MAX)
    };
    // Its own default deadline, no flag: bounded well below the 600 s it had.
    let deadline = timed_out(&["unload", "m"], Duration::from_secs(90));
    assert!(
        deadline <= 30.0,
        "unload's default deadline is {deadline} s"
    );
    for args in [
        &["reload", "--timeout", "1"][..],
        &["ps", "--timeout", "1"],
        &["status", "--timeout", "1"],
        &["unload", "m", "--timeout", "1"],
    ] {
        let deadline = timed_out(args, Duration::from_secs(60));
        assert_eq!(deadline, 1.0, "{args:?}");
    }
    crate::serve::signal(pid, "CONT");
    let out = run(ws.arcane().args(["--output", "json", "status"]));
    assert!(
        out.status.success(),
        "the resumed host answers: {}",
        stderr(&out)
    );
    crate::core::terminate(host);
}

/// Three `command` models behind `${API_KEY_FILE}`: `honours` gives the key to the
/// real llama-server; `ignores` and `strict` only put its path in the environment, so
/// the same server runs without a key (a server that ignores the key it is given,
/// speaking the real protocol); `strict` requires the key.
const KEYED: &str = r#"
[[model]]
id = "honours"
command = ["{server}", "--host", "127.0.0.1", "--port", "${PORT}", "--api-key-file", "${API_KEY_FILE}", "-m", "{model}", "-c", "512"]

[[model]]
id = "ignores"
command = ["{server}", "--host", "127.0.0.1", "--port", "${PORT}", "-m", "{model}", "-c", "512"]
env = { UNUSED_KEY_FILE = "${API_KEY_FILE}" }

[[model]]
id = "strict"
command = ["{server}", "--host", "127.0.0.1", "--port", "${PORT}", "-m", "{model}", "-c", "512"]
env = { UNUSED_KEY_FILE = "${API_KEY_FILE}" }
require_key = true
"#;

/// `GET http://127.0.0.1:PORT/v1/models` as the other user, no key: its status.
fn other_user_gets_models(url: &str) -> String {
    let script = "import sys, urllib.request, urllib.error\ntry:\n    print(urllib.request.urlopen(sys.argv[1] + '/v1/models', timeout=10).status)\nexcept urllib.error.HTTPError as e:\n    print(e.code)\n";
    let out = run(as_other("/usr/bin/python3").args(["-c", script, url]));
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out).trim().to_string()
}

/// Item 10: a `command` server that ignores `${API_KEY_FILE}` (another local user
/// reaches it with 200) is reported reachable without the token in `arcane ps`,
/// `/v1/models`, `arcane status` and its ready event, not "behind a key"; with
/// `require_key = true` it is refused and stopped; one that honours its key is still
/// behind it.
#[test]
fn a_command_server_that_ignores_its_key_is_reported_reachable_or_refused() {
    let ws = crate::command_kind::command_workspace(KEYED);
    let mut serve = crate::gateway::start(&ws);
    for id in ["honours", "ignores"] {
        let out = run(ws.arcane().args(["--output", "json", "load", id]));
        assert!(out.status.success(), "{id}: {}", stderr(&out));
    }
    let rows = crate::gateway::ps(&ws);
    let honours = crate::gateway::row(&rows, "honours");
    let ignores = crate::gateway::row(&rows, "ignores");
    let url_of = |row: &Value| row["url"].as_str().expect("a ready url").to_string();

    // What another user sees: one port refuses them, the other serves them.
    assert_eq!(other_user_gets_models(&url_of(honours)), "401");
    assert_eq!(other_user_gets_models(&url_of(ignores)), "200");

    assert_eq!(honours["reachableWithoutToken"], false, "{honours}");
    assert_eq!(honours["keyIgnored"], false, "{honours}");
    assert_eq!(ignores["reachableWithoutToken"], true, "{ignores}");
    assert_eq!(ignores["keyIgnored"], true, "{ignores}");

    let (port, token) = host_endpoint(&ws);
    let (code, body) = crate::front_door::call(port, &token, "GET", "/v1/models", None);
    assert_eq!(code, 200, "{body}");
    let models: Value = serde_json::from_str(&body).expect("a JSON model list");
    let listed = |id: &str| {
        models["data"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no `{id}` in {models}"))
    };
    assert_eq!(listed("ignores")["reachableWithoutToken"], true, "{models}");
    assert_eq!(
        listed("honours")["reachableWithoutToken"],
        false,
        "{models}"
    );

    let status = run(ws.arcane().arg("status"));
    assert!(status.status.success(), "{}", stderr(&status));
    let text = stdout(&status);
    let line = text
        .lines()
        .find(|l| {
            l.trim_start().starts_with("model") && l.contains(" ignores ") && l.contains("pid")
        })
        .unwrap_or_else(|| panic!("no `ignores` line in {text}"));
    assert!(line.contains("reachable without the token"), "{text}");

    let ready = serve.wait_line("`ignores` ready", START, |line| {
        line["type"] == "local-ai.model.ready" && line["data"]["model"] == "ignores"
    });
    assert_eq!(ready["data"]["keyIgnored"], true, "{ready}");

    // Required: refused with the policy code, and its engine is gone.
    let out = run(ws.arcane().args(["--output", "json", "load", "strict"]));
    assert!(!out.status.success(), "{}", stdout(&out));
    let error = crate::support::json(&out)["error"].clone();
    assert_eq!(error["code"], "ARCANE_POLICY_DENIED", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap_or_default()
            .contains("without its key"),
        "{error}"
    );
    let rows = crate::gateway::ps(&ws);
    let strict = crate::gateway::row(&rows, "strict");
    assert_eq!(strict["pid"], Value::Null, "{strict}");
    assert_ne!(strict["state"], "ready", "{strict}");
    serve.terminate();
}

/// The storm's two valid configurations: the same ids, other arguments (so a reload
/// replaces both models), and one model only the first has (added, then removed).
const STORM_A: &str = r#"
[[model]]
id = "m"
model = "smollm2-135m"
args = ["-c", "512"]

[[model]]
id = "n"
model = "smollm2-135m"
args = ["-c", "512"]
"#;
const STORM_B: &str = r#"
[[model]]
id = "m"
model = "smollm2-135m"
args = ["-c", "640"]
"#;

/// Item 12b: twenty `arcane reload`s while chat requests run and `arcane.toml` flips
/// between two configurations and an invalid one leave no engine the host does not
/// report: once the requests are done every llama-server under the host is the pid of
/// a model `arcane ps` lists, and none remains after the host stops.
#[test]
fn a_reload_storm_under_requests_leaves_no_engine_untracked() {
    let ws = crate::gateway::gateway_workspace(STORM_A);
    let mut serve = crate::gateway::start(&ws);
    let (port, token) = host_endpoint(&ws);
    let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let clients: Vec<_> = (0..3)
        .map(|client| {
            let (running, token) = (std::sync::Arc::clone(&running), token.clone());
            std::thread::spawn(move || {
                let mut answered = 0;
                while running.load(std::sync::atomic::Ordering::SeqCst) {
                    let model = if client == 2 { "n" } else { "m" };
                    let body = serde_json::json!({"model": model, "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 16});
                    let (status, _) = crate::front_door::call(
                        port,
                        &token,
                        "POST",
                        "/v1/chat/completions",
                        Some(body),
                    );
                    answered += usize::from(status == 200);
                }
                answered
            })
        })
        .collect();
    // The first answers: requests are running when the storm starts.
    crate::support::wait_until(START, "a loaded model", || {
        crate::gateway::ps(&ws)
            .iter()
            .any(|row| row["state"] == "ready")
    });
    let configurations = [STORM_B, "[[model]]\nid = 7\n", STORM_A, "not toml ["];
    for round in 0..20 {
        let text = configurations[round % configurations.len()]
            .replace("{model}", &crate::support::smollm2().display().to_string());
        std::fs::write(ws.path().join("arcane.toml"), text).unwrap();
        let out = run(ws.arcane().args(["--output", "json", "reload"]));
        let valid = round % 2 == 0;
        assert_eq!(
            out.status.success(),
            valid,
            "round {round}: {}",
            stderr(&out)
        );
        // Some loads under each configuration.
        let (status, _) = crate::front_door::call(
            port,
            &token,
            "POST",
            "/v1/chat/completions",
            Some(
                serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
            ),
        );
        assert!(status == 200 || status == 503, "round {round}: {status}");
    }
    running.store(false, std::sync::atomic::Ordering::SeqCst);
    let answered: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
    assert!(answered > 0, "requests ran during the storm");

    // Every engine under the host is one a listed model reports (a replaced model's
    // engine goes once its requests are done: waited for, bounded).
    let untracked = || {
        let reported: Vec<u64> = crate::gateway::ps(&ws)
            .iter()
            .filter_map(|row| row["pid"].as_u64())
            .collect();
        crate::gateway::engines_of(&serve)
            .into_iter()
            .filter(|pid| !reported.contains(&u64::from(*pid)))
            .collect::<Vec<u32>>()
    };
    let within = Duration::from_secs(90);
    let deadline = std::time::Instant::now() + within;
    loop {
        let left: Vec<arcane_process::Identity> = untracked()
            .into_iter()
            .filter_map(arcane_process::Identity::of)
            .collect();
        if left.is_empty() || std::time::Instant::now() >= deadline {
            break;
        }
        // Woken by the end of one of them (a pidfd), and looking again at least each
        // second (a listing may catch up meanwhile).
        let next = std::time::Instant::now() + Duration::from_secs(1);
        arcane_process::wait_for_an_end(&left, next.min(deadline));
    }
    assert_eq!(
        untracked(),
        Vec::<u32>::new(),
        "engines no model reports, {within:?} after the storm; ps: {:#?}",
        crate::gateway::ps(&ws)
    );
    let engines = crate::gateway::engines_of(&serve);
    serve.terminate();
    for pid in engines {
        assert!(
            crate::serve::wait_gone(pid, Duration::from_secs(30)),
            "engine {pid} outlived the host"
        );
    }
}
