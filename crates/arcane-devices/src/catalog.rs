//! The catalog of execution devices: its types, which are also the `--inventory` file
//! format, and loading and checking an inventory.
//!
//! A [`Catalog`] is what a probe of this machine found ([`crate::probe`]) or what an
//! inventory file says another machine has ([`Catalog::from_inventory_file`]); the
//! resolver treats both the same. The JSON format is documented in
//! `docs/inventory.md` and in the field docs below; every field name is camelCase and
//! unknown fields are rejected, so a typo in a hand-written inventory fails loudly
//! instead of silently reading as `null`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Error;

/// The inventory format version this crate reads and writes.
pub const SCHEMA_VERSION: u32 = 1;

/// The device id of the host CPU: always `cpu`.
pub const CPU_DEVICE_ID: &str = "cpu";

/// What a probe (or an inventory) knows about a machine's execution devices.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct Catalog {
    /// Always [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The operating system the catalog describes (`linux`, `windows`, `macos`, …).
    pub platform: String,
    /// `ready`, `partial` (see `issues`) or `unavailable`.
    pub state: CatalogState,
    /// Every device found, the CPU first.
    pub devices: Vec<Device>,
    /// Everything that kept the catalog from being complete.
    #[serde(default)]
    pub issues: Vec<CatalogIssue>,
    /// When the probe ran (RFC 3339 UTC); absent in hand-written inventories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probed_at: Option<String>,
}

/// How complete a catalog is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CatalogState {
    /// Every device source answered.
    Ready,
    /// Some devices may be missing or unidentified; `issues` says which and why.
    Partial,
    /// Discovery failed: no device list can be trusted.
    Unavailable,
}

impl CatalogState {
    /// The lowercase name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            CatalogState::Ready => "ready",
            CatalogState::Partial => "partial",
            CatalogState::Unavailable => "unavailable",
        }
    }
}

/// One execution device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct Device {
    /// The persistent id a configuration saves as its target; `null` when the device
    /// could not be identified (there is then an `identity-unresolved` issue). See
    /// `docs/inventory.md` for how ids are derived.
    pub device_id: Option<String>,
    /// What the id is derived from.
    pub identity_source: Option<IdentitySource>,
    /// `cpu`, `gpu` or `npu`.
    pub kind: DeviceKind,
    /// Who made it.
    pub vendor: Vendor,
    /// A name for people (`NVIDIA H200`, `AMD EPYC`); never used for matching.
    pub name: String,
    /// Whether the device is attached now. Inventories may list absent devices.
    pub present: bool,
    /// Hardware addresses.
    #[serde(default)]
    pub addresses: Addresses,
    /// Dedicated memory in MiB (GPUs), `null` when unknown.
    #[serde(default, rename = "dedicatedMemoryMiB")]
    pub dedicated_memory_mib: Option<u64>,
    /// The driver version (NVIDIA: from NVML), `null` when unknown.
    #[serde(default)]
    pub driver_version: Option<String>,
    /// CPU only: physical cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// CPU only: logical processors (hardware threads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logical_processors: Option<u32>,
    /// CPU only: system memory in MiB.
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// PCI identifiers, when the device is a PCI function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_ids: Option<PciIds>,
    /// NVIDIA: MIG mode is enabled, so CUDA exposes only the GPU's MIG instances and
    /// the whole-GPU UUID selects nothing. Omitted when `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mig_enabled: bool,
}

impl Device {
    /// Whether this is the host CPU record.
    pub fn is_cpu(&self) -> bool {
        self.kind == DeviceKind::Cpu
    }

    /// Whether exact selection (pinning llama.cpp to exactly this device) is supported
    /// for this device: the CPU, and NVIDIA GPUs identified by their UUID.
    pub fn exact_selection_supported(&self) -> bool {
        match self.kind {
            DeviceKind::Cpu => true,
            DeviceKind::Gpu => {
                self.vendor == Vendor::Nvidia && self.addresses.uuid.is_some() && !self.mig_enabled
            }
            DeviceKind::Npu => false,
        }
    }
}

/// Hardware addresses of a device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct Addresses {
    /// NVIDIA: the GPU UUID as NVML and `CUDA_VISIBLE_DEVICES` spell it
    /// (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
    #[serde(default)]
    pub uuid: Option<String>,
    /// The PCI address `dddd:bb:dd.f` (domain, bus, device, function), lowercase hex.
    #[serde(default)]
    pub pci: Option<String>,
}

