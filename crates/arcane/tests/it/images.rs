//! Issue 29: images through the front door with stable-diffusion.cpp's library and the
//! random-weight SDXS model (`ARCANE_SD_MODEL`), beside a llama.cpp chat model in one
//! gateway, driven by the official `openai` Python client and by `arcane imagine`; a
//! client that goes away stops its image. Random weights draw noise: what is checked
//! is what does not need trained ones.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::gateway::{gateway_workspace, start};
use crate::serve::{host_endpoint, START};
use crate::speech::row;
use crate::support::{json, provisioned, run, wait_until, TestWorkspace};

/// A gateway with SmolLM2 (`smol`) and the random-weight image model (`sd`), its library
/// registered.
fn image_workspace() -> TestWorkspace {
    let ws = gateway_workspace(
        r#"
[[model]]
id = "smol"
model = "smollm2-135m"

[[model]]
id = "sd"
model = "sdxs"
"#,
    );
    for (args, file) in [
        (["model", "add", "sdxs", "--file"], "ARCANE_SD_MODEL"),
        (
            ["runtime", "add", "stable-diffusion.cpp", "--library"],
            "ARCANE_SD_LIBRARY",
        ),
    ] {
        let out = run(ws.arcane().args(args).arg(provisioned(file)));
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    ws
}

/// The width and height of a PNG.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let be =
        |at: usize| u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    (be(16), be(20))
}

/// The lines `arcane logs sd` has kept of the worker's standard error.
fn worker_lines(ws: &TestWorkspace) -> Vec<String> {
    crate::speech::engine_lines(ws, "sd")
}

/// `arcane imagine` of a 64x64 image in two steps (or of the size `extra` names).
fn imagine(ws: &TestWorkspace, out: &Path, extra: &[&str]) -> std::process::Output {
    let size: &[&str] = if extra.contains(&"--size") {
        &[]
    } else {
        &["--size", "64x64"]
    };
    run(ws
        .arcane()
        .args([
            "--output",
            "json",
            "imagine",
            "a lighthouse at dusk",
            "--model",
            "sd",
        ])
        .args(["--steps", "2", "--cfg-scale", "1"])
        .args(size)
        .args(extra)
        .arg("--out")
        .arg(out))
}

