//! The `model-assets` service: `modelAssets.status`.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::service::{BoxError, BoxFuture, MethodResult, MethodSpec, RequestContext, Service};

/// The `model-assets` service: `modelAssets.status` lists the workspace's registered
/// models (the lister is plugged in by the CLI from `arcane-registry`).
pub struct ModelAssetsService {
    lister: Box<dyn Fn() -> Result<Value, BoxError> + Send + Sync>,
}

impl ModelAssetsService {
    /// A service listing models with `lister`.
    pub fn new(lister: impl Fn() -> Result<Value, BoxError> + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self {
            lister: Box::new(lister),
        })
    }
}

impl Service for ModelAssetsService {
    fn name(&self) -> &str {
        "model-assets"
    }

    fn methods(&self) -> Vec<MethodSpec> {
        vec![MethodSpec::request("modelAssets.status")]
    }

    fn call(
        self: Arc<Self>,
        _method: String,
        _parameters: Value,
        _context: RequestContext,
    ) -> BoxFuture<'static, MethodResult> {
        let result = (self.lister)();
        Box::pin(async move { result.map(|models| json!({"models": models})) })
    }
}
