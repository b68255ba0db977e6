//! Ownership records: how a later Arcane finds, and stops, a process that an earlier
//! Arcane started and then lost (it was killed before it could stop its child, and the
//! parent-death signal was not armed or not delivered): engines here, ONNX workers in
//! `arcane-core`.
//!
//! # One store
//!
//! Engines and ONNX workers keep their records the same way, so they keep them through
//! one [`RecordStore`]: one rule for where a record lives, one directory check (nothing
//! is written through a symbolic link), one atomic write, one reader that ignores what
//! is not a current record of its kind, one removal that never removes another
//! process's record, and one reaping loop. Two copies of these rules drift (one checks
//! the directory, the other does not); a record type only says what differs
//! ([`OwnershipRecord`]: its kind, its directory, its nonce variable, its key and its
//! claim).
//!
//! # The records
//!
//! `<workspace>/.arcane/<dir>/<key>.json`, written atomically (temporary file, fsync,
//! rename, mode 0644, pretty JSON and a newline) right after the spawn and removed
//! after the stop. An engine's (`.arcane/engines/<id>.json`) is written and removed
//! under the workspace operation lock (`with_lock`, held only for that mutation,
//! never for the server's life):
//!
//! ```json
//! {"schemaVersion": 1, "kind": "arcane-engine-ownership", "id": "llama.cpp",
//!  "engine": "llama.cpp", "url": "http://127.0.0.1:8080", "port": 8080,
//!  "pid": 4242, "startTime": 123456, "exe": "/…/llama-server",
//!  "executable": "/…/llama-server", "nonce": "9f…",
//!  "owner": {"pid": 4200, "startTime": 123400}, "createdAt": "…"}
//! ```
//!
//! An ONNX worker's is `.arcane/onnx-workers/<pid>.json` (kind
//! `arcane-onnx-worker-ownership`; see `arcane_onnx_service::records`).
//!
//! # The proof
//!
//! [`arcane_process::ownership`]'s: pid with the recorded start time, the recorded
//! executable, the recorded nonce in its environment, and its owner gone (a live owner
//! still supervises its process, which is then left alone and, for an engine, may be
//! adopted). A record whose process is gone, or fails the proof, is stale and is
//! removed.

use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arcane_process::ownership::{self, Claim};
use arcane_report::event_types;
use arcane_report::{Event, EventSink};
use arcane_workspace::layout;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::process::StopStep;
use crate::Error;

pub use arcane_process::ownership::{Judgement, Owner};

/// The schema version of every ownership record; a record of another is ignored.
pub const SCHEMA_VERSION: u32 = 1;

/// The permission bits of an ownership record.
const RECORD_MODE: u32 = 0o644;

/// A kind of ownership record: what differs between engines and ONNX workers. The
/// [`RecordStore`] does the rest.
pub trait OwnershipRecord: Serialize + DeserializeOwned {
    /// The `kind` every record of this type carries (`arcane-engine-ownership`).
    const KIND: &'static str;
    /// The environment variable that carries the nonce to the recorded process.
    const NONCE_VARIABLE: &'static str;
    /// The records' directory under `.arcane` (an `arcane_workspace::layout` name).
    const DIR_NAME: &'static str;

    /// The record's file stem: an engine id, a worker pid.
    fn key(&self) -> String;
    /// What the record claims, for the proof; its nonce variable is
    /// [`NONCE_VARIABLE`](Self::NONCE_VARIABLE).
    fn claim(&self) -> Claim<'_>;
    /// The record's `kind` field.
    fn kind(&self) -> &str;
    /// The record's `schemaVersion` field.
    fn schema_version(&self) -> u32;

    /// The nonce the record claims.
    fn nonce(&self) -> &str {
        self.claim().nonce.1
    }

    /// Whether this is a record of this type at [`SCHEMA_VERSION`]: anything else in
    /// the directory is not ours to read, judge or remove.
    fn is_current(&self) -> bool {
        self.kind() == Self::KIND && self.schema_version() == SCHEMA_VERSION
    }
}

/// The ownership records of one kind in one workspace. Every method blocks (file
/// system, and [`reap_orphans`](Self::reap_orphans) waits for orphans to stop): call
/// them off the async threads.
pub struct RecordStore<R> {
    workspace: PathBuf,
    record: PhantomData<fn() -> R>,
}

