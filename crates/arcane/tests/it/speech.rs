//! Issue 20: speech through the front door with the real models — whisper.cpp (tiny.en,
//! built into `arcane`) for `/v1/audio/transcriptions` and the `en_US-joe-medium`
//! Piper voice on ONNX Runtime for `/v1/audio/speech` — beside a llama.cpp chat model
//! in one gateway, driven by the official `openai` Python client and by `arcane
//! transcribe`/`arcane speak`; a client that goes away cancels its transcription; a
//! killed host leaves no worker; a GPU target is refused by name.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::gateway::{gateway_workspace, ps, start};
use crate::serve::{host_endpoint, signal, wait_gone, START};
use crate::support::{
    json, piper_voice, provisioned, run, wait_until, whisper_model, TestWorkspace,
};

const JFK: &str = "And so my fellow Americans ask not what your country can do for you, ask what you can do for your country.";

/// A gateway with SmolLM2 (`smol`), tiny.en (`whisper-1`) and the Joe voice (`tts-1`),
/// their runtimes registered.
pub(crate) fn speech_workspace() -> TestWorkspace {
    let ws = gateway_workspace(
        r#"
[[model]]
id = "smol"
model = "smollm2-135m"

[[model]]
id = "whisper-1"
model = "tiny-en"

[[model]]
id = "tts-1"
model = "joe"
"#,
    );
    let ok = |out: std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    ok(run(ws
        .arcane()
        .args(["model", "add", "tiny-en", "--file"])
        .arg(whisper_model())));
    ok(run(ws
        .arcane()
        .args(["model", "add", "joe", "--file"])
        .arg(piper_voice())));
    ok(run(ws
        .arcane()
        .args(["runtime", "add", "onnx", "--library"])
        .arg(provisioned("ARCANE_ONNXRUNTIME"))));
    ws
}

/// Twenty words, spoken by the voice and heard by the whisper model: Piper's voices
/// draw noise at every run, so what comes back is compared by word error rate.
pub(crate) const SENTENCE: &str = "The quick brown fox jumps over the lazy dog while the farmer watches from the porch near his old red barn.";

/// The word error rate of `heard` against `reference`: word-level edit distance over
/// the reference's length (case and punctuation ignored).
pub(crate) fn word_error_rate(reference: &str, heard: &str) -> f64 {
    let (reference, heard) = (words(reference), words(heard));
    let (reference, heard): (Vec<&str>, Vec<&str>) = (
        reference.split(' ').collect(),
        heard.split(' ').filter(|w| !w.is_empty()).collect(),
    );
    let mut row: Vec<usize> = (0..=heard.len()).collect();
    for (i, r) in reference.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, h) in heard.iter().enumerate() {
            let substitution = diagonal + usize::from(r != h);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j + 1] + 1).min(row[j] + 1);
        }
    }
    row[heard.len()] as f64 / reference.len() as f64
}

#[test]
fn the_word_error_rate_counts_substitutions_insertions_and_deletions() {
    assert_eq!(word_error_rate("Ask not, what", "ask not what"), 0.0);
    assert_eq!(word_error_rate("ask not what", "asked not what"), 1.0 / 3.0);
    assert_eq!(word_error_rate("ask not what", "ask what"), 1.0 / 3.0);
    assert_eq!(
        word_error_rate("ask not what", "so ask not what"),
        1.0 / 3.0
    );
    assert_eq!(word_error_rate("ask not", ""), 1.0);
}

pub(crate) fn words(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_alphanumeric() || c.is_whitespace())
        .collect::<String>()
        .to_lowercase()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The row of `id` in `arcane ps`.
pub(crate) fn row(ws: &TestWorkspace, id: &str) -> Value {
    ps(ws)
        .into_iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("no `{id}` in arcane ps"))
}

/// The pids of every process `pid` started whose command line has `needle`.
fn children_with(pid: u32, needle: &str) -> Vec<u32> {
    crate::front_door::process_tree(pid)
        .into_iter()
        .skip(1)
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
        .collect()
}

