//! [`EngineConfig`]: everything the supervisor needs to probe, adopt or start one
//! engine, validated into a launch-ready form before any side effect.

use std::path::{Path, PathBuf};
use std::time::Duration;

use arcane_devices::Backend;
use serde_json::json;

use arcane_workspace::command_template::{self, TemplateNeeds};
use arcane_workspace::{DevicePlan, Starts};

use crate::endpoint::{ApiKey, Endpoint, EngineAddress};
use crate::Error;

/// An inference engine Arcane can supervise: the registry's engine type, one
/// definition shared by registration, supervision and the Core host.
pub use arcane_registry::Engine;

/// What to do when an owned engine exits by itself after it was ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestartPolicy {
    /// Report the crash (`error` state) and stay down.
    #[default]
    Never,
    /// Restart it after `backoff` (doubling each time, at most 30 s), up to
    /// `max_restarts` times in the server's life.
    OnFailure {
        /// The most restarts.
        max_restarts: u32,
        /// The first delay before a restart.
        backoff: Duration,
    },
}

/// Where an engine Arcane starts listens (defined with the engine kinds: each kind
/// says its default and whether it can close its door).
pub use arcane_workspace::OwnedListen;

/// One engine to supervise. Build with [`EngineConfig::new`] and set fields; the
/// supervisor validates it before probing or touching anything.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EngineConfig {
    /// The engine.
    pub engine: Engine,
    /// The server id in events and ownership records (default: the engine id).
    pub id: String,
    /// The listener url (default: [`Engine::default_url`]; the `command` kind listens
    /// where its template's placeholders say, on a port Arcane chooses at each start).
    pub url: String,
    /// A single GGUF model (`--model`; relative paths resolve against the workspace).
    pub model: Option<PathBuf>,
    /// Router mode (`--models-dir`), or Ollama's `OLLAMA_MODELS`. Default:
    /// `<workspace>/.arcane/models/<engine>` when no `model` is set.
    pub models_dir: Option<PathBuf>,
    /// `--alias` (llama.cpp).
    pub alias: Option<String>,
    /// The execution target: a device id from `arcane devices`, or `cpu` (llama.cpp).
    /// Setting it requires a managed server: an external one is never adopted.
    pub device: Option<String>,
    /// The requested compute backend; anything but `auto` requires a managed server.
    pub backend: Backend,
    /// The backend the runtime was built with (from the registry; `auto` = unknown).
    pub runtime_backend: Backend,
    /// A requested engine version, checked against what the running server reports.
    pub version: Option<String>,
    /// The version the registry recorded for the executable (`--version` output),
    /// used when a llama.cpp server does not report its build.
    pub runtime_version: Option<String>,
    /// Extra engine arguments (after `--` on the command line).
    pub extra_args: Vec<String>,
    /// The auxiliary models the engine is given ([`arcane_workspace::AuxModel`]): each
    /// slot's flag and the registered model's path, resolved by whoever read the
    /// model's table.
    pub aux_models: Vec<(&'static str, PathBuf)>,
    /// The `command` kind's arguments after its program ([`EngineConfig::executable`]),
    /// with placeholders (`${PORT}`, `${SOCKET}`, `${API_KEY_FILE}`, `${MODEL}`; see
    /// [`arcane_workspace::command_template`]).
    pub template: Vec<String>,
    /// The `command` kind's own environment (values may use the same placeholders).
    pub template_env: std::collections::BTreeMap<String, String>,
    /// The readiness path, when not the kind's own (the `command` kind's `health`).
    pub health: Option<String>,
    /// A `command` server behind `${API_KEY_FILE}` that answers without the key once
    /// ready is refused (stopped, the start failed) instead of served and reported
    /// reachable without the token (`require_key = true`).
    pub require_key: bool,
    /// The engine executable to start when nothing listens (none: adopt only).
    pub executable: Option<PathBuf>,
    /// Directories the executable loads shared libraries from: first on the engine's
    /// loader search path (the rule is [`arcane_process::loader_path`]).
    pub library_dirs: Vec<PathBuf>,
    /// The runtime library a builtin engine loads ([`Starts::Builtin`] kinds that run
    /// on ONNX Runtime: Piper voices), passed on its command line.
    pub runtime_library: Option<PathBuf>,
    /// The loader search path Arcane was started with (the value of
    /// [`arcane_process::LOADER_PATH_VARIABLE`]), kept after `library_dirs` so the
    /// libraries it points at still resolve. `None` when the caller does not pass it:
    /// the engine then inherits the variable untouched when there are no
    /// `library_dirs`, and gets only `library_dirs` otherwise.
    pub inherited_loader_path: Option<std::ffi::OsString>,
    /// How long an owned engine may take to become ready (default 120 s).
    pub startup_timeout: Duration,
    /// How long an owned engine may stay loading without printing anything (default 60 s).
    pub stall_timeout: Duration,
    /// SIGTERM-to-SIGKILL grace when stopping an owned engine (default 10 s).
    pub stop_grace: Duration,
    /// The timeout of one readiness probe (default 2 s).
    pub probe_timeout: Duration,
    /// How often a ready owned engine's readiness is probed (default 5 s, each probe
    /// waiting as long); after [`EngineConfig::watchdog_misses`] unanswered probes in a
    /// row it is stopped and reported failed, so requests fail at once instead of
    /// waiting on an engine that stopped answering (`SIGSTOP`, a hang).
    pub watchdog_interval: Duration,
    /// How many unanswered probes in a row make a ready engine unresponsive (default 3;
    /// 0 turns the watchdog off).
    pub watchdog_misses: u32,
    /// What to do when an owned engine crashes after it was ready.
    pub restart: RestartPolicy,
    /// Where an engine Arcane starts listens (the url is still probed first: a server
    /// that answers there is adopted). Ollama always uses [`OwnedListen::OpenPort`].
    pub listen: OwnedListen,
    /// Adopt a server that answers at the url even though `device` or `backend` is
    /// set: they then apply only to a server Arcane starts (the embedded default
    /// pointed at a url).
    pub adopt_any: bool,
    /// Probe the url first and adopt a server that answers there (the SDK's rule, and
    /// the default). Off for a model of the gateway, which always runs its own engine:
    /// whatever listens at the default url is never adopted in its place.
    pub adopt_existing: bool,
    /// Why Arcane must not start this engine itself (it can only adopt); said in the
    /// error when nothing answers at the url.
    pub cannot_start: Option<String>,
    /// Arm the parent-death signal on the child (always on; tests turn it off to
    /// simulate an orphan left by a killed Arcane).
    #[doc(hidden)]
    pub parent_death_signal: bool,
    /// The only CPUs an owned engine (and every thread it starts) may run on (`cpus =
    /// "0-3"`); checked from `/proc/PID/status` once it runs.
    pub cpus: Option<arcane_process::CpuSet>,
}

