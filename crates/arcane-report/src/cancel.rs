//! A cancellation token shared by every blocking operation.
//!
//! Long work (waiting for a lock, downloading, hashing, starting an engine) checks a
//! [`CancelToken`] between steps and returns an `ARCANE_CANCELLED` error promptly when
//! it fires. Waiters use [`CancelToken::wait_timeout`] instead of `thread::sleep`, so a
//! cancellation wakes them at once rather than after their back-off delay; async code
//! awaits [`CancelToken::cancelled`], which `cancel` wakes the same way (no timer, and
//! no async runtime needed by this crate).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// A cheap, clonable flag that is set once and wakes everyone waiting on it.
#[derive(Debug, Clone, Default)]
pub struct CancelToken {
    inner: Arc<(Mutex<State>, Condvar)>,
}

/// The flag, and the async waiters to wake when it is set.
#[derive(Debug, Default)]
struct State {
    fired: bool,
    /// The next waiter's key (keys identify a waiter's entry for its drop).
    next_key: u64,
    wakers: Vec<(u64, Waker)>,
}

impl CancelToken {
    /// A token that has not fired.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires the token; every clone sees it and every waiter wakes. Idempotent.
    pub fn cancel(&self) {
        let (state, condvar) = &*self.inner;
        let wakers = match state.lock() {
            Ok(mut state) => {
                state.fired = true;
                std::mem::take(&mut state.wakers)
            }
            Err(_) => Vec::new(),
        };
        condvar.notify_all();
        for (_, waker) in wakers {
            waker.wake();
        }
    }

    /// Whether the token has fired.
    pub fn is_cancelled(&self) -> bool {
        self.inner.0.lock().map(|s| s.fired).unwrap_or(true)
    }

    /// Sleeps up to `timeout`, returning early (with `true`) if the token fires.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let (state, condvar) = &*self.inner;
        let Ok(guard) = state.lock() else { return true };
        match condvar.wait_timeout_while(guard, timeout, |s| !s.fired) {
            Ok((state, _)) => state.fired,
            Err(_) => true,
        }
    }

    /// Resolves once the token fires, woken by [`CancelToken::cancel`] itself.
    pub fn cancelled(&self) -> Cancelled {
        Cancelled {
            token: self.clone(),
            key: None,
        }
    }
}

/// The future of [`CancelToken::cancelled`]. Dropping it unresolved forgets its
/// waker, so a long-lived token does not collect the wakers of abandoned waits.
#[derive(Debug)]
#[must_use = "a future does nothing unless awaited"]
pub struct Cancelled {
    token: CancelToken,
    /// This waiter's entry among the token's wakers, once registered.
    key: Option<u64>,
}

impl Future for Cancelled {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let Ok(mut state) = this.token.inner.0.lock() else {
            return Poll::Ready(());
        };
        if state.fired {
            return Poll::Ready(());
        }
        let waker = cx.waker().clone();
        match this.key {
            Some(key) => {
                if let Some(entry) = state.wakers.iter_mut().find(|(k, _)| *k == key) {
                    entry.1 = waker;
                }
            }
            None => {
                let key = state.next_key;
                state.next_key += 1;
                state.wakers.push((key, waker));
                this.key = Some(key);
            }
        }
        Poll::Pending
    }
}

impl Drop for Cancelled {
    fn drop(&mut self) {
        if let (Some(key), Ok(mut state)) = (self.key, self.token.inner.0.lock()) {
            state.wakers.retain(|(k, _)| *k != key);
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

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn cancel_wakes_an_async_waiter_that_then_resolves() {
        let token = CancelToken::new();
        let count = Arc::new(Count::default());
        let waker = Waker::from(Arc::clone(&count));
        let mut cx = Context::from_waker(&waker);
        let mut waiting = token.cancelled();
        assert!(Pin::new(&mut waiting).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut waiting).poll(&mut cx).is_pending());
        assert_eq!(count.0.load(std::sync::atomic::Ordering::SeqCst), 0);
        token.clone().cancel();
        // Woken once by `cancel` (a re-poll replaced its waker rather than adding one).
        assert_eq!(count.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(Pin::new(&mut waiting).poll(&mut cx).is_ready());
        // A wait begun after the token fired resolves at once.
        assert!(Pin::new(&mut token.cancelled()).poll(&mut cx).is_ready());
    }

    #[test]
    fn an_abandoned_async_wait_leaves_no_waker_behind() {
        let token = CancelToken::new();
        let waker = Waker::from(Arc::new(Count::default()));
        let mut cx = Context::from_waker(&waker);
        for _ in 0..3 {
            let mut waiting = token.cancelled();
            assert!(Pin::new(&mut waiting).poll(&mut cx).is_pending());
        }
        let mut kept = token.cancelled();
        assert!(Pin::new(&mut kept).poll(&mut cx).is_pending());
        assert_eq!(token.inner.0.lock().unwrap().wakers.len(), 1);
        drop(kept);
        assert!(token.inner.0.lock().unwrap().wakers.is_empty());
    }

    #[test]
    fn an_unfired_token_times_out() {
        assert!(!CancelToken::new().wait_timeout(Duration::from_millis(5)));
    }
}
