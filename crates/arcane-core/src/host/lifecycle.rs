//! The host's own methods: starting its services, connections, shutdown and close,
//! what it reports about itself.

use super::*;

impl Host {
    /// A builder for a host serving `app`.
    pub fn builder(app: AppInfo) -> HostBuilder {
        HostBuilder {
            app,
            version: env!("CARGO_PKG_VERSION").to_string(),
            services: Vec::new(),
            names: HashSet::new(),
            methods: HashMap::new(),
            observer: Arc::new(NullSink),
            drain_deadline: DEFAULT_DRAIN_DEADLINE,
        }
    }

    /// Admits one piece of work a transport runs itself (a passthrough exchange):
    /// `None` once shutdown began. A shutdown waits for the returned [`Work`] to be
    /// dropped, until the drain deadline, then fires [`Work::cancelled`].
    pub fn accept_work(&self) -> Option<Work> {
        let inner = &self.inner;
        let admitted = inner.admission.lock().ok()?;
        if !*admitted {
            return None;
        }
        inner.active.send_modify(|n| *n += 1);
        drop(admitted);
        Some(Work {
            host: Arc::clone(inner),
            cancel: inner.held_work.child_token(),
        })
    }

    /// Starts every service in the background and admits requests. Must be called
    /// inside a tokio runtime. Calling it twice does nothing.
    pub fn start(&self) {
        {
            let Ok(mut admitted) = self.inner.admission.lock() else {
                return;
            };
            if *self.inner.state.borrow() != HostState::Created {
                return;
            }
            *admitted = true;
            self.inner.state.send_replace(HostState::Ready);
        }
        self.inner.publish(
            event_types::CORE_READY,
            json!({"version": self.inner.version, "app": self.inner.app}),
            EventRoute::Broadcast,
        );
        self.inner.publish_state();
        for entry in &self.inner.services {
            let entry = Arc::clone(entry);
            let inner = Arc::clone(&self.inner);
            let context = ServiceContext {
                events: self.events(),
                shutdown: self.inner.draining.clone(),
            };
            inner.set_service_state(&entry, ServiceState::Starting, None);
            tokio::spawn(async move {
                let outcome = Arc::clone(&entry.service).start(context).await;
                // A service that settles after shutdown began keeps its draining state.
                if entry.status.borrow().state != ServiceState::Starting {
                    return;
                }
                match outcome {
                    Ok(()) => inner.set_service_state(&entry, ServiceState::Ready, None),
                    Err(error) => {
                        let error = error_json(&*error);
                        inner.publish(
                            event_types::CORE_ERROR,
                            json!({"service": entry.name, "error": error}),
                            EventRoute::Broadcast,
                        );
                        inner.set_service_state(&entry, ServiceState::Failed, Some(error));
                    }
                }
            });
        }
        let host = self.clone();
        tokio::spawn(async move {
            host.inner.shutdown_requested.cancelled().await;
            host.begin_close();
        });
    }

    /// A handle that fires shutdown from anywhere.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.inner.shutdown_requested.clone())
    }

    /// An event publisher for services and libraries.
    pub fn events(&self) -> HostEvents {
        HostEvents {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// The dispatcher's state.
    pub fn state(&self) -> HostState {
        *self.inner.state.borrow()
    }

    /// Every service's name and status, in registration order.
    pub fn services(&self) -> Vec<(String, ServiceStatus)> {
        self.inner
            .services
            .iter()
            .map(|e| (e.name.clone(), e.status.borrow().clone()))
            .collect()
    }

    /// The service registered under `name`.
    pub fn service(&self, name: &str) -> Option<Arc<dyn Service>> {
        self.inner
            .services
            .iter()
            .find(|e| e.name == name)
            .map(|e| Arc::clone(&e.service))
    }

    /// Waits until the service `name` has settled, returning its status.
    pub async fn service_settled(&self, name: &str) -> Option<ServiceStatus> {
        let entry = self.inner.services.iter().find(|e| e.name == name)?;
        let mut rx = entry.status.subscribe();
        let status = rx.wait_for(|s| s.state.is_settled()).await.ok()?.clone();
        Some(status)
    }

    /// The full state as `core.state` carries it.
    pub fn snapshot(&self) -> Value {
        self.inner.state_json()
    }

    /// Opens a private connection (its own request-id space), e.g. for stdio.
    pub fn connect(&self, label: &str) -> Connection {
        let inner = self.inner.new_connection(label);
        Connection {
            host: self.clone(),
            inner,
        }
    }

    /// The connection named `client` (HTTP clients name theirs with `X-Arcane-Client` /
    /// `?client=`), created on first use and shared by every HTTP request naming it.
    pub fn named_connection(&self, client: &str) -> Connection {
        let inner = {
            let mut named = self.inner.named.lock().unwrap_or_else(|p| p.into_inner());
            if !named.contains_key(client) {
                forget_idle_clients(&mut named);
            }
            let entry = named.entry(client.to_string()).or_insert_with(|| Named {
                connection: self.inner.new_connection(client),
                last_used: std::time::Instant::now(),
            });
            entry.last_used = std::time::Instant::now();
            Arc::clone(&entry.connection)
        };
        Connection {
            host: self.clone(),
            inner,
        }
    }

    /// Publishes `core.http.connection-limit` (the HTTP transport refused a connection
    /// because `max` were open).
    pub fn publish_connection_limit(&self, max: usize) {
        self.inner.publish(
            "core.http.connection-limit",
            serde_json::json!({
                "maxConnections": max,
                "message": format!("refusing new connections: {max} are open (a local process may be holding them)"),
            }),
            EventRoute::Broadcast,
        );
    }

    /// How many named clients the host remembers now (bounded; see
    /// [`named_connection`](Self::named_connection)).
    pub fn named_clients(&self) -> usize {
        self.inner
            .named
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Starts closing in the background (idempotent); see [`Host::close`].
    pub fn begin_close(&self) {
        if self.inner.closing.swap(true, Ordering::SeqCst) {
            return;
        }
        self.inner.shutdown_requested.cancel();
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move { inner.run_close().await });
    }

    /// Drains and closes the host, waiting until it is closed. Idempotent: every
    /// caller waits for the same sequence. Fails when a service's `drain` or
    /// `dispose` failed (the host is closed either way).
    pub async fn close(&self) -> Result<(), Error> {
        self.begin_close();
        self.closed().await;
        let failures = self
            .inner
            .close_failures
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Error::Shutdown { failures })
        }
    }

    /// Resolves once the host is closed.
    pub async fn closed(&self) {
        let mut rx = self.inner.state.subscribe();
        let _ = rx.wait_for(|s| *s == HostState::Closed).await;
    }

    /// Resolves once shutdown was requested (draining may still be running).
    pub async fn closing(&self) {
        self.inner.shutdown_requested.cancelled().await;
    }
}
