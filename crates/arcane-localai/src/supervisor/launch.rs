//! An engine Arcane starts: resolve its device, spawn it (trusted program, private
//! listener, ownership record), wait until it is ready, and stop it.

use super::monitor;
use super::*;

impl Context {
    /// Starts the configured executable and waits until it is ready.
    pub(super) async fn launch(self, cancel: &CancelToken) -> Result<Server, Error> {
        if let Some(reason) = &self.config.cannot_start {
            return Err(Error::CannotStart {
                engine: self.engine().as_str().into(),
                url: self.endpoint().origin(),
                reason: reason.clone(),
            });
        }
        let Some(executable) = self.config.executable.clone() else {
            return Err(Error::ExecutableMissing {
                engine: self.engine().as_str().into(),
                url: self.endpoint().origin(),
            });
        };
        self.publisher.update(|s| s.managed = true);
        if let Some(dir) = &self.validated.models_dir {
            std::fs::create_dir_all(dir).map_err(|source| Error::Io {
                operation: "create",
                path: dir.clone(),
                source,
            })?;
        }
        let resolved = tokio::select! {
            resolved = execution::resolve(&self.config, &self.devices) => resolved?,
            _ = cancel.cancelled() => return Err(self.cancelled_error()),
        };
        let record = resolved.execution;
        let execution_json = execution::to_json(&record);
        let mut running = self
            .spawn(&executable, &resolved.launch, execution_json)
            .await?;
        let abort = cancel.cancelled();
        let ready = self.wait_ready(&mut running, abort).await;
        let version = match ready {
            Ok(version) => version,
            Err(error) => return Err(self.fail_start(running, error).await),
        };
        let version = match self
            .check_version(
                &self.owned().address,
                version,
                self.config.runtime_version.as_deref(),
            )
            .await
        {
            Ok(version) => version,
            Err(error) => return Err(self.fail_start(running, error).await),
        };
        let key_ignored = match self.key_ignored().await {
            Ok(ignored) => ignored,
            Err(error) => return Err(self.fail_start(running, error).await),
        };
        let pid = running.child.pid;
        let unchecked = record.clone();
        let placed = tokio::task::spawn_blocking(move || {
            let mut record = record;
            let result = execution::check_placement(&mut record, pid);
            (record, result)
        })
        .await;
        let (record, placement) = placed.unwrap_or((unchecked, Ok(())));
        if let Err(source) = placement {
            let error = Error::Execution {
                engine: self.engine().as_str().into(),
                source,
            };
            return Err(self.fail_start(running, error).await);
        }
        let execution_json = execution::to_json(&record);
        self.publisher.publish(Change::Ready, |s| {
            s.version = version;
            s.execution = execution_json;
            s.key_ignored = key_ignored;
        });
        let (stop, stop_rx) = watch::channel(false);
        let (done_tx, done) = watch::channel(None);
        let publisher = self.publisher.clone();
        let monitor = Monitor {
            context: self,
            executable,
            launch: resolved.launch,
            stop: stop_rx,
            done: done_tx,
            restarts: 0,
        };
        tokio::spawn(monitor.run(running));
        Ok(Server::Owned(OwnedServer {
            publisher,
            stop,
            done,
        }))
    }

