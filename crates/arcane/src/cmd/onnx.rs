//! `arcane onnx run`: one ONNX model run on NumPy `.npy` inputs, outputs written as
//! `.npy` files; and the hidden `arcane __onnx-worker`, the worker process the Core
//! host's `onnx` service starts for each execution target.
//!
//! Also home of what `arcane core`/`arcane serve` need for the `onnx` service: where
//! the ONNX Runtime library is ([`library`]) and the service itself ([`service`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arcane_onnx::{npy, Provider, RunCancel, Runtime, Session, SessionOptions};
use arcane_onnx_service::{OnnxConfig, OnnxService};
use arcane_report::codes;
use serde_json::json;

use crate::config::Context;
use crate::error::{CliError, CommandError};

/// Arguments of `arcane onnx`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: OnnxCommand,
}

/// `arcane onnx` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum OnnxCommand {
    /// Run an ONNX model once on `.npy` inputs and write each output as `<name>.npy`.
    ///
    /// Example: `arcane onnx run silero_vad.onnx --input input=frame.npy
    /// --input state=state.npy --input sr=sr.npy --output-dir out/`
    Run(RunArgs),
}

/// Arguments of `arcane onnx run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The model: a registered model id or a path to an `.onnx` file.
    #[arg(value_name = "MODEL")]
    pub model: String,

    /// An input as `NAME=FILE.npy` (NumPy `.npy`, any version, C order); repeat for
    /// each input of the model.
    #[arg(long = "input", value_name = "NAME=FILE")]
    pub inputs: Vec<String>,

    /// Only these outputs (default: all), comma-separated or repeated.
    #[arg(long = "only", value_name = "NAME", value_delimiter = ',')]
    pub outputs: Vec<String>,

    /// Where to write `<output>.npy` files (created if missing; each written
    /// atomically). Without it, outputs are printed (shape and type; `--output json`
    /// prints the data too).
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,

    /// The ONNX Runtime library (`libonnxruntime.so.<version>`). Default:
    /// `$ARCANE_ONNXRUNTIME`, else the registered `onnx` runtime.
    #[arg(long, value_name = "PATH")]
    pub library: Option<PathBuf>,
}

/// Arguments of the hidden `arcane __onnx-worker`.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// The ONNX Runtime library to load.
    #[arg(long, value_name = "PATH")]
    pub library: PathBuf,

    /// Test-only: stay (idle) after the input ends, until killed, as a worker stuck in
    /// a run would; with the parent-death signal off this makes an orphan.
    #[arg(long = "outlive-input", hide = true)]
    pub outlive_input: bool,
}

