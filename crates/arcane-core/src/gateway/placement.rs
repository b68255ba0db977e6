//! What fits on a device: eviction of the least recently used idle model, unloading,
//! and the idle clock of `keep_alive`.

use std::sync::Arc;
use std::time::Duration;

use arcane_report::event_types;
use serde_json::json;
use tokio::time::Instant;

use super::metrics::Metrics;
use super::model::{Model, Phase};
use super::*;

/// Why a model is being unloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reason {
    KeepAlive,
    Requested,
    Evicted,
    Shutdown,
}

impl Reason {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::KeepAlive => "keep-alive",
            Self::Requested => "request",
            Self::Evicted => "evicted",
            Self::Shutdown => "shutdown",
        }
    }
}

impl Gateway {
    /// Evicts least recently used idle models on `model`'s device until it fits, or
    /// waits (bounded) for one to become idle. Called with the placement lock held.
    pub(super) async fn make_room(&self, model: &Arc<Model>) -> Result<(), NoRoute> {
        let device = &model.spec.device;
        let limit = self
            .limits
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(device)
            .copied()
            .unwrap_or_default();
        if let Some(budget) = limit.memory.filter(|b| model.spec.memory > *b) {
            return Err(busy(format!(
                "`{}` needs {} bytes, more than device `{device}`'s budget of {budget}",
                model.spec.id, model.spec.memory
            )));
        }
        let deadline = Instant::now() + model.spec.load_timeout;
        loop {
            let everyone = self.everyone();
            // One engine per model id: a retired model of the same id (its socket and
            // ownership record are this one's) goes first, whatever the capacity.
            let namesake = everyone
                .iter()
                .find(|m| {
                    m.spec.id == model.spec.id && !Arc::ptr_eq(m, model) && m.current().occupies()
                })
                .cloned();
            if let Some(namesake) = namesake {
                let idle =
                    matches!(namesake.current(), Phase::Ready(_)) && namesake.lock().in_flight == 0;
                if idle {
                    self.unload(&namesake, Reason::Requested, Some(&model.spec.id))
                        .await;
                    continue;
                }
                let notified = self.changed.notified();
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() {
                    return Err(busy(format!(
                        "`{}` was reloaded and its previous configuration still has requests in flight; the new one loads once they are done",
                        model.spec.id
                    )));
                }
                continue;
            }
            let occupants: Vec<&Arc<Model>> = everyone
                .iter()
                .filter(|m| {
                    &m.spec.device == device && !Arc::ptr_eq(m, model) && m.current().occupies()
                })
                .collect();
            let used: u64 = occupants.iter().map(|m| m.spec.memory).sum();
            let fits_count = limit.max_loaded.is_none_or(|max| occupants.len() < max);
            let fits_memory = limit
                .memory
                .is_none_or(|budget| used + model.spec.memory <= budget);
            if fits_count && fits_memory {
                return Ok(());
            }
            let victim = occupants
                .iter()
                .filter(|m| matches!(m.current(), Phase::Ready(_)) && m.lock().in_flight == 0)
                .min_by_key(|m| m.lock().last_used)
                .map(|m| Arc::clone(m));
            if let Some(victim) = victim {
                self.unload(&victim, Reason::Evicted, Some(&model.spec.id))
                    .await;
                continue;
            }
            let notified = self.changed.notified();
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() {
                let holders: Vec<String> = occupants
                    .iter()
                    .map(|m| {
                        format!(
                            "`{}` ({} in flight, {})",
                            m.spec.id,
                            m.lock().in_flight,
                            m.current().name()
                        )
                    })
                    .collect();
                return Err(busy(format!(
                    "device `{device}` is full and busy: {} hold it; `{}` cannot load until one is idle",
                    holders.join(", "),
                    model.spec.id
                )));
            }
        }
    }

    /// Stops `model`'s engine (a ready model only; one with requests in flight only
    /// at shutdown).
    pub(super) async fn unload(&self, model: &Arc<Model>, reason: Reason, for_model: Option<&str>) {
        let handle = {
            let mut inner = model.lock();
            let busy = inner.in_flight > 0 && reason != Reason::Shutdown;
            if busy
                || !matches!(model.current(), Phase::Ready(_))
                || !model.become_(Phase::Unloading)
            {
                return;
            }
            inner.stopping = true;
            inner.unload_at = None;
            inner.handle.take()
        };
        if let Some(handle) = handle {
            let _ = handle.stop().await;
        }
        {
            let mut inner = model.lock();
            inner.stopping = false;
            inner.pid = None;
            inner.ready_since = None;
            // A clean unload: the next load starts without a backoff.
            inner.load_failures = 0;
        }
        model.become_(Phase::Unloaded);
        let label = Metrics::label(&model.spec.id);
        self.metrics.loaded.get_or_create(&label).set(0);
        if reason == Reason::Evicted {
            self.metrics.evictions.get_or_create(&label).inc();
        }
        let (kind, data) = match reason {
            Reason::Evicted => (
                event_types::LOCAL_AI_MODEL_EVICTED,
                json!({"model": model.spec.id, "device": model.spec.device, "for": for_model}),
            ),
            _ => (
                event_types::LOCAL_AI_MODEL_UNLOADED,
                json!({"model": model.spec.id, "device": model.spec.device, "reason": reason.name()}),
            ),
        };
        self.emit(kind, data);
        self.changed.notify_waiters();
    }

    /// Starts the idle clock of a model with nothing in flight.
    pub(super) fn schedule_idle(&self, model: &Arc<Model>) {
        let (generation, wait) = {
            let mut inner = model.lock();
            if inner.in_flight > 0 || inner.waiting > 0 {
                return;
            }
            let wait = match inner.keep_alive {
                KeepAlive::Never => return,
                KeepAlive::AfterEachRequest => Duration::ZERO,
                KeepAlive::For(duration) => duration,
            };
            inner.unload_at = Some(Instant::now() + wait);
            (inner.idle_generation, wait)
        };
        let (Some(gateway), model) = (self.me.upgrade(), Arc::clone(model)) else {
            return;
        };
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let still_idle = {
                let inner = model.lock();
                inner.idle_generation == generation && inner.in_flight == 0 && inner.waiting == 0
            };
            if still_idle {
                gateway.unload(&model, Reason::KeepAlive, None).await;
            }
        });
    }
}
