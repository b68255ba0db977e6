//! Tests of `arcane devices`: the real binary, with fixture inventories and with the
//! real probe of this machine.

use std::path::PathBuf;

use crate::support::{json, run, stderr, stdout, TestWorkspace};

fn inventory(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../arcane-devices/tests/fixtures")
        .join(name)
}

const ID_18: &str = "nvidia-gpu-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60718";
const ID_19: &str = "nvidia-gpu-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60719";

#[test]
fn devices_prints_the_inventory_catalog_as_json() {
    let ws = TestWorkspace::new();
    let out = run(ws
        .arcane()
        .args(["devices", "--output", "json", "--inventory"])
        .arg(inventory("two-same-model-gpus.json")));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // What is printed is the inventory itself: it reads back into the same catalog.
    let printed =
        arcane_devices::Catalog::from_json(&stdout(&out)).expect("printed catalog is an inventory");
    let expected =
        arcane_devices::Catalog::from_inventory_file(&inventory("two-same-model-gpus.json"))
            .expect("fixture");
    assert_eq!(printed, expected);
    assert_eq!(
        json(&out)["devices"][1]["addresses"]["uuid"],
        "GPU-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60719"
    );
}

#[test]
fn devices_human_output_lists_ids_and_issues() {
    let ws = TestWorkspace::new();
    let out = run(ws
        .arcane()
        .args(["devices", "--inventory"])
        .arg(inventory("unidentified-gpu.json")));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains(": partial"), "{text}");
    assert!(
        text.contains("nvidia-gpu-3f2a9c1e-0b4d-4e6f-8a9b-0c1d2e3f4a5b"),
        "{text}"
    );
    assert!(text.contains("(no id)"), "{text}");
    assert!(text.contains("identity/identity-unresolved"), "{text}");
}