impl Default for EngineConfig {
    /// llama.cpp with its defaults ([`EngineConfig::new`]).
    fn default() -> Self {
        Self::new(Engine::DEFAULT)
    }
}

impl EngineConfig {
    /// The defaults for `engine`: its default url, no model, automatic device.
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            id: engine.as_str().to_string(),
            url: engine.default_url().unwrap_or(NO_URL).to_string(),
            model: None,
            models_dir: None,
            alias: None,
            device: None,
            backend: Backend::Auto,
            runtime_backend: Backend::Auto,
            version: None,
            runtime_version: None,
            extra_args: Vec::new(),
            aux_models: Vec::new(),
            template: Vec::new(),
            template_env: Default::default(),
            runtime_library: None,
            health: None,
            require_key: false,
            executable: None,
            library_dirs: Vec::new(),
            inherited_loader_path: None,
            startup_timeout: Duration::from_secs(120),
            stall_timeout: Duration::from_secs(60),
            stop_grace: Duration::from_secs(10),
            probe_timeout: Duration::from_secs(2),
            watchdog_interval: Duration::from_secs(5),
            watchdog_misses: 3,
            restart: RestartPolicy::Never,
            listen: engine.kind().default_listen(),
            adopt_any: false,
            adopt_existing: true,
            cannot_start: None,
            parent_death_signal: true,
            cpus: None,
        }
    }

    /// The managed selection this configuration requires, as text (`device=cpu`,
    /// `backend=cuda`), or `None` when an external server may be adopted.
    pub fn managed_selection(&self) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(device) = &self.device {
            parts.push(format!("device={device}"));
        }
        if self.backend != Backend::Auto {
            parts.push(format!("backend={}", self.backend));
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    /// Checks everything that can be checked without I/O (the `command` kind also
    /// chooses its free port here, once per start).
    pub(crate) fn validate(&self, workspace: &Path) -> Result<Validated, Error> {
        let kind = self.engine.kind();
        if self.id.is_empty()
            || !self
                .id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        {
            return Err(Error::config(
                format!(
                    "the server id `{}` may use only letters, digits, `.`, `-` and `_`",
                    self.id
                ),
                json!({"id": self.id}),
            ));
        }
        let template = match kind.starts() {
            Starts::Worker => {
                return Err(Error::config(
                    format!(
                        "`{}` is not a server: its sessions run in the Core host's workers",
                        self.engine
                    ),
                    json!({"engine": self.engine}),
                ))
            }
            Starts::Command => Some(self.check_template()?),
            Starts::Server { .. } | Starts::Builtin { .. } => None,
        };
        self.check_kind_rules()?;
        self.check_values()?;
        let absolute = |path: &Path| {
            if path.is_absolute() {
                path.to_path_buf()
            } else {
                workspace.join(path)
            }
        };
        let model = self.model.as_deref().map(absolute);
        let router = kind.takes_model_file() && template.is_none();
        let models_dir = match (&self.model, &self.models_dir) {
            (Some(_), None) if kind.takes_model_file() => None,
            (_, Some(dir)) => Some(absolute(dir)),
            (_, None) if template.is_some() => None,
            (_, None) => {
                let _ = router;
                Some(arcane_workspace::layout::engine_models_dir(
                    workspace,
                    self.engine,
                ))
            }
        };
        let (endpoint, owned) = match template {
            Some(needs) => self.command_address(workspace, needs)?,
            None => {
                let listen = self.listen_of_kind();
                // A kind with no listener url of its own (Arcane's builtin engines) on
                // the private socket has no url to parse: its errors name the socket.
                let url = if self.url == NO_URL && listen == OwnedListen::PrivateSocket {
                    SOCKET_ONLY_URL
                } else {
                    &self.url
                };
                let endpoint = Endpoint::parse(url)?;
                let owned = self.owned_address(workspace, &endpoint, listen)?;
                (endpoint, owned)
            }
        };
        let closes_selection = kind.device_plan() != DevicePlan::EngineChooses;
        Ok(Validated {
            endpoint,
            owned,
            model,
            models_dir,
            selection: (closes_selection && !self.adopt_any)
                .then(|| self.managed_selection())
                .flatten(),
        })
    }

    /// Checks the configuration as a start would, without starting anything: the
    /// errors a start would give for the configuration itself (an unknown placeholder,
    /// a kind's rule), early — when a gateway's table is read, not at its first load.
    pub fn check(&self, workspace: &Path) -> Result<(), Error> {
        self.validate(workspace).map(|_| ())
    }

    /// Whether this configuration may adopt a server that answers at its url: never
    /// for the `command` kind (its port is chosen at each start).
    pub(crate) fn adopts(&self) -> bool {
        self.adopt_existing
            && !matches!(
                self.engine.kind().starts(),
                Starts::Command | Starts::Builtin { .. }
            )
    }

    /// The readiness path polled: the configured one, else the kind's.
    pub(crate) fn health_path(&self) -> &str {
        self.health
            .as_deref()
            .unwrap_or_else(|| self.engine.kind().health_path())
    }

    /// What the kind forbids: a device selection on a kind that chooses its own
    /// devices, a model on a kind that takes none.
    fn check_kind_rules(&self) -> Result<(), Error> {
        let kind = self.engine.kind();
        if kind.device_plan() == DevicePlan::EngineChooses {
            if let Some(selection) = self.managed_selection() {
                return Err(Error::config(
                    format!(
                        "`{selection}` does not apply to `{}`: it chooses its own devices",
                        self.engine
                    ),
                    json!({"engine": self.engine, "selection": selection}),
                ));
            }
        }
        if kind.device_plan() == DevicePlan::CpuOnly {
            let device = self.device.as_deref().unwrap_or("cpu");
            let backend_ok = matches!(self.backend, Backend::Auto | Backend::Cpu);
            if device != "cpu" || !backend_ok {
                let device = if backend_ok {
                    device.to_string()
                } else {
                    format!("{device} ({})", self.backend)
                };
                return Err(Error::TargetUnsupported {
                    engine: self.engine.to_string(),
                    device,
                });
            }
        }
        if !kind.takes_model_file() && (self.model.is_some() || self.alias.is_some()) {
            return Err(Error::config(
                format!(
                    "`model` and `alias` do not apply to `{}`: it serves the models in its models directory",
                    self.engine
                ),
                json!({"engine": self.engine}),
            ));
        }
        let aux_flags: Vec<&str> = kind.aux_models().iter().map(|aux| aux.flag).collect();
        if let Some(arg) = arcane_workspace::door_arg(&aux_flags, &self.extra_args) {
            let aux = kind
                .aux_models()
                .iter()
                .find(|aux| arg.starts_with(aux.flag));
            let key = aux.map_or("", |aux| aux.key);
            return Err(Error::config(
                format!(
                    "the engine argument `{arg}` of `{}` names a file Arcane passes itself: register the model (`arcane model add`) and name it as `{key} = \"ID\"` in the model's table",
                    self.id
                ),
                json!({"id": self.id, "argument": arg, "key": key}),
            ));
        }
        if let Some(arg) = arcane_workspace::door_arg(kind.door_args(), &self.extra_args) {
            return Err(Error::config(
                format!(
                    "the engine argument `{arg}` would decide where or how `{}` listens or authenticates, which Arcane sets itself: give a `url` (`--url`) for a port behind a key only the Core knows, or a `command` model to run the server exactly as written",
                    self.id
                ),
                json!({"id": self.id, "argument": arg, "refused": kind.door_args()}),
            ));
        }
        if kind.takes_model_file()
            && self.template.is_empty()
            && self.model.is_some()
            && self.models_dir.is_some()
        {
            return Err(Error::config(
                "`model` and `models_dir` exclude each other (one model, or router mode)",
                json!({"model": self.model, "modelsDir": self.models_dir}),
            ));
        }
        Ok(())
    }

    /// Empty or zero values.
    fn check_values(&self) -> Result<(), Error> {
        if let Some(device) = &self.device {
            if device.trim().is_empty() {
                return Err(Error::config(
                    "the device id is empty",
                    json!({"device": device}),
                ));
            }
        }
        if matches!(self.version.as_deref(), Some("")) {
            return Err(Error::config(
                "the requested version is empty",
                json!({"version": ""}),
            ));
        }
        if let Some(health) = &self.health {
            if !health.starts_with('/') {
                return Err(Error::config(
                    format!("the readiness path `{health}` must start with `/`"),
                    json!({"health": health}),
                ));
            }
        }
        for (name, value) in [
            ("startup_timeout", self.startup_timeout),
            ("stall_timeout", self.stall_timeout),
            ("probe_timeout", self.probe_timeout),
        ] {
            if value.is_zero() {
                return Err(Error::config(
                    format!("`{name}` must be more than zero"),
                    json!({"field": name}),
                ));
            }
        }
        Ok(())
    }

    /// The `command` kind's template: a program, known placeholders, one of `${PORT}`
    /// and `${SOCKET}`, a model when it names `${MODEL}`, and no variable that would
    /// undo Arcane's device plan or ownership proof.
    fn check_template(&self) -> Result<TemplateNeeds, Error> {
        if self.executable.is_none() {
            return Err(Error::config(
                "the `command` kind needs a command: its first element is the program",
                json!({"engine": self.engine}),
            ));
        }
        let needs = command_template::needs(&self.template, &self.template_env).map_err(|e| {
            Error::config(
                format!("`command` of `{}`: {}", self.id, e.why),
                json!({"id": self.id, "value": e.value}),
            )
        })?;
        if needs.model && self.model.is_none() {
            return Err(Error::config(
                format!(
                    "`command` of `{}` names `${{MODEL}}` but no `model` is set",
                    self.id
                ),
                json!({"id": self.id}),
            ));
        }
        let reserved = |name: &str| {
            name == crate::command::NONCE_VARIABLE
                || (self.device.is_some() && arcane_devices::is_device_variable(name))
        };
        if let Some(name) = self.template_env.keys().find(|n| reserved(n)) {
            return Err(Error::config(
                format!(
                    "`env` of `{}` sets `{name}`, which Arcane sets itself (`device` pins the engine: use it instead)",
                    self.id
                ),
                json!({"id": self.id, "variable": name}),
            ));
        }
        Ok(needs)
    }

    /// Where the kind listens when Arcane starts it: its own default unless it can be
    /// told otherwise.
    fn listen_of_kind(&self) -> OwnedListen {
        if self.engine.kind().can_close_its_door() {
            self.listen
        } else {
            OwnedListen::OpenPort
        }
    }

    /// The `command` kind's address for this start: a socket in the private run
    /// directory, or a free loopback port; with a key when the template asks for one.
    fn command_address(
        &self,
        workspace: &Path,
        needs: TemplateNeeds,
    ) -> Result<(Endpoint, Owned), Error> {
        let port = if needs.port {
            free_port().map_err(|source| Error::Io {
                operation: "choose a free port on",
                path: "127.0.0.1".into(),
                source,
            })?
        } else {
            0
        };
        let endpoint = Endpoint::loopback(port);
        let mut owned = self.owned_address(workspace, &endpoint, needs.listen())?;
        if needs.key_file && owned.key.is_none() {
            owned.key = Some(self.new_key(workspace)?);
        }
        Ok((endpoint, owned))
    }

    fn new_key(&self, workspace: &Path) -> Result<ApiKey, Error> {
        ApiKey::generate().map_err(|source| Error::Io {
            operation: "generate",
            path: arcane_workspace::layout::engine_key(workspace, &self.id),
            source,
        })
    }

    /// Where an engine Arcane starts listens, and its key (see [`OwnedListen`]).
    fn owned_address(
        &self,
        workspace: &Path,
        endpoint: &Endpoint,
        listen: OwnedListen,
    ) -> Result<Owned, Error> {
        match listen {
            OwnedListen::OpenPort => Ok(Owned {
                address: EngineAddress::Tcp(endpoint.clone()),
                key: None,
            }),
            OwnedListen::KeyedPort => Ok(Owned {
                address: EngineAddress::Tcp(endpoint.clone()),
                key: Some(self.new_key(workspace)?),
            }),
            OwnedListen::PrivateSocket => {
                let socket = arcane_workspace::layout::engine_socket(workspace, &self.id);
                // `sun_path` holds 108 bytes with its terminating NUL.
                let length = socket.as_os_str().len();
                if length > MAX_SOCKET_PATH {
                    return Err(Error::config(
                        format!(
                            "the engine socket `{}` is {length} bytes long; Unix sockets allow {MAX_SOCKET_PATH}",
                            socket.display()
                        ),
                        json!({"socket": socket, "length": length, "limit": MAX_SOCKET_PATH}),
                    ));
                }
                Ok(Owned {
                    address: EngineAddress::Unix(socket),
                    key: None,
                })
            }
        }
    }
}

