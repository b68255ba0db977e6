//! What an application key's scope lets it call: one table, read once per request
//! after the credential is checked ([`crate::http`]).
//!
//! An `admin` principal (the workspace token, or a key made with `--scope admin`) may
//! call everything. An `inference` key may call the inference paths of each API the
//! front door speaks, listed by API (below, and each translated API's in its module),
//! and list models; everything else (`arcane/1`
//! and its events, the logs, `/metrics`, the engines' own control paths such as
//! llama.cpp's `/slots` and `/props`, Ollama's `pull`/`delete`) answers **403**
//! `CORE_SCOPE_DENIED` in the error shape of the API the path belongs to. A new API's
//! inference paths are a row here, and a kind's own names for them (llama.cpp's
//! `/completion`) are in its descriptor; the route table and the handlers are not
//! touched.

use hyper::{Method, Response, StatusCode};
use serde_json::json;

use crate::router::{Handler, Lookup};
use arcane_core::keys::Principal;
use arcane_core::upstream::HttpBody;
use arcane_report::codes;

/// The inference paths of each API the engines speak (a path ending in `/` stands for
/// every path below it, any other for exactly itself: [`arcane_localai::serves_path`]);
/// the translated APIs list theirs in [`crate::apis::INFERENCE_PATHS`].
pub const INFERENCE_PATHS: &[(&str, &[&str])] = &[
    (
        "OpenAI",
        &[
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/responses",
            "/v1/rerank",
            "/v1/audio/speech",
            "/v1/audio/transcriptions",
            "/v1/audio/translations",
            "/v1/images/generations",
            "/v1/images/edits",
            "/v1/models",
            "/v1/models/",
        ],
    ),
    ("Anthropic", &["/v1/messages", "/v1/messages/count_tokens"]),
];

/// The inference paths of the APIs that an engine answers beside its slots: cheap, never
/// queued behind generations ([`is_work`]). Each kind lists its own besides
/// ([`arcane_localai::EngineKind::light_paths`]).
const LIGHT_PATHS: &[&str] = &[
    "/v1/models",
    "/v1/models/",
    "/v1/messages/count_tokens",
    "/api/tags",
    "/api/show",
    "/api/ps",
    "/api/version",
];

/// Whether `method path` is work that takes one of a model's `parallel` slots, and so
/// waits its turn in the model's queue: a `POST` to an inference path that is not a
/// light one. A listing, `/slots`, `/props` or `/tokenize` is answered at once even
/// while every slot is busy.
pub fn is_work(method: &Method, path: &str) -> bool {
    *method == Method::POST
        && is_inference_path(path)
        && !arcane_localai::serves_path(LIGHT_PATHS, path)
        && !any_kind_serves(path, |kind| kind.light_paths())
}

/// Whether one of the kinds' `paths` (its inference or light paths) is `path`.
fn any_kind_serves(
    path: &str,
    paths: impl Fn(&dyn arcane_localai::EngineKind) -> &'static [&'static str],
) -> bool {
    arcane_localai::Engine::ALL
        .iter()
        .any(|engine| arcane_localai::serves_path(paths(engine.kind()), path))
}

/// Whether `path` is an inference path: of an API (the tables above, and the translated
/// APIs' [`crate::apis::INFERENCE_PATHS`]), or of a kind's own
/// ([`arcane_localai::EngineKind::inference_paths`]).
fn is_inference_path(path: &str) -> bool {
    INFERENCE_PATHS
        .iter()
        .chain(crate::apis::INFERENCE_PATHS)
        .any(|(_, paths)| arcane_localai::serves_path(paths, path))
        || any_kind_serves(path, |kind| kind.inference_paths())
}

/// Whether an inference key may call `method path` as the route table found it.
fn inference_may_call(lookup: Lookup, path: &str) -> bool {
    let inference_path = || is_inference_path(path);
    match lookup {
        Lookup::Found(Handler::ModelList | Handler::ModelEntry) => true,
        // The engines' paths and the translated APIs': their inference paths only
        // (not llama.cpp's `/props`, `/slots`, `/metrics`; not Ollama's `pull`).
        Lookup::Found(Handler::Api(_) | Handler::Engine) => inference_path(),
        _ => false,
    }
}

