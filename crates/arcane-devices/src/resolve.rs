//! Target resolution: a saved execution target becomes the exact `llama-server`
//! arguments and child environment, or a typed error. Never a fallback.
//!
//! # Rules
//!
//! | target | backend | args | env (set) | result |
//! |---|---|---|---|---|
//! | none | requested `cpu` | `--device none --gpu-layers 0` | every GPU hidden | `automatic`, `runtime-backend-selected` |
//! | none | anything else | – | – | `automatic`, `engine-default-required` (no discovery) |
//! | `cpu` | requested `auto`/`cpu` | `--device none --gpu-layers 0` | every GPU hidden | `matched` |
//! | `cpu` | requested `cuda`/`vulkan`/`metal` | – | – | `LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED` (`backend-mismatch`) |
//! | NVIDIA GPU | requested `auto`/`cuda`, runtime `cuda` | `--device CUDA0 --split-mode none --main-gpu 0 --gpu-layers all` | `CUDA_VISIBLE_DEVICES=<UUID>`, `CUDA_DEVICE_ORDER=PCI_BUS_ID`, other backends hidden; `GGML_CUDA_DEVICES` removed | `matched` |
//! | NVIDIA GPU | requested `cpu`, or runtime not `cuda` | – | – | `…_UNSUPPORTED` (`backend-mismatch`) |
//! | NVIDIA GPU without a usable UUID | | – | – | `…_UNSUPPORTED` (`identity-unresolved`) |
//! | AMD/Intel GPU, NPU, NVIDIA GPU in MIG mode | | – | – | `…_UNSUPPORTED` (`selection-unsupported`) |
//! | id not matched | | – | – | see [`resolve_target`]: `…_UNAVAILABLE` (`device-not-present`) or `…_UNSUPPORTED` (`inventory-unavailable`, `identity-unresolved`) |
//!
//! "Every GPU hidden" sets `CUDA_VISIBLE_DEVICES`, `HIP_VISIBLE_DEVICES`,
//! `ROCR_VISIBLE_DEVICES` and `GGML_VK_VISIBLE_DEVICES` to the empty string: CUDA, HIP
//! and ROCm then enumerate no device, and ggml's Vulkan backend parses an empty list
//! (`ggml/src/ggml-vulkan/ggml-vulkan.cpp`, "Emulate behavior of CUDA_VISIBLE_DEVICES
//! for Vulkan"). A single full UUID in `CUDA_VISIBLE_DEVICES` makes `CUDA0` the chosen
//! physical GPU in the fresh process whatever the ordinal order; `GGML_CUDA_DEVICES`
//! (ggml's virtual-device emulation) is removed so that nothing changes what `CUDA0`
//! means.
//!
//! Every refusal is an [`Error`] carrying the [`ExecutionRecord`]: `resolution` is
//! `unavailable` or `unsupported` with its `reason`, and `resolvedDevice` names the
//! device when it was found but cannot be used (an AMD GPU, a CPU-only runtime).
//! A [`LaunchPlan`] has private fields and only [`resolve`] builds one, so a caller
//! cannot launch with a target that did not match.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::catalog::{
    Catalog, CatalogState, Device, DeviceKind, IssueCode, IssueSource, Vendor, CPU_DEVICE_ID,
};
use crate::{Backend, DeviceSource, Error};

/// Environment variables that, set to the empty string, hide every GPU of one backend.
pub const GPU_HIDING_VARIABLES: [&str; 4] = [
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GGML_VK_VISIBLE_DEVICES",
];

/// Whether the device plan owns variable `name` (a GPU selector or `CUDA_DEVICE_ORDER`,
/// `GGML_CUDA_DEVICES`): a configuration that sets it would undo the plan, so it is
/// refused where a device is chosen.
pub fn is_device_variable(name: &str) -> bool {
    GPU_HIDING_VARIABLES.contains(&name)
        || matches!(name, "CUDA_DEVICE_ORDER" | "GGML_CUDA_DEVICES")
}

/// Arguments that keep llama.cpp on the CPU.
const CPU_ARGS: [&str; 4] = ["--device", "none", "--gpu-layers", "0"];

