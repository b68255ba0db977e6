//! A model file's header, read by the reader of its format.
//!
//! Each model format the registry records has one [`FormatReader`], in the module of
//! its kind, listed once in the crate's reader table ([`crate::READERS`]). A file is
//! read by the first reader that claims it (its first bytes, or a companion file
//! beside it); a file no reader claims is read by the last one, whose refusal names
//! what was found. What a reader reads is recorded in the model's record under its own
//! keys (`gguf`, `whisper`, a Piper voice's `onnx` and `piper`), so the registry, the
//! bundle and the CLI ask the reader — [`Model::format`](crate::Model::format),
//! [`Model::summary`](crate::Model::summary) — and never name a format themselves.

use std::path::Path;

use arcane_workspace::ModelFormat;
use serde_json::{Map, Value};

use crate::Error;

/// What a record holds of its model's header: each reader's fields under their keys.
pub type Header = Map<String, Value>;

/// What the registry knows of one model format: how a file is told, read, recorded and
/// described.
pub trait FormatReader: Sync {
    /// The format it reads.
    fn format(&self) -> ModelFormat;
    /// What `arcane model` calls a model of this format (`gguf`, `whisper`,
    /// `piper-voice`): the `kind` of its rows.
    fn kind(&self) -> &'static str;
    /// The key whose presence in a record marks a model of this format.
    fn key(&self) -> &'static str;
    /// Whether the file at `path` is of this format (a damaged one still is: [`read`]
    /// says what is wrong with it).
    ///
    /// [`read`]: FormatReader::read
    fn claims(&self, path: &Path) -> bool;
    /// Reads and checks the file at `path` (and its companions beside it): the fields
    /// its record keeps. A file that is not a usable model is
    /// [`Error::ModelInvalid`] or [`Error::FormatInvalid`], naming what is wrong.
    fn read(&self, path: &Path) -> Result<Header, Error>;
    /// What `arcane model list` and `show` say of a model, from its record.
    fn summary(&self, header: &Header) -> Summary;
}

/// What `arcane model list` and `show` say of a model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// The list's kind column: the architecture (`llama`) or the kind (`whisper`).
    pub family: String,
    /// The weights' element count.
    pub parameters: Option<u64>,
    /// The weights' type (`Q4_1`, `F16`).
    pub quantization: Option<String>,
    /// The context the model was trained with.
    pub context: Option<u64>,
    /// One line describing it (`llama, 135M parameters, Q4_1, context 8192, GGUF v3`).
    pub description: String,
}

/// The reader of the file at `path`: the first of the table that claims it, else the
/// table's last (whose refusal names what was found).
fn reader_of_file(path: &Path) -> &'static dyn FormatReader {
    let readers = crate::READERS;
    readers
        .iter()
        .copied()
        .find(|reader| reader.claims(path))
        .unwrap_or(readers[readers.len() - 1])
}

/// The format of a model file that is not registered, from its first bytes (and the
/// companions beside it): what decides which engine kind serves a model named by path
/// (`--model id=PATH`, a bundle's models), as [`crate::Model::format`] does for a
/// registered one; `None` when no reader claims it.
pub fn format_of_file(path: &Path) -> Option<ModelFormat> {
    crate::READERS
        .iter()
        .find(|reader| reader.claims(path))
        .map(|reader| reader.format())
}

/// Reads the header of the model file at `path` with its reader.
pub fn read_header(path: &Path) -> Result<(&'static dyn FormatReader, Header), Error> {
    let reader = reader_of_file(path);
    Ok((reader, reader.read(path)?))
}

/// The reader of a record's `header`: the first whose key it holds.
pub fn reader_of_record(header: &Header) -> Option<&'static dyn FormatReader> {
    crate::READERS
        .iter()
        .copied()
        .find(|reader| header.contains_key(reader.key()))
}

/// `value` recorded under `key`, in a header of its own.
pub(crate) fn recorded<T: serde::Serialize>(key: &str, value: &T) -> Header {
    let mut header = Header::new();
    header.insert(
        key.to_string(),
        serde_json::to_value(value).unwrap_or_default(),
    );
    header
}

/// The record's `key`, read back as what its reader wrote.
pub(crate) fn field<T: serde::de::DeserializeOwned>(header: &Header, key: &str) -> Option<T> {
    header
        .get(key)
        .and_then(|value| serde_json::from_value(value.clone()).ok())
}

/// `135M`, `7.2B`, `950K`: a parameter count as people write it.
pub fn human_count(count: u64) -> String {
    match count {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{}M", (n as f64 / 1e6).round()),
        n if n >= 1_000 => format!("{}K", (n as f64 / 1e3).round()),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_format_is_told_by_its_first_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("m.gguf");
        std::fs::write(&gguf, b"GGUF\x03\0\0\0rest").unwrap();
        assert_eq!(format_of_file(&gguf), Some(arcane_workspace::formats::GGUF));
        let speech = dir.path().join("ggml-tiny.bin");
        std::fs::write(&speech, crate::test_whisper_bytes(crate::TINY_EN, 4)).unwrap();
        let format = format_of_file(&speech).expect("a format");
        assert_eq!(
            arcane_workspace::Engine::for_format(format).map(|e| e.kind().id()),
            Some("whisper.cpp")
        );
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, b"not a model").unwrap();
        assert_eq!(format_of_file(&text), None);
        assert_eq!(format_of_file(&dir.path().join("missing")), None);
        // A file no reader claims is refused by the last one, naming what it found.
        let refused = read_header(&text).err().expect("refused");
        use arcane_report::Diagnostic;
        assert_eq!(refused.code(), arcane_report::codes::LOCAL_AI_MODEL_INVALID);
    }

    #[test]
    fn parameter_counts_read_as_people_write_them() {
        assert_eq!(human_count(134_515_008), "135M");
        assert_eq!(human_count(7_241_732_096), "7.2B");
        assert_eq!(human_count(950_000), "950K");
        assert_eq!(human_count(12), "12");
    }
}
