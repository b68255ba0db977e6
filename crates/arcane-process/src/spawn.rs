//! [`spawn`] and the [`Child`] it returns: the only code that forks, waits for and
//! signals Arcane's children (see the crate documentation for the guarantees).

// This module is where processes are started (`Command::new`) and their groups
// signalled (`killpg`): clippy.toml fences both everywhere else.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Where one of the child's standard streams goes.
#[derive(Debug, Clone)]
pub enum StdioMode {
    /// `/dev/null`.
    Null,
    /// The parent's own stream.
    Inherit,
    /// A pipe the caller reads or writes ([`Child::stdout`] and friends).
    Piped,
    /// An open file (a log).
    File(Arc<std::fs::File>),
}

impl StdioMode {
    fn stdio(&self) -> io::Result<Stdio> {
        Ok(match self {
            StdioMode::Null => Stdio::null(),
            StdioMode::Inherit => Stdio::inherit(),
            StdioMode::Piped => Stdio::piped(),
            StdioMode::File(file) => Stdio::from(file.try_clone()?),
        })
    }
}

/// What to run and how.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The executable.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Variables set on top of the inherited environment.
    pub env: BTreeMap<OsString, OsString>,
    /// Inherited variables removed first.
    pub env_remove: Vec<OsString>,
    /// The working directory (default: the parent's).
    pub cwd: Option<PathBuf>,
    /// Standard input (default: `/dev/null`).
    pub stdin: StdioMode,
    /// Standard output (default: piped).
    pub stdout: StdioMode,
    /// Standard error (default: piped).
    pub stderr: StdioMode,
    /// Arm the parent-death signal (default: yes; only tests that simulate an orphan
    /// turn it off).
    pub parent_death_signal: bool,
    /// Descriptors the child inherits (their close-on-exec flag is cleared in the child
    /// only). Each must stay open in the parent until [`spawn`] returns.
    pub keep_fds: Vec<RawFd>,
    /// When standard input is the controlling terminal and this process is in its
    /// foreground group, make the child's group the foreground group (as a shell does
    /// for a job), so it reads the terminal and gets the terminal's Ctrl-C itself;
    /// [`Child::wait`] and friends give the terminal back.
    pub foreground: bool,
    /// The only CPUs the child (and every thread it starts) may run on (default: those
    /// of this process).
    pub cpus: Option<crate::CpuSet>,
}

impl Spec {
    /// Runs `program` with stdin from `/dev/null`, stdout and stderr piped, the
    /// parent-death signal armed, no descriptors passed and no terminal.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            env_remove: Vec::new(),
            cwd: None,
            stdin: StdioMode::Null,
            stdout: StdioMode::Piped,
            stderr: StdioMode::Piped,
            parent_death_signal: true,
            keep_fds: Vec::new(),
            foreground: false,
            cpus: None,
        }
    }

    /// Appends arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets one environment variable.
    pub fn env(mut self, name: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Inherits all three standard streams (a command a person watches).
    pub fn inherit_stdio(mut self) -> Self {
        self.stdin = StdioMode::Inherit;
        self.stdout = StdioMode::Inherit;
        self.stderr = StdioMode::Inherit;
        self
    }
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
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

    /// The shell's convention: the code, or 128 + the signal.
    pub fn shell_code(&self) -> u8 {
        match (self.code, self.signal) {
            (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
            (None, Some(signal)) => u8::try_from(128 + (signal & 0x7f)).unwrap_or(1),
            (None, None) => 1,
        }
    }
}

/// Which step of a stop ended the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
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

impl StopStep {
    /// The kebab-case name used in events.
    pub fn name(self) -> &'static str {
        match self {
            StopStep::AlreadyExited => "already-exited",
            StopStep::Sigterm => "sigterm",
            StopStep::Sigkill => "sigkill",
            StopStep::Released => "released",
        }
    }
}

/// The process group of a child; signals go through here only.
#[derive(Debug)]
struct Group {
    pgid: libc::pid_t,
    /// Set (under the lock) once the leader is reaped; no signal is sent after that.
    reaped: Mutex<bool>,
}

impl Group {
    /// Signals the whole group unless the leader has been reaped.
    fn signal(&self, signal: libc::c_int) -> bool {
        let reaped = self.reaped.lock().unwrap_or_else(|e| e.into_inner());
        if *reaped {
            return false;
        }
        // SAFETY: killpg has no memory-safety preconditions. The leader is not reaped
        // (checked under the lock the waiter holds while reaping), so `pgid` still names
        // our child's group and cannot belong to a stranger.
        unsafe { libc::killpg(self.pgid, signal) == 0 }
    }
}

type ExitHook = Box<dyn FnOnce(ExitInfo) + Send>;

