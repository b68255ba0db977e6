//! A Piper voice's `.onnx.json`: how text becomes the graph's input (the espeak-ng
//! voice, the phoneme-to-id map), the synthesis defaults (`inference`) and the sample
//! rate of what comes out.
//!
//! The one reader of that file: the registry checks a voice with it when the voice is
//! added ([`parse_config`]), the worker loads it with it ([`read_config`]). The file is
//! untrusted input: at most [`MAX_CONFIG_BYTES`], at most [`MAX_PHONEMES`] map entries
//! of at most [`MAX_IDS_PER_PHONEME`] ids below 65536 each, and the pad, start and end
//! phonemes Piper's ids need.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::Error;

/// The largest `.onnx.json` read, in bytes.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The most entries `phoneme_id_map` may have (real voices have about 150).
pub const MAX_PHONEMES: usize = 4096;

/// The most ids one phoneme may map to (real voices map each to one).
pub const MAX_IDS_PER_PHONEME: usize = 16;

/// The padding phoneme, placed after BOS and after every phoneme.
pub(crate) const PAD: char = '_';
/// The beginning-of-sentence phoneme.
pub(crate) const BOS: char = '^';
/// The end-of-sentence phoneme.
pub(crate) const EOS: char = '$';

/// What the voice's configuration says.
#[derive(Debug, Clone)]
pub struct VoiceConfig {
    /// `audio.sample_rate`, in Hz.
    pub sample_rate: u32,
    /// `audio.quality` (`low`, `medium`, `high`), when given.
    pub quality: Option<String>,
    /// `espeak.voice`: the espeak-ng voice that phonemizes the text.
    pub espeak_voice: String,
    /// `inference.noise_scale`.
    pub noise_scale: f32,
    /// `inference.length_scale`.
    pub length_scale: f32,
    /// `inference.noise_w`.
    pub noise_w: f32,
    /// `num_speakers` (1 when absent).
    pub num_speakers: u32,
    /// Phoneme (one codepoint) to ids.
    pub phoneme_ids: HashMap<char, Vec<i64>>,
}

/// The configuration beside `model`: its file name with `.json` appended.
pub fn config_path(model: &Path) -> PathBuf {
    let mut name = model.file_name().unwrap_or_default().to_os_string();
    name.push(".json");
    model.with_file_name(name)
}

/// Whether `voice` is a plausible espeak-ng voice name (it reaches a command line).
pub(crate) fn is_voice_name(voice: &str) -> bool {
    voice.len() <= 64
        && voice.starts_with(|c: char| c.is_ascii_alphanumeric())
        && voice
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '+'))
}

/// Reads and checks the configuration at `path` (a regular file).
pub fn read_config(path: &Path) -> Result<VoiceConfig, Error> {
    let invalid = |reason: String| Error::VoiceInvalid {
        path: path.to_path_buf(),
        reason,
    };
    let file = arcane_files::open_regular(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound {
            path: path.to_path_buf(),
        },
        std::io::ErrorKind::InvalidInput => invalid(format!("it {e}")),
        _ => Error::Io {
            action: "open",
            path: path.to_path_buf(),
            source: e,
        },
    })?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::Io {
            action: "read",
            path: path.to_path_buf(),
            source: e,
        })?;
    parse_config(&bytes).map_err(invalid)
}

/// Checks the configuration's bytes (at most [`MAX_CONFIG_BYTES`] of JSON); the error
/// names the field at fault and its value.
pub fn parse_config(bytes: &[u8]) -> Result<VoiceConfig, String> {
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(format!(
            "a Piper voice configuration is at most {MAX_CONFIG_BYTES} bytes; this one is larger"
        ));
    }
    let config: Value = serde_json::from_slice(bytes)
        .map_err(|e| format!("it is not a Piper voice configuration (JSON): {e}"))?;
    parse(&config)
}

