//! whisper.cpp through whisper-rs on the real Whisper tiny.en and `jfk.wav`
//! (`ARCANE_WHISPER_MODEL`, `ARCANE_SPEECH_WAV`, set by `scripts/test.sh`): the
//! decoded clip, the worker's protocol, cancellation.

use std::io::{BufRead, BufReader, Cursor, Write};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use arcane_whisper::worker::{self, Response};
use arcane_whisper::{Model, Options};
use base64::Engine as _;
use serde_json::json;

const JFK: &str = "And so my fellow Americans ask not what your country can do for you, ask what you can do for your country.";

// Tests read the provisioned parts' paths from the environment `scripts/test.sh` sets.
#[allow(clippy::disallowed_methods)]
fn real(var: &str) -> PathBuf {
    let value = std::env::var_os(var).unwrap_or_else(|| {
        panic!("{var} is not set: run the tests through `./scripts/test.sh` (it provisions the speech models and exports {var})")
    });
    let path = PathBuf::from(value);
    assert!(path.is_file(), "{var}={} is not a file", path.display());
    path
}

/// Lower case, letters and spaces only: punctuation and capitals are Whisper's
/// choice, the words are not.
fn words(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_alphanumeric() || c.is_whitespace())
        .collect::<String>()
        .to_lowercase()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn tiny_en_transcribes_jfk() {
    let bytes = std::fs::read(real("ARCANE_SPEECH_WAV")).unwrap();
    let audio = arcane_whisper::decode(&bytes).unwrap();
    assert_eq!(audio.format, "wav");
    assert!(
        (audio.duration() - 11.0).abs() < 0.1,
        "{}",
        audio.duration()
    );
    let model = Model::load(&real("ARCANE_WHISPER_MODEL"), 2).unwrap();
    assert!(model.english_only());
    let transcript = model
        .transcribe(
            &audio.samples,
            &Options::default(),
            Arc::new(AtomicBool::new(false)),
        )
        .unwrap();
    assert_eq!(words(&transcript.text), words(JFK), "{transcript:?}");
    assert_eq!(transcript.language, "en");
    assert!(!transcript.segments.is_empty());
    let last = transcript.segments.last().unwrap();
    assert!(last.end > 8.0 && last.end <= 11.1, "{transcript:?}");
}

#[test]
fn a_cancelled_transcription_stops() {
    let bytes = std::fs::read(real("ARCANE_SPEECH_WAV")).unwrap();
    let audio = arcane_whisper::decode(&bytes).unwrap();
    let model = Model::load(&real("ARCANE_WHISPER_MODEL"), 2).unwrap();
    let error = model
        .transcribe(
            &audio.samples,
            &Options::default(),
            Arc::new(AtomicBool::new(true)),
        )
        .unwrap_err();
    assert!(
        matches!(error, arcane_whisper::TranscribeError::Cancelled),
        "{error}"
    );
}

/// A writer the test reads back.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_worker_says_hello_and_answers_each_request_by_id() {
    let wav = std::fs::read(real("ARCANE_SPEECH_WAV")).unwrap();
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let requests = [
        json!({"op": "transcribe", "id": 7, "audio": b64(&wav), "options": {"language": "en"}}),
        json!({"op": "transcribe", "id": 8, "audio": b64(b"\0\0\0\x20ftypM4A ")}),
        json!({"op": "transcribe", "id": 9, "audio": b64(&wav), "options": {"language": "xx"}}),
        json!({"op": "nonsense", "id": 10}),
        json!({"op": "transcribe", "id": 11, "audio": b64(&wav)}),
        json!({"op": "cancel", "id": 12, "run": 11}),
    ];
    let input: String = requests.iter().map(|r| format!("{r}\n")).collect();
    let output = Shared::default();
    assert!(worker::serve(
        &real("ARCANE_WHISPER_MODEL"),
        2,
        BufReader::new(Cursor::new(input)),
        output.clone()
    ));
    let text = output.0.lock().unwrap().clone();
    let responses: Vec<Response> = text
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    assert_eq!(responses[0].id, 0, "{responses:?}");
    assert!(responses[0].result.as_ref().unwrap()["whisper"].is_string());
    let by_id = |id: u64| {
        responses
            .iter()
            .find(|r| r.id == id)
            .unwrap_or_else(|| panic!("no answer to {id}: {responses:?}"))
    };
    // Every request but the cancel is answered, once.
    assert_eq!(responses.len(), 6, "{responses:?}");
    let code = |id: u64| by_id(id).error.as_ref().map(|e| e["code"].clone());
    assert_eq!(
        words(by_id(7).result.as_ref().unwrap()["text"].as_str().unwrap()),
        words(JFK)
    );
    assert_eq!(code(8), Some(json!("AUDIO_UNSUPPORTED")));
    assert_eq!(
        by_id(8).error.as_ref().unwrap()["details"]["format"],
        "MP4/M4A"
    );
    assert_eq!(code(9), Some(json!("ARCANE_USAGE")));
    assert_eq!(code(10), Some(json!("ARCANE_USAGE")));
    // Its cancel is read while the first transcription runs.
    assert_eq!(code(11), Some(json!("ARCANE_CANCELLED")));
}
