//! Admission benchmark (`cargo bench -p arcane-front-door --bench admission`, with
//! `LLAMA_SERVER` and `ARCANE_TEST_MODEL` set for the second part), each against its
//! baseline in the same run:
//!
//! 1. What admission adds to a request on an idle host, step by step in process: an
//!    application key turned into its principal (a `stat` of the keys file, a SHA-256,
//!    a map lookup) against the workspace token's comparison, the scope table, and a
//!    slot of the model's queue taken and given back against a bare semaphore's
//!    (target: the sum ≤ +0.05 ms).
//! 2. Two applications on one model with `parallel = 1`: A keeps 16 requests in flight,
//!    B sends one at a time. B's median latency under A's flood ÷ B's median alone
//!    (target ≤ 3), beside the same flood with B sending under A's own key, where
//!    nothing takes turns (first come, first served, as every request was before).
#![allow(clippy::print_stdout, clippy::disallowed_methods)]

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arcane_core::keys::{self, KeyBook, Priority, Scope};
use arcane_core::supervised::SupervisedLauncher;
use arcane_core::Host;
use arcane_front_door::http::{engine_client, full, Deadlines, EngineAccess};
use arcane_gateway::admission::Admission;
use arcane_gateway::{DeviceLimit, Gateway, KeepAlive, ModelSpec};
use http_body_util::BodyExt;
use serde_json::json;

/// The mean time of one `step`, over `rounds` runs.
fn per_call(rounds: u32, mut step: impl FnMut()) -> Duration {
    let started = Instant::now();
    for _ in 0..rounds {
        step();
    }
    started.elapsed() / rounds
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

async fn idle_overhead() {
    const ROUNDS: u32 = 200_000;
    let workspace = tempfile::tempdir().unwrap();
    let made = keys::store::add(
        workspace.path(),
        "app",
        Scope::Inference,
        Priority::Normal,
        None,
    )
    .unwrap();
    let book = KeyBook::new(workspace.path());
    let token = arcane_core::endpoint::new_token().unwrap();
    let presented = token.clone();
    let compare = per_call(ROUNDS, || {
        std::hint::black_box(arcane_core::endpoint::constant_time_eq(
            presented.as_bytes(),
            token.as_bytes(),
        ));
    });
    let lookup = per_call(ROUNDS / 10, || {
        std::hint::black_box(book.principal(&made.key).unwrap());
    });
    let principal = book.principal(&made.key).unwrap();
    let lookup_path =
        arcane_front_door::router::Lookup::Found(arcane_front_door::router::Handler::Engine);
    let scope = per_call(ROUNDS, || {
        let _ = std::hint::black_box(arcane_front_door::scopes::permit(
            &principal,
            lookup_path,
            &hyper::Method::POST,
            "/v1/chat/completions",
        ));
    });
    let admission = Admission::new(4, 512);
    let name = Arc::clone(&principal.name);
    let started = Instant::now();
    for _ in 0..ROUNDS {
        let mut permit = admission
            .admit(&name, Priority::Normal, None)
            .await
            .unwrap();
        permit.serving();
        drop(permit);
    }
    let queue = started.elapsed() / ROUNDS;
    let semaphore = Arc::new(tokio::sync::Semaphore::new(4));
    let started = Instant::now();
    for _ in 0..ROUNDS {
        drop(semaphore.clone().acquire_owned().await.unwrap());
    }
    let bare = started.elapsed() / ROUNDS;
    let added = lookup.saturating_sub(compare) + scope + queue;
    println!(
        "admission on an idle host, per request: key → principal {:.2} µs (workspace token compare {:.3} µs) | scope table {:.3} µs | queue slot taken and given back {:.3} µs (a bare semaphore {:.3} µs, ratio {:.1}x) | added in all {:.4} ms (target <= 0.05 ms)",
        micros(lookup),
        micros(compare),
        micros(scope),
        micros(queue),
        micros(bare),
        queue.as_secs_f64() / bare.as_secs_f64().max(1e-12),
        added.as_secs_f64() * 1000.0,
    );
}

/// A gateway of one model with `parallel = 1` behind HTTP with `workspace`'s keys.
async fn serve(workspace: &Path, server: &Path, model: &Path) -> (Host, String, Arc<Gateway>) {
    let config = support::llama_config("m", server, model, &["--ctx-size", "2048", "-np", "1"]);
    let spec = ModelSpec {
        keep_alive: KeepAlive::Never,
        parallel: 1,
        ..ModelSpec::new("m", SupervisedLauncher::new(workspace, config))
    };
    let gateway = Gateway::new(vec![spec], HashMap::<String, DeviceLimit>::new());
    let (host, url, _) =
        support::serve_keyed(gateway.clone(), Arc::new(KeyBook::new(workspace))).await;
    (host, url, gateway)
}

/// One chat of 16 tokens with `key`; its latency.
async fn chat(url: &str, key: &str) -> Duration {
    let access: EngineAccess = support::core_access(url, key);
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "Count to twenty."}], "max_tokens": 16, "ignore_eos": true})
        .to_string();
    let request = access
        .request(hyper::Method::POST, "/v1/chat/completions")
        .header("content-type", "application/json")
        .body(full(body))
        .unwrap();
    let started = Instant::now();
    let response = engine_client()
        .send_to(
            &access,
            request,
            Deadlines::GENERATION,
            arcane_core::Peer::Host,
        )
        .await
        .expect("chat");
    assert!(response.status().is_success(), "{}", response.status());
    response.into_body().collect().await.unwrap();
    started.elapsed()
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// B's median over `rounds` sequential chats with `b_key` while A keeps 16 in flight
/// with `a_key` (none: alone).
async fn b_median(
    url: &str,
    gateway: &Gateway,
    a_key: Option<&str>,
    b_key: &str,
    rounds: usize,
) -> Duration {
    let stop = Arc::new(AtomicBool::new(false));
    let mut flood = Vec::new();
    if let Some(a_key) = a_key {
        for _ in 0..16 {
            let (url, key, stop) = (url.to_string(), a_key.to_string(), Arc::clone(&stop));
            flood.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    chat(&url, &key).await;
                }
            }));
        }
        // A's 16 fill the slot and the queue first.
        let deadline = Instant::now() + Duration::from_secs(60);
        while gateway.rows()[0]["queued"].as_u64().unwrap_or(0) < 15 {
            assert!(Instant::now() < deadline, "A's requests never queued");
            tokio::task::yield_now().await;
        }
    }
    let mut samples = Vec::new();
    for _ in 0..rounds {
        samples.push(chat(url, b_key).await);
    }
    stop.store(true, Ordering::Relaxed);
    for task in flood {
        task.await.unwrap();
    }
    median(samples)
}

