//! Ollama's API on the front door, with the real llama-server and SmolLM2 behind
//! `arcane serve`'s gateway: the official `ollama` clients (Python and npm) and
//! litellm's `ollama_chat/` list, show, chat, generate and embed through the Core's
//! token; errors have Ollama's shape; the gateway's metrics count the requests.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::front_door::{call, exchange};
use crate::gateway::{gateway_workspace, start};
use crate::serve::{host_endpoint, signal};

/// A chat model and an embedding model (llama.cpp's `--embeddings` restricts an
/// engine to embeddings), both SmolLM2 (the registered file, so it has a digest).
const MODELS: &str = r#"
[[model]]
id = "smol"
model = "smollm2-135m"
# As `docs/gateway.toml.example` writes it: less than the file's 8192, which
# `/api/show` must not report (a client sends it back as `num_ctx`).
args = ["-c", "2048"]

[[model]]
id = "smol-embed"
model = "smollm2-135m"
args = ["--embeddings", "--pooling", "mean"]
"#;

/// Runs one client script; panics with its output unless every check passed.
fn run_client(mut command: Command, checks: &[&str]) {
    let output = command.output().expect("start the client");
    let out = String::from_utf8_lossy(&output.stdout);
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{command:?} failed:\n{out}\n{err}");
    for check in checks {
        assert!(
            out.lines().any(|l| l == format!("ok {check}")),
            "`{check}` did not pass:\n{out}\n{err}"
        );
    }
}

/// A chunked body, joined.
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || after.len() < size {
            break;
        }
        out.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    out
}

/// `POST path` with `body`: status, lower-cased head, the body's text.
fn post(port: u16, token: &str, path: &str, body: &Value) -> (u16, String, String) {
    let body = body.to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, head, body) = exchange(port, &request);
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(&body)
    } else {
        body
    };
    (status, head, body)
}

fn metric(text: &str, name: &str, model: &str) -> f64 {
    let prefix = format!("{name}{{model=\"{model}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in {text}"))
        .parse()
        .unwrap()
}

