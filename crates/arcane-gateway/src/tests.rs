//! The gateway's placement, eviction, shared loads, failures and keep-alive, tested
//! with a fake launcher: no process runs, so each test is fast and decides exactly
//! when a launch ends and how.
//!
//! The fake's handles record every launch and stop in one shared log (the order
//! matters: an eviction stops its victim before the next launch). A launch can be
//! held until the test releases it (a gate), and can be told to fail. The engine's
//! address is never connected to: requests are routed through the gateway's own
//! [`Upstream::route`], whose [`Route`] holds the request in flight until dropped.
//!
//! Time is tokio's paused clock: the gateway's timers and clocks are tokio's, so
//! `advance` moves the idle clock and the backoff, and a bounded wait whose bound
//! passes fails at once instead of hanging. [`settle`] lets every other task run until
//! each waits for something (paused time moves only when nothing else can run), so
//! "nothing happened" is checked after everything that could happen did.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arcane_localai::{EngineState, ServerSnapshot, StateObserver};
use arcane_report::{codes, CancelToken, Event, EventSink};
use hyper::StatusCode;
use serde_json::{json, Value};
use tokio::sync::{watch, Semaphore};

use super::*;
use arcane_core::host::{AppInfo, Host};
use arcane_localai::Engine;

/// Long enough that no test's wait reaches it unless the test means it to.
const LOAD_TIMEOUT: Duration = Duration::from_secs(60);

/// The bound of every wait on the gateway's state (virtual time).
const WAIT: Duration = Duration::from_secs(600);

/// More launches of one model than any test makes: a load loop.
const MAX_LAUNCHES: usize = 10;

/// What the fake's launches did, in order (`launch a`, `stop a`), shared by every
/// model of a test.
#[derive(Default)]
struct Log {
    entries: watch::Sender<Vec<String>>,
}

impl Log {
    fn push(&self, entry: String) {
        self.entries.send_modify(|entries| entries.push(entry));
    }

    fn entries(&self) -> Vec<String> {
        self.entries.borrow().clone()
    }

    fn count(&self, entry: &str) -> usize {
        self.entries.borrow().iter().filter(|e| *e == entry).count()
    }

    /// Waits (bounded) until `entry` has been logged `times` times.
    async fn wait_for(&self, entry: &str, times: usize) {
        let mut entries = self.entries.subscribe();
        let seen = tokio::time::timeout(
            WAIT,
            entries.wait_for(|e| e.iter().filter(|x| *x == entry).count() >= times),
        )
        .await
        .is_ok_and(|seen| seen.is_ok());
        assert!(
            seen,
            "`{entry}` was not logged {times} time(s): {:?}",
            self.entries()
        );
    }
}

/// How the fake's next launch ends.
#[derive(Clone, Debug)]
enum Outcome {
    Ready,
    Fail(&'static str),
}

/// A launcher that starts nothing: see the module documentation.
struct FakeLauncher {
    id: String,
    /// The kind it stands for (which paths its model serves).
    kind: Engine,
    log: Arc<Log>,
    outcome: Mutex<Outcome>,
    /// `Some`: each launch waits for one permit (the test adds them).
    gate: Option<Arc<Semaphore>>,
    /// The observer of the last launch (to report a crash).
    observer: Mutex<Option<StateObserver>>,
}

impl FakeLauncher {
    fn snapshot(id: &str, state: EngineState) -> ServerSnapshot {
        let mut snapshot = ServerSnapshot::new(id, Engine::DEFAULT.as_str(), "http://127.0.0.1:9");
        snapshot.available = state == EngineState::Ready;
        snapshot.state = state;
        snapshot
    }
}

impl EngineLauncher for FakeLauncher {
    fn runtime(&self) -> Engine {
        self.kind
    }

    fn url(&self) -> String {
        "http://127.0.0.1:9".into()
    }

    fn launch(
        &self,
        _events: Arc<dyn EventSink>,
        observer: StateObserver,
        _cancel: CancelToken,
    ) -> BoxFuture<'static, Result<Box<dyn EngineHandle>, BoxError>> {
        *self.observer.lock().unwrap_or_else(|p| p.into_inner()) = Some(observer);
        let (id, log, gate) = (self.id.clone(), Arc::clone(&self.log), self.gate.clone());
        let outcome = self
            .outcome
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Box::pin(async move {
            log.push(format!("launch {id}"));
            // A gateway that loads again and again would never let paused time move
            // (so no bounded wait would end): it fails here instead.
            if log.count(&format!("launch {id}")) > MAX_LAUNCHES {
                return Err(Box::new(Error::Remote {
                    code: codes::LOCAL_AI_SERVER_FAILED.into(),
                    message: format!("`{id}` was launched more than {MAX_LAUNCHES} times"),
                    details: json!({}),
                    hints: Vec::new(),
                    cause: None,
                }) as BoxError);
            }
            if let Some(gate) = gate {
                gate.acquire().await.expect("the gate stays open").forget();
            }
            match outcome {
                Outcome::Ready => Ok(Box::new(FakeHandle { id, log }) as Box<dyn EngineHandle>),
                Outcome::Fail(message) => Err(Box::new(Error::Remote {
                    code: codes::LOCAL_AI_SERVER_FAILED.into(),
                    message: message.into(),
                    details: json!({"model": id}),
                    hints: Vec::new(),
                    cause: None,
                }) as BoxError),
            }
        })
    }
}

/// A running fake engine: its stop takes a moment (of paused time), as a real
/// engine's does, and is logged once it is done.
struct FakeHandle {
    id: String,
    log: Arc<Log>,
}

/// How long a fake engine takes to stop.
const STOP_TAKES: Duration = Duration::from_millis(100);

impl EngineHandle for FakeHandle {
    fn snapshot(&self) -> ServerSnapshot {
        FakeLauncher::snapshot(&self.id, EngineState::Ready)
    }

    fn stop(self: Box<Self>) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move {
            tokio::time::sleep(STOP_TAKES).await;
            self.log.push(format!("stop {}", self.id));
            Ok(())
        })
    }
}

/// One model of a test: its id, memory need and keep-alive.
struct Spec {
    id: &'static str,
    memory: u64,
    keep_alive: KeepAlive,
    load_on_start: bool,
    pin: Option<bool>,
    unlisted: bool,
    upstream_model: Option<&'static str>,
    kind: Engine,
    external: bool,
    parallel: usize,
    max_queue: usize,
}

