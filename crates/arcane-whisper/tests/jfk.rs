//! whisper.cpp through whisper-rs on the real Whisper tiny.en and `jfk.wav`
//! (`ARCANE_WHISPER_MODEL`, `ARCANE_SPEECH_WAV`, set by `scripts/test.sh`): the
//! decoded clip and cancellation.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use arcane_whisper::{Model, Options};

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
    // Each segment carries its text tokens and how sure whisper.cpp was of them.
    for segment in &transcript.segments {
        assert!(!segment.tokens.is_empty(), "{segment:?}");
        assert!(
            segment.avg_logprob < 0.0 && segment.avg_logprob > -2.0,
            "{segment:?}"
        );
        assert!((0.0..=1.0).contains(&segment.no_speech_prob), "{segment:?}");
    }
    let last = transcript.segments.last().unwrap();
    assert!(last.end > 8.0 && last.end <= 11.1, "{transcript:?}");
}

#[test]
fn word_timestamps_time_every_word_in_order() {
    let bytes = std::fs::read(real("ARCANE_SPEECH_WAV")).unwrap();
    let audio = arcane_whisper::decode(&bytes).unwrap();
    let model = Model::load(&real("ARCANE_WHISPER_MODEL"), 2).unwrap();
    let options = Options {
        word_timestamps: true,
        ..Options::default()
    };
    let transcript = model
        .transcribe(&audio.samples, &options, Arc::new(AtomicBool::new(false)))
        .unwrap();
    let words = transcript.words.expect("words were asked for");
    let said: Vec<&str> = words.iter().map(|w| w.word.as_str()).collect();
    assert_eq!(words_of(&said.join(" ")), words_of(JFK), "{said:?}");
    for pair in words.windows(2) {
        assert!(pair[0].start <= pair[1].start, "{pair:?}");
    }
    for word in &words {
        assert!(word.start <= word.end && word.end <= 11.1, "{word:?}");
    }
    // "Americans" is said after "fellow" and before "country": times mean something.
    let at = |w: &str| {
        words
            .iter()
            .find(|x| x.word.eq_ignore_ascii_case(w))
            .unwrap()
            .start
    };
    assert!(at("fellow") < at("Americans") && at("Americans") < at("country"));
}

fn words_of(text: &str) -> String {
    words(text)
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

fn rms(samples: &[f32]) -> f64 {
    (samples.iter().map(|s| f64::from(*s).powi(2)).sum::<f64>() / samples.len() as f64).sqrt()
}

/// The same clip encoded by libsndfile as FLAC, MP3 and Ogg/Vorbis decodes to the same
/// eleven seconds at about the same loudness as the WAV.
#[test]
fn flac_mp3_and_ogg_encodings_of_the_clip_decode_like_the_wav() {
    let wav = arcane_whisper::decode(&std::fs::read(real("ARCANE_SPEECH_WAV")).unwrap()).unwrap();
    for (var, format) in [
        ("ARCANE_SPEECH_FLAC", "flac"),
        ("ARCANE_SPEECH_MP3", "mp3"),
        ("ARCANE_SPEECH_OGG", "ogg"),
    ] {
        let audio = arcane_whisper::decode(&std::fs::read(real(var)).unwrap()).unwrap();
        assert_eq!(audio.format, format);
        assert_eq!(audio.source_rate, 16_000, "{format}");
        assert!(
            (audio.duration() - wav.duration()).abs() < 0.15,
            "{format}: {} s against {} s",
            audio.duration(),
            wav.duration()
        );
        let ratio = rms(&audio.samples) / rms(&wav.samples);
        assert!(
            (0.8..1.25).contains(&ratio),
            "{format}: loudness ratio {ratio}"
        );
    }
}
