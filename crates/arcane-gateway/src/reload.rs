//! Reading the configuration again: added, removed, changed and unchanged models, the
//! device limits and the exclusive groups.

use std::sync::Arc;
use std::time::Duration;

use arcane_report::{error_json, event_types};
use serde_json::{json, Value};

use super::model::Model;
use super::placement::Reason;
use super::*;

impl Gateway {
    /// Sets how `models.reload` reads the configuration again.
    pub fn set_reloader(&self, reloader: Reloader) {
        *self.reloader.lock().unwrap_or_else(|p| p.into_inner()) = Some(reloader);
    }

    /// Reads the configuration again and applies it: added models become routable,
    /// removed ones stop being routed to and unload once idle, changed ones are
    /// replaced (the old engine unloads once idle), unchanged ones are untouched. The
    /// device limits and groups are replaced: a group's new rule applies from the next
    /// load (members loaded together before it stay until one is idle and another
    /// member loads). Returns `{added, removed, changed, unchanged, groups}`.
    pub async fn reload(&self) -> MethodResult {
        let reloader = self
            .reloader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(reloader) = reloader else {
            return Err(Box::new(Error::usage(
                "this host cannot read its configuration again",
                json!({}),
            )));
        };
        let read = tokio::task::spawn_blocking(move || reloader())
            .await
            .map_err(|e| {
                Box::new(Error::usage(
                    format!("the reload did not finish: {e}"),
                    json!({}),
                )) as BoxError
            })
            .and_then(|read| read);
        match read {
            Ok(configuration) => {
                // Serialized with placement decisions: a load is decided wholly before
                // or wholly after the models change.
                let placement = self.placement.lock().await;
                let summary = self.apply(configuration);
                drop(placement);
                self.emit(event_types::LOCAL_AI_MODELS_RELOADED, summary.clone());
                Ok(summary)
            }
            Err(error) => {
                // Nothing changes: the models keep running as configured before.
                self.emit(
                    event_types::LOCAL_AI_MODELS_RELOADED,
                    json!({"error": error_json(&*error)}),
                );
                Err(error)
            }
        }
    }

    /// Applies a new configuration (see [`Gateway::reload`]).
    pub(super) fn apply(&self, configuration: Configuration) -> Value {
        let Configuration {
            models: specs,
            limits,
            groups,
        } = configuration;
        let group_ids: Vec<String> = groups.iter().map(|g| g.id.clone()).collect();
        let old = self.models();
        let (mut added, mut changed, mut unchanged) = (Vec::new(), Vec::new(), Vec::new());
        let mut next = Vec::new();
        for spec in specs {
            let id = spec.id.clone();
            match old.iter().find(|m| m.spec.id == id) {
                Some(model) if model.spec.fingerprint == spec.fingerprint => {
                    unchanged.push(id);
                    next.push(Arc::clone(model));
                }
                Some(_) => {
                    changed.push(id);
                    next.push(Model::new(spec));
                }
                None => {
                    added.push(id);
                    next.push(Model::new(spec));
                }
            }
        }
        let retired: Vec<Arc<Model>> = old
            .into_iter()
            .filter(|m| !next.iter().any(|n| Arc::ptr_eq(n, m)))
            .collect();
        let removed: Vec<String> = retired
            .iter()
            .filter(|m| !changed.contains(&m.spec.id))
            .map(|m| m.spec.id.clone())
            .collect();
        for model in &next {
            self.metrics.register_model(&model.spec.id);
        }
        *self.models.write().unwrap_or_else(|p| p.into_inner()) = next;
        *self.limits.write().unwrap_or_else(|p| p.into_inner()) = limits;
        *self.groups.write().unwrap_or_else(|p| p.into_inner()) = groups;
        for model in retired {
            self.retire(model);
        }
        self.changed.notify_waiters();
        json!({"added": added, "removed": removed, "changed": changed, "unchanged": unchanged, "groups": group_ids})
    }

    /// Unloads a model no longer routed to once its requests are done. It stays in
    /// `retiring` (counted by placement, the namesake rule and shutdown) until it no
    /// longer holds an engine: an unload refused because a request took the model in
    /// the meantime (a waiter of its load, leased between the idle check and the
    /// unload) is tried again once that request ends, never given up on.
    pub(super) fn retire(&self, model: Arc<Model>) {
        if !model.state().occupies() {
            return;
        }
        self.retiring
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::clone(&model));
        let Some(gateway) = self.me.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            loop {
                let notified = gateway.changed.notified();
                let state = model.state();
                let idle = model.lock().in_flight == 0;
                match state {
                    // Not done until the phase says so: the unload may have found a
                    // request in flight after all (see above).
                    EngineState::Ready if idle => {
                        #[cfg(test)]
                        if let Some(race) = gateway
                            .retire_race
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .as_ref()
                        {
                            race(&model);
                        }
                        gateway.unload(&model, Reason::Requested, None).await;
                    }
                    state if !state.occupies() => break,
                    _ => {
                        // Woken by a request's end or a phase change; checked again at
                        // least every second.
                        let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
                    }
                }
            }
            gateway
                .retiring
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|m| !Arc::ptr_eq(m, &model));
        });
    }
}
