//! The execution-device catalog and exact target resolution into a llama.cpp launch
//! plan.
//!
//! # What this crate owns
//!
//! * **The catalog** ([`Catalog`], [`probe`]): the host CPU (always, id `cpu`),
//!   NVIDIA GPUs through NVML loaded at run time (id `nvidia-gpu-<uuid>`, from the GPU
//!   UUID, so it survives reboots and slot changes), and other PCI display/3D adapters
//!   (AMD, Intel) from sysfs, listed but not selectable yet. Probing never fails: a
//!   missing NVML library is a `partial` catalog with an issue.
//! * **The inventory format**: a catalog serialized as JSON is also the `--inventory`
//!   file format ([`Catalog::from_inventory_file`]); `docs/inventory.md` documents it.
//! * **Resolution** ([`resolve`]): a saved target (a `deviceId`, or none) plus the
//!   runtime's and the request's backends become a [`LaunchPlan`]: the exact
//!   `llama-server` arguments, the child environment, and an [`ExecutionRecord`]. A
//!   target that does not match is an error
//!   (`LOCAL_AI_EXECUTION_TARGET_UNAVAILABLE`/`…_UNSUPPORTED`) carrying the record;
//!   there is no fallback to another device, and a plan can only be obtained for a
//!   matched target.
//! * **The placement check** ([`check_placement`]): NVML's per-GPU process lists
//!   confirm that a running engine is on the configured GPU.
//!
//! It does not spawn engines (the supervisor in `arcane-localai` does, applying the
//! plan) and it reads no configuration: callers pass the target and the backends.
//!
//! # Guarantees
//!
//! * Resolution runs afresh on each call: [`DeviceSource::catalog`] is called once per
//!   [`resolve`] with a target, and never without one.
//! * A GPU plan sets `CUDA_VISIBLE_DEVICES` to exactly one full, validated GPU UUID;
//!   a CPU plan hides every GPU from CUDA, HIP/ROCm and Vulkan.
//! * `fallback` is always `false`.
//!
//! # Example
//!
//! ```
//! use arcane_devices::{resolve, Backend, Catalog, ResolveRequest};
//!
//! let inventory = Catalog::from_json(r#"{
//!   "schemaVersion": 1, "platform": "linux", "state": "ready", "issues": [],
//!   "devices": [
//!     {"deviceId": "cpu", "identitySource": "host-cpu", "kind": "cpu", "vendor": "amd",
//!      "name": "AMD EPYC", "present": true},
//!     {"deviceId": "nvidia-gpu-3f2a9c1e-0b4d-4e6f-8a9b-0c1d2e3f4a5b",
//!      "identitySource": "nvml-uuid", "kind": "gpu", "vendor": "nvidia",
//!      "name": "NVIDIA H200", "present": true,
//!      "addresses": {"uuid": "GPU-3f2a9c1e-0b4d-4e6f-8a9b-0c1d2e3f4a5b", "pci": "0000:01:00.0"}}
//!   ]}"#).unwrap();
//! let request = ResolveRequest {
//!     target: Some("nvidia-gpu-3f2a9c1e-0b4d-4e6f-8a9b-0c1d2e3f4a5b".into()),
//!     runtime_backend: Backend::Cuda,
//!     requested_backend: Backend::Auto,
//! };
//! let plan = resolve(&request, &inventory).unwrap();
//! assert_eq!(plan.env()["CUDA_VISIBLE_DEVICES"], "GPU-3f2a9c1e-0b4d-4e6f-8a9b-0c1d2e3f4a5b");
//! assert_eq!(plan.args()[..2], ["--device", "CUDA0"]);
//! assert!(!plan.execution().fallback);
//! ```
//!
//! The benchmark `cargo bench -p arcane-devices --bench resolve` compares resolving
//! against an inventory with a bare catalog lookup.
#![warn(missing_docs)]

mod backend;
mod catalog;
mod error;
mod placement;
mod probe;
mod resolve;

pub use backend::Backend;
pub use catalog::{
    Addresses, Catalog, CatalogIssue, CatalogState, Device, DeviceKind, IdentitySource, IssueCode,
    IssueSource, PciIds, Vendor, CPU_DEVICE_ID, SCHEMA_VERSION,
};
pub use error::Error;
pub use placement::{
    check_placement, check_placement_with, GpuProcessSource, GpuProcesses, NvmlProcesses, Placement,
};
pub use probe::{
    assemble, nvidia_device_id, probe, probe_with, scan_pci_adapters, LiveProbe, NvidiaGpu,
    NvmlLibrary, NvmlListing, PciAdapter, ProbeOptions,
};
pub use resolve::{
    is_device_variable, is_gpu_uuid, resolve, resolve_target, resolve_with, CatalogUuidIdentity,
    ConfiguredTarget, CudaIdentity, ExecutionRecord, GpuIdentitySource, GpuLayers, LaunchPlan,
    ObservedTarget, Reason, RequestedTarget, Resolution, ResolveRequest, TargetResolution,
    GPU_HIDING_VARIABLES,
};

/// Where resolution gets its catalog: the live machine ([`LiveProbe`]) or a fixed
/// inventory (a [`Catalog`], returned as a clone). [`resolve`] calls it once per
/// launch, so a live source probes afresh every time.
pub trait DeviceSource: Send + Sync {
    /// The catalog as of now.
    fn catalog(&self) -> Catalog;
}

impl DeviceSource for Catalog {
    fn catalog(&self) -> Catalog {
        self.clone()
    }
}
