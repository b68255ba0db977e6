//! Runs `<executable> --version` with a time limit and reads the engine version from
//! what it prints, proving the executable really starts on this machine (its shared
//! libraries resolve, it is built for this CPU and OS) before it is registered.
//!
//! llama-server prints `version: 4500 (adef0123)` for release builds (recorded as the
//! release tag `b4500`) or `version: 0.6.0-dev (build 0, …)` for packaged builds
//! (recorded as `0.6.0-dev`), on stderr in most builds; Ollama
//! prints `ollama version is 0.5.7`, or `Warning: client version is 0.5.7` when no
//! Ollama server is running. Both streams are read.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arcane_process::{Child, ExitInfo, Spec};
use arcane_report::CancelToken;

use crate::{Engine, Error};

/// What `--version` told us (the kind's descriptor reads it).
pub(crate) use arcane_workspace::Probed;

const KEEP_OUTPUT: usize = 2000;

fn tail(text: &str) -> String {
    let text = text.trim();
    if text.len() <= KEEP_OUTPUT {
        return text.to_string();
    }
    let mut start = text.len() - KEEP_OUTPUT;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_string()
}

/// How long a version check that ran out of time (or was cancelled) gets between
/// SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_millis(500);

/// How often the wait for the exit looks at the cancellation token.
const POLL: Duration = Duration::from_millis(20);

/// Runs `executable --version` and parses it. The child is started by
/// [`arcane_process::spawn`] (its own process group, the parent-death signal armed,
/// reaped by the process module) with the loader path of
/// [`arcane_process::loader_path`]: `library_dirs` first, then `inherited`. When it
/// outlives `timeout` or `cancel` fires, its whole group is stopped.
pub(crate) fn probe(
    engine: Engine,
    executable: &Path,
    library_dirs: &[PathBuf],
    inherited: Option<&OsStr>,
    timeout: Duration,
    cancel: &CancelToken,
) -> Result<Probed, Error> {
    let mut child = start(executable, library_dirs, inherited)?;
    let readers = read_output(&mut child);
    let status = wait(&mut child, executable, timeout, cancel)?;
    let mut output = String::new();
    for reader in readers {
        if let Ok(bytes) = reader.join() {
            output.push_str(&String::from_utf8_lossy(&bytes));
            output.push('\n');
        }
    }
    if !status.success() {
        return Err(Error::ExecutableFailed {
            executable: executable.to_path_buf(),
            status: status.describe(),
            output: tail(&output),
        });
    }
    parse_version(engine, &output).ok_or_else(|| Error::VersionUnknown {
        executable: executable.to_path_buf(),
        engine: engine.to_string(),
        output: tail(&output),
    })
}

/// Spawns `executable --version`, stdin from `/dev/null`, both output streams piped.
fn start(
    executable: &Path,
    library_dirs: &[PathBuf],
    inherited: Option<&OsStr>,
) -> Result<Child, Error> {
    let mut spec = Spec::new(executable).args(["--version"]);
    match arcane_process::loader_path(library_dirs, inherited) {
        (variable, Some(value)) => spec = spec.env(variable, value),
        // Nothing to search: the child must not inherit an empty (current-directory)
        // entry either.
        (variable, None) if inherited.is_some() => spec.env_remove.push(variable.into()),
        (_, None) => {}
    }
    arcane_process::spawn(spec).map_err(|source| Error::ExecutableDoesNotRun {
        executable: executable.to_path_buf(),
        source,
    })
}

/// Reads the child's stdout and stderr (up to 1 MiB each) on their own threads.
fn read_output(child: &mut Child) -> Vec<JoinHandle<Vec<u8>>> {
    let streams = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ];
    streams
        .into_iter()
        .flatten()
        .map(|stream| {
            std::thread::spawn(move || {
                let mut buffer = Vec::new();
                let _ = stream.take(1 << 20).read_to_end(&mut buffer);
                buffer
            })
        })
        .collect()
}

/// Waits for the exit; stops the child's group when `timeout` passes or `cancel` fires.
fn wait(
    child: &mut Child,
    executable: &Path,
    timeout: Duration,
    cancel: &CancelToken,
) -> Result<ExitInfo, Error> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.wait_timeout(POLL) {
            return Ok(status);
        }
        if cancel.is_cancelled() {
            child.terminate(STOP_GRACE);
            return Err(Error::cancelled("version check"));
        }
        if Instant::now() >= deadline {
            child.terminate(STOP_GRACE);
            return Err(Error::ExecutableTimedOut {
                executable: executable.to_path_buf(),
                seconds: timeout.as_secs(),
            });
        }
    }
}

/// Finds the engine's version in `--version` output: the kind's own rule.
pub(crate) fn parse_version(engine: Engine, output: &str) -> Option<Probed> {
    engine.kind().parse_version(output)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_llama_server_and_ollama_versions() {
        let llama = "load_backend: loaded CPU backend\nversion: 4500 (adef0123)\nbuilt with cc (GCC) 12.2.0 for x86_64-linux-gnu\n";
        let probed = parse_version(Engine::LlamaCpp, llama).unwrap();
        assert_eq!(probed.version, "b4500");
        assert_eq!(probed.build_info, "version: 4500 (adef0123)");
        let packaged = "version: 0.6.0-dev (build 0, commit unknown)\nbuilt with GNU 12.2.0 for Linux x86_64\n";
        assert_eq!(
            parse_version(Engine::LlamaCpp, packaged).unwrap().version,
            "0.6.0-dev"
        );
        assert_eq!(parse_version(Engine::LlamaCpp, "version:"), None);
        assert_eq!(parse_version(Engine::LlamaCpp, "version: ???"), None);
        assert_eq!(
            parse_version(Engine::LlamaCpp, "echo (GNU coreutils) 9.1"),
            None
        );
        assert_eq!(
            parse_version(Engine::Ollama, "ollama version is 0.5.7")
                .unwrap()
                .version,
            "0.5.7"
        );
        let warned = "Warning: could not connect to a running Ollama instance\nWarning: client version is 0.6.0\n";
        assert_eq!(
            parse_version(Engine::Ollama, warned).unwrap().version,
            "0.6.0"
        );
        assert_eq!(parse_version(Engine::Ollama, llama), None);
    }
}
