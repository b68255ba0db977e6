//! The test harness: a fresh workspace per test and a command builder for the real
//! `arcane` binary.
#![allow(dead_code)]
#![allow(clippy::disallowed_methods)] // tests read the provisioned paths from the environment

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Path of the `arcane` binary under test.
pub fn arcane_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_arcane"))
}

/// A fresh temporary directory holding a workspace, removed when dropped.
pub struct TestWorkspace {
    pub dir: tempfile::TempDir,
}

impl TestWorkspace {
    /// Creates an empty workspace directory.
    pub fn new() -> Self {
        Self {
            dir: tempfile::Builder::new()
                .prefix("arcane-test-")
                .tempdir()
                .expect("create temp workspace"),
        }
    }

    /// The workspace root.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `arcane --workspace <this>` with a clean environment for Arcane's variables.
    pub fn arcane(&self) -> Command {
        let mut command = Command::new(arcane_bin());
        command
            .arg("--workspace")
            .arg(self.path())
            .env_remove("ARCANE_WORKSPACE")
            .env("NO_COLOR", "1");
        command
    }
}

/// Runs a command and returns its output, panicking only if it could not be spawned.
pub fn run(command: &mut Command) -> Output {
    command.output().expect("spawn arcane")
}

/// stdout as UTF-8.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// stderr as UTF-8.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// stdout parsed as one JSON document.
pub fn json(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
            stdout(output),
            stderr(output)
        )
    })
}

/// The real `llama-server` provisioned by `scripts/provision.sh` (`LLAMA_SERVER`).
/// Tests that need it fail loudly rather than skip when it is absent.
pub fn llama_server() -> PathBuf {
    real_part("LLAMA_SERVER")
}

/// The real SmolLM2 GGUF provisioned by `scripts/provision.sh` (`ARCANE_TEST_MODEL`).
pub fn smollm2() -> PathBuf {
    real_part("ARCANE_TEST_MODEL")
}

/// Whisper tiny.en in whisper.cpp's ggml format, converted by `scripts/provision.sh`
/// (`ARCANE_WHISPER_MODEL`).
pub fn whisper_model() -> PathBuf {
    real_part("ARCANE_WHISPER_MODEL")
}

/// The `en_US-joe-medium` Piper voice (`.onnx`, its `.onnx.json` beside it),
/// provisioned by `scripts/provision.sh` (`ARCANE_PIPER_VOICE`).
pub fn piper_voice() -> PathBuf {
    real_part("ARCANE_PIPER_VOICE")
}

fn real_part(var: &str) -> PathBuf {
    let value = std::env::var_os(var).unwrap_or_else(|| {
        panic!("{var} is not set: run the tests through `./scripts/test.sh` (it provisions llama-server, SmolLM2, the speech models and the other real parts, and exports {var})")
    });
    let path = PathBuf::from(value);
    assert!(
        path.is_file(),
        "{var}={} does not exist; rerun `bash scripts/provision.sh`",
        path.display()
    );
    path
}

/// Sends one raw HTTP/1.1 request (which should say `Connection: close`) to
/// `address` (a loopback `host:port`; anything else panics) and returns the status
/// and body of the reply.
pub fn http_exchange(address: &str, request: &str) -> (u16, String) {
    assert!(
        address.starts_with("127.0.0.1:")
            || address.starts_with("[::1]:")
            || address.starts_with("localhost:"),
        "tests talk to loopback only, not `{address}`"
    );
    let stream = std::net::TcpStream::connect(address).expect("connect to the host");
    stream
        // A generous bound (a completion on a loaded 2-core machine can take a while),
        // never a timing assertion.
        .set_read_timeout(Some(std::time::Duration::from_secs(300)))
        .expect("set a read timeout");
    exchange(stream, request)
}

