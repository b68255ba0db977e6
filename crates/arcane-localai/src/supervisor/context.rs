//! The start of one engine: probe first, adopt what answers, check the version, reap
//! an orphan an earlier Arcane left.

use super::*;

impl Context {
    pub(super) fn engine(&self) -> Engine {
        self.config.engine
    }

    /// The configured url: probed first, adopted when it answers.
    pub(super) fn endpoint(&self) -> &Endpoint {
        &self.validated.endpoint
    }

    /// The configured url as an address to probe.
    pub(super) fn configured(&self) -> EngineAddress {
        EngineAddress::Tcp(self.validated.endpoint.clone())
    }

    /// Where an engine Arcane starts listens, and its key.
    pub(super) fn owned(&self) -> &crate::config::Owned {
        &self.validated.owned
    }

    /// Prepares [`Context::owned`] for a spawn (see [`listen`]).
    pub(super) async fn prepare_listen(&self) -> Result<(), Error> {
        let (workspace, id, owned) = (
            self.workspace.clone(),
            self.config.id.clone(),
            self.owned().clone(),
        );
        tokio::task::spawn_blocking(move || listen::prepare(&workspace, &id, &owned))
            .await
            .unwrap_or_else(|_| {
                Err(Error::Io {
                    operation: "prepare",
                    path: arcane_workspace::layout::run_dir(&self.workspace),
                    source: std::io::Error::other("the preparation did not finish"),
                })
            })
    }

    pub(super) async fn start(self, cancel: &CancelToken) -> Result<Server, Error> {
        if cancel.is_cancelled() {
            return Err(self.cancelled_error());
        }
        self.reap_orphan().await?;
        if !self.config.adopts() {
            // Its own engine, always: nothing at the url is asked, let alone adopted.
            return self.launch(cancel).await;
        }
        let configured = self.configured();
        let outcome = tokio::select! {
            outcome = probe::probe(self.engine(), &configured, self.config.probe_timeout) => outcome,
            _ = cancel.cancelled() => return Err(self.cancelled_error()),
        };
        let answered = !matches!(outcome, ProbeOutcome::Refused);
        let reported = match &outcome {
            ProbeOutcome::Ready { version } => version.clone(),
            _ => None,
        };
        if answered {
            self.publisher.update(|s| s.external = true);
        }
        match decide(
            self.engine(),
            self.endpoint(),
            outcome,
            self.validated.selection.as_deref(),
        ) {
            Decision::Adopt => self.adopt(false, reported, cancel).await,
            Decision::AdoptLoading => self.adopt(true, None, cancel).await,
            Decision::Spawn => self.launch(cancel).await,
            Decision::Fail(error) => Err(error),
        }
    }

    pub(super) fn cancelled_error(&self) -> Error {
        Error::Cancelled {
            engine: self.engine().as_str().into(),
        }
    }

    /// Adopts an external server: waits for it if it is loading, checks the version,
    /// publishes `ready`, and runs the exit hook (nothing was spawned).
    pub(super) async fn adopt(
        self,
        loading: bool,
        reported: Option<String>,
        cancel: &CancelToken,
    ) -> Result<Server, Error> {
        let mut version = reported;
        if loading {
            self.publisher.publish(Change::Loading, |_| {});
            version = self.wait_external(cancel).await?;
        }
        let address = EngineAddress::Tcp(self.endpoint().clone());
        let version = self.check_version(&address, version, None).await?;
        self.publisher
            .publish(Change::Ready, |s| s.version = version);
        run_hook(&self.hook, &self.publisher.snapshot());
        Ok(Server::Adopted(AdoptedServer {
            publisher: self.publisher,
        }))
    }

    /// Polls a loading external server until it is ready (or the startup timeout).
    pub(super) async fn wait_external(
        &self,
        cancel: &CancelToken,
    ) -> Result<Option<String>, Error> {
        let deadline = Instant::now() + self.config.startup_timeout;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(POLL_MAX) => {}
                _ = cancel.cancelled() => return Err(self.cancelled_error()),
            }
            match probe::probe(self.engine(), &self.configured(), self.config.probe_timeout).await {
                ProbeOutcome::Ready { version } => return Ok(version),
                ProbeOutcome::Loading if Instant::now() < deadline => {}
                ProbeOutcome::Loading => {
                    return Err(Error::ExternalNotReady {
                        engine: self.engine().as_str().into(),
                        url: self.endpoint().origin(),
                        timeout: self.config.startup_timeout,
                    })
                }
                other => {
                    return match decide(self.engine(), self.endpoint(), other, None) {
                        Decision::Fail(error) => Err(error),
                        _ => Err(Error::NotLoopback {
                            url: self.endpoint().origin(),
                        }),
                    }
                }
            }
        }
    }

    /// Checks the requested version against what the server reports (Ollama's
    /// `/api/version`; llama.cpp's `/props` `build_info`, else the registry's record
    /// of the executable). Returns the observed version.
    pub(super) async fn check_version(
        &self,
        address: &EngineAddress,
        reported: Option<String>,
        runtime: Option<&str>,
    ) -> Result<Option<String>, Error> {
        let requested = self.config.version.as_deref().filter(|v| *v != "latest");
        let over_http = self.engine().kind().reports_build_over_http();
        let observed = match reported {
            Some(version) => Some(version),
            // `/props` costs a round trip on the way to ready: ask only when it matters.
            None if over_http && requested.is_some() => {
                llama_build(address, self.config.probe_timeout)
                    .await
                    .or_else(|| runtime.map(str::to_string))
            }
            None if over_http => runtime.map(str::to_string),
            None => None,
        };
        let Some(requested) = requested else {
            return Ok(observed);
        };
        let matches = observed
            .as_deref()
            .is_some_and(|o| normalize_version(o) == normalize_version(requested));
        if matches {
            Ok(observed)
        } else {
            Err(Error::VersionMismatch {
                engine: self.engine().as_str().into(),
                url: self.endpoint().origin(),
                requested: requested.into(),
                observed,
            })
        }
    }

    /// The engines' ownership records in this workspace.
    pub(super) fn records(&self) -> RecordStore<Record> {
        RecordStore::new(&self.workspace)
    }

    /// Stops a proven orphan of an earlier Arcane, removes stale records.
    pub(super) async fn reap_orphan(&self) -> Result<(), Error> {
        let _reaping = records::REAPING.lock().await;
        let store = self.records();
        records::check_dir(&store).await?;
        let Some(record) = store.read(&self.config.id) else {
            return Ok(());
        };
        let (judged, grace, claimed) = (store.clone(), self.config.stop_grace, record.clone());
        let settled = tokio::task::spawn_blocking(move || judged.settle(&claimed, grace))
            .await
            .unwrap_or(records::Settled::Stays);
        match settled {
            records::Settled::Stays => return Ok(()),
            records::Settled::Stale => {}
            records::Settled::Stopped(step) => {
                records::orphan_event(&*self.events, &record, step);
            }
        }
        // Stale, or its orphan stopped: the record goes.
        records::with_lock(
            &self.workspace,
            self.engine().as_str(),
            &self.events,
            move || store.remove(&record.id, &record.nonce),
        )
        .await
    }
}
