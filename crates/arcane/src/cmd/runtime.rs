//! `arcane runtime`: register, install, list and remove engine runtimes. The rules live
//! in `arcane-registry`; this module parses, calls and renders. It also renders every
//! `registry.*` and `download.*` event, and draws their progress bars
//! ([`ProgressSink`], shared with `arcane model`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use arcane_devices::Backend;
use arcane_registry::{
    AddRuntime, Engine, InstallRuntime, LibraryRuntime, Registry, Runtime, Source,
};
use arcane_report::event_types;
use arcane_report::{Event, EventSink};
use indicatif::{ProgressBar, ProgressDrawTarget};
use serde_json::json;

use crate::config::Context;
use crate::error::CliError;
use crate::output::Output;

/// Arguments of `arcane runtime`.
///
/// A runtime is an engine executable Arcane may start (llama.cpp's `llama-server` or
/// `ollama`) or the ONNX Runtime library its ONNX workers load. Registered runtimes
/// live in the workspace's `.arcane/registry.json`; installed ones under
/// `.arcane/runtimes/<engine>/<version>[-<backend>]/`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: RuntimeCommand,
}

#[derive(Debug, clap::Subcommand)]
enum RuntimeCommand {
    /// Register an existing engine executable after checking that it runs
    /// (`--version`), recording its version, backend and library directory; or an
    /// ONNX Runtime library (`onnx --library PATH`), recording the version it reports.
    ///
    /// Examples: `arcane runtime add llama.cpp --executable ~/llama.cpp/build/bin/llama-server --backend cpu`,
    /// `arcane runtime add onnx --library .../onnxruntime/capi/libonnxruntime.so.1.31.1`
    Add(AddArgs),
    /// Install an official release archive (`.zip` or `.tar.gz`, a file or an
    /// `http(s)://` URL) after checking its SHA-256, then register it.
    ///
    /// Nothing is extracted before the digest matches; entries with absolute paths,
    /// `..` or links leaving the install directory are refused; a failed or cancelled
    /// install (Ctrl-C) leaves nothing behind and never replaces an earlier one.
    ///
    /// Example: `arcane runtime install llama.cpp --archive llama-b4500-bin-ubuntu-x64.zip --sha256 4f…`
    // `--version` names the runtime's version here, not Arcane's.
    #[command(disable_version_flag = true)]
    Install(InstallArgs),
    /// List the registered runtimes (id, engine, version, backend, executable or
    /// library).
    List,
    /// Unregister a runtime; an installed one is deleted from `.arcane/runtimes/`
    /// (an external executable is never touched).
    Remove(RemoveArgs),
}

/// A backend a runtime can be built for.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum BuildBackend {
    /// CPU only.
    Cpu,
    /// NVIDIA CUDA.
    Cuda,
    /// Vulkan.
    Vulkan,
    /// Apple Metal.
    Metal,
}

impl From<BuildBackend> for Backend {
    fn from(value: BuildBackend) -> Self {
        match value {
            BuildBackend::Cpu => Backend::Cpu,
            BuildBackend::Cuda => Backend::Cuda,
            BuildBackend::Vulkan => Backend::Vulkan,
            BuildBackend::Metal => Backend::Metal,
        }
    }
}

fn parse_engine(value: &str) -> Result<Engine, String> {
    value.parse::<Engine>().map_err(|e| e.to_string())
}

/// What `arcane runtime add` registers: an engine, or a kind's runtime library.
#[derive(Debug, Clone, Copy)]
enum AddKind {
    Engine(Engine),
    Library(Engine),
}

fn parse_add_kind(value: &str) -> Result<AddKind, String> {
    let engine = value
        .parse::<Engine>()
        .map_err(|_| format!("unknown runtime `{value}`: expected {}", addable()))?;
    Ok(match engine.kind().runtime_library() {
        Some(_) => AddKind::Library(engine),
        None => AddKind::Engine(engine),
    })
}

