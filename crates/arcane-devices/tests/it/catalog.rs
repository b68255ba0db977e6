//! Loading and checking inventories.

use arcane_devices::{Catalog, CatalogState, DeviceKind, IdentitySource, IssueCode, Vendor};
use arcane_report::{codes, Diagnostic};

use crate::{fixture, fixture_path};

#[test]
fn every_fixture_loads_and_round_trips() {
    for entry in std::fs::read_dir(fixture_path("")).expect("fixtures dir") {
        let path = entry.expect("entry").path();
        let catalog = Catalog::from_inventory_file(&path)
            .unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
        let again = Catalog::from_json(&catalog.to_json_pretty()).expect("round trip");
        assert_eq!(catalog, again, "{}", path.display());
    }
}

#[test]
fn fields_read_as_documented() {
    let catalog = fixture("amd-intel.json");
    assert_eq!(catalog.state, CatalogState::Ready);
    let amd = catalog.device("amd-gpu-2d3c4b5a69788796").expect("amd");
    assert_eq!(amd.kind, DeviceKind::Gpu);
    assert_eq!(amd.vendor, Vendor::Amd);
    assert_eq!(amd.identity_source, Some(IdentitySource::AmdUniqueId));
    assert_eq!(amd.dedicated_memory_mib, Some(24560));
    assert_eq!(amd.addresses.pci.as_deref(), Some("0000:03:00.0"));
    assert_eq!(
        amd.pci_ids.as_ref().map(|p| p.device.as_str()),
        Some("0x744c")
    );
    let cpu = fixture("one-gpu.json");
    let cpu = cpu.device("cpu").expect("cpu");
    assert_eq!(
        (cpu.cores, cpu.logical_processors, cpu.memory_mib),
        (Some(32), Some(64), Some(515590))
    );
    let absent = fixture("nvml-absent.json");
    assert_eq!(absent.state, CatalogState::Partial);
    assert_eq!(absent.issues[0].code, IssueCode::EnumerationUnavailable);
}

fn usage_problem(text: &str) -> String {
    let error = Catalog::from_json(text).expect_err("must be rejected");
    assert_eq!(error.code(), codes::ARCANE_USAGE, "{error}");
    error.to_string()
}

const CPU: &str = r#"{"deviceId": "cpu", "identitySource": "host-cpu", "kind": "cpu", "vendor": "amd", "name": "x", "present": true}"#;

#[test]
fn inconsistent_inventories_are_refused_with_the_offending_value() {
    let message = usage_problem(&format!(
        r#"{{"schemaVersion": 1, "platform": "linux", "state": "ready", "devices": [{CPU}, {CPU}]}}"#
    ));
    assert!(message.contains("`cpu` is listed twice"), "{message}");

    let message = usage_problem(&format!(
        r#"{{"schemaVersion": 2, "platform": "linux", "state": "ready", "devices": [{CPU}]}}"#
    ));
    assert!(message.contains("`schemaVersion` is 2"), "{message}");

    let message = usage_problem(
        r#"{"schemaVersion": 1, "platform": "linux", "state": "ready", "devices": [
            {"deviceId": "cpu", "identitySource": null, "kind": "gpu", "vendor": "nvidia", "name": "x", "present": true}]}"#,
    );
    assert!(message.contains("reserved"), "{message}");

    let message = usage_problem(
        r#"{"schemaVersion": 1, "platform": "linux", "state": "ready", "devices": [
            {"deviceId": "", "identitySource": null, "kind": "gpu", "vendor": "nvidia", "name": "x", "present": true}]}"#,
    );
    assert!(message.contains("empty `deviceId`"), "{message}");
}

#[test]
fn a_misspelled_field_is_refused_not_read_as_null() {
    let error = Catalog::from_json(
        r#"{"schemaVersion": 1, "platform": "linux", "state": "ready", "devices": [
            {"deviceID": "cpu", "identitySource": "host-cpu", "kind": "cpu", "vendor": "amd", "name": "x", "present": true}]}"#,
    )
    .expect_err("unknown field");
    assert_eq!(error.code(), codes::ARCANE_USAGE);
    let caused_by = std::error::Error::source(&error)
        .map(|s| s.to_string())
        .unwrap_or_default();
    assert!(caused_by.contains("deviceID"), "{caused_by}");
    assert!(error.details()["line"].as_u64().is_some());
}

#[test]
fn a_missing_file_is_an_io_error_naming_the_path() {
    let path = fixture_path("no-such-inventory.json");
    let error = Catalog::from_inventory_file(&path).expect_err("missing");
    assert_eq!(error.code(), codes::ARCANE_IO);
    assert!(error.to_string().contains("no-such-inventory.json"));
}

#[test]
fn new_derives_the_state() {
    let full = fixture("one-gpu.json");
    let ready = Catalog::new("linux", full.devices.clone(), Vec::new());
    assert_eq!(ready.state, CatalogState::Ready);
    let partial = Catalog::new(
        "linux",
        full.devices.clone(),
        fixture("nvml-absent.json").issues,
    );
    assert_eq!(partial.state, CatalogState::Partial);
    assert_eq!(
        Catalog::new("linux", Vec::new(), Vec::new()).state,
        CatalogState::Unavailable
    );
}

#[test]
fn an_unknown_vendor_reads_as_other() {
    let catalog = Catalog::from_json(
        r#"{"schemaVersion": 1, "platform": "linux", "state": "ready", "devices": [
            {"deviceId": "cpu", "identitySource": "host-cpu", "kind": "cpu", "vendor": "qualcomm", "name": "x", "present": true}]}"#,
    )
    .expect("valid");
    assert_eq!(catalog.devices[0].vendor, Vendor::Other);
    assert!(catalog.issues.is_empty());
}
