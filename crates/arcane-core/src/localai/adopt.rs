//! [`AdoptLauncher`]: adopts an engine that already listens at a URL, never starting or
//! signalling a process. Readiness is `arcane-localai`'s one classifier
//! ([`arcane_localai::probe::probe`]); every state change goes through its one table
//! ([`ServerSnapshot::apply`]).

use std::sync::Arc;
use std::time::Duration;

use arcane_localai::probe::{self, ProbeOutcome};
use arcane_localai::{
    Change, Endpoint, Engine, EngineAddress, EngineState, ServerSnapshot, StateObserver,
};
use arcane_report::{error_json, CancelToken, Event, EventSink};
use serde_json::Value;

use super::{EngineHandle, EngineLauncher};
use crate::error::{Error, Unready};
use crate::service::{BoxError, BoxFuture};
use crate::upstream::Deadlines;

/// How long to wait between two probes of an engine that is not ready yet.
const PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// An [`EngineLauncher`] that only adopts an engine already listening at a URL (it
/// never starts or signals a process): the external-server case, and what tests use
/// around an engine they run themselves. It probes the engine's readiness path
/// (llama.cpp `GET /health`, Ollama `GET /api/version`) until it is ready or until
/// `wait` has passed.
pub struct AdoptLauncher {
    runtime: Engine,
    url: String,
    wait: Duration,
}

impl AdoptLauncher {
    /// Adopts `runtime` at `url`, probing for at most `wait`.
    pub fn new(runtime: Engine, url: impl Into<String>, wait: Duration) -> Arc<Self> {
        Arc::new(Self {
            runtime,
            url: url.into().trim_end_matches('/').to_string(),
            wait,
        })
    }
}

struct AdoptedEngine {
    snapshot: ServerSnapshot,
}

impl EngineHandle for AdoptedEngine {
    fn snapshot(&self) -> ServerSnapshot {
        self.snapshot.clone()
    }

    fn stop(self: Box<Self>) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async { Ok(()) })
    }
}

/// One adoption's snapshot, published like the supervisor's: an event, then the
/// observer, once per change.
struct Adoption {
    snapshot: ServerSnapshot,
    events: Arc<dyn EventSink>,
    observer: StateObserver,
}

impl Adoption {
    fn emit(&self) {
        let data = serde_json::to_value(&self.snapshot).unwrap_or(Value::Null);
        self.events.emit(Event::new(
            self.snapshot
                .state
                .event_type(arcane_localai::Subject::Server),
            data,
        ));
        (self.observer)(&self.snapshot);
    }

    fn change(&mut self, change: Change, edit: impl FnOnce(&mut ServerSnapshot)) {
        // Every change here is one the table allows from where the loop is.
        if self.snapshot.apply(change).is_ok() {
            edit(&mut self.snapshot);
            self.emit();
        }
    }
}

/// The engine of a kind the adopter can probe: one that answers HTTP at a url.
fn engine_of(runtime: Engine) -> Result<Engine, BoxError> {
    if matches!(
        runtime.kind().starts(),
        arcane_localai::Starts::Worker | arcane_localai::Starts::Builtin { .. }
    ) {
        return Err(Box::new(Error::usage(
            format!("runtime `{runtime}` has no engine to adopt"),
            serde_json::json!({"runtime": runtime.as_str()}),
        )));
    }
    Ok(runtime)
}

impl EngineLauncher for AdoptLauncher {
    fn runtime(&self) -> Engine {
        self.runtime
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    fn launch(
        &self,
        events: Arc<dyn EventSink>,
        observer: StateObserver,
        cancel: CancelToken,
    ) -> BoxFuture<'static, Result<Box<dyn EngineHandle>, BoxError>> {
        let (runtime, url, wait) = (self.runtime, self.url.clone(), self.wait);
        Box::pin(async move {
            let engine = engine_of(runtime)?;
            let endpoint = Endpoint::parse(&url).map_err(|e| Box::new(e) as BoxError)?;
            let address = EngineAddress::Tcp(endpoint);
            let mut snapshot = ServerSnapshot::new(runtime.as_str(), runtime.as_str(), &url);
            snapshot.external = true;
            let mut adoption = Adoption {
                snapshot,
                events,
                observer,
            };
            adoption.emit();
            let probe_url = format!("{url}{}", probe::health_path(engine));
            let deadline = tokio::time::Instant::now() + wait;
            loop {
                let timeout = Deadlines::QUICK.head;
                let last_error = match probe::probe(engine, &address, timeout).await {
                    ProbeOutcome::Ready { version } => {
                        adoption.change(Change::Ready, |s| s.version = version);
                        return Ok(Box::new(AdoptedEngine {
                            snapshot: adoption.snapshot,
                        }) as Box<dyn EngineHandle>);
                    }
                    ProbeOutcome::Loading => {
                        if adoption.snapshot.state != EngineState::Loading {
                            adoption.change(Change::Loading, |_| {});
                        }
                        format!("`{probe_url}` answered HTTP 503 (loading the model)")
                    }
                    ProbeOutcome::Answered { status, .. } => {
                        format!("`{probe_url}` answered HTTP {status}")
                    }
                    ProbeOutcome::Refused => {
                        format!("`{probe_url}` did not answer: connection refused")
                    }
                    ProbeOutcome::NoHttp(error) | ProbeOutcome::Unreachable(error) => {
                        format!("`{probe_url}` did not answer: {error}")
                    }
                    _ => format!("`{probe_url}` did not answer"),
                };
                if cancel.is_cancelled() {
                    return Err(Box::new(Error::Cancelled {
                        id: runtime.as_str().into(),
                    }) as BoxError);
                }
                if tokio::time::Instant::now() >= deadline {
                    let error = Error::EngineNotReady {
                        runtime: runtime.as_str().into(),
                        state: Unready::Unanswered(last_error),
                        retry_after: None,
                    };
                    let record = error_json(&error);
                    adoption.change(Change::Failed, |s| s.error = Some(record));
                    return Err(Box::new(error) as BoxError);
                }
                tokio::time::sleep(PROBE_INTERVAL).await;
            }
        })
    }
}
