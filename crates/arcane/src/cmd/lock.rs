//! `arcane lock`: hold the workspace operation lock around a command, inspect it, or
//! recover a stale one. The rules live in `arcane-lock`; this module parses, calls and
//! renders.

use std::ffi::OsString;
use std::time::{Duration, Instant};

use arcane_lock::{AcquireOptions, LockStatus, RecoverOptions, Recovered, WorkspaceLock};
use arcane_report::{codes, Event};
use serde_json::{json, Value};

use crate::config::Context;
use crate::error::{CliError, CommandError};

/// Arguments of `arcane lock`.
///
/// The lock is `.arcane/workspace-operation.lock` (an advisory `flock` held for the
/// whole operation) plus the record `.arcane/workspace-operation.lock.json` naming the
/// holder. A lock whose holder died (even by `kill -9`) is recovered by the next
/// acquirer at once; a lock from another host never is.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: LockCommand,
}

#[derive(Debug, clap::Subcommand)]
enum LockCommand {
    /// Hold the workspace lock while CMD runs, then release it; exits with CMD's exit
    /// code. A busy workspace exits 75 (`ARCANE_WORKSPACE_BUSY`) unless `--wait` is given.
    ///
    /// CMD inherits the lease (the locked descriptor and `ARCANE_WORKSPACE_LEASE`), so
    /// Arcane commands it runs on the same workspace proceed at once instead of waiting
    /// for it, and the lock stays held for as long as CMD, or anything it leaves behind,
    /// lives. CMD runs in its own process group (the terminal's foreground group, so it
    /// gets Ctrl-C itself) and dies with `arcane lock run`, even after `kill -9`.
    ///
    /// Example: `arcane --workspace ~/w lock run --operation model.add --wait 30s -- cp a b`
    Run(RunArgs),
    /// Show whether the workspace lock is free, held (pid, host, operation, since,
    /// alive) or stale. Creates nothing.
    Status,
    /// Remove the lock record only when its owner is provably gone; otherwise say why
    /// not and exit non-zero (75).
    Recover(RecoverArgs),
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The operation's name, recorded in the lock (`[a-z0-9][a-z0-9._-]*`).
    #[arg(long, value_name = "NAME")]
    operation: String,

    /// Wait up to DURATION for a busy workspace (`500ms`, `30s`, `2m`, `1h`; a bare
    /// number is seconds) instead of failing at once. Ctrl-C stops the wait.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    wait: Option<Duration>,

    /// The command to run while holding the lock, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

#[derive(Debug, clap::Args)]
struct RecoverArgs {
    /// Also move an unreadable, empty, oversized or other-workspace record aside (kept as
    /// `.arcane/workspace-operation.lock.json.quarantined-*`) when no Arcane process holds
    /// the lock. Such a record may belong to a JavaScript SDK process that is starting.
    #[arg(long)]
    quarantine_unreadable: bool,

    /// Also break a lock taken on the host HOST. Only do this when you know that host no
    /// longer uses this workspace.
    #[arg(long, value_name = "HOST")]
    break_foreign_host: Option<String>,
}

impl Args {
    /// Whether this needs an existing workspace (`status`, `recover`); `run` creates one.
    pub fn needs_existing_workspace(&self) -> bool {
        !matches!(self.command, LockCommand::Run(_))
    }
}

/// Runs `arcane lock`.
pub fn run(context: &Context, args: Args) -> Result<u8, CliError> {
    match args.command {
        LockCommand::Run(run) => run_command(context, run),
        LockCommand::Status => status(context),
        LockCommand::Recover(recover) => recover_command(context, recover),
    }
}

/// Parses `500ms`, `30s`, `2m`, `1h` or a bare number of seconds (the one reading of
/// a duration, [`arcane_core::duration::parse`]), at most a week.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = arcane_core::duration::parse(text)?;
    if duration > Duration::from_secs(604_800) {
        return Err(format!(
            "`{}` is out of range (at most a week)",
            text.trim()
        ));
    }
    Ok(duration)
}

