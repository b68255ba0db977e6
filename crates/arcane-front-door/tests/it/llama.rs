//! The local-AI service and the OpenAI passthrough with the real `llama-server` and
//! SmolLM2 (`LLAMA_SERVER`, `ARCANE_TEST_MODEL`; these tests fail loudly when unset).

use std::sync::Arc;
use std::time::Duration;

use arcane_core::localai::{AdoptLauncher, LocalAiService};
use arcane_core::protocol::Control;
use arcane_core::{AppInfo, Host};
use arcane_front_door::http::HttpOptions;
use arcane_localai::Engine;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{dechunk, raw_http, until, LlamaServer};

struct Stack {
    host: Host,
    address: std::net::SocketAddr,
    token: String,
    _llama: LlamaServer,
    llama_url: String,
}

async fn stack() -> Stack {
    let llama = LlamaServer::start().await;
    let llama_url = llama.url.clone();
    let service = LocalAiService::new(vec![AdoptLauncher::new(
        Engine::LlamaCpp,
        &llama.url,
        Duration::from_secs(60),
    )]);
    let host = Host::builder(AppInfo::default())
        .service(service.clone())
        .unwrap()
        .build();
    host.start();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let token = arcane_core::endpoint::new_token().unwrap();
    tokio::spawn(arcane_front_door::http::serve(
        host.clone(),
        listener,
        HttpOptions::new(token.clone()).upstream(service),
    ));
    // Wait until the engine is adopted (`localai.state` says ready).
    let connection = host.connect("wait");
    let mut events = connection.subscribe();
    until(&mut events, |f| {
        f["event"] == "localai.state" && f["data"]["runtimes"][0]["state"] == "ready"
    })
    .await;
    Stack {
        host,
        address,
        token,
        _llama: llama,
        llama_url,
    }
}

fn chat_body(stream: bool) -> String {
    json!({
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8, "temperature": 0, "seed": 1, "stream": stream
    })
    .to_string()
}

#[tokio::test]
async fn the_openai_passthrough_answers_like_llama_server_streamed_and_not() {
    let stack = stack().await;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\n",
        stack.address, stack.token
    );
    // Not streamed: the same completion as straight from llama-server.
    let (status, h, body) = raw_http(stack.address, &head, &chat_body(false)).await;
    assert_eq!(status, 200, "{body}");
    let through: Value = serde_json::from_str(&dechunk(&h, &body)).unwrap();
    let direct_address: std::net::SocketAddr = stack
        .llama_url
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let direct_head = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: {direct_address}\r\nContent-Type: application/json\r\n");
    let (_, dh, dbody) = raw_http(direct_address, &direct_head, &chat_body(false)).await;
    let direct: Value = serde_json::from_str(&dechunk(&dh, &dbody)).unwrap();
    let content = through["choices"][0]["message"]["content"]
        .as_str()
        .unwrap();
    assert!(!content.is_empty());
    assert_eq!(
        content,
        direct["choices"][0]["message"]["content"].as_str().unwrap(),
        "greedy decoding is deterministic"
    );
    // Streamed: SSE chunks pass through, ending in [DONE].
    let (status, h, body) = raw_http(stack.address, &head, &chat_body(true)).await;
    assert_eq!(status, 200);
    assert!(h.contains("content-type: text/event-stream"), "{h}");
    let text = dechunk(&h, &body);
    let chunks: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(chunks.len() > 1, "{text}");
    assert!(text.contains("data: [DONE]"));
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, content);
    // /v1/models too, and the token is required there as well.
    let head = format!(
        "GET /v1/models HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n",
        stack.address, stack.token
    );
    let (status, h, body) = raw_http(stack.address, &head, "").await;
    assert_eq!(status, 200, "{body}");
    let models: Value = serde_json::from_str(&dechunk(&h, &body)).unwrap();
    assert!(models["data"][0]["id"].is_string());
    stack.host.close().await.unwrap();
}