/// PCI identifiers (lowercase hex with `0x`, as sysfs writes them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct PciIds {
    /// Vendor id, e.g. `0x10de`.
    pub vendor: String,
    /// Device id, e.g. `0x2335`.
    pub device: String,
    /// Subsystem vendor id, when known.
    #[serde(default)]
    pub subsystem_vendor: Option<String>,
    /// Subsystem device id, when known.
    #[serde(default)]
    pub subsystem_device: Option<String>,
}

/// What a device id is derived from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdentitySource {
    /// The host CPU (`cpu`).
    HostCpu,
    /// The NVIDIA GPU UUID read through NVML: survives reboots, driver updates and
    /// moving the card to another slot.
    NvmlUuid,
    /// AMD's `unique_id` (a serial burned into the chip), read from sysfs.
    AmdUniqueId,
    /// The PCI address: survives reboots, not moving the card to another slot.
    PciLocation,
    /// A Windows PnP instance id (inventories written by the Windows SDK).
    WindowsPnpInstance,
}

/// The kind of device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// The host CPU (one aggregate record).
    Cpu,
    /// A graphics or compute adapter.
    Gpu,
    /// A neural processing unit.
    Npu,
}

impl DeviceKind {
    /// The lowercase name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Gpu => "gpu",
            DeviceKind::Npu => "npu",
        }
    }
}

/// Who made a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    /// NVIDIA (PCI vendor `0x10de`).
    Nvidia,
    /// AMD (PCI vendor `0x1002`; CPUs `AuthenticAMD`).
    Amd,
    /// Intel (PCI vendor `0x8086`; CPUs `GenuineIntel`).
    Intel,
    /// Apple.
    Apple,
    /// Anyone else, or unknown.
    #[serde(other)]
    Other,
}

impl Vendor {
    /// The lowercase name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
            Vendor::Intel => "intel",
            Vendor::Apple => "apple",
            Vendor::Other => "other",
        }
    }
}

/// Something that kept the catalog from being complete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct CatalogIssue {
    /// Which part of discovery it concerns.
    pub source: IssueSource,
    /// What went wrong.
    pub code: IssueCode,
    /// For a person: what happened and, where known, why.
    pub message: String,
    /// The device it concerns, when that device has an id.
    #[serde(default)]
    pub device_id: Option<String>,
}

impl CatalogIssue {
    /// An issue about `source`.
    pub fn new(source: IssueSource, code: IssueCode, message: impl Into<String>) -> Self {
        Self {
            source,
            code,
            message: message.into(),
            device_id: None,
        }
    }

    /// The same issue, about device `device_id`.
    pub fn for_device(mut self, device_id: impl Into<String>) -> Self {
        self.device_id = Some(device_id.into());
        self
    }
}

/// Which part of discovery an issue concerns (the SDK's sources).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IssueSource {
    /// The CPU record.
    Cpu,
    /// GPU enumeration (NVML, sysfs).
    Gpu,
    /// NPU enumeration.
    Npu,
    /// Device identity (ids that could not be derived).
    Identity,
    /// Windows DXGI (inventories written by the Windows SDK).
    Dxgi,
}

impl IssueSource {
    /// The lowercase name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            IssueSource::Cpu => "cpu",
            IssueSource::Gpu => "gpu",
            IssueSource::Npu => "npu",
            IssueSource::Identity => "identity",
            IssueSource::Dxgi => "dxgi",
        }
    }
}

/// What went wrong (the SDK's issue codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IssueCode {
    /// A device source cannot be used at all (e.g. the NVML library is absent).
    EnumerationUnavailable,
    /// A device source failed while listing devices.
    EnumerationFailed,
    /// A property cannot be read on this device or driver.
    PropertyUnavailable,
    /// Reading a property failed.
    PropertyFailed,
    /// Releasing a discovery resource failed.
    CleanupFailed,
    /// Two devices would share one id; both were left without one.
    IdentityAmbiguous,
    /// A present device has no id.
    IdentityUnresolved,
    /// A diagnostic from an interop layer.
    InteropDiagnostic,
    /// Discovery wrote diagnostics.
    DiscoveryDiagnostics,
    /// Discovery is not implemented on this platform.
    PlatformUnavailable,
    /// Discovery failed as a whole.
    DiscoveryFailed,
}

