//! ONNX Runtime for Arcane.
//!
//! * [`Runtime`]: ONNX Runtime's shared library loaded with `ort`'s dynamic loading from
//!   an explicit path (a missing or too old one is `ARCANE_PREREQUISITE_MISSING`
//!   naming the path and [`minimum_version`]), its version and execution providers.
//! * [`Session`]: a model opened on the CPU or CUDA provider ([`Provider`]), its
//!   inputs and outputs ([`IoSpec`], dynamic dimensions by name), runs that validate
//!   every input first and can be cancelled ([`RunCancel`]).
//! * [`tensor`]: tensors as JSON (`{type, shape, data}`, data an array or base64).
//! * [`model`]: the `.onnx` header (IR version, opsets, inputs, outputs) read without
//!   the runtime; [`npy`]: NumPy `.npy` files in and out.
//! * [`wire`] and [`worker`]: the frames between the Core host and a worker process,
//!   and the worker's loop (run by the `arcane` binary's hidden `__onnx-worker`).
//!
//! The crate never reads the environment, prints or exits.
#![warn(missing_docs)]

mod error;
pub mod model;
pub mod npy;
mod runtime;
mod session;
pub mod tensor;
pub mod wire;
pub mod worker;

pub use error::Error;
pub use runtime::{library_version, minimum_version, Runtime};
pub use session::{Dim, IoSpec, Provider, RunCancel, Session, SessionOptions};
pub use tensor::{ElementType, Encoding, JsonTensor, Tensor, TensorData};