fn run_command(context: &Context, args: RunArgs) -> Result<u8, CliError> {
    let mut options = AcquireOptions::new(&args.operation)?.cancel(context.cancel.clone());
    if let Some(wait) = args.wait {
        options = options.wait(wait);
    }
    let Some((program, rest)) = args.command.split_first() else {
        return Err(CommandError::usage("no command to run after `--`", json!({})).into());
    };
    crate::cmd::ensure_workspace(context)?;
    let lock = WorkspaceLock::acquire(&context.workspace, &options, &context.output)
        .map_err(|error| wait_hint(error, args.wait.is_some()))?;
    let mut child = match spawn_under(&lock, program, rest) {
        Ok(child) => child,
        Err(error) => {
            let _ = lock.release_with_events(&context.output);
            return Err(error.into());
        }
    };
    let compromised = supervise(context, &lock, &mut child).err();
    let exit = child.wait().shell_code();
    let released = lock.release_with_events(&context.output);
    if let Some(error) = compromised {
        if let Err(release_error) = released {
            context.output.note(&format!("warning: {release_error}"));
        }
        return Err(error.into());
    }
    match released {
        Ok(()) => {}
        Err(error) if exit == 0 => return Err(error.into()),
        Err(error) => context.output.note(&format!(
            "warning: releasing the workspace lock failed: {error}"
        )),
    }
    context.output.result(
        "",
        &json!({
            "workspace": lock_workspace(context),
            "operation": args.operation,
            "exitCode": exit,
        }),
    );
    Ok(exit)
}

/// A busy workspace gets the hint about `--wait`, which this command has (the lock
/// library's own hints name no flag).
fn wait_hint(error: arcane_lock::Error, waited: bool) -> CliError {
    let busy = error.is_busy();
    let error = CliError::from(error);
    match (busy, waited) {
        (false, _) => error,
        (true, false) => error.with_hint("pass `--wait 30s` to wait for the holder"),
        (true, true) => error.with_hint("pass a longer `--wait`"),
    }
}

/// Starts the command tied to the lease: it inherits the locked descriptor (so the lock
/// stays held while it, or anything it leaves behind, lives, and nested Arcane
/// operations run at once), runs in its own process group (the terminal's foreground
/// group when we have one), and dies with us (parent-death signal).
fn spawn_under(
    lock: &WorkspaceLock,
    program: &OsString,
    rest: &[OsString],
) -> Result<arcane_process::Child, CommandError> {
    let mut spec = arcane_process::Spec::new(program)
        .args(rest)
        .inherit_stdio();
    spec.foreground = true;
    if let Some(inheritance) = lock.inheritance() {
        spec.keep_fds.push(inheritance.fd);
        spec.env
            .insert(inheritance.variable.into(), inheritance.value.into());
    }
    arcane_process::spawn(spec).map_err(|error| {
        let code = if error.kind() == std::io::ErrorKind::NotFound {
            codes::ARCANE_PREREQUISITE_MISSING
        } else {
            codes::ARCANE_OPERATION_FAILED
        };
        CommandError::new(
            code,
            format!("cannot run `{}`", program.to_string_lossy()),
            json!({"command": program.to_string_lossy()}),
        )
        .caused_by(error)
    })
}

fn lock_workspace(context: &Context) -> Value {
    json!(std::fs::canonicalize(&context.workspace).unwrap_or_else(|_| context.workspace.clone()))
}

/// Waits for the command, forwarding cancellation (the first SIGINT/SIGTERM) as SIGTERM
/// to its process group and checking once a second that the lock is intact; a
/// compromised lock stops the command. (A second signal exits at once; the
/// parent-death signal then ends the command.)
fn supervise(
    context: &Context,
    lock: &WorkspaceLock,
    child: &mut arcane_process::Child,
) -> Result<(), arcane_lock::Error> {
    let mut signalled = false;
    let mut last_check = Instant::now();
    loop {
        if child.wait_timeout(Duration::from_millis(100)).is_some() {
            return Ok(());
        }
        if context.cancel.is_cancelled() && !signalled {
            signalled = true;
            child.signal(libc::SIGTERM);
        }
        if last_check.elapsed() >= Duration::from_secs(1) {
            last_check = Instant::now();
            if let Err(error) = lock.check() {
                child.signal(libc::SIGTERM);
                child.wait();
                return Err(error);
            }
        }
    }
}

