//! Owned engine processes: the ONE spawn function, and the only place that signals.
//!
//! Every owned child is created by [`spawn`], which always
//!
//! * puts the child in a new process group (`setpgid(0, 0)`), so a stop reaches the
//!   engine and anything it started;
//! * arms `PR_SET_PDEATHSIG(SIGKILL)` on Linux (prctl(2)), so `kill -9` of Arcane takes
//!   the engine down too. The signal fires when the *thread* that forked exits, not
//!   the process (prctl(2), "the parent thread"), so every fork happens on one
//!   dedicated spawner thread that lives as long as the process;
//! * kills the group when its [`Child`] handle is dropped without a stop (kill-on-drop).
//!
//! Stopping ([`Child::terminate`]) sends SIGTERM to the group, waits out the grace
//! period, then sends SIGKILL. A waiter thread notices the leader's exit with
//! `waitid(WNOWAIT)` (wait(2)): the zombie still holds the pid, so the group id cannot
//! have been reused when the waiter sends a final SIGKILL to any leftover group member,
//! and only then reaps the leader. No signal is ever sent after the reap.
//!
//! [`stop_orphan`] stops a process a previous Arcane provably owned (see `records`).
//!
//! [`kill_all_now`] is the escalation path (a second Ctrl-C/SIGTERM while draining): it
//! SIGKILLs every owned group not yet reaped, through the same [`Group`] rule, right
//! before the process exits.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc as std_mpsc, Arc, Mutex, OnceLock};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct SpawnSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub env_remove: Vec<String>,
    pub cwd: Option<PathBuf>,
    /// Arm the parent-death signal (always, except in tests that simulate an orphan).
    pub parent_death_signal: bool,
}

/// Which stream a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// One non-empty output line.
#[derive(Debug, Clone)]
pub(crate) struct OutputLine {
    pub stream: Stream,
    pub line: String,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExitInfo {
    /// The exit code, when it exited by itself.
    pub code: Option<i32>,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
}

impl ExitInfo {
    /// `exit code N` or `signal N`.
    pub fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => format!("signal {signal}"),
            (None, None) => "unknown status".into(),
        }
    }

    /// Whether it exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Which step of a stop ended the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StopStep {
    /// It had already exited before the stop.
    AlreadyExited,
    /// SIGTERM to the group ended it within the grace period.
    Sigterm,
    /// It outlived the grace period and was killed with SIGKILL.
    Sigkill,
    /// An adopted server: nothing was signalled, it was left running.
    Released,
}

/// The process group of an owned child; signals go through here only.
#[derive(Debug)]
struct Group {
    pgid: libc::pid_t,
    /// Set (under the lock) once the leader is reaped; no signal is sent after that.
    reaped: Mutex<bool>,
}

impl Group {
    /// Signals the whole group unless the leader has been reaped. Returns whether it was sent.
    fn signal(&self, signal: libc::c_int) -> bool {
        let Ok(reaped) = self.reaped.lock() else {
            return false;
        };
        if *reaped {
            return false;
        }
        // SAFETY: killpg has no memory-safety preconditions. The leader is not reaped
        // (checked under the lock the waiter holds while reaping), so `pgid` still names
        // our child's group and cannot belong to a stranger.
        unsafe { libc::killpg(self.pgid, signal) == 0 }
    }
}

/// A running owned child. Dropping it kills its process group (kill-on-drop).
#[derive(Debug)]
#[must_use = "dropping a Child kills it"]
pub(crate) struct Child {
    pub pid: u32,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: Option<u64>,
    /// What `/proc/<pid>/exe` resolved to right after the spawn.
    pub exe: Option<PathBuf>,
    pub lines: mpsc::UnboundedReceiver<OutputLine>,
    /// The leader's exit, once it happened (a separate field so that output and exit
    /// can be awaited together).
    pub exit: ExitWatch,
    group: Arc<Group>,
}

/// Watches for the leader's exit.
#[derive(Debug)]
pub(crate) struct ExitWatch(watch::Receiver<Option<ExitInfo>>);

impl ExitWatch {
    /// The exit status, once the leader has exited and been reaped.
    pub fn status(&self) -> Option<ExitInfo> {
        *self.0.borrow()
    }

    /// Waits until the leader has exited (and been reaped).
    pub async fn exited(&mut self) -> ExitInfo {
        loop {
            if let Some(info) = *self.0.borrow_and_update() {
                return info;
            }
            if self.0.changed().await.is_err() {
                // The waiter thread is gone without a status; treat as unknown.
                return self.0.borrow().unwrap_or(ExitInfo {
                    code: None,
                    signal: None,
                });
            }
        }
    }
}

impl Child {
    /// The exit status, once the leader has exited and been reaped.
    pub fn exit_status(&self) -> Option<ExitInfo> {
        self.exit.status()
    }

    /// Waits until the leader has exited (and been reaped).
    pub async fn exited(&mut self) -> ExitInfo {
        self.exit.exited().await
    }

