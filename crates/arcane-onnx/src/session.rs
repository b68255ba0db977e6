//! [`Session`]: one ONNX model opened on one execution provider, its inputs and
//! outputs described, and runs that check every input against the description before
//! ONNX Runtime sees it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use half::f16;
use ort::session::{RunOptions, Session as OrtSession};
use ort::value::{DynValue, TensorElementType, ValueType};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::tensor::{each_data, ElementType, Tensor, TensorData};
use crate::{Error, Runtime};

/// One dimension of a declared shape: a size, or a name for a dynamic one (`?` when
/// the model gives it no name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Dim {
    /// A fixed size.
    Fixed(i64),
    /// A dynamic dimension's name.
    Named(String),
}

/// A declared input or output: `{name, type, shape}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoSpec {
    /// The name.
    pub name: String,
    /// The element type's wire name.
    #[serde(rename = "type")]
    pub element_type: String,
    /// The shape; `null` when the model declares none.
    pub shape: Option<Vec<Dim>>,
}

impl IoSpec {
    /// The shape as text, e.g. `[batch, 576]` (`any` when undeclared).
    pub fn shape_text(&self) -> String {
        match &self.shape {
            None => "any".into(),
            Some(dims) => {
                let dims: Vec<String> = dims
                    .iter()
                    .map(|d| match d {
                        Dim::Fixed(n) => n.to_string(),
                        Dim::Named(name) => name.clone(),
                    })
                    .collect();
                format!("[{}]", dims.join(", "))
            }
        }
    }

    /// Whether `shape` fits the declared shape (same rank, every fixed size equal).
    pub fn accepts(&self, shape: &[i64]) -> bool {
        match &self.shape {
            None => true,
            Some(dims) => {
                dims.len() == shape.len()
                    && dims.iter().zip(shape).all(|(d, s)| match d {
                        Dim::Fixed(n) => n == s,
                        Dim::Named(_) => true,
                    })
            }
        }
    }
}

/// Which execution provider a session runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// `CPUExecutionProvider`.
    Cpu,
    /// `CUDAExecutionProvider` on device 0 of the process (the host sets
    /// `CUDA_VISIBLE_DEVICES` to exactly one GPU).
    Cuda,
}

impl Provider {
    /// ONNX Runtime's name for it.
    pub fn ort_name(self) -> &'static str {
        match self {
            Self::Cpu => "CPUExecutionProvider",
            Self::Cuda => "CUDAExecutionProvider",
        }
    }
}

/// Session options `onnx.load` accepts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionOptions {
    /// Threads inside one operator (ONNX Runtime's default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intra_op_threads: Option<usize>,
    /// Threads across operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inter_op_threads: Option<usize>,
}

impl SessionOptions {
    /// Parses `options` (`null` = defaults); an unknown key is `ARCANE_USAGE`.
    pub fn from_json(options: &Value) -> Result<SessionOptions, Error> {
        if options.is_null() {
            return Ok(SessionOptions::default());
        }
        serde_json::from_value(options.clone()).map_err(|e| {
            Error::usage(
                format!("invalid session options: {e} (known: intraOpThreads, interOpThreads)"),
                json!({"options": options}),
            )
        })
    }
}

/// A handle that stops a run in progress (ONNX Runtime's terminate flag).
#[derive(Clone, Default)]
pub struct RunCancel {
    inner: Arc<Mutex<CancelState>>,
}

#[derive(Default)]
struct CancelState {
    cancelled: bool,
    options: Option<Arc<RunOptions>>,
}

impl RunCancel {
    /// A handle that has not fired.
    pub fn new() -> RunCancel {
        RunCancel::default()
    }

    /// Stops the run (now, or as soon as it starts).
    pub fn cancel(&self) {
        let mut state = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        state.cancelled = true;
        if let Some(options) = &state.options {
            let _ = options.terminate();
        }
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .cancelled
    }

    fn attach(&self, options: Arc<RunOptions>) -> Result<(), Error> {
        let mut state = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if state.cancelled {
            return Err(Error::Cancelled);
        }
        state.options = Some(options);
        Ok(())
    }
}

