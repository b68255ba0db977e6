//! The dashboard's login codes and sessions: in memory, per listener, on an injectable
//! clock.
//!
//! # Why a code, and why it travels in the fragment
//!
//! The bearer token must never appear in a URL: URLs end up in the browser's history,
//! in a `Referer`, in server and proxy logs, in a screenshot of the address bar. So
//! `arcane open` (which holds the token) asks the running host for a **login code**
//! (`ui.code.issue`, with the token) and opens `http://arcane-<hex>.localhost:PORT/ui#code=…`
//! (see [`super::dashboard_authority`] for the host name). The
//! code sits in the **fragment**, which a browser never sends to a server (not in the
//! request line, not in a `Referer`); the page's script reads it, removes it from the
//! address bar and the history entry (`history.replaceState`), and trades it for a
//! session with `POST /ui/session`. Should the link leak anyway (a history database, a
//! shell's scroll-back), it is worthless: a code is good **once**, for
//! [`CODE_LIFETIME`], and 256 random bits cannot be guessed.
//!
//! # Sessions
//!
//! A session is 256 random bits in an `HttpOnly; SameSite=Strict` cookie scoped to
//! `Path=/ui` and named after the listener's port (cookies do not separate ports, so
//! two hosts on one machine must not overwrite each other's). It lives only in this
//! process's memory: a host restart ends every session. It remembers the bearer token in
//! force when it began and is valid only while that token still is: `arcane token
//! rotate` ends every session at once, on the next request, without a timer. Logout
//! (`POST /ui/logout`) ends one session; every session ends [`SESSION_LIFETIME`] after
//! it began. At most [`MAX_CODES`] codes and [`MAX_SESSIONS`] sessions are kept: a new
//! one pushes out the oldest, so no client can grow the host's memory.
//!
//! Time comes from a [`Clock`] so tests can expire a code without sleeping.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arcane_core::endpoint::constant_time_eq;

/// How long a login code may be redeemed after it was issued.
pub const CODE_LIFETIME: Duration = Duration::from_secs(60);

/// How long a session lasts after its login, whatever its activity.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);

/// The most login codes waiting to be redeemed (the oldest is dropped).
pub const MAX_CODES: usize = 32;

/// The most sessions at once (the oldest is ended).
pub const MAX_SESSIONS: usize = 32;

/// The dashboard's clock: `Instant::now` in the host, a controllable one in tests.
pub type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// The real clock.
pub fn system_clock() -> Clock {
    Arc::new(Instant::now)
}

/// Why a login or a session was refused. Each variant has a stable code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UiError {
    /// The code is not one this host issued, or it was redeemed already.
    #[error("the login code is unknown or was used already")]
    CodeInvalid,
    /// The code was issued more than [`CODE_LIFETIME`] ago.
    #[error("the login code has expired (a code is good for {} seconds)", CODE_LIFETIME.as_secs())]
    CodeExpired,
    /// No valid session: none presented, ended by logout, rotation or age.
    #[error("the dashboard needs a session: run `arcane open` to log in")]
    SessionRequired,
    /// The call did not come from the Core's own origin.
    #[error("dashboard calls are accepted only from the dashboard's own origin")]
    OriginRefused,
    /// A login or a session call on another host name than the dashboard's own.
    #[error("dashboard sessions live only at the address of the link `arcane open` gives")]
    HostRefused,
    /// The body of `POST /ui/session` is not `{"code": "…"}`.
    #[error("the login body must be a JSON object with a string `code`")]
    BadLogin,
    /// The dashboard asked for a method it may not call.
    #[error("the dashboard may not call `{method}`")]
    MethodRefused {
        /// The method asked for.
        method: String,
    },
    /// No path of the dashboard's API is `path`.
    #[error("no dashboard endpoint `{path}`")]
    NoEndpoint {
        /// The path asked for.
        path: String,
    },
    /// The kernel gave no random bytes.
    #[error("could not read random bytes for a dashboard secret")]
    Random,
}

