//! Routing one request: waiting until its model is ready and holding it in flight
//! with a [`Lease`] until the answer is sent (the lease also measures the request).

use std::sync::Arc;
use std::time::Duration;

use hyper::StatusCode;
use serde_json::Value;
use tokio::time::Instant;

use super::metrics::Metrics;
use super::model::Model;
use super::*;

/// Held by a forwarded request until its answer is sent: the model counts it in flight
/// and starts its idle clock when the last one ends.
pub(super) struct Lease {
    model: Arc<Model>,
    gateway: Weak<Gateway>,
    started: Instant,
    status: Option<StatusCode>,
    usage: Option<Value>,
    finished: bool,
    /// Whether it is a request, measured in the metrics (a load asked for by
    /// `models.load` holds the model the same way, and is not one).
    counted: bool,
    /// The name of the key it came with (`/metrics`, the log line).
    key: Arc<str>,
    /// Its slot in the model's admission queue, given back with the lease.
    permit: Option<super::admission::Permit>,
    /// The pid of the engine it was routed to (owned engines).
    pid: Option<u32>,
}

/// How long a request whose connection broke waits to see its engine's death before
/// it is answered as the failure it is.
const ENGINE_GONE_WAIT: Duration = Duration::from_secs(10);

impl arcane_core::route::Lease for Lease {
    fn answered(&mut self, status: StatusCode) {
        self.status = Some(status);
    }

    fn usage(&mut self, usage: &Value) {
        self.usage = Some(usage.clone());
    }

    fn finished(&mut self) {
        self.finished = true;
    }

    fn unreachable(&mut self) {
        // An external server that stopped answering is probed again by the next
        // request (an owned engine's death is seen by its supervisor).
        if self.model.spec.external {
            if let Some(gateway) = self.gateway.upgrade() {
                gateway.lost_external(&self.model);
            }
        }
    }

    fn engine_gone(&mut self) -> arcane_core::service::BoxFuture<'_, bool> {
        Box::pin(async move {
            if self.model.spec.external || self.pid.is_none() || !self.engine_died().await {
                return false;
            }
            // The replay is the request; this attempt is not counted.
            self.counted = false;
            // Said as an event, which the model's log keeps too (`arcane logs MODEL`).
            if let Some(gateway) = self.gateway.upgrade() {
                let id = &self.model.spec.id;
                gateway.emit(
                    arcane_report::event_types::LOCAL_AI_REQUEST_REPLAYED,
                    serde_json::json!({"model": id, "key": &*self.key, "pid": self.pid}),
                );
            }
            true
        })
    }
}

impl Lease {
    /// Waits (at most [`ENGINE_GONE_WAIT`]) until the engine it was routed to is no
    /// longer the model's ready engine; whether it is gone.
    async fn engine_died(&self) -> bool {
        let mut phase = self.model.phase.subscribe();
        let deadline = Instant::now() + ENGINE_GONE_WAIT;
        loop {
            let ready = phase.borrow_and_update().state.is_ready();
            if !ready || self.model.lock().pid != self.pid {
                return true;
            }
            match tokio::time::timeout_at(deadline, phase.changed()).await {
                Ok(Ok(())) => continue,
                // The model is gone with its gateway: nothing to replay on.
                Ok(Err(_)) | Err(_) => return false,
            }
        }
    }

