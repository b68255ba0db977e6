//! A voice's audio, encoded and read back by a real decoder.

use std::io::Cursor;

use arcane_onnx::RunCancel;
use arcane_piper::{encode, to_i16, AudioFormat};
use symphonia::core::codecs::audio::AudioDecoderOptions;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, TrackType};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;

use crate::{phonemizer, voice};

/// Decodes a FLAC stream with symphonia: (sample rate, samples).
fn decode_flac(bytes: Vec<u8>) -> (u32, Vec<i16>) {
    let mut hint = Hint::new();
    hint.with_extension("flac");
    let source = MediaSourceStream::new(Box::new(Cursor::new(bytes)), Default::default());
    let mut reader = symphonia::default::get_probe()
        .probe(
            &hint,
            source,
            FormatOptions::default(),
            MetadataOptions::default(),
        )
        .expect("symphonia recognises the stream");
    let track = reader.default_track(TrackType::Audio).expect("a track");
    let track_id = track.id;
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .expect("audio parameters")
        .clone();
    assert_eq!(params.bits_per_sample, Some(16));
    let mut decoder = symphonia::default::get_codecs()
        .make_audio_decoder(&params, &AudioDecoderOptions::default().verify(true))
        .expect("a FLAC decoder");
    let mut out = Vec::new();
    while let Some(packet) = reader.next_packet().expect("a packet") {
        assert_eq!(packet.track_id, track_id);
        let decoded = decoder.decode(&packet).expect("the frame decodes");
        assert_eq!(decoded.spec().channels().count(), 1);
        let mut samples: Vec<i16> = Vec::new();
        decoded.copy_to_vec_interleaved(&mut samples);
        out.extend(samples);
    }
    (params.sample_rate.expect("a sample rate"), out)
}

#[test]
fn synthesized_speech_round_trips_through_flac() {
    let voice = voice();
    let samples = voice
        .synthesize(&phonemizer(), "One, two, three.", 1.0, &RunCancel::new())
        .unwrap();
    let (rate, decoded) =
        decode_flac(encode(&samples, voice.sample_rate(), AudioFormat::Flac).unwrap());
    assert_eq!(rate, 22050);
    let expected: Vec<i16> = samples.iter().copied().map(to_i16).collect();
    assert!(decoded == expected);
}
