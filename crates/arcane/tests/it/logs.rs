//! `arcane logs` and `GET /v1/logs` with the real llama-server and SmolLM2: the
//! engine's own output and the host's lines are kept per model, a follower sees new
//! lines as they happen (an unload, then a new engine's start), an unknown model is
//! an error naming the known ones, and the budget of `log_buffer` holds. Issue 27,
//! item 4: whatever an engine prints (one huge line, a million lines), the host's
//! memory stays within `log_buffer` and a constant.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::serve::{real_socket_args, strs, wait_host_ready, Serve, START};
use crate::support::{json, run, stderr, TestWorkspace};

/// `arcane logs … --output ndjson` running, its lines on a channel.
struct Follower {
    child: Child,
    lines: mpsc::Receiver<Value>,
}

impl Follower {
    fn start(ws: &TestWorkspace, args: &[&str]) -> Follower {
        let mut child = ws
            .arcane()
            .args(["--output", "ndjson", "logs"])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start arcane logs -f");
        let stdout = child.stdout.take().expect("its stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(value) = serde_json::from_str::<Value>(&line) {
                    if sender.send(value).is_err() {
                        return;
                    }
                }
            }
        });
        Follower { child, lines }
    }

    /// Waits (bounded) for a line whose text passes `pred`; returns it.
    fn wait_for(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.wait_within(START, what, pred)
    }

    /// [`Follower::wait_for`], for up to `within`.
    fn wait_within(&self, within: Duration, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if pred(&line) => return line,
                Ok(_) => {}
                Err(_) => panic!("`arcane logs -f` never showed {what}"),
            }
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(line: &Value) -> &str {
    line["data"]["line"].as_str().unwrap_or_default()
}

#[test]
fn the_engines_output_and_the_hosts_lines_are_kept_and_followed_per_model() {
    let ws = TestWorkspace::new();
    std::fs::write(ws.path().join("arcane.toml"), "log_buffer = \"2KiB\"\n").unwrap();
    let mut args = real_socket_args();
    args.extend(["--alias".into(), "smol".into()]);
    let mut serve = Serve::start(&ws, &strs(&args));
    serve.wait_for("local-ai.server.ready", START);
    wait_host_ready(&ws);

    // What was kept: llama-server's own output and the host's lines, under `smol`.
    let kept = json(&run(ws.arcane().args(["--output", "json", "logs", "smol"])));
    let lines = kept["lines"].as_array().expect("a list of lines").clone();
    assert!(lines.iter().all(|l| l["model"] == "smol"), "{kept}");
    assert!(
        lines.iter().any(|l| l["stream"] == "stderr"),
        "llama-server's own output is kept: {kept}"
    );
    assert!(
        lines.iter().any(|l| l["stream"] == "host"
            && l["line"]
                .as_str()
                .unwrap_or_default()
                .starts_with("local-ai.model.ready")),
        "the host's line for the load is kept: {kept}"
    );
    // `log_buffer` holds: llama-server alone prints far more than 2 KiB while it
    // loads, so with the default (1 MiB) this would fail. A line counts its text,
    // its model's name and 64 bytes of bookkeeping.
    let bytes: usize = lines
        .iter()
        .map(|l| l["line"].as_str().unwrap_or_default().len() + "smol".len() + 64)
        .sum();
    assert!(bytes <= 2 * 1024, "the budget holds: {bytes}");

    // A follower sees what happens next: the unload, then a new engine's start. It
    // first replays what was kept; seeing the load's line proves it is attached, so
    // the unload cannot happen before it listens.
    let follower = Follower::start(&ws, &["-f", "smol", "--since", "1h"]);
    follower.wait_for("the kept load line", |l| {
        text(l).starts_with("local-ai.model.ready")
    });
    let unload = run(ws.arcane().args(["unload", "smol"]));
    assert!(unload.status.success(), "{}", stderr(&unload));
    follower.wait_for("the unload", |l| {
        text(l).starts_with("local-ai.model.stopped")
    });
    let load = run(ws.arcane().args(["load", "smol"]));
    assert!(load.status.success(), "{}", stderr(&load));
    let started = follower.wait_for("the new engine's own output", |l| {
        l["data"]["stream"] == "stderr"
    });
    assert_eq!(started["data"]["model"], "smol");
    follower.wait_for("the new engine ready", |l| {
        text(l).starts_with("local-ai.model.ready")
    });

    // An unknown model is an error naming the ones that have logs.
    let unknown = run(ws.arcane().args(["--output", "json", "logs", "smoll"]));
    assert!(!unknown.status.success());
    let error = json(&unknown);
    assert_eq!(error["error"]["code"], "ARCANE_NOT_FOUND", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("smol"),
        "{error}"
    );
    // A bad --since is refused before anything is asked.
    let bad = run(ws.arcane().args(["logs", "--since", "soon"]));
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("soon"), "{}", stderr(&bad));
    serve.terminate();
}

/// An engine for the `command` kind: answers `GET /health` at once, prints `many`
/// lines, waits until the FIFO `go` beside it is opened and closed by a writer, prints
/// one line of `huge` bytes and two short ones, then only serves.
const LOUD_ENGINE: &str = r#"
import os, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, huge, many = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"status":"ok"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", port), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()
out = sys.stdout.buffer
for n in range(many):
    out.write(b"line %d of many, about as long as a line an engine prints in its log\n" % n)
