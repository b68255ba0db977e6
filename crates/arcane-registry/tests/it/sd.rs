//! stable-diffusion.cpp's files: the provisioned SDXS model registered as a diffusion
//! model (and a truncated copy refused), its library registered with the version it
//! reports (and another library refused).

use arcane_registry::{AddModel, Engine, Registry};
use arcane_report::{codes, CancelToken, Diagnostic, NullSink};
use arcane_workspace::formats::DIFFUSION;

use crate::support::*;

/// The tensor count and element total of a safetensors file, read here with
/// `serde_json` alone, independently of the code under test.
fn count_tensors(path: &std::path::Path) -> (u64, u64) {
    use std::io::Read;
    let mut file = std::fs::File::open(path).unwrap();
    let mut length = [0u8; 8];
    file.read_exact(&mut length).unwrap();
    let mut header = vec![0u8; u64::from_le_bytes(length) as usize];
    file.read_exact(&mut header).unwrap();
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).unwrap();
    let tensors = header.iter().filter(|(name, _)| *name != "__metadata__");
    tensors.fold((0, 0), |(count, elements), (_, tensor)| {
        let shape = tensor["shape"].as_array().unwrap();
        let product: u64 = shape.iter().map(|d| d.as_u64().unwrap()).product();
        (count + 1, elements + product)
    })
}

#[test]
fn the_provisioned_sdxs_model_is_registered_as_a_diffusion_model() {
    let source = sd_model();
    assert_eq!(arcane_registry::format_of_file(&source), Some(DIFFUSION));
    // The workspace is on the model's file system: it is hard-linked, not copied.
    let dir = tempdir();
    let model = Registry::new(dir.path())
        .add_model(
            &AddModel::file("sdxs", &source),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
    assert_eq!(model.kind(), "diffusion");
    assert_eq!(model.format(), Some(DIFFUSION));
    let info = model.diffusion().expect("a diffusion record");
    let (tensors, elements) = count_tensors(&source);
    assert_eq!(
        (info.tensor_count, info.parameter_count),
        (tensors, elements)
    );
    assert_eq!(info.architecture, "SDXS");
    assert_eq!(info.container, "safetensors");
    assert_eq!(info.dtype, "F16");
    assert!(info.taesd && !info.vae, "{info:?}");
    let summary = model.summary();
    assert_eq!(summary.family, "diffusion");
    assert_eq!(summary.parameters, Some(elements));
    assert!(
        summary.description.starts_with("SDXS, ") && summary.description.ends_with("TAESD"),
        "{}",
        summary.description
    );
}

#[test]
fn a_truncated_copy_of_the_sdxs_model_is_refused_naming_its_check() {
    use std::io::Read;
    let dir = tempdir();
    let copy = dir.path().join("sdxs-partial.safetensors");
    let mut head = Vec::new();
    std::fs::File::open(sd_model())
        .unwrap()
        .take(1 << 20)
        .read_to_end(&mut head)
        .unwrap();
    std::fs::write(&copy, &head).unwrap();
    assert_eq!(arcane_registry::format_of_file(&copy), Some(DIFFUSION));
    let workspace = dir.path().join("ws");
    let error = Registry::new(&workspace)
        .add_model(
            &AddModel::file("partial", &copy),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap_err();
    assert_eq!(error.code(), codes::LOCAL_AI_MODEL_INVALID);
    let details = error.details();
    assert_eq!(details["check"], "SAFETENSORS_TRUNCATED", "{details}");
    assert_eq!(details["format"], "diffusion");
    assert_eq!(details["size"], 1 << 20);
    assert!(details["tensor"].is_string(), "{details}");
    assert!(error.to_string().contains("sdxs-partial"), "{error}");
    assert!(
        !workspace.join(".arcane").exists(),
        "nothing is created for a refused file"
    );
}

#[test]
fn the_stable_diffusion_library_is_registered_with_the_version_it_reports() {
    let library = sd_library();
    let dir = tempdir();
    let registry = Registry::new(dir.path());
    let runtime = registry
        .add_library_runtime(
            Engine::StableDiffusion,
            &library,
            None,
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
    assert_eq!(runtime.id, "stable-diffusion.cpp");
    assert_eq!(runtime.library, std::fs::canonicalize(&library).unwrap());
    assert!(!runtime.version.is_empty());
    assert_eq!(
        runtime.version,
        arcane_stable_diffusion::library_version(&library).unwrap()
    );
    let default = registry
        .default_library_runtime(Engine::StableDiffusion)
        .unwrap();
    assert_eq!(default, Some(runtime));
    assert_eq!(registry.library_runtimes(Engine::Onnx).unwrap(), vec![]);
}

#[test]
fn a_library_that_is_not_stable_diffusion_cpps_is_refused() {
    let libc = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/aarch64-linux-gnu/libc.so.6",
    ]
    .into_iter()
    .map(std::path::PathBuf::from)
    .find(|p| p.exists())
    .expect("no libc.so.6 to load");
    let dir = tempdir();
    let registry = Registry::new(dir.path());
    let error = registry
        .add_library_runtime(
            Engine::StableDiffusion,
            &libc,
            None,
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_PREREQUISITE_MISSING);
    // stable-diffusion.cpp's loader refused it, not ONNX Runtime's.
    assert!(error.to_string().contains("sd_version"), "{error}");
    assert_eq!(
        registry.library_runtimes(Engine::StableDiffusion).unwrap(),
        vec![]
    );
}