/// Arguments that put every layer on the one visible CUDA device.
const CUDA_ARGS: [&str; 8] = [
    "--device",
    "CUDA0",
    "--split-mode",
    "none",
    "--main-gpu",
    "0",
    "--gpu-layers",
    "all",
];

/// What to resolve.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolveRequest {
    /// The saved target: a `deviceId` from the catalog (`cpu` for the CPU), or `None`
    /// for the engine's own default.
    pub target: Option<String>,
    /// The backend the installed runtime was built with (`Auto` = unknown).
    pub runtime_backend: Backend,
    /// The backend the configuration asks for (`Auto` = no preference).
    pub requested_backend: Backend,
}

/// The outcome class of a resolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resolution {
    /// The target names a present device.
    Matched,
    /// The target names a device that is not present.
    Unavailable,
    /// The target cannot be honoured (see the reason).
    Unsupported,
    /// No target: the engine chooses (or the CPU backend was requested).
    Automatic,
}

impl Resolution {
    /// The lowercase name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Matched => "matched",
            Resolution::Unavailable => "unavailable",
            Resolution::Unsupported => "unsupported",
            Resolution::Automatic => "automatic",
        }
    }
}

/// Why a resolution came out as it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// No target and no CPU request: llama.cpp picks its devices itself.
    EngineDefaultRequired,
    /// No target, but the CPU backend was requested.
    RuntimeBackendSelected,
    /// No present device has the id.
    DeviceNotPresent,
    /// The inventory could not list the devices the target could be among.
    InventoryUnavailable,
    /// A present device has no id (it might be the target), or the target's CUDA
    /// identity could not be established.
    IdentityUnresolved,
    /// The requested or built backend cannot drive the target.
    BackendMismatch,
    /// Exact selection of this kind of device (AMD/Intel GPU, NPU) is not supported yet.
    SelectionUnsupported,
}

impl Reason {
    /// The kebab-case name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::EngineDefaultRequired => "engine-default-required",
            Reason::RuntimeBackendSelected => "runtime-backend-selected",
            Reason::DeviceNotPresent => "device-not-present",
            Reason::InventoryUnavailable => "inventory-unavailable",
            Reason::IdentityUnresolved => "identity-unresolved",
            Reason::BackendMismatch => "backend-mismatch",
            Reason::SelectionUnsupported => "selection-unsupported",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The target as requested, reduced to its id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestedTarget {
    /// The requested `deviceId`.
    pub device_id: String,
}

/// How many layers llama.cpp offloads: a count or `all`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuLayers {
    /// Exactly this many (0 keeps everything on the CPU).
    Count(u32),
    /// Every layer.
    All,
}

impl Serialize for GpuLayers {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            GpuLayers::Count(count) => serializer.serialize_u32(*count),
            GpuLayers::All => serializer.serialize_str("all"),
        }
    }
}

impl<'de> Deserialize<'de> for GpuLayers {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Count(u32),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Count(count) => Ok(GpuLayers::Count(count)),
            Raw::Text(text) if text == "all" => Ok(GpuLayers::All),
            Raw::Text(text) => Err(serde::de::Error::custom(format!(
                "`gpuLayers` must be a count or `all`, not `{text}`"
            ))),
        }
    }
}

/// What a plan configures: the evidence of the selection, before the server runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ConfiguredTarget {
    /// `cpu` or `cuda`.
    pub backend: Backend,
    /// The matched device id (absent for an automatic CPU plan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// The llama.cpp `--device` value: `none` or `CUDA0`.
    pub device: String,
    /// The llama.cpp `--gpu-layers` value.
    pub gpu_layers: GpuLayers,
    /// The GPU UUID placed in `CUDA_VISIBLE_DEVICES`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Where the UUID came from (`nvml-uuid` on Linux).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_source: Option<String>,
    /// The llama.cpp `--split-mode` value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_mode: Option<String>,
    /// The llama.cpp `--main-gpu` value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main_gpu: Option<u32>,
}

