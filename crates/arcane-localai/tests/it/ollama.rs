//! Ollama: managed start with `serve`, `OLLAMA_HOST` and `OLLAMA_MODELS`; adoption and
//! the version check through `/api/version` (against the protocol-faithful fake).

use std::process::{Command, Stdio};
use std::time::Duration;

use arcane_localai::{Engine, EngineConfig, EngineState, Server, StopStep};
use arcane_report::{codes, CancelToken, Diagnostic};

use crate::support::*;

fn ollama(port: u16) -> EngineConfig {
    let mut config = EngineConfig::new(Engine::Ollama);
    config.url = format!("http://127.0.0.1:{port}");
    config.executable = Some(fake("fake_ollama.py"));
    config.startup_timeout = Duration::from_secs(20);
    config
}

fn external_ollama(port: u16, version: &str) -> Proc {
    let proc = Proc(
        Command::new(fake("fake_ollama.py"))
            .args(["serve", "--fake-version", version])
            .env("OLLAMA_HOST", format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn fake ollama"),
    );
    wait_until(Duration::from_secs(20), || {
        http_get(port, "/api/version").is_some()
    });
    proc
}

#[tokio::test]
async fn a_managed_ollama_is_started_with_serve_and_its_variables() {
    let ws = workspace();
    let port = free_port();
    let (supervisor, events) = supervisor(ws.path());
    let recorded = ws.path().join("ollama-invocation.json");
    let mut config = ollama(port);
    config.extra_args = vec!["--fake-record".into(), recorded.display().to_string()];
    let server = match supervisor.start(config, CancelToken::new()).await.unwrap() {
        Server::Owned(server) => server,
        Server::Adopted(_) => panic!("nothing listened: it must be owned"),
    };
    let snapshot = server.snapshot();
    assert_eq!(snapshot.state, EngineState::Ready);
    assert_eq!(snapshot.version.as_deref(), Some("0.5.1"));
    assert_eq!(snapshot.execution, None, "Ollama has no execution record");
    let invocation: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&recorded).unwrap()).unwrap();
    assert_eq!(invocation["argv"][0], "serve");
    assert_eq!(
        invocation["OLLAMA_HOST"],
        format!("http://127.0.0.1:{port}")
    );
    let models = ws.path().join(".arcane/models/ollama");
    assert_eq!(invocation["OLLAMA_MODELS"], models.display().to_string());
    assert!(
        models.is_dir(),
        "the models directory is created before launch"
    );
    assert_eq!(http_get(port, "/api/tags").map(|(s, _)| s), Some(200));
    let pid = server.pid().unwrap();
    assert_eq!(server.stop().await.step, StopStep::Sigterm);
    assert!(!alive(pid));
    assert_eq!(
        states(&events),
        ["starting", "starting", "ready", "stopped"]
    );
}

#[tokio::test]
async fn a_running_ollama_is_adopted_and_its_version_checked() {
    let ws = workspace();
    let port = free_port();
    let external = external_ollama(port, "v0.5.1");
    let (supervisor, events) = supervisor(ws.path());
    let mut config = ollama(port);
    config.version = Some("0.5.1".into());
    let server = supervisor.start(config, CancelToken::new()).await.unwrap();
    assert!(!server.is_owned());
    assert_eq!(server.snapshot().version.as_deref(), Some("v0.5.1"));
    assert!(events_of(&events, "process.starting").is_empty());
    server.close().await;
    assert!(alive(external.pid()));

    let mut config = ollama(port);
    config.version = Some("0.5.2".into());
    let (supervisor, _) = crate::support::supervisor(ws.path());
    let error = supervisor
        .start(config, CancelToken::new())
        .await
        .unwrap_err();
    assert_eq!(error.code(), codes::LOCAL_AI_VERSION_MISMATCH);
    assert_eq!(error.details()["observed"], "v0.5.1");
    assert!(
        alive(external.pid()),
        "a mismatching external server is left running"
    );
}