/// An open ONNX session. Runs on one session take turns; runs on different sessions
/// run in parallel.
pub struct Session {
    inner: Mutex<OrtSession>,
    provider: Provider,
    inputs: Vec<IoSpec>,
    outputs: Vec<IoSpec>,
    /// Inputs and outputs whose type Arcane cannot carry, by name.
    unsupported: BTreeMap<String, String>,
    /// Whether each run hands the CPU arena's unused memory back.
    shrink_arena: bool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("provider", &self.provider)
            .field("inputs", &self.inputs)
            .field("outputs", &self.outputs)
            .finish()
    }
}

impl Session {
    /// Opens `model` on `provider`. CUDA is refused (`LOCAL_AI_EXECUTION_TARGET_UNSUPPORTED`)
    /// when the runtime has no CUDA provider, and its registration failing is an error,
    /// never a silent fall-back to the CPU.
    pub fn open(
        runtime: &Runtime,
        model: &Path,
        provider: Provider,
        options: &SessionOptions,
    ) -> Result<Session, Error> {
        if !runtime.has_provider(provider.ort_name()) {
            return Err(Error::ProviderUnavailable {
                provider: provider.ort_name().into(),
                available: runtime.providers().to_vec(),
            });
        }
        let context = format!("opening `{}`", model.display());
        let fail = |e: &dyn std::fmt::Display| Error::runtime(context.clone(), e);
        let mut builder = OrtSession::builder(runtime.environment()).map_err(|e| fail(&e))?;
        if provider == Provider::Cuda {
            let cuda = ort::ep::CUDA::default()
                .with_device_id(0)
                .build()
                .error_on_failure();
            builder = builder
                .with_execution_providers([cuda])
                .map_err(|e| fail(&e))?;
        }
        if let Some(n) = options.intra_op_threads {
            builder = builder.with_intra_threads(n).map_err(|e| fail(&e))?;
        }
        if let Some(n) = options.inter_op_threads {
            builder = builder.with_inter_threads(n).map_err(|e| fail(&e))?;
        }
        let session = builder
            .commit_from_file(model)
            .map_err(|e| Error::ModelInvalid {
                path: model.to_path_buf(),
                reason: e.to_string(),
            })?;
        let mut unsupported = BTreeMap::new();
        let mut describe = |outlets: &[ort::value::Outlet]| -> Vec<IoSpec> {
            outlets
                .iter()
                .map(|o| {
                    let spec = describe_outlet(o.name(), o.dtype());
                    if let Err(found) = &spec {
                        unsupported.insert(o.name().to_string(), found.clone());
                    }
                    spec.unwrap_or_else(|found| IoSpec {
                        name: o.name().to_string(),
                        element_type: found,
                        shape: None,
                    })
                })
                .collect()
        };
        let inputs = describe(session.inputs());
        let outputs = describe(session.outputs());
        Ok(Session {
            inner: Mutex::new(session),
            provider,
            inputs,
            outputs,
            unsupported,
            shrink_arena: false,
        })
    }

    /// Makes every later run hand the memory its CPU arena grew by back when it ends
    /// (ONNX Runtime's `memory.enable_memory_arena_shrinkage`): for a model whose
    /// memory grows with its input (a voice and its text), so one large run does not
    /// hold that memory until the session closes.
    pub fn shrink_arena_after_runs(&mut self) {
        self.shrink_arena = true;
    }

    /// The provider it runs on.
    pub fn provider(&self) -> Provider {
        self.provider
    }

    /// The declared inputs.
    pub fn inputs(&self) -> &[IoSpec] {
        &self.inputs
    }

    /// The declared outputs.
    pub fn outputs(&self) -> &[IoSpec] {
        &self.outputs
    }

