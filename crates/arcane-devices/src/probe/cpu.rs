//! The host CPU record: one aggregate device with id `cpu`, read from
//! `/proc/cpuinfo` and `/proc/meminfo` (Linux). Elsewhere, or when those files cannot
//! be read, the record is still listed, named `Host CPU`, with what the standard
//! library knows (the logical processor count) and a `cpu` issue.

use std::collections::BTreeSet;
use std::path::Path;

use crate::catalog::{
    Addresses, CatalogIssue, Device, DeviceKind, IdentitySource, IssueCode, IssueSource, Vendor,
    CPU_DEVICE_ID,
};

/// What `/proc/cpuinfo` says.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct CpuInfo {
    pub names: Vec<String>,
    pub vendor: Option<String>,
    pub logical: u32,
    pub cores: Option<u32>,
}

/// Parses `/proc/cpuinfo`: distinct model names in order, the vendor, the logical
/// processor count and the physical core count (distinct `physical id`/`core id`
/// pairs; else `cpu cores` summed over packages).
pub(crate) fn parse_cpuinfo(text: &str) -> CpuInfo {
    let mut info = CpuInfo::default();
    let mut pairs = BTreeSet::new();
    let mut cores_per_package: std::collections::BTreeMap<String, u32> = Default::default();
    let mut physical = String::new();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "processor" => info.logical += 1,
            "model name" | "Model"
                if !value.is_empty() && !info.names.iter().any(|name| name == value) =>
            {
                info.names.push(value.to_string());
            }
            "vendor_id" if info.vendor.is_none() => info.vendor = Some(value.to_string()),
            "physical id" => physical = value.to_string(),
            "core id" => {
                pairs.insert((physical.clone(), value.to_string()));
            }
            "cpu cores" => {
                if let Ok(count) = value.parse::<u32>() {
                    cores_per_package.insert(physical.clone(), count);
                }
            }
            _ => {}
        }
    }
    info.cores = if !pairs.is_empty() {
        u32::try_from(pairs.len()).ok()
    } else if !cores_per_package.is_empty() {
        Some(cores_per_package.values().sum())
    } else {
        None
    };
    info
}

/// Parses `MemTotal` from `/proc/meminfo`, in MiB.
pub(crate) fn parse_meminfo(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix("MemTotal:")?;
        let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib / 1024)
    })
}

fn vendor_of(vendor_id: Option<&str>) -> Vendor {
    match vendor_id {
        Some("GenuineIntel") => Vendor::Intel,
        Some("AuthenticAMD") => Vendor::Amd,
        Some("Apple") => Vendor::Apple,
        _ => Vendor::Other,
    }
}

/// The CPU record, and issues about what could not be read.
pub(crate) fn probe(proc_root: &Path) -> (Device, Vec<CatalogIssue>) {
    let mut issues = Vec::new();
    let fallback_logical = std::thread::available_parallelism()
        .ok()
        .and_then(|n| u32::try_from(n.get()).ok());
    let info = match std::fs::read_to_string(proc_root.join("cpuinfo")) {
        Ok(text) => Some(parse_cpuinfo(&text)),
        Err(error) => {
            if cfg!(target_os = "linux") {
                issues.push(
                    CatalogIssue::new(
                        IssueSource::Cpu,
                        IssueCode::PropertyUnavailable,
                        format!(
                            "cannot read `{}`: {error}",
                            proc_root.join("cpuinfo").display()
                        ),
                    )
                    .for_device(CPU_DEVICE_ID),
                );
            }
            None
        }
    };
    let memory_mib = std::fs::read_to_string(proc_root.join("meminfo"))
        .ok()
        .and_then(|text| parse_meminfo(&text));
    let info = info.unwrap_or_default();
    let name = if info.names.is_empty() {
        "Host CPU".to_string()
    } else {
        info.names.join(" / ")
    };
    let logical = if info.logical > 0 {
        Some(info.logical)
    } else {
        fallback_logical
    };
    let device = Device {
        device_id: Some(CPU_DEVICE_ID.to_string()),
        identity_source: Some(IdentitySource::HostCpu),
        kind: DeviceKind::Cpu,
        vendor: vendor_of(info.vendor.as_deref()),
        name,
        present: true,
        addresses: Addresses::default(),
        dedicated_memory_mib: None,
        driver_version: None,
        cores: info.cores.or(logical),
        logical_processors: logical,
        memory_mib,
        pci_ids: None,
        mig_enabled: false,
    };
    (device, issues)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_SOCKETS: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon A\nphysical id\t: 0\ncore id\t: 0\ncpu cores\t: 2\n\n\
processor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon A\nphysical id\t: 0\ncore id\t: 0\ncpu cores\t: 2\n\n\
processor\t: 2\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon A\nphysical id\t: 0\ncore id\t: 1\ncpu cores\t: 2\n\n\
processor\t: 3\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon B\nphysical id\t: 1\ncore id\t: 0\ncpu cores\t: 1\n";

    #[test]
    fn counts_threads_cores_and_distinct_names() {
        let info = parse_cpuinfo(TWO_SOCKETS);
        assert_eq!(info.logical, 4);
        // (0,0), (0,1), (1,0): core 0 of socket 0 has two threads.
        assert_eq!(info.cores, Some(3));
        assert_eq!(info.names, vec!["Xeon A", "Xeon B"]);
        assert_eq!(vendor_of(info.vendor.as_deref()), Vendor::Intel);
    }

    #[test]
    fn meminfo_total_in_mib() {
        assert_eq!(
            parse_meminfo("MemFree: 1 kB\nMemTotal:       24684092 kB\n"),
            Some(24105)
        );
        assert_eq!(parse_meminfo("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn unreadable_proc_still_lists_the_cpu_with_an_issue() {
        let (device, issues) = probe(Path::new("/nonexistent-proc-root"));
        assert_eq!(device.device_id.as_deref(), Some("cpu"));
        assert_eq!(device.name, "Host CPU");
        if cfg!(target_os = "linux") {
            assert_eq!(issues.len(), 1);
            assert_eq!(issues[0].code, IssueCode::PropertyUnavailable);
        }
    }
}