async fn flood(server: &Path, model: &Path) {
    let workspace = tempfile::tempdir().unwrap();
    let a = keys::store::add(
        workspace.path(),
        "a",
        Scope::Inference,
        Priority::Normal,
        None,
    )
    .unwrap();
    let b = keys::store::add(
        workspace.path(),
        "b",
        Scope::Inference,
        Priority::Normal,
        None,
    )
    .unwrap();
    let (host, url, gateway) = serve(workspace.path(), server, model).await;
    chat(&url, &b.key).await;
    let alone = b_median(&url, &gateway, None, &b.key, 9).await;
    let shared = b_median(&url, &gateway, Some(&a.key), &b.key, 9).await;
    let same_key = b_median(&url, &gateway, Some(&a.key), &a.key, 3).await;
    let ratio = |d: Duration| d.as_secs_f64() / alone.as_secs_f64();
    println!(
        "two applications, parallel = 1, A keeping 16 in flight: B's median alone {:.0} ms | under A's flood {:.0} ms, ratio {:.2}x (target <= 3) | B under A's own key, first come first served {:.0} ms, ratio {:.1}x",
        alone.as_secs_f64() * 1000.0,
        shared.as_secs_f64() * 1000.0,
        ratio(shared),
        same_key.as_secs_f64() * 1000.0,
        ratio(same_key),
    );
    host.close().await.unwrap();
}

#[tokio::main]
async fn main() {
    idle_overhead().await;
    let (Some(server), Some(model)) = (
        std::env::var_os("LLAMA_SERVER"),
        std::env::var_os("ARCANE_TEST_MODEL"),
    ) else {
        println!("two applications: skipped (set LLAMA_SERVER and ARCANE_TEST_MODEL)");
        return;
    };
    flood(Path::new(&server), Path::new(&model)).await;
}
