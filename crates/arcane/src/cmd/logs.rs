//! `arcane logs [MODEL] [-f] [--since 5m]`: what the running host kept of its
//! engines' output and its own lines (`GET /v1/logs`), one model's or all of them,
//! and with `--follow` every new line until Ctrl-C.

use arcane_core::client::CoreClient;
use arcane_report::Event;
use serde_json::{json, Value};

use crate::cli::OutputMode;
use crate::config::Context;
use crate::error::{CliError, CommandError};

/// Arguments of `arcane logs`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The model whose lines to show (a gateway model id, an engine id such as
    /// `llama.cpp`, or `host` for the host's lines that name no model); all when
    /// omitted.
    #[arg(value_name = "MODEL")]
    pub model: Option<String>,

    /// Keep printing new lines as they come, until Ctrl-C.
    #[arg(short, long)]
    pub follow: bool,

    /// Only lines from this long ago on: `30s`, `5m`, `1h30m` (default: all the host
    /// kept; it keeps 1 MiB of lines, all models together, by default).
    #[arg(long, value_name = "DURATION")]
    pub since: Option<String>,
}

/// Runs `arcane logs`.
pub fn run(context: &Context, args: Args) -> Result<u8, CliError> {
    if let Some(since) = &args.since {
        arcane_core::duration::parse(since).map_err(|why| {
            CommandError::usage(format!("--since: {why}"), json!({"since": since}))
        })?;
    }
    if args.follow && context.output.mode == OutputMode::Json {
        return Err(CommandError::usage(
            "`--follow` never ends, so it has no single JSON document: use `--output ndjson`",
            json!({"follow": true}),
        )
        .into());
    }
    let client = CoreClient::from_workspace(&context.workspace)?;
    let query = query(&args);
    let mut kept = Vec::new();
    crate::cmd::core::block_on_client(context, "`arcane logs`", async {
        client
            .logs(&query, args.follow, |line| show(context, line, &mut kept))
            .await
            .map_err(CliError::from)
    })?;
    if context.output.mode == OutputMode::Json {
        context.output.result("", &json!({"lines": kept}));
    }
    Ok(0)
}

/// The query string of `args`, percent-encoded.
fn query(args: &Args) -> String {
    let mut pairs = Vec::new();
    if let Some(model) = &args.model {
        pairs.push(format!("model={}", encode(model)));
    }
    if let Some(since) = &args.since {
        pairs.push(format!("since={}", encode(since)));
    }
    if args.follow {
        pairs.push("follow=1".to_string());
    }
    pairs.join("&")
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Prints one line as the output mode wants it (`json` keeps it for the document).
fn show(context: &Context, line: Value, kept: &mut Vec<Value>) {
    match context.output.mode {
        OutputMode::Human => context.output.result(&human(&line), &Value::Null),
        OutputMode::Ndjson => {
            let mut event = Event::new(
                "log.line",
                json!({"model": line["model"], "stream": line["stream"], "line": line["line"]}),
            );
            if let Some(time) = line["time"].as_str() {
                event.time = time.to_string();
            }
            context.output.event(&event);
        }
        OutputMode::Json => kept.push(line),
    }
}

/// `HH:MM:SS model stream  text`.
fn human(line: &Value) -> String {
    let time = line["time"].as_str().unwrap_or_default();
    let clock = time.get(11..19).unwrap_or(time);
    format!(
        "{clock} {} {:<6} {}",
        line["model"].as_str().unwrap_or("?"),
        line["stream"].as_str().unwrap_or("?"),
        line["line"].as_str().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_is_encoded_and_a_line_is_readable() {
        let args = Args {
            model: Some("smol a/b".into()),
            follow: true,
            since: Some("5m".into()),
        };
        assert_eq!(query(&args), "model=smol%20a%2Fb&since=5m&follow=1");
        let line = json!({"time": "2026-12-01T21:30:01.123Z", "model": "smol", "stream": "stderr", "line": "hello"});
        assert_eq!(human(&line), "21:30:01 smol stderr hello");
    }
}
