//! The model gateway's settings: `[[model]]`, `[[group]]` and `[devices.<id>]` in
//! `arcane.toml` turned into the Core host's gateway [`Configuration`] (validated, the
//! registry read, nothing started).
//!
//! ```toml
//! [[model]]
//! id = "smol-a"              # what clients name in `model`
//! aliases = ["fast"]
//! model = "smollm2-135m"     # a registered model id or a GGUF path
//! device = "cpu"             # exact; never a fallback (default `cpu`)
//! args = ["-c", "2048"]      # engine arguments
//! keep_alive = "5m"          # seconds or a duration; 0: after each request; -1: never
//! load = "on-demand"         # or "on-start"
//!
//! [[model]]
//! id = "whisper-1"
//! model = "tiny-en"          # a registered whisper.cpp model
//! vad = "silero"             # a registered voice-activity model, for a kind with that
//!                            # slot (`EngineKind::aux_models`): silence is skipped
//!
//! [[model]]
//! id = "remote"
//! url = "http://127.0.0.1:9000"   # an OpenAI-compatible server: routed, never started
//!
//! [[model]]
//! id = "custom"              # any OpenAI-compatible server, started and owned by Arcane
//! command = ["/opt/llama/llama-server", "--host", "${SOCKET}", "-m", "${MODEL}"]
//! model = "smollm2-135m"     # optional: `${MODEL}` is its file
//! env = { OMP_NUM_THREADS = "2" }
//! health = "/health"         # readiness path: 200 ready, 503 loading
//! require_key = true         # behind `${API_KEY_FILE}`: a server that answers without
//!                            # the key once ready is refused (default: served, and
//!                            # reported reachable without the token)
//! pin = true                 # never evicted to make room (implied by keep_alive = -1
//!                            # and load = "on-start"; `false` takes it back)
//! unlisted = true            # routable, but not in `/v1/models`
//! upstream_model = "org/name" # the `model` the engine is sent (answers keep the client's)
//!
//! [[group]]
//! id = "chat"
//! members = ["smol-a", "custom"]
//! exclusive = true           # one member loaded at a time (required: see `groups`)
//!
//! [devices.cpu]
//! max_loaded = 1
//! memory = 8000000000        # bytes
//! ```

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arcane_core::localai::{AdoptLauncher, EngineLauncher};
use arcane_core::supervised::SupervisedLauncher;
use arcane_gateway::{Configuration, DeviceLimit, KeepAlive, ModelSpec};
use arcane_localai::Engine;
use arcane_registry::Registry;
use arcane_report::codes;
use serde::Deserialize;
use serde_json::json;

use crate::error::{Error, Refusal};
use crate::settings::EngineTable;
use crate::Context;

