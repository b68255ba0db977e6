//! A host in another process, behind the same stdio loop: what `arcane core --stdio`
//! becomes when its workspace's host already runs. N application processes then
//! share one host and one set of engines, each through its own bridge.
//!
//! # How it relays
//!
//! [`RemoteHost`] is a [`Dispatch`] over the running host's authenticated HTTP
//! transport, as one named client (`X-Arcane-Client: bridge-…`):
//!
//! * it opens that client's event stream (`GET /v1/events`) first, so it receives
//!   what an HTTP client would: the replay, every broadcast event, and its own
//!   requests' events;
//! * a request goes to `POST /v1/rpc`. The host also sends a copy of each named
//!   client's response down its event stream, after that request's events; the bridge
//!   answers with that copy, so a stream's chunks still precede its response, as the
//!   [`Dispatch`] contract asks. The `POST`'s own answer is used only when no copy can
//!   come (a refused frame, the host gone);
//! * controls go to `POST /v1/control`.
//!
//! End of input ends only this bridge: its requests are cancelled, the host and the
//! other bridges go on. When the host ends (its stream closes), [`Dispatch::closed`]
//! resolves and the loop stops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hyper::{Method, Request};
use serde_json::{json, Value};
use tokio::sync::{oneshot, watch};

use crate::dispatch::{Client, Deliver, Dispatch, FrameSink, Session};
use crate::endpoint::EndpointRecord;
use crate::error::{Error, Peer};
use crate::protocol::{Control, Request as RpcRequest, Response, PROTOCOL};
use crate::service::BoxFuture;
use crate::upstream::{collect, engine_client, full, Deadlines, EngineClient};

/// How long one relayed request may take: a model load or a long generation (the
/// host's own deadlines apply inside).
const RELAYED: Deadlines = Deadlines {
    head: Duration::from_secs(3600),
    idle: Duration::from_secs(600),
};

/// The event stream is quiet while nothing happens: only connecting is bounded.
const STREAM: Deadlines = Deadlines {
    head: Duration::from_secs(10),
    idle: Duration::from_secs(365 * 86_400),
};

/// What the event reader and the sessions share.
#[derive(Default)]
struct Shared {
    /// Requests waiting for their response's copy, by id.
    pending: HashMap<String, oneshot::Sender<Value>>,
    /// Where frames go once the loop subscribed; before that they wait in `early`.
    sink: Option<FrameSink>,
    early: Vec<std::sync::Arc<str>>,
}

/// The running host of a workspace, reached over its HTTP transport (see the module
/// documentation).
pub struct RemoteHost {
    record: EndpointRecord,
    client: EngineClient,
    name: String,
    shared: Arc<Mutex<Shared>>,
    closed: watch::Receiver<bool>,
    reader: tokio::task::JoinHandle<()>,
    /// Requests submitted and not yet answered: end of input waits for them.
    in_flight: watch::Sender<usize>,
}

/// How long end of input waits for the bridge's cancelled requests to be answered.
const DRAIN: Duration = Duration::from_secs(30);

/// Counts one request in flight until dropped (answered, or its future dropped).
struct InFlight(watch::Sender<usize>);