impl arcane_report::Diagnostic for UiError {
    fn code(&self) -> &'static str {
        use arcane_report::codes;
        match self {
            Self::CodeInvalid => codes::UI_CODE_INVALID,
            Self::CodeExpired => codes::UI_CODE_EXPIRED,
            Self::SessionRequired => codes::UI_SESSION_REQUIRED,
            Self::OriginRefused | Self::HostRefused => codes::UI_ORIGIN_REFUSED,
            Self::BadLogin => codes::ARCANE_USAGE,
            Self::MethodRefused { .. } => codes::METHOD_NOT_ALLOWED,
            Self::NoEndpoint { .. } => codes::ARCANE_NOT_FOUND,
            Self::Random => codes::ARCANE_IO,
        }
    }

    fn details(&self) -> serde_json::Value {
        match self {
            Self::MethodRefused { method } => serde_json::json!({ "method": method }),
            Self::NoEndpoint { path } => serde_json::json!({ "path": path }),
            _ => serde_json::json!({}),
        }
    }

    fn hints(&self) -> Vec<String> {
        match self {
            Self::CodeInvalid | Self::CodeExpired | Self::SessionRequired | Self::HostRefused => {
                vec!["run `arcane open` for a new one-time link".into()]
            }
            _ => Vec::new(),
        }
    }
}

/// A code waiting to be redeemed.
struct Code {
    issued: Instant,
    /// The order of issue: the oldest is pushed out first.
    order: u64,
}

/// A live session.
struct Live {
    began: Instant,
    /// The order of login: the oldest is ended first.
    order: u64,
    /// The bearer token in force at login: the session ends when it changes.
    token: String,
    /// The session's own space of client names ([`super::scoped_client`]).
    scope: String,
}

#[derive(Default)]
struct State {
    codes: HashMap<String, Code>,
    sessions: HashMap<String, Live>,
    /// The next code's or session's order.
    next: u64,
}

/// The codes and sessions of one listener (see the module documentation).
pub struct Sessions {
    clock: Clock,
    state: Mutex<State>,
}

impl Sessions {
    /// No codes and no sessions, on `clock`.
    pub fn new(clock: Clock) -> Self {
        Self {
            clock,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh single-use login code, good for [`CODE_LIFETIME`].
    pub fn issue_code(&self) -> Result<String, UiError> {
        let code = secret()?;
        let now = (self.clock)();
        let mut state = self.lock();
        state
            .codes
            .retain(|_, c| now.saturating_duration_since(c.issued) < CODE_LIFETIME);
        if state.codes.len() >= MAX_CODES {
            let oldest = state
                .codes
                .iter()
                .min_by_key(|(_, c)| c.order)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                state.codes.remove(&oldest);
            }
        }
        state.next += 1;
        let order = state.next;
        state
            .codes
            .insert(code.clone(), Code { issued: now, order });
        Ok(code)
    }

    /// Redeems `code` (once) for a new session bound to `token`, the bearer token in
    /// force now; returns the session's secret.
    pub fn redeem(&self, code: &str, token: &str) -> Result<String, UiError> {
        let now = (self.clock)();
        let mut state = self.lock();
        // Removed whatever happens next: a code is never good twice.
        let issued = state.codes.remove(code).ok_or(UiError::CodeInvalid)?;
        if now.saturating_duration_since(issued.issued) >= CODE_LIFETIME {
            return Err(UiError::CodeExpired);
        }
        drop(state);
        let session = secret()?;
        let scope = arcane_files::secret_hex(8).map_err(|_| UiError::Random)?;
        let mut state = self.lock();
        state
            .sessions
            .retain(|_, s| now.saturating_duration_since(s.began) < SESSION_LIFETIME);
        if state.sessions.len() >= MAX_SESSIONS {
            let oldest = state
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.order)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                state.sessions.remove(&oldest);
            }
        }
        state.next += 1;
        let order = state.next;
        state.sessions.insert(
            session.clone(),
            Live {
                began: now,
                order,
                token: token.to_string(),
                scope,
            },
        );
        Ok(session)
    }

    /// Whether `session` is live under `token` (the bearer token in force now): its
    /// scope of client names when it is; a session that aged out or began under another
    /// token is ended here.
    pub fn check(&self, session: &str, token: &str) -> Result<String, UiError> {
        let now = (self.clock)();
        let mut state = self.lock();
        let live = state
            .sessions
            .get(session)
            .ok_or(UiError::SessionRequired)?;
        let valid = now.saturating_duration_since(live.began) < SESSION_LIFETIME
            && constant_time_eq(live.token.as_bytes(), token.as_bytes());
        if valid {
            Ok(live.scope.clone())
        } else {
            state.sessions.remove(session);
            Err(UiError::SessionRequired)
        }
    }

    /// Ends `session` (logout); `true` when it was live.
    pub fn end(&self, session: &str) -> bool {
        self.lock().sessions.remove(session).is_some()
    }

    /// How many sessions are kept now (for tests and diagnostics).
    pub fn count(&self) -> usize {
        self.lock().sessions.len()
    }
}

