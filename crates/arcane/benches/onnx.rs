//! `onnx.run` of Silero VAD on one 512-sample frame (plus its 64-sample context):
//! through the Core host over `arcane/1` on loopback HTTP (`POST /v1/rpc` with the
//! token, one keep-alive connection, the host in this process) and on stdio (`arcane
//! core --stdio` as a child process), each with the tensors as JSON arrays and as
//! base64, vs an in-process `ort` session, vs the Python `onnxruntime` package; p50/p99
//! of each in one run, and what the host adds at p50 over the in-process session.
//!
//! Each Arcane sample is the client's whole call: writing the request frame, the host's
//! work and the worker's, and reading the response frame back into JSON (and, for
//! base64, the state tensor back into floats).
//!
//! Run: `ARCANE_ONNXRUNTIME=... ARCANE_SILERO_VAD=... ARCANE_ONNX_PYTHON=... cargo bench -p arcane --bench onnx`
//! (`scripts/provision.sh` prints them).
#![allow(clippy::print_stdout, clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arcane_core::{AppInfo, Host};
use arcane_onnx_service::{OnnxConfig, OnnxService};

use arcane_onnx::{
    Encoding, Provider, RunCancel, Runtime, Session, SessionOptions, Tensor, TensorData,
};
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

/// One `arcane/1` request/response exchange over some transport.
trait Transport {
    /// Sends the request frame `body` and returns its response frame.
    fn call(&mut self, id: &str, body: &str) -> Value;
}

/// `arcane core --stdio` as a child process, `Content-Length` framing on its pipes.
struct StdioHost {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
    _workspace: tempfile::TempDir,
}

impl StdioHost {
    fn start(library: &Path) -> Self {
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
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        StdioHost {
            child,
            stdin,
            stdout,
            _workspace: workspace,
        }
    }
}

impl Transport for StdioHost {
    fn call(&mut self, id: &str, body: &str) -> Value {
        let frame = format!("Content-Length: {}\r\n\r\n{body}", body.len());
        self.stdin.write_all(frame.as_bytes()).unwrap();
        loop {
            let length = read_head(&mut self.stdout, "Content-Length: ");
            let mut frame = vec![0u8; length];
            self.stdout.read_exact(&mut frame).unwrap();
            let frame: Value = serde_json::from_slice(&frame).unwrap();
            if frame["type"] == "response" && frame["id"].as_str() == Some(id) {
                return frame;
            }
        }
    }
}

impl Drop for StdioHost {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads header lines up to the blank one; returns the value of `length` (a
/// `Content-Length`, whatever its case).
fn read_head(reader: &mut impl BufRead, length: &str) -> usize {
    let mut value = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            return value;
        }
        if line.len() > length.len() && line[..length.len()].eq_ignore_ascii_case(length) {
            value = line[length.len()..].trim().parse().unwrap();
        }
    }
}

/// The Core host in this process on loopback HTTP, one keep-alive connection to it.
struct Http {
    stream: BufReader<std::net::TcpStream>,
    address: String,
    token: String,
    host: Host,
    runtime: tokio::runtime::Runtime,
}

impl Http {
    fn start(library: &Path) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let service = OnnxService::new(OnnxConfig {
            library: library.to_path_buf(),
            worker_program: env!("CARGO_BIN_EXE_arcane").into(),
            worker_args: vec!["__onnx-worker".into(), "--library".into()],
            devices: Arc::new(arcane_devices::LiveProbe),
            models: Arc::new(|model: &str| Ok(PathBuf::from(model))),
            start_timeout: Duration::from_secs(60),
            cancel_grace: Duration::from_secs(2),
            max_workers: arcane_onnx_service::DEFAULT_MAX_WORKERS,
            records: None,
            workers_outlive_host: false,
        });
        let token = "bench-token-0123456789abcdef".to_string();
        let (host, address) = runtime.block_on(async {
            let host = Host::builder(AppInfo::default())
                .service(service)
                .unwrap()
                .build();
            host.start();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap().to_string();
            let options = arcane_front_door::http::HttpOptions::new(token.clone());
            tokio::spawn(arcane_front_door::http::serve(
                host.clone(),
                listener,
                options,
            ));
            (host, address)
        });
        let stream = std::net::TcpStream::connect(&address).unwrap();
        stream.set_nodelay(true).unwrap();
        Http {
            stream: BufReader::new(stream),
            address,
            token,
            host,
            runtime,
        }
    }
}

