//! Probing this machine: the CPU from `/proc`, NVIDIA GPUs through NVML (loaded at run
//! time), other PCI display and 3D adapters from sysfs; then [`assemble`] merges them
//! into one [`Catalog`].
//!
//! Probing never fails. Anything that cannot be read becomes a [`CatalogIssue`] and
//! the catalog is `partial`:
//!
//! * NVML cannot be loaded or initialized (no driver, no `libnvidia-ml.so.1`):
//!   `gpu`/`enumeration-unavailable`. GPU targets then resolve to
//!   `inventory-unavailable`, never to a wrong device.
//! * NVML cannot list devices: `gpu`/`enumeration-failed`.
//! * A GPU that NVML lists but cannot read, or that sysfs shows as NVIDIA but NVML does
//!   not list (e.g. bound to `nouveau`): a present record with `deviceId: null` and an
//!   `identity`/`identity-unresolved` issue, so that no GPU target is declared absent
//!   while an unidentified GPU might be it.
//! * The CPU's details cannot be read: `cpu`/`property-unavailable`; the CPU record is
//!   listed anyway.
//!
//! Only the NVML call can panic in principle (it is foreign code behind a wrapper);
//! it runs under `catch_unwind`, and a panic is reported as `enumeration-failed`.

mod cpu;
mod nvml;
mod sysfs;

use std::path::PathBuf;

use crate::catalog::{
    Addresses, Catalog, CatalogIssue, Device, DeviceKind, IdentitySource, IssueCode, IssueSource,
    PciIds, Vendor,
};
use crate::DeviceSource;

pub(crate) use nvml::processes as nvml_processes;
pub use nvml::{NvidiaGpu, NvmlListing};
pub use sysfs::{scan as scan_pci_adapters, PciAdapter};

/// Where NVML comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NvmlLibrary {
    /// The system's `libnvidia-ml.so.1` (Linux) or `nvml.dll` (Windows).
    #[default]
    System,
    /// A library at this path.
    Path(PathBuf),
    /// Do not use NVML (the catalog reports `enumeration-unavailable`).
    Disabled,
}

/// Where a probe reads from. [`Default`] is the real machine.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProbeOptions {
    /// The sysfs mount (`/sys`).
    pub sysfs_root: PathBuf,
    /// The procfs mount (`/proc`).
    pub proc_root: PathBuf,
    /// Where NVML comes from.
    pub nvml: NvmlLibrary,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        Self {
            sysfs_root: PathBuf::from("/sys"),
            proc_root: PathBuf::from("/proc"),
            nvml: NvmlLibrary::System,
        }
    }
}

impl ProbeOptions {
    /// Reads sysfs from `root` instead of `/sys`.
    pub fn with_sysfs_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.sysfs_root = root.into();
        self
    }

    /// Reads procfs from `root` instead of `/proc`.
    pub fn with_proc_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.proc_root = root.into();
        self
    }

    /// Uses `nvml` as the NVML library.
    pub fn with_nvml(mut self, nvml: NvmlLibrary) -> Self {
        self.nvml = nvml;
        self
    }
}

/// Probes this machine. Never fails; see the module docs for what becomes an issue.
pub fn probe() -> Catalog {
    probe_with(&ProbeOptions::default())
}

/// Probes with explicit sources.
pub fn probe_with(options: &ProbeOptions) -> Catalog {
    let (cpu, mut issues) = cpu::probe(&options.proc_root);
    let adapters = if cfg!(target_os = "linux") {
        sysfs::scan(&options.sysfs_root)
    } else {
        Vec::new()
    };
    let listing = nvml::list(&options.nvml);
    let mut catalog = assemble(cpu, adapters, listing);
    catalog.issues.splice(0..0, issues.drain(..));
    if catalog.state == crate::CatalogState::Ready && !catalog.issues.is_empty() {
        catalog.state = crate::CatalogState::Partial;
    }
    catalog.probed_at = Some(arcane_report::time::now_rfc3339());
    catalog
}

/// The live machine as a [`DeviceSource`]: every call probes afresh.
#[derive(Clone, Copy, Debug, Default)]
pub struct LiveProbe;

impl DeviceSource for LiveProbe {
    fn catalog(&self) -> Catalog {
        probe()
    }
}

impl DeviceSource for ProbeOptions {
    fn catalog(&self) -> Catalog {
        probe_with(self)
    }
}

/// The NVIDIA device id for a GPU UUID: `nvidia-` and the UUID in lowercase
/// (`GPU-3F2A…` → `nvidia-gpu-3f2a…`).
pub fn nvidia_device_id(uuid: &str) -> String {
    format!("nvidia-{}", uuid.to_ascii_lowercase())
}

