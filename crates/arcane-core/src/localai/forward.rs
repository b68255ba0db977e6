//! The `local-ai` methods that forward to an engine: `llama.chat` and the methods a
//! kind's descriptor forwards to its engine's own API (streamed answers become
//! `<namespace>.chunk` events tied to the request), and the one request path every call to an engine takes, with its
//! [`Deadlines`].

use arcane_report::event_types;
use bytes::Bytes;
use hyper::Method;
use serde_json::{json, Value};

use super::engines::LocalAiService;
use crate::error::{Error, Peer};
use crate::service::{MethodResult, RequestContext};
use crate::upstream::{collect, full, Deadlines, EngineAccess, EngineClient, HttpBody};
use arcane_localai::Takes;

impl LocalAiService {
    /// Sends one request to the engine at `access` ([`send`]).
    pub(super) async fn send(
        &self,
        access: &EngineAccess,
        method: Method,
        path: &str,
        body: Option<&Value>,
        deadlines: Deadlines,
    ) -> Result<hyper::Response<HttpBody>, Error> {
        send(&self.client, access, method, path, body, deadlines).await
    }

    /// [`engine_json`] with this service's client.
    pub(super) async fn engine_json(
        &self,
        access: &EngineAccess,
        method: Method,
        path: &str,
        body: Option<&Value>,
        deadlines: Deadlines,
    ) -> Result<Value, Error> {
        engine_json(&self.client, access, method, path, body, deadlines).await
    }

    pub(super) async fn llama_chat(
        &self,
        parameters: Value,
        context: RequestContext,
    ) -> MethodResult {
        let slot = self.require_namespace("llama")?;
        let access = self.ready_access(slot, &context).await?;
        chat(&self.client, &access, parameters, &context).await
    }

    /// Answers an `arcane/1` method a kind forwards to its engine's own API
    /// ([`arcane_localai::EngineKind::forwarded_methods`]): the engine's answer as it
    /// gives it; a streamed one (when asked, `"stream": true`) as `<namespace>.chunk`
    /// events tied to the request, then the last line carrying the whole text.
    pub(super) async fn forwarded(
        &self,
        method: &str,
        parameters: Value,
        context: RequestContext,
    ) -> MethodResult {
        let Some((engine, row)) = arcane_localai::Engine::forwarding(method) else {
            return Err(Box::new(Error::usage(
                format!("no engine answers `{method}`"),
                json!({"method": method}),
            )));
        };
        let slot = self.require(engine)?;
        let access = self.ready_access(slot, &context).await?;
        let deadlines = match row.takes {
            Takes::Quick => Deadlines::QUICK,
            Takes::Generation => Deadlines::GENERATION,
            Takes::Transfer => Deadlines::TRANSFER,
        };
        if !row.post {
            return Ok(self
                .engine_json(&access, Method::GET, row.path, None, deadlines)
                .await?);
        }
        let mut body = match parameters.get("payload") {
            Some(Value::Object(p)) => Value::Object(p.clone()),
            _ => parameters.clone(),
        };
        if let Value::Object(map) = &mut body {
            map.remove("streamId");
            map.remove("payload");
        }
        // Such engines stream by default; the host streams only when asked.
        let stream = row.streams && body["stream"].as_bool().unwrap_or(false);
        body["stream"] = json!(stream);
        if !stream {
            let result = self
                .engine_json(&access, Method::POST, row.path, Some(&body), deadlines)
                .await?;
            if row.changes_models {
                self.refresh_models(slot).await;
            }
            return Ok(result);
        }
        let stream_id = parameters["streamId"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| context.request_id.clone());
        let chunk_type = engine
            .kind()
            .rpc_namespace()
            .and_then(event_types::chunk_of)
            .unwrap_or(event_types::LLAMA_CHUNK);
        let url = access.url_of(row.path);
        let response = self
            .send(&access, Method::POST, row.path, Some(&body), deadlines)
            .await?;
        let mut content = String::new();
        let mut last = Value::Null;
        crate::upstream::stream_lines(response, &url, Peer::Engine, |line| {
            let Ok(chunk) = serde_json::from_str::<Value>(line) else {
                return true;
            };
            if let Some(text) = row.text.and_then(|at| chunk.pointer(at)?.as_str()) {
                content.push_str(text);
            }
            context.emit(chunk_type, json!({"streamId": stream_id, "chunk": chunk}));
            last = chunk;
            true
        })
        .await?;
        if row.changes_models {
            self.refresh_models(slot).await;
        }
        if let Some(at) = row.text {
            set_pointer(&mut last, at, json!(content));
        }
        Ok(last)
    }
}

/// Sets `value` at the JSON pointer `at` in `target`, making the objects on the way.
fn set_pointer(target: &mut Value, at: &str, value: Value) {
    let mut here = target;
    for key in at.split('/').skip(1) {
        if !here.is_object() {
            *here = json!({});
        }
        here = &mut here[key];
    }
    *here = value;
}

