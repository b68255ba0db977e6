//! The HTTP transport: admission (token, Host, Origin), RPC, control, SSE, limits and
//! the passthrough's not-ready answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arcane_core::localai::EngineState;
use arcane_core::{AppInfo, Host, Unready};
use arcane_front_door::http::{HttpOptions, Upstream, UpstreamTarget};
use arcane_front_door::origins::AllowedOrigins;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::support::{dechunk, raw_http, TestService};

#[allow(dead_code)]
pub struct Served {
    pub host: Host,
    pub address: SocketAddr,
    pub token: String,
    pub service: Arc<TestService>,
    pub task: tokio::task::JoinHandle<Result<(), arcane_core::Error>>,
}

pub async fn serve(upstream: Option<Arc<dyn Upstream>>) -> Served {
    serve_with(
        upstream,
        arcane_front_door::limits::ConnectionLimits::default(),
    )
    .await
    .0
}

/// A host with one test service on loopback, with `upstream` and `limits`; also the
/// types of the events its observer saw.
async fn serve_with(
    upstream: Option<Arc<dyn Upstream>>,
    limits: arcane_front_door::limits::ConnectionLimits,
) -> (Served, Arc<std::sync::Mutex<Vec<String>>>) {
    serve_allowing(upstream, limits, AllowedOrigins::default()).await
}

/// [`serve_with`], letting pages of `allowed` read the answers.
async fn serve_allowing(
    upstream: Option<Arc<dyn Upstream>>,
    limits: arcane_front_door::limits::ConnectionLimits,
    allowed: AllowedOrigins,
) -> (Served, Arc<std::sync::Mutex<Vec<String>>>) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let events = Arc::clone(&seen);
    let observer: Arc<dyn arcane_report::EventSink> =
        Arc::new(move |event: arcane_report::Event| events.lock().unwrap().push(event.kind));
    let service = TestService::new("t", "test");
    let host = Host::builder(AppInfo::default())
        .observer(observer)
        .service(service.clone())
        .unwrap()
        .build();
    host.start();
    host.service_settled("t").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let token = arcane_core::endpoint::new_token().unwrap();
    let mut options = HttpOptions::new(token.clone());
    options.max_body = 64 * 1024;
    options.limits = limits;
    options.allowed_origins = allowed;
    if let Some(upstream) = upstream {
        options = options.upstream(upstream);
    }
    let task = tokio::spawn(arcane_front_door::http::serve(
        host.clone(),
        listener,
        options,
    ));
    let served = Served {
        host,
        address,
        token,
        service,
        task,
    };
    (served, seen)
}

fn rpc_head(
    served: &Served,
    auth: Option<&str>,
    host: Option<String>,
    origin: Option<&str>,
) -> String {
    let mut head = "POST /v1/rpc HTTP/1.1\r\n".to_string();
    head.push_str(&format!(
        "Host: {}\r\n",
        host.unwrap_or_else(|| served.address.to_string())
    ));
    if let Some(auth) = auth {
        head.push_str(&format!("Authorization: {auth}\r\n"));
    }
    if let Some(origin) = origin {
        head.push_str(&format!("Origin: {origin}\r\n"));
    }
    head.push_str("Content-Type: application/json\r\n");
    head
}

fn echo_frame() -> String {
    json!({"protocol": "arcane/1", "type": "request", "id": "1", "method": "test.echo", "parameters": {"x": 1}}).to_string()
}

