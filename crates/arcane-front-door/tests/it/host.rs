//! The host: registry, states, dispatch, id spaces, cancellation, replay, shutdown.

use std::sync::Arc;
use std::time::Duration;

use arcane_core::protocol::Control;
use arcane_core::{AppInfo, Host, ServiceState};
use arcane_report::Diagnostic;
use serde_json::json;

use crate::support::{drain, request, until, TestService};

fn host_with(services: Vec<Arc<TestService>>) -> Host {
    let mut builder = Host::builder(AppInfo::default());
    for service in services {
        builder = builder.service(service).unwrap();
    }
    builder.build()
}

/// Polls the host's snapshot (at most 30 s) until `ready` holds for the ids of its
/// active requests: the state a test would otherwise sleep for.
async fn until_active(host: &Host, ready: impl Fn(&[&str]) -> bool) {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let snapshot = host.snapshot();
            let ids: Vec<&str> = snapshot["activeRequests"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["id"].as_str())
                .collect();
            if ready(&ids) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the requests become active in time");
}

#[test]
fn duplicate_service_and_method_names_are_refused() {
    let builder = Host::builder(AppInfo::default())
        .service(TestService::new("a", "a"))
        .unwrap();
    let error = builder
        .service(TestService::new("a", "other"))
        .err()
        .unwrap();
    assert_eq!(error.code(), "ARCANE_ALREADY_EXISTS");
    let builder = Host::builder(AppInfo::default())
        .service(TestService::new("a", "a"))
        .unwrap();
    let error = builder.service(TestService::new("b", "a")).err().unwrap();
    assert_eq!(error.details()["name"], "a.echo");
    // Built-in names are reserved.
    let error = Host::builder(AppInfo::default())
        .service(TestService::new("s", "system"))
        .err();
    assert!(error.is_none(), "`system.echo` is not a built-in");
}

#[tokio::test]
async fn a_request_waits_only_for_its_own_service() {
    let slow = TestService::with("slow", "slow", Duration::from_secs(3600), false);
    let fast = TestService::new("fast", "fast");
    let host = host_with(vec![slow.clone(), fast.clone()]);
    host.start();
    let connection = host.connect("t");
    let response = tokio::time::timeout(
        Duration::from_secs(30),
        connection.dispatch(request("1", "fast.echo", json!({"x": 1}))),
    )
    .await
    .expect("the fast service answers while the slow one is still starting");
    assert_eq!(response.outcome, Ok(json!({"x": 1})));
    let states: Vec<_> = host
        .services()
        .into_iter()
        .map(|(n, s)| (n, s.state))
        .collect();
    assert_eq!(
        states,
        vec![
            ("slow".into(), ServiceState::Starting),
            ("fast".into(), ServiceState::Ready)
        ]
    );
    assert_eq!(slow.calls(), 0);
}

#[tokio::test]
async fn a_failed_service_answers_service_unavailable() {
    let broken = TestService::with("broken", "broken", Duration::ZERO, true);
    let host = host_with(vec![broken.clone()]);
    host.start();
    let response = host
        .connect("t")
        .dispatch(request("1", "broken.echo", json!({})))
        .await;
    let error = response.outcome.unwrap_err();
    assert_eq!(error["code"], "CORE_SERVICE_UNAVAILABLE");
    assert_eq!(error["details"]["state"], "failed");
    assert_eq!(error["details"]["error"]["code"], "ARCANE_USAGE");
    assert_eq!(broken.calls(), 0);
}

#[tokio::test]
async fn builtins_and_unknown_methods() {
    let host = host_with(vec![TestService::new("t", "test")]);
    host.start();
    let connection = host.connect("t");
    assert_eq!(
        connection
            .dispatch(request("1", "system.ping", json!({})))
            .await
            .outcome,
        Ok(json!({"ok": true}))
    );
    let version = connection
        .dispatch(request("2", "version.current", json!({})))
        .await
        .outcome
        .unwrap();
    assert_eq!(version["protocol"], "arcane/1");
    let app = connection
        .dispatch(request("3", "app.current", json!({})))
        .await
        .outcome
        .unwrap();
    assert_eq!(app["id"], "arcane");
    let error = connection
        .dispatch(request("4", "nosuch.thing", json!({})))
        .await
        .outcome
        .unwrap_err();
    assert_eq!(error["code"], "METHOD_NOT_ALLOWED");
    assert_eq!(
        error["details"],
        json!({"method": "nosuch.thing", "namespace": "nosuch", "reason": "core-namespace-unavailable"})
    );
    let error = connection
        .dispatch(request("5", "test.nosuch", json!({})))
        .await
        .outcome
        .unwrap_err();
    assert_eq!(error["details"]["reason"], "core-method-unavailable");
    assert_eq!(error["details"]["namespace"], "test");
}