/// 256 random bits from the kernel, hex-encoded.
fn secret() -> Result<String, UiError> {
    arcane_files::secret_hex(32).map_err(|_| UiError::Random)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A clock that moves only when told.
    fn manual() -> (Clock, Arc<AtomicU64>) {
        let start = Instant::now();
        let offset = Arc::new(AtomicU64::new(0));
        let read = Arc::clone(&offset);
        let clock: Clock =
            Arc::new(move || start + Duration::from_millis(read.load(Ordering::SeqCst)));
        (clock, offset)
    }

    #[test]
    fn a_code_is_good_once_and_only_before_it_expires() {
        let (clock, offset) = manual();
        let sessions = Sessions::new(clock);
        let code = sessions.issue_code().unwrap();
        assert_eq!(code.len(), 64);
        let session = sessions.redeem(&code, "t").unwrap();
        assert!(sessions.check(&session, "t").is_ok());
        let other = sessions
            .redeem(&sessions.issue_code().unwrap(), "t")
            .unwrap();
        assert_ne!(sessions.check(&session, "t"), sessions.check(&other, "t"));
        assert_eq!(sessions.redeem(&code, "t"), Err(UiError::CodeInvalid));

        let late = sessions.issue_code().unwrap();
        offset.store(CODE_LIFETIME.as_millis() as u64, Ordering::SeqCst);
        assert_eq!(sessions.redeem(&late, "t"), Err(UiError::CodeExpired));
        // Refused once expired, and gone after.
        assert_eq!(sessions.redeem(&late, "t"), Err(UiError::CodeInvalid));
    }

    #[test]
    fn a_session_ends_with_its_token_its_age_or_a_logout() {
        let (clock, offset) = manual();
        let sessions = Sessions::new(clock);
        let a = sessions
            .redeem(&sessions.issue_code().unwrap(), "t1")
            .unwrap();
        assert_eq!(sessions.check(&a, "t2"), Err(UiError::SessionRequired));
        assert_eq!(sessions.check(&a, "t1"), Err(UiError::SessionRequired));

        let b = sessions
            .redeem(&sessions.issue_code().unwrap(), "t1")
            .unwrap();
        assert!(sessions.end(&b));
        assert_eq!(sessions.check(&b, "t1"), Err(UiError::SessionRequired));

        let c = sessions
            .redeem(&sessions.issue_code().unwrap(), "t1")
            .unwrap();
        offset.store(SESSION_LIFETIME.as_millis() as u64, Ordering::SeqCst);
        assert_eq!(sessions.check(&c, "t1"), Err(UiError::SessionRequired));
    }

    #[test]
    fn codes_and_sessions_are_bounded() {
        let (clock, _) = manual();
        let sessions = Sessions::new(clock);
        let first = sessions.issue_code().unwrap();
        for _ in 0..MAX_CODES {
            sessions.issue_code().unwrap();
        }
        assert_eq!(sessions.redeem(&first, "t"), Err(UiError::CodeInvalid));
        for _ in 0..MAX_SESSIONS + 5 {
            let code = sessions.issue_code().unwrap();
            sessions.redeem(&code, "t").unwrap();
        }
        assert_eq!(sessions.count(), MAX_SESSIONS);
    }
}