/// Merges the CPU record, the sysfs adapters and the NVML listing into a catalog.
///
/// NVML is the authority for NVIDIA GPUs; a sysfs NVIDIA adapter is matched to an NVML
/// GPU by PCI address. AMD and Intel adapters come from sysfs only.
pub fn assemble(cpu: Device, adapters: Vec<PciAdapter>, listing: NvmlListing) -> Catalog {
    let mut devices = vec![cpu];
    let mut issues = Vec::new();
    let (gpus, unreadable) = match listing {
        NvmlListing::Listed { gpus, unreadable } => (gpus, unreadable),
        NvmlListing::Unavailable { message } => {
            issues.push(CatalogIssue::new(
                IssueSource::Gpu,
                IssueCode::EnumerationUnavailable,
                message,
            ));
            (Vec::new(), Vec::new())
        }
        NvmlListing::Failed { message } => {
            issues.push(CatalogIssue::new(
                IssueSource::Gpu,
                IssueCode::EnumerationFailed,
                message,
            ));
            (Vec::new(), Vec::new())
        }
    };
    let nvml_pci: Vec<Option<String>> = gpus.iter().map(|gpu| gpu.pci.clone()).collect();
    for gpu in gpus {
        let device_id = nvidia_device_id(&gpu.uuid);
        if gpu.mig_enabled {
            issues.push(
                CatalogIssue::new(
                    IssueSource::Gpu,
                    IssueCode::PropertyUnavailable,
                    format!(
                        "MIG mode is enabled on `{}`: CUDA exposes only its MIG instances, which exact selection does not support",
                        gpu.uuid
                    ),
                )
                .for_device(device_id.clone()),
            );
        }
        devices.push(Device {
            device_id: Some(device_id),
            identity_source: Some(IdentitySource::NvmlUuid),
            kind: DeviceKind::Gpu,
            vendor: Vendor::Nvidia,
            name: gpu.name,
            present: true,
            addresses: Addresses {
                uuid: Some(gpu.uuid),
                pci: gpu.pci,
            },
            dedicated_memory_mib: gpu.memory_mib,
            driver_version: gpu.driver_version,
            cores: None,
            logical_processors: None,
            memory_mib: None,
            pci_ids: None,
            mig_enabled: gpu.mig_enabled,
        });
    }
    let mut unmatched_nvidia = 0usize;
    for adapter in adapters {
        if adapter.vendor == Vendor::Nvidia {
            if nvml_pci
                .iter()
                .any(|pci| pci.as_deref() == Some(adapter.pci.as_str()))
            {
                continue;
            }
            unmatched_nvidia += 1;
            let driver = adapter
                .driver
                .as_deref()
                .map(|driver| format!(" (driver `{driver}`)"))
                .unwrap_or_default();
            issues.push(CatalogIssue::new(
                IssueSource::Identity,
                IssueCode::IdentityUnresolved,
                format!(
                    "NVIDIA GPU at PCI `{}`{driver} is not listed by NVML, so its UUID is unknown",
                    adapter.pci
                ),
            ));
            devices.push(adapter.into_device(None));
        } else {
            let (id, source) = adapter.stable_id();
            devices.push(adapter.into_device(Some((id, source))));
        }
    }
    // NVML devices that could not be read at all: each is one issue. Unless an
    // unmatched sysfs NVIDIA adapter already stands for it, add an unidentified record
    // so that no GPU target resolves as absent while this GPU might be it.
    for message in &unreadable {
        issues.push(CatalogIssue::new(
            IssueSource::Identity,
            IssueCode::IdentityUnresolved,
            message.clone(),
        ));
    }
    for _ in unmatched_nvidia..unreadable.len() {
        devices.push(Device {
            device_id: None,
            identity_source: None,
            kind: DeviceKind::Gpu,
            vendor: Vendor::Nvidia,
            name: "NVIDIA GPU (unreadable)".to_string(),
            present: true,
            addresses: Addresses::default(),
            dedicated_memory_mib: None,
            driver_version: None,
            cores: None,
            logical_processors: None,
            memory_mib: None,
            pci_ids: None,
            mig_enabled: false,
        });
    }
    Catalog::new(std::env::consts::OS, devices, issues)
}

impl PciAdapter {
    fn into_device(self, identity: Option<(String, IdentitySource)>) -> Device {
        let (device_id, identity_source) = match identity {
            Some((id, source)) => (Some(id), Some(source)),
            None => (None, None),
        };
        Device {
            device_id,
            identity_source,
            kind: DeviceKind::Gpu,
            vendor: self.vendor,
            name: self.name,
            present: true,
            addresses: Addresses {
                uuid: None,
                pci: Some(self.pci),
            },
            dedicated_memory_mib: self.memory_mib,
            driver_version: None,
            cores: None,
            logical_processors: None,
            memory_mib: None,
            pci_ids: Some(PciIds {
                vendor: format!("0x{:04x}", self.vendor_id),
                device: format!("0x{:04x}", self.device_id),
                subsystem_vendor: self.subsystem_vendor.map(|id| format!("0x{id:04x}")),
                subsystem_device: self.subsystem_device.map(|id| format!("0x{id:04x}")),
            }),
            mig_enabled: false,
        }
    }
}