    /// Checks `inputs` against the declaration: every declared input given, no other,
    /// each with its element type and a fitting shape (`ARCANE_USAGE` naming the input
    /// and the expected shape otherwise); and `outputs` (default: all) are declared.
    pub fn check(
        &self,
        inputs: &BTreeMap<String, Tensor>,
        outputs: Option<&[String]>,
    ) -> Result<Vec<String>, Error> {
        let names = |specs: &[IoSpec]| specs.iter().map(|s| s.name.clone()).collect::<Vec<_>>();
        if let Some(name) = inputs
            .keys()
            .find(|n| !self.inputs.iter().any(|s| &s.name == *n))
        {
            return Err(Error::UnknownInput {
                name: name.clone(),
                known: names(&self.inputs),
            });
        }
        for spec in &self.inputs {
            if let Some(found) = self.unsupported.get(&spec.name) {
                return Err(Error::UnsupportedType {
                    name: spec.name.clone(),
                    found: found.clone(),
                });
            }
            let Some(tensor) = inputs.get(&spec.name) else {
                return Err(Error::MissingInput {
                    name: spec.name.clone(),
                    expected_type: spec.element_type.clone(),
                    expected_shape: spec.shape_text(),
                });
            };
            if tensor.element_type().as_str() != spec.element_type {
                return Err(Error::WrongType {
                    name: spec.name.clone(),
                    expected: spec.element_type.clone(),
                    expected_shape: spec.shape_text(),
                    found: tensor.element_type().as_str().into(),
                });
            }
            if !spec.accepts(&tensor.shape) {
                return Err(Error::WrongShape {
                    name: spec.name.clone(),
                    expected: spec.shape_text(),
                    found: tensor.shape.clone(),
                });
            }
        }
        let wanted = match outputs {
            None => names(&self.outputs),
            Some(list) => {
                if let Some(name) = list
                    .iter()
                    .find(|n| !self.outputs.iter().any(|s| &s.name == *n))
                {
                    return Err(Error::UnknownOutput {
                        name: name.clone(),
                        known: names(&self.outputs),
                    });
                }
                list.to_vec()
            }
        };
        if let Some(name) = wanted.iter().find(|n| self.unsupported.contains_key(*n)) {
            return Err(Error::UnsupportedType {
                name: name.clone(),
                found: self.unsupported[name].clone(),
            });
        }
        Ok(wanted)
    }

    /// Runs the model on `inputs` after [`check`](Self::check) and returns the
    /// `outputs` asked for (default: all), by name. `cancel` stops it.
    pub fn run(
        &self,
        inputs: &BTreeMap<String, Tensor>,
        outputs: Option<&[String]>,
        cancel: &RunCancel,
    ) -> Result<BTreeMap<String, Tensor>, Error> {
        let wanted = self.check(inputs, outputs)?;
        let mut values: Vec<(String, DynValue)> = Vec::with_capacity(inputs.len());
        for (name, tensor) in inputs {
            values.push((name.clone(), to_value(name, tensor)?));
        }
        let mut options =
            RunOptions::new().map_err(|e| Error::runtime("creating run options", e))?;
        if self.shrink_arena && self.provider == Provider::Cpu {
            options
                .set("memory.enable_memory_arena_shrinkage", "cpu:0")
                .map_err(|e| Error::runtime("creating run options", e))?;
        }
        let options = Arc::new(options);
        cancel.attach(Arc::clone(&options))?;
        let mut session = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if cancel.is_cancelled() {
            return Err(Error::Cancelled);
        }
        let result = session.run_with_options(values, &*options);
        let produced = match result {
            Ok(produced) => produced,
            Err(_) if cancel.is_cancelled() => return Err(Error::Cancelled),
            Err(e) => return Err(Error::runtime("running the model", e)),
        };
        let mut out = BTreeMap::new();
        for name in wanted {
            let Some(value) = produced.get(&name) else {
                return Err(Error::runtime(
                    "running the model",
                    format!("output `{name}` was not produced"),
                ));
            };
            out.insert(name.clone(), from_value(&name, value)?);
        }
        Ok(out)
    }
}

fn element_type_of(ty: TensorElementType) -> Option<ElementType> {
    Some(match ty {
        TensorElementType::Float16 => ElementType::Float16,
        TensorElementType::Float32 => ElementType::Float32,
        TensorElementType::Float64 => ElementType::Float64,
        TensorElementType::Int8 => ElementType::Int8,
        TensorElementType::Int16 => ElementType::Int16,
        TensorElementType::Int32 => ElementType::Int32,
        TensorElementType::Int64 => ElementType::Int64,
        TensorElementType::Uint8 => ElementType::Uint8,
        TensorElementType::Uint16 => ElementType::Uint16,
        TensorElementType::Uint32 => ElementType::Uint32,
        TensorElementType::Uint64 => ElementType::Uint64,
        TensorElementType::Bool => ElementType::Bool,
        TensorElementType::String => ElementType::String,
        _ => return None,
    })
}

