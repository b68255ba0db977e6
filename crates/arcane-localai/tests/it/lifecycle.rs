//! The owned and adopted lifecycle against the fault-injecting fake llama server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arcane_localai::{EngineState, Error, RestartPolicy, Server, StopStep};
use arcane_report::{codes, CancelToken, Diagnostic};

use crate::support::*;

fn owned(server: Server) -> arcane_localai::OwnedServer {
    match server {
        Server::Owned(owned) => owned,
        Server::Adopted(_) => panic!("expected an owned server"),
    }
}

#[tokio::test]
async fn owned_server_listens_on_its_private_socket_answers_and_stops_with_sigterm() {
    let ws = workspace();
    let port = free_port();
    let (supervisor, events) = supervisor(ws.path());
    let mut config = fake_llama(port, &[]);
    config.alias = Some("smol".into());
    let server = owned(supervisor.start(config, CancelToken::new()).await.unwrap());
    let snapshot = server.snapshot();
    assert_eq!(snapshot.state, EngineState::Ready);
    assert!(snapshot.available && snapshot.owned && snapshot.managed && !snapshot.external);
    let pid = server.pid().unwrap();
    let _guard = PidGuard(pid);
    assert!(alive(pid));
    // The command line is the SDK's, in order, with the socket as the host.
    let socket = engine_socket(ws.path(), "llama.cpp");
    let cmdline = proc_list(pid, "cmdline");
    let args: Vec<&str> = cmdline
        .iter()
        .map(String::as_str)
        .skip_while(|a| *a != "--host")
        .collect();
    let socket_text = socket.display().to_string();
    assert_eq!(
        args,
        [
            "--host",
            socket_text.as_str(),
            "--jinja",
            "--model",
            "/nonexistent/fake.gguf",
            "--alias",
            "smol"
        ]
    );
    assert_eq!(snapshot.socket.as_deref(), Some(socket.as_path()));
    assert_eq!(snapshot.url, format!("unix:{}", socket.display()));
    assert!(!snapshot.reachable_without_token());
    // No TCP port at all, and nothing at the configured url; the socket's directory
    // is this user's alone.
    assert_eq!(arcane_process::tcp_listeners(pid).unwrap(), []);
    assert!(http_get(port, "/health").is_none());
    let run = std::fs::metadata(socket.parent().unwrap()).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&run.permissions()) & 0o777,
        0o700
    );
    // The ownership record exists while it runs.
    let record = ws.path().join(".arcane/engines/llama.cpp.json");
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    assert_eq!(written["pid"], pid);
    assert_eq!(written["url"], snapshot.url);
    let (status, body) = http_unix(
        &socket,
        "POST",
        "/v1/chat/completions",
        r#"{"messages":[]}"#,
        None,
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");

    let report = server.stop().await;
    assert_eq!(report.step, StopStep::Sigterm);
    assert!(!alive(pid), "the engine must be gone after stop");
    assert!(
        !record.exists(),
        "the ownership record is removed after stop"
    );
    assert!(!socket.exists(), "the socket file is removed after stop");
    assert_eq!(server.snapshot().state, EngineState::Stopped);
    // Idempotent: the same report again, no second stop.
    assert_eq!(server.stop().await.step, StopStep::Sigterm);
    assert_eq!(
        states(&events),
        ["starting", "starting", "ready", "stopped"]
    );
    let stopped = events_of(&events, "local-ai.server.stopped");
    assert_eq!(stopped.len(), 1);
    assert_eq!(stopped[0]["stopStep"], "sigterm");
    // The key never appears in an event.
    assert!(stopped[0].get("apiKey").is_none());
}

