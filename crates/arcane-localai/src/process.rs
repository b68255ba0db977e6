//! Owned engine processes, seen from async code: an adapter over `arcane-process`
//! (the one module that spawns, waits for and signals processes) that adds what the
//! supervisor needs on a tokio runtime — output lines on a channel and an awaitable
//! exit.
//!
//! # Output is bounded, and the engine waits rather than the host growing
//!
//! An engine's output is not Arcane's to trust: one line may be hundreds of megabytes
//! (a model dumping a tensor, a binary written to stdout), and a chatty engine may
//! print faster than the host files its lines. So:
//!
//! * **one line keeps at most [`MAX_LINE_BYTES`]** (64 KiB). The reader threads read
//!   the pipes in chunks of that size and never hold more than one line's worth; the
//!   bytes past the cap are read and discarded up to the newline, and the kept line
//!   ends with ` … [truncated: N bytes not kept]`, so a reader knows bytes were
//!   dropped and how many. 64 KiB is a sixteenth of the log book's default budget
//!   (1 MiB, `log_buffer`): one oversized line cannot push every other line out, and
//!   no real engine log line (llama.cpp's longest are its prompt dumps) comes near it.
//! * **the channel to the supervisor holds at most [`BATCHES_QUEUED`] batches** of
//!   lines (a batch is the lines of one read, at most [`BATCH_LINES`]: under 160 KiB,
//!   so under 1 MiB an engine). When it is full, the reader thread blocks, the pipe
//!   fills (64 KiB in the kernel) and the engine's next write waits: backpressure, as
//!   a terminal gives, instead of host memory that grows with the engine's output.
//!   Batches, not lines, so that a fast engine costs one wake-up per read, not one
//!   per line.
//! * **nobody listening never blocks the engine**: once the receiver is gone (the
//!   [`Child`] was dropped), the reader threads keep reading and discard what they
//!   read, so the pipe never fills; while [`Child::terminate`] waits for an exit it
//!   takes the lines in (keeping the last [`LINES_HELD_WHILE_STOPPING`]), so an engine
//!   that prints while it shuts down is not stalled into a SIGKILL.

use std::collections::{BTreeMap, VecDeque};
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
    /// The only CPUs it may run on.
    pub cpus: Option<arcane_process::CpuSet>,
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

/// The most bytes of one output line that are kept (see the module documentation);
/// the rest of the line is discarded and counted in a ` … [truncated: N bytes not
/// kept]` suffix.
pub(crate) const MAX_LINE_BYTES: usize = 64 * 1024;

/// How many batches of lines wait for the supervisor before the reader threads (and
/// then the engine) wait.
pub(crate) const BATCHES_QUEUED: usize = 4;

/// The most lines in one batch (the lines one read of [`MAX_LINE_BYTES`] completed).
pub(crate) const BATCH_LINES: usize = 256;

/// How many of the lines printed while [`Child::terminate`] waits are kept for the
/// supervisor; older ones are dropped, and a line says how many.
pub(crate) const LINES_HELD_WHILE_STOPPING: usize = 64;

/// The output lines of a child, in order: what the reader threads sent, after the
/// lines [`Child::terminate`] took in while it waited.
#[derive(Debug)]
pub(crate) struct Lines {
    receiver: mpsc::Receiver<Vec<OutputLine>>,
    /// Lines received and not yet given: the rest of a batch, and what
    /// [`Child::terminate`] took in.
    held: VecDeque<OutputLine>,
    /// Lines printed while stopping that did not fit in `held`.
    dropped: u64,
    /// Whether the reader threads may still send (both pipes not yet closed).
    open: bool,
}

impl Lines {
    fn new(receiver: mpsc::Receiver<Vec<OutputLine>>) -> Self {
        Self {
            receiver,
            held: VecDeque::new(),
            dropped: 0,
            open: true,
        }
    }

    /// The next line; `None` once both pipes closed and every line was taken.
    /// Cancel-safe (a `select!` branch loses no line).
    pub async fn recv(&mut self) -> Option<OutputLine> {
        if self.dropped > 0 {
            let dropped = std::mem::take(&mut self.dropped);
            return Some(OutputLine {
                stream: Stream::Stderr,
                line: format!(
                    "[arcane: {dropped} earlier lines printed while stopping were not kept]"
                ),
            });
        }
        if let Some(line) = self.held.pop_front() {
            return Some(line);
        }
        let batch = self.receiver.recv().await?;
        self.held.extend(batch);
        self.held.pop_front()
    }

