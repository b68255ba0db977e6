//! The dashboard's session rules over real loopback HTTP, with an in-process host, a
//! token file (so a rotation is a real one) and a clock the test moves (so a code
//! expires without sleeping): the login page reveals nothing; a code is good once and
//! not after it expired; the session cookie opens the dashboard's paths only, from the
//! own origin only; a rotation and a logout end it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arcane_core::service::{MethodResult, MethodSpec, RequestContext, Service};
use arcane_core::{AppInfo, BoxFuture, Host};
use arcane_front_door::http::{EngineAccess, HttpOptions, Upstream, UpstreamTarget};
use arcane_front_door::passthrough::{NoRoute, Route, RouteRequest};
use serde_json::{json, Value};

use crate::support::raw_http;

/// A model name the login page must never show.
const SECRET_MODEL: &str = "secret-model-7f3a";

/// Answers `models.list` with [`SECRET_MODEL`], as the gateway would.
struct Models;

impl Service for Models {
    fn name(&self) -> &str {
        "models"
    }

    fn methods(&self) -> Vec<MethodSpec> {
        vec![MethodSpec::request("models.list")]
    }

    fn call(
        self: Arc<Self>,
        _method: String,
        _parameters: Value,
        _context: RequestContext,
    ) -> BoxFuture<'static, MethodResult> {
        Box::pin(async { Ok(json!({"models": [{"id": SECRET_MODEL, "state": "ready"}]})) })
    }
}

/// Routes by model to an address where nothing listens, recording what it routed: a
/// refused request must never get this far.
struct Nowhere {
    routed: Arc<Mutex<usize>>,
}

impl Upstream for Nowhere {
    fn openai_target(&self) -> UpstreamTarget {
        UpstreamTarget::Ready {
            access: EngineAccess::tcp("http://127.0.0.1:9").expect("a loopback url"),
        }
    }

    fn routes_by_model(&self) -> bool {
        true
    }

    fn route(&self, _request: RouteRequest) -> BoxFuture<'_, Result<Route, NoRoute>> {
        *self.routed.lock().unwrap() += 1;
        Box::pin(async {
            Ok(Route {
                access: EngineAccess::tcp("http://127.0.0.1:9").expect("a loopback url"),
                lease: None,
                rename: None,
                upstream_model: None,
            })
        })
    }

    fn models(&self) -> Option<Value> {
        Some(json!({"object": "list", "data": [{"id": SECRET_MODEL, "object": "model"}]}))
    }
}

struct Dashboard {
    address: SocketAddr,
    /// The dashboard's host and port (`arcane-….localhost:PORT`), from a login link.
    authority: String,
    workspace: tempfile::TempDir,
    /// Milliseconds the clock is ahead of its start.
    clock: Arc<AtomicU64>,
    routed: Arc<Mutex<usize>>,
    host: Host,
}

impl Dashboard {
    async fn start() -> Dashboard {
        let workspace = tempfile::tempdir().unwrap();
        let token = arcane_core::endpoint::workspace_token(workspace.path()).unwrap();
        let host = Host::builder(AppInfo::default())
            .service(Arc::new(Models))
            .unwrap()
            .build();
        host.start();
        host.service_settled("models").await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let start = Instant::now();
        let clock = Arc::new(AtomicU64::new(0));
        let ahead = Arc::clone(&clock);
        let routed = Arc::new(Mutex::new(0));
        let mut options = HttpOptions::new(token).upstream(Arc::new(Nowhere {
            routed: Arc::clone(&routed),
        }));
        options.token_file = Some(arcane_core::endpoint::token_path(workspace.path()));
        options.ui_clock =
            Arc::new(move || start + Duration::from_millis(ahead.load(Ordering::SeqCst)));
        tokio::spawn(arcane_front_door::http::serve(
            host.clone(),
            listener,
            options,
        ));
        let mut dashboard = Dashboard {
            address,
            authority: address.to_string(),
            workspace,
            clock,
            routed,
            host,
        };
        let (_, url) = dashboard.issue().await;
        dashboard.authority = url
            .strip_prefix("http://")
            .and_then(|rest| rest.split_once("/ui#code="))
            .map(|(authority, _)| authority.to_string())
            .unwrap_or_else(|| panic!("a login link: {url}"));
        dashboard
    }

