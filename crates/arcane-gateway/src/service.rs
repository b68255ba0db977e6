//! The gateway as the passthrough's [`Upstream`] and as a Core [`Service`].

use std::sync::Arc;

use arcane_report::codes;
use hyper::StatusCode;
use serde_json::{json, Value};

use super::model::Model;
use super::placement::Reason;
use super::*;

impl Gateway {
    pub(super) fn model_parameter(&self, parameters: &Value) -> Result<Arc<Model>, BoxError> {
        let name = parameters["model"].as_str();
        self.find(name, None, &Principal::workspace()).map_err(|no_route| {
            Box::new(Error::usage(
                no_route.body["error"]["message"]
                    .as_str()
                    .unwrap_or("unknown model")
                    .to_string(),
                json!({"model": name, "known": self.models().iter().map(|m| m.spec.id.clone()).collect::<Vec<_>>()}),
            )) as BoxError
        })
    }

    pub(super) async fn load_method(&self, parameters: Value) -> MethodResult {
        let model = self.model_parameter(&parameters)?;
        // A load holds the model as a request would, and is not one (`/metrics`, the
        // dashboard's requests and errors).
        let lease = self
            .acquire(&model, None)
            .await
            .map_err(refused)?
            .uncounted();
        let model = Arc::clone(lease.model());
        drop(lease);
        Ok(model.row())
    }

    pub(super) async fn unload_method(&self, parameters: Value) -> MethodResult {
        let model = self.model_parameter(&parameters)?;
        let in_flight = model.lock().in_flight;
        if in_flight > 0 {
            return Err(Box::new(Error::Remote {
                code: codes::ARCANE_IN_USE.into(),
                message: format!("`{}` has {in_flight} request(s) in flight", model.spec.id),
                details: json!({"model": model.spec.id, "inFlight": in_flight}),
                hints: vec!["wait for its requests to finish, then unload it".into()],
                cause: None,
            }));
        }
        self.unload(&model, Reason::Requested, None).await;
        Ok(model.row())
    }
}

impl Gateway {
    /// 503 `CORE_OVERLOADED` for a request admission refused, with a `Retry-After` of
    /// the work ahead; counted in `/metrics`.
    fn overloaded(&self, model: &Model, refusal: &super::admission::Refusal) -> NoRoute {
        use super::admission::Refusal;
        let id = &model.spec.id;
        self.metrics
            .refused
            .get_or_create(&super::metrics::RefusalLabel {
                model: id.clone(),
                reason: refusal.reason().into(),
            })
            .inc();
        let retry_after = refusal.retry_after();
        let seconds = retry_after.as_secs_f64();
        let (whole_seconds, millis) = retry_headers(retry_after);
        let (message, details) = match refusal {
            Refusal::QueueFull { queued, .. } => (
                format!("`{id}` is busy: {queued} request(s) wait already (its `max_queue`); retry after {seconds:.1} s"),
                json!({"model": id, "reason": refusal.reason(), "queued": queued, "retryAfterSeconds": seconds}),
            ),
            Refusal::Deadline { expected, deadline, .. } => (
                format!(
                    "`{id}` would keep this request waiting about {:.1} s, longer than its deadline of {:.1} s; retry after {seconds:.1} s",
                    expected.as_secs_f64(),
                    deadline.as_secs_f64()
                ),
                json!({"model": id, "reason": refusal.reason(), "expectedWaitSeconds": expected.as_secs_f64(), "deadlineSeconds": deadline.as_secs_f64(), "retryAfterSeconds": seconds}),
            ),
        };
        NoRoute {
            status: StatusCode::SERVICE_UNAVAILABLE,
            body: json!({"error": {
                "message": message,
                "type": "overloaded_error",
                "code": codes::CORE_OVERLOADED,
                "details": details,
            }}),
            retry_after: Some(whole_seconds),
            retry_after_ms: Some(millis),
        }
    }
}

