//! Every error a caller can cause, with its code and the value it names.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use arcane_onnx::RunCancel;
use arcane_piper::{Error, Phonemizer, Voice, MAX_TEXT_CHARS};
use arcane_report::codes;

use crate::{phonemizer, provisioned, runtime, voice};

fn synthesize(text: &str, speed: f32) -> Result<Vec<f32>, Error> {
    voice().synthesize(&phonemizer(), text, speed, &RunCancel::new())
}

#[test]
fn empty_and_too_long_text_are_usage_errors() {
    for text in ["", "  \n\t"] {
        let e = synthesize(text, 1.0).unwrap_err();
        assert!(matches!(e, Error::EmptyText), "{e}");
        assert_eq!(e.code(), codes::ARCANE_USAGE);
    }
    let e = synthesize(&"a".repeat(MAX_TEXT_CHARS + 1), 1.0).unwrap_err();
    assert_eq!(e.code(), codes::ARCANE_USAGE);
    assert!(
        e.to_string().contains("4097") && e.to_string().contains("4096"),
        "{e}"
    );
    let e = synthesize("?!", 1.0).unwrap_err();
    assert!(matches!(e, Error::NothingToSay { .. }), "{e}");
    assert_eq!(e.code(), codes::ARCANE_USAGE);
}

#[test]
fn a_speed_outside_the_range_is_a_usage_error_naming_it() {
    for speed in [0.1, 4.5, f32::NAN, -1.0] {
        let e = synthesize("Hello.", speed).unwrap_err();
        assert_eq!(e.code(), codes::ARCANE_USAGE, "{e}");
        assert!(e.to_string().contains(&speed.to_string()), "{e}");
    }
}

#[test]
fn a_voice_without_its_json_is_not_found_naming_the_json() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("en_US-joe-medium.onnx");
    std::os::unix::fs::symlink(provisioned("ARCANE_PIPER_VOICE"), &model).unwrap();
    let e = Voice::load(runtime(), &model, None).unwrap_err();
    assert_eq!(e.code(), codes::ARCANE_NOT_FOUND, "{e}");
    assert!(e.to_string().contains("en_US-joe-medium.onnx.json"), "{e}");
    let e = Voice::load(runtime(), &dir.path().join("missing.onnx"), None).unwrap_err();
    assert_eq!(e.code(), codes::ARCANE_NOT_FOUND, "{e}");
    assert!(e.to_string().contains("missing.onnx"), "{e}");
}

#[test]
fn a_broken_json_is_an_invalid_voice_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("v.onnx");
    std::os::unix::fs::symlink(provisioned("ARCANE_PIPER_VOICE"), &model).unwrap();
    std::fs::write(
        dir.path().join("v.onnx.json"),
        r#"{"audio": {"sample_rate": 22050}, "espeak": {"voice": "en-us"}}"#,
    )
    .unwrap();
    let e = Voice::load(runtime(), &model, None).unwrap_err();
    assert_eq!(e.code(), codes::LOCAL_AI_MODEL_INVALID, "{e}");
    assert!(e.to_string().contains("phoneme_id_map"), "{e}");
}

#[test]
fn a_missing_phonemizer_is_named() {
    let missing = Phonemizer::new("/nonexistent/espeak-ng".into());
    let e = voice()
        .synthesize(&missing, "Hello.", 1.0, &RunCancel::new())
        .unwrap_err();
    assert_eq!(e.code(), codes::TTS_PHONEMIZER_FAILED, "{e}");
    assert!(e.to_string().contains("/nonexistent/espeak-ng"), "{e}");
}

#[test]
fn a_failing_phonemizer_reports_its_stderr() {
    let e = phonemizer().phonemize("xx-nope", "Hello.").unwrap_err();
    assert_eq!(e.code(), codes::TTS_PHONEMIZER_FAILED, "{e}");
    assert!(e.to_string().contains("exit code"), "{e}");
    assert!(e.to_string().contains("voice does not exist"), "{e}");
    let e = phonemizer().phonemize("-x", "Hello.").unwrap_err();
    assert_eq!(e.code(), codes::ARCANE_USAGE, "{e}");
}

#[test]
fn a_hanging_phonemizer_is_killed_at_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("hang.sh");
    let pid_file = dir.path().join("pid");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho $$ > '{}'\nexec sleep 100000\n",
            pid_file.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Long enough for the shell to write its pid even on a loaded machine.
    let hanging = Phonemizer::new(script.clone()).with_timeout(Duration::from_millis(3000));
    let e = hanging.phonemize("en-us", "Hello.").unwrap_err();
    assert!(matches!(e, Error::PhonemizerTimeout { .. }), "{e}");
    assert_eq!(e.code(), codes::TTS_PHONEMIZER_FAILED);
    assert!(
        e.to_string().contains("hang.sh") && e.to_string().contains("3000 ms"),
        "{e}"
    );
    // The call returned after reaping the child: it no longer exists.
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    assert!(
        !std::path::Path::new(&format!("/proc/{}", pid.trim())).exists(),
        "the phonemizer {pid} outlived its deadline"
    );
}

#[test]
fn a_cancelled_synthesis_does_not_run() {
    let cancel = RunCancel::new();
    cancel.cancel();
    let e = voice()
        .synthesize(&phonemizer(), "Hello world.", 1.0, &cancel)
        .unwrap_err();
    assert!(matches!(e, Error::Cancelled), "{e}");
    assert_eq!(e.code(), codes::ARCANE_CANCELLED);
}