impl<R> Clone for RecordStore<R> {
    fn clone(&self) -> Self {
        Self {
            workspace: self.workspace.clone(),
            record: PhantomData,
        }
    }
}

impl<R> std::fmt::Debug for RecordStore<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordStore")
            .field("workspace", &self.workspace)
            .finish()
    }
}

impl<R: OwnershipRecord> RecordStore<R> {
    /// The records of type `R` in `workspace`.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        Self {
            workspace: workspace.into(),
            record: PhantomData,
        }
    }

    /// The records' directory, `<workspace>/.arcane/<R::DIR_NAME>`.
    pub fn dir(&self) -> PathBuf {
        layout::records_dir(&self.workspace, R::DIR_NAME)
    }

    /// The file of record `key`, `<workspace>/.arcane/<R::DIR_NAME>/<key>.json`.
    pub fn path(&self, key: &str) -> PathBuf {
        layout::ownership_record(&self.workspace, R::DIR_NAME, key)
    }

    /// Checks that the records' directory is a physical directory of the workspace
    /// (creating the workspace and the directory, 0700, when missing), so no record is
    /// ever written through a link; returns the checked directory.
    pub fn check_dir(&self) -> Result<PathBuf, Error> {
        ensure_workspace(&self.workspace)?;
        arcane_lock::state_subdir(&self.workspace, R::DIR_NAME).map_err(|source| {
            Error::RecordsRefused {
                path: self.dir(),
                source,
            }
        })
    }

    /// Reads record `key`; a missing, unreadable or foreign record (another `kind` or
    /// schema version) is `None`.
    pub fn read(&self, key: &str) -> Option<R> {
        let bytes = std::fs::read(self.path(key)).ok()?;
        let record: R = serde_json::from_slice(&bytes).ok()?;
        record.is_current().then_some(record)
    }

    /// Writes `record` atomically (through [`arcane_files::write_atomic`]) into the
    /// checked directory ([`check_dir`](Self::check_dir)). A record [`read`](Self::read)
    /// would ignore is refused.
    pub fn write(&self, record: &R) -> Result<(), Error> {
        let target = self.path(&record.key());
        if !record.is_current() {
            let detail = format!("not a current `{}` record", R::KIND);
            return Err(io_error("write", &target)(std::io::Error::other(detail)));
        }
        self.check_dir()?;
        let mut bytes = serde_json::to_vec_pretty(record)
            .map_err(|e| io_error("serialize", &target)(std::io::Error::other(e)))?;
        bytes.push(b'\n');
        arcane_files::write_atomic(&target, &bytes, RECORD_MODE).map_err(io_error("write", &target))
    }

    /// Removes record `key` if it still carries `nonce` (never another process's).
    pub fn remove(&self, key: &str, nonce: &str) -> Result<(), Error> {
        match self.read(key) {
            Some(record) if record.nonce() == nonce => self.remove_file(key),
            _ => Ok(()),
        }
    }

    /// Removes record `key` unconditionally; a missing one is no error.
    pub fn remove_file(&self, key: &str) -> Result<(), Error> {
        let target = self.path(key);
        match std::fs::remove_file(&target) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(io_error("remove", &target)(source)),
        }
    }

    /// Judges `record` against the live system (the proof of
    /// [`arcane_process::ownership`]).
    pub fn judge(&self, record: &R) -> Judgement {
        ownership::judge(&record.claim())
    }

    /// Stops every proven orphan recorded here (SIGTERM to its group, SIGKILL after
    /// `grace`) and removes its record and every stale one; records whose owner is
    /// alive are left alone. Returns each stopped orphan's record and how it ended.
    pub fn reap_orphans(&self, grace: Duration) -> Vec<(R, StopStep)> {
        self.keys()
            .into_iter()
            .filter_map(|key| self.reap(&key, grace))
            .collect()
    }

    /// The keys of the `.json` files in the records' directory.
    fn keys(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.dir()) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                name.strip_suffix(".json").map(str::to_string)
            })
            .collect()
    }

    /// Settles record `key`: an orphan is stopped (and returned), and its record goes
    /// with a stale one's; a record whose owner is alive stays.
    fn reap(&self, key: &str, grace: Duration) -> Option<(R, StopStep)> {
        let record = self.read(key)?;
        let settled = self.settle(&record, grace);
        if settled != Settled::Stays {
            // A record left behind is judged again by the next host.
            let _ = self.remove(key, record.nonce());
        }
        match settled {
            Settled::Stopped(step) => Some((record, step)),
            Settled::Stays | Settled::Stale => None,
        }
    }

    /// Judges `record` and stops its orphan (SIGTERM to its tree, SIGKILL after
    /// `grace`); says whether the record stays or is to go. Blocking: it may wait out
    /// the grace.
    pub(crate) fn settle(&self, record: &R, grace: Duration) -> Settled {
        match self.judge(record) {
            Judgement::OwnerAlive => Settled::Stays,
            Judgement::Stale(_) => Settled::Stale,
            Judgement::Orphan => Settled::Stopped(ownership::stop_orphan(&record.claim(), grace)),
        }
    }
}