/// The leader's exit, shared between the waiter thread and the [`Child`].
#[derive(Default)]
struct ExitSlot {
    state: Mutex<(Option<ExitInfo>, Vec<ExitHook>)>,
    changed: Condvar,
}

impl ExitSlot {
    fn set(&self, info: ExitInfo) {
        let hooks = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.0 = Some(info);
            std::mem::take(&mut state.1)
        };
        self.changed.notify_all();
        for hook in hooks {
            hook(info);
        }
    }

    fn get(&self) -> Option<ExitInfo> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    fn wait(&self, deadline: Option<Instant>) -> Option<ExitInfo> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(info) = state.0 {
                return Some(info);
            }
            state = match deadline {
                None => self.changed.wait(state).unwrap_or_else(|e| e.into_inner()),
                Some(deadline) => {
                    let left = deadline.checked_duration_since(Instant::now())?;
                    self.changed
                        .wait_timeout(state, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }
}

impl std::fmt::Debug for ExitSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExitSlot")
            .field("exit", &self.get())
            .finish()
    }
}

/// A running child. Dropping it before it exited kills its process group.
#[derive(Debug)]
#[must_use = "dropping a Child kills it"]
pub struct Child {
    pid: u32,
    start_time: Option<u64>,
    exe: Option<PathBuf>,
    /// Its standard input, when piped.
    pub stdin: Option<ChildStdin>,
    /// Its standard output, when piped.
    pub stdout: Option<ChildStdout>,
    /// Its standard error, when piped.
    pub stderr: Option<ChildStderr>,
    group: Arc<Group>,
    exit: Arc<ExitSlot>,
    terminal: Option<Terminal>,
}

impl Child {
    /// The child's pid (also its process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its start time in clock ticks since boot, read right after the spawn.
    pub fn start_time(&self) -> Option<u64> {
        self.start_time
    }

    /// What `/proc/<pid>/exe` resolved to right after the spawn.
    pub fn exe(&self) -> Option<&std::path::Path> {
        self.exe.as_deref()
    }

    /// The exit status, once the leader has exited and been reaped.
    pub fn exit_status(&self) -> Option<ExitInfo> {
        self.exit.get()
    }

    /// Runs `hook` with the exit status once the leader has been reaped (at once when it
    /// already was). Hooks run on the waiter thread and must not block.
    pub fn on_exit(&self, hook: impl FnOnce(ExitInfo) + Send + 'static) {
        let mut state = self.exit.state.lock().unwrap_or_else(|e| e.into_inner());
        match state.0 {
            Some(info) => {
                drop(state);
                hook(info);
            }
            None => state.1.push(Box::new(hook)),
        }
    }

    /// Waits for the leader's exit; gives the terminal back if the child had it.
    pub fn wait(&mut self) -> ExitInfo {
        let info = self.exit.wait(None).unwrap_or(ExitInfo {
            code: None,
            signal: None,
        });
        self.restore_terminal();
        info
    }

    /// Waits up to `timeout` for the leader's exit.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitInfo> {
        let info = self.exit.wait(Some(Instant::now() + timeout))?;
        self.restore_terminal();
        Some(info)
    }

    /// Signals the child's whole group unless it has been reaped. Returns whether the
    /// signal was sent.
    pub fn signal(&self, signal: libc::c_int) -> bool {
        self.group.signal(signal)
    }

    /// SIGTERM to the group; after `grace`, SIGKILL; waits for the exit. Idempotent.
    pub fn terminate(&mut self, grace: Duration) -> (StopStep, ExitInfo) {
        if let Some(info) = self.exit_status() {
            return (StopStep::AlreadyExited, info);
        }
        self.signal(libc::SIGTERM);
        if let Some(info) = self.wait_timeout(grace) {
            return (StopStep::Sigterm, info);
        }
        self.signal(libc::SIGKILL);
        (StopStep::Sigkill, self.wait())
    }

    fn restore_terminal(&mut self) {
        if let Some(terminal) = self.terminal.take() {
            terminal.restore();
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.group.signal(libc::SIGKILL);
        self.restore_terminal();
    }
}

/// The terminal handed to a foreground child, and the group to give it back to.
#[derive(Debug)]
struct Terminal {
    own_group: libc::pid_t,
}

impl Terminal {
    /// Gives the terminal to `child_group` when stdin is our controlling terminal and we
    /// are its foreground group.
    fn hand_over(child_group: libc::pid_t) -> Option<Terminal> {
        // SAFETY: plain syscalls on descriptor 0; no memory is passed.
        unsafe {
            if libc::isatty(0) != 1 || libc::tcgetpgrp(0) != libc::getpgrp() {
                return None;
            }
            let own_group = libc::getpgrp();
            set_foreground(child_group);
            Some(Terminal { own_group })
        }
    }

