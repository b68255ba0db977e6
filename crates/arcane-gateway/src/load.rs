//! A model's load and what ends it: the launch, `ready` or `error`, and an engine
//! that dies (a crash) or an external server that stops answering.

use std::sync::Arc;
use std::time::Duration;

use arcane_localai::ServerSnapshot;
use arcane_report::{codes, error_json};
use hyper::StatusCode;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::metrics::Metrics;
use super::model::Model;
use super::placement::Reason;
use super::*;

impl Gateway {
    /// Starts loading `model` unless a load already runs (then returns at once): makes
    /// room on its device first.
    pub(super) async fn load(&self, model: &Arc<Model>, reason: &str) -> Result<(), NoRoute> {
        // A request may come in before the gateway service started (the listener is up
        // first): its load waits for the start, so its `loading` event is not emitted
        // into nothing.
        if self.started().await.is_none() {
            return Err(not_ready(&model.spec.id, "the host is shutting down"));
        }
        let placement = self.placement.lock().await;
        // A model a reload replaced meanwhile is never started (its requests follow its
        // successor); placement decisions and reloads take the same lock.
        if !self.is_routed(model)
            || !matches!(model.state(), EngineState::Stopped | EngineState::Error)
        {
            return Ok(());
        }
        if let Some(refused) = held_back(model) {
            return Err(refused);
        }
        self.make_room(model).await?;
        if !self.enter(model, &[Change::Start], |_| {}, json!({"reason": reason})) {
            return Ok(());
        }
        drop(placement);
        self.metrics
            .loads
            .get_or_create(&Metrics::label(&model.spec.id))
            .inc();
        let Some(me) = self.me.upgrade() else {
            return Ok(());
        };
        let model = Arc::clone(model);
        tokio::spawn(async move { me.run_load(model).await });
        Ok(())
    }

    /// The service's context once the host started the gateway; `None` when the host
    /// shuts down first.
    async fn started(&self) -> Option<arcane_core::service::ServiceContext> {
        let mut context = self.context.subscribe();
        tokio::select! {
            started = context.wait_for(Option::is_some) => started.ok().and_then(|c| c.clone()),
            () = self.shutdown.cancelled() => None,
        }
    }

    /// The load itself: launch, then `ready` (or `error`).
    pub(super) async fn run_load(self: Arc<Self>, model: Arc<Model>) {
        let Some(context) = self.started().await else {
            return;
        };
        let observer = self.observer(&model);
        let launched = tokio::time::timeout(
            model.spec.load_timeout + Duration::from_secs(5),
            model.spec.launcher.launch(
                // Its engine's output and states are filed under the model.
                arcane_core::logs::ModelTag::wrap(&model.spec.id, context.sink()),
                observer,
                self.shutdown.clone(),
            ),
        )
        .await;
        match launched {
            Ok(Ok(handle)) => self.loaded(&model, handle),
            Ok(Err(error)) => self.load_failed(&model, error_json(&*error)),
            Err(_) => self.load_failed(
                &model,
                json!({"code": codes::LOCAL_AI_SERVER_FAILED, "message": format!("`{}` did not load within {:?}", model.spec.id, model.spec.load_timeout), "details": {"model": model.spec.id}}),
            ),
        }
        self.changed.notify_waiters();
    }

    pub(super) fn loaded(&self, model: &Arc<Model>, handle: Box<dyn EngineHandle>) {
        let snapshot = handle.snapshot();
        let Some(address) = snapshot.address() else {
            self.load_failed(model, json!({"code": codes::LOCAL_AI_SERVER_FAILED, "message": format!("`{}` has no usable address `{}`", model.spec.id, snapshot.url)}));
            return;
        };
        let access = arcane_core::upstream::EngineAccess {
            address,
            key: snapshot.api_key.clone(),
        };
        {
            let mut inner = model.lock();
            inner.handle = Some(handle);
            inner.pid = snapshot.pid;
            inner.last_used = Instant::now();
            inner.retry_at = None;
            inner.ready_since = Some(Instant::now());
        }
        let mut data = json!({"pid": snapshot.pid, "url": access.address.to_string(), "reachableWithoutToken": model.spec.reachable_without_token || snapshot.key_ignored, "keyIgnored": snapshot.key_ignored});
        // The estimate it was placed by, beside what the engine really holds.
        data["memoryNeed"] = json!(model.spec.memory);
        data["residentBytes"] = json!(snapshot.pid.and_then(arcane_process::resident_bytes));
        if let Some(cpus) = &model.spec.cpus {
            data["cpus"] = json!(cpus.to_string());
            data["cpusSharedWith"] = json!(self.cpus_shared_with(model));
        }
        if self.enter(model, &[Change::Ready], |p| p.access = Some(access), data) {
            self.metrics
                .loaded
                .get_or_create(&Metrics::label(&model.spec.id))
                .set(1);
            self.schedule_idle(model);
        }
    }

