//! Ollama's `options`, `format` and `think`, as the engine's (llama-server's) request
//! fields. Sampling options map one to one (`num_predict` is `max_tokens`); options
//! that choose how a model is loaded (`num_gpu`, `num_thread`, `use_mmap`, …) are
//! Arcane's configuration, not a request's, and are ignored as Ollama ignores options
//! it does not know; `num_ctx` must be at most the loaded context (checked against the engine,
//! see [`super::check_needs`]). The table is in `docs/ollama-api.md`.

use serde_json::{json, Map, Value};

use super::{kind_of, OllamaError};

/// How one option's value must look.
#[derive(Clone, Copy)]
enum Shape {
    Number,
    Integer,
    Stop,
}

/// Ollama's option → the engine's field, and its shape.
const MAPPED: &[(&str, &str, Shape)] = &[
    ("temperature", "temperature", Shape::Number),
    ("top_p", "top_p", Shape::Number),
    ("top_k", "top_k", Shape::Integer),
    ("min_p", "min_p", Shape::Number),
    ("typical_p", "typical_p", Shape::Number),
    ("seed", "seed", Shape::Integer),
    ("num_predict", "max_tokens", Shape::Integer),
    ("stop", "stop", Shape::Stop),
    ("repeat_penalty", "repeat_penalty", Shape::Number),
    ("repeat_last_n", "repeat_last_n", Shape::Integer),
    ("presence_penalty", "presence_penalty", Shape::Number),
    ("frequency_penalty", "frequency_penalty", Shape::Number),
    ("mirostat", "mirostat", Shape::Integer),
    ("mirostat_tau", "mirostat_tau", Shape::Number),
    ("mirostat_eta", "mirostat_eta", Shape::Number),
    ("num_keep", "n_keep", Shape::Integer),
];

/// Options that choose how a model is loaded: Arcane's configuration (`args` in the
/// model's table), ignored in a request.
pub const LOAD_TIME: &[&str] = &[
    "num_batch",
    "num_gpu",
    "main_gpu",
    "num_thread",
    "numa",
    "use_mmap",
    "use_mlock",
    "low_vram",
    "vocab_only",
    "f16_kv",
    "logits_all",
    "embedding_only",
];

/// Applies `options` to the engine request `body`; returns the `num_ctx` asked for (to
/// be checked against the loaded context). A known option of the wrong type is a 400
/// naming it; unknown and load-time options are ignored.
pub fn apply(
    options: Option<&Value>,
    body: &mut Map<String, Value>,
) -> Result<Option<u64>, OllamaError> {
    let options = match options {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(options)) => options,
        Some(other) => {
            return Err(OllamaError::BadRequest(format!(
                "`options` must be an object, not {}",
                kind_of(other)
            )))
        }
    };
    for (name, field, shape) in MAPPED {
        let Some(value) = options.get(*name).filter(|v| !v.is_null()) else {
            continue;
        };
        let bad = || {
            OllamaError::BadRequest(format!(
                "option `{name}` must be {}, not `{value}`",
                match shape {
                    Shape::Number => "a number",
                    Shape::Integer => "an integer",
                    Shape::Stop => "a string or a list of strings",
                }
            ))
        };
        let value = match shape {
            Shape::Number => json!(value.as_f64().ok_or_else(bad)?),
            Shape::Integer => json!(value.as_i64().ok_or_else(bad)?),
            Shape::Stop => match value {
                Value::String(stop) => json!([stop]),
                Value::Array(stops) if stops.iter().all(Value::is_string) => value.clone(),
                _ => return Err(bad()),
            },
        };
        // Ollama's `num_predict` of -1 (infinite) and -2 (fill the context) are the
        // engine's default: no limit is sent.
        if *name == "num_predict" && value.as_i64().is_some_and(|n| n < 0) {
            continue;
        }
        body.insert((*field).to_string(), value);
    }
    match options.get("num_ctx") {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value.as_u64().filter(|n| *n > 0).map(Some).ok_or_else(|| {
            OllamaError::BadRequest(format!(
                "option `num_ctx` must be a positive integer, not `{value}`"
            ))
        }),
    }
}

