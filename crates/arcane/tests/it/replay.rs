//! Issue 34, item 5: a crash no client sees. An engine that dies after a request was
//! forwarded and before the first byte of its answer gets the request again, once,
//! from the engine that replaces it; the official clients read an ordinary answer. An
//! engine that dies again is not tried a third time, and one that cannot start again
//! is refused in the shape of the API the client called. The fault is injected by the
//! fake llama-server (`die-on-request`), which speaks llama-server's protocol; the real
//! llama-server killed mid-request shows the same with a real generation.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::front_door::call;
use crate::gateway::{gateway_workspace, ps, row, start};
use crate::serve::host_endpoint;
use crate::support::{run, TestWorkspace};

fn fake_llama() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../arcane-localai/tests/fakes/fake_llama.py")
}

/// A `command` model `id` running the fake llama-server that dies on its first chat
/// (on every chat when `state` is `None`), with the fake's other `modes`.
fn dying(id: &str, state: Option<&Path>, modes: &[&str]) -> String {
    let mut command = vec![
        "python3".to_string(),
        fake_llama().display().to_string(),
        "--host".into(),
        "${SOCKET}".into(),
        "--fake-mode".into(),
        "die-on-request".into(),
    ];
    for mode in modes {
        command.extend(["--fake-mode".into(), mode.to_string()]);
    }
    if let Some(state) = state {
        command.extend(["--fake-state".into(), state.display().to_string()]);
    }
    format!(
        "[[model]]\nid = \"{id}\"\ncommand = {}\n\n",
        serde_json::to_string(&command).unwrap()
    )
}

#[test]
fn an_engine_that_dies_before_answering_gets_the_request_again_and_the_client_never_knows() {
    let ws = TestWorkspace::new();
    let (openai_state, ollama_state) =
        (ws.path().join("openai.died"), ws.path().join("ollama.died"));
    let toml =
        dying("chat", Some(&openai_state), &[]) + &dying("chat-ollama", Some(&ollama_state), &[]);
    std::fs::write(ws.path().join("arcane.toml"), toml).unwrap();
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);
    let python = crate::support::provisioned("ARCANE_CLIENTS_PYTHON");
    let script = r#"
import os, sys
import ollama, openai
root, token = os.environ["ARCANE_ROOT_URL"], os.environ["ARCANE_TOKEN"]
hi = [{"role": "user", "content": "Hi"}]
reply = openai.OpenAI(base_url=root + "/v1", api_key=token, max_retries=0).chat.completions.create(model="chat", messages=hi)
print("openai", reply.choices[0].message.content)
client = ollama.Client(host=root, headers={"Authorization": f"Bearer {token}"})
print("ollama", client.chat(model="chat-ollama", messages=hi).message.content)
"#;
    let out = run(std::process::Command::new(&python)
        .args(["-c", script])
        .env("ARCANE_ROOT_URL", format!("http://127.0.0.1:{port}"))
        .env("ARCANE_TOKEN", &token));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Each engine died on the request (it left its mark), and each client read the
    // answer of the engine that replaced it.
    assert!(openai_state.exists() && ollama_state.exists());
    assert!(stdout.contains("openai hello from the fake"), "{stdout}");
    assert!(stdout.contains("ollama hello from the fake"), "{stdout}");

    // Said in the events and the logs, for each model, once.
    let replayed: Vec<Value> = serve
        .seen()
        .iter()
        .filter(|l| l["type"] == "local-ai.request.replayed")
        .map(|l| l["data"].clone())
        .collect();
    let models: Vec<&Value> = replayed.iter().map(|d| &d["model"]).collect();
    assert_eq!(
        models,
        [&json!("chat"), &json!("chat-ollama")],
        "{replayed:?}"
    );
    assert!(replayed
        .iter()
        .all(|d| d["key"] == "workspace" && d["pid"].is_u64()));
    let logs = run(ws.arcane().args(["logs", "chat"]));
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert_eq!(logs.matches("replayed").count(), 1, "{logs}");
    // One request, answered: the attempt the crash cut is not counted as one.
    let (_, metrics) = call(port, &token, "GET", "/metrics", None);
    assert_eq!(
        crate::support::metric(&metrics, r#"arcane_requests_total{model="chat"}"#),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        crate::support::metric(&metrics, r#"arcane_request_errors_total{model="chat"}"#),
        0.0
    );
    assert_eq!(row(&ps(&ws), "chat")["crashes"], 1);
    serve.terminate();
}