/// The kinds `arcane runtime add` registers, as a list for messages: those started from
/// an executable, and those whose runtime is a library.
fn addable() -> String {
    let names: Vec<String> = Engine::registrable()
        .chain(Engine::library_kinds())
        .map(|e| format!("`{e}`"))
        .collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

#[derive(Debug, clap::Args)]
struct AddArgs {
    /// The runtime: `llama.cpp`, `ollama` or `onnx`.
    #[arg(value_name = "ENGINE", value_parser = parse_add_kind)]
    engine: AddKind,

    /// The engine's server executable (`llama-server` or `ollama`).
    #[arg(
        long,
        value_name = "PATH",
        required_unless_present = "library",
        conflicts_with = "library"
    )]
    executable: Option<PathBuf>,

    /// The ONNX Runtime shared library (`libonnxruntime.so.<version>`, e.g. the
    /// `onnxruntime` wheel's `onnxruntime/capi/libonnxruntime.so.1.31.1`); `onnx` only.
    #[arg(long, value_name = "PATH")]
    library: Option<PathBuf>,

    /// The backend it was built for. Default: detected from its ggml libraries
    /// (llama.cpp; `cpu` when none is found), `auto` for Ollama.
    #[arg(long, value_enum)]
    backend: Option<BuildBackend>,

    /// The runtime's id (`[a-z0-9][a-z0-9._-]*`). Default: the engine's name. Pass one
    /// to register several runtimes of the same engine.
    #[arg(long, value_name = "ID")]
    id: Option<String>,
}

#[derive(Debug, clap::Args)]
struct InstallArgs {
    /// The engine in the archive: `llama.cpp` (or `ollama`).
    #[arg(value_name = "ENGINE", value_parser = parse_engine)]
    engine: Engine,

    /// The release archive: a local file or an `http(s)://` URL.
    #[arg(long, value_name = "FILE|URL")]
    archive: String,

    /// The archive's SHA-256 (64 hex digits, as published with the release).
    #[arg(long, value_name = "HEX")]
    sha256: String,

    /// The version tag (e.g. `b4500`). Default: what the executable's `--version` says.
    #[arg(long, value_name = "TAG")]
    version: Option<String>,

    /// The backend the archive was built for. Given, it is part of the id and
    /// directory (`llama.cpp-b4500-cuda`); default `cpu` (`metal` on macOS).
    #[arg(long, value_enum)]
    backend: Option<BuildBackend>,

    /// The runtime's id. Default: `<engine>-<version>[-<backend>]`.
    #[arg(long, value_name = "ID")]
    id: Option<String>,

    /// Do not check that the installed server runs on this machine (`--version`); for
    /// a build meant for another machine, such as a CUDA build on a host without a GPU.
    /// The version then comes from `--version` or the archive's name.
    #[arg(long)]
    skip_run_check: bool,

    /// The most the archive may extract to, all files together (bytes, or with a unit:
    /// `KiB`, `MiB`, `GiB`). Past it the install stops and leaves nothing. Default
    /// `4GiB`.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_extracted_size: Option<u64>,

    /// The most the archive may extract to as a multiple of its own size (real releases
    /// expand 2-5 times; a decompression bomb, a thousand). Default 200.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_expansion_ratio: Option<u64>,
}

/// Parses a size: a number of bytes, or one followed by `KiB`, `MiB` or `GiB` (`K`,
/// `M`, `G` too).
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number.parse().map_err(|_| {
        format!("`{text}` is not a size (try `4GiB`, `500MiB` or a number of bytes)")
    })?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        other => {
            return Err(format!(
                "unknown size unit `{other}` (use `KiB`, `MiB` or `GiB`)"
            ))
        }
    };
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("`{text}` is too large"))
}

#[derive(Debug, clap::Args)]
struct RemoveArgs {
    /// The runtime's id (see `arcane runtime list`).
    #[arg(value_name = "ID")]
    id: String,

    /// Remove it even while a running Core host serves it (its next load fails).
    #[arg(long)]
    force: bool,
}

impl Args {
    /// Whether this needs an existing workspace (`list`, `remove`); `add` and `install`
    /// create one.
    pub fn needs_existing_workspace(&self) -> bool {
        matches!(
            self.command,
            RuntimeCommand::List | RuntimeCommand::Remove(_)
        )
    }
}

