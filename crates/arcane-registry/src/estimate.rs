//! What a model needs in memory, estimated before it loads: the number placement
//! decides with (a device's `memory` budget, eviction) and `arcane load --dry-run`
//! explains, compared with what the engine really holds once it runs (`arcane ps`).
//!
//! How is the kind's ([`MemoryModel`]): for a GGUF language model the parts llama.cpp
//! allocates, read from the model's header and the engine's arguments; for the other
//! kinds the file and working memory measured on their workers. For SmolLM2-135M
//! (Q4_1) llama-server holds 181 MB with `-c 2048` and 505 MB with `-c 16384`; this
//! estimates 190 MB and 520 MB.

use std::path::Path;

use arcane_workspace::MemoryModel;
use serde_json::{json, Value};

/// The compute buffers of one batch, per embedding dimension of a token: llama.cpp's
/// graph for a batch of 512 tokens holds about 16 activations of 4 bytes each.
const COMPUTE_PER_EMBEDDING: u64 = 512 * 4 * 16;

/// llama-server's own memory (the program, its libraries, its HTTP threads).
const GGUF_RUNTIME: u64 = 24 << 20;

/// A model's memory need, in parts (bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// The weights (the model file).
    pub weights: u64,
    /// The key/value cache of the context.
    pub cache: u64,
    /// Compute buffers and working memory.
    pub compute: u64,
    /// The engine process itself.
    pub runtime: u64,
    /// The context the cache holds, in tokens (GGUF models).
    pub context: Option<u64>,
}

impl MemoryEstimate {
    /// The whole need.
    pub fn total(&self) -> u64 {
        self.weights + self.cache + self.compute + self.runtime
    }

    /// `{bytes, weights, cache, compute, runtime, context}`.
    pub fn json(&self) -> Value {
        json!({
            "bytes": self.total(),
            "weights": self.weights,
            "cache": self.cache,
            "compute": self.compute,
            "runtime": self.runtime,
            "context": self.context,
        })
    }
}

/// The estimate for `file` served by a kind of `model` with `args`, `parallel` requests
/// at once. A file that cannot be read estimates as nothing (its load then fails and
/// says why).
pub fn estimate(
    model: MemoryModel,
    file: &Path,
    args: &[String],
    parallel: usize,
) -> MemoryEstimate {
    let size = std::fs::metadata(file).map_or(0, |m| m.len());
    match model {
        MemoryModel::Gguf => match crate::read_gguf(file) {
            Ok(info) => gguf(&info, size, args),
            Err(_) => file_only(size, 10, 1, 0),
        },
        MemoryModel::File {
            compute_percent,
            per_request,
            runtime,
        } => {
            let copies = if per_request {
                parallel.max(1) as u64
            } else {
                1
            };
            file_only(size, compute_percent, copies, runtime)
        }
    }
}

fn file_only(size: u64, percent: u64, copies: u64, runtime: u64) -> MemoryEstimate {
    MemoryEstimate {
        weights: size,
        compute: size.saturating_mul(percent) / 100 * copies,
        runtime,
        ..MemoryEstimate::default()
    }
}

fn gguf(info: &crate::GgufInfo, size: u64, args: &[String]) -> MemoryEstimate {
    let context = arcane_workspace::context_arg(args)
        .or(info.context_length)
        .unwrap_or(4096);
    let f16_cache = info.kv_cache_bytes(context).unwrap_or(0);
    let cache = f16_cache * cache_eighths(args) / 16;
    let compute = info
        .embedding_length
        .map_or(size / 10, |embedding| embedding * COMPUTE_PER_EMBEDDING);
    MemoryEstimate {
        weights: size,
        cache,
        compute,
        runtime: GGUF_RUNTIME,
        context: Some(context),
    }
}

/// The key and value caches' sizes against f16's, in eighths each (summed: 16 is two
/// f16 caches), from `-ctk`/`--cache-type-k` and `-ctv`/`--cache-type-v`.
fn cache_eighths(args: &[String]) -> u64 {
    let eighths = |names: &[&str]| -> u64 {
        let value = args
            .iter()
            .position(|a| names.contains(&a.as_str()))
            .and_then(|i| args.get(i + 1))
            .map(String::as_str);
        match value {
            Some("f32") => 16,
            Some("q8_0") => 4,
            Some("q5_0" | "q5_1") => 3,
            Some("q4_0" | "q4_1" | "iq4_nl") => 2,
            _ => 8,
        }
    };
    eighths(&["-ctk", "--cache-type-k"]) + eighths(&["-ctv", "--cache-type-v"])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smol_like() -> crate::GgufInfo {
        crate::GgufInfo {
            block_count: Some(30),
            embedding_length: Some(576),
            head_count: Some(9),
            head_count_kv: Some(3),
            context_length: Some(8192),
            ..crate::GgufInfo::default()
        }
    }

    #[test]
    fn a_gguf_needs_its_weights_its_context_and_its_buffers() {
        let args = |c: &str| vec!["-c".to_string(), c.to_string()];
        let small = gguf(&smol_like(), 98_362_432, &args("2048"));
        // 30 layers × 2048 tokens × (192 + 192) values × 2 bytes.
        assert_eq!(small.cache, 30 * 2048 * 384 * 2);
        assert_eq!(small.context, Some(2048));
        let large = gguf(&smol_like(), 98_362_432, &args("16384"));
        assert_eq!(large.cache, small.cache * 8);
        // Measured: 181.5 MB and 504.5 MB of RSS.
        for (estimate, measured) in [(small, 181_528_000.0), (large, 504_508_000.0)] {
            let ratio = estimate.total() as f64 / measured;
            assert!((0.9..1.1).contains(&ratio), "{estimate:?}: {ratio}");
        }
        // The trained context when `-c` is absent, a quarter with q4_0 caches.
        assert_eq!(gguf(&smol_like(), 0, &[]).context, Some(8192));
        let quantized: Vec<String> = ["-c", "2048", "-ctk", "q4_0", "-ctv", "q4_0"]
            .map(String::from)
            .to_vec();
        assert_eq!(gguf(&smol_like(), 0, &quantized).cache, small.cache / 4);
    }

    #[test]
    fn other_kinds_need_their_file_and_measured_working_memory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("voice.onnx");
        std::fs::write(&file, vec![0u8; 1000]).unwrap();
        let model = MemoryModel::File {
            compute_percent: 150,
            per_request: true,
            runtime: 7,
        };
        let one = estimate(model, &file, &[], 1);
        assert_eq!((one.weights, one.compute, one.runtime), (1000, 1500, 7));
        assert_eq!(estimate(model, &file, &[], 2).compute, 3000);
        assert_eq!(estimate(model, &dir.path().join("gone"), &[], 1).total(), 7);
    }
}