#[tokio::test]
async fn an_owned_server_on_a_port_demands_its_key_and_the_key_never_leaves_the_core() {
    let ws = workspace();
    let port = free_port();
    let (supervisor, events) = supervisor(ws.path());
    let mut config = fake_llama(port, &[]);
    config.listen = arcane_localai::OwnedListen::KeyedPort;
    let server = owned(supervisor.start(config, CancelToken::new()).await.unwrap());
    let pid = server.pid().unwrap();
    let _guard = PidGuard(pid);
    let snapshot = server.snapshot();
    let key = snapshot.api_key.clone().expect("a key for a TCP port");
    assert!(!snapshot.reachable_without_token());
    assert_eq!(
        arcane_process::tcp_listeners(pid).unwrap(),
        [format!("127.0.0.1:{port}").parse().unwrap()]
    );
    // Without the key: 401, even for the model list; with it: the answer.
    for (method, path) in [("POST", "/v1/chat/completions"), ("GET", "/v1/models")] {
        let (status, _) = http_keyed(port, method, path, "{}", None).unwrap();
        assert_eq!(status, 401, "{method} {path}");
        let (status, _) = http_keyed(port, method, path, "{}", Some("wrong-key")).unwrap();
        assert_eq!(status, 401, "{method} {path}");
        let (status, body) = http_keyed(port, method, path, "{}", Some(key.expose())).unwrap();
        assert_eq!(status, 200, "{method} {path}: {body}");
    }
    let file = ws.path().join(".arcane/run/llama.cpp.key");
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o600
    );
    // The key is on no command line and in no event.
    assert!(!proc_list(pid, "cmdline")
        .iter()
        .any(|a| a.contains(key.expose())));
    for event in events.events() {
        assert!(
            !event.data.to_string().contains(key.expose()),
            "{}",
            event.kind
        );
    }
    assert!(!format!("{snapshot:?}").contains(key.expose()));
    server.stop().await;
    assert!(!file.exists(), "the key file is removed after stop");
}

#[tokio::test]
async fn readiness_comes_from_polling_when_no_listening_line_is_printed() {
    let ws = workspace();
    let port = free_port();
    let (supervisor, _) = supervisor(ws.path());
    let server = owned(
        supervisor
            .start(fake_llama(port, &["silent"]), CancelToken::new())
            .await
            .unwrap(),
    );
    assert!(server.snapshot().available);
    server.stop().await;
}

#[tokio::test]
async fn both_loading_shapes_publish_loading_then_ready() {
    for mode in ["loading=1", "loading-old=1"] {
        let ws = workspace();
        let port = free_port();
        let (supervisor, events) = supervisor(ws.path());
        let server = owned(
            supervisor
                .start(fake_llama(port, &[mode]), CancelToken::new())
                .await
                .unwrap(),
        );
        assert_eq!(
            states(&events),
            ["starting", "starting", "loading", "ready"],
            "{mode}"
        );
        server.stop().await;
    }
}

#[tokio::test]
async fn an_owned_child_answering_http_500_is_an_error_and_is_stopped() {
    let ws = workspace();
    let port = free_port();
    let (supervisor, events) = supervisor(ws.path());
    let error = supervisor
        .start(fake_llama(port, &["http500"]), CancelToken::new())
        .await
        .unwrap_err();
    assert!(
        matches!(error, Error::NotReady { status: 500, .. }),
        "{error:?}"
    );
    assert_eq!(error.code(), codes::LOCAL_AI_SERVER_FAILED);
    let pid = events_of(&events, "process.exited")[0]["pid"]
        .as_u64()
        .unwrap() as u32;
    assert!(!alive(pid));
    assert_eq!(states(&events).last().map(String::as_str), Some("error"));
    assert!(!ws.path().join(".arcane/engines/llama.cpp.json").exists());
}

#[tokio::test]
async fn another_service_on_the_port_fails_without_spawning() {
    let ws = workspace();
    let port = free_port();
    let external = external_fake_llama(port, &["http500"]);
    let (supervisor, events) = supervisor(ws.path());
    let error = supervisor
        .start(fake_llama(port, &[]), CancelToken::new())
        .await
        .unwrap_err();
    assert_eq!(error.code(), codes::LOCAL_AI_SERVICE_CONFLICT, "{error:?}");
    assert!(
        events_of(&events, "process.starting").is_empty(),
        "nothing may be spawned"
    );
    let errors = events_of(&events, "local-ai.server.error");
    assert_eq!(errors[0]["external"], true);
    assert_eq!(errors[0]["error"]["code"], codes::LOCAL_AI_SERVICE_CONFLICT);
    assert!(alive(external.pid()));
}

