//! Issue 34, item 1: a key per application. `arcane token add|list|revoke` with the real
//! host, llama-server and SmolLM2; the official `openai`, `anthropic` and `ollama`
//! clients each send the key their own way; an `inference` key reaches only the
//! inference paths and its models; `/metrics` and the logs name it; a revoke refuses it
//! at once and cuts its open stream.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::front_door::{call, parsed, run_client};
use crate::gateway::{gateway_workspace, start};
use crate::serve::{host_endpoint, signal};
use crate::support::{json as json_of, run, wait_until, TestWorkspace};

const TWO_MODELS: &str = r#"
[[model]]
id = "smol"
model = "smollm2-135m"
args = ["-c", "4096"]

[[model]]
id = "smol-b"
model = "smollm2-135m"
args = ["-c", "1024"]
"#;

/// `arcane token add` with `args`: its JSON (`{name, token, scope, priority, models}`).
pub(crate) fn add_key(ws: &TestWorkspace, args: &[&str]) -> Value {
    let out = run(ws
        .arcane()
        .args(["--output", "json", "token", "add"])
        .args(args));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json_of(&out)
}

/// The `arcane token list --output json` rows.
fn key_rows(ws: &TestWorkspace) -> Vec<Value> {
    let out = run(ws.arcane().args(["--output", "json", "token", "list"]));
    assert!(out.status.success());
    json_of(&out)["keys"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn application_keys_reach_what_their_scope_and_models_allow() {
    let python = crate::support::provisioned("ARCANE_CLIENTS_PYTHON");
    let scripts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/clients");
    let ws = gateway_workspace(TWO_MODELS);
    let app = add_key(&ws, &["app", "--models", "smol", "--priority", "high"]);
    assert_eq!(
        (
            &app["name"],
            &app["scope"],
            &app["priority"],
            &app["models"]
        ),
        (
            &json!("app"),
            &json!("inference"),
            &json!("high"),
            &json!(["smol"])
        )
    );
    let app_key = app["token"].as_str().unwrap().to_string();
    let ops_key = add_key(&ws, &["ops", "--scope", "admin"])["token"]
        .as_str()
        .unwrap()
        .to_string();
    // The keys file keeps no key, and is the user's alone.
    let file = ws.path().join(".arcane/keys.json");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains(&app_key) && !text.contains(&ops_key));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);
    let mut client = Command::new(&python);
    client
        .arg(scripts.join("keys_client.py"))
        .env("ARCANE_ROOT_URL", format!("http://127.0.0.1:{port}"))
        .env("ARCANE_APP_KEY", &app_key)
        .env("ARCANE_MODEL", "smol")
        .env("ARCANE_OTHER_MODEL", "smol-b")
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("ANTHROPIC_BASE_URL");
    run_client(
        client,
        &[
            "openai models.list shows only the key's models",
            "openai chat.completions",
            "openai another model is 403 naming the allowed ones",
            "openai the other model is not found",
            "anthropic messages.create with x-api-key",
            "anthropic another model is a permission_error",
            "ollama list shows only the key's models",
            "ollama chat",
            "ollama another model is 403",
            "inference key refused POST /v1/rpc",
            "inference key refused GET /v1/events",
            "inference key refused GET /v1/logs",
            "inference key refused GET /metrics",
            "inference key refused POST /props",
            "inference key refused GET /slots",
            "inference key refused /api/pull in Ollama's shape",
        ],
    );

    // An admin key does what the workspace token does.
    let frame = json!({"protocol": "arcane/1", "type": "request", "id": "1", "method": "models.list", "params": {}});
    let (status, body) = call(port, &ops_key, "POST", "/v1/rpc", Some(frame));
    assert_eq!(status, 200, "{body}");
    assert_eq!(parsed("/v1/rpc", &body)["ok"], true, "{body}");
    // Nothing the denied requests asked for was loaded.
    let rows = crate::gateway::ps(&ws);
    assert_eq!(crate::gateway::row(&rows, "smol-b")["state"], "stopped");

    // `/metrics` and the logs name the key by its name, never the key.
    let (status, metrics) = call(port, &token, "GET", "/metrics", None);
    assert_eq!(status, 200);
    let app_requests = crate::support::metric(
        &metrics,
        r#"arcane_key_requests_total{key="app",model="smol"}"#,
    );
    assert_eq!(
        app_requests, 3.0,
        "openai, anthropic and ollama chats:\n{metrics}"
    );
    let logs = run(ws.arcane().args(["logs", "smol"]));
    let logs = String::from_utf8_lossy(&logs.stdout).into_owned();
    assert_eq!(
        logs.lines()
            .filter(|l| l.contains("request key=app"))
            .count(),
        3,
        "{logs}"
    );
    for text in [&metrics, &logs] {
        assert!(!text.contains(&app_key) && !text.contains(&ops_key));
    }
    // `token list` shows when it was last used (the host writes it down within a poll).
    wait_until(Duration::from_secs(30), "app's last use", || {
        key_rows(&ws)
            .iter()
            .any(|r| r["name"] == "app" && r["lastUsed"].is_string())
    });
    let rows = key_rows(&ws);
    assert!(rows
        .iter()
        .all(|r| r.get("token").is_none() && r.get("hash").is_none()));
    let app = rows.iter().find(|r| r["name"] == "app").unwrap();
    assert_eq!(
        (&app["scope"], &app["priority"], &app["models"]),
        (&json!("inference"), &json!("high"), &json!(["smol"]))
    );
    assert!(
        app["created"].as_str().is_some_and(|c| c.ends_with('Z')),
        "{app}"
    );

    signal(serve.pid(), "TERM");
    assert_eq!(serve.wait_exit(Duration::from_secs(60)), Some(0));
}

