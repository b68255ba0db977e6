//! The one table of event types: the `type` of every [`Event`](crate::Event) Arcane
//! emits (and of the NDJSON `core.listening` line), like [`codes`](crate::codes) for
//! errors.
//!
//! Every emitting site and every renderer names its event through these constants, so
//! a type is spelled once. A type never changes after release. Add one by adding a
//! row to the table; a unit test fails when a type is listed twice or is not a dotted
//! lowercase name.

macro_rules! event_types {
    ($( $(#[$doc:meta])* $name:ident = $value:literal ),* $(,)?) => {
        $( $(#[$doc])* pub const $name: &str = $value; )*
        /// Every event type, in table order.
        pub const ALL: &[&str] = &[$($name),*];
    };
}

event_types! {
    // --- workspace operation lock (`arcane-lock`) -------------------------------------
    /// The workspace operation lock was taken `{operation, pid, path, …}`.
    WORKSPACE_OPERATION_LOCKED = "workspace.operation.locked",
    /// The lock was released.
    WORKSPACE_OPERATION_RELEASED = "workspace.operation.released",
    /// Releasing the lock failed (it is released when the process exits).
    WORKSPACE_OPERATION_RELEASE_FAILED = "workspace.operation.release-failed",
    /// Another operation holds the lock; waiting for it.
    WORKSPACE_OPERATION_WAITING = "workspace.operation.waiting",
    /// A stale lock record of a dead holder was recovered.
    WORKSPACE_OPERATION_STALE_RECOVERED = "workspace.operation.stale-recovered",
    /// A stale lock record that could not be judged was moved aside.
    WORKSPACE_OPERATION_STALE_QUARANTINED = "workspace.operation.stale-quarantined",

    // --- downloads and the registry (`arcane-registry`) -------------------------------
    /// A download started `{url, bytes?}`.
    DOWNLOAD_STARTED = "download.started",
    /// Download progress `{url, done, total?}`.
    DOWNLOAD_PROGRESS = "download.progress",
    /// A download finished.
    DOWNLOAD_FINISHED = "download.finished",
    /// Hashing a file, progress.
    REGISTRY_HASH_PROGRESS = "registry.hash.progress",
    /// A runtime's executable is asked for its version.
    REGISTRY_RUNTIME_PROBING = "registry.runtime.probing",
    /// A runtime archive is being extracted.
    REGISTRY_RUNTIME_EXTRACTING = "registry.runtime.extracting",
    /// A runtime was registered.
    REGISTRY_RUNTIME_ADDED = "registry.runtime.added",
    /// A runtime was installed from an archive.
    REGISTRY_RUNTIME_INSTALLED = "registry.runtime.installed",
    /// A runtime was removed.
    REGISTRY_RUNTIME_REMOVED = "registry.runtime.removed",
    /// A model was registered.
    REGISTRY_MODEL_ADDED = "registry.model.added",
    /// A model was removed.
    REGISTRY_MODEL_REMOVED = "registry.model.removed",

    // --- bundles (`arcane-bundle`, `arcane launch`) -----------------------------------
    /// `bundle build` started.
    BUNDLE_BUILD_STARTED = "bundle.build.started",
    /// `bundle build` resolved what goes in.
    BUNDLE_BUILD_RESOLVED = "bundle.build.resolved",
    /// `bundle build` copy progress.
    BUNDLE_BUILD_PROGRESS = "bundle.build.progress",
    /// `bundle build` finished.
    BUNDLE_BUILD_FINISHED = "bundle.build.finished",
    /// `bundle verify` started.
    BUNDLE_VERIFY_STARTED = "bundle.verify.started",
    /// `bundle verify` hashing progress.
    BUNDLE_VERIFY_PROGRESS = "bundle.verify.progress",
    /// `bundle verify` finished.
    BUNDLE_VERIFY_FINISHED = "bundle.verify.finished",
    /// `launch` verified the bundle.
    BUNDLE_LAUNCH_VERIFIED = "bundle.launch.verified",
    /// `launch` becomes the Core host.
    BUNDLE_LAUNCH_CORE = "bundle.launch.core",
    /// `launch` started a Core host in the background.
    BUNDLE_LAUNCH_CORE_STARTED = "bundle.launch.core-started",
    /// `launch` runs the app entry.
    BUNDLE_LAUNCH_APP_ENTRY = "bundle.launch.app-entry",

    // --- engine processes (`arcane-localai`) ------------------------------------------
    /// An engine process is being started `{command, args, cwd}`.
    PROCESS_STARTING = "process.starting",
    /// One line of an engine's stdout `{pid, line}`.
    PROCESS_STDOUT = "process.stdout",
    /// One line of an engine's stderr `{pid, line}`.
    PROCESS_STDERR = "process.stderr",
    /// An engine process was asked to stop (SIGTERM to its group) `{pid}`.
    PROCESS_CANCELLATION_REQUESTED = "process.cancellation.requested",
    /// It ignored SIGTERM past the grace: SIGKILL `{pid, signal}`.
    PROCESS_CANCELLATION_ESCALATED = "process.cancellation.escalated",
    /// An engine process ended `{pid, code, signal, stopStep}`.
    PROCESS_EXITED = "process.exited",
    /// An orphan of an earlier Arcane was stopped.
    PROCESS_ORPHAN_STOPPED = "process.orphan.stopped",

    // --- engine and model states (`arcane-localai`'s one table) -----------------------
    /// An engine entered `starting` (a server snapshot as data).
    LOCAL_AI_SERVER_STARTING = "local-ai.server.starting",
    /// An engine entered `loading`.
    LOCAL_AI_SERVER_LOADING = "local-ai.server.loading",
    /// An engine entered `ready`.
    LOCAL_AI_SERVER_READY = "local-ai.server.ready",
    /// An engine entered `stopping` (the state exists for every record; a supervisor
    /// stops in one step and does not announce it).
    LOCAL_AI_SERVER_STOPPING = "local-ai.server.stopping",
    /// An engine entered `error`.
    LOCAL_AI_SERVER_ERROR = "local-ai.server.error",
    /// An engine entered `stopped`.
    LOCAL_AI_SERVER_STOPPED = "local-ai.server.stopped",
    /// An engine entered `closed` (the host's record; a supervisor does not announce it).
    LOCAL_AI_SERVER_CLOSED = "local-ai.server.closed",
    /// A ready engine did not answer its readiness probe in time but worked meanwhile
    /// (its processes used CPU time): load, not a fault; it is not stopped, and the
    /// next probe waits longer `{id, engine, probeTimeoutMs}`.
    LOCAL_AI_ENGINE_BUSY = "local-ai.engine.busy",
    /// The model gateway started loading a model `{model, device, state, reason}`
    /// (`reason`: `request`, `on-start`, `load`).
    LOCAL_AI_MODEL_STARTING = "local-ai.model.starting",
    /// A model's engine answers `503 Loading model` `{model, device, state}`.
    LOCAL_AI_MODEL_LOADING = "local-ai.model.loading",
    /// A model is loaded and answers `{model, device, state, pid, url}`.
    LOCAL_AI_MODEL_READY = "local-ai.model.ready",
    /// A model's engine is being stopped `{model, device, state, reason, for?}`.
    LOCAL_AI_MODEL_STOPPING = "local-ai.model.stopping",
    /// A model failed to load, its engine died, or its external server stopped
    /// answering `{model, device, state, reason, error}` (`reason`: `load-failed`,
    /// `crashed`, `unreachable`).
    LOCAL_AI_MODEL_ERROR = "local-ai.model.error",
    /// A model's engine is down `{model, device, state, reason, for?, group?}`
    /// (`reason`: `keep-alive`, `request`, `shutdown`, `evicted` with `for`, `group`,
    /// or `crashed` once a crashed engine is down and the model may load again).
    LOCAL_AI_MODEL_STOPPED = "local-ai.model.stopped",
    /// A model entered `closed` (the state exists for every record; a gateway model
    /// ends `stopped`).
    LOCAL_AI_MODEL_CLOSED = "local-ai.model.closed",
    /// The gateway read its configuration again `{added, removed, changed, unchanged}`
    /// (`arcane reload`, SIGHUP), or could not `{error}`.
    LOCAL_AI_MODELS_RELOADED = "local-ai.models.reloaded",
    /// A request whose engine died before it answered is sent once more to the engine
    /// that replaces it: `{model, key, pid}` (the dead engine's pid).
    LOCAL_AI_REQUEST_REPLAYED = "local-ai.request.replayed",
    /// A state change the transition table refused (a bug) `{id, engine, from, change, message}`.
    LOCAL_AI_TRANSITION_REFUSED = "local-ai.transition.refused",

    // --- the Core host (`arcane-core`) ------------------------------------------------
    /// The host is ready (sent to each new connection).
    CORE_READY = "core.ready",
    /// The host's state changed (`draining`, `closed`, …).
    CORE_STATE = "core.state",
    /// A service's state changed.
    CORE_SERVICE_STATE = "core.service.state",
    /// A service or transport failed.
    CORE_ERROR = "core.error",
    /// The HTTP transport refused a connection at its cap `{maxConnections, message}`.
    CORE_HTTP_CONNECTION_LIMIT = "core.http.connection-limit",
    /// `arcane serve` listens (the first NDJSON line) `{url, pid, endpointFile}`.
    CORE_LISTENING = "core.listening",
    /// The local-AI service's engines changed `{runtimes[]}`.
    LOCALAI_STATE = "localai.state",
    /// One streamed chunk of `llama.chat` `{streamId, chunk}`.
    LLAMA_CHUNK = "llama.chunk",
    /// One streamed chunk of an `ollama.*` call `{streamId, chunk}`.
    OLLAMA_CHUNK = "ollama.chunk",
}

/// The event type of one streamed chunk of a `<namespace>.*` call (`llama.chunk`,
/// `ollama.chunk`), when the table has one.
pub fn chunk_of(namespace: &str) -> Option<&'static str> {
    ALL.iter()
        .copied()
        .find(|kind| kind.strip_suffix(".chunk") == Some(namespace))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    #[test]
    fn every_type_is_listed_once_and_well_formed() {
        let mut seen = HashSet::new();
        for kind in super::ALL {
            assert!(seen.insert(*kind), "event type {kind} is listed twice");
            assert!(kind.contains('.'), "event type {kind} is not dotted");
            assert!(
                kind.bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'.' || b == b'-'),
                "event type {kind} is not lowercase"
            );
        }
        // Every constant in this file is in ALL (the macro guarantees it; this guards
        // against a bare `pub const` added by hand).
        let source = include_str!("event_types.rs");
        let declared = source
            .lines()
            .filter(|l| {
                let l = l.trim();
                l.contains(" = \"") && l.ends_with("\",") && !l.starts_with("//")
            })
            .count();
        assert_eq!(declared, super::ALL.len());
    }
}
