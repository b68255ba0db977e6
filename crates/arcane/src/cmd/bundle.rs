//! `arcane bundle build|verify`: assemble a portable bundle from an app directory and
//! the workspace registry, and verify one byte for byte (`arcane-bundle`).

use std::path::PathBuf;
use std::sync::Mutex;

use arcane_bundle::{AppOverrides, BuildRequest, RuntimeRequest, VerifyOptions, VerifyReport};
use arcane_report::event_types;
use arcane_report::{codes, Event, EventSink};
use clap::Subcommand;
use serde_json::json;

use crate::cli::OutputMode;
use crate::config::Context;
use crate::error::{exit_code, CliError, CommandError};
use crate::output::Output;

/// Arguments of `arcane bundle`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: BundleCommand,
}

/// `arcane bundle` subcommands.
#[derive(Debug, Subcommand)]
pub enum BundleCommand {
    /// Build a bundle: the app, runtimes and models from the workspace registry, and
    /// this `arcane` as the launcher, in a fresh directory.
    ///
    /// The output is assembled in a temporary sibling and renamed into place when
    /// complete; an existing `--out` is never touched. The workspace lock is held only
    /// while the registry is read. Ctrl-C removes what the build created.
    Build(BuildArgs),
    /// Verify a bundle: manifest, path rules, no symlinks, hard links or special files,
    /// no unlisted files, sizes, modes and SHA-256 of every file, and the target.
    ///
    /// Exit codes: 0 clean, 2 integrity failure (every failure is listed with its code).
    Verify(VerifyArgs),
    /// Make a signing key pair: `FILE` (the secret key, mode 0600, never overwritten) and
    /// `FILE.pub` (the public key, minisign's format) for `bundle build --sign FILE` and
    /// `bundle verify --trusted-key FILE.pub`.
    Keygen(KeygenArgs),
}

/// Arguments of `arcane bundle keygen`.
#[derive(Debug, clap::Args)]
pub struct KeygenArgs {
    /// Where to write the secret key (`FILE.pub` gets the public key).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

/// Arguments of `arcane bundle build`.
#[derive(Debug, clap::Args)]
pub struct BuildArgs {
    /// The app directory, copied byte for byte to `app/`. It may hold `arcane-app.json`
    /// (`{"id", "name", "version", "start"}`); the `--app-*` flags override it.
    #[arg(long, value_name = "DIR")]
    pub app: PathBuf,

    /// A runtime from the registry: `llama.cpp` (the engine's default runtime),
    /// `llama.cpp=ID`, or `onnx[=ID]` (the registered ONNX Runtime library, which
    /// `launch` hands the Core host). Repeatable. Default: the default engine's
    /// default runtime (`llama.cpp`).
    #[arg(long = "runtime", value_name = "ENGINE[=ID]")]
    pub runtimes: Vec<String>,

    /// Model ids from the registry (`arcane model list`). Repeatable; the first is the
    /// one `launch` loads.
    #[arg(long = "model", value_name = "ID", required = true, num_args = 1..)]
    pub models: Vec<String>,

    /// The output directory. Must not exist; missing parent directories are created
    /// (and removed again if the build fails).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,

    /// The app id (`[a-z0-9][a-z0-9.-]{0,63}`; names the default state root).
    #[arg(long, value_name = "ID")]
    pub app_id: Option<String>,

    /// The app's display name (default: its id).
    #[arg(long, value_name = "NAME")]
    pub app_name: Option<String>,

    /// The app's version (default: `0.0.0`).
    #[arg(long, value_name = "VERSION")]
    pub app_version: Option<String>,

    /// The app's start file, relative to the app directory (default: `index.html` when present).
    #[arg(long, value_name = "FILE")]
    pub app_start: Option<String>,

    /// The execution target `launch` uses by default (`cpu` or a device id).
    #[arg(long, value_name = "TARGET")]
    pub execution_target: Option<String>,

    /// Sign the manifest with this secret key (from `arcane bundle keygen`), so that
    /// `verify --trusted-key` and `launch` with a trusted key accept the bundle.
    #[arg(long, value_name = "KEY")]
    pub sign: Option<PathBuf>,
}

/// Arguments of `arcane bundle verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The bundle directory.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,

