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
//! * **Streamed speech** of five sentences: the time to the first byte of audio of a
//!   streamed answer (`stream_format: "audio"`) against the time of the whole synthesis
//!   (the same text answered whole), side by side, and their ratio (target ≤ 0.35).
//!
//! * **Concurrent transcriptions**: four copies of `jfk.wav` sent at once to a
//!   whisper.cpp model with a pool of workers (`--max-workers 2 --threads 1`) against
//!   the same four one at a time on one worker with every thread (`--max-workers 1
//!   --threads 2`, the baseline), and the throughput ratio.
//!
//! * **Voice activity**: `jfk.wav` after 20 s of silence, transcribed by a model with
//!   whisper.cpp's Silero VAD (`vad = "silero"`) against the same model without (the
//!   baseline), and the ratio.
//!
//! Run: `cargo bench -p arcane --bench speech` with `scripts/provision.sh all`'s
//! assignments in the environment (ARCANE_WHISPER_MODEL, ARCANE_SPEECH_WAV,
//! ARCANE_WHISPER_CLI, ARCANE_WHISPER_VAD, ARCANE_PIPER_VOICE, ARCANE_ONNXRUNTIME).
#![allow(clippy::print_stdout, clippy::disallowed_methods)]

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{median, real, Host};

const RUNS: usize = 7;
const THREADS: usize = 2;
const FIVE: &str = "The sun rose over the quiet valley. A farmer walked out to his old red barn. His dog ran ahead through the tall grass. Birds sang in the trees along the river. It was going to be a warm and busy day.";
const SENTENCE: &str = "The quick brown fox jumps over the lazy dog while the farmer watches from the porch near his old red barn.";

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

/// `arcane serve` with the speech models registered and served on `THREADS` threads.
fn start_host() -> Host {
    Host::start(
        &[
            (&["model", "add", "tiny-en", "--file"], real("ARCANE_WHISPER_MODEL")),
            (&["model", "add", "joe", "--file"], real("ARCANE_PIPER_VOICE")),
            (&["runtime", "add", "onnx", "--library"], real("ARCANE_ONNXRUNTIME")),
        ],
        &format!(
            "[[model]]\nid = \"whisper-1\"\nmodel = \"tiny-en\"\nload = \"on-start\"\nargs = [\"--threads\", \"{THREADS}\"]\n\n[[model]]\nid = \"tts-1\"\nmodel = \"joe\"\nload = \"on-start\"\nargs = [\"--threads\", \"{THREADS}\"]\n"
        ),
        "core.listening",
    )
}

fn multipart(file: &[u8]) -> (String, Vec<u8>) {
    multipart_for("whisper-1", file)
}

fn multipart_for(model: &str, file: &[u8]) -> (String, Vec<u8>) {
    let boundary = "arcane-bench-boundary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{model}\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"response_format\"\r\n\r\ntext\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"jfk.wav\"\r\n\r\n"
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
    let host = start_host();

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

    streamed_speech(&host);
    drop(host);
    concurrent_transcriptions(&wav);
    voice_activity(&wav);
}

/// `wav` (16 kHz mono 16-bit) after `seconds` of silence.
fn after_silence(wav: &[u8], seconds: usize) -> Vec<u8> {
    let at = wav.windows(4).position(|w| w == b"data").unwrap();
    let size = u32::from_le_bytes(wav[at + 4..at + 8].try_into().unwrap()) as usize;
    let mut samples = vec![0u8; seconds * 16_000 * 2];
    samples.extend_from_slice(&wav[at + 8..(at + 8 + size).min(wav.len())]);
    let mut out = wav[..at].to_vec();
    // The RIFF size, then the data chunk.
    let riff = (at + 8 + samples.len() - 8) as u32;
    out[4..8].copy_from_slice(&riff.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&(samples.len() as u32).to_le_bytes());
    out.extend_from_slice(&samples);
    out
}

/// 20 s of silence and `jfk.wav`: with the voice-activity model and without.
fn voice_activity(wav: &[u8]) {
    let host = Host::start(
        &[
            (&["model", "add", "tiny-en", "--file"], real("ARCANE_WHISPER_MODEL")),
            (&["model", "add", "silero", "--file"], real("ARCANE_WHISPER_VAD")),
        ],
        &format!(
            "[[model]]\nid = \"whisper-1\"\nmodel = \"tiny-en\"\nload = \"on-start\"\nargs = [\"--threads\", \"{THREADS}\"]\n\n[[model]]\nid = \"whisper-vad\"\nmodel = \"tiny-en\"\nvad = \"silero\"\nload = \"on-start\"\nargs = [\"--threads\", \"{THREADS}\"]\n"
        ),
        "core.listening",
    );
    let clip = after_silence(wav, 20);
    let timed_model = |model: &str| {
        let (content_type, body) = multipart_for(model, &clip);
        timed(|| {
            let text = host.post("/v1/audio/transcriptions", &content_type, &body);
            assert!(
                String::from_utf8_lossy(&text).contains("country"),
                "{model}: {}",
                String::from_utf8_lossy(&text)
            );
        })
    };
    let without = median(timed_model("whisper-1"));
    let with = median(timed_model("whisper-vad"));
    println!(
        "jfk.wav after 20 s of silence (31.0 s), tiny.en, {THREADS} threads, median of {RUNS}:"
    );
    println!(
        "  without voice activity detection   {:>8.1} ms   <- baseline",
        without * 1e3
    );
    println!(
        "  with Silero VAD (vad = \"silero\")   {:>8.1} ms",
        with * 1e3
    );
    println!(
        "  with / without                     {:>8.3}x",
        with / without
    );
}

