//! Runtime and model registry, and supervision of llama.cpp and Ollama servers.
//!
//! (Being built; see the open issue for this crate.)
#![warn(missing_docs)]
