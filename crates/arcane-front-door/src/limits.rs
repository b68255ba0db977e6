//! What one local process may hold of the HTTP transport: how long a request head may
//! take to arrive, how long a keep-alive connection may sit idle, and how many
//! connections may be open at once.
//!
//! A local process is not trusted to be polite: one that sends a header byte a second,
//! opens hundreds of idle connections, or leaves keep-alive connections open forever
//! must not exhaust the host. So:
//!
//! * **header read**: hyper's own timer closes a connection whose request head is not
//!   complete within [`ConnectionLimits::header_read`] of the connection opening;
//! * **idle**: a connection with no request in flight and no bytes moving for
//!   [`ConnectionLimits::idle`] is closed (a request in flight, even one waiting silently
//!   for a slow non-streamed completion, keeps it open; so does a streamed response);
//! * **cap**: past [`ConnectionLimits::max_connections`] open connections a new one is
//!   closed at once and a `core.http.connection-limit` event says so (once per burst);
//! * **before the token**: a connection that has not yet sent a request with the token
//!   is one of at most [`ConnectionLimits::max_unauthenticated`]; a new one past that
//!   closes the oldest of the peer address holding the most of them (so connections
//!   that never authenticate cannot keep out the clients that do — a client sends its
//!   request as soon as it connects — and one peer's flood evicts its own first), and
//!   such a connection may sit idle only [`ConnectionLimits::unauthenticated_idle`].

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The limits of the HTTP transport (see the module documentation).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// How long a request head may take, from the connection opening (default 10 s).
    pub header_read: Duration,
    /// How long a connection may sit idle between requests (default 120 s).
    pub idle: Duration,
    /// How many connections may be open at once (default 1024).
    pub max_connections: usize,
    /// How many connections may be open before presenting the token (default 64); a
    /// new one past it closes the oldest.
    pub max_unauthenticated: usize,
    /// How long a connection that has not presented the token may sit idle (default
    /// 5 s).
    pub unauthenticated_idle: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_read: Duration::from_secs(10),
            idle: Duration::from_secs(120),
            max_connections: 1024,
            max_unauthenticated: 64,
            unauthenticated_idle: Duration::from_secs(5),
        }
    }
}

/// What one connection is doing: when bytes last moved, and how many requests are in
/// flight on it.
#[derive(Debug)]
pub(crate) struct Activity {
    epoch: Instant,
    last_millis: AtomicU64,
    in_flight: AtomicUsize,
    /// A request on it presented the token.
    authenticated: std::sync::atomic::AtomicBool,
    /// It was closed to make room for a newer unauthenticated connection.
    evicted: std::sync::atomic::AtomicBool,
    /// Woken on either change.
    changed: tokio::sync::Notify,
    /// The application keys its requests presented (by name): a revoked one closes it.
    keys: std::sync::Mutex<Vec<Arc<str>>>,
}

impl Activity {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            epoch: Instant::now(),
            last_millis: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            authenticated: std::sync::atomic::AtomicBool::new(false),
            evicted: std::sync::atomic::AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
            keys: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// A request on this connection presented the application key `name`.
    pub(crate) fn presented_key(&self, name: &Arc<str>) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if !keys.contains(name) {
            keys.push(Arc::clone(name));
        }
    }

    /// Whether a request on this connection presented a key that is no longer in force.
    pub(crate) fn holds_revoked_key(&self, in_force: &std::collections::HashSet<Arc<str>>) -> bool {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.iter().any(|name| !in_force.contains(name))
    }

    /// A request on this connection presented the token.
    pub(crate) fn authenticate(&self) {
        if !self.authenticated.swap(true, Ordering::SeqCst) {
            self.changed.notify_waiters();
        }
    }

    /// Whether a request on this connection presented the token.
    pub(crate) fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::SeqCst)
    }

    /// Closes this connection if it has not authenticated (room for a newer one).
    fn evict(&self) {
        self.evicted.store(true, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Resolves when the connection authenticates or is evicted.
    pub(crate) async fn changed(&self) {
        let changed = self.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if self.is_authenticated() || self.is_evicted() {
            return;
        }
        changed.await;
    }

    /// Whether it was evicted before it authenticated.
    pub(crate) fn is_evicted(&self) -> bool {
        self.evicted.load(Ordering::SeqCst) && !self.is_authenticated()
    }

    fn touch(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        self.last_millis.store(now, Ordering::Relaxed);
    }

    /// Marks a request in flight until the guard (held by its response body) drops.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(self))
    }

    /// Resolves once the connection has been idle (nothing in flight, no bytes) for
    /// `idle`.
    pub(crate) async fn idle_for(&self, idle: Duration) {
        loop {
            let quiet = self.epoch.elapsed().saturating_sub(Duration::from_millis(
                self.last_millis.load(Ordering::Relaxed),
            ));
            if self.in_flight.load(Ordering::SeqCst) == 0 && quiet >= idle {
                return;
            }
            let wait = idle.saturating_sub(quiet).max(Duration::from_millis(50));
            tokio::time::sleep(wait.min(idle)).await;
        }
    }
}

