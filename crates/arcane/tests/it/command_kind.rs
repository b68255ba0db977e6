//! Issue 18: the `command` engine kind — any OpenAI-compatible server given as a
//! command line — proven with the real llama-server and SmolLM2: on a private socket,
//! on a port behind a key file, and on a bare port (reported as reachable without the
//! token); owned like every engine (gone with a killed host); a command that exits at
//! once fails the load with its own last lines; bad templates are refused before
//! anything starts.

use std::time::Duration;

use serde_json::json;

use crate::front_door::{call, parsed, process_tree};
use crate::gateway::{ps, row, start};
use crate::serve::{host_endpoint, proc_list, signal, wait_gone};
use crate::support::{llama_server, run, smollm2, stderr, TestWorkspace};

/// A workspace with SmolLM2 registered (no runtime: a `command` needs none) and
/// `toml` as its `arcane.toml`; `{server}` and `{model}` are replaced by the real
/// llama-server's and the model's paths.
pub(crate) fn command_workspace(toml: &str) -> TestWorkspace {
    let ws = TestWorkspace::new();
    let out = run(ws
        .arcane()
        .args(["model", "add", "smollm2-135m", "--file"])
        .arg(smollm2()));
    assert!(out.status.success(), "{}", stderr(&out));
    let toml = toml
        .replace("{server}", &llama_server().display().to_string())
        .replace("{model}", &smollm2().display().to_string());
    std::fs::write(ws.path().join("arcane.toml"), toml).unwrap();
    ws
}

/// `VAR=value` from a process's environment.
fn environ(pid: u32, name: &str) -> Option<String> {
    proc_list(pid, "environ")
        .into_iter()
        .find_map(|entry| entry.strip_prefix(&format!("{name}=")).map(str::to_string))
}

const THREE: &str = r#"
[[model]]
id = "sock"
command = ["{server}", "--host", "${SOCKET}", "-m", "${MODEL}", "-c", "512"]
model = "smollm2-135m"

[[model]]
id = "keyed"
command = ["{server}", "--host", "127.0.0.1", "--port", "${PORT}", "--api-key-file", "${API_KEY_FILE}", "-m", "{model}", "-c", "512"]
health = "/health"

[[model]]
id = "open"
command = ["{server}", "--host", "127.0.0.1", "--port", "${PORT}", "--model", "${MODEL}", "-c", "512"]
model = "{model}"
env = { ARCANE_TEST_MARK = "port-${PORT}", OMP_NUM_THREADS = "1" }
"#;

#[test]
fn the_real_llama_server_runs_as_a_command_on_a_socket_a_keyed_port_and_an_open_port() {
    let ws = command_workspace(THREE);
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);

    // Each answers through the front door, named as the client asked.
    for id in ["sock", "keyed", "open"] {
        let (code, body) = call(
            port,
            &token,
            "POST",
            "/v1/chat/completions",
            Some(
                json!({"model": id, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}),
            ),
        );
        assert_eq!(code, 200, "{id}: {body}");
        let answer = parsed("/v1/chat/completions", &body);
        assert_eq!(answer["model"], id, "{answer}");
        assert!(answer["choices"][0]["message"]["content"].is_string());
    }

    let rows = ps(&ws);
    let pid = |id: &str| row(&rows, id)["pid"].as_u64().unwrap() as u32;
    for id in ["sock", "keyed", "open"] {
        assert_eq!(row(&rows, id)["state"], "ready", "{rows:#?}");
        // Each is its own process under the host: owned, reaped with it.
        assert!(process_tree(serve.pid()).contains(&pid(id)), "{id}");
        // `device` defaults to the CPU: every GPU is hidden from it.
        assert_eq!(
            environ(pid(id), "CUDA_VISIBLE_DEVICES").as_deref(),
            Some(""),
            "{id}"
        );
    }

    // Reachability, honestly: the socket and the key close the door; a bare port does not.
    assert_eq!(row(&rows, "sock")["reachableWithoutToken"], false);
    assert_eq!(row(&rows, "keyed")["reachableWithoutToken"], false);
    assert_eq!(row(&rows, "open")["reachableWithoutToken"], true);
    let (_, models) = call(port, &token, "GET", "/v1/models", None);
    let listed = parsed("/v1/models", &models)["data"]
        .as_array()
        .cloned()
        .unwrap();
    let open_entry = listed.iter().find(|m| m["id"] == "open").unwrap();
    assert_eq!(open_entry["reachableWithoutToken"], true, "{listed:#?}");
    let status = run(ws.arcane().arg("status"));
    let status_text = crate::support::stdout(&status);
    let open_line = status_text
        .lines()
        .find(|l| l.starts_with("  model ") && l.contains(" open "))
        .unwrap_or_else(|| panic!("{status_text}"));
    assert!(
        open_line.contains("reachable without the token"),
        "{status_text}"
    );

    // The socket engine has no TCP port at all.
    assert_eq!(
        arcane_process::tcp_listeners(pid("sock")).unwrap_or_default(),
        Vec::new()
    );
    // The keyed port refuses whoever lacks the key; the open one answers anyone.
    let port_of = |id: &str| -> u16 {
        let url = row(&rows, id)["url"].as_str().unwrap().to_string();
        url.rsplit(':')
            .next()
            .unwrap()
            .trim_end_matches('/')
            .parse()
            .unwrap()
    };
    let direct = |port: u16| {
        crate::support::http_exchange(
            &format!("127.0.0.1:{port}"),
            &format!(
                "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
            ),
        )
        .0
    };
    assert_eq!(direct(port_of("keyed")), 401);
    assert_eq!(direct(port_of("open")), 200);
    // `${PORT}` in `env` is this start's port.
    assert_eq!(
        environ(pid("open"), "ARCANE_TEST_MARK"),
        Some(format!("port-{}", port_of("open")))
    );
    assert_eq!(
        environ(pid("open"), "OMP_NUM_THREADS").as_deref(),
        Some("1")
    );

    // kill -9 of the host leaves no engine behind.
    let engines: Vec<u32> = ["sock", "keyed", "open"].map(pid).to_vec();
    signal(serve.pid(), "KILL");
    for engine in engines {
        assert!(
            wait_gone(engine, Duration::from_secs(10)),
            "engine {engine} outlived a killed host"
        );
    }
    let _ = serve.seen();
}