#[test]
fn the_openai_client_transcribes_and_speaks_beside_chat_and_a_killed_host_leaves_no_worker() {
    let ws = speech_workspace();
    let serve = start(&ws);
    let (port, token) = host_endpoint(&ws);

    // Routing knows the path: speech naming the chat model is refused before anything
    // loads, naming who speaks; naming no model, the voice answers, not the first model.
    let speak = |model: Option<&str>| {
        let mut body = serde_json::json!({"input": "Hello there.", "voice": "alloy", "response_format": "wav"});
        if let Some(model) = model {
            body["model"] = model.into();
        }
        crate::front_door::call(port, &token, "POST", "/v1/audio/speech", Some(body))
    };
    let (status, body) = speak(Some("smol"));
    assert_eq!(status, 404, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap_or_default();
    assert_eq!(error["error"]["code"], "LOCAL_AI_PATH_NOT_SERVED", "{body}");
    assert_eq!(
        error["error"]["details"]["servedBy"],
        serde_json::json!(["tts-1"]),
        "{body}"
    );
    assert_eq!(
        row(&ws, "smol")["state"],
        "stopped",
        "nothing loaded for it"
    );
    let (status, body) = speak(None);
    assert_eq!(status, 200, "{body}");
    assert!(
        body.starts_with("RIFF"),
        "a WAV: {}",
        &body[..body.len().min(80)]
    );
    assert_eq!(
        row(&ws, "smol")["state"],
        "stopped",
        "the voice spoke, not `smol`"
    );
    assert_eq!(row(&ws, "tts-1")["state"], "ready");

    let out = tempfile::tempdir().unwrap();
    let not_audio = out.path().join("notes.txt");
    std::fs::write(
        &not_audio,
        "minutes of the meeting, not a recording of it\n",
    )
    .unwrap();
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/clients/openai_audio.py");
    let mut client = Command::new(provisioned("ARCANE_CLIENTS_PYTHON"));
    client
        .arg(script)
        .env("ARCANE_BASE_URL", format!("http://127.0.0.1:{port}/v1"))
        .env("ARCANE_TOKEN", &token)
        .env("ARCANE_CHAT_MODEL", "smol")
        .env("ARCANE_NOT_AUDIO", &not_audio)
        .env("ARCANE_OUT", out.path());
    for var in [
        "ARCANE_SPEECH_WAV",
        "ARCANE_SPEECH_FLAC",
        "ARCANE_SPEECH_MP3",
        "ARCANE_SOUNDFILE_PYTHON",
    ] {
        client.env(var, provisioned(var));
    }
    crate::front_door::run_client(
        client,
        &[
            "transcriptions json",
            "transcriptions text",
            "transcriptions srt",
            "transcriptions verbose_json",
            "transcriptions word timestamps",
            "transcriptions stream deltas, then done",
            "a streamed srt is refused",
            "transcriptions flac",
            "transcriptions mp3",
            "a file that is no audio is refused",
            "speech wav is playable",
            "round trip word error rate <= 10%",
            "an English-only model does not translate",
            "speech is mp3 by default",
            "speech mp3 is heard back",
            "speech opus is Ogg Opus",
            "speech opus is heard back",
            "speech aac is refused naming the formats",
            "speech streams chunked",
            "streamed speech is heard back",
            "speech sse sends a delta per sentence, then done",
            "speech sse is heard back",
            "chat beside speech",
        ],
    );

    // The official npm client too.
    let mut node = Command::new("node");
    node.arg(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/clients/openai_audio.cjs"),
    )
    .env("NODE_PATH", provisioned("ARCANE_NODE_CLIENTS"))
    .env("ARCANE_BASE_URL", format!("http://127.0.0.1:{port}/v1"))
    .env("ARCANE_TOKEN", &token)
    .env("ARCANE_SPEECH_WAV", provisioned("ARCANE_SPEECH_WAV"))
    .env("ARCANE_OUT", out.path());
    crate::front_door::run_client(
        node,
        &[
            "npm transcriptions json",
            "npm transcriptions verbose_json",
            "npm speech wav",
            "npm round trip",
        ],
    );
    // The gateway counted them as it counts chat.
    let (status, metrics) = crate::front_door::call(port, &token, "GET", "/metrics", None);
    assert_eq!(status, 200);
    for model in ["whisper-1", "tts-1", "smol"] {
        let counted = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("arcane_requests_total{{model=\"{model}\"}} ")))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0);
        assert!(counted >= 1, "{model}: {metrics}");
    }

    // The CLI goes through the same door: speak, then hear it back.
    let spoken = out.path().join("hello.flac");
    let said = run(ws
        .arcane()
        .args(["speak", SENTENCE, "--model", "tts-1", "--out"])
        .arg(&spoken));
    assert!(
        said.status.success(),
        "{}",
        String::from_utf8_lossy(&said.stderr)
    );
    assert_eq!(&std::fs::read(&spoken).unwrap()[..4], b"fLaC");
    let heard = json(&run(ws
        .arcane()
        .args(["--output", "json", "transcribe", "--model", "whisper-1"])
        .arg(&spoken)));
    let rate = word_error_rate(SENTENCE, heard["text"].as_str().unwrap_or_default());
    assert!(rate <= 0.1, "word error rate {rate}: {heard}");
    // Human output: the subtitles as they are, one cue per segment.
    let srt = run(ws
        .arcane()
        .args(["transcribe", "--model", "whisper-1", "--format", "srt"])
        .arg(provisioned("ARCANE_SPEECH_FLAC")));
    let srt = String::from_utf8_lossy(&srt.stdout).into_owned();
    assert!(srt.starts_with("1\n00:00:00,000 --> 00:00:"), "{srt}");
    let cues: Vec<&str> = srt.lines().filter(|l| l.contains(" --> ")).collect();
    assert!(!cues.is_empty() && srt.contains("\n2\n"), "{srt}");
    let jfk = json(&run(ws
        .arcane()
        .args(["--output", "json", "transcribe", "--model", "whisper-1"])
        .arg(provisioned("ARCANE_SPEECH_OGG"))));
    assert_eq!(
        words(jfk["text"].as_str().unwrap_or_default()),
        words(JFK),
        "{jfk}"
    );

    // Each speech model is an engine like any other: listed, owned, on the CPU.
    for id in ["whisper-1", "tts-1"] {
        let row = row(&ws, id);
        assert_eq!(row["state"], "ready", "{row}");
        assert_eq!(row["device"], "cpu", "{row}");
        assert_eq!(row["reachableWithoutToken"], false, "{row}");
    }
    let workers: Vec<u32> = ["__whisper-worker", "__piper-worker", "llama-server"]
        .iter()
        .flat_map(|needle| {
            let found = children_with(serve.pid(), needle);
            assert_eq!(found.len(), 1, "{needle}: {found:?}");
            found
        })
        .collect();
    for (id, pid) in [("whisper-1", workers[0]), ("tts-1", workers[1])] {
        assert_eq!(row(&ws, id)["pid"], pid, "{id}");
        // The CPU plan hides every GPU from the worker.
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        assert!(
            environ
                .split(|b| *b == 0)
                .any(|v| v == b"CUDA_VISIBLE_DEVICES="),
            "{id}: CUDA_VISIBLE_DEVICES is not empty"
        );
    }
    signal(serve.pid(), "KILL");
    for pid in workers {
        assert!(
            wait_gone(pid, Duration::from_secs(10)),
            "{pid} outlived a killed host"
        );
    }
    drop(serve);
}