/// Applies `format` (`"json"`, a JSON schema, or absent) as the engine's
/// `response_format`; anything else is a 400.
pub fn apply_format(
    format: Option<&Value>,
    body: &mut Map<String, Value>,
) -> Result<(), OllamaError> {
    let response_format = match format {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(text)) if text.is_empty() => return Ok(()),
        Some(Value::String(text)) if text == "json" => json!({"type": "json_object"}),
        Some(Value::Object(schema)) => json!({
            "type": "json_schema",
            "json_schema": {"name": "format", "schema": schema, "strict": true},
        }),
        Some(other) => {
            return Err(OllamaError::BadRequest(format!(
                "`format` must be \"json\" or a JSON schema object, not `{other}`"
            )))
        }
    };
    body.insert("response_format".into(), response_format);
    Ok(())
}

/// Applies `think` (a boolean, or a level `"low"|"medium"|"high"`) as the chat
/// template's `enable_thinking` (llama-server's `chat_template_kwargs`); the model's
/// reasoning comes back as `thinking`. A template without the switch ignores it.
pub fn apply_think(
    think: Option<&Value>,
    body: &mut Map<String, Value>,
) -> Result<(), OllamaError> {
    let enable = match think {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Bool(enable)) => *enable,
        Some(Value::String(level)) if matches!(level.as_str(), "low" | "medium" | "high") => {
            body.insert("reasoning_effort".into(), json!(level));
            true
        }
        Some(other) => {
            return Err(OllamaError::BadRequest(format!(
                "`think` must be true, false, \"low\", \"medium\" or \"high\", not `{other}`"
            )))
        }
    };
    body.insert(
        "chat_template_kwargs".into(),
        json!({"enable_thinking": enable}),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(options: Value) -> (Map<String, Value>, Option<u64>) {
        let mut body = Map::new();
        let context = apply(Some(&options), &mut body).unwrap();
        (body, context)
    }

    #[test]
    fn sampling_options_map_onto_the_engine() {
        let (body, context) = applied(json!({
            "temperature": 0.2, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7,
            "num_predict": 16, "stop": "\n", "repeat_penalty": 1.1,
            "presence_penalty": 0.5, "frequency_penalty": 0.25,
            "num_gpu": 99, "unknown_option": true,
        }));
        assert_eq!(context, None);
        assert_eq!(
            Value::Object(body),
            json!({
                "temperature": 0.2, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7,
                "max_tokens": 16, "stop": ["\n"], "repeat_penalty": 1.1,
                "presence_penalty": 0.5, "frequency_penalty": 0.25,
            })
        );
    }

    #[test]
    fn unlimited_predictions_send_no_limit_and_num_ctx_is_returned() {
        let (body, context) = applied(json!({"num_predict": -1, "num_ctx": 4096}));
        assert!(body.is_empty(), "{body:?}");
        assert_eq!(context, Some(4096));
    }

    #[test]
    fn wrongly_typed_options_are_refused_naming_them() {
        for options in [
            json!({"temperature": "hot"}),
            json!({"stop": [1]}),
            json!({"num_ctx": -5}),
            json!({"seed": 1.5}),
            json!([1]),
        ] {
            let error = apply(Some(&options), &mut Map::new()).unwrap_err();
            assert_eq!(error.status(), hyper::StatusCode::BAD_REQUEST, "{options}");
        }
    }

    #[test]
    fn format_json_and_schemas_constrain_the_output() {
        let mut body = Map::new();
        apply_format(Some(&json!("json")), &mut body).unwrap();
        assert_eq!(body["response_format"], json!({"type": "json_object"}));
        let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}});
        apply_format(Some(&schema), &mut body).unwrap();
        assert_eq!(body["response_format"]["json_schema"]["schema"], schema);
        assert!(apply_format(Some(&json!("yaml")), &mut body).is_err());
    }

    #[test]
    fn think_switches_the_templates_thinking() {
        let mut body = Map::new();
        apply_think(Some(&json!(false)), &mut body).unwrap();
        assert_eq!(
            body["chat_template_kwargs"],
            json!({"enable_thinking": false})
        );
        apply_think(Some(&json!("high")), &mut body).unwrap();
        assert_eq!(body["reasoning_effort"], "high");
        assert!(apply_think(Some(&json!(3)), &mut body).is_err());
    }
}