/// One `[[model]]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelTable {
    /// The id clients name.
    pub id: String,
    /// Other names.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// A registered model id or a GGUF path.
    pub model: Option<String>,
    /// A registered runtime id (default: the registered llama.cpp).
    pub runtime: Option<String>,
    /// The engine executable to run instead of the registered runtime's (a bundle's
    /// own `llama-server`).
    pub executable: Option<std::path::PathBuf>,
    /// The exact device (default `cpu`).
    pub device: Option<String>,
    /// Engine arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Idle time before unloading: seconds, or a duration string.
    pub keep_alive: Option<toml::Value>,
    /// `on-demand` (default) or `on-start`.
    pub load: Option<String>,
    /// An external OpenAI-compatible server instead of `model`.
    pub url: Option<String>,
    /// Seconds a load may take (default 120).
    pub startup_timeout: Option<f64>,
    /// The `command` kind: a server's program and arguments, with placeholders
    /// (`${PORT}`, `${SOCKET}`, `${API_KEY_FILE}`, `${MODEL}`).
    pub command: Option<Vec<String>>,
    /// The `command` kind's environment (values may use the placeholders).
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// The `command` kind's readiness path (default `/health`).
    pub health: Option<String>,
    /// A `command` behind `${API_KEY_FILE}` whose server answers without the key once
    /// ready is refused (`true`) rather than served and reported reachable without
    /// the token (the default).
    #[serde(default)]
    pub require_key: bool,
    /// `true`: never evicted to make room; `false`: evictable even with
    /// `keep_alive = -1` or `load = "on-start"` (which pin it otherwise).
    pub pin: Option<bool>,
    /// Routable, but left out of `/v1/models` (and every listing shown to clients).
    #[serde(default)]
    pub unlisted: bool,
    /// The model name the engine is sent instead of the client's (llama-swap's
    /// `useModelName`).
    pub upstream_model: Option<String>,
    /// A registered voice-activity model for a kind that takes one (whisper.cpp's
    /// Silero VAD, `arcane model add silero --file ggml-silero-v6.2.0.bin`): silence is
    /// skipped before decoding.
    pub vad: Option<String>,
    /// How many of its requests are forwarded to its engine at once (default: the
    /// engine's own `-np` when `args` set it, else 4); for llama.cpp also its `-np`
    /// (with `-kvu`) and for whisper.cpp its worker count, unless `args` set them.
    pub parallel: Option<usize>,
    /// How many of its requests may wait beyond `parallel` (default 512); one more is
    /// refused at once with 503 and a `Retry-After`.
    pub max_queue: Option<usize>,
    /// The only CPUs its engine (and every thread of it) may run on: `"0-3"`, `"0,2"`.
    /// llama.cpp's thread count follows (`-t`, unless `args` give one).
    pub cpus: Option<String>,
}

impl ModelTable {
    /// The auxiliary models the table names, by their slot key
    /// ([`arcane_workspace::AuxModel::key`]).
    fn aux_models(&self) -> [(&'static str, Option<&str>); 1] {
        [("vad", self.vad.as_deref())]
    }
}

/// One `[[group]]` table: models of which at most one is loaded at a time.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupTable {
    /// The group's id.
    pub id: String,
    /// The ids of its models (each in at most one group).
    #[serde(default)]
    pub members: Vec<String>,
    /// Must be `true`: a group exists to keep its members from running together.
    pub exclusive: Option<bool>,
}

/// One `[devices.<id>]` table.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceTable {
    /// The most models loaded at once.
    pub max_loaded: Option<usize>,
    /// The memory budget in bytes.
    pub memory: Option<u64>,
}

/// The gateway's configuration for `tables` (relative paths against `base`), its
/// device limits and its `groups`: validated (the groups before any model is looked
/// up), the registry read, nothing started.
pub fn models(
    context: &Context,
    tables: &[ModelTable],
    devices: &HashMap<String, DeviceTable>,
    groups: &[GroupTable],
    base: &Path,
    parent_death_signal: bool,
) -> Result<Configuration, Error> {
    let groups = crate::groups::groups(groups, tables)?;
    let registry = Registry::new(&context.workspace);
    let mut specs = Vec::new();
    for table in tables {
        check_names(table, &specs)?;
        specs.push(spec(context, &registry, table, base, parent_death_signal)?);
    }
    let mut limits: HashMap<String, DeviceLimit> = devices
        .iter()
        .map(|(id, d)| {
            (
                id.clone(),
                DeviceLimit {
                    max_loaded: d.max_loaded,
                    memory: d.memory,
                },
            )
        })
        .collect();
    default_budgets(&specs, &mut limits);
    Ok(Configuration {
        models: specs,
        limits,
        groups,
    })
}