/// The samples of `jfk.wav` (16 kHz mono 16-bit), as the bytes of its data chunk.
fn jfk_samples() -> Vec<u8> {
    let wav = std::fs::read(provisioned("ARCANE_SPEECH_WAV")).unwrap();
    let at = wav
        .windows(4)
        .position(|w| w == b"data")
        .expect("a data chunk");
    let size = u32::from_le_bytes(wav[at + 4..at + 8].try_into().unwrap()) as usize;
    wav[at + 8..(at + 8 + size).min(wav.len())].to_vec()
}

/// The clip `times` times over, as one 16 kHz mono 16-bit WAV.
fn long_clip(times: usize) -> Vec<u8> {
    crate::uploads::wav(1, 16_000, 1, 16, &jfk_samples().repeat(times))
}

/// The lines `arcane logs whisper-1` has kept.
fn worker_lines(ws: &TestWorkspace) -> Vec<String> {
    engine_lines(ws, "whisper-1")
}

/// The lines `arcane logs MODEL` has kept of its engine's standard error.
pub(crate) fn engine_lines(ws: &TestWorkspace, model: &str) -> Vec<String> {
    let kept = json(&run(ws.arcane().args(["--output", "json", "logs", model])));
    kept["lines"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|l| l["stream"] == "stderr")
        .filter_map(|l| l["line"].as_str().map(str::to_string))
        .collect()
}