    /// Spawns the engine, publishes `starting` (owned), writes the ownership record.
    pub(super) async fn spawn(
        &self,
        executable: &Path,
        launch: &crate::command::DeviceLaunch,
        execution: Option<Value>,
    ) -> Result<Running, Error> {
        // Never run a program (or load libraries) another user could have swapped
        // (StrictModes): the program, its library directories and the libraries in them.
        match arcane_files::trust::check_program(executable, &self.config.library_dirs) {
            Ok(Ok(())) => {}
            Ok(Err(untrusted)) => {
                return Err(Error::Untrusted {
                    executable: executable.to_path_buf(),
                    detail: untrusted.describe(),
                    fix: untrusted.fix(),
                })
            }
            Err(source) => {
                return Err(Error::Spawn {
                    executable: executable.to_path_buf(),
                    source,
                })
            }
        }
        self.prepare_listen().await?;
        let nonce = records::new_nonce().map_err(|source| Error::Io {
            operation: "read random bytes for",
            path: self.records().path(&self.config.id),
            source,
        })?;
        let key_file = listen::key_file(&self.workspace, &self.config.id, self.owned());
        let EngineCommand {
            program,
            args,
            env,
            env_remove,
        } = engine_command(
            &self.config,
            &self.validated,
            executable,
            launch,
            &nonce,
            key_file.as_deref(),
        );
        let owned = self.owned().clone();
        self.publisher.publish(Change::Spawned, |s| {
            s.owned = true;
            s.managed = true;
            s.execution = execution;
            s.exit = None;
            s.pid = None;
            s.url = owned.address.to_string();
            s.socket = owned.address.socket().map(Path::to_path_buf);
            s.api_key = owned.key.clone();
        });
        let cwd = process::working_directory(&program);
        self.publisher.emit(
            event_types::PROCESS_STARTING,
            json!({"command": program, "args": args, "cwd": cwd}),
        );
        let child = process::spawn(SpawnSpec {
            program: program.clone(),
            args,
            env,
            env_remove,
            cwd,
            parent_death_signal: self.config.parent_death_signal,
            cpus: self.config.cpus.clone(),
        })
        .await
        .map_err(|source| Error::Spawn {
            executable: program.clone(),
            source,
        })?;
        let pid = child.pid;
        self.publisher.update(|s| s.pid = Some(pid));
        let running = Running {
            child,
            nonce: nonce.clone(),
            last_lines: VecDeque::new(),
            output_open: true,
        };
        if let Err(error) = self.check_cpus(pid) {
            return Err(self.fail_start(running, error).await);
        }
        let record = Record {
            schema_version: records::SCHEMA_VERSION,
            kind: Record::KIND.into(),
            id: self.config.id.clone(),
            engine: self.engine().as_str().into(),
            url: self.owned().address.to_string(),
            port: match &self.owned().address {
                EngineAddress::Tcp(endpoint) => endpoint.port(),
                EngineAddress::Unix(_) => 0,
            },
            pid,
            start_time: running.child.start_time.unwrap_or(0),
            exe: running.child.exe.clone().unwrap_or_else(|| program.clone()),
            executable: program,
            nonce,
            owner: records::Owner::current(),
            created_at: arcane_report::time::now_rfc3339(),
        };
        let store = self.records();
        let written = records::with_lock(
            &self.workspace,
            self.engine().as_str(),
            &self.events,
            move || store.write(&record),
        )
        .await;
        if let Err(error) = written {
            return Err(self.fail_start(running, error).await);
        }
        Ok(running)
    }

    /// Stops a child whose start failed, removes its record, and returns `error`.
    /// The evidence that `cpus` took: the engine's CPUs, read back from
    /// `/proc/PID/status`, are the ones asked for (a process already gone is judged by
    /// its exit, later).
    fn check_cpus(&self, pid: u32) -> Result<(), Error> {
        let Some(wanted) = &self.config.cpus else {
            return Ok(());
        };
        match arcane_process::CpuSet::of_process(pid) {
            Some(actual) if actual != *wanted => Err(Error::CpusNotApplied {
                id: self.config.id.clone(),
                pid,
                wanted: wanted.to_string(),
                actual: actual.to_string(),
            }),
            _ => Ok(()),
        }
    }

    pub(super) async fn fail_start(&self, mut running: Running, error: Error) -> Error {
        let (step, exit) = if matches!(error, Error::Unresponsive { .. }) {
            self.kill(&mut running).await
        } else {
            self.terminate(&mut running).await
        };
        let _ = step;
        self.publisher.update(|s| {
            s.exit = Some(exit);
            s.pid = None;
        });
        self.remove_record(&running.nonce).await;
        error
    }

    /// Stops the child: SIGTERM to its group, the stop grace, then SIGKILL.
    pub(super) async fn terminate(&self, running: &mut Running) -> (StopStep, ExitInfo) {
        self.stop_child(running, false).await
    }

    /// Kills an unresponsive child at once (SIGKILL, no grace): a stopped or hung
    /// process acts on no SIGTERM, so waiting out the grace only keeps its requests
    /// waiting.
    pub(super) async fn kill(&self, running: &mut Running) -> (StopStep, ExitInfo) {
        self.stop_child(running, true).await
    }