#[test]
fn ollamas_clients_and_litellm_work_through_the_front_door_with_the_token() {
    let python = crate::support::provisioned("ARCANE_CLIENTS_PYTHON");
    let node_modules = crate::support::provisioned("ARCANE_NODE_CLIENTS");
    let scripts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/clients");
    let ws = gateway_workspace(MODELS);
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);

    // No unauthenticated path: the listing needs the token, as `x-api-key` too. The
    // refusal is in Ollama's shape under `/api/` (its clients read `error` as a
    // string), Arcane's elsewhere, and both say where the token is.
    let refused = |path: &str| {
        let (code, _, body) = exchange(
            port,
            &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"),
        );
        (code, serde_json::from_str::<Value>(&body).unwrap())
    };
    let (code, body) = refused("/api/tags");
    assert_eq!(code, 401);
    assert_eq!(body["code"], "CORE_UNAUTHORIZED", "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("arcane token show"),
        "{body}"
    );
    let (code, body) = refused("/v1/models");
    assert_eq!(code, 401);
    assert_eq!(body["error"]["code"], "CORE_UNAUTHORIZED", "{body}");
    // The Core's own answers under `/api/` too: an unknown path, a wrong method.
    // A client given the OpenAI base URL (`…/v1`) is told to drop it, in its shape.
    for (request, status) in [
        ("GET /api/nope", 404),
        ("GET /api/chat", 405),
        ("GET /v1/api/tags", 404),
    ] {
        let (code, _, body) = exchange(
            port,
            &format!("{request} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(code, status, "{request}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        let said = body["error"].as_str().unwrap();
        assert!(said.contains("/api/"), "{request}: {body}");
        assert_eq!(
            said.contains("without `/v1`"),
            request.contains("/v1/"),
            "{request}: {body}"
        );
    }
    let (code, _, body) = exchange(
        port,
        &format!("GET /api/tags HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nx-api-key: {token}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(code, 200, "{body}");
    let tags: Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["smol:latest", "smol-embed:latest"], "{body}");
    // The dashboard's playground offers the models that chat: not an embedder.
    let rows = crate::gateway::ps(&ws);
    let chats: Vec<(&str, bool)> = rows
        .iter()
        .map(|r| (r["id"].as_str().unwrap(), r["chat"].as_bool().unwrap()))
        .collect();
    assert_eq!(chats, [("smol", true), ("smol-embed", false)], "{rows:?}");
    // Listing loads nothing.
    let (code, ps) = call(port, &token, "GET", "/api/ps", None);
    assert_eq!(
        (code, serde_json::from_str::<Value>(&ps).unwrap()),
        (200, json!({"models": []}))
    );

    // Ollama's error shape: an unknown model names the known ones; pull names the
    // Arcane command; a malformed request is a 400.
    let (code, _, body) = post(
        port,
        &token,
        "/api/chat",
        &json!({"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(code, 404, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("smol:latest, smol-embed:latest"),
        "{body}"
    );
    let (code, _, body) = post(port, &token, "/api/pull", &json!({"model": "llama3"}));
    assert_eq!(code, 501, "{body}");
    assert!(serde_json::from_str::<Value>(&body).unwrap()["error"]
        .as_str()
        .unwrap()
        .contains("arcane model add"));
    let (code, _, body) = post(
        port,
        &token,
        "/api/chat",
        &json!({"model": "smol", "messages": "hi"}),
    );
    assert_eq!(code, 400, "{body}");
    assert!(
        serde_json::from_str::<Value>(&body).unwrap()["error"].is_string(),
        "{body}"
    );

    // A whole chat (loading the model on demand) and a streamed generate (NDJSON).
    let (code, _, body) = post(
        port,
        &token,
        "/api/chat",
        &json!({"model": "smol:latest", "messages": [{"role": "user", "content": "Say hi."}], "stream": false, "options": {"num_predict": 6}}),
    );
    assert_eq!(code, 200, "{body}");
    let chat: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(chat["done"], true, "{body}");
    assert_eq!(chat["model"], "smol:latest");
    let eval_count = chat["eval_count"].as_u64().unwrap();
    assert!(
        eval_count > 0 && chat["prompt_eval_count"].as_u64().unwrap() > 0,
        "{body}"
    );
    let (code, head, body) = post(
        port,
        &token,
        "/api/generate",
        &json!({"model": "smol", "prompt": "One, two,", "options": {"num_predict": 4}}),
    );
    assert_eq!(code, 200, "{body}");
    assert!(
        head.contains("content-type: application/x-ndjson"),
        "{head}"
    );
    let lines: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = lines.last().unwrap();
    assert_eq!(last["done"], true, "{body}");
    for field in [
        "total_duration",
        "load_duration",
        "prompt_eval_count",
        "prompt_eval_duration",
        "eval_count",
        "eval_duration",
    ] {
        assert!(last[field].is_u64(), "{field} in {last}");
    }
    assert!(
        lines[..lines.len() - 1]
            .iter()
            .all(|l| l["done"] == false && l["response"].is_string()),
        "{body}"
    );

    // The gateway's metrics count them, with the engine's tokens.
    let (code, text) = call(port, &token, "GET", "/metrics", None);
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        metric(&text, "arcane_requests_total", "smol"),
        2.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "arcane_request_errors_total", "smol"),
        0.0,
        "{text}"
    );
    assert!(
        metric(&text, "arcane_completion_tokens_total", "smol") >= eval_count as f64,
        "{text}"
    );

    let env = |command: &mut Command| {
        command
            .env("ARCANE_ROOT_URL", format!("http://127.0.0.1:{port}"))
            .env("ARCANE_TOKEN", &token)
            .env("ARCANE_MODEL", "smol")
            .env("ARCANE_EMBED_MODEL", "smol-embed")
            .env_remove("OLLAMA_HOST")
            .env_remove("OLLAMA_API_BASE")
            .env_remove("OPENAI_API_KEY");
    };
    let mut py = Command::new(&python);
    py.arg(scripts.join("ollama_client.py"));
    env(&mut py);
    run_client(
        py,
        &[
            "list",
            "list details",
            "show",
            "chat",
            "chat stream",
            "ps",
            "generate",
            "generate stream",
            "format schema",
            "embed",
            "embed string",
            "embeddings",
            "unknown model",
            "pull refused",
            "num_ctx",
            "num_ctx served",
            "wrong token",
        ],
    );
    let mut node = Command::new("node");
    node.arg(scripts.join("ollama_client.cjs"))
        .env("NODE_PATH", &node_modules);
    env(&mut node);
    run_client(
        node,
        &[
            "list",
            "show",
            "chat",
            "chat stream",
            "ps",
            "generate",
            "generate stream",
            "embed",
            "unknown model",
            "wrong token",
        ],
    );
    let mut litellm = Command::new(&python);
    litellm.arg(scripts.join("litellm_ollama.py"));
    env(&mut litellm);
    run_client(litellm, &["ollama_chat", "ollama_chat stream"]);

    signal(serve.pid(), "TERM");
    assert_eq!(serve.wait_exit(Duration::from_secs(60)), Some(0));
}
