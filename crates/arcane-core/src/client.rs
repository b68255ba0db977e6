//! A small client of a running Core host, for the CLI's `arcane status` and
//! `arcane chat` (and tests): reads `core.json`, authenticates with its token, calls
//! `arcane/1` methods and streams chat completions through the OpenAI passthrough.
//! Every exchange has [`Deadlines`] (default [`Deadlines::QUICK`] for calls and
//! [`Deadlines::GENERATION`] for chat; [`CoreClient::with_deadlines`] sets both), so a
//! host that does not answer is a `CORE_TIMEOUT` error naming the URL and deadline.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use hyper::{Method, Request};
use serde_json::{json, Value};

use crate::endpoint::{running_endpoint, EndpointRecord};
use crate::error::{Error, Peer};
use crate::localai::LocalAiStatus;
use crate::protocol::PROTOCOL;
use crate::upstream::{collect, engine_client, full, Deadlines, EngineClient, HttpBody};

/// A connection to a running Core host.
pub struct CoreClient {
    record: EndpointRecord,
    client: EngineClient,
    next_id: std::sync::atomic::AtomicU64,
    deadlines: Option<Deadlines>,
}

impl CoreClient {
    /// Connects to the host recorded in `workspace`'s `core.json` (its process must be
    /// alive); fails with `CORE_NOT_RUNNING` otherwise.
    pub fn from_workspace(workspace: &Path) -> Result<Self, Error> {
        Ok(Self::new(running_endpoint(workspace)?))
    }

    /// A client for `record`.
    pub fn new(record: EndpointRecord) -> Self {
        Self {
            record,
            client: engine_client(),
            next_id: std::sync::atomic::AtomicU64::new(1),
            deadlines: None,
        }
    }

    /// Uses `deadlines` for every exchange (calls and chat alike).
    pub fn with_deadlines(mut self, deadlines: Deadlines) -> Self {
        self.deadlines = Some(deadlines);
        self
    }

    /// The host's endpoint record.
    pub fn endpoint(&self) -> &EndpointRecord {
        &self.record
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        deadlines: Deadlines,
    ) -> Result<hyper::Response<HttpBody>, Error> {
        let (content_type, body) = match body {
            Some(body) => (Some("application/json"), Bytes::from(body.to_string())),
            None => (None, Bytes::new()),
        };
        self.send_bytes(method, path, content_type, body, deadlines)
            .await
    }

    async fn send_bytes(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: Bytes,
        deadlines: Deadlines,
    ) -> Result<hyper::Response<HttpBody>, Error> {
        let url = format!("{}{}", self.record.url, path);
        let mut request = Request::builder().method(method).uri(&url).header(
            hyper::header::AUTHORIZATION,
            format!("Bearer {}", self.record.token),
        );
        if let Some(content_type) = content_type {
            request = request.header(hyper::header::CONTENT_TYPE, content_type);
        }
        let request = request.body(full(body)).map_err(|e| Error::Http {
            url: url.clone(),
            source: Box::new(e),
        })?;
        self.client.send(request, deadlines, Peer::Host).await
    }

    async fn json(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), Error> {
        let url = format!("{}{}", self.record.url, path);
        let deadlines = self.deadlines.unwrap_or(Deadlines::QUICK);
        let response = self.send(method, path, body, deadlines).await?;
        let status = response.status().as_u16();
        let bytes = collect(response, &url, Peer::Host).await?;
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Ok((status, value))
    }

    /// `GET /v1/health`.
    pub async fn health(&self) -> Result<Value, Error> {
        let (status, value) = self.json(Method::GET, "/v1/health", None).await?;
        if status != 200 {
            return Err(remote(&value["error"], status));
        }
        Ok(value)
    }