#[tokio::test]
async fn llama_chat_streams_chunks_to_its_requester_and_returns_the_completion() {
    let stack = stack().await;
    let connection = stack.host.connect("chat");
    let mut events = connection.subscribe();
    let response = connection
        .dispatch(crate::support::request(
            "c1",
            "llama.chat",
            json!({"messages": [{"role": "user", "content": "Say hello."}], "maxTokens": 8, "temperature": 0, "stream": true, "streamId": "s1"}),
        ))
        .await;
    let result = response.outcome.expect("chat succeeds");
    let frames = crate::support::drain(&mut events);
    let chunks: Vec<_> = frames
        .iter()
        .filter(|f| f["event"] == "llama.chunk")
        .collect();
    assert!(!chunks.is_empty());
    assert!(chunks
        .iter()
        .all(|f| f["requestId"] == "c1" && f["data"]["streamId"] == "s1"));
    let assembled: String = chunks
        .iter()
        .filter_map(|f| f["data"]["chunk"]["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(result["choices"][0]["message"]["content"], json!(assembled));
    assert!(!assembled.is_empty());
    // Status methods observe the adopted engine.
    let status = connection
        .dispatch(crate::support::request("s", "llama.status", json!({})))
        .await
        .outcome
        .unwrap();
    assert_eq!(
        (status["state"].as_str(), status["owned"].as_bool()),
        (Some("ready"), Some(false))
    );
    // Models, load and unload of an adopted (external) engine: it is never touched.
    let models = connection
        .dispatch(crate::support::request("m", "llama.models", json!({})))
        .await
        .outcome
        .unwrap();
    let id = models["models"][0]["id"]
        .as_str()
        .expect("a model id")
        .to_string();
    let loaded = connection
        .dispatch(crate::support::request(
            "l",
            "llama.load",
            json!({"model": id}),
        ))
        .await
        .outcome
        .unwrap();
    assert_eq!(loaded["loaded"], true);
    let unknown = connection
        .dispatch(crate::support::request(
            "u",
            "llama.load",
            json!({"model": "no-such-model"}),
        ))
        .await;
    assert_eq!(unknown.outcome.unwrap_err()["code"], "ARCANE_USAGE");
    for id in ["x1", "x2"] {
        let unloaded = connection
            .dispatch(crate::support::request(id, "llama.unload", json!({})))
            .await
            .outcome
            .unwrap();
        assert_eq!(unloaded, json!({"released": true, "unloaded": false}));
    }
    let still = connection
        .dispatch(crate::support::request("s2", "llama.status", json!({})))
        .await
        .outcome
        .unwrap();
    assert_eq!(still["state"], "ready");
    stack.host.close().await.unwrap();
}

#[tokio::test]
async fn cancelling_a_streaming_llama_chat_stops_it() {
    let stack = stack().await;
    let connection = Arc::new(stack.host.connect("cancel"));
    let mut events = connection.subscribe();
    let chat = {
        let connection = Arc::clone(&connection);
        tokio::spawn(async move {
            connection
                .dispatch(crate::support::request(
                    "long",
                    "llama.chat",
                    json!({"messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 4000, "stream": true}),
                ))
                .await
        })
    };
    until(&mut events, |f| f["event"] == "llama.chunk").await;
    assert_eq!(
        connection.control(Control::Cancel {
            request_id: "long".into()
        })["cancelled"],
        true
    );
    let response = tokio::time::timeout(Duration::from_secs(30), chat)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.outcome.unwrap_err()["code"], "ARCANE_CANCELLED");
    // The engine stops generating, nothing more arrives for the request, and the
    // engine takes the next request at once.
    assert!(
        slots_go_idle(&stack.llama_url).await,
        "llama-server kept generating after the cancellation"
    );
    crate::support::drain(&mut events);
    // Not synchronisation: a window in which a chat that went on streaming would
    // deliver another chunk (an absence has no event to wait for).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(crate::support::drain(&mut events)
        .iter()
        .all(|f| f["event"] != "llama.chunk"));
    let next = connection
        .dispatch(crate::support::request(
            "next",
            "llama.chat",
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
        ))
        .await;
    assert!(next.is_ok(), "{:?}", next.outcome);
    stack.host.close().await.unwrap();
}

#[tokio::test]
async fn a_client_disconnect_during_a_streamed_passthrough_reaches_the_engine() {
    let stack = stack().await;
    let mut stream = tokio::net::TcpStream::connect(stack.address).await.unwrap();
    let body = json!({"messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 8000, "stream": true}).to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        stack.address,
        stack.token,
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut first = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(60), stream.read(&mut first))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).contains("200"));
    drop(stream);
    // The engine stops generating: its only slot goes idle long before an 8000-token
    // generation could finish on its own.
    assert!(
        slots_go_idle(&stack.llama_url).await,
        "llama-server kept generating after the client went away"
    );
    stack.host.close().await.unwrap();
}

/// Polls llama-server's `/slots` at `llama_url` (every 100 ms, at most 10 s) until no
/// slot is processing; whether that happened in time.
async fn slots_go_idle(llama_url: &str) -> bool {
    let direct: std::net::SocketAddr = llama_url.trim_start_matches("http://").parse().unwrap();
    let head = format!("GET /slots HTTP/1.1\r\nHost: {direct}\r\n");
    for _ in 0..100 {
        let (status, h, body) = raw_http(direct, &head, "").await;
        assert_eq!(status, 200, "{body}");
        let slots: Value = serde_json::from_str(&dechunk(&h, &body)).unwrap();
        if slots
            .as_array()
            .is_some_and(|s| s.iter().all(|slot| slot["is_processing"] == false))
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
