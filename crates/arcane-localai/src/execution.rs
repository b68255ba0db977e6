//! The bridge to `arcane-devices`: a configured target becomes device arguments,
//! environment and the execution record; after ready, the placement check.

use std::sync::Arc;

use arcane_devices::{DeviceSource, ResolveRequest};
use serde_json::Value;

use crate::command::DeviceLaunch;
use arcane_workspace::DevicePlan;

use crate::config::EngineConfig;
use crate::Error;

/// A device source shared across starts.
pub type SharedDeviceSource = Arc<dyn DeviceSource + Send + Sync>;

/// A resolved launch: what to add to the command, and the record for the snapshot.
pub(crate) struct Resolved {
    pub launch: DeviceLaunch,
    pub execution: Option<arcane_devices::ExecutionRecord>,
}

/// Resolves `config`'s target (not for a kind that chooses its own devices). Runs on a
/// blocking thread: discovery reads sysfs and may load NVML.
///
/// A kind pinned by environment only (the `command` kind) has no runtime Arcane
/// registered: a GPU target is taken as CUDA (its `CUDA_VISIBLE_DEVICES` is set to the
/// GPU's UUID), the CPU as the CPU (every GPU hidden).
pub(crate) async fn resolve(
    config: &EngineConfig,
    source: &SharedDeviceSource,
) -> Result<Resolved, Error> {
    let Some(request) = request(config) else {
        return Ok(Resolved {
            launch: DeviceLaunch::default(),
            execution: None,
        });
    };
    let source = source.clone();
    let engine = config.engine.as_str().to_string();
    let plan = tokio::task::spawn_blocking(move || arcane_devices::resolve(&request, &*source))
        .await
        .map_err(|e| Error::Io {
            operation: "resolve devices",
            path: Default::default(),
            source: std::io::Error::other(e),
        })?
        .map_err(|source| Error::Execution { engine, source })?;
    Ok(Resolved {
        launch: DeviceLaunch {
            args: plan.args().to_vec(),
            env: plan.env().clone(),
            env_remove: plan.env_remove().to_vec(),
        },
        execution: Some(plan.into_execution()),
    })
}

/// What the resolver is asked for `config`'s target; `None` for a kind that chooses
/// its own devices.
fn request(config: &EngineConfig) -> Option<ResolveRequest> {
    let plan = config.engine.kind().device_plan();
    if plan == DevicePlan::EngineChooses {
        return None;
    }
    Some(ResolveRequest {
        target: config.device.clone(),
        runtime_backend: match (plan, config.device.as_deref()) {
            (DevicePlan::EnvOnly, Some("cpu") | None) | (DevicePlan::CpuOnly, _) => {
                arcane_devices::Backend::Cpu
            }
            (DevicePlan::EnvOnly, Some(_)) => arcane_devices::Backend::Cuda,
            _ => config.runtime_backend,
        },
        requested_backend: config.backend,
    })
}

/// Resolves `config`'s target on `source` now, before anything starts, so a device
/// this machine does not have is refused when the configuration is read rather than
/// at the first request (the same resolution runs again at every start). Blocking:
/// discovery reads sysfs and may load NVML.
pub fn check_target(config: &EngineConfig, source: &dyn DeviceSource) -> Result<(), Error> {
    let Some(request) = request(config) else {
        return Ok(());
    };
    arcane_devices::resolve(&request, source)
        .map(drop)
        .map_err(|source| Error::Execution {
            engine: config.engine.as_str().to_string(),
            source,
        })
}

/// The execution record as snapshot JSON.
pub(crate) fn to_json(execution: &Option<arcane_devices::ExecutionRecord>) -> Option<Value> {
    execution
        .as_ref()
        .and_then(|e| serde_json::to_value(e).ok())
}

/// Fills `observedTarget` when NVML can see the engine (after ready). Returns the error
/// when the engine is provably on another device than configured.
pub(crate) fn check_placement(
    execution: &mut Option<arcane_devices::ExecutionRecord>,
    pid: u32,
) -> Result<(), arcane_devices::Error> {
    let Some(record) = execution.as_mut() else {
        return Ok(());
    };
    arcane_devices::check_placement(record, pid).map(|_| ())
}