#[test]
fn the_real_probe_lists_the_cpu_and_succeeds() {
    let ws = TestWorkspace::new();
    let out = run(ws
        .arcane()
        .args(["devices", "--refresh", "--output", "json"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let value = json(&out);
    let devices = value["devices"].as_array().expect("devices");
    assert!(devices
        .iter()
        .any(|d| d["deviceId"] == "cpu" && d["present"] == true));
    let has_nvml_gpu = devices.iter().any(|d| d["identitySource"] == "nvml-uuid");
    if !has_nvml_gpu {
        assert_eq!(value["state"], "partial", "{value:#}");
        assert!(value["issues"]
            .as_array()
            .is_some_and(|issues| issues.iter().any(|i| i["source"] == "gpu")));
    }
}

#[test]
fn resolve_pins_each_of_two_identical_gpus_by_its_own_uuid() {
    for (id, uuid) in [
        (ID_18, "GPU-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60718"),
        (ID_19, "GPU-5e1b7c2a-93d4-4f0e-a1b2-c3d4e5f60719"),
    ] {
        let ws = TestWorkspace::new();
        let out = run(ws
            .arcane()
            .args([
                "devices",
                "resolve",
                id,
                "--runtime-backend",
                "cuda",
                "--output",
                "json",
                "--inventory",
            ])
            .arg(inventory("two-same-model-gpus.json")));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let plan = json(&out);
        assert_eq!(plan["env"]["CUDA_VISIBLE_DEVICES"], uuid);
        assert_eq!(plan["env"]["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
        assert_eq!(plan["env"]["GGML_VK_VISIBLE_DEVICES"], "");
        assert_eq!(
            plan["args"],
            serde_json::json!([
                "--device",
                "CUDA0",
                "--split-mode",
                "none",
                "--main-gpu",
                "0",
                "--gpu-layers",
                "all"
            ])
        );
        assert_eq!(plan["envRemove"], serde_json::json!(["GGML_CUDA_DEVICES"]));
        assert_eq!(plan["execution"]["resolution"], "matched");
        assert_eq!(plan["execution"]["observedTarget"], serde_json::Value::Null);
        assert_eq!(plan["execution"]["fallback"], false);
    }
}

#[test]
fn resolve_human_output_shows_args_and_env() {
    let ws = TestWorkspace::new();
    let out = run(ws
        .arcane()
        .args(["devices", "--inventory"])
        .arg(inventory("one-gpu.json"))
        .args(["resolve", "cpu"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("matched"), "{text}");
    assert!(text.contains("--device none --gpu-layers 0"), "{text}");
    assert!(text.contains("CUDA_VISIBLE_DEVICES=\"\""), "{text}");
}

fn error_of(out: &std::process::Output) -> serde_json::Value {
    json(out)["error"].clone()
}

#[test]
fn resolve_refuses_unknown_and_vanished_targets_with_exit_1() {
    for (fixture, target) in [
        (
            "two-same-model-gpus.json",
            "nvidia-gpu-00000000-0000-0000-0000-000000000000",
        ),
        (
            "gpu-disappeared.json",
            "nvidia-gpu-3f2a9c1e-0b4d-4e6f-8a9b-0c1d2e3f4a5b",
        ),
    ] {
        let ws = TestWorkspace::new();
        let out = run(ws
            .arcane()
            .args([
                "devices",
                "resolve",
                target,
                "--runtime-backend",
                "cuda",
                "--output",
                "json",
                "--inventory",
            ])
            .arg(inventory(fixture)));
        assert_eq!(out.status.code(), Some(1), "{fixture}: {}", stdout(&out));
        let error = error_of(&out);
        assert_eq!(
            error["code"], "LOCAL_AI_EXECUTION_TARGET_UNAVAILABLE",
            "{fixture}"
        );
        assert_eq!(error["details"]["reason"], "device-not-present");
        assert_eq!(error["details"]["execution"]["fallback"], false);
    }
}

#[test]
fn resolve_refuses_gpu_targets_the_backend_cannot_drive() {
    for extra in [
        vec!["--runtime-backend", "cpu"],
        vec![],
        vec!["--runtime-backend", "cuda", "--backend", "cpu"],
    ] {
        let ws = TestWorkspace::new();
        let out = run(ws
            .arcane()
            .args(["devices", "resolve", ID_18, "--output", "json"])
            .args(&extra)
            .arg("--inventory")
            .arg(inventory("two-same-model-gpus.json")));
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {}", stdout(&out));
        let error = error_of(&out);
        assert_eq!(
            error["code"], "LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED",
            "{extra:?}"
        );
        assert_eq!(error["details"]["reason"], "backend-mismatch", "{extra:?}");
    }
}

#[test]
fn resolve_without_nvml_refuses_gpu_targets_in_human_mode_too() {
    let ws = TestWorkspace::new();
    let out = run(ws
        .arcane()
        .args([
            "devices",
            "resolve",
            ID_18,
            "--runtime-backend",
            "cuda",
            "--inventory",
        ])
        .arg(inventory("nvml-absent.json")));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).is_empty(),
        "no plan on stdout: {}",
        stdout(&out)
    );
    insta::assert_snapshot!("devices_resolve_gpu_without_nvml", ws.redact(&stderr(&out)));
}

#[test]
fn a_bad_inventory_is_a_usage_error() {
    let ws = TestWorkspace::new();
    let bad = ws.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"schemaVersion": 1, "platform": "linux", "state": "ready", "devices": [], "extra": 1}"#,
    )
    .expect("write");
    let out = run(ws
        .arcane()
        .args(["devices", "--output", "json", "--inventory"])
        .arg(&bad));
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    insta::assert_snapshot!(
        "devices_bad_inventory_json",
        ws.redactions().json(&json(&out))
    );

    let out = run(ws
        .arcane()
        .args(["devices", "--output", "json", "--inventory"])
        .arg(ws.path().join("missing.json")));
    assert_eq!(out.status.code(), Some(1));
    insta::assert_snapshot!(
        "devices_missing_inventory_json",
        ws.redactions().json(&json(&out))
    );
}

#[test]
fn an_unknown_backend_is_a_usage_error_naming_it() {
    let ws = TestWorkspace::new();
    let out = run(ws
        .arcane()
        .args(["devices", "resolve", "cpu", "--backend", "rocm"]));
    assert_eq!(out.status.code(), Some(2));
    insta::assert_snapshot!("devices_unknown_backend", ws.redact(&stderr(&out)));
}

#[test]
fn check_placement_of_a_process_without_a_gpu_is_not_a_mismatch() {
    let ws = TestWorkspace::new();
    let out = run(ws.arcane().args([
        "devices",
        "check-placement",
        "cpu",
        "--pid",
        &std::process::id().to_string(),
        "--output",
        "json",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let value = json(&out);
    // No NVML here: not observed. With NVML: this test process is on no GPU.
    assert!(
        value["placement"] == "not-observed" || value["placement"] == "no-gpu",
        "{value:#}"
    );
    assert_eq!(
        value["execution"]["observedTarget"],
        serde_json::Value::Null
    );
}

/// Kills and reaps the child when dropped, also on panic.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn health_status(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.lines().next().map(str::to_string)
}

#[test]
fn the_real_llama_server_accepts_the_cpu_plan() {
    let server = crate::support::llama_server();
    let model = crate::support::smollm2();
    let ws = TestWorkspace::new();
    let out = run(ws
        .arcane()
        .args(["devices", "resolve", "cpu", "--output", "json"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let plan = json(&out);

    let port = crate::serve::free_port();
    let log = ws.path().join("llama-server.log");
    let mut command = std::process::Command::new(&server);
    command
        .args(["--host", "127.0.0.1", "--port", &port.to_string(), "-m"])
        .arg(&model)
        .stdout(std::fs::File::create(&log).expect("log"))
        .stderr(std::fs::File::create(ws.path().join("llama-server.err")).expect("log"));
    for arg in plan["args"].as_array().expect("args") {
        command.arg(arg.as_str().expect("string arg"));
    }
    for (name, value) in plan["env"].as_object().expect("env") {
        command.env(name, value.as_str().expect("string value"));
    }
    let mut child = KillOnDrop(command.spawn().expect("spawn llama-server"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        if health_status(port).is_some_and(|line| line.contains(" 200")) {
            break;
        }
        if let Ok(Some(status)) = child.0.try_wait() {
            panic!(
                "llama-server exited with {status} on the CPU plan:\n{}",
                std::fs::read_to_string(ws.path().join("llama-server.err")).unwrap_or_default()
            );
        }
        assert!(
            std::time::Instant::now() < deadline,
            "llama-server did not become ready on the CPU plan"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Ready means llama.cpp accepted `--device none --gpu-layers 0` (an unknown device
    // or a bad layer count makes it exit at once) under the GPU-hiding environment.
}
