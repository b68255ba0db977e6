//! What fits on a device: eviction of the least recently used idle model that is not
//! pinned, the swap of an exclusive group's member, unloading, and the idle clock of
//! `keep_alive`.
//!
//! Every placement decision is [`Gateway::next_step`]: in order, one engine per model
//! id (a retired namesake goes first), one loaded member per exclusive group, then the
//! device's `max_loaded` and memory. A decision either lets the load go on, unloads
//! one model, waits (bounded by the load timeout) for one to become idle, or refuses
//! with a [`Refusal`] that names what holds the device.

use std::sync::Arc;
use std::time::Duration;

use arcane_report::codes;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::metrics::Metrics;
use super::model::Model;
use super::*;

/// Why a model is being unloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reason {
    KeepAlive,
    Requested,
    Evicted,
    /// Another member of its exclusive group is loading.
    Group,
    Shutdown,
    /// Its engine died; said once the dying engine is down and a load may start again.
    Crashed,
}

impl Reason {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::KeepAlive => "keep-alive",
            Self::Requested => "request",
            Self::Evicted => "evicted",
            Self::Group => "group",
            Self::Shutdown => "shutdown",
            Self::Crashed => "crashed",
        }
    }
}

/// A model that holds a device or a group, as a refusal names it.
#[derive(Debug, Clone)]
pub(super) struct Holder {
    id: String,
    in_flight: usize,
    state: &'static str,
    memory: u64,
    pinned: Option<Pinned>,
}

impl Holder {
    fn of(model: &Model) -> Self {
        Self {
            id: model.spec.id.clone(),
            in_flight: model.lock().in_flight,
            state: model.state().as_str(),
            memory: model.spec.memory,
            pinned: model.spec.pinned(),
        }
    }

