//! Resolution of targets into launch plans, against fixture inventories.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use arcane_devices::{
    resolve, resolve_with, Backend, Catalog, CudaIdentity, Device, DeviceSource, Error,
    GpuIdentitySource, Reason, Resolution, ResolveRequest,
};
use arcane_report::{codes, Diagnostic};

use crate::fixture;

const H200: &str = "nvidia-gpu-3f2a9c1e-0b4d-4e6f-8a9b-0c1d2e3f4a5b";
const H200_UUID: &str = "GPU-3f2a9c1e-0b4d-4e6f-8a9b-0c1d2e3f4a5b";

fn request(target: Option<&str>, runtime: Backend, requested: Backend) -> ResolveRequest {
    ResolveRequest {
        target: target.map(str::to_string),
        runtime_backend: runtime,
        requested_backend: requested,
    }
}

fn gpu(target: &str) -> ResolveRequest {
    request(Some(target), Backend::Cuda, Backend::Auto)
}

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn expect_error(result: Result<arcane_devices::LaunchPlan, Error>) -> Error {
    match result {
        Ok(plan) => panic!("expected an error, got a plan: {plan:?}"),
        Err(error) => error,
    }
}

#[test]
fn one_gpu_with_a_cuda_runtime_pins_its_uuid() {
    let plan = resolve(&gpu(H200), &fixture("one-gpu.json")).expect("matched");
    assert_eq!(
        plan.args(),
        [
            "--device",
            "CUDA0",
            "--split-mode",
            "none",
            "--main-gpu",
            "0",
            "--gpu-layers",
            "all"
        ]
    );
    assert_eq!(
        plan.env(),
        &env(&[
            ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
            ("CUDA_VISIBLE_DEVICES", H200_UUID),
            ("GGML_VK_VISIBLE_DEVICES", ""),
            ("HIP_VISIBLE_DEVICES", ""),
            ("ROCR_VISIBLE_DEVICES", ""),
        ])
    );
    assert_eq!(plan.env_remove(), ["GGML_CUDA_DEVICES"]);
    let record = plan.execution();
    assert_eq!(record.resolution, Resolution::Matched);
    assert_eq!(record.reason, None);
    assert!(!record.fallback);
    assert!(record.observed_target.is_none());
    let configured = record.configured_target.as_ref().expect("configured");
    assert_eq!(configured.uuid.as_deref(), Some(H200_UUID));
    assert_eq!(configured.device_id.as_deref(), Some(H200));

    // The record's wire form uses the documented camelCase names.
    let json = serde_json::to_value(record).expect("serialize");
    assert_eq!(json["requestedTarget"]["deviceId"], H200);
    assert_eq!(json["resolvedDevice"]["addresses"]["uuid"], H200_UUID);
    assert_eq!(json["configuredTarget"]["backend"], "cuda");
    assert_eq!(json["configuredTarget"]["device"], "CUDA0");
    assert_eq!(json["configuredTarget"]["gpuLayers"], "all");
    assert_eq!(json["configuredTarget"]["splitMode"], "none");
    assert_eq!(json["configuredTarget"]["mainGpu"], 0);
    assert_eq!(json["observedTarget"], serde_json::Value::Null);
    assert_eq!(json["fallback"], false);
}

#[test]
fn two_gpus_of_the_same_model_each_pin_their_own_uuid() {
    let catalog = fixture("two-same-model-gpus.json");
    // Listed out of PCI order on purpose, and differing only in the last UUID digit:
    // an index, an order or a prefix match would pick the wrong one.
    for (id, uuid) in [
        (
            "nvidia-gpu-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60718",
            "GPU-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60718",
        ),
        (
            "nvidia-gpu-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60719",
            "GPU-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60719",
        ),
    ] {
        let plan = resolve(&gpu(id), &catalog).expect("matched");
        assert_eq!(plan.env()["CUDA_VISIBLE_DEVICES"], uuid, "target {id}");
        let device = plan.execution().resolved_device.as_ref().expect("device");
        assert_eq!(device.device_id.as_deref(), Some(id));
        assert_eq!(device.addresses.uuid.as_deref(), Some(uuid));
    }
}

