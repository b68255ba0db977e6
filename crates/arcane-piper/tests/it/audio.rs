//! The encodings, read back byte by byte (WAV, PCM) and by a real decoder (FLAC).

use std::io::Cursor;

use arcane_onnx::RunCancel;
use arcane_piper::{encode, to_i16, AudioFormat};
use symphonia::core::codecs::audio::AudioDecoderOptions;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, TrackType};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;

use crate::{phonemizer, voice};

/// A test signal: a sweep with clipping at both ends and some NaN-free noise.
fn signal(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let t = i as f32 / 22050.0;
            1.2 * (t * (200.0 + 50.0 * t) * std::f32::consts::TAU).sin()
        })
        .collect()
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

#[test]
fn wav_has_a_correct_riff_header_and_the_samples() {
    let samples = signal(1000);
    let wav = encode(&samples, 22050, AudioFormat::Wav);
    assert_eq!(wav.len(), 44 + 2000);
    assert_eq!(&wav[0..4], b"RIFF");
    assert_eq!(u32_at(&wav, 4) as usize, wav.len() - 8);
    assert_eq!(&wav[8..16], b"WAVEfmt ");
    assert_eq!(u32_at(&wav, 16), 16);
    assert_eq!(u16_at(&wav, 20), 1, "PCM");
    assert_eq!(u16_at(&wav, 22), 1, "mono");
    assert_eq!(u32_at(&wav, 24), 22050);
    assert_eq!(u32_at(&wav, 28), 44100, "byte rate");
    assert_eq!(u16_at(&wav, 32), 2, "block align");
    assert_eq!(u16_at(&wav, 34), 16, "bits");
    assert_eq!(&wav[36..40], b"data");
    assert_eq!(u32_at(&wav, 40), 2000);
    for (i, s) in samples.iter().enumerate() {
        assert_eq!(u16_at(&wav, 44 + 2 * i) as i16, to_i16(*s));
    }
}

#[test]
fn pcm_is_two_little_endian_bytes_a_sample() {
    let samples = signal(777);
    let pcm = encode(&samples, 22050, AudioFormat::Pcm);
    assert_eq!(pcm.len(), 2 * samples.len());
    assert_eq!(u16_at(&pcm, 2 * 500) as i16, to_i16(samples[500]));
    assert!(encode(&[], 22050, AudioFormat::Pcm).is_empty());
}

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
fn flac_decodes_to_the_quantised_samples() {
    // Over 128 frames, so frame numbers need the two-byte coding; a partial last frame.
    let samples = signal(4096 * 130 + 123);
    let expected: Vec<i16> = samples.iter().copied().map(to_i16).collect();
    for rate in [22050, 44100, 12345, 100_000] {
        let (decoded_rate, decoded) = decode_flac(encode(&samples, rate, AudioFormat::Flac));
        assert_eq!(decoded_rate, rate);
        assert_eq!(decoded.len(), expected.len(), "{rate} Hz");
        assert!(decoded == expected, "{rate} Hz: samples differ");
    }
}

#[test]
fn synthesized_speech_round_trips_through_flac() {
    let voice = voice();
    let samples = voice
        .synthesize(&phonemizer(), "One, two, three.", 1.0, &RunCancel::new())
        .unwrap();
    let (rate, decoded) = decode_flac(encode(&samples, voice.sample_rate(), AudioFormat::Flac));
    assert_eq!(rate, 22050);
    let expected: Vec<i16> = samples.iter().copied().map(to_i16).collect();
    assert!(decoded == expected);
}
