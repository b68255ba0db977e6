//! `arcane model`: add (verified), list and remove GGUF and ONNX models. The rules live in
//! `arcane-registry`; this module parses, calls and renders. Its events (`registry.*`,
//! `download.*`) are rendered by `cmd::runtime::human_event`.

use std::path::PathBuf;

use arcane_registry::{AddModel, Model, Registry, Source};
use serde_json::json;

use crate::cmd::runtime::{human_bytes, table, ProgressSink};
use crate::config::Context;
use crate::error::CliError;

/// Arguments of `arcane model`.
///
/// Models are GGUF files or ONNX graphs kept in the workspace under
/// `.arcane/models/<id>/` and recorded (size, SHA-256, and for GGUF architecture,
/// parameters, context length, quantization; for ONNX IR version, opsets, inputs and
/// outputs) in `.arcane/registry.json`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: ModelCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ModelCommand {
    /// Check a GGUF model (magic, version, metadata) or an ONNX model (protobuf header:
    /// IR version, opset imports, inputs, outputs), store it in the workspace and
    /// register it with its size and SHA-256.
    ///
    /// `--file` hard-links the file when it is on the same file system as the
    /// workspace (no extra space) and copies it otherwise; `--url` downloads it and
    /// verifies it against `--sha256`.
    ///
    /// Example: `arcane model add smollm2-135m --file SmolLM2-135M-Instruct.Q4_1.gguf`,
    /// `arcane model add silero-vad --file silero_vad.onnx`
    Add(AddArgs),
    /// List the registered models (id, size, digest, architecture, parameters,
    /// quantization, context length, file).
    List,
    /// Unregister a model and delete its file from `.arcane/models/` (the file it was
    /// added from is never touched).
    Remove(RemoveArgs),
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["file", "url"])))]
struct AddArgs {
    /// The model's id (`[a-z0-9][a-z0-9._-]*`), e.g. `smollm2-135m`.
    #[arg(value_name = "ID")]
    id: String,

    /// A GGUF or ONNX file on this machine.
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,

    /// An `http(s)://` URL of a GGUF or ONNX file; needs `--sha256`.
    #[arg(long, value_name = "URL", requires = "sha256")]
    url: Option<String>,

    /// The expected SHA-256 (64 hex digits): required with `--url`, checked when
    /// given with `--file`.
    #[arg(long, value_name = "HEX")]
    sha256: Option<String>,
}

#[derive(Debug, clap::Args)]
struct RemoveArgs {
    /// The model's id (see `arcane model list`).
    #[arg(value_name = "ID")]
    id: String,

    /// Remove it even while a running Core host serves it (its next load fails).
    #[arg(long)]
    force: bool,
}

impl Args {
    /// Whether this needs an existing workspace (`list`, `remove`); only `add` creates one.
    pub fn needs_existing_workspace(&self) -> bool {
        !matches!(self.command, ModelCommand::Add(_))
    }
}

/// Runs `arcane model`.
pub fn run(context: &Context, args: Args) -> Result<u8, CliError> {
    let registry = Registry::new(&context.workspace);
    match args.command {
        ModelCommand::Add(add) => {
            let mut options = match (add.file, add.url) {
                (Some(file), _) => AddModel::file(add.id, file),
                // clap's required group guarantees `--url` when `--file` is absent.
                (None, url) => {
                    let url = url.unwrap_or_default();
                    let url = match Source::parse(&url)? {
                        Source::Url(url) => url,
                        Source::File(_) => {
                            return Err(arcane_registry::Error::InvalidUrl { url }.into());
                        }
                    };
                    AddModel::url(add.id, url, "")
                }
            };
            options.sha256 = add.sha256;
            let sink = ProgressSink::new(&context.output);
            let model = registry.add_model(&options, &sink, &context.cancel)?;
            drop(sink);
            context.output.result(
                &format!(
                    "added model `{}`: {}, sha256 {}\n  {}\n  stored at {} ({})",
                    model.id,
                    human_bytes(model.size),
                    model.sha256,
                    describe(&model),
                    model.path.display(),
                    storage(&model),
                ),
                &json!({"model": model, "kind": model.kind()}),
            );
        }
        ModelCommand::List => {
            let models = registry.models()?;
            let listed: Vec<_> = models
                .iter()
                .map(|model| {
                    let mut value = json!(model);
                    value["changed"] = json!(!Registry::model_unchanged(model));
                    value["kind"] = json!(model.kind());
                    value
                })
                .collect();
            context.output.result(
                &list_text(&models, context.output.verbose > 0),
                &json!({"models": listed}),
            );
        }
        ModelCommand::Remove(remove) => {
            let record = registry.model(&remove.id)?;
            crate::cmd::refuse_in_use(context, "model", &remove.id, &record.path, remove.force)?;
            let model = registry.remove_model(&remove.id, &context.output, &context.cancel)?;
            context.output.result(
                &format!(
                    "removed model `{}` (deleted {})",
                    model.id,
                    model.path.display()
                ),
                &json!({"model": model}),
            );
        }
    }
    Ok(0)
}

fn storage(model: &Model) -> &'static str {
    match model.storage {
        arcane_registry::Storage::HardLink => "hard link",
        arcane_registry::Storage::Copy => "copy",
        arcane_registry::Storage::Download => "downloaded",
    }
}