/// A device without a `memory` budget gets its memory less a margin (a tenth, at least
/// 1 GiB) from the device catalog; one the catalog does not know gets none (its load
/// fails with the resolver's error anyway).
fn default_budgets(specs: &[ModelSpec], limits: &mut HashMap<String, DeviceLimit>) {
    let wanted: Vec<&str> = specs
        .iter()
        .filter(|s| !s.external)
        .map(|s| s.device.as_str())
        .filter(|d| limits.get(*d).is_none_or(|l| l.memory.is_none()))
        .collect();
    if wanted.is_empty() {
        return;
    }
    let catalog = arcane_devices::probe();
    for device in wanted {
        let total_mib = catalog
            .devices
            .iter()
            .find(|d| d.device_id.as_deref() == Some(device))
            .and_then(|d| d.memory_mib.or(d.dedicated_memory_mib));
        if let Some(total) = total_mib.map(|mib| mib << 20) {
            let margin = (total / 10).max(1 << 30);
            limits.entry(device.to_string()).or_default().memory =
                Some(total.saturating_sub(margin));
        }
    }
}

/// Whether `id` may name a model or a group: letters, digits, `.`, `-` and `_`, at least
/// one of them.
pub(crate) fn is_name(id: &str) -> bool {
    !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

/// Refuses an empty or malformed id, a name used twice, and a model that names both
/// `model` and `url`.
fn check_names(table: &ModelTable, earlier: &[ModelSpec]) -> Result<(), Error> {
    if !is_name(&table.id) {
        return Err(Refusal::usage(
            format!(
                "the model id `{}` may use only letters, digits, `.`, `-` and `_`",
                table.id
            ),
            json!({"id": table.id}),
        )
        .into());
    }
    let names = std::iter::once(&table.id).chain(&table.aliases);
    for name in names {
        if earlier
            .iter()
            .any(|s| &s.id == name || s.aliases.contains(name))
        {
            return Err(Refusal::usage(
                format!("the model name `{name}` is used twice in `[[model]]`"),
                json!({"name": name}),
            )
            .into());
        }
    }
    if table
        .upstream_model
        .as_deref()
        .is_some_and(|name| name.trim().is_empty())
    {
        return Err(Refusal::usage(
            format!("`upstream_model` of model `{}` is empty", table.id),
            json!({"id": table.id, "upstream_model": table.upstream_model}),
        )
        .into());
    }
    if table.command.is_some() {
        return check_command_table(table);
    }
    if table.url.is_some() == table.model.is_some() {
        return Err(Refusal::usage(
            format!("model `{}` needs exactly one of `model` (a registered id or GGUF path), `url` (an external server) and `command` (a server Arcane starts)", table.id),
            json!({"id": table.id}),
        )
        .into());
    }
    if let Some((key, _)) = table
        .aux_models()
        .into_iter()
        .find(|(_, id)| id.is_some() && table.url.is_some())
    {
        return Err(Refusal::usage(
            format!(
                "`{key}` of model `{}` applies to an engine Arcane runs, not to an external `url`",
                table.id
            ),
            json!({"id": table.id, "field": key}),
        )
        .into());
    }
    for (field, set) in [
        ("env", !table.env.is_empty()),
        ("health", table.health.is_some()),
        ("require_key", table.require_key),
    ] {
        if set {
            return Err(Refusal::usage(
                format!(
                    "`{field}` of model `{}` applies to a `command` only",
                    table.id
                ),
                json!({"id": table.id, "field": field}),
            )
            .into());
        }
    }
    Ok(())
}

/// A `command` table names no `url` (the server is Arcane's), no `runtime` and no
/// `args` (the command line is the command), and a program.
fn check_command_table(table: &ModelTable) -> Result<(), Error> {
    let conflicts = [
        ("url", table.url.is_some()),
        ("runtime", table.runtime.is_some()),
        ("executable", table.executable.is_some()),
        ("args", !table.args.is_empty()),
    ];
    if let Some((field, _)) = conflicts.iter().find(|(_, set)| *set) {
        return Err(Refusal::usage(
            format!(
                "model `{}` has a `command`, so `{field}` does not apply (the command line is the whole server invocation)",
                table.id
            ),
            json!({"id": table.id, "field": field}),
        )
        .into());
    }
    let empty = table
        .command
        .as_ref()
        .and_then(|c| c.first())
        .is_none_or(|program| program.trim().is_empty());
    if empty {
        return Err(Refusal::usage(
            format!(
                "`command` of model `{}` is empty: its first element is the program",
                table.id
            ),
            json!({"id": table.id}),
        )
        .into());
    }
    let template = table.command.as_deref().unwrap_or_default();
    let keyed_port =
        arcane_localai::command_template::needs(template.get(1..).unwrap_or_default(), &table.env)
            .is_ok_and(|needs| needs.port && needs.key_file);
    if table.require_key && !keyed_port {
        return Err(Refusal::usage(
            format!(
                "`require_key` of model `{}` applies to a command on `${{PORT}}` behind `${{API_KEY_FILE}}`",
                table.id
            ),
            json!({"id": table.id, "field": "require_key"}),
        )
        .into());
    }
    Ok(())
}

fn spec(
    context: &Context,
    registry: &Registry,
    table: &ModelTable,
    base: &Path,
    parent_death_signal: bool,
) -> Result<ModelSpec, Error> {
    let load_on_start = match table.load.as_deref() {
        None | Some("on-demand") => false,
        Some("on-start") => true,
        Some(other) => {
            return Err(Refusal::usage(
                format!(
                    "`load` of model `{}` must be `on-demand` or `on-start`, not `{other}`",
                    table.id
                ),
                json!({"id": table.id, "load": other}),
            )
            .into())
        }
    };
    let keep_alive = match &table.keep_alive {
        // A model meant to be there (loaded at start, or pinned) stays loaded unless its
        // table says how long it may idle.
        None if table.pin.unwrap_or(load_on_start) => KeepAlive::Never,
        None => KeepAlive::default(),
        Some(value) => keep_alive(&table.id, value)?,
    };
    let load_timeout = crate::settings::seconds(
        "startup_timeout",
        table.startup_timeout,
        Duration::from_secs(120),
    )?;
    if table.parallel == Some(0) {
        return Err(Refusal::usage(
            format!("`parallel` of model `{}` must be 1 or more", table.id),
            json!({"id": table.id, "parallel": 0}),
        )
        .into());
    }
    if table.url.is_some() && table.cpus.is_some() {
        return Err(Refusal::usage(
            format!(
                "`cpus` of model `{}` applies to an engine Arcane starts, not to an external `url`",
                table.id
            ),
            json!({"id": table.id, "field": "cpus"}),
        )
        .into());
    }
    let mut parallel = table.parallel.unwrap_or(arcane_gateway::DEFAULT_PARALLEL);
    let mut launcher_cpus = None;
    let mut launcher_estimate = None;
    let (launcher, device, memory, exposure, digest) = match &table.url {
        Some(url) => (
            AdoptLauncher::new(arcane_localai::Engine::DEFAULT, url, load_timeout)
                as Arc<dyn EngineLauncher>,
            "external".into(),
            0,
            Exposure::External,
            None,
        ),
        None => {
            if let Some(model) = &table.model {
                refuse_aux_only(registry, table, model)?;
            }
            let engine = EngineTable {
                runtime: match &table.command {
                    Some(_) => Some(Engine::Command.as_str().to_string()),
                    None => table.runtime.clone(),
                },
                model: table.model.clone(),
                executable: table.executable.as_ref().map(|e| base.join(e)),
                alias: Some(table.id.clone()),
                device: Some(table.device.clone().unwrap_or_else(|| "cpu".into())),
                args: table.args.clone(),
                startup_timeout: table.startup_timeout,
                ..EngineTable::default()
            };
            let mut config = crate::settings::table_config(registry, &engine, base, context)?;
            let aux = aux_models(registry, table, config.engine)?;
            config.aux_models = aux
                .iter()
                .map(|(flag, m)| (*flag, m.path.clone()))
                .collect();
            config.id = table.id.clone();
            config.alias = Some(table.id.clone());
            if let Some(command) = &table.command {
                apply_command(&mut config, command, table, base, &context.environment)?;
            }
            parallel = engine_parallel(&mut config, table.parallel);
            if let Some(cpus) = &table.cpus {
                keep_to_cpus(&mut config, &table.id, cpus)?;
            }
            let workspace = &context.workspace;
            let fix = || format!("fix model `{}` in `arcane.toml`", table.id);
            config
                .check(workspace)
                .map_err(|error| Error::from(error).with_hint(fix()))?;
            // A device this machine lacks is refused now, not at the first request (the
            // CPU is always there).
            if config
                .device
                .as_deref()
                .is_some_and(|device| device != "cpu")
            {
                arcane_localai::check_target(&config, &arcane_devices::LiveProbe)
                    .map_err(|error| Error::from(error).with_hint(fix()))?;
            }
            // A gateway model is always its own engine, whatever answers at 8080.
            config.adopt_existing = false;
            config.parent_death_signal = parent_death_signal;
            let estimate = config
                .model
                .as_deref()
                .map(|p| memory_need(&config, p, parallel));
            launcher_estimate = estimate.map(|e| e.json());
            let memory = estimate.map_or(0, |e| e.total());
            let device = config.device.clone().unwrap_or_else(|| "cpu".into());
            let exposure = exposure_of(&config);
            let check = registered_check(workspace, &config, aux);
            let digest = registered_digest(workspace, config.model.clone());
            (
                {
                    launcher_cpus = config.cpus.clone();
                    SupervisedLauncher::checked(workspace, config, check) as Arc<dyn EngineLauncher>
                },
                device,
                memory,
                exposure,
                digest,
            )
        }
    };
    // What a reload compares: the table as written, and the model file it names as
    // it is now (edited in place, it is another model).
    let stamp = table
        .model
        .as_deref()
        .map(|m| base.join(m))
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| (m.len(), m.modified().ok()));
    let fingerprint = format!("{table:?} {stamp:?}");
    Ok(ModelSpec {
        fingerprint,
        digest,
        id: table.id.clone(),
        aliases: table.aliases.clone(),
        launcher,
        device,
        keep_alive,
        load_on_start,
        external: exposure == Exposure::External,
        answers_as_id: exposure == Exposure::Alias,
        reachable_without_token: matches!(exposure, Exposure::External | Exposure::OpenPort),
        memory,
        load_timeout,
        pin: table.pin,
        unlisted: table.unlisted,
        upstream_model: table.upstream_model.clone(),
        parallel,
        max_queue: table.max_queue.unwrap_or(arcane_gateway::DEFAULT_MAX_QUEUE),
        cpus: launcher_cpus,
        memory_estimate: launcher_estimate,
    })
}

