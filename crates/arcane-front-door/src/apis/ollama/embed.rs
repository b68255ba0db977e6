//! `POST /api/embed` (`input`: a string or a list) and the older `POST
//! /api/embeddings` (`prompt`: one string) → the engine's `/v1/embeddings`. A llama.cpp
//! model answers embeddings only when its engine was started for them (`args =
//! ["--embeddings"]` in its [[model]] table); otherwise the engine's refusal comes back
//! in Ollama's shape.

use std::time::Instant;

use hyper::Response;
use serde_json::{json, Map, Value};

use super::reply::Whole;
use super::{kind_of, Exchange, Needs, OllamaError, Outgoing};
use arcane_core::upstream::HttpBody;

/// Which of the two endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `/api/embed`: `{embeddings: [[…]]}`.
    Embed,
    /// `/api/embeddings`: `{embedding: […]}`.
    Embeddings,
}

/// The engine request of an embed request.
pub fn translate(
    request: &Map<String, Value>,
    form: Form,
) -> Result<(Outgoing, Needs), OllamaError> {
    let field = match form {
        Form::Embed => "input",
        Form::Embeddings => "prompt",
    };
    let input = match (form, request.get(field)) {
        (_, Some(Value::String(text))) => json!(text),
        (Form::Embed, Some(Value::Array(texts))) if texts.iter().all(Value::is_string) => {
            json!(texts)
        }
        (_, None | Some(Value::Null)) => {
            return Err(OllamaError::BadRequest(format!("`{field}` is required")))
        }
        (_, Some(other)) => {
            return Err(OllamaError::BadRequest(format!(
                "`{field}` must be {}, not {}",
                match form {
                    Form::Embed => "a string or a list of strings",
                    Form::Embeddings => "a string",
                },
                kind_of(other)
            )))
        }
    };
    let mut body = Map::new();
    body.insert("input".into(), input);
    if let Some(dimensions) = request.get("dimensions").filter(|d| !d.is_null()) {
        body.insert("dimensions".into(), dimensions.clone());
    }
    let needs = Needs {
        context: super::options::apply(request.get("options"), &mut Map::new())?,
        ..Needs::default()
    };
    Ok((
        Outgoing {
            path: "/v1/embeddings",
            body: Value::Object(body),
            stream: false,
        },
        needs,
    ))
}

/// Ollama's answer from the engine's `/v1/embeddings` answer.
pub fn answer(form: Form, model: &str, engine: &Value, load: u64, total: u64) -> Value {
    let mut vectors: Vec<(u64, Value)> = engine["data"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, item)| {
            (
                item["index"].as_u64().unwrap_or(i as u64),
                item["embedding"].clone(),
            )
        })
        .collect();
    vectors.sort_by_key(|(index, _)| *index);
    let vectors: Vec<Value> = vectors.into_iter().map(|(_, v)| v).collect();
    match form {
        Form::Embed => json!({
            "model": model,
            "embeddings": vectors,
            "total_duration": total,
            "load_duration": load,
            "prompt_eval_count": engine["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
        }),
        Form::Embeddings => json!({
            "embedding": vectors.into_iter().next().unwrap_or_else(|| json!([])),
        }),
    }
}

/// Answers one embed request.
pub async fn handle(
    exchange: &Exchange<'_>,
    request: &Map<String, Value>,
    form: Form,
) -> Result<Response<HttpBody>, OllamaError> {
    let started = Instant::now();
    let (outgoing, needs) = translate(request, form)?;
    let model = exchange.asked.to_string();
    exchange
        .send(request.get("keep_alive").cloned(), needs, outgoing, move |load| {
            Box::new(Whole::new(move |bytes: &[u8]| {
                match serde_json::from_slice::<Value>(bytes) {
                    Ok(engine) => {
                        let usage = engine.get("usage").filter(|u| u.is_object()).cloned();
                        let total = started.elapsed().as_nanos() as u64;
                        (answer(form, &model, &engine, load.as_nanos() as u64, total), usage)
                    }
                    Err(_) => (
                        json!({"error": format!("the engine's answer is not JSON: {}", String::from_utf8_lossy(bytes))}),
                        None,
                    ),
                }
            }))
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_or_a_list_is_sent_and_vectors_come_back_in_order() {
        let request = json!({"input": ["a", "b"]}).as_object().cloned().unwrap();
        let (outgoing, _) = translate(&request, Form::Embed).unwrap();
        assert_eq!(outgoing.body["input"], json!(["a", "b"]));
        let engine = json!({"data": [{"index": 1, "embedding": [0.2]}, {"index": 0, "embedding": [0.1]}], "usage": {"prompt_tokens": 4}});
        let embed = answer(Form::Embed, "e:latest", &engine, 1, 2);
        assert_eq!(embed["embeddings"], json!([[0.1], [0.2]]));
        assert_eq!(embed["prompt_eval_count"], 4);
        assert_eq!(
            answer(Form::Embeddings, "e", &engine, 1, 2),
            json!({"embedding": [0.1]})
        );
        let old = json!({"prompt": ["a"]}).as_object().cloned().unwrap();
        assert!(translate(&old, Form::Embeddings).is_err());
        assert!(translate(&Map::new(), Form::Embed).is_err());
    }
}