impl InFlight {
    fn new(count: &watch::Sender<usize>) -> Self {
        count.send_modify(|n| *n += 1);
        Self(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl RemoteHost {
    /// Connects to the host of `record` as the named client `name`: returns once its
    /// event stream is open (every later event reaches this bridge).
    pub async fn connect(record: EndpointRecord, name: String) -> Result<Self, Error> {
        let client = engine_client();
        let path = format!("/v1/events?client={name}");
        let request = authorized(&record, &name, Method::GET, &path, None)?;
        let url = format!("{}{path}", record.url);
        let response = client.send(request, STREAM, Peer::Host).await?;
        if response.status() != 200 {
            let status = response.status().as_u16();
            return Err(remote_error(&collect_json(response, &url).await, status));
        }
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (closed_sender, closed) = watch::channel(false);
        let reader = tokio::spawn(read_events(
            response,
            url,
            Arc::clone(&shared),
            closed_sender,
        ));
        Ok(Self {
            record,
            client,
            name,
            shared,
            closed,
            reader,
            in_flight: watch::channel(0).0,
        })
    }

    /// The host's endpoint record.
    pub fn endpoint(&self) -> &EndpointRecord {
        &self.record
    }

    /// Whether the host ended this bridge's stream (it closed, or died).
    pub fn host_ended(&self) -> bool {
        *self.closed.borrow()
    }

    async fn post(
        &self,
        path: &str,
        frame: Value,
        deadlines: Deadlines,
    ) -> Result<(u16, Value), Error> {
        let request = authorized(&self.record, &self.name, Method::POST, path, Some(frame))?;
        let url = format!("{}{path}", self.record.url);
        let response = self.client.send(request, deadlines, Peer::Host).await?;
        let status = response.status().as_u16();
        Ok((status, collect_json(response, &url).await))
    }
}

impl Drop for RemoteHost {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// A request to the host with the token and the bridge's client name.
fn authorized(
    record: &EndpointRecord,
    name: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Result<Request<crate::upstream::HttpBody>, Error> {
    let url = format!("{}{path}", record.url);
    let mut request = Request::builder()
        .method(method)
        .uri(&url)
        .header(
            hyper::header::AUTHORIZATION,
            format!("Bearer {}", record.token),
        )
        .header("x-arcane-client", name);
    if body.is_some() {
        request = request.header(hyper::header::CONTENT_TYPE, "application/json");
    }
    let body = body.map_or_else(|| full(Bytes::new()), |b| full(b.to_string()));
    request.body(body).map_err(|e| Error::Http {
        url,
        source: Box::new(e),
    })
}

async fn collect_json(response: hyper::Response<crate::upstream::HttpBody>, url: &str) -> Value {
    let bytes = collect(response, url, Peer::Host).await.unwrap_or_default();
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

fn remote_error(body: &Value, status: u16) -> Error {
    crate::client::remote(&body["error"], status)
}

/// The event reader: each SSE frame goes to the loop, except a response copy a
/// request waits for, which goes to that request. Ends (and says so) when the stream
/// does.
async fn read_events(
    response: hyper::Response<crate::upstream::HttpBody>,
    url: String,
    shared: Arc<Mutex<Shared>>,
    closed: watch::Sender<bool>,
) {
    let _ = crate::upstream::stream_lines(response, &url, Peer::Host, |line| {
        let Some(frame) = line.strip_prefix("data:").map(str::trim) else {
            return true;
        };
        route_frame(&shared, frame);
        true
    })
    .await;
    if let Ok(mut shared) = shared.lock() {
        // Waiting requests fall back to their POST's answer.
        shared.pending.clear();
    }
    closed.send_replace(true);
}

fn route_frame(shared: &Mutex<Shared>, frame: &str) {
    let Ok(mut shared) = shared.lock() else {
        return;
    };
    let value: Value = serde_json::from_str(frame).unwrap_or(Value::Null);
    if value["type"] == "response" {
        let waiter = value["id"]
            .as_str()
            .and_then(|id| shared.pending.remove(id));
        if let Some(waiter) = waiter {
            let _ = waiter.send(value);
        }
        // A copy nobody waits for (its POST already failed) is not sent twice.
        return;
    }
    let text: std::sync::Arc<str> = std::sync::Arc::from(frame);
    match &shared.sink {
        Some(sink) => {
            sink.send(text);
        }
        None => shared.early.push(text),
    }
}

/// A response frame as a [`Response`].
fn response_of(frame: &Value, id: &str) -> Response {
    let outcome = match frame["ok"].as_bool() {
        Some(true) => Ok(frame["result"].clone()),
        _ => Err(frame["error"].clone()),
    };
    Response {
        id: Some(id.to_string()),
        outcome,
        time: frame["time"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(arcane_report::time::now_rfc3339),
    }
}

/// The one session of a bridge.
struct RemoteSession(Arc<RemoteHost>);

impl Dispatch for Arc<RemoteHost> {
    fn open(&self, _client: Client<'_>) -> Arc<dyn Session> {
        Arc::new(RemoteSession(Arc::clone(self)))
    }

    fn accepting(&self) -> bool {
        !self.host_ended()
    }

    fn closed(&self) -> BoxFuture<'_, ()> {
        let mut closed = self.closed.clone();
        Box::pin(async move {
            let _ = closed.wait_for(|ended| *ended).await;
        })
    }

    fn close(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            // Only this bridge ends: what it still runs on the host is cancelled.
            if !self.host_ended() {
                let frame = json!({"protocol": PROTOCOL, "type": "control", "control": "requests.cancelAll"});
                let _ = self.post("/v1/control", frame, Deadlines::QUICK).await;
            }
            // Like a host's drain: what was submitted is answered first (its response
            // copy still comes down the stream), bounded.
            let mut in_flight = self.in_flight.subscribe();
            let mut ended = self.closed.clone();
            let _ = tokio::time::timeout(DRAIN, async {
                tokio::select! {
                    _ = in_flight.wait_for(|n| *n == 0) => {}
                    _ = ended.wait_for(|ended| *ended) => {}
                }
            })
            .await;
            if let Ok(mut shared) = self.shared.lock() {
                // Whoever still waits falls back to its POST's answer.
                shared.pending.clear();
                shared.sink = None;
            }
            self.reader.abort();
            Ok(())
        })
    }
}

impl Session for RemoteSession {
    fn subscribe(&self, sink: FrameSink) {
        let Ok(mut shared) = self.0.shared.lock() else {
            return;
        };
        for frame in shared.early.drain(..) {
            sink.send(frame);
        }
        shared.sink = Some(sink);
    }

    fn submit(self: Arc<Self>, request: RpcRequest, deliver: Deliver) -> BoxFuture<'static, ()> {
        let (sender, copy) = oneshot::channel();
        if let Ok(mut shared) = self.0.shared.lock() {
            shared.pending.insert(request.id.clone(), sender);
        }
        let counted = InFlight::new(&self.0.in_flight);
        Box::pin(async move {
            let _counted = counted;
            let id = request.id.clone();
            let posted = self.0.post("/v1/rpc", request.to_frame(), RELAYED).await;
            let response = match posted {
                // Delivered: its copy comes after its events (or, if the stream ended
                // first, this answer stands).
                Ok((200, body)) => match copy.await {
                    Ok(frame) => response_of(&frame, &id),
                    Err(_) => response_of(&body, &id),
                },
                Ok((status, body)) => {
                    self.0.forget(&id);
                    match body["type"] == "response" {
                        true => response_of(&body, &id),
                        false => Response::error(Some(id.clone()), &remote_error(&body, status)),
                    }
                }
                Err(error) => {
                    self.0.forget(&id);
                    Response::error(Some(id.clone()), &error)
                }
            };
            deliver(response);
        })
    }

    fn control(self: Arc<Self>, control: Control) -> BoxFuture<'static, Value> {
        Box::pin(async move {
            let frame = match control {
                Control::Cancel { request_id } => {
                    json!({"protocol": PROTOCOL, "type": "control", "control": "request.cancel", "requestId": request_id})
                }
                Control::CancelAll => {
                    json!({"protocol": PROTOCOL, "type": "control", "control": "requests.cancelAll"})
                }
                Control::Replay => {
                    json!({"protocol": PROTOCOL, "type": "control", "control": "runtime.replay"})
                }
            };
            match self.0.post("/v1/control", frame, Deadlines::QUICK).await {
                Ok((_, body)) => body["result"].clone(),
                Err(error) => json!({"error": arcane_report::error_json(&error)}),
            }
        })
    }

    fn deliver(&self, _frame: &Value) {}
}

impl RemoteHost {
    fn forget(&self, id: &str) {
        if let Ok(mut shared) = self.shared.lock() {
            shared.pending.remove(id);
        }
    }
}
