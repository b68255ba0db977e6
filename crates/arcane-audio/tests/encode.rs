//! The encodings, read back byte by byte (WAV, PCM) and by real decoders: symphonia
//! for FLAC and MP3, libopus for Ogg Opus. Streamed and whole answers hold the same
//! audio.

use std::io::Cursor;

use arcane_audio::{encode, resample, to_i16, AudioFormat, Encoder, Framing};
use symphonia::core::codecs::audio::AudioDecoderOptions;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, TrackType};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;

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
    let wav = encode(&samples, 22050, AudioFormat::Wav).unwrap();
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
    let pcm = encode(&samples, 22050, AudioFormat::Pcm).unwrap();
    assert_eq!(pcm.len(), 2 * samples.len());
    assert_eq!(u16_at(&pcm, 2 * 500) as i16, to_i16(samples[500]));
    assert!(encode(&[], 22050, AudioFormat::Pcm).unwrap().is_empty());
}

/// Decodes a FLAC or MP3 stream with symphonia: (sample rate, samples).
fn decode(bytes: Vec<u8>, extension: &str) -> (u32, Vec<i16>) {
    let mut hint = Hint::new();
    hint.with_extension(extension);
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
    let mut decoder = symphonia::default::get_codecs()
        .make_audio_decoder(&params, &AudioDecoderOptions::default().verify(true))
        .expect("a decoder");
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
        let (decoded_rate, decoded) =
            decode(encode(&samples, rate, AudioFormat::Flac).unwrap(), "flac");
        assert_eq!(decoded_rate, rate);
        assert_eq!(decoded.len(), expected.len(), "{rate} Hz");
        assert!(decoded == expected, "{rate} Hz: samples differ");
    }
}

/// A tone at `hz` Hz for `seconds`, amplitude 0.5.
fn tone(rate: u32, hz: f32, seconds: f32) -> Vec<f32> {
    (0..(rate as f32 * seconds) as usize)
        .map(|i| 0.5 * (i as f32 / rate as f32 * hz * std::f32::consts::TAU).sin())
        .collect()
}

/// The amplitude of the `hz` component of `samples` (in [-1, 1]) at `rate` (Goertzel).
fn amplitude_at(samples: &[f32], rate: u32, hz: f32) -> f32 {
    let w = std::f32::consts::TAU * hz / rate as f32;
    let (re, im) = samples
        .iter()
        .enumerate()
        .fold((0.0f32, 0.0f32), |(re, im), (i, s)| {
            (re + s * (w * i as f32).cos(), im - s * (w * i as f32).sin())
        });
    2.0 * (re * re + im * im).sqrt() / samples.len() as f32
}

/// Encodes `samples` streamed in pieces of `piece` samples: what each push gave, and
/// what `finish` gave.
fn streamed(
    format: AudioFormat,
    rate: u32,
    samples: &[f32],
    piece: usize,
) -> (Vec<Vec<u8>>, Vec<u8>) {
    let mut encoder = Encoder::new(format, rate, Framing::Streamed).unwrap();
    let pushed = samples
        .chunks(piece)
        .map(|p| encoder.push(p).unwrap())
        .collect();
    (pushed, encoder.finish().unwrap())
}

#[test]
fn a_streamed_wav_says_its_length_is_unknown_and_holds_the_same_samples() {
    let samples = signal(5000);
    let whole = encode(&samples, 22050, AudioFormat::Wav).unwrap();
    let (pushed, rest) = streamed(AudioFormat::Wav, 22050, &samples, 1000);
    assert_eq!(
        pushed[0].len(),
        44 + 2000,
        "the header comes with the first piece"
    );
    assert!(rest.is_empty());
    let stream = pushed.concat();
    assert_eq!(u32_at(&stream, 4), u32::MAX);
    assert_eq!(u32_at(&stream, 40), u32::MAX);
    assert_eq!(stream[8..40], whole[8..40]);
    assert_eq!(stream[44..], whole[44..]);
    // Nothing pushed: still a header.
    assert_eq!(streamed(AudioFormat::Wav, 22050, &[], 1).1.len(), 44);
}

#[test]
fn a_streamed_flac_gives_whole_frames_as_they_fill_and_decodes_the_same() {
    let samples = signal(4096 * 3 + 500);
    let (pushed, rest) = streamed(AudioFormat::Flac, 22050, &samples, 5000);
    assert!(
        pushed[0].len() > 4096 * 2,
        "the first frame went out with the first piece"
    );
    assert!(!rest.is_empty(), "the short last frame comes at the end");
    let mut stream = pushed.concat();
    stream.extend(rest);
    let (rate, decoded) = decode(stream, "flac");
    let (_, whole) = decode(encode(&samples, 22050, AudioFormat::Flac).unwrap(), "flac");
    assert_eq!(rate, 22050);
    assert_eq!(decoded, whole);
    assert_eq!(decoded.len(), samples.len());
}