#[tokio::test]
async fn a_child_that_exits_early_fails_at_once_with_its_code_and_last_lines() {
    let ws = workspace();
    let port = free_port();
    let (supervisor, events) = supervisor(ws.path());
    let mut config = fake_llama(port, &["exit-early=3"]);
    config.startup_timeout = Duration::from_secs(600);
    let error = supervisor
        .start(config, CancelToken::new())
        .await
        .unwrap_err();
    match &error {
        Error::ExitedEarly {
            code, last_lines, ..
        } => {
            assert_eq!(*code, Some(3));
            assert!(
                last_lines
                    .iter()
                    .any(|l| l.contains("failed to load model")),
                "{last_lines:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    let details = error.details();
    assert_eq!(details["exitCode"], 3);
    let error_event = &events_of(&events, "local-ai.server.error")[0];
    assert_eq!(error_event["error"]["code"], codes::LOCAL_AI_SERVER_FAILED);
}

#[tokio::test]
async fn a_child_that_never_becomes_ready_times_out_and_is_stopped() {
    let ws = workspace();
    let port = free_port();
    let (supervisor, events) = supervisor(ws.path());
    let mut config = fake_llama(port, &["never-ready"]);
    config.startup_timeout = Duration::from_millis(1500);
    let error = supervisor
        .start(config, CancelToken::new())
        .await
        .unwrap_err();
    assert!(matches!(error, Error::StartupTimeout { .. }), "{error:?}");
    assert!(
        !error.last_lines().is_empty(),
        "last output lines belong in the details"
    );
    let pid = events_of(&events, "process.exited")[0]["pid"]
        .as_u64()
        .unwrap() as u32;
    assert!(!alive(pid));
}

#[tokio::test]
async fn a_load_that_stalls_is_an_error() {
    let ws = workspace();
    let port = free_port();
    let (supervisor, events) = supervisor(ws.path());
    let mut config = fake_llama(port, &["loading-forever"]);
    config.stall_timeout = Duration::from_millis(1200);
    config.startup_timeout = Duration::from_secs(120);
    let error = supervisor
        .start(config, CancelToken::new())
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Stalled { .. }), "{error:?}");
    assert_eq!(
        states(&events),
        ["starting", "starting", "loading", "error"]
    );
}

#[tokio::test]
async fn a_child_that_ignores_sigterm_is_killed_after_the_grace() {
    let ws = workspace();
    let port = free_port();
    let (supervisor, events) = supervisor(ws.path());
    let mut config = fake_llama(port, &["ignore-term"]);
    config.stop_grace = Duration::from_millis(600);
    let server = owned(supervisor.start(config, CancelToken::new()).await.unwrap());
    let pid = server.pid().unwrap();
    let _guard = PidGuard(pid);
    let report = server.stop().await;
    assert_eq!(report.step, StopStep::Sigkill);
    assert_eq!(report.exit.and_then(|e| e.signal), Some(9));
    assert!(!alive(pid));
    assert_eq!(
        events_of(&events, "process.cancellation.escalated").len(),
        1
    );
    assert_eq!(
        events_of(&events, "local-ai.server.stopped")[0]["stopStep"],
        "sigkill"
    );
}

#[tokio::test]
async fn a_crash_after_ready_is_an_error_event_with_the_exit_status() {
    let ws = workspace();
    let port = free_port();
    let (supervisor, events) = supervisor(ws.path());
    let hook_runs = Arc::new(AtomicUsize::new(0));
    let counter = hook_runs.clone();
    let server = supervisor
        .start_with_exit_hook(
            fake_llama(port, &["crash-after=0.3"]),
            CancelToken::new(),
            Some(Box::new(move |_| {
                counter.fetch_add(1, Ordering::SeqCst);
            })),
        )
        .await
        .unwrap();
    let server = owned(server);
    let report = tokio::time::timeout(Duration::from_secs(30), server.wait())
        .await
        .unwrap();
    assert_eq!(report.exit.and_then(|e| e.code), Some(7));
    assert_eq!(report.snapshot.state, EngineState::Error);
    let error = &events_of(&events, "local-ai.server.error")[0];
    assert_eq!(error["exit"]["code"], 7);
    assert_eq!(error["error"]["details"]["exitCode"], 7);
    // Stop after a crash is harmless and the hook ran exactly once.
    assert_eq!(server.stop().await.step, StopStep::AlreadyExited);
    assert_eq!(hook_runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_crash_is_restarted_under_on_failure() {
    let ws = workspace();
    let port = free_port();
    let (supervisor, events) = supervisor(ws.path());
    let state = ws.path().join("crashed-once");
    let mut config = fake_llama(port, &["crash-after=0.2"]);
    config
        .extra_args
        .extend(["--fake-state".to_string(), state.display().to_string()]);
    config.restart = RestartPolicy::OnFailure {
        max_restarts: 2,
        backoff: Duration::from_millis(100),
    };
    let server = owned(supervisor.start(config, CancelToken::new()).await.unwrap());
    let first = server.pid().unwrap();
    let mut states_rx = server.subscribe();
    let restarted = tokio::time::timeout(
        Duration::from_secs(30),
        states_rx.wait_for(|s| s.restarts == 1 && s.available),
    )
    .await
    .map(|r| r.is_ok());
    assert_eq!(restarted, Ok(true), "no restart: {:?}", events.types());
    let second = server.pid().unwrap();
    assert_ne!(first, second);
    assert!(!alive(first));
    assert_eq!(
        states(&events),
        ["starting", "starting", "ready", "error", "starting", "ready"]
    );
    let report = server.stop().await;
    assert_eq!(report.step, StopStep::Sigterm);
    assert!(!alive(second));
}

/// Issue 10, item 10: when `on-failure` has no restart left it says so, once, naming
/// the engine, the count and the last error.
#[tokio::test]
async fn giving_up_after_the_last_restart_is_a_clear_error() {
    let ws = workspace();
    let port = free_port();
    let (supervisor, events) = supervisor(ws.path());
    let mut config = fake_llama(port, &["crash-after=0.2"]);
    config.restart = RestartPolicy::OnFailure {
        max_restarts: 1,
        backoff: Duration::from_millis(50),
    };
    let server = owned(supervisor.start(config, CancelToken::new()).await.unwrap());
    let report = tokio::time::timeout(Duration::from_secs(60), server.wait())
        .await
        .expect("down for good after its one restart");
    assert_eq!(report.snapshot.state, EngineState::Error);
    assert_eq!(report.snapshot.restarts, 1);
    let errors = events_of(&events, "local-ai.server.error");
    let gave_up: Vec<_> = errors
        .iter()
        .filter(|e| e["error"]["details"]["gaveUp"] == true)
        .collect();
    assert_eq!(gave_up.len(), 1, "{errors:#?}");
    let message = gave_up[0]["error"]["message"].as_str().unwrap();
    assert_eq!(
        message,
        "gave up restarting `llama.cpp` after 1 restart: `llama.cpp` stopped unexpectedly (exit code 7)"
    );
    assert_eq!(
        errors.last(),
        gave_up.last().copied(),
        "it is the last word"
    );
}

#[tokio::test]
async fn a_port_bound_by_another_process_is_reported_as_such() {
    let ws = workspace();
    // Bound but not listening: the probe is refused, the bind check catches it.
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = socket.local_addr().unwrap().port();
    let tcp = std::net::TcpListener::bind(("127.0.0.1", port));
    drop(socket);
    let Ok(tcp) = tcp else { return };
    // A listener that never speaks HTTP: the probe connects and gets no answer.
    let (supervisor, events) = supervisor(ws.path());
    let mut config = fake_llama(port, &[]);
    config.probe_timeout = Duration::from_millis(500);
    let error = supervisor
        .start(config, CancelToken::new())
        .await
        .unwrap_err();
    assert_eq!(error.code(), codes::LOCAL_AI_PORT_IN_USE, "{error:?}");
    assert_eq!(error.details()["port"], port);
    assert!(error.to_string().contains(&port.to_string()));
    assert!(events_of(&events, "process.starting").is_empty());
    drop(tcp);
}

#[tokio::test]
async fn a_bound_but_silent_socket_is_a_port_in_use_without_spawning() {
    let ws = workspace();
    let port = free_port();
    // Bind without listening (a refused probe), through a raw socket.
    let fd = bind_only(port);
    let (supervisor, events) = supervisor(ws.path());
    let mut config = fake_llama(port, &[]);
    config.listen = arcane_localai::OwnedListen::KeyedPort;
    let error = supervisor
        .start(config, CancelToken::new())
        .await
        .unwrap_err();
    assert_eq!(error.code(), codes::LOCAL_AI_PORT_IN_USE, "{error:?}");
    assert_eq!(error.details()["evidence"], "bind");
    assert!(events_of(&events, "process.starting").is_empty());
    drop(fd);
}

/// A TCP socket bound to 127.0.0.1:port but not listening (connections are refused).
fn bind_only(port: u16) -> std::process::Child {
    let script = format!(
        "import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',{port}))\nprint('bound',flush=True)\ntime.sleep(60)\n"
    );
    let mut child = std::process::Command::new("python3")
        .args(["-c", &script])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let stdout = child.stdout.take().unwrap();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
    assert_eq!(line.trim(), "bound");
    child
}

/// Issue 10, item 10: a server Arcane did not start that keeps answering `loading`
/// (a squatter) is not blamed on `startup_timeout`: the error says that something else
/// serves the URL, names it, and how to pick another `--url`; it is left running.
#[tokio::test]
async fn an_external_server_loading_forever_is_named_not_blamed_on_the_timeout() {
    let ws = workspace();
    let port = free_port();
    let external = external_fake_llama(port, &["loading-forever"]);
    let (supervisor, events) = supervisor(ws.path());
    let mut config = fake_llama(port, &[]);
    config.startup_timeout = Duration::from_millis(800);
    let error = supervisor
        .start(config, CancelToken::new())
        .await
        .unwrap_err();
    assert!(matches!(error, Error::ExternalNotReady { .. }), "{error:?}");
    let url = format!("http://127.0.0.1:{port}");
    assert!(error.to_string().contains(&url), "{error}");
    assert!(error.to_string().contains("did not start"), "{error}");
    let hints = error.hints().join("\n");
    assert!(!hints.contains("startup_timeout"), "{hints}");
    assert!(
        hints.contains(&format!("something else already serves `{url}`")),
        "{hints}"
    );
    assert!(hints.contains("--url"), "{hints}");
    assert_eq!(error.details()["external"], true);
    assert!(events_of(&events, "process.starting").is_empty());
    assert!(alive(external.pid()), "an adopted server is never stopped");
}

/// Issue 10, item 11: the missing-runtime hint names the engine that was asked for.
#[tokio::test]
async fn the_missing_executable_hint_names_the_engine_asked_for() {
    let ws = workspace();
    let (supervisor, _events) = supervisor(ws.path());
    let mut config = arcane_localai::EngineConfig::new(arcane_localai::Engine::Ollama);
    config.url = format!("http://127.0.0.1:{}", free_port());
    let error = supervisor
        .start(config, CancelToken::new())
        .await
        .unwrap_err();
    assert!(
        matches!(error, Error::ExecutableMissing { .. }),
        "{error:?}"
    );
    let hints = error.hints().join("\n");
    assert!(
        hints.contains("`arcane runtime add ollama --executable PATH`"),
        "{hints}"
    );
    assert!(!hints.contains("llama.cpp"), "{hints}");
}

#[tokio::test]
async fn an_external_server_is_adopted_never_signalled_and_left_running() {
    let ws = workspace();
    let port = free_port();
    let external = external_fake_llama(port, &[]);
    let (supervisor, events) = supervisor(ws.path());
    let hook_runs = Arc::new(AtomicUsize::new(0));
    let counter = hook_runs.clone();
    let server = supervisor
        .start_with_exit_hook(
            fake_llama(port, &[]),
            CancelToken::new(),
            Some(Box::new(move |_| {
                counter.fetch_add(1, Ordering::SeqCst);
            })),
        )
        .await
        .unwrap();
    let snapshot = server.snapshot();
    assert!(!server.is_owned());
    assert!(!snapshot.owned && snapshot.external && !snapshot.managed && snapshot.available);
    assert_eq!(snapshot.execution, None);
    assert_eq!(
        hook_runs.load(Ordering::SeqCst),
        1,
        "nothing spawned: the hook runs after startup"
    );
    assert!(events_of(&events, "process.starting").is_empty());
    let report = server.close().await;
    assert_eq!(report.step, StopStep::Released);
    assert!(
        alive(external.pid()),
        "an adopted server is never signalled"
    );
    assert!(http_get(port, "/health").is_some());
}

#[tokio::test]
async fn a_target_while_an_external_server_runs_is_refused_and_it_is_untouched() {
    let ws = workspace();
    let port = free_port();
    let external = external_fake_llama(port, &[]);
    let (supervisor, events) = supervisor(ws.path());
    let mut config = fake_llama(port, &[]);
    config.device = Some("cpu".into());
    let error = supervisor
        .start(config, CancelToken::new())
        .await
        .unwrap_err();
    assert_eq!(error.code(), codes::LOCAL_AI_EXTERNAL_SELECTION_UNSUPPORTED);
    assert!(events_of(&events, "process.starting").is_empty());
    assert!(alive(external.pid()));
    assert_eq!(http_get(port, "/health").map(|(s, _)| s), Some(200));
}

#[tokio::test]
async fn cancelling_during_start_stops_the_child_and_reports_cancelled() {
    let ws = workspace();
    let port = free_port();
    let (supervisor, events) = supervisor(ws.path());
    let cancel = CancelToken::new();
    let trigger = cancel.clone();
    let seen = events.clone();
    // Cancel once the child is being spawned (a `never-ready` fake never gets further),
    // so the cancellation lands while the start waits for readiness.
    std::thread::spawn(move || {
        wait_until(Duration::from_secs(20), || {
            !events_of(&seen, "process.starting").is_empty()
        });
        trigger.cancel();
    });
    let error = supervisor
        .start(fake_llama(port, &["never-ready"]), cancel)
        .await
        .unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_CANCELLED);
    let pid = events_of(&events, "process.exited")[0]["pid"]
        .as_u64()
        .unwrap() as u32;
    assert!(!alive(pid));
    assert_eq!(states(&events).last().map(String::as_str), Some("stopped"));
}

#[tokio::test]
async fn a_llama_version_request_is_checked_against_the_build_it_reports() {
    let ws = workspace();
    let port = free_port();
    let (supervisor, _) = supervisor(ws.path());
    let mut config = fake_llama(port, &[]);
    config.version = Some("b4242".into());
    let server = owned(supervisor.start(config, CancelToken::new()).await.unwrap());
    assert_eq!(server.snapshot().version.as_deref(), Some("b4242"));
    server.stop().await;

    let port = free_port();
    let (supervisor, events) = crate::support::supervisor(ws.path());
    let mut config = fake_llama(port, &[]);
    config.version = Some("b6000".into());
    let error = supervisor
        .start(config, CancelToken::new())
        .await
        .unwrap_err();
    assert_eq!(error.code(), codes::LOCAL_AI_VERSION_MISMATCH);
    assert_eq!(error.details()["observed"], "b4242");
    let pid = events_of(&events, "process.exited")[0]["pid"]
        .as_u64()
        .unwrap() as u32;
    assert!(
        !alive(pid),
        "an owned server with the wrong version is stopped"
    );
}

#[tokio::test]
async fn dropping_the_handle_stops_the_engine() {
    let ws = workspace();
    let port = free_port();
    let (supervisor, _) = supervisor(ws.path());
    let server = owned(
        supervisor
            .start(fake_llama(port, &[]), CancelToken::new())
            .await
            .unwrap(),
    );
    let pid = server.pid().unwrap();
    let _guard = PidGuard(pid);
    drop(server);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while alive(pid) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!alive(pid));
}

#[tokio::test]
async fn with_adopt_existing_off_a_server_answering_at_the_url_is_never_adopted() {
    let ws = workspace();
    let port = free_port();
    let _external = external_fake_llama(port, &[]);
    let (supervisor, events) = supervisor(ws.path());
    let mut config = fake_llama(port, &[]);
    config.adopt_existing = false;
    let server = owned(supervisor.start(config, CancelToken::new()).await.unwrap());
    let pid = server.pid().unwrap();
    let _guard = PidGuard(pid);
    // Its own engine, on its own socket; the url was not even probed.
    assert!(server.snapshot().socket.is_some());
    assert!(!server.snapshot().external);
    assert_eq!(events_of(&events, "process.starting").len(), 1);
    server.stop().await;
}
