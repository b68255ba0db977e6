//! Piper voices: an ONNX graph (`en_US-joe-medium.onnx`) with its configuration beside
//! it (`en_US-joe-medium.onnx.json`). The graph is read like any ONNX model; this module
//! reads the configuration, which says how to turn text into the graph's input: the
//! espeak-ng voice that phonemizes it, the phoneme-to-id map, and the sample rate of
//! the audio that comes out.
//!
//! The configuration is untrusted input: it is read only up to [`MAX_CONFIG_BYTES`]
//! (real ones are about 5 KB), and its phoneme map may hold at most
//! [`MAX_PHONEMES`] entries of at most [`MAX_IDS_PER_PHONEME`] ids each, so a hostile
//! file cannot make the registry parse megabytes or keep a huge map.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Error;

/// The largest `.onnx.json` read, in bytes.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The most entries `phoneme_id_map` may have (real voices have about 150).
pub const MAX_PHONEMES: usize = 4096;

/// The most ids one phoneme may map to (real voices map each to one).
pub const MAX_IDS_PER_PHONEME: usize = 16;

/// What a Piper voice's `.onnx.json` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PiperVoiceInfo {
    /// `audio.sample_rate`: the rate of the audio the voice produces (Hz).
    pub sample_rate: u32,
    /// `espeak.voice`: the espeak-ng voice that phonemizes its text (`en-us`).
    pub espeak_voice: String,
    /// `audio.quality` (`low`, `medium`, `high`), when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<String>,
    /// `num_speakers` (1 when absent).
    pub num_speakers: u32,
    /// The entries of `phoneme_id_map`.
    pub phonemes: usize,
    /// The configuration's file name, beside the model (`<model>.json`).
    pub config_file: String,
    /// The configuration's SHA-256, 64 lowercase hex digits.
    pub config_sha256: String,
}

/// The configuration that makes the ONNX graph at `model` a Piper voice:
/// `<model>.json` (`en_US-joe-medium.onnx` → `en_US-joe-medium.onnx.json`), if the
/// model's name ends in `.onnx`.
pub fn piper_config_path(model: &Path) -> Option<PathBuf> {
    let name = model.file_name()?.to_str()?;
    name.ends_with(".onnx")
        .then(|| model.with_file_name(format!("{name}.json")))
}