    fn json(&self) -> Value {
        json!({"model": self.id, "inFlight": self.in_flight, "state": self.state, "memory": self.memory, "pinned": self.pinned.map(Pinned::setting)})
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` (", self.id)?;
        if let Some(pinned) = self.pinned {
            write!(
                f,
                "pinned by `{}`, {} bytes, ",
                pinned.setting(),
                self.memory
            )?;
        }
        write!(f, "{} in flight, {})", self.in_flight, self.state)
    }
}

fn listed(holders: &[Holder]) -> String {
    let names: Vec<String> = holders.iter().map(Holder::to_string).collect();
    names.join(", ")
}

/// How full a device is, as a refusal says it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Usage {
    loaded: usize,
    max_loaded: Option<usize>,
    used: u64,
    budget: Option<u64>,
}

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(max) = self.max_loaded {
            parts.push(format!("{} of {max} slots", self.loaded));
        }
        if let Some(budget) = self.budget {
            parts.push(format!("{} of {budget} bytes", self.used));
        }
        if parts.is_empty() {
            return write!(f, "{} loaded", self.loaded);
        }
        write!(f, "{} in use", parts.join(" and "))
    }
}

/// Why a load gets no room: each with a stable code and its values in `details`.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refusal {
    /// The model alone is bigger than its device's budget.
    #[error("`{model}` needs {need} bytes, more than device `{device}`'s budget of {budget}")]
    OverBudget {
        model: String,
        device: String,
        need: u64,
        budget: u64,
    },
    /// A retired configuration of the same id still serves requests.
    #[error("`{model}` was reloaded and its previous configuration still has requests in flight; the new one loads once they are done")]
    Namesake { model: String },
    /// The device is full, and what could go stayed busy until the load timeout.
    #[error("device `{device}` is full and busy: {} hold it; `{model}` cannot load until one is idle", listed(.holders))]
    DeviceBusy {
        model: String,
        device: String,
        holders: Vec<Holder>,
    },
    /// The device is full of pinned models: nothing may go.
    #[error("`{model}` ({need} bytes) cannot load: device `{device}` is full ({usage}) and held by pinned models, never evicted to make room: {}", listed(.holders))]
    Pinned {
        model: String,
        device: String,
        need: u64,
        usage: Usage,
        holders: Vec<Holder>,
    },
    /// Another member of the model's exclusive group stayed busy until the load
    /// timeout.
    #[error("group `{group}` allows one loaded model: {} holds it; `{model}` cannot load until it is idle", listed(.holders))]
    GroupBusy {
        model: String,
        group: String,
        holders: Vec<Holder>,
    },
}

impl Refusal {
    /// The stable error code.
    pub(super) fn code(&self) -> &'static str {
        match self {
            Self::Pinned { .. } => codes::LOCAL_AI_DEVICE_PINNED,
            Self::OverBudget { .. } => codes::LOCAL_AI_MODEL_TOO_LARGE,
            _ => codes::ARCANE_IN_USE,
        }
    }

    /// `{code, message, details}`.
    pub(super) fn json(&self) -> Value {
        json!({"code": self.code(), "message": self.to_string(), "details": self.details()})
    }

    /// The offending values.
    fn details(&self) -> Value {
        let holders = |holders: &[Holder]| holders.iter().map(Holder::json).collect::<Vec<_>>();
        match self {
            Self::OverBudget {
                model,
                device,
                need,
                budget,
            } => {
                json!({"model": model, "device": device, "need": need, "budget": budget})
            }
            Self::Namesake { model } => json!({"model": model}),
            Self::DeviceBusy {
                model,
                device,
                holders: h,
            } => {
                json!({"model": model, "device": device, "holders": holders(h)})
            }
            Self::Pinned {
                model,
                device,
                need,
                usage,
                holders: h,
            } => json!({
                "model": model, "device": device, "need": need, "loaded": usage.loaded,
                "maxLoaded": usage.max_loaded, "used": usage.used, "budget": usage.budget,
                "available": usage.budget.map(|b| b.saturating_sub(usage.used)),
                "pinned": holders(h),
            }),
            Self::GroupBusy {
                model,
                group,
                holders: h,
            } => {
                json!({"model": model, "group": group, "holders": holders(h)})
            }
        }
    }
}

impl From<Refusal> for NoRoute {
    /// 503; a retry may succeed later unless the device is pinned full or too small.
    fn from(refusal: Refusal) -> Self {
        let never = [
            codes::LOCAL_AI_DEVICE_PINNED,
            codes::LOCAL_AI_MODEL_TOO_LARGE,
        ];
        let retry_after = (!never.contains(&refusal.code())).then_some(5);
        NoRoute {
            status: StatusCode::SERVICE_UNAVAILABLE,
            body: json!({"error": {"code": refusal.code(), "message": refusal.to_string(), "details": refusal.details()}}),
            retry_after,
            retry_after_ms: None,
        }
    }
}

/// What placement does next for a load.
enum Step {
    /// The model fits: its load goes on.
    Fits,
    /// This model goes first (and the decision is made again).
    Unload(Arc<Model>, Reason),
    /// Wait for a change (a request ending, an unload), bounded; this is the refusal
    /// when the bound passes.
    Wait(Refusal),
    /// Nothing can change: refused now.
    Refuse(Refusal),
}

/// Whether `model` could be unloaded now (ready, nothing in flight).
fn idle(model: &Model) -> bool {
    model.state().is_ready() && model.lock().in_flight == 0
}

impl Gateway {
    /// Makes room for `model` on its device and in its group: unloads, or waits
    /// (bounded by its load timeout) for, what must go first (see
    /// [`Gateway::next_step`]). Called with the placement lock held.
    pub(super) async fn make_room(&self, model: &Arc<Model>) -> Result<(), Refusal> {
        let limit = self.limit(&model.spec.device);
        if let Some(budget) = limit.memory.filter(|b| model.spec.memory > *b) {
            return Err(Refusal::OverBudget {
                model: model.spec.id.clone(),
                device: model.spec.device.clone(),
                need: model.spec.memory,
                budget,
            });
        }
        let deadline = Instant::now() + model.spec.load_timeout;
        loop {
            // Registered before the decision, so a change in between is not lost.
            let changed = self.changed.notified();
            match self.next_step(model, limit) {
                Step::Fits => return Ok(()),
                Step::Refuse(refusal) => return Err(refusal),
                Step::Unload(first, reason) => {
                    self.unload(&first, reason, Some(&model.spec.id)).await;
                }
                Step::Wait(refusal) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() || tokio::time::timeout(left, changed).await.is_err() {
                        return Err(refusal);
                    }
                }
            }
        }
    }

    /// The one placement decision for loading `model` (see the module documentation).
    fn next_step(&self, model: &Arc<Model>, limit: DeviceLimit) -> Step {
        let everyone = self.everyone();
        let others: Vec<&Arc<Model>> = everyone
            .iter()
            .filter(|m| !Arc::ptr_eq(m, model) && m.state().occupies())
            .collect();
        self.decide(model, limit, &others)
    }

    /// The decision for loading `model` while `others` hold their devices.
    fn decide(&self, model: &Arc<Model>, limit: DeviceLimit, others: &[&Arc<Model>]) -> Step {
        namesake_step(model, others)
            .or_else(|| self.group_step(model, others))
            .unwrap_or_else(|| device_step(model, limit, others))
    }

    /// What loading `model` would do now, changing nothing (`models.plan`, `arcane
    /// load --dry-run`): its device and estimate, what it would evict and why, or what
    /// it would wait for, or why it cannot load. The same decisions as a load, made on
    /// a copy of who holds the devices.
    pub(super) fn plan(&self, model: &Arc<Model>) -> Value {
        let limit = self.limit(&model.spec.device);
        let everyone = self.everyone();
        let mut others: Vec<&Arc<Model>> = everyone
            .iter()
            .filter(|m| !Arc::ptr_eq(m, model) && m.state().occupies())
            .collect();
        let on_device: Vec<&&Arc<Model>> = others
            .iter()
            .filter(|m| m.spec.device == model.spec.device)
            .collect();
        let mut plan = json!({
            "model": model.spec.id,
            "device": model.spec.device,
            "state": model.state().as_str(),
            "memoryNeed": model.spec.memory,
            "estimate": model.spec.memory_estimate.clone().unwrap_or_else(|| json!({"bytes": model.spec.memory})),
            "deviceLimits": {
                "memory": limit.memory,
                "maxLoaded": limit.max_loaded,
                "used": on_device.iter().map(|m| m.spec.memory).sum::<u64>(),
                "loaded": on_device.iter().map(|m| m.spec.id.clone()).collect::<Vec<_>>(),
            },
            "evict": [],
        });
        if model.state().occupies() {
            plan["outcome"] = json!("loaded");
            return plan;
        }
        if let Some(budget) = limit.memory.filter(|b| model.spec.memory > *b) {
            let refusal = Refusal::OverBudget {
                model: model.spec.id.clone(),
                device: model.spec.device.clone(),
                need: model.spec.memory,
                budget,
            };
            plan["outcome"] = json!("refused");
            plan["error"] = refusal.json();
            return plan;
        }
        let mut evicted = Vec::new();
        loop {
            match self.decide(model, limit, &others) {
                Step::Fits => {
                    plan["outcome"] = json!("loads");
                    break;
                }
                Step::Unload(first, reason) => {
                    evicted.push(eviction(&first, reason, self.group_of(&first.spec.id)));
                    others.retain(|m| !Arc::ptr_eq(m, &first));
                }
                Step::Wait(refusal) => {
                    plan["outcome"] = json!("waits");
                    plan["waitsFor"] = refusal.json();
                    break;
                }
                Step::Refuse(refusal) => {
                    plan["outcome"] = json!("refused");
                    plan["error"] = refusal.json();
                    break;
                }
            }
        }
        plan["evict"] = Value::Array(evicted);
        plan
    }

    /// An exclusive group's other loaded member goes once it is idle.
    fn group_step(&self, model: &Model, others: &[&Arc<Model>]) -> Option<Step> {
        let group = self.group_of(&model.spec.id)?;
        let rivals: Vec<&Arc<Model>> = others
            .iter()
            .copied()
            .filter(|m| group.members.contains(&m.spec.id))
            .collect();
        if rivals.is_empty() {
            return None;
        }
        if let Some(rival) = rivals.iter().find(|m| idle(m)) {
            return Some(Step::Unload(Arc::clone(rival), Reason::Group));
        }
        Some(Step::Wait(Refusal::GroupBusy {
            model: model.spec.id.clone(),
            group: group.id,
            holders: rivals.iter().map(|m| Holder::of(m)).collect(),
        }))
    }

    /// The exclusive group `id` belongs to.
    pub(super) fn group_of(&self, id: &str) -> Option<Group> {
        self.groups
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|g| g.members.iter().any(|m| m == id))
            .cloned()
    }