    fn token(&self) -> String {
        arcane_core::endpoint::workspace_token(self.workspace.path()).unwrap()
    }

    fn origin(&self) -> String {
        format!("http://{}", self.authority)
    }

    /// `method path` with `headers` (each `Name: value`) and `body`, to the dashboard's
    /// host name.
    async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[String],
        body: &str,
    ) -> (u16, String, String) {
        self.send_to(&self.authority, method, path, headers, body)
            .await
    }

    /// [`Dashboard::send`] with `Host: authority`.
    async fn send_to(
        &self,
        authority: &str,
        method: &str,
        path: &str,
        headers: &[String],
        body: &str,
    ) -> (u16, String, String) {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\n");
        for header in headers {
            head.push_str(header);
            head.push_str("\r\n");
        }
        raw_http(self.address, &head, body).await
    }

    /// A login code, issued with the bearer token as `arcane open` does.
    async fn issue(&self) -> (String, String) {
        let frame = json!({"protocol": "arcane/1", "type": "request", "id": "1", "method": "ui.code.issue"});
        let (status, _, body) = self
            .send(
                "POST",
                "/v1/rpc",
                &[format!("Authorization: Bearer {}", self.token())],
                &frame.to_string(),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["ok"], true, "{answer}");
        let result = &answer["result"];
        assert_eq!(result["expiresIn"], 60, "{answer}");
        let code = result["code"].as_str().unwrap().to_string();
        let url = result["url"].as_str().unwrap().to_string();
        (code, url)
    }

    /// `POST /ui/session` with `code` from the own origin: status, head, body.
    async fn redeem(&self, code: &str) -> (u16, String, String) {
        let origin = format!("Origin: {}", self.origin());
        let body = json!({ "code": code }).to_string();
        self.send("POST", "/ui/session", &[origin], &body).await
    }

    /// Logs in: a fresh code redeemed; the `Cookie:` header it set.
    async fn login(&self) -> String {
        let (code, _) = self.issue().await;
        let (status, head, body) = self.redeem(&code).await;
        assert_eq!(status, 204, "{head}{body}");
        let cookie = head
            .lines()
            .find_map(|l| l.strip_prefix("set-cookie: "))
            .expect("a session cookie")
            .to_string();
        let port = self.address.port();
        assert!(cookie.contains("httponly"), "{cookie}");
        assert!(cookie.contains("samesite=strict"), "{cookie}");
        assert!(cookie.contains("path=/ui"), "{cookie}");
        let pair = cookie.split(';').next().unwrap();
        let (name, value) = pair.split_once('=').unwrap();
        assert_eq!(name, format!("arcane_ui_{port}"));
        assert_eq!(value.len(), 64, "256 random bits, hex");
        // (The reply's head is lower-cased: the secret is lower-case hex anyway.)
        format!("Cookie: arcane_ui_{port}={value}")
    }

    /// A dashboard call (`POST /ui/api/rpc`) for `method` with `headers`.
    async fn ui_rpc(&self, method: &str, headers: &[String]) -> (u16, String) {
        let frame = json!({"protocol": "arcane/1", "type": "request", "id": "u", "method": method});
        let (status, _, body) = self
            .send("POST", "/ui/api/rpc", headers, &frame.to_string())
            .await;
        (status, body)
    }
}

