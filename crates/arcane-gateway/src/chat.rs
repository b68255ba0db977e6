//! `llama.chat` on the gateway: the SDK's chat method for an `arcane/1` client (a
//! stdio application, a bridge) of a host that routes by model. It takes the route
//! a passthrough request would (the model `model` names, else the default; loaded on
//! demand; counted in flight, so no unload cuts it), then the one `llama.chat` of
//! the local-AI service ([`arcane_core::localai::chat`]).

use std::sync::Arc;

use serde_json::{json, Value};

use super::{refused, Gateway};
use arcane_core::route::{RouteRequest, Upstream};
use arcane_core::service::{MethodResult, RequestContext};

impl Gateway {
    /// Answers `llama.chat`: the answer names the model as the client asked.
    pub(super) async fn chat_method(
        self: &Arc<Self>,
        mut parameters: Value,
        context: RequestContext,
    ) -> MethodResult {
        let request = RouteRequest {
            model: parameters["model"].as_str().map(str::to_string),
            keep_alive: parameters.get("keep_alive").cloned(),
            path: Some("/v1/chat/completions".into()),
            queued: true,
            ..RouteRequest::default()
        };
        let route = Upstream::route(&**self, request).await.map_err(refused)?;
        if let Some(upstream) = &route.upstream_model {
            parameters["model"] = json!(upstream);
        }
        let mut lease = route.lease;
        let answer = arcane_core::localai::chat(
            &arcane_core::upstream::engine_client(),
            &route.access,
            parameters,
            &context,
        )
        .await;
        if let Some(lease) = lease.as_mut() {
            match &answer {
                Ok(value) => {
                    lease.answered(hyper::StatusCode::OK);
                    lease.usage(&value["usage"]);
                    lease.finished();
                }
                Err(_) => lease.unreachable(),
            }
        }
        let mut value = answer?;
        if let Some(name) = route.rename {
            value["model"] = json!(name);
        }
        Ok(value)
    }
}