/// What [`RecordStore::settle`] did with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Its owner lives and supervises its process: the record stays.
    Stays,
    /// Its process is gone (or another now): the record is to go.
    Stale,
    /// Its orphan was stopped, ending as said: the record is to go.
    Stopped(StopStep),
}

impl Settled {
    /// How the orphan ended, when there was one.
    pub(crate) fn stopped(self) -> Option<StopStep> {
        match self {
            Settled::Stopped(step) => Some(step),
            Settled::Stays | Settled::Stale => None,
        }
    }
}

/// The [`Error::Io`] of `operation` on `path`.
fn io_error(operation: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io {
        operation,
        path,
        source,
    }
}

/// Creates the workspace (mode 0700, private to the user like the lock's own directory)
/// when nothing exists there: a first `serve` may run before anything else created it.
fn ensure_workspace(workspace: &Path) -> Result<(), Error> {
    if workspace.is_dir() {
        return Ok(());
    }
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(workspace)
        .map_err(io_error("create", workspace))
}

/// How long a record write waits for another operation's workspace lock.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// One engine's ownership record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Record {
    pub schema_version: u32,
    pub kind: String,
    pub id: String,
    pub engine: String,
    pub url: String,
    pub port: u16,
    pub pid: u32,
    pub start_time: u64,
    pub exe: PathBuf,
    pub executable: PathBuf,
    pub nonce: String,
    pub owner: Owner,
    pub created_at: String,
}

impl OwnershipRecord for Record {
    const KIND: &'static str = "arcane-engine-ownership";
    const NONCE_VARIABLE: &'static str = crate::command::NONCE_VARIABLE;
    const DIR_NAME: &'static str = layout::ENGINES_DIR_NAME;

    fn key(&self) -> String {
        self.id.clone()
    }

    fn claim(&self) -> Claim<'_> {
        Claim {
            pid: self.pid,
            start_time: self.start_time,
            exe: &self.exe,
            nonce: (Self::NONCE_VARIABLE, &self.nonce),
            owner: &self.owner,
        }
    }

    fn kind(&self) -> &str {
        &self.kind
    }

    fn schema_version(&self) -> u32 {
        self.schema_version
    }
}

/// [`RecordStore::check_dir`] of the engines' records, off the async threads: run
/// before an engine starts.
pub(crate) async fn check_dir(store: &RecordStore<Record>) -> Result<(), Error> {
    let (store, dir) = (store.clone(), store.dir());
    let checked = tokio::task::spawn_blocking(move || store.check_dir().map(drop)).await;
    checked.unwrap_or_else(|_| {
        Err(io_error("check", &dir)(std::io::Error::other(
            "the check did not finish",
        )))
    })
}

/// A fresh random nonce (128 bits from the kernel, as hex).
pub(crate) fn new_nonce() -> std::io::Result<String> {
    arcane_files::secret_hex(16)
}

