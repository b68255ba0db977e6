//! The `engine-records` service: when the host starts, every engine ownership record
//! of the workspace is settled, not only those of the models it is about to load.
//!
//! A host killed with `kill -9` may leave an engine behind (one a wrapper forked, which
//! the parent-death signal does not reach) and always leaves its records. A model
//! renamed or removed from `arcane.toml` since would never be loaded again under that
//! id, so the per-load check (`arcane-localai`'s supervisor, before each start) would
//! never see its record: this service does, as the ONNX service does for its workers
//! ([`arcane_localai::records::reap_engines`]). It answers no method.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::error::Error;
use crate::service::{
    BoxError, BoxFuture, MethodResult, MethodSpec, RequestContext, Service, ServiceContext,
};

/// How long an orphan found at start gets between SIGTERM and SIGKILL (the engines'
/// default `stop_grace`).
const GRACE: Duration = Duration::from_secs(10);

/// Settles the workspace's engine records when the host starts.
pub struct EngineRecordsService {
    workspace: PathBuf,
}

impl EngineRecordsService {
    /// The service for the engine records of `workspace`.
    pub fn new(workspace: impl Into<PathBuf>) -> Arc<Self> {
        Arc::new(Self {
            workspace: workspace.into(),
        })
    }
}

impl Service for EngineRecordsService {
    fn name(&self) -> &str {
        "engine-records"
    }

    fn methods(&self) -> Vec<MethodSpec> {
        Vec::new()
    }

    fn start(self: Arc<Self>, context: ServiceContext) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move {
            arcane_localai::records::reap_engines(&self.workspace, GRACE, context.sink())
                .await
                .map(|_| ())
                .map_err(|error| Box::new(error) as BoxError)
        })
    }

    fn call(
        self: Arc<Self>,
        method: String,
        _parameters: Value,
        _context: RequestContext,
    ) -> BoxFuture<'static, MethodResult> {
        Box::pin(async move {
            Err(Box::new(Error::usage(
                format!("`{method}` is not a method of `engine-records`"),
                serde_json::json!({"method": method}),
            )) as BoxError)
        })
    }
}