#[tokio::test]
async fn without_a_session_ui_is_a_login_page_that_reveals_no_model() {
    let dash = Dashboard::start().await;
    // No cookie at all, and a bearer token (which `/ui` ignores): the same login page.
    for headers in [
        vec![],
        vec![format!("Authorization: Bearer {}", dash.token())],
        vec![format!(
            "Cookie: arcane_ui_{}={}",
            dash.address.port(),
            "0".repeat(64)
        )],
    ] {
        let (status, head, body) = dash.send("GET", "/ui", &headers, "").await;
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("data-page=\"login\""), "{body}");
        assert!(body.contains("arcane open"), "{body}");
        assert!(!body.contains(SECRET_MODEL), "{body}");
        assert!(!body.contains("data-page=\"dashboard\""), "{body}");
        for header in [
            "content-security-policy: default-src 'self'",
            "frame-ancestors 'none'",
            "x-frame-options: deny",
            "referrer-policy: no-referrer",
            "cache-control: no-store",
        ] {
            assert!(head.contains(header), "{header} in {head}");
        }
    }
    // Nor does any dashboard call answer without a session.
    let own = format!("Origin: {}", dash.origin());
    let (status, body) = dash.ui_rpc("models.list", std::slice::from_ref(&own)).await;
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains(SECRET_MODEL), "{body}");
    assert!(body.contains("UI_SESSION_REQUIRED"), "{body}");
    // The page's own files load without a session (the login page needs them).
    let (status, head, _) = dash.send("GET", "/ui/app.js", &[], "").await;
    assert_eq!(status, 200);
    assert!(head.contains("content-type: text/javascript"), "{head}");
    // And the icon, also where a browser asks for it on any page of the origin.
    for path in ["/ui/icon.svg", "/favicon.ico"] {
        let (status, head, body) = dash.send("GET", path, &[], "").await;
        assert_eq!(status, 200, "{path}: {body}");
        assert!(head.contains("content-type: image/svg+xml"), "{head}");
        assert!(!body.contains(SECRET_MODEL));
    }
    dash.host.close().await.unwrap();
}

#[tokio::test]
async fn a_code_logs_in_once_and_a_second_use_is_refused() {
    let dash = Dashboard::start().await;
    let (code, url) = dash.issue().await;
    assert_eq!(url, format!("http://{}/ui#code={code}", dash.authority));
    let (status, head, _) = dash.redeem(&code).await;
    assert_eq!(status, 204);
    assert!(head.contains("set-cookie: "), "{head}");
    let (status, head, body) = dash.redeem(&code).await;
    assert_eq!(status, 401, "{body}");
    assert!(!head.contains("set-cookie"), "{head}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["code"],
        "UI_CODE_INVALID"
    );
    // A code nobody issued is refused the same way.
    let (status, _, body) = dash.redeem(&"a".repeat(64)).await;
    assert_eq!(status, 401, "{body}");

    // With the session, the dashboard and its calls answer.
    let cookie = dash.login().await;
    let (status, _, body) = dash
        .send("GET", "/ui", std::slice::from_ref(&cookie), "")
        .await;
    assert_eq!(status, 200);
    assert!(body.contains("data-page=\"dashboard\""), "{body}");
    let own = format!("Origin: {}", dash.origin());
    let (status, body) = dash.ui_rpc("models.list", &[cookie.clone(), own]).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(SECRET_MODEL), "{body}");
    // `EventSource` and same-origin `GET`s send `Sec-Fetch-Site` instead of `Origin`.
    let (status, body) = dash
        .ui_rpc(
            "models.list",
            &[cookie.clone(), "Sec-Fetch-Site: same-origin".into()],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Only the methods the dashboard needs: not `ui.code.issue`, not a shutdown.
    for method in ["ui.code.issue", "core.host.shutdown"] {
        let own = format!("Origin: {}", dash.origin());
        let (status, body) = dash.ui_rpc(method, &[cookie.clone(), own]).await;
        assert_eq!(status, 403, "{method}: {body}");
        assert!(body.contains("METHOD_NOT_ALLOWED"), "{body}");
    }
    dash.host.close().await.unwrap();
}

