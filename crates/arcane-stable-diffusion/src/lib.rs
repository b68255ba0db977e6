//! Image generation for Arcane: stable-diffusion.cpp's library, loaded from the path the
//! user registered and driven through its C API by `arcane __sd-worker`.
//!
//! * [`Library`] and [`Model`]: the library (its functions resolved by name, its version
//!   read) and one diffusion model loaded by it, with a fixed thread count.
//! * [`ImageRequest`]: OpenAI's `POST /v1/images/generations` body, checked against
//!   bounds (sides multiples of 64 up to [`MAX_SIDE`], at most [`MAX_IMAGES`] images and
//!   [`MAX_STEPS`] steps, prompts of at most [`MAX_PROMPT_CHARS`]), each refusal naming
//!   its field and value.
//! * [`Model::generate_isolated`]: one image in the generator, a child process forked
//!   with the model loaded (killed and forked again after a cancellation), cancellable by
//!   [`Cancel`], reporting each sampling step ([`Event`]); [`Model::generate_here`]
//!   does the same work in this process (the benchmark's baseline).
//! * [`encode`]: PNG, JPEG or lossless WebP.
#![warn(missing_docs)]

mod child;
mod encode;
mod error;
pub mod ffi;
mod library;
mod request;

pub use child::{Cancel, Event};
pub use encode::{encode, ImageFormat};
pub use error::Error;
pub use library::{library_version, Library, Model};
pub use request::{
    Generation, ImageRequest, DEFAULT_CFG_SCALE, DEFAULT_SIZE, DEFAULT_STEPS, MAX_CFG_SCALE,
    MAX_IMAGES, MAX_PROMPT_CHARS, MAX_SIDE, MAX_STEPS, MIN_SIDE,
};
