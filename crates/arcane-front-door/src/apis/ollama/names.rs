//! Ollama's model names: clients send `name:tag`, and a name without a tag means
//! `name:latest`. A gateway model's id (or alias) without a tag therefore answers to
//! `id`, and to `id:latest`; `/api/tags` lists it as `id:latest`. An id that has a tag
//! of its own (`smol:135m`) answers only to itself.

use serde_json::Value;

use super::{kind_of, OllamaError};
use crate::passthrough::ModelFacts;

/// The tag a name without one has.
pub const LATEST: &str = "latest";

/// The name `/api/tags` lists for a model id: `id:latest`, or the id when it has a
/// tag.
pub fn listed(id: &str) -> String {
    if has_tag(id) {
        id.to_string()
    } else {
        format!("{id}:{LATEST}")
    }
}

/// Whether a name has a tag (a `:` after its last `/`: `host:port/name` has none).
fn has_tag(name: &str) -> bool {
    name.rsplit('/')
        .next()
        .is_some_and(|last| last.contains(':'))
}

/// Whether `name` (as a client sends it) names the model called `id`.
pub fn names(name: &str, id: &str) -> bool {
    if name == id {
        return true;
    }
    match name.strip_suffix(":latest") {
        Some(bare) => bare == id && !has_tag(id),
        None => false,
    }
}

/// The model `asked` (the request's `model`) names, by id then alias: a 400 when it is
/// missing or not a string, a 404 listing the known names when nothing answers to it.
pub fn resolve<'a>(
    asked: &Value,
    catalog: &'a [ModelFacts],
) -> Result<&'a ModelFacts, OllamaError> {
    let name = match asked {
        Value::String(name) if !name.trim().is_empty() => name.trim(),
        Value::Null | Value::String(_) => {
            return Err(OllamaError::BadRequest("`model` is required".into()))
        }
        other => {
            return Err(OllamaError::BadRequest(format!(
                "`model` must be a string, not {}",
                kind_of(other)
            )))
        }
    };
    catalog
        .iter()
        .find(|m| names(name, &m.id))
        .or_else(|| {
            catalog
                .iter()
                .find(|m| m.aliases.iter().any(|alias| names(name, alias)))
        })
        .ok_or_else(|| OllamaError::UnknownModel {
            asked: name.to_string(),
            known: catalog
                .iter()
                .map(|m| listed(&m.id))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn facts(id: &str, aliases: &[&str]) -> ModelFacts {
        ModelFacts {
            id: id.into(),
            aliases: aliases.iter().map(|a| a.to_string()).collect(),
            kind: arcane_localai::Engine::LlamaCpp,
            file: None,
            digest: None,
            args: Vec::new(),
            device: "cpu".into(),
            loaded: false,
            resident_bytes: None,
            memory: 0,
            unloads_in: None,
            keep_alive: 300.0,
        }
    }

    #[test]
    fn a_bare_id_answers_to_itself_and_to_latest() {
        let catalog = [facts("smol", &["tiny"]), facts("qwen:7b", &[])];
        for name in ["smol", "smol:latest", "tiny", "tiny:latest"] {
            assert_eq!(
                resolve(&json!(name), &catalog).unwrap().id,
                "smol",
                "{name}"
            );
        }
        assert_eq!(resolve(&json!("qwen:7b"), &catalog).unwrap().id, "qwen:7b");
        assert!(resolve(&json!("qwen:7b:latest"), &catalog).is_err());
        assert!(resolve(&json!("qwen"), &catalog).is_err());
        assert!(resolve(&json!("smol:135m"), &catalog).is_err());
        assert_eq!(listed("smol"), "smol:latest");
        assert_eq!(listed("qwen:7b"), "qwen:7b");
        assert_eq!(listed("localhost:5000/smol"), "localhost:5000/smol:latest");
    }

    #[test]
    fn unknown_missing_and_mistyped_names_are_told_apart() {
        let catalog = [facts("smol", &[]), facts("embed", &[])];
        let unknown = resolve(&json!("llama3"), &catalog).unwrap_err();
        assert_eq!(unknown.status(), hyper::StatusCode::NOT_FOUND);
        let text = unknown.to_string();
        assert!(
            text.contains("\"llama3\"") && text.contains("smol:latest, embed:latest"),
            "{text}"
        );
        for asked in [json!(null), json!(""), json!(7)] {
            let error = resolve(&asked, &catalog).unwrap_err();
            assert_eq!(error.status(), hyper::StatusCode::BAD_REQUEST, "{asked}");
        }
    }
}
