//! The stdio transport over in-memory pipes (the binary's real-pipe tests live in the
//! CLI's `core` tests).

use std::time::Duration;

use arcane_core::framing::encode;
use arcane_core::stdio::{serve, StdioOptions};
use arcane_core::{AppInfo, Host};
use arcane_report::Diagnostic;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::TestService;

fn frame(value: Value) -> Vec<u8> {
    encode(value.to_string().as_bytes())
}

/// Feeds `input` in pieces of `piece` bytes, keeps stdin open until `answers`
/// responses were written (end of input cancels request-lifetime work, as in the SDK),
/// then closes it; returns the output frames and the transport's outcome.
async fn run(
    input: Vec<u8>,
    piece: usize,
    answers: usize,
) -> (
    Vec<Value>,
    Result<(), arcane_core::Error>,
    std::sync::Arc<TestService>,
) {
    let service = TestService::new("t", "test");
    let host = Host::builder(AppInfo::default())
        .service(service.clone())
        .unwrap()
        .build();
    host.start();
    host.service_settled("t").await;
    let (mut client_in, host_in) = tokio::io::duplex(1024);
    let (host_out, mut client_out) = tokio::io::duplex(1 << 20);
    let serving = {
        let host = host.clone();
        tokio::spawn(async move { serve(&host, host_in, host_out, StdioOptions::default()).await })
    };
    let (answered, wait_answered) = tokio::sync::oneshot::channel::<()>();
    let writer = tokio::spawn(async move {
        for chunk in input.chunks(piece.max(1)) {
            if client_in.write_all(chunk).await.is_err() {
                break;
            }
        }
        let _ = wait_answered.await;
        let _ = client_in.shutdown().await;
    });
    let mut answered = Some(answered);
    if answers == 0 {
        let _ = answered.take().map(|a| a.send(()));
    }
    let mut decoder = arcane_core::framing::Decoder::new(1 << 20);
    let mut frames = Vec::new();
    let mut buffer = vec![0u8; 65536];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(30), client_out.read(&mut buffer))
            .await
            .unwrap()
            .unwrap();
        if n == 0 {
            break;
        }
        decoder.push(&buffer[..n]);
        while let Some(frame) = decoder.next_frame().unwrap() {
            frames.push(frame);
        }
        if frames.iter().filter(|f| f["type"] == "response").count() >= answers {
            let _ = answered.take().map(|a| a.send(()));
        }
    }
    decoder.finish().unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(30), serving)
        .await
        .unwrap()
        .unwrap();
    writer.await.unwrap();
    (frames, outcome, service)
}

fn responses(frames: &[Value]) -> Vec<&Value> {
    frames.iter().filter(|f| f["type"] == "response").collect()
}

#[tokio::test]
async fn split_and_concatenated_frames_are_answered_then_eof_closes_the_host() {
    let mut input = frame(
        json!({"protocol": "arcane/1", "type": "request", "id": "a", "method": "system.ping"}),
    );
    input.extend(frame(json!({"protocol": "arcane/1", "type": "request", "id": "b", "method": "test.echo", "parameters": {"n": 2}})));
    for piece in [1, 7, input.len()] {
        let (frames, outcome, service) = run(input.clone(), piece, 2).await;
        outcome.unwrap();
        assert_eq!(frames[0]["event"], "core.ready", "the replay comes first");
        let answered = responses(&frames);
        assert_eq!(answered.len(), 2, "piece {piece}");
        assert!(answered.iter().all(|f| f["ok"] == true), "{answered:?}");
        let b = answered.iter().find(|f| f["id"] == "b").unwrap();
        assert_eq!(b["result"], json!({"n": 2}));
        assert_eq!(
            frames.last().unwrap()["data"]["state"],
            "closed",
            "EOF drains and publishes closed last"
        );
        assert_eq!(
            service.disposed.load(std::sync::atomic::Ordering::SeqCst),
            1
        );
    }
}

#[tokio::test]
async fn a_stream_s_chunks_precede_its_response() {
    let input = frame(
        json!({"protocol": "arcane/1", "type": "request", "id": "s", "method": "test.save", "parameters": {"ms": 1}}),
    );
    let mut input2 = frame(
        json!({"protocol": "arcane/1", "type": "request", "id": "x", "method": "test.stream", "parameters": {"count": 3}}),
    );
    input2.extend(input);
    let (frames, outcome, _) = run(input2, 1000, 2).await;
    outcome.unwrap();
    let position = |pred: &dyn Fn(&Value) -> bool| frames.iter().position(pred).unwrap();
    let last_chunk = frames
        .iter()
        .rposition(|f| f["event"] == "test.chunk")
        .unwrap();
    assert!(last_chunk < position(&|f| f["type"] == "response" && f["id"] == "x"));
    assert_eq!(
        frames
            .iter()
            .filter(|f| f["event"] == "test.chunk" && f["requestId"] == "x")
            .count(),
        3
    );
}

