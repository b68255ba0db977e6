//! `docs/clients.md` as a user runs it: every block marked to run (```` ```python run ````,
//! ```` ```js run ````) is run with the official client against a real host, with the
//! variables the document's preamble exports, and must answer.

use std::path::PathBuf;
use std::process::Command;

use crate::gateway::{gateway_workspace, start};
use crate::serve::host_endpoint;

/// The document's blocks marked to run: `(language, code)`, in order.
fn runnable_blocks(text: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in text.lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                let mut words = info.split_whitespace();
                let language = words.next().unwrap_or_default().to_string();
                let runs = words.any(|w| w == "run");
                open = Some((if runs { language } else { String::new() }, String::new()));
            }
            (Some(_), Some(_)) => {
                let (language, code) = open.take().unwrap();
                if !language.is_empty() {
                    blocks.push((language, code));
                }
            }
            (Some((_, code)), None) => {
                code.push_str(line);
                code.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "an unclosed block in docs/clients.md");
    blocks
}

#[test]
fn every_snippet_of_the_clients_document_answers_through_the_front_door() {
    let python = crate::support::provisioned("ARCANE_CLIENTS_PYTHON");
    let node_modules = crate::support::provisioned("ARCANE_NODE_CLIENTS");
    let doc = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/clients.md");
    let blocks = runnable_blocks(&std::fs::read_to_string(&doc).unwrap());
    let languages: Vec<&str> = blocks.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(
        languages,
        ["python", "js", "python", "python", "js", "python"],
        "the blocks marked to run"
    );
    let ws = gateway_workspace("[[model]]\nid = \"smol\"\nmodel = \"smollm2-135m\"\n");
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);
    let url = format!("http://127.0.0.1:{port}");
    let scripts = tempfile::tempdir().unwrap();
    for (index, (language, code)) in blocks.iter().enumerate() {
        let (program, file) = match language.as_str() {
            "python" => (python.clone().into_os_string(), "snippet.py"),
            _ => ("node".into(), "snippet.cjs"),
        };
        let path = scripts.path().join(format!("{index}-{file}"));
        std::fs::write(&path, code).unwrap();
        // Exactly what the document's preamble exports (beside `PATH` and `HOME`): no
        // setting of this machine's helps a snippet along.
        let mut command = Command::new(program);
        command.env_clear();
        for kept in ["PATH", "HOME"] {
            if let Some(value) = std::env::var_os(kept) {
                command.env(kept, value);
            }
        }
        let output = command
            .arg(&path)
            .env("ARCANE_URL", &url)
            .env("ARCANE_TOKEN", &token)
            .env("ARCANE_MODEL", "smol")
            .env("OPENAI_BASE_URL", format!("{url}/v1"))
            .env("OPENAI_API_KEY", &token)
            .env("ANTHROPIC_BASE_URL", &url)
            .env("ANTHROPIC_API_KEY", &token)
            .env("OLLAMA_HOST", &url)
            .env("OLLAMA_API_KEY", &token)
            .env("NODE_PATH", &node_modules)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && !said.trim().is_empty(),
            "block {index} ({language}) of docs/clients.md:\n{code}\nstdout: {said}\nstderr: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    serve.terminate();
}
