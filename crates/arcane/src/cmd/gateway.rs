//! `arcane ps`, `arcane load MODEL`, `arcane unload MODEL` and `arcane reload`: the
//! running host's model gateway, asked over `arcane/1` (its settings are the host
//! library's: `arcane_host::models`).

use std::time::Duration;

use arcane_core::client::CoreClient;
use arcane_front_door::http::Deadlines;
use serde_json::{json, Value};

use crate::config::Context;
use crate::error::CliError;

/// Arguments of `arcane ps`.
#[derive(Debug, clap::Args)]
pub struct PsArgs {
    /// Seconds to wait for the host's answer (default 10); a host that does not answer
    /// in time is a `CORE_TIMEOUT` error.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
}

/// Arguments of `arcane load` and `arcane unload`.
#[derive(Debug, clap::Args)]
pub struct ModelArgs {
    /// The model id or alias (as in `arcane.toml`'s `[[model]]`).
    pub model: String,

    /// Seconds to wait for the host's answer (default 600 for `load`: a load may take
    /// that long; 30 for `unload`); a host that does not answer in time is a
    /// `CORE_TIMEOUT` error.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
}

/// Runs `arcane ps`: the running host's models, loaded or not.
pub fn ps(context: &Context, args: PsArgs) -> Result<u8, CliError> {
    let timeout =
        arcane_host::settings::seconds("--timeout", args.timeout, Duration::from_secs(10))?;
    let client =
        CoreClient::from_workspace(&context.workspace)?.with_deadlines(Deadlines::uniform(timeout));
    let answer = crate::cmd::core::block_on_client(context, "`arcane ps`", async {
        Ok::<_, CliError>(client.call("models.list", json!({})).await?)
    })?;
    let rows = answer["models"].as_array().cloned().unwrap_or_default();
    context
        .output
        .result(&with_reasons(table(&rows), &rows), &json!({"models": rows}));
    Ok(0)
}

/// Arguments of `arcane reload`.
#[derive(Debug, clap::Args)]
pub struct ReloadArgs {
    /// Seconds to wait for the host's answer (default 30); a host that does not answer
    /// in time is a `CORE_TIMEOUT` error.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
}

/// Runs `arcane reload`: the running host reads `arcane.toml` again (as on SIGHUP).
pub fn reload(context: &Context, args: ReloadArgs) -> Result<u8, CliError> {
    let timeout = arcane_host::settings::seconds(
        "--timeout",
        args.timeout,
        crate::cmd::core::CLIENT_DEADLINE,
    )?;
    let client =
        CoreClient::from_workspace(&context.workspace)?.with_deadlines(Deadlines::uniform(timeout));
    let summary = crate::cmd::core::block_on_client(context, "`arcane reload`", async {
        Ok::<_, CliError>(client.call("models.reload", json!({})).await?)
    })?;
    let list = |key: &str| {
        let names: Vec<&str> = summary[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if names.is_empty() {
            "-".to_string()
        } else {
            names.join(", ")
        }
    };
    let text = format!(
        "added: {}\nremoved (unload when idle): {}\nchanged (reload when idle): {}\nunchanged: {}",
        list("added"),
        list("removed"),
        list("changed"),
        list("unchanged")
    );
    context.output.result(&text, &summary);
    Ok(0)
}

/// Runs `arcane load MODEL` (returns once it is ready) or `arcane unload MODEL`.
pub fn load(context: &Context, args: ModelArgs, unload: bool) -> Result<u8, CliError> {
    // A load waits for its model; an unload only for its engine to stop.
    let default = match unload {
        true => crate::cmd::core::CLIENT_DEADLINE,
        false => Duration::from_secs(600),
    };
    let timeout = arcane_host::settings::seconds("--timeout", args.timeout, default)?;
    let client =
        CoreClient::from_workspace(&context.workspace)?.with_deadlines(Deadlines::uniform(timeout));
    let method = if unload {
        "models.unload"
    } else {
        "models.load"
    };
    let row = crate::cmd::core::block_on_client(
        context,
        &format!("`arcane {}`", if unload { "unload" } else { "load" }),
        async { Ok::<_, CliError>(client.call(method, json!({"model": args.model})).await?) },
    )?;
    let text = format!(
        "{} {}",
        row["id"].as_str().unwrap_or("?"),
        row["state"].as_str().unwrap_or("?")
    );
    context.output.result(&text, &row);
    Ok(0)
}

/// The table, then why each model that failed (or crashed) did: its last error.
fn with_reasons(mut text: String, rows: &[Value]) -> String {
    for row in rows {
        let Some(message) = row["lastError"]["message"].as_str() else {
            continue;
        };
        if row["state"] == "error" || row["crashes"].as_u64().is_some_and(|c| c > 0) {
            text.push_str(&format!(
                "\n{}: {message}",
                row["id"].as_str().unwrap_or("?")
            ));
        }
    }
    text
}

/// A row's waiting requests, with the keys they came with: `3 (app 2, batch 1)`.
fn queued(row: &Value) -> String {
    let total = row["queued"].as_u64().unwrap_or(0);
    let by_key: Vec<String> = row["queuedByKey"]
        .as_object()
        .map(|keys| keys.iter().map(|(k, n)| format!("{k} {n}")).collect())
        .unwrap_or_default();
    if by_key.is_empty() {
        total.to_string()
    } else {
        format!("{total} ({})", by_key.join(", "))
    }
}

/// The `arcane ps` table.
fn table(rows: &[Value]) -> String {
    let text = |v: &Value| match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            [
                text(&r["id"]),
                text(&r["state"]),
                text(&r["device"]),
                text(&r["pid"]),
                r["residentBytes"]
                    .as_u64()
                    .map_or("-".into(), crate::cmd::runtime::human_bytes),
                text(&r["inFlight"]),
                queued(r),
                r["unloadsIn"]
                    .as_f64()
                    .map_or("-".into(), |s| format!("{s:.0}s")),
            ]
        })
        .collect();
    crate::cmd::runtime::table(
        &[
            "MODEL",
            "STATE",
            "DEVICE",
            "PID",
            "MEMORY",
            "IN FLIGHT",
            "QUEUED",
            "UNLOADS IN",
        ],
        &cells,
    )
}