    /// Print the report as one JSON document (same as `--output json`).
    #[arg(long)]
    pub json: bool,

    /// Hashing threads (default: every core, at most 8).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

    /// Also require the manifest's signature by this public key (`KEY.pub`): an unsigned
    /// bundle is `BUNDLE_UNSIGNED`, another key's or a broken signature
    /// `BUNDLE_SIGNATURE_INVALID`, naming the key ids.
    #[arg(long, value_name = "KEY.pub")]
    pub trusted_key: Option<PathBuf>,
}

/// Runs `arcane bundle`.
pub fn run(context: &Context, args: Args) -> Result<u8, CliError> {
    match args.command {
        BundleCommand::Build(args) => build(context, args),
        BundleCommand::Verify(args) => verify(context, args),
        BundleCommand::Keygen(args) => keygen(context, args),
    }
}

/// A key file that cannot be used, as a CLI error naming it.
pub fn key_error(error: arcane_bundle::sign::SignError) -> CliError {
    let details = match &error {
        arcane_bundle::sign::SignError::BadKey { path, what, .. } => {
            json!({"path": path, "key": what})
        }
        _ => json!({}),
    };
    CommandError::new(codes::ARCANE_USAGE, error.to_string(), details)
        .hint("make a key pair with `arcane bundle keygen --out FILE`")
        .into()
}

/// Reads a trusted public key file.
pub fn trusted_key(path: &std::path::Path) -> Result<arcane_bundle::sign::PublicKey, CliError> {
    arcane_bundle::sign::PublicKey::read(path).map_err(key_error)
}

fn keygen(context: &Context, args: KeygenArgs) -> Result<u8, CliError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let secret = arcane_bundle::sign::generate().map_err(key_error)?;
    let public = secret.public();
    let public_path = {
        let mut name = args.out.clone().into_os_string();
        name.push(".pub");
        PathBuf::from(name)
    };
    // Never overwrite a key: a lost secret key cannot be recovered.
    let create = |path: &PathBuf, mode: u32, text: String| -> Result<(), CliError> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
            .map_err(|e| {
                let code = if e.kind() == std::io::ErrorKind::AlreadyExists {
                    codes::ARCANE_ALREADY_EXISTS
                } else {
                    codes::ARCANE_IO
                };
                CliError::from(
                    CommandError::new(
                        code,
                        format!("cannot create `{}`", path.display()),
                        json!({"path": path}),
                    )
                    .caused_by(e),
                )
            })?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| {
                CliError::from(
                    CommandError::new(
                        codes::ARCANE_IO,
                        format!("cannot write `{}`", path.display()),
                        json!({"path": path}),
                    )
                    .caused_by(e),
                )
            })
    };
    if public_path.exists() {
        return Err(CommandError::new(
            codes::ARCANE_ALREADY_EXISTS,
            format!("`{}` already exists", public_path.display()),
            json!({"path": public_path}),
        )
        .into());
    }
    create(&args.out, 0o600, secret.to_text())?;
    if let Err(error) = create(&public_path, 0o644, public.to_text()) {
        let _ = std::fs::remove_file(&args.out);
        return Err(error);
    }
    context.output.result(
        &format!(
            "made key {}: secret key `{}` (keep it private), public key `{}`",
            public.id(),
            args.out.display(),
            public_path.display()
        ),
        &json!({"keyId": public.id(), "secretKey": args.out, "publicKey": public_path}),
    );
    Ok(0)
}

