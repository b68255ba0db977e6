//! Unknown keys in a TOML configuration file are usage errors, never silently ignored.
//!
//! A typo such as `[[engines]]` for `[[engine]]` would otherwise be skipped by serde
//! and the built-in default would run instead of what the file meant. The known keys
//! come from the `Deserialize` type itself ([`field_names`]), so the list a person is
//! shown can never drift from what is parsed.

use std::path::Path;

use serde::de::{self, Deserializer, Visitor};
use serde_json::json;

use crate::error::Refusal;

/// The field names `T` deserializes (the `fields` serde passes to
/// `deserialize_struct`); empty for a type that is not a struct.
pub fn field_names<'de, T: serde::Deserialize<'de>>() -> &'static [&'static str] {
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(FieldCapture(&mut fields));
    fields
}

/// A deserializer that records the struct fields it is asked for and fails at once.
struct FieldCapture<'a>(&'a mut &'static [&'static str]);

impl<'de> Deserializer<'de> for FieldCapture<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("only the field names are captured"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = fields;
        Err(de::Error::custom("only the field names are captured"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
        identifier ignored_any
    }
}

/// Refuses the first key of `table` that is not in `known`: a usage error naming the
/// key, where it is (`place`, e.g. "the top level" or "`[[engine]]` #1"), the file,
/// the known keys, and the closest known key when the key looks like a misspelling.
pub fn refuse_unknown(
    path: &Path,
    place: &str,
    table: &toml::Table,
    known: &[&str],
) -> Result<(), Refusal> {
    let Some(key) = table.keys().find(|k| !known.contains(&k.as_str())) else {
        return Ok(());
    };
    let suggestion = closest(key, known);
    let listed = known
        .iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut error = Refusal::usage(
        format!("unknown key `{key}` at {place} of `{}`", path.display()),
        json!({"path": path, "key": key, "table": place, "known": known, "suggestion": suggestion}),
    );
    if let Some(instead) = llama_swap(key) {
        error = error.hint(format!(
            "`{key}` is llama-swap's; arcane.toml says {instead} (docs/llama-swap.md maps every key)"
        ));
    } else if let Some(suggestion) = suggestion {
        error = error.hint(format!("did you mean `{suggestion}`?"));
    }
    Err(error.hint(format!(
        "the keys known there are {listed} (see `docs/arcane.toml.example`)"
    )))
}

/// Keys of llama-swap's `config.yaml` that someone moving from it writes, and what
/// `arcane.toml` says instead (the whole mapping is `docs/llama-swap.md`).
const LLAMA_SWAP: &[(&str, &str)] = &[
    (
        "ttl",
        "`keep_alive` (`-1`: never; llama-swap's `ttl: 0` is `-1` here)",
    ),
    (
        "cmd",
        "`model` and `args` for the engine Arcane starts from a model file, or `command = [...]` for another server",
    ),
    ("proxy", "`url`, for a server Arcane does not start"),
    ("checkEndpoint", "`health`"),
    ("healthCheckTimeout", "`startup_timeout`, per model"),
    ("useModelName", "`upstream_model`"),
    ("preload", "`load = \"on-start\"`"),
    ("persistent", "`pin = true`"),
    ("swap", "`exclusive = true`"),
    ("models", "`[[model]]` tables"),
    ("groups", "`[[group]]` tables"),
];

/// What `arcane.toml` says for llama-swap's key `key`, when it is one.
fn llama_swap(key: &str) -> Option<&'static str> {
    LLAMA_SWAP
        .iter()
        .find(|(theirs, _)| *theirs == key)
        .map(|(_, ours)| *ours)
}

/// The known key closest to `key`, when it is close enough to be a misspelling.
fn closest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    let normalized = key.to_ascii_lowercase().replace('-', "_");
    known
        .iter()
        .map(|k| (strsim::jaro_winkler(&normalized, k), *k))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Sample {
        engine: Vec<String>,
        startup_timeout: Option<f64>,
    }

    #[test]
    fn field_names_come_from_the_type() {
        assert_eq!(field_names::<Sample>(), ["engine", "startup_timeout"]);
    }

    #[test]
    fn close_misspellings_are_suggested_and_far_ones_are_not() {
        let known = ["engine", "startup_timeout"];
        assert_eq!(closest("engines", &known), Some("engine"));
        assert_eq!(closest("startup-timeout", &known), Some("startup_timeout"));
        assert_eq!(closest("zzz", &known), None);
    }

    #[test]
    fn an_unknown_key_names_itself_the_file_and_the_known_keys() {
        let table: toml::Table = toml::from_str("engines = 1\n").unwrap();
        let error = refuse_unknown(
            Path::new("/w/arcane.toml"),
            "the top level",
            &table,
            &["engine"],
        )
        .unwrap_err();
        assert!(error.message.contains("`engines`"), "{}", error.message);
        assert!(
            error.message.contains("/w/arcane.toml"),
            "{}",
            error.message
        );
        assert_eq!(error.details["known"], json!(["engine"]));
        assert_eq!(error.details["suggestion"], "engine");
        assert!(refuse_unknown(Path::new("x"), "the top level", &table, &["engines"]).is_ok());
    }

    #[test]
    fn a_llama_swap_key_is_told_what_arcane_toml_says_instead() {
        let table: toml::Table = toml::from_str("ttl = 60\n").unwrap();
        let known = ["id", "keep_alive", "load"];
        let error = refuse_unknown(
            Path::new("/w/arcane.toml"),
            "`[[model]]` #1",
            &table,
            &known,
        )
        .unwrap_err();
        assert!(
            error.hints[0].contains("llama-swap") && error.hints[0].contains("`keep_alive`"),
            "{:?}",
            error.hints
        );
    }
}
