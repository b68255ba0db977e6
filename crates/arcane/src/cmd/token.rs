//! `arcane token show|rotate`: the workspace's bearer token (`.arcane/core-token`, mode
//! 0600), created once and kept across restarts so a client configured with it keeps
//! working. The rules live in `arcane_core::endpoint`; this module parses and renders.

use serde_json::json;

use crate::config::Context;
use crate::error::CliError;

/// Arguments of `arcane token`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Debug, clap::Subcommand)]
enum TokenCommand {
    /// Print the token clients present (`Authorization: Bearer TOKEN`; the OpenAI
    /// clients' API key). Creates it when the workspace has none yet.
    Show,
    /// Replace the token with a fresh one. A running host switches at once: requests
    /// with the old token are refused from the next one on.
    Rotate,
}

/// The running host, when it accepts its own key rather than the workspace's
/// `token`.
fn own_key(context: &Context, token: &str) -> Option<arcane_core::endpoint::EndpointRecord> {
    arcane_core::endpoint::running_endpoint(&context.workspace)
        .ok()
        .filter(|host| host.token != token)
}

/// Runs `arcane token`.
pub fn run(context: &Context, args: Args) -> Result<u8, CliError> {
    crate::cmd::ensure_workspace(context)?;
    let path = arcane_core::endpoint::token_path(&context.workspace);
    match args.command {
        TokenCommand::Show => {
            let token = arcane_core::endpoint::workspace_token(&context.workspace)?;
            // A host started with its own key (`ARCANE_API_KEY`, `--api-key-file`)
            // accepts that key, not the workspace's: show the one it accepts.
            match own_key(context, &token) {
                Some(host) => context.output.result(
                    &host.token,
                    &json!({"token": host.token, "file": null, "source": "the running host's own key (ARCANE_API_KEY or --api-key-file)", "host": {"url": host.url, "pid": host.pid}}),
                ),
                None => context
                    .output
                    .result(&token, &json!({"token": token, "file": path})),
            }
        }
        TokenCommand::Rotate => {
            let current = arcane_core::endpoint::workspace_token(&context.workspace)?;
            if let Some(host) = own_key(context, &current) {
                return Err(crate::error::CommandError::usage(
                    format!(
                        "the host at {} (pid {}) accepts its own key, not the workspace's token: rotating the token would change nothing it accepts",
                        host.url, host.pid
                    ),
                    json!({"url": host.url, "pid": host.pid}),
                )
                .hint("change `ARCANE_API_KEY` (or the `--api-key-file`) and restart `arcane serve`")
                .into());
            }
            let token = arcane_core::endpoint::rotate_token(&context.workspace)?;
            let host = arcane_core::endpoint::running_endpoint(&context.workspace).ok();
            let human = match &host {
                Some(host) => format!(
                    "rotated the token in `{}`; the host at {} (pid {}) now accepts only the new one",
                    path.display(),
                    host.url,
                    host.pid
                ),
                None => format!("rotated the token in `{}`", path.display()),
            };
            context.output.result(
                &human,
                &json!({"token": token, "file": path, "host": host.map(|h| json!({"url": h.url, "pid": h.pid}))}),
            );
        }
    }
    Ok(0)
}
