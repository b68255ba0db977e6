//! `verify`: a clean bundle passes anywhere; each kind of tampering fails with its own
//! code naming the path, and every failure is reported, not just the first.

use std::os::unix::fs::PermissionsExt;

use arcane_bundle::manifest::Target;
use arcane_bundle::{verify, verify_strict, Error, VerifyOptions, VerifyReport};
use arcane_report::{codes, CancelToken, Collector, Diagnostic, NullSink};

use crate::fixture::{Fixture, MODEL, RUNTIME_EXE, RUNTIME_LIB, START};

fn run(fixture: &Fixture) -> VerifyReport {
    verify(
        &fixture.root(),
        &VerifyOptions::default(),
        &NullSink,
        &CancelToken::new(),
    )
    .expect("verify runs")
}

/// The (code, path) pairs of a report.
fn found(report: &VerifyReport) -> Vec<(&'static str, Option<String>)> {
    report
        .failures
        .iter()
        .map(|f| (f.code, f.path.clone()))
        .collect()
}

fn assert_only(report: &VerifyReport, code: &str, path: &str) {
    let found = found(report);
    assert_eq!(
        found,
        vec![(code_static(code), Some(path.to_string()))],
        "{:#?}",
        report.failures
    );
}

fn code_static(code: &str) -> &'static str {
    codes::ALL
        .iter()
        .find(|c| **c == code)
        .copied()
        .expect("known code")
}

fn flip_byte(path: &std::path::Path, offset: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_clean_bundle_verifies_and_hashes_every_file_with_progress() {
    let fixture = Fixture::new();
    let events = Collector::default();
    let report = verify(
        &fixture.root(),
        &VerifyOptions::default(),
        &events,
        &CancelToken::new(),
    )
    .unwrap();
    assert!(report.is_clean(), "{:#?}", report.failures);
    assert_eq!(report.files_hashed, fixture.manifest.files.len() as u64);
    assert_eq!(
        report.bytes_hashed,
        fixture.manifest.files.iter().map(|f| f.size).sum::<u64>()
    );
    let types = events.types();
    assert_eq!(
        types.first().map(String::as_str),
        Some("bundle.verify.started")
    );
    assert_eq!(
        types.last().map(String::as_str),
        Some("bundle.verify.finished")
    );
    assert!(types.iter().any(|t| t == "bundle.verify.progress"));
    let verified = verify_strict(
        &fixture.root(),
        &VerifyOptions::default(),
        &NullSink,
        &CancelToken::new(),
    )
    .unwrap();
    assert_eq!(
        verified.resolve(MODEL),
        fixture.path(MODEL).canonicalize().unwrap()
    );
}

#[test]
fn a_moved_renamed_read_only_bundle_still_verifies() {
    let fixture = Fixture::new();
    let elsewhere = tempfile::tempdir().unwrap();
    let moved = elsewhere.path().join("renamed bundle");
    std::fs::rename(fixture.root(), &moved).unwrap();
    make_read_only(&moved);
    let report = verify(
        &moved,
        &VerifyOptions::default(),
        &NullSink,
        &CancelToken::new(),
    )
    .unwrap();
    make_writable(&moved);
    assert!(report.is_clean(), "{:#?}", report.failures);
    assert_eq!(report.root, moved.canonicalize().unwrap());
}

fn make_read_only(dir: &std::path::Path) {
    for entry in walk(dir) {
        let mode = std::fs::symlink_metadata(&entry)
            .unwrap()
            .permissions()
            .mode();
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(mode & !0o222)).unwrap();
    }
}

fn make_writable(dir: &std::path::Path) {
    for entry in walk(dir) {
        let mode = std::fs::symlink_metadata(&entry)
            .unwrap()
            .permissions()
            .mode();
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(mode | 0o200)).unwrap();
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry.file_type().unwrap().is_dir() {
            out.extend(walk(&entry.path()));
        } else {
            out.push(entry.path());
        }
    }
    out
}

#[test]
fn one_flipped_byte_in_the_runtime_is_a_hash_mismatch_naming_it() {
    let fixture = Fixture::new();
    flip_byte(&fixture.path(RUNTIME_EXE), 123_456);
    let report = run(&fixture);
    assert_only(&report, codes::BUNDLE_HASH_MISMATCH, RUNTIME_EXE);
    let expected = &fixture.manifest.file(RUNTIME_EXE).unwrap().sha256;
    assert_eq!(report.failures[0].details["expected"], *expected);
    assert_ne!(report.failures[0].details["actual"], *expected);
}

#[test]
fn one_flipped_byte_in_the_model_is_a_hash_mismatch_even_with_its_mtime_restored() {
    let fixture = Fixture::new();
    let path = fixture.path(MODEL);
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    flip_byte(&path, 0);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    assert_only(&run(&fixture), codes::BUNDLE_HASH_MISMATCH, MODEL);
}

