//! The host's ONNX workers by key (a target, or `<target>/<session>` for an isolated
//! session), each with its holds: the sessions loaded in it and the loads in flight
//! on it.
//!
//! Why holds: a worker is a whole ONNX Runtime process (tens of MB), so one nobody
//! uses must not stay (issue 19 §10: ten isolated loads and unloads left eleven
//! workers). The last hold's release takes the worker out of the pool to be stopped;
//! counting loads in flight, not only sessions, keeps an unload from stopping a worker
//! a concurrent load is about to use. And a cap bounds how many run at once, so a
//! client that forgets to unload gets a clear error instead of exhausting memory.

use std::collections::HashMap;
use std::sync::Arc;

use arcane_report::codes;
use serde_json::json;

use crate::worker::Worker;
use arcane_core::service::BoxError;
use arcane_core::Error;

struct Slot {
    worker: Arc<Worker>,
    holds: usize,
}

/// The workers, their holds, and the cap.
pub(crate) struct Pool {
    slots: HashMap<String, Slot>,
    max: usize,
}

impl Pool {
    /// An empty pool that runs at most `max` workers.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            slots: HashMap::new(),
            max,
        }
    }

    /// The live worker under `key`, if any.
    pub(crate) fn live(&self, key: &str) -> Option<Arc<Worker>> {
        self.slots
            .get(key)
            .filter(|slot| !slot.worker.is_dead())
            .map(|slot| Arc::clone(&slot.worker))
    }

    /// Any live worker (its hello tells the runtime's version and providers).
    pub(crate) fn any_live(&self) -> Option<Arc<Worker>> {
        self.slots
            .values()
            .find(|slot| !slot.worker.is_dead())
            .map(|slot| Arc::clone(&slot.worker))
    }

    /// How many workers run (dead ones, kept only for their failed sessions, do not).
    pub(crate) fn running(&self) -> usize {
        self.slots
            .values()
            .filter(|slot| !slot.worker.is_dead())
            .count()
    }

    /// Refuses a new worker for `target` when the cap is reached: `ARCANE_IN_USE`
    /// naming the cap and how many run, with the way out.
    pub(crate) fn check_room(&self, target: &str) -> Result<(), BoxError> {
        let running = self.running();
        if running < self.max {
            return Ok(());
        }
        Err(Box::new(Error::Remote {
            code: codes::ARCANE_IN_USE.into(),
            message: format!(
                "cannot start another ONNX worker for `{target}`: {running} workers run, the most this host allows (maxWorkers {})",
                self.max
            ),
            details: json!({"target": target, "running": running, "maxWorkers": self.max}),
            hints: vec![
                "unload sessions you no longer need with `onnx.unload` (`onnx.status` lists them): a worker whose last session is unloaded stops".into(),
                "load without `isolated: true` to share the target's worker".into(),
            ],
            cause: None,
        }))
    }

    /// Puts a freshly started `worker` under `key` with no holds (replacing a dead
    /// one, whose sessions keep their own reference to report how it ended).
    pub(crate) fn insert(&mut self, key: &str, worker: Arc<Worker>) {
        self.slots
            .insert(key.to_string(), Slot { worker, holds: 0 });
    }

    /// Adds a hold on the worker under `key` (a load about to use it).
    pub(crate) fn hold(&mut self, key: &str) {
        if let Some(slot) = self.slots.get_mut(key) {
            slot.holds += 1;
        }
    }

    /// Drops a hold of `worker` under `key` (its load failed or its session was
    /// unloaded). A worker that was replaced meanwhile is no longer the pool's: its
    /// holds went with it.
    pub(crate) fn release(&mut self, key: &str, worker: &Arc<Worker>) {
        if let Some(slot) = self.slots.get_mut(key) {
            if Arc::ptr_eq(&slot.worker, worker) {
                slot.holds = slot.holds.saturating_sub(1);
            }
        }
    }

    /// Takes out every worker without holds (to be stopped by the caller).
    pub(crate) fn take_idle(&mut self) -> Vec<Arc<Worker>> {
        let idle: Vec<String> = self
            .slots
            .iter()
            .filter(|(_, slot)| slot.holds == 0)
            .map(|(key, _)| key.clone())
            .collect();
        idle.iter()
            .filter_map(|key| self.slots.remove(key))
            .map(|slot| slot.worker)
            .collect()
    }

    /// Takes out every worker (the host is stopping).
    pub(crate) fn drain(&mut self) -> Vec<Arc<Worker>> {
        self.slots.drain().map(|(_, slot)| slot.worker).collect()
    }

    /// Every worker, for `onnx.status`.
    pub(crate) fn workers(&self) -> impl Iterator<Item = &Arc<Worker>> {
        self.slots.values().map(|slot| &slot.worker)
    }
}