/// `POST /v1/audio/transcriptions` of `clip` to `whisper-1` with `fields`, sent whole
/// on a raw connection that is left open for the caller to read or drop.
fn send_transcription(
    port: u16,
    token: &str,
    clip: &[u8],
    fields: &[(&str, &str)],
) -> std::net::TcpStream {
    let boundary = "arcane-test-boundary";
    let mut body = String::new();
    for (name, value) in [("model", "whisper-1")].iter().chain(fields) {
        body.push_str(&format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
        ));
    }
    body.push_str(&format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"long.wav\"\r\nContent-Type: audio/wav\r\n\r\n"
    ));
    let mut body = body.into_bytes();
    body.extend_from_slice(clip);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\nContent-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    if let Err(error) = stream.write_all(&body) {
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        panic!("the upload was cut short ({error}): {answer}");
    }
    stream
}

#[test]
fn a_streamed_transcription_sends_text_before_its_end_and_stops_when_its_client_leaves() {
    let ws = speech_workspace();
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);
    // 132 s of audio: five of whisper.cpp's 30-second windows, many seconds of work.
    let mut stream = send_transcription(port, &token, &long_clip(12), &[("stream", "true")]);
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("transcript.text.delta") {
        let read = stream.read(&mut buffer).unwrap();
        assert!(
            read > 0,
            "the stream ended before any text: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buffer[..read]);
    }
    let head = String::from_utf8_lossy(&seen).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/event-stream"), "{head}");
    // The client leaves after the first text: the rest is never decoded.
    drop(stream);
    wait_until(
        Duration::from_secs(60),
        "the transcription to be cancelled",
        || {
            worker_lines(&ws)
                .iter()
                .any(|l| l.starts_with("ARCANE_CANCELLED"))
        },
    );
    let lines = worker_lines(&ws);
    assert!(
        !lines.iter().any(|l| l.starts_with("transcribed 132.0 s")),
        "the transcription ran to its end before its first text was sent: {lines:?}"
    );
    serve.terminate();
}

#[test]
fn a_client_that_goes_away_cancels_its_transcription_and_the_worker_serves_the_next() {
    let ws = speech_workspace();
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);
    let stream = send_transcription(port, &token, &long_clip(12), &[]);
    wait_until(START, "the worker to start transcribing", || {
        worker_lines(&ws)
            .iter()
            .any(|l| l.starts_with("transcribing 132.0 s"))
    });
    drop(stream);
    wait_until(
        Duration::from_secs(60),
        "the transcription to be cancelled",
        || {
            worker_lines(&ws)
                .iter()
                .any(|l| l.starts_with("ARCANE_CANCELLED"))
        },
    );
    let lines = worker_lines(&ws);
    assert!(
        !lines.iter().any(|l| l.starts_with("transcribed 132.0 s")),
        "the cancelled transcription ran to its end: {lines:?}"
    );
    // The worker is free again: the next request is answered.
    let heard = json(&run(ws
        .arcane()
        .args(["--output", "json", "transcribe", "--model", "whisper-1"])
        .arg(provisioned("ARCANE_SPEECH_WAV"))));
    assert_eq!(
        words(heard["text"].as_str().unwrap_or_default()),
        words(JFK),
        "{heard}"
    );
    serve.terminate();
}

/// How many transcriptions the worker's log shows running at once at most
/// (`transcribing …` starts one, `transcribed …` ends it).
fn most_at_once(lines: &[String]) -> usize {
    let (mut running, mut most) = (0usize, 0usize);
    for line in lines {
        if line.starts_with("transcribing ") {
            running += 1;
            most = most.max(running);
        } else if line.starts_with("transcribed ") {
            running = running.saturating_sub(1);
        }
    }
    most
}

#[test]
fn transcriptions_run_side_by_side_up_to_max_workers() {
    let clip_dir = tempfile::tempdir().unwrap();
    let clip = clip_dir.path().join("three-times.wav");
    std::fs::write(&clip, long_clip(3)).unwrap();
    for (workers, expected) in [(2, 2), (1, 1)] {
        let ws = gateway_workspace(&format!(
            "[[model]]\nid = \"whisper-1\"\nmodel = \"tiny-en\"\nargs = [\"--max-workers\", \"{workers}\", \"--threads\", \"1\"]\n"
        ));
        let added = run(ws
            .arcane()
            .args(["model", "add", "tiny-en", "--file"])
            .arg(whisper_model()));
        assert!(
            added.status.success(),
            "{}",
            String::from_utf8_lossy(&added.stderr)
        );
        let mut serve = start(&ws);
        // Three at once: with two workers two run and the third waits; with one, each
        // waits for the one before.
        let clients: Vec<_> = (0..3)
            .map(|_| {
                ws.arcane()
                    .args(["--output", "json", "transcribe", "--model", "whisper-1"])
                    .arg(&clip)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for client in clients {
            let out = client.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let heard = json(&out);
            assert!(
                words(heard["text"].as_str().unwrap_or_default())
                    .contains("ask not what your country"),
                "{heard}"
            );
        }
        let lines = worker_lines(&ws);
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&format!("{workers} at once on 1 threads each"))),
            "{lines:?}"
        );
        assert_eq!(
            most_at_once(&lines),
            expected,
            "{workers} workers: {lines:?}"
        );
        serve.terminate();
    }
}