/// Runs `f` while holding the workspace operation lock (`operation` names it), on a
/// blocking thread: the lock is held only for this one mutation.
pub(crate) async fn with_lock<T: Send + 'static>(
    workspace: &Path,
    engine: &str,
    events: &Arc<dyn EventSink>,
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    let workspace = workspace.to_path_buf();
    let engine = engine.to_string();
    let events = events.clone();
    tokio::task::spawn_blocking(move || {
        ensure_workspace(&workspace)?;
        let lock_error = |source| Error::Lock {
            engine: engine.clone(),
            source,
        };
        // Another operation (a model being added) may hold the lock briefly: wait for it.
        let options = arcane_lock::AcquireOptions::new("serve")
            .map_err(lock_error)?
            .wait(LOCK_WAIT);
        // Only waiting and recovery are worth telling; locked/released on every record
        // write would drown the server's own events.
        let filtered = |event: Event| {
            if event.kind == event_types::WORKSPACE_OPERATION_WAITING
                || event.kind == event_types::WORKSPACE_OPERATION_STALE_RECOVERED
            {
                events.emit(event);
            }
        };
        let lock = arcane_lock::WorkspaceLock::acquire(&workspace, &options, &filtered)
            .map_err(lock_error)?;
        let result = f();
        let released = lock.release().map_err(lock_error);
        let value = result?;
        released?;
        Ok(value)
    })
    .await
    .map_err(|e| io_error("lock", Path::new(""))(std::io::Error::other(e)))?
}

