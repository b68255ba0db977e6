//! `arcane core`. (Being built; see the open issue for this command.)

use arcane_report::{codes, Event};
use serde_json::json;

use crate::config::Context;
use crate::error::{CliError, CommandError};

/// Arguments of `arcane core`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `arcane core`.
pub fn run(_context: &Context, _args: Args) -> Result<u8, CliError> {
    Err(CommandError::new(codes::ARCANE_OPERATION_FAILED, "`arcane core` is not available in this build yet", json!({"command": "core"})).into())
}

/// The human line for one of this command's events.
pub fn human_event(_event: &Event, _verbose: u8) -> Option<String> {
    None
}