    /// The limits of `device` (none when it has no table).
    fn limit(&self, device: &str) -> DeviceLimit {
        self.limits
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(device)
            .copied()
            .unwrap_or_default()
    }

    /// Stops `model`'s engine (a ready model only; one with requests in flight only
    /// at shutdown).
    pub(super) async fn unload(&self, model: &Arc<Model>, reason: Reason, for_model: Option<&str>) {
        let data = match reason {
            Reason::Evicted => json!({"reason": reason.name(), "for": for_model}),
            Reason::Group => {
                json!({"reason": reason.name(), "for": for_model, "group": self.group_of(&model.spec.id).map(|g| g.id)})
            }
            _ => json!({"reason": reason.name()}),
        };
        let handle = {
            let mut inner = model.lock();
            let busy = inner.in_flight > 0 && reason != Reason::Shutdown;
            // Only a ready model is unloaded (a crashed one is stopped by `crashed`).
            if busy
                || !model.state().is_ready()
                || !self.enter(model, &[Change::Stop], |_| {}, data.clone())
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
        let label = Metrics::label(&model.spec.id);
        self.metrics.loaded.get_or_create(&label).set(0);
        if reason == Reason::Evicted {
            self.metrics.evictions.get_or_create(&label).inc();
        }
        self.enter(model, &[Change::Stopped], |_| {}, data);
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

/// One model a load would unload first, and why, as a dry run says it.
fn eviction(model: &Model, reason: Reason, group: Option<Group>) -> Value {
    let idle = model.lock().last_used.elapsed().as_secs_f64();
    let why = match reason {
        Reason::Evicted => format!(
            "the least recently used idle model on device `{}` that is not pinned (idle {idle:.0} s)",
            model.spec.device
        ),
        Reason::Group => format!(
            "exclusive group `{}` allows one loaded model",
            group.map(|g| g.id).unwrap_or_default()
        ),
        _ => "an earlier configuration of the same id".to_string(),
    };
    json!({"model": model.spec.id, "reason": reason.name(), "why": why, "memory": model.spec.memory, "idleSeconds": idle})
}

/// One engine per model id: a retired model of the same id (its socket and ownership
/// record are this one's) goes first, whatever the capacity.
fn namesake_step(model: &Model, others: &[&Arc<Model>]) -> Option<Step> {
    let namesake = others.iter().find(|m| m.spec.id == model.spec.id)?;
    Some(if idle(namesake) {
        Step::Unload(Arc::clone(namesake), Reason::Requested)
    } else {
        Step::Wait(Refusal::Namesake {
            model: model.spec.id.clone(),
        })
    })
}

/// The device's `max_loaded` and memory: the least recently used idle model that is
/// not pinned goes; with none, the load waits for one that may go, or is refused when
/// only pinned models hold the device.
fn device_step(model: &Model, limit: DeviceLimit, others: &[&Arc<Model>]) -> Step {
    let occupants: Vec<&Arc<Model>> = others
        .iter()
        .copied()
        .filter(|m| m.spec.device == model.spec.device)
        .collect();
    let usage = Usage {
        loaded: occupants.len(),
        max_loaded: limit.max_loaded,
        used: occupants.iter().map(|m| m.spec.memory).sum(),
        budget: limit.memory,
    };
    let fits_count = usage.max_loaded.is_none_or(|max| usage.loaded < max);
    let fits_memory = usage
        .budget
        .is_none_or(|budget| usage.used + model.spec.memory <= budget);
    if fits_count && fits_memory {
        return Step::Fits;
    }
    let movable = |m: &&Arc<Model>| m.spec.pinned().is_none() || m.state() == EngineState::Stopping;
    let victim = occupants
        .iter()
        .filter(|m| m.spec.pinned().is_none() && idle(m))
        .min_by_key(|m| m.lock().last_used);
    if let Some(victim) = victim {
        return Step::Unload(Arc::clone(victim), Reason::Evicted);
    }
    let holders = occupants.iter().map(|m| Holder::of(m)).collect();
    let (model_id, device) = (model.spec.id.clone(), model.spec.device.clone());
    if occupants.iter().any(movable) {
        return Step::Wait(Refusal::DeviceBusy {
            model: model_id,
            device,
            holders,
        });
    }
    Step::Refuse(Refusal::Pinned {
        model: model_id,
        device,
        need: model.spec.memory,
        usage,
        holders,
    })
}