/// Runs the worker on stdin/stdout until stdin ends (0), or reports a runtime that does
/// not load in its hello and exits 1.
pub fn worker(args: &WorkerArgs) -> u8 {
    let stdin = std::io::stdin();
    let served = arcane_onnx::worker::serve(
        &args.library,
        std::io::BufReader::new(stdin),
        std::io::stdout(),
    );
    if args.outlive_input {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    match served {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// The ONNX Runtime library: `flag`, else `$ARCANE_ONNXRUNTIME` (both explicit
/// overrides), else the workspace's registered ONNX Runtime (`arcane runtime add onnx`:
/// the one called `onnx`, or the only one); none is `ARCANE_PREREQUISITE_MISSING`
/// saying how to get one.
pub fn library(workspace: &Path, flag: Option<&Path>) -> Result<PathBuf, CliError> {
    if let Some(path) = flag
        .map(Path::to_path_buf)
        .or_else(|| crate::config::library_override(KIND))
    {
        return trusted_library(path);
    }
    if let Some(runtime) =
        arcane_registry::Registry::new(workspace).default_library_runtime(KIND)?
    {
        return trusted_library(runtime.library);
    }
    Err(CommandError::new(
        codes::ARCANE_PREREQUISITE_MISSING,
        "no ONNX Runtime library is configured",
        json!({"minimumVersion": arcane_onnx::minimum_version()}),
    )
    .hint("register one with `arcane runtime add onnx --library PATH` (the `onnxruntime` wheel's `onnxruntime/capi/libonnxruntime.so.<version>`; `scripts/provision.sh` installs one), or pass `--onnx-library PATH` or set ARCANE_ONNXRUNTIME")
    .into())
}

/// `path`, unless another user controls it or a library beside it (loading it runs
/// its constructors as this user): the rule `runtime add onnx` applies too.
fn trusted_library(path: PathBuf) -> Result<PathBuf, CliError> {
    let beside: Vec<PathBuf> = path.parent().map(Path::to_path_buf).into_iter().collect();
    match arcane_files::trust::check_program(&path, &beside) {
        // A missing file is reported where it is loaded, with the minimum version.
        Err(_) | Ok(Ok(())) => Ok(path),
        Ok(Err(untrusted)) => Err(CommandError::new(
            codes::ARCANE_POLICY_DENIED,
            format!(
                "refusing to load `{}`: {}",
                path.display(),
                untrusted.describe()
            ),
            json!({"path": path, "untrusted": untrusted.path}),
        )
        .hint(untrusted.fix())
        .into()),
    }
}

/// Resolves `model`: a registered model id first, else a path to a regular file
/// (opened without blocking, as the registry opens a file it is given); a relative
/// path is the working directory's (`arcane onnx run`, typed in a shell).
pub fn model_path(workspace: &Path, model: &str) -> Result<PathBuf, arcane_core::BoxError> {
    resolve_model(workspace, model, None)
}

/// As [`model_path`], but a relative path is the workspace's: what the host's
/// `onnx.load` takes, since the host's working directory is wherever it was started
/// and no client can see it.
pub fn workspace_model_path(
    workspace: &Path,
    model: &str,
) -> Result<PathBuf, arcane_core::BoxError> {
    resolve_model(workspace, model, Some(workspace))
}

fn resolve_model(
    workspace: &Path,
    model: &str,
    base: Option<&Path>,
) -> Result<PathBuf, arcane_core::BoxError> {
    if let Ok(registered) = arcane_registry::Registry::new(workspace).model(model) {
        return Ok(registered.path);
    }
    let given = match base {
        Some(base) if Path::new(model).is_relative() => base.join(model),
        _ => PathBuf::from(model),
    };
    let path = std::path::absolute(&given).unwrap_or(given);
    match arcane_files::open_regular(&path) {
        Ok(_) => Ok(path),
        Err(e) => Err(Box::new(
            CommandError::new(
                codes::ARCANE_NOT_FOUND,
                format!("`{model}` is neither a registered model nor a readable model file: {e}"),
                json!({"model": model, "path": path}),
            )
            .hint("`arcane model list` shows the registered models"),
        )),
    }
}

/// The kind this module serves.
pub const KIND: arcane_registry::Engine = arcane_registry::Engine::Onnx;

/// The flag of `arcane core` and `arcane serve` that names its library (without its
/// `--`).
pub const LIBRARY_FLAG: &str = "onnx-library";

/// How the host sets up its `onnx` service: the flags `arcane core` and `arcane serve`
/// take for it.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct OnnxOptions {
    /// The ONNX Runtime library for the `onnx` runtime (`libonnxruntime.so.<version>`):
    /// `arcane serve` hosts ONNX sessions on it. Default: `$ARCANE_ONNXRUNTIME`, else
    /// the registered `onnx` runtime.
    #[arg(long = LIBRARY_FLAG, value_name = "PATH")]
    pub library: Option<PathBuf>,
    /// Test-only: resolve ONNX execution targets against this device inventory (the
    /// `arcane devices --inventory` format) instead of probing this machine.
    #[arg(long = "onnx-inventory", value_name = "PATH", hide = true)]
    pub inventory: Option<PathBuf>,
    /// Test-only: start ONNX workers without the parent-death signal, as if they had
    /// outlived a host that could not take them down.
    #[arg(long = "onnx-workers-outlive-host", hide = true)]
    pub workers_outlive_host: bool,
}

/// The `onnx` service of the host in `context.workspace`: workers are this executable
/// (`__onnx-worker`) on the library [`library`] finds, targets resolved by the live
/// device probe (or `options.inventory`), models by [`workspace_model_path`].
pub fn service(workspace: &Path, options: &OnnxOptions) -> Result<Arc<OnnxService>, CliError> {
    let library = library(workspace, options.library.as_deref())?;
    let program = std::env::current_exe().map_err(|e| {
        CommandError::new(
            codes::ARCANE_IO,
            "cannot find this executable to start ONNX workers",
            json!({}),
        )
        .caused_by(e)
    })?;
    let devices: Arc<dyn arcane_devices::DeviceSource> = match &options.inventory {
        Some(path) => Arc::new(arcane_devices::Catalog::from_inventory_file(path)?),
        None => Arc::new(arcane_devices::LiveProbe),
    };
    let records = workspace.to_path_buf();
    let workspace = workspace.to_path_buf();
    Ok(OnnxService::new(OnnxConfig {
        library,
        worker_program: program,
        worker_args: vec!["__onnx-worker".into(), "--library".into()],
        devices,
        models: Arc::new(move |model: &str| workspace_model_path(&workspace, model)),
        start_timeout: std::time::Duration::from_secs(60),
        cancel_grace: std::time::Duration::from_secs(2),
        max_workers: arcane_onnx_service::DEFAULT_MAX_WORKERS,
        records: Some(records),
        workers_outlive_host: options.workers_outlive_host,
    }))
}

/// Runs `arcane onnx`.
pub fn run(context: &Context, args: Args) -> Result<u8, CliError> {
    match args.command {
        OnnxCommand::Run(args) => run_model(context, args),
    }
}

fn read_inputs(specs: &[String]) -> Result<BTreeMap<String, arcane_onnx::Tensor>, CliError> {
    let mut inputs = BTreeMap::new();
    for spec in specs {
        let Some((name, file)) = spec.split_once('=') else {
            return Err(CommandError::usage(
                format!("`--input {spec}` must be NAME=FILE.npy"),
                json!({"input": spec}),
            )
            .into());
        };
        let path = Path::new(file);
        let bytes = arcane_files::read_regular(path, 1 << 32).map_err(|e| {
            CommandError::new(
                codes::ARCANE_IO,
                format!("cannot read `{file}`"),
                json!({"path": path}),
            )
            .caused_by(e)
        })?;
        inputs.insert(name.to_string(), npy::from_bytes(file, &bytes)?);
    }
    Ok(inputs)
}

fn run_model(context: &Context, args: RunArgs) -> Result<u8, CliError> {
    let library = library(&context.workspace, args.library.as_deref())?;
    let model = model_path(&context.workspace, &args.model).map_err(CliError)?;
    let inputs = read_inputs(&args.inputs)?;
    let runtime = Runtime::load(&library)?;
    let session = Session::open(&runtime, &model, Provider::Cpu, &SessionOptions::default())?;
    let wanted = (!args.outputs.is_empty()).then_some(args.outputs.as_slice());
    let outputs = session.run(&inputs, wanted, &RunCancel::new())?;
    let mut human = String::new();
    let mut written = serde_json::Map::new();
    for (name, tensor) in &outputs {
        let mut entry = json!({"type": tensor.element_type().as_str(), "shape": tensor.shape});
        if let Some(dir) = &args.output_dir {
            std::fs::create_dir_all(dir).map_err(|e| {
                CommandError::new(
                    codes::ARCANE_IO,
                    format!("cannot create `{}`", dir.display()),
                    json!({"path": dir}),
                )
                .caused_by(e)
            })?;
            let path = dir.join(format!("{}.npy", safe_name(name)));
            arcane_files::write_atomic(&path, &npy::to_bytes(tensor), 0o644).map_err(|e| {
                CommandError::new(
                    codes::ARCANE_IO,
                    format!("cannot write `{}`", path.display()),
                    json!({"path": path}),
                )
                .caused_by(e)
            })?;
            human.push_str(&format!(
                "{name}: {} {:?} -> {}\n",
                tensor.element_type(),
                tensor.shape,
                path.display()
            ));
            entry["path"] = json!(path);
        } else {
            human.push_str(&format!(
                "{name}: {} {:?}\n",
                tensor.element_type(),
                tensor.shape
            ));
            entry["data"] = tensor.to_json(arcane_onnx::Encoding::Array).data;
        }
        written.insert(name.clone(), entry);
    }
    context
        .output
        .result(&human, &json!({"model": model, "outputs": written}));
    Ok(0)
}

/// An output name as a file name: `[A-Za-z0-9._-]` kept, anything else `_`.
fn safe_name(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    match cleaned.trim_start_matches('.') {
        "" => "output".into(),
        rest => rest.to_string(),
    }
}
