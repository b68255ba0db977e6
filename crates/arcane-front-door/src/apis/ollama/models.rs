//! `GET /api/tags`, `GET /api/ps` and `POST /api/show`: the gateway's models described
//! as Ollama describes its own, from what the gateway knows of each ([`ModelFacts`])
//! and the model file's GGUF header (read with the registry's bounded reader, never
//! the tensor data).
//!
//! * `digest` is the SHA-256 `arcane model add` registered for the file; a file that is
//!   not registered has no `digest` (hashing a many-gigabyte file per listing is not
//!   done, and a made-up digest would be dishonest).
//! * `size` is the file's size; in `/api/ps` it is the engine's resident memory when
//!   known (else the gateway's estimate), and `size_vram` is 0 on the CPU.
//! * `expires_at` is when the gateway's `keep_alive` unloads the model.
//! * `template` is the model's chat template as the file carries it (Jinja, which the
//!   engine applies, not Ollama's Go template); `parameters` is empty (the engine's
//!   defaults apply).

use std::path::Path;
use std::time::{Duration, SystemTime};

use arcane_registry::GgufInfo;
use hyper::{Response, StatusCode};
use serde_json::{json, Map, Value};

use super::{names, OllamaError};
use crate::passthrough::ModelFacts;
use arcane_core::upstream::HttpBody;

/// What is read from a model file: its size, modification time and GGUF header.
struct FileFacts {
    size: u64,
    modified: Option<SystemTime>,
    gguf: Option<GgufInfo>,
}

/// Reads the file's facts on a blocking thread (the header read is file I/O).
async fn file_facts(file: Option<&Path>) -> Option<FileFacts> {
    let file = file?.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let meta = std::fs::metadata(&file).ok()?;
        Some(FileFacts {
            size: meta.len(),
            modified: meta.modified().ok(),
            gguf: arcane_registry::read_gguf(&file).ok(),
        })
    })
    .await
    .ok()
    .flatten()
}

/// A parameter count as Ollama writes it (`134.52M`, `7.2B`).
pub fn parameter_size(count: u64) -> String {
    let count = count as f64;
    if count >= 1e9 {
        format!("{:.1}B", count / 1e9)
    } else if count >= 1e6 {
        format!("{:.2}M", count / 1e6)
    } else {
        format!("{:.0}K", count / 1e3)
    }
}

/// Ollama's `details` of a model.
fn details(file: Option<&FileFacts>) -> Value {
    let gguf = file.and_then(|f| f.gguf.as_ref());
    let family = gguf
        .and_then(|g| g.architecture.clone())
        .unwrap_or_default();
    json!({
        "parent_model": "",
        "format": if gguf.is_some() { "gguf" } else { "" },
        "family": family,
        "families": if family.is_empty() { Value::Null } else { json!([family]) },
        "parameter_size": gguf
            .and_then(|g| g.parameter_count.map(parameter_size).or_else(|| g.size_label.clone()))
            .unwrap_or_default(),
        "quantization_level": gguf.and_then(|g| g.quantization.clone()).unwrap_or_default(),
    })
}

/// The fields `/api/tags` and `/api/ps` share.
fn entry(facts: &ModelFacts, file: Option<&FileFacts>) -> Map<String, Value> {
    let name = names::listed(&facts.id);
    let mut entry = Map::new();
    entry.insert("name".into(), json!(name));
    entry.insert("model".into(), json!(name));
    entry.insert("size".into(), json!(file.map_or(0, |f| f.size)));
    if let Some(digest) = &facts.digest {
        entry.insert("digest".into(), json!(digest));
    }
    entry.insert("details".into(), details(file));
    entry
}

/// `GET /api/tags`: every model.
pub async fn tags(catalog: &[ModelFacts]) -> Response<HttpBody> {
    let mut models = Vec::with_capacity(catalog.len());
    for facts in catalog {
        let file = file_facts(facts.file.as_deref()).await;
        let mut entry = entry(facts, file.as_ref());
        let modified = file
            .as_ref()
            .and_then(|f| f.modified)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        entry.insert(
            "modified_at".into(),
            json!(arcane_report::time::format_rfc3339(modified)),
        );
        models.push(Value::Object(entry));
    }
    crate::http::json_response(StatusCode::OK, &json!({ "models": models }))
}

/// When a loaded model unloads: after its idle clock, or its `keep_alive` after the
/// requests in flight; "never" (`keep_alive` -1) is far in the future, as Ollama
/// writes it.
pub fn expires_at(facts: &ModelFacts, now: SystemTime) -> String {
    let after = match facts.unloads_in {
        Some(seconds) => Duration::from_secs_f64(seconds.max(0.0)),
        None if facts.keep_alive < 0.0 => Duration::from_secs(300 * 365 * 86_400),
        None => Duration::from_secs_f64(facts.keep_alive.clamp(0.0, 1e9)),
    };
    arcane_report::time::format_rfc3339(now + after)
}