fn model(id: &'static str) -> Spec {
    Spec {
        id,
        memory: 0,
        keep_alive: KeepAlive::default(),
        load_on_start: false,
        pin: None,
        unlisted: false,
        upstream_model: None,
        kind: Engine::DEFAULT,
        external: false,
        parallel: 8,
        max_queue: crate::DEFAULT_MAX_QUEUE,
    }
}

/// A started gateway over fake launchers, all on device `cpu`.
struct Rig {
    gateway: Arc<Gateway>,
    _host: Host,
    log: Arc<Log>,
    launchers: HashMap<&'static str, Arc<FakeLauncher>>,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Rig {
    fn new(specs: Vec<Spec>, limit: DeviceLimit) -> Self {
        Self::with_gate(specs, limit, None)
    }

    /// Every launch waits for a permit of `gate`.
    fn with_gate(specs: Vec<Spec>, limit: DeviceLimit, gate: Option<Arc<Semaphore>>) -> Self {
        Self::configured(specs, limit, gate, Vec::new())
    }

    /// With exclusive `groups`.
    fn with_groups(specs: Vec<Spec>, limit: DeviceLimit, groups: Vec<Group>) -> Self {
        Self::configured(specs, limit, None, groups)
    }

    fn configured(
        specs: Vec<Spec>,
        limit: DeviceLimit,
        gate: Option<Arc<Semaphore>>,
        groups: Vec<Group>,
    ) -> Self {
        let log = Arc::new(Log::default());
        let mut launchers = HashMap::new();
        let mut models = Vec::new();
        for spec in specs {
            let launcher = Arc::new(FakeLauncher {
                id: spec.id.into(),
                kind: spec.kind,
                log: Arc::clone(&log),
                outcome: Mutex::new(Outcome::Ready),
                gate: gate.clone(),
                observer: Mutex::new(None),
            });
            launchers.insert(spec.id, Arc::clone(&launcher));
            models.push(ModelSpec {
                keep_alive: spec.keep_alive,
                load_on_start: spec.load_on_start,
                memory: spec.memory,
                load_timeout: LOAD_TIMEOUT,
                pin: spec.pin,
                unlisted: spec.unlisted,
                upstream_model: spec.upstream_model.map(String::from),
                external: spec.external,
                parallel: spec.parallel,
                max_queue: spec.max_queue,
                ..ModelSpec::new(spec.id, launcher)
            });
        }
        let gateway = Gateway::configured(Configuration {
            models,
            limits: HashMap::from([("cpu".to_string(), limit)]),
            groups,
        });
        let events: Arc<Mutex<Vec<Event>>> = Arc::default();
        let seen = Arc::clone(&events);
        let observer =
            move |event: Event| seen.lock().unwrap_or_else(|p| p.into_inner()).push(event);
        let host = Host::builder(AppInfo::default())
            .observer(Arc::new(observer))
            .service(Arc::clone(&gateway) as Arc<dyn Service>)
            .expect("the gateway registers")
            .build();
        host.start();
        Self {
            gateway,
            _host: host,
            log,
            launchers,
            events,
        }
    }

    /// Routes a request for `id` (waiting for its load); panics when refused.
    async fn route(&self, id: &str) -> Route {
        self.route_with(id, None).await
    }

    async fn route_with(&self, id: &str, keep_alive: Option<Value>) -> Route {
        match self.ask(id, keep_alive).await {
            Ok(route) => route,
            Err(refused) => panic!("`{id}` was refused: {} {}", refused.status, refused.body),
        }
    }

    /// Routes a request for `id` that must be refused.
    async fn refused(&self, id: &str) -> NoRoute {
        match self.ask(id, None).await {
            Ok(_) => panic!("`{id}` was routed"),
            Err(refused) => refused,
        }
    }

    async fn ask(&self, id: &str, keep_alive: Option<Value>) -> Result<Route, NoRoute> {
        let request = RouteRequest {
            model: Some(id.into()),
            keep_alive,
            path: None,
            queued: true,
            ..RouteRequest::default()
        };
        tokio::time::timeout(WAIT, self.gateway.route(request))
            .await
            .unwrap_or_else(|_| panic!("routing `{id}` did not end"))
    }

    /// Routes a request for `path` naming `model` (`None`: naming none).
    async fn ask_path(&self, model: Option<&str>, path: &str) -> Result<Route, NoRoute> {
        let request = RouteRequest {
            model: model.map(String::from),
            keep_alive: None,
            path: Some(path.into()),
            ..RouteRequest::default()
        };
        tokio::time::timeout(WAIT, self.gateway.route(request))
            .await
            .unwrap_or_else(|_| panic!("routing {model:?} for {path} did not end"))
    }

    /// A request for `id`, routed in the background.
    fn spawn_route(&self, id: &'static str) -> tokio::task::JoinHandle<Result<Route, NoRoute>> {
        let gateway = Arc::clone(&self.gateway);
        tokio::spawn(async move {
            let request = RouteRequest {
                model: Some(id.into()),
                queued: true,
                ..RouteRequest::default()
            };
            gateway.route(request).await
        })
    }

    /// The `models.list` row of `id`.
    fn row(&self, id: &str) -> Value {
        self.gateway
            .rows()
            .into_iter()
            .find(|row| row["id"] == id)
            .unwrap_or_else(|| panic!("no row for `{id}`"))
    }

    /// The state of each model, in configuration order.
    fn states(&self) -> Vec<(String, String)> {
        self.gateway
            .rows()
            .iter()
            .map(|row| {
                let field = |key: &str| row[key].as_str().unwrap_or_default().to_string();
                (field("id"), field("state"))
            })
            .collect()
    }

    /// Waits (bounded) until `id` is in `state`.
    async fn until_state(&self, id: &str, state: &str) {
        let model = self
            .gateway
            .models()
            .into_iter()
            .find(|m| m.spec.id == id)
            .unwrap_or_else(|| panic!("no model `{id}`"));
        let mut phase = model.phase.subscribe();
        let reached = tokio::time::timeout(WAIT, phase.wait_for(|p| p.state.as_str() == state))
            .await
            .is_ok_and(|reached| reached.is_ok());
        assert!(reached, "`{id}` never became {state}: {}", self.row(id));
    }

    /// The data of every event of `kind` so far.
    fn events(&self, kind: &str) -> Vec<Value> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|e| e.kind == kind)
            .map(|e| e.data.clone())
            .collect()
    }

    /// The state observer `id`'s last launch was given (to report what its supervisor
    /// would: a crash, `loading`).
    fn observer(&self, id: &str) -> StateObserver {
        self.launchers[id]
            .observer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .expect("the launch got an observer")
    }

    fn fail_next_launches(&self, id: &str, message: &'static str) {
        *self.launchers[id]
            .outcome
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Outcome::Fail(message);
    }

    fn succeed_next_launches(&self, id: &str) {
        *self.launchers[id]
            .outcome
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Outcome::Ready;
    }
}

