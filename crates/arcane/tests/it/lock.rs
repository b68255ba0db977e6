//! Tests of `arcane lock` with real processes: exclusion across many processes,
//! `kill -9` recovery, crash states, racing recoverers, PID reuse, JavaScript-SDK
//! records and every adversarial path of the lock's safety rules.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::support::{json, run, stderr, stdout, wait_for_exit, wait_until, TestWorkspace};

const RECORD: &str = ".arcane/workspace-operation.lock.json";
const SENTINEL: &str = ".arcane/workspace-operation.lock";

/// Processes a test started, killed (SIGKILL) and reaped on drop, even on panic.
#[derive(Default)]
struct Reaper {
    children: Vec<Child>,
    pids: Vec<u32>,
}

impl Reaper {
    fn adopt(&mut self, child: Child) -> u32 {
        let pid = child.id();
        self.children.push(child);
        pid
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for pid in &self.pids {
            // Grandchildren we know by pid (the `sleep` under a killed `arcane`).
            let _ = Command::new("kill")
                .arg("-9")
                .arg(pid.to_string())
                .stderr(Stdio::null())
                .status();
        }
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn record(ws: &TestWorkspace) -> PathBuf {
    ws.path().join(RECORD)
}

/// Starts `arcane lock run --operation OP -- sh -c 'echo $$ > PIDFILE; exec sleep 600'`
/// and waits until it holds the lock. Returns (arcane pid, sleep pid).
fn start_holder(ws: &TestWorkspace, operation: &str, reaper: &mut Reaper) -> (u32, u32) {
    let pidfile = ws.path().join(format!("holder-{operation}.pid"));
    let child = ws
        .arcane()
        .args([
            "lock",
            "run",
            "--operation",
            operation,
            "--",
            "sh",
            "-c",
            "echo $$ > \"$1\"; exec sleep 600",
            "sh",
        ])
        .arg(&pidfile)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn holder");
    let arcane_pid = reaper.adopt(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(text) = std::fs::read_to_string(&pidfile) {
            if let Ok(pid) = text.trim().parse::<u32>() {
                reaper.pids.push(pid);
                assert!(
                    record(ws).is_file(),
                    "the record exists while the command runs"
                );
                return (arcane_pid, pid);
            }
        }
        assert!(Instant::now() < deadline, "holder did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .to_string()
}

fn start_time(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &text[text.rfind(')').unwrap() + 1..];
    after
        .split_ascii_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap()
}

fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

fn canonical(ws: &TestWorkspace) -> String {
    std::fs::canonicalize(ws.path())
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

fn arcane_record(ws: &TestWorkspace, pid: u32, start: u64, operation: &str) -> Vec<u8> {
    serde_json::to_vec_pretty(&serde_json::json!({
        "schemaVersion": 1, "kind": "arcane-workspace-operation-lock", "operation": operation,
        "owner": {"pid": pid, "hostname": hostname(), "bootId": boot_id(), "startTime": start, "command": "arcane serve"},
        "scope": canonical(ws), "nonce": "00000000-0000-4000-8000-000000000001",
        "acquiredAt": "2026-11-29T10:02:11.000Z", "expiresAt": "2026-11-29T16:02:11.000Z",
        "ttlMilliseconds": 21600000, "advisoryLock": {"kind": "flock", "sentinel": "workspace-operation.lock"}
    }))
    .unwrap()
}

/// An SDK record for `pid`, written now (as `date -u` tells it).
fn sdk_record(ws: &TestWorkspace, pid: u32) -> Vec<u8> {
    let now = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%S.000Z"])
        .output()
        .unwrap();
    let now = String::from_utf8(now.stdout).unwrap();
    serde_json::to_vec_pretty(&serde_json::json!({
        "schemaVersion": 1, "kind": "arcane-workspace-operation-lock", "operation": "package",
        "owner": {"pid": pid}, "scope": canonical(ws), "nonce": "5b0c6a52-8d8e-4c1e-9a51-0a7d1c2e3f40",
        "acquiredAt": now.trim(), "expiresAt": "2999-11-29T16:00:00.000Z",
        "ttlMilliseconds": 21600000,
        "releaseProcedure": "The owning Arcane process removes this cooperative lock after the operation settles.",
        "staleRecovery": "After expiresAt, confirm the recorded owner process is absent."
    }))
    .unwrap()
}

fn plant(ws: &TestWorkspace, bytes: &[u8]) {
    std::fs::create_dir_all(ws.path().join(".arcane")).unwrap();
    std::fs::write(record(ws), bytes).unwrap();
}

/// The NDJSON events of an `--output ndjson` run, by type.
fn events_of(output: &std::process::Output, kind: &str) -> Vec<serde_json::Value> {
    stdout(output)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["type"] == kind)
        .collect()
}

#[test]
fn run_holds_the_lock_while_the_command_runs_and_exits_with_its_code() {
    let ws = TestWorkspace::new();
    let out = run(ws
        .arcane()
        .args([
            "lock",
            "run",
            "--operation",
            "demo",
            "--",
            "sh",
            "-c",
            "test -f \"$1\" && exit 7",
            "sh",
        ])
        .arg(record(&ws)));
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert!(!record(&ws).exists(), "released after the command");
    assert!(ws.path().join(SENTINEL).is_file(), "the sentinel stays");
    let out = run(ws
        .arcane()
        .args(["lock", "run", "--operation", "demo", "--", "true"]));
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn run_creates_a_missing_workspace_but_status_does_not() {
    let parent = TestWorkspace::new();
    let fresh = parent.path().join("a/b");
    let out = run(Command::new(crate::support::arcane_bin())
        .arg("--workspace")
        .arg(&fresh)
        .args(["lock", "status"]));
    assert_eq!(
        out.status.code(),
        Some(2),
        "status refuses a missing workspace"
    );
    insta::assert_snapshot!(
        "lock_status_missing_workspace",
        parent.redact(&stderr(&out))
    );
    assert!(!fresh.exists());
    let out = run(Command::new(crate::support::arcane_bin())
        .arg("--workspace")
        .arg(&fresh)
        .args(["lock", "run", "--operation", "demo", "--", "true"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(fresh.join(SENTINEL).is_file());
}

#[test]
fn run_rejects_bad_operation_names_as_usage_errors() {
    let ws = TestWorkspace::new();
    let out = run(ws
        .arcane()
        .args(["lock", "run", "--operation", "Build", "--", "true"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    insta::assert_snapshot!("lock_run_bad_operation_name", ws.redact(&stderr(&out)));
    // An underscore is refused too: the SDK could not recover a record naming it.
    let out = run(ws
        .arcane()
        .args(["lock", "run", "--operation", "my_build", "--", "true"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(!ws.path().join(".arcane").exists());
    let out = run(ws.arcane().args([
        "lock",
        "run",
        "--operation",
        "x",
        "--wait",
        "soon",
        "--",
        "true",
    ]));
    assert_eq!(out.status.code(), Some(2));
    insta::assert_snapshot!("lock_run_bad_wait", ws.redact(&stderr(&out)));
}

#[test]
fn a_busy_workspace_exits_75_and_names_the_holder() {
    let ws = TestWorkspace::new();
    let mut reaper = Reaper::default();
    let (holder, _) = start_holder(&ws, "serve", &mut reaper);
    let before = std::fs::read(record(&ws)).unwrap();

    let out = run(ws
        .arcane()
        .args(["lock", "run", "--operation", "build", "--", "true"]));
    assert_eq!(out.status.code(), Some(75));
    // The holder's own pid, host and start time have their placeholders: the message
    // names the holder, not just some pid.
    let redactions = ws
        .redactions()
        .text(format!("pid {holder}"), "pid [HOLDER]")
        .text(format!("host `{}`", hostname()), "host `[THIS_HOST]`")
        .text(
            format!("\"hostname\": \"{}\"", hostname()),
            "\"hostname\": \"[THIS_HOST]\"",
        )
        .text(format!("\"pid\": {holder}"), "\"pid\": [HOLDER]")
        .text(boot_id(), "[THIS_BOOT]")
        .text(
            format!("\"startTime\": {}", start_time(holder)),
            "\"startTime\": [HOLDER_START]",
        );
    insta::assert_snapshot!("lock_run_busy", redactions.apply(&stderr(&out)));

    let out = run(ws.arcane().args([
        "--output",
        "json",
        "lock",
        "run",
        "--operation",
        "build",
        "--",
        "true",
    ]));
    assert_eq!(out.status.code(), Some(75));
    insta::assert_snapshot!("lock_run_busy_json", redactions.json(&json(&out)));
    assert_eq!(
        std::fs::read(record(&ws)).unwrap(),
        before,
        "the holder's record is untouched"
    );

    let out = run(ws.arcane().args(["--output", "json", "lock", "status"]));
    let v = json(&out);
    assert_eq!(v["state"], "held");
    assert_eq!(v["holder"]["pid"], holder);
    assert_eq!(v["holder"]["alive"], true);
    let out = run(ws.arcane().args(["lock", "recover"]));
    assert_eq!(
        out.status.code(),
        Some(75),
        "a live holder is never removed"
    );
    assert!(record(&ws).exists());
}

#[test]
fn a_wait_reports_the_holder_and_ends_busy_at_the_deadline_or_locked_when_it_leaves() {
    let ws = TestWorkspace::new();
    let mut reaper = Reaper::default();
    let (holder, _) = start_holder(&ws, "serve", &mut reaper);
    let out = run(ws.arcane().args([
        "lock",
        "run",
        "--operation",
        "build",
        "--wait",
        "300ms",
        "--",
        "true",
    ]));
    assert_eq!(out.status.code(), Some(75));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "waiting for the workspace lock held by pid {holder}"
        )),
        "{err}"
    );
    assert!(err.contains("waiting up to 300 ms"), "{err}");
    assert!(err.contains("gave up after waiting"), "{err}");

    let mut waiter = ws
        .arcane()
        .args([
            "--output",
            "ndjson",
            "lock",
            "run",
            "--operation",
            "build",
            "--wait",
            "120s",
            "--",
            "true",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The holder leaves once the waiter has said it waits (its ndjson event; the read
    // is bounded by the waiter's own 120 s deadline).
    let mut lines = BufReader::new(waiter.stdout.take().unwrap()).lines();
    let mut events = Vec::new();
    while !events
        .iter()
        .any(|e: &serde_json::Value| e["type"] == "workspace.operation.waiting")
    {
        let line = lines
            .next()
            .expect("the waiter ended before it reported waiting")
            .unwrap();
        events.extend(serde_json::from_str::<serde_json::Value>(&line).ok());
    }
    // The holder finishes normally: SIGTERM to `arcane lock run` stops its command.
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(holder.to_string())
        .status();
    events.extend(
        lines
            .map_while(Result::ok)
            .filter_map(|l| serde_json::from_str(&l).ok()),
    );
    let out = waiter.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let count = |kind: &str| events.iter().filter(|e| e["type"] == kind).count();
    assert_eq!(count("workspace.operation.waiting"), 1);
    assert_eq!(count("workspace.operation.locked"), 1);
    assert_eq!(
        count("workspace.operation.stale-recovered"),
        0,
        "a clean release leaves nothing stale"
    );
}

#[test]
fn ctrl_c_stops_a_wait_promptly_and_touches_nothing() {
    let ws = TestWorkspace::new();
    let mut reaper = Reaper::default();
    start_holder(&ws, "serve", &mut reaper);
    let before = std::fs::read(record(&ws)).unwrap();
    let mut waiter = ws
        .arcane()
        .args([
            "lock",
            "run",
            "--operation",
            "build",
            "--wait",
            "10m",
            "--",
            "true",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it reports waiting, then interrupt it.
    let mut line = String::new();
    BufReader::new(waiter.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("waiting for the workspace lock"), "{line}");
    let _ = Command::new("kill")
        .arg("-INT")
        .arg(waiter.id().to_string())
        .status();
    let status = waiter.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert_eq!(std::fs::read(record(&ws)).unwrap(), before);
}

#[test]
fn a_holder_killed_with_sigkill_is_recovered_at_once_by_the_next_acquirer() {
    let ws = TestWorkspace::new();
    let mut reaper = Reaper::default();
    let (holder, _sleep) = start_holder(&ws, "serve", &mut reaper);
    kill9(holder);
    for child in &mut reaper.children {
        let _ = child.wait();
    }
    assert!(record(&ws).exists(), "kill -9 leaves the record behind");
    let out = run(ws.arcane().args(["--output", "json", "lock", "status"]));
    assert_eq!(json(&out)["state"], "stale");

    let out = run(ws.arcane().args([
        "--output",
        "ndjson",
        "lock",
        "run",
        "--operation",
        "build",
        "--",
        "true",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let recovered = events_of(&out, "workspace.operation.stale-recovered");
    assert_eq!(recovered.len(), 1);
    assert_eq!(recovered[0]["data"]["previousOwner"]["pid"], holder);
    assert_eq!(recovered[0]["data"]["previousOperation"], "serve");
    // The human line names the previous owner too.
    let ws2 = TestWorkspace::new();
    plant(&ws2, &arcane_record(&ws2, dead_pid(), 1, "serve"));
    let out = run(ws2
        .arcane()
        .args(["lock", "run", "--operation", "build", "--", "true"]));
    assert!(
        stderr(&out).contains("recovered a stale workspace lock left by pid"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_crash_between_create_and_write_does_not_block_the_next_acquirer() {
    // Arcane creates and writes its record under a temporary name while holding the
    // sentinel's lock; a crash there leaves exactly this on disk.
    let ws = TestWorkspace::new();
    std::fs::create_dir(ws.path().join(".arcane")).unwrap();
    std::fs::write(ws.path().join(SENTINEL), b"").unwrap();
    std::fs::write(
        ws.path().join(".arcane/.workspace-operation.lock.json.tmp"),
        b"{\n  \"sche",
    )
    .unwrap();
    let out = run(ws
        .arcane()
        .args(["lock", "run", "--operation", "build", "--", "true"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!record(&ws).exists());
}

#[test]
fn an_empty_record_from_an_sdk_crash_is_busy_until_quarantined_on_request() {
    // The JavaScript SDK creates its record with O_EXCL and then writes it: a crash in
    // between leaves an empty record, which may equally be an SDK process about to write.
    let ws = TestWorkspace::new();
    plant(&ws, b"");
    let out = run(ws
        .arcane()
        .args(["lock", "run", "--operation", "build", "--", "true"]));
    assert_eq!(out.status.code(), Some(75));
    assert!(stderr(&out).contains("empty"), "{}", stderr(&out));
    assert_eq!(std::fs::read(record(&ws)).unwrap(), b"");
    let out = run(ws.arcane().args(["lock", "recover"]));
    assert_eq!(
        out.status.code(),
        Some(75),
        "recover refuses without the flag"
    );
    let out = run(ws.arcane().args([
        "--output",
        "json",
        "lock",
        "recover",
        "--quarantine-unreadable",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let kept = PathBuf::from(json(&out)["path"].as_str().unwrap().to_string());
    assert_eq!(std::fs::read(kept).unwrap(), b"");
    let out = run(ws
        .arcane()
        .args(["lock", "run", "--operation", "build", "--", "true"]));
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn two_simultaneous_recoverers_cannot_both_win() {
    for _ in 0..8 {
        let ws = TestWorkspace::new();
        plant(&ws, &arcane_record(&ws, dead_pid(), 1, "serve"));
        let children: Vec<_> = (0..2)
            .map(|_| {
                ws.arcane()
                    .args(["--output", "json", "lock", "recover"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let outputs: Vec<_> = children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        let removed = outputs
            .iter()
            .filter(|o| o.status.success() && json(o)["recovered"] == "removed")
            .count();
        assert_eq!(removed, 1);
        for o in &outputs {
            assert!(matches!(o.status.code(), Some(0 | 75)), "{}", stderr(o));
        }
        assert!(!record(&ws).exists());
    }
}

#[test]
fn two_simultaneous_acquirers_of_a_stale_lock_recover_it_once() {
    for _ in 0..5 {
        let ws = TestWorkspace::new();
        plant(&ws, &arcane_record(&ws, dead_pid(), 1, "serve"));
        let children: Vec<_> = (0..2)
            .map(|_| {
                ws.arcane()
                    .args([
                        "--output",
                        "ndjson",
                        "lock",
                        "run",
                        "--operation",
                        "build",
                        "--wait",
                        "60s",
                        "--",
                        "true",
                    ])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let outputs: Vec<_> = children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        let recovered: usize = outputs
            .iter()
            .map(|o| events_of(o, "workspace.operation.stale-recovered").len())
            .sum();
        assert_eq!(recovered, 1);
        assert!(outputs.iter().all(|o| o.status.success()));
    }
}

#[test]
fn a_reused_pid_with_another_start_time_is_recovered() {
    let ws = TestWorkspace::new();
    let mut reaper = Reaper::default();
    let unrelated = reaper.adopt(Command::new("sleep").arg("600").spawn().unwrap());
    plant(
        &ws,
        &arcane_record(&ws, unrelated, start_time(unrelated) + 100, "serve"),
    );
    let out = run(ws.arcane().args([
        "--output",
        "ndjson",
        "lock",
        "run",
        "--operation",
        "build",
        "--",
        "true",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let recovered = events_of(&out, "workspace.operation.stale-recovered");
    assert_eq!(recovered[0]["data"]["reason"], "pid-reused");
    assert_eq!(recovered[0]["data"]["previousOwner"]["pid"], unrelated);
}

#[test]
fn javascript_sdk_records_follow_the_sdk_rule() {
    // Live pid: busy, untouched.
    let ws = TestWorkspace::new();
    let mut reaper = Reaper::default();
    let owner = reaper.adopt(Command::new("sleep").arg("600").spawn().unwrap());
    let bytes = sdk_record(&ws, owner);
    plant(&ws, &bytes);
    let out = run(ws
        .arcane()
        .args(["lock", "run", "--operation", "build", "--", "true"]));
    assert_eq!(out.status.code(), Some(75));
    assert!(
        stderr(&out).contains(&format!("pid {owner}")),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read(record(&ws)).unwrap(), bytes);
    // Dead pid: recovered at once (no 6-hour wait, expiry ignored).
    let ws = TestWorkspace::new();
    let dead = dead_pid();
    plant(&ws, &sdk_record(&ws, dead));
    let out = run(ws.arcane().args([
        "--output",
        "ndjson",
        "lock",
        "run",
        "--operation",
        "build",
        "--",
        "true",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        events_of(&out, "workspace.operation.stale-recovered")[0]["data"]["previousOwner"]["pid"],
        dead
    );
}

fn policy_denied(ws_path: &Path) -> serde_json::Value {
    let out = run(Command::new(crate::support::arcane_bin())
        .args(["--output", "json", "--workspace"])
        .arg(ws_path)
        .args(["lock", "run", "--operation", "build", "--", "true"]));
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let v = json(&out);
    assert_eq!(v["error"]["code"], "ARCANE_POLICY_DENIED", "{v}");
    v
}

#[test]
fn adversarial_paths_are_denied_and_left_untouched() {
    // The workspace itself is a symlink: its target gets no `.arcane`.
    let target = TestWorkspace::new();
    let links = TestWorkspace::new();
    let link = links.path().join("ws");
    symlink(target.path(), &link).unwrap();
    policy_denied(&link);
    assert!(!target.path().join(".arcane").exists());

    // `.arcane` is a symlink to an outside directory.
    let ws = TestWorkspace::new();
    let outside = TestWorkspace::new();
    symlink(outside.path(), ws.path().join(".arcane")).unwrap();
    policy_denied(ws.path());
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);

    // `.arcane` is a regular file.
    let ws = TestWorkspace::new();
    std::fs::write(ws.path().join(".arcane"), b"file").unwrap();
    policy_denied(ws.path());
    assert_eq!(std::fs::read(ws.path().join(".arcane")).unwrap(), b"file");

    // The lock paths are symlinks (dangling and not), directories or FIFOs.
    for name in [RECORD, SENTINEL] {
        for dangling in [true, false] {
            let ws = TestWorkspace::new();
            let outside = TestWorkspace::new();
            std::fs::create_dir(ws.path().join(".arcane")).unwrap();
            let target = outside.path().join("t");
            if !dangling {
                std::fs::write(&target, b"precious").unwrap();
            }
            symlink(&target, ws.path().join(name)).unwrap();
            let v = policy_denied(ws.path());
            assert_eq!(v["error"]["details"]["reason"], "symbolic-link");
            if dangling {
                assert!(!target.exists(), "{name}: the dangling target was created");
            } else {
                assert_eq!(std::fs::read(&target).unwrap(), b"precious");
            }
        }
        let ws = TestWorkspace::new();
        std::fs::create_dir_all(ws.path().join(name).join("inner")).unwrap();
        policy_denied(ws.path());
        assert!(ws.path().join(name).join("inner").is_dir());

        let ws = TestWorkspace::new();
        std::fs::create_dir(ws.path().join(".arcane")).unwrap();
        assert!(Command::new("mkfifo")
            .arg(ws.path().join(name))
            .status()
            .unwrap()
            .success());
        policy_denied(ws.path());
    }
}

#[test]
fn unreadable_and_foreign_records_are_busy_and_byte_identical() {
    let other = TestWorkspace::new();
    let mut oversized = b"{\"schemaVersion\": 1".to_vec();
    oversized.extend(std::iter::repeat_n(b' ', 65 * 1024));
    oversized.extend_from_slice(b"}\n");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"not json at all \x00\x01".to_vec()),
        ("empty", Vec::new()),
        ("oversized", oversized),
        ("other-scope", sdk_record(&other, dead_pid())),
    ];
    for (name, bytes) in cases {
        let ws = TestWorkspace::new();
        plant(&ws, &bytes);
        let out = run(ws.arcane().args([
            "--output",
            "json",
            "lock",
            "run",
            "--operation",
            "build",
            "--",
            "true",
        ]));
        assert_eq!(out.status.code(), Some(75), "{name}");
        assert_eq!(json(&out)["error"]["code"], "ARCANE_WORKSPACE_BUSY");
        assert_eq!(
            std::fs::read(record(&ws)).unwrap(),
            bytes,
            "{name}: bytes changed"
        );
        let out = run(ws.arcane().args(["lock", "recover"]));
        assert_eq!(out.status.code(), Some(75), "{name}");
        assert_eq!(
            std::fs::read(record(&ws)).unwrap(),
            bytes,
            "{name}: recover changed bytes"
        );
    }
}

#[test]
fn status_and_recover_describe_a_stale_lock_and_remove_it() {
    let ws = TestWorkspace::new();
    let out = run(ws.arcane().args(["--output", "json", "lock", "status"]));
    assert_eq!(json(&out)["state"], "free");
    let dead = dead_pid();
    plant(&ws, &arcane_record(&ws, dead, 1, "serve"));
    let out = run(ws.arcane().args(["lock", "status"]));
    let text = stdout(&out);
    assert!(text.starts_with("stale:"), "{text}");
    assert!(text.contains(&format!("pid {dead}")), "{text}");
    let out = run(ws.arcane().args(["--output", "json", "lock", "status"]));
    let v = json(&out);
    assert_eq!(v["state"], "stale");
    assert_eq!(v["holder"]["pid"], dead);
    assert_eq!(v["holder"]["operation"], "serve");
    let out = run(ws.arcane().args(["lock", "recover"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("removed the stale lock"),
        "{}",
        stdout(&out)
    );
    assert!(!record(&ws).exists());
}

/// The stress test: 8 processes × 200 acquisitions each through `arcane lock
/// run`. Each critical section creates an in-section marker with O_EXCL (`set -C`),
/// appends to a log and removes the marker; an overlap makes the create fail (exit 99).
#[test]
fn eight_processes_times_200_acquisitions_never_overlap() {
    const PROCESSES: usize = 8;
    const ROUNDS: usize = 200;
    let ws = TestWorkspace::new();
    let marker = ws.path().join("in-section");
    let log = ws.path().join("entries.log");
    let section = "set -C; : > \"$1\" || exit 99; echo x >> \"$2\"; rm \"$1\"";
    let workers: Vec<_> = (0..PROCESSES)
        .map(|_| {
            let workspace = ws.path().to_path_buf();
            let (marker, log) = (marker.clone(), log.clone());
            std::thread::spawn(move || {
                for round in 0..ROUNDS {
                    let out = Command::new(crate::support::arcane_bin())
                        .arg("--workspace")
                        .arg(&workspace)
                        .env("NO_COLOR", "1")
                        .args([
                            "lock",
                            "run",
                            "--operation",
                            "stress",
                            "--wait",
                            "10m",
                            "--",
                            "sh",
                            "-c",
                            section,
                            "sh",
                        ])
                        .arg(&marker)
                        .arg(&log)
                        .output()
                        .expect("spawn arcane");
                    assert_eq!(
                        out.status.code(),
                        Some(0),
                        "round {round}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            })
        })
        .collect();
    for worker in workers {
        worker
            .join()
            .expect("a critical section overlapped or failed");
    }
    let entries = std::fs::read_to_string(&log).unwrap().lines().count();
    assert_eq!(entries, PROCESSES * ROUNDS);
    assert!(!marker.exists());
    assert!(!record(&ws).exists());
}

#[test]
fn a_holder_whose_record_is_deleted_stops_its_command_and_reports_compromised() {
    let ws = TestWorkspace::new();
    let child = ws
        .arcane()
        .args([
            "--output",
            "json",
            "lock",
            "run",
            "--operation",
            "serve",
            "--",
            "sleep",
            "600",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !record(&ws).exists() {
        assert!(Instant::now() < deadline, "holder did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    // A third party deletes the record behind the holder's back.
    std::fs::remove_file(record(&ws)).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(json(&out)["error"]["code"], "ARCANE_LOCK_COMPROMISED");
}

#[test]
fn a_dot_arcane_the_user_cannot_enter_is_a_typed_permission_refusal() {
    use std::os::unix::fs::PermissionsExt;
    let ws = TestWorkspace::new();
    std::fs::set_permissions(ws.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dot = ws.path().join(".arcane");
    std::fs::create_dir(&dot).unwrap();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut command = if root {
        // Root may enter anything: run as `nobody` against root's 0700 `.arcane`.
        std::fs::set_permissions(&dot, std::fs::Permissions::from_mode(0o700)).unwrap();
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(crate::support::arcane_bin());
        c
    } else {
        std::fs::set_permissions(&dot, std::fs::Permissions::from_mode(0o000)).unwrap();
        Command::new(crate::support::arcane_bin())
    };
    let out = run(command
        .args(["--output", "json", "--workspace"])
        .arg(ws.path())
        .args(["lock", "run", "--operation", "build", "--", "true"]));
    std::fs::set_permissions(&dot, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["error"]["code"], "ARCANE_POLICY_DENIED");
    assert_eq!(v["error"]["details"]["reason"], "permission-denied");
}

/// Reads a pid a test command wrote to `path`, waiting (bounded) for it to appear.
fn read_pid(path: &Path) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts `arcane lock run --operation OP -- sh -c SCRIPT sh ARGS…` with stderr
/// silenced, under `reaper`; returns the `arcane` pid.
fn start_script_holder(
    ws: &TestWorkspace,
    reaper: &mut Reaper,
    operation: &str,
    script: &str,
    args: &[&Path],
) -> u32 {
    let holder = ws
        .arcane()
        .args([
            "lock",
            "run",
            "--operation",
            operation,
            "--",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .args(args)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    reaper.adopt(holder)
}

/// `kill -KILL PID`.
fn kill9(pid: u32) {
    let _ = Command::new("kill")
        .arg("-KILL")
        .arg(pid.to_string())
        .status();
}

/// Waits (bounded) until `pid` no longer runs (gone or a zombie).
fn wait_gone(pid: u32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while arcane_process::start_time(pid).is_some() {
        assert!(
            Instant::now() < deadline,
            "{what} (pid {pid}) is still running"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_command_dies_with_a_holder_killed_with_sigkill_so_writers_never_interleave() {
    // Issue: after `kill -9` of `arcane lock run`, its command went on writing while
    // the next holder's command wrote too (`first-3 second-1 first-4 …`).
    let ws = TestWorkspace::new();
    let mut reaper = Reaper::default();
    let log = ws.path().join("log");
    let pidfile = ws.path().join("first.pid");
    let script =
        "echo $$ > \"$1\"; i=0; while :; do i=$((i+1)); echo first-$i >> \"$2\"; sleep 0.05; done";
    let arcane_pid = start_script_holder(&ws, &mut reaper, "first", script, &[&pidfile, &log]);
    let command = read_pid(&pidfile);
    reaper.pids.push(command);
    kill9(arcane_pid);
    wait_gone(command, "the command of the killed holder");
    let out = run(ws
        .arcane()
        .args([
            "lock",
            "run",
            "--operation",
            "second",
            "--wait",
            "30s",
            "--",
            "sh",
            "-c",
            "for i in 1 2 3; do echo second-$i >> \"$1\"; sleep 0.05; done",
            "sh",
        ])
        .arg(&log));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = std::fs::read_to_string(&log).unwrap();
    let first_second = text.lines().position(|l| l.starts_with("second-")).unwrap();
    assert!(
        text.lines()
            .skip(first_second)
            .all(|l| l.starts_with("second-")),
        "writes interleaved:\n{text}"
    );
}

#[test]
fn what_a_killed_holders_command_leaves_behind_keeps_the_lock_until_it_ends() {
    let ws = TestWorkspace::new();
    let mut reaper = Reaper::default();
    let pidfile = ws.path().join("left.pid");
    // The background `sleep` outlives the shell (the leader the parent-death signal
    // kills) and still holds the inherited locked descriptor.
    let arcane_pid = start_script_holder(
        &ws,
        &mut reaper,
        "first",
        "sleep 600 & echo $! > \"$1\"; wait",
        &[&pidfile],
    );
    let left = read_pid(&pidfile);
    reaper.pids.push(left);
    kill9(arcane_pid);
    for child in &mut reaper.children {
        let _ = child.wait();
    }
    let out = run(ws.arcane().args([
        "--output",
        "json",
        "lock",
        "run",
        "--operation",
        "second",
        "--",
        "true",
    ]));
    assert_eq!(out.status.code(), Some(75), "{}", stdout(&out));
    assert_eq!(json(&out)["error"]["code"], "ARCANE_WORKSPACE_BUSY");
    kill9(left);
    wait_gone(left, "the left-behind sleep");
    let out = run(ws.arcane().args([
        "lock",
        "run",
        "--operation",
        "third",
        "--wait",
        "30s",
        "--",
        "true",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn two_sigints_to_a_holder_whose_command_traps_them_end_the_command_before_the_next_holder_runs() {
    let ws = TestWorkspace::new();
    let mut reaper = Reaper::default();
    let pidfile = ws.path().join("trap.pid");
    let termed = ws.path().join("termed");
    // The command ignores SIGINT and survives SIGTERM, noting each one it gets.
    let arcane_pid = start_script_holder(
        &ws,
        &mut reaper,
        "first",
        "trap '' INT; trap 'echo term >> \"$2\"' TERM; echo $$ > \"$1\"; while :; do sleep 0.05; done",
        &[&pidfile, &termed],
    );
    let command = read_pid(&pidfile);
    reaper.pids.push(command);
    let sigint = || {
        let _ = Command::new("kill")
            .arg("-INT")
            .arg(arcane_pid.to_string())
            .status();
    };
    // The second SIGINT is sent only once the first was handled (forwarded to the
    // command as SIGTERM); two sent at once could merge into one pending signal.
    sigint();
    crate::support::wait_until(
        Duration::from_secs(30),
        "the first SIGINT forwarded",
        || termed.exists(),
    );
    sigint();
    let status = crate::support::wait_for_exit(
        &mut reaper.children[0],
        Duration::from_secs(30),
        "the holder",
    );
    assert_eq!(status.code(), Some(130));
    // The next holder's command checks that the first command is gone.
    let check =
        format!("test ! -e /proc/{command}/cmdline || grep -q '^State:.Z' /proc/{command}/status");
    let out = run(ws.arcane().args([
        "lock",
        "run",
        "--operation",
        "second",
        "--wait",
        "30s",
        "--",
        "sh",
        "-c",
        &check,
    ]));
    assert_eq!(
        out.status.code(),
        Some(0),
        "the first command still ran: {}",
        stderr(&out)
    );
}

#[test]
fn nested_operations_under_lock_run_inherit_the_lease_and_run_at_once() {
    // Issue: `arcane lock run -- arcane model add …` waited 10 minutes for its own
    // parent and gave up with 75.
    let ws = TestWorkspace::new();
    let model = crate::support::smollm2();
    let arcane = crate::support::arcane_bin();
    let out = run(ws
        .arcane()
        .args(["lock", "run", "--operation", "outer", "--"])
        .arg(&arcane)
        .arg("--workspace")
        .arg(ws.path())
        .args(["--output", "json", "model", "add", "smol", "--file"])
        .arg(&model));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let listed = run(ws.arcane().args(["--output", "json", "model", "list"]));
    assert!(stdout(&listed).contains("\"smol\""), "{}", stdout(&listed));
    // Deeper nesting works too, and the lock is free afterwards.
    let out = run(ws
        .arcane()
        .args(["lock", "run", "--operation", "outer", "--"])
        .arg(&arcane)
        .arg("--workspace")
        .arg(ws.path())
        .args([
            "--output",
            "ndjson",
            "lock",
            "run",
            "--operation",
            "inner",
            "--",
            "true",
        ]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let inner = events_of(&out, "workspace.operation.locked");
    assert_eq!(inner.len(), 1, "{}", stdout(&out));
    assert_eq!(inner[0]["data"]["inherited"], true);
    assert_eq!(inner[0]["data"]["operation"], "inner");
    let status = run(ws.arcane().args(["--output", "json", "lock", "status"]));
    assert_eq!(json(&status)["state"], "free");
}

#[test]
fn a_lease_claimed_without_its_descriptor_is_refused() {
    let ws = TestWorkspace::new();
    let mut reaper = Reaper::default();
    let claimfile = ws.path().join("claim");
    // A holder whose command publishes the variable and keeps running.
    let holder = ws
        .arcane()
        .args([
            "lock",
            "run",
            "--operation",
            "first",
            "--",
            "sh",
            "-c",
            "echo \"$ARCANE_WORKSPACE_LEASE\" > \"$1.tmp\"; mv \"$1.tmp\" \"$1\"; exec sleep 600",
            "sh",
        ])
        .arg(&claimfile)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    reaper.adopt(holder);
    let deadline = Instant::now() + Duration::from_secs(60);
    let claim = loop {
        if let Ok(text) = std::fs::read_to_string(&claimfile) {
            break text.trim().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the holder never published its lease"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(claim.starts_with("v1:"), "{claim}");
    // Another process copies the variable but has no such descriptor.
    let out = run(ws.arcane().env("ARCANE_WORKSPACE_LEASE", &claim).args([
        "--output",
        "json",
        "lock",
        "run",
        "--operation",
        "thief",
        "--",
        "true",
    ]));
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let v = json(&out);
    assert_eq!(v["error"]["code"], "ARCANE_POLICY_DENIED", "{v}");
    assert!(v.to_string().contains("inherited-lease"), "{v}");
    // A damaged variable is refused too, never silently ignored.
    let out = run(ws.arcane().env("ARCANE_WORKSPACE_LEASE", "garbage").args([
        "--output",
        "json",
        "lock",
        "run",
        "--operation",
        "x",
        "--",
        "true",
    ]));
    assert_eq!(json(&out)["error"]["code"], "ARCANE_POLICY_DENIED");
}

/// Issue 10, item 10: a busy workspace's hints name `--wait` only for the command that
/// has it (`lock run`); `lock recover` (like `serve`) gets the neutral one.
#[test]
fn busy_hints_name_wait_only_where_the_command_has_it() {
    let ws = TestWorkspace::new();
    let mut reaper = Reaper::default();
    start_holder(&ws, "serve", &mut reaper);
    let out = run(ws.arcane().args([
        "lock",
        "run",
        "--operation",
        "build",
        "--wait",
        "200ms",
        "--",
        "true",
    ]));
    assert_eq!(out.status.code(), Some(75));
    assert!(
        stderr(&out).contains("pass a longer `--wait`"),
        "{}",
        stderr(&out)
    );
    let out = run(ws.arcane().args(["lock", "recover"]));
    assert_eq!(out.status.code(), Some(75));
    // The whole message: a hint, and none naming `--wait`.
    insta::assert_snapshot!("lock_recover_busy", ws.redact(&stderr(&out)));
}

#[test]
fn a_directory_at_the_stale_aside_name_is_named_with_a_hint_and_kept() {
    // Issue: `run` and `recover` failed naming the record, not the directory in the way.
    let ws = TestWorkspace::new();
    plant(&ws, &arcane_record(&ws, dead_pid(), 1, "serve"));
    let aside = ws
        .path()
        .join(".arcane/.workspace-operation.lock.json.stale");
    std::fs::create_dir(&aside).unwrap();
    std::fs::write(aside.join("keep"), b"mine").unwrap();
    for command in [
        vec!["lock", "run", "--operation", "build", "--", "true"],
        vec!["lock", "recover"],
    ] {
        let out = run(ws.arcane().args(["--output", "json"]).args(&command));
        assert_ne!(out.status.code(), Some(0), "{command:?}");
        let v = json(&out);
        assert_eq!(
            v["error"]["code"], "ARCANE_POLICY_DENIED",
            "{command:?}: {v}"
        );
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(".workspace-operation.lock.json.stale"),
            "{message}"
        );
        assert!(message.contains("a directory"), "{message}");
        assert!(!v["error"]["hints"].as_array().unwrap().is_empty(), "{v}");
    }
    assert_eq!(std::fs::read(aside.join("keep")).unwrap(), b"mine");
    assert!(
        record(&ws).exists(),
        "the stale record stays until the way is clear"
    );
}

/// The SDK's workspace-operation-lock module, version 0.1.1, exactly as published,
/// from the reference seeds in `shared/` beside the repository (CI lays them there too);
/// fails naming the path when they are not there.
fn sdk_lock_module_0_1_1() -> String {
    let seed = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/reference/seeds/arcane-os-0.1.1-workspace-operation-lock.diff");
    let diff = std::fs::read_to_string(&seed).unwrap_or_else(|e| {
        panic!(
            "the SDK reference seed `{}` is not beside the repository: {e}",
            seed.display()
        )
    });
    let hunk = diff
        .split_once("@@ -0,0 +1,716 @@\n")
        .expect("the module's hunk")
        .1;
    hunk.lines()
        .take_while(|line| line.starts_with('+'))
        .map(|line| format!("{}\n", &line[1..]))
        .collect()
}

/// The 0.1.1 module with the 0.89 recovery rule applied by hand (its hunks do not apply
/// textually): an owner is absent only when `kill(pid, 0)` says `ESRCH`, and recovery
/// no longer waits for the record's expiry.
fn sdk_lock_module() -> String {
    let mut module = sdk_lock_module_0_1_1();
    let rules = [
        // Recovery no longer waits for expiry.
        ("        &&expires<=now\n", ""),
        // An owner is absent only on ESRCH.
        (
            "        &&!ownerIsAlive(document.owner.pid);",
            "        &&ownerIsAbsent(document.owner.pid);",
        ),
        (
            "function validOperation(operation){",
            "function ownerIsAbsent(pid){\n    if(!Number.isSafeInteger(pid)||pid<1)return false;\n    try{\n        process.kill(pid,0);\n        return false;\n    }catch(error){\n        if(error?.code==='ESRCH')return true;\n        const busyError=workspaceBusy('The recorded Arcane workspace operation owner could not be determined.');\n        busyError.cause=error;\n        throw busyError;\n    }\n}\n\nfunction validOperation(operation){",
        ),
    ];
    for (from, to) in rules {
        assert!(module.contains(from), "the 0.1.1 module has no `{from}`");
        module = module.replacen(from, to, 1);
    }
    module
}

/// A JavaScript SDK module in a directory of its own, with a script that takes the lock
/// once (operation `sdk-test`) and prints `{"result":"done"}` or the error's code.
struct Sdk {
    dir: tempfile::TempDir,
}

impl Sdk {
    fn new(module: String) -> Sdk {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("workspace-operation-lock.mjs"), module).unwrap();
        std::fs::write(
            dir.path().join("run.mjs"),
            "import {withWorkspaceOperationLock} from './workspace-operation-lock.mjs';\n\
             try {\n\
               const result = await withWorkspaceOperationLock({workspaceRoot: process.argv[2], operation: 'sdk-test'}, async () => 'done');\n\
               console.log(JSON.stringify({result}));\n\
             } catch (error) {\n\
               console.log(JSON.stringify({code: error.code ?? null, message: String(error.message)}));\n\
               process.exitCode = 1;\n\
             }\n",
        )
        .unwrap();
        Sdk { dir }
    }

    /// One acquisition by the SDK: its answer.
    fn acquire(&self, ws: &TestWorkspace) -> serde_json::Value {
        let out = run(Command::new("node")
            .arg(self.dir.path().join("run.mjs"))
            .arg(ws.path()));
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .unwrap_or_else(|_| panic!("node: {} {}", stdout(&out), stderr(&out)))
    }
}

/// Arcane takes (and releases) the workspace's lock.
fn assert_arcane_locks(ws: &TestWorkspace) {
    let out = run(ws
        .arcane()
        .args(["lock", "run", "--operation", "after", "--", "true"]));
    assert!(out.status.success(), "{}", stderr(&out));
}

/// The record's `expiresAt`; `None` while there is no record (or one read in the middle
/// of a renewal's rewrite).
fn expires_at(ws: &TestWorkspace) -> Option<std::time::SystemTime> {
    let bytes = std::fs::read(record(ws)).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    arcane_report::time::parse_rfc3339(v["expiresAt"].as_str()?)
}

/// Issue 19, item 15: after `kill -9` of `arcane lock run`, the JavaScript SDK (0.1.1
/// with the 0.89 rule) recovers the dead Arcane holder at once, exactly as one of its
/// own: the record is the SDK's document (its exact keys, `owner` with only `pid`, its
/// prose, a UUID-v4 nonce, its TTL and scope, its formatting). It used to answer
/// `ARCANE_WORKSPACE_BUSY` until an Arcane command recovered the record.
#[test]
fn the_sdk_recovers_a_killed_arcane_holder_as_one_of_its_own() {
    let module = sdk_lock_module();
    let ws = TestWorkspace::new();
    let sdk = Sdk::new(module);
    // The SDK takes and releases a free lock (the harness works).
    assert_eq!(sdk.acquire(&ws)["result"], "done");

    let mut holder = ws
        .arcane()
        .args(["lock", "run", "--operation", "hold", "--", "sleep", "600"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = run(ws.arcane().args(["--output", "json", "lock", "status"]));
        if json(&out)["state"] == "held" {
            break;
        }
        assert!(Instant::now() < deadline, "the lock was never held");
        std::thread::sleep(Duration::from_millis(20));
    }
    // While the holder lives, the SDK is refused.
    assert_eq!(sdk.acquire(&ws)["code"], "ARCANE_WORKSPACE_BUSY");
    holder.kill().unwrap();
    holder.wait().unwrap();
    // Dead: the SDK recovers it at once and runs its operation.
    let answer = sdk.acquire(&ws);
    assert_eq!(answer["result"], "done", "{answer}");
    // And Arcane still takes the lock after it (the dead holder's facts are debris).
    assert_arcane_locks(&ws);
}

/// Issue 31: the SDK's 0.1.1 module exactly as published, whose recovery waits for
/// `expiresAt` and an absent owner, recovers a killed `arcane lock run` within the
/// record's short horizon instead of six hours later. While the holder lives, it renews
/// the expiry in place, so the record never expires under a live holder.
#[test]
fn the_sdk_0_1_1_recovers_a_killed_arcane_holder_within_the_horizon() {
    let module = sdk_lock_module_0_1_1();
    let ws = TestWorkspace::new();
    let sdk = Sdk::new(module);
    assert_eq!(sdk.acquire(&ws)["result"], "done", "the harness works");
    let mut reaper = Reaper::default();
    let (arcane_pid, sleep_pid) = start_holder(&ws, "hold", &mut reaper);
    let first = expires_at(&ws).expect("the holder's record");
    assert!(
        first <= SystemTime::now() + Duration::from_secs(31),
        "the record expires within the horizon, not in six hours"
    );
    assert_eq!(sdk.acquire(&ws)["code"], "ARCANE_WORKSPACE_BUSY");
    // A live holder renews: the expiry moves on, and the SDK is still refused.
    wait_until(Duration::from_secs(60), "the record's renewal", || {
        expires_at(&ws).is_some_and(|e| e > first)
    });
    assert_eq!(sdk.acquire(&ws)["code"], "ARCANE_WORKSPACE_BUSY");
    kill9(arcane_pid);
    for child in &mut reaper.children {
        let _ = child.wait();
    }
    wait_gone(sleep_pid, "the holder's command");
    let last = expires_at(&ws).expect("the dead holder's record");
    assert!(
        last <= SystemTime::now() + Duration::from_secs(31),
        "the dead holder's record expires within the horizon"
    );
    // Dead but not yet expired (it was renewed a moment ago): the SDK still waits.
    assert_eq!(sdk.acquire(&ws)["code"], "ARCANE_WORKSPACE_BUSY");
    // Expired: the SDK recovers it at once.
    wait_until(
        Duration::from_secs(60),
        "the dead holder's record to expire",
        || SystemTime::now() > last,
    );
    let answer = sdk.acquire(&ws);
    assert_eq!(answer["result"], "done", "{answer}");
    assert_arcane_locks(&ws);
}

/// Issue 31: an inner `arcane lock run` holding the inherited lease checks the lock
/// every second while the outer one renews the record's times in place: a renewal is
/// not taken for tampering, so the inner command runs to its end.
#[test]
fn an_inherited_lease_takes_its_ancestors_renewals_for_what_they_are() {
    let ws = TestWorkspace::new();
    let arcane = crate::support::arcane_bin();
    // The innermost command waits for a line on a FIFO, which the test writes once the
    // record's expiry has changed twice: the inner holder checked the lock a dozen
    // times in between.
    let fifo = ws.path().join("go");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let mut reaper = Reaper::default();
    let child = ws
        .arcane()
        .args(["lock", "run", "--operation", "outer", "--"])
        .arg(&arcane)
        .arg("--workspace")
        .arg(ws.path())
        .args([
            "lock",
            "run",
            "--operation",
            "inner",
            "--",
            "sh",
            "-c",
            "read line < \"$1\"; echo \"$line\"",
            "sh",
        ])
        .arg(&fifo)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    reaper.adopt(child);
    let mut expiry = None;
    wait_until(Duration::from_secs(60), "the outer holder's record", || {
        expiry = expires_at(&ws);
        expiry.is_some()
    });
    for renewal in ["first", "second"] {
        let before = expiry.expect("read above");
        wait_until(
            Duration::from_secs(60),
            &format!("the {renewal} renewal"),
            || {
                expiry = expires_at(&ws).filter(|e| *e > before);
                expiry.is_some()
            },
        );
    }
    // Without blocking: a reader is there only if the inner command still runs.
    use std::os::unix::fs::OpenOptionsExt;
    let mut go = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .expect("the inner command still runs after two renewals");
    std::io::Write::write_all(&mut go, b"renewed-twice\n").unwrap();
    drop(go);
    let child = reaper.children.last_mut().unwrap();
    let status = wait_for_exit(child, Duration::from_secs(60), "the outer `lock run`");
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{out}\n{err}");
    assert!(out.contains("renewed-twice"), "{out}");
}
