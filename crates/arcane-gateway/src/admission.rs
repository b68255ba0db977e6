//! Admission: who of a model's requests goes to its engine now, who waits, and who is
//! told at once to come back later.
//!
//! Without it every request was forwarded the moment it arrived, so an engine's own
//! queue (unbounded, first come first served) decided: one application sending 16
//! requests made every other wait behind all 16, and a client whose SDK gives up after
//! its timeout found out only when that timeout passed.
//!
//! Each model owns one [`Admission`]:
//!
//! * at most `parallel` requests hold a [`Permit`] (are forwarded) at once;
//! * at most `max_queue` more wait; one beyond that is refused at once
//!   ([`Refusal::QueueFull`]);
//! * a request whose expected wait is longer than its own deadline (the client's
//!   timeout) is refused at once too ([`Refusal::Deadline`]) instead of timing out
//!   later;
//! * waiting requests are served by priority, highest first, and within a priority the
//!   keys take turns (round robin): each key's requests wait in a lane of their own, and
//!   a freed slot goes to the next lane's first request. One application holding many
//!   requests cannot starve another that sends one at a time.
//!
//! The expected wait is the work ahead of the request (the requests that would be
//! served before it under these rules) times the model's measured service time (an
//! exponentially weighted mean of the time a request holds its permit, from the moment
//! its engine is ready), divided by `parallel`. Until a first request has been measured
//! the service time is taken to be one second, and no deadline is judged by it. The
//! same figure is the `Retry-After` of a refusal.
//!
//! The queue's state is one mutex per model; a request that waits holds a oneshot
//! receiver, and the permit is handed over under that mutex, so a request that gives up
//! (its client went away) either is still in its lane, and leaves it, or was granted
//! its slot, and gives the slot back.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arcane_core::keys::Priority;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// `parallel` when the configuration gives none (llama.cpp's own slot count when its
/// `-np` is not set).
pub const DEFAULT_PARALLEL: usize = 4;

/// `max_queue` when the configuration gives none (Ollama's `OLLAMA_MAX_QUEUE`).
pub const DEFAULT_MAX_QUEUE: usize = 512;

/// The service time assumed before one is measured.
const UNMEASURED: Duration = Duration::from_secs(1);

/// How much one new measurement moves the mean service time.
const SMOOTHING: f64 = 0.2;

/// Why a request was refused at once.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// `max_queue` requests wait already.
    QueueFull {
        /// How many wait.
        queued: usize,
        /// When a retry may find room.
        retry_after: Duration,
    },
    /// The wait ahead of it is longer than its deadline.
    Deadline {
        /// The wait expected.
        expected: Duration,
        /// The client's deadline.
        deadline: Duration,
        /// When a retry may be served in time.
        retry_after: Duration,
    },
}

impl Refusal {
    /// When to come back.
    pub fn retry_after(&self) -> Duration {
        match self {
            Self::QueueFull { retry_after, .. } | Self::Deadline { retry_after, .. } => {
                *retry_after
            }
        }
    }

    /// Its name in metrics and details: `queue_full` or `deadline`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::QueueFull { .. } => "queue_full",
            Self::Deadline { .. } => "deadline",
        }
    }
}

/// One waiting request.
struct Waiter {
    ticket: u64,
    granted: oneshot::Sender<()>,
}

/// The waiting requests of one key.
struct Lane {
    key: Arc<str>,
    waiters: VecDeque<Waiter>,
}

/// What changes together.
struct State {
    running: usize,
    queued: usize,
    /// Lanes by priority (`HIGHEST_FIRST` order), each in turn order.
    lanes: [VecDeque<Lane>; 3],
    /// The key each priority served last: a key that starts waiting goes before it.
    last_served: [Option<Arc<str>>; 3],
    next_ticket: u64,
    /// The mean time a request holds its permit once served.
    service: Option<Duration>,
    /// Every key that ever waited: its count stays shown, at 0, once it waits no more.
    waited: HashSet<Arc<str>>,
}

/// The admission queue of one model (see the module documentation).
pub struct Admission {
    parallel: usize,
    max_queue: usize,
    state: Mutex<State>,
}

fn level(priority: Priority) -> usize {
    Priority::HIGHEST_FIRST
        .iter()
        .position(|p| *p == priority)
        .unwrap_or(1)
}

