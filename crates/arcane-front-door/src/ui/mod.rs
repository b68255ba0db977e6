//! The dashboard: one page served by the Core at `GET /ui`, and the session that lets
//! a browser use it without ever holding the bearer token.
//!
//! # Why a session at all
//!
//! A browser cannot be given the token safely: in a URL it lands in history and logs;
//! in the page's storage any script of the origin can read it forever, and it would
//! open the whole `/v1/*` API. Instead `arcane open` trades the token for a one-time
//! code, and the page trades the code for a cookie session that only the dashboard's
//! own paths accept (see [`session`] for the code, the fragment and the session's
//! life).
//!
//! # Paths and their admission
//!
//! Every `/ui` path passes the front door's `Host` check (421) and `Origin` check (403)
//! like any other, and is then admitted by **these** rules instead of the bearer token
//! (which they ignore):
//!
//! | method and path | admission | answer |
//! |---|---|---|
//! | `GET /ui` | none | with a live session the dashboard, without one the login page (no model, path or state) |
//! | `GET /ui/app.js`, `GET /ui/app.css` | none | the embedded script and style sheet |
//! | `POST /ui/session` | own origin | `{"code"}` → 204 and the session cookie; an unknown, used or expired code is 401 |
//! | `POST /ui/logout` | session, own origin | 204; the session ends and the cookie is cleared |
//! | `POST /ui/api/rpc` | session, own origin | `POST /v1/rpc`, for the methods in [`RPC_METHODS`] only |
//! | `GET /ui/api/events` | session, own origin | `GET /v1/events` (SSE) |
//! | `GET /ui/api/logs` | session, own origin | `GET /v1/logs` (NDJSON), whatever the host answers there (404 when it serves none) |
//! | `GET /ui/api/metrics` | session, own origin | `GET /metrics` (the gateway's Prometheus text) |
//! | `POST /ui/api/chat/completions` | session, own origin | `POST /v1/chat/completions` |
//!
//! The session cookie is accepted on these paths only: `/v1/*` and the engines' paths
//! keep requiring the bearer token, cookie or not, and the cookie's `Path=/ui` keeps
//! browsers from even sending it there. A dashboard call is forwarded with its cookie
//! removed, so an engine never sees it.
//!
//! **Own host name** ([`dashboard_authority`]): the dashboard lives at a random
//! `arcane-<hex>.localhost` name drawn per listener; the session cookie is believed
//! only on requests to that name, and a login on another name is refused. Cookies
//! ignore ports but not host names, so a server on another port of `127.0.0.1` or
//! `localhost` never receives the cookie, and only the login link names the label. A
//! session acts only as itself: a client name it gives is put in its own space
//! ([`scoped_client`]).
//!
//! **Own origin** ([`same_origin`]) means: the `Origin` header, when sent, is the
//! listener's own origin (not one of the user's `allowed_origins`: those pages get the
//! API with the token, never the dashboard's session), and `Sec-Fetch-Site`, when sent,
//! is `same-origin`; at least one of the two must be sent. `SameSite=Strict` alone does
//! not suffice, as browsers treat every port of `127.0.0.1` as one *site*: a page on
//! another local port would otherwise ride the session. Browsers send `Origin` on every
//! `POST` and on cross-origin `GET`s, and `Sec-Fetch-Site` on every request to a
//! loopback origin, so the dashboard's own `fetch` and `EventSource` calls pass, and a
//! page of another origin (or an `<img>`/`<script>` pointing here) does not.
//!
//! Every `/ui` answer carries a strict Content-Security-Policy (`default-src 'self'`,
//! no inline script or style, `frame-ancestors 'none'`), `X-Frame-Options: DENY`,
//! `Referrer-Policy: no-referrer`, `Cache-Control: no-store`,
//! `X-Content-Type-Options: nosniff` and `Cross-Origin-Resource-Policy: same-origin`.

use hyper::header::{HeaderMap, HeaderName, HeaderValue};

use crate::router::{Handler, PathPattern, Row, Scope, Verb};

pub mod assets;
pub mod session;

pub use session::{system_clock, Clock, Sessions, UiError, CODE_LIFETIME, SESSION_LIFETIME};