#[test]
fn a_client_that_leaves_a_streamed_speech_stops_it_and_the_voice_speaks_the_next() {
    let ws = speech_workspace();
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);
    // Forty sentences: many seconds of work, streamed sentence by sentence.
    let text = "The farmer walked out to his old red barn. ".repeat(40);
    let body =
        serde_json::json!({"model": "tts-1", "input": text, "response_format": "pcm"}).to_string();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // The head and the first sentence's audio arrive while the rest is being made.
    let mut first = vec![0u8; 4096];
    let read = stream.read(&mut first).unwrap();
    let head = String::from_utf8_lossy(&first[..read]).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    drop(stream);
    wait_until(
        Duration::from_secs(60),
        "the synthesis to be cancelled",
        || {
            engine_lines(&ws, "tts-1")
                .iter()
                .any(|l| l.starts_with("ARCANE_CANCELLED"))
        },
    );
    let lines = engine_lines(&ws, "tts-1");
    assert!(
        !lines.iter().any(|l| l.starts_with("spoke ")),
        "the abandoned synthesis ran to its end: {lines:?}"
    );
    // The voice is free again: the next request is answered whole.
    let (status, answer) = crate::front_door::call(
        port,
        &token,
        "POST",
        "/v1/audio/speech",
        Some(
            serde_json::json!({"model": "tts-1", "input": "Hello there.", "response_format": "wav"}),
        ),
    );
    assert_eq!(status, 200, "{answer}");
    serve.terminate();
}

/// `jfk.wav` after `seconds` of silence, as one 16 kHz mono 16-bit WAV.
pub(crate) fn after_silence(seconds: usize) -> Vec<u8> {
    let mut samples = vec![0u8; seconds * 16_000 * 2];
    samples.extend_from_slice(&jfk_samples());
    crate::uploads::wav(1, 16_000, 1, 16, &samples)
}

