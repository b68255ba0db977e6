//! Overload benchmark (`cargo bench -p arcane-front-door --bench overload`, with
//! `LLAMA_SERVER` and `ARCANE_TEST_MODEL` set): the same burst of concurrent streamed
//! chats against llama-server started by hand on a socket, then against the same
//! server as a gateway model behind the Core (its readiness watchdog probing it every
//! 5 s, as in production), each for `ARCANE_BENCH_SECONDS` (default 120) with
//! `ARCANE_BENCH_CLIENTS` clients (default 32; on 2 cores that keeps every core busy
//! and the engine's HTTP threads queued). It prints, each way, the requests answered,
//! the failed ones and p50/p99, how often the watchdog found the engine busy and how
//! often its engine died, and says `met` when Arcane failed no more requests than the
//! engine alone: an engine that is merely slow must never be taken for a dead one (the
//! watchdog once killed a busy engine and failed most requests of a burst).
//!
//! `ARCANE_BENCH_PROBE_MS` shortens the watchdog's probe (default 5000): on a machine
//! where the engine's `/health` stays fast under this burst, a probe of a few tens of
//! milliseconds puts the watchdog where an overloaded machine puts a 5 s probe.
#![allow(clippy::print_stdout, clippy::disallowed_methods)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arcane_core::supervised::SupervisedLauncher;
use arcane_core::Host;
use arcane_front_door::http::{engine_client, full, Deadlines, EngineAccess, EngineClient};
use arcane_gateway::{DeviceLimit, Gateway, KeepAlive, ModelSpec};

mod support;
use http_body_util::BodyExt;
use serde_json::json;

const ARGS: [&str; 4] = ["--ctx-size", "2048", "--parallel", "4"];

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What one burst did.
#[derive(Default)]
struct Burst {
    answered: Vec<Duration>,
    failed: usize,
    first_failure: Option<String>,
}

impl Burst {
    fn line(&mut self, name: &str) -> String {
        let total = self.answered.len() + self.failed;
        let p50 = percentile(&mut self.answered, 0.50);
        let p99 = percentile(&mut self.answered, 0.99);
        format!(
            "{name:<22} {total:>6} requests, {:>6} failed, p50 {:>8.0} ms, p99 {:>8.0} ms{}",
            self.failed,
            ms(p50),
            ms(p99),
            self.first_failure
                .as_ref()
                .map(|f| format!(" (first failure: {f})"))
                .unwrap_or_default()
        )
    }
}

/// One streamed chat, read to its end: its time, or why it failed (a status, a
/// transport error, or an error frame in the stream).
async fn chat(client: &EngineClient, access: &EngineAccess) -> Result<Duration, String> {
    let body =
        json!({"model": "m", "messages": [{"role": "user", "content": "Tell me about the sea."}],
                      "max_tokens": 24, "stream": true})
        .to_string();
    let request = access
        .request(hyper::Method::POST, "/v1/chat/completions")
        .header("content-type", "application/json")
        .body(full(body))
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let response = client
        .send_to(
            access,
            request,
            Deadlines::GENERATION,
            arcane_core::Peer::Host,
        )
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let text = String::from_utf8_lossy(&bytes);
    if !status.is_success() {
        return Err(format!(
            "{status}: {}",
            text.chars().take(160).collect::<String>()
        ));
    }
    if text.contains("\"error\"") || !text.contains("[DONE]") {
        return Err(format!(
            "cut: {}",
            text.chars().take(160).collect::<String>()
        ));
    }
    Ok(started.elapsed())
}

/// `clients` tasks sending chats to `access` back to back for `seconds`.
async fn burst(access: EngineAccess, clients: u64, seconds: u64) -> Burst {
    let client = Arc::new(engine_client());
    let until = Instant::now() + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, access) = (Arc::clone(&client), access.clone());
            tokio::spawn(async move {
                let mut burst = Burst::default();
                while Instant::now() < until {
                    match chat(&client, &access).await {
                        Ok(took) => burst.answered.push(took),
                        Err(why) => {
                            burst.failed += 1;
                            burst.first_failure.get_or_insert(why);
                        }
                    }
                }
                burst
            })
        })
        .collect();
    let mut all = Burst::default();
    for task in tasks {
        let part = task.await.expect("a client task");
        all.answered.extend(part.answered);
        all.failed += part.failed;
        if all.first_failure.is_none() {
            all.first_failure = part.first_failure;
        }
    }
    all
}

