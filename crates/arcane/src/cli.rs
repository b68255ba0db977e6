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
    /// One JSON document on stdout (errors as `{"code","message","details"}`).
    Json,
    /// One JSON object per line: events as they happen, then the result.
    Ndjson,
}