/// Where a placement check saw the engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ObservedTarget {
    /// The device id of the GPU the engine runs on, when the catalog knows it.
    pub device_id: Option<String>,
    /// The GPU UUID NVML lists the engine's process on.
    pub uuid: String,
    /// The engine's process id.
    pub pid: u32,
    /// How it was observed: `nvml-process-list`.
    pub source: String,
}

/// The record of one resolution, kept with the server's state.
///
/// Serialized in camelCase: `requestedTarget`, `resolvedDevice`, `resolution`,
/// `reason`, `configuredTarget`, `observedTarget`, `fallback`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ExecutionRecord {
    /// The target as requested, or `null` for automatic.
    pub requested_target: Option<RequestedTarget>,
    /// The matched device (a copy of its catalog record), or `null`.
    pub resolved_device: Option<Device>,
    /// The outcome class.
    pub resolution: Resolution,
    /// Why; `null` when matched.
    pub reason: Option<Reason>,
    /// What the plan configures, `null` when it configures nothing.
    pub configured_target: Option<ConfiguredTarget>,
    /// `null` until a placement check confirms where the engine runs.
    pub observed_target: Option<ObservedTarget>,
    /// Always `false`: Arcane never falls back to another device.
    pub fallback: bool,
}

/// The result of matching a target id against a catalog, before any backend rule
/// (the SDK's `resolveTarget`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct TargetResolution {
    /// The target as requested.
    pub requested_target: RequestedTarget,
    /// The present device with that id, when there is one.
    pub resolved_device: Option<Device>,
    /// `matched`, `unavailable` or `unsupported`.
    pub resolution: Resolution,
    /// `null` when matched, else why not.
    pub reason: Option<Reason>,
}

/// The exact arguments and environment for one `llama-server` launch.
///
/// Only [`resolve`] builds one. Apply it to the child command as:
/// `args` appended, every `env` entry set (an empty value is meaningful: it hides a
/// backend's devices), every `env_remove` name removed.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LaunchPlan {
    args: Vec<String>,
    env: BTreeMap<String, String>,
    env_remove: Vec<String>,
    execution: ExecutionRecord,
}

impl LaunchPlan {
    /// Arguments to append to `llama-server`'s command line.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// Variables to set in the child (an empty string hides a backend's devices).
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// Variables to remove from the child's inherited environment.
    pub fn env_remove(&self) -> &[String] {
        &self.env_remove
    }

    /// The execution record.
    pub fn execution(&self) -> &ExecutionRecord {
        &self.execution
    }

    /// The execution record, by value.
    pub fn into_execution(self) -> ExecutionRecord {
        self.execution
    }

    /// Applies the plan to a command: appends the args, sets and removes variables.
    pub fn apply_to(&self, command: &mut std::process::Command) {
        command.args(&self.args);
        for name in &self.env_remove {
            command.env_remove(name);
        }
        for (name, value) in &self.env {
            command.env(name, value);
        }
    }
}

/// The CUDA identity that pins one GPU in a fresh process.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CudaIdentity {
    /// The full GPU UUID for `CUDA_VISIBLE_DEVICES` (`GPU-…`).
    pub uuid: String,
    /// Where it came from (`nvml-uuid`).
    pub source: String,
}

impl CudaIdentity {
    /// An identity `uuid` read from `source`.
    pub fn new(uuid: impl Into<String>, source: impl Into<String>) -> Self {
        Self {
            uuid: uuid.into(),
            source: source.into(),
        }
    }
}

/// Turns a matched GPU into the CUDA identity that pins it.
///
/// This is the seam for platforms where the catalog's id is not the CUDA UUID: on
/// Windows the catalog knows a PnP instance and a session LUID, and a source that asks
/// the CUDA driver for the UUID with that LUID (as the SDK's
/// `llama-execution-windows.ps1` does) plugs in here without changing any caller.
pub trait GpuIdentitySource {
    /// The identity of `device`, or a sentence saying why there is none.
    fn cuda_identity(&self, device: &Device) -> Result<CudaIdentity, String>;
}

