//! What Arcane's own engines (`arcane __whisper-worker`, `arcane __piper-worker`) share
//! on the command line: where they listen (`--socket`, or `--host`/`--port` with
//! `--api-key-file`), the model, the thread count, and the runtime that serves them
//! ([`arcane_worker_http`]). The supervisor writes these flags
//! (`arcane_workspace`'s builtin command line); nobody else needs to.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use arcane_worker_http::{Listen, WorkerServer};

/// The flags every builtin engine takes.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// Listen on this Unix socket (created, mode 0600).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["host", "port"])]
    pub socket: Option<PathBuf>,

    /// Listen on this loopback host (with `--port`).
    #[arg(long, value_name = "HOST", requires = "port")]
    pub host: Option<IpAddr>,

    /// Listen on this port (with `--host`).
    #[arg(long, value_name = "PORT", requires = "host")]
    pub port: Option<u16>,

    /// Demand the key in this file on every request but `GET /health`.
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,

    /// The model file.
    #[arg(long, value_name = "PATH")]
    pub model: PathBuf,

    /// Threads the engine computes with (default: the CPUs this process may use, at
    /// most 8).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
}

impl EngineArgs {
    /// The thread count to use.
    pub fn threads(&self) -> usize {
        self.threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get().min(8))
                .unwrap_or(1)
        })
    }

    fn listen(&self) -> Result<Listen, String> {
        match (&self.socket, self.host, self.port) {
            (Some(socket), _, _) => Ok(Listen::Socket(socket.clone())),
            (None, Some(host), Some(port)) if host.is_loopback() => {
                Ok(Listen::Tcp(SocketAddr::new(host, port)))
            }
            (None, Some(host), Some(_)) => Err(format!(
                "`{host}` is not a loopback address: an engine listens on loopback only"
            )),
            _ => Err("give `--socket PATH` or `--host HOST --port PORT`".into()),
        }
    }
}

/// Serves `server` where `args` say until the process is stopped; a failure to start
/// is said on stderr (the supervisor keeps an engine's last lines) and exits 1.
#[allow(clippy::print_stderr)]
pub fn serve(name: &str, args: &EngineArgs, server: WorkerServer) -> u8 {
    let started = args.listen().and_then(|listen| {
        let server = server
            .key_file(args.api_key_file.as_deref())
            .map_err(|e| format!("the key file cannot be read: {e}"))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime
            .block_on(server.serve(listen))
            .map_err(|e| format!("cannot listen: {e}"))
    });
    match started {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("{name}: {error}");
            1
        }
    }
}
