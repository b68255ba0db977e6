//! Issue 34, items 2 and 3: admission. With the real host, llama-server and SmolLM2: a
//! model's `parallel` and `max_queue`; the official clients get a 503 with a
//! `Retry-After` computed from the work ahead and back off exactly as told; a client
//! whose own timeout is shorter than the wait is refused at once (the SDKs' header or
//! `X-Arcane-Deadline`); a key flooding a model does not keep another key's request
//! waiting behind all of its own; a higher priority goes first.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::front_door::call;
use crate::gateway::{gateway_workspace, start};
use crate::serve::{host_endpoint, signal};
use crate::support::TestWorkspace;

/// Two models of one slot, one without a queue and one with. Each engine computes on one
/// thread: the tests running beside these start engines too, and an engine whose threads
/// wait for each other at every step slows fortyfold when they outnumber the cores
/// (300 tokens took over two minutes on two cores), where one thread slows only in
/// proportion to its share.
const QUEUES: &str = r#"
[[model]]
id = "smol"
model = "smollm2-135m"
args = ["-c", "2048", "-t", "1"]
parallel = 1
max_queue = 0

[[model]]
id = "smol-q"
model = "smollm2-135m"
args = ["-c", "2048", "-t", "1"]
parallel = 1
max_queue = 8
"#;

/// A chat of `tokens` tokens for `model` with `key`, not stopped early.
fn long_chat(model: &str, tokens: u32, stream: bool) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": "Count from one to one thousand."}],
        "max_tokens": tokens,
        "ignore_eos": true,
        "stream": stream,
    })
}

/// A whole chat of `tokens` tokens for `model` with `key`, which must be answered.
fn chat(port: u16, key: &str, model: &str, tokens: u32) {
    let (status, body) = call(
        port,
        key,
        "POST",
        "/v1/chat/completions",
        Some(long_chat(model, tokens, false)),
    );
    assert_eq!(status, 200, "{body}");
}

/// A new key made by `arcane token add ARGS`.
fn key(ws: &TestWorkspace, args: &[&str]) -> String {
    crate::keys::add_key(ws, args)["token"]
        .as_str()
        .expect("the new key")
        .to_string()
}

/// The tokens an occupying stream asks for: more than any test holds it for, on any
/// machine (the context is 2048), so that it ends only when the test releases it.
const OCCUPYING_TOKENS: u32 = 1800;

/// A streamed chat that holds a model's one slot until [`Occupier::release`]: the test,
/// not this machine's speed, decides when the slot frees.
struct Occupier {
    /// A second handle on the connection, to end it from the test's thread.
    connection: std::net::TcpStream,
    /// Reads the stream until the connection ends; returns what it read.
    reader: std::thread::JoinHandle<String>,
}

impl Occupier {
    /// Ends the stream by closing its connection (the client going away, which frees
    /// the slot) and returns what it read: it must have been streaming all along.
    fn release(self) {
        let _ = self.connection.shutdown(std::net::Shutdown::Both);
        drop(self.connection);
        let seen = self.reader.join().unwrap();
        assert!(
            seen.contains("data: ") && !seen.contains("[DONE]"),
            "the occupying stream ended on its own: {seen}"
        );
    }
}

/// Fills `model`'s one slot with a streamed chat for `key`: returns once its first event
/// came.
fn occupy(port: u16, key: &str, model: &str) -> Occupier {
    let (mut stream, mut seen) = crate::keys::open_stream(port, key, model, OCCUPYING_TOKENS);
    let connection = stream.try_clone().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buffer = [0u8; 4096];
        loop {
            let n = stream.read(&mut buffer).unwrap_or(0);
            if n == 0 {
                break seen;
            }
            seen.push_str(&String::from_utf8_lossy(&buffer[..n]));
        }
    });
    Occupier { connection, reader }
}

/// The client's timeouts for `retry_client.py`: `deadline`, shorter than the wait ahead
/// of its request (`deadline` mode), and `patient`, far longer than any wait or answer
/// (every other request). Both follow the measured service time, which this machine's
/// speed and load decide: a fixed `patient` was once shorter than the wait on a loaded
/// machine, and its request was refused.
struct Timeouts {
    deadline: String,
    patient: String,
}

impl Timeouts {
    /// Half, and twice plus two minutes, the `service` time in seconds.
    fn of(service: f64) -> Self {
        Self {
            deadline: format!("{:.2}", service / 2.0),
            patient: format!("{:.0}", service * 2.0 + 120.0),
        }
    }
}