#[tokio::test]
async fn an_expired_code_is_refused() {
    let dash = Dashboard::start().await;
    let (code, _) = dash.issue().await;
    let (fresh, _) = dash.issue().await;
    // 59.999 s later the second code still works; at 60 s the first has expired.
    dash.clock.store(59_999, Ordering::SeqCst);
    assert_eq!(dash.redeem(&fresh).await.0, 204);
    dash.clock.store(60_000, Ordering::SeqCst);
    let (status, head, body) = dash.redeem(&code).await;
    assert_eq!(status, 401, "{body}");
    assert!(!head.contains("set-cookie"), "{head}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["code"],
        "UI_CODE_EXPIRED"
    );
    dash.host.close().await.unwrap();
}

#[tokio::test]
async fn the_session_cookie_opens_no_plain_api_path() {
    let dash = Dashboard::start().await;
    let cookie = dash.login().await;
    let own = format!("Origin: {}", dash.origin());
    let frame =
        json!({"protocol": "arcane/1", "type": "request", "id": "1", "method": "models.list"})
            .to_string();
    let chat = json!({"model": SECRET_MODEL, "stream": true, "messages": [{"role": "user", "content": "hi"}]})
        .to_string();
    for (method, path, body) in [
        ("POST", "/v1/rpc", frame.as_str()),
        ("POST", "/v1/chat/completions", chat.as_str()),
        ("GET", "/v1/events", ""),
        ("GET", "/v1/models", ""),
    ] {
        let (status, head, reply) = dash
            .send(method, path, &[cookie.clone(), own.clone()], body)
            .await;
        assert_eq!(status, 401, "{path}: {reply}");
        assert!(head.contains("www-authenticate: bearer"), "{head}");
        assert!(!reply.contains(SECRET_MODEL), "{reply}");
    }
    assert_eq!(*dash.routed.lock().unwrap(), 0, "nothing was routed");
    dash.host.close().await.unwrap();
}

#[tokio::test]
async fn a_dashboard_call_from_another_origin_is_refused() {
    let dash = Dashboard::start().await;
    let cookie = dash.login().await;
    let port = dash.address.port();
    for refused in [
        // A page on another local port: the same *site*, so SameSite sends the cookie.
        vec![format!("Origin: http://127.0.0.1:{}", port.wrapping_add(1))],
        vec!["Sec-Fetch-Site: same-site".to_string()],
        vec!["Sec-Fetch-Site: cross-site".to_string()],
        // Neither header: not a request the dashboard's own page makes.
        vec![],
    ] {
        let mut headers = refused.clone();
        headers.push(cookie.clone());
        let (status, body) = dash.ui_rpc("models.list", &headers).await;
        assert!(status == 403, "{refused:?}: {status} {body}");
        assert!(!body.contains(SECRET_MODEL), "{body}");
    }
    // The login itself, from another origin, is refused and spends no code.
    let (code, _) = dash.issue().await;
    let (status, _, _) = dash
        .send(
            "POST",
            "/ui/session",
            &["Sec-Fetch-Site: cross-site".to_string()],
            &json!({ "code": code }).to_string(),
        )
        .await;
    assert_eq!(status, 403);
    assert_eq!(dash.redeem(&code).await.0, 204);
    dash.host.close().await.unwrap();
}