fn parse(config: &Value) -> Result<VoiceConfig, String> {
    let sample_rate = config["audio"]["sample_rate"]
        .as_u64()
        .filter(|rate| (1_000..=384_000).contains(rate))
        .and_then(|rate| u32::try_from(rate).ok())
        .ok_or_else(|| {
            format!(
                "`audio.sample_rate` is {}, not a sample rate in 1000..=384000 Hz",
                config["audio"]["sample_rate"]
            )
        })?;
    let espeak_voice = config["espeak"]["voice"]
        .as_str()
        .filter(|voice| is_voice_name(voice))
        .ok_or_else(|| {
            format!(
                "`espeak.voice` is {}, not an espeak-ng voice name such as \"en-us\"",
                config["espeak"]["voice"]
            )
        })?
        .to_string();
    if let Some(kind) = config["phoneme_type"].as_str() {
        if kind != "espeak" {
            return Err(format!(
                "`phoneme_type` is {kind:?}; only \"espeak\" voices are supported"
            ));
        }
    }
    let scale = |key: &str, default: f32, range: std::ops::RangeInclusive<f32>| {
        let value = &config["inference"][key];
        if value.is_null() {
            return Ok(default);
        }
        value
            .as_f64()
            .map(|v| v as f32)
            .filter(|v| range.contains(v))
            .ok_or_else(|| format!("`inference.{key}` is {value}, not a number in {range:?}"))
    };
    let noise_scale = scale("noise_scale", 0.667, 0.0..=10.0)?;
    let length_scale = scale("length_scale", 1.0, 0.01..=10.0)?;
    let noise_w = scale("noise_w", 0.8, 0.0..=10.0)?;
    let map = config["phoneme_id_map"]
        .as_object()
        .ok_or("`phoneme_id_map` is missing or not an object of phoneme -> ids")?;
    if map.is_empty() || map.len() > MAX_PHONEMES {
        return Err(format!(
            "`phoneme_id_map` has {} entries, outside 1..={MAX_PHONEMES}",
            map.len()
        ));
    }
    let mut phoneme_ids = HashMap::with_capacity(map.len());
    for (phoneme, ids) in map {
        let parsed = ids.as_array().and_then(|ids| {
            ids.iter()
                .map(|id| id.as_u64().filter(|id| *id < 1 << 16).map(|id| id as i64))
                .collect::<Option<Vec<i64>>>()
        });
        let ids = parsed
            .filter(|ids| (1..=MAX_IDS_PER_PHONEME).contains(&ids.len()))
            .ok_or_else(|| {
                format!(
                    "`phoneme_id_map` maps {phoneme:?} to {ids}, not 1..={MAX_IDS_PER_PHONEME} ids below 65536"
                )
            })?;
        let mut chars = phoneme.chars();
        match (chars.next(), chars.next()) {
            (Some(c), None) => {
                phoneme_ids.insert(c, ids);
            }
            _ => {
                return Err(format!(
                    "`phoneme_id_map` has the key {phoneme:?}, not one character"
                ))
            }
        }
    }
    for (special, what) in [(PAD, "pad"), (BOS, "beginning"), (EOS, "end")] {
        if !phoneme_ids.contains_key(&special) {
            return Err(format!(
                "`phoneme_id_map` has no {what} phoneme {:?}",
                special.to_string()
            ));
        }
    }
    let num_speakers = match &config["num_speakers"] {
        Value::Null => 1,
        value => value
            .as_u64()
            .filter(|n| (1..=1 << 16).contains(n))
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| format!("`num_speakers` is {value}, not 1..=65536"))?,
    };
    Ok(VoiceConfig {
        sample_rate,
        quality: config["audio"]["quality"]
            .as_str()
            .filter(|q| q.len() <= 32)
            .map(str::to_string),
        espeak_voice,
        noise_scale,
        length_scale,
        noise_w,
        num_speakers,
        phoneme_ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"audio": {"sample_rate": 22050}, "espeak": {"voice": "en-us"},
        "inference": {"noise_scale": 0.5, "length_scale": 1.5, "noise_w": 0.7},
        "phoneme_id_map": {"_": [0], "^": [1], "$": [2], "a": [14], "ˈ": [120]}}"#;

    #[test]
    fn reads_the_fields_and_the_map() {
        let config = parse(&serde_json::from_str(GOOD).unwrap()).unwrap();
        assert_eq!(config.sample_rate, 22050);
        assert_eq!(config.espeak_voice, "en-us");
        assert_eq!(
            (config.noise_scale, config.length_scale, config.noise_w),
            (0.5, 1.5, 0.7)
        );
        assert_eq!(config.phoneme_ids[&'ˈ'], vec![120]);
        assert_eq!(config.num_speakers, 1);
    }

    #[test]
    fn refuses_broken_configurations_naming_the_field() {
        for (broken, field) in [
            (GOOD.replace("22050", "0"), "audio.sample_rate"),
            (GOOD.replace("\"en-us\"", "\"-x\""), "espeak.voice"),
            (GOOD.replace("1.5", "-1"), "inference.length_scale"),
            (GOOD.replace("[14]", "[-1]"), "phoneme_id_map"),
            (GOOD.replace("\"a\"", "\"ab\""), "not one character"),
            (GOOD.replace("\"^\"", "\"b\""), "beginning"),
        ] {
            let error = parse(&serde_json::from_str(&broken).unwrap()).unwrap_err();
            assert!(error.contains(field), "{field}: {error}");
        }
    }

    #[test]
    fn the_configuration_sits_beside_the_model() {
        assert_eq!(
            config_path(Path::new("/v/en_US-joe-medium.onnx")),
            PathBuf::from("/v/en_US-joe-medium.onnx.json")
        );
    }
}