/// `Retry-After` and `retry-after-ms` for a wait: both rounded up (and at least one), so
/// that a client that waits this long finds the work ahead done; the milliseconds first,
/// so that the seconds are exactly the milliseconds in whole seconds (2.0004 s is 2001 ms
/// and 3 s, never 2000 ms and 3 s: clients read either).
fn retry_headers(wait: std::time::Duration) -> (u64, u64) {
    let millis = u64::try_from(wait.as_nanos().div_ceil(1_000_000))
        .unwrap_or(u64::MAX)
        .max(1);
    (millis.div_ceil(1000), millis)
}

impl Upstream for Gateway {
    fn openai_target(&self) -> UpstreamTarget {
        let first = self.models().first().cloned();
        let runtime = first
            .as_ref()
            .map_or(arcane_localai::Engine::DEFAULT, |m| {
                m.spec.launcher.runtime()
            })
            .as_str()
            .to_string();
        let phase = first.map(|m| m.current());
        match phase.as_ref().map(|p| (p.state, p.ready())) {
            Some((_, Some(access))) => UpstreamTarget::Ready {
                access: access.clone(),
            },
            Some((EngineState::Error, _)) => UpstreamTarget::Unavailable {
                runtime,
                state: arcane_core::Unready::Unanswered("the default model failed to load".into()),
                retry_after: None,
            },
            _ => UpstreamTarget::Unavailable {
                runtime,
                state: arcane_core::Unready::Unanswered("the default model is not loaded".into()),
                retry_after: Some(1),
            },
        }
    }

    /// On demand, unless the default model loads when the host starts: then
    /// `/health` follows it (loading, ok, or error when its load failed).
    fn loads_on_demand(&self) -> bool {
        !self.models().first().is_some_and(|m| m.spec.load_on_start)
    }

    fn routes_by_model(&self) -> bool {
        true
    }

    fn route(&self, request: RouteRequest) -> BoxFuture<'_, Result<Route, NoRoute>> {
        Box::pin(async move {
            let model = self.find(
                request.model.as_deref(),
                request.path.as_deref(),
                &request.caller,
            )?;
            let keep_alive = match request.keep_alive.as_ref().map(KeepAlive::from_json) {
                Some(Err(why)) => {
                    return Err(NoRoute {
                        status: StatusCode::BAD_REQUEST,
                        body: json!({"error": {"message": format!("`keep_alive`: {why}"), "type": "invalid_request_error", "param": "keep_alive"}}),
                        retry_after: None,
                        retry_after_ms: None,
                    })
                }
                Some(Ok(keep_alive)) => Some(keep_alive),
                None => None,
            };
            let caller = &request.caller;
            let permit = match request.queued {
                true => Some(
                    model
                        .admission
                        .admit(&caller.name, caller.priority, request.deadline)
                        .await
                        .map_err(|refusal| self.overloaded(&model, &refusal))?,
                ),
                false => None,
            };
            let lease = self
                .acquire(&model, keep_alive)
                .await?
                .admitted(&caller.name, permit);
            // A reload may have replaced the model: the lease's is the one serving.
            let model = Arc::clone(lease.model());
            let Some(access) = model.current().ready().cloned() else {
                return Err(not_ready(&model.spec.id, "it was unloaded"));
            };
            // An owned llama.cpp answers with the model's id; an external server, a
            // command, or an engine sent `upstream_model` with its own name: rename when
            // the client asked for something else.
            let as_id = model.spec.answers_as_id && model.spec.upstream_model.is_none();
            Ok(Route {
                access,
                lease: Some(Box::new(lease)),
                rename: request
                    .model
                    .filter(|asked| *asked != model.spec.id || !as_id)
                    .or_else(|| (!as_id).then(|| model.spec.id.clone())),
                upstream_model: model.spec.upstream_model.clone(),
            })
        })
    }

    fn metrics(&self) -> Option<String> {
        Some(self.metrics_text())
    }

    /// Whether some model serves `path` ([`ModelSpec::serves`]).
    fn serves(&self, path: &str) -> bool {
        self.models().iter().any(|m| m.spec.serves(path))
    }

    fn models(&self) -> Option<Value> {
        let data: Vec<Value> = self.listed().iter().map(|m| m.entry()).collect();
        Some(json!({"object": "list", "data": data}))
    }

    fn catalog(&self) -> Vec<arcane_core::route::ModelFacts> {
        self.models().iter().map(|m| m.facts()).collect()
    }
}

