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

/// One line from the model's format reader: `llama, 135M parameters, Q4_1, context
/// 8192, GGUF v3` for a GGUF model, the format's own facts for the others.
fn describe(model: &Model) -> String {
    model.summary().description
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
            let summary = m.summary();
            [
                m.id.clone(),
                human_bytes(m.size),
                digest,
                summary.family,
                summary
                    .parameters
                    .map(arcane_registry::human_count)
                    .unwrap_or_else(|| "-".into()),
                summary.quantization.unwrap_or_else(|| "-".into()),
                summary
                    .context
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