/// Runs `arcane runtime`.
pub fn run(context: &Context, args: Args) -> Result<u8, CliError> {
    let registry = Registry::new(&context.workspace);
    match args.command {
        RuntimeCommand::Add(add) => add_runtime(context, &registry, add)?,
        RuntimeCommand::Install(install) => {
            let source = Source::parse(&install.archive)?;
            let mut options = InstallRuntime::new(install.engine, source, install.sha256)
                .inherited_loader_path(crate::config::inherited_loader_path());
            if let Some(version) = install.version {
                options = options.version(version);
            }
            if let Some(backend) = install.backend {
                options = options.backend(backend.into());
            }
            if let Some(id) = install.id {
                options = options.id(id);
            }
            options = options.check_runs(!install.skip_run_check);
            if let Some(bytes) = install.max_extracted_size {
                options = options.max_extracted_bytes(bytes);
            }
            if let Some(ratio) = install.max_expansion_ratio {
                options = options.max_expansion_ratio(ratio);
            }
            let sink = ProgressSink::new(&context.output);
            let runtime = registry.install_runtime(&options, &sink, &context.cancel)?;
            drop(sink);
            let root = runtime.root.as_deref().unwrap_or(&runtime.executable);
            context.output.result(
                &format!(
                    "installed runtime `{}`: {}\n  in {}",
                    runtime.id,
                    describe(&runtime),
                    root.display()
                ),
                &json!({"runtime": runtime}),
            );
        }
        RuntimeCommand::List => {
            let runtimes = registry.runtimes()?;
            let mut libraries = Vec::new();
            // Each library kind's under `<kind>Runtimes`, as the registry keeps them.
            let mut listed = json!({"runtimes": runtimes});
            for kind in Engine::library_kinds() {
                let of_kind = registry.library_runtimes(kind)?;
                listed[kind.runtimes_key()] = json!(of_kind);
                libraries.extend(of_kind.into_iter().map(|r| (kind, r)));
            }
            context
                .output
                .result(&list_text(&runtimes, &libraries), &listed);
        }
        RuntimeCommand::Remove(remove) if is_library(&registry, &remove.id)? => {
            let runtime =
                registry.remove_library_runtime(&remove.id, &context.output, &context.cancel)?;
            context.output.result(
                &format!(
                    "removed runtime `{}` (left {} in place)",
                    runtime.id,
                    runtime.library.display()
                ),
                &json!({"runtime": runtime}),
            );
        }
        RuntimeCommand::Remove(remove) => {
            let record = registry.runtime(&remove.id)?;
            crate::cmd::refuse_in_use(
                context,
                "runtime",
                &remove.id,
                &record.executable,
                remove.force,
            )?;
            let runtime = registry.remove_runtime(&remove.id, &context.output, &context.cancel)?;
            let what = if runtime.installed {
                format!(
                    "deleted {}",
                    runtime
                        .root
                        .as_deref()
                        .unwrap_or(&runtime.executable)
                        .display()
                )
            } else {
                format!("left {} in place", runtime.executable.display())
            };
            context.output.result(
                &format!("removed runtime `{}` ({what})", runtime.id),
                &json!({"runtime": runtime}),
            );
        }
    }
    Ok(0)
}

/// `arcane runtime add`: an engine executable, or an ONNX Runtime library.
fn add_runtime(context: &Context, registry: &Registry, add: AddArgs) -> Result<(), CliError> {
    let sink = ProgressSink::new(&context.output);
    let (engine, executable) = match (add.engine, add.executable, add.library) {
        (AddKind::Library(kind), None, Some(library)) => {
            if add.backend.is_some() {
                return Err(usage(&format!(
                    "`--backend` is for engines; a `{kind}` library reports its own execution providers"
                )));
            }
            let runtime = registry.add_library_runtime(
                kind,
                &library,
                add.id.as_deref(),
                &sink,
                &context.cancel,
            )?;
            drop(sink);
            context.output.result(
                &format!(
                    "registered runtime `{}`: {kind} {} at {}",
                    runtime.id,
                    runtime.version,
                    runtime.library.display()
                ),
                &json!({"runtime": runtime}),
            );
            return Ok(());
        }
        (AddKind::Library(kind), ..) => {
            return Err(usage(&format!(
                "`arcane runtime add {kind}` needs `--library PATH` (not `--executable`)"
            )))
        }
        (AddKind::Engine(engine), Some(executable), None) => (engine, executable),
        (AddKind::Engine(engine), ..) => {
            let libraries: Vec<String> =
                Engine::library_kinds().map(|k| format!("`{k}`")).collect();
            return Err(usage(&format!(
                "`arcane runtime add {engine}` needs `--executable PATH` (`--library` is for {})",
                libraries.join(", ")
            )));
        }
    };
    let mut options = AddRuntime::new(engine, executable)
        .inherited_loader_path(crate::config::inherited_loader_path());
    if let Some(backend) = add.backend {
        options = options.backend(backend.into());
    }
    if let Some(id) = add.id {
        options = options.id(id);
    }
    let runtime = registry.add_runtime(&options, &sink, &context.cancel)?;
    drop(sink);
    context.output.result(
        &format!(
            "registered runtime `{}`: {}",
            runtime.id,
            describe(&runtime)
        ),
        &json!({"runtime": runtime}),
    );
    Ok(())
}

