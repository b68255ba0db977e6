//! `docs/clients.md` as a user runs it: every block marked to run (```` ```python run ````,
//! ```` ```js run ````) is run with the official client against a real host, with the
//! variables the document's preamble exports, and must answer. A block marked
//! `frameworks` too (```` ```python run frameworks ````) runs with the frameworks
//! (LangChain, LlamaIndex, the Vercel AI SDK) `scripts/provision.sh` installs in
//! environments of their own.

use std::path::PathBuf;
use std::process::Command;

use crate::gateway::{gateway_workspace, start};
use crate::serve::host_endpoint;

/// One block marked to run.
struct Block {
    /// `python` or `js`.
    language: String,
    /// Whether it needs the frameworks' environments.
    frameworks: bool,
    code: String,
}

/// The document's blocks marked to run, in order.
fn runnable_blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<(Option<Block>, String)> = None;
    for line in text.lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                let words: Vec<&str> = info.split_whitespace().collect();
                let block = words.contains(&"run").then(|| Block {
                    language: words.first().copied().unwrap_or_default().to_string(),
                    frameworks: words.contains(&"frameworks"),
                    code: String::new(),
                });
                open = Some((block, String::new()));
            }
            (Some(_), Some(_)) => {
                let (block, code) = open.take().unwrap();
                if let Some(block) = block {
                    blocks.push(Block { code, ..block });
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
    let frameworks_python = crate::support::provisioned("ARCANE_FRAMEWORKS_PYTHON");
    let frameworks_modules = crate::support::provisioned("ARCANE_NODE_FRAMEWORKS");
    let doc = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/clients.md");
    let blocks = runnable_blocks(&std::fs::read_to_string(&doc).unwrap());
    let languages: Vec<String> = blocks
        .iter()
        .map(|b| format!("{}{}", b.language, if b.frameworks { "+" } else { "" }))
        .collect();
    assert_eq!(
        languages,
        [
            "python", "js", "python", "python", "js", "python", "python+", "python+", "python+",
            "js+", "js+"
        ],
        "the blocks marked to run (+: with the frameworks)"
    );
    let ws = gateway_workspace("[[model]]\nid = \"smol\"\nmodel = \"smollm2-135m\"\n");
    let mut serve = start(&ws);
    let (port, token) = host_endpoint(&ws);
    let url = format!("http://127.0.0.1:{port}");
    let scripts = tempfile::tempdir().unwrap();
    for (index, block) in blocks.iter().enumerate() {
        let (language, code) = (&block.language, &block.code);
        let (python, node_modules) = match block.frameworks {
            true => (&frameworks_python, &frameworks_modules),
            false => (&python, &node_modules),
        };
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
            .env("NODE_PATH", node_modules)
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