#[test]
fn the_openai_client_and_arcane_imagine_draw_images_through_the_front_door() {
    let ws = image_workspace();
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);

    // Routing knows the path: an image asked of the chat model is refused before
    // anything loads, naming the model that draws.
    let asked = json!({"model": "smol", "prompt": "x", "size": "64x64"});
    let (status, body) =
        crate::front_door::call(port, &token, "POST", "/v1/images/generations", Some(asked));
    assert_eq!(status, 404, "{body}");
    let refusal: Value = serde_json::from_str(&body).unwrap_or_default();
    assert_eq!(
        refusal["error"]["code"], "LOCAL_AI_PATH_NOT_SERVED",
        "{body}"
    );
    assert_eq!(
        refusal["error"]["details"]["servedBy"],
        json!(["sd"]),
        "{body}"
    );
    assert_eq!(row(&ws, "smol")["state"], "stopped");

    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/clients/openai_images.py");
    let mut client = Command::new(provisioned("ARCANE_CLIENTS_PYTHON"));
    client
        .arg(script)
        .env("ARCANE_BASE_URL", format!("http://127.0.0.1:{port}/v1"))
        .env("ARCANE_TOKEN", &token)
        .env("ARCANE_IMAGE_MODEL", "sd");
    crate::front_door::run_client(
        client,
        &[
            "models.list has the image model",
            "n images",
            "png of the requested size",
            "the answer says the format and size",
            "the seeds are reported",
            "the same seed draws the same bytes",
            "image 2 of seed 7 is the image of seed 8",
            "different seeds draw different images",
            "a wide size",
            "jpeg",
            "webp",
            "a url response is refused",
            "a size that is no multiple of 64 is refused",
            "too many images are refused",
            "a stream reports every step, then the image",
        ],
    );
    assert_eq!(
        row(&ws, "smol")["state"],
        "stopped",
        "the image model drew, not `smol`"
    );

    // The CLI goes through the same door, and draws what the client drew for a seed.
    let out = tempfile::tempdir().unwrap();
    let one = out.path().join("one.png");
    let drawn = imagine(&ws, &one, &["--seed", "9"]);
    assert!(
        drawn.status.success(),
        "{}",
        String::from_utf8_lossy(&drawn.stderr)
    );
    let said = json(&drawn);
    assert_eq!(said["images"][0]["seed"], 9, "{said}");
    let bytes = std::fs::read(&one).unwrap();
    assert_eq!(png_size(&bytes), (64, 64));
    // A person is told where it went and which seed draws it again.
    let human = run(ws
        .arcane()
        .args([
            "imagine",
            "a lighthouse at dusk",
            "--model",
            "sd",
            "--size",
            "64x64",
        ])
        .args(["--steps", "2", "--cfg-scale", "1", "--seed", "9", "--out"])
        .arg(out.path().join("again.png")));
    let said = String::from_utf8_lossy(&human.stdout);
    assert!(
        said.contains("again.png") && said.contains("seed 9"),
        "{said}"
    );
    assert_eq!(std::fs::read(out.path().join("again.png")).unwrap(), bytes);
    let many = out.path().join("many.webp");
    let drawn = imagine(&ws, &many, &["--seed", "9", "-n", "2"]);
    assert!(
        drawn.status.success(),
        "{}",
        String::from_utf8_lossy(&drawn.stderr)
    );
    let said = json(&drawn);
    assert_eq!(said["format"], "webp", "{said}");
    let seeds: Vec<&Value> = said["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["seed"])
        .collect();
    assert_eq!(seeds, [&json!(9), &json!(10)], "{said}");
    for name in ["many-1.webp", "many-2.webp"] {
        let bytes = std::fs::read(out.path().join(name)).unwrap();
        assert_eq!(
            (&bytes[..4], &bytes[8..12]),
            (&b"RIFF"[..], &b"WEBP"[..]),
            "{name}"
        );
    }
    // A refusal keeps the engine's code and names the value; nothing is written.
    let refused = out.path().join("refused.png");
    let drawn = imagine(&ws, &refused, &["--size", "65x64"]);
    assert_eq!(drawn.status.code(), Some(2));
    let error = &json(&drawn)["error"];
    assert_eq!(error["code"], "ARCANE_USAGE", "{error}");
    assert_eq!(
        error["details"]["field"], "size",
        "the engine's refusal: {error}"
    );
    assert!(
        error["message"]
            .as_str()
            .unwrap_or_default()
            .contains("65x64"),
        "{error}"
    );
    assert!(!refused.exists());

    // The image model is an engine like any other: listed, owned, on the CPU, counted.
    let sd = row(&ws, "sd");
    assert_eq!(sd["state"], "ready", "{sd}");
    assert_eq!(sd["device"], "cpu", "{sd}");
    assert_eq!(sd["reachableWithoutToken"], false, "{sd}");
    let (status, metrics) = crate::front_door::call(port, &token, "GET", "/metrics", None);
    assert_eq!(status, 200);
    let counted = metrics
        .lines()
        .find_map(|l| l.strip_prefix("arcane_requests_total{model=\"sd\"} "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or(0);
    assert!(counted >= 10, "{metrics}");
    serve.terminate();
}

#[test]
fn a_client_that_goes_away_stops_its_image_and_the_worker_draws_the_next() {
    let ws = image_workspace();
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);
    let body = json!({"model": "sd", "prompt": "a lighthouse", "size": "256x256", "steps": 150, "seed": 1, "stream": true}).to_string();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(START)).unwrap();
    write!(
        stream,
        "POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Read until the first sampling step is reported: the image is being drawn.
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    while !line.contains("image_generation.step") {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "the stream ended before a step"
        );
    }
    let worker = row(&ws, "sd")["pid"].as_u64().expect("the worker's pid") as u32;
    let drawing = crate::front_door::process_tree(worker);
    assert_eq!(drawing.len(), 2, "one child draws the image: {drawing:?}");
    drop(reader);
    drop(stream);
    wait_until(
        Duration::from_secs(60),
        "the drawing child to be stopped",
        || crate::front_door::process_tree(worker).len() == 1,
    );
    assert!(
        !worker_lines(&ws).iter().any(|l| l.contains("150 steps")),
        "the cancelled image was drawn to its end: {:?}",
        worker_lines(&ws)
    );
    // The same worker draws the next image.
    let out = tempfile::tempdir().unwrap();
    let next = out.path().join("next.png");
    let drawn = imagine(&ws, &next, &[]);
    assert!(
        drawn.status.success(),
        "{}",
        String::from_utf8_lossy(&drawn.stderr)
    );
    assert_eq!(png_size(&std::fs::read(&next).unwrap()), (64, 64));
    assert_eq!(row(&ws, "sd")["pid"], worker, "the worker was restarted");
    serve.terminate();
}