/// The url of a kind with no default listener (before a start chooses one).
const NO_URL: &str = "http://127.0.0.1:0";

/// The endpoint of an engine with no url that listens only on its private socket: never
/// dialled (an engine on the socket is reached through it, and never adopted).
const SOCKET_ONLY_URL: &str = "http://127.0.0.1:1";

/// A loopback port nothing listens on now (the kernel's choice). Another process may
/// take it before the engine binds it; the engine then fails to start with its own
/// "address in use", which the supervisor reports.
fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

/// The longest Unix socket path (`sun_path` less its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Where an engine Arcane starts listens, and the key it demands.
#[derive(Debug, Clone)]
pub(crate) struct Owned {
    pub address: EngineAddress,
    pub key: Option<ApiKey>,
}

/// A configuration that passed [`EngineConfig::validate`].
#[derive(Debug, Clone)]
pub(crate) struct Validated {
    pub endpoint: Endpoint,
    /// Where a started engine listens.
    pub owned: Owned,
    pub model: Option<PathBuf>,
    pub models_dir: Option<PathBuf>,
    pub selection: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_urls_follow_the_sdk() {
        assert_eq!(
            EngineConfig::new(Engine::LlamaCpp).url,
            "http://127.0.0.1:8080"
        );
        assert_eq!(
            EngineConfig::new(Engine::Ollama).url,
            "http://127.0.0.1:11434"
        );
    }

