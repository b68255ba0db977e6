//! The format of a model file that is not registered, from its first bytes: what
//! decides which engine kind serves a model named by path (`--model id=PATH`, a
//! bundle's models), as [`crate::Model::format`] does for a registered one.

use std::io::Read;
use std::path::Path;

use arcane_workspace::ModelFormat;

/// The format of the file at `path`: a Piper voice (an ONNX graph with its
/// `.onnx.json` beside it), a whisper.cpp model, GGUF or ONNX; `None` when it is none
/// of these or cannot be read.
pub fn format_of_file(path: &Path) -> Option<ModelFormat> {
    let onnx = arcane_onnx::model::looks_like_onnx(path);
    let voice = crate::piper::piper_config_path(path).is_some_and(|config| config.is_file());
    if onnx && voice {
        return Some(ModelFormat::PiperVoice);
    }
    if onnx {
        return Some(ModelFormat::Onnx);
    }
    if crate::whisper::looks_like_whisper(path) {
        return Some(ModelFormat::WhisperGgml);
    }
    let mut magic = [0u8; 4];
    let file = arcane_files::open_regular(path).ok()?;
    file.take(4).read_exact(&mut magic).ok()?;
    (&magic == b"GGUF").then_some(ModelFormat::Gguf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_format_is_told_by_its_first_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("m.gguf");
        std::fs::write(&gguf, b"GGUF\x03\0\0\0rest").unwrap();
        assert_eq!(format_of_file(&gguf), Some(ModelFormat::Gguf));
        let whisper = dir.path().join("ggml-tiny.bin");
        std::fs::write(&whisper, crate::test_whisper_bytes(crate::TINY_EN, 4)).unwrap();
        assert_eq!(format_of_file(&whisper), Some(ModelFormat::WhisperGgml));
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, b"not a model").unwrap();
        assert_eq!(format_of_file(&text), None);
        assert_eq!(format_of_file(&dir.path().join("missing")), None);
    }
}