#[test]
fn mp3_decodes_to_the_same_tone_and_streams_frame_by_frame() {
    let samples = tone(22050, 440.0, 2.0);
    let whole = encode(&samples, 22050, AudioFormat::Mp3).unwrap();
    // An MPEG-2 Layer III frame header, no tag or ID3 first.
    assert_eq!((whole[0], whole[1] & 0xFE), (0xFF, 0xF2));
    let (rate, decoded) = decode(whole.clone(), "mp3");
    assert_eq!(rate, 22050);
    let decoded: Vec<f32> = decoded.iter().map(|&s| f32::from(s) / 32767.0).collect();
    // LAME's delay and padding add at most a few frames of 576 samples.
    assert!(
        decoded.len() >= samples.len() && decoded.len() < samples.len() + 4 * 1152,
        "{} samples decoded for {}",
        decoded.len(),
        samples.len()
    );
    let middle = &decoded[5000..35_000];
    let a440 = amplitude_at(middle, 22050, 440.0);
    assert!((a440 - 0.5).abs() < 0.05, "440 Hz amplitude {a440}");
    assert!(amplitude_at(middle, 22050, 1000.0) < 0.01);
    // Streamed, frames come out as audio goes in, and the bytes are the same.
    let (pushed, rest) = streamed(AudioFormat::Mp3, 22050, &samples, 11025);
    assert!(!pushed[0].is_empty(), "half a second gave no frame");
    let mut stream = pushed.concat();
    stream.extend(rest);
    assert_eq!(stream, whole);
}

/// Reads an Ogg Opus stream with libopus: (OpusHead's input rate, 48 kHz samples with
/// the pre-skip dropped and the end trimmed to the last granule position).
fn decode_opus(bytes: Vec<u8>) -> (u32, Vec<f32>) {
    let mut reader = ogg::PacketReader::new(Cursor::new(bytes));
    let head = reader.read_packet_expected().expect("OpusHead");
    assert_eq!(&head.data[..8], b"OpusHead");
    assert_eq!(head.data[9], 1, "mono");
    let pre_skip = usize::from(u16::from_le_bytes([head.data[10], head.data[11]]));
    let input_rate =
        u32::from_le_bytes([head.data[12], head.data[13], head.data[14], head.data[15]]);
    let tags = reader.read_packet_expected().expect("OpusTags");
    assert_eq!(&tags.data[..8], b"OpusTags");
    let mut decoder = opus::Decoder::new(48_000, opus::Channels::Mono).unwrap();
    let (mut out, mut granule, mut ended) = (Vec::new(), 0, false);
    while let Some(packet) = reader.read_packet().expect("an Ogg page") {
        assert!(!ended, "a packet after the end of the stream");
        let mut frame = vec![0.0f32; 5760];
        let n = decoder
            .decode_float(&packet.data, &mut frame, false)
            .unwrap();
        out.extend_from_slice(&frame[..n]);
        granule = packet.absgp_page();
        ended = packet.last_in_stream();
    }
    assert!(ended, "the stream has no end");
    out.truncate(granule as usize);
    out.drain(..pre_skip);
    (input_rate, out)
}

#[test]
fn ogg_opus_decodes_to_the_same_tone_as_long_as_the_input() {
    let samples = tone(22050, 440.0, 1.5);
    let whole = encode(&samples, 22050, AudioFormat::Opus).unwrap();
    assert_eq!(&whole[..4], b"OggS");
    let (input_rate, decoded) = decode_opus(whole);
    assert_eq!(input_rate, 22050);
    let expected = resample(&samples, 22050, 48_000).unwrap();
    assert_eq!(
        decoded.len(),
        expected.len(),
        "the granule position trims the padding"
    );
    let middle = &decoded[10_000..60_000];
    let a440 = amplitude_at(middle, 48_000, 440.0);
    assert!((a440 - 0.5).abs() < 0.05, "440 Hz amplitude {a440}");
    // Streamed: each piece ends a page, and the whole stream decodes the same length.
    let (pushed, rest) = streamed(AudioFormat::Opus, 22050, &samples, 4410);
    assert!(
        pushed
            .iter()
            .all(|bytes| bytes.windows(4).any(|w| w == b"OggS")),
        "a piece of 0.2 s gave no page"
    );
    let mut stream = pushed.concat();
    stream.extend(rest);
    let (_, decoded) = decode_opus(stream);
    assert_eq!(decoded.len(), expected.len());
}
