//! The placement check: once an engine runs, confirm through NVML's per-GPU process
//! lists that its process is on the GPU its plan configured, and nowhere else.
//!
//! | plan | NVML | pid listed on | outcome |
//! |---|---|---|---|
//! | automatic | – | – | [`Placement::Skipped`] (nothing was configured; NVML is not asked) |
//! | any | absent or failing | – | [`Placement::NotObserved`] |
//! | CUDA `U` | ok | only `U` | [`Placement::Confirmed`], `observedTarget` filled |
//! | CUDA `U` | ok | nothing | [`Placement::NotObserved`] (no CUDA context yet, or the engine is in another PID namespace: NVML reports host pids, so inside a container the check cannot see it) |
//! | CUDA `U` | ok | any other GPU | `LOCAL_AI_PLACEMENT_MISMATCH` |
//! | CPU | ok | nothing | [`Placement::NoGpu`] |
//! | CPU | ok | any GPU | `LOCAL_AI_PLACEMENT_MISMATCH` |
//!
//! `observedTarget` stays `null` unless the check confirms the configured GPU.

use crate::probe::NvmlLibrary;
use crate::resolve::{ExecutionRecord, ObservedTarget};
use crate::{Backend, Error};

/// How a placement check ended when it found no mismatch.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Placement {
    /// NVML lists the process on exactly the configured GPU; `observedTarget` is set.
    Confirmed,
    /// CPU target: NVML lists the process on no NVIDIA GPU.
    NoGpu,
    /// The check could not see the process (the reason says why); nothing changed.
    NotObserved {
        /// Why, for a person.
        reason: String,
    },
    /// Nothing to check (automatic plan); NVML was not asked.
    Skipped {
        /// Why, for a person.
        reason: String,
    },
}

/// The processes NVML lists on one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuProcesses {
    /// The GPU UUID.
    pub uuid: String,
    /// Process ids with a compute or graphics context on it.
    pub pids: Vec<u32>,
}

/// Where per-GPU process lists come from: NVML on a real machine.
pub trait GpuProcessSource {
    /// Every GPU with the processes on it, or a sentence saying why not.
    fn gpu_processes(&self) -> Result<Vec<GpuProcesses>, String>;
}

/// NVML's per-device process lists.
#[derive(Clone, Debug, Default)]
pub struct NvmlProcesses {
    /// Which NVML library to load.
    pub library: NvmlLibrary,
}

impl GpuProcessSource for NvmlProcesses {
    fn gpu_processes(&self) -> Result<Vec<GpuProcesses>, String> {
        crate::probe::nvml_processes(&self.library).map(|list| {
            list.into_iter()
                .map(|(uuid, pids)| GpuProcesses { uuid, pids })
                .collect()
        })
    }
}

/// Checks where process `pid` runs against `record`'s configured target, through
/// the system's NVML; fills `record.observed_target` when confirmed.
pub fn check_placement(record: &mut ExecutionRecord, pid: u32) -> Result<Placement, Error> {
    check_placement_with(record, pid, &NvmlProcesses::default())
}

/// [`check_placement`] with an explicit process source.
pub fn check_placement_with(
    record: &mut ExecutionRecord,
    pid: u32,
    source: &dyn GpuProcessSource,
) -> Result<Placement, Error> {
    let Some(configured) = record.configured_target.as_ref() else {
        return Ok(Placement::Skipped {
            reason: "the plan is automatic: the engine chose its devices".to_string(),
        });
    };
    let expected = match configured.backend {
        Backend::Cpu => None,
        Backend::Cuda => match configured.uuid.clone() {
            Some(uuid) => Some(uuid),
            None => {
                return Ok(Placement::Skipped {
                    reason: "the plan configures no GPU UUID".to_string(),
                })
            }
        },
        other => {
            return Ok(Placement::Skipped {
                reason: format!("placement checks cover `cpu` and `cuda` plans, not `{other}`"),
            })
        }
    };
    let gpus = match source.gpu_processes() {
        Ok(gpus) => gpus,
        Err(reason) => return Ok(Placement::NotObserved { reason }),
    };
    let on: Vec<String> = gpus
        .into_iter()
        .filter(|gpu| gpu.pids.contains(&pid))
        .map(|gpu| gpu.uuid)
        .collect();
    match expected {
        None if on.is_empty() => Ok(Placement::NoGpu),
        None => Err(Error::PlacementMismatch {
            pid,
            configured_uuid: "none".to_string(),
            observed_uuids: on,
            execution: Box::new(record.clone()),
        }),
        Some(_) if on.is_empty() => Ok(Placement::NotObserved {
            reason: format!(
                "NVML lists pid {pid} on no GPU: it has no CUDA context yet, or it runs in another PID namespace"
            ),
        }),
        Some(uuid) => {
            if on.iter().all(|observed| observed.eq_ignore_ascii_case(&uuid)) {
                record.observed_target = Some(ObservedTarget {
                    device_id: record
                        .resolved_device
                        .as_ref()
                        .and_then(|device| device.device_id.clone()),
                    uuid,
                    pid,
                    source: "nvml-process-list".to_string(),
                });
                Ok(Placement::Confirmed)
            } else {
                Err(Error::PlacementMismatch {
                    pid,
                    configured_uuid: uuid,
                    observed_uuids: on,
                    execution: Box::new(record.clone()),
                })
            }
        }
    }
}
