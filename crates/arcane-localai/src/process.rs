//! Owned engine processes, seen from async code: an adapter over `arcane-process`
//! (the one module that spawns, waits for and signals processes) that adds what the
//! supervisor needs on a tokio runtime — output lines on a channel and an awaitable
//! exit.
//!
//! [`stop_orphan`] stops a process a previous Arcane provably owned (see `records`).

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use arcane_process::{ExitInfo, StopStep};
use tokio::sync::{mpsc, watch};

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
    inner: arcane_process::Child,
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
        self.inner.signal(libc::SIGTERM);
        if let Ok(info) = tokio::time::timeout(grace, self.exited()).await {
            return (StopStep::Sigterm, info);
        }
        on_escalate();
        self.inner.signal(libc::SIGKILL);
        let info = self.exited().await;
        (StopStep::Sigkill, info)
    }
}

/// Spawns `spec` as an owned child (new process group, parent-death signal, kill-on-drop).
pub(crate) async fn spawn(spec: SpawnSpec) -> io::Result<Child> {
    let mut shared = arcane_process::Spec::new(&spec.program).args(&spec.args);
    shared.env = spec.env.iter().map(|(k, v)| (k.into(), v.into())).collect();
    shared.env_remove = spec.env_remove.iter().map(Into::into).collect();
    shared.cwd = spec.cwd.clone();
    shared.parent_death_signal = spec.parent_death_signal;
    let mut inner = tokio::task::spawn_blocking(move || arcane_process::spawn(shared))
        .await
        .map_err(|_| io::Error::other("the spawn task did not finish"))??;
    let (line_tx, lines) = mpsc::unbounded_channel();
    if let Some(stdout) = inner.stdout.take() {
        read_lines(stdout, Stream::Stdout, line_tx.clone());
    }
    if let Some(stderr) = inner.stderr.take() {
        read_lines(stderr, Stream::Stderr, line_tx);
    }
    let (exit_tx, exit) = watch::channel(None);
    inner.on_exit(move |info| {
        let _ = exit_tx.send(Some(info));
    });
    Ok(Child {
        pid: inner.pid(),
        start_time: inner.start_time(),
        exe: inner.exe().map(Path::to_path_buf),
        lines,
        exit: ExitWatch(exit),
        inner,
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

/// Stops a process that a previous Arcane provably owned (`records` checked the
/// proof): [`arcane_process::ownership::stop_orphan`], off the async threads.
pub(crate) async fn stop_orphan(pid: u32, start_time: u64, grace: Duration) -> StopStep {
    tokio::task::spawn_blocking(move || {
        arcane_process::ownership::stop_orphan(pid, start_time, grace)
    })
    .await
    .unwrap_or(StopStep::Sigkill)
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
        assert!(arcane_process::start_time(pid).is_some());
        let (step, _) = child.terminate(Duration::from_secs(5), || {}).await;
        assert_eq!(step, StopStep::Sigterm);
        assert_eq!(arcane_process::start_time(pid), None);
        // Idempotent.
        let (again, _) = child.terminate(Duration::from_secs(5), || {}).await;
        assert_eq!(again, StopStep::AlreadyExited);
    }
}