fn build(context: &Context, args: BuildArgs) -> Result<u8, CliError> {
    let default = [arcane_localai::Engine::DEFAULT.as_str().to_string()];
    let asked = if args.runtimes.is_empty() {
        &default[..]
    } else {
        &args.runtimes[..]
    };
    let runtimes = asked
        .iter()
        .map(|r| RuntimeRequest::parse(r))
        .collect::<Result<Vec<_>, _>>()?;
    let launcher = std::env::current_exe().map_err(|e| {
        CommandError::new(
            codes::ARCANE_IO,
            "cannot locate the running `arcane` binary",
            json!({}),
        )
        .caused_by(e)
    })?;
    let mut request = BuildRequest::new(context.workspace.clone(), args.app, args.out, launcher);
    request.runtimes = runtimes;
    request.models = args.models;
    let mut app = AppOverrides::new();
    app.id = args.app_id;
    app.name = args.app_name;
    app.version = args.app_version;
    app.start = args.app_start;
    request.app = app;
    request.execution_target = args.execution_target;
    if let Some(key) = &args.sign {
        let key = arcane_bundle::sign::SecretKey::read(key).map_err(key_error)?;
        request.sign = Some(std::sync::Arc::new(key));
    }
    let sink = ProgressSink::new(&context.output, "building");
    let outcome = arcane_bundle::build(&request, &sink, &context.cancel);
    sink.finish();
    let outcome = outcome?;
    let manifest = &outcome.manifest;
    let human = format!(
        "built bundle `{}` ({} files, {}): app `{}` {}, runtimes {}, models {}\nverify it with `arcane bundle verify {}`; launch it with `{}/bin/arcane launch`",
        outcome.root.display(),
        manifest.files.len(),
        human_bytes(outcome.bytes),
        manifest.app.id,
        manifest.app.version,
        list(
            manifest
                .runtimes
                .iter()
                .map(|r| r.id.as_str())
                .chain(manifest.library_entries().map(|(_, r)| r.id.as_str()))
        ),
        list(manifest.models.iter().map(|m| m.id.as_str())),
        outcome.root.display(),
        outcome.root.display(),
    );
    context.output.result(
        &human,
        &json!({"root": outcome.root, "bundleId": manifest.bundle_id, "files": manifest.files.len(), "bytes": outcome.bytes, "manifest": manifest}),
    );
    Ok(0)
}

fn verify(context: &Context, args: VerifyArgs) -> Result<u8, CliError> {
    let json_output;
    let output = if args.json && context.output.mode != OutputMode::Json {
        json_output = Output::new(OutputMode::Json, context.output.verbose);
        &json_output
    } else {
        &context.output
    };
    let mut options = VerifyOptions::default();
    if let Some(threads) = args.threads {
        options = options.threads(threads);
    }
    if let Some(key) = &args.trusted_key {
        options.trusted_key = Some(trusted_key(key)?);
    }
    let sink = ProgressSink::new(output, "verifying");
    let report = arcane_bundle::verify(&args.dir, &options, &sink, &context.cancel);
    sink.finish();
    let report = match report {
        Ok(report) => report,
        Err(error) if args.json => {
            output.error(&error);
            return Ok(exit_code(arcane_report::Diagnostic::code(&error)));
        }
        Err(error) => return Err(error.into()),
    };
    render_report(output, &report);
    Ok(report_exit_code(&report))
}

/// The exit code of a verification: 0 clean, else the first failure's (2 for `BUNDLE_*`).
pub fn report_exit_code(report: &VerifyReport) -> u8 {
    match report.failures.first() {
        None if report.omitted == 0 => 0,
        None => 2,
        Some(failure) => exit_code(failure.code),
    }
}

/// Prints a verification report: one line per failure for a person, the report as
/// JSON for machines.
pub fn render_report(output: &Output, report: &VerifyReport) {
    let value = json!({
        "ok": report.is_clean(),
        "root": report.root,
        "bundleId": report.bundle_id,
        "failures": report.failures,
        "omitted": report.omitted,
        "filesHashed": report.files_hashed,
        "bytesHashed": report.bytes_hashed,
    });
    let human = if report.is_clean() {
        format!(
            "bundle `{}` verified: {} files, {} hashed",
            report.root.display(),
            report.files_hashed,
            human_bytes(report.bytes_hashed)
        )
    } else {
        let count = report.failures.len() + report.omitted;
        let mut text = format!(
            "bundle `{}` failed verification ({count} {}):",
            report.root.display(),
            if count == 1 { "problem" } else { "problems" }
        );
        for failure in &report.failures {
            match &failure.path {
                Some(path) => text.push_str(&format!(
                    "\n  {:<24} `{path}`: {}",
                    failure.code, failure.message
                )),
                None => text.push_str(&format!("\n  {:<24} {}", failure.code, failure.message)),
            }
        }
        if report.omitted > 0 {
            text.push_str(&format!("\n  … and {} more", report.omitted));
        }
        text
    };
    if output.is_human() && !report.is_clean() {
        // Failures are diagnostics: stderr, so stdout stays clean for pipes.
        output.note(&human);
    } else {
        output.result(&human, &value);
    }
}

