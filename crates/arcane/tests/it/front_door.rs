//! Issue 11: one front door. With the real llama-server and SmolLM2: an owned engine
//! has no TCP port (a private socket), or, on a url the user asked for, a port that
//! answers 401 without its key; the browser attacks get nothing from any port
//! Arcane's processes listen on; the engine's whole API goes through the Core's token;
//! the official `openai` (PyPI and npm) and `anthropic` clients work unchanged.
#![allow(clippy::disallowed_methods)] // tests read the provisioned paths from the environment

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::serve::{
    fake_serve_args, free_port, host_endpoint, real_args, real_socket_args, signal, strs,
    wait_gone, wait_host_ready, Serve, START,
};
use crate::support::{run, TestWorkspace};

/// A foreign web page's origin (`.invalid` never resolves: nothing is ever contacted).
const FOREIGN_ORIGIN: &str = "http://attacker.invalid";

/// One HTTP/1.1 exchange on 127.0.0.1:`port`: status, lower-cased head, body.
pub(crate) fn exchange(port: u16, request: &str) -> (u16, String, String) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(300)))
        .expect("a read timeout");
    stream.write_all(request.as_bytes()).expect("send");
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_string())
}

/// `method path` through the Core on `port` with `token` and a JSON `body`.
pub(crate) fn call(
    port: u16,
    token: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, String) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, _, body) = exchange(port, &request);
    (status, body)
}

/// The JSON of a body, or a panic naming the path.
pub(crate) fn parsed(path: &str, body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {body}"))
}

/// The engine's pid from a `local-ai.server.ready` line.
pub(crate) fn engine_pid(ready: &Value) -> u32 {
    ready["data"]["pid"]
        .as_u64()
        .expect("an owned engine's pid") as u32
}

/// The pids of `pid` and everything it started (children, grandchildren).
pub(crate) fn process_tree(pid: u32) -> Vec<u32> {
    let mut tree = vec![pid];
    let mut index = 0;
    while index < tree.len() {
        let parent = tree[index];
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            let ppid = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(parent) && !tree.contains(&child) {
                tree.push(child);
            }
        }
        index += 1;
    }
    tree
}

/// Every TCP address `serve` and the processes it started listen on.
fn listeners_of_tree(pid: u32) -> Vec<SocketAddr> {
    let mut all: Vec<SocketAddr> = process_tree(pid)
        .into_iter()
        .flat_map(|p| arcane_process::tcp_listeners(p).unwrap_or_default())
        .collect();
    all.sort();
    all.dedup();
    all
}

/// The three browser attacks against `port`, none with a token or key: a `text/plain`
/// POST from a foreign origin (no CORS preflight), a DNS-rebinding `Host`, and a CORS
/// preflight. The two requests must be refused (a refusal's CORS headers let a page
/// read only the refusal); the preflight may reveal nothing, and when it is answered
/// at all, the request it clears is the refused one.
fn browser_attacks_get_nothing(port: u16) {
    let body = r#"{"messages":[{"role":"user","content":"Say hi."}],"max_tokens":4}"#;
    let simple = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: {FOREIGN_ORIGIN}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let rebinding = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: attacker.invalid:{port}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let preflight = format!(
        "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: {FOREIGN_ORIGIN}\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type\r\nConnection: close\r\n\r\n"
    );
    for (name, request) in [
        ("text/plain POST", simple),
        ("DNS rebinding", rebinding),
        ("preflight", preflight),
    ] {
        let (status, head, body) = exchange(port, &request);
        assert!(!body.contains("choices"), "{name} on {port}: {body}");
        if name == "preflight" {
            assert!(
                body.trim().is_empty() || body.contains("error"),
                "{name} on {port}: {body}"
            );
            continue;
        }
        assert!(
            !(200..300).contains(&status),
            "{name} on port {port} was answered {status}: {head}{body}"
        );
    }
}