    #[test]
    fn a_device_or_backend_requires_a_managed_server() {
        let mut config = EngineConfig::new(Engine::LlamaCpp);
        assert_eq!(config.managed_selection(), None);
        config.device = Some("cpu".into());
        config.backend = Backend::Cpu;
        assert_eq!(
            config.managed_selection().as_deref(),
            Some("device=cpu, backend=cpu")
        );
    }

    #[test]
    fn relative_models_resolve_against_the_workspace() {
        let mut config = EngineConfig::new(Engine::LlamaCpp);
        config.model = Some("models/a.gguf".into());
        let validated = config.validate(Path::new("/ws")).unwrap();
        assert_eq!(
            validated.model.as_deref(),
            Some(Path::new("/ws/models/a.gguf"))
        );
        assert_eq!(validated.models_dir, None);
        config.model = None;
        let validated = config.validate(Path::new("/ws")).unwrap();
        assert_eq!(
            validated.models_dir.as_deref(),
            Some(Path::new("/ws/.arcane/models/llama.cpp"))
        );
    }

    #[test]
    fn bad_values_are_refused_before_anything_happens() {
        let mut config = EngineConfig::new(Engine::Ollama);
        config.device = Some("cpu".into());
        assert!(config.validate(Path::new("/ws")).is_err());
        let mut config = EngineConfig::new(Engine::LlamaCpp);
        config.url = "https://127.0.0.1:1".into();
        assert!(config.validate(Path::new("/ws")).is_err());
        let mut config = EngineConfig::new(Engine::LlamaCpp);
        config.id = "../x".into();
        assert!(config.validate(Path::new("/ws")).is_err());
    }
}
