//! How the first start of a host's engines went, and when to announce the host: the
//! rule `arcane serve` (and anything else that serves a workspace) follows.
//!
//! * A plain supervised engine: judged from the `local-ai` service's typed status
//!   ([`FirstStartWatch::observe`]). Every engine ready → announce (once llama.cpp's
//!   models are known, or on the change after); one in `error` → shut the host down,
//!   the engine's error is the exit.
//! * The gateway of one model (the flags' or the embedded default's): judged from the
//!   gateway's events ([`FirstStartWatch::observe_event`]): its on-start model ready →
//!   announce; its load failed → shut down with that error.
//! * Stopped before either: a cancellation naming what was still starting
//!   ([`Outcome::Cancelled`]).

use arcane_report::{event_types, Event};
use serde_json::{json, Value};

use arcane_core::localai::{EngineState, EngineStatus, LocalAiStatus};

/// How the first start went so far.
#[derive(Debug, Clone, PartialEq)]
enum FirstStart {
    Pending,
    Ready,
    Failed(Value),
}

impl FirstStart {
    /// An engine that failed ends the first start; all ready is ready; else pending.
    fn judge(status: &LocalAiStatus) -> Self {
        if let Some(failed) = status
            .runtimes
            .iter()
            .find(|e| e.state == EngineState::Error)
        {
            return Self::Failed(failed.error.clone().unwrap_or_default());
        }
        if status.runtimes.iter().all(|e| e.state.is_ready()) {
            Self::Ready
        } else {
            Self::Pending
        }
    }
}

/// What the serving loop does after a change.
#[derive(Debug, PartialEq)]
pub enum Next {
    /// Nothing yet.
    Wait,
    /// Announce the host (with llama.cpp's entry, when it is a plain engine).
    Announce(Option<Box<EngineStatus>>),
    /// A first start failed: shut the host down (the error is the exit).
    Shutdown,
}

/// The end of a first start, once the host closed.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Everything started (a later crash does not change it).
    Started,
    /// The first start failed with this error (as `error_json` wrote it).
    Failed(Value),
    /// The host stopped while these engines (`{id: state}`) were still starting.
    Cancelled(Value),
}

/// Follows the first start of a host's engines (see the module documentation).
#[derive(Debug)]
pub struct FirstStartWatch {
    first: FirstStart,
    announced: bool,
    /// The gateway's models loaded when the host starts, not ready yet.
    models: Vec<String>,
    /// Changes seen since all engines turned ready (the models come right after).
    ready_changes: u32,
    last: LocalAiStatus,
}

impl FirstStartWatch {
    /// A watch over plain engines (`engines`: whether any is selected; none: ready at
    /// once).
    pub fn new(engines: bool) -> Self {
        Self {
            first: if engines {
                FirstStart::Pending
            } else {
                FirstStart::Ready
            },
            announced: false,
            models: Vec::new(),
            ready_changes: 0,
            last: LocalAiStatus::default(),
        }
    }

    /// Also waits for these gateway models (loaded on start) before announcing.
    pub fn waiting_for_models(mut self, models: Vec<String>) -> Self {
        if !models.is_empty() {
            self.first = FirstStart::Pending;
        }
        self.models = models;
        self
    }

    /// Whether the watch follows gateway models (then feed it the host's events).
    pub fn follows_models(&self) -> bool {
        !self.models.is_empty()
    }

    /// Judges one host event while gateway models load on start: the last one ready
    /// announces the host; one that fails to load ends the first start.
    pub fn observe_event(&mut self, event: &Event) -> Next {
        let model = event.data["model"].as_str().unwrap_or_default();
        if self.first != FirstStart::Pending || !self.models.iter().any(|m| m == model) {
            return Next::Wait;
        }
        match event.kind.as_str() {
            event_types::LOCAL_AI_MODEL_READY => {
                self.models.retain(|m| m != model);
                if !self.models.is_empty() {
                    return Next::Wait;
                }
                self.first = FirstStart::Ready;
                self.announced = true;
                Next::Announce(None)
            }
            event_types::LOCAL_AI_MODEL_ERROR if event.data["reason"] == "load-failed" => {
                self.first = FirstStart::Failed(event.data["error"].clone());
                Next::Shutdown
            }
            _ => Next::Wait,
        }
    }

    /// Judges one status of plain engines: once every engine is ready, announce when
    /// llama.cpp's models are known (fetched right after it turns ready), or anyway on
    /// the change after that.
    pub fn observe(&mut self, status: LocalAiStatus) -> Next {
        if self.first == FirstStart::Pending {
            self.first = FirstStart::judge(&status);
            self.last = status.clone();
            if matches!(self.first, FirstStart::Failed(_)) {
                return Next::Shutdown;
            }
        }
        if self.first != FirstStart::Ready || self.announced {
            return Next::Wait;
        }
        let llama = status
            .engine(arcane_localai::Engine::DEFAULT.as_str())
            .cloned()
            .map(Box::new);
        let models_known = llama.as_ref().is_none_or(|l| !l.models.is_empty());
        self.ready_changes += 1;
        if models_known || self.ready_changes > 1 {
            self.announced = true;
            return Next::Announce(llama);
        }
        Next::Wait
    }

