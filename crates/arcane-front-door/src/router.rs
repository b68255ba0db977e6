//! The front door's one route table: which handler answers a method and path.
//!
//! Before this table, `http::handle` was a closed `match` of the Core's own paths
//! followed by a catch-all forward to the engine, so with the model gateway every
//! unknown path (`GET /ui`, a typo) cold-loaded the default model only to get the
//! engine's 404. Now every path the front door serves is a [`Row`] of one table,
//! searched in order; the first row whose method and path match names the
//! [`Handler`]. A later feature (audio, `/ui`) adds rows
//! (a `const` slice of its own, listed in [`TABLE`]) and a handler kind, not a new
//! `match` arm on paths.
//!
//! # What an unmatched request gets
//!
//! * A path some row matches, with a method none of its rows accepts: **405**
//!   ([`Lookup::MethodNotAllowed`]).
//! * A path no row matches ([`Lookup::Unknown`]): with the model gateway (routing by
//!   model), the Core's own 404 (`ARCANE_NOT_FOUND`, naming the path), and nothing is
//!   loaded; with a single engine, the request is forwarded and gets the engine's own
//!   answer (the engine may serve paths Arcane does not list). The caller decides, as
//!   only it knows the mode; see [`crate::http`].

/// Which methods a row accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// Every method.
    Any,
    /// `GET` only.
    Get,
    /// `POST` only.
    Post,
    /// `DELETE` only.
    Delete,
}

impl Verb {
    fn accepts(self, method: &hyper::Method) -> bool {
        match self {
            Self::Any => true,
            Self::Get => method == hyper::Method::GET,
            Self::Post => method == hyper::Method::POST,
            Self::Delete => method == hyper::Method::DELETE,
        }
    }
}

/// Which paths a row matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathPattern {
    /// Exactly this path.
    Exact(&'static str),
    /// This path, or any path below it (`/slots` matches `/slots` and `/slots/0`, not
    /// `/slotsx`). A pattern ending in `/` matches only what is below it.
    Prefix(&'static str),
}

impl PathPattern {
    fn matches(self, path: &str) -> bool {
        match self {
            Self::Exact(exact) => path == exact,
            Self::Prefix(prefix) if prefix.ends_with('/') => {
                path.len() > prefix.len() && path.starts_with(prefix)
            }
            Self::Prefix(prefix) => path
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/')),
        }
    }
}

/// When a row is in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Always.
    Always,
    /// Only while the passthrough routes by model (the model gateway).
    RoutingByModel,
}

/// Who answers a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Handler {
    /// `GET /health`: the token-free status for monitors.
    Health,
    /// `GET /v1/health`: the host's health.
    CoreHealth,
    /// `POST /v1/rpc`: one `arcane/1` request frame.
    Rpc,
    /// `POST /v1/control`: one control frame.
    Control,
    /// `GET /v1/events`: the SSE event stream.
    Events,
    /// `GET /v1/logs`: the kept log lines, optionally followed ([`crate::logs`]).
    Logs,
    /// `GET /v1/models`, answered by the gateway.
    ModelList,
    /// `GET /v1/models/{id}`, answered by the gateway for an id or alias.
    ModelEntry,
    /// `GET /metrics`, the gateway's Prometheus text.
    Metrics,
    /// A translated API's endpoint ([`crate::apis`]), for every gateway model.
    Api(crate::apis::Endpoint),
    /// The engine's own API: forwarded by [`crate::passthrough`].
    Engine,
    /// `GET /ui`: the dashboard with a session, else its login page ([`crate::ui`]).
    UiPage,
    /// `GET /ui/app.js`, `GET /ui/app.css`, `GET /ui/icon.svg` (and `GET /favicon.ico`):
    /// the dashboard's embedded files, which reveal nothing.
    UiAsset,
    /// `POST /ui/session`: a login code traded for a session cookie.
    UiLogin,
    /// `POST /ui/logout`: ends the session.
    UiLogout,
    /// `/ui/api/*`: a dashboard call, answered by the handler of the path it stands
    /// for ([`crate::ui::api_target`]).
    UiApi,
    /// `GET /ui/app/*`: the application's packaged web ([`crate::web`]), with the
    /// dashboard's session.
    UiWeb,
    /// `/app`, `/app/*`: moved to `/ui/app/` (the session's cookie is scoped to `/ui`).
    AppMoved,
}

