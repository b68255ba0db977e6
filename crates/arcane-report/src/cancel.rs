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
        let waiter = std::thread::spawn(move || other.wait_timeout(Duration::from_secs(600)));
        std::thread::sleep(Duration::from_millis(20));
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
