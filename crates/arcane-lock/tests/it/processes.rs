//! Real processes against the library: this test binary re-executes itself as the
//! contending processes (the `child_entry` test is a no-op unless the parent set
//! `ARCANE_LOCK_IT_CHILD`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use arcane_lock::{with_workspace_lock, Error, WorkspaceLock};
use arcane_report::NullSink;

use crate::support::*;

const CHILD_VAR: &str = "ARCANE_LOCK_IT_CHILD";

fn spawn_child(role: &str, ws: &Path, extra: &str) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "processes::child_entry",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_VAR, format!("{role}|{}|{extra}", ws.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Kills and reaps a child on drop, also when the test panics.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs a child role when re-executed by a parent test; otherwise does nothing.
#[test]
#[allow(clippy::disallowed_methods, clippy::print_stdout)] // the role comes from the parent; the parent reads stdout
fn child_entry() {
    let Ok(spec) = std::env::var(CHILD_VAR) else {
        return;
    };
    let mut parts = spec.splitn(3, '|');
    let (role, ws, extra) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let ws = Path::new(ws);
    match role {
        "loop" => {
            let marker = ws.join("in-section");
            let rounds: usize = extra.parse().unwrap();
            let opts = options("stress").wait(Duration::from_secs(600));
            for _ in 0..rounds {
                with_workspace_lock(ws, &opts, &NullSink, |_| {
                    // O_EXCL: fails if another holder is inside.
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&marker)
                        .expect("overlap");
                    std::fs::remove_file(&marker).unwrap();
                    Ok::<_, Error>(())
                })
                .unwrap();
            }
            println!("\nCHILD-DONE");
        }
        "hold" => {
            let _lock = WorkspaceLock::acquire(ws, &options(extra), &NullSink).unwrap();
            println!("\nCHILD-LOCKED");
            // Not synchronisation: the holder's job is to stay alive holding the lock
            // until the test kills it.
            std::thread::sleep(Duration::from_secs(600));
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn four_processes_never_overlap() {
    let ws = workspace();
    let mut children: Vec<_> = (0..4)
        .map(|_| KillOnDrop(spawn_child("loop", ws.path(), "100")))
        .collect();
    for child in &mut children {
        let mut stdout = String::new();
        std::io::Read::read_to_string(child.0.stdout.as_mut().unwrap(), &mut stdout).unwrap();
        let status = child.0.wait().unwrap();
        assert!(status.success(), "a child failed (overlap or error)");
        assert!(stdout.contains("CHILD-DONE"), "the child did not run");
    }
    assert!(!ws.path().join("in-section").exists());
}

#[test]
fn a_holder_killed_with_sigkill_is_recovered_at_once() {
    let ws = workspace();
    let mut guard = KillOnDrop(spawn_child("hold", ws.path(), "serve"));
    let child = &mut guard.0;
    // Skip the test harness's own lines until the child says it holds the lock.
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("CHILD-LOCKED") {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "the child exited early"
        );
    }
    let pid = child.id();
    // Busy while it lives.
    assert!(
        WorkspaceLock::acquire(ws.path(), &options("probe"), &NullSink).is_err_and(|e| e.is_busy())
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let sink = events();
    let lock = WorkspaceLock::acquire(ws.path(), &options("build"), &sink).unwrap();
    let recovered = sink
        .events()
        .into_iter()
        .find(|e| e.kind == "workspace.operation.stale-recovered")
        .expect("stale-recovered");
    assert_eq!(recovered.data["previousOwner"]["pid"], pid);
    assert_eq!(recovered.data["previousOperation"], "serve");
    lock.release().unwrap();
}
