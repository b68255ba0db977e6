//! Start-to-ready and stop time of a supervised `llama-server`, against the same
//! `llama-server` started and polled directly, in the same run; plus Arcane's own
//! resident memory while serving.
//!
//! ```text
//! LLAMA_SERVER=… ARCANE_TEST_MODEL=… cargo bench -p arcane-localai --bench serve
//! # optional: ARCANE_BIN=target/release/arcane (else target/{release,debug}/arcane if built)
//! ```
//!
//! Baseline: spawn `llama-server` with the same arguments and poll `GET /health` every
//! 5 ms until it answers 200. Supervisor: `Supervisor::start` (CPU target) until it
//! returns the ready server. `arcane serve`: the binary until its NDJSON `ready` event.
//! Runs alternate so drift affects both sides alike; medians are printed.
#![allow(clippy::print_stdout, clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arcane_localai::{Engine, EngineConfig, Server, Supervisor};
use arcane_report::{CancelToken, NullSink};

const RUNS: usize = 5;

fn main() {
    let (Some(server), Some(model)) = (
        std::env::var_os("LLAMA_SERVER"),
        std::env::var_os("ARCANE_TEST_MODEL"),
    ) else {
        println!("serve bench: set LLAMA_SERVER and ARCANE_TEST_MODEL (source ~/.cache/arcane/embedded.env); skipped");
        return;
    };
    let server = PathBuf::from(server);
    let model = PathBuf::from(model);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let arcane = arcane_binary();
    let mut raw_ready = Vec::new();
    let mut raw_stop = Vec::new();
    let mut lib_ready = Vec::new();
    let mut lib_stop = Vec::new();
    let mut cli_ready = Vec::new();
    let mut cli_stop = Vec::new();
    let mut cli_rss = Vec::new();
    for _ in 0..RUNS {
        let (ready, stop) = raw(&server, &model);
        raw_ready.push(ready);
        raw_stop.push(stop);
        let (ready, stop) = runtime.block_on(supervised(&server, &model));
        lib_ready.push(ready);
        lib_stop.push(stop);
        if let Some(arcane) = &arcane {
            let (ready, stop, rss) = cli(arcane, &server, &model);
            cli_ready.push(ready);
            cli_stop.push(stop);
            cli_rss.push(rss);
        }
    }
    let raw_ready = median(raw_ready);
    let lib_ready = median(lib_ready);
    println!("start-to-ready, median of {RUNS} (same model, same machine, alternating runs):");
    println!(
        "  raw llama-server, /health polled every 5 ms : {:8.1} ms",
        ms(raw_ready)
    );
    println!(
        "  Supervisor::start (CPU target)             : {:8.1} ms  ratio {:.3}  added {:+.1} ms",
        ms(lib_ready),
        lib_ready.as_secs_f64() / raw_ready.as_secs_f64(),
        ms(lib_ready) - ms(raw_ready)
    );
    if !cli_ready.is_empty() {
        let cli_ready = median(cli_ready);
        println!(
            "  arcane serve (process start to ready event): {:8.1} ms  ratio {:.3}  added {:+.1} ms",
            ms(cli_ready),
            cli_ready.as_secs_f64() / raw_ready.as_secs_f64(),
            ms(cli_ready) - ms(raw_ready)
        );
    }
    println!("stop (SIGTERM until reaped), median:");
    println!("  raw llama-server : {:8.1} ms", ms(median(raw_stop)));
    println!("  OwnedServer::stop: {:8.1} ms", ms(median(lib_stop)));
    if !cli_stop.is_empty() {
        println!(
            "  arcane serve (SIGTERM to arcane until it exited, engine gone): {:8.1} ms",
            ms(median(cli_stop))
        );
        cli_rss.sort_unstable();
        println!(
            "arcane serve resident memory while serving: {:.1} MB (median VmRSS)",
            cli_rss[cli_rss.len() / 2] as f64 / 1024.0
        );
    } else {
        println!(
            "(arcane binary not found: build it or set ARCANE_BIN for the CLI rows and its memory)"
        );
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values[values.len() / 2]
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn health(port: u16) -> Option<u16> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

fn args(port: u16, model: &Path) -> Vec<String> {
    [
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--jinja",
        "--model",
        &model.display().to_string(),
        "--alias",
        "bench",
        "--device",
        "none",
        "--gpu-layers",
        "0",
    ]
    .map(String::from)
    .to_vec()
}

/// The baseline: spawn, poll `/health` every 5 ms; then SIGTERM and wait.
fn raw(server: &Path, model: &Path) -> (Duration, Duration) {
    let port = free_port();
    let started = Instant::now();
    let mut child = Command::new(server)
        .args(args(port, model))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn llama-server");
    while health(port) != Some(200) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let ready = started.elapsed();
    let stopping = Instant::now();
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    (ready, stopping.elapsed())
}

async fn supervised(server: &Path, model: &Path) -> (Duration, Duration) {
    let workspace = std::env::temp_dir().join(format!("arcane-bench-{}", std::process::id()));
    let port = free_port();
    let mut config = EngineConfig::new(Engine::LlamaCpp);
    config.url = format!("http://127.0.0.1:{port}");
    config.executable = Some(server.to_path_buf());
    config.model = Some(model.to_path_buf());
    config.alias = Some("bench".into());
    config.device = Some("cpu".into());
    let supervisor = Supervisor::new(&workspace, Arc::new(NullSink));
    let started = Instant::now();
    let server = supervisor
        .start(config, CancelToken::new())
        .await
        .expect("start");
    let ready = started.elapsed();
    let Server::Owned(owned) = server else {
        panic!("expected an owned server")
    };
    let stopping = Instant::now();
    owned.stop().await;
    let stop = stopping.elapsed();
    let _ = std::fs::remove_dir_all(&workspace);
    (ready, stop)
}

fn arcane_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("ARCANE_BIN") {
        return Some(PathBuf::from(path));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut candidates = Vec::new();
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        candidates.push(PathBuf::from(&target).join("release/arcane"));
        candidates.push(PathBuf::from(&target).join("debug/arcane"));
    }
    candidates.push(root.join("target/release/arcane"));
    candidates.push(root.join("target/debug/arcane"));
    candidates.into_iter().find(|p| p.is_file())
}

/// `arcane serve` until its ready event; VmRSS while serving; SIGTERM until it exits.
fn cli(arcane: &Path, server: &Path, model: &Path) -> (Duration, Duration, u64) {
    let workspace = std::env::temp_dir().join(format!("arcane-bench-cli-{}", std::process::id()));
    let port = free_port();
    let started = Instant::now();
    let mut child = Command::new(arcane)
        .arg("--workspace")
        .arg(&workspace)
        .args([
            "--output",
            "ndjson",
            "serve",
            "--url",
            &format!("http://127.0.0.1:{port}"),
            "--device",
            "cpu",
            "--alias",
            "bench",
        ])
        .arg("--model")
        .arg(model)
        .arg("--executable")
        .arg(server)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn arcane");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let Ok(line) = line else { break };
        if line.contains("\"local-ai.server.ready\"") {
            break;
        }
    }
    let ready = started.elapsed();
    std::thread::sleep(Duration::from_millis(200));
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let stopping = Instant::now();
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    for _ in lines.by_ref() {}
    let _ = child.wait();
    let stop = stopping.elapsed();
    let _ = std::fs::remove_dir_all(&workspace);
    (ready, stop, rss)
}