/// `Ok` when `principal` may call `method path`; else the 403 to answer with.
pub fn permit(
    principal: &Principal,
    lookup: Lookup,
    method: &Method,
    path: &str,
) -> Result<(), Box<Response<HttpBody>>> {
    if principal.is_admin() || inference_may_call(lookup, path) {
        return Ok(());
    }
    let apis: Vec<&str> = INFERENCE_PATHS
        .iter()
        .chain(crate::apis::INFERENCE_PATHS)
        .map(|(api, _)| *api)
        .collect();
    let message = format!(
        "the key `{}` has the `inference` scope, which may not call `{method} {path}`: it may call the inference paths of the {} APIs (chat, completions, embeddings, speech, images) and list models; everything else needs an admin key",
        principal.name,
        apis.join(", ")
    );
    let details = json!({"key": &*principal.name, "scope": principal.scope, "method": method.as_str(), "path": path});
    let body = crate::apis::error_body(path, codes::CORE_SCOPE_DENIED, &message).unwrap_or_else(
        || json!({"error": {"code": codes::CORE_SCOPE_DENIED, "message": message, "type": "permission_error", "details": details}}),
    );
    Err(Box::new(crate::http::json_response(
        StatusCode::FORBIDDEN,
        &body,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arcane_core::keys::Scope;

    fn inference() -> Principal {
        Principal {
            name: "app".into(),
            scope: Scope::Inference,
            ..Principal::workspace()
        }
    }

    fn allowed(method: Method, path: &str) -> bool {
        let lookup = crate::router::lookup(
            crate::router::TABLE,
            &|p| arcane_localai::serves_path(arcane_localai::Engine::DEFAULT.kind().api_paths(), p),
            &method,
            path,
            true,
        );
        permit(&inference(), lookup, &method, path).is_ok()
    }

    #[test]
    fn inference_keys_reach_inference_and_listings_only() {
        for (method, path) in [
            (Method::POST, "/v1/chat/completions"),
            (Method::POST, "/v1/messages"),
            (Method::POST, "/v1/embeddings"),
            (Method::GET, "/v1/models"),
            (Method::GET, "/v1/models/smol"),
            (Method::POST, "/api/chat"),
            (Method::GET, "/api/tags"),
            (Method::POST, "/tokenize"),
        ] {
            assert!(allowed(method.clone(), path), "{method} {path}");
        }
        for (method, path) in [
            (Method::POST, "/v1/rpc"),
            (Method::GET, "/v1/events"),
            (Method::GET, "/v1/logs"),
            (Method::GET, "/v1/health"),
            (Method::GET, "/metrics"),
            (Method::POST, "/props"),
            (Method::GET, "/props"),
            (Method::GET, "/slots"),
            (Method::POST, "/slots/0"),
            (Method::POST, "/api/pull"),
            (Method::DELETE, "/api/delete"),
            (Method::POST, "/lora-adapters"),
        ] {
            assert!(!allowed(method.clone(), path), "{method} {path}");
        }
    }

    #[test]
    fn generations_queue_and_listings_and_engine_controls_do_not() {
        for path in [
            "/v1/chat/completions",
            "/v1/embeddings",
            "/v1/audio/speech",
            "/completion",
            "/v1/messages",
            "/api/chat",
        ] {
            assert!(is_work(&Method::POST, path), "{path}");
        }
        for (method, path) in [
            (Method::GET, "/slots"),
            (Method::POST, "/slots/0"),
            (Method::POST, "/props"),
            (Method::POST, "/tokenize"),
            (Method::GET, "/v1/models"),
            (Method::POST, "/v1/messages/count_tokens"),
        ] {
            assert!(!is_work(&method, path), "{method} {path}");
        }
    }

    #[test]
    fn admin_principals_call_everything() {
        let lookup = Lookup::Found(Handler::Rpc);
        assert!(permit(&Principal::workspace(), lookup, &Method::POST, "/v1/rpc").is_ok());
    }
}
