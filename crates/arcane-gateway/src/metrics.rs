//! The gateway's Prometheus metrics (`GET /metrics`, token required), in the
//! OpenMetrics text format of the `prometheus-client` crate. Per model:
//!
//! * `arcane_requests_total`, `arcane_request_errors_total` (an answer of 400 or more,
//!   or no answer), `arcane_request_duration_seconds` (a histogram, to the end of the
//!   answer);
//! * `arcane_prompt_tokens_total`, `arcane_completion_tokens_total` (from the answers'
//!   `usage`);
//! * `arcane_model_loads_total`, `arcane_model_evictions_total`,
//!   `arcane_model_crashes_total`, and `arcane_model_loaded` (1 while ready);
//! * admission: `arcane_requests_running`, `arcane_queue_depth`,
//!   `arcane_requests_refused_total{reason}` (`queue_full`, `deadline`);
//! * per key (its name, never the key) and model: `arcane_key_requests_total`,
//!   `arcane_key_queue_depth`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The label every metric carries.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ModelLabel {
    /// The model id.
    pub model: String,
}

/// The labels of a per-key series: the key's name (never the key) and the model.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KeyLabel {
    /// The key's name (`workspace` for the workspace token).
    pub key: String,
    /// The model id.
    pub model: String,
}

/// The labels of a refusal by admission.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RefusalLabel {
    /// The model id.
    pub model: String,
    /// `queue_full` or `deadline`.
    pub reason: String,
}

/// Every metric of the gateway.
pub(crate) struct Metrics {
    registry: Registry,
    pub requests: Family<ModelLabel, Counter>,
    pub errors: Family<ModelLabel, Counter>,
    pub duration: Family<ModelLabel, Histogram>,
    pub prompt_tokens: Family<ModelLabel, Counter>,
    pub completion_tokens: Family<ModelLabel, Counter>,
    pub loads: Family<ModelLabel, Counter>,
    pub evictions: Family<ModelLabel, Counter>,
    pub crashes: Family<ModelLabel, Counter>,
    pub loaded: Family<ModelLabel, Gauge>,
    pub key_requests: Family<KeyLabel, Counter>,
    pub refused: Family<RefusalLabel, Counter>,
    pub running: Family<ModelLabel, Gauge>,
    pub queued: Family<ModelLabel, Gauge>,
    pub key_queued: Family<KeyLabel, Gauge>,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("arcane");
        let duration = Family::<ModelLabel, Histogram>::new_with_constructor(|| {
            // 5 ms to about 5.5 min.
            Histogram::new(exponential_buckets(0.005, 2.0, 17))
        });
        let metrics = Self {
            requests: Family::default(),
            errors: Family::default(),
            duration,
            prompt_tokens: Family::default(),
            completion_tokens: Family::default(),
            loads: Family::default(),
            evictions: Family::default(),
            crashes: Family::default(),
            loaded: Family::default(),
            key_requests: Family::default(),
            refused: Family::default(),
            running: Family::default(),
            queued: Family::default(),
            key_queued: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "requests",
            "Requests forwarded to a model",
            metrics.requests.clone(),
        );
        registry.register(
            "request_errors",
            "Requests answered with 400 or more, or not answered",
            metrics.errors.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time to the end of the answer",
            metrics.duration.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens, from the answers' usage",
            metrics.prompt_tokens.clone(),
        );
        registry.register(
            "completion_tokens",
            "Completion tokens, from the answers' usage",
            metrics.completion_tokens.clone(),
        );
        registry.register("model_loads", "Loads started", metrics.loads.clone());
        registry.register(
            "model_evictions",
            "Unloads to make room on a device",
            metrics.evictions.clone(),
        );
        registry.register(
            "model_crashes",
            "Engines that died while ready",
            metrics.crashes.clone(),
        );
        registry.register(
            "model_loaded",
            "1 while the model is loaded",
            metrics.loaded.clone(),
        );
        registry.register(
            "key_requests",
            "Requests forwarded to a model, by the name of the key they came with",
            metrics.key_requests.clone(),
        );
        registry.register(
            "requests_refused",
            "Requests refused at once by admission (queue_full, deadline)",
            metrics.refused.clone(),
        );
        registry.register(
            "requests_running",
            "Requests forwarded to the model's engine now (at most its parallel)",
            metrics.running.clone(),
        );
        registry.register(
            "queue_depth",
            "Requests waiting in the model's queue",
            metrics.queued.clone(),
        );
        registry.register(
            "key_queue_depth",
            "Requests waiting in the model's queue, by key name",
            metrics.key_queued.clone(),
        );
        Self {
            registry,
            ..metrics
        }
    }

    /// Creates every series of `model` at zero, so a scrape sees it before its first
    /// request.
    pub(crate) fn register_model(&self, model: &str) {
        let label = Self::label(model);
        for family in [
            &self.requests,
            &self.errors,
            &self.prompt_tokens,
            &self.completion_tokens,
            &self.loads,
            &self.evictions,
            &self.crashes,
        ] {
            let _ = family.get_or_create(&label);
        }
        let _ = self.duration.get_or_create(&label);
        let _ = self.loaded.get_or_create(&label);
        let _ = self.running.get_or_create(&label);
        let _ = self.queued.get_or_create(&label);
    }

    /// The label of `model`.
    pub(crate) fn label(model: &str) -> ModelLabel {
        ModelLabel {
            model: model.to_string(),
        }
    }

    /// The label of `key`'s requests to `model`.
    pub(crate) fn key_label(key: &str, model: &str) -> KeyLabel {
        KeyLabel {
            key: key.to_string(),
            model: model.to_string(),
        }
    }

    /// The text exposition.
    pub(crate) fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_each_model() {
        let metrics = Metrics::new();
        metrics
            .requests
            .get_or_create(&Metrics::label("smol-a"))
            .inc();
        metrics
            .loaded
            .get_or_create(&Metrics::label("smol-a"))
            .set(1);
        let text = metrics.encode();
        assert!(
            text.contains("arcane_requests_total{model=\"smol-a\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("arcane_model_loaded{model=\"smol-a\"} 1"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