#[test]
fn a_command_that_exits_at_once_fails_the_load_with_its_last_lines() {
    let ws = command_workspace(
        r#"
[[model]]
id = "broken"
command = ["/bin/sh", "-c", "echo 'error: unknown argument: --bogus' >&2; exit 3", "${PORT}"]
"#,
    );
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);
    let (code, body) = call(
        port,
        &token,
        "POST",
        "/v1/chat/completions",
        Some(json!({"model": "broken", "messages": [{"role": "user", "content": "hi"}]})),
    );
    assert!(code >= 500, "{code} {body}");
    assert!(body.contains("error: unknown argument: --bogus"), "{body}");
    let failed = serve.wait_for("local-ai.model.error", Duration::from_secs(10));
    assert_eq!(failed["data"]["model"], "broken");
    let rows = ps(&ws);
    assert_eq!(row(&rows, "broken")["state"], "error", "{rows:#?}");
    assert!(row(&rows, "broken")["lastError"]
        .to_string()
        .contains("--bogus"));
    // Issue 19, item 16: the human table says why, not only `failed`.
    let human = crate::support::stdout(&run(ws.arcane().arg("ps")));
    let reason = human
        .lines()
        .find(|l| l.starts_with("broken: "))
        .unwrap_or_else(|| panic!("{human}"));
    assert!(reason.contains("exited before it was ready"), "{human}");
}

#[test]
fn bad_command_tables_are_refused_before_anything_starts() {
    let cases = [
        (
            r#"command = ["/bin/true", "--x=${HOME}", "${PORT}"]"#,
            "`${HOME}` is not a placeholder",
        ),
        (
            r#"command = ["/bin/true", "--port", "9"]"#,
            "neither `${PORT}` nor `${SOCKET}`",
        ),
        (
            r#"command = ["/bin/true", "${PORT}"]
env = { CUDA_VISIBLE_DEVICES = "0" }"#,
            "CUDA_VISIBLE_DEVICES",
        ),
        (
            r#"command = ["/bin/true", "${PORT}", "-m", "${MODEL}"]"#,
            "no `model` is set",
        ),
        (
            r#"command = ["/bin/true", "${PORT}"]
args = ["-c", "512"]"#,
            "`args` does not apply",
        ),
        (
            r#"command = ["no-such-program-anywhere", "${PORT}"]"#,
            "is not on `PATH`",
        ),
    ];
    for (table, expected) in cases {
        let ws = command_workspace(&format!("[[model]]\nid = \"bad\"\n{table}\n"));
        let out = run(ws.arcane().arg("serve"));
        assert!(!out.status.success(), "{table}");
        let text = stderr(&out);
        assert!(text.contains(expected), "{table}: {text}");
        // Refused as configuration, before any engine or port.
        assert!(!text.contains("process.starting"), "{text}");
    }
}