    pub(super) fn load_failed(&self, model: &Arc<Model>, error: Value) {
        {
            let mut inner = model.lock();
            inner.load_failures += 1;
            // Even after one failure, a second load waits a moment: the requests that
            // arrive right after it get its error (and `Retry-After`) instead of a load
            // each.
            let wait = Model::backoff(inner.load_failures).unwrap_or(Duration::from_secs(1));
            inner.retry_at = Some(Instant::now() + wait);
            inner.last_error = Some(error.clone());
        }
        let data = json!({"reason": "load-failed", "error": error});
        self.enter(model, &[Change::Failed], |p| p.error = Some(error), data);
    }

    /// Sees the supervisor's snapshots: an engine answering `503 Loading model` makes a
    /// starting model `loading`; an engine that died while ready is a crash.
    pub(super) fn observer(&self, model: &Arc<Model>) -> arcane_localai::StateObserver {
        let gateway = self.me.clone();
        let model = Arc::downgrade(model);
        Arc::new(move |snapshot: &ServerSnapshot| {
            let (Some(gateway), Some(model)) = (gateway.upgrade(), model.upgrade()) else {
                return;
            };
            match (model.state(), snapshot.state) {
                (EngineState::Starting, EngineState::Loading) => {
                    gateway.enter(&model, &[Change::Loading], |_| {}, json!({}));
                }
                (EngineState::Ready, EngineState::Error | EngineState::Stopped)
                    if !model.lock().stopping =>
                {
                    gateway.crashed(&model, snapshot);
                }
                _ => {}
            }
        })
    }

    pub(super) fn crashed(&self, model: &Arc<Model>, snapshot: &ServerSnapshot) {
        let error = snapshot.error.clone().unwrap_or_else(|| {
            json!({"code": codes::LOCAL_AI_SERVER_FAILED, "message": format!("the engine of `{}` stopped", model.spec.id)})
        });
        let handle = {
            let mut inner = model.lock();
            inner.crashes += 1;
            inner.pid = None;
            inner.last_error = Some(error.clone());
            // An engine that stayed up a minute starts the count again; one that keeps
            // dying sooner backs off like a failing load.
            let stayed_up = inner
                .ready_since
                .is_some_and(|since| since.elapsed() >= Duration::from_secs(60));
            inner.load_failures = if stayed_up {
                1
            } else {
                inner.load_failures + 1
            };
            inner.retry_at = Model::backoff(inner.load_failures).map(|d| Instant::now() + d);
            inner.handle.take()
        };
        let label = Metrics::label(&model.spec.id);
        self.metrics.crashes.get_or_create(&label).inc();
        self.metrics.loaded.get_or_create(&label).set(0);
        // `error`, then `stopping`, as one step: nothing new is routed to the dying
        // engine, and no replacement starts while it still holds its socket, port and
        // memory. Requests wait in `stopping` until the supervisor has it down (at once
        // after a crash, a kill for an unresponsive one); then the next one loads it
        // again.
        let data = json!({"reason": Reason::Crashed.name(), "error": error, "exit": snapshot.exit});
        let stopping = self.enter(model, &[Change::Failed, Change::Stop], |_| {}, data);
        let (gateway, model) = (self.me.clone(), Arc::clone(model));
        tokio::spawn(async move {
            // The handle taken above is stopped even when the table refused the step
            // (the model changed meanwhile): it is this task's to stop, or nobody's.
            if let Some(handle) = handle {
                let _ = handle.stop().await;
            }
            if let Some(gateway) = gateway.upgrade().filter(|_| stopping) {
                let data = json!({"reason": Reason::Crashed.name()});
                gateway.enter(&model, &[Change::Stopped], |_| {}, data);
            }
        });
    }

    /// An external model that did not answer: released, in `error` saying so (its
    /// `lastError` too), so the next request adopts (probes) it again.
    pub(super) fn lost_external(&self, model: &Arc<Model>) {
        let handle = model.lock().handle.take();
        let url = model.spec.launcher.url();
        let error = json!({"code": codes::LOCAL_AI_SERVER_FAILED, "message": format!("the server of `{}` at {url} stopped answering", model.spec.id), "details": {"model": model.spec.id, "url": url}});
        let data = json!({"reason": "unreachable", "error": error});
        if self.enter(
            model,
            &[Change::Failed],
            |p| p.error = Some(error.clone()),
            data,
        ) {
            model.lock().last_error = Some(error);
            let label = Metrics::label(&model.spec.id);
            self.metrics.loaded.get_or_create(&label).set(0);
        }
        if let Some(handle) = handle {
            // Releasing an adopted server signals nothing.
            tokio::spawn(async move {
                let _ = handle.stop().await;
            });
        }
    }
}

/// The refusal of a load while `model` is held back after failures: 503 with its last
/// error and `Retry-After`; `None` when it may load.
fn held_back(model: &Model) -> Option<NoRoute> {
    let inner = model.lock();
    let wait = inner.retry_at?.checked_duration_since(Instant::now())?;
    let mut refused = load_failed(inner.last_error.as_ref().unwrap_or(&Value::Null));
    refused.status = StatusCode::SERVICE_UNAVAILABLE;
    refused.retry_after = Some(wait.as_secs().max(1));
    Some(refused)
}