#[tokio::test]
async fn ids_are_per_connection_and_an_active_id_cannot_be_reused() {
    let service = TestService::new("t", "test");
    let host = host_with(vec![service.clone()]);
    host.start();
    let a = Arc::new(host.connect("a"));
    let b = host.connect("b");
    let first = {
        let a = Arc::clone(&a);
        tokio::spawn(async move {
            a.dispatch(request("r1", "test.sleep", json!({"ms": 300})))
                .await
        })
    };
    // Wait until r1 is active on `a`.
    for _ in 0..300 {
        if host.snapshot()["activeRequests"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let reused = a.dispatch(request("r1", "test.echo", json!({}))).await;
    assert_eq!(reused.outcome.unwrap_err()["code"], "RPC_REQUEST_ID_ACTIVE");
    // The same id on another connection is independent.
    let other = b
        .dispatch(request("r1", "test.echo", json!({"from": "b"})))
        .await;
    assert_eq!(other.outcome, Ok(json!({"from": "b"})));
    // And the first request was unaffected.
    assert_eq!(first.await.unwrap().outcome, Ok(json!({"slept": 300})));
    // Once answered, the id is free again.
    assert!(a
        .dispatch(request("r1", "test.echo", json!({})))
        .await
        .is_ok());
}

#[tokio::test]
async fn request_events_go_only_to_their_connection() {
    let host = host_with(vec![TestService::new("t", "test")]);
    host.start();
    let a = host.connect("a");
    let b = host.connect("b");
    let mut a_events = a.subscribe();
    let mut b_events = b.subscribe();
    drain(&mut a_events);
    drain(&mut b_events);
    let ra = a.dispatch(request("same", "test.stream", json!({"count": 2})));
    let rb = b.dispatch(request("same", "test.stream", json!({"count": 3})));
    let (ra, rb) = tokio::join!(ra, rb);
    assert!(ra.is_ok() && rb.is_ok());
    let a_chunks: Vec<_> = drain(&mut a_events)
        .into_iter()
        .filter(|f| f["event"] == "test.chunk")
        .collect();
    let b_chunks: Vec<_> = drain(&mut b_events)
        .into_iter()
        .filter(|f| f["event"] == "test.chunk")
        .collect();
    assert_eq!(a_chunks.len(), 2);
    assert_eq!(b_chunks.len(), 3);
    assert!(a_chunks
        .iter()
        .chain(&b_chunks)
        .all(|f| f["requestId"] == "same"));
}

#[tokio::test]
async fn cancel_aborts_request_work_but_not_service_work() {
    let host = host_with(vec![TestService::new("t", "test")]);
    host.start();
    let connection = Arc::new(host.connect("c"));
    let sleeping = {
        let c = Arc::clone(&connection);
        tokio::spawn(async move {
            c.dispatch(request("long", "test.sleep", json!({"ms": 3_600_000})))
                .await
        })
    };
    let saving = {
        let c = Arc::clone(&connection);
        tokio::spawn(async move {
            c.dispatch(request("save", "test.save", json!({"ms": 200})))
                .await
        })
    };
    // Cancel once `long` is active (and `save` too, unless it already finished).
    until_active(&host, |ids| {
        ids.contains(&"long") && (ids.contains(&"save") || saving.is_finished())
    })
    .await;
    let result = connection.control(Control::Cancel {
        request_id: "long".into(),
    });
    assert_eq!(result["cancelled"], true);
    assert_eq!(
        connection.control(Control::Cancel {
            request_id: "save".into()
        })["cancelled"],
        false
    );
    let cancelled = tokio::time::timeout(Duration::from_secs(30), sleeping)
        .await
        .unwrap()
        .unwrap();
    let error = cancelled.outcome.unwrap_err();
    assert_eq!(error["code"], "ARCANE_CANCELLED");
    assert_eq!(error["details"]["reason"], "REQUEST_ABORTED");
    assert_eq!(saving.await.unwrap().outcome, Ok(json!({"slept": 200})));
}

#[tokio::test]
async fn replay_sends_current_state_in_order_and_never_history() {
    let host = host_with(vec![
        TestService::new("one", "one"),
        TestService::new("two", "two"),
    ]);
    host.start();
    host.service_settled("one").await;
    host.service_settled("two").await;
    let early = host.connect("early");
    let _early_events = early.subscribe();
    early
        .dispatch(request("1", "one.stream", json!({"count": 2})))
        .await;
    let late = host.connect("late");
    let mut events = late.subscribe();
    let frames = drain(&mut events);
    let names: Vec<_> = frames
        .iter()
        .map(|f| f["event"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        vec![
            "core.ready",
            "core.state",
            "core.service.state",
            "core.service.state",
            "one.state",
            "two.state"
        ]
    );
    assert_eq!(
        frames[2]["data"],
        json!({"name": "one", "state": "ready", "error": null})
    );
    assert!(frames
        .iter()
        .all(|f| f["protocol"] == "arcane/1" && f["type"] == "event"));
    // `runtime.replay` sends the same snapshot again.
    let result = late.control(Control::Replay);
    assert_eq!(result["replayed"], 6);
    assert_eq!(drain(&mut events).len(), 6);
}

#[tokio::test]
async fn shutdown_refuses_new_work_finishes_accepted_work_and_disposes() {
    let service = TestService::new("t", "test");
    let host = host_with(vec![service.clone()]);
    host.start();
    let connection = Arc::new(host.connect("c"));
    let mut events = connection.subscribe();
    let saving = {
        let c = Arc::clone(&connection);
        tokio::spawn(async move {
            c.dispatch(request("save", "test.save", json!({"ms": 300})))
                .await
        })
    };
    let sleeping = {
        let c = Arc::clone(&connection);
        tokio::spawn(async move {
            c.dispatch(request("sleep", "test.sleep", json!({"ms": 3_600_000})))
                .await
        })
    };
    // Close only once both were accepted (`save` may already have finished).
    until_active(&host, |ids| {
        ids.contains(&"sleep") && (ids.contains(&"save") || saving.is_finished())
    })
    .await;
    let closing = {
        let host = host.clone();
        tokio::spawn(async move { host.close().await })
    };
    until(&mut events, |f| {
        f["event"] == "core.state" && f["data"]["state"] == "draining"
    })
    .await;
    let refused = connection
        .dispatch(request("new", "test.echo", json!({})))
        .await;
    assert_eq!(refused.outcome.unwrap_err()["code"], "CORE_SHUTTING_DOWN");
    assert_eq!(
        saving.await.unwrap().outcome,
        Ok(json!({"slept": 300})),
        "service-lifetime work finishes"
    );
    assert_eq!(
        sleeping.await.unwrap().outcome.unwrap_err()["code"],
        "ARCANE_CANCELLED"
    );
    closing.await.unwrap().unwrap();
    assert_eq!(
        service.disposed.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    let rest = until(&mut events, |f| {
        f["event"] == "core.state" && f["data"]["state"] == "closed"
    })
    .await;
    assert!(rest
        .iter()
        .any(|f| f["event"] == "core.service.state" && f["data"]["state"] == "closed"));
    // The stream ends after `closed`.
    assert!(tokio::time::timeout(Duration::from_secs(30), events.recv())
        .await
        .unwrap()
        .is_none());
    // Closing again is a no-op.
    host.close().await.unwrap();
}

#[tokio::test]
async fn devices_and_target_resolution_come_from_the_live_catalog() {
    let service =
        arcane_core::localai::DevicesService::new(arcane_core::supervised::LiveDevices::new());
    let host = Host::builder(AppInfo::default())
        .service(service)
        .unwrap()
        .build();
    host.start();
    let connection = host.connect("d");
    let devices = connection
        .dispatch(request("1", "localai.devices", json!({"refresh": true})))
        .await
        .outcome
        .unwrap();
    let list = devices["devices"].as_array().expect("a device list");
    assert!(list.iter().any(|d| d["deviceId"] == "cpu"), "{devices}");
    let resolved = connection
        .dispatch(request(
            "2",
            "localai.resolveTarget",
            json!({"executionTarget": {"deviceId": "cpu"}}),
        ))
        .await
        .outcome
        .unwrap();
    assert_eq!(resolved["resolution"], "matched", "{resolved}");
    let missing = connection
        .dispatch(request(
            "3",
            "localai.resolveTarget",
            json!({"executionTarget": {"deviceId": "GPU-00000000-0000-0000-0000-000000000000"}}),
        ))
        .await
        .outcome
        .unwrap();
    assert_ne!(missing["resolution"], "matched", "{missing}");
    let bad = connection
        .dispatch(request(
            "4",
            "localai.resolveTarget",
            json!({"executionTarget": 5}),
        ))
        .await;
    assert_eq!(bad.outcome.unwrap_err()["code"], "ARCANE_USAGE");
}