/// Runs `retry_client.py MODE`: once it is ready, fills `smol`'s (or, for `deadline`,
/// `smol-q`'s) slot, frees it when the client prints `release` (or at its end), and
/// checks its `ok` lines.
fn run_retry_client(port: u16, token: &str, mode: &str, timeouts: &Timeouts, checks: &[&str]) {
    let python = crate::support::provisioned("ARCANE_CLIENTS_PYTHON");
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/clients/retry_client.py");
    let mut child = Command::new(python)
        .arg(script)
        .arg(mode)
        .env("ARCANE_ROOT_URL", format!("http://127.0.0.1:{port}"))
        .env("ARCANE_TOKEN", token)
        .env("ARCANE_MODEL", "smol")
        .env("ARCANE_QUEUED_MODEL", "smol-q")
        .env("ARCANE_DEADLINE", &timeouts.deadline)
        .env("ARCANE_PATIENT", &timeouts.patient)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().map(|line| line.unwrap()).unwrap_or_default();
    assert_eq!(first, "ready", "{first}");
    let model = if mode == "deadline" { "smol-q" } else { "smol" };
    let mut occupier = Some(occupy(port, token, model));
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    for line in lines {
        let line = line.unwrap();
        if line == "release when queued" {
            crate::support::wait_until(Duration::from_secs(60), "a queued request", || {
                let (_, metrics) = call(port, token, "GET", "/metrics", None);
                let depth = format!(r#"arcane_queue_depth{{model="{model}"}}"#);
                crate::support::metric(&metrics, &depth) == 1.0
            });
        }
        if line.starts_with("release") {
            occupier.take().expect("one release").release();
        }
        rest.push_str(&line);
        rest.push('\n');
    }
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{mode} failed:\n{rest}\n{err}");
    for check in checks {
        assert!(
            rest.lines().any(|l| l == format!("ok {check}")),
            "`{check}` did not pass:\n{rest}\n{err}"
        );
    }
    if let Some(occupier) = occupier {
        occupier.release();
    }
}

#[test]
fn a_full_queue_answers_503_with_the_wait_ahead_and_the_official_clients_back_off_as_told() {
    let ws = gateway_workspace(QUEUES);
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);
    // One request each measures the service time the waits are computed from. The
    // deadline case needs a wait well above the time a refusal takes to arrive, whatever
    // this machine's speed: `smol-q` measures a longer answer, and the client's timeout
    // is half of what it measured (the wait ahead of a request behind the one in its
    // slot is exactly the measured time: no `smol-q` request ends before that case).
    for (model, tokens) in [("smol", 60), ("smol-q", 300)] {
        chat(port, &token, model, tokens);
    }
    let service = crate::gateway::row(&crate::gateway::ps(&ws), "smol-q")["serviceSeconds"]
        .as_f64()
        .expect("smol-q measured its service time");
    let timeouts = Timeouts::of(service);
    run_retry_client(
        port,
        &token,
        "openai",
        &timeouts,
        &[
            "openai first try is refused",
            "openai was refused while the slot was taken",
            "openai waited what each refusal said before retrying",
            "openai Retry-After is the same wait in whole seconds",
            "openai was served in the end",
        ],
    );
    run_retry_client(
        port,
        &token,
        "anthropic",
        &timeouts,
        &[
            "anthropic first try is overloaded",
            "anthropic was refused while the slot was taken",
            "anthropic waited what each refusal said before retrying",
            "anthropic was served in the end",
        ],
    );
    run_retry_client(
        port,
        &token,
        "ollama",
        &timeouts,
        &["ollama is refused with 503"],
    );
    run_retry_client(
        port,
        &token,
        "deadline",
        &timeouts,
        &[
            "a deadline shorter than the wait is refused at once",
            "a deadline longer than the wait is served",
        ],
    );
    let (_, metrics) = call(port, &token, "GET", "/metrics", None);
    assert!(
        crate::support::metric(
            &metrics,
            r#"arcane_requests_refused_total{model="smol",reason="queue_full"}"#
        ) >= 4.0,
        "{metrics}"
    );
    assert_eq!(
        crate::support::metric(
            &metrics,
            r#"arcane_requests_refused_total{model="smol-q",reason="deadline"}"#
        ),
        1.0,
        "{metrics}"
    );
    // `arcane ps` says each model's limits and measured service time.
    let rows = crate::gateway::ps(&ws);
    let row = crate::gateway::row(&rows, "smol-q");
    assert_eq!((&row["parallel"], &row["maxQueue"]), (&json!(1), &json!(8)));
    assert!(
        row["serviceSeconds"].as_f64().is_some_and(|s| s > 0.0),
        "{row}"
    );
    signal(serve.pid(), "TERM");
    assert_eq!(serve.wait_exit(Duration::from_secs(60)), Some(0));
}

