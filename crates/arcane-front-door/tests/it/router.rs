//! The front door's router with an upstream that routes by model and a scripted
//! engine on loopback (no real model needed): the model is found in a `text/plain`
//! body with a BOM and the engine gets the body byte for byte; an answer whose
//! `"model"` key and `usage` are split across two chunks is still renamed and counted;
//! an unknown path is answered without routing; an alias has its `/v1/models` entry;
//! `x-api-key` is admitted.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arcane_core::{AppInfo, BoxFuture, Host};
use arcane_front_door::http::{EngineAccess, HttpOptions, Upstream, UpstreamTarget};
use arcane_front_door::passthrough::{Lease, NoRoute, Route, RouteRequest};
use hyper::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// What the upstream and its leases saw.
#[derive(Default)]
struct Seen {
    routes: Vec<RouteRequest>,
    lease: Vec<String>,
}

/// Routes every request to the engine at `url`, renaming answers to the name asked.
struct ByModel {
    url: String,
    seen: Arc<Mutex<Seen>>,
}

struct Recording(Arc<Mutex<Seen>>);

impl Lease for Recording {
    fn answered(&mut self, status: StatusCode) {
        self.0
            .lock()
            .unwrap()
            .lease
            .push(format!("answered {status}"));
    }
    fn usage(&mut self, usage: &Value) {
        self.0.lock().unwrap().lease.push(format!("usage {usage}"));
    }
    fn finished(&mut self) {
        self.0.lock().unwrap().lease.push("finished".into());
    }
}

impl Upstream for ByModel {
    fn openai_target(&self) -> UpstreamTarget {
        UpstreamTarget::Ready {
            access: EngineAccess::tcp(&self.url).expect("a loopback url"),
        }
    }

    fn routes_by_model(&self) -> bool {
        true
    }

    fn route(&self, request: RouteRequest) -> BoxFuture<'_, Result<Route, NoRoute>> {
        Box::pin(async move {
            self.seen.lock().unwrap().routes.push(request.clone());
            Ok(Route {
                access: EngineAccess::tcp(&self.url).expect("a loopback url"),
                lease: Some(Box::new(Recording(Arc::clone(&self.seen)))),
                rename: request.model,
                upstream_model: None,
            })
        })
    }

    fn models(&self) -> Option<Value> {
        Some(json!({"object": "list", "data": [
            {"id": "smol-a", "object": "model", "aliases": []},
            {"id": "smol-b", "object": "model", "aliases": ["fast"]},
        ]}))
    }
}

fn chunk(text: &str) -> Vec<u8> {
    format!("{:x}\r\n{text}\r\n", text.len()).into_bytes()
}

/// A scripted engine answering one request with an SSE stream whose `"model"` key and
/// `usage` are each split across two chunks; sends the request body it received.
async fn engine() -> (String, oneshot::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (body_tx, body_rx) = oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut seen = Vec::new();
        let mut buffer = [0u8; 4096];
        let head_end = loop {
            if let Some(at) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let n = stream.read(&mut buffer).await.unwrap();
            assert!(n > 0, "the request ended early");
            seen.extend_from_slice(&buffer[..n]);
        };
        let head = String::from_utf8_lossy(&seen[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("a content-length");
        while seen.len() < head_end + length {
            let n = stream.read(&mut buffer).await.unwrap();
            assert!(n > 0, "the body ended early");
            seen.extend_from_slice(&buffer[..n]);
        }
        let _ = body_tx.send(seen[head_end..].to_vec());
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
        stream.write_all(head.as_bytes()).await.unwrap();
        for piece in [
            "data: {\"model\":\"smol-b\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"mod",
            "el\":\"smol-b\",\"choices\":[]}\n\ndata: {\"us",
            "age\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
        ] {
            stream.write_all(&chunk(piece)).await.unwrap();
            stream.flush().await.unwrap();
        }
        stream.write_all(b"0\r\n\r\n").await.unwrap();
        // Hold the connection until the Core closes it.
        let _ = stream.read(&mut buffer).await;
    });
    (url, body_rx)
}

async fn serve(upstream: Arc<dyn Upstream>) -> (Host, SocketAddr, String) {
    let host = Host::builder(AppInfo::default()).build();
    host.start();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let token = arcane_core::endpoint::new_token().unwrap();
    let options = HttpOptions::new(token.clone()).upstream(upstream);
    tokio::spawn(arcane_front_door::http::serve(
        host.clone(),
        listener,
        options,
    ));
    (host, address, token)
}

/// One raw exchange (`Connection: close`): status and the de-chunked body.
async fn exchange(address: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut raw))
        .await
        .expect("the answer in time")
        .unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, after)) = rest.split_once("\r\n") {
            let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if size == 0 {
                break;
            }
            out.push_str(&after[..size]);
            rest = &after[size + 2..];
        }
        out
    } else {
        body.to_string()
    };
    (status, body)
}