fn usage(message: &str) -> CliError {
    crate::error::CommandError::usage(message, json!({})).into()
}

/// `llama.cpp 0.6.0-dev (cpu) at /path/llama-server`.
fn describe(runtime: &Runtime) -> String {
    format!(
        "{} {} ({}) at {}",
        runtime.engine,
        runtime.version,
        runtime.backend,
        runtime.executable.display()
    )
}

/// Whether `id` names a registered library runtime (of any kind).
fn is_library(registry: &Registry, id: &str) -> Result<bool, CliError> {
    for kind in Engine::library_kinds() {
        if registry.library_runtimes(kind)?.iter().any(|r| r.id == id) {
            return Ok(true);
        }
    }
    Ok(false)
}

fn list_text(runtimes: &[Runtime], libraries: &[(Engine, LibraryRuntime)]) -> String {
    if runtimes.is_empty() && libraries.is_empty() {
        let library = Engine::library_kinds()
            .map(|k| format!(" (or `arcane runtime add {k} --library PATH`)"))
            .collect::<String>();
        return format!(
            "no runtimes registered; add one with `arcane runtime add {} --executable PATH`{library}",
            Engine::DEFAULT
        );
    }
    let mut rows: Vec<[String; 5]> = runtimes
        .iter()
        .map(|r| {
            let origin = if r.installed {
                format!("{} (installed)", r.executable.display())
            } else {
                r.executable.display().to_string()
            };
            [
                r.id.clone(),
                r.engine.to_string(),
                r.version.clone(),
                r.backend.to_string(),
                origin,
            ]
        })
        .collect();
    rows.extend(libraries.iter().map(|(kind, r)| {
        [
            r.id.clone(),
            kind.to_string(),
            r.version.clone(),
            "-".to_string(),
            r.library.display().to_string(),
        ]
    }));
    table(&["ID", "ENGINE", "VERSION", "BACKEND", "EXECUTABLE"], &rows)
}

/// Left-aligned columns separated by two spaces; the last column is not padded.
pub(crate) fn table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(str::len);
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == N {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        text.push_str(out.trim_end());
        text.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    text
}

/// `1.5 GB`, `98.6 MB`, `12.0 kB`, `512 B` (decimal units).
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["kB", "MB", "GB", "TB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1000.0;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// The human line for a `registry.*` or `download.*` event (progress events have
/// none: they drive progress bars on a terminal, and are NDJSON lines otherwise).
pub fn human_event(event: &Event, verbose: u8) -> Option<String> {
    let data = &event.data;
    let text = |key: &str| {
        data[key]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| data[key].to_string())
    };
    match event.kind.as_str() {
        event_types::DOWNLOAD_STARTED => Some(match data["total"].as_u64() {
            Some(total) => format!("downloading `{}` ({})", text("url"), human_bytes(total)),
            None => format!("downloading `{}`", text("url")),
        }),
        event_types::DOWNLOAD_FINISHED if verbose > 0 => Some(format!(
            "downloaded {} (sha256 {})",
            human_bytes(data["bytes"].as_u64().unwrap_or(0)),
            text("sha256")
        )),
        event_types::REGISTRY_RUNTIME_PROBING => Some(format!(
            "checking that `{}` runs (`--version`)",
            text("executable")
        )),
        event_types::REGISTRY_RUNTIME_EXTRACTING => Some(if verbose > 0 {
            format!(
                "extracting `{}` into `{}`",
                text("archive"),
                text("destination")
            )
        } else {
            format!("verified; extracting `{}`", text("archive"))
        }),
        _ => None,
    }
}

