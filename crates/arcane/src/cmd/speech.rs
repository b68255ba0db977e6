//! `arcane transcribe FILE` and `arcane speak "TEXT"`: speech through the running Core
//! host's front door (`/v1/audio/transcriptions`, `/v1/audio/speech`), authenticated
//! with `core.json`'s token, so they load, queue and are listed like any client's
//! request. `--model` names a gateway model (default: the host's first speech-to-text
//! or voice model is the one a request without a name is routed to, the host's
//! default, so name it when the default is a chat model).

use std::path::{Path, PathBuf};
use std::time::Duration;

use arcane_core::client::{CoreClient, Upload};
use arcane_front_door::http::Deadlines;
use arcane_report::codes;
use bytes::Bytes;
use serde_json::{json, Value};

use crate::cli::OutputMode;
use crate::config::Context;
use crate::error::{CliError, CommandError};

/// Arguments of `arcane transcribe`.
#[derive(Debug, clap::Args)]
pub struct TranscribeArgs {
    /// The audio file: WAV (any rate and channels), FLAC, MP3 or Ogg/Vorbis.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    /// The speech-to-text model (a `[[model]]` id or alias, e.g. `whisper-1`).
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,

    /// What to print: `text`, `srt` or `vtt` subtitles, `json` (`{"text"}`) or
    /// `verbose_json` (language, duration, segments with times). With `--output json`
    /// the result is always the verbose JSON.
    #[arg(long, value_name = "FORMAT", default_value = "text",
          value_parser = ["text", "srt", "vtt", "json", "verbose_json"])]
    pub format: String,

    /// The spoken language (ISO-639-1, e.g. `en`); default: detected.
    #[arg(long, value_name = "CODE")]
    pub language: Option<String>,

    /// Text that came before, to guide spelling and style.
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,

    /// Translate into English instead of transcribing (multilingual models only).
    #[arg(long)]
    pub translate: bool,

    /// Seconds to wait for the answer (default 600).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
}

/// Arguments of `arcane speak`.
#[derive(Debug, clap::Args)]
pub struct SpeakArgs {
    /// What to say (at most 4096 characters).
    #[arg(value_name = "TEXT")]
    pub text: String,

    /// Where to write the audio (written whole or not at all).
    #[arg(long, short, value_name = "FILE")]
    pub out: PathBuf,

    /// The voice model (a `[[model]]` id or alias, e.g. `tts-1`).
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,

    /// `mp3`, `opus` (Ogg Opus), `wav`, `flac` or `pcm` (16-bit little-endian mono);
    /// default: from the file's extension (`.ogg` is Opus), else `wav`.
    #[arg(long, value_name = "FORMAT", value_parser = ["mp3", "opus", "wav", "flac", "pcm"])]
    pub format: Option<String>,

    /// Speaking speed, from 0.25 to 4 (1 is the voice's own).
    #[arg(long, value_name = "SPEED", default_value_t = 1.0)]
    pub speed: f64,

    /// Seconds to wait for the answer (default 600).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
}

/// A spinner with the elapsed time on stderr while the host works (human output on a
/// terminal only; indicatif draws nothing elsewhere): a long recording takes minutes.
fn spinner(context: &Context, message: String) -> Option<indicatif::ProgressBar> {
    if context.output.mode != OutputMode::Human {
        return None;
    }
    let bar = indicatif::ProgressBar::new_spinner().with_message(message);
    if let Some(style) = crate::output::progress_style("{spinner} {msg} {elapsed}") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(120));
    Some(bar)
}

fn client(context: &Context, timeout: Option<f64>) -> Result<CoreClient, CliError> {
    let timeout = arcane_host::settings::seconds("--timeout", timeout, Duration::from_secs(600))?;
    Ok(CoreClient::from_workspace(&context.workspace)?.with_deadlines(Deadlines::uniform(timeout)))
}

/// Runs `arcane transcribe`.
pub fn transcribe(context: &Context, args: TranscribeArgs) -> Result<u8, CliError> {
    let client = client(context, args.timeout)?;
    let file = std::fs::read(&args.file).map_err(|e| {
        CommandError::new(
            if e.kind() == std::io::ErrorKind::NotFound {
                codes::ARCANE_NOT_FOUND
            } else {
                codes::ARCANE_IO
            },
            format!("cannot read the audio file `{}`: {e}", args.file.display()),
            json!({"file": args.file}),
        )
    })?;
    let human = context.output.mode == OutputMode::Human;
    let format = if human {
        args.format.as_str()
    } else {
        "verbose_json"
    };
    let mut fields = vec![("response_format".to_string(), format.to_string())];
    let optional = [
        ("model", args.model.as_deref()),
        ("language", args.language.as_deref()),
        ("prompt", args.prompt.as_deref()),
    ];
    for (name, value) in optional {
        if let Some(value) = value {
            fields.push((name.to_string(), value.to_string()));
        }
    }
    let upload = Upload {
        file_name: file_name(&args.file),
        file: Bytes::from(file),
        fields,
    };
    let path = if args.translate {
        "/v1/audio/translations"
    } else {
        "/v1/audio/transcriptions"
    };
    let waiting = spinner(
        context,
        format!(
            "transcribing {} ({})",
            args.file.display(),
            args.model.as_deref().unwrap_or("the default model")
        ),
    );
    let body = crate::cmd::core::block_on_client(context, "the transcription", async {
        client.upload(path, &upload).await.map_err(CliError::from)
    });
    if let Some(bar) = waiting {
        bar.finish_and_clear();
    }
    let body = body?;
    if human {
        let text = String::from_utf8_lossy(&body);
        let text = match serde_json::from_slice::<Value>(&body) {
            Ok(json) => serde_json::to_string_pretty(&json).unwrap_or_default(),
            Err(_) => text.trim_end().to_string(),
        };
        context.output.result(&text, &json!({}));
    } else {
        let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        context.output.result("", &value);
    }
    Ok(0)
}

/// Runs `arcane speak`.
pub fn speak(context: &Context, args: SpeakArgs) -> Result<u8, CliError> {
    let client = client(context, args.timeout)?;
    let format = args.format.clone().unwrap_or_else(|| {
        match args
            .out
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
        {
            Some(ext) if ext == "ogg" => "opus".to_string(),
            Some(ext) if arcane_audio::AudioFormat::parse(&ext).is_some() => ext,
            _ => "wav".to_string(),
        }
    });
    let mut payload = json!({
        "input": args.text,
        "voice": "default",
        "response_format": format,
        "speed": args.speed,
    });
    if let Some(model) = &args.model {
        payload["model"] = json!(model);
    }
    let waiting = spinner(
        context,
        format!(
            "speaking {} characters ({})",
            args.text.chars().count(),
            args.model.as_deref().unwrap_or("the default model")
        ),
    );
    let audio = crate::cmd::core::block_on_client(context, "the speech", async {
        client
            .post_for_bytes("/v1/audio/speech", payload)
            .await
            .map_err(CliError::from)
    });
    if let Some(bar) = waiting {
        bar.finish_and_clear();
    }
    let audio = audio?;
    arcane_files::write_atomic(&args.out, &audio, 0o644).map_err(|e| {
        CommandError::new(
            codes::ARCANE_IO,
            format!("cannot write `{}`: {e}", args.out.display()),
            json!({"out": args.out}),
        )
    })?;
    context.output.result(
        &format!(
            "wrote {} ({} bytes of {format})",
            args.out.display(),
            audio.len()
        ),
        &json!({"out": args.out, "bytes": audio.len(), "format": format}),
    );
    Ok(0)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "audio".into())
}
