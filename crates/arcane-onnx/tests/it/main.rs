//! The library against the real ONNX Runtime (`ARCANE_ONNXRUNTIME`) and the real
//! Silero VAD model (`ARCANE_SILERO_VAD`), both provisioned by `scripts/provision.sh`.
//! A test fails, naming the variable, when one is absent (`scripts/test.sh` sets them).

use std::collections::BTreeMap;
use std::path::PathBuf;

use arcane_onnx::model::read_onnx;
use arcane_onnx::{Dim, Provider, RunCancel, Runtime, Session, SessionOptions, Tensor, TensorData};
use arcane_report::{codes, Diagnostic};

/// A provisioned part's path, from `var`; fails the test naming it when unset.
#[allow(clippy::disallowed_methods)]
fn env_path(var: &str) -> PathBuf {
    let value = std::env::var_os(var).unwrap_or_else(|| {
        panic!("{var} is not set: run the tests through `./scripts/test.sh` (it provisions what they drive)")
    });
    PathBuf::from(value)
}

fn runtime() -> &'static Runtime {
    static RUNTIME: std::sync::OnceLock<Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        Runtime::load(&env_path("ARCANE_ONNXRUNTIME")).expect("the provisioned runtime loads")
    })
}

#[test]
fn the_runtime_reports_its_version_and_the_cpu_provider() {
    let runtime = runtime();
    assert!(runtime.version().starts_with("1."), "{}", runtime.version());
    assert!(
        runtime.has_provider("CPUExecutionProvider"),
        "{:?}",
        runtime.providers()
    );
}

#[test]
fn a_missing_or_foreign_library_is_a_prerequisite_error_naming_path_and_minimum() {
    let missing =
        arcane_onnx::library_version("/nonexistent/libonnxruntime.so.1.31.1".as_ref()).unwrap_err();
    assert_eq!(missing.code(), codes::ARCANE_PREREQUISITE_MISSING);
    let text = missing.to_string();
    assert!(
        text.contains("/nonexistent/libonnxruntime.so.1.31.1"),
        "{text}"
    );
    assert!(text.contains(&arcane_onnx::minimum_version()), "{text}");
    // A real shared library that is not ONNX Runtime.
    let libc = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/libc.so.6",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.is_file());
    if let Some(libc) = libc {
        let foreign = arcane_onnx::library_version(&libc).unwrap_err();
        assert_eq!(foreign.code(), codes::ARCANE_PREREQUISITE_MISSING);
        assert!(foreign.to_string().contains("OrtGetApiBase"), "{foreign}");
    }
}

#[test]
fn silero_is_described_by_its_header_and_by_the_session_alike() {
    let runtime = runtime();
    let model = env_path("ARCANE_SILERO_VAD");
    let info = read_onnx(&model).unwrap();
    assert!(info.ir_version >= 7, "{info:?}");
    assert!(
        info.opsets
            .iter()
            .any(|o| o.domain == "ai.onnx" && o.version >= 15),
        "{info:?}"
    );
    let session =
        Session::open(runtime, &model, Provider::Cpu, &SessionOptions::default()).unwrap();
    let names =
        |specs: &[arcane_onnx::IoSpec]| specs.iter().map(|s| s.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&info.inputs), names(session.inputs()));
    assert_eq!(names(&info.outputs), names(session.outputs()));
    let input = session.inputs().iter().find(|s| s.name == "input").unwrap();
    assert_eq!(input.element_type, "float32");
    assert!(
        matches!(input.shape.as_deref(), Some([Dim::Named(_), Dim::Named(_)])),
        "{input:?}"
    );

    // One frame of silence: a probability, and the state carried out.
    let mut inputs = BTreeMap::new();
    inputs.insert(
        "input".to_string(),
        Tensor {
            shape: vec![1, 576],
            data: TensorData::Float32(vec![0.0; 576]),
        },
    );
    inputs.insert(
        "state".to_string(),
        Tensor {
            shape: vec![2, 1, 128],
            data: TensorData::Float32(vec![0.0; 256]),
        },
    );
    inputs.insert(
        "sr".to_string(),
        Tensor {
            shape: vec![],
            data: TensorData::Int64(vec![16000]),
        },
    );
    let out = session.run(&inputs, None, &RunCancel::new()).unwrap();
    let TensorData::Float32(p) = &out["output"].data else {
        panic!("{out:?}")
    };
    assert!(p[0] < 0.5, "silence scored {}", p[0]);
    assert_eq!(out["stateN"].shape, vec![2, 1, 128]);

    // A wrong shape names the input and the expected shape.
    inputs.insert(
        "state".to_string(),
        Tensor {
            shape: vec![2, 128],
            data: TensorData::Float32(vec![0.0; 256]),
        },
    );
    let e = session.run(&inputs, None, &RunCancel::new()).unwrap_err();
    assert_eq!(e.code(), codes::ARCANE_USAGE);
    assert!(
        e.to_string().contains("input `state` must have shape [2, "),
        "{e}"
    );

    // A cancelled run does not start.
    let cancel = RunCancel::new();
    cancel.cancel();
    inputs.insert(
        "state".to_string(),
        Tensor {
            shape: vec![2, 1, 128],
            data: TensorData::Float32(vec![0.0; 256]),
        },
    );
    assert_eq!(
        session.run(&inputs, None, &cancel).unwrap_err().code(),
        codes::ARCANE_CANCELLED
    );
}