/// The identity NVML already wrote into the catalog: `addresses.uuid` (Linux, and any
/// inventory that records UUIDs).
#[derive(Clone, Copy, Debug, Default)]
pub struct CatalogUuidIdentity;

impl GpuIdentitySource for CatalogUuidIdentity {
    fn cuda_identity(&self, device: &Device) -> Result<CudaIdentity, String> {
        let uuid = device
            .addresses
            .uuid
            .as_deref()
            .ok_or_else(|| "the catalog records no GPU UUID for this device".to_string())?;
        if !is_gpu_uuid(uuid) {
            return Err(format!(
                "`{uuid}` is not a full GPU UUID (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`)"
            ));
        }
        Ok(CudaIdentity::new(uuid, "nvml-uuid"))
    }
}

/// Whether `text` is a full NVIDIA GPU UUID: `GPU-` and 32 hex digits dashed 8-4-4-4-12.
///
/// Anything else is refused before it reaches `CUDA_VISIBLE_DEVICES`, where a comma or
/// a short prefix could expose a different or a second GPU.
pub fn is_gpu_uuid(text: &str) -> bool {
    let Some(rest) = text.strip_prefix("GPU-") else {
        return false;
    };
    let groups: Vec<&str> = rest.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(group, len)| group.len() == len && group.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Matches `target` against `catalog` (the SDK's `resolveTarget`).
///
/// A present device with that id is `matched`. Otherwise the first reason that
/// applies wins:
/// 1. `inventory-unavailable` (`unsupported`): the catalog is `unavailable`, or has an
///    `enumeration-unavailable`/`enumeration-failed` issue from a relevant source (`cpu`
///    for the target `cpu`, `gpu` or `npu` for any other);
/// 2. `identity-unresolved` (`unsupported`): the target is not `cpu` and a present
///    device has no id (it could be the target);
/// 3. `device-not-present` (`unavailable`).
pub fn resolve_target(target: &str, catalog: &Catalog) -> TargetResolution {
    let requested_target = RequestedTarget {
        device_id: target.to_string(),
    };
    if let Some(device) = catalog
        .devices
        .iter()
        .find(|device| device.present && device.device_id.as_deref() == Some(target))
    {
        return TargetResolution {
            requested_target,
            resolved_device: Some(device.clone()),
            resolution: Resolution::Matched,
            reason: None,
        };
    }
    let is_cpu = target == CPU_DEVICE_ID;
    let relevant = |source: IssueSource| {
        if is_cpu {
            source == IssueSource::Cpu
        } else {
            matches!(source, IssueSource::Gpu | IssueSource::Npu)
        }
    };
    let enumeration_failed = catalog.issues.iter().any(|issue| {
        matches!(
            issue.code,
            IssueCode::EnumerationUnavailable | IssueCode::EnumerationFailed
        ) && relevant(issue.source)
    });
    let (resolution, reason) = if catalog.state == CatalogState::Unavailable || enumeration_failed {
        (Resolution::Unsupported, Reason::InventoryUnavailable)
    } else if !is_cpu
        && catalog
            .devices
            .iter()
            .any(|device| device.present && device.device_id.is_none())
    {
        (Resolution::Unsupported, Reason::IdentityUnresolved)
    } else {
        (Resolution::Unavailable, Reason::DeviceNotPresent)
    };
    TargetResolution {
        requested_target,
        resolved_device: None,
        resolution,
        reason: Some(reason),
    }
}

/// Resolves `request` into a launch plan, discovering devices through `source` (afresh:
/// call this once per launch), with the platform's default [`GpuIdentitySource`].
///
/// Errors: `LOCAL_AI_EXECUTION_TARGET_UNAVAILABLE` ([`Error::TargetUnavailable`]) and
/// `LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED` ([`Error::TargetUnsupported`]), each
/// carrying the [`ExecutionRecord`]; `ARCANE_USAGE` for an empty target.
pub fn resolve(request: &ResolveRequest, source: &dyn DeviceSource) -> Result<LaunchPlan, Error> {
    resolve_with(request, source, &CatalogUuidIdentity)
}

/// [`resolve`] with an explicit [`GpuIdentitySource`].
pub fn resolve_with(
    request: &ResolveRequest,
    source: &dyn DeviceSource,
    identity: &dyn GpuIdentitySource,
) -> Result<LaunchPlan, Error> {
    let Some(target) = request.target.as_deref() else {
        return Ok(automatic_plan(request.requested_backend));
    };
    if target.trim().is_empty() {
        return Err(Error::EmptyTarget);
    }
    let catalog = source.catalog();
    let matched = resolve_target(target, &catalog);
    let mut execution = ExecutionRecord {
        requested_target: Some(matched.requested_target),
        resolved_device: matched.resolved_device,
        resolution: matched.resolution,
        reason: matched.reason,
        configured_target: None,
        observed_target: None,
        fallback: false,
    };
    // A refusal after matching still records the device, but never as `matched`: the
    // record says `unsupported` and why, exactly as a refusal before matching does.
    let unsupported = |mut execution: ExecutionRecord, reason: Reason, explanation: String| {
        execution.resolution = Resolution::Unsupported;
        execution.reason = Some(reason);
        Error::TargetUnsupported {
            target: target.to_string(),
            reason,
            explanation,
            runtime_backend: request.runtime_backend,
            requested_backend: request.requested_backend,
            execution: Box::new(execution),
        }
    };
    let Some(device) = execution.resolved_device.clone() else {
        let reason = execution.reason.unwrap_or(Reason::DeviceNotPresent);
        return Err(match execution.resolution {
            Resolution::Unsupported => {
                let explanation = match reason {
                    Reason::InventoryUnavailable => {
                        "the device inventory could not list the devices it might be".to_string()
                    }
                    _ => {
                        "a present device could not be identified and might be this one".to_string()
                    }
                };
                unsupported(execution, reason, explanation)
            }
            _ => Error::TargetUnavailable {
                target: target.to_string(),
                reason,
                execution: Box::new(execution),
            },
        });
    };
    let device_id = device.device_id.clone();
    let requested = request.requested_backend;
    match device.kind {
        DeviceKind::Cpu => {
            if !matches!(requested, Backend::Auto | Backend::Cpu) {
                return Err(unsupported(
                    execution,
                    Reason::BackendMismatch,
                    format!("the requested backend `{requested}` cannot run on the CPU"),
                ));
            }
            execution.configured_target = Some(cpu_configured(device_id));
            Ok(cpu_plan(execution))
        }
        DeviceKind::Npu => Err(unsupported(
            execution,
            Reason::SelectionUnsupported,
            "exact selection of an NPU is not supported".to_string(),
        )),
        DeviceKind::Gpu => {
            if device.vendor != Vendor::Nvidia {
                return Err(unsupported(
                    execution,
                    Reason::SelectionUnsupported,
                    format!(
                        "exact selection of {} GPUs is not supported yet; only NVIDIA GPUs through CUDA are",
                        vendor_name(device.vendor)
                    ),
                ));
            }
            if device.mig_enabled {
                return Err(unsupported(
                    execution,
                    Reason::SelectionUnsupported,
                    "MIG mode is enabled on this GPU; selecting MIG instances is not supported"
                        .to_string(),
                ));
            }
            if !matches!(requested, Backend::Auto | Backend::Cuda) {
                return Err(unsupported(
                    execution,
                    Reason::BackendMismatch,
                    format!("the requested backend `{requested}` cannot drive an NVIDIA GPU selected by UUID"),
                ));
            }
            if request.runtime_backend != Backend::Cuda {
                let built = match request.runtime_backend {
                    Backend::Auto => "of unknown backend".to_string(),
                    other => format!("built for `{other}`"),
                };
                return Err(unsupported(
                    execution,
                    Reason::BackendMismatch,
                    format!("exact GPU selection needs a runtime built with CUDA; the runtime is {built}"),
                ));
            }
            let cuda = match identity.cuda_identity(&device) {
                Ok(cuda) => cuda,
                Err(why) => {
                    return Err(unsupported(execution, Reason::IdentityUnresolved, why));
                }
            };
            execution.configured_target = Some(ConfiguredTarget {
                backend: Backend::Cuda,
                device_id,
                device: "CUDA0".to_string(),
                gpu_layers: GpuLayers::All,
                uuid: Some(cuda.uuid.clone()),
                identity_source: Some(cuda.source),
                split_mode: Some("none".to_string()),
                main_gpu: Some(0),
            });
            let mut env = BTreeMap::new();
            for name in GPU_HIDING_VARIABLES {
                env.insert(name.to_string(), String::new());
            }
            env.insert("CUDA_VISIBLE_DEVICES".to_string(), cuda.uuid);
            env.insert("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string());
            Ok(LaunchPlan {
                args: CUDA_ARGS.iter().map(|arg| arg.to_string()).collect(),
                env,
                env_remove: vec!["GGML_CUDA_DEVICES".to_string()],
                execution,
            })
        }
    }
}

fn vendor_name(vendor: Vendor) -> &'static str {
    match vendor {
        Vendor::Nvidia => "NVIDIA",
        Vendor::Amd => "AMD",
        Vendor::Intel => "Intel",
        Vendor::Apple => "Apple",
        Vendor::Other => "other vendors'",
    }
}

fn cpu_configured(device_id: Option<String>) -> ConfiguredTarget {
    ConfiguredTarget {
        backend: Backend::Cpu,
        device_id,
        device: "none".to_string(),
        gpu_layers: GpuLayers::Count(0),
        uuid: None,
        identity_source: None,
        split_mode: None,
        main_gpu: None,
    }
}

fn cpu_plan(execution: ExecutionRecord) -> LaunchPlan {
    LaunchPlan {
        args: CPU_ARGS.iter().map(|arg| arg.to_string()).collect(),
        env: GPU_HIDING_VARIABLES
            .iter()
            .map(|name| (name.to_string(), String::new()))
            .collect(),
        env_remove: Vec::new(),
        execution,
    }
}

fn automatic_plan(requested: Backend) -> LaunchPlan {
    let cpu = requested == Backend::Cpu;
    let execution = ExecutionRecord {
        requested_target: None,
        resolved_device: None,
        resolution: Resolution::Automatic,
        reason: Some(if cpu {
            Reason::RuntimeBackendSelected
        } else {
            Reason::EngineDefaultRequired
        }),
        configured_target: cpu.then(|| cpu_configured(None)),
        observed_target: None,
        fallback: false,
    };
    if cpu {
        cpu_plan(execution)
    } else {
        LaunchPlan {
            args: Vec::new(),
            env: BTreeMap::new(),
            env_remove: Vec::new(),
            execution,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_uuid_shape_is_checked_exactly() {
        assert!(is_gpu_uuid("GPU-3f2a9c1e-0b4d-4e6f-8a9b-0c1d2e3f4a5b"));
        assert!(!is_gpu_uuid("GPU-3f2a9c1e-0b4d-4e6f-8a9b-0c1d2e3f4a5"));
        assert!(!is_gpu_uuid(
            "GPU-3f2a9c1e-0b4d-4e6f-8a9b-0c1d2e3f4a5b,GPU-0"
        ));
        assert!(!is_gpu_uuid("MIG-3f2a9c1e-0b4d-4e6f-8a9b-0c1d2e3f4a5b"));
        assert!(!is_gpu_uuid("GPU-3f2a9c1e-0b4d-4e6f-8a9b-0c1d2e3f4z5b"));
    }

    #[test]
    fn gpu_layers_serialize_as_count_or_all() {
        assert_eq!(
            serde_json::to_string(&GpuLayers::All).ok().as_deref(),
            Some("\"all\"")
        );
        assert_eq!(
            serde_json::to_string(&GpuLayers::Count(0)).ok().as_deref(),
            Some("0")
        );
        assert_eq!(
            serde_json::from_str::<GpuLayers>("\"all\"").ok(),
            Some(GpuLayers::All)
        );
        assert!(serde_json::from_str::<GpuLayers>("\"some\"").is_err());
    }
}