/// The description of one outlet, or the text of a type Arcane cannot carry.
fn describe_outlet(name: &str, dtype: &ValueType) -> Result<IoSpec, String> {
    let ValueType::Tensor {
        ty,
        shape,
        dimension_symbols,
    } = dtype
    else {
        return Err(dtype.to_string());
    };
    let element_type = element_type_of(*ty).ok_or_else(|| format!("tensor({ty})"))?;
    let dims = shape
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            if d >= 0 {
                Dim::Fixed(d)
            } else {
                let symbol = dimension_symbols.get(i).filter(|s| !s.is_empty());
                Dim::Named(symbol.cloned().unwrap_or_else(|| "?".into()))
            }
        })
        .collect();
    Ok(IoSpec {
        name: name.to_string(),
        element_type: element_type.as_str().into(),
        shape: Some(dims),
    })
}

fn to_value(name: &str, tensor: &Tensor) -> Result<DynValue, Error> {
    let fail = |e: ort::Error| Error::BadData {
        name: name.to_string(),
        reason: e.to_string(),
    };
    let shape = tensor.shape.clone();
    match &tensor.data {
        TensorData::String(v) => ort::value::Tensor::from_string_array((shape, v.as_slice()))
            .map(|t| t.into_dyn())
            .map_err(fail),
        data => each_numeric(data, shape).map_err(fail),
    }
}

fn each_numeric(data: &TensorData, shape: Vec<i64>) -> ort::Result<DynValue> {
    macro_rules! owned {
        ($v:expr) => {
            ort::value::Tensor::from_array((shape, $v.clone())).map(|t| t.into_dyn())
        };
    }
    match data {
        TensorData::Float16(v) => owned!(v),
        TensorData::Float32(v) => owned!(v),
        TensorData::Float64(v) => owned!(v),
        TensorData::Int8(v) => owned!(v),
        TensorData::Int16(v) => owned!(v),
        TensorData::Int32(v) => owned!(v),
        TensorData::Int64(v) => owned!(v),
        TensorData::Uint8(v) => owned!(v),
        TensorData::Uint16(v) => owned!(v),
        TensorData::Uint32(v) => owned!(v),
        TensorData::Uint64(v) => owned!(v),
        TensorData::Bool(v) => owned!(v),
        TensorData::String(_) => unreachable!("strings are converted by the caller"),
    }
}

fn from_value(name: &str, value: &ort::value::DynValue) -> Result<Tensor, Error> {
    let fail = |e: ort::Error| Error::runtime(format!("reading output `{name}`"), e);
    let dtype = value.dtype();
    let Some(ty) = dtype.tensor_type().and_then(element_type_of) else {
        return Err(Error::UnsupportedType {
            name: name.to_string(),
            found: dtype.to_string(),
        });
    };
    macro_rules! take {
        ($t:ty, $variant:ident) => {{
            let (shape, data) = value.try_extract_tensor::<$t>().map_err(fail)?;
            Tensor {
                shape: shape.to_vec(),
                data: TensorData::$variant(data.to_vec()),
            }
        }};
    }
    Ok(match ty {
        ElementType::Float16 => take!(f16, Float16),
        ElementType::Float32 => take!(f32, Float32),
        ElementType::Float64 => take!(f64, Float64),
        ElementType::Int8 => take!(i8, Int8),
        ElementType::Int16 => take!(i16, Int16),
        ElementType::Int32 => take!(i32, Int32),
        ElementType::Int64 => take!(i64, Int64),
        ElementType::Uint8 => take!(u8, Uint8),
        ElementType::Uint16 => take!(u16, Uint16),
        ElementType::Uint32 => take!(u32, Uint32),
        ElementType::Uint64 => take!(u64, Uint64),
        ElementType::Bool => take!(bool, Bool),
        ElementType::String => {
            let (shape, data) = value.try_extract_strings().map_err(fail)?;
            Tensor {
                shape: shape.to_vec(),
                data: TensorData::String(data),
            }
        }
    })
}

/// Used by `each_data!` users elsewhere; keeps the macro import alive here.
#[allow(dead_code)]
fn len_of(data: &TensorData) -> usize {
    each_data!(data, v => v.len())
}