    /// The model this request is served by (after a reload, the successor of the one
    /// it was routed to).
    pub(super) fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The same lease for the key `key`, holding `permit` (its slot, measured from
    /// now) when it waited its turn.
    pub(super) fn admitted(
        mut self,
        key: &Arc<str>,
        permit: Option<super::admission::Permit>,
    ) -> Self {
        self.permit = permit.map(|mut permit| {
            permit.serving();
            permit
        });
        self.key = Arc::clone(key);
        self
    }

    /// The same lease, not measured as a request (a load someone asked for).
    pub(super) fn uncounted(mut self) -> Self {
        self.counted = false;
        self
    }

    /// Counts the request in the model's metrics, and says it in the log.
    fn measure(&self, metrics: &Metrics, gateway: &Gateway) {
        let label = Metrics::label(&self.model.spec.id);
        metrics.requests.get_or_create(&label).inc();
        metrics
            .key_requests
            .get_or_create(&Metrics::key_label(&self.key, &self.model.spec.id))
            .inc();
        let failed = !self.finished || self.status.is_none_or(|s| s.as_u16() >= 400);
        gateway.log_request(
            &self.model.spec.id,
            &format!(
                "request key={} status={} seconds={:.3}{}",
                self.key,
                self.status
                    .map_or("none".to_string(), |s| s.as_u16().to_string()),
                self.started.elapsed().as_secs_f64(),
                if self.finished { "" } else { " cut=true" },
            ),
        );
        if failed {
            metrics.errors.get_or_create(&label).inc();
        }
        metrics
            .duration
            .get_or_create(&label)
            .observe(self.started.elapsed().as_secs_f64());
        let tokens = |key: &str| {
            self.usage
                .as_ref()
                .and_then(|u| u[key].as_u64())
                .unwrap_or(0)
        };
        metrics
            .prompt_tokens
            .get_or_create(&label)
            .inc_by(tokens("prompt_tokens"));
        metrics
            .completion_tokens
            .get_or_create(&label)
            .inc_by(tokens("completion_tokens"));
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(gateway) = self.gateway.upgrade().filter(|_| self.counted) {
            self.measure(&gateway.metrics, &gateway);
        }
        // The slot goes to the next waiting request before the model may go idle.
        drop(self.permit.take());
        let idle = {
            let mut inner = self.model.lock();
            inner.in_flight = inner.in_flight.saturating_sub(1);
            inner.last_used = Instant::now();
            inner.in_flight == 0
        };
        if let Some(gateway) = self.gateway.upgrade() {
            gateway.changed.notify_waiters();
            if idle {
                gateway.schedule_idle(&self.model);
            }
        }
    }
}

/// A request waiting in [`Gateway::acquire`]: counted in [`super::model::Inner::waiting`]
/// until it is in flight or gives up (then, if it was the last, the idle clock starts).
struct Waiting {
    model: Arc<Model>,
    gateway: Weak<Gateway>,
}

impl Waiting {
    fn new(model: &Arc<Model>, gateway: Weak<Gateway>) -> Self {
        model.lock().waiting += 1;
        Self {
            model: Arc::clone(model),
            gateway,
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let idle = {
            let mut inner = self.model.lock();
            inner.waiting = inner.waiting.saturating_sub(1);
            inner.waiting == 0 && inner.in_flight == 0
        };
        if idle && self.model.state().is_ready() {
            if let Some(gateway) = self.gateway.upgrade() {
                gateway.schedule_idle(&self.model);
            }
        }
    }
}

impl Gateway {
    /// Waits until `model` is ready and counts one request in flight on it.
    ///
    /// A model that a reload replaced while the request waited is followed to its
    /// successor (the model of the same id now configured): the request is served by
    /// one configuration, and no engine of a configuration no longer routed to starts.
    pub(super) async fn acquire(
        &self,
        model: &Arc<Model>,
        keep_alive: Option<KeepAlive>,
    ) -> Result<Lease, NoRoute> {
        let mut model = Arc::clone(model);
        let mut _waiting = Waiting::new(&model, self.me.clone());
        let deadline = Instant::now() + model.spec.load_timeout + Duration::from_secs(30);
        let mut waited_on_load = false;
        loop {
            let mut phase = model.phase.subscribe();
            let current = phase.borrow_and_update().clone();
            match current.state {
                EngineState::Ready => {
                    let mut inner = model.lock();
                    // Checked again under the lock an unload takes to begin.
                    if !model.state().is_ready() {
                        continue;
                    }
                    inner.in_flight += 1;
                    inner.idle_generation += 1;
                    inner.unload_at = None;
                    if let Some(keep_alive) = keep_alive {
                        inner.keep_alive = keep_alive;
                    }
                    return Ok(Lease {
                        model: Arc::clone(&model),
                        gateway: self.me.clone(),
                        started: Instant::now(),
                        status: None,
                        usage: None,
                        finished: false,
                        counted: true,
                        key: Arc::from(arcane_core::keys::WORKSPACE_PRINCIPAL),
                        permit: None,
                        pid: inner.pid,
                    });
                }
                EngineState::Error if waited_on_load => {
                    return Err(load_failed(current.error.as_ref().unwrap_or(&Value::Null)))
                }
                EngineState::Starting | EngineState::Loading | EngineState::Stopping => {
                    waited_on_load |= current.state != EngineState::Stopping;
                    let left = deadline.saturating_duration_since(Instant::now());
                    if tokio::time::timeout(left, phase.changed()).await.is_err() {
                        return Err(not_ready(&model.spec.id, "its load did not finish in time"));
                    }
                }
                EngineState::Closed => {
                    return Err(not_ready(&model.spec.id, "the host is shutting down"))
                }
                EngineState::Stopped | EngineState::Error if !self.is_routed(&model) => {
                    model = self.successor(&model)?;
                    _waiting = Waiting::new(&model, self.me.clone());
                }
                EngineState::Stopped | EngineState::Error => {
                    self.load(&model, "request").await?;
                    waited_on_load = true;
                }
            }
        }
    }
}