    /// Takes in a batch while nobody else reads (during a stop), keeping the last
    /// [`LINES_HELD_WHILE_STOPPING`] lines.
    fn hold(&mut self, batch: Vec<OutputLine>) {
        self.held.extend(batch);
        while self.held.len() > LINES_HELD_WHILE_STOPPING {
            self.held.pop_front();
            self.dropped += 1;
        }
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
    /// Its output lines (bounded: see the module documentation).
    pub lines: Lines,
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

    /// Waits up to `limit` (forever when `None`) for the leader's exit, taking in the
    /// output lines meanwhile so that an engine printing while it stops never waits
    /// on a full pipe; `None` when `limit` passed first.
    async fn exited_reading(&mut self, limit: Option<Duration>) -> Option<ExitInfo> {
        let deadline = limit.map(|limit| tokio::time::Instant::now() + limit);
        let expired = async move {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expired);
        loop {
            tokio::select! {
                biased;
                info = self.exit.exited() => return Some(info),
                batch = self.lines.receiver.recv(), if self.lines.open => match batch {
                    Some(batch) => self.lines.hold(batch),
                    None => self.lines.open = false,
                },
                () = &mut expired => return None,
            }
        }
    }

    /// SIGKILL to the group at once, then waits for the exit: for a child that acts on
    /// no SIGTERM (stopped, hung). Idempotent.
    pub async fn kill(&mut self) -> (StopStep, ExitInfo) {
        if let Some(info) = self.exit_status() {
            return (StopStep::AlreadyExited, info);
        }
        self.inner.signal(libc::SIGKILL);
        (StopStep::Sigkill, self.exited().await)
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
        if let Some(info) = self.exited_reading(Some(grace)).await {
            return (StopStep::Sigterm, info);
        }
        on_escalate();
        self.inner.signal(libc::SIGKILL);
        let info = match self.exited_reading(None).await {
            Some(info) => info,
            None => self.exited().await,
        };
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
    shared.cpus = spec.cpus.clone();
    let mut inner = tokio::task::spawn_blocking(move || arcane_process::spawn(shared))
        .await
        .map_err(|_| io::Error::other("the spawn task did not finish"))??;
    let (line_tx, lines) = mpsc::channel(BATCHES_QUEUED);
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
        lines: Lines::new(lines),
        exit: ExitWatch(exit),
        inner,
    })
}

