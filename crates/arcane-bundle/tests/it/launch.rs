//! Launch preparation on a real built bundle: the context resolves to paths inside the
//! bundle wherever it lives (also after a move), state goes to the state root only,
//! app entries stay inside `app/`.

use arcane_bundle::{
    build, prepare_state_root, resolve_app_entry, resolve_context, verify_strict, HostDirs,
    VerifyOptions,
};
use arcane_report::{codes, CancelToken, Diagnostic, NullSink};

use crate::build::Setup;

#[test]
fn the_context_follows_a_moved_bundle_and_nothing_is_written_inside_it() {
    let setup = Setup::new();
    let out = setup.dir.path().join("out");
    build(&setup.request(&out), &NullSink, &CancelToken::new()).expect("build");
    let state_root = setup.dir.path().join("state");
    let dirs = HostDirs::new(Some(setup.dir.path().join("home")), None, None);

    for location in ["first", "second place"] {
        let parent = setup.dir.path().join(location);
        std::fs::create_dir(&parent).unwrap();
        let bundle = parent.join("bundle");
        let from = if location == "first" {
            out.clone()
        } else {
            setup.dir.path().join("first/bundle")
        };
        std::fs::rename(&from, &bundle).unwrap();

        let verified = verify_strict(
            &bundle,
            &VerifyOptions::default(),
            &NullSink,
            &CancelToken::new(),
        )
        .expect("verify");
        let context = resolve_context(verified, Some(&state_root), None, &dirs).expect("context");
        let runtime = context.runtime.clone().expect("a runtime");
        let model = context.model.clone().expect("a model");
        let root = bundle.canonicalize().unwrap();
        assert!(
            runtime.executable.starts_with(&root),
            "{}",
            runtime.executable.display()
        );
        assert!(model.path.starts_with(&root), "{}", model.path.display());
        assert_eq!(context.execution_target, None);
        assert_eq!(
            context.endpoint_file(),
            state_root.join(".arcane/core.json")
        );

        assert_eq!(
            runtime.library_dirs,
            vec![runtime.executable.parent().unwrap().to_path_buf()]
        );
        prepare_state_root(&context).expect("prepare");
        assert!(state_root.is_dir());
        prepare_state_root(&context).expect("prepare again");

        let report = arcane_bundle::verify(
            &bundle,
            &VerifyOptions::default(),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
        assert!(
            report.is_clean(),
            "preparing wrote inside the bundle: {:#?}",
            report.failures
        );
    }

    // Without `--state-root`, the state goes to the per-OS default for the app id.
    let verified = verify_strict(
        &setup.dir.path().join("second place/bundle"),
        &VerifyOptions::default(),
        &NullSink,
        &CancelToken::new(),
    )
    .unwrap();
    let context = resolve_context(verified.clone(), None, None, &dirs).unwrap();
    assert_eq!(
        context.state_root,
        setup.dir.path().join("home/.local/share/Arcane/demo")
    );
    // A state root inside the bundle is refused.
    let inside = verified.root.join("app/state");
    assert_eq!(
        resolve_context(verified.clone(), Some(&inside), None, &dirs)
            .unwrap_err()
            .code(),
        codes::ARCANE_USAGE
    );
    // Issue 14, item 2: containment is by identity, not spelling. A launch file's
    // `../<bundle>/app` and `../<bundle>/.`, and a `--state-root` that is a link to
    // the bundle, all put the state inside it: refused.
    let elsewhere = setup.dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let name = verified
        .root
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let sibling = verified.root.parent().unwrap().join("conf");
    std::fs::create_dir_all(&sibling).unwrap();
    for state in [format!("../{name}/app"), format!("../{name}/.")] {
        let file = sibling.join("launch.json");
        std::fs::write(&file, serde_json::json!({ "stateRoot": state }).to_string()).unwrap();
        assert_eq!(
            resolve_context(verified.clone(), None, Some(&file), &dirs)
                .unwrap_err()
                .code(),
            codes::ARCANE_USAGE,
            "{state}"
        );
    }
    let link = elsewhere.join("state-link");
    std::os::unix::fs::symlink(&verified.root, &link).unwrap();
    assert_eq!(
        resolve_context(verified.clone(), Some(&link), None, &dirs)
            .unwrap_err()
            .code(),
        codes::ARCANE_USAGE
    );
    assert!(resolve_context(
        verified.clone(),
        Some(&elsewhere.join("state")),
        None,
        &dirs
    )
    .is_ok());

    // App entries: a listed executable resolves; escapes and non-executables do not.
    let program = resolve_app_entry(&verified, "tools/hello").unwrap();
    assert_eq!(program, verified.root.join("app/tools/hello"));
    for (entry, code) in [
        ("../bin/arcane", codes::BUNDLE_PATH_INVALID),
        ("/bin/sh", codes::BUNDLE_PATH_INVALID),
        ("tools/../../bin/arcane", codes::BUNDLE_PATH_INVALID),
        ("index.html", codes::ARCANE_USAGE),
        ("nope", codes::ARCANE_USAGE),
        ("", codes::ARCANE_USAGE),
    ] {
        assert_eq!(
            resolve_app_entry(&verified, entry).unwrap_err().code(),
            code,
            "{entry:?}"
        );
    }
}