#[tokio::test]
async fn bad_credentials_are_refused_before_anything_runs() {
    let served = serve(None).await;
    let good = format!("Bearer {}", served.token);
    let wrong = format!("Bearer {}x", &served.token[..served.token.len() - 1]);
    let port = served.address.port();
    type Case<'a> = (Option<&'a str>, Option<String>, Option<&'a str>, u16);
    let cases: Vec<Case> = vec![
        (None, None, None, 401),
        (Some(wrong.as_str()), None, None, 401),
        (Some("Bearer "), None, None, 401),
        (Some(served.token.as_str()), None, None, 401), // no `Bearer ` scheme
        (
            Some(good.as_str()),
            Some(format!("evil.example:{port}")),
            None,
            421,
        ),
        (Some(good.as_str()), Some("127.0.0.1:1".into()), None, 421),
        (Some(good.as_str()), None, Some("http://evil.example"), 403),
        (Some(good.as_str()), None, Some("null"), 403),
    ];
    let mut bodies_401 = Vec::new();
    for (auth, host, origin, expected) in cases {
        let (status, head, body) = raw_http(
            served.address,
            &rpc_head(&served, auth, host.clone(), origin),
            &echo_frame(),
        )
        .await;
        assert_eq!(
            status, expected,
            "auth {auth:?} host {host:?} origin {origin:?}: {body}"
        );
        let body: Value = serde_json::from_str(&dechunk(&head, &body)).unwrap();
        assert_eq!(body["error"]["code"], "CORE_UNAUTHORIZED");
        if expected == 401 {
            assert!(head.contains("www-authenticate: bearer"));
            bodies_401.push(body);
        }
    }
    assert!(
        bodies_401.windows(2).all(|w| w[0] == w[1]),
        "every bad token gets the identical body"
    );
    assert_eq!(served.service.calls(), 0, "nothing was executed");
    // Every endpoint is guarded, health and events included.
    for path in [
        "GET /v1/health",
        "GET /v1/events",
        "GET /v1/models",
        "POST /v1/control",
    ] {
        let head = format!("{path} HTTP/1.1\r\nHost: {}\r\n", served.address);
        assert_eq!(raw_http(served.address, &head, "").await.0, 401, "{path}");
    }
    // The good request, same origin, works.
    let origin = format!("http://127.0.0.1:{port}");
    let (status, head, body) = raw_http(
        served.address,
        &rpc_head(&served, Some(&good), None, Some(&origin)),
        &echo_frame(),
    )
    .await;
    assert_eq!(status, 200);
    let frame: Value = serde_json::from_str(&dechunk(&head, &body)).unwrap();
    assert_eq!(frame["ok"], true);
    assert_eq!(frame["result"], json!({"x": 1}));
    assert_eq!(served.service.calls(), 1);
    // `localhost:<port>` is a loopback name too.
    let (status, _, _) = raw_http(
        served.address,
        &rpc_head(
            &served,
            Some(&good),
            Some(format!("localhost:{port}")),
            None,
        ),
        &echo_frame(),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn malformed_and_oversized_bodies() {
    let served = serve(None).await;
    let good = format!("Bearer {}", served.token);
    let (status, head, body) = raw_http(
        served.address,
        &rpc_head(&served, Some(&good), None, None),
        "{nope",
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(
        serde_json::from_str::<Value>(&dechunk(&head, &body)).unwrap()["error"]["code"],
        "RPC_FRAME_INVALID"
    );
    let big = format!(
        r#"{{"protocol":"arcane/1","type":"request","id":"1","method":"test.echo","parameters":{{"p":"{}"}}}}"#,
        "x".repeat(100_000)
    );
    let (status, _, _) = raw_http(
        served.address,
        &rpc_head(&served, Some(&good), None, None),
        &big,
    )
    .await;
    assert_eq!(status, 413);
    assert_eq!(served.service.calls(), 0);
    // Still healthy afterwards.
    let head = format!(
        "GET /v1/health HTTP/1.1\r\nHost: {}\r\nAuthorization: {good}\r\n",
        served.address
    );
    let (status, head, body) = raw_http(served.address, &head, "").await;
    assert_eq!(status, 200);
    let health: Value = serde_json::from_str(&dechunk(&head, &body)).unwrap();
    assert_eq!(health["protocol"], "arcane/1");
    assert_eq!(health["state"], "ready");
}

/// Opens `/v1/events` and returns a line reader positioned after the head.
async fn open_events(served: &Served, client: &str) -> BufReader<tokio::net::TcpStream> {
    let mut stream = tokio::net::TcpStream::connect(served.address)
        .await
        .unwrap();
    let head = format!(
        "GET /v1/events?client={client} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\r\n",
        served.address, served.token
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).await.unwrap();
        if line == "\r\n" {
            return reader;
        }
    }
}

/// The next SSE `data:` frame.
async fn next_event(reader: &mut BufReader<tokio::net::TcpStream>) -> Value {
    let mut line = String::new();
    loop {
        line.clear();
        let n = tokio::time::timeout(Duration::from_secs(30), reader.read_line(&mut line))
            .await
            .expect("event in time")
            .unwrap();
        assert!(n > 0, "event stream ended");
        if let Some(data) = line.trim().strip_prefix("data: ") {
            return serde_json::from_str(data).unwrap();
        }
    }
}

async fn post(served: &Served, path: &str, client: Option<&str>, frame: Value) -> (u16, Value) {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n",
        served.address, served.token
    );
    if let Some(client) = client {
        head.push_str(&format!("X-Arcane-Client: {client}\r\n"));
    }
    let (status, head, body) = raw_http(served.address, &head, &frame.to_string()).await;
    (
        status,
        serde_json::from_str(&dechunk(&head, &body)).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn sse_replays_then_streams_only_the_clients_own_request_events() {
    let served = serve(None).await;
    let mut alice = open_events(&served, "alice").await;
    let mut bob = open_events(&served, "bob").await;
    for reader in [&mut alice, &mut bob] {
        let first: Vec<_> = [
            next_event(reader).await,
            next_event(reader).await,
            next_event(reader).await,
        ]
        .iter()
        .map(|f| f["event"].as_str().unwrap().to_string())
        .collect();
        assert_eq!(
            first,
            vec!["core.ready", "core.state", "core.service.state"]
        );
        assert_eq!(next_event(reader).await["event"], "test.state");
    }
    let frame = json!({"protocol": "arcane/1", "type": "request", "id": "r1", "method": "test.stream", "parameters": {"count": 2}});
    let (status, response) = post(&served, "/v1/rpc", Some("alice"), frame.clone()).await;
    assert_eq!((status, &response["result"]), (200, &json!({"chunks": 2})));
    // Alice sees her chunks, then the copy of her response.
    let mut seen = Vec::new();
    loop {
        let event = next_event(&mut alice).await;
        let done = event["type"] == "response";
        seen.push(event);
        if done {
            break;
        }
    }
    assert_eq!(
        seen.iter()
            .filter(|f| f["event"] == "test.chunk" && f["requestId"] == "r1")
            .count(),
        2
    );
    // Bob's stream got nothing of it: his next event is the answer to his own request.
    let (_, response) = post(&served, "/v1/rpc", Some("bob"), frame).await;
    assert_eq!(response["ok"], true);
    let event = next_event(&mut bob).await;
    assert_eq!(event["event"], "test.chunk");
    assert_eq!(event["data"]["index"], 0);
    // Controls reach the named client: replay goes to Bob's stream.
    let (status, control) = post(
        &served,
        "/v1/control",
        Some("bob"),
        json!({"protocol": "arcane/1", "type": "control", "control": "runtime.replay"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(control["result"]["replayed"], 4);
}

/// Issue 10, item 12 (the HTTP side): valid JSON that is not an object is answered
/// `ok:false`, as on stdio, and the host keeps answering.
#[tokio::test]
async fn rpc_bodies_that_are_json_but_not_objects_are_answered_ok_false() {
    let served = serve(None).await;
    for body in [json!([1]), json!("hi"), Value::Null] {
        let (status, response) = post(&served, "/v1/rpc", None, body.clone()).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(response["ok"], false, "{body}: {response}");
        assert_eq!(response["error"]["code"], "RPC_FRAME_INVALID", "{body}");
    }
    let ping =
        json!({"protocol": "arcane/1", "type": "request", "id": "p", "method": "system.ping"});
    let (status, response) = post(&served, "/v1/rpc", None, ping).await;
    assert_eq!((status, &response["ok"]), (200, &json!(true)));
}

#[tokio::test]
async fn shutdown_rpc_closes_the_host_and_ends_event_streams() {
    let served = serve(None).await;
    let mut events = open_events(&served, "c").await;
    let (status, response) = post(&served, "/v1/rpc", None, json!({"protocol": "arcane/1", "type": "request", "id": "s", "method": "core.host.shutdown"})).await;
    assert_eq!(status, 200);
    assert_eq!(response["result"], json!({"state": "closed"}));
    assert_eq!(
        served
            .service
            .disposed
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    // The stream carried `closed`, then ended.
    loop {
        let event = next_event(&mut events).await;
        if event["event"] == "core.state" && event["data"]["state"] == "closed" {
            break;
        }
    }
    tokio::time::timeout(Duration::from_secs(30), served.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

struct Loading;

impl Upstream for Loading {
    fn openai_target(&self) -> UpstreamTarget {
        UpstreamTarget::Unavailable {
            runtime: "llama.cpp".into(),
            state: Unready::In(EngineState::Loading),
            retry_after: Some(2),
        }
    }
}

#[tokio::test]
async fn the_passthrough_answers_503_with_retry_after_while_the_engine_loads() {
    let served = serve(Some(Arc::new(Loading))).await;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\n",
        served.address, served.token
    );
    let (status, head, body) = raw_http(served.address, &head, r#"{"messages":[]}"#).await;
    assert_eq!(status, 503);
    assert!(head.contains("retry-after: 2"), "{head}");
    let body: Value = serde_json::from_str(&dechunk(&head, &body)).unwrap();
    assert_eq!(body["error"]["code"], "LOCAL_AI_SERVER_NOT_READY");
    assert_eq!(body["error"]["details"]["state"], "loading");
}

#[tokio::test]
async fn an_event_stream_that_stops_reading_is_dropped_instead_of_buffering_without_bound() {
    let served = serve(None).await;
    let mut stalled = open_events(&served, "stalled").await;
    let events = served.host.events();
    let total = 100_000;
    let padding = "x".repeat(200);
    for i in 0..total {
        arcane_report::EventSink::emit(
            &events,
            arcane_report::Event::new("test.flood", json!({"i": i, "pad": padding})),
        );
    }
    // The flood is emitted without yielding: on this current-thread runtime the SSE
    // writer cannot drain anything meanwhile, so the client's backlog overflows however
    // fast or slow the machine is (a yield here made the outcome depend on load).
    // The stream ends (the host dropped the subscriber) after fewer than all events.
    let mut delivered = 0;
    let mut line = String::new();
    loop {
        line.clear();
        let n = tokio::time::timeout(Duration::from_secs(60), stalled.read_line(&mut line))
            .await
            .expect("the stream ends")
            .unwrap();
        // End of input, or the last chunk of the (chunked, kept-alive) response.
        if n == 0 || line == "0\r\n" {
            break;
        }
        if line.contains("\"test.flood\"") {
            delivered += 1;
        }
    }
    assert!(
        delivered < total,
        "all {total} events were buffered for a client that was not reading"
    );
    // Other clients are unaffected.
    let (status, response) = post(
        &served,
        "/v1/rpc",
        None,
        json!({"protocol": "arcane/1", "type": "request", "id": "1", "method": "system.ping"}),
    )
    .await;
    assert_eq!((status, response["ok"].as_bool()), (200, Some(true)));
}

#[tokio::test]
async fn a_frame_with_a_duplicate_key_is_refused_and_never_dispatched() {
    // Issue: `"method":"system.ping","method":"core.host.shutdown"` shut the host down
    // (the last key won).
    let served = serve(None).await;
    let good = format!("Bearer {}", served.token);
    let smuggled = r#"{"protocol":"arcane/1","type":"request","id":"1","method":"system.ping","method":"core.host.shutdown"}"#;
    let (status, head, body) = raw_http(
        served.address,
        &rpc_head(&served, Some(&good), None, None),
        smuggled,
    )
    .await;
    assert_eq!(status, 400);
    let answer: Value = serde_json::from_str(&dechunk(&head, &body)).unwrap();
    assert_eq!(answer["error"]["code"], "RPC_FRAME_INVALID", "{answer}");
    assert_eq!(
        answer["error"]["details"]["reason"], "IPC_DUPLICATE_KEY",
        "{answer}"
    );
    // Nested duplicates too, and the host is still up and answering.
    let nested = r#"{"protocol":"arcane/1","type":"request","id":"2","method":"test.echo","parameters":{"x":1,"x":2}}"#;
    let (status, _, _) = raw_http(
        served.address,
        &rpc_head(&served, Some(&good), None, None),
        nested,
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(served.service.calls(), 0);
    let (status, response) = post(
        &served,
        "/v1/rpc",
        None,
        json!({"protocol": "arcane/1", "type": "request", "id": "3", "method": "system.ping"}),
    )
    .await;
    assert_eq!(status, 200, "{response}");
}

#[tokio::test]
async fn distinct_client_names_do_not_grow_the_host_without_bound() {
    // Issue: 20,000 RPCs with distinct `X-Arcane-Client` names raised RSS permanently.
    let served = serve(None).await;
    let ping =
        json!({"protocol": "arcane/1", "type": "request", "id": "p", "method": "system.ping"});
    for i in 0..1500 {
        let (status, _) = post(
            &served,
            "/v1/rpc",
            Some(&format!("client-{i}")),
            ping.clone(),
        )
        .await;
        assert_eq!(status, 200);
    }
    let remembered = served.host.named_clients();
    assert!(
        (1..=1024).contains(&remembered),
        "{remembered} named clients remembered"
    );
    // A client that keeps its event stream open is never forgotten: after more churn
    // than the cap, its own request's events still reach its stream.
    let mut listener = open_events(&served, "listener").await;
    for _ in 0..4 {
        next_event(&mut listener).await; // the replay
    }
    for i in 0..1100 {
        let (status, _) = post(&served, "/v1/rpc", Some(&format!("more-{i}")), ping.clone()).await;
        assert_eq!(status, 200);
    }
    assert!(served.host.named_clients() <= 1024);
    let frame = json!({"protocol": "arcane/1", "type": "request", "id": "r", "method": "test.stream", "parameters": {"count": 1}});
    let (status, _) = post(&served, "/v1/rpc", Some("listener"), frame).await;
    assert_eq!(status, 200);
    let event = next_event(&mut listener).await;
    assert_eq!(event["event"], "test.chunk", "{event}");
    assert_eq!(event["requestId"], "r");
}

/// Reads until the peer closes (`true`) or `within` passes (`false`).
async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buffer = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn slow_idle_and_excess_connections_are_closed_and_real_requests_still_answered() {
    // Issue: a client sending one header byte per second stayed connected for 45 s and
    // more; 200 idle connections, half with partial headers, all stayed open.
    use tokio::io::AsyncWriteExt;
    let limits = arcane_front_door::limits::ConnectionLimits {
        header_read: Duration::from_secs(1),
        idle: Duration::from_secs(1),
        max_connections: 64,
        max_unauthenticated: 64,
        unauthenticated_idle: Duration::from_secs(1),
    };
    let (served, events) = serve_with(None, limits).await;
    // 1. A head dribbled a byte at a time is cut off by the header-read timeout.
    let mut slow = tokio::net::TcpStream::connect(served.address)
        .await
        .unwrap();
    let dribble = tokio::spawn(async move {
        for byte in b"GET /v1/health HTTP/1.1\r\nHost: x\r\n" {
            if slow.write_all(&[*byte]).await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        closed_within(&mut slow, Duration::from_secs(1)).await
    });
    assert!(dribble.await.unwrap(), "the slow client was never cut off");
    // 2. A keep-alive connection left idle after a request is closed.
    let mut idle = tokio::net::TcpStream::connect(served.address)
        .await
        .unwrap();
    let head = format!(
        "GET /v1/health HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\r\n",
        served.address, served.token
    );
    idle.write_all(head.as_bytes()).await.unwrap();
    assert!(
        closed_within(&mut idle, Duration::from_secs(20)).await,
        "the idle connection stayed open"
    );
    // 3. Past the cap a new connection is closed at once, said once; once the squatters
    //    are cut off, authenticated requests are answered again.
    let mut held = Vec::new();
    for _ in 0..limits.max_connections {
        held.push(
            tokio::net::TcpStream::connect(served.address)
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut extra = tokio::net::TcpStream::connect(served.address)
        .await
        .unwrap();
    assert!(closed_within(&mut extra, Duration::from_secs(5)).await);
    assert_eq!(
        events
            .lock()
            .unwrap()
            .iter()
            .filter(|kind| *kind == "core.http.connection-limit")
            .count(),
        1
    );
    for stream in &mut held {
        assert!(
            closed_within(stream, Duration::from_secs(20)).await,
            "a squatter stayed"
        );
    }
    let (status, _) = post(
        &served,
        "/v1/rpc",
        None,
        json!({"protocol": "arcane/1", "type": "request", "id": "p", "method": "system.ping"}),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn an_authenticated_request_is_answered_while_500_idle_connections_are_held() {
    let served = serve(None).await;
    let mut held = Vec::new();
    for i in 0..500 {
        let mut stream = tokio::net::TcpStream::connect(served.address)
            .await
            .unwrap();
        if i % 2 == 0 {
            use tokio::io::AsyncWriteExt;
            stream.write_all(b"GET /v1/hea").await.unwrap();
        }
        held.push(stream);
    }
    let (status, response) = post(
        &served,
        "/v1/rpc",
        None,
        json!({"protocol": "arcane/1", "type": "request", "id": "p", "method": "system.ping"}),
    )
    .await;
    assert_eq!(status, 200, "{response}");
}

/// Issue 19, item 8: connections that never present the token cannot keep out those
/// that do (1100 idle connections let 14 of 45 authenticated requests through): past
/// the budget for unauthenticated connections a new one closes the oldest, and the
/// cap on all connections is never reached by them.
#[tokio::test]
async fn connections_that_never_authenticate_cannot_keep_out_those_that_do() {
    let limits = arcane_front_door::limits::ConnectionLimits {
        max_connections: 128,
        max_unauthenticated: 16,
        // Long: eviction, not the idle limit, is what is tested.
        unauthenticated_idle: Duration::from_secs(60),
        ..Default::default()
    };
    let (served, events) = serve_with(None, limits).await;
    let mut held = Vec::new();
    for _ in 0..300 {
        held.push(
            tokio::net::TcpStream::connect(served.address)
                .await
                .unwrap(),
        );
    }
    let mut answered = 0;
    for i in 0..45 {
        let (status, _) = post(
            &served,
            "/v1/rpc",
            None,
            json!({"protocol": "arcane/1", "type": "request", "id": format!("p{i}"), "method": "system.ping"}),
        )
        .await;
        answered += usize::from(status == 200);
    }
    assert_eq!(answered, 45);
    // The oldest squatters were closed to make room; the cap was never hit.
    assert!(closed_within(&mut held[0], Duration::from_secs(5)).await);
    assert!(!events
        .lock()
        .unwrap()
        .iter()
        .any(|kind| kind == "core.http.connection-limit"));
}

/// `GET <path>` with these extra header lines; (status, JSON body).
async fn get(served: &Served, path: &str, extra: &str) -> (u16, Value) {
    let head = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n{extra}", served.address);
    let (status, head, body) = raw_http(served.address, &head, "").await;
    let text = dechunk(&head, &body);
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test]
async fn health_needs_no_token_and_reveals_only_a_status_everything_else_needs_one() {
    let served = serve(None).await;
    let (status, body) = get(&served, "/health", "").await;
    assert_eq!((status, &body), (200, &json!({"status": "ok"})));
    // Still only from the loopback listener itself, and never to a foreign page.
    let head = "GET /health HTTP/1.1\r\nHost: evil.example:80\r\n";
    assert_eq!(raw_http(served.address, head, "").await.0, 421);
    let (status, _) = get(&served, "/health", "Origin: http://evil.example\r\n").await;
    assert_eq!(status, 403);
    // The detailed health keeps needing the token; the scheme is case-insensitive.
    assert_eq!(get(&served, "/v1/health", "").await.0, 401);
    let lower = format!("Authorization: bearer {}\r\n", served.token);
    let (status, body) = get(&served, "/v1/health", &lower).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["protocol"], "arcane/1");
    let wrong = "Authorization: Basic Zm9vOmJhcg==\r\n";
    assert_eq!(get(&served, "/v1/health", wrong).await.0, 401);
    // A loading engine is `loading` (503), for a load balancer to wait.
    let loading = serve(Some(Arc::new(Loading))).await;
    let (status, body) = get(&loading, "/health", "").await;
    assert_eq!((status, &body), (503, &json!({"status": "loading"})));
}

/// The value of header `name` in a response head (names compared case-insensitively).
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// A page of an allowed origin gets CORS answers: its preflight without the token,
/// then every answer (a 401 too, so the page can say why); its requests still need
/// the token. Any other origin stays refused, and the listener's own origin needs no
/// CORS headers.
#[tokio::test]
async fn an_allowed_origin_gets_cors_answers_and_still_needs_the_token() {
    let allowed = "http://localhost:3000";
    let (served, _) = serve_allowing(
        None,
        arcane_front_door::limits::ConnectionLimits::default(),
        AllowedOrigins::parse(&[allowed]).unwrap(),
    )
    .await;
    let preflight = |origin: &str| {
        format!(
            "OPTIONS /v1/rpc HTTP/1.1\r\nHost: {}\r\nOrigin: {origin}\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type\r\n",
            served.address
        )
    };
    let (status, head, _) = raw_http(served.address, &preflight(allowed), "").await;
    assert_eq!(status, 204, "{head}");
    assert_eq!(header(&head, "access-control-allow-origin"), Some(allowed));
    assert_eq!(
        header(&head, "access-control-allow-headers"),
        Some("authorization, content-type")
    );
    assert_eq!(header(&head, "access-control-allow-credentials"), None);

    let bearer = format!("Bearer {}", served.token);
    let (status, head, _) = raw_http(
        served.address,
        &rpc_head(&served, None, None, Some(allowed)),
        &echo_frame(),
    )
    .await;
    assert_eq!(status, 401, "still the token: {head}");
    assert_eq!(header(&head, "access-control-allow-origin"), Some(allowed));
    let (status, head, body) = raw_http(
        served.address,
        &rpc_head(&served, Some(&bearer), None, Some(allowed)),
        &echo_frame(),
    )
    .await;
    assert_eq!(status, 200, "{head}");
    assert!(body.contains("\"ok\":true"), "{body}");
    assert_eq!(header(&head, "access-control-allow-origin"), Some(allowed));
    assert_eq!(
        header(&head, "vary"),
        Some("origin"),
        "the head is lowercased"
    );

    // Another origin: its preflight and its requests are refused, with no CORS grant.
    let other = "http://localhost:3001";
    let (status, head, _) = raw_http(served.address, &preflight(other), "").await;
    assert_eq!(status, 403, "{head}");
    assert_eq!(header(&head, "access-control-allow-origin"), None);
    let (status, _, _) = raw_http(
        served.address,
        &rpc_head(&served, Some(&bearer), None, Some(other)),
        &echo_frame(),
    )
    .await;
    assert_eq!(status, 403);
    // The listener's own origin is same-origin: answered, no CORS headers needed.
    let own = format!("http://{}", served.address);
    let (status, head, _) = raw_http(
        served.address,
        &rpc_head(&served, Some(&bearer), None, Some(&own)),
        &echo_frame(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(header(&head, "access-control-allow-origin"), None);
}