/// Issue 19, item 1: engine arguments that would open another door (where or how the
/// engine listens or authenticates) are refused in every spelling, in `[[model]]`
/// tables and after `--` on the command line, before anything starts.
#[test]
fn engine_args_that_would_open_a_door_are_refused_in_every_spelling() {
    let port = crate::serve::free_port().to_string();
    for args in [
        vec!["--host", "127.0.0.1", "--port", port.as_str()],
        vec!["-c", "512", "--port=18631"],
        vec!["--api-key-file", "/tmp/k"],
        vec!["--ssl-key-file=/tmp/x"],
    ] {
        let quoted: Vec<String> = args.iter().map(|a| format!("\"{a}\"")).collect();
        let ws = crate::gateway::gateway_workspace(&format!(
            "[[model]]\nid = \"m\"\nmodel = \"smollm2-135m\"\nargs = [{}]\n",
            quoted.join(", ")
        ));
        let out = run(ws.arcane().arg("serve"));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let text = stderr(&out);
        let flag = args
            .iter()
            .find(|a| a.starts_with("--") && *a != &"-c")
            .unwrap();
        let name = flag.split('=').next().unwrap();
        assert!(text.contains(name), "{args:?}: {text}");
        assert!(text.contains("`command`"), "{text}");

        // The same after `--` for the embedded default's engine.
        std::fs::remove_file(ws.path().join("arcane.toml")).unwrap();
        let out = run(ws.arcane().args(["serve", "--"]).args(&args));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(name), "{}", stderr(&out));
    }
    // Nothing listens where the refused arguments pointed.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port.parse::<u16>().unwrap())).is_err());
}

/// `arcane serve` for a person (human output), its stderr lines on a channel.
struct HumanServe {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl HumanServe {
    fn start(ws: &TestWorkspace) -> HumanServe {
        use std::io::BufRead;
        let mut child = ws
            .arcane()
            .arg("serve")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn arcane serve");
        let stderr = child.stderr.take().unwrap();
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        HumanServe { child, lines }
    }

    /// The first line that starts with `prefix` (waiting at most `within`).
    fn line_starting(&self, prefix: &str, within: Duration) -> String {
        let deadline = std::time::Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(line) => seen.push(line),
                Err(_) => panic!("no `{prefix}` line within {within:?}: {seen:#?}"),
            }
        }
    }
}

impl Drop for HumanServe {
    fn drop(&mut self) {
        signal(self.child.id(), "TERM");
        crate::support::wait_for_exit(&mut self.child, Duration::from_secs(60), "arcane serve");
    }
}

/// Issue 27, item 8: a `command` model on `${SOCKET}` is shown at its socket by the
/// `ready:` line of `arcane serve` and by `arcane status`, loaded or not, never at
/// the placeholder of a port not chosen (`http://127.0.0.1:0`).
#[test]
fn a_socket_command_is_shown_at_its_socket_by_serve_and_status() {
    let ws = command_workspace(
        r#"
[[model]]
id = "sock"
command = ["{server}", "--host", "${SOCKET}", "-m", "{model}", "-c", "512"]
load = "on-start"
"#,
    );
    let socket = format!("unix:{}", ws.path().join(".arcane/run/sock.sock").display());
    let serve = HumanServe::start(&ws);
    let ready = serve.line_starting("ready:", Duration::from_secs(60));
    assert!(
        ready.contains(&format!("at {socket} ")) && !ready.contains("127.0.0.1:0"),
        "{ready}"
    );
    let status = || {
        let out = run(ws.arcane().arg("status"));
        assert!(out.status.success(), "{}", stderr(&out));
        let text = crate::support::stdout(&out);
        let engine = text
            .lines()
            .find(|l| l.starts_with("  engine "))
            .unwrap_or_else(|| panic!("{text}"))
            .to_string();
        assert!(
            engine.contains(&format!("at {socket} ")) && !text.contains("127.0.0.1:0"),
            "{text}"
        );
        let out = run(ws.arcane().args(["--output", "json", "status"]));
        let engines = crate::support::json(&out)["engines"].clone();
        assert_eq!(engines[0]["url"], socket.as_str(), "{engines}");
    };
    // Loaded, then unloaded (no engine: the model's table says where it will listen).
    let out = run(ws.arcane().args(["load", "sock"]));
    assert!(out.status.success(), "{}", stderr(&out));
    status();
    let out = run(ws.arcane().args(["unload", "sock"]));
    assert!(out.status.success(), "{}", stderr(&out));
    status();
    drop(serve);
}