#[test]
fn a_truncated_file_is_a_size_mismatch() {
    let fixture = Fixture::new();
    let path = fixture.path(RUNTIME_LIB);
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    let report = run(&fixture);
    assert_only(&report, codes::BUNDLE_SIZE_MISMATCH, RUNTIME_LIB);
    assert_eq!(report.failures[0].details["actual"], len - 1);
    // Size is decided before hashing: the truncated file is not hashed.
    assert_eq!(report.files_hashed, fixture.manifest.files.len() as u64 - 1);
}

#[test]
fn a_deleted_file_is_missing() {
    let fixture = Fixture::new();
    std::fs::remove_file(fixture.path(START)).unwrap();
    assert_only(&run(&fixture), codes::BUNDLE_MISSING, START);
}

#[test]
fn an_added_file_and_an_added_directory_are_unlisted() {
    let fixture = Fixture::new();
    std::fs::write(fixture.path("app/evil.js"), b"alert(1)").unwrap();
    assert_only(&run(&fixture), codes::BUNDLE_UNLISTED, "app/evil.js");
    std::fs::remove_file(fixture.path("app/evil.js")).unwrap();
    std::fs::create_dir(fixture.path("extra")).unwrap();
    assert_only(&run(&fixture), codes::BUNDLE_UNLISTED, "extra");
}

#[test]
fn a_symlink_swapped_in_is_refused_even_when_it_points_inside() {
    let fixture = Fixture::new();
    std::fs::remove_file(fixture.path(RUNTIME_LIB)).unwrap();
    std::os::unix::fs::symlink("llama-server", fixture.path(RUNTIME_LIB)).unwrap();
    assert_only(&run(&fixture), codes::BUNDLE_SYMLINK, RUNTIME_LIB);

    let fixture = Fixture::new();
    std::fs::remove_file(fixture.path(MODEL)).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", fixture.path(MODEL)).unwrap();
    let report = run(&fixture);
    assert_only(&report, codes::BUNDLE_SYMLINK, MODEL);
    assert_eq!(report.failures[0].details["target"], "/etc/hostname");
}

#[test]
fn a_symlinked_directory_is_not_followed() {
    let fixture = Fixture::new();
    let outside = fixture.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("index.html"), b"x").unwrap();
    std::fs::rename(fixture.path("app"), fixture.dir.path().join("app-moved")).unwrap();
    std::os::unix::fs::symlink(&outside, fixture.path("app")).unwrap();
    let report = run(&fixture);
    let found = found(&report);
    assert!(
        found.contains(&(codes::BUNDLE_SYMLINK, Some("app".into()))),
        "{found:?}"
    );
    // Nothing under the link was read: its listed files are not "missing", not hashed.
    assert!(
        !found
            .iter()
            .any(|(code, _)| *code == codes::BUNDLE_HASH_MISMATCH),
        "{found:?}"
    );
}

#[test]
fn a_hard_link_is_refused() {
    let fixture = Fixture::new();
    std::fs::hard_link(
        fixture.path(MODEL),
        fixture.dir.path().join("second-name.gguf"),
    )
    .unwrap();
    let report = run(&fixture);
    assert_only(&report, codes::BUNDLE_HARDLINK, MODEL);
    assert_eq!(report.failures[0].details["nlink"], 2);
}

