//! `POST /api/chat` → the engine's `/v1/chat/completions`: Ollama's messages (with
//! `images`, `tool_calls` whose arguments are objects, `tool` results) become OpenAI's,
//! `tools` pass as they are (Ollama's and OpenAI's tool definitions are the same
//! shape), `options`, `format` and `think` map as [`super::options`] says. Streaming is
//! on unless `stream` is `false`. No messages at all loads the model and answers
//! `done_reason: "load"` (Ollama's preload; with `keep_alive: 0`, `"unload"`).

use std::time::Instant;

use hyper::Response;
use serde_json::{json, Map, Value};

use super::reply::{Kind, Reply};
use super::{kind_of, options, Exchange, Needs, OllamaError, Outgoing};
use arcane_core::upstream::HttpBody;

/// Answers one `/api/chat` request.
pub async fn handle(
    exchange: &Exchange<'_>,
    request: &Map<String, Value>,
) -> Result<Response<HttpBody>, OllamaError> {
    let started = Instant::now();
    let keep_alive = request.get("keep_alive").cloned();
    let no_messages = match request.get("messages") {
        None | Some(Value::Null) => true,
        Some(Value::Array(messages)) => messages.is_empty(),
        Some(_) => false,
    };
    if no_messages {
        let reason = load_reason(keep_alive.as_ref());
        let asked = exchange.asked.to_string();
        return exchange
            .load_only(keep_alive, move |load| {
                json!({
                    "model": asked,
                    "created_at": arcane_report::time::now_rfc3339(),
                    "message": {"role": "assistant", "content": ""},
                    "done_reason": reason,
                    "done": true,
                    "load_duration": load.as_nanos() as u64,
                    "total_duration": started.elapsed().as_nanos() as u64,
                })
            })
            .await;
    }
    let (outgoing, needs) = translate(request)?;
    let stream = outgoing.stream;
    let asked = exchange.asked.to_string();
    exchange
        .send(keep_alive, needs, outgoing, move |load| {
            Box::new(Reply::new(Kind::Chat, stream, &asked, started, load))
        })
        .await
}

/// `"unload"` for a `keep_alive` of zero, else `"load"`.
pub(crate) fn load_reason(keep_alive: Option<&Value>) -> &'static str {
    let zero = keep_alive.is_some_and(|k| {
        k.as_f64() == Some(0.0)
            || k.as_str()
                .is_some_and(|s| s.trim() == "0" || s.trim() == "0s")
    });
    if zero {
        "unload"
    } else {
        "load"
    }
}

/// Whether a request streams: `stream` absent or `true` (Ollama's default).
pub fn streams(request: &Map<String, Value>) -> Result<bool, OllamaError> {
    match request.get("stream") {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(stream)) => Ok(*stream),
        Some(other) => Err(OllamaError::BadRequest(format!(
            "`stream` must be true or false, not `{other}`"
        ))),
    }
}

/// The engine request for an Ollama chat request, and what the engine must offer.
pub fn translate(request: &Map<String, Value>) -> Result<(Outgoing, Needs), OllamaError> {
    let stream = streams(request)?;
    let messages = match request.get("messages") {
        Some(Value::Array(messages)) => messages,
        Some(other) => {
            return Err(OllamaError::BadRequest(format!(
                "`messages` must be a list, not {}",
                kind_of(other)
            )))
        }
        None => return Err(OllamaError::BadRequest("`messages` is required".into())),
    };
    let mut needs = Needs::default();
    let mut translated = Vec::with_capacity(messages.len());
    for (at, message) in messages.iter().enumerate() {
        translated.push(message_of(message, at, &mut needs)?);
    }
    let mut body = Map::new();
    body.insert("messages".into(), Value::Array(translated));
    common(request, &mut body, &mut needs, stream)?;
    match request.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) if !tools.is_empty() => {
            body.insert("tools".into(), Value::Array(tools.clone()));
        }
        Some(Value::Array(_)) => {}
        Some(other) => {
            return Err(OllamaError::BadRequest(format!(
                "`tools` must be a list, not {}",
                kind_of(other)
            )))
        }
    }
    Ok((
        Outgoing {
            path: "/v1/chat/completions",
            body: Value::Object(body),
            stream,
        },
        needs,
    ))
}