impl Handler {
    /// Whether the dashboard's rules admit the request ([`crate::ui`]: a session and
    /// the own origin) instead of the bearer token.
    pub fn is_dashboard(self) -> bool {
        matches!(
            self,
            Self::UiPage
                | Self::UiAsset
                | Self::UiLogin
                | Self::UiLogout
                | Self::UiApi
                | Self::UiWeb
        )
    }
}

/// One row of the route table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// The methods it accepts.
    pub verb: Verb,
    /// The paths it matches.
    pub path: PathPattern,
    /// When it is in force.
    pub scope: Scope,
    /// Who answers.
    pub handler: Handler,
}

const fn row(verb: Verb, path: PathPattern, handler: Handler) -> Row {
    Row {
        verb,
        path,
        scope: Scope::Always,
        handler,
    }
}

/// The Core's own endpoints (any other method on these paths is a 405).
pub const CORE_ROWS: &[Row] = &[
    row(Verb::Get, PathPattern::Exact("/health"), Handler::Health),
    row(
        Verb::Get,
        PathPattern::Exact("/v1/health"),
        Handler::CoreHealth,
    ),
    row(Verb::Post, PathPattern::Exact("/v1/rpc"), Handler::Rpc),
    row(
        Verb::Post,
        PathPattern::Exact("/v1/control"),
        Handler::Control,
    ),
    row(Verb::Get, PathPattern::Exact("/v1/events"), Handler::Events),
];

/// Where the application's packaged web used to be looked for: `/app/…` moves to
/// `/ui/app/…`.
pub const WEB_ROWS: &[Row] = &[row(
    Verb::Any,
    PathPattern::Prefix("/app"),
    Handler::AppMoved,
)];

/// The host's logs.
pub const LOG_ROWS: &[Row] = &[row(
    Verb::Get,
    PathPattern::Exact("/v1/logs"),
    Handler::Logs,
)];

/// What the model gateway answers itself (before the engine rows of the same paths).
pub const GATEWAY_ROWS: &[Row] = &[
    Row {
        verb: Verb::Get,
        path: PathPattern::Exact("/v1/models"),
        scope: Scope::RoutingByModel,
        handler: Handler::ModelList,
    },
    Row {
        verb: Verb::Get,
        path: PathPattern::Prefix("/v1/models/"),
        scope: Scope::RoutingByModel,
        handler: Handler::ModelEntry,
    },
    Row {
        verb: Verb::Get,
        path: PathPattern::Exact("/metrics"),
        scope: Scope::RoutingByModel,
        handler: Handler::Metrics,
    },
];

/// The front door's table, searched in this order: the Core's rows, the logs', the
/// dashboard's ([`crate::ui::UI_ROWS`]), the packaged web's move, the gateway's own
/// answers, then the translated APIs ([`crate::apis::ROWS`]). A new area adds its slice
/// here. The engines' API paths
/// come last, from the descriptors of the kinds being served
/// ([`arcane_localai::EngineKind::api_paths`]: a path ending in `/` matches what is
/// below it, any other exactly itself).
pub const TABLE: &[&[Row]] = &[
    CORE_ROWS,
    LOG_ROWS,
    crate::ui::UI_ROWS,
    WEB_ROWS,
    GATEWAY_ROWS,
    crate::apis::ROWS,
];

/// The outcome of looking a request up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// This handler answers.
    Found(Handler),
    /// Some row serves the path, none with this method: 405.
    MethodNotAllowed,
    /// No row serves the path.
    Unknown,
}