/// Keeps `config`'s engine to the CPUs `text` names (model `id`'s `cpus`): refused
/// unless it parses and names only CPUs this process may use; llama.cpp's thread count
/// follows unless its arguments give one.
fn keep_to_cpus(
    config: &mut arcane_localai::EngineConfig,
    id: &str,
    text: &str,
) -> Result<(), Error> {
    let usage = |message: String, details| Error::from(Refusal::usage(message, details));
    let set = arcane_process::CpuSet::parse(text).map_err(|error| {
        usage(
            format!("`cpus` of model `{id}`: {error}"),
            json!({"id": id, "cpus": text}),
        )
    })?;
    let allowed = arcane_process::CpuSet::allowed_now().map_err(|error| {
        usage(
            format!(
                "`cpus` of model `{id}`: the CPUs this process may use cannot be read: {error}"
            ),
            json!({"id": id, "cpus": text}),
        )
    })?;
    if !set.is_subset(&allowed) {
        return Err(usage(
            format!("`cpus` of model `{id}` names CPUs this machine does not let Arcane use: `{text}` (it may use {allowed})"),
            json!({"id": id, "cpus": text, "allowed": allowed.to_string()}),
        ));
    }
    let kind = config.engine.kind();
    if !arcane_workspace::threads_in(kind, &config.extra_args) {
        if let Some(flag) = kind.thread_flags().first() {
            config
                .extra_args
                .extend([flag.to_string(), set.len().to_string()]);
        }
    }
    config.cpus = Some(set);
    Ok(())
}