    /// Calls `method` and returns its result (an `ok:false` answer becomes
    /// [`Error::Remote`] with the host's code).
    pub async fn call(&self, method: &str, parameters: Value) -> Result<Value, Error> {
        let id = format!(
            "cli-{}",
            self.next_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let frame = json!({"protocol": PROTOCOL, "type": "request", "id": id, "method": method, "parameters": parameters});
        let (status, value) = self.json(Method::POST, "/v1/rpc", Some(frame)).await?;
        if value["ok"].as_bool() == Some(true) {
            return Ok(value["result"].clone());
        }
        let error = if value["error"].is_object() {
            &value["error"]
        } else {
            &value
        };
        Err(remote(error, status))
    }

    /// Calls `localai.status` and parses its answer into the host's typed engine
    /// status, once (the one deserialising type, [`LocalAiStatus`]).
    pub async fn local_ai_status(&self) -> Result<LocalAiStatus, Error> {
        let value = self.call("localai.status", json!({})).await?;
        serde_json::from_value(value).map_err(|source| Error::Http {
            url: format!("{}/v1/rpc", self.endpoint().url.trim_end_matches('/')),
            source: Box::new(source),
        })
    }

    /// Sends a chat completion through the OpenAI passthrough with `stream: true`,
    /// calling `on_delta` with each piece of content as it arrives; returns the whole
    /// answer.
    pub async fn chat(
        &self,
        mut payload: Value,
        mut on_delta: impl FnMut(&str),
    ) -> Result<String, Error> {
        payload["stream"] = json!(true);
        let path = "/v1/chat/completions";
        let url = format!("{}{}", self.record.url, path);
        let deadlines = self.deadlines.unwrap_or(Deadlines::GENERATION);
        let response = self
            .send(Method::POST, path, Some(payload), deadlines)
            .await?;
        if response.status() != 200 {
            return Err(refused(response, &url).await);
        }
        let mut answer = String::new();
        crate::upstream::stream_lines(response, &url, Peer::Host, |line| {
            let Some(data) = line.strip_prefix("data:").map(str::trim) else {
                return true;
            };
            if data == "[DONE]" {
                return false;
            }
            if let Ok(chunk) = serde_json::from_str::<Value>(data) {
                if let Some(delta) = chunk["choices"][0]["delta"]["content"].as_str() {
                    answer.push_str(delta);
                    on_delta(delta);
                }
            }
            true
        })
        .await?;
        Ok(answer)
    }
}

/// One uploaded file and the text fields sent with it (`multipart/form-data`).
#[derive(Debug, Clone)]
pub struct Upload {
    /// The file's name as sent (`jfk.wav`).
    pub file_name: String,
    /// Its bytes.
    pub file: Bytes,
    /// The other fields, by name.
    pub fields: Vec<(String, String)>,
}

impl Upload {
    /// The body and its `Content-Type`, with a boundary found in no part.
    fn encode(&self) -> (String, Bytes) {
        let mut boundary = String::from("arcane-upload");
        let contains = |needle: &[u8]| {
            self.file.windows(needle.len()).any(|w| w == needle)
                || self
                    .fields
                    .iter()
                    .any(|(_, value)| value.as_bytes().windows(needle.len()).any(|w| w == needle))
        };
        while contains(boundary.as_bytes()) {
            boundary.push('x');
        }
        let mut body = Vec::with_capacity(self.file.len() + 1024);
        for (name, value) in &self.fields {
            body.extend_from_slice(
                format!(
                    "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
                )
                .as_bytes(),
            );
        }
        let file_name = self.file_name.replace(['"', '\r', '\n'], "_");
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{file_name}\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes(),
        );
        body.extend_from_slice(&self.file);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        (
            format!("multipart/form-data; boundary={boundary}"),
            Bytes::from(body),
        )
    }
}

impl CoreClient {
    /// `POST path` with an upload (`/v1/audio/transcriptions`): the answer's body, or
    /// the host's (or engine's) error.
    pub async fn upload(&self, path: &str, upload: &Upload) -> Result<Bytes, Error> {
        let (content_type, body) = upload.encode();
        self.post_bytes(path, &content_type, body).await
    }

    /// `POST path` with a JSON body whose answer is bytes (`/v1/audio/speech`).
    pub async fn post_for_bytes(&self, path: &str, payload: Value) -> Result<Bytes, Error> {
        let body = Bytes::from(payload.to_string());
        self.post_bytes(path, "application/json", body).await
    }

    /// `POST path` with a JSON body whose answer is server-sent events
    /// (`/v1/images/generations` with `stream: true`): calls `on_event(name, data)`
    /// with each event as it arrives (`name` is `message` for an unnamed one), until
    /// the stream ends or `on_event` returns `false`. An `error` event (`{"error":
    /// {code, message, details}}`, sent when the work fails after the answer began)
    /// ends the stream as [`Error::Remote`], as a refusal before it would.
    pub async fn post_for_events(
        &self,
        path: &str,
        payload: Value,
        mut on_event: impl FnMut(&str, &Value) -> bool,
    ) -> Result<(), Error> {
        let url = format!("{}{}", self.record.url, path);
        let deadlines = self.deadlines.unwrap_or(Deadlines::GENERATION);
        let body = Bytes::from(payload.to_string());
        let response = self
            .send_bytes(
                Method::POST,
                path,
                Some("application/json"),
                body,
                deadlines,
            )
            .await?;
        if response.status() != 200 {
            return Err(refused(response, &url).await);
        }
        let mut name = String::from("message");
        let mut failed = None;
        crate::upstream::stream_lines(response, &url, Peer::Host, |line| {
            if let Some(event) = line.strip_prefix("event:") {
                name = event.trim().to_string();
                return true;
            }
            let Some(data) = line.strip_prefix("data:").map(str::trim) else {
                return true;
            };
            let value = serde_json::from_str::<Value>(data).unwrap_or(Value::Null);
            let keep_going = if name == "error" {
                failed = Some(remote(&value["error"], 200));
                false
            } else {
                value.is_null() || on_event(&name, &value)
            };
            name = String::from("message");
            keep_going
        })
        .await?;
        failed.map_or(Ok(()), Err)
    }