/// Lets every other task run until each waits (see the module documentation).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

fn max_loaded(max: usize) -> DeviceLimit {
    DeviceLimit {
        max_loaded: Some(max),
        memory: None,
    }
}

fn budget(bytes: u64) -> DeviceLimit {
    DeviceLimit {
        max_loaded: None,
        memory: Some(bytes),
    }
}

fn log(entries: &[&str]) -> Vec<String> {
    entries.iter().map(|e| e.to_string()).collect()
}

fn state(id: &str, state: &str) -> (String, String) {
    (id.into(), state.into())
}

#[tokio::test(start_paused = true)]
async fn with_one_slot_loading_b_evicts_idle_a_first() {
    let rig = Rig::new(vec![model("a"), model("b")], max_loaded(1));
    drop(rig.route("a").await);
    drop(rig.route("b").await);
    // A is stopped before B starts: the device never holds two.
    assert_eq!(rig.log.entries(), log(&["launch a", "stop a", "launch b"]));
    assert_eq!(rig.states(), [state("a", "stopped"), state("b", "ready")]);
    assert_eq!(
        rig.events("local-ai.model.stopped"),
        [
            json!({"model": "a", "device": "cpu", "state": "stopped", "reason": "evicted", "for": "b"})
        ]
    );
    // Back to A: B is evicted in turn, and A is launched a second time.
    drop(rig.route("a").await);
    assert_eq!(
        rig.log.entries(),
        log(&["launch a", "stop a", "launch b", "stop b", "launch a"])
    );
}