impl Admission {
    /// A queue forwarding `parallel` requests at once (at least one) with `max_queue`
    /// waiting.
    pub fn new(parallel: usize, max_queue: usize) -> Arc<Self> {
        Arc::new(Self {
            parallel: parallel.max(1),
            max_queue,
            state: Mutex::new(State {
                running: 0,
                queued: 0,
                lanes: Default::default(),
                last_served: Default::default(),
                next_ticket: 0,
                service: None,
                waited: HashSet::new(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `parallel` and `max_queue`.
    pub fn limits(&self) -> (usize, usize) {
        (self.parallel, self.max_queue)
    }

    /// Requests forwarded now, requests waiting, and waiting requests per key.
    pub fn depth(&self) -> (usize, usize, Vec<(Arc<str>, usize)>) {
        let state = self.lock();
        let mut by_key: Vec<_> = state
            .waited
            .iter()
            .map(|key| {
                let waiting = state.lanes.iter().flatten().find(|lane| lane.key == *key);
                (
                    Arc::clone(key),
                    waiting.map_or(0, |lane| lane.waiters.len()),
                )
            })
            .collect();
        by_key.sort();
        (state.running, state.queued, by_key)
    }

    /// The mean service time measured so far.
    pub fn service_time(&self) -> Option<Duration> {
        self.lock().service
    }

    /// Waits for a slot for a request of `key` at `priority`, or refuses it at once
    /// (see the module documentation).
    pub async fn admit(
        self: &Arc<Self>,
        key: &Arc<str>,
        priority: Priority,
        deadline: Option<Duration>,
    ) -> Result<Permit, Refusal> {
        let (ticket, granted) = {
            let mut state = self.lock();
            if state.running < self.parallel && state.queued == 0 {
                state.running += 1;
                return Ok(Permit::new(self));
            }
            if state.queued >= self.max_queue {
                return Err(Refusal::QueueFull {
                    queued: state.queued,
                    retry_after: self.wait_for(&state, state.queued + 1),
                });
            }
            let ahead = ahead_of(&state, key, priority);
            let expected = self.wait_for(&state, ahead + 1);
            if let (Some(deadline), Some(_)) = (deadline, state.service) {
                if expected > deadline {
                    return Err(Refusal::Deadline {
                        expected,
                        deadline,
                        retry_after: expected,
                    });
                }
            }
            let (sender, receiver) = oneshot::channel();
            let ticket = state.next_ticket;
            state.next_ticket += 1;
            enqueue(
                &mut state,
                key,
                priority,
                Waiter {
                    ticket,
                    granted: sender,
                },
            );
            (ticket, receiver)
        };
        let mut waiting = Waiting {
            admission: Arc::clone(self),
            ticket,
            done: false,
        };
        // The sender is dropped only after it sent (a grant) or with the waiter removed
        // by `Waiting::drop`: a closed channel cannot be seen here.
        let _ = granted.await;
        waiting.done = true;
        Ok(Permit::new(self))
    }

    /// The expected time until `ahead` requests before it (itself included) have been
    /// given a slot.
    fn wait_for(&self, state: &State, ahead: usize) -> Duration {
        let service = state.service.unwrap_or(UNMEASURED);
        service.mul_f64(ahead as f64 / self.parallel as f64)
    }

    /// A permit ended after serving for `served` (`None`: it never began serving): its
    /// slot goes to the next waiting request.
    fn release(&self, served: Option<Duration>) {
        let mut state = self.lock();
        if let Some(served) = served {
            state.service = Some(match state.service {
                None => served,
                Some(mean) => mean.mul_f64(1.0 - SMOOTHING) + served.mul_f64(SMOOTHING),
            });
        }
        state.running = state.running.saturating_sub(1);
        while state.running < self.parallel {
            let Some(waiter) = next(&mut state) else {
                break;
            };
            // A waiter that gave up left its lane first (`Waiting` drops before its
            // receiver), so a send only fails for nothing: the slot then stays free.
            if waiter.granted.send(()).is_ok() {
                state.running += 1;
            }
        }
    }

    /// A waiter that gave up: out of its lane if still there; if it was granted its
    /// slot meanwhile, the slot goes on.
    fn abandon(&self, ticket: u64) {
        let mut state = self.lock();
        if remove(&mut state, ticket) {
            return;
        }
        drop(state);
        // Granted between its wake-up and its giving up: pass the slot on.
        self.release(None);
    }
}

/// The requests that would be served before a new one of `key` at `priority`: every
/// waiting request of a higher priority, and in its own priority its own key's and, of
/// each other key's, as many as the turns before its own.
fn ahead_of(state: &State, key: &Arc<str>, priority: Priority) -> usize {
    let own = level(priority);
    let higher: usize = state.lanes[..own]
        .iter()
        .flatten()
        .map(|lane| lane.waiters.len())
        .sum();
    let lanes = &state.lanes[own];
    let mine = lanes
        .iter()
        .find(|lane| lane.key == *key)
        .map_or(0, |lane| lane.waiters.len());
    let others: usize = lanes
        .iter()
        .filter(|lane| lane.key != *key)
        .map(|lane| lane.waiters.len().min(mine + 1))
        .sum();
    higher + mine + others
}

/// Puts `waiter` in its key's lane; a key that was not waiting gets a lane of its own at
/// the end of the turns, but before the key that was served last (which has just had
/// its turn, and went to the end for it).
fn enqueue(state: &mut State, key: &Arc<str>, priority: Priority, waiter: Waiter) {
    let level = level(priority);
    let lanes = &mut state.lanes[level];
    match lanes.iter_mut().find(|lane| lane.key == *key) {
        Some(lane) => lane.waiters.push_back(waiter),
        None => {
            let lane = Lane {
                key: Arc::clone(key),
                waiters: VecDeque::from([waiter]),
            };
            let just_served = lanes
                .back()
                .is_some_and(|last| Some(&last.key) == state.last_served[level].as_ref());
            match just_served {
                true => lanes.insert(lanes.len() - 1, lane),
                false => lanes.push_back(lane),
            }
        }
    }
    state.queued += 1;
    if !state.waited.contains(key) {
        state.waited.insert(Arc::clone(key));
    }
}

/// The next request to serve: the first lane of the highest priority with any gives its
/// first waiter and goes to the back of its priority's turn.
fn next(state: &mut State) -> Option<Waiter> {
    let level = state.lanes.iter().position(|lanes| !lanes.is_empty())?;
    let lanes = &mut state.lanes[level];
    let mut lane = lanes.pop_front()?;
    let waiter = lane.waiters.pop_front()?;
    state.last_served[level] = Some(Arc::clone(&lane.key));
    if !lane.waiters.is_empty() {
        lanes.push_back(lane);
    }
    state.queued -= 1;
    Some(waiter)
}

/// Takes the waiter `ticket` out of its lane; whether it was there.
fn remove(state: &mut State, ticket: u64) -> bool {
    for lanes in state.lanes.iter_mut() {
        for index in 0..lanes.len() {
            let lane = &mut lanes[index];
            let Some(at) = lane.waiters.iter().position(|w| w.ticket == ticket) else {
                continue;
            };
            lane.waiters.remove(at);
            if lane.waiters.is_empty() {
                lanes.remove(index);
            }
            state.queued -= 1;
            return true;
        }
    }
    false
}

/// A request waiting in [`Admission::admit`]; dropped before its grant arrives (its
/// client went away), it leaves the queue.
struct Waiting {
    admission: Arc<Admission>,
    ticket: u64,
    done: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if !self.done {
            self.admission.abandon(self.ticket);
        }
    }
}

/// One of a model's `parallel` slots, held until the request's answer is sent (or
/// dropped).
pub struct Permit {
    admission: Arc<Admission>,
    serving_since: Option<Instant>,
}

impl Permit {
    fn new(admission: &Arc<Admission>) -> Self {
        Self {
            admission: Arc::clone(admission),
            serving_since: None,
        }
    }

    /// Its request is now served by a ready engine: the service time is measured from
    /// here.
    pub fn serving(&mut self) {
        self.serving_since = Some(Instant::now());
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.admission
            .release(self.serving_since.map(|since| since.elapsed()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    /// Enqueues a request of `name` and returns a task that resolves with its order.
    fn request(
        admission: &Arc<Admission>,
        name: &str,
        priority: Priority,
        order: &Arc<Mutex<Vec<String>>>,
    ) -> tokio::task::JoinHandle<()> {
        let (admission, order, name) = (Arc::clone(admission), Arc::clone(order), name.to_string());
        tokio::spawn(async move {
            // Served, then done at once: its slot goes to the next.
            let _permit = admission.admit(&key(&name), priority, None).await.unwrap();
            order.lock().unwrap().push(name);
        })
    }

    /// Lets every spawned task run until it waits.
    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn keys_take_turns_and_higher_priorities_go_first() {
        let admission = Admission::new(1, 100);
        let holder = admission
            .admit(&key("a"), Priority::Normal, None)
            .await
            .unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for _ in 0..4 {
            tasks.push(request(&admission, "a", Priority::Normal, &order));
            settle().await;
        }
        tasks.push(request(&admission, "b", Priority::Normal, &order));
        settle().await;
        tasks.push(request(&admission, "low", Priority::Low, &order));
        settle().await;
        tasks.push(request(&admission, "vip", Priority::High, &order));
        settle().await;
        let by_key = |counts: &[(&str, usize)]| -> Vec<(Arc<str>, usize)> {
            counts.iter().map(|(k, n)| (key(k), *n)).collect()
        };
        let (_, queued, waiting) = admission.depth();
        assert_eq!(queued, 7);
        assert_eq!(
            waiting,
            by_key(&[("a", 4), ("b", 1), ("low", 1), ("vip", 1)])
        );
        drop(holder);
        for task in tasks {
            task.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        assert_eq!(order, ["vip", "a", "b", "a", "a", "a", "low"]);
        // Every key that waited is still shown, at 0.
        let (running, _, waiting) = admission.depth();
        assert_eq!(running, 0);
        assert_eq!(
            waiting,
            by_key(&[("a", 0), ("b", 0), ("low", 0), ("vip", 0)])
        );
    }

    /// A request of `name` that is granted its slot and keeps it (the task ends with it).
    fn holding(admission: &Arc<Admission>, name: &str) -> tokio::task::JoinHandle<Permit> {
        let (admission, name) = (Arc::clone(admission), key(name));
        tokio::spawn(async move {
            admission
                .admit(&name, Priority::Normal, None)
                .await
                .unwrap()
        })
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_key_that_starts_waiting_goes_before_the_key_that_was_just_served() {
        let admission = Admission::new(1, 100);
        let holder = admission
            .admit(&key("a"), Priority::Normal, None)
            .await
            .unwrap();
        let mut floods = Vec::new();
        for _ in 0..3 {
            floods.push(holding(&admission, "a"));
            settle().await;
        }
        // `a`'s first waiting request is served; `b` starts waiting just after.
        drop(holder);
        settle().await;
        assert!(floods[0].is_finished());
        let single = holding(&admission, "b");
        settle().await;
        drop(floods.remove(0).await.unwrap());
        settle().await;
        // `a` just had its turn: `b` goes before `a`'s two others.
        assert!(single.is_finished(), "b waits behind a");
        assert!(floods.iter().all(|f| !f.is_finished()));
        drop(single.await.unwrap());
        for flood in floods {
            settle().await;
            drop(flood.await.unwrap());
        }
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_full_queue_refuses_at_once_with_the_work_ahead() {
        let admission = Admission::new(2, 1);
        let mut first = admission
            .admit(&key("a"), Priority::Normal, None)
            .await
            .unwrap();
        first.serving();
        tokio::time::advance(Duration::from_secs(3)).await;
        drop(first);
        assert_eq!(admission.service_time(), Some(Duration::from_secs(3)));
        let _one = admission
            .admit(&key("a"), Priority::Normal, None)
            .await
            .unwrap();
        let _two = admission
            .admit(&key("a"), Priority::Normal, None)
            .await
            .unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let _waiting = request(&admission, "a", Priority::Normal, &order);
        settle().await;
        let refused = admission
            .admit(&key("b"), Priority::Normal, None)
            .await
            .err()
            .expect("refused");
        assert_eq!(refused.reason(), "queue_full");
        // Two running and one waiting on two slots of 3 s: 3 s × 2 / 2 … before it.
        assert!(
            refused.retry_after() >= Duration::from_secs(3),
            "{refused:?}"
        );
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_deadline_shorter_than_the_wait_is_refused_and_a_longer_one_waits() {
        let admission = Admission::new(1, 10);
        let mut first = admission
            .admit(&key("a"), Priority::Normal, None)
            .await
            .unwrap();
        // No measurement yet: no deadline is judged.
        let (tx, rx) = oneshot::channel();
        {
            let admission = Arc::clone(&admission);
            tokio::spawn(async move {
                let result = admission
                    .admit(&key("b"), Priority::Normal, Some(Duration::from_millis(1)))
                    .await;
                let _ = tx.send(result.is_ok());
            });
        }
        settle().await;
        first.serving();
        tokio::time::advance(Duration::from_secs(10)).await;
        drop(first);
        assert!(
            rx.await.unwrap(),
            "admitted: nothing was measured when it came"
        );
        // Measured now (10 s a request) and the slot taken: 10 s ahead of a new one.
        let _holder = admission
            .admit(&key("a"), Priority::Normal, None)
            .await
            .unwrap();
        let refused = admission
            .admit(&key("c"), Priority::Normal, Some(Duration::from_secs(5)))
            .await
            .err()
            .expect("refused");
        match refused {
            Refusal::Deadline {
                expected, deadline, ..
            } => {
                assert!(expected > deadline, "{expected:?} {deadline:?}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_request_that_gives_up_leaves_its_place_and_its_slot() {
        let admission = Admission::new(1, 10);
        let holder = admission
            .admit(&key("a"), Priority::Normal, None)
            .await
            .unwrap();
        let gone = {
            let admission = Arc::clone(&admission);
            tokio::spawn(async move { admission.admit(&key("b"), Priority::Normal, None).await })
        };
        settle().await;
        assert_eq!(admission.depth().1, 1);
        gone.abort();
        settle().await;
        assert_eq!(admission.depth().1, 0);
        drop(holder);
        assert_eq!(admission.depth().0, 0);
        let _next = admission
            .admit(&key("c"), Priority::Normal, None)
            .await
            .unwrap();
        assert_eq!(admission.depth().0, 1);
    }
}