    async fn stop_child(&self, running: &mut Running, at_once: bool) -> (StopStep, ExitInfo) {
        let pid = running.child.pid;
        if running.child.exit_status().is_none() {
            self.publisher.emit(
                event_types::PROCESS_CANCELLATION_REQUESTED,
                json!({"pid": pid}),
            );
        }
        let publisher = self.publisher.clone();
        let escalated = move || {
            publisher.emit(
                event_types::PROCESS_CANCELLATION_ESCALATED,
                json!({"pid": pid, "signal": "SIGKILL"}),
            );
        };
        let (step, exit) = if at_once {
            running.child.kill().await
        } else {
            let grace = self.config.stop_grace;
            running.child.terminate(grace, escalated).await
        };
        self.publisher.emit(
            event_types::PROCESS_EXITED,
            json!({"pid": pid, "code": exit.code, "signal": exit.signal, "stopStep": step}),
        );
        (step, exit)
    }

    /// Forgets an owned process that has exited: removes its socket or key file and
    /// its ownership record.
    pub(super) async fn remove_record(&self, nonce: &str) {
        let (workspace, id, owned) = (
            self.workspace.clone(),
            self.config.id.clone(),
            self.owned().clone(),
        );
        let _ =
            tokio::task::spawn_blocking(move || listen::clean_up(&workspace, &id, &owned)).await;
        let (store, id, nonce) = (self.records(), self.config.id.clone(), nonce.to_string());
        // A record left behind is judged stale (or an orphan) by the next start.
        let _ = records::with_lock(
            &self.workspace,
            self.engine().as_str(),
            &self.events,
            move || store.remove(&id, &nonce),
        )
        .await;
    }

    /// Whether a ready `command` server behind a key (`${API_KEY_FILE}` on `${PORT}`)
    /// ignores it: one `GET /v1/models` without the key, within the probe timeout;
    /// a 2xx answer means anyone on this machine reaches it without the Core's token.
    /// Such a server is refused ([`Error::KeyIgnored`]) when its model requires the
    /// key, else reported (`keyIgnored`, reachable without the token). Engines Arcane
    /// starts with its own key flag are not asked: their flag is known to work.
    async fn key_ignored(&self) -> Result<bool, Error> {
        const PATH: &str = "/v1/models";
        let keyed_port =
            matches!(self.owned().address, EngineAddress::Tcp(_)) && self.owned().key.is_some();
        if !keyed_port || self.engine().kind().starts() != arcane_workspace::Starts::Command {
            return Ok(false);
        }
        let answer = crate::http::get(&self.owned().address, PATH, self.config.probe_timeout).await;
        let status = match answer {
            Ok(answer) if (200..300).contains(&answer.status) => answer.status,
            _ => return Ok(false),
        };
        if self.config.require_key {
            return Err(Error::KeyIgnored {
                engine: self.config.id.clone(),
                url: self.owned().address.to_string(),
                path: PATH.into(),
                status,
            });
        }
        Ok(true)
    }