/// Sends one request to the engine at `access` (`path` with its query); a non-2xx
/// answer is [`Error::Upstream`] with the engine's body.
pub(crate) async fn send(
    client: &EngineClient,
    access: &EngineAccess,
    method: Method,
    path: &str,
    body: Option<&Value>,
    deadlines: Deadlines,
) -> Result<hyper::Response<HttpBody>, Error> {
    let url = access.url_of(path);
    let url = url.as_str();
    let mut request = access.request(method, path);
    let body = match body {
        Some(body) => {
            request = request.header(hyper::header::CONTENT_TYPE, "application/json");
            full(body.to_string())
        }
        None => full(Bytes::new()),
    };
    let request = request.body(body).map_err(|e| Error::Http {
        url: url.into(),
        source: Box::new(e),
    })?;
    let response = client
        .send_to(access, request, deadlines, Peer::Engine)
        .await?;
    if response.status().is_success() {
        return Ok(response);
    }
    let status = response.status().as_u16();
    let bytes = collect(response, url, Peer::Engine)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(4096)]).into_owned();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Err(Error::Upstream {
        url: url.into(),
        status,
        body,
    })
}

/// [`send`], with the answer read whole as JSON (or a JSON string).
pub(crate) async fn engine_json(
    client: &EngineClient,
    access: &EngineAccess,
    method: Method,
    path: &str,
    body: Option<&Value>,
    deadlines: Deadlines,
) -> Result<Value, Error> {
    let response = send(client, access, method, path, body, deadlines).await?;
    let bytes = collect(response, &access.url_of(path), Peer::Engine).await?;
    Ok(serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned())))
}

/// `llama.chat` on the engine at `access`: `messages` (or `payload`) with the SDK's
/// options sent to `/v1/chat/completions`; streamed (`stream: true`) as `llama.chunk`
/// events tied to the request, the whole answer returned at the end. The local-AI
/// service and the model gateway both answer `llama.chat` with it.
pub async fn chat(
    client: &EngineClient,
    access: &EngineAccess,
    parameters: Value,
    context: &RequestContext,
) -> MethodResult {
    let mut payload = match parameters.get("payload") {
        Some(Value::Object(p)) => Value::Object(p.clone()),
        _ => json!({}),
    };
    for key in [
        "messages",
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
    ] {
        if let Some(value) = parameters.get(key).filter(|v| !v.is_null()) {
            payload[key] = value.clone();
        }
    }
    // The SDK's camelCase option names, translated to llama.cpp's spelling.
    for (sdk, upstream) in [
        ("maxTokens", "max_tokens"),
        ("topP", "top_p"),
        ("topK", "top_k"),
    ] {
        if let Some(value) = parameters.get(sdk).or_else(|| payload.get(sdk)).cloned() {
            payload[upstream] = value;
            if let Value::Object(map) = &mut payload {
                map.remove(sdk);
            }
        }
    }
    if payload.get("messages").is_none() {
        return Err(Box::new(Error::usage(
            "`llama.chat` needs `messages` (or `payload.messages`)",
            json!({"parameters": parameters}),
        )));
    }
    let stream = parameters["stream"]
        .as_bool()
        .or_else(|| payload["stream"].as_bool())
        .unwrap_or(false);
    payload["stream"] = json!(stream);
    let path = "/v1/chat/completions";
    let url = access.url_of(path);
    if !stream {
        let answer = engine_json(
            client,
            access,
            Method::POST,
            path,
            Some(&payload),
            Deadlines::GENERATION,
        );
        return Ok(answer.await?);
    }
    let stream_id = parameters["streamId"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| context.request_id.clone());
    let response = send(
        client,
        access,
        Method::POST,
        path,
        Some(&payload),
        Deadlines::GENERATION,
    )
    .await?;
    let mut content = String::new();
    let mut finish_reason = Value::Null;
    let mut last = Value::Null;
    let mut chunks = 0usize;
    crate::upstream::stream_lines(response, &url, Peer::Engine, |line| {
        let Some(data) = line.strip_prefix("data:").map(str::trim) else {
            return true;
        };
        if data == "[DONE]" {
            return false;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            return true;
        };
        if let Some(delta) = chunk["choices"][0]["delta"]["content"].as_str() {
            content.push_str(delta);
        }
        if !chunk["choices"][0]["finish_reason"].is_null() {
            finish_reason = chunk["choices"][0]["finish_reason"].clone();
        }
        chunks += 1;
        context.emit(
            event_types::LLAMA_CHUNK,
            json!({"streamId": stream_id, "chunk": chunk}),
        );
        last = chunk;
        true
    })
    .await?;
    Ok(json!({
        "id": last["id"],
        "object": "chat.completion",
        "created": last["created"],
        "model": last["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish_reason}],
        "usage": last.get("usage").cloned().unwrap_or(Value::Null),
        "timings": last.get("timings").cloned().unwrap_or(Value::Null),
        "streamId": stream_id,
        "chunks": chunks,
    }))
}
