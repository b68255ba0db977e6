//! The decision after the first probe, checked without any I/O: this is how a
//! non-loopback url is tested without ever sending traffic off loopback.

use arcane_localai::probe::{classify, decide, Decision, ProbeOutcome};
use arcane_localai::{Endpoint, Engine, Error};
use arcane_report::{codes, Diagnostic};

fn endpoint(url: &str) -> Endpoint {
    Endpoint::parse(url).unwrap()
}

fn refused() -> ProbeOutcome {
    ProbeOutcome::Refused
}

#[test]
fn refused_on_loopback_spawns() {
    for url in [
        "http://127.0.0.1:8080",
        "http://localhost:8080",
        "http://[::1]:9000",
    ] {
        assert!(
            matches!(
                decide(Engine::LlamaCpp, &endpoint(url), refused(), None),
                Decision::Spawn
            ),
            "{url}"
        );
    }
}

#[test]
fn refused_on_a_non_loopback_host_is_never_started() {
    for url in [
        "http://192.168.1.5:8080",
        "http://127.0.0.2:8080",
        "http://inference.example:8080",
    ] {
        match decide(Engine::LlamaCpp, &endpoint(url), refused(), None) {
            Decision::Fail(error @ Error::NotLoopback { .. }) => {
                assert_eq!(error.code(), codes::LOCAL_AI_SERVER_FAILED);
                assert_eq!(error.details()["url"], endpoint(url).origin());
            }
            other => panic!("{url}: {other:?}"),
        }
    }
}

#[test]
fn a_healthy_external_server_is_adopted_unless_a_selection_is_required() {
    let ready = || classify(Engine::LlamaCpp, 200, br#"{"status":"ok"}"#);
    let e = endpoint("http://127.0.0.1:8080");
    assert!(matches!(
        decide(Engine::LlamaCpp, &e, ready(), None),
        Decision::Adopt
    ));
    match decide(Engine::LlamaCpp, &e, ready(), Some("device=cpu")) {
        Decision::Fail(error) => {
            assert_eq!(error.code(), codes::LOCAL_AI_EXTERNAL_SELECTION_UNSUPPORTED)
        }
        other => panic!("{other:?}"),
    }
    // A remote server is adopted too (it is never started or signalled).
    assert!(matches!(
        decide(
            Engine::LlamaCpp,
            &endpoint("http://10.0.0.7:8080"),
            ready(),
            None
        ),
        Decision::Adopt
    ));
}

#[test]
fn a_loading_external_server_is_adopted_once_ready() {
    let loading = classify(
        Engine::LlamaCpp,
        503,
        br#"{"error":{"code":503,"message":"Loading model"}}"#,
    );
    assert!(matches!(
        decide(
            Engine::LlamaCpp,
            &endpoint("http://127.0.0.1:1"),
            loading,
            None
        ),
        Decision::AdoptLoading
    ));
}

#[test]
fn any_other_http_answer_means_another_service_owns_the_port() {
    for (status, body) in [
        (500, &br#"{"error":"x"}"#[..]),
        (502, b"{}"),
        (200, b"<html>koboldcpp</html>"),
        (404, b"nope"),
    ] {
        let outcome = classify(Engine::LlamaCpp, status, body);
        match decide(
            Engine::LlamaCpp,
            &endpoint("http://127.0.0.1:8080"),
            outcome,
            None,
        ) {
            Decision::Fail(error) => {
                assert_eq!(error.code(), codes::LOCAL_AI_SERVICE_CONFLICT, "{status}");
                assert_eq!(error.details()["status"], status);
                if status == 502 {
                    // A JSON body is kept as it was (spec case 5: `details.result`).
                    assert_eq!(error.details()["result"], serde_json::json!({}));
                }
            }
            other => panic!("{status}: {other:?}"),
        }
    }
    // Ollama's empty version is not healthy (spec case 3).
    let outcome = classify(Engine::Ollama, 200, br#"{"version":""}"#);
    assert!(matches!(
        decide(
            Engine::Ollama,
            &endpoint("http://127.0.0.1:11434"),
            outcome,
            None
        ),
        Decision::Fail(_)
    ));
}

#[test]
fn a_connection_without_http_on_loopback_is_a_port_in_use() {
    let outcome = ProbeOutcome::NoHttp(std::io::Error::other("garbage"));
    match decide(
        Engine::LlamaCpp,
        &endpoint("http://127.0.0.1:8089"),
        outcome,
        None,
    ) {
        Decision::Fail(error) => {
            assert_eq!(error.code(), codes::LOCAL_AI_PORT_IN_USE);
            assert_eq!(error.details()["port"], 8089);
        }
        other => panic!("{other:?}"),
    }
}
