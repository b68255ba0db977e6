//! `arcane chat "PROMPT"`: sends one prompt to the running Core host's engine (through
//! its OpenAI-compatible passthrough, authenticated with `core.json`'s token) and
//! streams the answer as it is generated. `--model` names a gateway model. Without a
//! prompt, on a terminal, it is a conversation (each answer joins the history; an
//! empty line or end of input ends it); without a terminal, standard input is the
//! prompt.

use std::io::Write;
use std::time::Duration;

use arcane_core::client::CoreClient;
use arcane_front_door::http::Deadlines;
use arcane_report::{codes, Diagnostic};
use serde_json::{json, Value};

use crate::cli::OutputMode;
use crate::config::Context;
use crate::error::{Cause, CliError, CommandError};

/// Arguments of `arcane chat`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to ask (none: a conversation on a terminal, else standard input).
    #[arg(value_name = "PROMPT")]
    pub prompt: Option<String>,

    /// The model to ask (a `[[model]]` id or alias; default: the host's default).
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,

    /// A system message to send first.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,

    /// The most tokens to generate.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_tokens: u32,

    /// Sampling temperature (0 = deterministic).
    #[arg(long, value_name = "T")]
    pub temperature: Option<f64>,

    /// Seconds to wait for the answer to start, and then between two streamed pieces
    /// (default 120); a host or engine that does not answer in time is a
    /// `CORE_TIMEOUT` error.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
}

/// Runs `arcane chat`.
pub fn run(context: &Context, args: Args) -> Result<u8, CliError> {
    use std::io::IsTerminal;
    let timeout =
        arcane_host::settings::seconds("--timeout", args.timeout, Duration::from_secs(120))?;
    let client =
        CoreClient::from_workspace(&context.workspace)?.with_deadlines(Deadlines::uniform(timeout));
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    let prompt = match &args.prompt {
        Some(prompt) => prompt.clone(),
        None if std::io::stdin().is_terminal() => {
            return conversation(context, &client, &args, messages)
        }
        None => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(|e| {
                CommandError::new(
                    codes::ARCANE_IO,
                    "cannot read the prompt from standard input",
                    json!({}),
                )
                .caused_by(e)
            })?;
            text
        }
    };
    messages.push(json!({"role": "user", "content": prompt}));
    let answer = ask(context, &client, &args, &messages)?;
    let human = context.output.mode == OutputMode::Human;
    if human {
        context.output.result("", &json!({}));
        let _ = writeln!(std::io::stdout());
    } else {
        context
            .output
            .result("", &json!({"answer": answer, "url": client.endpoint().url}));
    }
    Ok(0)
}

/// A conversation on a terminal: a prompt per line, each answer streamed and kept in
/// the history.
fn conversation(
    context: &Context,
    client: &CoreClient,
    args: &Args,
    mut messages: Vec<Value>,
) -> Result<u8, CliError> {
    let stdin = std::io::stdin();
    context.output.note(&format!(
        "chatting with {} (an empty line or Ctrl-D ends it)",
        args.model.as_deref().unwrap_or("the default model")
    ));
    loop {
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(b"> ");
        let _ = err.flush();
        drop(err);
        let mut line = String::new();
        if stdin.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
            return Ok(0);
        }
        messages.push(json!({"role": "user", "content": line.trim_end()}));
        let answer = ask(context, client, args, &messages)?;
        let _ = writeln!(std::io::stdout());
        messages.push(json!({"role": "assistant", "content": answer}));
    }
}

/// Sends `messages` and streams the answer to stdout (in human mode); returns it.
fn ask(
    context: &Context,
    client: &CoreClient,
    args: &Args,
    messages: &[Value],
) -> Result<String, CliError> {
    let mut payload = json!({"messages": messages, "max_tokens": args.max_tokens});
    if let Some(temperature) = args.temperature {
        payload["temperature"] = json!(temperature);
    }
    if let Some(model) = &args.model {
        payload["model"] = json!(model);
    }
    let human = context.output.mode == OutputMode::Human;
    // Ctrl-C drops the stream, which the host passes on to the engine.
    let answer = crate::cmd::core::block_on_client(context, "the chat", async {
        let answer = client
            .chat(payload, |delta| {
                if human {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(delta.as_bytes());
                    let _ = out.flush();
                }
            })
            .await;
        match answer {
            Err(error) if error.code() == codes::LOCAL_AI_SERVER_NOT_READY => {
                Err(explain_not_ready(client, error).await)
            }
            other => other.map_err(CliError::from),
        }
    })?;
    Ok(answer)
}

/// A not-ready engine, explained: the host's error (its code, details and hints) with
/// the engine's own error from `localai.status` (e.g. how it crashed) as its cause.
/// Without that record (an older host, a slow answer) the host's error is kept as is.
async fn explain_not_ready(client: &CoreClient, error: arcane_core::Error) -> CliError {
    let runtime = error.details()["runtime"]
        .as_str()
        .unwrap_or(arcane_localai::Engine::DEFAULT.as_str())
        .to_string();
    let status =
        tokio::time::timeout(std::time::Duration::from_secs(5), client.local_ai_status()).await;
    let engine_error = match status {
        Ok(Ok(status)) => status
            .engine(&runtime)
            .filter(|engine| engine.error_message().is_some())
            .and_then(|engine| engine.error.clone()),
        _ => None,
    };
    let Some(engine_error) = engine_error else {
        return error.into();
    };
    let mut details = error.details();
    if let Value::Object(map) = &mut details {
        map.insert("engineError".into(), engine_error.clone());
    }
    let message = engine_error["message"].as_str().unwrap_or_default();
    let causes = engine_error["causes"].as_array().into_iter().flatten();
    let chain = std::iter::once(message).chain(causes.filter_map(Value::as_str));
    let mut explained = CommandError::new(error.code(), error.to_string(), details);
    if let Some(cause) = Cause::chain(chain) {
        explained = explained.caused_by(cause);
    }
    for hint in error.hints() {
        explained = explained.hint(hint);
    }
    explained.into()
}