/// The event sink of the registry commands: draws a progress bar per download or
/// hashed file when a person watches a terminal (`Output::progress_allowed`), and
/// passes every other event (and, without a terminal, every event) to [`Output`].
pub(crate) struct ProgressSink<'a> {
    output: &'a Output,
    enabled: bool,
    bars: Mutex<HashMap<String, ProgressBar>>,
}

impl<'a> ProgressSink<'a> {
    pub(crate) fn new(output: &'a Output) -> Self {
        Self {
            output,
            enabled: output.progress_allowed(),
            bars: Mutex::new(HashMap::new()),
        }
    }

    fn update(&self, key: String, label: &str, done: u64, total: Option<u64>) {
        let Ok(mut bars) = self.bars.lock() else {
            return;
        };
        let bar = bars.entry(key).or_insert_with(|| {
            let bar = match total {
                Some(total) => {
                    ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
                }
                None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
            };
            let template = if total.is_some() {
                "{msg} [{bar:30}] {decimal_bytes}/{decimal_total_bytes} {decimal_rate} eta {eta}"
            } else {
                "{msg} {spinner} {decimal_bytes} {decimal_rate}"
            };
            if let Some(style) = crate::output::progress_style(template) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message(label.to_string());
            bar
        });
        bar.set_position(done);
        if total == Some(done) {
            bar.finish_and_clear();
        }
    }
}

impl EventSink for ProgressSink<'_> {
    fn emit(&self, event: Event) {
        if self.enabled {
            let data = &event.data;
            match event.kind.as_str() {
                event_types::DOWNLOAD_PROGRESS => {
                    let url = data["url"].as_str().unwrap_or_default().to_string();
                    let name = url.rsplit('/').next().unwrap_or(&url).to_string();
                    let done = data["received"].as_u64().unwrap_or(0);
                    self.update(
                        url,
                        &format!("downloading {name}"),
                        done,
                        data["total"].as_u64(),
                    );
                    return;
                }
                event_types::REGISTRY_HASH_PROGRESS => {
                    let path = data["path"].as_str().unwrap_or_default().to_string();
                    let action = match data["action"].as_str() {
                        Some("copy") => "copying",
                        Some("verify") => "verifying",
                        _ => "hashing",
                    };
                    let name = path.rsplit('/').next().unwrap_or(&path).to_string();
                    let done = data["done"].as_u64().unwrap_or(0);
                    self.update(
                        format!("{action}:{path}"),
                        &format!("{action} {name}"),
                        done,
                        data["total"].as_u64(),
                    );
                    return;
                }
                _ => {}
            }
            // Print above any active bar rather than through it.
            if let Ok(bars) = self.bars.lock() {
                if let Some(bar) = bars.values().find(|b| !b.is_finished()) {
                    bar.suspend(|| self.output.event(&event));
                    return;
                }
            }
        }
        self.output.event(&event);
    }
}

impl Drop for ProgressSink<'_> {
    fn drop(&mut self) {
        if let Ok(bars) = self.bars.lock() {
            for bar in bars.values() {
                bar.finish_and_clear();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_a_person_would_write_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(98_600_000), "98.6 MB");
        assert_eq!(human_bytes(1_500_000_000), "1.5 GB");
    }

    #[test]
    fn extraction_limits_read_with_binary_units() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert!(parse_size("1.5GiB").is_err());
        assert!(parse_size("4TB").unwrap_err().contains("`TB`"));
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("17179869184GiB")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn tables_align_columns() {
        let text = table(
            &["ID", "X"],
            &[["a".into(), "1".into()], ["long-id".into(), "2".into()]],
        );
        assert_eq!(text, "ID       X\na        1\nlong-id  2\n");
    }

    #[test]
    fn progress_events_have_no_human_line_but_downloads_do() {
        let progress = Event::new(
            arcane_report::event_types::DOWNLOAD_PROGRESS,
            json!({"url": "http://x/a", "received": 1, "total": 2}),
        );
        assert_eq!(human_event(&progress, 0), None);
        let started = Event::new(
            arcane_report::event_types::DOWNLOAD_STARTED,
            json!({"url": "http://x/a", "total": 2_000_000}),
        );
        assert_eq!(
            human_event(&started, 0).as_deref(),
            Some("downloading `http://x/a` (2.0 MB)")
        );
    }
}