    /// SIGTERM to the group; after `grace`, SIGKILL; waits for the exit. Idempotent.
    /// `on_escalate` runs just before SIGKILL is sent.
    pub async fn terminate(
        &mut self,
        grace: Duration,
        on_escalate: impl FnOnce(),
    ) -> (StopStep, ExitInfo) {
        if let Some(info) = self.exit_status() {
            return (StopStep::AlreadyExited, info);
        }
        self.group.signal(libc::SIGTERM);
        if let Ok(info) = tokio::time::timeout(grace, self.exited()).await {
            return (StopStep::Sigterm, info);
        }
        on_escalate();
        self.group.signal(libc::SIGKILL);
        let info = self.exited().await;
        (StopStep::Sigkill, info)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.group.signal(libc::SIGKILL);
    }
}

/// Every owned group still alive, for [`kill_all_now`].
fn live_groups() -> &'static Mutex<Vec<std::sync::Weak<Group>>> {
    static LIVE: OnceLock<Mutex<Vec<std::sync::Weak<Group>>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(Vec::new()))
}

/// SIGKILLs every owned process group that is not yet reaped, and returns how many were
/// signalled: for a process about to exit at once (the second signal), so no engine
/// outlives it even without the parent-death signal. Safe from any thread.
pub fn kill_all_now() -> usize {
    let groups: Vec<Arc<Group>> = live_groups()
        .lock()
        .map(|list| list.iter().filter_map(std::sync::Weak::upgrade).collect())
        .unwrap_or_default();
    groups
        .iter()
        .filter(|group| group.signal(libc::SIGKILL))
        .count()
}

type SpawnReply = oneshot::Sender<io::Result<std::process::Child>>;

/// The long-lived thread every owned child is forked from (see the module doc).
fn spawner() -> &'static Mutex<std_mpsc::Sender<(SpawnSpec, SpawnReply)>> {
    static SPAWNER: OnceLock<Mutex<std_mpsc::Sender<(SpawnSpec, SpawnReply)>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (sender, receiver) = std_mpsc::channel::<(SpawnSpec, SpawnReply)>();
        let _ = std::thread::Builder::new()
            .name("arcane-spawner".into())
            .spawn(move || {
                // Lives until the process exits: its exit would fire the children's
                // parent-death signal.
                while let Ok((spec, reply)) = receiver.recv() {
                    let _ = reply.send(spawn_here(&spec));
                }
                loop {
                    std::thread::park();
                }
            });
        Mutex::new(sender)
    })
}

