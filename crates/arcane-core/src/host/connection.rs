//! One client's connection: its request-id space, its events, accepted work that a
//! shutdown waits for, and what is forgotten when it goes.

use super::*;

impl Work {
    /// Resolves when a shutdown's drain deadline passed: stop the work now.
    pub fn cancelled(&self) -> WaitForCancellationFutureOwned {
        self.cancel.clone().cancelled_owned()
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        self.host.active.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        if let Ok(mut active) = self.connection.active.lock() {
            if let Some(request) = active.remove(&self.id) {
                // A dropped dispatch (client gone) cancels its work.
                request.cancel.cancel();
            }
        }
        self.host.active.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Connection {
    /// The host this connection belongs to.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Subscribes to events: the replay first, then every broadcast event and every
    /// event of this connection's requests. The channel ends when the host closes.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<Arc<str>> {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.subscribe_sink(FrameSink::Unbounded(sender));
        receiver
    }

    /// Subscribes `sender` (what [`crate::dispatch::Session::subscribe`] does for a
    /// transport: stdio's one ordered channel, a network client's bounded one).
    pub(crate) fn subscribe_sink(&self, sender: FrameSink) {
        let inner = &self.host.inner;
        let Ok(mut subscribers) = inner.subscribers.lock() else {
            return;
        };
        for frame in inner.replay_frames() {
            sender.send(frame);
        }
        if *inner.state.borrow() != HostState::Closed {
            subscribers.push(Subscriber {
                connection: self.inner.id,
                sender,
            });
        }
    }

    /// Sends a frame to this connection's subscribers only (e.g. a response copy).
    pub fn deliver(&self, frame: &Value) {
        let text: Arc<str> = Arc::from(frame.to_string());
        if let Ok(mut subscribers) = self.host.inner.subscribers.lock() {
            subscribers
                .retain(|s| s.connection != self.inner.id || s.sender.send(Arc::clone(&text)));
        }
    }

    /// Applies a control frame to this connection and returns its result.
    pub fn control(&self, control: Control) -> Value {
        match control {
            Control::Cancel { request_id } => {
                let cancelled = self
                    .inner
                    .active
                    .lock()
                    .ok()
                    .and_then(|active| {
                        active
                            .get(&request_id)
                            .filter(|r| r.lifetime == Lifetime::Request)
                            .map(|r| r.cancel.cancel())
                    })
                    .is_some();
                json!({"requestId": request_id, "cancelled": cancelled})
            }
            Control::CancelAll => {
                let mut count = 0;
                if let Ok(active) = self.inner.active.lock() {
                    for request in active.values().filter(|r| r.lifetime == Lifetime::Request) {
                        request.cancel.cancel();
                        count += 1;
                    }
                }
                json!({"cancelled": count})
            }
            Control::Replay => {
                let inner = &self.host.inner;
                let frames = inner.replay_frames();
                let count = frames.len();
                if let Ok(mut subscribers) = inner.subscribers.lock() {
                    subscribers.retain(|s| {
                        s.connection != self.inner.id
                            || frames.iter().all(|f| s.sender.send(Arc::clone(f)))
                    });
                }
                json!({"replayed": count})
            }
        }
    }

    /// Cancels every request-lifetime request of this connection (a disconnect).
    pub fn cancel_all(&self) {
        let _ = self.control(Control::CancelAll);
    }

    /// Dispatches one request and returns its response (never fails: errors become
    /// `ok:false` responses).
    pub async fn dispatch(&self, request: Request) -> Response {
        let prepared = self.prepare(request);
        self.finish(prepared).await
    }

    /// The synchronous half of [`Connection::dispatch`]: admits the request (or
    /// refuses it) at once, so a transport that reads a request before end of input
    /// has it counted as accepted even if shutdown starts before it runs.
    pub fn prepare(&self, request: Request) -> Prepared {
        let host = &self.host.inner;
        let Request {
            id,
            method,
            parameters,
        } = request;
        // `core.host.shutdown` waits for the close it starts, so it cannot count as an
        // accepted request the close waits for; the other built-ins do.
        if method == "core.host.shutdown" {
            return Prepared(PreparedKind::Builtin { id, method });
        }
        let refuse = |error: Error| {
            Prepared(PreparedKind::Refused {
                id: id.clone(),
                error,
            })
        };
        let target = if BUILTIN_METHODS.contains(&method.as_str()) {
            Some((None, Lifetime::Request))
        } else {
            host.methods
                .get(&method)
                .map(|&(index, lifetime)| (Some(index), lifetime))
        };
        let Some((index, lifetime)) = target else {
            let namespace = namespace_of(&method).to_string();
            let reason = if host.namespaces.contains(&namespace) {
                "core-method-unavailable"
            } else {
                "core-namespace-unavailable"
            };
            return refuse(Error::MethodNotAllowed {
                method,
                namespace,
                reason,
            });
        };
        let cancel = match lifetime {
            Lifetime::Request => host.request_work.child_token(),
            Lifetime::Service => CancellationToken::new(),
        };
        // Admission and the active count change under one lock, so `close` never
        // misses a request it admitted.
        {
            let Ok(admitted) = host.admission.lock() else {
                return refuse(Error::ShuttingDown);
            };
            if !*admitted {
                return refuse(Error::ShuttingDown);
            }
            let Ok(mut active) = self.inner.active.lock() else {
                return refuse(Error::ShuttingDown);
            };
            if active.contains_key(&id) {
                return refuse(Error::RequestIdActive { id: id.clone() });
            }
            active.insert(
                id.clone(),
                ActiveRequest {
                    method: method.clone(),
                    lifetime,
                    cancel: cancel.clone(),
                },
            );
            host.active.send_modify(|n| *n += 1);
        }
        let guard = ActiveGuard {
            host: Arc::clone(host),
            connection: Arc::clone(&self.inner),
            id: id.clone(),
        };
        let request = Admitted {
            id,
            method,
            parameters,
            index,
            lifetime,
            cancel,
        };
        Prepared(PreparedKind::Admitted(request, guard))
    }

    /// The asynchronous half of [`Connection::dispatch`]: runs a prepared request.
    pub async fn finish(&self, prepared: Prepared) -> Response {
        let mut answer = None;
        self.finish_then(prepared, |response| answer = Some(response))
            .await;
        answer.unwrap_or_else(|| Response::error(None, &Error::ShuttingDown))
    }

    /// Like [`Connection::finish`], handing the response to `deliver` while the request
    /// still counts as accepted, so a shutdown waits until it is written (the stdio
    /// transport queues it here, before `closed`).
    pub async fn finish_then(&self, prepared: Prepared, deliver: impl FnOnce(Response)) {
        match prepared.0 {
            PreparedKind::Refused { id, error } => deliver(Response::error(Some(id), &error)),
            PreparedKind::Builtin { id, method } => {
                deliver(Response::ok(id, self.builtin(&method).await))
            }
            PreparedKind::Admitted(request, guard) => {
                let id = request.id.clone();
                let outcome = self.run(request).await;
                deliver(match outcome {
                    Ok(result) => Response::ok(id, result),
                    Err(error) => Response::error(Some(id), &*error),
                });
                drop(guard);
            }
        }
    }

    pub(super) async fn builtin(&self, method: &str) -> Value {
        let host = &self.host.inner;
        match method {
            "system.ping" => json!({"ok": true}),
            "version.current" => {
                json!({"name": "arcane", "version": host.version, "protocol": PROTOCOL})
            }
            "app.current" => json!(host.app),
            _ => {
                // `core.host.shutdown`: drains, then answers `{state:"closed"}`.
                self.host.begin_close();
                self.host.closed().await;
                json!({"state": "closed"})
            }
        }
    }

    async fn run(&self, request: Admitted) -> Result<Value, crate::service::BoxError> {
        let Admitted {
            id,
            method,
            parameters,
            index,
            lifetime,
            cancel,
        } = request;
        let host = &self.host.inner;
        let Some(index) = index else {
            return Ok(self.builtin(&method).await);
        };
        let entry = Arc::clone(&host.services[index]);
        let mut status = entry.status.subscribe();
        let settled = tokio::select! {
            status = status.wait_for(|s| s.state.is_settled()) => status.map(|s| s.clone()).ok(),
            _ = cancel.cancelled() => return Err(Box::new(Error::Cancelled { id })),
        };
        let Some(settled) = settled else {
            return Err(Box::new(Error::ShuttingDown));
        };
        if settled.state != ServiceState::Ready {
            return Err(Box::new(Error::ServiceUnavailable {
                service: entry.name.clone(),
                state: settled.state.as_str().to_string(),
                error: settled.error,
            }));
        }
        let context = RequestContext {
            request_id: id.clone(),
            method: method.clone(),
            cancel: cancel.clone(),
            events: self.host.events(),
            route: EventRoute::Request {
                connection: self.inner.id,
                request_id: id.clone(),
            },
        };
        let call = Arc::clone(&entry.service).call(method, parameters, context);
        match lifetime {
            Lifetime::Request => {
                let outcome = tokio::select! {
                    outcome = call => outcome,
                    _ = cancel.cancelled() => return Err(Box::new(Error::Cancelled { id })),
                };
                // Cancelled work that would otherwise succeed still reports the abort.
                if cancel.is_cancelled() {
                    return Err(Box::new(Error::Cancelled { id }));
                }
                outcome
            }
            Lifetime::Service => call.await,
        }
    }
}

/// Before a new name is added: forgets idle clients not used for [`NAMED_CLIENT_IDLE`],
/// then, at the cap, the least recently used idle one.
pub(super) fn forget_idle_clients(named: &mut HashMap<String, Named>) {
    named.retain(|_, entry| !(entry.idle() && entry.last_used.elapsed() >= NAMED_CLIENT_IDLE));
    if named.len() < MAX_NAMED_CLIENTS {
        return;
    }
    let oldest = named
        .iter()
        .filter(|(_, entry)| entry.idle())
        .min_by_key(|(_, entry)| entry.last_used)
        .map(|(name, _)| name.clone());
    if let Some(name) = oldest {
        named.remove(&name);
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // A private connection going away cancels its requests; named (HTTP) clients
        // outlive any one HTTP exchange.
        if Arc::strong_count(&self.inner) == 1 {
            self.cancel_all();
        }
    }
}