    fn restore(self) {
        set_foreground(self.own_group);
    }
}

/// `tcsetpgrp(0, group)` with SIGTTOU blocked in this thread (a background group
/// taking the terminal back would otherwise be stopped; termios(3)).
fn set_foreground(group: libc::pid_t) {
    // SAFETY: the sigset is a plain C struct initialised by sigemptyset; the calls only
    // change this thread's signal mask and the terminal's foreground group.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
        libc::tcsetpgrp(0, group);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

/// Every group spawned here and not yet dropped, for [`kill_all_now`].
fn live_groups() -> &'static Mutex<Vec<std::sync::Weak<Group>>> {
    static LIVE: OnceLock<Mutex<Vec<std::sync::Weak<Group>>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(Vec::new()))
}

/// SIGKILLs every child group spawned here that is not yet reaped, through the same
/// reap-before-signal rule, and returns how many were signalled: for a process about to
/// exit at once (a second Ctrl-C/SIGTERM), so no child outlives it even where the
/// parent-death signal is not available. Safe from any thread.
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

type SpawnReply = mpsc::Sender<io::Result<std::process::Child>>;

/// The long-lived thread every child is forked from (see the crate documentation).
fn spawner() -> &'static Mutex<mpsc::Sender<(Spec, SpawnReply)>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<(Spec, SpawnReply)>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<(Spec, SpawnReply)>();
        let _ = std::thread::Builder::new()
            .name("arcane-spawner".into())
            .spawn(move || {
                // Lives until the process exits: its exit would fire the children's
                // parent-death signal.
                while let Ok((spec, reply)) = receiver.recv() {
                    let _ = reply.send(fork_exec(&spec));
                }
                loop {
                    std::thread::park();
                }
            });
        Mutex::new(sender)
    })
}

fn fork_exec(spec: &Spec) -> io::Result<std::process::Child> {
    let mut command = Command::new(&spec.program);
    command
        .args(&spec.args)
        .stdin(spec.stdin.stdio()?)
        .stdout(spec.stdout.stdio()?)
        .stderr(spec.stderr.stdio()?)
        .process_group(0);
    for name in &spec.env_remove {
        command.env_remove(name);
    }
    command.envs(&spec.env);
    if let Some(cwd) = &spec.cwd {
        command.current_dir(cwd);
    }
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    let keep = spec.keep_fds.clone();
    let pdeathsig = spec.parent_death_signal;
    let foreground = spec.foreground;
    let cpus = spec.cpus.as_ref().map(crate::CpuSet::raw);
    // SAFETY: the closure runs in the forked child before exec (after `setpgid`) and
    // calls only async-signal-safe functions (prctl, getppid, fcntl, isatty, tcgetpgrp,
    // sigprocmask, tcsetpgrp, getpid, sched_setaffinity); it allocates nothing (`keep`
    // and `cpus` were made before the fork).
    unsafe {
        command.pre_exec(move || {
            child_setup(parent, pdeathsig, &keep, foreground)?;
            match &cpus {
                Some(set) => keep_to_cpus(set),
                None => Ok(()),
            }
        });
    }
    command.spawn()
}