#[test]
fn a_flooding_key_takes_turns_with_a_key_that_sends_one_request() {
    let ws = gateway_workspace(QUEUES);
    let (flood, single) = (key(&ws, &["flood"]), key(&ws, &["single"]));
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);
    chat(port, &token, "smol-q", 20);
    // `flood` fills the slot, held until `single` waits too, and the queue's first six
    // places.
    let (finished, order) = mpsc::channel::<String>();
    let first = occupy(port, &flood, "smol-q");
    let mut floods = Vec::new();
    for i in 0..6 {
        let (flood, finished) = (flood.clone(), finished.clone());
        floods.push(std::thread::spawn(move || {
            chat(port, &flood, "smol-q", 20);
            let _ = finished.send(format!("flood {i}"));
        }));
    }
    crate::support::wait_until(
        Duration::from_secs(60),
        "six queued requests of `flood`",
        || {
            let rows = crate::gateway::ps(&ws);
            crate::gateway::row(&rows, "smol-q")["queuedByKey"]["flood"] == 6
        },
    );
    // `/metrics` and `arcane ps` show the queue by key.
    let (_, metrics) = call(port, &token, "GET", "/metrics", None);
    assert_eq!(
        crate::support::metric(
            &metrics,
            r#"arcane_key_queue_depth{key="flood",model="smol-q"}"#
        ),
        6.0,
        "{metrics}"
    );
    assert_eq!(
        crate::support::metric(&metrics, r#"arcane_queue_depth{model="smol-q"}"#),
        6.0
    );
    let single = {
        let finished = finished.clone();
        std::thread::spawn(move || {
            chat(port, &single, "smol-q", 20);
            let _ = finished.send("single".into());
        })
    };
    crate::support::wait_until(Duration::from_secs(60), "`single` queued", || {
        let rows = crate::gateway::ps(&ws);
        crate::gateway::row(&rows, "smol-q")["queuedByKey"]["single"] == 1
    });
    first.release();
    single.join().unwrap();
    for flood in floods {
        flood.join().unwrap();
    }
    drop(finished);
    let order: Vec<String> = order.iter().collect();
    // The one request of `single` went after at most one of `flood`'s queued requests
    // (the one whose turn came first), not after all six.
    let position = order.iter().position(|o| o == "single").unwrap();
    assert!(position <= 1, "{order:?}");
    signal(serve.pid(), "TERM");
    assert_eq!(serve.wait_exit(Duration::from_secs(60)), Some(0));
}

#[test]
fn a_high_priority_key_goes_before_an_earlier_one_and_a_deadline_header_is_honoured() {
    let ws = gateway_workspace(QUEUES);
    let (busy, early, urgent) = (
        key(&ws, &["busy"]),
        key(&ws, &["early", "--priority", "low"]),
        key(&ws, &["urgent", "--priority", "high"]),
    );
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);
    // The measured service time: long enough that the wait ahead of the deadline header
    // below is far above its 0.05 s on a fast machine too.
    chat(port, &token, "smol-q", 100);
    let (finished, order) = mpsc::channel::<&str>();
    let send = |key: String, name: &'static str| {
        let finished = finished.clone();
        std::thread::spawn(move || {
            chat(port, &key, "smol-q", 10);
            let _ = finished.send(name);
        })
    };
    let queued = |ws: &TestWorkspace, name: &str| {
        crate::gateway::row(&crate::gateway::ps(ws), "smol-q")["queuedByKey"][name] == 1
    };
    // `early` (low priority) waits first, then `urgent` (high) arrives: neither was
    // served before, so only the priority can put `urgent` first.
    let first = occupy(port, &busy, "smol-q");
    let early = send(early, "early");
    crate::support::wait_until(Duration::from_secs(60), "`early` queued", || {
        queued(&ws, "early")
    });
    let urgent = send(urgent, "urgent");
    crate::support::wait_until(Duration::from_secs(60), "`urgent` queued", || {
        queued(&ws, "urgent")
    });
    // Any client may state its deadline in seconds: a wait longer than it is refused at
    // once, naming both.
    let body = long_chat("smol-q", 10, false).to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\nX-Arcane-Deadline: 0.05\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, head, body) = crate::front_door::exchange(port, &request);
    assert_eq!(status, 503, "{body}");
    assert!(head.contains("retry-after-ms: "), "{head}");
    let refusal: Value = serde_json::from_str(&body).unwrap();
    let details = &refusal["error"]["details"];
    assert_eq!(details["reason"], "deadline", "{refusal}");
    assert_eq!(details["deadlineSeconds"], 0.05, "{refusal}");
    assert!(
        details["expectedWaitSeconds"].as_f64().unwrap() > 0.05,
        "{refusal}"
    );
    first.release();
    early.join().unwrap();
    urgent.join().unwrap();
    drop(finished);
    let order: Vec<&str> = order.iter().collect();
    assert_eq!(order, ["urgent", "early"]);
    signal(serve.pid(), "TERM");
    assert_eq!(serve.wait_exit(Duration::from_secs(60)), Some(0));
}