#[tokio::test]
async fn decode_errors_close_the_transport_with_a_reason() {
    let ping = frame(
        json!({"protocol": "arcane/1", "type": "request", "id": "a", "method": "system.ping"}),
    );
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"X: 1\r\n\r\n{}".to_vec(), "IPC_LENGTH_MISSING"),
        (
            b"Content-Length: abc\r\n\r\n{}".to_vec(),
            "IPC_LENGTH_INVALID",
        ),
        (
            b"Content-Length: 50\r\n\r\n{\"a\":".to_vec(),
            "IPC_FRAME_INCOMPLETE",
        ),
        (
            b"Content-Length: 2\r\n\r\n\xc3\x28".to_vec(),
            "IPC_INVALID_UTF8",
        ),
        (b"Content-Length: 3\r\n\r\n{x}".to_vec(), "IPC_INVALID_JSON"),
        (
            format!("Content-Length: {}\r\n\r\n", 9 * 1024 * 1024).into_bytes(),
            "IPC_FRAME_TOO_LARGE",
        ),
    ];
    for (bad, reason) in cases {
        let mut input = ping.clone();
        input.extend(bad);
        if reason != "IPC_FRAME_INCOMPLETE" {
            // Frames after the bad one are never read.
            input.extend(frame(json!({"protocol": "arcane/1", "type": "request", "id": "late", "method": "test.echo"})));
        }
        let (frames, outcome, service) = run(input, 4096, 0).await;
        let error = outcome.unwrap_err();
        assert_eq!(error.code(), "RPC_FRAME_INVALID", "{reason}");
        assert_eq!(error.details()["reason"], reason);
        let reported = frames
            .iter()
            .find(|f| f["event"] == "core.error")
            .expect("core.error frame");
        assert_eq!(reported["data"]["error"]["details"]["reason"], reason);
        assert!(frames
            .iter()
            .any(|f| f["type"] == "response" && f["id"] == "a"));
        {
            assert!(
                !frames.iter().any(|f| f["id"] == "late"),
                "{reason}: nothing after a bad frame runs"
            );
        }
        assert_eq!(service.calls(), 0, "{reason}");
        assert_eq!(
            frames.last().unwrap()["data"]["state"],
            "closed",
            "{reason}: the host still drains"
        );
    }
}

#[tokio::test]
async fn an_invalid_request_is_answered_without_closing() {
    let mut input = frame(json!({"protocol": "arcane/1", "type": "request", "id": "a"}));
    input.extend(frame(
        json!({"protocol": "arcane/1", "type": "request", "id": "b", "method": "test.echo"}),
    ));
    let (frames, outcome, _) = run(input, 4096, 2).await;
    outcome.unwrap();
    let answered = responses(&frames);
    assert_eq!(answered[0]["id"], "a");
    assert_eq!(answered[0]["error"]["code"], "RPC_FRAME_INVALID");
    assert_eq!(answered[1]["ok"], true);
}

/// A second [`Dispatch`](arcane_core::dispatch::Dispatch) behind the same stdio loop,
/// standing in for a host in another process: it records what the loop asks of it,
/// emits one event per request before answering, and answers `first` only after
/// `second` was answered (a loop that ran requests one by one would never end).
mod relay {
    use std::sync::{Arc, Mutex};

    use arcane_core::dispatch::{Client, Deliver, Dispatch, FrameSink, Session};
    use arcane_core::protocol::{Control, EventFrame, Request, Response};
    use arcane_core::BoxFuture;
    use serde_json::{json, Value};
    use tokio::sync::{watch, Notify};

    #[derive(Default)]
    pub struct State {
        pub log: Mutex<Vec<String>>,
        sink: Mutex<Option<FrameSink>>,
        second_answered: Notify,
        in_flight: watch::Sender<usize>,
    }

    impl State {
        fn record(&self, line: String) {
            self.log.lock().unwrap().push(line);
        }
    }

    pub struct Relay {
        pub state: Arc<State>,
        closed: watch::Sender<bool>,
    }

    impl Relay {
        pub fn new() -> Self {
            Self {
                state: Arc::default(),
                closed: watch::channel(false).0,
            }
        }
    }

    struct RelaySession(Arc<State>);

