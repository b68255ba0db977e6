//! `add_runtime`: the real llama-server, executables that do not run, ids, defaults.

use arcane_devices::Backend;
use arcane_registry::{AddRuntime, Engine, Error, Registry};
use arcane_report::{codes, CancelToken, Collector, Diagnostic, NullSink};

use crate::support::*;

#[test]
fn the_real_llama_server_is_added_with_version_backend_and_libraries() {
    let server = llama_server();
    let dir = tempdir();
    let registry = Registry::new(dir.path());
    let events = Collector::default();
    let runtime = registry
        .add_runtime(
            &AddRuntime::new(Engine::LlamaCpp, &server).backend(Backend::Cpu),
            &events,
            &CancelToken::new(),
        )
        .unwrap();
    assert_eq!(runtime.id, "llama.cpp");
    assert_eq!(runtime.engine, Engine::LlamaCpp);
    assert_eq!(runtime.backend, Backend::Cpu);
    assert!(!runtime.installed);
    assert_eq!(runtime.executable, std::fs::canonicalize(&server).unwrap());
    // The version is what the binary itself prints.
    let printed = std::process::Command::new(&server)
        .arg("--version")
        .output()
        .unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&printed.stdout),
        String::from_utf8_lossy(&printed.stderr)
    );
    assert!(
        printed.contains(runtime.build_info.as_deref().unwrap()),
        "{printed}"
    );
    assert!(
        !runtime.version.is_empty() && printed.contains(runtime.version.trim_start_matches('b'))
    );
    // Its shared libraries sit next to it.
    let server_dir = std::fs::canonicalize(server.parent().unwrap()).unwrap();
    assert_eq!(runtime.library_dirs, vec![server_dir]);
    assert_eq!(registry.runtimes().unwrap(), vec![runtime.clone()]);
    assert_eq!(registry.default_runtime(Engine::LlamaCpp).unwrap(), runtime);
    let locked = events
        .events()
        .into_iter()
        .find(|e| e.kind == "workspace.operation.locked")
        .unwrap();
    assert_eq!(locked.data["operation"], "runtime-add");
}