#[test]
fn a_gpu_that_disappeared_is_unavailable_not_replaced() {
    let catalog = fixture("gpu-disappeared.json");
    let error = expect_error(resolve(&gpu(H200), &catalog));
    assert_eq!(error.code(), codes::LOCAL_AI_EXECUTION_TARGET_UNAVAILABLE);
    assert_eq!(error.reason(), Some(Reason::DeviceNotPresent));
    let record = error.execution().expect("record");
    assert_eq!(record.resolution, Resolution::Unavailable);
    assert!(record.resolved_device.is_none());
    assert!(record.configured_target.is_none());
    assert!(!record.fallback);
    let details = error.details();
    assert_eq!(details["reason"], "device-not-present");
    assert_eq!(details["execution"]["resolution"], "unavailable");
    assert_eq!(details["execution"]["requestedTarget"]["deviceId"], H200);
    // The other, present GPU is still selectable.
    let other = resolve(
        &gpu("nvidia-gpu-9d8c7b6a-5f4e-4d3c-8b2a-19087f6e5d4c"),
        &catalog,
    )
    .expect("the present GPU matches");
    assert_eq!(
        other.env()["CUDA_VISIBLE_DEVICES"],
        "GPU-9d8c7b6a-5f4e-4d3c-8b2a-19087f6e5d4c"
    );
}

#[test]
fn nvml_absent_makes_gpu_targets_unsupported_and_leaves_the_cpu_selectable() {
    let catalog = fixture("nvml-absent.json");
    let error = expect_error(resolve(&gpu(H200), &catalog));
    assert_eq!(error.code(), codes::LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED);
    assert_eq!(error.reason(), Some(Reason::InventoryUnavailable));
    assert_eq!(
        error.execution().map(|r| r.resolution),
        Some(Resolution::Unsupported)
    );
    assert!(error
        .hints()
        .iter()
        .any(|h| h.contains("libnvidia-ml.so.1")));

    let plan = resolve(
        &request(Some("cpu"), Backend::Auto, Backend::Auto),
        &catalog,
    )
    .expect("cpu matches");
    assert_eq!(plan.execution().resolution, Resolution::Matched);
}

#[test]
fn amd_and_intel_adapters_are_listed_but_not_selectable() {
    let catalog = fixture("amd-intel.json");
    for id in ["amd-gpu-2d3c4b5a69788796", "intel-gpu-pci-0000-00-02.0"] {
        let device = catalog.device(id).expect("listed");
        assert!(device.present);
        assert!(!device.exact_selection_supported());
        let error = expect_error(resolve(&gpu(id), &catalog));
        assert_eq!(
            error.code(),
            codes::LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED,
            "{id}"
        );
        assert_eq!(error.reason(), Some(Reason::SelectionUnsupported), "{id}");
        // The device is there, but unsupported: the record names it and says why.
        let record = error.execution().expect("record");
        assert_eq!(record.resolution, Resolution::Unsupported);
        assert_eq!(record.reason, Some(Reason::SelectionUnsupported));
        assert!(record.configured_target.is_none());
        assert_eq!(
            record
                .resolved_device
                .as_ref()
                .and_then(|d| d.device_id.as_deref()),
            Some(id)
        );
    }
    // The NVIDIA GPU next to them still resolves.
    let plan = resolve(&gpu(H200), &catalog).expect("nvidia matches");
    assert_eq!(plan.env()["CUDA_VISIBLE_DEVICES"], H200_UUID);
}

#[test]
fn a_cpu_only_runtime_cannot_take_a_gpu_target() {
    let catalog = fixture("one-gpu.json");
    for runtime in [Backend::Cpu, Backend::Auto, Backend::Vulkan] {
        let error = expect_error(resolve(
            &request(Some(H200), runtime, Backend::Auto),
            &catalog,
        ));
        assert_eq!(
            error.code(),
            codes::LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED,
            "{runtime}"
        );
        assert_eq!(error.reason(), Some(Reason::BackendMismatch));
        assert_eq!(error.details()["runtimeBackend"], runtime.as_str());
        assert_eq!(error.details()["execution"]["resolution"], "unsupported");
        assert_eq!(error.details()["execution"]["reason"], "backend-mismatch");
    }
}

#[test]
fn a_requested_cpu_backend_cannot_take_a_gpu_target() {
    let error = expect_error(resolve(
        &request(Some(H200), Backend::Cuda, Backend::Cpu),
        &fixture("one-gpu.json"),
    ));
    assert_eq!(error.code(), codes::LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED);
    assert_eq!(error.reason(), Some(Reason::BackendMismatch));
    assert_eq!(error.details()["requestedBackend"], "cpu");
}

