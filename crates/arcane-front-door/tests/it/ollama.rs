//! The `ollama.*` passthroughs against a small fake of Ollama's documented `/api/*`
//! (Ollama cannot be installed here): requests are forwarded with their bodies,
//! streamed answers become `ollama.chunk` events tied to the request.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arcane_core::localai::{AdoptLauncher, LocalAiService};
use arcane_core::{AppInfo, Host};
use arcane_localai::Engine;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::support::{drain, request, until};

/// Serves `/api/version`, `/api/tags`, `/api/show` and a streaming `/api/chat`;
/// records every request's path and body.
async fn fake_ollama() -> (String, Arc<Mutex<Vec<(String, Value)>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                reader.read_line(&mut line).await.unwrap();
                let path = line.split(' ').nth(1).unwrap_or("/").to_string();
                let mut length = 0;
                loop {
                    line.clear();
                    reader.read_line(&mut line).await.unwrap();
                    if line == "\r\n" {
                        break;
                    }
                    if let Some(n) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = n.trim().parse().unwrap();
                    }
                }
                let mut body = vec![0u8; length];
                reader.read_exact(&mut body).await.unwrap();
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                log.lock().unwrap().push((path.clone(), body.clone()));
                let reply = match path.as_str() {
                    "/api/version" => json!({"version": "0.9.0"}).to_string(),
                    "/api/tags" => json!({"models": [{"name": "smollm2:135m"}]}).to_string(),
                    "/api/show" => {
                        json!({"details": {"family": "llama"}, "asked": body["model"]}).to_string()
                    }
                    "/api/chat" if body["stream"] == true => ["Hel", "lo", "!"]
                        .iter()
                        .enumerate()
                        .map(|(i, t)| {
                            json!({"message": {"role": "assistant", "content": t}, "done": i == 2})
                                .to_string()
                                + "\n"
                        })
                        .collect(),
                    "/api/chat" => {
                        json!({"message": {"role": "assistant", "content": "Hello!"}, "done": true})
                            .to_string()
                    }
                    _ => String::new(),
                };
                let head = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", reply.len());
                let stream = reader.get_mut();
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(reply.as_bytes()).await;
            });
        }
    });
    (url, seen)
}

#[tokio::test]
async fn ollama_methods_pass_through_and_stream_chunks() {
    let (url, seen) = fake_ollama().await;
    let service = LocalAiService::new(vec![AdoptLauncher::new(
        Engine::Ollama,
        &url,
        Duration::from_secs(30),
    )]);
    let host = Host::builder(AppInfo::default())
        .service(service.clone())
        .unwrap()
        .build();
    host.start();
    let connection = host.connect("o");
    let mut events = connection.subscribe();
    until(&mut events, |f| {
        f["event"] == "localai.state" && f["data"]["runtimes"][0]["state"] == "ready"
    })
    .await;
    // An Ollama-only host's OpenAI target (what `/health` reports) is its ready
    // Ollama, not a missing llama.cpp.
    use arcane_front_door::http::{Upstream, UpstreamTarget};
    assert!(
        matches!(service.openai_target(), UpstreamTarget::Ready { .. }),
        "{:?}",
        service.openai_target()
    );

    let version = connection
        .dispatch(request("v", "ollama.version", json!({})))
        .await;
    assert_eq!(version.outcome, Ok(json!({"version": "0.9.0"})));
    let models = connection
        .dispatch(request("m", "ollama.models", json!({})))
        .await
        .outcome
        .unwrap();
    assert_eq!(models["models"][0]["name"], "smollm2:135m");
    let show = connection
        .dispatch(request(
            "s",
            "ollama.show",
            json!({"model": "smollm2:135m"}),
        ))
        .await
        .outcome
        .unwrap();
    assert_eq!(show["asked"], "smollm2:135m");

    drain(&mut events);
    let chat = connection
        .dispatch(request("c", "ollama.chat", json!({"model": "smollm2:135m", "messages": [{"role": "user", "content": "hi"}], "stream": true, "streamId": "st"})))
        .await
        .outcome
        .unwrap();
    assert_eq!(chat["message"]["content"], "Hello!");
    let chunks: Vec<_> = drain(&mut events)
        .into_iter()
        .filter(|f| f["event"] == "ollama.chunk")
        .collect();
    assert_eq!(chunks.len(), 3);
    assert!(chunks
        .iter()
        .all(|f| f["requestId"] == "c" && f["data"]["streamId"] == "st"));
    // The forwarded body is the caller's, without Arcane's own fields.
    let log = seen.lock().unwrap().clone();
    let (_, body) = log
        .iter()
        .find(|(p, b)| p == "/api/chat" && b["stream"] == true)
        .unwrap();
    assert_eq!(body["model"], "smollm2:135m");
    assert!(body.get("streamId").is_none());
    // llama.* is not selected here: a clear error, not a hang.
    let error = connection
        .dispatch(request("l", "llama.status", json!({})))
        .await
        .outcome
        .unwrap_err();
    assert_eq!(error["code"], "LOCAL_AI_SERVER_NOT_READY");
    host.close().await.unwrap();
}

/// `localai.services.recover` on an adopted engine: the host stops it (an adopted
/// handle reports no stop of its own) and starts it anew through its state table, so
/// the engine goes `starting` then `ready` again and no change is refused.
#[tokio::test]
async fn recover_restarts_an_adopted_engine_through_the_state_table() {
    let (url, seen) = fake_ollama().await;
    let service = LocalAiService::new(vec![AdoptLauncher::new(
        Engine::Ollama,
        &url,
        Duration::from_secs(30),
    )]);
    let host = Host::builder(AppInfo::default())
        .service(service.clone())
        .unwrap()
        .build();
    host.start();
    let connection = host.connect("r");
    let mut events = connection.subscribe();
    let state = |f: &Value| f["data"]["runtimes"][0]["state"].clone();
    until(&mut events, |f| {
        f["event"] == "localai.state" && state(f) == "ready"
    })
    .await;
    let probes_before = seen.lock().unwrap().len();
    let recovered = connection
        .dispatch(request("r", "localai.services.recover", json!({})))
        .await
        .outcome
        .unwrap();
    assert_eq!(recovered, json!({"runtimes": ["ollama"]}));
    // In this order, each seen (`until` fails after its deadline otherwise).
    let mut frames = Vec::new();
    for wanted in ["stopped", "starting", "ready"] {
        frames.extend(
            until(&mut events, |f| {
                f["event"] == "localai.state" && state(f) == wanted
            })
            .await,
        );
    }
    assert!(
        !frames
            .iter()
            .any(|f| f["event"] == "local-ai.transition.refused"),
        "{frames:?}"
    );
    assert!(
        seen.lock().unwrap().len() > probes_before,
        "the new start probed the engine again"
    );
    host.close().await.unwrap();
}
