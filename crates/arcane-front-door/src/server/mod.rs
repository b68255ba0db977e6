//! The Core host as a library: what `arcane serve`, `arcane core --stdio` and a
//! bundle's launcher build, in one place, so another front end (a bridge, a web mode)
//! builds the same host instead of copying the CLI.
//!
//! 1. [`ServerBuilder`]: the host's services from what the caller resolved — the
//!    engines of a plain supervised selection ([`LocalAiService`]), the model gateway,
//!    the device catalog, and any other service (model assets, ONNX sessions) —
//!    into [`HostParts`].
//! 2. [`listen`]: the loopback listener on the given port, else the workspace's saved
//!    one, else a free one (saved for next time).
//! 3. [`publish_endpoint`]: `core.json` (url, pid, token, the files the engines run).
//! 4. [`serve_http`]: the HTTP transport with the right upstream (the gateway, else
//!    the local-AI service), the token file watched for rotation; [`reload_on_sighup`].
//! 5. [`FirstStartWatch`]: when to announce the host, and what its first start ended
//!    as.
//!
//! The caller keeps what is its own: parsing flags and files, rendering events, and
//! signals (it fires [`Host::shutdown_handle`]).

mod first_start;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arcane_report::EventSink;

pub use first_start::{FirstStartWatch, Next, Outcome};

use arcane_core::endpoint::{self, EndpointRecord, Serving};
use arcane_core::localai::{DeviceCatalog, DevicesService, EngineLauncher, LocalAiService};
use arcane_core::logs::{LogBook, Tee};
use arcane_core::service::Service;
use arcane_core::Error;
use arcane_core::{AppInfo, Host};
use arcane_gateway::Gateway;

/// A built host and the services the transports need to reach.
pub struct HostParts {
    /// The host, not started.
    pub host: Host,
    /// The local-AI service of a plain supervised selection.
    pub local_ai: Option<Arc<LocalAiService>>,
    /// The model gateway (then the passthrough's upstream).
    pub gateway: Option<Arc<Gateway>>,
    /// Every engine's output and the host's own lines (`GET /v1/logs`); its budget is
    /// [`arcane_core::logs::DEFAULT_BUDGET`] until [`LogBook::set_budget`] changes it.
    pub logs: Arc<LogBook>,
}

impl HostParts {
    /// The passthrough's upstream: the gateway, else the local-AI service.
    pub fn upstream(&self) -> Option<Arc<dyn crate::passthrough::Upstream>> {
        match (&self.gateway, &self.local_ai) {
            (Some(gateway), _) => Some(gateway.clone()),
            (None, Some(local_ai)) => Some(local_ai.clone()),
            (None, None) => None,
        }
    }
}

/// Builds a host's services (see the module documentation).
pub struct ServerBuilder {
    app: AppInfo,
    version: Option<String>,
    observer: Option<Arc<dyn EventSink>>,
    drain: Duration,
    engines: Vec<Arc<dyn EngineLauncher>>,
    gateway: Option<Arc<Gateway>>,
    devices: Option<Arc<dyn DeviceCatalog>>,
    services: Vec<Arc<dyn Service>>,
}

impl ServerBuilder {
    /// A host for `app` with no service yet and the default drain deadline.
    pub fn new(app: AppInfo) -> Self {
        Self {
            app,
            version: None,
            observer: None,
            drain: arcane_core::host::DEFAULT_DRAIN_DEADLINE,
            engines: Vec::new(),
            gateway: None,
            devices: None,
            services: Vec::new(),
        }
    }

