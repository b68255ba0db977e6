//! The drain counts passthrough responses as accepted work, and every engine or host
//! call has deadlines: a scripted engine on loopback, no real model needed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arcane_core::{AppInfo, Host, HostState, Peer};
use arcane_front_door::http::{
    collect, engine_client, full, Deadlines, HttpOptions, Upstream, UpstreamTarget,
};
use arcane_report::Diagnostic;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// Always forwards to `url`.
struct Fixed(String);

impl Upstream for Fixed {
    fn openai_target(&self) -> UpstreamTarget {
        UpstreamTarget::Ready {
            access: arcane_front_door::http::EngineAccess::tcp(&self.0).expect("a loopback url"),
        }
    }
}

/// A scripted engine: answers one request with an SSE head and a first event, then
/// sends `data: [DONE]` when `finish` fires, and reports when its peer closed the
/// connection.
struct Engine {
    url: String,
    finish: Option<oneshot::Sender<()>>,
    closed: oneshot::Receiver<()>,
}

async fn engine() -> Engine {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (finish, finished) = oneshot::channel::<()>();
    let (closed_tx, closed) = oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        read_head(&mut stream).await;
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
        stream.write_all(head.as_bytes()).await.unwrap();
        stream
            .write_all(&chunk("data: {\"n\":1}\n\n"))
            .await
            .unwrap();
        let (mut read, mut write) = stream.into_split();
        tokio::spawn(async move {
            if finished.await.is_ok() {
                let _ = write.write_all(&chunk("data: [DONE]\n\n")).await;
                let _ = write.write_all(b"0\r\n\r\n").await;
            }
            // Keep the write half (and so the connection) open until the peer closes.
            std::future::pending::<()>().await;
        });
        let mut buffer = [0u8; 1024];
        while matches!(read.read(&mut buffer).await, Ok(n) if n > 0) {}
        let _ = closed_tx.send(());
    });
    Engine {
        url,
        finish: Some(finish),
        closed,
    }
}

fn chunk(text: &str) -> Vec<u8> {
    format!("{:x}\r\n{text}\r\n", text.len()).into_bytes()
}

async fn read_head(stream: &mut TcpStream) {
    let mut seen = Vec::new();
    let mut buffer = [0u8; 1024];
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buffer).await.unwrap();
        assert!(n > 0, "the request ended early");
        seen.extend_from_slice(&buffer[..n]);
    }
}

/// A host with no services, the passthrough to `url`, and `drain` as its deadline.
async fn serve(url: &str, drain: Duration) -> (Host, SocketAddr, String) {
    let host = Host::builder(AppInfo::default())
        .drain_deadline(drain)
        .build();
    host.start();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let token = arcane_core::endpoint::new_token().unwrap();
    let options = HttpOptions::new(token.clone()).upstream(Arc::new(Fixed(url.into())));
    tokio::spawn(arcane_front_door::http::serve(
        host.clone(),
        listener,
        options,
    ));
    (host, address, token)
}

/// Sends a streamed completion and returns the connection once the first event came.
async fn start_stream(address: SocketAddr, token: &str) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let body = r#"{"messages":[],"stream":true}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut seen = String::new();
    let mut buffer = [0u8; 4096];
    while !seen.contains("\"n\":1") {
        let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut buffer))
            .await
            .expect("the first event in time")
            .unwrap();
        assert!(n > 0, "the stream ended early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buffer[..n]));
    }
    (stream, seen)
}

async fn rest(mut stream: TcpStream, mut seen: String) -> String {
    let mut tail = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut tail))
        .await
        .expect("the stream ends in time");
    seen.push_str(&String::from_utf8_lossy(&tail));
    seen
}

async fn wait_state(host: &Host, state: HostState) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while host.state() != state {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the host reaches the state in time");
}

#[tokio::test]
async fn a_shutdown_waits_for_a_streaming_passthrough_response_to_finish() {
    let mut engine = engine().await;
    let (host, address, token) = serve(&engine.url, Duration::from_secs(3600)).await;
    let (stream, seen) = start_stream(address, &token).await;

    let closing = tokio::spawn({
        let host = host.clone();
        async move { host.close().await }
    });
    wait_state(&host, HostState::Draining).await;
    // Accepted work: new passthrough requests are refused, this one is waited for.
    assert!(host.accept_work().is_none());
    // Not synchronisation: a window in which a drain that did not wait for the stream
    // would have moved on (nothing to wait for: the state must *not* change).
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        host.state(),
        HostState::Draining,
        "the drain must wait for the stream"
    );

    engine.finish.take().unwrap().send(()).unwrap();
    let reply = rest(stream, seen).await;
    assert!(reply.contains("data: [DONE]"), "{reply}");
    assert!(
        reply.ends_with("0\r\n\r\n"),
        "a complete chunked body: {reply:?}"
    );
    tokio::time::timeout(Duration::from_secs(30), closing)
        .await
        .expect("the host closes once the stream finished")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn past_the_drain_deadline_a_passthrough_response_is_cut_and_its_engine_connection_closed() {
    let engine = engine().await;
    let (host, address, token) = serve(&engine.url, Duration::from_millis(200)).await;
    let (stream, seen) = start_stream(address, &token).await;

    tokio::time::timeout(Duration::from_secs(30), host.close())
        .await
        .expect("the drain deadline bounds the wait")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), engine.closed)
        .await
        .expect("the cut closes the connection to the engine")
        .unwrap();
    let reply = rest(stream, seen).await;
    assert!(!reply.contains("[DONE]"), "{reply}");
    assert!(
        !reply.ends_with("0\r\n\r\n"),
        "a cut body must not look complete: {reply:?}"
    );
}

#[tokio::test]
async fn a_peer_that_does_not_answer_or_stalls_is_a_timeout_naming_the_url_and_deadline() {
    // Accepts and reads, never answers.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/health", silent.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let request = hyper::Request::get(&url).body(full("")).unwrap();
    let error = engine_client()
        .send(
            request,
            Deadlines::uniform(Duration::from_millis(300)),
            Peer::Host,
        )
        .await
        .expect_err("no answer is an error");
    assert_eq!(error.code(), "CORE_TIMEOUT");
    assert_eq!(error.details()["phase"], "head");
    assert_eq!(error.details()["peer"], "host");
    assert_eq!(
        error.to_string(),
        format!("`{url}` did not answer within 0.3 s")
    );
    assert!(!error.hints().is_empty());

    // Answers a head and one event, then stalls.
    let mut engine = engine().await;
    let url = format!("{}/v1/chat/completions", engine.url);
    let request = hyper::Request::post(&url).body(full("{}")).unwrap();
    let response = engine_client()
        .send(
            request,
            Deadlines::uniform(Duration::from_millis(300)),
            Peer::Engine,
        )
        .await
        .expect("the head comes");
    let error = collect(response, &url, Peer::Engine)
        .await
        .expect_err("a stalled body is an error");
    assert_eq!(error.code(), "CORE_TIMEOUT");
    assert_eq!(error.details()["phase"], "stall");
    assert_eq!(
        error.to_string(),
        format!("`{url}` did not send more of its answer within 0.3 s")
    );
    drop(engine.finish.take());
}