#[tokio::test]
async fn a_rotation_and_a_logout_end_the_session() {
    let dash = Dashboard::start().await;
    let own = format!("Origin: {}", dash.origin());
    let first = dash.login().await;
    let second = dash.login().await;
    for cookie in [&first, &second] {
        let (status, body) = dash
            .ui_rpc("models.list", &[cookie.clone(), own.clone()])
            .await;
        assert_eq!(status, 200, "{body}");
    }
    // Logout ends that session only, and clears the cookie.
    let (status, head, _) = dash
        .send("POST", "/ui/logout", &[first.clone(), own.clone()], "")
        .await;
    assert_eq!(status, 204);
    assert!(head.contains("max-age=0"), "{head}");
    let (status, _) = dash
        .ui_rpc("models.list", &[first.clone(), own.clone()])
        .await;
    assert_eq!(status, 401);
    let (_, _, page) = dash
        .send("GET", "/ui", std::slice::from_ref(&first), "")
        .await;
    assert!(page.contains("data-page=\"login\""), "{page}");
    let (status, _) = dash
        .ui_rpc("models.list", &[second.clone(), own.clone()])
        .await;
    assert_eq!(status, 200);

    // `arcane token rotate` ends every session, at once.
    arcane_core::endpoint::rotate_token(dash.workspace.path()).unwrap();
    let (status, body) = dash
        .ui_rpc("models.list", &[second.clone(), own.clone()])
        .await;
    assert_eq!(status, 401, "{body}");
    let (_, _, page) = dash
        .send("GET", "/ui", std::slice::from_ref(&second), "")
        .await;
    assert!(page.contains("data-page=\"login\""), "{page}");
    // A new login works under the new token.
    let third = dash.login().await;
    let (status, _) = dash.ui_rpc("models.list", &[third, own]).await;
    assert_eq!(status, 200);
    dash.host.close().await.unwrap();
}

/// Issue 28, item 9: a session lives only on the dashboard's own host name, a random
/// `arcane-….localhost` that only the login link names. Browsers keep the cookie to
/// that name, so no server on another port of `127.0.0.1` or `localhost` receives it
/// (`tests/browser/ui.py` shows that in Chromium); and a login on those names, whose
/// cookie would go to every one of their ports, is refused without spending the code.
#[tokio::test]
async fn sessions_live_only_on_the_dashboards_own_secret_host_name() {
    let dash = Dashboard::start().await;
    let port = dash.address.port();
    let label = dash
        .authority
        .strip_suffix(&format!(".localhost:{port}"))
        .unwrap_or_else(|| panic!("{}", dash.authority))
        .to_string();
    let digits = label.strip_prefix("arcane-").unwrap_or_default();
    assert!(
        digits.len() == 32 && digits.bytes().all(|b| b.is_ascii_hexdigit()),
        "{label}"
    );
    let other = Dashboard::start().await;
    assert!(
        !other.authority.starts_with(&label),
        "a new name per listener"
    );
    other.host.close().await.unwrap();

    let (code, _) = dash.issue().await;
    let body = json!({ "code": code }).to_string();
    for authority in [dash.address.to_string(), format!("localhost:{port}")] {
        let origin = format!("Origin: http://{authority}");
        let (status, head, reply) = dash
            .send_to(&authority, "POST", "/ui/session", &[origin], &body)
            .await;
        assert_eq!(status, 403, "{authority}: {reply}");
        assert!(!head.contains("set-cookie"), "{head}");
        assert!(reply.contains("UI_ORIGIN_REFUSED"), "{reply}");
        assert!(
            !reply.contains(&label),
            "the refusal names no dashboard: {reply}"
        );
    }
    assert_eq!(dash.redeem(&code).await.0, 204, "the code was not spent");

    // A live session's cookie replayed on another host name, with whatever `Origin`
    // the replaying program likes, opens nothing.
    let cookie = dash.login().await;
    let frame =
        json!({"protocol": "arcane/1", "type": "request", "id": "1", "method": "models.list"})
            .to_string();
    for authority in [dash.address.to_string(), format!("localhost:{port}")] {
        let origin = format!("Origin: http://{authority}");
        let (status, _, reply) = dash
            .send_to(
                &authority,
                "POST",
                "/ui/api/rpc",
                &[cookie.clone(), origin],
                &frame,
            )
            .await;
        assert_eq!(status, 401, "{authority}: {reply}");
        assert!(!reply.contains(SECRET_MODEL), "{reply}");
        let (_, _, page) = dash
            .send_to(&authority, "GET", "/ui", std::slice::from_ref(&cookie), "")
            .await;
        assert!(page.contains("data-page=\"login\""), "{page}");
    }
    let own = format!("Origin: {}", dash.origin());
    let (status, reply) = dash.ui_rpc("models.list", &[cookie, own]).await;
    assert_eq!(status, 200, "{reply}");
    dash.host.close().await.unwrap();
}