const METHODS: &[&str] = &[
    "models.reload",
    "models.list",
    "models.plan",
    "models.load",
    "models.unload",
    "localai.status",
    "llama.status",
    "llama.models",
    "llama.load",
    "llama.unload",
    "llama.chat",
];

impl Service for Gateway {
    fn name(&self) -> &str {
        "model-gateway"
    }

    fn methods(&self) -> Vec<MethodSpec> {
        METHODS.iter().map(|m| MethodSpec::request(*m)).collect()
    }

    fn start(self: Arc<Self>, context: ServiceContext) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move {
            self.context.send_replace(Some(context));
            for model in self.models().iter().filter(|m| m.spec.load_on_start) {
                // A failed start load is reported as `local-ai.model.error`; requests
                // try again.
                let _ = self.load(model, "on-start").await;
            }
            Ok(())
        })
    }

    fn call(
        self: Arc<Self>,
        method: String,
        parameters: Value,
        context: RequestContext,
    ) -> BoxFuture<'static, MethodResult> {
        Box::pin(async move {
            match method.as_str() {
                "models.reload" => self.reload().await,
                "llama.chat" => self.chat_method(parameters, context).await,
                "models.load" => self.load_method(parameters).await,
                // A dry run of `models.load`: changes nothing.
                "models.plan" => self
                    .model_parameter(&parameters)
                    .map(|model| self.plan(&model)),
                "models.unload" => self.unload_method(parameters).await,
                // The SDK's shapes: `{loaded}` and `{released, unloaded}` beside the row.
                "llama.load" => self.load_method(parameters).await.map(|mut row| {
                    row["loaded"] = json!(row["state"] == "ready");
                    row
                }),
                "llama.unload" => self.unload_method(parameters).await.map(|mut row| {
                    row["unloaded"] = json!(row["external"] != true);
                    row["released"] = json!(true);
                    row
                }),
                "localai.status" => Ok(json!({"runtimes": self.engines(), "models": self.rows()})),
                _ => Ok(json!({"models": self.rows()})),
            }
        })
    }

    fn dispose(self: Arc<Self>) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move {
            // Loads in progress end first: cancelled, their engines stopped by the
            // supervisor (bounded: a launch honours its cancel promptly).
            self.shutdown.cancel();
            let loading = || {
                self.models()
                    .iter()
                    .any(|m| matches!(m.state(), EngineState::Starting | EngineState::Loading))
            };
            let settled = async {
                loop {
                    // Registered before the check, so a change in between is not lost.
                    let changed = self.changed.notified();
                    tokio::pin!(changed);
                    changed.as_mut().enable();
                    if !loading() {
                        break;
                    }
                    changed.await;
                }
            };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(30), settled).await;
            let mut stops = tokio::task::JoinSet::new();
            let mut everyone = self.models();
            everyone.extend(
                self.retiring
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .drain(..),
            );
            for model in &everyone {
                let (gateway, model) = (Arc::clone(&self), Arc::clone(model));
                stops.spawn(async move { gateway.unload(&model, Reason::Shutdown, None).await });
            }
            while stops.join_next().await.is_some() {}
            Ok(())
        })
    }

    fn replay(&self) -> Vec<(String, Value)> {
        Vec::new()
    }
}

#[cfg(test)]
mod retry_headers_tests {
    use std::time::Duration;

    use super::retry_headers;

    #[test]
    fn the_seconds_are_the_milliseconds_rounded_up_and_neither_is_zero() {
        let cases = [
            (Duration::ZERO, (1, 1)),
            (Duration::from_nanos(1), (1, 1)),
            (Duration::from_millis(669), (1, 669)),
            (Duration::from_secs(2), (2, 2000)),
            (Duration::from_nanos(2_000_400_000), (3, 2001)),
            (Duration::from_nanos(2_999_000_001), (3, 3000)),
        ];
        for (wait, expected) in cases {
            assert_eq!(retry_headers(wait), expected, "{wait:?}");
        }
    }
}
