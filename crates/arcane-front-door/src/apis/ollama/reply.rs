//! The engine's OpenAI answer, rewritten into Ollama's: [`Reply`] for chat and generate
//! (streamed: SSE `data:` lines in, one NDJSON line per piece out, then the final line;
//! whole: one JSON object), [`Whole`] for anything answered at once (embeddings,
//! errors). Both are [`Rewrite`]s the passthrough's body drives, so the lease sees the
//! engine's `usage` and the drain applies.
//!
//! The final line carries Ollama's counters, in nanoseconds, from the engine's own
//! `timings` (llama-server reports `prompt_n`, `prompt_ms`, `predicted_n`,
//! `predicted_ms` on its last chunk and whole answers): `prompt_eval_count` and
//! `prompt_eval_duration` are the prompt tokens it evaluated (a cached prefix is not
//! evaluated again), `eval_count` and `eval_duration` the generated ones;
//! `load_duration` is the time the gateway took to have the model ready and
//! `total_duration` the whole request's, both measured here.

use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::response_lines::{Rewrite, Transformed};

/// Which of Ollama's answers is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `/api/chat`: `message: {role, content, thinking?, tool_calls?}`.
    Chat,
    /// `/api/generate`: `response`, `thinking?`.
    Generate,
}

/// Chat and generate answers (see the module documentation).
pub struct Reply {
    kind: Kind,
    stream: bool,
    model: String,
    started: Instant,
    load: Duration,
    /// The incomplete last line (streamed) or the whole answer (not streamed).
    pending: Vec<u8>,
    /// Streamed tool calls, assembled by index: name and argument text.
    tool_calls: Vec<(String, String)>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    timings: Option<Value>,
    finished: bool,
}

impl Reply {
    /// A reply of `kind` naming `model` (as asked), streamed or whole; `started` is when
    /// the request came, `load` how long its model took to be ready.
    pub fn new(kind: Kind, stream: bool, model: &str, started: Instant, load: Duration) -> Self {
        Self {
            kind,
            stream,
            model: model.to_string(),
            started,
            load,
            pending: Vec::new(),
            tool_calls: Vec::new(),
            finish_reason: None,
            usage: None,
            timings: None,
            finished: false,
        }
    }

    /// A line of Ollama's answer with `content` (and `thinking`, `tool_calls`).
    fn piece(
        &self,
        content: &str,
        thinking: Option<&str>,
        tool_calls: Option<Value>,
    ) -> Map<String, Value> {
        let mut line = Map::new();
        line.insert("model".into(), json!(self.model));
        line.insert(
            "created_at".into(),
            json!(arcane_report::time::now_rfc3339()),
        );
        match self.kind {
            Kind::Chat => {
                let mut message = json!({"role": "assistant", "content": content});
                if let Some(thinking) = thinking.filter(|t| !t.is_empty()) {
                    message["thinking"] = json!(thinking);
                }
                if let Some(calls) = tool_calls {
                    message["tool_calls"] = calls;
                }
                line.insert("message".into(), message);
            }
            Kind::Generate => {
                line.insert("response".into(), json!(content));
                if let Some(thinking) = thinking.filter(|t| !t.is_empty()) {
                    line.insert("thinking".into(), json!(thinking));
                }
            }
        }
        line.insert("done".into(), json!(false));
        line
    }

