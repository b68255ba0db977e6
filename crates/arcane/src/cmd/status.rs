//! `arcane status`: what the running Core host of this workspace is doing: its URL,
//! services and their states, engines (state, owned or adopted, device) and devices.
//! The host answers from its own state (it never asks an engine for this), and every
//! call has a deadline (`--timeout`).

use std::time::Duration;

use arcane_core::client::CoreClient;
use arcane_core::localai::EngineStatus;
use arcane_front_door::http::Deadlines;
use serde_json::{json, Value};

use crate::config::Context;
use crate::error::CliError;

/// Arguments of `arcane status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Seconds to wait for each answer of the Core host (default 10); a host that does
    /// not answer in time is a `CORE_TIMEOUT` error.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
}

/// Runs `arcane status`: reads `core.json`, asks the host, prints the answer.
pub fn run(context: &Context, args: Args) -> Result<u8, CliError> {
    let timeout =
        arcane_host::settings::seconds("--timeout", args.timeout, Duration::from_secs(10))?;
    let client =
        CoreClient::from_workspace(&context.workspace)?.with_deadlines(Deadlines::uniform(timeout));
    let (health, local_ai, devices, models) =
        crate::cmd::core::block_on_client(context, "`arcane status`", async {
            let health = client.health().await?;
            let has = |name: &str| {
                health["services"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|s| s["name"] == name))
            };
            let has_gateway = has("model-gateway");
            // The gateway describes its loaded models' engines as `local-ai` does.
            let local_ai = if has("local-ai") || has_gateway {
                Some(client.local_ai_status().await?)
            } else {
                None
            };
            let devices = if has("execution-devices") {
                client.call("localai.devices", json!({})).await.ok()
            } else {
                None
            };
            let models = if has_gateway {
                client.call("models.list", json!({})).await.ok()
            } else {
                None
            };
            Ok::<_, CliError>((health, local_ai, devices, models))
        })?;
    let endpoint = client.endpoint();
    let engines = local_ai.unwrap_or_default();
    let value = json!({
        "url": endpoint.url,
        "pid": endpoint.pid,
        "state": health["state"],
        "version": health["version"],
        "services": health["services"],
        "engines": engines.to_json()["runtimes"].take(),
        "devices": devices.as_ref().map(|d| d["devices"].clone()).unwrap_or(json!([])),
        "models": models.as_ref().map(|m| m["models"].clone()).unwrap_or(json!([])),
    });
    context
        .output
        .result(&human(&value, &engines.runtimes), &value);
    Ok(0)
}

fn human(value: &Value, engines: &[EngineStatus]) -> String {
    let text = |v: &Value| v.as_str().unwrap_or("?").to_string();
    let mut host = format!(
        "Core host {} at {}",
        text(&value["state"]),
        text(&value["url"])
    );
    if let Some(pid) = value["pid"].as_u64() {
        host.push_str(&format!(" (pid {pid})"));
    }
    let mut lines = vec![host];
    for service in value["services"].as_array().into_iter().flatten() {
        lines.push(format!(
            "  service {:<18} {}",
            text(&service["name"]),
            text(&service["state"])
        ));
    }
    for engine in engines {
        let mut line = format!(
            "  engine  {:<18} {} at {} ({})",
            engine.id,
            engine.state,
            engine.url,
            engine.ownership()
        );
        if let Some(device) = engine.device() {
            line.push_str(&format!(", device `{device}`"));
        }
        if let Some(message) = engine.error_message() {
            line.push_str(&format!(": {message}"));
        }
        lines.push(line);
        if engine.state.is_ready() || engine.owned {
            lines.push(format!("          {}", engine.exposure()));
        }
        for model in &engine.models {
            // OpenAI's lists name a model `id`; Ollama's `/api/tags` names it `name`.
            let name = model.get("id").or_else(|| model.get("name"));
            lines.push(format!("          model {}", name.map_or("?".into(), text)));
        }
    }
    for model in value["models"].as_array().into_iter().flatten() {
        let mut line = format!(
            "  model   {:<18} {} on `{}`",
            text(&model["id"]),
            text(&model["state"]),
            text(&model["device"])
        );
        if let Some(pid) = model["pid"].as_u64() {
            line.push_str(&format!(", pid {pid}"));
        }
        if model["external"] == true {
            line.push_str(", external (reachable without the token)");
        } else if model["keyIgnored"] == true {
            line.push_str(", reachable without the token (it ignores its key)");
        } else if model["reachableWithoutToken"] == true {
            line.push_str(", reachable without the token (its port has no key)");
        }
        lines.push(line);
    }
    for device in value["devices"].as_array().into_iter().flatten() {
        lines.push(format!(
            "  device  {:<18} {}",
            text(&device["deviceId"]),
            text(&device["name"])
        ));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_without_a_pid_are_described_in_words() {
        let base = json!({"id": "llama.cpp", "url": "u", "state": "ready"});
        let with = |extra: Value| {
            let mut engine = base.clone();
            for (key, value) in extra.as_object().unwrap() {
                engine[key] = value.clone();
            }
            serde_json::from_value::<EngineStatus>(engine).unwrap()
        };
        let cases = [
            (
                json!({"owned": true, "engine": "llama.cpp", "pid": 42}),
                "owned, pid 42",
            ),
            (
                json!({"owned": true, "engine": "llama.cpp", "pid": null}),
                "owned, no process running",
            ),
            (
                json!({"owned": false, "external": true, "pid": null}),
                "adopted (not started by Arcane)",
            ),
            (json!({"owned": false, "external": false}), "not running"),
        ];
        for (engine, expected) in cases {
            assert_eq!(with(engine.clone()).ownership(), expected, "{engine}");
        }
        let value = json!({"state": "ready", "url": "http://127.0.0.1:1", "pid": null,
            "engines": [{"id": "llama.cpp", "state": "ready", "url": "u", "owned": false, "external": true, "pid": null}]});
        let engines: Vec<EngineStatus> = serde_json::from_value(value["engines"].clone()).unwrap();
        let text = human(&value, &engines);
        assert!(!text.contains("null"), "{text}");
        assert!(
            text.contains("engine  llama.cpp          ready at u (adopted"),
            "{text}"
        );
    }
}
