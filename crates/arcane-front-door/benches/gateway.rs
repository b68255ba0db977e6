//! Model gateway benchmark (`cargo bench -p arcane-front-door --bench gateway`, with
//! `LLAMA_SERVER` and `ARCANE_TEST_MODEL` set), each against its baseline in the same
//! run:
//!
//! 1. Cold request: the model not loaded → the first streamed chunk, through the
//!    gateway, vs starting `llama-server` by hand on a socket, waiting for `/health`,
//!    and sending the same request (target ratio ≤ 1.05).
//! 2. Warm routing: 4 models configured, `/tokenize` of the loaded one through the
//!    Core (client kept alive) vs straight to its engine's socket (target ≤ +0.15 ms p50).
//! 3. Swap under `max_loaded = 1`: a request to the other model (stop one, start the
//!    other, answer) vs a raw stop + start + the same request.
//! 4. The `command` kind's cold request: the same llama-server given as a `command`
//!    (`--host ${SOCKET} --model ${MODEL}`) vs started by hand (target ratio ≤ 1.05).
#![allow(clippy::print_stdout, clippy::disallowed_methods)]

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use arcane_core::supervised::SupervisedLauncher;
use arcane_core::Host;
use arcane_front_door::http::{engine_client, full, Deadlines, EngineAccess, EngineClient};
use arcane_gateway::{DeviceLimit, Gateway, KeepAlive, ModelSpec};
use arcane_localai::{EngineAddress, EngineConfig};
use http_body_util::BodyExt;
use hyper::body::Body;
use serde_json::json;
use support::Raw;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

const ARGS: [&str; 4] = ["--ctx-size", "1024", "--parallel", "1"];

fn spec(workspace: &Path, id: &str, server: &Path, model: &Path) -> ModelSpec {
    let config = support::llama_config(id, server, model, &ARGS);
    ModelSpec {
        keep_alive: KeepAlive::Never,
        // Never unloaded for idleness, yet swapped under `max_loaded = 1`.
        pin: Some(false),
        ..ModelSpec::new(id, SupervisedLauncher::new(workspace, config))
    }
}

/// The same server and model as a `command` model.
fn command_spec(workspace: &Path, id: &str, server: &Path, model: &Path) -> ModelSpec {
    let mut config = EngineConfig::new(arcane_localai::Engine::Command);
    config.id = id.into();
    config.executable = Some(server.to_path_buf());
    config.model = Some(model.to_path_buf());
    config.device = Some("cpu".into());
    config.template = ["--host", "${SOCKET}", "--model", "${MODEL}"]
        .into_iter()
        .chain(["--device", "none", "--gpu-layers", "0"])
        .chain(ARGS)
        .map(String::from)
        .collect();
    ModelSpec {
        answers_as_id: false,
        launcher: SupervisedLauncher::new(workspace, config),
        ..spec(workspace, id, server, model)
    }
}

/// A gateway over `ids` (each the same model file) behind HTTP: its URL and token.
async fn gateway(
    workspace: &Path,
    ids: &[&str],
    max_loaded: Option<usize>,
    server: &Path,
    model: &Path,
) -> (Host, String, String) {
    let specs = ids
        .iter()
        .map(|id| spec(workspace, id, server, model))
        .collect();
    gateway_of(specs, max_loaded).await
}

/// A gateway over `specs` behind HTTP: its URL and token.
async fn gateway_of(specs: Vec<ModelSpec>, max_loaded: Option<usize>) -> (Host, String, String) {
    let limits = HashMap::from([(
        "cpu".to_string(),
        DeviceLimit {
            max_loaded,
            memory: None,
        },
    )]);
    support::serve_gateway(Gateway::new(specs, limits)).await
}

/// Sends a streamed one-token chat naming `model` and returns the time to the first
/// body chunk (the whole answer is then read).
async fn first_chunk(client: &EngineClient, access: &EngineAccess, model: &str) -> Duration {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "stream": true})
        .to_string();
    let request = access
        .request(hyper::Method::POST, "/v1/chat/completions")
        .header("content-type", "application/json")
        .body(full(body))
        .unwrap();
    let started = Instant::now();
    let response = client
        .send_to(
            access,
            request,
            Deadlines::GENERATION,
            arcane_core::Peer::Host,
        )
        .await
        .expect("request");
    assert!(response.status().is_success(), "{}", response.status());
    let mut body = response.into_body();
    let first = loop {
        match body.frame().await {
            Some(Ok(frame)) if frame.is_data() => break started.elapsed(),
            Some(Ok(_)) => continue,
            _ => panic!("the stream ended before a chunk"),
        }
    };
    while let Some(frame) = body.frame().await {
        frame.expect("the rest of the stream");
    }
    let _ = body.is_end_stream();
    first
}