/// Looks `method path` up in `table` (rows in order, first match wins), then asks
/// `engines_serve` (whether the engines being served answer it, any method:
/// [`Upstream::serves`](crate::passthrough::Upstream::serves)); rows scoped to
/// [`Scope::RoutingByModel`] count only when `routes_by_model`.
pub fn lookup(
    table: &[&[Row]],
    engines_serve: &dyn Fn(&str) -> bool,
    method: &hyper::Method,
    path: &str,
    routes_by_model: bool,
) -> Lookup {
    let mut path_served = false;
    let rows = table.iter().flat_map(|rows| rows.iter()).filter(|row| {
        row.scope == Scope::Always || (row.scope == Scope::RoutingByModel && routes_by_model)
    });
    for row in rows {
        if !row.path.matches(path) {
            continue;
        }
        if row.verb.accepts(method) {
            return Lookup::Found(row.handler);
        }
        path_served = true;
    }
    if engines_serve(path) {
        Lookup::Found(Handler::Engine)
    } else if path_served {
        Lookup::MethodNotAllowed
    } else {
        Lookup::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::Method;

    const LLAMA: arcane_localai::Engine = arcane_localai::Engine::LlamaCpp;

    /// Whether one of `kinds` serves a path, as an upstream serving them answers.
    fn serving(kinds: &[arcane_localai::Engine]) -> impl Fn(&str) -> bool + '_ {
        |path| {
            kinds
                .iter()
                .any(|k| arcane_localai::serves_path(k.kind().api_paths(), path))
        }
    }

    fn find(method: Method, path: &str, routes_by_model: bool) -> Lookup {
        lookup(TABLE, &serving(&[LLAMA]), &method, path, routes_by_model)
    }

    #[test]
    fn exact_rows_match_only_their_path() {
        assert_eq!(
            find(Method::POST, "/v1/rpc", false),
            Lookup::Found(Handler::Rpc)
        );
        assert_eq!(
            find(Method::POST, "/v1/chat/completions", true),
            Lookup::Found(Handler::Engine)
        );
        assert_eq!(find(Method::POST, "/v1/rpc/x", true), Lookup::Unknown);
        assert_eq!(
            find(Method::POST, "/v1/chat/completionsx", true),
            Lookup::Unknown
        );
    }

    #[test]
    fn prefix_rows_match_below_their_path_only() {
        for path in ["/slots", "/slots/0", "/slots/0/save"] {
            assert_eq!(
                find(Method::POST, path, true),
                Lookup::Found(Handler::Engine),
                "{path}"
            );
        }
        assert_eq!(find(Method::GET, "/slotsx", true), Lookup::Unknown);
        assert_eq!(
            find(Method::GET, "/v1/models/smol-a", true),
            Lookup::Found(Handler::ModelEntry)
        );
    }

    #[test]
    fn the_method_selects_the_row_and_a_core_path_refuses_other_methods() {
        assert_eq!(
            find(Method::GET, "/health", false),
            Lookup::Found(Handler::Health)
        );
        assert_eq!(
            find(Method::POST, "/health", false),
            Lookup::MethodNotAllowed
        );
        assert_eq!(find(Method::GET, "/v1/rpc", true), Lookup::MethodNotAllowed);
        // The gateway answers `GET /v1/models` itself; another method goes to the
        // engine row of the same path.
        assert_eq!(
            find(Method::GET, "/v1/models", true),
            Lookup::Found(Handler::ModelList)
        );
        assert_eq!(
            find(Method::POST, "/v1/models", true),
            Lookup::Found(Handler::Engine)
        );
        assert_eq!(
            find(Method::DELETE, "/v1/models/smol-a", true),
            Lookup::MethodNotAllowed
        );
    }

    #[test]
    fn gateway_rows_count_only_when_routing_by_model() {
        assert_eq!(
            find(Method::GET, "/metrics", true),
            Lookup::Found(Handler::Metrics)
        );
        assert_eq!(
            find(Method::GET, "/metrics", false),
            Lookup::Found(Handler::Engine)
        );
        assert_eq!(
            find(Method::GET, "/v1/models", false),
            Lookup::Found(Handler::Engine)
        );
        assert_eq!(find(Method::GET, "/v1/models/x", false), Lookup::Unknown);
    }

    #[test]
    fn unknown_paths_are_unknown_in_either_mode() {
        for routes_by_model in [true, false] {
            assert_eq!(
                find(Method::GET, "/nowhere", routes_by_model),
                Lookup::Unknown
            );
            assert_eq!(
                find(Method::GET, "/ui/nowhere", routes_by_model),
                Lookup::Unknown
            );
            assert_eq!(find(Method::GET, "/", routes_by_model), Lookup::Unknown);
            assert_eq!(
                find(Method::POST, "/v1/audio/speech", routes_by_model),
                Lookup::Unknown
            );
        }
    }

    #[test]
    fn the_dashboard_is_rows_of_the_table() {
        for routes_by_model in [true, false] {
            assert_eq!(
                find(Method::GET, "/ui", routes_by_model),
                Lookup::Found(Handler::UiPage)
            );
            assert_eq!(
                find(Method::POST, "/ui/session", routes_by_model),
                Lookup::Found(Handler::UiLogin)
            );
            assert_eq!(
                find(Method::GET, "/ui/session", routes_by_model),
                Lookup::MethodNotAllowed
            );
            assert_eq!(
                find(Method::POST, "/ui/api/chat/completions", routes_by_model),
                Lookup::Found(Handler::UiApi)
            );
        }
        assert!(Handler::UiApi.is_dashboard() && !Handler::Rpc.is_dashboard());
    }

    #[test]
    fn a_later_area_adds_rows_not_match_arms() {
        const UI: &[Row] = &[row(Verb::Get, PathPattern::Prefix("/ui"), Handler::Health)];
        let table: &[&[Row]] = &[CORE_ROWS, UI];
        assert_eq!(
            lookup(
                table,
                &serving(&[LLAMA]),
                &Method::GET,
                "/ui/index.html",
                true
            ),
            Lookup::Found(Handler::Health)
        );
        assert_eq!(
            lookup(table, &serving(&[LLAMA]), &Method::POST, "/ui", true),
            Lookup::MethodNotAllowed
        );
        // A kind's API paths are its own: Ollama's `/api/` only when Ollama is served
        // by a single engine; the gateway answers Ollama's API itself.
        let ollama = arcane_localai::Engine::Ollama;
        assert_eq!(
            lookup(TABLE, &serving(&[LLAMA]), &Method::POST, "/api/chat", false),
            Lookup::Unknown
        );
        assert_eq!(
            lookup(
                TABLE,
                &serving(&[ollama]),
                &Method::POST,
                "/api/chat",
                false
            ),
            Lookup::Found(Handler::Engine)
        );
    }

    #[test]
    fn the_gateway_answers_ollamas_api_and_leaves_other_api_paths_to_ollama() {
        use crate::apis::ollama::Endpoint;
        let ollama = arcane_localai::Engine::Ollama;
        for kinds in [&[LLAMA][..], &[LLAMA, ollama][..]] {
            assert_eq!(
                lookup(TABLE, &serving(kinds), &Method::POST, "/api/chat", true),
                Lookup::Found(Handler::Api(crate::apis::Endpoint::Ollama(Endpoint::Chat)))
            );
            assert_eq!(
                lookup(TABLE, &serving(kinds), &Method::DELETE, "/api/delete", true),
                Lookup::Found(Handler::Api(crate::apis::Endpoint::Ollama(
                    Endpoint::Delete
                )))
            );
        }
        assert_eq!(
            lookup(TABLE, &serving(&[LLAMA]), &Method::GET, "/api/chat", true),
            Lookup::MethodNotAllowed
        );
        assert_eq!(
            lookup(
                TABLE,
                &serving(&[LLAMA]),
                &Method::HEAD,
                "/api/blobs/sha256:0",
                true
            ),
            Lookup::Unknown
        );
        assert_eq!(
            lookup(
                TABLE,
                &serving(&[LLAMA, ollama]),
                &Method::HEAD,
                "/api/blobs/sha256:0",
                true
            ),
            Lookup::Found(Handler::Engine)
        );
    }
}
