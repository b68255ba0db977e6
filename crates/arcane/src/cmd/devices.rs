//! `arcane devices`: list this machine's execution devices, or resolve a target into
//! the exact `llama-server` launch plan. Both read an `--inventory` file instead of
//! probing when given one (format: `docs/inventory.md`).

use std::fmt::Write as _;
use std::path::PathBuf;

use arcane_devices::{
    check_placement, resolve, Backend, Catalog, CatalogState, Device, DeviceKind, DeviceSource,
    LaunchPlan, LiveProbe, Placement, ResolveRequest,
};

use crate::config::Context;
use crate::error::CliError;

/// Arguments of `arcane devices`.
///
/// Without a subcommand, prints the catalog: the CPU (id `cpu`), NVIDIA GPUs read
/// through NVML (id `nvidia-gpu-<uuid>`), and AMD/Intel adapters from sysfs (listed,
/// not yet selectable). A catalog is `ready`, `partial` (with issues, e.g. no NVIDIA
/// driver) or `unavailable`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Probe afresh. Arcane keeps no device cache, so every run already probes this
    /// machine; the flag states it explicitly (and is ignored with `--inventory`).
    #[arg(long)]
    refresh: bool,

    /// Read this JSON inventory instead of probing this machine: the format that
    /// `arcane devices --output json` prints (see `docs/inventory.md`). Lets you list
    /// and plan for another machine.
    #[arg(long, value_name = "FILE", global = true)]
    inventory: Option<PathBuf>,

    #[command(subcommand)]
    command: Option<DevicesCommand>,
}

#[derive(Debug, clap::Subcommand)]
enum DevicesCommand {
    /// Resolve a target into the launch plan: `llama-server` arguments, the child
    /// environment and the execution record. Fails (exit 1) with
    /// `LOCAL_AI_EXECUTION_TARGET_UNAVAILABLE` or `…_UNSUPPORTED` rather than fall back.
    Resolve(ResolveArgs),
    /// Resolve a target afresh, then check through NVML's per-GPU process lists that
    /// process `--pid` (a running engine) is on the configured device. Fails with
    /// `LOCAL_AI_PLACEMENT_MISMATCH` when it is on another GPU.
    CheckPlacement(CheckPlacementArgs),
}

#[derive(Debug, clap::Args)]
struct CheckPlacementArgs {
    #[command(flatten)]
    resolve: ResolveArgs,

    /// The engine's process id.
    #[arg(long, value_name = "PID")]
    pid: u32,
}

#[derive(Debug, clap::Args)]
struct ResolveArgs {
    /// The target: a `deviceId` from `arcane devices`, or `cpu`.
    #[arg(value_name = "TARGET")]
    target: String,

    /// The backend the configuration requests: `auto`, `cpu`, `cuda`, `vulkan`, `metal`.
    /// A GPU target needs `auto` or `cuda`; `cpu` refuses GPU targets.
    #[arg(long, value_name = "BACKEND", default_value = "auto")]
    backend: Backend,

    /// The backend the llama.cpp runtime was built with (`auto` = unknown). Exact GPU
    /// selection needs `cuda`.
    #[arg(long, value_name = "BACKEND", default_value = "auto")]
    runtime_backend: Backend,
}

/// Runs `arcane devices`.
pub fn run(context: &Context, args: Args) -> Result<u8, CliError> {
    let inventory = match &args.inventory {
        Some(path) => Some(Catalog::from_inventory_file(path)?),
        None => None,
    };
    if args.refresh && inventory.is_some() {
        context
            .output
            .note("note: `--refresh` has no effect with `--inventory`: the file is read as it is");
    }
    let source: &dyn DeviceSource = match &inventory {
        Some(catalog) => catalog,
        None => &LiveProbe,
    };
    match args.command {
        None => {
            let catalog = source.catalog();
            let value = serde_json::to_value(&catalog).unwrap_or_default();
            context
                .output
                .result(&render_catalog(&catalog, args.inventory.as_ref()), &value);
        }
        Some(DevicesCommand::Resolve(resolve_args)) => {
            let request = ResolveRequest {
                target: Some(resolve_args.target),
                runtime_backend: resolve_args.runtime_backend,
                requested_backend: resolve_args.backend,
            };
            let plan = resolve(&request, source)?;
            let value = serde_json::to_value(&plan).unwrap_or_default();
            context.output.result(&render_plan(&plan), &value);
        }
        Some(DevicesCommand::CheckPlacement(check)) => {
            let request = ResolveRequest {
                target: Some(check.resolve.target),
                runtime_backend: check.resolve.runtime_backend,
                requested_backend: check.resolve.backend,
            };
            let mut execution = resolve(&request, source)?.into_execution();
            let placement = check_placement(&mut execution, check.pid)?;
            let (outcome, reason) = match &placement {
                Placement::Confirmed => ("confirmed", None),
                Placement::NoGpu => ("no-gpu", None),
                Placement::NotObserved { reason } => ("not-observed", Some(reason.clone())),
                Placement::Skipped { reason } => ("skipped", Some(reason.clone())),
                _ => ("unknown", None),
            };
            let human = match &reason {
                Some(reason) => format!("placement of pid {}: {outcome} ({reason})", check.pid),
                None => format!("placement of pid {}: {outcome}", check.pid),
            };
            let value = serde_json::json!({
                "pid": check.pid,
                "placement": outcome,
                "reason": reason,
                "execution": execution,
            });
            context.output.result(&human, &value);
        }
    }
    Ok(0)
}