out.write(b"many printed\n")
out.flush()
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "go"), "rb") as go:
    go.read()
chunk = b"x" * (1 << 20)
left = huge
while left > 0:
    out.write(chunk[: min(left, len(chunk))])
    left -= len(chunk)
out.write(b"\nafter the huge line\nall printed\n")
out.flush()
threading.Event().wait()
"#;

/// What the host may hold beyond `log_buffer`: the process itself (a debug build of
/// `arcane serve` idles at about 24 MiB) and its constant costs (each engine's output
/// channel, under 1 MiB; the followers' tail, 1 MiB; the allocator's slack). Before
/// the bound, one 200 MB line took the host past 1 GiB and a million lines past
/// 130 MiB.
const HOST_ALLOWANCE: u64 = 64 << 20;

/// The host's peak resident memory (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the host runs");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status");
    kib * 1024
}

/// The lines `arcane logs loud` shows now.
fn kept_lines(ws: &TestWorkspace) -> Vec<String> {
    let out = run(ws.arcane().args(["--output", "json", "logs", "loud"]));
    if !out.status.success() {
        return Vec::new();
    }
    json(&out)["lines"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["line"].as_str().map(str::to_string))
        .collect()
}

/// Waits (up to `within`) until `follower` shows `line`, then returns what `arcane
/// logs loud` keeps.
fn wait_for_kept(
    ws: &TestWorkspace,
    follower: &Follower,
    line: &str,
    within: Duration,
) -> Vec<String> {
    follower.wait_within(within, &format!("`{line}`"), |l| text(l) == line);
    kept_lines(ws)
}

#[test]
fn r27_an_engine_printing_a_huge_line_and_a_million_lines_keeps_the_host_within_log_buffer() {
    const HUGE: usize = 200_000_000;
    const MANY: usize = 1_000_000;
    const LOG_BUFFER: u64 = 1 << 20;
    let ws = TestWorkspace::new();
    let engine = ws.path().join("loud.py");
    std::fs::write(&engine, LOUD_ENGINE).unwrap();
    let go =
        std::ffi::CString::new(ws.path().join("go").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path this test owns.
    assert_eq!(unsafe { libc::mkfifo(go.as_ptr(), 0o600) }, 0, "mkfifo");
    let toml = format!(
        "log_buffer = \"1MiB\"\n\n[[model]]\nid = \"loud\"\ncommand = [\"python3\", \"{}\", \"${{PORT}}\", \"{HUGE}\", \"{MANY}\"]\nhealth = \"/health\"\n",
        engine.display()
    );
    std::fs::write(ws.path().join("arcane.toml"), toml).unwrap();

    // Under an address-space cap, so that a regression fails this test instead of
    // taking the machine down (it has no swap).
    let mut command = ws.arcane();
    command
        .arg("serve")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: only async-signal-safe calls (setrlimit) between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let cap = 4 << 30;
            let limit = libc::rlimit {
                rlim_cur: cap,
                rlim_max: cap,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut host = command.spawn().expect("start arcane serve");
    struct Stop<'a>(&'a mut Child);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let pid = host.id();
    let _stop = Stop(&mut host);
    crate::support::wait_until(START, "the host's core.json", || {
        std::fs::read_to_string(ws.path().join(".arcane/core.json"))
            .is_ok_and(|t| t.contains("token"))
    });
    let follower = Follower::start(&ws, &["-f", "loud", "--since", "0s"]);
    let load = run(ws.arcane().args(["load", "loud"]));
    assert!(load.status.success(), "{}", stderr(&load));

    // A million lines: the engine waits for the host instead of the host queueing them.
    let bound = LOG_BUFFER + HOST_ALLOWANCE;
    let kept = wait_for_kept(&ws, &follower, "many printed", Duration::from_secs(600));
    let last = format!(
        "line {} of many, about as long as a line an engine prints in its log",
        MANY - 1
    );
    assert!(kept.contains(&last), "the last of the many lines is kept");
    let after_many = peak_rss(pid);
    assert!(
        after_many <= bound,
        "{MANY} lines took the host to {} MiB (bound {} MiB)",
        after_many >> 20,
        bound >> 20
    );

    // One line of 200 MB: cut at 64 KiB, read in bounded chunks, and it says so. (The
    // engine waits on the FIFO until this opens and closes it.)
    std::fs::write(ws.path().join("go"), "").unwrap();
    let kept = wait_for_kept(&ws, &follower, "all printed", Duration::from_secs(600));
    let peak = peak_rss(pid);
    assert!(
        peak <= bound,
        "a {HUGE}-byte line took the host to {} MiB (bound {} MiB)",
        peak >> 20,
        bound >> 20
    );
    let cap = 64 * 1024;
    let cut = kept
        .iter()
        .find(|l| l.starts_with("xxxx"))
        .expect("the huge line is kept, cut");
    let suffix = format!(" … [truncated: {} bytes not kept]", HUGE - cap);
    assert!(
        cut.ends_with(&suffix),
        "{}",
        &cut[cut.len().saturating_sub(80)..]
    );
    assert_eq!(cut.len(), cap + suffix.len());
    // The lines after it are whole, in order.
    let position = |text: &str| kept.iter().position(|l| l == text);
    assert!(position("after the huge line") < position("all printed"));
    assert_eq!(
        kept.iter()
            .position(|l| l.starts_with("xxxx"))
            .map(|p| p + 1),
        position("after the huge line")
    );
}