#[test]
fn an_unknown_id_is_unavailable() {
    let error = expect_error(resolve(
        &gpu("nvidia-gpu-00000000-0000-0000-0000-000000000000"),
        &fixture("two-same-model-gpus.json"),
    ));
    assert_eq!(error.code(), codes::LOCAL_AI_EXECUTION_TARGET_UNAVAILABLE);
    assert_eq!(error.reason(), Some(Reason::DeviceNotPresent));
    assert!(error
        .to_string()
        .contains("`nvidia-gpu-00000000-0000-0000-0000-000000000000`"));
}

#[test]
fn an_unidentified_present_gpu_blocks_gpu_targets_it_might_be() {
    let catalog = fixture("unidentified-gpu.json");
    let error = expect_error(resolve(&gpu("nvidia-gpu-some-other-card"), &catalog));
    assert_eq!(error.code(), codes::LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED);
    assert_eq!(error.reason(), Some(Reason::IdentityUnresolved));
    // Identified devices still resolve, and so does the CPU.
    assert!(resolve(&gpu(H200), &catalog).is_ok());
    assert!(resolve(
        &request(Some("cpu"), Backend::Cuda, Backend::Auto),
        &catalog
    )
    .is_ok());
}

#[test]
fn a_malformed_uuid_never_reaches_the_environment() {
    let error = expect_error(resolve(
        &gpu("nvidia-gpu-hand-written"),
        &fixture("malformed-uuid.json"),
    ));
    assert_eq!(error.code(), codes::LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED);
    assert_eq!(error.reason(), Some(Reason::IdentityUnresolved));
}

#[test]
fn the_cpu_target_hides_every_gpu() {
    let plan = resolve(
        &request(Some("cpu"), Backend::Cuda, Backend::Auto),
        &fixture("two-same-model-gpus.json"),
    )
    .expect("cpu matches");
    assert_eq!(plan.args(), ["--device", "none", "--gpu-layers", "0"]);
    assert_eq!(
        plan.env(),
        &env(&[
            ("CUDA_VISIBLE_DEVICES", ""),
            ("GGML_VK_VISIBLE_DEVICES", ""),
            ("HIP_VISIBLE_DEVICES", ""),
            ("ROCR_VISIBLE_DEVICES", ""),
        ])
    );
    let json = serde_json::to_value(plan.execution()).expect("serialize");
    assert_eq!(json["resolution"], "matched");
    assert_eq!(json["configuredTarget"]["backend"], "cpu");
    assert_eq!(json["configuredTarget"]["device"], "none");
    assert_eq!(json["configuredTarget"]["gpuLayers"], 0);
    assert_eq!(json["configuredTarget"]["deviceId"], "cpu");
}

#[test]
fn the_cpu_target_refuses_a_gpu_backend_request() {
    for requested in [Backend::Cuda, Backend::Vulkan] {
        let error = expect_error(resolve(
            &request(Some("cpu"), Backend::Cuda, requested),
            &fixture("one-gpu.json"),
        ));
        assert_eq!(error.code(), codes::LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED);
        assert_eq!(error.reason(), Some(Reason::BackendMismatch));
    }
}

/// A source that counts calls and serves a sequence of catalogs.
struct Sequence {
    calls: AtomicUsize,
    catalogs: Mutex<Vec<Catalog>>,
}

impl Sequence {
    fn new(catalogs: Vec<Catalog>) -> Self {
        Self {
            calls: AtomicUsize::new(0),
            catalogs: Mutex::new(catalogs),
        }
    }
}

impl DeviceSource for Sequence {
    fn catalog(&self) -> Catalog {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut catalogs = self.catalogs.lock().expect("lock");
        if catalogs.len() > 1 {
            catalogs.remove(0)
        } else {
            catalogs[0].clone()
        }
    }
}

#[test]
fn no_target_is_automatic_and_does_no_discovery() {
    let source = Sequence::new(vec![fixture("one-gpu.json")]);
    let plan = resolve(&request(None, Backend::Cuda, Backend::Auto), &source).expect("automatic");
    assert!(plan.args().is_empty());
    assert!(plan.env().is_empty());
    assert!(plan.env_remove().is_empty());
    let record = plan.execution();
    assert_eq!(record.resolution, Resolution::Automatic);
    assert_eq!(record.reason, Some(Reason::EngineDefaultRequired));
    assert!(record.requested_target.is_none());
    assert!(record.configured_target.is_none());
    assert_eq!(source.calls.load(Ordering::SeqCst), 0);
}