/// A model's `parallel`: the table's, given to the engine too (its kind's
/// [`arcane_localai::EngineKind::parallel_args`]) unless its arguments say already; else
/// what its arguments say; else the default.
fn engine_parallel(config: &mut arcane_localai::EngineConfig, asked: Option<usize>) -> usize {
    let kind = config.engine.kind();
    let in_args = arcane_workspace::parallel_in(kind, &config.extra_args);
    match (asked, in_args) {
        (Some(parallel), None) => {
            config.extra_args.extend(kind.parallel_args(parallel));
            parallel
        }
        (Some(parallel), Some(_)) => parallel,
        (None, Some(parallel)) => parallel,
        (None, None) => arcane_gateway::DEFAULT_PARALLEL,
    }
}

/// The gateway of one model: the engine `arcane serve` runs from its flags or the
/// embedded default (no `[[model]]` tables), loaded when the host starts and kept
/// (no idle unload), so `arcane ps|load|unload|reload` and model routing work on the
/// main job as on any gateway. Its id is the model's (the registered id, else the file
/// name); answers are named as the client asked. The engine still probes its url
/// first and adopts a server that answers there (the SDK's rule).
pub fn single(mut config: arcane_localai::EngineConfig, workspace: &Path) -> Configuration {
    let parallel = engine_parallel(&mut config, None);
    let id = config
        .alias
        .clone()
        .or_else(|| {
            config
                .model
                .as_deref()
                .and_then(Path::file_stem)
                .map(|s| s.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| config.engine.as_str().to_string());
    let device = config.device.clone().unwrap_or_else(|| "cpu".into());
    let estimate = config
        .model
        .as_deref()
        .map(|p| memory_need(&config, p, parallel));
    let memory = estimate.map_or(0, |e| e.total());
    let fingerprint = format!("{config:?}");
    let load_timeout = config.startup_timeout + Duration::from_secs(5);
    let spec = ModelSpec {
        fingerprint,
        digest: registered_digest(workspace, config.model.clone()),
        id,
        aliases: Vec::new(),
        device,
        keep_alive: KeepAlive::Never,
        load_on_start: true,
        external: false,
        // It may adopt a server that names its model its own way.
        answers_as_id: false,
        reachable_without_token: exposure_of(&config) == Exposure::OpenPort,
        memory,
        load_timeout,
        pin: None,
        unlisted: false,
        upstream_model: None,
        parallel,
        max_queue: arcane_gateway::DEFAULT_MAX_QUEUE,
        cpus: None,
        memory_estimate: estimate.map(|e| e.json()),
        launcher: SupervisedLauncher::checked(
            workspace,
            config.clone(),
            registered_check(workspace, &config, Vec::new()),
        ),
    };
    let mut limits = HashMap::new();
    default_budgets(std::slice::from_ref(&spec), &mut limits);
    Configuration {
        models: vec![spec],
        limits,
        groups: Vec::new(),
    }
}

/// The registered SHA-256 of the model file at `path` (`None`: not registered): the
/// digest the Ollama API lists for the model.
fn registered_digest(workspace: &Path, path: Option<std::path::PathBuf>) -> Option<String> {
    let path = path?;
    Registry::new(workspace)
        .models()
        .ok()?
        .into_iter()
        .find(|m| m.path == path)
        .map(|m| m.sha256)
}

/// For a registered model file: a check, before every load, that the file is still
/// the one registered (its stamp, else its SHA-256), so a file replaced or edited in
/// place after `serve` started is refused at its next load, not served.
fn registered_check(
    workspace: &Path,
    config: &arcane_localai::EngineConfig,
    aux: Vec<(&'static str, arcane_registry::Model)>,
) -> Option<arcane_core::supervised::LaunchCheck> {
    let registry = Registry::new(workspace);
    let mut checked: Vec<arcane_registry::Model> = aux.into_iter().map(|(_, m)| m).collect();
    if let Some(path) = config.model.as_ref() {
        let models = registry.models().ok()?;
        checked.extend(models.into_iter().find(|m| &m.path == path));
    }
    if checked.is_empty() {
        return None;
    }
    Some(Arc::new(move || {
        checked.iter().try_for_each(|model| {
            registry
                .check_model_file(model, &arcane_report::CancelToken::new())
                .map_err(|e| Box::new(e) as arcane_core::BoxError)
        })
    }))
}

/// Refuses a model that no kind serves but one uses beside its own (a voice-activity
/// model named as a `model`), saying where it goes instead.
fn refuse_aux_only(registry: &Registry, table: &ModelTable, model: &str) -> Result<(), Error> {
    let Some(format) = registry.model(model).ok().and_then(|m| m.format()) else {
        return Ok(());
    };
    if Engine::for_format(format).is_some() {
        return Ok(());
    }
    let slot = Engine::ALL.into_iter().find_map(|engine| {
        engine
            .kind()
            .aux_models()
            .iter()
            .find(|slot| slot.format == format)
            .map(|slot| (engine, slot))
    });
    let Some((engine, slot)) = slot else {
        return Ok(());
    };
    Err(Refusal::usage(
        format!(
            "`{model}` of model `{}` is {} ({}), which no engine serves by itself: name it as `{} = \"{model}\"` of a `{engine}` model",
            table.id, slot.what, format.label, slot.key
        ),
        json!({"id": table.id, "model": model, "format": format.id, "key": slot.key}),
    )
    .into())
}

/// The auxiliary models `table` names (its `vad`), each checked against the slots of
/// `engine`'s kind: a key the kind has no slot for, a model not registered, or one of
/// another format is refused, naming it.
fn aux_models(
    registry: &Registry,
    table: &ModelTable,
    engine: Engine,
) -> Result<Vec<(&'static str, arcane_registry::Model)>, Error> {
    let kind = engine.kind();
    let mut resolved = Vec::new();
    for (key, id) in table.aux_models() {
        let Some(id) = id else { continue };
        let Some(slot) = kind.aux_models().iter().find(|slot| slot.key == key) else {
            return Err(Refusal::usage(
                format!(
                    "`{key}` of model `{}` does not apply: `{engine}` takes no {key} model",
                    table.id
                ),
                json!({"id": table.id, "key": key, "engine": engine.as_str()}),
            )
            .into());
        };
        let model = registry.model(id).map_err(|e| {
            Error::from(e).with_hint(format!("register it: `arcane model add {id} --file PATH`"))
        })?;
        let format = model.format();
        if format != Some(slot.format) {
            let found = format.map_or("an unknown format", |f| f.label);
            return Err(Refusal::usage(
                format!(
                    "`{key} = \"{id}\"` of model `{}` must name {} ({}), but `{id}` is {found}",
                    table.id, slot.what, slot.format.label
                ),
                json!({"id": table.id, "key": key, "model": id, "format": format.map(|f| f.id)}),
            )
            .into());
        }
        resolved.push((slot.flag, model));
    }
    Ok(resolved)
}

/// Who reaches a model's engine besides the Core, and how it names itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exposure {
    /// An external url: not Arcane's to secure; answers with its own model names.
    External,
    /// Owned, behind a socket or key, started with `--alias ID`: answers as the id.
    Alias,
    /// Owned, behind a socket or key, naming models its own way (a `command`).
    Closed,
    /// Owned on a port with no key (a `command` on a bare `${PORT}`, Ollama).
    OpenPort,
}

/// The exposure of an owned engine, from its kind and (for a `command`) the
/// placeholders of its template.
fn exposure_of(config: &arcane_localai::EngineConfig) -> Exposure {
    let kind = config.engine.kind();
    let listen = match kind.starts() {
        arcane_localai::Starts::Command => {
            arcane_localai::command_template::needs(&config.template, &config.template_env)
                .map_or(arcane_localai::OwnedListen::OpenPort, |n| n.listen())
        }
        _ if kind.can_close_its_door() => config.listen,
        _ => arcane_localai::OwnedListen::OpenPort,
    };
    match (listen, kind.starts()) {
        (arcane_localai::OwnedListen::OpenPort, _) => Exposure::OpenPort,
        (_, arcane_localai::Starts::Command) => Exposure::Closed,
        _ => Exposure::Alias,
    }
}

/// The `command` kind's program (a path, or a name found on `PATH`), its template,
/// environment and readiness path.
fn apply_command(
    config: &mut arcane_localai::EngineConfig,
    command: &[String],
    table: &ModelTable,
    base: &Path,
    environment: &crate::Environment,
) -> Result<(), Error> {
    let (program, template) = command.split_first().unwrap_or((&table.id, &[]));
    let executable = if program.contains('/') {
        let path = Path::new(program);
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            base.join(path)
        }
    } else {
        environment.find_program(program).ok_or_else(|| {
            Error::from(
                Refusal::new(
                    codes::ARCANE_NOT_FOUND,
                    format!(
                        "the program `{program}` of model `{}` is not on `PATH`",
                        table.id
                    ),
                    json!({"id": table.id, "program": program}),
                )
                .hint("give its full path as the first element of `command`"),
            )
        })?
    };
    config.executable = Some(executable);
    config.template = template.to_vec();
    config.template_env = table.env.clone();
    config.health = table.health.clone();
    config.require_key = table.require_key;
    config.runtime_version = None;
    Ok(())
}

/// What a model needs on its device, estimated before it loads by its kind's rule
/// (`arcane_registry::estimate`): its weights, the key/value cache of its context, its
/// working memory for `parallel` requests, the engine itself.
fn memory_need(
    config: &arcane_localai::EngineConfig,
    model: &Path,
    parallel: usize,
) -> arcane_registry::MemoryEstimate {
    arcane_registry::estimate(
        config.engine.kind().memory_model(),
        model,
        &config.extra_args,
        parallel,
    )
}

fn keep_alive(id: &str, value: &toml::Value) -> Result<KeepAlive, Error> {
    let parsed = match value {
        toml::Value::Integer(n) => KeepAlive::from_seconds(*n as f64),
        toml::Value::Float(f) => KeepAlive::from_seconds(*f),
        toml::Value::String(text) => KeepAlive::parse(text),
        other => Err(format!("`{other}` is not a duration")),
    };
    parsed.map_err(|why| {
        Refusal::usage(
            format!("`keep_alive` of model `{id}`: {why}"),
            json!({"id": id, "keep_alive": value.to_string()}),
        )
        .into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model loaded at start, or pinned, is meant to be there: without a `keep_alive`
    /// of its own it never unloads for idleness; with one, or with `pin = false`, the
    /// usual rule holds.
    #[test]
    fn a_model_meant_to_be_there_stays_unless_its_table_says_how_long_it_may_idle() {
        let workspace = tempfile::tempdir().unwrap();
        let context = Context::new(workspace.path());
        let idle = |load: Option<&str>, pin: Option<bool>, keep_alive: Option<&str>| {
            let table = ModelTable {
                id: "m".into(),
                url: Some("http://127.0.0.1:9".into()),
                load: load.map(String::from),
                pin,
                keep_alive: keep_alive.map(|k| toml::Value::String(k.into())),
                ..ModelTable::default()
            };
            let base = workspace.path();
            let configuration =
                models(&context, &[table], &HashMap::new(), &[], base, true).unwrap();
            configuration.models[0].keep_alive
        };
        let five_minutes = KeepAlive::For(Duration::from_secs(300));
        assert_eq!(idle(Some("on-start"), None, None), KeepAlive::Never);
        assert_eq!(idle(None, Some(true), None), KeepAlive::Never);
        assert_eq!(idle(None, None, None), five_minutes);
        // `pin = false`: not meant to stay, so the default holds.
        assert_eq!(idle(Some("on-start"), Some(false), None), five_minutes);
        assert_eq!(idle(Some("on-start"), None, Some("5m")), five_minutes);
    }
}
