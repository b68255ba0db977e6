//! What the engine benchmarks share: llama-server started by hand (the baseline every
//! engine benchmark compares with) and a gateway behind the Core's HTTP front door.
#![allow(dead_code)] // each benchmark uses what it needs

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arcane_core::{AppInfo, Host};
use arcane_front_door::http::{
    engine_client, full, Deadlines, EngineAccess, EngineClient, HttpOptions,
};
use arcane_gateway::Gateway;
use arcane_localai::{EngineAddress, EngineConfig};
use http_body_util::BodyExt;

/// A raw llama-server on a Unix socket: started with `args`, waited for until
/// `/health` answers, stopped with SIGTERM as Arcane stops its engines.
pub struct Raw(std::process::Child);

impl Raw {
    pub async fn start(server: &Path, model: &Path, socket: &Path, args: &[&str]) -> Raw {
        let _ = std::fs::remove_file(socket);
        let raw = Raw(std::process::Command::new(server)
            .arg("--host")
            .arg(socket)
            .arg("--model")
            .arg(model)
            .args(["--device", "none", "--gpu-layers", "0"])
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn llama-server"));
        let (client, access) = (engine_client(), unix(socket));
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "llama-server never answered /health on {}",
                socket.display()
            );
            let request = access
                .request(hyper::Method::GET, "/health")
                .body(full(""))
                .unwrap();
            let answer = client
                .send_to(
                    &access,
                    request,
                    Deadlines::QUICK,
                    arcane_core::Peer::Engine,
                )
                .await;
            if answer.is_ok_and(|response| response.status().is_success()) {
                return raw;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// SIGTERM, then the wait.
    pub fn stop(mut self) {
        // SAFETY: kill(2) on the pid of a child this benchmark started and has not
        // reaped yet.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let _ = self.0.wait();
    }
}

/// The engine at `socket`, asked directly.
pub fn unix(socket: &Path) -> EngineAccess {
    EngineAccess {
        address: EngineAddress::Unix(socket.to_path_buf()),
        key: None,
    }
}

/// The Core's front door at `url`, with `token`, as an access clients send to.
pub fn core_access(url: &str, token: &str) -> EngineAccess {
    let mut access = EngineAccess::tcp(url).unwrap();
    access.key = Some(arcane_localai::ApiKey::from_secret(token));
    access
}

/// `gateway` as a started host's service behind HTTP on a fresh loopback port: the
/// host, its URL and its token.
pub async fn serve_gateway(gateway: Arc<Gateway>) -> (Host, String, String) {
    serve_observed(gateway, None).await
}

/// [`serve_gateway`], with `observer` seeing every event the host publishes.
pub async fn serve_observed(
    gateway: Arc<Gateway>,
    observer: Option<Arc<dyn arcane_report::EventSink>>,
) -> (Host, String, String) {
    serve_with(gateway, observer, None).await
}

/// [`serve_gateway`], accepting the application keys of `keys` beside its token.
pub async fn serve_keyed(
    gateway: Arc<Gateway>,
    keys: Arc<arcane_core::keys::KeyBook>,
) -> (Host, String, String) {
    serve_with(gateway, None, Some(keys)).await
}

async fn serve_with(
    gateway: Arc<Gateway>,
    observer: Option<Arc<dyn arcane_report::EventSink>>,
    keys: Option<Arc<arcane_core::keys::KeyBook>>,
) -> (Host, String, String) {
    let mut builder = Host::builder(AppInfo::default());
    if let Some(observer) = observer {
        builder = builder.observer(observer);
    }
    let host = builder.service(gateway.clone()).unwrap().build();
    host.start();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let token = arcane_core::endpoint::new_token().unwrap();
    let mut options = HttpOptions::new(token.clone()).upstream(gateway);
    options.keys = keys;
    tokio::spawn(arcane_front_door::http::serve(
        host.clone(),
        listener,
        options,
    ));
    (host, url, token)
}

/// The llama.cpp engine `id` (its alias too): `server` with `model` on the CPU, with
/// `args`.
pub fn llama_config(id: &str, server: &Path, model: &Path, args: &[&str]) -> EngineConfig {
    let mut config = EngineConfig::new(arcane_localai::Engine::LlamaCpp);
    config.id = id.into();
    config.alias = Some(id.into());
    config.executable = Some(server.to_path_buf());
    config.model = Some(model.to_path_buf());
    config.device = Some("cpu".into());
    config.extra_args = args.iter().map(|a| a.to_string()).collect();
    config
}

/// Calls the gateway's `method` (`models.load`, `models.unload`) on `model` through the
/// Core's `/v1/rpc`; returns once it answered, and panics unless it succeeded (a load
/// answers once the model is ready).
pub async fn rpc(client: &EngineClient, url: &str, token: &str, method: &str, model: &str) {
    let body = serde_json::json!({"protocol": "arcane/1", "type": "request", "id": "b", "method": method, "parameters": {"model": model}})
        .to_string();
    let request = hyper::Request::post(format!("{url}/v1/rpc"))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(full(body))
        .unwrap();
    let response = client
        .send(request, Deadlines::GENERATION, arcane_core::Peer::Host)
        .await
        .unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(value["ok"], true, "{value}");
}
