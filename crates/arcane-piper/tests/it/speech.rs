//! Phonemizing and synthesizing with the real voice and espeak-ng.

use std::time::Instant;

use arcane_onnx::RunCancel;

use crate::{phonemizer, voice};

#[test]
fn hello_world_becomes_ipa_and_ids_framed_by_bos_and_eos_with_pads_between() {
    let voice = voice();
    assert_eq!(voice.sample_rate(), 22050);
    assert_eq!(voice.espeak_voice(), "en-us");
    let ipa = phonemizer()
        .phonemize(voice.espeak_voice(), "Hello world.")
        .unwrap();
    assert!(ipa.contains("həlˈoʊ") && ipa.ends_with('.'), "{ipa:?}");
    let ids = voice.phoneme_ids(&ipa);
    let id = |c| voice.phoneme_id(c).unwrap()[0];
    let (pad, bos, eos) = (id('_'), id('^'), id('$'));
    assert_eq!(ids.ids[..2], [bos, pad], "{:?}", ids.ids);
    assert_eq!(ids.ids.last(), Some(&eos), "{:?}", ids.ids);
    // Every phoneme of this voice maps to one id: BOS, pad, (id, pad)*, EOS.
    let body = &ids.ids[2..ids.ids.len() - 1];
    assert_eq!(body.len(), 2 * ids.found);
    assert!(body.chunks(2).all(|pair| pair[1] == pad && pair[0] != pad));
    let total = ipa.chars().count();
    assert!(
        ids.found * 10 >= total * 9,
        "{total} phonemes, missing {:?}",
        ids.missing
    );
}

#[test]
fn clause_punctuation_is_kept_as_piper_keeps_it() {
    let ipa = phonemizer()
        .phonemize("en-us", "-v Hello, world; how are you? Fine!")
        .unwrap();
    // Text starting with `-` is text, not an option; `, ;` are followed by a space.
    assert!(ipa.contains(", ") && ipa.contains("; "), "{ipa:?}");
    assert!(ipa.contains('?') && ipa.ends_with('!'), "{ipa:?}");
    let ids = voice().phoneme_ids(&ipa);
    eprintln!("{ipa:?}, missing {:?}", ids.missing);
    assert!(
        ids.found * 10 >= ipa.chars().count() * 9,
        "missing {:?}",
        ids.missing
    );
}

#[test]
fn a_sentence_is_plausible_audio_and_speed_two_is_shorter() {
    let voice = voice();
    let text = "The quick brown fox jumps over the lazy dog near the river bank.";
    let cancel = RunCancel::new();
    let normal = voice.synthesize(&phonemizer(), text, 1.0, &cancel).unwrap();
    let seconds = normal.len() as f32 / voice.sample_rate() as f32;
    assert!((0.5..10.0).contains(&seconds), "{seconds} s");
    let peak = normal.iter().fold(0f32, |p, s| p.max(s.abs()));
    assert!(peak > 0.5 && peak <= 1.0, "peak {peak}");
    assert!(normal.iter().all(|s| s.is_finite()));
    let fast = voice.synthesize(&phonemizer(), text, 2.0, &cancel).unwrap();
    assert!(
        (fast.len() as f32) < normal.len() as f32 * 0.7,
        "speed 2: {} samples, speed 1: {}",
        fast.len(),
        normal.len()
    );
}

#[test]
fn sentences_are_joined_by_silence() {
    let voice = voice();
    let cancel = RunCancel::new();
    let one = voice
        .synthesize(&phonemizer(), "Good morning.", 1.0, &cancel)
        .unwrap();
    let two = voice
        .synthesize(&phonemizer(), "Good morning. Good morning.", 1.0, &cancel)
        .unwrap();
    let silence = (arcane_piper::SENTENCE_SILENCE_SECONDS * voice.sample_rate() as f32) as usize;
    // Noise makes each sentence's length vary a little; the silence is exact.
    assert!(
        two.len() > one.len() * 3 / 2 + silence,
        "{} vs {}",
        two.len(),
        one.len()
    );
}

#[test]
fn real_time_factor_of_a_twenty_word_sentence() {
    let voice = voice();
    let text = "Arcane keeps every model on this machine, so your words never leave it \
                while the voice reads them back clearly.";
    assert_eq!(text.split_whitespace().count(), 20);
    let cancel = RunCancel::new();
    let start = Instant::now();
    let audio = voice.synthesize(&phonemizer(), text, 1.0, &cancel).unwrap();
    let wall = start.elapsed().as_secs_f64();
    let seconds = audio.len() as f64 / f64::from(voice.sample_rate());
    eprintln!(
        "real-time factor: {:.2} ({seconds:.2} s of audio in {wall:.2} s)",
        seconds / wall
    );
    assert!(seconds > 2.0, "{seconds} s for 20 words");
}

#[test]
fn many_clauses_keep_their_punctuation_in_order() {
    // About 4000 characters: 240 clauses phonemized by one espeak-ng run.
    let text = "One, two; three. ".repeat(235);
    assert!(text.chars().count() <= arcane_piper::MAX_TEXT_CHARS);
    let ipa = phonemizer().phonemize("en-us", &text).unwrap();
    let marks: String = ipa
        .chars()
        .filter(|c| matches!(c, ',' | ';' | '.'))
        .collect();
    assert_eq!(marks, ",;.".repeat(235));
    assert_eq!(ipa.matches("wˈʌn").count(), 235, "{ipa}");
}

#[test]
fn a_clause_espeak_splits_itself_is_phonemized_whole() {
    // espeak-ng breaks a clause this long in two, so the lines no longer match the
    // clauses and each clause is phonemized by its own run.
    let text = format!("{}, and the end.", "apple ".repeat(200).trim_end());
    let ipa = phonemizer().phonemize("en-us", &text).unwrap();
    let (long, rest) = ipa.split_once(", ").expect("the comma is kept");
    assert_eq!(long.split_whitespace().count(), 200, "{ipa}");
    assert!(rest.ends_with('.') && rest.contains("ɛnd"), "{rest}");
}

#[test]
fn espeak_on_path_is_found_when_there() {
    if let Some(found) = arcane_piper::Phonemizer::find() {
        assert!(found.executable().ends_with("espeak-ng"));
        assert!(found.executable().is_absolute());
    }
}
