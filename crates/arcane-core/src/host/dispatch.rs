//! Inside the host: routing a request to its service, the services' states, events to
//! subscribers, the draining shutdown.

use super::*;

impl Inner {
    pub(super) fn new_connection(&self, label: &str) -> Arc<ConnectionInner> {
        let id = self.next_connection.fetch_add(1, Ordering::Relaxed);
        let connection = Arc::new(ConnectionInner {
            id,
            label: label.to_string(),
            active: Mutex::new(HashMap::new()),
        });
        if let Ok(mut all) = self.connections.lock() {
            all.retain(|_, weak| weak.strong_count() > 0);
            all.insert(id, Arc::downgrade(&connection));
        }
        connection
    }

    pub(super) fn set_service_state(
        &self,
        entry: &Entry,
        state: ServiceState,
        error: Option<Value>,
    ) {
        entry.status.send_replace(ServiceStatus {
            state,
            error: error.clone(),
        });
        self.publish(
            event_types::CORE_SERVICE_STATE,
            json!({"name": entry.name, "state": state.as_str(), "error": error}),
            EventRoute::Broadcast,
        );
    }

    pub(super) fn state_json(&self) -> Value {
        let services: Vec<Value> = self
            .services
            .iter()
            .map(|e| {
                let status = e.status.borrow();
                json!({"name": e.name, "state": status.state.as_str(), "error": status.error})
            })
            .collect();
        let mut active = Vec::new();
        if let Ok(connections) = self.connections.lock() {
            for connection in connections.values().filter_map(Weak::upgrade) {
                if let Ok(requests) = connection.active.lock() {
                    for (id, request) in requests.iter() {
                        active.push(json!({"id": id, "connection": connection.label, "method": request.method, "lifetime": request.lifetime}));
                    }
                }
            }
        }
        json!({
            "protocol": PROTOCOL,
            "state": self.state.borrow().as_str(),
            "version": self.version,
            "app": self.app,
            "services": services,
            "activeRequests": active,
        })
    }

    pub(super) fn publish_state(&self) {
        self.publish(
            event_types::CORE_STATE,
            self.state_json(),
            EventRoute::Broadcast,
        );
    }

    pub(super) fn publish(&self, event: &str, data: Value, route: EventRoute) {
        self.publish_frame(
            EventFrame {
                event: event.to_string(),
                data,
                request_id: None,
                time: arcane_report::time::now_rfc3339(),
            },
            route,
        );
    }

    pub(super) fn publish_frame(&self, mut frame: EventFrame, route: EventRoute) {
        let target = match &route {
            EventRoute::Broadcast => {
                self.observer.emit(Event {
                    kind: frame.event.clone(),
                    time: frame.time.clone(),
                    data: frame.data.clone(),
                });
                None
            }
            EventRoute::Request {
                connection,
                request_id,
            } => {
                frame.request_id = Some(request_id.clone());
                Some(*connection)
            }
        };
        let text: Arc<str> = Arc::from(frame.to_frame().to_string());
        let Ok(mut subscribers) = self.subscribers.lock() else {
            return;
        };
        subscribers.retain(|s| {
            if target.is_some_and(|t| t != s.connection) {
                return true;
            }
            s.sender.send(Arc::clone(&text))
        });
    }

    /// The replay frames, in order: `core.ready` (when ready), `core.state`, one
    /// `core.service.state` per service, each service's snapshots.
    pub(super) fn replay_frames(&self) -> Vec<Arc<str>> {
        let time = arcane_report::time::now_rfc3339();
        let frame = |event: &str, data: Value| -> Arc<str> {
            Arc::from(
                EventFrame {
                    event: event.to_string(),
                    data,
                    request_id: None,
                    time: time.clone(),
                }
                .to_frame()
                .to_string(),
            )
        };
        let mut frames = Vec::new();
        if *self.state.borrow() == HostState::Ready {
            frames.push(frame(
                event_types::CORE_READY,
                json!({"version": self.version, "app": self.app}),
            ));
        }
        frames.push(frame(event_types::CORE_STATE, self.state_json()));
        for entry in &self.services {
            let status = entry.status.borrow().clone();
            frames.push(frame(
                event_types::CORE_SERVICE_STATE,
                json!({"name": entry.name, "state": status.state.as_str(), "error": status.error}),
            ));
        }
        for entry in &self.services {
            for (event, data) in entry.service.replay() {
                frames.push(frame(&event, data));
            }
        }
        frames
    }

    pub(super) async fn run_close(self: Arc<Self>) {
        // 1. Refuse new requests.
        if let Ok(mut admitted) = self.admission.lock() {
            *admitted = false;
        }
        self.state.send_replace(HostState::Draining);
        self.draining.cancel();
        self.publish_state();
        // 2. Cancel request-lifetime work.
        self.request_work.cancel();
        // 3. Wait for every accepted request to be answered and every `Work` to end;
        //    past the drain deadline, cancel the work (passthrough bodies are cut and
        //    their upstream connections closed) and wait for it to let go.
        let mut active = self.active.subscribe();
        let drained = tokio::time::timeout(self.drain_deadline, active.wait_for(|n| *n == 0))
            .await
            .is_ok();
        if !drained {
            self.held_work.cancel();
            let _ = active.wait_for(|n| *n == 0).await;
        }
        // 4. Drain then dispose each service, concurrently.
        let mut tasks = tokio::task::JoinSet::new();
        for entry in &self.services {
            let error = entry.status.borrow().error.clone();
            self.set_service_state(entry, ServiceState::Draining, error);
            let entry = Arc::clone(entry);
            tasks.spawn(async move {
                let mut failures = Vec::new();
                if let Err(error) = Arc::clone(&entry.service).drain().await {
                    failures.push(json!({"service": entry.name, "step": "drain", "error": error_json(&*error)}));
                }
                if let Err(error) = Arc::clone(&entry.service).dispose().await {
                    failures.push(json!({"service": entry.name, "step": "dispose", "error": error_json(&*error)}));
                }
                (entry, failures)
            });
        }
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((entry, failures)) => {
                    let error = failures.first().map(|f| f["error"].clone());
                    self.set_service_state(&entry, ServiceState::Closed, error);
                    if let Ok(mut all) = self.close_failures.lock() {
                        all.extend(failures);
                    }
                }
                Err(join) => {
                    if let Ok(mut all) = self.close_failures.lock() {
                        all.push(json!({"step": "dispose", "error": {"code": arcane_report::codes::ARCANE_OPERATION_FAILED, "message": format!("a service task panicked: {join}")}}));
                    }
                }
            }
        }
        // 5. Publish `closed`, then end every event stream.
        self.state.send_replace(HostState::Closed);
        self.publish_state();
        if let Ok(mut subscribers) = self.subscribers.lock() {
            subscribers.clear();
        }
    }
}