    /// `POST path` with `body`: the whole answer of a 200, else the host's error.
    async fn post_bytes(
        &self,
        path: &str,
        content_type: &str,
        body: Bytes,
    ) -> Result<Bytes, Error> {
        let url = format!("{}{}", self.record.url, path);
        let deadlines = self.deadlines.unwrap_or(Deadlines::GENERATION);
        let response = self
            .send_bytes(Method::POST, path, Some(content_type), body, deadlines)
            .await?;
        if response.status() != 200 {
            return Err(refused(response, &url).await);
        }
        collect(response, &url, Peer::Host).await
    }

    /// `GET /v1/logs` with `query` (`model=…&since=…&follow=1`, already encoded):
    /// calls `on_line` with each log line (`{time, model, stream, line}`) as it
    /// arrives, until the host ends the stream (or, while following, the host closes).
    /// A followed stream gets a minute of silence at most: the host says it is alive
    /// every 15 s.
    pub async fn logs(
        &self,
        query: &str,
        follow: bool,
        mut on_line: impl FnMut(Value),
    ) -> Result<(), Error> {
        let path = format!("/v1/logs?{query}");
        let url = format!("{}{}", self.record.url, path);
        let deadlines = match follow {
            true => Deadlines {
                head: Duration::from_secs(10),
                idle: crate::logs::HEARTBEAT * 4,
            },
            false => self.deadlines.unwrap_or(Deadlines::QUICK),
        };
        let response = self.send(Method::GET, &path, None, deadlines).await?;
        if response.status() != 200 {
            return Err(refused(response, &url).await);
        }
        crate::upstream::stream_lines(response, &url, Peer::Host, |line| {
            if let Ok(value) = serde_json::from_str::<Value>(line.trim()) {
                on_line(value);
            }
            true
        })
        .await
    }
}

/// The host's refusal of a streamed request: its `{"error": …}` as [`Error::Remote`].
async fn refused(response: hyper::Response<HttpBody>, url: &str) -> Error {
    let status = response.status().as_u16();
    let bytes = collect(response, url, Peer::Host).await.unwrap_or_default();
    let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    remote(&value["error"], status)
}

/// A host's `{code, message, details, causes, hints}` error (HTTP `status`) as
/// [`Error::Remote`]; what it lacks is said generically.
pub(crate) fn remote(error: &Value, status: u16) -> Error {
    Error::Remote {
        code: error["code"]
            .as_str()
            .unwrap_or("ARCANE_OPERATION_FAILED")
            .into(),
        message: error["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("the Core host answered HTTP {status}")),
        details: error.get("details").cloned().unwrap_or(Value::Null),
        hints: error["hints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        cause: arcane_report::Cause::of_error_json(error).map(Box::new),
    }
}

#[cfg(test)]
mod tests {
    use arcane_report::{codes, Diagnostic};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A stand-in host on a loopback port that answers one request with `body` as a
    /// `200 text/event-stream`.
    async fn stand_in(body: &'static str) -> CoreClient {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = vec![0u8; 4096];
            let _ = stream.read(&mut request).await;
            let head =
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
            let _ = stream.write_all(format!("{head}{body}").as_bytes()).await;
        });
        CoreClient::new(EndpointRecord {
            protocol: "arcane/1".into(),
            url: format!("http://127.0.0.1:{port}"),
            host: "127.0.0.1".into(),
            port,
            pid: std::process::id(),
            token: "t".into(),
            started_at: String::new(),
            serving: Default::default(),
        })
    }

    #[tokio::test]
    async fn an_error_event_ends_a_stream_as_the_hosts_error() {
        let client = stand_in(concat!(
            "event: image_generation.step\ndata: {\"step\":1,\"steps\":4}\n\n",
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"code\":\"ARCANE_USAGE\",\"message\":\"size `65x64` is no multiple of 64\",\"details\":{\"field\":\"size\"}}}\n\n",
            "event: image_generation.completed\ndata: {\"b64_json\":\"AA==\"}\n\n",
        ))
        .await;
        let mut seen = Vec::new();
        let outcome = client
            .post_for_events("/v1/images/generations", json!({}), |name, data| {
                seen.push((name.to_string(), data["step"].clone()));
                true
            })
            .await;
        let error = outcome.expect_err("the error event is the call's error");
        assert_eq!(error.code(), codes::ARCANE_USAGE);
        assert!(error.to_string().contains("65x64"), "{error}");
        assert_eq!(error.details()["field"], "size");
        // The events before it were seen; nothing after it.
        assert_eq!(seen, [("image_generation.step".to_string(), json!(1))]);
    }

    #[tokio::test]
    async fn a_stream_without_an_error_hands_over_every_event() {
        let client = stand_in(concat!(
            "event: image_generation.step\ndata: {\"step\":1}\n\n",
            "data: {\"plain\":true}\n\n",
            "event: image_generation.completed\ndata: {\"index\":0}\n\n",
        ))
        .await;
        let mut names = Vec::new();
        client
            .post_for_events("/v1/images/generations", json!({}), |name, _| {
                names.push(name.to_string());
                true
            })
            .await
            .unwrap();
        assert_eq!(
            names,
            [
                "image_generation.step",
                "message",
                "image_generation.completed"
            ]
        );
    }
}