    /// The counters of the final line.
    fn done(&self, line: &mut Map<String, Value>) {
        let timing = |key: &str| self.timings.as_ref().and_then(|t| t[key].as_f64());
        let usage = |key: &str| self.usage.as_ref().and_then(|u| u[key].as_u64());
        let nanos = |ms: Option<f64>| ms.map_or(0, |ms| (ms * 1e6).max(0.0) as u64);
        let reason = match self.finish_reason.as_deref() {
            Some("length") => "length",
            _ => "stop",
        };
        line.insert("done".into(), json!(true));
        line.insert("done_reason".into(), json!(reason));
        if self.kind == Kind::Generate {
            // Ollama's token ids of the exchange, for a next request to continue from;
            // the engines' OpenAI answers do not carry them. Clients that parse it as
            // required (the Vercel AI SDK's provider) get an empty one.
            line.insert("context".into(), json!([]));
        }
        line.insert(
            "total_duration".into(),
            json!(self.started.elapsed().as_nanos() as u64),
        );
        line.insert("load_duration".into(), json!(self.load.as_nanos() as u64));
        line.insert(
            "prompt_eval_count".into(),
            json!(timing("prompt_n")
                .map(|n| n as u64)
                .or_else(|| usage("prompt_tokens"))
                .unwrap_or(0)),
        );
        line.insert(
            "prompt_eval_duration".into(),
            json!(nanos(timing("prompt_ms"))),
        );
        line.insert(
            "eval_count".into(),
            json!(timing("predicted_n")
                .map(|n| n as u64)
                .or_else(|| usage("completion_tokens"))
                .unwrap_or(0)),
        );
        line.insert("eval_duration".into(), json!(nanos(timing("predicted_ms"))));
    }

    /// One SSE line of a streamed answer: what to send for it.
    fn stream_line(&mut self, line: &[u8], out: &mut Vec<u8>) {
        let text = String::from_utf8_lossy(line);
        let text = text.trim();
        let Some(data) = text.strip_prefix("data:").map(str::trim) else {
            return;
        };
        if data.is_empty() || data == "[DONE]" {
            return;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            return;
        };
        if chunk.get("error").is_some() {
            push_line(out, &json!({"error": super::error_message(&chunk)}));
            return;
        }
        self.observe(&chunk);
        let choice = &chunk["choices"][0];
        let delta = &choice["delta"];
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap_or(0) as usize;
            if self.tool_calls.len() <= index {
                self.tool_calls
                    .resize(index + 1, (String::new(), String::new()));
            }
            let (name, arguments) = &mut self.tool_calls[index];
            if let Some(piece) = call["function"]["name"].as_str() {
                name.push_str(piece);
            }
            if let Some(piece) = call["function"]["arguments"].as_str() {
                arguments.push_str(piece);
            }
        }
        let content = delta["content"]
            .as_str()
            .or_else(|| choice["text"].as_str())
            .unwrap_or("");
        let thinking = delta["reasoning_content"].as_str();
        if !content.is_empty() || thinking.is_some_and(|t| !t.is_empty()) {
            push_line(out, &Value::Object(self.piece(content, thinking, None)));
        }
    }

    /// Keeps what the final line needs from an answer or chunk.
    fn observe(&mut self, value: &Value) {
        if let Some(reason) = value["choices"][0]["finish_reason"].as_str() {
            self.finish_reason = Some(reason.to_string());
        }
        if value["usage"].is_object() {
            self.usage = Some(value["usage"].clone());
        }
        if value["timings"].is_object() {
            self.timings = Some(value["timings"].clone());
        }
    }

    /// The complete lines of `pending`, handled.
    fn drain_lines(&mut self, all: bool) -> Vec<u8> {
        let complete = if all {
            self.pending.len()
        } else {
            self.pending
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |end| end + 1)
        };
        let lines: Vec<u8> = self.pending.drain(..complete).collect();
        let mut out = Vec::new();
        for line in lines.split(|b| *b == b'\n') {
            self.stream_line(line, &mut out);
        }
        out
    }

    /// The whole (not streamed) answer.
    fn whole(&mut self) -> Vec<u8> {
        let answer: Value = match serde_json::from_slice(&self.pending) {
            Ok(answer) => answer,
            Err(_) => {
                let text = String::from_utf8_lossy(&self.pending).into_owned();
                return json!({"error": format!("the engine's answer is not JSON: {text}")})
                    .to_string()
                    .into_bytes();
            }
        };
        self.observe(&answer);
        let choice = &answer["choices"][0];
        let message = &choice["message"];
        let content = message["content"]
            .as_str()
            .or_else(|| choice["text"].as_str())
            .unwrap_or("");
        let calls = message["tool_calls"]
            .as_array()
            .filter(|calls| !calls.is_empty())
            .map(|calls| Value::Array(calls.iter().map(tool_call).collect()));
        let mut line = self.piece(content, message["reasoning_content"].as_str(), calls);
        self.done(&mut line);
        Value::Object(line).to_string().into_bytes()
    }
}

