//! `POST /api/generate` → the engine: with the model's template (the default), the
//! prompt (and `system`, `images`) becomes a chat on `/v1/chat/completions`, so the
//! engine applies the model's own chat template as Ollama applies its template; with
//! `raw: true` the prompt goes unchanged to `/v1/completions`. An empty prompt loads
//! the model and answers `done_reason: "load"` (Ollama's preload).
//!
//! Refused with a 400, as the translation cannot honour them: `suffix`
//! (fill-in-the-middle needs the model's FIM tokens and llama-server's `/infill`),
//! `template` (Ollama's Go templates; the engine applies the model's Jinja template)
//! and `context` (Ollama's returned token context; send the conversation as `/api/chat`
//! messages instead).

use std::time::Instant;

use hyper::Response;
use serde_json::{json, Map, Value};

use super::chat::{common, images_of, load_reason, streams, with_images};
use super::reply::{Kind, Reply};
use super::{kind_of, Exchange, Needs, OllamaError, Outgoing};
use arcane_core::upstream::HttpBody;

/// Answers one `/api/generate` request.
pub async fn handle(
    exchange: &Exchange<'_>,
    request: &Map<String, Value>,
) -> Result<Response<HttpBody>, OllamaError> {
    let started = Instant::now();
    let keep_alive = request.get("keep_alive").cloned();
    let (outgoing, needs) = match translate(request)? {
        Some(translated) => translated,
        None => {
            let reason = load_reason(keep_alive.as_ref());
            let asked = exchange.asked.to_string();
            return exchange
                .load_only(keep_alive, move |load| {
                    json!({
                        "model": asked,
                        "created_at": arcane_report::time::now_rfc3339(),
                        "response": "",
                        "done": true,
                        "done_reason": reason,
                        "load_duration": load.as_nanos() as u64,
                        "total_duration": started.elapsed().as_nanos() as u64,
                    })
                })
                .await;
        }
    };
    let stream = outgoing.stream;
    let asked = exchange.asked.to_string();
    exchange
        .send(keep_alive, needs, outgoing, move |load| {
            Box::new(Reply::new(Kind::Generate, stream, &asked, started, load))
        })
        .await
}

/// A string field, when present and not null.
fn text<'a>(request: &'a Map<String, Value>, field: &str) -> Result<Option<&'a str>, OllamaError> {
    match request.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(other) => Err(OllamaError::BadRequest(format!(
            "`{field}` must be a string, not {}",
            kind_of(other)
        ))),
    }
}

/// The engine request for an Ollama generate request, and what the engine must offer;
/// `None` for an empty prompt (a load).
pub fn translate(request: &Map<String, Value>) -> Result<Option<(Outgoing, Needs)>, OllamaError> {
    let stream = streams(request)?;
    let prompt = text(request, "prompt")?.unwrap_or_default();
    let system = text(request, "system")?;
    let raw = match request.get("raw") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(raw)) => *raw,
        Some(other) => {
            return Err(OllamaError::BadRequest(format!(
                "`raw` must be true or false, not `{other}`"
            )))
        }
    };
    if text(request, "suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(OllamaError::BadRequest(
            "`suffix` (fill-in-the-middle) is not supported by Arcane's Ollama API: use llama-server's own `/infill` through the front door with a model that has FIM tokens".into(),
        ));
    }
    if text(request, "template")?.is_some_and(|t| !t.is_empty()) {
        return Err(OllamaError::BadRequest(
            "`template` is not supported: the engine applies the model's own chat template; send `raw: true` with a prompt you formatted yourself".into(),
        ));
    }
    if request.get("context").is_some_and(|c| !c.is_null()) {
        return Err(OllamaError::BadRequest(
            "`context` (Ollama's token context) is not supported: send the conversation as `/api/chat` messages".into(),
        ));
    }
    let images = images_of(request.get("images"))
        .map_err(|why| OllamaError::BadRequest(format!("the request {why}")))?;
    if prompt.is_empty() && images.is_empty() {
        return Ok(None);
    }
    let mut needs = Needs {
        vision: !images.is_empty(),
        ..Needs::default()
    };
    let mut body = Map::new();
    let path = if raw {
        if !images.is_empty() {
            return Err(OllamaError::BadRequest(
                "`images` with `raw: true` is not supported: send them without `raw`".into(),
            ));
        }
        body.insert("prompt".into(), json!(prompt));
        "/v1/completions"
    } else {
        let mut messages = Vec::new();
        if let Some(system) = system.filter(|s| !s.is_empty()) {
            messages.push(json!({"role": "system", "content": system}));
        }
        let content = if images.is_empty() {
            json!(prompt)
        } else {
            with_images(prompt, &images)
        };
        messages.push(json!({"role": "user", "content": content}));
        body.insert("messages".into(), Value::Array(messages));
        "/v1/chat/completions"
    };
    common(request, &mut body, &mut needs, stream)?;
    Ok(Some((
        Outgoing {
            path,
            body: Value::Object(body),
            stream,
        },
        needs,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn a_templated_prompt_is_a_chat_and_a_raw_one_a_completion() {
        let (chat, _) = translate(&object(
            json!({"prompt": "Hi", "system": "Be brief.", "stream": false}),
        ))
        .unwrap()
        .unwrap();
        assert_eq!(chat.path, "/v1/chat/completions");
        assert_eq!(
            chat.body["messages"][0],
            json!({"role": "system", "content": "Be brief."})
        );
        assert_eq!(
            chat.body["messages"][1],
            json!({"role": "user", "content": "Hi"})
        );
        let (raw, _) = translate(&object(
            json!({"prompt": "<|im_start|>", "raw": true, "options": {"seed": 1}}),
        ))
        .unwrap()
        .unwrap();
        assert_eq!(raw.path, "/v1/completions");
        assert_eq!(raw.body["prompt"], "<|im_start|>");
        assert_eq!(raw.body["seed"], 1);
        assert!(raw.stream);
    }

    #[test]
    fn an_empty_prompt_is_a_load_and_unsupported_fields_are_400s() {
        assert!(translate(&object(json!({"model": "smol"})))
            .unwrap()
            .is_none());
        for request in [
            json!({"prompt": "def f(", "suffix": "return x"}),
            json!({"prompt": "x", "template": "{{ .Prompt }}"}),
            json!({"prompt": "x", "context": [1, 2]}),
            json!({"prompt": 5}),
            json!({"prompt": "x", "raw": true, "images": ["aGk="]}),
        ] {
            let error = translate(&object(request.clone())).unwrap_err();
            assert_eq!(error.status(), hyper::StatusCode::BAD_REQUEST, "{request}");
        }
        let (_, needs) = translate(&object(json!({"prompt": "x", "images": ["aGk="]})))
            .unwrap()
            .unwrap();
        assert!(needs.vision);
    }
}
