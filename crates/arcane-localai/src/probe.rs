//! One readiness probe, classified, and the pure decision the supervisor takes from it.
//!
//! * llama.cpp: `GET /health`. `200 {"status":"ok"}` is ready. `503` with
//!   `{"error":{"message":"Loading model"}}` (current builds) or
//!   `{"status":"loading model"}` (older builds) is loading.
//! * Ollama: `GET /api/version`. A 2xx with a non-empty string `version` is ready.
//!
//! Any other HTTP answer means something else owns the port. Only a refused connection
//! on a loopback host lets Arcane start its own engine ([`decide`]).

use std::time::Duration;

use serde_json::Value;

use crate::config::Engine;
use crate::endpoint::{Endpoint, EngineAddress};
use crate::http::{self, Failure};
use crate::Error;

/// What one probe observed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ProbeOutcome {
    /// The engine answers and is ready; `version` is what it reported (Ollama only).
    Ready {
        /// The reported version (Ollama's `/api/version`).
        version: Option<String>,
    },
    /// The engine answers and is loading its model (llama.cpp 503 "Loading model").
    Loading,
    /// Something answered HTTP, but not as a healthy or loading engine.
    Answered {
        /// The HTTP status.
        status: u16,
        /// The body, parsed as JSON where possible, else as a string.
        body: Value,
    },
    /// Every address of the host refused the connection.
    Refused,
    /// A connection was made but no HTTP answer came back (some other protocol).
    NoHttp(std::io::Error),
    /// The host could not be reached for another reason (DNS, unreachable, timeout).
    Unreachable(std::io::Error),
}

/// The readiness path of `engine` (`/health`, `/api/version`).
pub fn health_path(engine: Engine) -> &'static str {
    match engine {
        Engine::LlamaCpp => "/health",
        Engine::Ollama => "/api/version",
    }
}

/// Probes `address` once: `GET` the readiness path, classified by [`classify`]. The
/// one readiness check of every engine, whoever asks (the supervisor, an adopter).
pub async fn probe(engine: Engine, address: &EngineAddress, timeout: Duration) -> ProbeOutcome {
    match http::get(address, health_path(engine), timeout).await {
        Ok(answer) => classify(engine, answer.status, &answer.body),
        Err(Failure::Refused) => ProbeOutcome::Refused,
        Err(Failure::NoHttp(error)) => ProbeOutcome::NoHttp(error),
        Err(Failure::Connect(error)) => ProbeOutcome::Unreachable(error),
    }
}

/// Classifies an HTTP answer to the readiness path: the one rule of what "ready" and
/// "loading" mean for each engine (see the module documentation).
pub fn classify(engine: Engine, status: u16, body: &[u8]) -> ProbeOutcome {
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let body_value = || {
        json.clone()
            .unwrap_or_else(|| Value::String(String::from_utf8_lossy(body).into_owned()))
    };
    let ok = (200..300).contains(&status);
    match engine {
        Engine::LlamaCpp => {
            let field = |pointer: &str| {
                json.as_ref()
                    .and_then(|j| j.pointer(pointer))
                    .and_then(Value::as_str)
                    .map(str::to_ascii_lowercase)
            };
            if ok && field("/status").as_deref() == Some("ok") {
                return ProbeOutcome::Ready { version: None };
            }
            let loading = field("/error/message").as_deref() == Some("loading model")
                || field("/status").as_deref() == Some("loading model");
            if status == 503 && loading {
                return ProbeOutcome::Loading;
            }
        }
        Engine::Ollama => {
            let version = json
                .as_ref()
                .and_then(|j| j.get("version"))
                .and_then(Value::as_str)
                .filter(|v| !v.is_empty());
            if let (true, Some(version)) = (ok, version) {
                return ProbeOutcome::Ready {
                    version: Some(version.to_string()),
                };
            }
        }
    }
    ProbeOutcome::Answered {
        status,
        body: body_value(),
    }
}

