//! The production [`EngineLauncher`] and [`DeviceCatalog`]: `arcane-localai`'s
//! supervisor (probe, adopt or own, exact device, readiness, clean stop) and
//! `arcane-devices`' live catalog.

use std::path::PathBuf;
use std::sync::Arc;

use arcane_localai::{Engine, EngineConfig, Server, ServerSnapshot, StateObserver, Supervisor};
use arcane_report::{CancelToken, EventSink};
use serde_json::{json, Value};

use crate::error::Error;
use crate::localai::{DeviceCatalog, EngineHandle, EngineLauncher};
use crate::service::{BoxError, BoxFuture};

/// A check run before every launch (blocking: it may hash a file), e.g. that the
/// model file is still the one registered.
pub type LaunchCheck = Arc<dyn Fn() -> Result<(), BoxError> + Send + Sync>;

/// Launches one engine through [`Supervisor::start`].
pub struct SupervisedLauncher {
    workspace: PathBuf,
    config: EngineConfig,
    check: Option<LaunchCheck>,
}

impl SupervisedLauncher {
    /// A launcher for `config`, keeping ownership records under `workspace`.
    pub fn new(workspace: impl Into<PathBuf>, config: EngineConfig) -> Arc<Self> {
        Self::checked(workspace, config, None)
    }

    /// [`SupervisedLauncher::new`], running `check` before every launch (a load of the
    /// gateway, not only the host's start): a failed check fails the launch, and
    /// nothing is started.
    pub fn checked(
        workspace: impl Into<PathBuf>,
        config: EngineConfig,
        check: Option<LaunchCheck>,
    ) -> Arc<Self> {
        Arc::new(Self {
            workspace: workspace.into(),
            config,
            check,
        })
    }
}

/// The socket an engine of `config` listens on whenever Arcane starts it, or `None`
/// when that is not certain before a start: a kind that may adopt a server at its url,
/// or one on a port. (The supervisor decides the same way when it starts the engine:
/// a `command` on `${SOCKET}`; a kind Arcane always starts itself, whose door it can
/// close, set to the private socket.)
fn private_socket(workspace: &std::path::Path, config: &EngineConfig) -> Option<PathBuf> {
    use arcane_localai::{command_template, OwnedListen, Starts};
    let kind = config.engine.kind();
    let listen = match kind.starts() {
        Starts::Command => command_template::needs(&config.template, &config.template_env)
            .ok()?
            .listen(),
        Starts::Builtin { .. } if kind.can_close_its_door() => config.listen,
        _ if !config.adopt_existing && kind.can_close_its_door() => config.listen,
        _ => return None,
    };
    (listen == OwnedListen::PrivateSocket)
        .then(|| arcane_workspace::layout::engine_socket(workspace, &config.id))
}

struct Supervised {
    server: Server,
}

impl EngineHandle for Supervised {
    fn snapshot(&self) -> ServerSnapshot {
        self.server.snapshot()
    }

    fn stop(self: Box<Self>) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move {
            // `close` stops an owned server (SIGTERM to its group, grace, SIGKILL) and
            // only releases an adopted one; either way it reports, never fails.
            let _report = self.server.close().await;
            Ok(())
        })
    }
}

impl EngineLauncher for SupervisedLauncher {
    fn runtime(&self) -> Engine {
        self.config.engine
    }

    /// The configured url, except for an engine that can only ever listen on its
    /// private socket: that socket (`unix:<path>`, as the supervisor names it once the
    /// engine runs), so nothing shows the placeholder url of a port not chosen yet
    /// (`http://127.0.0.1:0`) before the first start.
    fn url(&self) -> String {
        match private_socket(&self.workspace, &self.config) {
            Some(socket) => format!("unix:{}", socket.display()),
            None => self.config.url.clone(),
        }
    }

    fn files(&self) -> (Option<PathBuf>, Option<PathBuf>) {
        (self.config.model.clone(), self.config.executable.clone())
    }

    fn args(&self) -> Vec<String> {
        self.config.extra_args.clone()
    }

    fn launch(
        &self,
        events: Arc<dyn EventSink>,
        observer: StateObserver,
        cancel: CancelToken,
    ) -> BoxFuture<'static, Result<Box<dyn EngineHandle>, BoxError>> {
        let supervisor = Supervisor::new(self.workspace.clone(), events).with_observer(observer);
        let config = self.config.clone();
        let check = self.check.clone();
        Box::pin(async move {
            if let Some(check) = check {
                tokio::task::spawn_blocking(move || check())
                    .await
                    .map_err(|e| {
                        Box::new(Error::Io {
                            operation: "check",
                            path: "the model file".into(),
                            source: std::io::Error::other(e),
                        }) as BoxError
                    })??;
            }
            match supervisor.start(config, cancel).await {
                Ok(server) => Ok(Box::new(Supervised { server }) as Box<dyn EngineHandle>),
                Err(error) => Err(Box::new(error) as BoxError),
            }
        })
    }
}

/// The live device catalog (`arcane_devices::probe`), cached until a refresh.
#[derive(Default)]
pub struct LiveDevices {
    cached: std::sync::Mutex<Option<arcane_devices::Catalog>>,
}

impl LiveDevices {
    /// A catalog that probes on first use (creating it does no I/O).
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn catalog(&self, refresh: bool) -> arcane_devices::Catalog {
        let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        if refresh || cached.is_none() {
            *cached = Some(arcane_devices::probe());
        }
        cached.clone().unwrap_or_else(arcane_devices::probe)
    }
}

impl DeviceCatalog for LiveDevices {
    fn devices(&self, refresh: bool) -> Result<Value, BoxError> {
        Ok(serde_json::to_value(self.catalog(refresh)).unwrap_or(Value::Null))
    }

    fn resolve(&self, target: &Value) -> Result<Value, BoxError> {
        let id = match target {
            Value::String(id) => id.clone(),
            Value::Object(map) => match map.get("deviceId").and_then(Value::as_str) {
                Some(id) => id.to_string(),
                None => {
                    return Err(Box::new(Error::usage(
                        "`executionTarget` needs a `deviceId`",
                        json!({"executionTarget": target}),
                    )))
                }
            },
            _ => {
                return Err(Box::new(Error::usage(
                    "`executionTarget` must be `{deviceId}` or a device id",
                    json!({"executionTarget": target}),
                )))
            }
        };
        let resolution = arcane_devices::resolve_target(&id, &self.catalog(true));
        Ok(serde_json::to_value(resolution).unwrap_or(Value::Null))
    }
}