/// Reads `stream` in chunks of [`MAX_LINE_BYTES`] on a thread of its own and sends
/// the non-blank lines each read completes, capped, as one batch (see the module
/// documentation); blocks while the channel is full, and once the receiver is gone
/// reads on and discards, so the engine never waits on a pipe nobody empties.
fn read_lines(
    stream: impl Read + Send + 'static,
    which: Stream,
    sender: mpsc::Sender<Vec<OutputLine>>,
) {
    let _ = std::thread::Builder::new()
        .name(format!("arcane-{}", which.name()))
        .spawn(move || {
            let mut reader = BufReader::with_capacity(MAX_LINE_BYTES, stream);
            let mut splitter = LineSplitter::new(MAX_LINE_BYTES);
            let mut batcher = Batcher {
                sender,
                which,
                batch: Vec::new(),
                listening: true,
            };
            loop {
                let chunk = match reader.fill_buf() {
                    Ok([]) => break,
                    Ok(chunk) => chunk,
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                let read = chunk.len();
                splitter.push(chunk, &mut |line| batcher.line(line));
                reader.consume(read);
                // What one read completed goes now: a line is never held back.
                batcher.flush();
            }
            splitter.finish(&mut |line| batcher.line(line));
            batcher.flush();
        });
}

/// Gathers one read's lines into a batch and sends it.
struct Batcher {
    sender: mpsc::Sender<Vec<OutputLine>>,
    which: Stream,
    batch: Vec<OutputLine>,
    listening: bool,
}

impl Batcher {
    fn line(&mut self, line: String) {
        self.batch.push(OutputLine {
            stream: self.which,
            line,
        });
        if self.batch.len() == BATCH_LINES {
            self.flush();
        }
    }

    fn flush(&mut self) {
        let batch = std::mem::take(&mut self.batch);
        // `blocking_send` waits while the channel is full (backpressure); an error
        // means nobody listens any more: keep draining the pipe, discarding.
        if !batch.is_empty() && self.listening && self.sender.blocking_send(batch).is_err() {
            self.listening = false;
        }
    }
}

/// Splits bytes into lines, keeping at most `max` bytes of each (cut on a character
/// boundary) and counting the rest; holds at most `max` bytes at any time.
#[derive(Debug)]
struct LineSplitter {
    kept: Vec<u8>,
    dropped: usize,
    max: usize,
}

impl LineSplitter {
    fn new(max: usize) -> Self {
        Self {
            kept: Vec::new(),
            dropped: 0,
            max,
        }
    }

    /// Takes in `bytes`; `emit` gets each line they complete.
    fn push(&mut self, mut bytes: &[u8], emit: &mut impl FnMut(String)) {
        while let Some(end) = bytes.iter().position(|&b| b == b'\n') {
            self.take(&bytes[..end]);
            if let Some(line) = self.end_line() {
                emit(line);
            }
            bytes = &bytes[end + 1..];
        }
        self.take(bytes);
    }

    /// The last line, when the stream ended without a newline.
    fn finish(&mut self, emit: &mut impl FnMut(String)) {
        if let Some(line) = self.end_line() {
            emit(line);
        }
    }

    fn take(&mut self, part: &[u8]) {
        let room = self.max.saturating_sub(self.kept.len()).min(part.len());
        self.kept.extend_from_slice(&part[..room]);
        self.dropped += part.len() - room;
    }

    /// The line taken in so far (`None` when blank), and a fresh start.
    fn end_line(&mut self) -> Option<String> {
        let mut dropped = std::mem::take(&mut self.dropped);
        if dropped > 0 {
            // Cut where the last whole character ends, not inside one.
            if let Err(error) = std::str::from_utf8(&self.kept) {
                if error.error_len().is_none() {
                    dropped += self.kept.len() - error.valid_up_to();
                    self.kept.truncate(error.valid_up_to());
                }
            }
        }
        let text = String::from_utf8_lossy(&self.kept);
        let text = text.trim_end_matches('\r');
        let line = if dropped > 0 {
            Some(format!("{text} … [truncated: {dropped} bytes not kept]"))
        } else if text.trim().is_empty() {
            None
        } else {
            Some(text.to_string())
        };
        self.kept.clear();
        if self.kept.capacity() > self.max {
            self.kept.shrink_to(self.max);
        }
        line
    }
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
            cpus: None,
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

    fn shell(script: &str) -> SpawnSpec {
        SpawnSpec {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            env: BTreeMap::new(),
            env_remove: vec![],
            cwd: None,
            parent_death_signal: true,
            cpus: None,
        }
    }

    /// A bounded wait for `what`, never a timing assertion.
    const WITHIN: Duration = Duration::from_secs(60);

    async fn next(child: &mut Child) -> OutputLine {
        tokio::time::timeout(WITHIN, child.lines.recv())
            .await
            .expect("a line within a minute")
            .expect("a line before the pipes closed")
    }

    fn split(max: usize, pieces: &[&[u8]]) -> Vec<String> {
        let mut splitter = LineSplitter::new(max);
        let mut lines = Vec::new();
        for piece in pieces {
            splitter.push(piece, &mut |line| lines.push(line));
            assert!(splitter.kept.len() <= max, "never holds more than the cap");
        }
        splitter.finish(&mut |line| lines.push(line));
        lines
    }

    #[test]
    fn a_line_over_the_cap_is_cut_says_so_and_the_next_lines_are_whole() {
        assert_eq!(
            split(
                8,
                &[b"short\r\n", b"0123456789abcdef\nnext\n", b"\n  \nlast"]
            ),
            [
                "short",
                "01234567 … [truncated: 8 bytes not kept]",
                "next",
                "last"
            ]
        );
        // The cut falls across reads: what was dropped in each read is counted.
        assert_eq!(
            split(4, &[b"abc", b"defg", b"hij\nok\n"]),
            ["abcd … [truncated: 6 bytes not kept]", "ok"]
        );
        // Never inside a character: `é` is two bytes, the cap falls between them.
        assert_eq!(
            split(4, &["abcé!\n".as_bytes()]),
            ["abc … [truncated: 3 bytes not kept]"]
        );
    }

    #[tokio::test]
    async fn a_child_printing_a_line_over_the_cap_gives_one_cut_line_and_the_next_intact() {
        let huge = 3 * MAX_LINE_BYTES + 17;
        let mut child = spawn(shell(&format!(
            "head -c {huge} /dev/zero | tr '\\0' x; echo; echo after; echo end >&2"
        )))
        .await
        .unwrap();
        // The streams are read apart; each keeps its order.
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        for _ in 0..3 {
            let line = next(&mut child).await;
            match line.stream {
                Stream::Stdout => stdout.push(line.line),
                Stream::Stderr => stderr.push(line.line),
            }
        }
        assert_eq!(stderr, ["end"]);
        assert_eq!(stdout.len(), 2, "{stdout:?}");
        let suffix = format!(" … [truncated: {} bytes not kept]", huge - MAX_LINE_BYTES);
        assert!(
            stdout[0].ends_with(&suffix),
            "{}",
            &stdout[0][MAX_LINE_BYTES..]
        );
        assert_eq!(stdout[0].len(), MAX_LINE_BYTES + suffix.len());
        assert!(stdout[0][..MAX_LINE_BYTES].bytes().all(|b| b == b'x'));
        assert_eq!(stdout[1], "after");
    }

    /// What `/proc/<pid>/wchan` says the process waits in (`anon_pipe_write`, …).
    fn waits_in(pid: u32) -> String {
        std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default()
    }

    #[tokio::test]
    async fn an_engine_printing_faster_than_it_is_read_waits_and_loses_nothing() {
        const COUNT: u32 = 200_000;
        let mut child = spawn(shell(&format!("seq 1 {COUNT}; exec sleep 60")))
            .await
            .unwrap();
        let pid = child.pid;
        // Nobody reads: the channel fills, then the pipe, and `seq` waits in its write
        // (with an unbounded channel it would finish and the host would hold every line).
        let deadline = std::time::Instant::now() + WITHIN;
        loop {
            let writing = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .any(|p| waits_in(p).contains("pipe_write"));
            if writing && child.lines.receiver.len() >= BATCHES_QUEUED {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "`seq` never waited on the full pipe"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // What waits in the host is the channel's capacity, not the engine's output.
        assert_eq!(child.lines.receiver.len(), BATCHES_QUEUED);
        // Reading resumes the engine, and every line arrives, in order.
        for n in 1..=COUNT {
            assert_eq!(next(&mut child).await.line, n.to_string());
        }
        let (step, _) = child.terminate(Duration::from_secs(5), || {}).await;
        assert_eq!(step, StopStep::Sigterm);
    }

    #[tokio::test]
    async fn a_dropped_receiver_never_blocks_the_engine() {
        let mut child = spawn(shell("seq 1 200000; echo done >&2")).await.unwrap();
        // Nobody listens any more: the readers drain and discard, so `seq` finishes.
        child.lines = Lines::new(mpsc::channel(1).1);
        let exit = tokio::time::timeout(WITHIN, child.exited())
            .await
            .expect("the engine exits although nobody reads its output");
        assert_eq!(exit.code, Some(0));
    }

    #[tokio::test]
    async fn an_engine_that_prints_while_it_stops_is_not_stalled_into_a_sigkill() {
        let mut child = spawn(shell(
            "trap 'seq 1 200000; echo bye; exit 0' TERM; echo up; while :; do sleep 1; done",
        ))
        .await
        .unwrap();
        assert_eq!(next(&mut child).await.line, "up");
        let (step, exit) = child.terminate(WITHIN, || {}).await;
        assert_eq!(step, StopStep::Sigterm);
        assert_eq!(exit.code, Some(0));
        // What it printed while stopping: a line saying how many lines were dropped,
        // then the last ones, ending with its farewell.
        let mut seen = Vec::new();
        while let Ok(Some(line)) =
            tokio::time::timeout(Duration::from_secs(5), child.lines.recv()).await
        {
            seen.push(line.line);
        }
        assert!(seen[0].contains("earlier lines printed while stopping were not kept"));
        assert_eq!(seen.last().map(String::as_str), Some("bye"));
        // Bounded: the held lines, the channel and what the kernel's pipe still held.
        assert!(seen.len() < 20_000, "{} lines kept", seen.len());
    }
}