/// `llama, 135M parameters, Q4_1, context 8192`, for an ONNX model
/// `ONNX IR 8, opset ai.onnx 16, inputs input, state, sr`, for a whisper.cpp one
/// `whisper tiny (English only), 38M parameters, F16, 4+4 layers, 80 mels`, for a
/// Piper voice `Piper voice, espeak-ng voice en-us, 22050 Hz, …; ONNX IR …`.
fn describe(model: &Model) -> String {
    if let (Some(piper), Some(onnx)) = (&model.piper, &model.onnx) {
        return format!(
            "Piper voice, espeak-ng voice {}, {} Hz{}, {} phonemes; {}",
            piper.espeak_voice,
            piper.sample_rate,
            piper
                .quality
                .as_deref()
                .map(|q| format!(", {q} quality"))
                .unwrap_or_default(),
            piper.phonemes,
            describe_onnx(onnx)
        );
    }
    if let Some(onnx) = &model.onnx {
        return describe_onnx(onnx);
    }
    if let Some(whisper) = &model.whisper {
        return describe_whisper(whisper);
    }
    let Some(info) = &model.gguf else {
        return "unknown format".into();
    };
    let mut parts = vec![info
        .architecture
        .clone()
        .unwrap_or_else(|| "unknown architecture".into())];
    if let Some(count) = info.parameter_count {
        parts.push(format!("{} parameters", parameters(count)));
    }
    if let Some(quantization) = &info.quantization {
        parts.push(quantization.clone());
    }
    if let Some(context) = info.context_length {
        parts.push(format!("context {context}"));
    }
    parts.push(format!("GGUF v{}", info.version));
    parts.join(", ")
}

fn describe_whisper(info: &arcane_registry::WhisperInfo) -> String {
    format!(
        "whisper {} ({}), {} parameters, {}, {}+{} layers, {} mels, whisper.cpp ggml",
        info.model_type,
        if info.multilingual {
            "multilingual"
        } else {
            "English only"
        },
        parameters(info.parameter_count),
        info.quantization,
        info.n_audio_layer,
        info.n_text_layer,
        info.n_mels
    )
}

fn describe_onnx(info: &arcane_onnx::model::OnnxInfo) -> String {
    let opsets: Vec<String> = info
        .opsets
        .iter()
        .map(|o| format!("{} {}", o.domain, o.version))
        .collect();
    let names = |specs: &[arcane_onnx::IoSpec]| {
        specs
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "ONNX IR {}, opset {}, inputs {}, outputs {}",
        info.ir_version,
        opsets.join(" + "),
        names(&info.inputs),
        names(&info.outputs)
    )
}

/// `135M`, `7.2B`, `950K`.
fn parameters(count: u64) -> String {
    match count {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{}M", (n as f64 / 1e6).round()),
        n if n >= 1_000 => format!("{}K", (n as f64 / 1e3).round()),
        n => n.to_string(),
    }
}

fn list_text(models: &[Model], full_digest: bool) -> String {
    if models.is_empty() {
        return "no models registered; add one with `arcane model add ID --file PATH`".to_string();
    }
    let rows: Vec<[String; 8]> = models
        .iter()
        .map(|m| {
            let digest = if full_digest {
                m.sha256.clone()
            } else {
                m.sha256.chars().take(12).collect()
            };
            [
                m.id.clone(),
                human_bytes(m.size),
                digest,
                match (&m.gguf, &m.onnx, &m.whisper) {
                    (Some(g), _, _) => g.architecture.clone().unwrap_or_else(|| "-".into()),
                    (None, Some(_), _) if m.piper.is_some() => "piper-voice".into(),
                    (None, Some(_), _) => "onnx".into(),
                    (None, None, Some(_)) => "whisper".into(),
                    (None, None, None) => "-".into(),
                },
                m.gguf
                    .as_ref()
                    .and_then(|g| g.parameter_count)
                    .or(m.whisper.as_ref().map(|w| w.parameter_count))
                    .map(parameters)
                    .unwrap_or_else(|| "-".into()),
                m.gguf
                    .as_ref()
                    .and_then(|g| g.quantization.clone())
                    .or(m.whisper.as_ref().map(|w| w.quantization.clone()))
                    .unwrap_or_else(|| "-".into()),
                m.gguf
                    .as_ref()
                    .and_then(|g| g.context_length)
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "-".into()),
                m.path.display().to_string(),
            ]
        })
        .collect();
    let mut text = table(
        &[
            "ID", "SIZE", "SHA-256", "ARCH", "PARAMS", "QUANT", "CONTEXT", "FILE",
        ],
        &rows,
    );
    for model in models.iter().filter(|m| !Registry::model_unchanged(m)) {
        text.push_str(&format!(
            "\nwarning: `{}` changed since it was added (its file was modified or replaced); the SHA-256 above is the registered one. Re-add it: `arcane model remove {}` then `arcane model add {} --file {}`",
            model.id, model.id, model.id, model.source
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_read_like_model_names() {
        assert_eq!(parameters(134_515_008), "135M");
        assert_eq!(parameters(7_241_732_096), "7.2B");
        assert_eq!(parameters(4096), "4K");
    }
}