#[test]
fn a_fifo_is_a_special_file() {
    let fixture = Fixture::new();
    let path = std::ffi::CString::new(
        fixture
            .path("app/pipe")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .unwrap();
    // SAFETY: `path` is a valid NUL-terminated string for the duration of the call.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0);
    assert_only(&run(&fixture), codes::BUNDLE_SPECIAL_FILE, "app/pipe");
}

#[test]
fn an_executable_bit_that_differs_is_a_mode_mismatch() {
    let fixture = Fixture::new();
    std::fs::set_permissions(
        fixture.path(RUNTIME_EXE),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    assert_only(&run(&fixture), codes::BUNDLE_MODE_MISMATCH, RUNTIME_EXE);
}

#[test]
fn escaping_and_invalid_manifest_paths_are_refused_and_never_opened() {
    for bad in [
        "../outside.txt",
        "app/../../outside.txt",
        "/etc/passwd",
        "C:/x",
        "C:\\x",
        "\\\\srv\\share\\x",
        "app/CON.txt",
        "app/lpt1",
        "app//x",
        "app/./x",
        "app/x\u{0}y",
        "app/name.",
        "app/tab\there",
    ] {
        let mut fixture = Fixture::new();
        std::fs::write(fixture.dir.path().join("outside.txt"), b"1").unwrap();
        fixture.list(bad);
        let report = run(&fixture);
        assert_eq!(
            found(&report),
            vec![(codes::BUNDLE_PATH_INVALID, Some(bad.to_string()))],
            "{bad:?}: {:#?}",
            report.failures
        );
        assert!(report.failures[0].details["reason"].is_string());
    }
}

#[test]
fn case_fold_collisions_and_file_directory_prefixes_are_refused() {
    let mut fixture = Fixture::new();
    fixture.list("app/INDEX.html");
    let report = run(&fixture);
    let failure = report
        .failures
        .iter()
        .find(|f| f.code == codes::BUNDLE_PATH_INVALID)
        .expect("a path failure");
    assert_eq!(
        failure.details["reason"], "case-fold-duplicate",
        "{:#?}",
        report.failures
    );

    let mut fixture = Fixture::new();
    fixture.list("app/index.html/inner");
    let report = run(&fixture);
    assert!(
        report
            .failures
            .iter()
            .any(|f| f.code == codes::BUNDLE_PATH_INVALID
                && f.details["reason"] == "file-is-directory-prefix"),
        "{:#?}",
        report.failures
    );
}

#[test]
fn runtimes_and_models_must_be_listed() {
    let mut fixture = Fixture::new();
    fixture
        .manifest
        .files
        .retain(|f| f.path != RUNTIME_EXE && f.path != MODEL);
    fixture.write_manifest();
    let report = run(&fixture);
    let found = found(&report);
    assert!(
        found.contains(&(codes::BUNDLE_RUNTIME_MISSING, Some(RUNTIME_EXE.into()))),
        "{found:?}"
    );
    assert!(
        found.contains(&(codes::BUNDLE_MODEL_MISSING, Some(MODEL.into()))),
        "{found:?}"
    );
    // The files themselves are now unlisted.
    assert!(
        found.contains(&(codes::BUNDLE_UNLISTED, Some(MODEL.into()))),
        "{found:?}"
    );
}

#[test]
fn a_foreign_target_is_refused_unless_the_check_is_off() {
    let mut fixture = Fixture::new();
    let host = Target::host();
    fixture.manifest.target = Target {
        os: if host.os == "windows" {
            "linux".into()
        } else {
            "windows".into()
        },
        arch: host.arch.clone(),
    };
    fixture.write_manifest();
    let report = run(&fixture);
    assert_eq!(found(&report), vec![(codes::BUNDLE_TARGET_MISMATCH, None)]);
    let report = verify(
        &fixture.root(),
        &VerifyOptions::default().check_target(false),
        &NullSink,
        &CancelToken::new(),
    )
    .unwrap();
    assert!(report.is_clean());
}

#[test]
fn a_missing_or_malformed_manifest_is_manifest_invalid() {
    let fixture = Fixture::new();
    std::fs::write(
        fixture.root().join("arcane-bundle.json"),
        b"{\"schemaVersion\": 2, \"kind\": \"arcane-bundle\"}",
    )
    .unwrap();
    let report = run(&fixture);
    assert_only(
        &report,
        codes::BUNDLE_MANIFEST_INVALID,
        "arcane-bundle.json",
    );
    assert_eq!(report.failures[0].details["value"], 2);
    std::fs::remove_file(fixture.root().join("arcane-bundle.json")).unwrap();
    assert_only(
        &run(&fixture),
        codes::BUNDLE_MANIFEST_INVALID,
        "arcane-bundle.json",
    );
    std::os::unix::fs::symlink("/etc/hostname", fixture.root().join("arcane-bundle.json")).unwrap();
    assert_only(&run(&fixture), codes::BUNDLE_SYMLINK, "arcane-bundle.json");
}

#[test]
fn every_failure_is_reported_not_just_the_first_and_strict_mode_returns_them_all() {
    let fixture = Fixture::new();
    flip_byte(&fixture.path(RUNTIME_EXE), 1);
    std::fs::remove_file(fixture.path(START)).unwrap();
    std::fs::write(fixture.path("models/smollm2/extra"), b"x").unwrap();
    let report = run(&fixture);
    let found = found(&report);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found.contains(&(codes::BUNDLE_HASH_MISMATCH, Some(RUNTIME_EXE.into()))));
    assert!(found.contains(&(codes::BUNDLE_MISSING, Some(START.into()))));
    assert!(found.contains(&(codes::BUNDLE_UNLISTED, Some("models/smollm2/extra".into()))));
    let error = verify_strict(
        &fixture.root(),
        &VerifyOptions::default(),
        &NullSink,
        &CancelToken::new(),
    )
    .unwrap_err();
    assert!(matches!(&error, Error::Integrity { failures, .. } if failures.len() == 3));
    assert!(error.code().starts_with("BUNDLE_"));
    assert_eq!(
        error.details()["failures"].as_array().map(Vec::len),
        Some(3)
    );
}

#[test]
fn verification_on_one_thread_and_on_many_agrees() {
    let fixture = Fixture::new();
    flip_byte(&fixture.path(MODEL), 5);
    for threads in [1, 2, 4] {
        let report = verify(
            &fixture.root(),
            &VerifyOptions::default().threads(threads),
            &NullSink,
            &CancelToken::new(),
        )
        .unwrap();
        assert_only(&report, codes::BUNDLE_HASH_MISMATCH, MODEL);
    }
}

#[test]
fn a_cancelled_verification_is_an_error_not_a_pass() {
    let fixture = Fixture::new();
    let cancel = CancelToken::new();
    cancel.cancel();
    let error = verify(
        &fixture.root(),
        &VerifyOptions::default(),
        &NullSink,
        &cancel,
    )
    .unwrap_err();
    assert_eq!(error.code(), codes::ARCANE_CANCELLED);
}

#[test]
fn an_app_start_naming_the_launcher_is_one_clear_failure_not_an_unlisted_file() {
    // Issue 14, item 13: with `app.start` naming a launcher path, `verify` reported a
    // listed file as "not listed".
    let mut fixture = Fixture::new();
    fixture.manifest.app.start = Some("bin/arcane".into());
    fixture.write_manifest();
    let report = run(&fixture);
    let found = found(&report);
    assert!(
        found
            .iter()
            .all(|(code, _)| *code != arcane_report::codes::BUNDLE_UNLISTED),
        "{found:?}"
    );
    assert_only(
        &report,
        arcane_report::codes::BUNDLE_PATH_INVALID,
        "bin/arcane",
    );
}

/// Issue 19, item 5: what someone other than the verifier could change between verify
/// and launch is refused — each with its own code, the path, the mode or owner and the
/// fix — however it is otherwise intact.
#[test]
fn what_another_user_could_change_before_launch_is_refused_with_the_fix() {
    use std::os::unix::fs::MetadataExt;
    let mode = |path: &std::path::Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    let only = |fixture: &Fixture, code: &str, path: &str, fix: &str| {
        let report = run(fixture);
        assert_only(&report, code, path);
        let failure = &report.failures[0];
        assert_eq!(failure.details["fix"], fix, "{failure:#?}");
        assert!(failure.message.contains(fix), "{failure:#?}");
    };

    // A world-writable program (the 0777 run.sh).
    let fixture = Fixture::new();
    mode(&fixture.path("app/tools/hello"), 0o777);
    only(
        &fixture,
        codes::BUNDLE_WRITABLE,
        "app/tools/hello",
        "chmod go-w",
    );
    assert_eq!(run(&fixture).failures[0].details["mode"], "0777");

    // A group-writable model directory, and a sticky world-writable one: the sticky
    // bit does not excuse it inside a bundle.
    for directory_mode in [0o775, 0o1777] {
        let fixture = Fixture::new();
        mode(&fixture.path("models/smollm2"), directory_mode);
        only(
            &fixture,
            codes::BUNDLE_WRITABLE,
            "models/smollm2",
            "chmod go-w",
        );
    }

    // The root itself, and the manifest.
    let fixture = Fixture::new();
    mode(&fixture.root(), 0o757);
    only(&fixture, codes::BUNDLE_WRITABLE, ".", "chmod go-w");
    let fixture = Fixture::new();
    mode(&fixture.path("arcane-bundle.json"), 0o646);
    only(
        &fixture,
        codes::BUNDLE_WRITABLE,
        "arcane-bundle.json",
        "chmod go-w",
    );

    // setuid and setgid files.
    for setid in [0o4755, 0o2755] {
        let fixture = Fixture::new();
        mode(&fixture.path(RUNTIME_EXE), setid);
        only(&fixture, codes::BUNDLE_SETID, RUNTIME_EXE, "chmod u-s,g-s");
    }

    // A file and a directory owned by another user (uid 65534), modes untouched.
    let fixture = Fixture::new();
    std::os::unix::fs::chown(fixture.path(START), Some(65534), None).unwrap();
    let report = run(&fixture);
    assert_only(&report, codes::BUNDLE_FOREIGN_OWNER, START);
    assert_eq!(report.failures[0].details["owner"], 65534);
    let fixture = Fixture::new();
    std::os::unix::fs::chown(fixture.path("app/tools"), Some(65534), None).unwrap();
    assert_only(&run(&fixture), codes::BUNDLE_FOREIGN_OWNER, "app/tools");
    // Root's files are fine for any verifier (the fixture is root's in the tests; a
    // file of the verifier's own passes too).
    let fixture = Fixture::new();
    assert_eq!(
        std::fs::metadata(fixture.path(START)).unwrap().uid(),
        rustix::process::geteuid().as_raw()
    );
    assert!(run(&fixture).is_clean());
}