/// The connections that have not presented the token yet, oldest first, with their
/// peer address: a new one past the limit evicts the oldest connection of the peer
/// that holds the most (see the module documentation), so one peer flooding the host
/// with connections evicts its own before anyone else's.
#[derive(Debug, Default)]
pub(crate) struct Unauthenticated {
    waiting: std::sync::Mutex<Waiting>,
}

type Waiting = std::collections::VecDeque<(std::net::IpAddr, std::sync::Weak<Activity>)>;

impl Unauthenticated {
    /// Counts `activity` (from `peer`) in, evicting past `max` as described above.
    pub(crate) fn admit(&self, activity: &Arc<Activity>, peer: std::net::IpAddr, max: usize) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        waiting.retain(|(_, w)| {
            w.upgrade()
                .is_some_and(|a| !a.is_authenticated() && !a.is_evicted())
        });
        while waiting.len() >= max.max(1) {
            let mut counts: std::collections::HashMap<std::net::IpAddr, usize> =
                std::collections::HashMap::new();
            for (ip, _) in waiting.iter() {
                *counts.entry(*ip).or_default() += 1;
            }
            let greediest = counts
                .into_iter()
                .max_by_key(|(_, count)| *count)
                .map(|(ip, _)| ip);
            let index = waiting
                .iter()
                .position(|(ip, _)| Some(*ip) == greediest)
                .unwrap_or(0);
            if let Some((_, oldest)) = waiting.remove(index) {
                if let Some(oldest) = oldest.upgrade() {
                    oldest.evict();
                }
            }
        }
        waiting.push_back((peer, Arc::downgrade(activity)));
    }
}

/// A request in flight on a connection (see [`Activity::begin`]).
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A stream that records when bytes move through it.
pub(crate) struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Tracked<S> {
    pub(crate) fn new(inner: S, activity: Arc<Activity>) -> Self {
        Self { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A response body that keeps its request counted as in flight until it is sent or
/// dropped.
pub(crate) struct Guarded<B> {
    inner: B,
    _in_flight: InFlight,
}

impl<B> Guarded<B> {
    pub(crate) fn new(inner: B, in_flight: InFlight) -> Self {
        Self {
            inner,
            _in_flight: in_flight,
        }
    }
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for Guarded<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peer holding the most unauthenticated connections loses its oldest first:
    /// a flood from one address does not evict another address's connection.
    #[test]
    fn the_greediest_peer_is_evicted_first() {
        let limits = Unauthenticated::default();
        let (quiet, flood): (std::net::IpAddr, std::net::IpAddr) =
            ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
        let client = Activity::new();
        limits.admit(&client, quiet, 4);
        let squatters: Vec<Arc<Activity>> = (0..20)
            .map(|_| {
                let squatter = Activity::new();
                limits.admit(&squatter, flood, 4);
                squatter
            })
            .collect();
        assert!(!client.is_evicted());
        assert_eq!(squatters.iter().filter(|s| !s.is_evicted()).count(), 3);
        // The newest are the ones kept.
        assert!(squatters[17..].iter().all(|s| !s.is_evicted()));
    }
}
