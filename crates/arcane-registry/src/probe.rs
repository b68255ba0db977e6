//! Runs `<executable> --version` with a time limit and reads the engine version from
//! what it prints, proving the executable really starts on this machine (its shared
//! libraries resolve, it is built for this CPU and OS) before it is registered.
//!
//! llama-server prints `version: 4500 (adef0123)` for release builds (recorded as the
//! release tag `b4500`) or `version: 0.6.0-dev (build 0, …)` for packaged builds
//! (recorded as `0.6.0-dev`), on stderr in most builds; Ollama
//! prints `ollama version is 0.5.7`, or `Warning: client version is 0.5.7` when no
//! Ollama server is running. Both streams are read.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use arcane_report::CancelToken;

use crate::{Engine, Error};

/// What `--version` told us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Probed {
    pub version: String,
    pub build_info: String,
}

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

/// Runs `executable --version` (with `library_dirs` on the loader path) and parses it.
pub(crate) fn probe(
    engine: Engine,
    executable: &Path,
    library_dirs: &[PathBuf],
    timeout: Duration,
    cancel: &CancelToken,
) -> Result<Probed, Error> {
    let mut command = Command::new(executable);
    command
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Only the runtime's own directories: the caller's `LD_LIBRARY_PATH` is not read
    // (libraries never read the environment), and the probe only proves the runtime
    // starts with what it ships.
    if let Some(value) = crate::types::library_path(library_dirs, None) {
        command.env(crate::Runtime::library_path_variable(), value);
    }
    let mut child = command
        .spawn()
        .map_err(|source| Error::ExecutableDoesNotRun {
            executable: executable.to_path_buf(),
            source,
        })?;
    let mut readers = Vec::new();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        readers.push(std::thread::spawn(move || {
            let mut stream = stream;
            let mut buffer = Vec::new();
            let _ = stream.by_ref().take(1 << 20).read_to_end(&mut buffer);
            buffer
        }));
    }
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(source) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::ExecutableDoesNotRun {
                    executable: executable.to_path_buf(),
                    source,
                });
            }
        }
        if cancel.is_cancelled() || started.elapsed() >= timeout {
            let _ = child.kill();
            let _ = child.wait();
            if cancel.is_cancelled() {
                return Err(Error::cancelled("version check"));
            }
            return Err(Error::ExecutableTimedOut {
                executable: executable.to_path_buf(),
                seconds: timeout.as_secs(),
            });
        }
        cancel.wait_timeout(Duration::from_millis(20));
    };
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
            status: status.to_string(),
            output: tail(&output),
        });
    }
    parse_version(engine, &output).ok_or_else(|| Error::VersionUnknown {
        executable: executable.to_path_buf(),
        engine: engine.to_string(),
        output: tail(&output),
    })
}

/// Finds the engine's version in `--version` output.
pub(crate) fn parse_version(engine: Engine, output: &str) -> Option<Probed> {
    match engine {
        Engine::LlamaCpp => output.lines().find_map(|line| {
            let line = line.trim();
            let token = line.strip_prefix("version:")?.split_whitespace().next()?;
            let version = if token.bytes().all(|b| b.is_ascii_digit()) {
                // Release builds print their build number, which is the release tag `b<N>`.
                format!("b{token}")
            } else {
                // Packaged builds print a semantic version (`0.6.0-dev (build 0, …)`).
                token.trim_start_matches('v').to_ascii_lowercase()
            };
            crate::id::is_valid_id(&version).then(|| Probed {
                version,
                build_info: line.to_string(),
            })
        }),
        Engine::Ollama => output.lines().find_map(|line| {
            let line = line.trim();
            let (_, rest) = line
                .split_once("ollama version is ")
                .or_else(|| line.split_once("client version is "))?;
            let version = rest.trim().trim_start_matches('v');
            let valid = !version.is_empty()
                && version.chars().next().is_some_and(|c| c.is_ascii_digit())
                && version
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'));
            valid.then(|| Probed {
                version: version.to_ascii_lowercase(),
                build_info: line.to_string(),
            })
        }),
    }
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
