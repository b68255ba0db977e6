//! PCI display and 3D adapters from sysfs (`/sys/bus/pci/devices/*`).
//!
//! An adapter is a PCI function whose `class` is VGA (`0x0300xx`), 3D (`0x0302xx`) or
//! other display (`0x0380xx`) and whose `vendor` is NVIDIA (`0x10de`), AMD (`0x1002`)
//! or Intel (`0x8086`). Other vendors' display functions (server BMC VGA, virtual
//! machine displays) cannot run llama.cpp and are not listed.
//!
//! # Device ids
//!
//! PCI vendor, device and subsystem ids name a *model*, not a card: two identical cards
//! share them, so they cannot be an id. What is stable per card:
//!
//! * AMD: `unique_id` (a per-chip serial that `amdgpu` exposes on most recent GPUs) →
//!   `amd-gpu-<unique_id>`, identity source `amd-unique-id`. Survives slot changes.
//! * Otherwise the PCI address → `<vendor>-gpu-pci-<domain>-<bus>-<device>.<function>`
//!   (e.g. `intel-gpu-pci-0000-00-02.0`), identity source `pci-location`. It survives
//!   reboots but not moving the card to another slot, like the Windows PnP instance
//!   id the SDK uses. These adapters are listed for information; exact selection does
//!   not support them yet, so a moved card can only ever resolve as not present, never
//!   as another device.
//!
//! NVIDIA adapters get their id from NVML (the GPU UUID), never from here.

use std::path::Path;

use crate::catalog::{IdentitySource, Vendor};

/// One PCI display/3D function as sysfs shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PciAdapter {
    /// The PCI address, `dddd:bb:dd.f`.
    pub pci: String,
    /// The vendor.
    pub vendor: Vendor,
    /// The PCI vendor id.
    pub vendor_id: u16,
    /// The PCI device id.
    pub device_id: u16,
    /// The PCI subsystem vendor id.
    pub subsystem_vendor: Option<u16>,
    /// The PCI subsystem device id.
    pub subsystem_device: Option<u16>,
    /// The 24-bit PCI class.
    pub class: u32,
    /// A name for people (from `pci.ids` when installed).
    pub name: String,
    /// The bound kernel driver (`amdgpu`, `i915`, `nvidia`, `nouveau`, …).
    pub driver: Option<String>,
    /// Dedicated memory (AMD `mem_info_vram_total`), MiB.
    pub memory_mib: Option<u64>,
    /// AMD's per-chip `unique_id`.
    pub unique_id: Option<String>,
}

impl PciAdapter {
    /// The adapter's persistent id and what it is derived from (see the module docs).
    pub fn stable_id(&self) -> (String, IdentitySource) {
        let vendor = self.vendor.as_str();
        if let Some(unique) = self.unique_id.as_deref() {
            return (
                format!("{vendor}-gpu-{}", unique.to_ascii_lowercase()),
                IdentitySource::AmdUniqueId,
            );
        }
        (
            format!("{vendor}-gpu-pci-{}", self.pci.replace(':', "-")),
            IdentitySource::PciLocation,
        )
    }
}

fn vendor_of(id: u16) -> Option<Vendor> {
    match id {
        0x10de => Some(Vendor::Nvidia),
        0x1002 => Some(Vendor::Amd),
        0x8086 => Some(Vendor::Intel),
        _ => None,
    }
}

fn is_display_class(class: u32) -> bool {
    matches!(class >> 8, 0x0300 | 0x0302 | 0x0380)
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|text| text.trim().to_string())
        .filter(|text| !text.is_empty())
}

fn read_hex(path: &Path) -> Option<u32> {
    let text = read_trimmed(path)?;
    u32::from_str_radix(text.trim_start_matches("0x"), 16).ok()
}