/// One OpenAI tool call in Ollama's shape: `{"function": {"name", "arguments": {…}}}`
/// (the arguments an object, not OpenAI's JSON text).
pub fn tool_call(call: &Value) -> Value {
    let function = &call["function"];
    ollama_call(
        function["name"].as_str().unwrap_or_default(),
        function["arguments"].as_str().unwrap_or("{}"),
    )
}

fn ollama_call(name: &str, arguments: &str) -> Value {
    let arguments = serde_json::from_str::<Value>(arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    json!({"function": {"name": name, "arguments": arguments}})
}

fn push_line(out: &mut Vec<u8>, value: &Value) {
    out.extend_from_slice(value.to_string().as_bytes());
    out.push(b'\n');
}

impl Rewrite for Reply {
    fn push(&mut self, data: Bytes) -> Transformed {
        self.pending.extend_from_slice(&data);
        if !self.stream {
            return Transformed::default();
        }
        let out = self.drain_lines(false);
        Transformed {
            data: Bytes::from(out),
            usage: self.usage.clone(),
        }
    }

    fn finish(&mut self) -> Transformed {
        self.finished = true;
        let data = if self.stream {
            let mut out = self.drain_lines(true);
            if !self.tool_calls.is_empty() {
                let calls = self
                    .tool_calls
                    .iter()
                    .map(|(name, arguments)| ollama_call(name, arguments))
                    .collect();
                push_line(
                    &mut out,
                    &Value::Object(self.piece("", None, Some(Value::Array(calls)))),
                );
            }
            let mut last = self.piece("", None, None);
            self.done(&mut last);
            push_line(&mut out, &Value::Object(last));
            out
        } else {
            self.whole()
        };
        Transformed {
            data: Bytes::from(data),
            usage: self.usage.clone(),
        }
    }

    fn holding(&self) -> bool {
        !self.finished
    }

    fn changes_length(&self) -> bool {
        true
    }
}

/// What turns a whole answer into the client's: its JSON and the `usage` to measure.
type Convert = Box<dyn FnOnce(&[u8]) -> (Value, Option<Value>) + Send + Sync>;

/// An answer read whole, then converted at its end (embeddings, engine errors).
pub struct Whole {
    body: Vec<u8>,
    convert: Option<Convert>,
}

impl Whole {
    /// Converts the whole answer with `convert`.
    pub fn new(
        convert: impl FnOnce(&[u8]) -> (Value, Option<Value>) + Send + Sync + 'static,
    ) -> Self {
        Self {
            body: Vec::new(),
            convert: Some(Box::new(convert)),
        }
    }
}

impl Rewrite for Whole {
    fn push(&mut self, data: Bytes) -> Transformed {
        self.body.extend_from_slice(&data);
        Transformed::default()
    }

    fn finish(&mut self) -> Transformed {
        match self.convert.take() {
            Some(convert) => {
                let (value, usage) = convert(&self.body);
                Transformed {
                    data: Bytes::from(value.to_string()),
                    usage,
                }
            }
            None => Transformed::default(),
        }
    }

    fn holding(&self) -> bool {
        self.convert.is_some()
    }

    fn changes_length(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(data: &[u8]) -> Vec<Value> {
        data.split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect()
    }

    const LAST: &str = r#"data: {"choices":[],"usage":{"prompt_tokens":31,"completion_tokens":3},"timings":{"prompt_n":30,"prompt_ms":12.5,"predicted_n":3,"predicted_ms":2.0}}"#;

    #[test]
    fn a_stream_becomes_ndjson_whose_last_line_has_the_engines_counters() {
        let mut reply = Reply::new(
            Kind::Chat,
            true,
            "smol:latest",
            Instant::now(),
            Duration::from_millis(5),
        );
        let sse = format!(
            "data: {{\"choices\":[{{\"delta\":{{\"role\":\"assistant\",\"content\":\"Hel\"}}}}]}}\n\ndata: {{\"choices\":[{{\"delta\":{{\"content\":\"lo\"}},\"finish_reason\":\"length\"}}]}}\n\n{LAST}\n\ndata: [DONE]\n\n"
        );
        // Split mid-line: the held line completes with the next read.
        let (a, b) = sse.split_at(30);
        let mut out = reply.push(Bytes::from(a.to_string())).data.to_vec();
        let pushed = reply.push(Bytes::from(b.to_string()));
        assert_eq!(pushed.usage.unwrap()["completion_tokens"], 3);
        out.extend_from_slice(&pushed.data);
        out.extend_from_slice(&reply.finish().data);
        let lines = lines(&out);
        assert_eq!(lines.len(), 3, "{lines:#?}");
        assert_eq!(lines[0]["message"]["content"], "Hel");
        assert_eq!(lines[0]["done"], false);
        assert_eq!(lines[0]["model"], "smol:latest");
        assert!(lines[0]["created_at"].as_str().unwrap().ends_with('Z'));
        let last = &lines[2];
        assert_eq!(last["done"], true);
        assert_eq!(last["done_reason"], "length");
        assert_eq!(last["prompt_eval_count"], 30);
        assert_eq!(last["prompt_eval_duration"], 12_500_000);
        assert_eq!(last["eval_count"], 3);
        assert_eq!(last["eval_duration"], 2_000_000);
        assert_eq!(last["load_duration"], 5_000_000);
        assert!(last["total_duration"].is_u64());
    }

    #[test]
    fn streamed_tool_calls_are_assembled_into_ollamas_shape() {
        let mut reply = Reply::new(Kind::Chat, true, "smol", Instant::now(), Duration::ZERO);
        let sse = concat!(
            r#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"get_weather","arguments":"{\"ci"}}]}}]}"#,
            "\n\n",
            r#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ty\":\"Paris\"}"}}]},"finish_reason":"tool_calls"}]}"#,
            "\n\n"
        );
        let mut out = reply.push(Bytes::from(sse)).data.to_vec();
        out.extend_from_slice(&reply.finish().data);
        let lines = lines(&out);
        assert_eq!(
            lines[0]["message"]["tool_calls"],
            json!([{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}])
        );
        assert_eq!(lines[1]["done_reason"], "stop");
    }

    #[test]
    fn a_whole_answer_is_one_object_for_generate() {
        let mut reply = Reply::new(
            Kind::Generate,
            false,
            "smol",
            Instant::now(),
            Duration::ZERO,
        );
        let answer = r#"{"choices":[{"text":"Hi there","finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":2},"timings":{"prompt_n":2,"prompt_ms":1.0,"predicted_n":2,"predicted_ms":1.5}}"#;
        assert!(reply.push(Bytes::from(answer)).data.is_empty());
        let done = reply.finish();
        assert_eq!(done.usage.unwrap()["prompt_tokens"], 2);
        let value: Value = serde_json::from_slice(&done.data).unwrap();
        assert_eq!(value["response"], "Hi there");
        assert_eq!(value["done"], true);
        assert_eq!(value["eval_duration"], 1_500_000);
        assert_eq!(value["context"], json!([]));
        assert!(value.get("message").is_none());
    }

    #[test]
    fn an_error_chunk_becomes_ollamas_error_line() {
        let mut reply = Reply::new(Kind::Chat, true, "smol", Instant::now(), Duration::ZERO);
        let out = reply.push(Bytes::from(
            "data: {\"error\":{\"code\":500,\"message\":\"boom\"}}\n\n",
        ));
        assert_eq!(lines(&out.data), vec![json!({"error": "boom"})]);
    }
}
