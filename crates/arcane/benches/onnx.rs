//! `onnx.run` of Silero VAD on one 512-sample frame (plus its 64-sample context):
//! through the Core host over `arcane/1` on stdio, vs an in-process `ort` session, vs
//! the Python `onnxruntime` package; p50/p99 of each in one run, and what the host adds
//! at p50 over the in-process session.
//!
//! Run: `ARCANE_ONNXRUNTIME=... ARCANE_SILERO_VAD=... ARCANE_ONNX_PYTHON=... cargo bench -p arcane --bench onnx`
//! (`scripts/provision.sh` prints them).
#![allow(clippy::print_stdout, clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use arcane_onnx::{Provider, RunCancel, Runtime, Session, SessionOptions, Tensor, TensorData};
use serde_json::{json, Value};

const RUNS: usize = 500;

fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q) as usize].as_secs_f64() * 1e3;
    (at(0.5), at(0.99))
}

fn frame_inputs() -> Value {
    json!({
        "input": {"type": "float32", "shape": [1, 576], "data": vec![0.01f32; 576]},
        "state": {"type": "float32", "shape": [2, 1, 128], "data": vec![0f32; 256]},
        "sr": {"type": "int64", "shape": [], "data": [16000]},
    })
}

fn in_process(library: &Path, model: &Path) -> Vec<Duration> {
    let runtime = Runtime::load(library).expect("runtime");
    let options = SessionOptions {
        intra_op_threads: Some(1),
        inter_op_threads: Some(1),
    };
    let session = Session::open(&runtime, model, Provider::Cpu, &options).expect("session");
    let mut inputs = BTreeMap::new();
    inputs.insert(
        "input".to_string(),
        Tensor {
            shape: vec![1, 576],
            data: TensorData::Float32(vec![0.01; 576]),
        },
    );
    inputs.insert(
        "state".to_string(),
        Tensor {
            shape: vec![2, 1, 128],
            data: TensorData::Float32(vec![0.0; 256]),
        },
    );
    inputs.insert(
        "sr".to_string(),
        Tensor {
            shape: vec![],
            data: TensorData::Int64(vec![16000]),
        },
    );
    (0..RUNS + 20)
        .map(|_| {
            let start = Instant::now();
            session.run(&inputs, None, &RunCancel::new()).expect("run");
            start.elapsed()
        })
        .skip(20)
        .collect()
}

fn stdio(library: &Path, model: &Path) -> Vec<Duration> {
    let workspace = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_arcane"))
        .arg("--workspace")
        .arg(workspace.path())
        .args(["core", "--stdio", "--runtime", "onnx", "--onnx-library"])
        .arg(library)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("arcane core");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut call = |id: usize, method: &str, parameters: Value| -> Value {
        let body = json!({"protocol": "arcane/1", "type": "request", "id": id.to_string(), "method": method, "parameters": parameters}).to_string();
        write!(stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        stdin.flush().unwrap();
        loop {
            let mut length = 0;
            loop {
                let mut line = String::new();
                stdout.read_line(&mut line).unwrap();
                let line = line.trim_end();
                if line.is_empty() {
                    break;
                }
                if let Some(n) = line.strip_prefix("Content-Length: ") {
                    length = n.parse().unwrap();
                }
            }
            let mut frame = vec![0u8; length];
            stdout.read_exact(&mut frame).unwrap();
            let frame: Value = serde_json::from_slice(&frame).unwrap();
            if frame["type"] == "response" && frame["id"].as_str() == Some(id.to_string().as_str())
            {
                return frame;
            }
        }
    };
    let loaded = call(
        0,
        "onnx.load",
        json!({"model": model, "options": {"intraOpThreads": 1, "interOpThreads": 1}}),
    );
    let session = loaded["result"]["session"].clone();
    let inputs = frame_inputs();
    let samples = (1..=RUNS + 20)
        .map(|id| {
            let start = Instant::now();
            let response = call(
                id,
                "onnx.run",
                json!({"session": session, "inputs": inputs}),
            );
            assert!(response["result"].is_object(), "{response}");
            start.elapsed()
        })
        .skip(20)
        .collect();
    drop(stdin);
    let _ = child.wait();
    samples
}

const PYTHON: &str = r#"
import json, sys, time
import numpy as np, onnxruntime as ort
o = ort.SessionOptions(); o.intra_op_num_threads = 1; o.inter_op_num_threads = 1
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"], sess_options=o)
feed = {"input": np.full((1, 576), 0.01, np.float32), "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}
t = []
for i in range(int(sys.argv[2]) + 20):
    a = time.perf_counter(); s.run(None, feed); t.append(time.perf_counter() - a)
t = sorted(t[20:]); q = lambda p: t[int((len(t) - 1) * p)] * 1e3
print(json.dumps({"p50": q(0.5), "p99": q(0.99)}))
"#;

fn main() {
    let get = |name: &str| std::env::var_os(name).map(PathBuf::from);
    let (Some(library), Some(model)) = (get("ARCANE_ONNXRUNTIME"), get("ARCANE_SILERO_VAD")) else {
        println!("skipped: set ARCANE_ONNXRUNTIME and ARCANE_SILERO_VAD (scripts/provision.sh prints them)");
        return;
    };
    let (rust50, rust99) = percentiles(in_process(&library, &model));
    let (stdio50, stdio99) = percentiles(stdio(&library, &model));
    println!("silero VAD, one 512-sample frame, {RUNS} runs each (ms):");
    println!("  in-process ort       p50 {rust50:.3}  p99 {rust99:.3}");
    println!(
        "  arcane/1 over stdio  p50 {stdio50:.3}  p99 {stdio99:.3}   (+{:.3} ms at p50, {:.2}x)",
        stdio50 - rust50,
        stdio50 / rust50
    );
    if let Some(python) = get("ARCANE_ONNX_PYTHON") {
        let out = Command::new(python)
            .arg("-c")
            .arg(PYTHON)
            .arg(&model)
            .arg(RUNS.to_string())
            .output()
            .expect("python");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        println!(
            "  python onnxruntime   p50 {:.3}  p99 {:.3}",
            v["p50"].as_f64().unwrap_or(f64::NAN),
            v["p99"].as_f64().unwrap_or(f64::NAN)
        );
    }
}
