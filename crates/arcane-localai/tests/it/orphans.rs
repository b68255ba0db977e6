//! Ownership records: a proven orphan of an earlier Arcane is stopped by the next start;
//! a stranger (reused pid, other executable, live owner) is never touched.

use std::process::{Command, Stdio};
use std::time::Duration;

use arcane_localai::NONCE_VARIABLE;
use arcane_report::CancelToken;
use serde_json::json;

use crate::support::*;

/// Starts the fake as an "orphan": its own process group, the nonce in its environment.
fn orphan(port: u16, nonce: &str) -> Proc {
    use std::os::unix::process::CommandExt;
    let proc = Proc(
        Command::new(fake("fake_llama.py"))
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .env(NONCE_VARIABLE, nonce)
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until(Duration::from_secs(20), || {
        http_get(port, "/health").is_some()
    });
    proc
}

fn start_time(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

fn write_record(
    ws: &std::path::Path,
    pid: u32,
    start: u64,
    exe: &str,
    nonce: &str,
    owner: (u32, u64),
    port: u16,
) {
    let dir = ws.join(".arcane/engines");
    std::fs::create_dir_all(&dir).unwrap();
    let record = json!({
        "schemaVersion": 1, "kind": "arcane-engine-ownership", "id": "llama.cpp",
        "engine": "llama.cpp", "url": format!("http://127.0.0.1:{port}"), "port": port,
        "pid": pid, "startTime": start, "exe": exe, "executable": fake("fake_llama.py"),
        "nonce": nonce, "owner": {"pid": owner.0, "startTime": owner.1},
        "createdAt": "2026-11-29T00:00:00.000Z",
    });
    std::fs::write(
        dir.join("llama.cpp.json"),
        serde_json::to_vec(&record).unwrap(),
    )
    .unwrap();
}

fn exe_of(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .unwrap()
        .display()
        .to_string()
}

/// A pid that is certainly dead (a child that exited and was reaped).
fn dead_owner() -> (u32, u64) {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    (pid, 1)
}

#[tokio::test]
async fn a_proven_orphan_is_stopped_and_replaced_by_an_owned_server() {
    let ws = workspace();
    let port = free_port();
    let stale = orphan(port, "n0nce");
    let pid = stale.pid();
    write_record(
        ws.path(),
        pid,
        start_time(pid),
        &exe_of(pid),
        "n0nce",
        dead_owner(),
        port,
    );
    let (supervisor, events) = supervisor(ws.path());
    let server = supervisor
        .start(fake_llama(port, &[]), CancelToken::new())
        .await
        .unwrap();
    let stopped = events_of(&events, "process.orphan.stopped");
    assert_eq!(stopped.len(), 1);
    assert_eq!(stopped[0]["pid"], pid);
    assert!(!alive(pid), "the orphan is stopped, not adopted");
    assert!(server.is_owned(), "a fresh server is started in its place");
    server.close().await;
}

#[tokio::test]
async fn a_stranger_behind_a_recorded_pid_is_never_signalled() {
    let ws = workspace();
    let port = free_port();
    let stranger = orphan(port, "other");
    let pid = stranger.pid();
    // Same pid and executable but a different start time: the pid was reused.
    write_record(
        ws.path(),
        pid,
        start_time(pid) + 1,
        &exe_of(pid),
        "other",
        dead_owner(),
        port,
    );
    let (supervisor, events) = supervisor(ws.path());
    let server = supervisor
        .start(fake_llama(port, &[]), CancelToken::new())
        .await
        .unwrap();
    assert!(events_of(&events, "process.orphan.stopped").is_empty());
    assert!(alive(pid));
    assert!(!server.is_owned(), "it answers, so it is adopted");
    assert!(
        !ws.path().join(".arcane/engines/llama.cpp.json").exists(),
        "a stale record is removed"
    );
    server.close().await;

    // Right start time, wrong nonce: still not ours.
    write_record(
        ws.path(),
        pid,
        start_time(pid),
        &exe_of(pid),
        "not-the-nonce",
        dead_owner(),
        port,
    );
    let (supervisor, events) = crate::support::supervisor(ws.path());
    let server = supervisor
        .start(fake_llama(port, &[]), CancelToken::new())
        .await
        .unwrap();
    assert!(events_of(&events, "process.orphan.stopped").is_empty());
    assert!(alive(pid));
    server.close().await;
}

#[tokio::test]
async fn a_server_whose_owner_still_runs_is_left_alone() {
    let ws = workspace();
    let port = free_port();
    let sibling = orphan(port, "live");
    let pid = sibling.pid();
    // The owner is a live process (this test's own child `sleep`).
    let owner = Proc(Command::new("sleep").arg("30").spawn().unwrap());
    write_record(
        ws.path(),
        pid,
        start_time(pid),
        &exe_of(pid),
        "live",
        (owner.pid(), start_time(owner.pid())),
        port,
    );
    let (supervisor, events) = supervisor(ws.path());
    let server = supervisor
        .start(fake_llama(port, &[]), CancelToken::new())
        .await
        .unwrap();
    assert!(events_of(&events, "process.orphan.stopped").is_empty());
    assert!(alive(pid));
    assert!(!server.is_owned());
    server.close().await;
}
