//! The `execution-devices` service: `localai.devices` and `localai.resolveTarget` over
//! a [`DeviceCatalog`].

use std::sync::Arc;

use serde_json::{json, Value};

use super::DeviceCatalog;
use crate::error::Error;
use crate::service::{BoxError, BoxFuture, MethodResult, MethodSpec, RequestContext, Service};

/// The `execution-devices` service: `localai.devices` and `localai.resolveTarget`.
pub struct DevicesService {
    catalog: Arc<dyn DeviceCatalog>,
}

impl DevicesService {
    /// A service over `catalog` (creating it does no I/O).
    pub fn new(catalog: Arc<dyn DeviceCatalog>) -> Arc<Self> {
        Arc::new(Self { catalog })
    }
}

impl Service for DevicesService {
    fn name(&self) -> &str {
        "execution-devices"
    }

    fn methods(&self) -> Vec<MethodSpec> {
        vec![
            MethodSpec::request("localai.devices"),
            MethodSpec::request("localai.resolveTarget"),
        ]
    }

    fn call(
        self: Arc<Self>,
        method: String,
        parameters: Value,
        _context: RequestContext,
    ) -> BoxFuture<'static, MethodResult> {
        Box::pin(async move {
            let catalog = Arc::clone(&self.catalog);
            let joined = tokio::task::spawn_blocking(move || match method.as_str() {
                "localai.devices" => {
                    catalog.devices(parameters["refresh"].as_bool().unwrap_or(false))
                }
                _ => {
                    let target = parameters
                        .get("executionTarget")
                        .cloned()
                        .unwrap_or(Value::Null);
                    catalog.resolve(&target)
                }
            })
            .await;
            match joined {
                Ok(result) => result,
                Err(join) => Err(Box::new(Error::usage(
                    format!("device probing failed: {join}"),
                    json!({}),
                )) as BoxError),
            }
        })
    }
}
