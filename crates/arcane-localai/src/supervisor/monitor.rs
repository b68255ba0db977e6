//! The task that owns a ready child: its output, crashes and restarts, the readiness
//! watchdog, and its stop.

use super::*;

impl Watchdog {
    pub(super) fn new(config: &crate::config::EngineConfig) -> Self {
        Self {
            interval: config.watchdog_interval,
            misses: config.watchdog_misses,
            missed: 0,
            timeout: config.watchdog_interval,
            next: Instant::now() + config.watchdog_interval,
        }
    }

    /// Probes until the engine is judged unresponsive (see [`Liveness`]); never
    /// returns while it answers, or works without answering.
    pub(super) async fn unresponsive(&mut self, context: &Context, group: u32) -> Unresponsive {
        if self.misses == 0 || self.interval.is_zero() {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep_until(self.next).await;
            let before = activity(group).await;
            let probed = Instant::now();
            let outcome = probe::probe_path(
                context.engine(),
                context.config.health_path(),
                &context.owned().address,
                self.timeout,
            )
            .await;
            self.next = Instant::now() + self.interval;
            if matches!(outcome, ProbeOutcome::Ready { .. } | ProbeOutcome::Loading) {
                self.missed = 0;
                self.timeout = self.interval;
                continue;
            }
            let after = activity(group).await;
            match Liveness::judge(&before, &after, probed.elapsed()) {
                Liveness::Stopped => return Unresponsive::Stopped,
                Liveness::Working => {
                    // Load, not death: nothing counts against it, and the next probe
                    // waits longer (a probe that times out still queues in the engine).
                    self.missed = 0;
                    self.timeout = (self.timeout * 2).min(self.interval * MAX_WIDENING);
                    context.publisher.emit(
                        event_types::LOCAL_AI_ENGINE_BUSY,
                        json!({"id": context.config.id, "engine": context.engine().as_str(),
                               "probeTimeoutMs": self.timeout.as_millis() as u64}),
                    );
                }
                Liveness::Idle => {
                    self.missed += 1;
                    self.timeout = (self.timeout * 2).min(self.interval * MAX_WIDENING);
                    if self.missed >= self.misses {
                        return Unresponsive::Hung;
                    }
                }
            }
        }
    }
}

/// How far an unanswered probe's timeout is widened, in watchdog intervals.
const MAX_WIDENING: u32 = 4;

/// Why the watchdog gave up on an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unresponsive {
    /// Every process of its group is stopped (`SIGSTOP`): it cannot answer until
    /// someone sends `SIGCONT`.
    Stopped,
    /// Probes went unanswered while its group used no CPU time at all.
    Hung,
}

/// What an unanswered probe says about an engine, judged by what its process group
/// did meanwhile (progress, not probe latency: a busy engine on a loaded machine may
/// take longer than any probe timeout to answer `/health`, while it streams tokens).
///
/// | its group during the probe | verdict | the watchdog |
/// |---|---|---|
/// | every process stopped (`SIGSTOP`) | [`Liveness::Stopped`] | unresponsive at once |
/// | did work (2 % of a CPU, at least 2 ticks) | [`Liveness::Working`] | not a miss; the next probe waits longer |
/// | did none | [`Liveness::Idle`] | a miss; the next probe waits longer |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Liveness {
    Stopped,
    Working,
    Idle,
}

impl Liveness {
    /// The verdict on a probe that went unanswered for `window`.
    pub(super) fn judge(
        before: &arcane_process::GroupActivity,
        after: &arcane_process::GroupActivity,
        window: Duration,
    ) -> Liveness {
        if after.all_stopped() {
            Liveness::Stopped
        } else if after.worked_since(before, window) {
            Liveness::Working
        } else {
            Liveness::Idle
        }
    }
}

/// What the engine's process group is doing, read off the async threads.
pub(super) async fn activity(group: u32) -> arcane_process::GroupActivity {
    tokio::task::spawn_blocking(move || arcane_process::group_activity(group))
        .await
        .unwrap_or_default()
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
                verdict = watchdog.unresponsive(&self.context, running.child.pid) => {
                    // Said first, so that nothing new is sent to it while it is killed
                    // (the gateway holds new requests for its replacement); killed at
                    // once, without the stop grace: it answers no signal it could act on.
                    let error = Error::Unresponsive {
                        engine: self.context.engine().as_str().into(),
                        stopped: verdict == Unresponsive::Stopped,
                        misses: watchdog.missed,
                        interval: watchdog.interval,
                        last_lines: running.last_lines(),
                    };
                    publisher.publish(Change::Failed, |s| s.error = Some(error_json(&error)));
                    let (step, exit) = self.context.kill(&mut running).await;
                    running.drain(&publisher).await;
                    publisher.update(|s| {
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
                            self.finish(step, Some(exit));
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
