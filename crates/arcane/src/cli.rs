//! The command-line definition (clap). Values are kept as typed here; each command
//! module validates them into library option structs before any side effect.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::cmd;

/// Arcane: a local-AI host for applications.
///
/// Runs llama.cpp and Ollama servers on exactly the device you chose, adopts servers
/// that already run, never leaves orphans, coordinates every change to a workspace
/// through a crash-safe lock, and ships apps as verified bundles.
#[derive(Debug, Parser)]
#[command(
    name = "arcane",
    version,
    propagate_version = true,
    max_term_width = 100
)]
pub struct Cli {
    /// Options every command accepts, before or after the subcommand.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// The command to run.
    #[command(subcommand)]
    pub command: cmd::Command,
}

/// Options every command accepts, before or after the subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct GlobalArgs {
    /// How to print results: `human` lines, one `json` document, or `ndjson` events.
    #[arg(long, global = true, value_enum, default_value_t = OutputMode::Human)]
    pub output: OutputMode,

    /// The workspace directory (holds `.arcane/`: lock, registry, engine records).
    /// Default: `$ARCANE_WORKSPACE`, else `$XDG_DATA_HOME/arcane`, else `~/.local/share/arcane`.
    /// Commands that change it create it; commands that only read it refuse a named one
    /// that does not exist (`ARCANE_WORKSPACE_NOT_FOUND`).
    #[arg(long, global = true, value_name = "DIR")]
    pub workspace: Option<PathBuf>,

    /// Print more detail (paths, causes); repeat for more.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputMode {
    /// Lines for a person; progress bars on a terminal.
    Human,
    /// One JSON document on stdout (an error as `{"error": {"code", "message",
    /// "details"}}`).
    Json,
    /// One JSON object per line: events as they happen, then the result (an error as
    /// `{"type": "error", "error": {"code", "message", "details"}}`).
    Ndjson,
}

/// Renders a command line clap refused: `--help` and `--version` as clap prints them;
/// a usage error as clap prints it, or, when the raw arguments ask for
/// `--output json|ndjson` (before or after the bad argument), as the same JSON error
/// every other failure prints (`ARCANE_USAGE`, exit 2).
pub fn refused(error: clap::Error) -> std::process::ExitCode {
    use clap::error::ErrorKind;
    let mode = raw_output_mode(std::env::args_os());
    let informational = matches!(
        error.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if informational || mode == OutputMode::Human {
        let _ = error.print();
        return std::process::ExitCode::from(error.exit_code().clamp(0, 255) as u8);
    }
    let usage = usage_error(&error);
    crate::output::Output::new(mode, 0).error(&usage);
    std::process::ExitCode::from(crate::error::exit_code(arcane_report::codes::ARCANE_USAGE))
}

/// A clap error as an `ARCANE_USAGE` error: clap's first line as the message, the
/// offending argument and value (when clap names them) and the usage in the details.
fn usage_error(error: &clap::Error) -> crate::error::CommandError {
    use clap::error::ContextKind;
    let rendered = error.render().to_string();
    let message = rendered
        .lines()
        .next()
        .unwrap_or("invalid command line")
        .trim_start_matches("error: ")
        .to_string();
    let context = |kind: ContextKind| error.get(kind).map(|value| value.to_string());
    let details = serde_json::json!({
        "kind": format!("{:?}", error.kind()),
        "argument": context(ContextKind::InvalidArg),
        "value": context(ContextKind::InvalidValue),
        "validValues": context(ContextKind::ValidValue),
        "usage": context(ContextKind::Usage),
    });
    let mut usage = crate::error::CommandError::usage(message, details);
    let suggested = [ContextKind::SuggestedSubcommand, ContextKind::SuggestedArg]
        .into_iter()
        .find_map(context);
    if let Some(suggested) = suggested {
        usage = usage.hint(format!("did you mean `{suggested}`?"));
    }
    usage.hint("`arcane <command> --help` explains every flag")
}

/// The `--output` mode the raw arguments ask for (the last one wins; nothing after a
/// bare `--`, which starts a command's own arguments), `human` when none does.
fn raw_output_mode(args: impl IntoIterator<Item = std::ffi::OsString>) -> OutputMode {
    let mut mode = OutputMode::Human;
    let mut args = args.into_iter().skip(1);
    while let Some(arg) = args.next() {
        let arg = arg.to_string_lossy().into_owned();
        if arg == "--" {
            break;
        }
        let value = match arg.strip_prefix("--output=") {
            Some(value) => value.to_string(),
            None if arg == "--output" => match args.next() {
                Some(value) => value.to_string_lossy().into_owned(),
                None => break,
            },
            None => continue,
        };
        mode = OutputMode::from_str(&value, false).unwrap_or(OutputMode::Human);
    }
    mode
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(args: &[&str]) -> OutputMode {
        raw_output_mode(
            std::iter::once("arcane")
                .chain(args.iter().copied())
                .map(Into::into),
        )
    }

    #[test]
    fn the_output_mode_is_read_from_raw_arguments_anywhere_before_a_bare_double_dash() {
        assert_eq!(
            mode(&["--output", "json", "model", "lis"]),
            OutputMode::Json
        );
        assert_eq!(
            mode(&["model", "lis", "--output=ndjson"]),
            OutputMode::Ndjson
        );
        assert_eq!(
            mode(&["lock", "run", "--", "x", "--output", "json"]),
            OutputMode::Human
        );
        assert_eq!(mode(&["--output", "xml"]), OutputMode::Human);
        assert_eq!(mode(&["--output"]), OutputMode::Human);
    }
}
