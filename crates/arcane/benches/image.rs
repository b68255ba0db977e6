//! One image through the front door against the same image drawn in this process, in
//! one run: `POST /v1/images/generations` to `arcane serve` (its stable-diffusion.cpp
//! worker on 2 threads, which draws in the generator process it forks) vs
//! `arcane_stable_diffusion::Model::generate_here` on 2 threads with the same library, model, seed and
//! parameters, encoded to the same PNG (the baseline of the ratio; the target is at
//! most 1.05x). Rounds alternate between the two so that a busy machine slows both.
//!
//! Run: `cargo bench -p arcane --bench image` with `scripts/provision.sh all`'s
//! assignments in the environment (ARCANE_SD_LIBRARY, ARCANE_SD_MODEL);
//! ARCANE_BENCH_SIZE (default 128) and ARCANE_BENCH_STEPS (default 4) change the work.
#![allow(clippy::print_stdout, clippy::disallowed_methods)]

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

const ROUNDS: usize = 7;
const THREADS: usize = 2;

fn real(var: &str) -> PathBuf {
    let path =
        PathBuf::from(std::env::var_os(var).unwrap_or_else(|| {
            panic!("{var} is not set: source `scripts/provision.sh all`'s output")
        }));
    assert!(path.is_file(), "{var}={} is not a file", path.display());
    path
}

fn setting(var: &str, default: u32) -> u32 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64()
}

/// `arcane serve` in a fresh workspace with the image model loaded.
struct Host {
    child: Child,
    _workspace: tempfile::TempDir,
    port: u16,
    token: String,
}

impl Host {
    fn start() -> Host {
        let workspace = tempfile::tempdir().unwrap();
        let arcane = |args: &[&str]| {
            let mut command = Command::new(env!("CARGO_BIN_EXE_arcane"));
            command
                .arg("--workspace")
                .arg(workspace.path())
                .args(args)
                .env_remove("ARCANE_WORKSPACE");
            command
        };
        for (args, file) in [
            (
                &["model", "add", "sdxs", "--file"][..],
                real("ARCANE_SD_MODEL"),
            ),
            (
                &["runtime", "add", "stable-diffusion.cpp", "--library"],
                real("ARCANE_SD_LIBRARY"),
            ),
        ] {
            let status = arcane(args)
                .arg(file)
                .stdout(Stdio::null())
                .status()
                .unwrap();
            assert!(status.success(), "{args:?}");
        }
        std::fs::write(
            workspace.path().join("arcane.toml"),
            format!("[[model]]\nid = \"sd\"\nmodel = \"sdxs\"\nload = \"on-start\"\nargs = [\"--threads\", \"{THREADS}\"]\n"),
        )
        .unwrap();
        let mut child = arcane(&["--output", "ndjson", "serve"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let (ready, heard) = std::sync::mpsc::channel();
        // Read every line to the end (a closed pipe would fail the host's output).
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if line.contains("\"local-ai.model.ready\"") {
                    let _ = ready.send(());
                }
            }
        });
        heard
            .recv_timeout(Duration::from_secs(120))
            .expect("the image model was not ready within two minutes");
        let record = workspace.path().join(".arcane/core.json");
        let endpoint: Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
        let url = endpoint["url"].as_str().unwrap();
        let port = url
            .rsplit(':')
            .next()
            .unwrap()
            .trim_end_matches('/')
            .parse()
            .unwrap();
        Host {
            child,
            _workspace: workspace,
            port,
            token: endpoint["token"].as_str().unwrap().to_string(),
        }
    }

    /// One image: its PNG bytes.
    fn draw(&self, request: &[u8]) -> Vec<u8> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        let head = format!(
            "POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.port,
            self.token,
            request.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(request).unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        let split = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        assert!(
            answer.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        let body: Value = serde_json::from_slice(&answer[split..]).unwrap();
        let b64 = body["data"][0]["b64_json"].as_str().unwrap();
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // SIGTERM: the host stops its worker and exits.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn main() {
    let (size, steps) = (
        setting("ARCANE_BENCH_SIZE", 128),
        setting("ARCANE_BENCH_STEPS", 4),
    );
    let host = Host::start();
    let request = json!({"model": "sd", "prompt": "a lighthouse at dusk", "size": format!("{size}x{size}"), "steps": steps, "cfg_scale": 1.0, "seed": 42});
    let request = request.to_string().into_bytes();
    let library = arcane_stable_diffusion::Library::load(&real("ARCANE_SD_LIBRARY")).unwrap();
    let model =
        arcane_stable_diffusion::Model::load(library, &real("ARCANE_SD_MODEL"), THREADS).unwrap();
    let generation = arcane_stable_diffusion::Generation {
        prompt: "a lighthouse at dusk".into(),
        negative_prompt: String::new(),
        width: size,
        height: size,
        steps,
        cfg_scale: 1.0,
        seed: 42,
        count: 1,
        format: arcane_stable_diffusion::ImageFormat::Png,
        quality: 90,
    };
    let here = || {
        let rgb = model.generate_here(&generation, 0, &mut |_, _| {}).unwrap();
        arcane_stable_diffusion::encode(
            &rgb,
            size,
            size,
            arcane_stable_diffusion::ImageFormat::Png,
            90,
        )
        .unwrap()
    };
    // Warm-up, and the two draw the same image.
    assert_eq!(
        host.draw(&request),
        here(),
        "the front door drew another image"
    );
    let (mut door, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let start = Instant::now();
        host.draw(&request);
        door.push(start.elapsed());
        let start = Instant::now();
        here();
        direct.push(start.elapsed());
    }
    let (door, direct) = (median(door), median(direct));
    println!("one {size}x{size} image, {steps} steps, random-weight SDXS, {THREADS} threads, median of {ROUNDS} alternating rounds:");
    println!(
        "  front door (sd worker, a child per image)  {:>8.1} ms",
        door * 1e3
    );
    println!(
        "  in process (arcane_stable_diffusion)                    {:>8.1} ms   <- baseline",
        direct * 1e3
    );
    let ratio = door / direct;
    let verdict = if ratio <= 1.05 { "met" } else { "NOT met" };
    println!(
        "  front door / in process                   {ratio:>8.3}x   (target <= 1.05x: {verdict})"
    );
}
