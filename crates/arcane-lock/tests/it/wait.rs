//! Waiting with a deadline, the `waiting` event, and cancellation.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use arcane_lock::{Error, WorkspaceLock};
use arcane_report::{CancelToken, Collector, Diagnostic, Event, EventSink, NullSink};

use crate::support::*;

/// Another process holding the advisory lock (a Python one-liner), killed on drop.
struct ForeignHolder(Child);

impl ForeignHolder {
    fn start(ws: &std::path::Path) -> Self {
        std::fs::create_dir_all(ws.join(".arcane")).unwrap();
        let mut child = Command::new("python3")
            .args([
                "-c",
                "import fcntl,os,sys,time\nfd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT,0o600)\nfcntl.flock(fd,fcntl.LOCK_EX)\nprint('locked',flush=True)\ntime.sleep(600)",
            ])
            .arg(ws.join(SENTINEL))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "locked");
        ForeignHolder(child)
    }
}

impl Drop for ForeignHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_wait_emits_one_waiting_event_and_gives_up_busy_at_the_deadline() {
    let ws = workspace();
    let holder = WorkspaceLock::acquire(ws.path(), &options("serve"), &NullSink).unwrap();
    let sink = Collector::default();
    let err = WorkspaceLock::acquire(
        ws.path(),
        &options("build").wait(Duration::from_millis(300)),
        &sink,
    )
    .unwrap_err();
    assert!(err.is_busy(), "{err}");
    match &err {
        Error::Busy { waited, .. } => assert!(waited.is_some()),
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("gave up after waiting"), "{err}");
    // Issue 10, item 10: no `--wait` hint from the library (`serve` has no such flag).
    assert!(
        !err.hints().iter().any(|h| h.contains("--wait")),
        "{:?}",
        err.hints()
    );
    let types = sink.types();
    assert_eq!(types, ["workspace.operation.waiting"]);
    let data = &sink.events()[0].data;
    assert_eq!(data["holder"]["pid"], std::process::id());
    assert_eq!(data["holder"]["operation"], "serve");
    assert!(data["holder"]["since"].is_string());
    assert_eq!(data["waitMilliseconds"], 300);
    drop(holder);
}

#[test]
fn a_waiter_gets_the_lock_when_a_foreign_holder_exits() {
    let ws = workspace();
    let holder = ForeignHolder::start(ws.path());
    let path = ws.path().to_path_buf();
    let sink = Arc::new(Collector::default());
    let waiter_sink = sink.clone();
    let waiter = std::thread::spawn(move || {
        let lock = WorkspaceLock::acquire(
            &path,
            &options("build").wait(Duration::from_secs(120)),
            &*waiter_sink,
        );
        lock.map(|l| l.release())
    });
    // The holder leaves only once the waiter is really waiting.
    wait_until("the waiter reports waiting", || {
        sink.types()
            .iter()
            .any(|t| t == "workspace.operation.waiting")
    });
    drop(holder);
    waiter.join().unwrap().unwrap().unwrap();
    assert_eq!(
        sink.types(),
        ["workspace.operation.waiting", "workspace.operation.locked"]
    );
}

#[test]
fn cancellation_stops_a_wait_promptly_and_touches_nothing() {
    let ws = workspace();
    let holder = WorkspaceLock::acquire(ws.path(), &options("serve"), &NullSink).unwrap();
    let before = std::fs::read(record_path(ws.path())).unwrap();
    let token = CancelToken::new();
    let path = ws.path().to_path_buf();
    let waiter_token = token.clone();
    let sink = Arc::new(Collector::default());
    let waiter_sink = sink.clone();
    let waiter = std::thread::spawn(move || {
        WorkspaceLock::acquire(
            &path,
            &options("build")
                .wait(Duration::from_secs(600))
                .cancel(waiter_token),
            &*waiter_sink,
        )
    });
    // Cancel a wait that has begun, not an acquire that has not looked yet.
    wait_until("the waiter reports waiting", || {
        sink.types()
            .iter()
            .any(|t| t == "workspace.operation.waiting")
    });
    token.cancel();
    // A 600 s wait that returns at all was woken by the token.
    let err = waiter.join().unwrap().unwrap_err();
    assert!(err.is_cancelled(), "{err}");
    assert_eq!(std::fs::read(record_path(ws.path())).unwrap(), before);
    holder.release().unwrap();
}

#[test]
fn a_token_fired_before_acquiring_creates_nothing() {
    let ws = workspace();
    let token = CancelToken::new();
    token.cancel();
    let err =
        WorkspaceLock::acquire(ws.path(), &options("build").cancel(token), &NullSink).unwrap_err();
    assert!(err.is_cancelled());
    assert!(!ws.path().join(".arcane").exists());
}

/// Cancels its token when it sees `locked` (lock-spec.md case 36).
struct CancelOnLocked(CancelToken, Collector);

impl EventSink for CancelOnLocked {
    fn emit(&self, event: Event) {
        if event.kind == "workspace.operation.locked" {
            self.0.cancel();
        }
        self.1.emit(event);
    }
}

#[test]
fn a_cancellation_inside_the_locked_event_gives_the_lock_back() {
    let ws = workspace();
    let token = CancelToken::new();
    let sink = CancelOnLocked(token.clone(), Collector::default());
    let err =
        WorkspaceLock::acquire(ws.path(), &options("build").cancel(token), &sink).unwrap_err();
    assert!(err.is_cancelled());
    assert!(!record_path(ws.path()).exists());
    assert_eq!(
        sink.1.types(),
        ["workspace.operation.locked", "workspace.operation.released"]
    );
    WorkspaceLock::acquire(ws.path(), &options("next"), &NullSink)
        .unwrap()
        .release()
        .unwrap();
}

#[test]
fn a_foreign_holder_without_a_record_is_busy_without_a_name() {
    let ws = workspace();
    let _holder = ForeignHolder::start(ws.path());
    let err = WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink).unwrap_err();
    assert!(err.is_busy());
    assert!(
        err.to_string().contains("not published its record"),
        "{err}"
    );
}

/// Issue 31: the record is written before the lock is tried; one that waited for the
/// lock longer than a second gets fresh times when it is published, so its expiry lies
/// a horizon after its publication, not after the start of the wait.
#[test]
fn a_record_that_waited_for_the_lock_is_published_with_fresh_times() {
    let ws = workspace();
    let holder = ForeignHolder::start(ws.path());
    let sink = Arc::new(Collector::default());
    let waiter = {
        let (path, sink) = (ws.path().to_path_buf(), Arc::clone(&sink));
        std::thread::spawn(move || {
            WorkspaceLock::acquire(
                &path,
                &options("build").wait(Duration::from_secs(60)),
                &*sink,
            )
        })
    };
    wait_until("the acquirer waits", || {
        sink.types()
            .contains(&"workspace.operation.waiting".to_string())
    });
    // The other holder keeps the lock for more than a second after that.
    let waiting_since = std::time::SystemTime::now();
    wait_until("a second has passed", || {
        waiting_since
            .elapsed()
            .is_ok_and(|e| e > Duration::from_millis(1100))
    });
    let released_at = std::time::SystemTime::now();
    drop(holder);
    let lock = waiter.join().unwrap().expect("locked once the holder left");
    let v = read_record(ws.path());
    let expires = arcane_report::time::parse_rfc3339(v["expiresAt"].as_str().unwrap()).unwrap();
    assert!(
        expires >= released_at + Duration::from_secs(29),
        "times of the publication, not of the preparation"
    );
    lock.release().unwrap();
}
