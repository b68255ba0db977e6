//! The embedding example, run as a user would run it: a host from an `arcane.toml`
//! with the real `llama-server` and SmolLM2, a chat through its front door, a second
//! host for the same workspace refused, and Ctrl-C leaving no engine behind.
#![allow(clippy::disallowed_methods)] // this test drives processes and reads its environment

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

/// How long a start, a load or a stop may take on a busy machine.
const PATIENCE: Duration = Duration::from_secs(120);

/// A provisioned part (`scripts/provision.sh`): a missing one fails, naming it.
fn provisioned(variable: &str) -> PathBuf {
    let value = std::env::var_os(variable)
        .unwrap_or_else(|| panic!("{variable} is not set: run scripts/provision.sh all"));
    let path = PathBuf::from(value);
    assert!(
        path.is_file(),
        "{variable}={} is not a file",
        path.display()
    );
    path
}

/// The example, which `cargo test` builds beside this test's own binary.
fn example() -> PathBuf {
    let deps = std::env::current_exe().unwrap();
    let path = deps
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/embed_host");
    assert!(path.is_file(), "{} was not built", path.display());
    path
}

fn start(workspace: &std::path::Path) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(example())
        .arg(workspace)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, said) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    (child, said)
}

/// One HTTP/1.1 exchange with the host: the status and the body.
fn call(port: u16, token: Option<&str>, body: &Value) -> (u16, Value) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let body = body.to_string();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let status = reply[9..12].parse().unwrap();
    let (_, body) = reply.split_once("\r\n\r\n").unwrap();
    (
        status,
        serde_json::from_str(body).unwrap_or(Value::String(body.into())),
    )
}

/// The `llama-server` processes whose parent is `pid`.
fn engines_of(pid: u32) -> Vec<u32> {
    let all = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok());
    all.filter(|child: &u32| {
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
        stat.contains("(llama-server") && after.split(' ').nth(1) == Some(pid.to_string().as_str())
    })
    .collect()
}

/// The exit of `child`, waited for on a thread blocked in wait(2), within [`PATIENCE`].
fn wait_exit(mut child: Child) -> std::process::ExitStatus {
    let (exited, exit) = mpsc::channel();
    std::thread::spawn(move || exited.send(child.wait()));
    exit.recv_timeout(PATIENCE)
        .expect("the host did not stop")
        .unwrap()
}

#[test]
fn the_embedding_example_serves_a_chat_from_arcane_toml_and_stops_its_engine() {
    let (server, model) = (
        provisioned("LLAMA_SERVER"),
        provisioned("ARCANE_TEST_MODEL"),
    );
    let workspace = tempfile::tempdir().unwrap();
    let toml = format!(
        "[[model]]\nid = \"smol\"\nmodel = {:?}\nexecutable = {:?}\nargs = [\"-c\", \"512\"]\n",
        model.display().to_string(),
        server.display().to_string()
    );
    std::fs::write(workspace.path().join("arcane.toml"), toml).unwrap();
    let (host, said) = start(workspace.path());
    let line = said
        .recv_timeout(PATIENCE)
        .expect("the host says where it listens");
    assert!(line.starts_with("listening on http://127.0.0.1:"), "{line}");
    let record: Value =
        serde_json::from_slice(&std::fs::read(workspace.path().join(".arcane/core.json")).unwrap())
            .unwrap();
    let (port, token) = (
        record["port"].as_u64().unwrap() as u16,
        record["token"].as_str().unwrap(),
    );
    assert!(line.contains(&format!(":{port}")), "{line} vs {record}");

    // The door is the host's: no token, no answer; with it, the model of arcane.toml.
    let chat = json!({"model": "smol", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4});
    assert_eq!(call(port, None, &chat).0, 401);
    let (status, answer) = call(port, Some(token), &chat);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["model"], "smol", "{answer}");
    assert!(
        answer["choices"][0]["message"]["content"].is_string(),
        "{answer}"
    );
    let engines = engines_of(host.id());
    assert_eq!(
        engines.len(),
        1,
        "one engine, the host's child: {engines:?}"
    );

    // One host per workspace: a second one is refused, naming the first.
    let (mut second, _) = start(workspace.path());
    let mut refused = String::new();
    second
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut refused)
        .unwrap();
    assert_eq!(wait_exit(second).code(), Some(1));
    assert!(refused.starts_with("CORE_ALREADY_RUNNING"), "{refused}");

    // Ctrl-C: a clean stop, and the engine is gone with it.
    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(host.id() as i32, libc::SIGINT) }, 0);
    assert_eq!(wait_exit(host).code(), Some(0));
    let gone = |pid: u32| {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z "))
    };
    assert!(
        engines.iter().all(|pid| gone(*pid)),
        "{engines:?} outlived the host"
    );
}
