//! The probe: the real machine, a fake sysfs tree, and merging NVML with sysfs.

use std::path::Path;

use arcane_devices::{
    assemble, probe, probe_with, resolve, Backend, CatalogState, DeviceKind, IdentitySource,
    IssueCode, IssueSource, NvidiaGpu, NvmlLibrary, NvmlListing, ProbeOptions, Reason,
    ResolveRequest, Vendor,
};
use arcane_report::Diagnostic;

#[test]
fn the_real_probe_lists_the_cpu_and_never_fails() {
    let catalog = probe();
    assert_ne!(catalog.state, CatalogState::Unavailable);
    let cpu = catalog.device("cpu").expect("the CPU is always listed");
    assert_eq!(cpu.kind, DeviceKind::Cpu);
    assert!(cpu.present);
    assert!(cpu.logical_processors.is_some_and(|n| n >= 1));
    assert!(catalog.probed_at.is_some());
    let nvml_gpus = catalog
        .devices
        .iter()
        .filter(|d| d.identity_source == Some(IdentitySource::NvmlUuid))
        .count();
    if nvml_gpus == 0 {
        // This machine (no NVIDIA driver): NVML's absence is reported, not hidden.
        assert_eq!(catalog.state, CatalogState::Partial);
        assert!(
            catalog.issues.iter().any(|i| i.source == IssueSource::Gpu
                && matches!(
                    i.code,
                    IssueCode::EnumerationUnavailable | IssueCode::EnumerationFailed
                )),
            "{:#?}",
            catalog.issues
        );
    }
    // And the probe's output is a valid inventory.
    let again = arcane_devices::Catalog::from_json(&catalog.to_json_pretty()).expect("valid");
    assert_eq!(again, catalog);
}

#[test]
fn a_missing_nvml_library_is_a_partial_catalog_naming_the_library() {
    let options = ProbeOptions::default()
        .with_nvml(NvmlLibrary::Path("/nonexistent/libnvidia-ml.so.1".into()));
    let catalog = probe_with(&options);
    assert_eq!(catalog.state, CatalogState::Partial);
    let issue = catalog
        .issues
        .iter()
        .find(|i| i.code == IssueCode::EnumerationUnavailable)
        .expect("issue");
    assert_eq!(issue.source, IssueSource::Gpu);
    assert!(
        issue.message.contains("/nonexistent/libnvidia-ml.so.1"),
        "{}",
        issue.message
    );
}

fn write(dir: &Path, name: &str, value: &str) {
    std::fs::write(dir.join(name), format!("{value}\n")).expect("write");
}

fn pci_function(
    root: &Path,
    address: &str,
    class: &str,
    vendor: &str,
    device: &str,
) -> std::path::PathBuf {
    let dir = root.join("bus/pci/devices").join(address);
    std::fs::create_dir_all(&dir).expect("mkdir");
    write(&dir, "class", class);
    write(&dir, "vendor", vendor);
    write(&dir, "device", device);
    write(&dir, "subsystem_vendor", "0x1043");
    write(&dir, "subsystem_device", "0x8882");
    dir
}

#[test]
fn sysfs_adapters_are_listed_with_stable_ids_and_nvidia_without_nvml_is_unresolved() {
    let root = tempfile::tempdir().expect("tempdir");
    let sys = root.path();
    let amd = pci_function(sys, "0000:03:00.0", "0x030000", "0x1002", "0x744c");
    write(&amd, "unique_id", "2D3C4B5A69788796");
    write(&amd, "mem_info_vram_total", "25753026560");
    pci_function(sys, "0000:00:02.0", "0x030000", "0x8086", "0xa780");
    pci_function(sys, "0000:04:00.0", "0x030200", "0x10de", "0x2335");
    pci_function(sys, "0000:00:01.0", "0x030000", "0x1af4", "0x1050"); // virtio VGA: not listed
    pci_function(sys, "0000:00:03.0", "0x020000", "0x8086", "0x1533"); // Intel NIC: not a display
    let options = ProbeOptions::default()
        .with_sysfs_root(sys)
        .with_nvml(NvmlLibrary::Disabled);
    let catalog = probe_with(&options);

    let gpus: Vec<_> = catalog
        .devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Gpu)
        .collect();
    assert_eq!(gpus.len(), 3, "{gpus:#?}");
    let amd = catalog
        .device("amd-gpu-2d3c4b5a69788796")
        .expect("amd by unique id");
    assert_eq!(amd.vendor, Vendor::Amd);
    assert_eq!(amd.dedicated_memory_mib, Some(24560));
    assert_eq!(amd.identity_source, Some(IdentitySource::AmdUniqueId));
    let intel = catalog
        .device("intel-gpu-pci-0000-00-02.0")
        .expect("intel by location");
    assert_eq!(intel.identity_source, Some(IdentitySource::PciLocation));
    assert_eq!(
        intel.pci_ids.as_ref().map(|p| p.vendor.as_str()),
        Some("0x8086")
    );
    let nvidia = gpus
        .iter()
        .find(|d| d.vendor == Vendor::Nvidia)
        .expect("nvidia");
    assert_eq!(nvidia.device_id, None);
    assert_eq!(nvidia.addresses.pci.as_deref(), Some("0000:04:00.0"));

    assert_eq!(catalog.state, CatalogState::Partial);
    assert!(catalog
        .issues
        .iter()
        .any(|i| i.code == IssueCode::EnumerationUnavailable));
    assert!(catalog
        .issues
        .iter()
        .any(|i| i.code == IssueCode::IdentityUnresolved && i.message.contains("0000:04:00.0")));

    // With NVML gone, no NVIDIA target can be resolved, whatever its id.
    let error = resolve(
        &ResolveRequest {
            target: Some("nvidia-gpu-3f2a9c1e-0b4d-4e6f-8a9b-0c1d2e3f4a5b".into()),
            runtime_backend: Backend::Cuda,
            requested_backend: Backend::Auto,
        },
        &catalog,
    )
    .expect_err("unsupported");
    assert_eq!(
        error.code(),
        arcane_report::codes::LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED
    );
    assert_eq!(error.reason(), Some(Reason::InventoryUnavailable));
}

