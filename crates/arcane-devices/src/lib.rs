//! The execution-device catalog (CPU, NVIDIA through NVML, other PCI GPUs) and exact target resolution into a llama.cpp launch plan.
//!
//! (Being built; see the open issue for this crate.)
#![warn(missing_docs)]