/// What the supervisor does after its first probe.
#[derive(Debug)]
#[non_exhaustive]
pub enum Decision {
    /// A healthy external server answers: adopt it (never signalled, left running).
    Adopt,
    /// An external server answers and is loading: adopt it once it is ready.
    AdoptLoading,
    /// Nothing listens on a loopback host: start the configured executable.
    Spawn,
    /// Fail without spawning anything.
    Fail(Error),
}

/// The decision for one probe outcome. Pure: no I/O, so it is tested for every case,
/// including non-loopback hosts that tests must never contact.
///
/// `selection` names a managed selection (`device=cpu`, `backend=cuda`) when one is
/// required; an external server cannot honour it.
pub fn decide(
    engine: Engine,
    endpoint: &Endpoint,
    outcome: ProbeOutcome,
    selection: Option<&str>,
) -> Decision {
    let url = endpoint.origin();
    match outcome {
        ProbeOutcome::Ready { .. } | ProbeOutcome::Loading => match selection {
            Some(selection) => Decision::Fail(Error::ExternalSelection {
                engine: engine.as_str().into(),
                url,
                selection: selection.into(),
            }),
            None if matches!(outcome, ProbeOutcome::Loading) => Decision::AdoptLoading,
            None => Decision::Adopt,
        },
        ProbeOutcome::Answered { status, body } => Decision::Fail(Error::ServiceConflict {
            engine: engine.as_str().into(),
            url,
            status,
            body: truncate(body),
        }),
        ProbeOutcome::Refused if endpoint.is_loopback() => Decision::Spawn,
        ProbeOutcome::Refused => Decision::Fail(Error::NotLoopback { url }),
        ProbeOutcome::NoHttp(error) if endpoint.is_loopback() => {
            let _ = error;
            Decision::Fail(Error::PortInUse {
                port: endpoint.port(),
                url,
                evidence: "no-http-answer".into(),
                last_lines: Vec::new(),
            })
        }
        ProbeOutcome::NoHttp(source) | ProbeOutcome::Unreachable(source) => {
            Decision::Fail(Error::Unreachable { url, source })
        }
    }
}

/// Keeps a JSON body as it is; cuts a long text body (an HTML page) to 1000 characters.
fn truncate(body: Value) -> Value {
    match body {
        Value::String(text) if text.chars().count() > 1000 => {
            Value::String(text.chars().take(1000).collect())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_llama_loading_shapes_are_loading() {
        let new = br#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#;
        assert!(matches!(
            classify(Engine::LlamaCpp, 503, new),
            ProbeOutcome::Loading
        ));
        let old = br#"{"status":"loading model"}"#;
        assert!(matches!(
            classify(Engine::LlamaCpp, 503, old),
            ProbeOutcome::Loading
        ));
        assert!(matches!(
            classify(Engine::LlamaCpp, 200, br#"{"status":"ok"}"#),
            ProbeOutcome::Ready { .. }
        ));
        // A 200 that is not `ok` (KoboldCpp answers 200 everywhere) is not ready.
        assert!(matches!(
            classify(Engine::LlamaCpp, 200, b"<html>"),
            ProbeOutcome::Answered { status: 200, .. }
        ));
        assert!(matches!(
            classify(Engine::LlamaCpp, 502, br#"{"x":1}"#),
            ProbeOutcome::Answered { status: 502, .. }
        ));
    }

    #[test]
    fn ollama_needs_a_non_empty_version() {
        assert!(matches!(
            classify(Engine::Ollama, 200, br#"{"version":""}"#),
            ProbeOutcome::Answered { .. }
        ));
        match classify(Engine::Ollama, 200, br#"{"version":"0.5.1"}"#) {
            ProbeOutcome::Ready { version } => assert_eq!(version.as_deref(), Some("0.5.1")),
            other => panic!("{other:?}"),
        }
    }
}