impl Transport for Http {
    fn call(&mut self, _id: &str, body: &str) -> Value {
        let request = format!(
            "POST /v1/rpc HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.address,
            self.token,
            body.len()
        );
        self.stream.get_mut().write_all(request.as_bytes()).unwrap();
        let length = read_head(&mut self.stream, "content-length:");
        let mut frame = vec![0u8; length];
        self.stream.read_exact(&mut frame).unwrap();
        serde_json::from_slice(&frame).unwrap()
    }
}

impl Drop for Http {
    fn drop(&mut self) {
        let host = self.host.clone();
        let _ = self.runtime.block_on(host.close());
    }
}

/// `onnx.run` timings over `transport`, the tensors' data written as `encoding`.
fn through(transport: &mut dyn Transport, model: &Path, encoding: Encoding) -> Vec<Duration> {
    let mut call = |id: usize, method: &str, parameters: Value| -> Value {
        let id = id.to_string();
        let body = json!({"protocol": "arcane/1", "type": "request", "id": id, "method": method, "parameters": parameters}).to_string();
        transport.call(&id, &body)
    };
    let loaded = call(
        0,
        "onnx.load",
        json!({"model": model, "options": {"intraOpThreads": 1, "interOpThreads": 1}}),
    );
    let session = loaded["result"]["session"].clone();
    let mut inputs = frame_inputs();
    if encoding == Encoding::Base64 {
        for (name, value) in inputs.as_object_mut().unwrap() {
            let tensor = Tensor::from_value(name, value).unwrap();
            *value = tensor.to_json(Encoding::Base64).into_value();
        }
    }
    let samples = (1..=RUNS + 20)
        .map(|id| {
            let start = Instant::now();
            let response = call(
                id,
                "onnx.run",
                json!({"session": session, "inputs": inputs, "encoding": encoding}),
            );
            let state = &response["result"]["outputs"]["stateN"];
            let state = Tensor::from_value("stateN", state).expect("the new state");
            assert_eq!(state.data.len(), 256, "{response}");
            start.elapsed()
        })
        .skip(20)
        .collect();
    let _ = call(RUNS + 21, "onnx.unload", json!({"session": session}));
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
    let mut http = Http::start(&library);
    let mut stdio = StdioHost::start(&library);
    println!("silero VAD, one 512-sample frame, {RUNS} runs each (ms):");
    println!("  in-process ort                p50 {rust50:.3}  p99 {rust99:.3}");
    for (name, encoding) in [
        ("HTTP, JSON arrays ", Encoding::Array),
        ("stdio, JSON arrays", Encoding::Array),
        ("HTTP, base64      ", Encoding::Base64),
        ("stdio, base64     ", Encoding::Base64),
    ] {
        let transport: &mut dyn Transport = match name.starts_with("HTTP") {
            true => &mut http,
            false => &mut stdio,
        };
        let (p50, p99) = percentiles(through(transport, &model, encoding));
        println!(
            "  arcane/1 {name}  p50 {p50:.3}  p99 {p99:.3}   (+{:.3} ms at p50, {:.2}x; target +0.25 ms)",
            p50 - rust50,
            p50 / rust50
        );
    }
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
            "  python onnxruntime            p50 {:.3}  p99 {:.3}",
            v["p50"].as_f64().unwrap_or(f64::NAN),
            v["p99"].as_f64().unwrap_or(f64::NAN)
        );
    }
}