    impl Dispatch for Relay {
        fn open(&self, client: Client<'_>) -> Arc<dyn Session> {
            self.state.record(format!("open {client:?}"));
            Arc::new(RelaySession(Arc::clone(&self.state)))
        }

        fn accepting(&self) -> bool {
            true
        }

        fn closed(&self) -> BoxFuture<'_, ()> {
            let mut closed = self.closed.subscribe();
            Box::pin(async move {
                let _ = closed.wait_for(|c| *c).await;
            })
        }

        fn close(&self) -> BoxFuture<'_, Result<(), arcane_core::Error>> {
            self.state.record("close".into());
            Box::pin(async move {
                // Like a host's drain: what was admitted is answered first; then the
                // subscriptions end (and with them the loop's writer).
                let mut in_flight = self.state.in_flight.subscribe();
                let _ = in_flight.wait_for(|n| *n == 0).await;
                self.state.sink.lock().unwrap().take();
                self.closed.send_replace(true);
                Ok(())
            })
        }
    }

    impl Session for RelaySession {
        fn subscribe(&self, sink: FrameSink) {
            self.0.record("subscribe".into());
            *self.0.sink.lock().unwrap() = Some(sink);
        }

        fn submit(self: Arc<Self>, request: Request, deliver: Deliver) -> BoxFuture<'static, ()> {
            self.0.record(format!("submit {}", request.id));
            self.0.in_flight.send_modify(|n| *n += 1);
            Box::pin(async move {
                if request.id == "first" {
                    self.0.second_answered.notified().await;
                }
                let event = EventFrame {
                    event: "relay.chunk".into(),
                    data: json!({}),
                    request_id: Some(request.id.clone()),
                    time: String::new(),
                };
                if let Some(sink) = self.0.sink.lock().unwrap().as_ref() {
                    sink.send(Arc::from(event.to_frame().to_string()));
                }
                let second = request.id == "second";
                deliver(Response::ok(request.id, json!({"relayed": request.method})));
                if second {
                    self.0.second_answered.notify_one();
                }
                self.0.in_flight.send_modify(|n| *n -= 1);
            })
        }

        fn control(self: Arc<Self>, control: Control) -> BoxFuture<'static, Value> {
            self.0.record(format!("control {control:?}"));
            Box::pin(std::future::ready(json!({})))
        }

        fn deliver(&self, _frame: &Value) {}
    }
}

#[tokio::test]
async fn the_stdio_loop_serves_any_dispatch_with_its_ordering() {
    let relay = std::sync::Arc::new(relay::Relay::new());
    let state = std::sync::Arc::clone(&relay.state);
    let mut input = frame(
        json!({"protocol": "arcane/1", "type": "request", "id": "first", "method": "remote.a"}),
    );
    input.extend(frame(json!({"protocol": "arcane/1", "type": "control", "control": "request.cancel", "requestId": "first"})));
    input.extend(frame(
        json!({"protocol": "arcane/1", "type": "request", "id": "second", "method": "remote.b"}),
    ));
    let (mut client_in, host_in) = tokio::io::duplex(1024);
    let (host_out, mut client_out) = tokio::io::duplex(1 << 20);
    let serving = {
        let relay = std::sync::Arc::clone(&relay);
        tokio::spawn(
            async move { serve(&*relay, host_in, host_out, StdioOptions::default()).await },
        )
    };
    client_in.write_all(&input).await.unwrap();
    client_in.shutdown().await.unwrap();
    let mut output = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), client_out.read_to_end(&mut output))
        .await
        .unwrap()
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let mut decoder = arcane_core::framing::Decoder::new(1 << 20);
    decoder.push(&output);
    let mut frames = Vec::new();
    while let Some(frame) = decoder.next_frame().unwrap() {
        frames.push(frame);
    }
    let position = |kind: &str, id: &str| {
        frames
            .iter()
            .position(|f| f["type"] == kind && (f["id"] == id || f["requestId"] == id))
            .unwrap_or_else(|| panic!("no {kind} for {id} in {frames:?}"))
    };
    // Each request's event precedes its response; the two ran concurrently.
    for id in ["first", "second"] {
        assert!(
            position("event", id) < position("response", id),
            "{frames:?}"
        );
    }
    assert!(position("response", "second") < position("response", "first"));
    assert_eq!(
        frames[position("response", "first")]["result"],
        json!({"relayed": "remote.a"})
    );
    // Admitted in the order read, the control in between; end of input closes once.
    assert_eq!(
        *state.log.lock().unwrap(),
        [
            "open Private(\"stdio\")",
            "subscribe",
            "submit first",
            "control Cancel { request_id: \"first\" }",
            "submit second",
            "close",
        ]
    );
}