#[test]
fn the_backend_is_detected_from_the_libraries_when_not_given() {
    let dir = tempdir();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    write_executable(&bin.join("llama-server"), &fake_llama_server_script(12));
    std::fs::write(bin.join("libggml-cuda.so"), "x").unwrap();
    let registry = Registry::new(&dir.path().join("ws"));
    let runtime = registry
        .add_runtime(
            &AddRuntime::new(Engine::LlamaCpp, bin.join("llama-server")),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
    assert_eq!(runtime.backend, Backend::Cuda);
    assert_eq!(runtime.version, "b12");
}

#[test]
fn executables_that_do_not_run_are_refused_with_their_path() {
    let dir = tempdir();
    let registry = Registry::new(&dir.path().join("ws"));
    let failing = dir.path().join("failing");
    write_executable(
        &failing,
        "#!/bin/sh\necho 'cannot open shared object file' >&2\nexit 127\n",
    );
    let silent = dir.path().join("silent");
    write_executable(&silent, "#!/bin/sh\nexit 0\n");
    let not_executable = dir.path().join("plain");
    std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
    let missing = dir.path().join("missing");
    for path in [&failing, &silent, &not_executable, &missing] {
        let error = registry
            .add_runtime(
                &AddRuntime::new(Engine::LlamaCpp, path),
                &NullSink,
                &CancelToken::new(),
            )
            .unwrap_err();
        assert_eq!(
            error.code(),
            codes::LOCAL_AI_RUNTIME_INVALID,
            "{path:?}: {error}"
        );
        assert!(
            error.details()["executable"]
                .as_str()
                .unwrap()
                .ends_with(path.file_name().unwrap().to_str().unwrap()),
            "{error:?}"
        );
    }
    // The reason a person needs is in the message itself.
    let error = registry
        .add_runtime(
            &AddRuntime::new(Engine::LlamaCpp, &failing),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap_err();
    assert!(
        error
            .to_string()
            .ends_with(": cannot open shared object file"),
        "{error}"
    );
    assert!(registry.runtimes().unwrap().is_empty());
}

#[test]
fn an_executable_that_hangs_times_out() {
    let dir = tempdir();
    let hangs = dir.path().join("hangs");
    write_executable(&hangs, "#!/bin/sh\nexec sleep 30\n");
    let mut options = AddRuntime::new(Engine::LlamaCpp, &hangs);
    options.version_timeout = std::time::Duration::from_millis(300);
    let error = Registry::new(dir.path())
        .add_runtime(&options, &NullSink, &CancelToken::new())
        .unwrap_err();
    assert!(
        matches!(error, Error::ExecutableTimedOut { .. }),
        "{error:?}"
    );
}

/// Whether `pid` is gone (or a zombie nobody has reaped yet).
fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

#[test]
fn a_version_check_that_times_out_stops_everything_the_executable_started() {
    let dir = tempdir();
    let pidfile = dir.path().join("background.pid");
    let hangs = dir.path().join("hangs");
    // The executable leaves a background process behind and waits for it: stopping only
    // the executable itself would leave that process running.
    write_executable(
        &hangs,
        &format!(
            "#!/bin/sh\nsleep 30 &\necho $! > '{}'\nwait\n",
            pidfile.display()
        ),
    );
    let mut options = AddRuntime::new(Engine::LlamaCpp, &hangs);
    options.version_timeout = std::time::Duration::from_secs(1);
    let error = Registry::new(&dir.path().join("ws"))
        .add_runtime(&options, &NullSink, &CancelToken::new())
        .unwrap_err();
    assert!(
        matches!(error, Error::ExecutableTimedOut { .. }),
        "{error:?}"
    );
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !process_gone(pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        process_gone(pid),
        "the background process {pid} outlived the version check"
    );
}

#[test]
fn the_version_check_puts_the_runtime_libraries_first_and_keeps_the_inherited_path() {
    let dir = tempdir();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::write(bin.join("libggml.so"), b"").unwrap();
    let seen = dir.path().join("seen");
    let server = bin.join("llama-server");
    write_executable(
        &server,
        &format!(
            "#!/bin/sh\nprintf '%s' \"$LD_LIBRARY_PATH\" > '{}'\necho 'version: 4500 (deadbeef)'\n",
            seen.display()
        ),
    );
    let bin = std::fs::canonicalize(&bin).unwrap();
    let options = AddRuntime::new(Engine::LlamaCpp, &server)
        .inherited_loader_path(Some(format!("/opt/cuda/lib::{}", bin.display()).into()));
    let runtime = Registry::new(&dir.path().join("ws"))
        .add_runtime(&options, &NullSink, &CancelToken::new())
        .unwrap();
    assert_eq!(runtime.library_dirs, vec![bin.clone()]);
    // The runtime's own directory first, then the inherited entries, each once, and no
    // empty (current-directory) entry.
    assert_eq!(
        std::fs::read_to_string(&seen).unwrap(),
        format!("{}:/opt/cuda/lib", bin.display())
    );
}

#[test]
fn ollama_versions_are_read_from_either_form() {
    let dir = tempdir();
    let registry = Registry::new(&dir.path().join("ws"));
    let ollama = dir.path().join("ollama");
    write_executable(&ollama, "#!/bin/sh\necho 'Warning: could not connect to a running Ollama instance'\necho 'Warning: client version is 0.5.7'\n");
    let runtime = registry
        .add_runtime(
            &AddRuntime::new(Engine::Ollama, &ollama),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
    assert_eq!(
        (
            runtime.id.as_str(),
            runtime.version.as_str(),
            runtime.backend
        ),
        ("ollama", "0.5.7", Backend::Auto)
    );
    // A llama-server is not an Ollama.
    let llama = dir.path().join("llama-server");
    write_executable(&llama, &fake_llama_server_script(1));
    let error = registry
        .add_runtime(
            &AddRuntime::new(Engine::Ollama, &llama).id("ollama-2"),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap_err();
    assert!(matches!(error, Error::VersionUnknown { .. }), "{error:?}");
}

#[test]
fn several_runtimes_need_ids_and_the_default_follows_the_rules() {
    let dir = tempdir();
    let registry = Registry::new(&dir.path().join("ws"));
    let a = dir.path().join("a");
    write_executable(&a, &fake_llama_server_script(1));
    let b = dir.path().join("b");
    write_executable(&b, &fake_llama_server_script(2));
    assert!(matches!(
        registry.default_runtime(Engine::LlamaCpp),
        Err(Error::NoRuntimeForEngine { .. })
    ));
    registry
        .add_runtime(
            &AddRuntime::new(Engine::LlamaCpp, &a).id("old"),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
    // The only one of its engine is the default, whatever its id.
    assert_eq!(
        registry.default_runtime(Engine::LlamaCpp).unwrap().id,
        "old"
    );
    registry
        .add_runtime(
            &AddRuntime::new(Engine::LlamaCpp, &b).id("new"),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
    let error = registry.default_runtime(Engine::LlamaCpp).unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_USAGE);
    assert_eq!(
        error.details()["candidates"],
        serde_json::json!(["old", "new"])
    );
    // One named after the engine wins.
    registry
        .add_runtime(
            &AddRuntime::new(Engine::LlamaCpp, &b),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
    assert_eq!(
        registry.default_runtime(Engine::LlamaCpp).unwrap().id,
        "llama.cpp"
    );
    // Taken ids and bad ids are refused.
    let error = registry
        .add_runtime(
            &AddRuntime::new(Engine::LlamaCpp, &a),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_ALREADY_EXISTS);
    let error = registry
        .add_runtime(
            &AddRuntime::new(Engine::LlamaCpp, &a).id("Bad Id"),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_USAGE);
    assert_eq!(error.details()["id"], "Bad Id");
    // Removing an external runtime leaves its executable alone.
    registry
        .remove_runtime("old", &NullSink, &CancelToken::new())
        .unwrap();
    assert!(a.is_file());
    let ids: Vec<String> = registry
        .runtimes()
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, ["new", "llama.cpp"]);
}

#[test]
fn the_registry_file_stores_workspace_paths_relative() {
    let dir = tempdir();
    let source = dir.path().join("tiny.gguf");
    write_gguf(&source, "Tiny");
    let workspace = dir.path().join("ws");
    arcane_registry::Registry::new(&workspace)
        .add_model(
            &arcane_registry::AddModel::file("tiny", &source),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
    let text = std::fs::read_to_string(workspace.join(".arcane/registry.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["version"], 1);
    assert_eq!(json["models"][0]["path"], ".arcane/models/tiny/tiny.gguf");
    // A moved workspace still resolves its models.
    let moved = dir.path().join("moved");
    std::fs::rename(&workspace, &moved).unwrap();
    let model = Registry::new(&moved).model("tiny").unwrap();
    assert_eq!(model.path, moved.join(".arcane/models/tiny/tiny.gguf"));
    assert!(model.path.is_file());
}