/// `GET /api/ps`: the loaded models.
pub async fn ps(catalog: &[ModelFacts]) -> Response<HttpBody> {
    let now = SystemTime::now();
    let mut models = Vec::new();
    for facts in catalog.iter().filter(|f| f.loaded) {
        let file = file_facts(facts.file.as_deref()).await;
        let mut entry = entry(facts, file.as_ref());
        let size = facts
            .resident_bytes
            .or((facts.memory > 0).then_some(facts.memory))
            .unwrap_or_else(|| file.as_ref().map_or(0, |f| f.size));
        let on_cpu = facts.device == "cpu" || facts.device == "external";
        entry.insert("size".into(), json!(size));
        entry.insert("size_vram".into(), json!(if on_cpu { 0 } else { size }));
        entry.insert("expires_at".into(), json!(expires_at(facts, now)));
        models.push(Value::Object(entry));
    }
    crate::http::json_response(StatusCode::OK, &json!({ "models": models }))
}

/// What a model can do, as `/api/show` lists it: `embedding` for an engine started
/// with `--embeddings` (llama-server then serves only embeddings), else `completion`,
/// with `tools` when its chat template mentions tools and `vision` with a projector.
pub fn capabilities(args: &[String], template: Option<&str>) -> Vec<&'static str> {
    if arcane_workspace::serves_only_vectors(args) {
        return vec!["embedding"];
    }
    let mut capabilities = vec!["completion"];
    if template.is_some_and(|t| t.contains("tools")) {
        capabilities.push("tools");
    }
    if args
        .iter()
        .any(|a| a == "--mmproj" || a.starts_with("--mmproj="))
    {
        capabilities.push("vision");
    }
    capabilities
}

/// `POST /api/show`: one model's details, header facts and capabilities.
pub async fn show(facts: &ModelFacts, asked: &str) -> Result<Response<HttpBody>, OllamaError> {
    let file = file_facts(facts.file.as_deref()).await;
    let gguf = file.as_ref().and_then(|f| f.gguf.as_ref());
    let mut info = Map::new();
    if let Some(gguf) = gguf {
        let arch = gguf.architecture.clone().unwrap_or_default();
        info.insert("general.architecture".into(), json!(arch));
        if let Some(name) = &gguf.name {
            info.insert("general.name".into(), json!(name));
        }
        if let Some(count) = gguf.parameter_count {
            info.insert("general.parameter_count".into(), json!(count));
        }
        if let Some(file_type) = gguf.file_type {
            info.insert("general.file_type".into(), json!(file_type));
        }
        // The context it is (or will be) served with, which a client may send back as
        // `num_ctx`: its arguments' when they set one, else the model's own.
        let served = arcane_workspace::request_context(&facts.args).or(gguf.context_length);
        for (key, value) in [
            ("context_length", served),
            ("block_count", gguf.block_count),
            ("embedding_length", gguf.embedding_length),
            ("attention.head_count", gguf.head_count),
            ("attention.head_count_kv", gguf.head_count_kv),
        ] {
            if let Some(value) = value {
                info.insert(format!("{arch}.{key}"), json!(value));
            }
        }
    }
    let template = gguf.and_then(|g| g.chat_template.clone());
    let modified = file
        .as_ref()
        .and_then(|f| f.modified)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let from = facts
        .file
        .as_deref()
        .map(|f| f.display().to_string())
        .unwrap_or_default();
    let body = json!({
        "license": "",
        "modelfile": format!("# Served by Arcane as `{}`; its [[model]] table in arcane.toml is its configuration.\nFROM {from}\n", facts.id),
        "parameters": "",
        "template": template.clone().unwrap_or_default(),
        "details": details(file.as_ref()),
        "model_info": info,
        "capabilities": capabilities(&facts.args, template.as_deref()),
        "modified_at": arcane_report::time::format_rfc3339(modified),
        "name": asked,
    });
    Ok(crate::http::json_response(StatusCode::OK, &body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::ollama::names::tests::facts;

    #[test]
    fn sizes_capabilities_and_expiry_read_as_ollamas() {
        assert_eq!(parameter_size(134_515_008), "134.52M");
        assert_eq!(parameter_size(7_241_732_096), "7.2B");
        assert_eq!(
            capabilities(&[], Some("{% if tools %}")),
            ["completion", "tools"]
        );
        assert_eq!(capabilities(&["--embeddings".into()], None), ["embedding"]);
        assert_eq!(
            capabilities(&["--mmproj".into(), "p.gguf".into()], None),
            ["completion", "vision"]
        );
        let mut model = facts("smol", &[]);
        model.unloads_in = Some(60.0);
        let epoch = SystemTime::UNIX_EPOCH;
        assert_eq!(expires_at(&model, epoch), "1970-01-01T00:01:00.000Z");
        model.unloads_in = None;
        model.keep_alive = -1.0;
        assert!(
            expires_at(&model, epoch).starts_with("2269-"),
            "{}",
            expires_at(&model, epoch)
        );
    }
}