#[test]
fn no_target_with_a_cpu_request_keeps_the_engine_on_the_cpu() {
    let source = Sequence::new(vec![fixture("one-gpu.json")]);
    let plan = resolve(&request(None, Backend::Cuda, Backend::Cpu), &source).expect("automatic");
    assert_eq!(plan.args(), ["--device", "none", "--gpu-layers", "0"]);
    assert_eq!(plan.env()["CUDA_VISIBLE_DEVICES"], "");
    assert_eq!(plan.execution().resolution, Resolution::Automatic);
    assert_eq!(
        plan.execution().reason,
        Some(Reason::RuntimeBackendSelected)
    );
    assert_eq!(source.calls.load(Ordering::SeqCst), 0);
}

#[test]
fn every_launch_resolves_afresh() {
    // The GPU is there for the first launch and gone for the second.
    let source = Sequence::new(vec![
        fixture("one-gpu.json"),
        fixture("gpu-disappeared.json"),
    ]);
    assert!(resolve(&gpu(H200), &source).is_ok());
    let error = expect_error(resolve(&gpu(H200), &source));
    assert_eq!(error.reason(), Some(Reason::DeviceNotPresent));
    assert_eq!(source.calls.load(Ordering::SeqCst), 2);
}

#[test]
fn an_empty_target_is_a_usage_error() {
    let error = expect_error(resolve(&gpu(" "), &fixture("one-gpu.json")));
    assert_eq!(error.code(), codes::ARCANE_USAGE);
}

#[test]
fn an_unavailable_inventory_makes_even_the_cpu_unsupported() {
    let mut text: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(crate::fixture_path("one-gpu.json")).expect("read"),
    )
    .expect("json");
    text["state"] = "unavailable".into();
    text["devices"] = serde_json::json!([]);
    let catalog = Catalog::from_json(&text.to_string()).expect("valid");
    let error = expect_error(resolve(
        &request(Some("cpu"), Backend::Cpu, Backend::Auto),
        &catalog,
    ));
    assert_eq!(error.reason(), Some(Reason::InventoryUnavailable));
}

/// An identity source standing in for the Windows LUID → CUDA UUID lookup.
struct LuidLookup;

impl GpuIdentitySource for LuidLookup {
    fn cuda_identity(&self, device: &Device) -> Result<CudaIdentity, String> {
        match device.addresses.pci.as_deref() {
            Some("0000:01:00.0") => Ok(CudaIdentity::new(
                "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
                "nvidia-cuda-driver",
            )),
            _ => Err("no CUDA device has this adapter's LUID".to_string()),
        }
    }
}

#[test]
fn the_identity_source_is_a_seam_callers_do_not_see() {
    let plan = resolve_with(&gpu(H200), &fixture("one-gpu.json"), &LuidLookup).expect("matched");
    assert_eq!(
        plan.env()["CUDA_VISIBLE_DEVICES"],
        "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    );
    assert_eq!(
        plan.execution()
            .configured_target
            .as_ref()
            .and_then(|c| c.identity_source.as_deref()),
        Some("nvidia-cuda-driver")
    );
    let error = expect_error(resolve_with(
        &gpu("nvidia-gpu-9d8c7b6a-5f4e-4d3c-8b2a-19087f6e5d4c"),
        &fixture("gpu-disappeared.json"),
        &LuidLookup,
    ));
    assert_eq!(error.reason(), Some(Reason::IdentityUnresolved));
    assert!(error.to_string().contains("LUID"));
}

#[test]
fn a_plan_applies_to_a_command_exactly() {
    let plan = resolve(&gpu(H200), &fixture("one-gpu.json")).expect("matched");
    let mut command = std::process::Command::new("llama-server");
    command.env("GGML_CUDA_DEVICES", "4");
    plan.apply_to(&mut command);
    let args: Vec<String> = command
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    assert_eq!(args, plan.args());
    let envs: BTreeMap<String, Option<String>> = command
        .get_envs()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.map(|v| v.to_string_lossy().into_owned()),
            )
        })
        .collect();
    assert_eq!(envs["GGML_CUDA_DEVICES"], None, "removed");
    assert_eq!(envs["CUDA_VISIBLE_DEVICES"].as_deref(), Some(H200_UUID));
    assert_eq!(envs["GGML_VK_VISIBLE_DEVICES"].as_deref(), Some(""));
}
