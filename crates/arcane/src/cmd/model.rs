//! `arcane model`. (Being built; see the open issue for this command.)

use arcane_report::{codes, Event};
use serde_json::json;

use crate::config::Context;
use crate::error::{CliError, CommandError};

/// Arguments of `arcane model`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `arcane model`.
pub fn run(_context: &Context, _args: Args) -> Result<u8, CliError> {
    Err(CommandError::new(codes::ARCANE_OPERATION_FAILED, "`arcane model` is not available in this build yet", json!({"command": "model"})).into())
}

/// The human line for one of this command's events.
pub fn human_event(_event: &Event, _verbose: u8) -> Option<String> {
    None
}
