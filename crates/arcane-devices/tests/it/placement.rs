//! The placement check, against scripted NVML process lists and the real (absent) NVML.

use std::sync::atomic::{AtomicUsize, Ordering};

use arcane_devices::{
    check_placement, check_placement_with, resolve, Backend, ExecutionRecord, GpuProcessSource,
    GpuProcesses, Placement, ResolveRequest,
};
use arcane_report::{codes, Diagnostic};

use crate::fixture;

const ID_18: &str = "nvidia-gpu-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60718";
const UUID_18: &str = "GPU-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60718";
const UUID_19: &str = "GPU-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60719";

fn record(target: Option<&str>, requested: Backend) -> ExecutionRecord {
    resolve(
        &ResolveRequest {
            target: target.map(str::to_string),
            runtime_backend: Backend::Cuda,
            requested_backend: requested,
        },
        &fixture("two-same-model-gpus.json"),
    )
    .expect("resolves")
    .into_execution()
}

/// NVML's answer, scripted.
struct Lists {
    answer: Result<Vec<(&'static str, Vec<u32>)>, String>,
    calls: AtomicUsize,
}

impl Lists {
    fn new(answer: Result<Vec<(&'static str, Vec<u32>)>, String>) -> Self {
        Self {
            answer,
            calls: AtomicUsize::new(0),
        }
    }
}

impl GpuProcessSource for Lists {
    fn gpu_processes(&self) -> Result<Vec<GpuProcesses>, String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.answer.clone().map(|list| {
            list.into_iter()
                .map(|(uuid, pids)| GpuProcesses {
                    uuid: uuid.to_string(),
                    pids,
                })
                .collect()
        })
    }
}

#[test]
fn the_pid_on_the_configured_gpu_is_confirmed() {
    let mut record = record(Some(ID_18), Backend::Auto);
    let lists = Lists::new(Ok(vec![(UUID_19, vec![7, 8]), (UUID_18, vec![41, 42])]));
    assert_eq!(
        check_placement_with(&mut record, 42, &lists).expect("ok"),
        Placement::Confirmed
    );
    let observed = record.observed_target.as_ref().expect("observed");
    assert_eq!(observed.uuid, UUID_18);
    assert_eq!(observed.pid, 42);
    assert_eq!(observed.device_id.as_deref(), Some(ID_18));
    let json = serde_json::to_value(&record).expect("json");
    assert_eq!(json["observedTarget"]["source"], "nvml-process-list");
}

#[test]
fn the_pid_on_another_gpu_is_a_mismatch() {
    for lists in [
        vec![(UUID_19, vec![42]), (UUID_18, vec![])],
        vec![(UUID_19, vec![42]), (UUID_18, vec![42])],
    ] {
        let mut record = record(Some(ID_18), Backend::Auto);
        let error =
            check_placement_with(&mut record, 42, &Lists::new(Ok(lists))).expect_err("mismatch");
        assert_eq!(error.code(), codes::LOCAL_AI_PLACEMENT_MISMATCH);
        assert_eq!(error.details()["configuredUuid"], UUID_18);
        assert!(error.details()["observedUuids"]
            .as_array()
            .is_some_and(|uuids| uuids.iter().any(|u| u == UUID_19)));
        assert!(record.observed_target.is_none());
    }
}

#[test]
fn an_unlisted_pid_or_failing_nvml_is_not_observed() {
    let mut record = record(Some(ID_18), Backend::Auto);
    let unlisted = Lists::new(Ok(vec![(UUID_18, vec![1, 2])]));
    assert!(matches!(
        check_placement_with(&mut record, 42, &unlisted),
        Ok(Placement::NotObserved { .. })
    ));
    let failing = Lists::new(Err("NVML could not be loaded".to_string()));
    assert!(matches!(
        check_placement_with(&mut record, 42, &failing),
        Ok(Placement::NotObserved { reason }) if reason.contains("NVML")
    ));
    assert!(record.observed_target.is_none());
}

#[test]
fn a_cpu_plan_is_checked_for_gpu_use() {
    let mut record = record(Some("cpu"), Backend::Auto);
    let clean = Lists::new(Ok(vec![(UUID_18, vec![1]), (UUID_19, vec![])]));
    assert_eq!(
        check_placement_with(&mut record, 42, &clean).expect("ok"),
        Placement::NoGpu
    );
    let dirty = Lists::new(Ok(vec![(UUID_19, vec![42])]));
    let error = check_placement_with(&mut record, 42, &dirty).expect_err("on a GPU");
    assert_eq!(error.code(), codes::LOCAL_AI_PLACEMENT_MISMATCH);
    assert!(record.observed_target.is_none());
}

#[test]
fn an_automatic_plan_is_not_checked() {
    let mut record = record(None, Backend::Auto);
    let lists = Lists::new(Ok(vec![(UUID_19, vec![42])]));
    assert!(matches!(
        check_placement_with(&mut record, 42, &lists),
        Ok(Placement::Skipped { .. })
    ));
    assert_eq!(lists.calls.load(Ordering::SeqCst), 0);
}

#[test]
fn the_real_check_without_nvml_changes_nothing() {
    // On a machine without NVIDIA's driver, the check answers NotObserved; on one with
    // it, this process is on no GPU, so it is never Confirmed or a mismatch either.
    let mut record = record(Some(ID_18), Backend::Auto);
    let outcome = check_placement(&mut record, std::process::id()).expect("no error");
    assert!(
        matches!(outcome, Placement::NotObserved { .. }),
        "{outcome:?}"
    );
    assert!(record.observed_target.is_none());
}