/// The dashboard's rows of the route table (see the module documentation).
pub const UI_ROWS: &[Row] = &[
    ui_row(Verb::Get, PathPattern::Exact("/ui"), Handler::UiPage),
    ui_row(
        Verb::Get,
        PathPattern::Exact("/ui/app.js"),
        Handler::UiAsset,
    ),
    ui_row(
        Verb::Get,
        PathPattern::Exact("/ui/app.css"),
        Handler::UiAsset,
    ),
    ui_row(
        Verb::Get,
        PathPattern::Exact("/ui/icon.svg"),
        Handler::UiAsset,
    ),
    ui_row(
        Verb::Get,
        PathPattern::Exact("/favicon.ico"),
        Handler::UiAsset,
    ),
    ui_row(
        Verb::Post,
        PathPattern::Exact("/ui/session"),
        Handler::UiLogin,
    ),
    ui_row(
        Verb::Post,
        PathPattern::Exact("/ui/logout"),
        Handler::UiLogout,
    ),
    ui_row(Verb::Any, PathPattern::Prefix("/ui/api/"), Handler::UiApi),
    ui_row(Verb::Any, PathPattern::Prefix("/ui/app"), Handler::UiWeb),
];

const fn ui_row(verb: Verb, path: PathPattern, handler: Handler) -> Row {
    Row {
        verb,
        path,
        scope: Scope::Always,
        handler,
    }
}

/// One path of the dashboard's API and the front door's path it stands for.
struct ApiRoute {
    path: &'static str,
    method: hyper::Method,
    target: &'static str,
}

/// The dashboard's API: each path is the same handler as its target.
const API: &[ApiRoute] = &[
    ApiRoute {
        path: "/ui/api/rpc",
        method: hyper::Method::POST,
        target: "/v1/rpc",
    },
    ApiRoute {
        path: "/ui/api/events",
        method: hyper::Method::GET,
        target: "/v1/events",
    },
    ApiRoute {
        path: "/ui/api/logs",
        method: hyper::Method::GET,
        target: "/v1/logs",
    },
    ApiRoute {
        path: "/ui/api/metrics",
        method: hyper::Method::GET,
        target: "/metrics",
    },
    ApiRoute {
        path: "/ui/api/chat/completions",
        method: hyper::Method::POST,
        target: "/v1/chat/completions",
    },
];

/// The front door's path a dashboard call stands for (`/ui/api/rpc` → `/v1/rpc`), or
/// why there is none.
pub fn api_target(method: &hyper::Method, path: &str) -> Result<&'static str, UiError> {
    API.iter()
        .find(|route| route.path == path && route.method == method)
        .map(|route| route.target)
        .ok_or_else(|| UiError::NoEndpoint {
            path: path.to_string(),
        })
}

/// The `arcane/1` methods the dashboard may call: reading state and loading or
/// unloading models, nothing that shuts the host down or issues login codes.
pub const RPC_METHODS: &[&str] = &[
    "system.ping",
    "version.current",
    "app.current",
    "models.list",
    "models.load",
    "models.unload",
    "localai.status",
    "localai.devices",
];

/// The method, answered by the HTTP transport itself with the bearer token, that
/// issues a login code: `{code, url, expiresIn}`.
pub const ISSUE_METHOD: &str = "ui.code.issue";

/// A fresh name for the dashboard's host, `arcane-<32 hex digits>`, drawn once per
/// listener (see [`dashboard_authority`]).
pub fn dashboard_label() -> std::io::Result<String> {
    arcane_files::secret_hex(16).map(|hex| format!("arcane-{hex}"))
}

/// Where the dashboard lives: `<label>.localhost:<port>`. Browsers resolve every
/// `*.localhost` name to the loopback address themselves, and keep a cookie to the host
/// name that set it: a session cookie set here goes to no other host name, so a page
/// or server on another port of `127.0.0.1` or `localhost` never receives it (cookies
/// ignore ports, host names they do not). Only the link `arcane open` gives names the
/// label, so no other local program can make the browser send the cookie to its port.
pub fn dashboard_authority(label: &str, port: u16) -> String {
    format!("{label}.localhost:{port}")
}

/// The client name a dashboard session acts under when it names `name`
/// (`X-Arcane-Client`, `?client=`): inside the session's own space, so a session can
/// neither read another client's stream (a bridge's) nor answer in its name.
pub fn scoped_client(scope: &str, name: &str) -> String {
    format!("ui-{scope}-{name}")
}

/// The session cookie's name for the listener on `port` (cookies do not separate
/// ports, so each host's dashboard has its own).
pub fn cookie_name(port: u16) -> String {
    format!("arcane_ui_{port}")
}

/// The `Set-Cookie` value that starts `session`.
pub fn set_cookie(port: u16, session: &str) -> String {
    format!(
        "{}={session}; HttpOnly; SameSite=Strict; Path=/ui",
        cookie_name(port)
    )
}

/// The `Set-Cookie` value that clears the session cookie.
pub fn clear_cookie(port: u16) -> String {
    format!(
        "{}=; HttpOnly; SameSite=Strict; Path=/ui; Max-Age=0",
        cookie_name(port)
    )
}