/// Runs in the child between fork and exec; see `fork_exec`.
/// Keeps the calling process (in the child, before `exec`) to `set`.
fn keep_to_cpus(set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: sched_setaffinity(2) on the calling process with a set of its own size.
    let result = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn child_setup(
    parent: libc::pid_t,
    pdeathsig: bool,
    keep: &[RawFd],
    foreground: bool,
) -> io::Result<()> {
    // SAFETY (whole body): async-signal-safe syscalls on our own process.
    unsafe {
        #[cfg(target_os = "linux")]
        if pdeathsig {
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
            // The parent may have died between fork and prctl; then nobody would ever
            // send the signal (prctl(2)), so refuse to run.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
        }
        for &fd in keep {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // The parent does the same right after the spawn; whichever runs first wins
        // the race harmlessly (as job-control shells do).
        if foreground && libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgid(parent) {
            let mut block: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut block);
            libc::sigaddset(&mut block, libc::SIGTTOU);
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigprocmask(libc::SIG_BLOCK, &block, &mut old);
            libc::tcsetpgrp(0, libc::getpid());
            libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
    }
    Ok(())
}

/// Spawns `spec` in a new process group, with the parent-death signal armed (unless
/// turned off) and a waiter thread that reaps it; see the crate documentation.
pub fn spawn(spec: Spec) -> io::Result<Child> {
    let foreground = spec.foreground;
    let (reply, answer) = mpsc::channel();
    spawner()
        .lock()
        .map_err(|_| io::Error::other("the spawner thread is unavailable"))?
        .send((spec, reply))
        .map_err(|_| io::Error::other("the spawner thread is unavailable"))?;
    let mut child = answer
        .recv()
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
    let terminal = if foreground {
        Terminal::hand_over(pid as libc::pid_t)
    } else {
        None
    };
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let exit = Arc::new(ExitSlot::default());
    let (waiter_group, waiter_exit) = (group.clone(), exit.clone());
    std::thread::Builder::new()
        .name(format!("arcane-wait-{pid}"))
        .spawn(move || wait_and_reap(child, &waiter_group, &waiter_exit))?;
    Ok(Child {
        pid,
        start_time: crate::start_time(pid),
        exe: crate::exe(pid),
        stdin,
        stdout,
        stderr,
        group,
        exit,
        terminal,
    })
}

/// Waits for the leader without reaping it, clears what it left in its group while the
/// zombie still pins the group id, then reaps it.
fn wait_and_reap(mut child: std::process::Child, group: &Group, exit: &ExitSlot) {
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
        // this clears any process the child left behind in its group.
        unsafe {
            libc::killpg(group.pgid, libc::SIGKILL);
        }
        let status = child.wait();
        *reaped = true;
        status
    };
    exit.set(match status {
        Ok(status) => ExitInfo {
            code: status.code(),
            signal: status.signal(),
        },
        Err(_) => ExitInfo {
            code: None,
            signal: None,
        },
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Spec {
        Spec::new("/bin/sh").args(["-c", script])
    }

    /// Reads one line of the child's stdout (blocking: the script prints it at once).
    fn first_line(child: &mut Child) -> String {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        line.trim().to_string()
    }

    /// Polls every 10 ms until `condition` holds; panics naming `what` after 30 s.
    fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !condition() {
            assert!(std::time::Instant::now() < deadline, "timed out: {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn terminate_stops_a_group_and_reports_sigterm() {
        // The shell prints its background `sleep`'s pid: a grandchild in the group.
        let mut child = spawn(sh("sleep 600 & echo $!; wait")).unwrap();
        let pid = child.pid();
        let grandchild: u32 = first_line(&mut child).parse().unwrap();
        let born = crate::start_time(grandchild).expect("the grandchild runs");
        assert!(crate::start_time(pid).is_some());
        let (step, _) = child.terminate(Duration::from_secs(5));
        assert_eq!(step, StopStep::Sigterm);
        assert_eq!(crate::start_time(pid), None);
        // The signal went to the whole group: the grandchild dies too (reaped by init
        // once its shell is gone). A pid reused meanwhile has another start time.
        wait_until("the grandchild dies with its group", || {
            crate::start_time(grandchild) != Some(born)
        });
        let (again, _) = child.terminate(Duration::from_secs(5));
        assert_eq!(again, StopStep::AlreadyExited);
        assert!(!child.signal(libc::SIGKILL), "no signal after the reap");
    }

    #[test]
    fn a_child_that_ignores_sigterm_is_killed_after_the_grace() {
        let mut child = spawn(sh(
            "trap '' TERM; echo trapped; while :; do sleep 0.05; done",
        ))
        .unwrap();
        // The shell says so once its trap is installed.
        assert_eq!(first_line(&mut child), "trapped");
        let (step, info) = child.terminate(Duration::from_millis(300));
        assert_eq!(step, StopStep::Sigkill);
        assert_eq!(info.signal, Some(libc::SIGKILL));
    }

    #[test]
    fn kept_descriptors_cross_exec_and_others_do_not() {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let kept = std::fs::File::open("/dev/null").unwrap();
        let other = std::fs::File::open("/dev/null").unwrap();
        let script = format!(
            "[ -e /proc/self/fd/{} ] && echo kept; [ -e /proc/self/fd/{} ] && echo leaked; true",
            kept.as_raw_fd(),
            other.as_raw_fd()
        );
        let mut spec = sh(&script);
        spec.keep_fds = vec![kept.as_raw_fd()];
        let mut child = spawn(spec).unwrap();
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert!(child.wait().success());
        assert_eq!(out.trim(), "kept");
    }

    #[test]
    fn exit_hooks_run_once_with_the_status() {
        let child = spawn(sh("exit 7")).unwrap();
        let (sender, receiver) = mpsc::channel();
        child.on_exit(move |info| sender.send(info).unwrap());
        let info = receiver.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(info.code, Some(7));
        assert_eq!(info.shell_code(), 7);
        // Registered after the exit: runs at once.
        let (sender, receiver) = mpsc::channel();
        child.on_exit(move |info| sender.send(info).unwrap());
        assert_eq!(receiver.recv().unwrap().code, Some(7));
    }
}
