//! `arcane serve`: the Core host, the main job, on loopback HTTP.
//!
//! A thin caller of the host library (`arcane_host`): the flags are its
//! [`arcane_host::Flags`], `arcane.toml` is read and validated there, and the host runs
//! there until Ctrl-C/SIGTERM; this module adds the worker kinds' services and says
//! what happens in the CLI's output.

use arcane_report::event_types;
use arcane_report::Event;
use serde_json::Value;

use crate::config::Context;
use crate::error::CliError;

/// Arguments of `arcane serve`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub flags: arcane_host::Flags,

    /// The services of the kinds whose sessions run in Arcane's own workers, hosted
    /// when a library is named or registered (`--onnx-library`: ONNX sessions,
    /// `onnx.status|load|run|unload`).
    #[command(flatten)]
    pub workers: crate::cmd::WorkerOptions,
}

/// Runs `arcane serve`: validates the engines, then runs the Core host on them until
/// Ctrl-C/SIGTERM (exit 0), a failed first engine start (its error), or a cancelled
/// start (130).
pub fn run(context: &Context, mut args: Args) -> Result<u8, CliError> {
    // One owner per workspace: a running host is the answer, whatever these flags say.
    let owner = arcane_host::own(&context.workspace)?;
    let host = context.host();
    if args.flags.config.is_none() {
        args.flags.config = local_config(context);
    }
    let mut options = arcane_host::settings::options(&host, &args.flags)?;
    args.workers.or_registered(context)?;
    options.workers = std::sync::Arc::new(args.workers);
    let said = crate::cmd::core::Said {
        context,
        config: options.config_file.clone(),
    };
    arcane_host::serve(&host, options, owner, &said)
}

/// `arcane.toml` in the current directory, when there is one: a project's own
/// configuration comes before the workspace's (as `docker compose` reads the project's
/// file), and the workspace's, when there is one too, is not read (said in a note).
fn local_config(context: &Context) -> Option<std::path::PathBuf> {
    let local = std::path::absolute(LOCAL_CONFIG).ok()?;
    // Anything there counts (a FIFO or a directory is refused by the reader).
    std::fs::symlink_metadata(&local).ok()?;
    let workspace = context.workspace.join(LOCAL_CONFIG);
    let same = |a: &std::path::Path, b: &std::path::Path| {
        std::fs::canonicalize(a).ok() == std::fs::canonicalize(b).ok()
    };
    if workspace.exists() && !same(&local, &workspace) {
        context.output.note(&format!(
            "reading `{}` from the current directory; the workspace's `{}` is not read (`--config` names another)",
            local.display(),
            workspace.display()
        ));
    }
    Some(local)
}

/// The configuration file's name, in the current directory and in the workspace.
const LOCAL_CONFIG: &str = "arcane.toml";

/// The human line for one of this command's events.
pub fn human_event(event: &Event, verbose: u8) -> Option<String> {
    let data = &event.data;
    let text = |key: &str| {
        data.get(key)
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string()
    };
    let engine = text("engine");
    let url = text("url");
    match event.kind.as_str() {
        event_types::LOCAL_AI_SERVER_STARTING => {
            if data["owned"] == true {
                Some(format!("starting {engine} at {url}"))
            } else if verbose > 0 {
                Some(format!("probing {engine} at {url}"))
            } else {
                None
            }
        }
        event_types::LOCAL_AI_SERVER_LOADING => {
            Some(format!("{engine} at {url} is loading its model"))
        }
        event_types::LOCAL_AI_SERVER_READY => {
            let how = if data["owned"] == true {
                format!("owned, pid {}", data["pid"])
            } else {
                "adopted: already running, never stopped by Arcane".to_string()
            };
            Some(format!("{engine} ready at {url} ({how})"))
        }
        event_types::LOCAL_AI_SERVER_ERROR => {
            let message = data["error"]["message"].as_str().unwrap_or("failed");
            Some(format!("{engine} at {url}: {message}"))
        }
        event_types::LOCAL_AI_SERVER_STOPPED => match data["stopStep"].as_str() {
            Some("released") => Some(format!("released {engine} at {url} (left running)")),
            Some("sigkill") => Some(format!("{engine} stopped (killed after ignoring SIGTERM)")),
            Some(_) => Some(format!("{engine} stopped")),
            None => Some(format!("{engine} stopped")),
        },
        event_types::LOCAL_AI_MODEL_STARTING => Some(format!(
            "loading model `{}` on `{}`",
            text("model"),
            text("device")
        )),
        event_types::LOCAL_AI_MODEL_READY => Some(format!(
            "model `{}` ready (pid {})",
            text("model"),
            data["pid"]
        )),
        event_types::LOCAL_AI_MODEL_STOPPED if data["reason"] == "evicted" => Some(format!(
            "evicted model `{}` from `{}` to make room for `{}`",
            text("model"),
            text("device"),
            text("for")
        )),
        event_types::LOCAL_AI_MODEL_STOPPED => Some(format!(
            "unloaded model `{}` ({})",
            text("model"),
            text("reason")
        )),
        event_types::LOCAL_AI_MODEL_ERROR => Some(format!(
            "model `{}` {}: {}",
            text("model"),
            match data["reason"].as_str() {
                Some("crashed") => "crashed",
                Some("unreachable") => "is unreachable",
                _ => "failed to load",
            },
            data["error"]["message"].as_str().unwrap_or("?")
        )),
        event_types::LOCAL_AI_MODELS_RELOADED => Some(match data["error"]["message"].as_str() {
            Some(message) => {
                let mut line = format!("reload failed, the models stay as they were: {message}");
                let causes = data["error"]["causes"].as_array().into_iter().flatten();
                for cause in causes.filter_map(Value::as_str) {
                    line.push_str(&format!("\n  caused by: {cause}"));
                }
                line
            }
            None => {
                let names = |key: &str| {
                    let list: Vec<&str> = data[key]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .collect();
                    if list.is_empty() {
                        "-".to_string()
                    } else {
                        list.join(", ")
                    }
                };
                format!(
                    "reloaded arcane.toml: added {}, removed {}, changed {}",
                    names("added"),
                    names("removed"),
                    names("changed")
                )
            }
        }),
        event_types::PROCESS_ORPHAN_STOPPED => Some(format!(
            "stopped an orphaned {} (pid {}) left behind by an earlier Arcane",
            text("id"),
            data["pid"]
        )),
        event_types::PROCESS_CANCELLATION_ESCALATED => Some(format!(
            "pid {} ignored SIGTERM; sending SIGKILL",
            data["pid"]
        )),
        event_types::PROCESS_STDOUT | event_types::PROCESS_STDERR if verbose > 1 => {
            Some(format!("  | {}", text("line")))
        }
        event_types::PROCESS_STARTING if verbose > 0 => {
            let args: Vec<&str> = data["args"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            Some(format!("exec {} {}", text("command"), args.join(" ")))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A reload that failed on SIGHUP says why in `serve`'s own output too, causes
    /// included (a TOML error's line and column are in its cause).
    #[test]
    fn a_failed_reload_event_shows_its_causes() {
        let event = Event::new(
            event_types::LOCAL_AI_MODELS_RELOADED,
            json!({"error": {"message": "`a.toml` is not a valid Arcane configuration", "causes": ["TOML parse error at line 3, column 9"]}}),
        );
        assert_eq!(
            human_event(&event, 0).as_deref(),
            Some("reload failed, the models stay as they were: `a.toml` is not a valid Arcane configuration\n  caused by: TOML parse error at line 3, column 9")
        );
    }
}