fn gib(mib: u64) -> String {
    format!("{:.1} GiB", mib as f64 / 1024.0)
}

fn describe(device: &Device) -> String {
    let mut parts = Vec::new();
    if device.kind == DeviceKind::Cpu {
        if let Some(cores) = device.cores {
            parts.push(format!("{cores} cores"));
        }
        if let Some(threads) = device.logical_processors {
            parts.push(format!("{threads} threads"));
        }
        if let Some(memory) = device.memory_mib {
            parts.push(format!("{} memory", gib(memory)));
        }
    } else {
        if let Some(memory) = device.dedicated_memory_mib {
            parts.push(gib(memory));
        }
        if let Some(driver) = &device.driver_version {
            parts.push(format!("driver {driver}"));
        }
        if let Some(pci) = &device.addresses.pci {
            parts.push(format!("PCI {pci}"));
        }
        if let Some(uuid) = &device.addresses.uuid {
            parts.push(uuid.clone());
        }
    }
    let selection = if !device.present {
        "not present"
    } else if device.device_id.is_none() {
        "unidentified"
    } else if device.exact_selection_supported() {
        "selectable"
    } else {
        "listed, exact selection not supported yet"
    };
    let details = if parts.is_empty() {
        String::new()
    } else {
        format!(" — {}", parts.join(", "))
    };
    format!("{}{details} [{selection}]", device.name)
}

fn render_catalog(catalog: &Catalog, inventory: Option<&PathBuf>) -> String {
    let mut text = String::new();
    let origin = match inventory {
        Some(path) => format!("inventory `{}`", path.display()),
        None => "this machine".to_string(),
    };
    let _ = writeln!(text, "devices of {origin}: {}", catalog.state.as_str());
    let ids: Vec<String> = catalog
        .devices
        .iter()
        .map(|d| d.device_id.clone().unwrap_or_else(|| "(no id)".to_string()))
        .collect();
    let width = ids.iter().map(String::len).max().unwrap_or(0);
    for (id, device) in ids.iter().zip(&catalog.devices) {
        let _ = writeln!(
            text,
            "  {id:<width$}  {:<3}  {}",
            device.kind.as_str(),
            describe(device)
        );
    }
    if catalog.devices.is_empty() {
        let _ = writeln!(text, "  (no devices)");
    }
    if !catalog.issues.is_empty() {
        let _ = writeln!(text, "issues:");
        for issue in &catalog.issues {
            let device = issue
                .device_id
                .as_deref()
                .map(|id| format!(" ({id})"))
                .unwrap_or_default();
            let _ = writeln!(
                text,
                "  {}/{}{device}: {}",
                issue.source.as_str(),
                issue.code.as_str(),
                issue.message
            );
        }
    }
    if catalog.state != CatalogState::Ready {
        let _ = writeln!(
            text,
            "GPU targets resolve only while the catalog can vouch for them; see the issues above."
        );
    }
    text
}

fn render_plan(plan: &LaunchPlan) -> String {
    let mut text = String::new();
    let record = plan.execution();
    let target = record
        .requested_target
        .as_ref()
        .map(|t| format!("`{}`", t.device_id))
        .unwrap_or_else(|| "(none)".to_string());
    let device = record
        .resolved_device
        .as_ref()
        .map(|d| format!(" → {}", d.name))
        .unwrap_or_default();
    let reason = record.reason.map(|r| format!(" ({r})")).unwrap_or_default();
    let _ = writeln!(
        text,
        "target  {target}: {}{reason}{device}",
        record.resolution.as_str()
    );
    let args = if plan.args().is_empty() {
        "(none)".to_string()
    } else {
        plan.args().join(" ")
    };
    let _ = writeln!(text, "args    {args}");
    let mut label = "env   ";
    if plan.env().is_empty() {
        let _ = writeln!(text, "env     (inherited unchanged)");
    }
    for (name, value) in plan.env() {
        if value.is_empty() {
            let _ = writeln!(
                text,
                "{label}  {name}=\"\" (hides every device of this backend)"
            );
        } else {
            let _ = writeln!(text, "{label}  {name}={value}");
        }
        label = "      ";
    }
    for name in plan.env_remove() {
        let _ = writeln!(text, "unset   {name}");
    }
    if let Some(configured) = &record.configured_target {
        let uuid = configured
            .uuid
            .as_deref()
            .map(|u| format!(", {u}"))
            .unwrap_or_default();
        let _ = writeln!(
            text,
            "config  {} on {}{uuid}; observed: not yet checked; fallback: never",
            configured.backend, configured.device
        );
    }
    text
}
