//! A cancellation token shared by every blocking operation.
//!
//! Long work (waiting for a lock, downloading, hashing, starting an engine) checks a
//! [`CancelToken`] between steps and returns an `ARCANE_CANCELLED` error promptly when
//! it fires. Waiters use [`CancelToken::wait_timeout`] instead of `thread::sleep`, so a
//! cancellation wakes them at once rather than after their back-off delay.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A cheap, clonable flag that is set once and wakes everyone waiting on it.
#[derive(Debug, Clone, Default)]
pub struct CancelToken {
    inner: Arc<(Mutex<bool>, Condvar)>,
}

impl CancelToken {
    /// A token that has not fired.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires the token; every clone sees it and every waiter wakes. Idempotent.
    pub fn cancel(&self) {
        let (flag, condvar) = &*self.inner;
        if let Ok(mut fired) = flag.lock() {
            *fired = true;
        }
        condvar.notify_all();
    }

    /// Whether the token has fired.
    pub fn is_cancelled(&self) -> bool {
        self.inner.0.lock().map(|f| *f).unwrap_or(true)
    }

    /// Sleeps up to `timeout`, returning early (with `true`) if the token fires.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let (flag, condvar) = &*self.inner;
        let Ok(guard) = flag.lock() else { return true };
        match condvar.wait_timeout_while(guard, timeout, |fired| !*fired) {
            Ok((fired, _)) => *fired,
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn cancel_wakes_a_waiter_early() {
        let token = CancelToken::new();
        let other = token.clone();
        let started = Instant::now();
        let (sender, tid) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            // This thread's id, so the test can see it block (`/proc/thread-self`).
            let _ = sender.send(std::fs::read_link("/proc/thread-self").ok());
            other.wait_timeout(Duration::from_secs(600))
        });
        // Cancel only once the waiter sleeps in its wait: a token fired before the
        // wait begins would pass without proving a wake-up.
        let task = tid.recv().unwrap().expect("/proc/thread-self");
        let stat = std::path::Path::new("/proc").join(task).join("stat");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !std::fs::read_to_string(&stat).is_ok_and(|s| {
            s.rfind(')')
                .is_some_and(|i| s[i + 1..].split_whitespace().next() == Some("S"))
        }) {
            assert!(Instant::now() < deadline, "the waiter never blocked");
            std::thread::sleep(Duration::from_millis(1));
        }
        token.cancel();
        assert!(waiter.join().unwrap());
        assert!(token.is_cancelled());
        // Not a timing assertion: the wait was 600 s; returning at all proves the wake-up.
        assert!(started.elapsed() < Duration::from_secs(600));
    }

    #[test]
    fn an_unfired_token_times_out() {
        assert!(!CancelToken::new().wait_timeout(Duration::from_millis(5)));
    }
}
