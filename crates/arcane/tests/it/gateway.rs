//! Issue 12: the model gateway, with the real llama-server and SmolLM2: `[[model]]`
//! entries routed by the request's `model`, loaded on demand (one engine start for
//! many concurrent requests), evicted under `max_loaded` but never with a request in
//! flight, unloaded after `keep_alive`, gone with a killed host; an external `url`
//! entry routed to and never signalled; `arcane ps` agrees with `/proc`.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::front_door::{call, parsed, process_tree};
use crate::serve::{
    alive, free_port, health, host_endpoint, signal, wait_gone, External, Serve, START,
};
use crate::support::{llama_server, run, smollm2, TestWorkspace};

/// A workspace with the real runtime and model registered and `toml` as its
/// `arcane.toml` (`{model}` in it is replaced by the model's path).
pub(crate) fn gateway_workspace(toml: &str) -> TestWorkspace {
    let ws = TestWorkspace::new();
    let ok = |out: std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        )
    };
    ok(run(ws
        .arcane()
        .args([
            "runtime",
            "add",
            "llama.cpp",
            "--backend",
            "cpu",
            "--executable",
        ])
        .arg(llama_server())));
    ok(run(ws
        .arcane()
        .args(["model", "add", "smollm2-135m", "--file"])
        .arg(smollm2())));
    let toml = toml.replace("{model}", &smollm2().display().to_string());
    std::fs::write(ws.path().join("arcane.toml"), toml).unwrap();
    ws
}

/// Starts `arcane serve` on the gateway and waits until its service is ready.
pub(crate) fn start(ws: &TestWorkspace) -> Serve {
    let mut serve = Serve::start(ws, &[]);
    listening(ws, &mut serve);
    serve
}

/// Waits until `serve` listens and its endpoint record has the token; its
/// `core.listening` line.
fn listening(ws: &TestWorkspace, serve: &mut Serve) -> Value {
    let line = serve.wait_for("core.listening", Duration::from_secs(60));
    crate::support::wait_until(Duration::from_secs(60), "core.json", || {
        std::fs::read_to_string(ws.path().join(".arcane/core.json"))
            .is_ok_and(|t| t.contains("token"))
    });
    line
}

/// The ids `/v1/models` lists.
fn listed_ids(ws: &TestWorkspace) -> Vec<Value> {
    let (port, token) = host_endpoint(ws);
    let (code, body) = call(port, &token, "GET", "/v1/models", None);
    assert_eq!(code, 200, "{body}");
    parsed("/v1/models", &body)["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].clone())
        .collect()
}

fn chat(ws: &TestWorkspace, model: Option<&str>) -> (u16, Value) {
    let (port, token) = host_endpoint(ws);
    let mut body = json!({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4});
    if let Some(model) = model {
        body["model"] = json!(model);
    }
    let (status, reply) = call(port, &token, "POST", "/v1/chat/completions", Some(body));
    let value = serde_json::from_str(&reply).unwrap_or(Value::String(reply));
    (status, value)
}

/// The `arcane ps` rows, by model id.
pub(crate) fn ps(ws: &TestWorkspace) -> Vec<Value> {
    let out = run(ws.arcane().args(["--output", "json", "ps"]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    crate::support::json(&out)["models"]
        .as_array()
        .cloned()
        .unwrap()
}

pub(crate) fn row<'a>(rows: &'a [Value], id: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("no `{id}` in {rows:#?}"))
}

/// The llama-server processes under `serve`.
pub(crate) fn engines_of(serve: &Serve) -> Vec<u32> {
    process_tree(serve.pid())
        .into_iter()
        .skip(1)
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim().starts_with("llama-server"))
        })
        .collect()
}

