//! Issue 34, item 4: loads that know whether they fit. A model's memory is estimated
//! before it loads (for llama.cpp from its GGUF header and its `-c`), compared with
//! what the real llama-server holds once it runs, and a dry run of a load says what it
//! would evict, or why it cannot load, and changes nothing.

use std::time::Duration;

use serde_json::{json, Value};

use crate::gateway::{gateway_workspace, ps, row, start};
use crate::serve::signal;
use crate::support::{json as json_of, run, smollm2, TestWorkspace};

/// `arcane load MODEL --dry-run --output json`.
fn dry_run(ws: &TestWorkspace, model: &str) -> Value {
    let out = run(ws
        .arcane()
        .args(["--output", "json", "load", model, "--dry-run"]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json_of(&out)
}

#[test]
fn the_estimate_of_smollm2_is_within_a_quarter_of_what_llama_server_holds() {
    let ws = gateway_workspace(
        r#"
[[model]]
id = "smol-2k"
model = "smollm2-135m"
args = ["-c", "2048"]

[[model]]
id = "smol-16k"
model = "smollm2-135m"
args = ["-c", "16384"]
"#,
    );
    let mut serve = start(&ws);
    for (id, context) in [("smol-2k", 2048), ("smol-16k", 16384)] {
        let out = run(ws.arcane().args(["load", id]));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ready = serve.wait_line("its ready event", Duration::from_secs(120), |l| {
            l["type"] == "local-ai.model.ready" && l["data"]["model"] == id
        });
        let rows = ps(&ws);
        let model = row(&rows, id);
        let estimate = model["memoryNeed"].as_u64().unwrap();
        let resident = model["residentBytes"].as_u64().unwrap();
        let ratio = estimate as f64 / resident as f64;
        assert!(
            (0.75..=1.25).contains(&ratio),
            "{id}: estimate {estimate}, resident {resident} ({ratio:.2})"
        );
        // The parts, and the context the cache is for.
        let parts = &model["memoryEstimate"];
        assert_eq!(parts["context"], context);
        assert_eq!(parts["bytes"], estimate);
        assert_eq!(
            parts["weights"],
            std::fs::metadata(smollm2()).unwrap().len()
        );
        // The ready event says both.
        assert_eq!(ready["data"]["memoryNeed"], estimate);
        assert!(ready["data"]["residentBytes"]
            .as_u64()
            .is_some_and(|r| r > 0));
    }
    signal(serve.pid(), "TERM");
    assert_eq!(serve.wait_exit(Duration::from_secs(60)), Some(0));
}

#[test]
fn a_dry_run_says_what_a_load_would_evict_or_why_it_cannot_and_changes_nothing() {
    let size = std::fs::metadata(smollm2()).unwrap().len();
    // Each needs about 1.6 times its file: one fits, two do not.
    let ws = gateway_workspace(&format!(
        r#"
[[model]]
id = "a"
model = "smollm2-135m"
args = ["-c", "512"]

[[model]]
id = "b"
model = "smollm2-135m"
args = ["-c", "512"]

[[model]]
id = "huge"
model = "smollm2-135m"
args = ["-c", "1000000"]

[devices.cpu]
memory = {}
"#,
        size * 5 / 2
    ));
    let mut serve = start(&ws);
    let plan = dry_run(&ws, "a");
    assert_eq!(plan["outcome"], "loads", "{plan}");
    assert_eq!(plan["evict"], json!([]));
    assert!(run(ws.arcane().args(["load", "a"])).status.success());

    let plan = dry_run(&ws, "b");
    assert_eq!(plan["outcome"], "loads", "{plan}");
    assert_eq!(plan["evict"][0]["model"], "a", "{plan}");
    assert_eq!(plan["evict"][0]["reason"], "evicted");
    assert_eq!(plan["deviceLimits"]["loaded"], json!(["a"]));
    assert_eq!(plan["deviceLimits"]["memory"], size * 5 / 2);
    let human = run(ws.arcane().args(["load", "b", "--dry-run"]));
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("would load after evicting `a`") && human.contains("key/value cache"),
        "{human}"
    );
    // Nothing changed.
    let rows = ps(&ws);
    assert_eq!(row(&rows, "a")["state"], "ready");
    assert_eq!(row(&rows, "b")["state"], "stopped");
    assert_eq!(serve.evictions(), 0);

    // A context far larger than the budget: refused before anything starts, naming
    // the bytes it needs and the budget.
    let plan = dry_run(&ws, "huge");
    assert_eq!(plan["outcome"], "refused", "{plan}");
    assert_eq!(plan["error"]["code"], "LOCAL_AI_MODEL_TOO_LARGE");
    assert_eq!(plan["error"]["details"]["budget"], size * 5 / 2);
    assert!(plan["error"]["details"]["need"].as_u64().unwrap() > size * 5 / 2);
    let out = run(ws.arcane().args(["--output", "json", "load", "huge"]));
    assert!(!out.status.success());
    assert_eq!(json_of(&out)["error"]["code"], "LOCAL_AI_MODEL_TOO_LARGE");
    assert_eq!(row(&ps(&ws), "huge")["state"], "stopped");
    signal(serve.pid(), "TERM");
    assert_eq!(serve.wait_exit(Duration::from_secs(60)), Some(0));
}

#[test]
fn a_dry_run_names_the_pins_that_hold_a_full_device() {
    let size = std::fs::metadata(smollm2()).unwrap().len();
    let ws = gateway_workspace(&format!(
        r#"
[[model]]
id = "kept"
model = "smollm2-135m"
args = ["-c", "512"]
load = "on-start"

[[model]]
id = "other"
model = "smollm2-135m"
args = ["-c", "512"]

[devices.cpu]
memory = {}
"#,
        size * 5 / 2
    ));
    let mut serve = start(&ws);
    serve.wait_for("local-ai.model.ready", Duration::from_secs(120));
    let plan = dry_run(&ws, "other");
    assert_eq!(plan["outcome"], "refused", "{plan}");
    let error = &plan["error"];
    assert_eq!(error["code"], "LOCAL_AI_DEVICE_PINNED");
    assert_eq!(error["details"]["pinned"][0]["model"], "kept");
    let need = error["details"]["need"].as_u64().unwrap();
    let available = error["details"]["available"].as_u64().unwrap();
    assert!(need > available, "{error}");
    signal(serve.pid(), "TERM");
    assert_eq!(serve.wait_exit(Duration::from_secs(60)), Some(0));
}
