//! The real `llama-server` and SmolLM2 (paths from `LLAMA_SERVER`, `ARCANE_TEST_MODEL`).

use std::time::Duration;

use arcane_localai::{Engine, EngineConfig, EngineState, Server, StopStep};
use arcane_report::CancelToken;

use crate::support::*;

fn real_config(port: u16) -> EngineConfig {
    let mut config = EngineConfig::new(Engine::LlamaCpp);
    config.url = format!("http://127.0.0.1:{port}");
    config.executable = Some(llama_server());
    config.model = Some(smollm2());
    config.device = Some("cpu".into());
    config.alias = Some("smollm2-135m".into());
    config.startup_timeout = Duration::from_secs(120);
    config
}

#[tokio::test]
async fn real_llama_server_on_the_cpu_answers_a_chat_and_stops() {
    let ws = workspace();
    let port = free_port();
    let (supervisor, events) = supervisor(ws.path());
    let server = match supervisor
        .start(real_config(port), CancelToken::new())
        .await
        .unwrap()
    {
        Server::Owned(server) => server,
        Server::Adopted(_) => panic!("nothing listened on the port; it must be owned"),
    };
    let pid = server.pid().unwrap();
    let _guard = PidGuard(pid);
    let snapshot = server.snapshot();
    assert_eq!(snapshot.state, EngineState::Ready);
    let execution = snapshot.execution.expect("an execution record");
    assert_eq!(execution["resolution"], "matched");
    assert_eq!(execution["configuredTarget"]["device"], "none");

    // The CPU target's arguments and environment reached the child.
    let cmdline = proc_list(pid, "cmdline");
    let tail: Vec<&str> = cmdline
        .iter()
        .rev()
        .take(4)
        .rev()
        .map(String::as_str)
        .collect();
    assert_eq!(
        tail,
        ["--device", "none", "--gpu-layers", "0"],
        "{cmdline:?}"
    );
    let environ = proc_list(pid, "environ");
    assert!(
        environ.iter().any(|v| v == "CUDA_VISIBLE_DEVICES="),
        "GPUs are hidden: {environ:?}"
    );

    // On its private socket: no TCP listener belongs to the engine.
    assert_eq!(arcane_process::tcp_listeners(pid).unwrap(), []);
    let socket = engine_socket(ws.path(), "llama.cpp");
    let (status, body) = http_unix(
        &socket,
        "POST",
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"Say hi."}],"max_tokens":8}"#,
        None,
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        answer["choices"][0]["message"]["content"].is_string(),
        "{body}"
    );

    let report = server.stop().await;
    assert_eq!(report.step, StopStep::Sigterm);
    assert!(!alive(pid), "llama-server is gone after stop");
    assert!(!socket.exists(), "the socket is removed after the stop");
    assert_eq!(states(&events).last().map(String::as_str), Some("stopped"));
}
