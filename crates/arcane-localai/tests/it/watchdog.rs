//! Issue 27, item 1: the readiness watchdog under load. An unanswered probe is judged
//! by what the engine's processes did meanwhile: working (CPU time grew) is load and
//! never a reason to stop it; every process stopped (`SIGSTOP`) is found at once;
//! probes unanswered while it used no CPU time are a hang. An unresponsive engine is
//! killed without waiting out the stop grace, and says so before it is killed.

use std::time::Duration;

use arcane_localai::{EngineConfig, EngineState, Server, StopStep};
use arcane_report::CancelToken;

use crate::support::*;

fn owned(server: Server) -> arcane_localai::OwnedServer {
    match server {
        Server::Owned(owned) => owned,
        Server::Adopted(_) => panic!("expected an owned server"),
    }
}

/// The fake with `modes`, probed every 200 ms, unresponsive after 2 idle misses, and a
/// stop grace no test would wait out.
fn watched(port: u16, modes: &[&str]) -> EngineConfig {
    let mut config = fake_llama(port, modes);
    config.watchdog_interval = Duration::from_millis(200);
    config.watchdog_misses = 2;
    config.stop_grace = Duration::from_secs(600);
    config
}

/// A watched fake engine with `modes`, started and ready: its workspace (kept alive
/// with it), its events, the server and a guard that kills its pid if a test fails.
struct Watched {
    ws: tempfile::TempDir,
    events: std::sync::Arc<arcane_report::Collector>,
    server: arcane_localai::OwnedServer,
    pid: u32,
    _guard: PidGuard,
}

async fn start_watched(modes: &[&str]) -> Watched {
    let ws = workspace();
    let (supervisor, events) = supervisor(ws.path());
    let server = owned(
        supervisor
            .start(watched(free_port(), modes), CancelToken::new())
            .await
            .unwrap(),
    );
    let pid = server.pid().unwrap();
    Watched {
        ws,
        events,
        server,
        pid,
        _guard: PidGuard(pid),
    }
}

#[tokio::test]
async fn a_busy_engine_whose_probes_go_unanswered_is_not_stopped_and_finishes_its_work() {
    // Each completion works the CPU for 3 s, and `/health` waits behind it: a dozen
    // probe timeouts, each of which the old watchdog counted as a miss.
    let watched = start_watched(&["busy-health=3"]).await;
    let (events, server, pid) = (&watched.events, &watched.server, watched.pid);
    let socket = engine_socket(watched.ws.path(), "llama.cpp");
    let answer = tokio::task::spawn_blocking(move || {
        http_unix(&socket, "POST", "/v1/chat/completions", "{}", None)
    })
    .await
    .unwrap();
    let (status, body) = answer.expect("the busy engine answered");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("hello from the fake"), "{body}");
    let snapshot = server.snapshot();
    assert_eq!(snapshot.state, EngineState::Ready);
    assert_eq!(snapshot.pid, Some(pid), "the same engine, never restarted");
    // The probes did go unanswered, and were judged as load.
    let busy = events_of(events, "local-ai.engine.busy");
    assert!(!busy.is_empty(), "{:?}", events.types());
    assert_eq!(busy[0]["engine"], "llama.cpp");
    // Widened, within its bound (4 intervals).
    let widest = busy
        .iter()
        .filter_map(|b| b["probeTimeoutMs"].as_u64())
        .max()
        .unwrap();
    assert!((400..=800).contains(&widest), "{busy:?}");
    assert!(events_of(events, "local-ai.server.error").is_empty());
    assert_eq!(server.stop().await.step, StopStep::Sigterm);
}

#[tokio::test]
async fn a_stopped_engine_is_found_and_killed_without_waiting_out_the_grace() {
    let watched = start_watched(&[]).await;
    let (events, server, pid) = (&watched.events, &watched.server, watched.pid);
    signal(pid, "STOP");
    // Bounded by a minute, far below the 600 s grace: waiting it out fails here.
    let report = tokio::time::timeout(Duration::from_secs(60), server.wait())
        .await
        .expect("the stopped engine was killed without the stop grace");
    assert_eq!(report.step, StopStep::Sigkill);
    assert_eq!(report.exit.and_then(|e| e.signal), Some(libc::SIGKILL));
    assert_eq!(report.snapshot.state, EngineState::Error);
    let errors = events_of(events, "local-ai.server.error");
    let error = &errors[0]["error"];
    assert_eq!(error["details"]["stopped"], true, "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("SIGSTOP"),
        "{error}"
    );
    // Said while it still ran (so nothing new was sent to it), then killed.
    assert_eq!(errors[0]["pid"], pid, "{errors:?}");
    assert!(!alive(pid));
}

#[tokio::test]
async fn an_idle_engine_that_stops_answering_is_a_hang_and_is_killed() {
    let watched = start_watched(&["hang-after=0.2"]).await;
    let (events, server) = (&watched.events, &watched.server);
    let report = tokio::time::timeout(Duration::from_secs(60), server.wait())
        .await
        .expect("the hung engine was killed without the stop grace");
    assert_eq!(report.step, StopStep::Sigkill);
    let error = &events_of(events, "local-ai.server.error")[0]["error"];
    assert_eq!(error["details"]["stopped"], false, "{error}");
    assert_eq!(error["details"]["misses"], 2, "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("with no CPU time used"),
        "{error}"
    );
}

#[tokio::test]
async fn an_engine_stopped_while_loading_fails_its_start_without_the_timeouts() {
    let ws = workspace();
    let port = free_port();
    let (supervisor, events) = supervisor(ws.path());
    let mut config = watched(port, &["loading=600"]);
    config.startup_timeout = Duration::from_secs(600);
    config.stall_timeout = Duration::from_secs(600);
    let collected = events.clone();
    let start = tokio::spawn(async move { supervisor.start(config, CancelToken::new()).await });
    let loading = tokio::task::spawn_blocking(move || {
        wait_until(Duration::from_secs(30), || {
            !events_of(&collected, "local-ai.server.loading").is_empty()
        });
        events_of(&collected, "local-ai.server.loading")[0]["pid"]
            .as_u64()
            .unwrap() as u32
    });
    let pid = loading.await.unwrap();
    let _guard = PidGuard(pid);
    signal(pid, "STOP");
    let failed = tokio::time::timeout(Duration::from_secs(60), start)
        .await
        .expect("the stopped start failed without waiting out its timeouts")
        .unwrap();
    let error = failed.expect_err("a stopped engine never becomes ready");
    assert!(error.to_string().contains("SIGSTOP"), "{error}");
    assert!(!alive(pid), "killed, not left stopped");
}
