//! The task that owns a ready child: its output, crashes and restarts, the readiness
//! watchdog, and its stop.

use super::*;

impl Watchdog {
    pub(super) fn new(config: &crate::config::EngineConfig) -> Self {
        Self {
            interval: config.watchdog_interval,
            misses: config.watchdog_misses,
            missed: 0,
            next: Instant::now() + config.watchdog_interval,
        }
    }

    pub(super) async fn unanswered(&mut self, context: &Context) {
        if self.misses == 0 || self.interval.is_zero() {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep_until(self.next).await;
            self.next = Instant::now() + self.interval;
            let outcome = probe::probe_path(
                context.engine(),
                context.config.health_path(),
                &context.owned().address,
                self.interval,
            )
            .await;
            if matches!(outcome, ProbeOutcome::Ready { .. } | ProbeOutcome::Loading) {
                self.missed = 0;
                continue;
            }
            self.missed += 1;
            if self.missed >= self.misses {
                return;
            }
        }
    }
}

impl Monitor {
    pub(super) async fn run(mut self, mut running: Running) {
        let publisher = self.context.publisher.clone();
        let mut watchdog = Watchdog::new(&self.context.config);
        loop {
            let mut stop = self.stop.clone();
            let stop_requested = async move {
                let _ = stop.wait_for(|requested| *requested).await;
            };
            tokio::select! {
                biased;
                _ = stop_requested => {
                    let (step, exit) = self.context.terminate(&mut running).await;
                    self.context.remove_record(&running.nonce).await;
                    publisher.publish(Change::Stopped, |s| {
                        s.stop_step = Some(step);
                        s.exit = Some(exit);
                        s.pid = None;
                    });
                    self.finish(step, Some(exit));
                    return;
                }
                line = running.child.lines.recv(), if running.output_open => {
                    match line {
                        Some(line) => running.push_line(&publisher, line),
                        // Both pipes closed; the exit branch will follow.
                        None => running.output_open = false,
                    }
                }
                () = watchdog.unanswered(&self.context) => {
                    // Stopped answering while ready: stopped like a crash, so requests
                    // waiting on it fail now and the next one starts it again.
                    let (_, exit) = self.context.terminate(&mut running).await;
                    running.drain(&publisher).await;
                    let error = Error::Unresponsive {
                        engine: self.context.engine().as_str().into(),
                        misses: watchdog.misses,
                        interval: watchdog.interval,
                        last_lines: running.last_lines(),
                    };
                    publisher.publish(Change::Failed, |s| {
                        s.error = Some(error_json(&error));
                        s.exit = Some(exit);
                        s.pid = None;
                    });
                    self.context.remove_record(&running.nonce).await;
                    match self.restart().await {
                        Some(next) => {
                            running = next;
                            watchdog = Watchdog::new(&self.context.config);
                        }
                        None => {
                            self.finish(StopStep::Sigkill, Some(exit));
                            return;
                        }
                    }
                }
                exit = running.child.exit.exited() => {
                    running.drain(&publisher).await;
                    let error = Error::ExitedEarly {
                        engine: self.context.engine().as_str().into(),
                        status: exit.describe(),
                        code: exit.code,
                        signal: exit.signal,
                        last_lines: running.last_lines(),
                    };
                    let message = format!("`{}` stopped unexpectedly ({})", self.context.engine(), exit.describe());
                    let mut record = error_json(&error);
                    record["message"] = Value::String(message);
                    publisher.publish(Change::Failed, |s| {
                        s.error = Some(record);
                        s.exit = Some(exit);
                        s.pid = None;
                    });
                    self.context.remove_record(&running.nonce).await;
                    match self.restart().await {
                        Some(next) => running = next,
                        None => {
                            if *self.stop.borrow() {
                                publisher.publish(Change::Stopped, |s| {
                                    s.stop_step = Some(StopStep::AlreadyExited);
                                });
                            }
                            self.finish(StopStep::AlreadyExited, Some(exit));
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Restarts after a crash when the policy allows; `None` when staying down.
    pub(super) async fn restart(&mut self) -> Option<Running> {
        let RestartPolicy::OnFailure {
            max_restarts,
            backoff,
        } = self.context.config.restart
        else {
            return None;
        };
        loop {
            if *self.stop.borrow() {
                return None;
            }
            if self.restarts >= max_restarts {
                self.publish_gave_up();
                return None;
            }
            let delay = backoff
                .saturating_mul(1u32 << self.restarts.min(10))
                .min(Duration::from_secs(30));
            self.restarts += 1;
            let mut stop = self.stop.clone();
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.wait_for(|r| *r) => return None,
            }
            let restarts = self.restarts;
            self.context.publisher.update(|s| s.restarts = restarts);
            let execution = self.context.publisher.snapshot().execution;
            let mut running = match self
                .context
                .spawn(&self.executable, &self.launch, execution)
                .await
            {
                Ok(running) => running,
                Err(error) => {
                    self.publish_error(&error);
                    continue;
                }
            };
            let mut stop = self.stop.clone();
            let abort = async move {
                let _ = stop.wait_for(|r| *r).await;
            };
            match self.context.wait_ready(&mut running, abort).await {
                Ok(version) => {
                    self.context.publisher.publish(Change::Ready, |s| {
                        if version.is_some() {
                            s.version = version;
                        }
                    });
                    return Some(running);
                }
                Err(error) => {
                    let error = self.context.fail_start(running, error).await;
                    if error.is_cancelled() {
                        return None;
                    }
                    self.publish_error(&error);
                }
            }
        }
    }

    /// Says once, as the final `error`, that the restart policy is exhausted: "gave up
    /// restarting `llama.cpp` after N restarts: <the last error>" (`details.gaveUp`).
    pub(super) fn publish_gave_up(&self) {
        let last = self.context.publisher.snapshot().error;
        let reason = last
            .as_ref()
            .and_then(|e| e["message"].as_str())
            .unwrap_or("it failed")
            .to_string();
        let restarts = self.restarts;
        let noun = if restarts == 1 { "restart" } else { "restarts" };
        let mut record = last.unwrap_or_else(|| json!({"code": codes::LOCAL_AI_SERVER_FAILED}));
        record["message"] = Value::String(format!(
            "gave up restarting `{}` after {restarts} {noun}: {reason}",
            self.context.engine()
        ));
        if !record["details"].is_object() {
            record["details"] = json!({});
        }
        record["details"]["gaveUp"] = Value::Bool(true);
        record["details"]["restarts"] = json!(restarts);
        self.context
            .publisher
            .publish(Change::GaveUp, |s| s.error = Some(record));
    }

    pub(super) fn publish_error(&self, error: &Error) {
        let record = error_json(error);
        self.context
            .publisher
            .publish(Change::Failed, |s| s.error = Some(record));
    }

    pub(super) fn finish(&self, step: StopStep, exit: Option<ExitInfo>) {
        let snapshot = self.context.publisher.snapshot();
        let report = StopReport {
            step,
            exit,
            snapshot: snapshot.clone(),
        };
        let _ = self.done.send(Some(report));
        run_hook(&self.context.hook, &snapshot);
    }
}
