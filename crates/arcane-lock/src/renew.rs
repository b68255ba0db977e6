//! The lock's one background thread per process: it renews the record of every root
//! lease this process holds, and closes cached workspace handles nobody used for a
//! while (the `warm` module).
//!
//! A record's `expiresAt` lies [`record::HORIZON`] after its last write (the `record`
//! module says why); this thread rewrites the times every [`EVERY`], so a live holder's
//! record never expires and a dead one's expires within the horizon. The work is off
//! the acquisition path: an acquisition only adds its record to a list (and wakes the
//! thread if it was idle), and a lease that ends within [`EVERY`] is never renewed.
//!
//! The thread starts with the first lease and sleeps when there is nothing to do. If
//! it cannot be started, records are not renewed: they expire while their holders live,
//! which an SDK 0.1.1 still does not act on (it also requires the owner pid to be gone).

use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::published::Published;
use crate::record;

/// How often a held record is renewed: a third of the horizon, so two renewals can be
/// late before a live holder's record expires.
pub(crate) const EVERY: Duration = Duration::from_secs(record::HORIZON.as_secs() / 3);

struct Renewer {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    leases: Vec<Weak<Published>>,
    /// When the thread will wake on its own (`None`: only when woken).
    wake_at: Option<Instant>,
    /// Work was added since the thread last looked (read only by a thread about to
    /// sleep with nothing scheduled).
    changed: bool,
}

fn renewer() -> Option<&'static Renewer> {
    static RENEWER: OnceLock<Option<&'static Renewer>> = OnceLock::new();
    *RENEWER.get_or_init(|| {
        let renewer: &'static Renewer = Box::leak(Box::new(Renewer {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("arcane-lock-renew".into())
            .spawn(move || renewer.run())
            .ok()
            .map(|_| renewer)
    })
}

impl Renewer {
    fn state(&self) -> MutexGuard<'_, State> {
        // Plain assignments only: a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn run(&self) {
        loop {
            let now = Instant::now();
            let (due, next) = self.due(now);
            for published in due {
                published.renew();
            }
            // With anything to watch, look again within `EVERY` at the latest: then a
            // lease added meanwhile is never due before the next look, and adding one
            // need not wake this thread (only an idle thread is woken).
            let next = match (next, crate::warm::expire_idle(Instant::now())) {
                (None, None) => None,
                (a, b) => {
                    let soonest = Instant::now() + EVERY;
                    Some(a.into_iter().chain(b).fold(soonest, Instant::min))
                }
            };
            let mut state = self.state();
            // Work added since `due` looked (it cleared the flag) matters only to a
            // thread about to sleep with nothing scheduled.
            if next.is_none() && state.changed {
                continue;
            }
            state.wake_at = next;
            let state = match next {
                Some(at) => {
                    let wait = at.saturating_duration_since(Instant::now());
                    self.wake
                        .wait_timeout(state, wait)
                        .map(|(state, _)| state)
                        .unwrap_or_else(|p| p.into_inner().0)
                }
                None => self.wake.wait(state).unwrap_or_else(|p| p.into_inner()),
            };
            drop(state);
        }
    }

    /// The records due for renewal now, and when the next one is due; forgets the
    /// released.
    fn due(&self, now: Instant) -> (Vec<Arc<Published>>, Option<Instant>) {
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        let mut earliest = |at: Instant| next = Some(next.map_or(at, |n| n.min(at)));
        let mut state = self.state();
        state.changed = false;
        state.leases.retain(|weak| {
            let Some(published) = weak.upgrade() else {
                return false;
            };
            let Some(at) = published.due(EVERY) else {
                return false;
            };
            if at <= now {
                due.push(published);
                earliest(now + EVERY);
            } else {
                earliest(at);
            }
            true
        });
        (due, next)
    }

    /// Makes sure the thread looks again by `at` (waking it only when it would sleep
    /// past that, which with work to watch it never does: the acquisition path pays for
    /// a wake-up only when the thread was idle).
    fn schedule(&self, state: &mut State, at: Instant) {
        state.changed = true;
        if state.wake_at.is_none_or(|wake| wake > at) {
            self.wake.notify_one();
        }
    }
}

/// Renews `published` every [`EVERY`] until it is removed or dropped.
pub(crate) fn watch(published: &Arc<Published>) {
    if let Some(renewer) = renewer() {
        let mut state = renewer.state();
        // Leases released since the thread last looked go now: the list stays short.
        state
            .leases
            .retain(|weak| weak.upgrade().is_some_and(|p| p.due(EVERY).is_some()));
        state.leases.push(Arc::downgrade(published));
        renewer.schedule(&mut state, Instant::now() + EVERY);
    }
}

/// Makes sure the thread looks again by `at` (a cached handle may be closed then).
pub(crate) fn look_by(at: Instant) {
    if let Some(renewer) = renewer() {
        let mut state = renewer.state();
        renewer.schedule(&mut state, at);
    }
}