#[test]
fn requests_name_their_model_and_max_loaded_evicts_the_idle_one_but_never_one_in_flight() {
    let ws = gateway_workspace(
        r#"
[[model]]
id = "smol-a"
aliases = ["fast"]
model = "smollm2-135m"
args = ["--parallel", "2"]

[[model]]
id = "smol-b"
model = "{model}"
# How long a load of smol-b waits for room (and may take): long enough for a load on a
# machine busy with other tests, shorter than the endless stream below.
startup_timeout = 25

[devices.cpu]
max_loaded = 1
"#,
    );
    let mut serve = start(&ws);
    // Every configured model is listed, loaded or not; an unknown one is OpenAI's 404.
    let (port, token) = host_endpoint(&ws);
    let (code, body) = call(port, &token, "GET", "/v1/models", None);
    assert_eq!(code, 200, "{body}");
    let listed: Vec<Value> = parsed("/v1/models", &body)["data"]
        .as_array()
        .cloned()
        .unwrap();
    assert_eq!(
        listed.iter().map(|m| m["id"].clone()).collect::<Vec<_>>(),
        [json!("smol-a"), json!("smol-b")]
    );
    assert!(listed.iter().all(|m| m["state"] == "stopped"), "{listed:?}");
    // `arcane status` names each model's engine by the model, loaded or not.
    let status = crate::support::stdout(&run(ws.arcane().arg("status")));
    assert!(
        status.contains("engine  smol-a") && status.contains("engine  smol-b"),
        "{status}"
    );
    assert!(!status.contains("engine  llama.cpp"), "{status}");
    // Nothing loaded, and healthy: models load on demand.
    let (status, _, body) = crate::front_door::exchange(
        port,
        &format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!((status, body.trim()), (200, r#"{"status":"ok"}"#));
    let (code, answer) = chat(&ws, Some("nope"));
    assert_eq!(code, 404, "{answer}");
    assert_eq!(answer["error"]["code"], "model_not_found");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("smol-a"),
        "{answer}"
    );

    // A stream is renamed chunk by chunk: every chunk names the alias asked for.
    let streamed = json!({"model": "fast", "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4, "stream": true});
    let (code, body) = call(port, &token, "POST", "/v1/chat/completions", Some(streamed));
    assert_eq!(code, 200, "{body}");
    let chunks: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(chunks.len() >= 2, "{body}");
    assert!(chunks.iter().all(|c| c["model"] == "fast"), "{body}");
    // Alternating requests: each answers, named as asked; only one engine at a time.
    for model in ["fast", "smol-b", "smol-a", "smol-b"] {
        let (code, answer) = chat(&ws, Some(model));
        assert_eq!(code, 200, "{model}: {answer}");
        assert_eq!(answer["model"], model, "{answer}");
        assert!(
            answer["choices"][0]["message"]["content"].is_string(),
            "{answer}"
        );
        assert_eq!(engines_of(&serve).len(), 1, "max_loaded = 1 on the CPU");
    }
    assert!(serve.evictions() >= 3, "{:#?}", serve.seen());
    // `arcane ps` agrees with /proc.
    let rows = ps(&ws);
    assert_eq!(row(&rows, "smol-a")["state"], "stopped");
    let b = row(&rows, "smol-b");
    assert_eq!(b["state"], "ready");
    let pid = b["pid"].as_u64().unwrap() as u32;
    assert_eq!(engines_of(&serve), [pid]);
    assert!(b["residentBytes"].as_u64().unwrap() > 1 << 20, "{b}");
    assert_eq!(
        arcane_process::tcp_listeners(pid).unwrap(),
        [],
        "the engine has no port"
    );

    // A stream in flight on smol-a: smol-b cannot evict it, and says what holds the
    // device; the stream keeps going.
    let (code, _) = chat(&ws, Some("smol-a"));
    assert_eq!(code, 200);
    let a_pid = row(&ps(&ws), "smol-a")["pid"].as_u64().unwrap() as u32;
    let endless = json!({"model": "smol-a", "messages": [{"role": "user", "content": "Count to one million."}],
        "max_tokens": 8000, "ignore_eos": true, "stream": true})
    .to_string();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .write_all(format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{endless}",
            endless.len()
        ).as_bytes())
        .unwrap();
    let mut first = [0u8; 256];
    let _ = stream.read(&mut first).unwrap();
    assert_eq!(row(&ps(&ws), "smol-a")["inFlight"], 1);
    let (code, answer) = chat(&ws, Some("smol-b"));
    assert_eq!(code, 503, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("smol-a") && message.contains("in flight"),
        "{answer}"
    );
    assert!(
        alive(a_pid),
        "a model with a stream in flight is never evicted"
    );
    let mut more = [0u8; 256];
    assert!(
        stream.read(&mut more).unwrap() > 0,
        "the stream still flows"
    );
    drop(stream);
    // Once the stream is gone, smol-b loads (smol-a is idle now).
    let deadline = Instant::now() + START;
    loop {
        let (code, answer) = chat(&ws, Some("smol-b"));
        if code == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "smol-b never loaded: {answer}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(wait_gone(a_pid, Duration::from_secs(30)));

    serve.terminate();
}

#[test]
fn a_cold_model_loads_once_for_eight_requests_and_unloads_after_keep_alive() {
    let ws = gateway_workspace(
        r#"
[[model]]
id = "smol-a"
model = "smollm2-135m"
keep_alive = "2s"
args = ["--parallel", "2"]
"#,
    );
    let mut serve = start(&ws);
    let requests: Vec<_> = (0..8)
        .map(|_| {
            let (port, token) = host_endpoint(&ws);
            std::thread::spawn(move || {
                let body = json!({"model": "smol-a", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
                call(port, &token, "POST", "/v1/chat/completions", Some(body))
            })
        })
        .collect();
    for request in requests {
        let (code, body) = request.join().unwrap();
        assert_eq!(code, 200, "{body}");
    }
    assert_eq!(
        serve.count("local-ai.model.starting"),
        1,
        "{:#?}",
        serve.seen()
    );
    assert_eq!(
        serve.count("process.starting"),
        1,
        "exactly one engine start"
    );
    let pid = row(&ps(&ws), "smol-a")["pid"].as_u64().unwrap() as u32;
    // Idle for keep_alive: unloaded, its process gone.
    let unloaded = serve.wait_for("local-ai.model.stopped", Duration::from_secs(60));
    assert_eq!(unloaded["data"]["reason"], "keep-alive");
    assert!(wait_gone(pid, Duration::from_secs(10)));
    assert_eq!(row(&ps(&ws), "smol-a")["state"], "stopped");
    // The next request reloads it; a request's own keep_alive overrides the model's.
    let (port, token) = host_endpoint(&ws);
    let body = json!({"model": "smol-a", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "keep_alive": -1});
    let (code, reply) = call(port, &token, "POST", "/v1/chat/completions", Some(body));
    assert_eq!(code, 200, "{reply}");
    let reloaded = row(&ps(&ws), "smol-a").clone();
    assert_eq!(reloaded["state"], "ready");
    assert_ne!(reloaded["pid"], json!(pid));
    assert_eq!(reloaded["keepAlive"], -1.0);
    assert_eq!(reloaded["unloadsIn"], Value::Null);
    // `arcane chat --model` asks it; standard input is the prompt without a terminal;
    // on a terminal without a prompt it is a conversation.
    let out = run(ws.arcane().args([
        "--output",
        "json",
        "chat",
        "--model",
        "smol-a",
        "--max-tokens",
        "4",
        "Hi",
    ]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(crate::support::json(&out)["answer"]
        .as_str()
        .is_some_and(|a| !a.is_empty()));
    let mut piped = ws
        .arcane()
        .args([
            "--output",
            "json",
            "chat",
            "--model",
            "smol-a",
            "--max-tokens",
            "4",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    piped.stdin.take().unwrap().write_all(b"Say hi.").unwrap();
    let out = piped.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(crate::support::json(&out)["answer"]
        .as_str()
        .is_some_and(|a| !a.is_empty()));
    let command = format!(
        "{} --workspace '{}' chat --model smol-a --max-tokens 4",
        crate::support::arcane_bin().display(),
        ws.path().display()
    );
    let mut terminal = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut input = terminal.stdin.take().unwrap();
        input.write_all(b"Hi\nAgain\n\n").unwrap();
    }
    let out = terminal.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("chatting with smol-a"), "{text}");
    assert!(
        text.matches("> ").count() >= 3,
        "two turns, then the empty line: {text}"
    );
    // `arcane unload` and `arcane load` act on it directly.
    assert!(run(ws.arcane().args(["unload", "smol-a"])).status.success());
    assert_eq!(row(&ps(&ws), "smol-a")["state"], "stopped");
    assert!(run(ws.arcane().args(["load", "smol-a"])).status.success());
    assert_eq!(row(&ps(&ws), "smol-a")["state"], "ready");
    serve.terminate();
}

#[test]
fn kill_9_of_the_host_with_three_models_loaded_leaves_no_engine() {
    let ws = gateway_workspace(
        r#"
[[model]]
id = "smol-a"
model = "smollm2-135m"
load = "on-start"

[[model]]
id = "smol-b"
model = "{model}"
load = "on-start"

[[model]]
id = "smol-embed"
model = "{model}"
args = ["--embeddings", "--pooling", "mean"]
load = "on-start"
"#,
    );
    let mut serve = start(&ws);
    let deadline = Instant::now() + START;
    while serve.count("local-ai.model.ready") < 3 {
        assert!(Instant::now() < deadline, "{:#?}", serve.seen());
        std::thread::sleep(Duration::from_millis(50));
    }
    // The embedding entry answers embeddings through the same door.
    let (port, token) = host_endpoint(&ws);
    let (code, body) = call(
        port,
        &token,
        "POST",
        "/v1/embeddings",
        Some(json!({"model": "smol-embed", "input": "red apple"})),
    );
    assert_eq!(code, 200, "{body}");
    assert!(
        parsed("/v1/embeddings", &body)["data"][0]["embedding"]
            .as_array()
            .unwrap()
            .len()
            > 16
    );
    let engines = engines_of(&serve);
    assert_eq!(engines.len(), 3, "{engines:?}");
    signal(serve.pid(), "KILL");
    for pid in engines {
        assert!(
            wait_gone(pid, Duration::from_secs(10)),
            "engine {pid} outlived a killed host"
        );
    }
}

#[test]
fn an_external_url_entry_is_routed_to_and_never_signalled() {
    let port = free_port();
    // Its own name is the model file's; answers name the model as the client asked.
    let external = External::start(port);
    let ws = gateway_workspace(&format!(
        "[[model]]\nid = \"remote\"\nurl = \"http://127.0.0.1:{port}\"\n"
    ));
    let mut serve = start(&ws);
    let (code, answer) = chat(&ws, Some("remote"));
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["model"], "remote");
    let rows = ps(&ws);
    assert_eq!(row(&rows, "remote")["external"], true);
    assert!(engines_of(&serve).is_empty(), "nothing was started");
    serve.terminate();
    assert!(
        alive(external.0.id()),
        "an external server is never signalled"
    );
    assert_eq!(health(port), Some(200));

    // A server that goes away is probed again by the next request once it is back.
    let mut serve = start(&ws);
    let (code, answer) = chat(&ws, Some("remote"));
    assert_eq!(code, 200, "{answer}");
    drop(external);
    assert_eq!(chat(&ws, Some("remote")).0, 502);
    let lost = serve.wait_for("local-ai.model.error", Duration::from_secs(30));
    assert_eq!(lost["data"]["reason"], "unreachable", "{lost}");
    // It stays in `error`, saying why, until the next request adopts it again.
    let remote = row(&ps(&ws), "remote").clone();
    assert_eq!(remote["state"], "error", "{remote}");
    assert!(
        remote["lastError"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("stopped answering")),
        "{remote}"
    );
    let external = External::start(port);
    assert_eq!(chat(&ws, Some("remote")).0, 200);
    serve.terminate();
    assert!(alive(external.0.id()));
}

#[test]
fn metrics_count_what_was_sent_and_a_crashed_engine_is_reloaded_on_the_next_request() {
    let ws = gateway_workspace(
        r#"
[[model]]
id = "smol-a"
model = "smollm2-135m"
"#,
    );
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);
    // A load asked for (`arcane load`, the dashboard's button) is not a request.
    let loaded = run(ws.arcane().args(["load", "smol-a"]));
    assert!(loaded.status.success(), "{loaded:?}");
    let mut completion_tokens = 0;
    for _ in 0..3 {
        let (code, answer) = chat(&ws, Some("smol-a"));
        assert_eq!(code, 200, "{answer}");
        completion_tokens += answer["usage"]["completion_tokens"].as_u64().unwrap();
    }
    let streamed = json!({"model": "smol-a", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
        "stream": true, "stream_options": {"include_usage": true}});
    let (code, body) = call(port, &token, "POST", "/v1/chat/completions", Some(streamed));
    assert_eq!(code, 200);
    let usage = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["usage"]["completion_tokens"].as_u64())
        .next_back()
        .expect("the stream reports its usage");
    completion_tokens += usage;
    let (code, _) = chat(&ws, Some("not-configured"));
    assert_eq!(code, 404);

    let metrics = |ws: &TestWorkspace| {
        let (port, token) = host_endpoint(ws);
        let (code, text) = call(port, &token, "GET", "/metrics", None);
        assert_eq!(code, 200, "{text}");
        text
    };
    let value = |text: &str, name: &str| -> f64 {
        let prefix = format!("{name}{{model=\"smol-a\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {text}"))
            .parse()
            .unwrap()
    };
    let text = metrics(&ws);
    assert_eq!(value(&text, "arcane_requests_total"), 4.0, "{text}");
    assert_eq!(value(&text, "arcane_request_errors_total"), 0.0, "{text}");
    assert_eq!(
        value(&text, "arcane_completion_tokens_total"),
        completion_tokens as f64,
        "{text}"
    );
    assert!(value(&text, "arcane_prompt_tokens_total") > 0.0, "{text}");
    assert_eq!(
        value(&text, "arcane_request_duration_seconds_count"),
        4.0,
        "{text}"
    );
    assert_eq!(value(&text, "arcane_model_loads_total"), 1.0, "{text}");
    assert_eq!(value(&text, "arcane_model_loaded"), 1.0, "{text}");
    // The metrics need the token like everything else.
    let (status, _, _) = crate::front_door::exchange(
        port,
        &format!("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(status, 401);

    let status = crate::support::stdout(&run(ws.arcane().arg("status")));
    assert!(
        status.contains("model   smol-a") && status.contains("ready on `cpu`"),
        "{status}"
    );
    // The engine dies: the model is in `error`, then stopped with the crash on record,
    // and the next request loads it again.
    let pid = row(&ps(&ws), "smol-a")["pid"].as_u64().unwrap() as u32;
    signal(pid, "KILL");
    let failed = serve.wait_for("local-ai.model.error", Duration::from_secs(60));
    assert_eq!(failed["data"]["reason"], "crashed", "{failed}");
    // It is `stopping` until the dead engine is down, then `stopped`, and says so.
    let unloaded = serve.wait_for("local-ai.model.stopped", Duration::from_secs(60));
    assert_eq!(unloaded["data"]["reason"], "crashed", "{unloaded}");
    let crashed = row(&ps(&ws), "smol-a").clone();
    assert_eq!(
        (crashed["state"].clone(), crashed["crashes"].clone()),
        (json!("stopped"), json!(1))
    );
    let (code, answer) = chat(&ws, Some("smol-a"));
    assert_eq!(code, 200, "{answer}");
    assert_ne!(row(&ps(&ws), "smol-a")["pid"], json!(pid));
    let text = metrics(&ws);
    assert_eq!(value(&text, "arcane_model_crashes_total"), 1.0, "{text}");
    assert_eq!(value(&text, "arcane_model_loads_total"), 2.0, "{text}");
    serve.terminate();
}

#[test]
fn reload_adds_removes_and_replaces_models_and_leaves_unchanged_ones_running() {
    let ws = gateway_workspace(
        r#"
[[model]]
id = "smol-a"
model = "smollm2-135m"
load = "on-start"

[[model]]
id = "smol-b"
model = "{model}"
"#,
    );
    let mut serve = start(&ws);
    serve.wait_for("local-ai.model.ready", START);
    let a_pid = row(&ps(&ws), "smol-a")["pid"].clone();
    let write = |toml: &str| {
        let toml = toml.replace("{model}", &smollm2().display().to_string());
        std::fs::write(ws.path().join("arcane.toml"), toml).unwrap();
    };
    // `arcane reload`: smol-b goes, smol-c comes, smol-a keeps its engine.
    write(
        "[[model]]\nid = \"smol-a\"\nmodel = \"smollm2-135m\"\nload = \"on-start\"\n\n[[model]]\nid = \"smol-c\"\nmodel = \"{model}\"\n",
    );
    let out = run(ws.arcane().args(["--output", "json", "reload"]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = crate::support::json(&out);
    assert_eq!(summary["added"], json!(["smol-c"]), "{summary}");
    assert_eq!(summary["removed"], json!(["smol-b"]), "{summary}");
    assert_eq!(summary["unchanged"], json!(["smol-a"]), "{summary}");
    let rows = ps(&ws);
    assert_eq!(
        row(&rows, "smol-a")["pid"],
        a_pid,
        "an unchanged model is untouched"
    );
    assert!(!rows.iter().any(|r| r["id"] == "smol-b"));
    assert_eq!(chat(&ws, Some("smol-b")).0, 404);
    assert_eq!(chat(&ws, Some("smol-c")).0, 200);
    // A configuration that does not parse changes nothing.
    write("[[model]\nid = ");
    let out = run(ws.arcane().args(["reload"]));
    assert!(!out.status.success());
    assert_eq!(row(&ps(&ws), "smol-a")["pid"], a_pid);
    // SIGHUP: smol-a changed, so its idle engine is replaced.
    write(
        "[[model]]\nid = \"smol-a\"\nmodel = \"smollm2-135m\"\nargs = [\"-c\", \"1024\"]\n\n[[model]]\nid = \"smol-c\"\nmodel = \"{model}\"\n",
    );
    signal(serve.pid(), "HUP");
    let reloaded = loop {
        let line = serve.wait_for("local-ai.models.reloaded", Duration::from_secs(30));
        // Earlier reloads' events come first.
        if line["data"]["changed"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
        {
            break line;
        }
    };
    assert_eq!(reloaded["data"]["changed"], json!(["smol-a"]), "{reloaded}");
    assert!(
        wait_gone(a_pid.as_u64().unwrap() as u32, Duration::from_secs(30)),
        "the old engine unloads when idle"
    );
    assert_eq!(chat(&ws, Some("smol-a")).0, 200);
    let new_pid = row(&ps(&ws), "smol-a")["pid"].as_u64().unwrap() as u32;
    assert!(
        crate::serve::proc_list(new_pid, "cmdline")
            .iter()
            .any(|a| a == "1024"),
        "the new arguments"
    );
    serve.terminate();
}

/// Issue 27, item 7: a reload that cannot use the file changes nothing and says why:
/// a file that does not parse names its line, column and text (as `serve` does), in
/// the human output and in the JSON error's details; an empty or comment-only file (one
/// being written) and a removed file are refused, where they used to be read as "no
/// models"; the models stay until a good file is read.
#[test]
fn a_reload_of_a_broken_empty_or_removed_file_says_why_and_keeps_the_models() {
    const TWO: &str = "[[model]]\nid = \"smol-a\"\nmodel = \"smollm2-135m\"\n\n[[model]]\nid = \"smol-b\"\nmodel = \"smollm2-135m\"\n";
    let ws = gateway_workspace(TWO);
    let mut serve = start(&ws);
    let config = ws.path().join("arcane.toml");
    let ids = || -> Vec<String> {
        ps(&ws)
            .iter()
            .filter_map(|r| r["id"].as_str().map(str::to_string))
            .collect()
    };
    assert_eq!(ids(), ["smol-a", "smol-b"]);
    let reload = |json: bool| {
        let mut command = ws.arcane();
        if json {
            command.args(["--output", "json"]);
        }
        let out = run(command.arg("reload"));
        assert!(!out.status.success(), "{}", crate::support::stdout(&out));
        out
    };

    // Does not parse: where, in words and in the details.
    std::fs::write(&config, "[[model]]\nid = \"smol-a\"\nmodel = \n").unwrap();
    let out = reload(false);
    assert_eq!(out.status.code(), Some(2));
    let said = crate::support::stderr(&out);
    assert!(
        said.contains("is not a valid Arcane configuration"),
        "{said}"
    );
    assert!(
        said.contains("caused by: TOML parse error at line 3, column"),
        "{said}"
    );
    assert!(said.contains("3 | model = "), "{said}");
    let error = crate::support::json(&reload(true))["error"].clone();
    assert_eq!(error["code"], "ARCANE_USAGE", "{error}");
    assert_eq!(error["details"]["path"], config.display().to_string());
    assert_eq!(error["details"]["line"], 3, "{error}");
    assert_eq!(error["details"]["snippet"], "model = ", "{error}");
    let column = &error["details"]["column"];
    assert!(
        error["causes"][0]
            .as_str()
            .is_some_and(|c| c.contains(&format!("line 3, column {column}"))),
        "{error}"
    );
    assert_eq!(ids(), ["smol-a", "smol-b"]);

    // Empty (an editor's truncate before its write), or comments only.
    for empty in ["", "\n  \n# being saved\n"] {
        std::fs::write(&config, empty).unwrap();
        let error = crate::support::json(&reload(true))["error"].clone();
        assert_eq!(error["code"], "ARCANE_USAGE", "{error}");
        assert!(
            error["message"]
                .as_str()
                .is_some_and(|m| m.contains("has no settings")),
            "{error}"
        );
        assert_eq!(ids(), ["smol-a", "smol-b"]);
    }

    // Removed.
    std::fs::remove_file(&config).unwrap();
    let error = crate::support::json(&reload(true))["error"].clone();
    assert_eq!(error["code"], "ARCANE_NOT_FOUND", "{error}");
    assert_eq!(error["details"]["path"], config.display().to_string());
    assert_eq!(ids(), ["smol-a", "smol-b"]);

    // A good file again: read as usual.
    std::fs::write(&config, TWO.replace("smol-b", "smol-c")).unwrap();
    let out = run(ws.arcane().args(["--output", "json", "reload"]));
    assert!(out.status.success(), "{}", crate::support::stderr(&out));
    assert_eq!(ids(), ["smol-a", "smol-c"]);
    serve.terminate();
}

/// A tmpfs of `size` mounted on `dir` while it lives: a disk that can be filled. Needs
/// root (the tests run as root, in CI too): a test that cannot mount fails, never skips.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, size: &str) -> Tmpfs {
        let out = run(Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir));
        assert!(
            out.status.success(),
            "cannot mount a tmpfs on {} (this test needs root): {}",
            dir.display(),
            crate::support::stderr(&out)
        );
        Tmpfs(dir.to_path_buf())
    }

    /// Writes a file until the disk is full.
    fn fill(&self) {
        let mut filler = std::fs::File::create(self.0.join("filler")).unwrap();
        let chunk = vec![0u8; 64 << 10];
        loop {
            match filler.write_all(&chunk) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: whatever still has a file open there does not keep it mounted.
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Issue 27, item 8: `arcane chat` on a full disk shows why the model did not load,
/// down to the system's words: the host's answer has the whole chain (the lock the
/// engine's ownership record is written under, and the write that failed), and the
/// client printed only its first line.
#[test]
fn a_chat_on_a_full_disk_shows_the_whole_cause_down_to_the_system_error() {
    let ws = TestWorkspace::new();
    let disk = Tmpfs::mount(ws.path(), "2m");
    let toml = format!(
        "[[model]]\nid = \"sock\"\ncommand = [\"{}\", \"--host\", \"${{SOCKET}}\", \"-m\", \"{}\", \"-c\", \"512\"]\n",
        llama_server().display(),
        smollm2().display()
    );
    std::fs::write(ws.path().join("arcane.toml"), toml).unwrap();
    let mut serve = start(&ws);
    disk.fill();
    let out = run(ws.arcane().args(["chat", "--model", "sock", "Say hi."]));
    assert!(!out.status.success());
    let said = crate::support::stderr(&out);
    assert!(
        said.contains("caused by: ") && said.contains("No space left on device (os error 28)"),
        "{said}"
    );
    serve.terminate();
    drop(serve);
    drop(disk);
}

#[test]
fn a_memory_budget_evicts_like_max_loaded_and_a_model_too_big_for_it_is_refused_naming_both() {
    let size = std::fs::metadata(smollm2()).unwrap().len();
    let ws = gateway_workspace(&format!(
        r#"
[[model]]
id = "smol-a"
model = "smollm2-135m"
args = ["-c", "512"]

[[model]]
id = "smol-b"
model = "{{model}}"
args = ["-c", "512"]

[devices.cpu]
memory = {}
"#,
        // Each needs its file, a 512-token cache, compute buffers and the server itself
        // (about 1.6 times the file): one fits, two do not.
        size * 5 / 2
    ));
    let mut serve = start(&ws);
    assert_eq!(chat(&ws, Some("smol-a")).0, 200);
    assert_eq!(chat(&ws, Some("smol-b")).0, 200);
    let evicted = serve.wait_line("an eviction", Duration::from_secs(30), |l| {
        l["type"] == "local-ai.model.stopped" && l["data"]["reason"] == "evicted"
    });
    assert_eq!(evicted["data"]["model"], "smol-a");
    assert_eq!(evicted["data"]["for"], "smol-b");
    assert_eq!(engines_of(&serve).len(), 1);
    serve.terminate();

    let ws = gateway_workspace(&format!(
        "[[model]]\nid = \"smol-a\"\nmodel = \"smollm2-135m\"\n\n[devices.cpu]\nmemory = {}\n",
        size / 2
    ));
    let mut serve = start(&ws);
    let (code, answer) = chat(&ws, Some("smol-a"));
    assert_eq!(code, 503, "{answer}");
    assert_eq!(
        answer["error"]["code"], "LOCAL_AI_MODEL_TOO_LARGE",
        "{answer}"
    );
    let details = &answer["error"]["details"];
    assert_eq!(details["budget"], size / 2, "{answer}");
    assert!(details["need"].as_u64().unwrap() > size, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("smol-a") && message.contains("budget"),
        "{message}"
    );
    assert!(engines_of(&serve).is_empty(), "nothing was started");
    serve.terminate();
}

#[test]
fn a_repeated_model_flag_makes_a_gateway_llama_methods_act_on_it_and_a_failed_load_answers_every_waiter(
) {
    let ws = gateway_workspace("");
    std::fs::remove_file(ws.path().join("arcane.toml")).unwrap();
    let bad = ws.path().join("broken.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00 this is not a model").unwrap();
    let bad = bad.display().to_string();
    let mut serve = Serve::start(&ws, &["--model", "a=smollm2-135m", "--model", &bad]);
    serve.wait_for("core.listening", Duration::from_secs(60));
    assert_eq!(listed_ids(&ws), [json!("a"), json!("broken")]);
    let (port, token) = host_endpoint(&ws);
    // No `model`: the default (the first).
    let (code, answer) = chat(&ws, None);
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["model"], "a");
    // The llama.* methods over arcane/1 act on the same models.
    let rpc = |method: &str, parameters: Value| {
        let frame = json!({"protocol": "arcane/1", "type": "request", "id": method, "method": method, "parameters": parameters});
        let (code, body) = call(port, &token, "POST", "/v1/rpc", Some(frame));
        assert_eq!(code, 200, "{body}");
        parsed(method, &body)
    };
    let models = rpc("llama.models", json!({}));
    assert_eq!(models["result"]["models"][0]["state"], "ready", "{models}");
    let unloaded = rpc("llama.unload", json!({"model": "a"}));
    assert_eq!(unloaded["result"]["state"], "stopped", "{unloaded}");
    let loaded = rpc("llama.load", json!({"model": "a"}));
    assert_eq!(loaded["result"]["state"], "ready", "{loaded}");
    // Four requests wait on one failing load; each gets the engine's error.
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let (port, token) = (port, token.clone());
            std::thread::spawn(move || {
                let body = json!({"model": "broken", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
                call(port, &token, "POST", "/v1/chat/completions", Some(body))
            })
        })
        .collect();
    for waiter in waiters {
        let (code, body) = waiter.join().unwrap();
        assert!(code == 502 || code == 503, "{code}: {body}");
        let error: Value = serde_json::from_str(&body).unwrap();
        assert!(error["error"]["message"].is_string(), "{error}");
        if code == 502 {
            assert!(
                error["error"]["details"]["lastLines"]
                    .as_array()
                    .is_some_and(|l| !l.is_empty()),
                "the engine's last lines: {error}"
            );
        }
    }
    let loads = serve
        .seen()
        .iter()
        .filter(|l| l["type"] == "local-ai.model.starting" && l["data"]["model"] == "broken")
        .count();
    assert_eq!(loads, 1, "one load for every waiter");
    assert_eq!(row(&ps(&ws), "broken")["state"], "error");
    serve.terminate();
}

/// `arcane.toml` in the current directory comes before the workspace's (as `docker
/// compose` reads a project's file), `--config` before both, and `serve` names the file
/// it read (`configFile` of `core.listening`, and its first line for a person).
#[test]
fn an_arcane_toml_in_the_current_directory_is_read_and_named() {
    let table = |id: &str| format!("[[model]]\nid = \"{id}\"\nmodel = \"smollm2-135m\"\n");
    let ws = gateway_workspace(&table("from-workspace"));
    let project = tempfile::tempdir().unwrap();
    let local = project.path().join("arcane.toml");
    std::fs::write(&local, table("from-project")).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let served = |cwd: &std::path::Path, args: &[&std::ffi::OsStr]| {
        let mut command = ws.arcane();
        command
            .current_dir(cwd)
            .args(["--output", "ndjson", "serve"])
            .args(args);
        let mut serve = Serve::spawn(command);
        let listening = listening(&ws, &mut serve);
        let ids = listed_ids(&ws);
        serve.terminate();
        (listening["data"]["configFile"].clone(), ids)
    };
    let workspace_file = ws.path().join("arcane.toml");
    assert_eq!(
        served(project.path(), &[]),
        (json!(local), vec![json!("from-project")])
    );
    let flag = [std::ffi::OsStr::new("--config"), workspace_file.as_os_str()];
    assert_eq!(
        served(project.path(), &flag),
        (json!(workspace_file), vec![json!("from-workspace")])
    );
    assert_eq!(
        served(elsewhere.path(), &[]),
        (json!(workspace_file), vec![json!("from-workspace")])
    );
    // A local file that does not parse is refused, never skipped for the workspace's,
    // and a person is told which file hides which.
    std::fs::write(&local, "not toml [").unwrap();
    let refused = run(ws.arcane().current_dir(project.path()).arg("serve"));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{said}");
    assert!(said.contains(&local.display().to_string()), "{said}");
    assert!(
        said.contains(&format!(
            "the workspace's `{}` is not read",
            workspace_file.display()
        )),
        "{said}"
    );
}

/// Issue 18, part 4: one mode. `arcane serve` on the embedded default (no `[[model]]`)
/// is a gateway of that one model: `ps`, `unload`, `load` and `reload` work on it, an
/// unknown model is OpenAI's 404 naming the known one, and no model still selects it.
#[test]
fn the_main_job_is_a_gateway_of_one_model() {
    let ws = gateway_workspace("");
    let mut serve = Serve::start(&ws, &[]);
    serve.wait_for("local-ai.model.ready", START);
    let rows = ps(&ws);
    assert_eq!(rows.len(), 1, "{rows:#?}");
    let first = row(&rows, "smollm2-135m");
    assert_eq!(first["state"], "ready");
    let pid = first["pid"].as_u64().expect("an engine pid") as u32;
    assert!(alive(pid));

    let (code, body) = chat(&ws, Some("nope"));
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["error"]["code"], "model_not_found", "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("smollm2-135m"));
    let (code, body) = chat(&ws, None);
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["model"], "smollm2-135m", "{body}");

    let out = run(ws.arcane().args(["unload", "smollm2-135m"]));
    assert!(out.status.success(), "{}", crate::support::stderr(&out));
    assert!(
        wait_gone(pid, Duration::from_secs(10)),
        "the engine outlived its unload"
    );
    assert_eq!(row(&ps(&ws), "smollm2-135m")["state"], "stopped");
    let out = run(ws.arcane().args(["load", "smollm2-135m"]));
    assert!(out.status.success(), "{}", crate::support::stderr(&out));
    let again = ps(&ws);
    assert_eq!(row(&again, "smollm2-135m")["state"], "ready");
    assert_ne!(
        row(&again, "smollm2-135m")["pid"].as_u64(),
        Some(pid as u64)
    );

    let out = run(ws.arcane().args(["--output", "json", "reload"]));
    assert!(out.status.success(), "{}", crate::support::stderr(&out));
    assert_eq!(
        crate::support::json(&out)["unchanged"],
        json!(["smollm2-135m"])
    );
    let (port, token) = host_endpoint(&ws);
    let (code, body) = call(port, &token, "GET", "/health", None);
    assert_eq!(
        (code, parsed("/health", &body)["status"].clone()),
        (200, json!("ok"))
    );
    serve.terminate();
}

/// Issue 19, item 14: an engine that stops answering (`SIGSTOP`) while ready is noticed
/// by the readiness watchdog: stopped, reported (`arcane ps` says why), the request
/// waiting on it answered with an error instead of hanging, and the next request loads
/// it again.
#[test]
fn a_ready_engine_that_stops_answering_is_stopped_and_the_next_request_reloads_it() {
    let ws =
        gateway_workspace("[[model]]\nid = \"m\"\nmodel = \"smollm2-135m\"\nload = \"on-start\"\n");
    let mut serve = start(&ws);
    serve.wait_for("local-ai.model.ready", START);
    let pid = row(&ps(&ws), "m")["pid"].as_u64().unwrap() as u32;
    signal(pid, "STOP");
    // A request sent to the stopped engine gets an answer, not a hang: the engine is
    // stopped for not answering before it answered it, so the request goes once more
    // to the engine that replaces it (issue 34, item 5).
    let waiting = {
        let (port, token) = host_endpoint(&ws);
        std::thread::spawn(move || {
            let body = json!({"model": "m", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4});
            call(port, &token, "POST", "/v1/chat/completions", Some(body)).0
        })
    };
    let failed = serve.wait_for("local-ai.model.error", START);
    assert_eq!(failed["data"]["model"], "m", "{failed}");
    assert!(
        failed
            .to_string()
            .contains("stopped answering its readiness probe"),
        "{failed}"
    );
    assert!(
        wait_gone(pid, Duration::from_secs(30)),
        "the stopped engine was left"
    );
    let status = waiting.join().unwrap();
    assert_eq!(status, 200);
    let replayed = serve.wait_for("local-ai.request.replayed", START);
    assert_eq!(replayed["data"]["pid"], pid, "{replayed}");
    let rows = ps(&ws);
    assert!(
        row(&rows, "m")["lastError"]
            .to_string()
            .contains("stopped answering"),
        "{rows:#?}"
    );
    let (code, body) = chat(&ws, Some("m"));
    assert_eq!(code, 200, "{body}");
    assert_ne!(row(&ps(&ws), "m")["pid"].as_u64(), Some(pid as u64));
}

/// A `[[model]]` on a device this machine does not have is refused when the
/// configuration is read, with the resolver's code and the model to fix; nothing
/// starts (it used to start and fail at the first request).
#[test]
fn a_device_this_machine_lacks_is_refused_when_the_configuration_is_read() {
    let gpu = "GPU-00000000-1111-2222-3333-444444444444";
    let ws = gateway_workspace(&format!(
        "[[model]]\nid = \"far\"\nmodel = \"smollm2-135m\"\ndevice = \"{gpu}\"\n"
    ));
    let mut child = ws
        .arcane()
        .args(["--output", "json", "serve"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status = crate::support::wait_for_exit(&mut child, START, "serve to refuse");
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{out}");
    let error = &serde_json::from_str::<Value>(&out).unwrap()["error"];
    assert!(
        error["code"]
            .as_str()
            .is_some_and(|c| c.starts_with("LOCAL_AI_EXECUTION_TARGET")),
        "{error}"
    );
    assert_eq!(error["details"]["target"], gpu, "{error}");
    assert!(
        error["hints"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h.as_str().unwrap().contains("model `far`")),
        "{error}"
    );
    assert!(
        !ws.path().join(".arcane/core.json").exists(),
        "it never listened"
    );
}

/// `[[group]]` mistakes are refused before anything starts, naming the value: an
/// unknown member, a model in two groups, no members, `exclusive = false`, an unknown
/// key.
#[test]
fn group_mistakes_are_refused_naming_the_value() {
    let models = "[[model]]\nid = \"a\"\nmodel = \"a.gguf\"\n\n[[model]]\nid = \"b\"\nmodel = \"b.gguf\"\n\n";
    let cases = [
        (
            "group_unknown_member",
            "[[group]]\nid = \"g\"\nmembers = [\"a\", \"ghost\"]\nexclusive = true\n",
        ),
        (
            "group_model_in_two_groups",
            "[[group]]\nid = \"g\"\nmembers = [\"a\"]\nexclusive = true\n\n[[group]]\nid = \"h\"\nmembers = [\"b\", \"a\"]\nexclusive = true\n",
        ),
        (
            "group_no_members",
            "[[group]]\nid = \"g\"\nmembers = []\nexclusive = true\n",
        ),
        (
            "group_not_exclusive",
            "[[group]]\nid = \"g\"\nmembers = [\"a\", \"b\"]\nexclusive = false\n",
        ),
        (
            "group_unknown_key",
            "[[group]]\nid = \"g\"\nmembers = [\"a\", \"b\"]\nexclusive = true\nswap = true\n",
        ),
    ];
    let without_models = (
        "group_without_models",
        "[[group]]\nid = \"g\"\nmembers = [\"a\", \"b\"]\nexclusive = true\n",
    );
    let cases = cases
        .iter()
        .map(|(name, group)| (*name, format!("{models}{group}")))
        .chain([(without_models.0, without_models.1.to_string())]);
    for (name, file) in cases {
        let ws = crate::support::TestWorkspace::new();
        std::fs::write(ws.path().join("arcane.toml"), file).unwrap();
        let output = ws
            .arcane()
            .args(["--output", "json", "serve"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{name}");
        let error = &crate::support::json(&output)["error"];
        let text = serde_json::to_string_pretty(error).unwrap();
        insta::assert_snapshot!(name, ws.redact(&text));
        assert!(!ws.path().join(".arcane/core.json").exists(), "{name}");
    }
}

/// An exclusive group swaps its members on request (reported as `unloaded` with
/// `reason: "group"`); an `unlisted` member is routed to but not in `/v1/models`.
#[test]
fn an_exclusive_group_swaps_on_request_and_an_unlisted_model_is_routed_but_not_listed() {
    let ws = gateway_workspace(
        r#"
[[model]]
id = "smol-a"
model = "smollm2-135m"
args = ["-c", "512"]

[[model]]
id = "smol-b"
model = "{model}"
args = ["-c", "512"]
unlisted = true

[[model]]
id = "smol-c"
model = "{model}"
args = ["-c", "512"]

[[group]]
id = "chat"
members = ["smol-a", "smol-b"]
exclusive = true
"#,
    );
    let mut serve = start(&ws);
    assert_eq!(chat(&ws, Some("smol-c")).0, 200);
    assert_eq!(chat(&ws, Some("smol-a")).0, 200);
    let (code, answer) = chat(&ws, Some("smol-b"));
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["model"], "smol-b");
    let unloaded = serve.wait_for("local-ai.model.stopped", Duration::from_secs(30));
    assert_eq!(
        unloaded["data"],
        json!({"model": "smol-a", "device": "cpu", "state": "stopped", "reason": "group", "for": "smol-b", "group": "chat"})
    );
    assert_eq!(serve.evictions(), 0);
    // `smol-c`, outside the group, still runs beside `smol-b`.
    let rows = ps(&ws);
    assert_eq!(row(&rows, "smol-a")["state"], "stopped");
    assert_eq!(row(&rows, "smol-b")["state"], "ready");
    assert_eq!(row(&rows, "smol-c")["state"], "ready");
    assert_eq!(engines_of(&serve).len(), 2);
    assert_eq!(listed_ids(&ws), [json!("smol-a"), json!("smol-c")]);
    serve.terminate();
}

/// A loopback relay in front of an engine that records every byte sent to it: what
/// the engine really received.
struct Recorder {
    port: u16,
    seen: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Recorder {
    fn start(engine: u16) -> Recorder {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = std::sync::Arc::clone(&seen);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", engine)) else {
                    continue;
                };
                let (mut client_in, mut server_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                let record = std::sync::Arc::clone(&record);
                std::thread::spawn(move || {
                    let mut buffer = [0u8; 8192];
                    while let Ok(n) = client_in.read(&mut buffer) {
                        if n == 0 || server_out.write_all(&buffer[..n]).is_err() {
                            break;
                        }
                        record.lock().unwrap().extend_from_slice(&buffer[..n]);
                    }
                    let _ = server_out.shutdown(std::net::Shutdown::Write);
                });
                let (mut server_in, mut client_out) = (server, client);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut server_in, &mut client_out);
                    let _ = client_out.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Recorder { port, seen }
    }

    fn seen(&self) -> String {
        String::from_utf8_lossy(&self.seen.lock().unwrap()).into_owned()
    }
}

/// `upstream_model` is the `model` the engine receives (recorded on its way to a real
/// llama-server), while the client gets the name it asked for back.
#[test]
fn upstream_model_is_what_the_engine_receives_and_the_client_gets_its_own_name() {
    let engine_port = free_port();
    let _engine = External::start(engine_port);
    let recorder = Recorder::start(engine_port);
    let ws = gateway_workspace(&format!(
        "[[model]]\nid = \"relay\"\naliases = [\"nick\"]\nurl = \"http://127.0.0.1:{}\"\nupstream_model = \"org/real-name\"\n",
        recorder.port
    ));
    let mut serve = start(&ws);
    let (code, answer) = chat(&ws, Some("nick"));
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["model"], "nick", "{answer}");
    let seen = recorder.seen();
    assert!(
        seen.contains("\"model\":\"org/real-name\""),
        "the engine was not sent the upstream name: {seen}"
    );
    assert!(!seen.contains("\"model\":\"nick\""), "{seen}");
    serve.terminate();
}
