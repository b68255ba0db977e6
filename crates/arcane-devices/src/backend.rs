//! [`Backend`]: the compute backend a llama.cpp runtime was built with, or that a user
//! asked for.
//!
//! The same enum serves two roles in a [`ResolveRequest`](crate::ResolveRequest):
//! `runtime_backend` is what the installed runtime can do (`Auto` = unknown), and
//! `requested_backend` is what the configuration asks for (`Auto` = no preference).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Error;

/// A llama.cpp compute backend. Serialized in lowercase (`"auto"`, `"cpu"`, `"cuda"`, …).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// No preference (as a request) or unknown (as a runtime's build).
    #[default]
    Auto,
    /// The CPU only.
    Cpu,
    /// NVIDIA CUDA.
    Cuda,
    /// Vulkan (any vendor).
    Vulkan,
    /// Apple Metal.
    Metal,
}

impl Backend {
    /// Every backend, in a stable order (for help texts and error details).
    pub const ALL: [Backend; 5] = [
        Backend::Auto,
        Backend::Cpu,
        Backend::Cuda,
        Backend::Vulkan,
        Backend::Metal,
    ];

    /// The lowercase name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
            Backend::Vulkan => "vulkan",
            Backend::Metal => "metal",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Backend {
    type Err = Error;

    /// Parses a backend name, case-insensitively; the error names the value.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let lower = value.trim().to_ascii_lowercase();
        Backend::ALL
            .into_iter()
            .find(|backend| backend.as_str() == lower)
            .ok_or_else(|| Error::UnknownBackend {
                value: value.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_name_and_round_trips_through_display() {
        for backend in Backend::ALL {
            assert_eq!(backend.to_string().parse::<Backend>().ok(), Some(backend));
            let json = serde_json::to_string(&backend).unwrap_or_default();
            assert_eq!(json, format!("\"{backend}\""));
        }
        assert_eq!("CUDA".parse::<Backend>().ok(), Some(Backend::Cuda));
    }

    #[test]
    fn unknown_name_is_an_error_naming_the_value() {
        let error = "rocm".parse::<Backend>().err().map(|e| e.to_string());
        assert!(error.is_some_and(|e| e.contains("`rocm`")));
    }
}
