//! Issue 28: the secrets of the dashboard's and the CLI's doors stay this user's. The
//! login link never sits on a command line another local user can read, and the CLI
//! sends the token only to the process that provably is the running host.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::core::Guard;
use crate::gateway::{gateway_workspace, start};
use crate::serve::{host_endpoint, signal, wait_gone};
use crate::support::{json, run, stderr, wait_until, TestWorkspace};

/// A workspace whose host routes one model, loaded only on request: a host that
/// listens and starts no engine.
fn idle_host() -> (TestWorkspace, crate::serve::Serve) {
    let ws = gateway_workspace("[[model]]\nid = \"smol\"\nmodel = \"smollm2-135m\"\n");
    let serve = start(&ws);
    (ws, serve)
}

/// Runs `cat path` as another local user (uid 65534); whether it could read it.
fn other_user_reads(path: &std::path::Path) -> bool {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
        .arg(path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run setpriv")
        .success()
}

/// Item 1: `arcane open` hands the opener a `file://` page in the private run
/// directory, never the login link: nothing in any process's arguments redeems a
/// session. The page is this user's alone and its link logs a browser in.
#[test]
fn the_login_link_never_sits_on_a_command_line() {
    let (ws, mut serve) = idle_host();
    let (port, _) = host_endpoint(&ws);
    // A stand-in for the desktop's opener: it records its arguments and the page.
    let bin = tempfile::tempdir().unwrap();
    let record = bin.path().join("argv");
    let opener = bin.path().join("xdg-open");
    std::fs::write(
        &opener,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$@\" > '{}'\n",
            record.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&opener, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = run(ws
        .arcane()
        .args(["--output", "json", "open"])
        .env("PATH", path));
    assert!(out.status.success(), "{}", stderr(&out));
    let answer = json(&out);
    assert_eq!(answer["opened"], true, "{answer}");
    let url = answer["url"].as_str().expect("the link").to_string();
    let code = url.split("#code=").nth(1).expect("a code in the link");

    let argv = std::fs::read_to_string(&record).expect("the opener ran");
    assert!(
        !argv.contains(code),
        "the code is on the command line: {argv}"
    );
    assert!(!argv.contains("#code="), "{argv}");
    let page = argv
        .trim()
        .strip_prefix("file://")
        .unwrap_or_else(|| panic!("a file URL: {argv}"));
    assert_eq!(answer["page"], page, "{answer}");
    let page = std::path::Path::new(page);
    let run_dir = ws.path().join(".arcane/run").canonicalize().unwrap();
    assert_eq!(page.parent(), Some(run_dir.as_path()), "{}", page.display());
    let meta = std::fs::symlink_metadata(page).unwrap();
    assert!(meta.file_type().is_file());
    assert_eq!(meta.mode() & 0o777, 0o600, "{}", page.display());
    assert_eq!(std::fs::metadata(&run_dir).unwrap().mode() & 0o777, 0o700);
    assert!(!other_user_reads(page), "another user read the login page");

    // The page sends the browser on to the link, and the link logs in once.
    let html = std::fs::read_to_string(page).unwrap();
    assert!(
        html.contains(&format!("http-equiv=\"refresh\" content=\"0;url={url}\"")),
        "{html}"
    );
    let authority = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split_once("/ui#"))
        .map(|(authority, _)| authority.to_string())
        .expect("the link's host");
    let body = format!("{{\"code\":\"{code}\"}}");
    let (status, head, reply) = crate::front_door::exchange(
        port,
        &format!(
            "POST /ui/session HTTP/1.1\r\nHost: {authority}\r\nOrigin: http://{authority}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    );
    assert_eq!(status, 204, "{head}{reply}");
    serve.terminate();
}

/// A stand-in for another local user's server: listens on `port` as uid 65534 and
/// appends the head of every request it gets to `log`.
const FOREIGN_SERVER: &str = r#"
import socket, sys
port, log = int(sys.argv[1]), sys.argv[2]
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen(16)
print("listening", flush=True)
while True:
    connection, _ = server.accept()
    connection.settimeout(10)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = connection.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    with open(log, "ab") as f:
        f.write(data + b"\n----\n")
    body = b'{"protocol":"arcane/1","state":"ready"}'
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    connection.close()
"#;

/// Item 2: after the host dies (kill -9) its `core.json` stays; while an `arcane core
/// --stdio` holds the owner lease, another user's program has the dead host's pid
/// (simulated: `core.json` is pointed at that program, as pid reuse would) and
/// listens on its port. The CLI finds that the lease's holder is not the recorded
/// pid and sends the token nowhere.
#[test]
fn the_token_goes_only_to_the_process_that_holds_the_lease_and_the_port() {
    let (ws, serve) = idle_host();
    let (port, token) = host_endpoint(&ws);
    let host = serve.pid();
    signal(host, "KILL");
    assert!(wait_gone(host, Duration::from_secs(30)), "the host died");
    let endpoint = ws.path().join(".arcane/core.json");
    assert!(endpoint.exists(), "a killed host leaves its core.json");

    let _stdio = Guard(
        ws.arcane()
            .args(["core", "--stdio"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start core --stdio"),
    );
    wait_until(
        Duration::from_secs(60),
        "core --stdio to hold the lease",
        || arcane_lock::owner_lease_held(ws.path(), "core").unwrap_or(false),
    );

    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let log = dir.path().join("requests");
    let mut foreign = Guard(
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/usr/bin/python3",
                "-c",
            ])
            .arg(FOREIGN_SERVER)
            .arg(port.to_string())
            .arg(&log)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the other user's server"),
    );
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(foreign.0.stdout.as_mut().expect("its stdout")),
        &mut ready,
    )
    .unwrap();
    assert_eq!(ready.trim(), "listening");
    let mut record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&endpoint).unwrap()).unwrap();
    record["pid"] = foreign.0.id().into();
    arcane_files::write_atomic(&endpoint, record.to_string().as_bytes(), 0o600).unwrap();

    for args in [
        &["--output", "json", "status"][..],
        &["--output", "json", "ps"][..],
        &["--output", "json", "chat", "hi"][..],
    ] {
        let out = run(ws.arcane().args(args));
        let sent = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            !sent.contains(&token),
            "`arcane {args:?}` sent the token to another user's process: {sent}"
        );
        assert!(
            !out.status.success() || args[2] == "status",
            "{args:?}: {}",
            stderr(&out)
        );
    }
}