fn status(context: &Context) -> Result<u8, CliError> {
    let status = arcane_lock::status(&context.workspace)?;
    let mut value = status.to_json();
    value["workspace"] = lock_workspace(context);
    let workspace = context.workspace.display();
    let human = match &status {
        LockStatus::Free => format!("free: no operation holds `{workspace}`"),
        LockStatus::Held {
            holder: Some(holder),
            reason,
        } => {
            let alive = match holder.alive {
                Some(true) => ", alive",
                Some(false) => ", gone",
                None => "",
            };
            let note = match reason {
                arcane_lock::BusyReason::Locked | arcane_lock::BusyReason::SameProcess => {
                    String::new()
                }
                other => format!("\n  ({})", busy_note(other)),
            };
            format!("held: {holder}{alive}{note}")
        }
        LockStatus::Held {
            holder: None,
            reason,
        } => format!("held: {}", busy_note(reason)),
        LockStatus::Stale { holder } => format!(
            "stale: {holder} is gone; the next operation replaces it, or run `arcane lock recover`"
        ),
        _ => status.state().to_string(),
    };
    context.output.result(&human, &value);
    Ok(0)
}

fn busy_note(reason: &arcane_lock::BusyReason) -> String {
    use arcane_lock::BusyReason as R;
    match reason {
        R::Locked => "by a process that has not written its record yet".into(),
        R::OwnerAlive => "written by the JavaScript SDK; its owner is alive".into(),
        R::OwnerAliveWithoutLock => "its owner is alive but holds no advisory lock".into(),
        R::OwnerUndeterminable => "whether its owner is alive cannot be determined".into(),
        R::ForeignHost { hostname } => format!("taken on another host, `{hostname}`"),
        R::UnreadableRecord { problem } => format!("the record is {problem}"),
        R::OtherScope { scope } => format!("the record belongs to `{scope}`"),
        other => format!("{other:?}"),
    }
}

fn recover_command(context: &Context, args: RecoverArgs) -> Result<u8, CliError> {
    let mut options = RecoverOptions::default().quarantine_unreadable(args.quarantine_unreadable);
    if let Some(host) = args.break_foreign_host {
        options = options.break_foreign_host(host);
    }
    let recovered = arcane_lock::recover(&context.workspace, &options, &context.output)?;
    let workspace = context.workspace.display();
    let (human, value) = match &recovered {
        Recovered::Nothing => (
            format!("nothing to recover: the lock on `{workspace}` is free"),
            json!({"recovered": "nothing"}),
        ),
        Recovered::Removed { previous } => (
            format!("removed the stale lock of {previous}"),
            json!({"recovered": "removed", "previous": previous.to_json()}),
        ),
        Recovered::Quarantined { path, problem } => (
            format!(
                "moved the lock record ({problem}) aside to `{}`; its bytes are kept",
                path.display()
            ),
            json!({"recovered": "quarantined", "path": path, "problem": problem}),
        ),
        _ => (String::new(), json!({})),
    };
    context.output.result(&human, &value);
    Ok(0)
}