/// Sends a streamed chat of `tokens` tokens for `model` with `key`, not stopped early,
/// and reads until its first event: the open connection, and what it read.
pub(crate) fn open_stream(
    port: u16,
    key: &str,
    model: &str,
    tokens: u32,
) -> (std::net::TcpStream, String) {
    let body = json!({
        "model": model,
        "messages": [{"role": "user", "content": "Count from one to one thousand."}],
        "stream": true,
        "max_tokens": tokens,
        "ignore_eos": true,
    })
    .to_string();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut seen = String::new();
    let mut buffer = [0u8; 4096];
    while !seen.contains("data: ") {
        let n = stream.read(&mut buffer).expect("the stream's first event");
        assert!(n > 0, "the stream ended before its first event: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buffer[..n]));
    }
    (stream, seen)
}

#[test]
fn a_revoked_key_is_refused_at_once_and_its_open_stream_is_cut() {
    let ws = gateway_workspace(TWO_MODELS);
    let app_key = add_key(&ws, &["app"])["token"]
        .as_str()
        .unwrap()
        .to_string();
    let other_key = add_key(&ws, &["other"])["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);
    let (mut revoked_stream, mut seen) = open_stream(port, &app_key, "smol", 3000);
    let (mut kept_stream, _) = open_stream(port, &other_key, "smol", 3000);

    let out = run(ws.arcane().args(["token", "revoke", "app"]));
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("revoked the key `app`"));

    // The revoked key's stream ends (the connection is closed) before its answer is
    // complete; the other key's goes on.
    let mut buffer = [0u8; 4096];
    loop {
        match revoked_stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buffer[..n])),
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(error) => panic!("the revoked key's stream was not closed: {error}"),
        }
    }
    assert!(!seen.contains("[DONE]"), "it ran to its end: {seen}");
    let n = kept_stream
        .read(&mut buffer)
        .expect("the other stream goes on");
    assert!(n > 0);
    drop(kept_stream);

    // The key is refused from its next request on; the other key and the token work.
    let chat =
        json!({"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    let (status, body) = call(
        port,
        &app_key,
        "POST",
        "/v1/chat/completions",
        Some(chat.clone()),
    );
    assert_eq!(status, 401, "{body}");
    let (status, _) = call(
        port,
        &other_key,
        "POST",
        "/v1/chat/completions",
        Some(chat.clone()),
    );
    assert_eq!(status, 200);
    let (status, _) = call(port, &token, "POST", "/v1/chat/completions", Some(chat));
    assert_eq!(status, 200);
    // A key added while the host runs works without a restart.
    let late = add_key(&ws, &["late"])["token"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, _) = call(port, &late, "GET", "/v1/models", None);
    assert_eq!(status, 200);

    let listed: Vec<Value> = key_rows(&ws).iter().map(|r| r["name"].clone()).collect();
    assert_eq!(listed, [json!("other"), json!("late")]);
    signal(serve.pid(), "TERM");
    assert_eq!(serve.wait_exit(Duration::from_secs(60)), Some(0));
}

#[test]
fn key_mistakes_are_refused_naming_the_value() {
    let ws = TestWorkspace::new();
    add_key(&ws, &["app"]);
    for (args, code, needle) in [
        (vec!["add", "app"], "ARCANE_ALREADY_EXISTS", "`app`"),
        (vec!["add", "Bad Name"], "ARCANE_USAGE", "`Bad Name`"),
        (vec!["add", "workspace"], "ARCANE_USAGE", "`workspace`"),
        (vec!["revoke", "nobody"], "ARCANE_NOT_FOUND", "`nobody`"),
    ] {
        let out = run(ws.arcane().args(["--output", "json", "token"]).args(&args));
        assert!(!out.status.success(), "{args:?}");
        let error = &json_of(&out)["error"];
        assert_eq!(error["code"], code, "{args:?}: {error}");
        assert!(
            error["message"]
                .as_str()
                .unwrap_or_default()
                .contains(needle),
            "{args:?}: {error}"
        );
    }
    // A keys file others may read is refused, with the fix.
    use std::os::unix::fs::PermissionsExt;
    let file = ws.path().join(".arcane/keys.json");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run(ws.arcane().args(["token", "list"]));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("chmod 600"));
}