/// An SSE stream of `path` with `headers`, positioned after the head.
async fn open_stream(
    dash: &Dashboard,
    path: &str,
    headers: &[String],
) -> tokio::io::BufReader<tokio::net::TcpStream> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(dash.address).await.unwrap();
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n", dash.authority);
    for header in headers {
        head.push_str(header);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut reader = tokio::io::BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).await.unwrap();
    assert!(line.contains(" 200 "), "{path}: {line}");
    loop {
        line.clear();
        reader.read_line(&mut line).await.unwrap();
        if line == "\r\n" {
            return reader;
        }
    }
}

/// The ids of the `response` frames of `reader` up to the one answering `last`.
async fn responses_until(
    reader: &mut tokio::io::BufReader<tokio::net::TcpStream>,
    last: &str,
) -> Vec<String> {
    use tokio::io::AsyncBufReadExt;
    let mut ids = Vec::new();
    let mut line = String::new();
    while ids.last().map(String::as_str) != Some(last) {
        line.clear();
        let read = tokio::time::timeout(Duration::from_secs(30), reader.read_line(&mut line))
            .await
            .unwrap_or_else(|_| panic!("no answer to {last} in time; saw {ids:?}"))
            .unwrap();
        assert!(read > 0, "the stream ended; saw {ids:?}");
        let Some(data) = line.trim().strip_prefix("data: ") else {
            continue;
        };
        let frame: Value = serde_json::from_str(data).unwrap();
        if frame["type"] == "response" {
            ids.push(frame["id"].as_str().unwrap_or_default().to_string());
        }
    }
    ids
}

/// Issue 28, item 7: a dashboard (or packaged-web) session that names another client
/// (a bridge) in `?client=` or `X-Arcane-Client` acts in its own space: it neither
/// reads that client's stream nor gets its own calls counted as that client's.
#[tokio::test]
async fn a_session_acts_only_as_itself_never_as_another_client() {
    let dash = Dashboard::start().await;
    let cookie = dash.login().await;
    let own = format!("Origin: {}", dash.origin());
    let bearer = format!("Authorization: Bearer {}", dash.token());
    let victim = "bridge-4242-0badcafe";
    let mut bridge = open_stream(
        &dash,
        &format!("/v1/events?client={victim}"),
        std::slice::from_ref(&bearer),
    )
    .await;
    let mut spy = open_stream(
        &dash,
        &format!("/ui/api/events?client={victim}"),
        &[cookie.clone(), "Sec-Fetch-Site: same-origin".into()],
    )
    .await;
    let ping = |id: &str| {
        json!({"protocol": "arcane/1", "type": "request", "id": id, "method": "system.ping"})
            .to_string()
    };
    let client = format!("X-Arcane-Client: {victim}");
    let (status, _, body) = dash
        .send(
            "POST",
            "/v1/rpc",
            &[bearer.clone(), client.clone()],
            &ping("bridge-1"),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = dash
        .send(
            "POST",
            "/ui/api/rpc",
            &[cookie.clone(), own.clone(), client.clone()],
            &ping("session-1"),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = dash
        .send("POST", "/v1/rpc", &[bearer, client], &ping("bridge-2"))
        .await;
    assert_eq!(status, 200, "{body}");
    // The session's stream carries its own answer, never the bridge's.
    assert_eq!(responses_until(&mut spy, "session-1").await, ["session-1"]);
    // The bridge's stream carries its own answers, never the session's.
    assert_eq!(
        responses_until(&mut bridge, "bridge-2").await,
        ["bridge-1", "bridge-2"]
    );
    dash.host.close().await.unwrap();
}