/// What `arcane serve` says when it refuses `toml` before starting anything.
fn serve_refusal(ws: &TestWorkspace, toml: &str) -> Value {
    std::fs::write(ws.path().join("arcane.toml"), toml).unwrap();
    let mut child = ws
        .arcane()
        .args(["--output", "json", "serve"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status =
        crate::support::wait_for_exit(&mut child, Duration::from_secs(60), "serve to refuse");
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert!(!status.success(), "{toml}");
    serde_json::from_str::<Value>(&stdout)
        .ok()
        .and_then(|v| v.get("error").cloned())
        .unwrap_or_else(|| panic!("no error in {stdout}"))
}

#[test]
fn a_voice_activity_model_is_registered_as_one_and_skips_leading_silence() {
    let ws = speech_workspace();
    // The registry tells whisper.cpp's VAD model from a Whisper model.
    let added = run(ws
        .arcane()
        .args(["--output", "json", "model", "add", "silero", "--file"])
        .arg(provisioned("ARCANE_WHISPER_VAD")));
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let listed = json(&run(ws
        .arcane()
        .args(["--output", "json", "model", "list"])));
    let row = listed["models"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["id"] == "silero")
        .cloned()
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(row["kind"], "vad", "{row}");
    assert_eq!(row["vad"]["modelType"], "silero-16k", "{row}");
    assert!(
        row.get("whisper").is_none(),
        "not read as a Whisper model: {row}"
    );

    // Named where it does not fit, it is refused before anything starts.
    for (toml, says) in [
        ("[[model]]\nid = \"vad\"\nmodel = \"silero\"\n", "silero"),
        ("[[model]]\nid = \"whisper-1\"\nmodel = \"tiny-en\"\nvad = \"tiny-en\"\n", "voice-activity"),
        ("[[model]]\nid = \"smol\"\nmodel = \"smollm2-135m\"\nvad = \"silero\"\n", "takes no vad"),
        ("[[model]]\nid = \"remote\"\nurl = \"http://127.0.0.1:9\"\nvad = \"silero\"\n", "external `url`"),
        ("[[model]]\nid = \"whisper-1\"\nmodel = \"tiny-en\"\nargs = [\"--vad-model\", \"/tmp/x\"]\n", "vad = "),
    ] {
        let error = serve_refusal(&ws, toml);
        assert!(error["message"].as_str().unwrap_or_default().contains(says), "{toml}: {error}");
    }

    // Served beside a Whisper model, it finds the speech after 20 s of silence.
    let toml = "[[model]]\nid = \"whisper-1\"\nmodel = \"tiny-en\"\nvad = \"silero\"\n";
    std::fs::write(ws.path().join("arcane.toml"), toml).unwrap();
    let mut serve = start(&ws);
    let clip_dir = tempfile::tempdir().unwrap();
    let clip = clip_dir.path().join("silence-then-jfk.wav");
    std::fs::write(&clip, after_silence(20)).unwrap();
    // Twice: the second run reuses the first one's voice-activity context.
    for _ in 0..2 {
        let heard = json(&run(ws
            .arcane()
            .args([
                "--output",
                "json",
                "transcribe",
                "--model",
                "whisper-1",
                "--format",
                "verbose_json",
            ])
            .arg(&clip)));
        assert_eq!(
            words(heard["text"].as_str().unwrap_or_default()),
            words(JFK),
            "{heard}"
        );
        let first = heard["segments"][0]["start"].as_f64().unwrap_or_default();
        assert!(
            first >= 19.0,
            "times count from the start of the audio: {heard}"
        );
    }
    let lines = worker_lines(&ws);
    assert!(
        lines.iter().any(|l| l.contains("silence skipped by")),
        "{lines:?}"
    );
    serve.terminate();
}

#[test]
fn a_speech_model_on_a_gpu_target_is_refused_naming_the_device() {
    let ws = speech_workspace();
    let gpu = "GPU-00000000-1111-2222-3333-444444444444";
    let toml = format!("[[model]]\nid = \"whisper-1\"\nmodel = \"tiny-en\"\ndevice = \"{gpu}\"\n");
    let error = serve_refusal(&ws, &toml);
    assert_eq!(
        error["code"], "LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED",
        "{error}"
    );
    assert_eq!(error["details"]["device"], gpu, "{error}");
    assert!(error["message"].as_str().unwrap().contains(gpu), "{error}");
    assert!(!ws.path().join(".arcane/run/whisper-1.sock").exists());
}

#[test]
fn a_worker_orphaned_by_a_killed_host_is_stopped_by_the_next_host() {
    let ws = speech_workspace();
    let toml = "[[model]]\nid = \"whisper-1\"\nmodel = \"tiny-en\"\nload = \"on-start\"\n";
    std::fs::write(ws.path().join("arcane.toml"), toml).unwrap();
    let mut first = crate::serve::Serve::start(&ws, &["--no-parent-death-signal"]);
    first.wait_for("local-ai.model.ready", START);
    let orphan = row(&ws, "whisper-1")["pid"].as_u64().expect("a pid") as u32;
    signal(first.pid(), "KILL");
    first.wait_exit(Duration::from_secs(10));
    // Without the parent-death signal the worker outlives its host: it still answers on
    // its socket.
    let socket = ws.path().join(".arcane/run/whisper-1.sock");
    let mut stream = std::os::unix::net::UnixStream::connect(&socket).expect("the orphan's socket");
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains("ok"),
        "{answer}"
    );

    let mut second = crate::serve::Serve::start(&ws, &[]);
    let stopped = second.wait_for("process.orphan.stopped", START);
    assert_eq!(stopped["data"]["pid"], orphan, "{stopped}");
    assert!(
        wait_gone(orphan, Duration::from_secs(10)),
        "the orphan {orphan} still runs"
    );
    second.wait_for("local-ai.model.ready", START);
    let pid = row(&ws, "whisper-1")["pid"].as_u64().unwrap() as u32;
    assert_ne!(pid, orphan, "a new worker replaces the orphan");
    second.terminate();
    assert!(
        wait_gone(pid, Duration::from_secs(10)),
        "a stopped host left its worker {pid}"
    );
}