/// The human line for one of this command's events.
pub fn human_event(event: &Event, verbose: u8) -> Option<String> {
    let data = &event.data;
    let text = |key: &str| data[key].as_str().unwrap_or("?").to_string();
    let path = |line: String| {
        if verbose > 0 {
            format!("{line} [{}]", data["lockPath"].as_str().unwrap_or(""))
        } else {
            line
        }
    };
    match event.kind.as_str() {
        arcane_report::event_types::WORKSPACE_OPERATION_WAITING => {
            let holder = describe_holder(&data["holder"]);
            let limit = data["wait"]
                .as_str()
                .map(|w| format!("; waiting up to {w}"))
                .unwrap_or_default();
            // This process's own holder is another of its operations (a host stopping
            // its engines while one of its tasks holds the lock), not someone else.
            let own = data["holder"]["pid"].as_u64() == Some(u64::from(std::process::id()));
            let line = match data["reason"].as_str() {
                _ if own => format!(
                    "waiting for the workspace lock: another operation of this process (`{}`) holds it",
                    data["holder"]["operation"].as_str().unwrap_or("?")
                ),
                Some("unreadable-record") => "waiting for the workspace lock: its record is unreadable (see `arcane lock status`)".to_string(),
                Some("other-scope") => "waiting for the workspace lock: its record belongs to another workspace (see `arcane lock status`)".to_string(),
                Some("foreign-host") => format!("waiting for the workspace lock held by {holder}, on another host"),
                _ => format!("waiting for the workspace lock held by {holder}"),
            };
            Some(path(format!("{line}{limit}")))
        }
        arcane_report::event_types::WORKSPACE_OPERATION_STALE_RECOVERED => {
            let owner = &data["previousOwner"];
            let mut who = match owner["pid"].as_i64() {
                Some(pid) => format!("pid {pid}"),
                None => "an unknown process".into(),
            };
            if let Some(host) = owner["hostname"].as_str() {
                who.push_str(&format!(" on host `{host}`"));
            }
            let why = match data["reason"].as_str() {
                Some("pid-reused") => "its pid now belongs to another process",
                Some("rebooted") => "it was taken before a reboot",
                Some("foreign-host-broken") => "broken on request",
                _ => "its owner exited",
            };
            Some(path(format!(
                "recovered a stale workspace lock left by {who} (operation `{}`): {why}",
                text("previousOperation")
            )))
        }
        arcane_report::event_types::WORKSPACE_OPERATION_STALE_QUARANTINED => Some(format!(
            "moved the unreadable lock record aside to `{}`",
            text("quarantinePath")
        )),
        arcane_report::event_types::WORKSPACE_OPERATION_RELEASE_FAILED => Some(format!(
            "warning: releasing the workspace lock failed: {}",
            data["error"]["message"].as_str().unwrap_or("?")
        )),
        "workspace.operation.locked" if verbose > 0 => Some(path(format!(
            "locked workspace `{}` for `{}`",
            text("workspaceRoot"),
            text("operation")
        ))),
        "workspace.operation.released" if verbose > 0 => Some(format!(
            "released workspace `{}` after `{}`",
            text("workspaceRoot"),
            text("operation")
        )),
        _ => None,
    }
}

fn describe_holder(holder: &Value) -> String {
    if holder.is_null() {
        return "another process (its record is not written yet)".into();
    }
    let mut text = match holder["pid"].as_i64() {
        Some(pid) => format!("pid {pid}"),
        None => "an unknown process".into(),
    };
    if let Some(command) = holder["command"].as_str() {
        text.push_str(&format!(" (`{command}`)"));
    }
    if let Some(host) = holder["hostname"].as_str() {
        text.push_str(&format!(" on host `{host}`"));
    }
    if let Some(since) = holder["since"].as_str() {
        let short = since
            .get(11..19)
            .map(|t| format!("{t}Z"))
            .unwrap_or_else(|| since.to_string());
        text.push_str(&format!(" since {short}"));
    }
    if let Some(operation) = holder["operation"].as_str() {
        text.push_str(&format!(", operation `{operation}`"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        for bad in ["", "s", "10x", "-1s", "99999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_waiting_line_names_the_holder_and_the_limit() {
        let event = Event::new(
            arcane_report::event_types::WORKSPACE_OPERATION_WAITING,
            json!({
                "holder": {"pid": 412, "command": "arcane serve", "hostname": "h", "since": "2026-11-29T10:02:11.000Z", "operation": "serve"},
                "wait": "30 s",
                "lockPath": "/w/.arcane/workspace-operation.lock.json"
            }),
        );
        assert_eq!(
            human_event(&event, 0).unwrap(),
            "waiting for the workspace lock held by pid 412 (`arcane serve`) on host `h` since 10:02:11Z, operation `serve`; waiting up to 30 s"
        );
        assert!(human_event(&event, 1).unwrap().contains("/w/.arcane"));
    }

    /// A wait for a lock this very process holds (a host stopping while another of its
    /// operations holds it) never names its own pid as if someone else held it.
    #[test]
    fn a_wait_for_this_process_own_lock_says_so() {
        let event = Event::new(
            arcane_report::event_types::WORKSPACE_OPERATION_WAITING,
            json!({"holder": {"pid": std::process::id(), "command": "arcane serve", "operation": "engine-records"}}),
        );
        let line = human_event(&event, 0).unwrap();
        assert_eq!(
            line,
            "waiting for the workspace lock: another operation of this process (`engine-records`) holds it"
        );
    }

    #[test]
    fn locked_and_released_are_quiet_unless_verbose() {
        let event = Event::new(
            arcane_report::event_types::WORKSPACE_OPERATION_LOCKED,
            json!({"workspaceRoot": "/w", "operation": "x"}),
        );
        assert_eq!(human_event(&event, 0), None);
        assert!(human_event(&event, 1).is_some());
    }
}