impl IssueCode {
    /// The kebab-case name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            IssueCode::EnumerationUnavailable => "enumeration-unavailable",
            IssueCode::EnumerationFailed => "enumeration-failed",
            IssueCode::PropertyUnavailable => "property-unavailable",
            IssueCode::PropertyFailed => "property-failed",
            IssueCode::CleanupFailed => "cleanup-failed",
            IssueCode::IdentityAmbiguous => "identity-ambiguous",
            IssueCode::IdentityUnresolved => "identity-unresolved",
            IssueCode::InteropDiagnostic => "interop-diagnostic",
            IssueCode::DiscoveryDiagnostics => "discovery-diagnostics",
            IssueCode::PlatformUnavailable => "platform-unavailable",
            IssueCode::DiscoveryFailed => "discovery-failed",
        }
    }
}

impl Catalog {
    /// A catalog of `devices` and `issues` for `platform`, with the state they imply:
    /// `unavailable` without devices, `partial` with issues, `ready` otherwise.
    pub fn new(
        platform: impl Into<String>,
        devices: Vec<Device>,
        issues: Vec<CatalogIssue>,
    ) -> Self {
        let state = if devices.is_empty() {
            CatalogState::Unavailable
        } else if issues.is_empty() {
            CatalogState::Ready
        } else {
            CatalogState::Partial
        };
        Self {
            schema_version: SCHEMA_VERSION,
            platform: platform.into(),
            state,
            devices,
            issues,
            probed_at: None,
        }
    }

    /// Parses and checks an inventory (the catalog's own JSON format).
    pub fn from_json(text: &str) -> Result<Catalog, Error> {
        Self::parse(text, None)
    }

    /// Reads, parses and checks an inventory file.
    pub fn from_inventory_file(path: &Path) -> Result<Catalog, Error> {
        let text = arcane_files::read_regular_text(path, 16 << 20).map_err(|source| {
            Error::InventoryRead {
                path: path.to_path_buf(),
                source,
            }
        })?;
        Self::parse(&text, Some(path))
    }

    fn parse(text: &str, path: Option<&Path>) -> Result<Catalog, Error> {
        let catalog: Catalog =
            serde_json::from_str(text).map_err(|source| Error::InventoryInvalid {
                path: path.map(Path::to_path_buf),
                source,
            })?;
        catalog
            .check()
            .map_err(|problem| Error::InventoryInconsistent {
                path: path.map(Path::to_path_buf),
                problem,
            })?;
        Ok(catalog)
    }

    /// The rules a deserialized inventory must also satisfy.
    fn check(&self) -> Result<(), String> {
        if self.schema_version != SCHEMA_VERSION {
            return Err(format!(
                "`schemaVersion` is {}, this version of arcane reads {SCHEMA_VERSION}",
                self.schema_version
            ));
        }
        let mut seen = HashSet::new();
        for device in &self.devices {
            let Some(id) = device.device_id.as_deref() else {
                continue;
            };
            if id.trim().is_empty() {
                return Err(format!("device `{}` has an empty `deviceId`", device.name));
            }
            if !seen.insert(id) {
                return Err(format!("`deviceId` `{id}` is listed twice"));
            }
            if (id == CPU_DEVICE_ID) != device.is_cpu() {
                return Err(format!(
                    "`deviceId` `{id}` has kind `{}`; the id `cpu` is reserved for the one CPU record",
                    device.kind.as_str()
                ));
            }
        }
        Ok(())
    }

    /// The device with id `device_id`, present or not.
    pub fn device(&self, device_id: &str) -> Option<&Device> {
        self.devices
            .iter()
            .find(|device| device.device_id.as_deref() == Some(device_id))
    }

    /// The catalog as pretty JSON (the inventory format).
    pub fn to_json_pretty(&self) -> String {
        // Serializing these plain types cannot fail (no maps with non-string keys).
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// Where an inventory came from, for messages.
pub(crate) fn describe_origin(path: Option<&PathBuf>) -> String {
    match path {
        Some(path) => format!(" `{}`", path.display()),
        None => String::new(),
    }
}