/// The same server as the one model of a gateway behind the Core: its access (the
/// Core's URL and token) and the host.
async fn gateway(
    workspace: &Path,
    server: &Path,
    model: &Path,
    probe: Duration,
    observer: Arc<Counts>,
) -> (Host, EngineAccess) {
    let mut config = support::llama_config("m", server, model, &ARGS);
    config.watchdog_interval = probe;
    let spec = ModelSpec {
        keep_alive: KeepAlive::Never,
        ..ModelSpec::new("m", SupervisedLauncher::new(workspace, config))
    };
    let gateway = Gateway::new(vec![spec], HashMap::<String, DeviceLimit>::new());
    let (host, url, token) = support::serve_observed(gateway, Some(observer)).await;
    // Warm: `models.load` answers once the model is ready.
    support::rpc(&engine_client(), &url, &token, "models.load", "m").await;
    (host, support::core_access(&url, &token))
}

/// How often the watchdog judged the engine busy, and how often the engine died.
#[derive(Default)]
struct Counts {
    busy: std::sync::atomic::AtomicUsize,
    died: std::sync::atomic::AtomicUsize,
}

impl arcane_report::EventSink for Counts {
    fn emit(&self, event: arcane_report::Event) {
        use std::sync::atomic::Ordering;
        match event.kind.as_str() {
            "local-ai.engine.busy" => self.busy.fetch_add(1, Ordering::Relaxed),
            "local-ai.model.error" => self.died.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (Some(server), Some(model)) = (
        std::env::var_os("LLAMA_SERVER").map(PathBuf::from),
        std::env::var_os("ARCANE_TEST_MODEL").map(PathBuf::from),
    ) else {
        println!("overload: skipped (set LLAMA_SERVER and ARCANE_TEST_MODEL)");
        return;
    };
    let seconds = setting("ARCANE_BENCH_SECONDS", 120).min(120);
    let clients = setting("ARCANE_BENCH_CLIENTS", 32);
    let probe = Duration::from_millis(setting("ARCANE_BENCH_PROBE_MS", 5000).max(1));
    println!(
        "overload: {clients} clients streaming chats for {seconds} s each way (watchdog probe {} ms)",
        probe.as_millis()
    );

    let scratch = tempfile::tempdir().unwrap();
    let socket = scratch.path().join("raw.sock");
    let raw = support::Raw::start(&server, &model, &socket, &ARGS).await;
    let mut direct = burst(support::unix(&socket), clients, seconds).await;
    raw.stop();

    let workspace = tempfile::tempdir().unwrap();
    let counts = Arc::new(Counts::default());
    let (host, access) = gateway(workspace.path(), &server, &model, probe, counts.clone()).await;
    let mut through = burst(access, clients, seconds).await;
    host.close().await.unwrap();

    println!("{}", direct.line("llama-server directly"));
    println!("{}", through.line("through Arcane"));
    println!(
        "watchdog: engine judged busy {} times, engine died {} times",
        counts.busy.load(std::sync::atomic::Ordering::Relaxed),
        counts.died.load(std::sync::atomic::Ordering::Relaxed)
    );
    let (p99_direct, p99_through) = (
        percentile(&mut direct.answered, 0.99),
        percentile(&mut through.answered, 0.99),
    );
    println!(
        "p99 through Arcane / directly: {:.2}x; failed: {} through Arcane vs {} directly: {}",
        p99_through.as_secs_f64() / p99_direct.as_secs_f64().max(1e-9),
        through.failed,
        direct.failed,
        if through.failed <= direct.failed {
            "met (no more failures than the engine alone)"
        } else {
            "NOT MET"
        }
    );
}