    /// The end of the first start, once the host closed.
    pub fn outcome(&self) -> Outcome {
        match &self.first {
            FirstStart::Failed(error) => Outcome::Failed(error.clone()),
            FirstStart::Pending => {
                let mut engines: serde_json::Map<String, Value> = self
                    .last
                    .runtimes
                    .iter()
                    .map(|e| (e.id.clone(), json!(e.state.as_str())))
                    .collect();
                for model in &self.models {
                    engines.insert(model.clone(), json!("loading"));
                }
                Outcome::Cancelled(Value::Object(engines))
            }
            FirstStart::Ready => Outcome::Started,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(states: &[(&str, EngineState, usize)]) -> LocalAiStatus {
        let runtimes = states
            .iter()
            .map(|(id, state, models)| {
                let mut engine: EngineStatus = serde_json::from_value(json!({
                    "id": id, "url": "http://127.0.0.1:8080", "state": state.as_str(),
                    "error": if *state == EngineState::Error {
                        json!({"code": "LOCAL_AI_SERVER_NOT_READY", "message": "it died"})
                    } else { Value::Null },
                }))
                .unwrap();
                engine.models = (0..*models)
                    .map(|i| json!({"id": format!("m{i}")}))
                    .collect();
                engine
            })
            .collect();
        LocalAiStatus { runtimes }
    }

    /// The first start is judged from the typed status: announce once everything is
    /// ready and llama.cpp's models are known, or on the change after ready.
    #[test]
    fn the_host_is_announced_once_the_engines_are_ready() {
        let mut watch = FirstStartWatch::new(true);
        let starting = status(&[("llama.cpp", EngineState::Starting, 0)]);
        assert_eq!(watch.observe(starting), Next::Wait);
        let ready = status(&[("llama.cpp", EngineState::Ready, 0)]);
        assert_eq!(watch.observe(ready.clone()), Next::Wait);
        match watch.observe(ready) {
            Next::Announce(Some(llama)) => assert_eq!(llama.id, "llama.cpp"),
            other => panic!("{other:?}"),
        }
        // Announced once only; later changes (a crash) do not end the host.
        let crashed = status(&[("llama.cpp", EngineState::Error, 1)]);
        assert_eq!(watch.observe(crashed), Next::Wait);
        assert_eq!(watch.outcome(), Outcome::Started);

        let mut watch = FirstStartWatch::new(true);
        let known = status(&[("llama.cpp", EngineState::Ready, 1)]);
        assert!(matches!(watch.observe(known), Next::Announce(Some(_))));

        let mut watch = FirstStartWatch::new(false);
        assert_eq!(
            watch.observe(LocalAiStatus::default()),
            Next::Announce(None)
        );
    }

    /// A failed first start shuts the host down and is the exit; stopping while the
    /// engines start is a cancellation naming their states.
    #[test]
    fn a_failed_or_interrupted_first_start_is_the_exit() {
        let mut watch = FirstStartWatch::new(true);
        let failed = status(&[
            ("llama.cpp", EngineState::Ready, 1),
            ("ollama", EngineState::Error, 0),
        ]);
        assert_eq!(watch.observe(failed), Next::Shutdown);
        match watch.outcome() {
            Outcome::Failed(error) => assert_eq!(error["message"], "it died"),
            other => panic!("{other:?}"),
        }

        let mut watch = FirstStartWatch::new(true);
        let loading = status(&[("llama.cpp", EngineState::Loading, 0)]);
        assert_eq!(watch.observe(loading), Next::Wait);
        assert_eq!(
            watch.outcome(),
            Outcome::Cancelled(json!({"llama.cpp": "loading"}))
        );
    }

    /// The gateway of one model: announced when its on-start model is ready; its
    /// failed load is the exit; other models' events are not its business.
    #[test]
    fn the_one_model_is_followed_by_its_events() {
        let event = |kind: &str, data: Value| Event::new(kind, data);
        let mut watch = FirstStartWatch::new(false).waiting_for_models(vec!["m".into()]);
        assert!(watch.follows_models());
        assert_eq!(
            watch.observe_event(&event(
                event_types::LOCAL_AI_MODEL_READY,
                json!({"model": "other"})
            )),
            Next::Wait
        );
        assert_eq!(watch.outcome(), Outcome::Cancelled(json!({"m": "loading"})));
        assert_eq!(
            watch.observe_event(&event(
                event_types::LOCAL_AI_MODEL_READY,
                json!({"model": "m"})
            )),
            Next::Announce(None)
        );
        assert_eq!(watch.outcome(), Outcome::Started);

        let mut watch = FirstStartWatch::new(false).waiting_for_models(vec!["m".into()]);
        let failed = json!({"model": "m", "reason": "load-failed", "error": {"message": "no"}});
        assert_eq!(
            watch.observe_event(&event(event_types::LOCAL_AI_MODEL_ERROR, failed)),
            Next::Shutdown
        );
        assert_eq!(watch.outcome(), Outcome::Failed(json!({"message": "no"})));
    }
}