/// Reads and checks the Piper configuration at `path` (see the module documentation
/// for the bounds).
///
/// Fails with [`Error::ModelInvalid`] naming the file and the missing or wrong field
/// (`audio.sample_rate`, `espeak.voice`, `phoneme_id_map`), or a file that is too
/// large, not a regular file or not JSON; [`Error::Io`] when it cannot be read.
pub fn read_piper_config(path: &Path) -> Result<PiperVoiceInfo, Error> {
    let invalid = |reason: String| Error::ModelInvalid {
        path: path.to_path_buf(),
        reason,
        found: None,
    };
    let file = arcane_files::open_regular(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidInput {
            invalid(format!("it {e}"))
        } else {
            Error::io("open", path, e)
        }
    })?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io("read", path, e))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(invalid(format!(
            "a Piper voice configuration is at most {MAX_CONFIG_BYTES} bytes; this one is larger"
        )));
    }
    let config: Value = serde_json::from_slice(&bytes)
        .map_err(|e| invalid(format!("it is not a Piper voice configuration (JSON): {e}")))?;
    let sample_rate = config["audio"]["sample_rate"]
        .as_u64()
        .filter(|rate| (1_000..=384_000).contains(rate))
        .and_then(|rate| u32::try_from(rate).ok())
        .ok_or_else(|| {
            invalid(format!(
                "`audio.sample_rate` is {}, not a sample rate in 1000..=384000 Hz",
                config["audio"]["sample_rate"]
            ))
        })?;
    let espeak_voice = config["espeak"]["voice"]
        .as_str()
        .filter(|voice| {
            !voice.is_empty()
                && voice.len() <= 64
                && voice
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '+'))
        })
        .ok_or_else(|| {
            invalid(format!(
                "`espeak.voice` is {}, not an espeak-ng voice name such as \"en-us\"",
                config["espeak"]["voice"]
            ))
        })?
        .to_string();
    let map = config["phoneme_id_map"].as_object().ok_or_else(|| {
        invalid("`phoneme_id_map` is missing or not an object of phoneme -> ids".into())
    })?;
    if map.is_empty() || map.len() > MAX_PHONEMES {
        return Err(invalid(format!(
            "`phoneme_id_map` has {} entries, outside 1..={MAX_PHONEMES}",
            map.len()
        )));
    }
    for (phoneme, ids) in map {
        let fine = ids.as_array().is_some_and(|ids| {
            (1..=MAX_IDS_PER_PHONEME).contains(&ids.len())
                && ids
                    .iter()
                    .all(|id| id.as_u64().is_some_and(|id| id < 1 << 16))
        });
        if !fine {
            return Err(invalid(format!(
                "`phoneme_id_map` maps {phoneme:?} to {ids}, not 1..={MAX_IDS_PER_PHONEME} ids below 65536"
            )));
        }
    }
    let num_speakers = match &config["num_speakers"] {
        Value::Null => 1,
        value => value
            .as_u64()
            .filter(|n| (1..=1 << 16).contains(n))
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| invalid(format!("`num_speakers` is {value}, not 1..=65536")))?,
    };
    Ok(PiperVoiceInfo {
        sample_rate,
        espeak_voice,
        quality: config["audio"]["quality"]
            .as_str()
            .filter(|q| q.len() <= 32)
            .map(str::to_string),
        num_speakers,
        phonemes: map.len(),
        config_file: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        config_sha256: {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(&bytes))
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(path: &Path, text: &str) -> Result<PiperVoiceInfo, Error> {
        std::fs::write(path, text).unwrap();
        read_piper_config(path)
    }

    #[test]
    fn the_configuration_sits_beside_the_model() {
        assert_eq!(
            piper_config_path(Path::new("/v/en_US-joe-medium.onnx")),
            Some(PathBuf::from("/v/en_US-joe-medium.onnx.json"))
        );
        assert_eq!(piper_config_path(Path::new("/v/model.gguf")), None);
    }

    #[test]
    fn reads_a_voice_and_refuses_broken_ones_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.onnx.json");
        let good = r#"{"audio": {"sample_rate": 22050, "quality": "medium"},
            "espeak": {"voice": "en-us"}, "num_speakers": 1,
            "phoneme_id_map": {"_": [0], "a": [14], "ˈ": [120]}}"#;
        let info = config(&path, good).unwrap();
        assert_eq!(info.sample_rate, 22050);
        assert_eq!(info.espeak_voice, "en-us");
        assert_eq!(info.quality.as_deref(), Some("medium"));
        assert_eq!(info.phonemes, 3);
        assert_eq!(info.config_file, "v.onnx.json");
        assert_eq!(info.config_sha256.len(), 64);
        for (broken, field) in [
            (good.replace("22050", "0"), "audio.sample_rate"),
            (good.replace("22050", "\"fast\""), "audio.sample_rate"),
            (good.replace("\"en-us\"", "\"en us; rm\""), "espeak.voice"),
            (good.replace("\"voice\"", "\"v\""), "espeak.voice"),
            (good.replace("[14]", "[-1]"), "phoneme_id_map"),
            (good.replace("[14]", "[]"), "phoneme_id_map"),
            (good.replace("phoneme_id_map", "x"), "phoneme_id_map"),
            (
                good.replace("\"num_speakers\": 1", "\"num_speakers\": 0"),
                "num_speakers",
            ),
            ("not json".to_string(), "JSON"),
        ] {
            let error = config(&path, &broken).unwrap_err().to_string();
            assert!(error.contains(field), "{field}: {error}");
        }
        let huge = format!("{{\"pad\": \"{}\"}}", "x".repeat(MAX_CONFIG_BYTES as usize));
        let error = config(&path, &huge).unwrap_err().to_string();
        assert!(error.contains("at most"), "{error}");
    }
}