/// The session secret the request's cookies carry for the listener on `port`.
pub fn session_cookie(headers: &HeaderMap, port: u16) -> Option<String> {
    let name = cookie_name(port);
    headers
        .get_all(hyper::header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.trim().to_string())
        .filter(|value| !value.is_empty())
}

/// Whether a request comes from the listener's own origin (`own`: its origins), by
/// `Origin` and `Sec-Fetch-Site` (see the module documentation).
pub fn same_origin(headers: &HeaderMap, own: &[String]) -> Result<(), UiError> {
    let origin = headers.get(hyper::header::ORIGIN).map(|v| v.to_str());
    let site = headers.get("sec-fetch-site").map(|v| v.to_str());
    let origin_ok = match origin {
        Some(Ok(origin)) => own.iter().any(|o| o.eq_ignore_ascii_case(origin)),
        Some(Err(_)) => false,
        None => true,
    };
    let site_ok = match site {
        Some(Ok(site)) => site.eq_ignore_ascii_case("same-origin"),
        Some(Err(_)) => false,
        None => true,
    };
    if origin_ok && site_ok && (origin.is_some() || site.is_some()) {
        Ok(())
    } else {
        Err(UiError::OriginRefused)
    }
}

/// The code of a `POST /ui/session` body, `{"code": "…"}`.
pub fn login_code(body: &[u8]) -> Result<String, UiError> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|_| UiError::BadLogin)?;
    value["code"]
        .as_str()
        .filter(|code| !code.is_empty() && code.len() <= 256)
        .map(str::to_string)
        .ok_or(UiError::BadLogin)
}

/// The Content-Security-Policy of every `/ui` answer.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Adds the headers every `/ui` answer carries (see the module documentation).
pub fn secure(headers: &mut HeaderMap) {
    let fixed: [(HeaderName, &'static str); 6] = [
        (
            hyper::header::CONTENT_SECURITY_POLICY,
            CONTENT_SECURITY_POLICY,
        ),
        (hyper::header::X_FRAME_OPTIONS, "DENY"),
        (hyper::header::REFERRER_POLICY, "no-referrer"),
        (hyper::header::CACHE_CONTROL, "no-store"),
        (hyper::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (
            HeaderName::from_static("cross-origin-resource-policy"),
            "same-origin",
        ),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn only_the_own_origin_passes() {
        let own = vec!["http://127.0.0.1:4000".to_string()];
        let ok = [
            headers(&[("origin", "http://127.0.0.1:4000")]),
            headers(&[("sec-fetch-site", "same-origin")]),
            headers(&[
                ("origin", "http://127.0.0.1:4000"),
                ("sec-fetch-site", "same-origin"),
            ]),
        ];
        for h in ok {
            assert_eq!(same_origin(&h, &own), Ok(()), "{h:?}");
        }
        let refused = [
            headers(&[]),
            headers(&[("origin", "http://127.0.0.1:3000")]),
            headers(&[("origin", "null")]),
            headers(&[("sec-fetch-site", "same-site")]),
            headers(&[("sec-fetch-site", "none")]),
            headers(&[
                ("origin", "http://127.0.0.1:4000"),
                ("sec-fetch-site", "cross-site"),
            ]),
        ];
        for h in refused {
            assert_eq!(same_origin(&h, &own), Err(UiError::OriginRefused), "{h:?}");
        }
    }

    #[test]
    fn the_cookie_of_this_port_is_found_among_others() {
        let h = headers(&[("cookie", "a=1; arcane_ui_4001=x; arcane_ui_4000=secret")]);
        assert_eq!(session_cookie(&h, 4000).as_deref(), Some("secret"));
        assert_eq!(session_cookie(&h, 4002), None);
        assert_eq!(
            session_cookie(&headers(&[("cookie", "arcane_ui_4000=")]), 4000),
            None
        );
    }

    #[test]
    fn the_api_maps_exact_paths_and_methods_only() {
        use hyper::Method;
        assert_eq!(api_target(&Method::POST, "/ui/api/rpc"), Ok("/v1/rpc"));
        assert_eq!(api_target(&Method::GET, "/ui/api/logs"), Ok("/v1/logs"));
        assert!(api_target(&Method::GET, "/ui/api/rpc").is_err());
        assert!(api_target(&Method::POST, "/ui/api/control").is_err());
        assert!(api_target(&Method::GET, "/ui/api/../v1/health").is_err());
        assert_eq!(login_code(br#"{"code":"abc"}"#), Ok("abc".into()));
        assert_eq!(login_code(b"code=abc"), Err(UiError::BadLogin));
        assert_eq!(login_code(br#"{"code":""}"#), Err(UiError::BadLogin));
    }
}
