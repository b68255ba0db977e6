//! `arcane imagine PROMPT --out FILE`: an image through the running Core host's front
//! door (`POST /v1/images/generations`, streamed), authenticated with `core.json`'s
//! token, so it loads, queues and is listed like any client's request. A progress bar
//! follows the sampling steps the engine reports; each image is written whole or not at
//! all. `--model` names a gateway model (default: the host's first model that draws
//! images).

use std::path::{Path, PathBuf};
use std::time::Duration;

use arcane_core::client::CoreClient;
use arcane_front_door::http::Deadlines;
use arcane_report::codes;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::cli::OutputMode;
use crate::config::Context;
use crate::error::{CliError, CommandError};

/// Arguments of `arcane imagine`.
#[derive(Debug, clap::Args)]
pub struct ImagineArgs {
    /// What to draw.
    #[arg(value_name = "PROMPT")]
    pub prompt: String,

    /// Where to write the image (with `-n 2` or more: `NAME-1.EXT`, `NAME-2.EXT`, …).
    #[arg(long, short, value_name = "FILE")]
    pub out: PathBuf,

    /// The image model (a `[[model]]` id or alias).
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,

    /// `WIDTHxHEIGHT`, each side a multiple of 64 from 64 to 1024.
    #[arg(long, value_name = "WxH", default_value = "512x512")]
    pub size: String,

    /// The seed (default: random; the one used is printed, and draws the same image
    /// again).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,

    /// Sampling steps (1 to 150).
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub steps: u32,

    /// Classifier-free guidance scale (0 to 30).
    #[arg(long, value_name = "SCALE", default_value_t = 7.0)]
    pub cfg_scale: f64,

    /// What to steer away from.
    #[arg(long, value_name = "TEXT")]
    pub negative_prompt: Option<String>,

    /// How many images (1 to 4), with seeds SEED, SEED+1, ….
    #[arg(short = 'n', long = "count", value_name = "N", default_value_t = 1)]
    pub count: u32,

    /// `png`, `jpeg` or `webp`; default: from the file's extension, else `png`.
    #[arg(long, value_name = "FORMAT", value_parser = ["png", "jpeg", "webp"])]
    pub format: Option<String>,

    /// Seconds to wait for the answer (default 600).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
}

/// An image the host sent.
struct Drawn {
    index: u64,
    seed: Value,
    bytes: Vec<u8>,
}

/// Runs `arcane imagine`.
pub fn imagine(context: &Context, args: ImagineArgs) -> Result<u8, CliError> {
    let timeout =
        arcane_host::settings::seconds("--timeout", args.timeout, Duration::from_secs(600))?;
    let client =
        CoreClient::from_workspace(&context.workspace)?.with_deadlines(Deadlines::uniform(timeout));
    let format = args.format.clone().unwrap_or_else(|| format_of(&args.out));
    let mut payload = json!({
        "prompt": args.prompt,
        "size": args.size,
        "n": args.count,
        "steps": args.steps,
        "cfg_scale": args.cfg_scale,
        "output_format": format,
        "response_format": "b64_json",
        "stream": true,
    });
    for (field, value) in [
        ("model", args.model.as_ref().map(|m| json!(m))),
        ("seed", args.seed.map(|s| json!(s))),
        (
            "negative_prompt",
            args.negative_prompt.as_ref().map(|t| json!(t)),
        ),
    ] {
        if let Some(value) = value {
            payload[field] = value;
        }
    }
    let bar = progress_bar(
        context,
        u64::from(args.steps) * u64::from(args.count.max(1)),
    );
    let mut drawn = Vec::new();
    let streamed = crate::cmd::core::block_on_client(context, "the image", async {
        client
            .post_for_events("/v1/images/generations", payload, |name, data| {
                on_event(name, data, bar.as_ref(), &mut drawn)
            })
            .await
            .map_err(CliError::from)
    });
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    streamed?;
    write(context, &args, &format, drawn)
}

/// Handles one event of the stream: a step moves the bar, an image is kept (an error
/// event ends the stream in the client).
fn on_event(
    name: &str,
    data: &Value,
    bar: Option<&indicatif::ProgressBar>,
    drawn: &mut Vec<Drawn>,
) -> bool {
    match name {
        "image_generation.step" => {
            if let (Some(bar), Some(step), Some(steps), Some(index)) = (
                bar,
                data["step"].as_u64(),
                data["steps"].as_u64(),
                data["index"].as_u64(),
            ) {
                bar.set_position(index * steps + step);
            }
            true
        }
        "image_generation.completed" => {
            let bytes = data["b64_json"]
                .as_str()
                .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok());
            if let Some(bytes) = bytes {
                drawn.push(Drawn {
                    index: data["index"].as_u64().unwrap_or(drawn.len() as u64),
                    seed: data["seed"].clone(),
                    bytes,
                });
            }
            true
        }
        _ => true,
    }
}

fn progress_bar(context: &Context, total: u64) -> Option<indicatif::ProgressBar> {
    if context.output.mode != OutputMode::Human {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total).with_message("drawing");
    if let Some(style) =
        crate::output::progress_style("{msg} [{bar:30}] step {pos}/{len} {elapsed}")
    {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    Some(bar)
}

/// Writes each image to its file and says where.
fn write(
    context: &Context,
    args: &ImagineArgs,
    format: &str,
    drawn: Vec<Drawn>,
) -> Result<u8, CliError> {
    if drawn.is_empty() {
        return Err(CommandError::new(
            codes::LOCAL_AI_REQUEST_FAILED,
            "the host's answer ended without an image",
            json!({}),
        )
        .into());
    }
    let several = drawn.len() > 1;
    let mut written = Vec::new();
    let mut lines = Vec::new();
    for image in drawn {
        let out = if several {
            numbered(&args.out, image.index + 1)
        } else {
            args.out.clone()
        };
        arcane_files::write_atomic(&out, &image.bytes, 0o644).map_err(|e| {
            CommandError::new(
                codes::ARCANE_IO,
                format!("cannot write `{}`: {e}", out.display()),
                json!({"out": out}),
            )
        })?;
        lines.push(format!(
            "wrote {} ({} bytes of {format}, seed {})",
            out.display(),
            image.bytes.len(),
            image.seed
        ));
        written.push(json!({"out": out, "bytes": image.bytes.len(), "seed": image.seed}));
    }
    context.output.result(
        &lines.join("\n"),
        &json!({"images": written, "format": format, "size": args.size}),
    );
    Ok(0)
}

/// `png`, `jpeg` or `webp` from `out`'s extension (`png` when it names none).
fn format_of(out: &Path) -> String {
    match out
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("jpg" | "jpeg") => "jpeg".into(),
        Some("webp") => "webp".into(),
        _ => "png".into(),
    }
}

/// `dir/name-N.ext` for `dir/name.ext`.
fn numbered(out: &Path, n: u64) -> PathBuf {
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match out.extension() {
        Some(ext) => format!("{stem}-{n}.{}", ext.to_string_lossy()),
        None => format!("{stem}-{n}"),
    };
    out.with_file_name(name)
}
