//! Speech through the front door against the same work done directly, in one run:
//!
//! * **Transcription** of `jfk.wav` (11 s) by Whisper tiny.en: `POST
//!   /v1/audio/transcriptions` to `arcane serve` (its whisper.cpp worker on 2 threads)
//!   vs the same model in this process through `arcane_whisper` on 2 threads (the
//!   baseline of the ratio), and whisper.cpp's own `whisper-cli` (built by
//!   `scripts/provision.sh`; it loads the model at every run, so it is shown, not
//!   compared).
//! * **Speech** of a 20-word sentence by the `en_US-joe-medium` voice: `POST
//!   /v1/audio/speech` vs the voice in this process; the real-time factor (seconds of
//!   audio per second of work) of each on this CPU.
//!
//! Run: `cargo bench -p arcane --bench speech` with `scripts/provision.sh all`'s
//! assignments in the environment (ARCANE_WHISPER_MODEL, ARCANE_SPEECH_WAV,
//! ARCANE_WHISPER_CLI, ARCANE_PIPER_VOICE, ARCANE_ONNXRUNTIME).
#![allow(clippy::print_stdout, clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

const RUNS: usize = 7;
const THREADS: usize = 2;
const SENTENCE: &str = "The quick brown fox jumps over the lazy dog while the farmer watches from the porch near his old red barn.";

fn real(var: &str) -> PathBuf {
    let path =
        PathBuf::from(std::env::var_os(var).unwrap_or_else(|| {
            panic!("{var} is not set: source `scripts/provision.sh all`'s output")
        }));
    assert!(path.is_file(), "{var}={} is not a file", path.display());
    path
}

fn median(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64()
}

fn timed(mut run: impl FnMut()) -> Vec<Duration> {
    run(); // warm-up: the model loaded, caches filled
    (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed()
        })
        .collect()
}

/// `arcane` in a fresh workspace with the speech models registered and served.
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
                &["model", "add", "tiny-en", "--file"][..],
                real("ARCANE_WHISPER_MODEL"),
            ),
            (
                &["model", "add", "joe", "--file"],
                real("ARCANE_PIPER_VOICE"),
            ),
            (
                &["runtime", "add", "onnx", "--library"],
                real("ARCANE_ONNXRUNTIME"),
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
            format!(
                "[[model]]\nid = \"whisper-1\"\nmodel = \"tiny-en\"\nload = \"on-start\"\nargs = [\"--threads\", \"{THREADS}\"]\n\n[[model]]\nid = \"tts-1\"\nmodel = \"joe\"\nload = \"on-start\"\nargs = [\"--threads\", \"{THREADS}\"]\n"
            ),
        )
        .unwrap();
        // `core.listening` is printed once `core.json` is published: wait for that line.
        let mut child = arcane(&["--output", "ndjson", "serve"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let (listening, heard) = std::sync::mpsc::channel();
        // Read every line to the end (a closed pipe would fail the host's output).
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(stdout).map_while(Result::ok) {
                if line.contains("\"core.listening\"") {
                    let _ = listening.send(());
                }
            }
        });
        heard
            .recv_timeout(Duration::from_secs(60))
            .expect("the host did not listen within a minute");
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

    /// One request; the body of a 200, else a panic with the answer.
    fn post(&self, path: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.port,
            self.token,
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body).unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        let split = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        assert!(
            answer.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        answer.split_off(split)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // SIGTERM: the host stops its workers and exits.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn multipart(file: &[u8]) -> (String, Vec<u8>) {
    let boundary = "arcane-bench-boundary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"response_format\"\r\n\r\ntext\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"jfk.wav\"\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(file);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

fn whisper_cli(cli: &Path, model: &Path, wav: &Path) {
    let status = Command::new(cli)
        .args(["-t", &THREADS.to_string(), "-nt", "-np", "-m"])
        .arg(model)
        .arg("-f")
        .arg(wav)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
}

fn main() {
    let wav_path = real("ARCANE_SPEECH_WAV");
    let wav = std::fs::read(&wav_path).unwrap();
    let model_path = real("ARCANE_WHISPER_MODEL");
    let host = Host::start();

    // Transcription.
    let (content_type, body) = multipart(&wav);
    let door = timed(|| {
        let text = host.post("/v1/audio/transcriptions", &content_type, &body);
        assert!(String::from_utf8_lossy(&text).contains("country"));
    });
    let model = arcane_whisper::Model::load(&model_path, THREADS).unwrap();
    let direct = timed(|| {
        let audio = arcane_whisper::decode(&wav).unwrap();
        let transcript = model
            .transcribe(
                &audio.samples,
                &Default::default(),
                Arc::new(AtomicBool::new(false)),
            )
            .unwrap();
        assert!(transcript.text.contains("country"));
    });
    drop(model);
    let cli = timed(|| whisper_cli(&real("ARCANE_WHISPER_CLI"), &model_path, &wav_path));
    let (door, direct, cli) = (median(door), median(direct), median(cli));
    println!("transcription of jfk.wav (11.0 s), tiny.en, {THREADS} threads, median of {RUNS}:");
    println!("  front door (whisper.cpp worker)  {:>8.1} ms", door * 1e3);
    println!(
        "  in process (arcane_whisper)      {:>8.1} ms   <- baseline",
        direct * 1e3
    );
    println!("  whisper-cli (loads the model)    {:>8.1} ms", cli * 1e3);
    println!("  front door / in process          {:>8.3}x", door / direct);

    // Speech.
    let request = serde_json::json!({"model": "tts-1", "input": SENTENCE, "voice": "alloy", "response_format": "pcm"});
    let request = request.to_string().into_bytes();
    let mut audio_seconds = 0.0;
    let door = timed(|| {
        let pcm = host.post("/v1/audio/speech", "application/json", &request);
        audio_seconds = pcm.len() as f64 / 2.0 / 22050.0;
    });
    let runtime = arcane_onnx::Runtime::load(&real("ARCANE_ONNXRUNTIME")).unwrap();
    let voice =
        arcane_piper::Voice::load(&runtime, &real("ARCANE_PIPER_VOICE"), Some(THREADS)).unwrap();
    let phonemizer = arcane_piper::Phonemizer::find().expect("espeak-ng on PATH");
    let direct = timed(|| {
        let samples = voice
            .synthesize(&phonemizer, SENTENCE, 1.0, &arcane_onnx::RunCancel::new())
            .unwrap();
        assert!(!samples.is_empty());
    });
    let (door, direct) = (median(door), median(direct));
    println!("speech of a 20-word sentence ({audio_seconds:.2} s of audio), en_US-joe-medium, {THREADS} threads, median of {RUNS}:");
    println!(
        "  front door (piper worker)  {:>8.1} ms   real-time factor {:>5.1}x",
        door * 1e3,
        audio_seconds / door
    );
    println!(
        "  in process (arcane_piper)  {:>8.1} ms   real-time factor {:>5.1}x   <- baseline",
        direct * 1e3,
        audio_seconds / direct
    );
    println!("  front door / in process    {:>8.3}x", door / direct);
}