/// [`http_exchange`] over the Unix socket `socket` (an engine's private one).
pub fn http_unix_exchange(socket: &std::path::Path, request: &str) -> (u16, String) {
    let stream = std::os::unix::net::UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connect to {}: {e}", socket.display()));
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(300)))
        .expect("set a read timeout");
    exchange(stream, request)
}

/// Sends `request` on `stream` and reads the reply to its end: status and body.
fn exchange(mut stream: impl std::io::Read + std::io::Write, request: &str) -> (u16, String) {
    stream
        .write_all(request.as_bytes())
        .expect("send the request");
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A part `scripts/provision.sh` provisioned (a client library, the browser, a
/// model), from the environment `scripts/test.sh` sets.
pub fn provisioned(var: &str) -> std::path::PathBuf {
    let value = std::env::var_os(var).unwrap_or_else(|| {
        panic!("{var} is not set: run the tests through `./scripts/test.sh` (it provisions what they drive)")
    });
    std::path::PathBuf::from(value)
}

/// Polls `condition` every 20 ms until it holds; panics naming `what` after `within`.
/// What a test would otherwise `sleep` for, waited on as the state it stands for.
pub fn wait_until(within: std::time::Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Waits up to `within` for `child` to exit and returns its status; panics naming
/// `what` when it does not (a bounded wait, never a timing assertion). It waits on
/// the exit itself: a pidfd of the child becomes readable when it ends.
pub fn wait_for_exit(
    child: &mut std::process::Child,
    within: std::time::Duration,
    what: &str,
) -> std::process::ExitStatus {
    if let Some(status) = child.try_wait().expect("poll the child") {
        return status;
    }
    // SAFETY: pidfd_open on our own unreaped child; the descriptor is closed below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, child.id() as libc::pid_t, 0) };
    assert!(fd >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
    let fd = fd as libc::c_int;
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let deadline = std::time::Instant::now() + within;
    let ready = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let millis = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd, owned by this frame.
        let ready = unsafe { libc::poll(&mut poll, 1, millis) };
        // A signal interrupted the wait: wait again for what is left.
        let interrupted =
            ready < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted;
        if !interrupted {
            break ready;
        }
    };
    // SAFETY: `fd` is the pidfd opened above, closed once.
    unsafe { libc::close(fd) };
    assert!(ready > 0, "{what} did not exit within {within:?}");
    child.wait().expect("reap the child")
}

/// What differs from run to run in the CLI's output, replaced by placeholders so the
/// whole output can be compared with a committed snapshot (`insta`): the paths of the
/// test's temporary directories, of the binary and of the repository, pids, loopback
/// ports, timestamps, boot ids and nonces (UUIDs) and the host name. Values a test
/// knows (the holder's pid and host) get their own placeholder first, so the snapshot
/// still says *which* pid is named.
pub struct Redactions {
    /// Exact text and its placeholder, longest first when applied.
    exact: Vec<(String, String)>,
}

impl Redactions {
    /// The binary's and the repository's paths; add the test's own paths and values.
    pub fn new() -> Self {
        let repository = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        Self { exact: Vec::new() }
            .text(arcane_bin().display().to_string(), "[ARCANE]")
            .path(&repository, "[REPO]")
    }

    /// `path` (and its canonical form) becomes `placeholder`.
    pub fn path(mut self, path: &Path, placeholder: &str) -> Self {
        if let Ok(canonical) = std::fs::canonicalize(path) {
            self = self.text(canonical.display().to_string(), placeholder);
        }
        self.text(path.display().to_string(), placeholder)
    }

    /// `text` becomes `placeholder`.
    pub fn text(mut self, text: impl Into<String>, placeholder: &str) -> Self {
        let text = text.into();
        if !text.is_empty() {
            self.exact.push((text, placeholder.to_string()));
        }
        self
    }

    /// `text` with every redaction applied.
    pub fn apply(&self, text: &str) -> String {
        let mut exact = self.exact.clone();
        exact.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
        let mut text = text.to_string();
        for (from, to) in &exact {
            text = text.replace(from.as_str(), to);
        }
        let temp = regex::escape(
            std::env::temp_dir()
                .display()
                .to_string()
                .trim_end_matches('/'),
        );
        let patterns = [
            // Other temporary directories (their names are random); what is inside stays.
            (format!(r"{temp}/[A-Za-z0-9._-]+"), "[TMP]"),
            (
                r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})".into(),
                "[TIME]",
            ),
            // A time of day (`since 19:29:35Z`).
            (r"\b\d{2}:\d{2}:\d{2}Z".into(), "[TIME]"),
            // The host name, where the output names one (a short name such as `vm`
            // could not be replaced as plain text); a placeholder stays.
            (r"\bhost `[^`\[][^`]*`".into(), "host `[HOST]`"),
            (
                r#""hostname": ?"[^"\[][^"]*""#.into(),
                r#""hostname": "[HOST]""#,
            ),
            (
                r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}".into(),
                "[UUID]",
            ),
            (r"(?i)\b(pid) \d+".into(), "$1 [PID]"),
            (r#"("[A-Za-z]*(?:pid|Pid)": ?)\d+"#.into(), "$1[PID]"),
            (
                r"((?:127\.0\.0\.1|localhost|\[::1\]):)\d+".into(),
                "$1[PORT]",
            ),
            (r#"("port": ?)\d+"#.into(), "$1[PORT]"),
        ];
        for (pattern, replacement) in patterns {
            let pattern = regex::Regex::new(&pattern).expect("a valid redaction pattern");
            text = pattern.replace_all(&text, replacement).into_owned();
        }
        text
    }

    /// `value` as pretty JSON, redacted.
    pub fn json(&self, value: &serde_json::Value) -> String {
        self.apply(&serde_json::to_string_pretty(value).expect("JSON prints"))
    }
}

impl TestWorkspace {
    /// The usual redactions of a test on this workspace (its path is `[WORKSPACE]`).
    pub fn redactions(&self) -> Redactions {
        Redactions::new().path(self.path(), "[WORKSPACE]")
    }

    /// `text` (CLI output) with this workspace's redactions.
    pub fn redact(&self, text: &str) -> String {
        self.redactions().apply(text)
    }
}

#[test]
fn redactions_replace_what_varies_and_keep_what_a_test_named() {
    let ws = TestWorkspace::new();
    let text = format!(
        "workspace `{}` held by pid 4242 on host `box` since 19:29:35Z ({}), see http://127.0.0.1:51234 and {}/arcane-xyz/file; \"pid\": 17, \"bootId\": \"0b7c6a52-8d8e-4c1e-9a51-0a7d1c2e3f40\"",
        ws.path().display(),
        "2026-12-01T19:29:35.123Z",
        std::env::temp_dir().display().to_string().trim_end_matches('/'),
    );
    let redacted = ws
        .redactions()
        .text("pid 4242", "pid [HOLDER]")
        .apply(&text);
    assert_eq!(
        redacted,
        "workspace `[WORKSPACE]` held by pid [HOLDER] on host `[HOST]` since [TIME] ([TIME]), see http://127.0.0.1:[PORT] and [TMP]/file; \"pid\": [PID], \"bootId\": \"[UUID]\""
    );
}

/// Every path under `root`, relative and sorted.
pub fn tree(root: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            out.push(path.strip_prefix(root).unwrap().display().to_string());
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Kills `pid` (SIGKILL) when dropped, if it still runs: an orphan a test made (or a
/// failed test left) must not outlive the test.
pub struct OrphanGuard(pub u32);

impl Drop for OrphanGuard {
    fn drop(&mut self) {
        if running(self.0) {
            // SAFETY: a plain syscall on the pid this test made an orphan of.
            unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGKILL) };
        }
    }
}

/// Whether `pid` runs (exists and is not a zombie).
pub fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// A series' value in a `/metrics` text (`name` with its labels, as printed), 0 when
/// it is absent.
pub fn metric(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}