    /// Waits until the owned engine answers ready; see the module doc.
    pub(super) async fn wait_ready(
        &self,
        running: &mut Running,
        abort: impl Future<Output = ()>,
    ) -> Result<Option<String>, Error> {
        let engine = self.engine().as_str().to_string();
        let started = Instant::now();
        let deadline = started + self.config.startup_timeout;
        let mut last_progress = started;
        let mut delay = POLL_FIRST;
        let mut next_probe = started + POLL_FIRST;
        let mut loading = false;
        let mut next_stopped_check = started + STOPPED_CHECK;
        tokio::pin!(abort);
        loop {
            let stall_deadline = if loading {
                last_progress + self.config.stall_timeout
            } else {
                deadline
            };
            let wake = next_probe.min(deadline).min(stall_deadline);
            tokio::select! {
                biased;
                _ = &mut abort => return Err(self.cancelled_error()),
                exit = running.child.exit.exited() => {
                    running.drain(&self.publisher).await;
                    return Err(exit_error(&engine, &self.owned().address, exit, running.last_lines()));
                }
                line = running.child.lines.recv(), if running.output_open => {
                    if let Some(line) = line {
                        let announces = line.line.to_ascii_lowercase().contains("listening on");
                        running.push_line(&self.publisher, line);
                        last_progress = Instant::now();
                        if announces {
                            next_probe = Instant::now();
                        }
                    } else {
                        running.output_open = false;
                    }
                }
                _ = tokio::time::sleep_until(wake) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(Error::StartupTimeout {
                            engine, timeout: self.config.startup_timeout, last_lines: running.last_lines(),
                        });
                    }
                    if loading && now >= stall_deadline {
                        return Err(Error::Stalled {
                            engine, stall: self.config.stall_timeout, last_lines: running.last_lines(),
                        });
                    }
                    if now < next_probe {
                        continue;
                    }
                    match probe::probe_path(self.engine(), self.config.health_path(), &self.owned().address, self.config.probe_timeout).await {
                        ProbeOutcome::Ready { version } => return Ok(version),
                        ProbeOutcome::Loading => {
                            if !loading {
                                loading = true;
                                last_progress = Instant::now();
                                self.publisher.publish(Change::Loading, |_| {});
                            }
                        }
                        ProbeOutcome::Answered { status, body } => {
                            return Err(Error::NotReady {
                                engine, url: self.owned().address.to_string(), status, body,
                                last_lines: running.last_lines(),
                            });
                        }
                        ProbeOutcome::Refused | ProbeOutcome::NoHttp(_) | ProbeOutcome::Unreachable(_) => {
                            // Stopped (`SIGSTOP`) while starting: it cannot become ready,
                            // so do not wait out the startup timeout for it.
                            if Instant::now() >= next_stopped_check {
                                next_stopped_check = Instant::now() + STOPPED_CHECK;
                                if monitor::activity(running.child.pid).await.all_stopped() {
                                    return Err(Error::Unresponsive {
                                        engine, stopped: true, misses: 0,
                                        interval: STOPPED_CHECK, last_lines: running.last_lines(),
                                    });
                                }
                            }
                        }
                    }
                    delay = (delay * 2).min(POLL_MAX);
                    next_probe = Instant::now() + delay;
                }
            }
        }
    }
}

/// How often a starting engine that does not answer is checked for being stopped.
const STOPPED_CHECK: Duration = Duration::from_secs(1);

/// The error for an engine that exited before it was ready: a port conflict when its
/// output says so, else its exit status.
pub(super) fn exit_error(
    engine: &str,
    address: &EngineAddress,
    exit: ExitInfo,
    last_lines: Vec<String>,
) -> Error {
    let port_taken = last_lines.iter().any(|line| {
        let line = line.to_ascii_lowercase();
        line.contains("address already in use")
            || line.contains("couldn't bind")
            || line.contains("could not bind")
    });
    match address {
        EngineAddress::Tcp(endpoint) if port_taken => {
            return Error::PortInUse {
                port: endpoint.port(),
                url: endpoint.origin(),
                evidence: "engine-output".into(),
                last_lines,
            }
        }
        EngineAddress::Unix(socket) if port_taken => {
            return Error::SocketInUse {
                socket: socket.clone(),
            }
        }
        _ => {}
    }
    Error::ExitedEarly {
        engine: engine.into(),
        status: exit.describe(),
        code: exit.code,
        signal: exit.signal,
        last_lines,
    }
}

/// llama.cpp's build (`b6000` from `/props` `build_info` `b6000-abc123`), if it says.
pub(super) async fn llama_build(address: &EngineAddress, timeout: Duration) -> Option<String> {
    let answer = crate::http::get(address, "/props", timeout).await.ok()?;
    if !(200..300).contains(&answer.status) {
        return None;
    }
    let props: Value = serde_json::from_slice(&answer.body).ok()?;
    let build = props.get("build_info")?.as_str()?;
    Some(build.split('-').next().unwrap_or(build).to_string())
}

/// Compares versions loosely: case, a leading `v` (Ollama) or `b` (llama.cpp build),
/// and anything after the first `-`, space or `(` are ignored.
pub(crate) fn normalize_version(version: &str) -> String {
    let lower = version.trim().to_ascii_lowercase();
    let lower = lower
        .strip_prefix("version:")
        .map(str::trim)
        .unwrap_or(&lower);
    let mut text = lower.strip_prefix('v').unwrap_or(lower);
    if let Some(rest) = text.strip_prefix('b') {
        if rest.starts_with(|c: char| c.is_ascii_digit()) {
            text = rest;
        }
    }
    text.split(['-', ' ', '('])
        .next()
        .unwrap_or(text)
        .to_string()
}