/// Held while engine records are judged, their orphans stopped and the records
/// removed: a host's start-up sweep ([`reap_engines`]) and the first load of a model
/// (the supervisor's check of its own record) would otherwise judge and stop the same
/// orphan at once, and both report it. The second to come finds it settled.
pub(crate) static REAPING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Settles every engine record in `workspace`, whatever model id it names: a proven
/// orphan (and everything it started, see [`ownership::Tree`]) is stopped and
/// reported as `process.orphan-stopped`; its record and every stale one are removed
/// (under the workspace lock, and only while unchanged); the records of a live host,
/// this one included, stay. A host does this when it starts, as it does for ONNX
/// workers: a model renamed or removed from `arcane.toml` since the last host was
/// killed leaves nothing running. Returns how many orphans were stopped.
pub async fn reap_engines(
    workspace: &Path,
    grace: Duration,
    events: Arc<dyn EventSink>,
) -> Result<usize, Error> {
    let store = RecordStore::<Record>::new(workspace);
    if !store.dir().is_dir() {
        return Ok(0);
    }
    let _reaping = REAPING.lock().await;
    check_dir(&store).await?;
    let me = Owner::current();
    let judged = store.clone();
    let settled = tokio::task::spawn_blocking(move || {
        judged
            .keys()
            .into_iter()
            .filter_map(|key| {
                let record = judged.read(&key)?;
                if record.owner == me {
                    return None;
                }
                match judged.settle(&record, grace) {
                    Settled::Stays => None,
                    settled => Some((record, settled.stopped())),
                }
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    let stopped = settled.iter().filter(|(_, step)| step.is_some()).count();
    for (record, step) in &settled {
        if let Some(step) = step {
            orphan_event(&*events, record, *step);
        }
    }
    if !settled.is_empty() {
        with_lock(workspace, "engines", &events, move || {
            settled
                .iter()
                .try_for_each(|(record, _)| store.remove(&record.id, &record.nonce))
        })
        .await?;
    }
    Ok(stopped)
}

/// Emits the event that says a proven orphan was stopped.
pub(crate) fn orphan_event(events: &dyn EventSink, record: &Record, step: StopStep) {
    events.emit(Event::new(
        event_types::PROCESS_ORPHAN_STOPPED,
        json!({
            "id": record.id, "pid": record.pid, "executable": record.executable,
            "port": record.port, "previousOwner": record.owner.pid, "stopStep": step,
        }),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A nonce of this test's own: tests run in parallel, and a process carrying
    /// another test's nonce would be that test's record's descendant.
    fn fresh_nonce() -> String {
        new_nonce().expect("random bytes")
    }

    fn store(workspace: &tempfile::TempDir) -> RecordStore<Record> {
        RecordStore::new(workspace.path())
    }

    /// An engine record claiming `pid` (its start time and executable read now, or
    /// made up when it is gone), started by `owner`.
    fn record(id: &str, pid: u32, nonce: &str, owner: Owner) -> Record {
        Record {
            schema_version: SCHEMA_VERSION,
            kind: Record::KIND.into(),
            id: id.into(),
            engine: "llama.cpp".into(),
            url: "http://127.0.0.1:8080".into(),
            port: 8080,
            pid,
            start_time: arcane_process::start_time(pid).unwrap_or(1),
            exe: arcane_process::exe(pid).unwrap_or_else(|| "/gone".into()),
            executable: "/bin/sleep".into(),
            nonce: nonce.into(),
            owner,
            created_at: "2026-01-01T00:00:00.000Z".into(),
        }
    }

    /// `sleep 30` with `nonce` in its environment, as a recorded process is started.
    fn sleeper(nonce: &str) -> arcane_process::Child {
        let spec = arcane_process::Spec::new("/bin/sleep")
            .args(["30"])
            .env(Record::NONCE_VARIABLE, nonce);
        arcane_process::spawn(spec).expect("spawn sleep")
    }

    /// The owner of a process that certainly exited (a child that ran and was reaped).
    fn gone_owner() -> Owner {
        let mut child =
            arcane_process::spawn(arcane_process::Spec::new("/bin/true")).expect("spawn true");
        let owner = Owner {
            pid: child.pid(),
            start_time: child.start_time().unwrap_or(1),
        };
        child.wait();
        owner
    }

    /// A live process, other than this one, as an owner.
    fn live_owner(child: &arcane_process::Child) -> Owner {
        Owner {
            pid: child.pid(),
            start_time: arcane_process::start_time(child.pid()).expect("owner alive"),
        }
    }

    #[test]
    fn an_engine_record_roundtrips_in_the_unchanged_format() {
        let nonce = fresh_nonce();
        let workspace = tempfile::tempdir().unwrap();
        let store = store(&workspace);
        let written = record("llama.cpp", 4242, &nonce, Owner::current());
        store.write(&written).unwrap();
        assert_eq!(store.read("llama.cpp"), Some(written));

        let file = workspace.path().join(".arcane/engines/llama.cpp.json");
        assert_eq!(store.path("llama.cpp"), file);
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.starts_with("{\n  \""), "pretty JSON: {text}");
        assert!(text.ends_with("}\n"), "a final newline: {text}");
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut keys: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "createdAt",
                "engine",
                "exe",
                "executable",
                "id",
                "kind",
                "nonce",
                "owner",
                "pid",
                "port",
                "schemaVersion",
                "startTime",
                "url"
            ]
        );
        assert_eq!(value["kind"], "arcane-engine-ownership");
        assert_eq!(value["schemaVersion"], 1);
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
    }

    #[test]
    fn remove_leaves_a_record_with_another_nonce() {
        let nonce = fresh_nonce();
        let workspace = tempfile::tempdir().unwrap();
        let store = store(&workspace);
        store
            .write(&record("llama.cpp", 4242, &nonce, Owner::current()))
            .unwrap();
        store.remove("llama.cpp", "another-nonce").unwrap();
        assert!(store.read("llama.cpp").is_some(), "another's record stays");
        store.remove("llama.cpp", &nonce).unwrap();
        assert!(!store.path("llama.cpp").exists(), "its own record goes");
        store.remove_file("llama.cpp").unwrap();
    }

    #[test]
    fn a_record_of_another_kind_or_schema_is_neither_read_nor_removed_nor_written() {
        let nonce = fresh_nonce();
        let workspace = tempfile::tempdir().unwrap();
        let store = store(&workspace);
        let mut foreign = record("llama.cpp", 4242, &nonce, Owner::current());
        foreign.kind = "arcane-onnx-worker-ownership".into();
        assert!(store.write(&foreign).is_err(), "a record read would ignore");

        store.check_dir().unwrap();
        let file = store.path("llama.cpp");
        std::fs::write(&file, serde_json::to_vec(&foreign).unwrap()).unwrap();
        assert_eq!(store.read("llama.cpp"), None);
        store.remove("llama.cpp", &nonce).unwrap();
        assert!(file.exists(), "not ours to remove");

        let mut future = record("llama.cpp", 4242, &nonce, Owner::current());
        future.schema_version = 2;
        std::fs::write(&file, serde_json::to_vec(&future).unwrap()).unwrap();
        assert_eq!(store.read("llama.cpp"), None);
    }

    #[test]
    fn reaping_removes_stale_records_and_leaves_a_live_owners_alone() {
        let nonce = fresh_nonce();
        let workspace = tempfile::tempdir().unwrap();
        let store = store(&workspace);
        let gone = gone_owner();
        let stale = Record {
            start_time: gone.start_time,
            // Its own nonce: a process carrying a record's nonce is its descendant.
            ..record("stale", gone.pid, &fresh_nonce(), Owner::current())
        };
        store.write(&stale).unwrap();

        let mut owner = sleeper("owner");
        let mut supervised = sleeper(&nonce);
        let kept = record("kept", supervised.pid(), &nonce, live_owner(&owner));
        store.write(&kept).unwrap();

        let reaped = store.reap_orphans(Duration::from_secs(5));
        assert!(reaped.is_empty(), "nothing was an orphan: {reaped:?}");
        assert!(!store.path("stale").exists(), "the stale record goes");
        assert_eq!(
            store.read("kept"),
            Some(kept.clone()),
            "a live owner's record stays"
        );
        let alive = arcane_process::start_time(supervised.pid());
        assert_eq!(alive, Some(kept.start_time), "its process is not signalled");
        supervised.terminate(Duration::from_secs(5));
        owner.terminate(Duration::from_secs(5));
    }

    #[test]
    fn reaping_stops_a_proven_orphan_and_never_signals_a_stranger() {
        let nonce = fresh_nonce();
        let workspace = tempfile::tempdir().unwrap();
        let store = store(&workspace);
        let mut orphan = sleeper(&nonce);
        let lost = record("lost", orphan.pid(), &nonce, gone_owner());
        store.write(&lost).unwrap();
        let mut stranger = sleeper("its-own-nonce");
        let claimed = record("stranger", stranger.pid(), &nonce, gone_owner());
        store.write(&claimed).unwrap();

        let reaped = store.reap_orphans(Duration::from_secs(5));
        assert_eq!(reaped, vec![(lost, StopStep::Sigterm)]);
        let exit = orphan
            .wait_timeout(Duration::from_secs(5))
            .expect("stopped");
        assert_eq!(exit.signal, Some(libc::SIGTERM));
        assert!(!store.path("lost").exists(), "the orphan's record goes");
        assert!(!store.path("stranger").exists(), "a stale record goes");
        let alive = arcane_process::start_time(stranger.pid());
        assert_eq!(
            alive,
            Some(claimed.start_time),
            "the stranger is not signalled"
        );
        stranger.terminate(Duration::from_secs(5));
    }

    /// Issue 27: an engine a wrapper forked (`sh -c "llama-server …; …"`) outlives the
    /// wrapper when its host is killed (the parent-death signal is armed on the wrapper
    /// only, and a fork does not inherit it). The record's pid is gone, but the nonce
    /// in the engine's environment proves whose it is: it is stopped, and its record
    /// goes.
    #[test]
    #[allow(clippy::disallowed_methods)] // the wrapper must not be our supervised child
    fn reaping_stops_what_a_gone_wrapper_forked_by_its_nonce() {
        use std::io::BufRead;
        let workspace = tempfile::tempdir().unwrap();
        let store = store(&workspace);
        let nonce = fresh_nonce();
        let mut wrapper = std::process::Command::new("/bin/sh")
            .args(["-c", "sleep 600 & echo $!; read _"])
            .env(Record::NONCE_VARIABLE, &nonce)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(wrapper.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let engine: u32 = line.trim().parse().unwrap();
        let engine_born = arcane_process::start_time(engine).expect("the engine runs");
        let lost = record("wrapped", wrapper.id(), &nonce, gone_owner());
        store.write(&lost).unwrap();
        // The wrapper ends (as the parent-death signal ends it); its engine stays.
        drop(wrapper.stdin.take());
        wrapper.wait().unwrap();
        assert_eq!(arcane_process::start_time(engine), Some(engine_born));

        assert_eq!(store.judge(&lost), Judgement::Orphan);
        let reaped = store.reap_orphans(Duration::from_secs(5));
        assert_eq!(reaped, vec![(lost, StopStep::Sigterm)]);
        assert_ne!(
            arcane_process::start_time(engine),
            Some(engine_born),
            "the forked engine was stopped"
        );
        assert!(!store.path("wrapped").exists(), "its record goes");
    }

    #[test]
    fn a_records_directory_that_is_a_link_is_refused_and_nothing_is_written_through_it() {
        let nonce = fresh_nonce();
        let workspace = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        arcane_files::create_private_dirs(&workspace.path().join(".arcane")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), workspace.path().join(".arcane/engines"))
            .unwrap();
        let store = store(&workspace);
        let written = store.write(&record("llama.cpp", 4242, &nonce, Owner::current()));
        assert!(
            matches!(written, Err(Error::RecordsRefused { .. })),
            "{written:?}"
        );
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }
}
