//! A kind lives in one place: outside its own modules and crates (a path naming the
//! kind), at most three non-test Rust files name it, and `docs/engine-kinds.md` says
//! which and why. This walks the workspace's sources as they are, so a change that
//! names a kind somewhere new fails here, not in review.

use std::path::{Path, PathBuf};

/// Most files outside a kind's home that may name it.
const LIMIT: usize = 3;

/// Each kind: how code names it (lowercase, matched case-insensitively) and what a
/// path of its home contains.
const KINDS: &[(&str, &[&str], &[&str])] = &[
    (
        "llama.cpp",
        &[
            "llama.cpp",
            "llama-cpp",
            "llama_cpp",
            "llamacpp",
            "llama-server",
        ],
        &["llama"],
    ),
    ("ollama", &["ollama"], &["ollama"]),
    ("onnx", &["onnx"], &["onnx", "piper"]),
    ("whisper.cpp", &["whisper"], &["whisper"]),
    ("piper", &["piper"], &["piper"]),
    (
        "stable-diffusion.cpp",
        &[
            "stable-diffusion",
            "stable_diffusion",
            "stablediffusion",
            "sd.cpp",
            "sd-cpp",
            "sdcpp",
        ],
        &[
            "stable-diffusion",
            "stable_diffusion",
            "/sd.rs",
            "/image.rs",
        ],
    ),
];

fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !["tests", "benches", "examples", "target"].contains(&name.as_str()) {
                sources(&path, found);
            }
        } else if name.ends_with(".rs") && !name.ends_with("_test.rs") {
            found.push(path);
        }
    }
}

/// The code of a source file: before its first `#[cfg(test)]`, comments removed.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
        .to_lowercase()
}

/// Whether `code` names the kind: one of `names`, where a bare `onnx` counts only at
/// the start of a word (as in `crate::onnx`, not `arcane_onnx` or `libonnxruntime`).
fn names(code: &str, names: &[&str]) -> bool {
    names.iter().any(|name| {
        code.match_indices(name).any(|(at, _)| {
            *name != "onnx"
                || code[..at]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
        })
    })
}

#[test]
fn every_kind_is_named_by_at_most_three_files_outside_its_home() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    sources(&root.join("crates"), &mut files);
    assert!(files.len() > 100, "the sources were found: {}", files.len());
    let codes: Vec<(String, String)> = files
        .iter()
        .map(|p| {
            let relative = p.strip_prefix(&root).unwrap_or(p);
            (relative.to_string_lossy().to_lowercase(), code(p))
        })
        .collect();
    let mut over = Vec::new();
    for (kind, spelled, home) in KINDS {
        let outside: Vec<&str> = codes
            .iter()
            .filter(|(path, _)| !home.iter().any(|h| path.contains(h)))
            .filter(|(_, code)| names(code, spelled))
            .map(|(path, _)| path.as_str())
            .collect();
        if outside.len() > LIMIT {
            over.push(format!("{kind}: {} files: {outside:?}", outside.len()));
        }
    }
    assert!(
        over.is_empty(),
        "kinds named outside their homes (see docs/engine-kinds.md):\n{}",
        over.join("\n")
    );
}

#[test]
fn the_rule_finds_a_kind_where_code_names_it_and_not_in_comments_or_other_words() {
    assert!(names("use crate::onnx::graph;", &["onnx"]));
    assert!(!names("use arcane_onnx::model;", &["onnx"]));
    assert!(!names("let file = \"libonnxruntime.so\";", &["onnx"]));
    assert!(names("engine::llamacpp", &["llamacpp"]));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.rs");
    std::fs::write(
        &file,
        "// whisper in a comment\nfn a() {}\n#[cfg(test)]\nmod t { whisper }",
    )
    .unwrap();
    assert!(!names(&code(&file), &["whisper"]));
}