/// What every chat and generate request shares: `stream` (with usage and timings
/// asked for), `options`, `format`, `think`.
pub(crate) fn common(
    request: &Map<String, Value>,
    body: &mut Map<String, Value>,
    needs: &mut Needs,
    stream: bool,
) -> Result<(), OllamaError> {
    body.insert("stream".into(), json!(stream));
    if stream {
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    // llama-server reports `timings` (prompt_n, prompt_ms, predicted_n, predicted_ms)
    // on whole answers and the last chunk: the final line's counters.
    body.insert("timings_per_token".into(), json!(false));
    needs.context = options::apply(request.get("options"), body)?;
    options::apply_format(request.get("format"), body)?;
    options::apply_think(request.get("think"), body)?;
    Ok(())
}

/// One Ollama message as OpenAI's.
fn message_of(message: &Value, at: usize, needs: &mut Needs) -> Result<Value, OllamaError> {
    let bad = |why: String| OllamaError::BadRequest(format!("`messages[{at}]` {why}"));
    let Value::Object(message) = message else {
        return Err(bad(format!("must be an object, not {}", kind_of(message))));
    };
    let role = match message.get("role") {
        Some(Value::String(role))
            if matches!(role.as_str(), "system" | "user" | "assistant" | "tool") =>
        {
            role.clone()
        }
        Some(other) => {
            return Err(bad(format!(
                "has role `{other}` (system, user, assistant or tool)"
            )))
        }
        None => return Err(bad("has no `role`".into())),
    };
    let content = match message.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(content)) => content.clone(),
        Some(other) => {
            return Err(bad(format!(
                "has `content` {}, not a string",
                kind_of(other)
            )))
        }
    };
    let images = images_of(message.get("images")).map_err(bad)?;
    let mut out = Map::new();
    out.insert("role".into(), json!(role));
    if images.is_empty() {
        out.insert("content".into(), json!(content));
    } else {
        needs.vision = true;
        out.insert("content".into(), with_images(&content, &images));
    }
    if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                let function = &call["function"];
                let arguments = match &function["arguments"] {
                    Value::String(text) => text.clone(),
                    Value::Null => "{}".into(),
                    other => other.to_string(),
                };
                json!({
                    "id": call["id"].as_str().map_or_else(|| format!("call_{i}"), str::to_string),
                    "type": "function",
                    "function": {"name": function["name"].as_str().unwrap_or_default(), "arguments": arguments},
                })
            })
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(id) = message.get("tool_call_id").and_then(Value::as_str) {
        out.insert("tool_call_id".into(), json!(id));
    }
    if let Some(name) = message.get("tool_name").and_then(Value::as_str) {
        out.insert("name".into(), json!(name));
    }
    Ok(Value::Object(out))
}

/// `images`: base64 strings (absent or null: none).
pub(crate) fn images_of(images: Option<&Value>) -> Result<Vec<String>, String> {
    match images {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(images)) => images
            .iter()
            .map(|image| {
                image
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| "has an image that is not a base64 string".to_string())
            })
            .collect(),
        Some(other) => Err(format!("has `images` {}, not a list", kind_of(other))),
    }
}

/// OpenAI's content parts: the text, then each image as a data URL.
pub(crate) fn with_images(text: &str, images: &[String]) -> Value {
    let mut parts = vec![json!({"type": "text", "text": text})];
    parts.extend(images.iter().map(|image| {
        json!({"type": "image_url", "image_url": {"url": format!("data:image/jpeg;base64,{image}")}})
    }));
    Value::Array(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn messages_tools_and_options_become_openais() {
        let (outgoing, needs) = translate(&object(json!({
            "model": "smol",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
                {"role": "tool", "content": "42", "tool_name": "f"},
            ],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "options": {"num_predict": 8, "temperature": 0},
            "format": "json",
        })))
        .unwrap();
        assert!(outgoing.stream, "streaming is the default");
        assert!(!needs.vision);
        let body = outgoing.body;
        assert_eq!(outgoing.path, "/v1/chat/completions");
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(body["max_tokens"], 8);
        assert_eq!(body["response_format"]["type"], "json_object");
        assert_eq!(
            body["messages"][1]["tool_calls"][0]["function"]["arguments"],
            r#"{"x":1}"#
        );
        assert_eq!(body["messages"][2]["name"], "f");
        assert_eq!(body["tools"][0]["function"]["name"], "f");
    }

    #[test]
    fn images_need_vision_and_become_content_parts() {
        let (outgoing, needs) = translate(&object(json!({
            "messages": [{"role": "user", "content": "What is this?", "images": ["aGk="]}],
            "stream": false,
        })))
        .unwrap();
        assert!(needs.vision && !outgoing.stream);
        assert_eq!(
            outgoing.body["messages"][0]["content"][1]["image_url"]["url"],
            "data:image/jpeg;base64,aGk="
        );
    }

    #[test]
    fn malformed_requests_are_400s_naming_the_field() {
        for request in [
            json!({"messages": "hi"}),
            json!({"messages": [{"role": "robot", "content": "x"}]}),
            json!({"messages": [{"role": "user", "content": 5}]}),
            json!({"messages": [], "stream": "yes"}),
        ] {
            let error = translate(&object(request.clone())).unwrap_err();
            assert_eq!(error.status(), hyper::StatusCode::BAD_REQUEST, "{request}");
        }
        assert_eq!(load_reason(Some(&json!(0))), "unload");
        assert_eq!(load_reason(Some(&json!("5m"))), "load");
    }
}
