//! [`Engine`]: which inference engine a runtime, a record or a request means.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An inference engine Arcane can run. Serialized as `"llama.cpp"` or `"ollama"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Engine {
    /// llama.cpp's `llama-server`.
    #[serde(rename = "llama.cpp")]
    LlamaCpp,
    /// Ollama's `ollama serve`.
    #[serde(rename = "ollama")]
    Ollama,
}

impl Engine {
    /// Both engines.
    pub const ALL: [Engine; 2] = [Engine::LlamaCpp, Engine::Ollama];

    /// The engine's name, also the default runtime id: `llama.cpp` or `ollama`.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::LlamaCpp => "llama.cpp",
            Engine::Ollama => "ollama",
        }
    }

    /// The SDK's default listener URL: `http://127.0.0.1:8080` for llama.cpp,
    /// `http://127.0.0.1:11434` for Ollama.
    pub fn default_url(self) -> &'static str {
        match self {
            Engine::LlamaCpp => "http://127.0.0.1:8080",
            Engine::Ollama => "http://127.0.0.1:11434",
        }
    }

    /// The file name of the engine's server executable in an archive.
    pub fn executable_name(self) -> &'static str {
        match self {
            Engine::LlamaCpp => "llama-server",
            Engine::Ollama => "ollama",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no engine Arcane knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownEngine {
    /// The name given.
    pub value: String,
}

impl fmt::Display for UnknownEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is not an engine Arcane knows (use `llama.cpp` or `ollama`)",
            self.value
        )
    }
}

impl std::error::Error for UnknownEngine {}

impl FromStr for Engine {
    type Err = UnknownEngine;

    /// Parses `llama.cpp` (also `llama`, `llama-cpp`, `llamacpp`) or `ollama`; the error
    /// names the value.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value.trim().to_ascii_lowercase().as_str() {
            "llama.cpp" | "llama" | "llama-cpp" | "llamacpp" => Ok(Engine::LlamaCpp),
            "ollama" => Ok(Engine::Ollama),
            _ => Err(UnknownEngine {
                value: value.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_text_and_json() {
        for engine in Engine::ALL {
            assert_eq!(engine.as_str().parse::<Engine>().unwrap(), engine);
            let json = serde_json::to_string(&engine).unwrap();
            assert_eq!(json, format!("\"{}\"", engine.as_str()));
        }
        assert_eq!("LLAMA".parse::<Engine>().unwrap(), Engine::LlamaCpp);
        assert_eq!("vllm".parse::<Engine>().unwrap_err().value, "vllm");
    }
}
