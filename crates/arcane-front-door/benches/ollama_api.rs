//! Ollama API benchmark (`cargo bench -p arcane-front-door --bench ollama_api`, with
//! `LLAMA_SERVER` and `ARCANE_TEST_MODEL` set): the translation's cost against the
//! same request on OpenAI's path, through the same gateway, in the same run,
//! alternated so both see the same engine state:
//!
//! 1. Whole answers: `POST /api/chat` (`stream: false`) vs `POST /v1/chat/completions`
//!    with the same messages and limits: the added p50 in ms.
//! 2. Streams: the same two, streamed (NDJSON vs SSE), the same tokens (greedy,
//!    seeded): the throughput ratio (OpenAI path time / Ollama path time; 1.0 = no cost).
#![allow(clippy::print_stdout, clippy::disallowed_methods)]

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use arcane_core::supervised::SupervisedLauncher;
use arcane_front_door::http::{engine_client, full, Deadlines, EngineAccess, EngineClient};
use arcane_gateway::{DeviceLimit, Gateway, KeepAlive, ModelSpec};
use http_body_util::BodyExt;
use serde_json::{json, Value};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn spec(workspace: &Path, server: &Path, model: &Path) -> ModelSpec {
    let config = support::llama_config(
        "smol",
        server,
        model,
        &["--ctx-size", "1024", "--parallel", "1"],
    );
    ModelSpec {
        keep_alive: KeepAlive::Never,
        ..ModelSpec::new("smol", SupervisedLauncher::new(workspace, config))
    }
}

/// Sends `body` to `path` and reads the whole answer: the time it took.
async fn timed(client: &EngineClient, core: &EngineAccess, path: &str, body: &Value) -> Duration {
    let request = core
        .request(hyper::Method::POST, path)
        .header("content-type", "application/json")
        .body(full(body.to_string()))
        .unwrap();
    let started = Instant::now();
    let response = client
        .send_to(
            core,
            request,
            Deadlines::GENERATION,
            arcane_core::Peer::Host,
        )
        .await
        .expect("request");
    assert!(
        response.status().is_success(),
        "{path}: {}",
        response.status()
    );
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert!(!bytes.is_empty());
    started.elapsed()
}

/// Alternates the two requests `rounds` times (after 3 unmeasured): their medians.
async fn compare(
    client: &EngineClient,
    core: &EngineAccess,
    ollama: &Value,
    openai: &Value,
    rounds: usize,
) -> (Duration, Duration) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for round in 0..rounds + 3 {
        let o = timed(client, core, "/api/chat", ollama).await;
        let v = timed(client, core, "/v1/chat/completions", openai).await;
        if round >= 3 {
            a.push(o);
            b.push(v);
        }
    }
    (median(a), median(b))
}

fn main() {
    let (Some(server), Some(model)) = (
        std::env::var_os("LLAMA_SERVER"),
        std::env::var_os("ARCANE_TEST_MODEL"),
    ) else {
        println!("ollama_api: skipped (set LLAMA_SERVER and ARCANE_TEST_MODEL)");
        return;
    };
    let (server, model) = (PathBuf::from(server), PathBuf::from(model));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let workspace = tempfile::tempdir().unwrap();
        std::fs::create_dir(workspace.path().join(".arcane")).unwrap();
        let limits = HashMap::from([("cpu".to_string(), DeviceLimit::default())]);
        let gateway = Gateway::new(vec![spec(workspace.path(), &server, &model)], limits);
        let (host, url, token) = support::serve_gateway(gateway).await;
        let core = support::core_access(&url, &token);
        let client = engine_client();
        let messages = json!([{"role": "user", "content": "Name three colours."}]);

        let ollama = json!({"model": "smol", "messages": messages, "stream": false, "options": {"num_predict": 4, "temperature": 0, "seed": 1}});
        let openai = json!({"model": "smol", "messages": messages, "max_tokens": 4, "temperature": 0, "seed": 1});
        let (o, v) = compare(&client, &core, &ollama, &openai, 30).await;
        println!(
            "whole answer, 4 tokens (median of 30): /v1/chat/completions p50 {:.2} ms | /api/chat p50 {:.2} ms | added {:+.2} ms",
            ms(v),
            ms(o),
            ms(o) - ms(v)
        );

        let ollama = json!({"model": "smol", "messages": messages, "stream": true, "options": {"num_predict": 64, "temperature": 0, "seed": 1}});
        let openai = json!({"model": "smol", "messages": messages, "stream": true, "max_tokens": 64, "temperature": 0, "seed": 1});
        let (o, v) = compare(&client, &core, &ollama, &openai, 10).await;
        println!(
            "streamed, 64 tokens (median of 10): SSE {:.1} ms | NDJSON {:.1} ms | throughput ratio {:.3}x (Ollama path / OpenAI path; 1.0 = no cost)",
            ms(v),
            ms(o),
            ms(v) / ms(o)
        );
        host.close().await.unwrap();
    });
}