#[test]
fn an_engine_that_dies_again_is_not_tried_a_third_time() {
    let ws = TestWorkspace::new();
    std::fs::write(ws.path().join("arcane.toml"), dying("always", None, &[])).unwrap();
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);
    let body = json!({"model": "always", "messages": [{"role": "user", "content": "Hi"}]});
    let (status, reply) = call(port, &token, "POST", "/v1/chat/completions", Some(body));
    assert_eq!(status, 502, "{reply}");
    let error: Value = serde_json::from_str(&reply).unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("stopped before its answer was complete"),
        "{error}"
    );
    // Two engines started and died (the first and the replay's), one replay said.
    serve.wait_line("the second crash", Duration::from_secs(60), |l| {
        l["type"] == "local-ai.model.error"
    });
    let starts = serve
        .seen()
        .iter()
        .filter(|l| l["type"] == "local-ai.model.ready" && l["data"]["model"] == "always")
        .count();
    assert_eq!(starts, 2);
    assert_eq!(serve.count("local-ai.request.replayed"), 1);
    serve.terminate();
}

#[test]
fn a_replay_whose_engine_cannot_start_again_is_refused_in_the_shape_of_the_api_called() {
    let ws = TestWorkspace::new();
    let state = ws.path().join("died");
    let toml = dying("claude", Some(&state), &["refuse-restart"]);
    std::fs::write(ws.path().join("arcane.toml"), toml).unwrap();
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);
    let body = json!({
        "model": "claude", "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hi"}],
    });
    let (status, reply) = call(port, &token, "POST", "/v1/messages", Some(body));
    // The engine died on the request (it left its mark), the replay's engine failed to
    // load, and the Anthropic client reads an Anthropic error saying why.
    assert!(state.exists());
    assert!((500..600).contains(&status), "{status} {reply}");
    let error: Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(error["type"], "error", "{error}");
    assert_eq!(error["error"]["type"], "api_error", "{error}");
    assert_eq!(error["error"]["code"], "LOCAL_AI_SERVER_FAILED", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("exited before it was ready")),
        "{error}"
    );
    assert_eq!(serve.count("local-ai.request.replayed"), 1);
    serve.terminate();
}

#[test]
fn the_real_llama_server_killed_mid_request_still_answers_the_client() {
    let ws = gateway_workspace(
        "[[model]]\nid = \"smol\"\nmodel = \"smollm2-135m\"\nargs = [\"-c\", \"1024\"]\nload = \"on-start\"\n",
    );
    let mut serve = start(&ws);
    serve.wait_for("local-ai.model.ready", Duration::from_secs(180));
    let (port, token) = host_endpoint(&ws);
    let engine = row(&ps(&ws), "smol")["pid"].as_u64().unwrap() as u32;
    // A whole (not streamed) answer: no byte reaches the client before it is done. Long
    // enough to be still in work when the kill comes, on a fast machine too.
    let body = json!({
        "model": "smol",
        "messages": [{"role": "user", "content": "Count to one thousand."}],
        "max_tokens": 400, "ignore_eos": true,
    });
    let answer =
        std::thread::spawn(move || call(port, &token, "POST", "/v1/chat/completions", Some(body)));
    // Killed once it works on the request.
    let (port, token) = host_endpoint(&ws);
    crate::support::wait_until(
        Duration::from_secs(60),
        "the engine to take the request",
        || {
            let (_, slots) = call(port, &token, "GET", "/slots", None);
            slots.contains("\"is_processing\":true")
        },
    );
    crate::serve::signal(engine, "KILL");
    let (status, reply) = answer.join().unwrap();
    assert_eq!(status, 200, "{reply}");
    let reply: Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(reply["usage"]["completion_tokens"], 400, "{reply}");
    let replayed = serve.wait_for("local-ai.request.replayed", Duration::from_secs(10));
    assert_eq!(replayed["data"]["pid"], engine);
    assert_ne!(
        row(&ps(&ws), "smol")["pid"],
        engine,
        "served by a new engine"
    );
    serve.terminate();
}