/// A host serving tiny.en as `whisper-1` with these worker flags.
fn whisper_host(flags: &str) -> Host {
    Host::start(
        &[(&["model", "add", "tiny-en", "--file"], real("ARCANE_WHISPER_MODEL"))],
        &format!(
            "[[model]]\nid = \"whisper-1\"\nmodel = \"tiny-en\"\nload = \"on-start\"\nargs = [{flags}]\n"
        ),
        "core.listening",
    )
}

/// Four clips at once through a pool of two workers, against the same four one at a
/// time on one worker with both threads.
fn concurrent_transcriptions(wav: &[u8]) {
    const CLIPS: usize = 4;
    let (content_type, body) = multipart(wav);
    let round = |host: &Host, at_once: bool| {
        let started = Instant::now();
        if at_once {
            std::thread::scope(|scope| {
                for _ in 0..CLIPS {
                    scope.spawn(|| host.post("/v1/audio/transcriptions", &content_type, &body));
                }
            });
        } else {
            for _ in 0..CLIPS {
                host.post("/v1/audio/transcriptions", &content_type, &body);
            }
        }
        started.elapsed()
    };
    let one = whisper_host("\"--max-workers\", \"1\", \"--threads\", \"2\"");
    round(&one, false); // warm-up
    let serial: Vec<Duration> = (0..3).map(|_| round(&one, false)).collect();
    drop(one);
    let pool = whisper_host("\"--max-workers\", \"2\", \"--threads\", \"1\"");
    round(&pool, true); // warm-up
    let pooled: Vec<Duration> = (0..3).map(|_| round(&pool, true)).collect();
    let (serial, pooled) = (median(serial), median(pooled));
    println!("{CLIPS} transcriptions of jfk.wav, tiny.en, median of 3 rounds:");
    println!(
        "  one at a time, 1 worker x 2 threads   {:>8.1} ms   {:>5.2} clips/s   <- baseline",
        serial * 1e3,
        CLIPS as f64 / serial
    );
    println!(
        "  at once, 2 workers x 1 thread         {:>8.1} ms   {:>5.2} clips/s",
        pooled * 1e3,
        CLIPS as f64 / pooled
    );
    println!(
        "  throughput, pool / one at a time      {:>8.3}x",
        serial / pooled
    );
}

/// Five sentences streamed vs answered whole, alternating run by run.
fn streamed_speech(host: &Host) {
    let streamed = serde_json::json!({"model": "tts-1", "input": FIVE, "response_format": "pcm", "stream_format": "audio"})
        .to_string()
        .into_bytes();
    // No `stream_format`: a WAV is answered whole, its sizes exact.
    let whole = serde_json::json!({"model": "tts-1", "input": FIVE, "response_format": "wav"})
        .to_string()
        .into_bytes();
    host.post("/v1/audio/speech", "application/json", &whole); // warm-up
    let (mut first, mut streamed_total, mut whole_total) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let started = Instant::now();
        let (first_byte, pcm) = host.post_timed("/v1/audio/speech", "application/json", &streamed);
        streamed_total.push(started.elapsed());
        first.push(first_byte);
        assert!(pcm.len() > 22050 * 2, "{} bytes", pcm.len());
        let started = Instant::now();
        let wav = host.post("/v1/audio/speech", "application/json", &whole);
        whole_total.push(started.elapsed());
        assert_eq!(&wav[..4], b"RIFF");
    }
    let (first, streamed_total, whole_total) =
        (median(first), median(streamed_total), median(whole_total));
    println!("streamed speech of five sentences, median of {RUNS}:");
    println!(
        "  whole synthesis (wav, answered whole)   {:>8.1} ms   <- baseline",
        whole_total * 1e3
    );
    println!(
        "  first audio byte (pcm, streamed)        {:>8.1} ms",
        first * 1e3
    );
    println!(
        "  last audio byte (pcm, streamed)         {:>8.1} ms",
        streamed_total * 1e3
    );
    println!(
        "  first byte / whole synthesis            {:>8.3}x   (target <= 0.35)",
        first / whole_total
    );
}
