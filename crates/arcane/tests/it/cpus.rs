//! Issue 34, item 6: CPU placement. A model's `cpus` keeps its engine and every thread
//! of it to those cores (read back from `/proc`), llama.cpp's thread count follows, and
//! two loaded models whose sets overlap are allowed and reported.

use std::time::Duration;

use serde_json::{json, Value};

use crate::front_door::call;
use crate::gateway::{gateway_workspace, ps, row, start};
use crate::serve::{host_endpoint, signal};

/// `Cpus_allowed_list` of `/proc/PID/status` (or `/proc/PID/task/TID/status`).
fn cpus_of(status: &str) -> String {
    std::fs::read_to_string(status)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The CPUs this test may use, as numbers.
fn allowed() -> Vec<usize> {
    let list = cpus_of("/proc/self/status");
    list.split(',')
        .flat_map(|part| match part.split_once('-') {
            Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect::<Vec<usize>>(),
            None => vec![part.parse().unwrap()],
        })
        .collect()
}

fn chat(port: u16, token: &str, model: &str) {
    let body =
        json!({"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    let (status, reply) = call(port, token, "POST", "/v1/chat/completions", Some(body));
    assert_eq!(status, 200, "{reply}");
}

#[test]
fn cpus_keep_an_engine_and_its_threads_to_those_cores_and_overlaps_are_reported() {
    let cpus = allowed();
    // The last core alone, and every core: they overlap on the last one.
    let last = *cpus.last().unwrap();
    let toml = format!(
        r#"
[[model]]
id = "pinned"
model = "smollm2-135m"
args = ["-c", "512"]
cpus = "{last}"

[[model]]
id = "wide"
model = "smollm2-135m"
args = ["-c", "512", "--threads", "1"]
cpus = "{}"
"#,
        cpus.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    let ws = gateway_workspace(&toml);
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);
    chat(port, &token, "pinned");
    let rows = ps(&ws);
    let pinned = row(&rows, "pinned");
    assert_eq!(pinned["cpus"], json!(last.to_string()));
    let pid = pinned["pid"].as_u64().expect("a pid") as u32;
    assert_eq!(cpus_of(&format!("/proc/{pid}/status")), last.to_string());
    let threads: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|t| cpus_of(&format!("{}/status", t.unwrap().path().display())))
        .collect();
    assert!(threads.len() > 1, "llama-server runs threads");
    assert!(
        threads.iter().all(|t| *t == last.to_string()),
        "{threads:?}"
    );
    // llama.cpp's threads follow the set: one core, one thread.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let t = args.iter().position(|a| a == "-t").expect("-t given");
    assert_eq!(args[t + 1], "1", "{args:?}");
    assert_eq!(pinned["cpusSharedWith"], json!([]));

    chat(port, &token, "wide");
    let rows = ps(&ws);
    let wide = row(&rows, "wide");
    // `args` gave its thread count: kept.
    let pid = wide["pid"].as_u64().unwrap() as u32;
    let cmdline = String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap())
        .replace('\0', " ");
    assert!(
        cmdline.contains("--threads 1") && !cmdline.contains(" -t "),
        "{cmdline}"
    );
    assert_eq!(row(&rows, "pinned")["cpusSharedWith"], json!(["wide"]));
    assert_eq!(wide["cpusSharedWith"], json!(["pinned"]));
    signal(serve.pid(), "TERM");
    assert_eq!(serve.wait_exit(Duration::from_secs(60)), Some(0));
}

#[test]
fn cpus_mistakes_are_refused_naming_the_value() {
    let outside = allowed().last().unwrap() + 1000;
    for (cpus, needle) in [
        ("\"x\"".to_string(), "`x`"),
        ("\"3-1\"".to_string(), "`3-1`"),
        (format!("\"{outside}\""), "does not let Arcane use"),
    ] {
        let ws = gateway_workspace(&format!(
            "[[model]]\nid = \"m\"\nmodel = \"smollm2-135m\"\ncpus = {cpus}\n"
        ));
        let output = ws
            .arcane()
            .args(["--output", "json", "serve"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{cpus}");
        let error: Value = crate::support::json(&output)["error"].clone();
        assert_eq!(error["code"], "ARCANE_USAGE", "{error}");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(needle) && message.contains("`cpus` of model `m`"),
            "{message}"
        );
    }
    // An external server is not Arcane's to place.
    let ws =
        gateway_workspace("[[model]]\nid = \"m\"\nurl = \"http://127.0.0.1:9\"\ncpus = \"0\"\n");
    let output = ws
        .arcane()
        .args(["--output", "json", "serve"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let error = &crate::support::json(&output)["error"];
    assert!(
        error["message"]
            .as_str()
            .unwrap_or_default()
            .contains("external `url`"),
        "{error}"
    );
}