    /// The version the host reports.
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// Where every host event also goes.
    pub fn observer(mut self, observer: Arc<dyn EventSink>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// How long a shutdown waits for accepted work.
    pub fn drain_deadline(mut self, drain: Duration) -> Self {
        self.drain = drain;
        self
    }

    /// The engines of a plain supervised selection (the `local-ai` service).
    pub fn engines(mut self, engines: Vec<Arc<dyn EngineLauncher>>) -> Self {
        self.engines = engines;
        self
    }

    /// The model gateway.
    pub fn gateway(mut self, gateway: Option<Arc<Gateway>>) -> Self {
        self.gateway = gateway;
        self
    }

    /// The device catalog (`execution-devices`): registered when engines or a gateway
    /// are.
    pub fn devices(mut self, devices: Arc<dyn DeviceCatalog>) -> Self {
        self.devices = Some(devices);
        self
    }

    /// Another service (model assets, ONNX sessions, …).
    pub fn service(mut self, service: Arc<dyn Service>) -> Self {
        self.services.push(service);
        self
    }

    /// The host, not started.
    pub fn build(self) -> Result<HostParts, Error> {
        let mut builder = Host::builder(self.app).drain_deadline(self.drain);
        if let Some(version) = self.version {
            builder = builder.version(version);
        }
        // The log book sees every event the host publishes, beside the caller's observer.
        let logs = LogBook::new(arcane_core::logs::DEFAULT_BUDGET);
        builder = builder.observer(match self.observer {
            Some(observer) => Arc::new(Tee(logs.clone(), observer)),
            None => logs.clone(),
        });
        let serves_engines = !self.engines.is_empty() || self.gateway.is_some();
        if let (true, Some(devices)) = (serves_engines, self.devices) {
            builder = builder.service(DevicesService::new(devices))?;
        }
        let mut local_ai = None;
        if !self.engines.is_empty() {
            let service = LocalAiService::new(self.engines);
            builder = builder.service(service.clone())?;
            local_ai = Some(service);
        }
        for service in self.services {
            builder = builder.service(service)?;
        }
        if let Some(gateway) = &self.gateway {
            gateway.log_requests_to(logs.clone());
            builder = builder.service(gateway.clone())?;
        }
        Ok(HostParts {
            host: builder.build(),
            local_ai,
            gateway: self.gateway,
            logs,
        })
    }
}

/// The listener on the saved (or given) port, and the url it answers at.
pub struct Listening {
    /// The bound listener.
    pub listener: tokio::net::TcpListener,
    /// `http://host:port`.
    pub url: String,
    /// The host as written in the url (IPv6 in brackets).
    pub host: String,
    /// The port.
    pub port: u16,
}

/// Binds the loopback listener on `ip`: on `port`, else the workspace's saved port,
/// else a free one, saved for next time (a busy saved port is `CORE_PORT_IN_USE`).
pub async fn listen(workspace: &Path, ip: IpAddr, port: Option<u16>) -> Result<Listening, Error> {
    let saved = endpoint::saved_port(workspace)?;
    let address = SocketAddr::new(ip, port.or(saved).unwrap_or(0));
    let listener = crate::http::bind(address, &endpoint::port_path(workspace)).await?;
    let local = listener.local_addr().map_err(|source| Error::Io {
        operation: "inspect",
        path: "the listener".into(),
        source,
    })?;
    if port.is_none() && saved.is_none() {
        endpoint::save_port(workspace, local.port())?;
    }
    let host = match local {
        SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
        SocketAddr::V4(v4) => v4.ip().to_string(),
    };
    Ok(Listening {
        listener,
        url: format!("http://{host}:{}", local.port()),
        host,
        port: local.port(),
    })
}

/// Writes `core.json`: the url, this pid, the token (`api_key`, else the workspace's
/// own), and the files the engines run.
pub fn publish_endpoint(
    workspace: &Path,
    listening: &Listening,
    api_key: Option<&str>,
    serving: Serving,
) -> Result<(EndpointRecord, PathBuf), Error> {
    let record = EndpointRecord {
        protocol: arcane_core::protocol::PROTOCOL.into(),
        url: listening.url.clone(),
        host: listening.host.clone(),
        port: listening.port,
        pid: std::process::id(),
        token: match api_key {
            Some(key) => key.to_string(),
            None => endpoint::workspace_token(workspace)?,
        },
        started_at: arcane_report::time::now_rfc3339(),
        serving,
    };
    let file = endpoint::write_endpoint(workspace, &record)?;
    Ok((record, file))
}

/// The files a host runs: the gateway's models and executables, and those of the
/// plain engines (`engines`: `(model, executable)` pairs).
pub fn serving(
    gateway: Option<&Gateway>,
    engines: impl IntoIterator<Item = (Option<PathBuf>, Option<PathBuf>)>,
) -> Serving {
    let (mut models, mut executables) = gateway.map(Gateway::files).unwrap_or_default();
    for (model, executable) in engines {
        models.extend(model);
        executables.extend(executable);
    }
    Serving {
        models,
        executables,
    }
}

/// Serves HTTP on `listener` (RPC, events, the passthrough to the host's upstream)
/// with `token`; `token_file`, when given, is watched so a rotation takes effect at
/// once; `workspace`'s application keys (`arcane token add`, [`arcane_core::keys`])
/// are admitted beside it; pages of `allowed_origins` may read the answers (CORS); `web`
/// is the application's packaged web, served at `/ui/app/`.
pub fn serve_http(
    parts: &HostParts,
    workspace: &std::path::Path,
    listener: tokio::net::TcpListener,
    token: String,
    token_file: Option<PathBuf>,
    allowed_origins: crate::origins::AllowedOrigins,
    web: Option<Arc<crate::web::WebRoot>>,
) -> tokio::task::JoinHandle<Result<(), Error>> {
    let mut options = crate::http::HttpOptions::new(token);
    options.token_file = token_file;
    options.keys = Some(Arc::new(arcane_core::keys::KeyBook::new(workspace)));
    options.allowed_origins = allowed_origins;
    options.logs = Some(parts.logs.clone());
    options.web = web;
    options.upstream = parts.upstream();
    tokio::spawn(crate::http::serve(parts.host.clone(), listener, options))
}

/// SIGHUP makes the gateway read its configuration again (its
/// `local-ai.models.reloaded` event says what changed, or why nothing did).
pub fn reload_on_sighup(gateway: Arc<Gateway>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        return;
    };
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            let _ = gateway.reload().await;
        }
    });
}