fn get(address: SocketAddr, path: &str, auth: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: {address}\r\n{auth}\r\nConnection: close\r\n\r\n")
        .into_bytes()
}

#[tokio::test]
async fn a_text_plain_body_with_a_bom_is_routed_and_a_split_answer_renamed_and_counted() {
    let (url, received) = engine().await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let upstream = Arc::new(ByModel {
        url,
        seen: Arc::clone(&seen),
    });
    let (host, address, token) = serve(upstream).await;
    let body = "\u{feff}{\"model\":\"fast\",\"stream\":true,\"messages\":[]}";
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, answer) = exchange(address, request.as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    // The engine got the client's bytes, BOM included.
    assert_eq!(received.await.unwrap(), body.as_bytes());
    assert_eq!(
        seen.lock().unwrap().routes[0].model.as_deref(),
        Some("fast")
    );
    // Both `"model"` keys renamed, the split one too.
    assert_eq!(
        answer,
        "data: {\"model\":\"fast\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n\
         data: {\"model\":\"fast\",\"choices\":[]}\n\n\
         data: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n"
    );
    // The split usage counted once, then the end.
    let lease = seen.lock().unwrap().lease.clone();
    assert_eq!(
        lease,
        [
            "answered 200 OK".to_string(),
            format!(
                "usage {}",
                json!({"prompt_tokens": 3, "completion_tokens": 2})
            ),
            "finished".to_string(),
        ]
    );
    host.close().await.unwrap();
}

#[tokio::test]
async fn unknown_paths_aliases_bad_models_and_x_api_key_are_answered_without_routing() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let upstream = Arc::new(ByModel {
        // Nothing listens here: nothing may be forwarded.
        url: "http://127.0.0.1:9".into(),
        seen: Arc::clone(&seen),
    });
    let (host, address, token) = serve(upstream).await;
    let bearer = format!("Authorization: Bearer {token}");

    let (status, body) = exchange(address, &get(address, "/nowhere", &bearer)).await;
    assert_eq!(status, 404, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"]["code"], "ARCANE_NOT_FOUND");
    assert_eq!(error["error"]["details"]["path"], "/nowhere");

    let (status, body) = exchange(address, &get(address, "/v1/models/fast", &bearer)).await;
    assert_eq!(status, 200, "{body}");
    let entry: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(entry["id"], "fast");
    assert_eq!(entry["aliases"], json!(["fast"]));
    let (status, body) = exchange(address, &get(address, "/v1/models/nope", &bearer)).await;
    assert_eq!(status, 404, "{body}");

    let (status, _) = exchange(
        address,
        &get(address, "/v1/models", &format!("x-api-key: {token}")),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = exchange(address, &get(address, "/v1/models", "x-api-key: wrong")).await;
    assert_eq!(status, 401);
    let both = format!("{bearer}\r\nx-api-key: wrong");
    let (status, _) = exchange(address, &get(address, "/v1/models", &both)).await;
    assert_eq!(status, 401);

    let body = r#"{"model":7}"#;
    let request = format!(
        "POST /v1/embeddings HTTP/1.1\r\nHost: {address}\r\n{bearer}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, body) = exchange(address, request.as_bytes()).await;
    assert_eq!(status, 400, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"]["code"], "ARCANE_USAGE");
    assert_eq!(error["error"]["details"], json!({"model": 7}));

    assert!(seen.lock().unwrap().routes.is_empty(), "nothing was routed");
    host.close().await.unwrap();
}

/// Issue 27, item 5: an engine that dies after it took the request and before it
/// answered (a crash, `kill -9`; a speech worker killed mid-synthesis) is answered
/// 502 in OpenAI's error shape (`message`, `type`, `param`, Arcane's `code`), saying
/// the engine stopped, not only the transport's "connection closed before message
/// completed". (Every path the front door forwards takes this exchange.)
#[tokio::test]
async fn an_engine_that_dies_before_answering_is_a_502_in_openais_shape_saying_so() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut seen = Vec::new();
        let mut buffer = [0u8; 4096];
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buffer).await.unwrap();
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buffer[..n]);
        }
        // Dies with the request read and nothing answered.
        drop(stream);
    });
    let seen = Arc::new(Mutex::new(Seen::default()));
    let upstream = Arc::new(ByModel {
        url,
        seen: Arc::clone(&seen),
    });
    let (host, address, token) = serve(upstream).await;
    let body = "{\"model\":\"smol-a\",\"messages\":[]}";
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, answer) = exchange(address, request.as_bytes()).await;
    assert_eq!(status, 502, "{answer}");
    let error: Value = serde_json::from_str(&answer).unwrap();
    let error = &error["error"];
    assert_eq!(error["type"], "server_error", "{error}");
    assert!(error.get("param").is_some_and(Value::is_null), "{error}");
    assert_eq!(error["code"], "LOCAL_AI_SERVER_FAILED", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("stopped before its answer was complete"),
        "{error}"
    );
    host.close().await.unwrap();
}