#[test]
fn an_owned_engine_has_no_port_and_its_whole_api_goes_through_the_token() {
    let ws = TestWorkspace::new();
    let mut args = real_socket_args();
    args.extend(["--alias", "smol", "--", "--metrics", "--parallel", "2"].map(String::from));
    let mut serve = Serve::start(&ws, &strs(&args));
    let ready = serve.wait_for("local-ai.server.ready", START);
    let engine = engine_pid(&ready);
    wait_host_ready(&ws);
    let (port, token) = host_endpoint(&ws);

    // 1. No TCP listener belongs to the engine; the Core's port is the only one, and
    //    the browser attacks get nothing from it.
    assert_eq!(arcane_process::tcp_listeners(engine).unwrap(), []);
    let listeners = listeners_of_tree(serve.pid());
    assert_eq!(
        listeners.iter().map(SocketAddr::port).collect::<Vec<_>>(),
        [port],
        "{listeners:?}"
    );
    for listener in &listeners {
        browser_attacks_get_nothing(listener.port());
    }
    let status = run(ws.arcane().args(["--output", "json", "status"]));
    let status = crate::support::json(&status);
    assert_eq!(
        status["engines"][0]["reachableWithoutToken"], false,
        "{status}"
    );
    let human = crate::support::stdout(&run(ws.arcane().arg("status")));
    assert!(
        human.contains("private socket: reachable only through the Core"),
        "{human}"
    );

    // 2. Every path of the engine's API, through the front door.
    let (code, body) = call(port, &token, "GET", "/v1/models", None);
    assert_eq!(code, 200, "{body}");
    assert_eq!(parsed("/v1/models", &body)["data"][0]["id"], "smol");
    let (code, body) = call(port, &token, "GET", "/v1/models/smol", None);
    assert_eq!(
        (code, parsed("/v1/models/smol", &body)["id"].clone()),
        (200, json!("smol"))
    );
    let (code, body) = call(port, &token, "GET", "/v1/models/nope", None);
    assert_eq!(code, 404, "{body}");
    assert_eq!(
        parsed("/v1/models/nope", &body)["error"]["code"],
        "model_not_found"
    );
    let (code, body) = call(port, &token, "GET", "/props", None);
    assert_eq!(code, 200, "{body}");
    assert!(
        parsed("/props", &body).get("build_info").is_some(),
        "{body}"
    );
    let (code, body) = call(port, &token, "GET", "/slots", None);
    assert_eq!(code, 200, "{body}");
    assert!(
        parsed("/slots", &body)
            .as_array()
            .is_some_and(|s| s.len() == 2),
        "{body}"
    );
    // `/metrics` is the gateway's (the main job is a gateway of one model); the
    // engine's own, with its `--metrics`, is `?model=ID`.
    let (code, body) = call(port, &token, "GET", "/metrics", None);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("arcane_requests_total"), "{body}");
    let (code, body) = call(port, &token, "GET", "/metrics?model=smol", None);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("llamacpp:"), "{body}");

    let messages = json!([{"role": "user", "content": "Say hi."}]);
    let posts = [
        (
            "/v1/completions",
            json!({"prompt": "The sky is", "max_tokens": 4}),
            "/choices/0/text",
        ),
        ("/v1/embeddings", json!({"input": "x"}), ""),
        ("/tokenize", json!({"content": "hello world"}), "/tokens/0"),
        ("/apply-template", json!({"messages": messages}), "/prompt"),
        (
            "/v1/responses",
            json!({"input": "Say hi.", "max_output_tokens": 4}),
            "/output",
        ),
        (
            "/v1/messages",
            json!({"model": "smol", "max_tokens": 4, "messages": messages}),
            "/content/0/text",
        ),
        (
            "/v1/messages/count_tokens",
            json!({"model": "smol", "messages": messages}),
            "/input_tokens",
        ),
    ];
    for (path, request, pointer) in posts {
        let (code, body) = call(port, &token, "POST", path, Some(request));
        if pointer.is_empty() {
            // Not served in this engine configuration: the engine's own answer.
            assert!(
                parsed(path, &body)["error"]["message"].is_string(),
                "{path}: {body}"
            );
            assert!(!body.contains("ARCANE_"), "{path}: {body}");
            continue;
        }
        assert_eq!(code, 200, "{path}: {body}");
        assert!(
            parsed(path, &body).pointer(pointer).is_some(),
            "{path}: {body}"
        );
    }
    let (_, body) = call(
        port,
        &token,
        "POST",
        "/tokenize",
        Some(json!({"content": "lighthouse"})),
    );
    let tokens = parsed("/tokenize", &body)["tokens"].clone();
    let (code, body) = call(
        port,
        &token,
        "POST",
        "/detokenize",
        Some(json!({"tokens": tokens})),
    );
    assert_eq!(code, 200, "{body}");
    assert!(parsed("/detokenize", &body)["content"]
        .as_str()
        .unwrap()
        .contains("lighthouse"));
    // Reranking is off in this configuration: both spellings get the engine's answer.
    for path in ["/v1/rerank", "/rerank"] {
        let (code, body) = call(
            port,
            &token,
            "POST",
            path,
            Some(json!({"query": "q", "documents": ["a"]})),
        );
        assert_ne!(code, 200, "{path}: {body}");
        assert!(
            !body.contains("ARCANE_"),
            "{path} must be the engine's answer: {body}"
        );
    }
    // A path no engine route serves: the gateway's own 404 naming it, and nothing is
    // forwarded (the main job is a gateway of one model).
    let (code, body) = call(port, &token, "GET", "/no/such/path", None);
    assert_eq!(code, 404, "{body}");
    assert!(
        body.contains("ARCANE_NOT_FOUND") && body.contains("/no/such/path"),
        "{body}"
    );

    // 3. A stream comes through chunk by chunk, and a client that goes away stops the
    //    engine's work on it.
    let (code, body) = call(
        port,
        &token,
        "POST",
        "/v1/chat/completions",
        Some(json!({"messages": messages, "max_tokens": 8, "stream": true})),
    );
    assert_eq!(code, 200);
    assert!(
        body.matches("data: ").count() >= 3 && body.contains("data: [DONE]"),
        "{body}"
    );
    let endless = json!({"messages": [{"role": "user", "content": "Count to one million."}],
        "max_tokens": 6000, "ignore_eos": true, "stream": true})
    .to_string();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{endless}",
                endless.len()
            )
            .as_bytes(),
        )
        .unwrap();
    let mut first = [0u8; 512];
    let _ = stream.read(&mut first).unwrap();
    let busy = |expected: bool| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, body) = call(port, &token, "GET", "/slots", None);
            if body.contains("\"is_processing\":true") == expected {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "slots never became processing={expected}: {body}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    busy(true);
    drop(stream);
    busy(false);

    serve.terminate();
    assert!(wait_gone(engine, Duration::from_secs(10)));
}