fn cpu() -> arcane_devices::Device {
    probe().devices.remove(0)
}

#[test]
fn nvml_gpus_get_uuid_ids_and_an_unreadable_gpu_leaves_an_unidentified_record() {
    let listing = NvmlListing::Listed {
        gpus: vec![
            NvidiaGpu::new("GPU-5E1B7C2A-93D4-4F0E-A1B2-C3D4E5F60718", "NVIDIA H100")
                .at_pci("0000:17:00.0"),
        ],
        unreadable: vec!["NVML could not read GPU 1's UUID: GPU is lost".to_string()],
    };
    let catalog = assemble(cpu(), Vec::new(), listing);
    let h100 = catalog
        .device("nvidia-gpu-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60718")
        .expect("id is the lowercased UUID");
    assert_eq!(
        h100.addresses.uuid.as_deref(),
        Some("GPU-5E1B7C2A-93D4-4F0E-A1B2-C3D4E5F60718")
    );
    assert_eq!(catalog.state, CatalogState::Partial);
    let unidentified: Vec<_> = catalog
        .devices
        .iter()
        .filter(|d| d.device_id.is_none())
        .collect();
    assert_eq!(unidentified.len(), 1);
    assert!(catalog
        .issues
        .iter()
        .any(|i| i.code == IssueCode::IdentityUnresolved && i.message.contains("GPU is lost")));

    let ready = assemble(
        cpu(),
        Vec::new(),
        NvmlListing::Listed {
            gpus: vec![NvidiaGpu::new(
                "GPU-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60718",
                "NVIDIA H100",
            )],
            unreadable: Vec::new(),
        },
    );
    assert_eq!(ready.state, CatalogState::Ready);
    assert!(ready.issues.is_empty());
}

#[test]
fn an_nvml_gpu_seen_in_sysfs_is_listed_once() {
    let root = tempfile::tempdir().expect("tempdir");
    pci_function(root.path(), "0000:17:00.0", "0x030200", "0x10de", "0x2330");
    // Probe sysfs only, then merge with an NVML listing of the same card.
    let sysfs_only = probe_with(
        &ProbeOptions::default()
            .with_sysfs_root(root.path())
            .with_nvml(NvmlLibrary::Disabled),
    );
    assert_eq!(
        sysfs_only
            .devices
            .iter()
            .filter(|d| d.kind == DeviceKind::Gpu)
            .count(),
        1
    );
    let adapters = arcane_devices::scan_pci_adapters(root.path());
    let catalog = assemble(
        cpu(),
        adapters,
        NvmlListing::Listed {
            gpus: vec![
                NvidiaGpu::new("GPU-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60718", "NVIDIA H100")
                    .at_pci("0000:17:00.0"),
            ],
            unreadable: Vec::new(),
        },
    );
    let gpus: Vec<_> = catalog
        .devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Gpu)
        .collect();
    assert_eq!(gpus.len(), 1, "{gpus:#?}");
    assert_eq!(gpus[0].identity_source, Some(IdentitySource::NvmlUuid));
    assert_eq!(catalog.state, CatalogState::Ready, "{:#?}", catalog.issues);
}

#[test]
fn a_gpu_in_mig_mode_is_listed_with_an_issue_and_refused() {
    let uuid = "GPU-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60718";
    let catalog = assemble(
        cpu(),
        Vec::new(),
        NvmlListing::Listed {
            gpus: vec![NvidiaGpu::new(uuid, "NVIDIA H200").with_mig()],
            unreadable: Vec::new(),
        },
    );
    let id = "nvidia-gpu-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60718";
    assert!(catalog
        .device(id)
        .is_some_and(|d| d.mig_enabled && !d.exact_selection_supported()));
    assert!(catalog
        .issues
        .iter()
        .any(|i| i.device_id.as_deref() == Some(id) && i.message.contains("MIG")));
    let json = catalog.to_json_pretty();
    assert!(json.contains("\"migEnabled\": true"), "{json}");
    let error = resolve(
        &ResolveRequest {
            target: Some(id.into()),
            runtime_backend: Backend::Cuda,
            requested_backend: Backend::Auto,
        },
        &catalog,
    )
    .expect_err("MIG refused");
    assert_eq!(error.reason(), Some(Reason::SelectionUnsupported));
}
