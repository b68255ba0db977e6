//! One readiness probe, classified, and the pure decision the supervisor takes from it.
//!
//! What "ready" and "loading" mean is each kind's own rule
//! ([`arcane_workspace::EngineKind::classify`]: llama.cpp's `/health` `{"status":"ok"}`,
//! Ollama's `/api/version`, the `command` kind's 200/503); this module asks the path,
//! classifies the answer with that rule, and tells the failures apart.
//!
//! Any other HTTP answer means something else owns the port. Only a refused connection
//! on a loopback host lets Arcane start its own engine ([`decide`]).

use std::time::Duration;

use serde_json::Value;

use arcane_workspace::Readiness;

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
    engine.kind().health_path()
}

/// Probes `address` once at the kind's readiness path, classified by [`classify`].
/// The one readiness check of every engine, whoever asks (the supervisor, an adopter).
pub async fn probe(engine: Engine, address: &EngineAddress, timeout: Duration) -> ProbeOutcome {
    probe_path(engine, health_path(engine), address, timeout).await
}

/// [`probe`] at `path` instead of the kind's readiness path (a configured `health`).
pub async fn probe_path(
    engine: Engine,
    path: &str,
    address: &EngineAddress,
    timeout: Duration,
) -> ProbeOutcome {
    match http::get(address, path, timeout).await {
        Ok(answer) => classify(engine, answer.status, &answer.body),
        Err(Failure::Refused) => ProbeOutcome::Refused,
        Err(Failure::NoHttp(error)) => ProbeOutcome::NoHttp(error),
        Err(Failure::Connect(error)) => ProbeOutcome::Unreachable(error),
    }
}

/// Classifies an HTTP answer to the readiness path by the kind's own rule.
pub fn classify(engine: Engine, status: u16, body: &[u8]) -> ProbeOutcome {
    match engine.kind().classify(status, body) {
        Readiness::Ready { version } => ProbeOutcome::Ready { version },
        Readiness::Loading => ProbeOutcome::Loading,
        Readiness::Other => ProbeOutcome::Answered {
            status,
            body: serde_json::from_slice(body)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned())),
        },
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