fn list<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let items: Vec<String> = items.map(|i| format!("`{i}`")).collect();
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

/// `1.5 MiB`, `98.4 MiB`, `812 B`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Forwards events to the output and draws a byte progress bar for
/// `bundle.*.progress` when a person watches a terminal.
pub struct ProgressSink<'a> {
    output: &'a Output,
    label: &'static str,
    bar: Mutex<Option<indicatif::ProgressBar>>,
}

impl<'a> ProgressSink<'a> {
    /// A sink printing to `output`; `label` prefixes the bar.
    pub fn new(output: &'a Output, label: &'static str) -> Self {
        Self {
            output,
            label,
            bar: Mutex::new(None),
        }
    }

    /// Removes the bar, if one was drawn.
    pub fn finish(&self) {
        if let Ok(mut bar) = self.bar.lock() {
            if let Some(bar) = bar.take() {
                bar.finish_and_clear();
            }
        }
    }
}

impl EventSink for ProgressSink<'_> {
    fn emit(&self, event: Event) {
        if event.kind.starts_with("bundle.") && event.kind.ends_with(".progress") {
            if self.output.progress_allowed() {
                let total = event.data["bytesTotal"].as_u64().unwrap_or(0);
                let done = event.data["bytesDone"].as_u64().unwrap_or(0);
                if let Ok(mut bar) = self.bar.lock() {
                    let bar = bar.get_or_insert_with(|| {
                        let bar = indicatif::ProgressBar::new(total);
                        if let Some(style) = crate::output::progress_style(
                            "{msg} [{bar:30}] {bytes}/{total_bytes} {rate}",
                        ) {
                            bar.set_style(style.progress_chars("=> "));
                        }
                        bar.set_message(self.label);
                        bar
                    });
                    bar.set_length(total);
                    bar.set_position(done);
                }
                return;
            }
            if !self.output.is_human() {
                self.output.event(&event);
            }
            return;
        }
        self.output.event(&event);
    }
}

/// The human line for one of this command's events.
pub fn human_event(event: &Event, verbose: u8) -> Option<String> {
    let data = &event.data;
    let text = |key: &str| data[key].as_str().unwrap_or("?").to_string();
    match event.kind.as_str() {
        event_types::BUNDLE_BUILD_STARTED => Some(format!(
            "building a bundle from `{}` into `{}`",
            text("app"),
            text("out")
        )),
        event_types::BUNDLE_BUILD_RESOLVED => Some(format!(
            "bundling runtimes {} and models {}: {} files, {}",
            list(
                data["runtimes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str())
            ),
            list(
                data["models"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str())
            ),
            data["files"],
            human_bytes(data["bytes"].as_u64().unwrap_or(0)),
        )),
        event_types::BUNDLE_BUILD_PROGRESS | event_types::BUNDLE_VERIFY_PROGRESS => (verbose > 0)
            .then(|| {
                format!(
                    "{} {}/{} files, {}/{}",
                    if event.kind == event_types::BUNDLE_BUILD_PROGRESS {
                        "copied"
                    } else {
                        "hashed"
                    },
                    data["filesDone"],
                    data["filesTotal"],
                    human_bytes(data["bytesDone"].as_u64().unwrap_or(0)),
                    human_bytes(data["bytesTotal"].as_u64().unwrap_or(0)),
                )
            }),
        event_types::BUNDLE_VERIFY_STARTED => {
            (verbose > 0).then(|| format!("verifying bundle `{}`", text("root")))
        }
        event_types::BUNDLE_VERIFY_FINISHED => None,
        kind if kind.starts_with("bundle.launch.") => {
            crate::cmd::launch::human_event(event, verbose)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_like_a_person_would_write_them() {
        assert_eq!(human_bytes(812), "812 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(98_362_432), "93.8 MiB");
    }
}
