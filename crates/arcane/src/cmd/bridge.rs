//! `arcane core --stdio` on a workspace whose host already runs: a bridge. It proves
//! the running host holds the workspace's owner lease (the lease is held, by the pid
//! `core.json` names, and that process lives), then relays `arcane/1` frames both ways
//! through the same stdio loop a host uses ([`arcane_core::bridge`]). End of input
//! ends only this bridge; the host's end ends it, saying so.

use std::time::{Duration, Instant};

use arcane_core::bridge::RemoteHost;
use arcane_core::endpoint::{running_endpoint, EndpointRecord};
use arcane_report::codes;
use serde_json::json;

use crate::config::Context;
use crate::error::{CliError, CommandError};

/// How long a bridge waits for a host that holds the lease but has not written
/// `core.json` yet (it is starting).
const HOST_STARTING: Duration = Duration::from_secs(15);

/// Runs the bridge to the host `owner` (the lease holder's pid, when known).
pub fn run(context: &Context, owner: u32, max_frame: usize) -> Result<u8, CliError> {
    let record = wait_for_host(context, owner)?;
    let runtime = crate::cmd::core::runtime()?;
    let name = format!("bridge-{}-{}", std::process::id(), suffix());
    let outcome = runtime.block_on(async {
        let host = std::sync::Arc::new(RemoteHost::connect(record.clone(), name.clone()).await?);
        context.output.note(&format!(
            "joined the running Core host (pid {}, {}) as client `{name}`",
            record.pid, record.url
        ));
        let mut options = arcane_core::stdio::StdioOptions::default();
        options.max_frame = max_frame;
        let (stdin, stdout, _blocking) = arcane_core::stdio::process_stdio();
        arcane_core::stdio::serve(&host, stdin, stdout, options).await?;
        Ok::<bool, CliError>(host.host_ended())
    });
    runtime.shutdown_timeout(Duration::from_millis(200));
    if outcome? {
        return Err(CommandError::new(
            codes::CORE_NOT_RUNNING,
            format!(
                "the Core host (pid {}, {}) ended; this bridge ends with it",
                record.pid, record.url
            ),
            json!({"pid": record.pid, "url": record.url}),
        )
        .hint("start the host again (`arcane serve`), then the application")
        .into());
    }
    Ok(0)
}

/// The running host's record, once it is there: the lease is held and `core.json`
/// names its holder (a host that holds the lease but is still starting gets
/// [`HOST_STARTING`]; a host on stdio only never writes one).
fn wait_for_host(context: &Context, owner: u32) -> Result<EndpointRecord, CliError> {
    let deadline = Instant::now() + HOST_STARTING;
    loop {
        let found = running_endpoint(&context.workspace);
        match found {
            Ok(record) if owner == 0 || record.pid == owner => return Ok(record),
            _ if Instant::now() >= deadline => return Err(no_endpoint(owner, found.err())),
            // The host writes `core.json` once it listens: look again shortly, and
            // let Ctrl-C end the wait at once.
            _ if context.cancel.wait_timeout(Duration::from_millis(100)) => {
                return Err(CommandError::new(
                    codes::ARCANE_CANCELLED,
                    "cancelled while waiting for the running host's endpoint",
                    json!({"pid": owner}),
                )
                .into())
            }
            _ => {}
        }
    }
}

/// The lease is held, but by no host a bridge can join.
fn no_endpoint(owner: u32, cause: Option<arcane_core::Error>) -> CliError {
    let error = CommandError::new(
        codes::CORE_NOT_RUNNING,
        format!("the host holding the workspace (pid {owner}) has no HTTP endpoint (`core.json`): a bridge joins an `arcane serve` host, not another `core --stdio`"),
        json!({"pid": owner}),
    )
    .hint("run the shared host with `arcane serve`; applications then join it with `arcane core --stdio`");
    match cause {
        Some(cause) => error.caused_by(cause).into(),
        None => error.into(),
    }
}

/// Eight random hex digits, so two bridges of one process never share a name.
fn suffix() -> String {
    arcane_files::secret_hex(4).unwrap_or_else(|_| "0".into())
}