async fn cold(server: &Path, model: &Path, command: bool) {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::create_dir(workspace.path().join(".arcane")).unwrap();
    let spec = if command { command_spec } else { spec };
    let specs = vec![spec(workspace.path(), "m0", server, model)];
    let (host, url, token) = gateway_of(specs, None).await;
    let client = engine_client();
    let core = support::core_access(&url, &token);
    let socket: PathBuf = workspace.path().join("raw.sock");
    let raw_access = EngineAccess {
        address: EngineAddress::Unix(socket.clone()),
        key: None,
    };
    let (mut through, mut by_hand) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        through.push(first_chunk(&client, &core, "m0").await);
        support::rpc(&client, &url, &token, "models.unload", "m0").await;
        let started = Instant::now();
        let raw = Raw::start(server, model, &socket, &ARGS).await;
        let _ = first_chunk(&client, &raw_access, "m0").await;
        by_hand.push(started.elapsed());
        raw.stop();
    }
    let (t, r) = (median(through), median(by_hand));
    println!(
        "cold request to the first streamed chunk (median of 3): through the gateway{} {:.0} ms | llama-server started by hand {:.0} ms | ratio {:.3}x (target <= 1.05)",
        if command { " as a `command`" } else { "" },
        ms(t),
        ms(r),
        t.as_secs_f64() / r.as_secs_f64()
    );
    host.close().await.unwrap();
}

async fn warm(server: &Path, model: &Path) {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::create_dir(workspace.path().join(".arcane")).unwrap();
    let (host, url, token) = gateway(
        workspace.path(),
        &["m0", "m1", "m2", "m3"],
        None,
        server,
        model,
    )
    .await;
    let client = engine_client();
    support::rpc(&client, &url, &token, "models.load", "m0").await;
    let engine = EngineAccess {
        address: EngineAddress::Unix(arcane_workspace::layout::engine_socket(
            workspace.path(),
            "m0",
        )),
        key: None,
    };
    // The client kept alive to the Core, as pooling clients are.
    let core = support::core_access(&url, &token);
    let stream = core.address.connect().await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let body = r#"{"model":"m0","content":"hello world"}"#;
    let (mut direct, mut routed) = (Vec::new(), Vec::new());
    for round in 0..420 {
        let request = engine
            .request(hyper::Method::POST, "/tokenize")
            .header("content-type", "application/json")
            .body(full(body))
            .unwrap();
        let started = Instant::now();
        let response = client
            .send_to(
                &engine,
                request,
                Deadlines::QUICK,
                arcane_core::Peer::Engine,
            )
            .await
            .unwrap();
        let _ = response.into_body().collect().await.unwrap();
        let straight = started.elapsed();
        let request = core
            .request(hyper::Method::POST, "/tokenize")
            .header("content-type", "application/json")
            .body(full(body))
            .unwrap();
        let started = Instant::now();
        sender.ready().await.unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert!(response.status().is_success());
        let _ = response.into_body().collect().await.unwrap();
        if round >= 20 {
            direct.push(straight);
            routed.push(started.elapsed());
        }
    }
    let (d, r) = (median(direct), median(routed));
    println!(
        "warm routing with 4 models configured (/tokenize, 400 requests each): engine socket p50 {:.3} ms | through the gateway p50 {:.3} ms | added {:+.3} ms (target <= +0.15 ms)",
        ms(d),
        ms(r),
        ms(r) - ms(d)
    );
    host.close().await.unwrap();
}

async fn swap(server: &Path, model: &Path) {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::create_dir(workspace.path().join(".arcane")).unwrap();
    let (host, url, token) = gateway(workspace.path(), &["a", "b"], Some(1), server, model).await;
    let client = engine_client();
    let core = support::core_access(&url, &token);
    first_chunk(&client, &core, "a").await;
    let mut swaps = Vec::new();
    for model_id in ["b", "a", "b", "a"] {
        let started = Instant::now();
        first_chunk(&client, &core, model_id).await;
        swaps.push(started.elapsed());
    }
    host.close().await.unwrap();
    let sockets = [
        workspace.path().join("ra.sock"),
        workspace.path().join("rb.sock"),
    ];
    let mut raw = Raw::start(server, model, &sockets[0], &ARGS).await;
    let mut raws = Vec::new();
    for index in [1, 0, 1, 0] {
        let started = Instant::now();
        raw.stop();
        raw = Raw::start(server, model, &sockets[index], &ARGS).await;
        let access = EngineAccess {
            address: EngineAddress::Unix(sockets[index].clone()),
            key: None,
        };
        first_chunk(&client, &access, "x").await;
        raws.push(started.elapsed());
    }
    raw.stop();
    let (s, r) = (median(swaps), median(raws));
    println!(
        "swap under max_loaded = 1 (stop one, start the other, first chunk; median of 4): gateway {:.0} ms | raw stop + start {:.0} ms | ratio {:.3}x",
        ms(s),
        ms(r),
        s.as_secs_f64() / r.as_secs_f64()
    );
}

fn main() {
    let (Some(server), Some(model)) = (
        std::env::var_os("LLAMA_SERVER"),
        std::env::var_os("ARCANE_TEST_MODEL"),
    ) else {
        println!("gateway: skipped (set LLAMA_SERVER and ARCANE_TEST_MODEL)");
        return;
    };
    let (server, model) = (PathBuf::from(server), PathBuf::from(model));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        cold(&server, &model, false).await;
        cold(&server, &model, true).await;
        warm(&server, &model).await;
        swap(&server, &model).await;
    });
}
