//! Issue 27: what a killed host leaves behind, proven with the real llama-server. An
//! engine a `command` wrapper forked (the llama-swap `cmd` style: `sh -c "llama-server
//! …; …"`) is not reached by the parent-death signal, which is armed on the wrapper
//! only; the next host stops it by the nonce it carries, whatever model id its record
//! names (here one no longer in `arcane.toml`), before it loads anything.

use std::time::Duration;

use serde_json::json;

use crate::command_kind::command_workspace;
use crate::front_door::{call, parsed, process_tree};
use crate::gateway::{ps, row, start};
use crate::serve::{alive, host_endpoint, signal, wait_gone};
use crate::support::{llama_server, run, wait_until, OrphanGuard};

/// A `[[model]]` whose command is a shell that forks llama-server (`{server}`; the
/// `; exit` keeps the shell from replacing itself with it) on its private socket.
fn wrapped(id: &str) -> String {
    format!(
        r#"
[[model]]
id = "{id}"
command = ["/bin/sh", "-c", "\"$0\" --host \"$1\" -m \"$2\" -c 512; exit $?", "{{server}}", "${{SOCKET}}", "${{MODEL}}"]
model = "smollm2-135m"
load = "on-start"
"#
    )
}

/// The llama-server processes among `pids`.
fn llama_servers(pids: &[u32]) -> Vec<u32> {
    pids.iter()
        .copied()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim().starts_with("llama-server"))
        })
        .collect()
}

#[test]
fn an_engine_a_wrapper_forked_is_stopped_by_the_next_host_even_for_a_removed_model() {
    let ws = command_workspace(&wrapped("old"));

    let mut first = start(&ws);
    first.wait_for("local-ai.model.ready", Duration::from_secs(180));
    let wrapper = row(&ps(&ws), "old")["pid"].as_u64().unwrap() as u32;
    let engines = llama_servers(&process_tree(wrapper));
    assert_eq!(engines.len(), 1, "the wrapper forked one llama-server");
    let engine = engines[0];
    let _orphan = OrphanGuard(engine);
    assert_ne!(engine, wrapper, "forked, not exec'd");

    signal(first.pid(), "KILL");
    first.wait_exit(Duration::from_secs(10));
    assert!(
        wait_gone(wrapper, Duration::from_secs(10)),
        "the parent-death signal ends the wrapper"
    );
    // The forked engine outlives its killed host (the fault this test is about): with
    // the wrapper gone, it still answers on its socket.
    let (status, _) = crate::support::http_unix_exchange(
        &ws.path().join(".arcane/run/old.sock"),
        "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(
        status, 200,
        "the forked engine answers after its host was killed"
    );
    assert!(alive(engine));

    // The model is renamed: no load of `old` will ever look at its record again.
    let renamed = wrapped("new").replace("{server}", &llama_server().display().to_string());
    std::fs::write(ws.path().join("arcane.toml"), renamed).unwrap();
    let mut second = start(&ws);
    let stopped = second.wait_for("process.orphan.stopped", Duration::from_secs(60));
    assert_eq!(stopped["data"]["id"], "old", "{stopped}");
    assert!(
        wait_gone(engine, Duration::from_secs(30)),
        "the next host stopped the orphan"
    );
    let record = ws.path().join(".arcane/engines/old.json");
    wait_until(Duration::from_secs(30), "its record to go", || {
        !record.exists()
    });
    second.wait_for("local-ai.model.ready", Duration::from_secs(180));
    let (port, token) = host_endpoint(&ws);
    let (code, body) = call(
        port,
        &token,
        "POST",
        "/v1/chat/completions",
        Some(
            json!({"model": "new", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4}),
        ),
    );
    assert_eq!(code, 200, "{body}");
    assert!(parsed("/v1/chat/completions", &body)["choices"][0].is_object());
    second.terminate();
}

/// Issue 27, item 5: an engine killed mid-stream ends the stream with an error in the
/// API's own shape, which each official client raises (OpenAI's `data: {"error"}`,
/// Anthropic's `event: error`, Ollama's `{"error"}` line), saying the engine stopped;
/// before, the stream was just cut, and the clients saw a network fault or nothing.
#[test]
fn a_stream_the_engine_dies_in_ends_with_an_error_each_official_client_raises() {
    let ws = crate::gateway::gateway_workspace(
        "[[model]]\nid = \"smol\"\nmodel = \"smollm2-135m\"\nargs = [\"-c\", \"2048\"]\nload = \"on-start\"\n",
    );
    let mut serve = start(&ws);
    serve.wait_for("local-ai.model.ready", Duration::from_secs(180));
    let (port, token) = host_endpoint(&ws);
    let python = crate::support::provisioned("ARCANE_CLIENTS_PYTHON");
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/clients/cut_stream.py");
    for api in ["openai", "anthropic", "ollama"] {
        // Loaded again after the last kill (a model that just crashed is loaded again
        // after a short backoff: `load` is refused until then).
        wait_until(Duration::from_secs(120), "the model to load again", || {
            run(ws.arcane().args(["load", "smol"])).status.success()
        });
        let mut client = std::process::Command::new(&python)
            .arg(&script)
            .env("ARCANE_ROOT_URL", format!("http://127.0.0.1:{port}"))
            .env("ARCANE_TOKEN", &token)
            .env("ARCANE_MODEL", "smol")
            .env("ARCANE_API", api)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = std::io::BufReader::new(client.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        assert_eq!(line.trim(), "first", "{api}: {line}");
        // The engine answering this stream (the gateway loads it again for the next).
        let engine = row(&ps(&ws), "smol")["pid"].as_u64().unwrap() as u32;
        signal(engine, "KILL");
        let status = crate::support::wait_for_exit(
            &mut client,
            Duration::from_secs(120),
            "the client of the cut stream",
        );
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
        assert!(status.success(), "{api}: the cut went unnoticed: {rest}");
        assert!(rest.starts_with("error "), "{api}: {rest}");
        assert!(
            rest.contains("stopped before its answer was complete"),
            "{api}: the client was not told the engine stopped: {rest}"
        );
    }
    serve.terminate();
}
