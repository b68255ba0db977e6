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

/// Arguments of `arcane load`.
#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    /// The model and how long to wait.
    #[command(flatten)]
    pub model: ModelArgs,

    /// Change nothing: say the device, the memory estimate (weights, key/value cache,
    /// compute, the engine itself), which loaded models the load would evict and why
    /// (idle order, pins, groups), or why it cannot load (`models.plan`).
    #[arg(long)]
    pub dry_run: bool,
}

/// Runs `arcane load MODEL --dry-run`: what a load would do, from the running host.
pub fn plan(context: &Context, args: ModelArgs) -> Result<u8, CliError> {
    let timeout =
        arcane_host::settings::seconds("--timeout", args.timeout, Duration::from_secs(10))?;
    let client =
        CoreClient::from_workspace(&context.workspace)?.with_deadlines(Deadlines::uniform(timeout));
    let plan = crate::cmd::core::block_on_client(context, "`arcane load --dry-run`", async {
        Ok::<_, CliError>(
            client
                .call("models.plan", json!({"model": args.model}))
                .await?,
        )
    })?;
    context.output.result(&plan_text(&plan), &plan);
    Ok(0)
}

/// A dry run for a person: what it would need, then what would happen.
fn plan_text(plan: &Value) -> String {
    let bytes = |v: &Value| {
        v.as_u64()
            .map_or("?".into(), crate::cmd::runtime::human_bytes)
    };
    let id = plan["model"].as_str().unwrap_or("?");
    let estimate = &plan["estimate"];
    let mut parts = vec![format!("weights {}", bytes(&estimate["weights"]))];
    if let Some(cache) = estimate["cache"].as_u64().filter(|c| *c > 0) {
        let context = estimate["context"]
            .as_u64()
            .map_or(String::new(), |c| format!(" for {c} tokens"));
        parts.push(format!(
            "key/value cache {}{context}",
            crate::cmd::runtime::human_bytes(cache)
        ));
    }
    for (key, name) in [("compute", "compute"), ("runtime", "the engine itself")] {
        if estimate[key].as_u64().is_some_and(|n| n > 0) {
            parts.push(format!("{name} {}", bytes(&estimate[key])));
        }
    }
    let limits = &plan["deviceLimits"];
    let device = plan["device"].as_str().unwrap_or("?");
    let mut text = format!(
        "`{id}` on device `{device}` needs about {} ({})",
        bytes(&plan["memoryNeed"]),
        parts.join(", ")
    );
    if let Some(budget) = limits["memory"].as_u64() {
        text.push_str(&format!(
            "; the device's budget is {}, {} in use",
            crate::cmd::runtime::human_bytes(budget),
            bytes(&limits["used"])
        ));
    }
    text.push('\n');
    let evictions: Vec<String> = plan["evict"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            format!(
                "`{}` ({})",
                e["model"].as_str().unwrap_or("?"),
                e["why"].as_str().unwrap_or("")
            )
        })
        .collect();
    text.push_str(&match plan["outcome"].as_str() {
        Some("loaded") => format!(
            "it is loaded already ({})",
            plan["state"].as_str().unwrap_or("?")
        ),
        Some("loads") if evictions.is_empty() => "it would load now, evicting nothing".into(),
        Some("loads") => format!("it would load after evicting {}", evictions.join(", ")),
        Some("waits") => format!(
            "it would wait for a busy model to become idle: {}",
            plan["waitsFor"]["message"].as_str().unwrap_or("?")
        ),
        _ => format!(
            "it cannot load: {} ({})",
            plan["error"]["message"].as_str().unwrap_or("?"),
            plan["error"]["code"].as_str().unwrap_or("?")
        ),
    });
    text
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