fn spawn_here(spec: &SpawnSpec) -> io::Result<std::process::Child> {
    let mut command = Command::new(&spec.program);
    command
        .args(&spec.args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    for name in &spec.env_remove {
        command.env_remove(name);
    }
    command.envs(&spec.env);
    if let Some(cwd) = &spec.cwd {
        command.current_dir(cwd);
    }
    #[cfg(target_os = "linux")]
    if spec.parent_death_signal {
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the closure runs in the forked child before exec and calls only
        // async-signal-safe functions (prctl, getppid); it allocates nothing.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died between fork and prctl; then nobody would
                // ever send the signal (prctl(2)), so refuse to run.
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }
    command.spawn()
}

/// Spawns `spec` as an owned child (new process group, parent-death signal, kill-on-drop).
pub(crate) async fn spawn(spec: SpawnSpec) -> io::Result<Child> {
    let (reply, answer) = oneshot::channel();
    spawner()
        .lock()
        .map_err(|_| io::Error::other("the spawner thread is unavailable"))?
        .send((spec, reply))
        .map_err(|_| io::Error::other("the spawner thread is unavailable"))?;
    let mut child = answer
        .await
        .map_err(|_| io::Error::other("the spawner thread did not answer"))??;
    let pid = child.id();
    let group = Arc::new(Group {
        pgid: pid as libc::pid_t,
        reaped: Mutex::new(false),
    });
    if let Ok(mut live) = live_groups().lock() {
        live.retain(|weak| weak.strong_count() > 0);
        live.push(Arc::downgrade(&group));
    }
    let (line_tx, lines) = mpsc::unbounded_channel();
    if let Some(stdout) = child.stdout.take() {
        read_lines(stdout, Stream::Stdout, line_tx.clone());
    }
    if let Some(stderr) = child.stderr.take() {
        read_lines(stderr, Stream::Stderr, line_tx);
    }
    let (exit_tx, exit) = watch::channel(None);
    let waiter_group = group.clone();
    std::thread::Builder::new()
        .name(format!("arcane-wait-{pid}"))
        .spawn(move || wait_and_reap(child, waiter_group, exit_tx))?;
    Ok(Child {
        pid,
        start_time: process_start_time(pid),
        exe: std::fs::read_link(format!("/proc/{pid}/exe")).ok(),
        lines,
        exit: ExitWatch(exit),
        group,
    })
}

fn read_lines(
    stream: impl Read + Send + 'static,
    which: Stream,
    sender: mpsc::UnboundedSender<OutputLine>,
) {
    let _ = std::thread::Builder::new()
        .name(format!("arcane-{}", which.name()))
        .spawn(move || {
            let reader = BufReader::new(stream);
            for chunk in reader.split(b'\n') {
                let Ok(chunk) = chunk else { break };
                let line = String::from_utf8_lossy(&chunk);
                let line = line.trim_end_matches('\r');
                if line.trim().is_empty() {
                    continue;
                }
                if sender
                    .send(OutputLine {
                        stream: which,
                        line: line.to_string(),
                    })
                    .is_err()
                {
                    // Nobody listens any more; keep draining so the child never blocks.
                    continue;
                }
            }
        });
}

fn wait_and_reap(
    mut child: std::process::Child,
    group: Arc<Group>,
    exit: watch::Sender<Option<ExitInfo>>,
) {
    let pid = child.id() as libc::id_t;
    loop {
        // SAFETY: `info` is a valid, zeroed siginfo_t that waitid writes into.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: plain syscall on our own child's pid; WNOWAIT leaves it a zombie.
        let result =
            unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if result == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    let status = {
        let mut reaped = group.reaped.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the leader is a zombie (not yet reaped), so the group id is still ours;
        // this clears any process the engine left behind in its group.
        unsafe {
            libc::killpg(group.pgid, libc::SIGKILL);
        }
        let status = child.wait();
        *reaped = true;
        status
    };
    let info = match status {
        Ok(status) => ExitInfo {
            code: status.code(),
            signal: status.signal(),
        },
        Err(_) => ExitInfo {
            code: None,
            signal: None,
        },
    };
    let _ = exit.send(Some(info));
}

/// A process's start time in clock ticks since boot (`/proc/<pid>/stat` field 22), or
/// `None` when there is no such process (or it is a zombie).
pub(crate) fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: parse after the last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); field 22 is index 19.
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// What `/proc/<pid>/exe` points to.
pub(crate) fn process_exe(pid: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe")).ok()
}

/// Whether `/proc/<pid>/environ` holds `name=value`; `None` when it cannot be read.
pub(crate) fn process_environ_has(pid: u32, name: &str, value: &str) -> Option<bool> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let wanted = format!("{name}={value}");
    Some(
        environ
            .split(|b| *b == 0)
            .any(|entry| entry == wanted.as_bytes()),
    )
}

/// Stops a process that a previous Arcane provably owned (`records` checked pid, start
/// time and executable). It is not our child, so liveness is polled through `/proc`;
/// the group is signalled only while the pid still has the recorded start time.
pub(crate) async fn stop_orphan(pid: u32, start_time: u64, grace: Duration) -> StopStep {
    let alive = || process_start_time(pid) == Some(start_time);
    let signal = |sig: libc::c_int| {
        if !alive() {
            return;
        }
        // SAFETY: plain syscalls. The pid was re-checked against the recorded start time
        // just above, so it names the orphan, which leads its own group (spawned with
        // `setpgid(0, 0)`); if it does not lead a group, only the pid is signalled.
        unsafe {
            if libc::getpgid(pid as libc::pid_t) == pid as libc::pid_t {
                libc::killpg(pid as libc::pid_t, sig);
            } else {
                libc::kill(pid as libc::pid_t, sig);
            }
        }
    };
    if !alive() {
        return StopStep::AlreadyExited;
    }
    signal(libc::SIGTERM);
    let deadline = tokio::time::Instant::now() + grace;
    while tokio::time::Instant::now() < deadline {
        if !alive() {
            return StopStep::Sigterm;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal(libc::SIGKILL);
    for _ in 0..250 {
        if !alive() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    StopStep::Sigkill
}

/// The directory the child runs in: the executable's own directory (as the SDK does).
pub(crate) fn working_directory(executable: &Path) -> Option<PathBuf> {
    executable
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_of_self_is_readable_and_stable() {
        let me = std::process::id();
        let first = process_start_time(me).unwrap();
        assert_eq!(process_start_time(me), Some(first));
        assert_eq!(process_start_time(u32::MAX - 1), None);
    }

    #[tokio::test]
    async fn terminate_stops_a_group_and_reports_sigterm() {
        let mut child = spawn(SpawnSpec {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), "sleep 30 & wait".into()],
            env: BTreeMap::new(),
            env_remove: vec![],
            cwd: None,
            parent_death_signal: true,
        })
        .await
        .unwrap();
        let pid = child.pid;
        assert!(process_start_time(pid).is_some());
        let (step, _) = child.terminate(Duration::from_secs(5), || {}).await;
        assert_eq!(step, StopStep::Sigterm);
        assert_eq!(process_start_time(pid), None);
        // Idempotent.
        let (again, _) = child.terminate(Duration::from_secs(5), || {}).await;
        assert_eq!(again, StopStep::AlreadyExited);
    }
}
