//! Issue 18 §3: one router at the front door. With a gateway of two real SmolLM2
//! models: the model a request names is found whatever its body's spelling
//! (`Application/JSON; charset=utf-8`, `text/plain`, a UTF-8 BOM, a multipart `model`
//! field) and only that model loads; an unknown path, a `model` that is not a string
//! and `GET /v1/models/{alias}` are answered without loading anything; `x-api-key` is
//! admitted like the bearer token.

use serde_json::{json, Value};

use crate::front_door::{call, exchange, parsed};
use crate::gateway::{gateway_workspace, ps, start};
use crate::serve::{host_endpoint, Serve, START};
use crate::support::TestWorkspace;

/// Two models: `smol-a` (the default) and `smol-b` (alias `bee`), both SmolLM2.
const TWO_MODELS: &str = r#"
[[model]]
id = "smol-a"
model = "smollm2-135m"

[[model]]
id = "smol-b"
aliases = ["bee"]
model = "{model}"
"#;

/// The models `starting` events named so far.
fn loaded(serve: &mut Serve) -> Vec<String> {
    serve
        .seen()
        .iter()
        .filter(|l| l["type"] == "local-ai.model.starting")
        .filter_map(|l| l["data"]["model"].as_str().map(str::to_string))
        .collect()
}

/// The state `arcane ps` shows for `id`.
fn state(ws: &TestWorkspace, id: &str) -> Value {
    ps(ws)
        .into_iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("no `{id}` in `arcane ps`"))["state"]
        .clone()
}

/// A POST of `body` (bytes as given) to `path` with `content_type`.
fn post(port: u16, token: &str, path: &str, content_type: &str, body: &[u8]) -> (u16, String) {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    // The body may not be UTF-8 text in general, but these are.
    let request = format!("{head}{}", String::from_utf8_lossy(body));
    let (status, _, reply) = exchange(port, &request);
    (status, reply)
}

#[test]
fn the_front_door_answers_unknown_paths_aliases_and_bad_models_without_loading_anything() {
    let ws = gateway_workspace(TWO_MODELS);
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);

    // An unknown path is the Core's own 404, naming it; nothing loads.
    let (code, body) = call(port, &token, "GET", "/nowhere", None);
    assert_eq!(code, 404, "{body}");
    let error = &parsed("/nowhere", &body)["error"];
    assert_eq!(error["code"], "ARCANE_NOT_FOUND", "{body}");
    assert_eq!(error["details"]["path"], "/nowhere", "{body}");

    // `GET /v1/models/{alias}` answers as for the id, named as asked.
    let (code, body) = call(port, &token, "GET", "/v1/models/bee", None);
    assert_eq!(code, 200, "{body}");
    let entry = parsed("/v1/models/bee", &body);
    assert_eq!(entry["id"], "bee", "{body}");
    assert_eq!(entry["object"], "model", "{body}");
    assert_eq!(entry["state"], "stopped", "{body}");
    let (code, body) = call(port, &token, "GET", "/v1/models/smol-b", None);
    assert_eq!(code, 200, "{body}");
    assert_eq!(parsed("/v1/models/smol-b", &body)["id"], "smol-b");
    let (code, body) = call(port, &token, "GET", "/v1/models/nope", None);
    assert_eq!(code, 404, "{body}");
    assert_eq!(
        parsed("/v1/models/nope", &body)["error"]["code"],
        "model_not_found"
    );

    // A `model` that is not a string is a 400 that names it.
    let (code, body) = call(
        port,
        &token,
        "POST",
        "/v1/chat/completions",
        Some(json!({"model": 7, "messages": [{"role": "user", "content": "Hi"}]})),
    );
    assert_eq!(code, 400, "{body}");
    let error = &parsed("/v1/chat/completions", &body)["error"];
    assert_eq!(error["code"], "ARCANE_USAGE", "{body}");
    assert_eq!(error["details"], json!({"model": 7}), "{body}");
    assert!(
        error["message"].as_str().unwrap().contains("`model`"),
        "{body}"
    );

    // `x-api-key: TOKEN` is admitted like the bearer token; a wrong one, or one that
    // disagrees with the bearer token, is refused.
    let with = |headers: &str| {
        exchange(
            port,
            &format!("GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}Connection: close\r\n\r\n"),
        )
    };
    let (code, _, body) = with(&format!("x-api-key: {token}\r\n"));
    assert_eq!(code, 200, "{body}");
    assert_eq!(parsed("/v1/models", &body)["data"][1]["id"], "smol-b");
    let (code, head, _) = with("x-api-key: not-the-token\r\n");
    assert_eq!(code, 401);
    assert!(head.contains("www-authenticate: bearer"), "{head}");
    let (code, _, _) = with(&format!(
        "Authorization: Bearer {token}\r\nx-api-key: not-the-token\r\n"
    ));
    assert_eq!(code, 401);

    // None of it loaded a model.
    assert_eq!(loaded(&mut serve), Vec::<String>::new());
    assert_eq!(state(&ws, "smol-a"), "stopped");
    assert_eq!(state(&ws, "smol-b"), "stopped");
}

#[test]
fn the_model_a_body_names_is_found_whatever_its_spelling_and_only_it_loads() {
    let ws = gateway_workspace(TWO_MODELS);
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);

    // A multipart body naming the second model (by alias) loads it, not the default,
    // whatever the engine then says of a multipart chat request.
    let multipart = "--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nbee\r\n\
         --XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\nContent-Type: text/plain\r\n\r\nhello\r\n\
         --XyZ--\r\n";
    let (code, body) = post(
        port,
        &token,
        "/v1/chat/completions",
        "multipart/form-data; boundary=XyZ",
        multipart.as_bytes(),
    );
    assert!(![401, 404, 413].contains(&code), "{code}: {body}");
    let ready = serve.wait_for("local-ai.model.ready", START);
    assert_eq!(ready["data"]["model"], "smol-b", "{ready}");
    assert_eq!(loaded(&mut serve), ["smol-b"]);

    // JSON under any spelling of its type, or with a BOM, names the second model.
    let chat = json!({"model": "smol-b", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}).to_string();
    let with_bom = format!("\u{feff}{chat}");
    for (content_type, body) in [
        ("Application/JSON; charset=utf-8", chat.as_str()),
        ("text/plain", chat.as_str()),
        ("application/json", with_bom.as_str()),
        ("text/plain;charset=UTF-8", with_bom.as_str()),
    ] {
        let (code, reply) = post(
            port,
            &token,
            "/v1/chat/completions",
            content_type,
            body.as_bytes(),
        );
        assert_eq!(code, 200, "{content_type}: {reply}");
        let answer = parsed("/v1/chat/completions", &reply);
        assert_eq!(answer["model"], "smol-b", "{content_type}: {reply}");
        assert!(
            answer["choices"][0]["message"]["content"].is_string(),
            "{reply}"
        );
    }
    // The default model never loaded.
    assert_eq!(loaded(&mut serve), ["smol-b"], "{:#?}", serve.seen());
    assert_eq!(state(&ws, "smol-a"), "stopped");
    assert_eq!(state(&ws, "smol-b"), "ready");
}
