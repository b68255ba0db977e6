//! ONNX Runtime sessions: not a server but Arcane's own worker processes (the `onnx`
//! service of the Core host), on a runtime that is a library (`arcane runtime add onnx
//! --library PATH`). The worker has no port at all; it talks over pipes to the Core.

use crate::engine::{DevicePlan, EngineKind, ModelFormat, RuntimeLibrary, Starts};

/// The directory under `.arcane` of its workers' ownership records.
pub(crate) const WORKER_RECORDS: &str = "onnx-workers";

/// An ONNX graph (a protobuf `ModelProto`).
pub(crate) const GRAPH: ModelFormat = ModelFormat {
    id: "onnx",
    label: "ONNX",
    bundled: false,
    companions: &[],
};

/// The ONNX descriptor.
#[derive(Debug)]
pub(crate) struct Onnx;

impl EngineKind for Onnx {
    fn id(&self) -> &'static str {
        "onnx"
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["onnxruntime"]
    }

    fn starts(&self) -> Starts {
        Starts::Worker
    }

    fn device_plan(&self) -> DevicePlan {
        // Sessions choose their execution provider per target (CPU, or CUDA by device).
        DevicePlan::EnvOnly
    }

    fn runtime_library(&self) -> Option<RuntimeLibrary> {
        Some(RuntimeLibrary {
            label: "ONNX Runtime",
            file: "libonnxruntime.so",
            plugins: "libonnxruntime_providers",
            variable: "ARCANE_ONNXRUNTIME",
        })
    }

    fn formats(&self) -> &'static [ModelFormat] {
        &[GRAPH]
    }
}