#[test]
fn an_owned_engine_on_a_url_answers_401_to_everyone_but_the_core() {
    let ws = TestWorkspace::new();
    let engine_port = free_port();
    let mut serve = Serve::start(&ws, &strs(&real_args(engine_port)));
    let ready = serve.wait_for("local-ai.server.ready", START);
    let engine = engine_pid(&ready);
    wait_host_ready(&ws);
    let (port, token) = host_endpoint(&ws);
    assert_eq!(
        arcane_process::tcp_listeners(engine).unwrap(),
        [format!("127.0.0.1:{engine_port}")
            .parse::<SocketAddr>()
            .unwrap()]
    );
    // Without the key, the engine's port refuses everything that reveals or does
    // anything; the key is on no command line.
    let body = r#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4}"#;
    for (method, path) in [
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/models"),
        ("GET", "/slots"),
        ("GET", "/props"),
    ] {
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{engine_port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let (status, _, reply) = exchange(engine_port, &request);
        assert_eq!(status, 401, "{method} {path}: {reply}");
    }
    let key = std::fs::read_to_string(ws.path().join(".arcane/run/llama.cpp.key")).unwrap();
    assert!(!crate::serve::proc_list(engine, "cmdline")
        .iter()
        .any(|a| a.contains(key.trim())));
    // Every port of the process tree (the Core's and the engine's) refuses the
    // browser attacks.
    for listener in listeners_of_tree(serve.pid()) {
        browser_attacks_get_nothing(listener.port());
    }
    // The Core adds the key: the same request through the front door is answered.
    let (code, reply) = call(
        port,
        &token,
        "POST",
        "/v1/chat/completions",
        Some(parsed("body", body)),
    );
    assert_eq!(code, 200, "{reply}");
    let human = crate::support::stdout(&run(ws.arcane().arg("status")));
    assert!(
        human.contains("port behind a key only the Core knows"),
        "{human}"
    );
    serve.terminate();
    assert!(
        !ws.path().join(".arcane/run/llama.cpp.key").exists(),
        "the key file goes with the engine"
    );
}

/// Runs one client script; panics with its output unless every check passed.
pub(crate) fn run_client(mut command: Command, checks: &[&str]) {
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

#[test]
fn the_official_openai_and_anthropic_clients_work_through_the_front_door() {
    let python = crate::support::provisioned("ARCANE_CLIENTS_PYTHON");
    let node_modules = crate::support::provisioned("ARCANE_NODE_CLIENTS");
    let scripts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/clients");

    // One engine for chat, one configured for embeddings (llama.cpp's `--embeddings`
    // restricts an engine to them), each behind its own Core.
    let chat_ws = TestWorkspace::new();
    let mut args = real_socket_args();
    args.extend(["--alias", "smol"].map(String::from));
    let mut chat = Serve::start(&chat_ws, &strs(&args));
    let embed_ws = TestWorkspace::new();
    let mut args = real_socket_args();
    args.extend(
        [
            "--alias",
            "smol-embed",
            "--",
            "--embeddings",
            "--pooling",
            "mean",
        ]
        .map(String::from),
    );
    let mut embed = Serve::start(&embed_ws, &strs(&args));
    chat.wait_for("local-ai.server.ready", START);
    embed.wait_for("local-ai.server.ready", START);
    wait_host_ready(&chat_ws);
    wait_host_ready(&embed_ws);
    let (port, token) = host_endpoint(&chat_ws);
    let (embed_port, embed_token) = host_endpoint(&embed_ws);
    assert_ne!(token, embed_token, "each workspace has its own token");

    let env = |command: &mut Command| {
        command
            .env("ARCANE_BASE_URL", format!("http://127.0.0.1:{port}/v1"))
            .env("ARCANE_ROOT_URL", format!("http://127.0.0.1:{port}"))
            .env("ARCANE_TOKEN", &token)
            .env("ARCANE_MODEL", "smol")
            .env(
                "ARCANE_EMBED_BASE_URL",
                format!("http://127.0.0.1:{embed_port}/v1"),
            )
            .env("ARCANE_EMBED_MODEL", "smol-embed")
            // The embedding engine has its own token; the clients use one key.
            .env("ARCANE_EMBED_TOKEN", &embed_token)
            .env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("ANTHROPIC_BASE_URL");
    };
    let mut openai = Command::new(&python);
    openai.arg(scripts.join("openai_client.py"));
    env(&mut openai);
    run_client(
        openai,
        &[
            "models.list",
            "models.retrieve",
            "models.retrieve unknown",
            "chat.completions",
            "chat.completions stream",
            "completions",
            "responses.create",
            "responses.create stream",
            "wrong token",
            "embeddings.create",
        ],
    );
    let mut anthropic = Command::new(&python);
    anthropic.arg(scripts.join("anthropic_client.py"));
    env(&mut anthropic);
    run_client(
        anthropic,
        &[
            "messages.create",
            "messages.create stream",
            "messages.count_tokens",
            "messages.create with api_key (x-api-key)",
            "a wrong api_key is refused",
        ],
    );
    let mut node = Command::new("node");
    node.arg(scripts.join("openai_client.cjs"))
        .env("NODE_PATH", &node_modules);
    env(&mut node);
    run_client(
        node,
        &[
            "models.list",
            "models.retrieve",
            "chat.completions stream",
            "responses.create",
            "embeddings.create",
            "wrong token",
        ],
    );
    signal(chat.pid(), "TERM");
    signal(embed.pid(), "TERM");
    assert_eq!(chat.wait_exit(Duration::from_secs(60)), Some(0));
    assert_eq!(embed.wait_exit(Duration::from_secs(60)), Some(0));
}

#[test]
fn the_listen_address_comes_from_the_flag_or_arcane_toml_and_the_ready_line_names_it() {
    let ws = TestWorkspace::new();
    let wanted = free_port();
    let engine = fake_serve_args(&ws, free_port(), &[]);
    let mut args = vec!["--listen".to_string(), format!("127.0.0.1:{wanted}")];
    args.extend(engine.iter().cloned());
    let mut serve = Serve::start(&ws, &strs(&args));
    let listening = serve.wait_for("core.listening", Duration::from_secs(60));
    assert_eq!(
        listening["data"]["url"],
        format!("http://127.0.0.1:{wanted}")
    );
    signal(serve.pid(), "TERM");
    serve.wait_exit(Duration::from_secs(60));

    let from_file = free_port();
    std::fs::write(
        ws.path().join("arcane.toml"),
        format!("listen = \"localhost:{from_file}\"\n"),
    )
    .unwrap();
    let output = ws
        .arcane()
        .args(["serve", "--port", &wanted.to_string()])
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(2),
        "a port that contradicts `listen` is a usage error"
    );
    assert!(String::from_utf8_lossy(&output.stderr).contains(&from_file.to_string()));
    let mut serve = Serve::start(&ws, &strs(&engine));
    let listening = serve.wait_for("core.listening", Duration::from_secs(60));
    assert_eq!(
        listening["data"]["url"],
        format!("http://127.0.0.1:{from_file}")
    );
    signal(serve.pid(), "TERM");
    serve.wait_exit(Duration::from_secs(60));

    for bad in ["127.0.0.1:http", "localhost:0", "nowhere"] {
        let output = ws
            .arcane()
            .args(["serve", "--listen", bad])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{bad}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(bad), "{bad}: {stderr}");
    }
}
