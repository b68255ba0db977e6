//! `arcane token show|rotate`: the workspace's bearer token (`.arcane/core-token`, mode
//! 0600), created once and kept across restarts so a client configured with it keeps
//! working; `arcane token add|list|revoke`: a key per application, with its scope,
//! priority and models. The rules live in `arcane_core::endpoint` and
//! `arcane_core::keys`; this module parses and renders.

use arcane_core::keys::{self, Priority, Scope};
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
    /// Make a key for one application and print it (once: only its SHA-256 is kept).
    ///
    /// The workspace token stays the admin key. An `inference` key may call the
    /// inference paths of every API (OpenAI, Anthropic, Ollama, speech, images) and list
    /// models, and nothing else (`arcane/1`, events, logs, metrics, loads, the
    /// dashboard's login). Clients send it as they send the token: `Authorization:
    /// Bearer KEY` (OpenAI's and Ollama's clients), `x-api-key: KEY` (Anthropic's). A
    /// running host accepts it from its next request on.
    ///
    /// Example: `arcane token add chat-app --priority high --models smol`
    Add(AddArgs),
    /// List the application keys: name, scope, priority, models, when each was made and
    /// last used (never a key).
    List,
    /// Revoke an application key: a running host refuses it from its next request on
    /// and closes the connections (and streams) that used it.
    Revoke {
        /// The key's name.
        #[arg(value_name = "NAME")]
        name: String,
    },
}

#[derive(Debug, clap::Args)]
struct AddArgs {
    /// The application's name (`[a-z0-9][a-z0-9._-]*`): `/metrics` and the logs name
    /// its requests by it.
    #[arg(value_name = "NAME")]
    name: String,
    /// What it may call: `inference` (the APIs' inference paths and model listings) or
    /// `admin` (everything the workspace token may do).
    #[arg(long, value_enum, default_value_t = ScopeArg::Inference)]
    scope: ScopeArg,
    /// Its place in each model's queue: every waiting `high` request is served before
    /// any `normal` one, and `normal` before `low`; keys of one priority take turns.
    #[arg(long, value_enum, default_value_t = PriorityArg::Normal)]
    priority: PriorityArg,
    /// The only models it may use (ids, comma-separated); other models answer 403 and
    /// are left out of its listings. Default: every model.
    #[arg(long, value_name = "ID,…", value_delimiter = ',')]
    models: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ScopeArg {
    Inference,
    Admin,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PriorityArg {
    High,
    Normal,
    Low,
}

impl From<ScopeArg> for Scope {
    fn from(scope: ScopeArg) -> Self {
        match scope {
            ScopeArg::Inference => Scope::Inference,
            ScopeArg::Admin => Scope::Admin,
        }
    }
}

impl From<PriorityArg> for Priority {
    fn from(priority: PriorityArg) -> Self {
        match priority {
            PriorityArg::High => Priority::High,
            PriorityArg::Normal => Priority::Normal,
            PriorityArg::Low => Priority::Low,
        }
    }
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
        TokenCommand::Add(add) => add_key(context, add)?,
        TokenCommand::List => list_keys(context)?,
        TokenCommand::Revoke { name } => revoke_key(context, &name)?,
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

/// `arcane token add`: the key, printed once.
fn add_key(context: &Context, args: AddArgs) -> Result<(), CliError> {
    let models = args
        .models
        .map(|ids| ids.into_iter().map(|id| id.trim().to_string()).collect());
    let made = keys::store::add(
        &context.workspace,
        &args.name,
        args.scope.into(),
        args.priority.into(),
        models,
    )?;
    let record = &made.record;
    let human = format!(
        "{}\n\nThe key of `{}` ({} scope, {} priority, models: {}). It is shown only now: keep it where the application reads its API key.",
        made.key,
        record.name,
        record.scope,
        record.priority,
        record.models.as_ref().map_or("every model".into(), |m| m.join(", ")),
    );
    context.output.result(
        &human,
        &json!({"name": record.name, "token": made.key, "scope": record.scope, "priority": record.priority, "models": record.models}),
    );
    Ok(())
}

/// `arcane token list`: every key but the key itself.
fn list_keys(context: &Context) -> Result<(), CliError> {
    let records = keys::store::list(&context.workspace)?;
    let used = keys::store::last_used(&context.workspace);
    let rows: Vec<_> = records
        .iter()
        .map(|r| r.public_json(used.get(&r.name).map(String::as_str)))
        .collect();
    let human = if rows.is_empty() {
        "no application keys (`arcane token add NAME` makes one; the workspace token is `arcane token show`)".to_string()
    } else {
        let cells: Vec<[String; 6]> = records
            .iter()
            .map(|r| {
                [
                    r.name.clone(),
                    r.scope.to_string(),
                    r.priority.to_string(),
                    r.models.as_ref().map_or("*".into(), |m| m.join(",")),
                    r.created.clone(),
                    used.get(&r.name).cloned().unwrap_or_else(|| "never".into()),
                ]
            })
            .collect();
        crate::cmd::runtime::table(
            &[
                "NAME",
                "SCOPE",
                "PRIORITY",
                "MODELS",
                "CREATED",
                "LAST USED",
            ],
            &cells,
        )
    };
    context.output.result(&human, &json!({"keys": rows}));
    Ok(())
}

/// `arcane token revoke`.
fn revoke_key(context: &Context, name: &str) -> Result<(), CliError> {
    let record = keys::store::revoke(&context.workspace, name)?;
    let host = arcane_core::endpoint::running_endpoint(&context.workspace).ok();
    let human = match &host {
        Some(host) => format!(
            "revoked the key `{}`; the host at {} (pid {}) refuses it from its next request on and closes its connections",
            record.name, host.url, host.pid
        ),
        None => format!("revoked the key `{}`", record.name),
    };
    context.output.result(
        &human,
        &json!({"name": record.name, "revoked": true, "host": host.map(|h| json!({"url": h.url, "pid": h.pid}))}),
    );
    Ok(())
}
