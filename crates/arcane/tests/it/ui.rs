//! The dashboard in a real browser: `arcane serve` with the real llama-server and
//! SmolLM2, `arcane open --print` for the one-time link, and headless Chromium
//! (`tests/browser/ui.py`) logging in with it, unloading and loading the model,
//! streaming a chat in the playground, watching events, logs and counts; then the
//! same link again (refused), a page of another origin (reads nothing) and logout.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;

use crate::browser::Driver;
use crate::serve::{host_endpoint, real_socket_args, strs, wait_host_ready, Serve, START};
use crate::support::TestWorkspace;

#[test]
fn the_dashboard_logs_in_once_by_its_link_and_drives_the_real_model() {
    let mut driver = Driver::script("ui.py");
    let page = driver.line(Duration::from_secs(60));
    let foreign_port: u16 = page
        .strip_prefix("page ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {page:?}"));
    let ws = TestWorkspace::new();
    let mut serve = Serve::start(&ws, &strs(&real_socket_args()));
    serve.wait_for("local-ai.server.ready", START);
    wait_host_ready(&ws);
    let (port, token) = host_endpoint(&ws);

    let ps = crate::support::run(ws.arcane().args(["--output", "json", "ps"]));
    let model = crate::support::json(&ps)["models"][0]["id"]
        .as_str()
        .expect("a model id")
        .to_string();

    // The link: the listener's port under the dashboard's own secret host name (a
    // random `arcane-….localhost`), a code in the fragment, never the token.
    let open = crate::support::run(ws.arcane().args(["open", "--print"]));
    assert!(open.status.success(), "{open:?}");
    let url = crate::support::stdout(&open).trim().to_string();
    let suffix = format!(".localhost:{port}/ui#code=");
    let (origin, code) = url
        .split_once(&suffix)
        .unwrap_or_else(|| panic!("{url} names `….localhost:{port}`"));
    let origin = format!("{origin}.localhost:{port}");
    assert!(origin.starts_with("http://arcane-"), "{url}");
    assert_eq!(code.len(), 64, "{url}");
    assert!(!url.contains(&token), "the token is not in the link");

    let shots = std::env::var_os("ARCANE_UI_SCREENSHOTS")
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_else(|| "-".into());
    driver.send(&format!("link {url} {model} {shots}"));
    let mut steps: HashMap<String, Value> = HashMap::new();
    loop {
        let line = driver.line(Duration::from_secs(900));
        if line == "done" {
            break;
        }
        let result: Value = serde_json::from_str(
            line.strip_prefix("result ")
                .unwrap_or_else(|| panic!("unexpected line {line:?}")),
        )
        .expect("a JSON result");
        let name = result["step"].as_str().unwrap_or_default().to_string();
        steps.insert(name, result);
    }
    for (name, result) in &steps {
        assert_eq!(result["error"], Value::Null, "step {name}: {result}");
    }

    // Logged in; the code is gone from the address bar; the cookie is the dashboard's.
    let login = &steps["login"];
    assert_eq!(login["href"], format!("{origin}/ui"), "{login}");
    let cookies = login["cookies"].as_array().expect("cookies");
    assert_eq!(cookies.len(), 1, "{login}");
    assert_eq!(cookies[0]["name"], format!("arcane_ui_{port}"), "{login}");
    assert_eq!(cookies[0]["path"], "/ui", "{login}");
    assert_eq!(cookies[0]["httpOnly"], true, "{login}");
    assert_eq!(cookies[0]["sameSite"], "Strict", "{login}");

    // The row changed state with the buttons.
    let switched = &steps["unload-and-load"];
    assert!(
        switched["unloaded"]
            .as_str()
            .unwrap_or_default()
            .contains("stopped"),
        "{switched}"
    );
    assert!(
        switched["ready"]
            .as_str()
            .unwrap_or_default()
            .contains("ready"),
        "{switched}"
    );

    // The playground streamed text.
    let chat = &steps["playground"];
    assert_eq!(chat["status"], "done", "{chat}");
    assert!(
        !chat["text"].as_str().unwrap_or_default().trim().is_empty(),
        "{chat}"
    );

    // Events arrived live; logs are followed; counts show.
    let live = &steps["events-and-logs"];
    let events = live["events"].as_array().expect("events");
    for kind in ["local-ai.model.stopped", "local-ai.model.ready"] {
        assert!(
            events
                .iter()
                .any(|e| e.as_str().unwrap_or_default().contains(kind)),
            "{kind} in {live}"
        );
    }
    // The model's logs are followed live and show its engine's and the host's lines.
    assert_eq!(live["logsState"], "following", "{live}");
    assert!(live["logLines"].as_u64() > Some(0), "{live}");
    assert!(
        live["usage"].as_str().unwrap_or_default().contains(&model),
        "{live}"
    );

    // A page of another origin, with the browser's cookie, read nothing.
    let foreign = &steps["foreign"];
    assert_eq!(
        foreign["origin"],
        format!("http://127.0.0.1:{foreign_port}"),
        "{foreign}"
    );
    for attempt in ["rpc", "metrics", "page"] {
        assert_eq!(foreign[attempt]["status"], Value::Null, "{foreign}");
        assert_eq!(foreign[attempt]["text"], "", "{foreign}");
    }
    // `no-cors`: an opaque answer, status 0 and no body.
    assert_eq!(foreign["rpcNoCors"]["status"], 0, "{foreign}");
    assert_eq!(foreign["rpcNoCors"]["text"], "", "{foreign}");
    assert_eq!(foreign["events"]["messages"], 0, "{foreign}");

    // The same link again: the login page, refused, with no model in sight.
    let again = &steps["again"];
    assert_eq!(again["page"], "login", "{again}");
    assert_eq!(again["cookies"], 0, "{again}");
    let body = again["body"].as_str().unwrap_or_default();
    assert!(body.contains("cannot log in"), "{again}");
    assert!(!body.contains(&model), "{again}");

    // Issue 28, item 9: the browser sends the session cookie to no server on another
    // port, whether it is reached as `127.0.0.1` or `localhost`, on `/ui` paths too.
    let other = &steps["other-port"];
    let received = other["cookies"]
        .as_array()
        .expect("the requests it received");
    assert!(received.len() >= 2, "{other}");
    for cookie in received {
        assert!(
            !cookie.as_str().unwrap_or_default().contains("arcane_ui_"),
            "another port received the session: {other}"
        );
    }

    // Logout: the login page again.
    assert_eq!(steps["logout"]["page"], "login", "{:?}", steps["logout"]);
    serve.terminate();
}
