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

mod support;

use std::time::Instant;

use base64::Engine as _;
use serde_json::{json, Value};
use support::{median, real, Host};

const ROUNDS: usize = 7;
const THREADS: usize = 2;

fn setting(var: &str, default: u32) -> u32 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `arcane serve` with the image model registered and loaded on `THREADS` threads.
fn start_host() -> Host {
    Host::start(
        &[
            (&["model", "add", "sdxs", "--file"], real("ARCANE_SD_MODEL")),
            (
                &["runtime", "add", "stable-diffusion.cpp", "--library"],
                real("ARCANE_SD_LIBRARY"),
            ),
        ],
        &format!("[[model]]\nid = \"sd\"\nmodel = \"sdxs\"\nload = \"on-start\"\nargs = [\"--threads\", \"{THREADS}\"]\n"),
        "local-ai.model.ready",
    )
}

/// One image through the front door: its PNG bytes.
fn draw(host: &Host, request: &[u8]) -> Vec<u8> {
    let answer = host.post("/v1/images/generations", "application/json", request);
    let body: Value = serde_json::from_slice(&answer).unwrap();
    let b64 = body["data"][0]["b64_json"].as_str().unwrap();
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap()
}

fn main() {
    let (size, steps) = (
        setting("ARCANE_BENCH_SIZE", 128),
        setting("ARCANE_BENCH_STEPS", 4),
    );
    let host = start_host();
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
        draw(&host, &request),
        here(),
        "the front door drew another image"
    );
    let (mut door, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let start = Instant::now();
        draw(&host, &request);
        door.push(start.elapsed());
        let start = Instant::now();
        here();
        direct.push(start.elapsed());
    }
    let (door, direct) = (median(door), median(direct));
    println!("one {size}x{size} image, {steps} steps, random-weight SDXS, {THREADS} threads, median of {ROUNDS} alternating rounds:");
    println!(
        "  front door (the worker's generator)   {:>8.1} ms",
        door * 1e3
    );
    println!(
        "  in process (arcane_stable_diffusion)  {:>8.1} ms   <- baseline",
        direct * 1e3
    );
    let ratio = door / direct;
    let verdict = if ratio <= 1.05 { "met" } else { "NOT met" };
    println!(
        "  front door / in process               {ratio:>8.3}x   (target <= 1.05x: {verdict})"
    );
}