/// Lists the display/3D adapters under `<sysfs_root>/bus/pci/devices`, sorted by PCI
/// address. A missing or unreadable sysfs yields an empty list (NVML still lists
/// NVIDIA GPUs; nothing else is selectable anyway).
pub fn scan(sysfs_root: &Path) -> Vec<PciAdapter> {
    let Ok(entries) = std::fs::read_dir(sysfs_root.join("bus/pci/devices")) else {
        return Vec::new();
    };
    let names = pci_names();
    let mut adapters: Vec<PciAdapter> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let dir = entry.path();
            let pci = entry.file_name().to_string_lossy().to_ascii_lowercase();
            let class = read_hex(&dir.join("class"))?;
            if !is_display_class(class) {
                return None;
            }
            let vendor_id = u16::try_from(read_hex(&dir.join("vendor"))?).ok()?;
            let vendor = vendor_of(vendor_id)?;
            let device_id = u16::try_from(read_hex(&dir.join("device"))?).ok()?;
            let subsystem_vendor =
                read_hex(&dir.join("subsystem_vendor")).and_then(|id| u16::try_from(id).ok());
            let subsystem_device =
                read_hex(&dir.join("subsystem_device")).and_then(|id| u16::try_from(id).ok());
            let driver = std::fs::read_link(dir.join("driver"))
                .ok()
                .and_then(|link| {
                    link.file_name()
                        .map(|name| name.to_string_lossy().into_owned())
                });
            let memory_mib = read_trimmed(&dir.join("mem_info_vram_total"))
                .and_then(|bytes| bytes.parse::<u64>().ok())
                .map(|bytes| bytes / (1024 * 1024));
            let unique_id = read_trimmed(&dir.join("unique_id"))
                .filter(|id| id.bytes().all(|b| b.is_ascii_hexdigit()));
            let name = names
                .as_deref()
                .and_then(|db| lookup_name(db, vendor_id, device_id))
                .unwrap_or_else(|| {
                    format!(
                        "{} GPU [{vendor_id:04x}:{device_id:04x}]",
                        vendor_label(vendor)
                    )
                });
            Some(PciAdapter {
                pci,
                vendor,
                vendor_id,
                device_id,
                subsystem_vendor,
                subsystem_device,
                class,
                name,
                driver,
                memory_mib,
                unique_id,
            })
        })
        .collect();
    adapters.sort_by(|a, b| a.pci.cmp(&b.pci));
    adapters
}

fn vendor_label(vendor: Vendor) -> &'static str {
    match vendor {
        Vendor::Nvidia => "NVIDIA",
        Vendor::Amd => "AMD",
        Vendor::Intel => "Intel",
        Vendor::Apple => "Apple",
        Vendor::Other => "PCI",
    }
}

/// The `pci.ids` database, when installed (for names only).
fn pci_names() -> Option<String> {
    [
        "/usr/share/hwdata/pci.ids",
        "/usr/share/misc/pci.ids",
        "/usr/share/pci.ids",
    ]
    .iter()
    .find_map(|path| std::fs::read_to_string(path).ok())
}

/// `<vendor label> <device name>` from a `pci.ids` text.
pub(crate) fn lookup_name(db: &str, vendor_id: u16, device_id: u16) -> Option<String> {
    let vendor_key = format!("{vendor_id:04x}");
    let device_key = format!("\t{device_id:04x}");
    let mut in_vendor = false;
    for line in db.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if !line.starts_with('\t') {
            if in_vendor {
                return None;
            }
            in_vendor = line.starts_with(&vendor_key);
            continue;
        }
        if in_vendor && line.starts_with(&device_key) && !line.starts_with("\t\t") {
            let name = line[device_key.len()..].trim();
            let vendor = vendor_of(vendor_id).map(vendor_label).unwrap_or("PCI");
            return Some(format!("{vendor} {name}"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_ids_lookup_finds_the_device_under_its_vendor_only() {
        let db = "# comment\n1002  Advanced Micro Devices\n\t73bf  Navi 21 [Radeon RX 6800]\n\t\t1002 0e3a  sub\n10de  NVIDIA Corporation\n\t73bf  Not this one\n";
        assert_eq!(
            lookup_name(db, 0x1002, 0x73bf).as_deref(),
            Some("AMD Navi 21 [Radeon RX 6800]")
        );
        assert_eq!(lookup_name(db, 0x1002, 0x1234), None);
        assert_eq!(lookup_name(db, 0x8086, 0x73bf), None);
    }

    #[test]
    fn display_classes_only() {
        assert!(is_display_class(0x030000));
        assert!(is_display_class(0x030200));
        assert!(is_display_class(0x038000));
        assert!(!is_display_class(0x020000));
        assert!(!is_display_class(0x120000));
    }
}
