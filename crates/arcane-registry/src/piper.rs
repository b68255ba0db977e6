//! Piper voices: an ONNX graph (`en_US-joe-medium.onnx`) with its configuration beside
//! it (`en_US-joe-medium.onnx.json`). The graph is read like any ONNX model; the
//! configuration is checked by the one reader the voice's worker loads it with
//! ([`arcane_piper::parse_config`]: bounded size, map and ids, the phonemes Piper
//! needs), and the registry records what it says and its digest.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use arcane_piper::{MAX_CONFIG_BYTES, MAX_IDS_PER_PHONEME, MAX_PHONEMES};

use crate::Error;

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
        .then(|| arcane_piper::config_path(model))
}

/// Reads and checks the Piper configuration at `path` (see the module documentation
/// for the bounds).
///
/// Fails with [`Error::ModelInvalid`] naming the file and the missing or wrong field
/// (`audio.sample_rate`, `espeak.voice`, `phoneme_id_map`, …), or a file that is too
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
    let config = arcane_piper::parse_config(&bytes).map_err(invalid)?;
    Ok(PiperVoiceInfo {
        sample_rate: config.sample_rate,
        espeak_voice: config.espeak_voice,
        quality: config.quality,
        num_speakers: config.num_speakers,
        phonemes: config.phoneme_ids.len(),
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

/// The Piper reader of the registry's table ([`crate::READERS`]): an ONNX graph with
/// its configuration beside it, recorded as `onnx` and `piper`. It comes before the
/// plain ONNX reader, whose files it shares.
pub(crate) struct Voice;

impl crate::header::FormatReader for Voice {
    fn format(&self) -> arcane_workspace::ModelFormat {
        arcane_workspace::formats::PIPER_VOICE
    }

    fn kind(&self) -> &'static str {
        "piper-voice"
    }

    fn key(&self) -> &'static str {
        "piper"
    }

    /// An ONNX graph with anything at its configuration's name (a link, a FIFO or
    /// anything else there is refused by [`read`](Self::read), naming it, not skipped).
    fn claims(&self, path: &Path) -> bool {
        arcane_onnx::model::looks_like_onnx(path)
            && piper_config_path(path).is_some_and(|c| std::fs::symlink_metadata(c).is_ok())
    }

    fn read(&self, path: &Path) -> Result<crate::header::Header, Error> {
        let graph = crate::onnx::read(path)?;
        let config = piper_config_path(path).ok_or_else(|| Error::ModelInvalid {
            path: path.to_path_buf(),
            reason: "a Piper voice's name ends in `.onnx`".into(),
            found: None,
        })?;
        let mut header = crate::header::recorded("onnx", &graph);
        header.extend(crate::header::recorded(
            self.key(),
            &read_piper_config(&config)?,
        ));
        Ok(header)
    }

    fn summary(&self, header: &crate::header::Header) -> crate::header::Summary {
        let voice = crate::header::field::<PiperVoiceInfo>(header, self.key());
        let graph = crate::header::field::<arcane_onnx::model::OnnxInfo>(header, "onnx");
        let description = match (voice, graph) {
            (Some(voice), Some(graph)) => format!(
                "Piper voice, espeak-ng voice {}, {} Hz{}, {} phonemes; {}",
                voice.espeak_voice,
                voice.sample_rate,
                voice
                    .quality
                    .as_deref()
                    .map(|q| format!(", {q} quality"))
                    .unwrap_or_default(),
                voice.phonemes,
                crate::onnx::describe(&graph)
            ),
            _ => String::new(),
        };
        crate::header::Summary {
            family: self.kind().into(),
            description,
            ..crate::header::Summary::default()
        }
    }
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
            "phoneme_id_map": {"_": [0], "^": [1], "$": [2], "a": [14], "ˈ": [120]}}"#;
        let info = config(&path, good).unwrap();
        assert_eq!(info.sample_rate, 22050);
        assert_eq!(info.espeak_voice, "en-us");
        assert_eq!(info.quality.as_deref(), Some("medium"));
        assert_eq!(info.phonemes, 5);
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
            // Piper's ids need the start phoneme.
            (good.replace("\"^\"", "\"b\""), "beginning"),
        ] {
            let error = config(&path, &broken).unwrap_err().to_string();
            assert!(error.contains(field), "{field}: {error}");
        }
        let huge = format!("{{\"pad\": \"{}\"}}", "x".repeat(MAX_CONFIG_BYTES as usize));
        let error = config(&path, &huge).unwrap_err().to_string();
        assert!(error.contains("at most"), "{error}");
    }
}