#[tokio::test(start_paused = true)]
async fn eviction_picks_the_least_recently_used_idle_model() {
    let rig = Rig::new(vec![model("a"), model("b"), model("c")], max_loaded(2));
    drop(rig.route("a").await);
    tokio::time::advance(Duration::from_secs(1)).await;
    drop(rig.route("b").await);
    tokio::time::advance(Duration::from_secs(1)).await;
    // A was loaded first but used last.
    drop(rig.route("a").await);
    tokio::time::advance(Duration::from_secs(1)).await;
    drop(rig.route("c").await);
    assert_eq!(
        rig.log.entries(),
        log(&["launch a", "launch b", "stop b", "launch c"])
    );
    assert_eq!(
        rig.states(),
        [
            state("a", "ready"),
            state("b", "stopped"),
            state("c", "ready")
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_model_with_a_request_in_flight_is_not_evicted_the_load_waits_for_it() {
    let rig = Rig::new(vec![model("a"), model("b")], max_loaded(1));
    let held = rig.route("a").await;
    let b = rig.spawn_route("b");
    settle().await;
    // Half the load timeout later, B still waits and A still answers.
    tokio::time::advance(LOAD_TIMEOUT / 2).await;
    settle().await;
    assert!(!b.is_finished());
    assert_eq!(rig.log.entries(), log(&["launch a"]));
    assert_eq!(rig.row("a")["inFlight"], 1);
    assert_eq!(rig.states(), [state("a", "ready"), state("b", "stopped")]);
    // A's request ends: A is evicted and B loads.
    drop(held);
    let routed = tokio::time::timeout(WAIT, b).await.expect("B's load ended");
    assert!(matches!(routed, Ok(Ok(_))), "B was not routed");
    assert_eq!(rig.log.entries(), log(&["launch a", "stop a", "launch b"]));
}

#[tokio::test(start_paused = true)]
async fn a_load_that_waits_too_long_for_a_busy_device_fails_naming_the_holder() {
    let rig = Rig::new(vec![model("a"), model("b")], max_loaded(1));
    let _held = rig.route("a").await;
    let refused = rig.refused("b").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.retry_after, Some(5));
    assert_eq!(refused.body["error"]["code"], codes::ARCANE_IN_USE);
    assert_eq!(
        refused.body["error"]["message"],
        "device `cpu` is full and busy: `a` (1 in flight, ready) hold it; `b` cannot load until one is idle"
    );
    // A was never touched; B never launched.
    assert_eq!(rig.log.entries(), log(&["launch a"]));
    assert_eq!(rig.states(), [state("a", "ready"), state("b", "stopped")]);
}

#[tokio::test(start_paused = true)]
async fn a_memory_budget_evicts_the_least_recently_used_like_max_loaded() {
    let sized = |id, memory| Spec {
        memory,
        ..model(id)
    };
    let rig = Rig::new(
        vec![sized("a", 4), sized("b", 4), sized("c", 4)],
        budget(10),
    );
    drop(rig.route("a").await);
    tokio::time::advance(Duration::from_secs(1)).await;
    drop(rig.route("b").await);
    tokio::time::advance(Duration::from_secs(1)).await;
    // 4 + 4 fit in 10; a third 4 does not: A, the least recently used, goes.
    drop(rig.route("c").await);
    assert_eq!(
        rig.log.entries(),
        log(&["launch a", "launch b", "stop a", "launch c"])
    );
    assert_eq!(
        rig.states(),
        [
            state("a", "stopped"),
            state("b", "ready"),
            state("c", "ready")
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_model_bigger_than_the_budget_is_refused_naming_both() {
    let rig = Rig::new(
        vec![
            Spec {
                memory: 4,
                ..model("small")
            },
            Spec {
                memory: 11,
                ..model("big")
            },
        ],
        budget(10),
    );
    drop(rig.route("small").await);
    let refused = rig.refused("big").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        refused.body["error"]["code"],
        codes::LOCAL_AI_MODEL_TOO_LARGE
    );
    assert_eq!(refused.retry_after, None, "it never fits: no retry helps");
    assert_eq!(
        refused.body["error"]["message"],
        "`big` needs 11 bytes, more than device `cpu`'s budget of 10"
    );
    // Nothing was evicted for a load that could never fit.
    assert_eq!(rig.log.entries(), log(&["launch small"]));
    assert_eq!(
        rig.states(),
        [state("small", "ready"), state("big", "stopped")]
    );
}

#[tokio::test(start_paused = true)]
async fn concurrent_requests_for_a_cold_model_share_one_launch() {
    let gate = Arc::new(Semaphore::new(0));
    let rig = Rig::with_gate(vec![model("a")], max_loaded(1), Some(Arc::clone(&gate)));
    let waiting: Vec<_> = (0..5).map(|_| rig.spawn_route("a")).collect();
    rig.log.wait_for("launch a", 1).await;
    settle().await;
    assert_eq!(rig.states(), [state("a", "starting")]);
    gate.add_permits(1);
    let mut routes = Vec::new();
    for task in waiting {
        match tokio::time::timeout(WAIT, task).await {
            Ok(Ok(Ok(route))) => routes.push(route),
            _ => panic!("a request for `a` was not routed"),
        }
    }
    assert_eq!(rig.log.entries(), log(&["launch a"]));
    assert_eq!(rig.row("a")["inFlight"], 5);
    assert_eq!(rig.events("local-ai.model.starting").len(), 1);
    drop(routes);
    assert_eq!(rig.row("a")["inFlight"], 0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_launch_answers_every_waiter_and_holds_back_the_next_load() {
    let gate = Arc::new(Semaphore::new(0));
    let rig = Rig::with_gate(vec![model("a")], max_loaded(1), Some(Arc::clone(&gate)));
    rig.fail_next_launches("a", "the engine exploded");
    let waiting: Vec<_> = (0..3).map(|_| rig.spawn_route("a")).collect();
    rig.log.wait_for("launch a", 1).await;
    gate.add_permits(1);
    for task in waiting {
        let Ok(Ok(Err(refused))) = tokio::time::timeout(WAIT, task).await else {
            panic!("a request for `a` was routed");
        };
        assert_eq!(refused.status, StatusCode::BAD_GATEWAY);
        assert_eq!(refused.body["error"]["code"], codes::LOCAL_AI_SERVER_FAILED);
        assert_eq!(refused.body["error"]["message"], "the engine exploded");
    }
    assert_eq!(rig.states(), [state("a", "error")]);
    assert_eq!(rig.row("a")["lastError"]["message"], "the engine exploded");
    // The next request right after is refused with the error and a Retry-After, and
    // does not launch again.
    rig.succeed_next_launches("a");
    let refused = rig.refused("a").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.retry_after, Some(1));
    assert_eq!(refused.body["error"]["message"], "the engine exploded");
    assert_eq!(rig.log.count("launch a"), 1);
    // Once the backoff (1 s) has passed, a request loads it again.
    tokio::time::advance(Duration::from_millis(1001)).await;
    gate.add_permits(1);
    drop(rig.route("a").await);
    assert_eq!(rig.log.count("launch a"), 2);
    assert_eq!(rig.states(), [state("a", "ready")]);
}

#[tokio::test(start_paused = true)]
async fn keep_alive_zero_unloads_once_the_request_has_finished() {
    let rig = Rig::new(
        vec![Spec {
            keep_alive: KeepAlive::AfterEachRequest,
            ..model("a")
        }],
        max_loaded(1),
    );
    // The request that loads the model is counted before the idle clock can see it
    // idle: one launch, not a load that unloads under it (and again, and again).
    let held = rig.route("a").await;
    settle().await;
    assert_eq!(
        rig.log.entries(),
        log(&["launch a"]),
        "unloaded mid-request"
    );
    drop(held);
    rig.until_state("a", "stopped").await;
    assert_eq!(rig.log.entries(), log(&["launch a", "stop a"]));
    assert_eq!(
        rig.events("local-ai.model.stopped"),
        [json!({"model": "a", "device": "cpu", "state": "stopped", "reason": "keep-alive"})]
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_that_gives_up_during_the_load_leaves_the_model_to_its_idle_clock() {
    let gate = Arc::new(Semaphore::new(0));
    let rig = Rig::with_gate(
        vec![Spec {
            keep_alive: KeepAlive::AfterEachRequest,
            ..model("a")
        }],
        max_loaded(1),
        Some(Arc::clone(&gate)),
    );
    let request = rig.spawn_route("a");
    rig.log.wait_for("launch a", 1).await;
    // The client goes away while the engine starts.
    request.abort();
    assert!(request.await.is_err_and(|e| e.is_cancelled()));
    gate.add_permits(1);
    // Nobody is waiting for it any more: it unloads instead of staying loaded forever.
    rig.until_state("a", "stopped").await;
    assert_eq!(rig.log.entries(), log(&["launch a", "stop a"]));
}

#[tokio::test(start_paused = true)]
async fn a_request_keep_alive_of_zero_overrides_the_configured_one() {
    let rig = Rig::new(vec![model("a")], max_loaded(1));
    drop(rig.route_with("a", Some(json!(0))).await);
    rig.until_state("a", "stopped").await;
    assert_eq!(rig.log.entries(), log(&["launch a", "stop a"]));
}

#[tokio::test(start_paused = true)]
async fn keep_alive_unloads_after_its_idle_time_and_a_request_restarts_the_clock() {
    let rig = Rig::new(
        vec![Spec {
            keep_alive: KeepAlive::For(Duration::from_secs(300)),
            ..model("a")
        }],
        max_loaded(1),
    );
    drop(rig.route("a").await);
    tokio::time::advance(Duration::from_secs(200)).await;
    drop(rig.route("a").await);
    // 400 s after the first request, 200 s after the second: still loaded.
    tokio::time::advance(Duration::from_secs(200)).await;
    settle().await;
    assert_eq!(rig.states(), [state("a", "ready")]);
    tokio::time::advance(Duration::from_secs(101)).await;
    rig.until_state("a", "stopped").await;
    assert_eq!(rig.log.entries(), log(&["launch a", "stop a"]));
}

#[tokio::test(start_paused = true)]
async fn keep_alive_minus_one_never_unloads() {
    let rig = Rig::new(
        vec![Spec {
            keep_alive: KeepAlive::Never,
            ..model("a")
        }],
        max_loaded(1),
    );
    drop(rig.route("a").await);
    tokio::time::advance(Duration::from_secs(30 * 24 * 3600)).await;
    settle().await;
    assert_eq!(rig.states(), [state("a", "ready")]);
    assert_eq!(rig.log.entries(), log(&["launch a"]));
    assert_eq!(rig.row("a")["unloadsIn"], Value::Null);
    assert_eq!(rig.row("a")["keepAlive"], -1.0);
}

#[tokio::test(start_paused = true)]
async fn an_engine_that_dies_puts_its_model_in_error_then_stopping_and_the_next_request_reloads_it()
{
    let rig = Rig::new(vec![model("a")], max_loaded(1));
    drop(rig.route("a").await);
    let observer = rig.observer("a");
    observer(&FakeLauncher::snapshot("a", EngineState::Error));
    // `error`, then `stopping` in the same step: nothing new is routed to the dying
    // engine until its supervisor has it down, and no request can see `error` and
    // start a second engine beside it. A request that comes meanwhile waits, then
    // loads a new one.
    assert_eq!(rig.states(), [state("a", "stopping")]);
    assert_eq!(rig.row("a")["crashes"], 1);
    let crashed = |kind: &str| {
        rig.events(kind)
            .iter()
            .filter(|e| e["reason"] == "crashed")
            .count()
    };
    assert_eq!(
        (
            crashed("local-ai.model.error"),
            crashed("local-ai.model.stopping")
        ),
        (1, 1)
    );
    drop(rig.route("a").await);
    // The replacement starts only once the dying engine is stopped (its stop takes a
    // while: a replacement started at once would be logged first).
    assert_eq!(rig.log.entries(), log(&["launch a", "stop a", "launch a"]));
    assert_eq!(rig.states(), [state("a", "ready")]);
}

/// A starting model whose engine answers `503 Loading model` (its supervisor's
/// `loading`) is `loading` too, announced in the same words, and `ready` after it.
#[tokio::test(start_paused = true)]
async fn a_model_is_loading_while_its_engine_loads_its_weights() {
    let gate = Arc::new(Semaphore::new(0));
    let rig = Rig::with_gate(vec![model("a")], max_loaded(1), Some(Arc::clone(&gate)));
    let request = rig.spawn_route("a");
    rig.log.wait_for("launch a", 1).await;
    let observer = rig.observer("a");
    observer(&FakeLauncher::snapshot("a", EngineState::Loading));
    assert_eq!(rig.states(), [state("a", "loading")]);
    assert_eq!(rig.events("local-ai.model.loading").len(), 1);
    gate.add_permits(1);
    let Ok(Ok(Ok(route))) = tokio::time::timeout(WAIT, request).await else {
        panic!("the request for `a` was not routed");
    };
    drop(route);
    assert_eq!(rig.states(), [state("a", "ready")]);
}

impl Rig {
    /// Makes `reload` replace `id`'s configuration with one launched as `launched_as`
    /// (the others unchanged), under `limit`.
    fn reload_replacing(&self, id: &'static str, launched_as: &'static str, limit: DeviceLimit) {
        let launcher = Arc::new(FakeLauncher {
            id: launched_as.into(),
            kind: Engine::DEFAULT,
            log: Arc::clone(&self.log),
            outcome: Mutex::new(Outcome::Ready),
            gate: None,
            observer: Mutex::new(None),
        });
        let mut specs = Vec::new();
        for model in self.gateway.models() {
            let replaced = model.spec.id == id;
            let launcher = if replaced {
                Arc::clone(&launcher) as Arc<dyn EngineLauncher>
            } else {
                Arc::clone(&model.spec.launcher)
            };
            specs.push(ModelSpec {
                keep_alive: model.spec.keep_alive,
                load_timeout: LOAD_TIMEOUT,
                fingerprint: if replaced {
                    launched_as.into()
                } else {
                    model.spec.fingerprint.clone()
                },
                pin: model.spec.pin,
                ..ModelSpec::new(model.spec.id.clone(), launcher)
            });
        }
        let read = Mutex::new(Some(Configuration {
            models: specs,
            limits: HashMap::from([("cpu".to_string(), limit)]),
            groups: self
                .gateway
                .groups
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }));
        self.gateway.set_reloader(Arc::new(move || {
            Ok(read
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .expect("one reload"))
        }));
    }
}

/// Issue 19, item 11: a request routed before a reload, whose load was still waiting
/// for room, used to load the *old* configuration after the reload, in an engine no
/// list showed and nothing stopped. Reloads now wait for placement decisions: the old
/// configuration's engine is tracked as retiring and stopped once idle, and the next
/// request loads the new one — one engine of `m` at a time.
#[tokio::test(start_paused = true)]
async fn a_load_decided_before_a_reload_is_tracked_and_retired_never_orphaned() {
    let rig = Rig::new(vec![model("a"), model("m")], max_loaded(1));
    let a = rig.route("a").await;
    let waiting = rig.spawn_route("m");
    settle().await;
    rig.reload_replacing("m", "m2", max_loaded(1));
    let gateway = Arc::clone(&rig.gateway);
    let reload = tokio::spawn(async move { gateway.reload().await });
    settle().await;
    drop(a);
    let served = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("the request ends")
        .expect("no panic")
        .unwrap_or_else(|refused| panic!("refused: {} {}", refused.status, refused.body));
    reload.await.expect("no panic").expect("reloaded");
    drop(served);
    rig.log.wait_for("stop m", 1).await;
    drop(rig.route("m").await);
    assert_eq!(
        rig.log.entries(),
        log(&["launch a", "stop a", "launch m", "stop m", "launch m2"])
    );
    assert_eq!(rig.row("m")["state"], "ready");
}

/// Issue 19, item 11: one engine per model id. A reload that changes `m` while its old
/// engine serves a request does not start the new one beside it (the same socket and
/// ownership record): the new one waits until the old one is idle and stopped.
#[tokio::test(start_paused = true)]
async fn a_changed_model_waits_for_its_previous_engine_to_be_idle_and_stopped() {
    let rig = Rig::new(vec![model("m")], DeviceLimit::default());
    let old = rig.route("m").await;
    rig.reload_replacing("m", "m2", DeviceLimit::default());
    rig.gateway.reload().await.expect("reloaded");
    let new = rig.spawn_route("m");
    settle().await;
    assert_eq!(rig.log.entries(), log(&["launch m"]));
    drop(old);
    let served = tokio::time::timeout(WAIT, new)
        .await
        .expect("the request ends")
        .expect("no panic")
        .unwrap_or_else(|refused| panic!("refused: {} {}", refused.status, refused.body));
    drop(served);
    assert_eq!(rig.log.entries(), log(&["launch m", "stop m", "launch m2"]));
}

/// Issue 28, item 12b: a request that takes a replaced model between the retire task's
/// idle check and its unload (a waiter of its load, on another thread of the host's
/// runtime; here the race is forced at that very point) makes the unload refuse. The
/// model stays tracked (retiring: listed for placement and shutdown) until that
/// request ends, and then its engine is stopped: never an engine nothing tracks.
#[tokio::test(start_paused = true)]
async fn a_request_that_takes_a_retiring_model_before_its_unload_keeps_it_tracked() {
    let rig = Rig::new(vec![model("m")], DeviceLimit::default());
    drop(rig.route("m").await);
    let raced: Arc<Mutex<Option<Arc<Model>>>> = Arc::default();
    let seen = Arc::clone(&raced);
    *rig.gateway.retire_race.lock().unwrap() = Some(Box::new(move |model| {
        model.lock().in_flight += 1;
        seen.lock()
            .unwrap()
            .get_or_insert_with(|| Arc::clone(model));
    }));
    rig.reload_replacing("m", "m2", DeviceLimit::default());
    rig.gateway.reload().await.expect("reloaded");
    settle().await;
    let old = raced
        .lock()
        .unwrap()
        .clone()
        .expect("the retire task went to unload the replaced model");
    assert_eq!(
        rig.log.entries(),
        log(&["launch m"]),
        "stopped while in use"
    );
    let tracked = |gateway: &Gateway| {
        gateway
            .retiring
            .lock()
            .unwrap()
            .iter()
            .any(|m| Arc::ptr_eq(m, &old))
    };
    assert!(
        tracked(&rig.gateway),
        "a replaced model with an engine is tracked"
    );

    // The request ends: the retire task stops the engine, then lets the model go.
    *rig.gateway.retire_race.lock().unwrap() = None;
    old.lock().in_flight -= 1;
    rig.gateway.changed.notify_waiters();
    rig.log.wait_for("stop m", 1).await;
    settle().await;
    assert!(!tracked(&rig.gateway), "retired once its engine is down");
    assert_eq!(rig.log.entries(), log(&["launch m", "stop m"]));
}

fn pinned_by(
    id: &'static str,
    keep_alive: KeepAlive,
    load_on_start: bool,
    pin: Option<bool>,
) -> Spec {
    Spec {
        keep_alive,
        load_on_start,
        pin,
        ..model(id)
    }
}

fn group(id: &str, members: &[&str]) -> Group {
    Group {
        id: id.into(),
        members: members.iter().map(|m| m.to_string()).collect(),
    }
}

/// The llama-swap report: an always-loaded model was evicted for another. A pinned
/// model stays; the load that needed its room fails at once naming it and the device.
#[tokio::test(start_paused = true)]
async fn a_pinned_model_is_never_evicted_and_the_load_that_needed_room_fails_naming_it() {
    let rig = Rig::new(
        vec![
            pinned_by("embed", KeepAlive::default(), false, Some(true)),
            model("coder"),
        ],
        max_loaded(1),
    );
    drop(rig.route("embed").await);
    let refused = rig.refused("coder").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.retry_after, None);
    let error = &refused.body["error"];
    assert_eq!(error["code"], codes::LOCAL_AI_DEVICE_PINNED);
    assert_eq!(
        error["message"],
        "`coder` (0 bytes) cannot load: device `cpu` is full (1 of 1 slots in use) and held by pinned models, never evicted to make room: `embed` (pinned by `pin = true`, 0 bytes, 0 in flight, ready)"
    );
    assert_eq!(error["details"]["pinned"][0]["model"], "embed");
    assert_eq!(error["details"]["pinned"][0]["pinned"], "pin = true");
    assert_eq!(error["details"]["maxLoaded"], 1);
    assert_eq!(rig.log.entries(), log(&["launch embed"]));
    assert_eq!(
        rig.states(),
        [state("embed", "ready"), state("coder", "stopped")]
    );
    assert!(rig
        .events("local-ai.model.stopped")
        .iter()
        .all(|e| e["reason"] != "evicted"));
}

/// `keep_alive = -1` and `load = "on-start"` pin as `pin = true` does; `pin = false`
/// takes the pin back.
#[tokio::test(start_paused = true)]
async fn keep_alive_minus_one_and_on_start_pin_too_and_pin_false_unpins() {
    let rig = Rig::new(
        vec![
            pinned_by("forever", KeepAlive::Never, false, None),
            pinned_by("early", KeepAlive::default(), true, None),
            model("other"),
        ],
        max_loaded(2),
    );
    rig.until_state("early", "ready").await;
    drop(rig.route("forever").await);
    let refused = rig.refused("other").await;
    assert_eq!(refused.body["error"]["code"], codes::LOCAL_AI_DEVICE_PINNED);
    let pins: Vec<&Value> = refused.body["error"]["details"]["pinned"]
        .as_array()
        .expect("the pinned models")
        .iter()
        .map(|h| &h["pinned"])
        .collect();
    assert_eq!(
        pins,
        [&json!("keep_alive = -1"), &json!("load = \"on-start\"")]
    );
    assert_eq!(rig.row("forever")["pinned"], "keep_alive = -1");
    assert_eq!(rig.log.entries(), log(&["launch early", "launch forever"]));

    let unpinned = Rig::new(
        vec![
            pinned_by("forever", KeepAlive::Never, false, Some(false)),
            model("other"),
        ],
        max_loaded(1),
    );
    drop(unpinned.route("forever").await);
    drop(unpinned.route("other").await);
    assert_eq!(
        unpinned.log.entries(),
        log(&["launch forever", "stop forever", "launch other"])
    );
}

/// A pinned model stays while an unpinned one goes: eviction skips the pinned, even
/// when it is the least recently used.
#[tokio::test(start_paused = true)]
async fn eviction_passes_over_a_pinned_model_for_an_unpinned_one() {
    let rig = Rig::new(
        vec![
            pinned_by("embed", KeepAlive::Never, false, None),
            model("a"),
            model("b"),
        ],
        max_loaded(2),
    );
    drop(rig.route("embed").await);
    tokio::time::advance(Duration::from_secs(1)).await;
    drop(rig.route("a").await);
    drop(rig.route("b").await);
    assert_eq!(
        rig.log.entries(),
        log(&["launch embed", "launch a", "stop a", "launch b"])
    );
    assert_eq!(
        rig.events("local-ai.model.stopped"),
        [
            json!({"model": "a", "device": "cpu", "state": "stopped", "reason": "evicted", "for": "b"})
        ]
    );
}

/// An exclusive group: loading one member unloads the other once it is idle (reported
/// as `unloaded` with `reason: "group"`), even with room on the device; a model outside
/// the group is untouched.
#[tokio::test(start_paused = true)]
async fn an_exclusive_group_swaps_its_idle_member_and_leaves_others_alone() {
    let rig = Rig::with_groups(
        vec![model("a"), model("b"), model("solo")],
        DeviceLimit::default(),
        vec![group("chat", &["a", "b"])],
    );
    drop(rig.route("solo").await);
    drop(rig.route("a").await);
    drop(rig.route("b").await);
    assert_eq!(
        rig.log.entries(),
        log(&["launch solo", "launch a", "stop a", "launch b"])
    );
    assert_eq!(
        rig.states(),
        [
            state("a", "stopped"),
            state("b", "ready"),
            state("solo", "ready")
        ]
    );
    assert_eq!(
        rig.events("local-ai.model.stopped"),
        [
            json!({"model": "a", "device": "cpu", "state": "stopped", "reason": "group", "for": "b", "group": "chat"})
        ]
    );
}

/// A busy member is not unloaded under its request: the other member's load waits for
/// it to be idle, then swaps.
#[tokio::test(start_paused = true)]
async fn an_exclusive_group_waits_for_its_busy_member_then_swaps() {
    let rig = Rig::with_groups(
        vec![model("a"), model("b")],
        DeviceLimit::default(),
        vec![group("chat", &["a", "b"])],
    );
    let held = rig.route("a").await;
    let b = rig.spawn_route("b");
    settle().await;
    tokio::time::advance(LOAD_TIMEOUT / 2).await;
    settle().await;
    assert!(!b.is_finished());
    assert_eq!(rig.log.entries(), log(&["launch a"]));
    drop(held);
    let routed = tokio::time::timeout(WAIT, b).await.expect("B's load ended");
    assert!(matches!(routed, Ok(Ok(_))), "B was not routed");
    assert_eq!(rig.log.entries(), log(&["launch a", "stop a", "launch b"]));
}

/// A member busy past the load timeout: the other's load fails naming it and the group.
#[tokio::test(start_paused = true)]
async fn an_exclusive_group_load_fails_after_the_bound_naming_the_busy_member() {
    let rig = Rig::with_groups(
        vec![model("a"), model("b")],
        DeviceLimit::default(),
        vec![group("chat", &["a", "b"])],
    );
    let _held = rig.route("a").await;
    let refused = rig.refused("b").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.body["error"]["code"], codes::ARCANE_IN_USE);
    assert_eq!(
        refused.body["error"]["message"],
        "group `chat` allows one loaded model: `a` (1 in flight, ready) holds it; `b` cannot load until it is idle"
    );
    assert_eq!(refused.body["error"]["details"]["group"], "chat");
    assert_eq!(refused.body["error"]["details"]["holders"][0]["model"], "a");
    assert_eq!(rig.log.entries(), log(&["launch a"]));
}

/// A reload changes the groups: members that ran together now swap, and a model taken
/// out of its group runs beside its former members.
#[tokio::test(start_paused = true)]
async fn a_reload_changes_group_membership() {
    let rig = Rig::with_groups(
        vec![model("a"), model("b"), model("c")],
        DeviceLimit::default(),
        vec![group("chat", &["a", "b"])],
    );
    drop(rig.route("a").await);
    drop(rig.route("c").await);
    rig.reload_groups(vec![group("chat", &["b", "c"])]);
    let summary = rig.gateway.reload().await.expect("reloaded");
    assert_eq!(summary["groups"], json!(["chat"]));
    assert_eq!(summary["unchanged"], json!(["a", "b", "c"]));
    // `b` now swaps with `c`, and `a` (out of the group) stays.
    drop(rig.route("b").await);
    assert_eq!(
        rig.log.entries(),
        log(&["launch a", "launch c", "stop c", "launch b"])
    );
    assert_eq!(
        rig.states(),
        [
            state("a", "ready"),
            state("b", "ready"),
            state("c", "stopped")
        ]
    );
}

impl Rig {
    /// Makes `reload` keep every model and set `groups`.
    fn reload_groups(&self, groups: Vec<Group>) {
        let specs: Vec<ModelSpec> = self
            .gateway
            .models()
            .iter()
            .map(|model| ModelSpec {
                keep_alive: model.spec.keep_alive,
                load_timeout: LOAD_TIMEOUT,
                fingerprint: model.spec.fingerprint.clone(),
                pin: model.spec.pin,
                ..ModelSpec::new(model.spec.id.clone(), Arc::clone(&model.spec.launcher))
            })
            .collect();
        let read = Mutex::new(Some(Configuration {
            models: specs,
            limits: HashMap::new(),
            groups,
        }));
        self.gateway.set_reloader(Arc::new(move || {
            Ok(read
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .expect("one reload"))
        }));
    }
}

/// `unlisted` is routed to but in no listing a client sees (`/v1/models`, a 404's
/// known models); `upstream_model` is what the route sends the engine, and the answer
/// is named as the client asked.
#[tokio::test(start_paused = true)]
async fn an_unlisted_model_is_routed_but_not_listed_and_upstream_model_renames_back() {
    let hidden = Spec {
        unlisted: true,
        upstream_model: Some("org/real-name"),
        ..model("hidden")
    };
    let rig = Rig::new(vec![model("shown"), hidden], DeviceLimit::default());
    let listed = <Gateway as Upstream>::models(&rig.gateway).expect("a list");
    let ids: Vec<&Value> = listed["data"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| &e["id"])
        .collect();
    assert_eq!(ids, [&json!("shown")]);
    let unknown = rig.refused("nope").await;
    assert!(
        !unknown.body.to_string().contains("hidden"),
        "{}",
        unknown.body
    );
    let route = rig.route("hidden").await;
    assert_eq!(route.upstream_model.as_deref(), Some("org/real-name"));
    assert_eq!(route.rename.as_deref(), Some("hidden"));
    drop(route);
    assert_eq!(rig.row("hidden")["unlisted"], true);
    // The plain model's engine answers as its id: nothing to rename or replace.
    let plain = rig.route("shown").await;
    assert_eq!((plain.rename, plain.upstream_model), (None, None));
}

/// A request that comes in before the host started the gateway service (the
/// listener is up first) waits for that start, so its load is reported: its
/// `loading` event is not emitted into nothing.
#[tokio::test(start_paused = true)]
async fn a_request_before_the_gateway_started_still_reports_its_load() {
    let rig = Rig::new(vec![model("a")], max_loaded(1));
    // No yield since `Rig::new` started the host: the gateway's start has not run.
    drop(rig.route("a").await);
    assert_eq!(
        rig.events("local-ai.model.starting"),
        [json!({"model": "a", "device": "cpu", "state": "starting", "reason": "request"})]
    );
    assert_eq!(rig.events("local-ai.model.ready").len(), 1);
}

/// The first kind in the table that serves `path`, and nothing else of OpenAI's chat.
fn kind_serving(path: &str) -> Engine {
    Engine::ALL
        .into_iter()
        .find(|e| {
            let paths = e.kind().api_paths();
            arcane_localai::serves_path(paths, path)
                && !arcane_localai::serves_path(paths, "/v1/chat/completions")
        })
        .unwrap_or_else(|| panic!("no kind serves only {path}"))
}

#[tokio::test(start_paused = true)]
async fn a_model_that_does_not_serve_the_path_is_refused_naming_its_paths_and_nothing_loads() {
    let rig = Rig::new(
        vec![
            model("chat"),
            Spec {
                kind: kind_serving("/v1/audio/speech"),
                ..model("voice")
            },
            Spec {
                kind: kind_serving("/v1/audio/transcriptions"),
                ..model("ears")
            },
        ],
        max_loaded(3),
    );
    for asked in ["chat", "ears"] {
        let Err(refused) = rig.ask_path(Some(asked), "/v1/audio/speech").await else {
            panic!("`{asked}` was routed to speech");
        };
        assert_eq!(refused.status, StatusCode::NOT_FOUND);
        let error = &refused.body["error"];
        assert_eq!(error["code"], codes::LOCAL_AI_PATH_NOT_SERVED, "{error}");
        assert_eq!(error["type"], "invalid_request_error", "{error}");
        assert_eq!(error["param"], "model", "{error}");
        assert_eq!(error["details"]["model"], asked, "{error}");
        assert_eq!(error["details"]["servedBy"], json!(["voice"]), "{error}");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("/v1/audio/speech") && message.contains("`voice`"),
            "{message}"
        );
    }
    let chat = rig.ask_path(Some("chat"), "/v1/audio/speech").await.err();
    let serves = chat.map(|r| r.body["error"]["details"]["serves"].clone());
    assert!(
        serves.is_some_and(|s| s
            .as_array()
            .is_some_and(|s| s.contains(&json!("/v1/chat/completions")))),
        "a refusal names the paths the model serves"
    );
    settle().await;
    assert!(
        rig.log.entries().is_empty(),
        "nothing was loaded: {:?}",
        rig.log.entries()
    );

    // A request naming no model goes to the first that serves its path.
    let route = rig
        .ask_path(None, "/v1/audio/transcriptions")
        .await
        .unwrap_or_else(|r| panic!("refused: {}", r.body));
    assert_eq!(rig.log.entries(), ["launch ears"]);
    drop(route);
    let route = rig.ask_path(None, "/v1/chat/completions").await;
    assert!(route.is_ok());
    assert_eq!(rig.log.entries(), ["launch ears", "launch chat"]);
}

#[tokio::test(start_paused = true)]
async fn an_external_url_model_serves_every_v1_path_and_the_front_door_routes_them() {
    let rig = Rig::new(
        vec![
            Spec {
                kind: kind_serving("/v1/audio/speech"),
                ..model("voice")
            },
            Spec {
                external: true,
                ..model("remote")
            },
        ],
        max_loaded(2),
    );
    // vLLM or another Arcane: whatever `/v1` path it has, even one no kind here serves.
    for path in [
        "/v1/images/generations",
        "/v1/audio/speech",
        "/v1/chat/completions",
    ] {
        assert!(Upstream::serves(&*rig.gateway, path), "{path}");
    }
    assert!(!Upstream::serves(&*rig.gateway, "/v2/anything"));
    assert!(
        !Upstream::serves(&*rig.gateway, "/v1"),
        "the prefix itself is no path below it"
    );
    let route = rig
        .ask_path(Some("remote"), "/v1/images/generations")
        .await
        .unwrap_or_else(|r| panic!("refused: {}", r.body));
    drop(route);
    assert_eq!(rig.log.entries(), ["launch remote"]);
    // Naming none, a path both serve goes to the first; one only it serves, to it.
    assert!(rig.ask_path(None, "/v1/audio/speech").await.is_ok());
    assert_eq!(rig.log.entries(), ["launch remote", "launch voice"]);
    assert!(rig.ask_path(None, "/v1/embeddings").await.is_ok());
    assert_eq!(rig.log.count("launch remote"), 1, "already loaded");
    assert_eq!(rig.log.count("launch voice"), 1);
    // A voice is still only a voice.
    let refused = rig
        .ask_path(Some("voice"), "/v1/images/generations")
        .await
        .err();
    assert!(refused.is_some_and(|r| r.body["error"]["details"]["servedBy"] == json!(["remote"])));
}

#[tokio::test(start_paused = true)]
async fn past_parallel_a_request_waits_for_a_slot_and_past_max_queue_it_is_refused_at_once() {
    let rig = Rig::new(
        vec![Spec {
            parallel: 1,
            max_queue: 1,
            ..model("a")
        }],
        max_loaded(1),
    );
    let first = rig.route("a").await;
    let waiting = rig.spawn_route("a");
    settle().await;
    assert!(
        !waiting.is_finished(),
        "the second waits for the first's slot"
    );
    let refused = rig.refused("a").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.body["error"]["code"], codes::CORE_OVERLOADED);
    assert_eq!(refused.body["error"]["details"]["reason"], "queue_full");
    assert!(
        refused.retry_after.is_some_and(|s| s >= 1),
        "{:?}",
        refused.retry_after
    );
    let row = rig
        .gateway
        .rows()
        .into_iter()
        .find(|r| r["id"] == "a")
        .unwrap();
    assert_eq!(
        (row["inFlight"].clone(), row["queued"].clone()),
        (json!(1), json!(1))
    );
    drop(first);
    let second = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("served once the first ended")
        .unwrap();
    assert!(second.is_ok());
    let metrics = rig.gateway.metrics_text();
    assert!(
        metrics.contains("arcane_requests_refused_total{model=\"a\",reason=\"queue_full\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_key_is_routed_among_its_models_only_and_told_which_they_are() {
    let rig = Rig::new(vec![model("a"), model("b")], max_loaded(2));
    let key = |models: &[&str]| arcane_core::keys::Principal {
        name: "app".into(),
        scope: arcane_core::keys::Scope::Inference,
        models: Some(
            models
                .iter()
                .map(|m| m.to_string())
                .collect::<Vec<_>>()
                .into(),
        ),
        ..arcane_core::keys::Principal::workspace()
    };
    let ask = |model: Option<&str>, caller| RouteRequest {
        model: model.map(String::from),
        caller,
        ..RouteRequest::default()
    };
    // No model named: the first it may use, not the default.
    let route = rig
        .gateway
        .route(ask(None, key(&["b"])))
        .await
        .ok()
        .expect("routed");
    assert_eq!(rig.states(), [state("a", "stopped"), state("b", "ready")]);
    drop(route);
    for (model, allowed) in [(Some("a"), &["b"][..]), (None, &["gone"][..])] {
        let refused = rig
            .gateway
            .route(ask(model, key(allowed)))
            .await
            .err()
            .expect("refused");
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
        assert_eq!(refused.body["error"]["code"], codes::CORE_MODEL_DENIED);
        assert_eq!(refused.body["error"]["details"]["allowed"], json!(allowed));
        let message = refused.body["error"]["message"].as_str().unwrap();
        assert!(message.contains("may not use the model `a`"), "{message}");
    }
}
