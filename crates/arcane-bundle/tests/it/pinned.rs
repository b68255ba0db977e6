//! Launch runs exactly what it verified (issue 19, item 5): a file swapped or rewritten
//! after verification is refused before anything runs, and a program already opened
//! for launch runs as verified even when its path is swapped afterwards.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;

use arcane_bundle::{open_app_entry, verify_strict, VerifiedBundle, VerifyOptions};
use arcane_report::{codes, CancelToken, Diagnostic, NullSink};
use sha2::{Digest, Sha256};

use crate::fixture::{Fixture, MODEL};

/// The program under test: writes `$1` with `what`.
fn script(what: &str) -> Vec<u8> {
    format!("#!/bin/sh\nprintf '{what}' > \"$1\"\n").into_bytes()
}

/// A fixture whose `app/tools/hello` is [`script`]`("verified")`, verified.
fn verified() -> (Fixture, VerifiedBundle) {
    let mut fixture = Fixture::new();
    let content = script("verified");
    let path = fixture.path("app/tools/hello");
    std::fs::write(&path, &content).unwrap();
    let entry = fixture
        .manifest
        .files
        .iter_mut()
        .find(|f| f.path == "app/tools/hello")
        .unwrap();
    entry.size = content.len() as u64;
    entry.sha256 = hex::encode(Sha256::digest(&content));
    fixture.write_manifest();
    let bundle = verify_strict(
        &fixture.root(),
        &VerifyOptions::default(),
        &NullSink,
        &CancelToken::new(),
    )
    .expect("the fixture verifies");
    (fixture, bundle)
}

/// Replaces `path` by a new file with `content` (what a rename over it does), mode 0755.
fn swap(path: &Path, content: &[u8]) {
    let next = path.with_extension("next");
    std::fs::write(&next, content).unwrap();
    std::fs::set_permissions(&next, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&next, path).unwrap();
}

/// Runs `program` (`/proc/self/fd/N`) with `fd` inherited and `marker` as `$1`.
fn run_pinned(program: &arcane_bundle::PinnedFile, marker: &Path) -> std::process::ExitStatus {
    let fd = program.raw_fd();
    let mut command = std::process::Command::new(program.exec_path());
    command.arg(marker);
    // SAFETY: fcntl is async-signal-safe; it clears close-on-exec on our own descriptor.
    unsafe {
        command.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.status().unwrap()
}

fn assert_changed(error: arcane_bundle::Error, path: &str) {
    assert_eq!(error.code(), codes::BUNDLE_FILE_CHANGED, "{error}");
    assert_eq!(error.failures().len(), 1, "{error}");
    assert_eq!(error.failures()[0].path.as_deref(), Some(path), "{error}");
}

#[test]
fn a_program_swapped_after_verification_is_refused_and_never_runs() {
    let (fixture, bundle) = verified();
    let marker = fixture.dir.path().join("marker");
    swap(&fixture.path("app/tools/hello"), &script("swapped"));
    let error = open_app_entry(&bundle, "tools/hello").expect_err("a swapped program is refused");
    assert_changed(error, "app/tools/hello");
    assert!(!marker.exists(), "the swapped program ran");
}

#[test]
fn a_program_rewritten_in_place_after_verification_is_refused() {
    // Same inode, same size: only its content (and its times, within the clock's
    // granularity) differs; the content is hashed again from the open descriptor.
    let (fixture, bundle) = verified();
    let path = fixture.path("app/tools/hello");
    let evil = script("rewrote!");
    assert_eq!(evil.len(), script("verified").len());
    std::fs::write(&path, &evil).unwrap();
    assert_changed(
        open_app_entry(&bundle, "tools/hello").unwrap_err(),
        "app/tools/hello",
    );
}

#[test]
fn a_pinned_program_runs_as_verified_even_when_its_path_is_swapped_after() {
    let (fixture, bundle) = verified();
    let program = open_app_entry(&bundle, "./tools/hello").expect("the verified program");
    assert_eq!(program.relative(), "app/tools/hello");
    assert_eq!(program.path(), bundle.root.join("app/tools/hello"));
    swap(&fixture.path("app/tools/hello"), &script("swapped"));
    let marker = fixture.dir.path().join("marker");
    assert!(run_pinned(&program, &marker).success());
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "verified");
}

#[test]
fn files_the_core_host_opens_by_path_are_rechecked_before_they_are_handed_over() {
    let (fixture, bundle) = verified();
    bundle.recheck_all().expect("nothing changed");
    // The model replaced by an identical copy: another file, refused.
    let model = fixture.path(MODEL);
    let content = std::fs::read(&model).unwrap();
    let copy = model.with_extension("copy");
    std::fs::write(&copy, &content).unwrap();
    std::fs::rename(&copy, &model).unwrap();
    assert_changed(bundle.recheck_all().unwrap_err(), MODEL);
}

#[test]
fn a_file_that_gained_a_link_or_a_mode_change_after_verification_is_refused() {
    let (fixture, bundle) = verified();
    let path = fixture.path("app/tools/hello");
    std::fs::hard_link(&path, fixture.dir.path().join("link")).unwrap();
    assert_changed(
        open_app_entry(&bundle, "tools/hello").unwrap_err(),
        "app/tools/hello",
    );
    std::fs::remove_file(fixture.dir.path().join("link")).unwrap();
    let (fixture, bundle) = verified();
    let path = fixture.path(MODEL);
    std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
    assert_changed(bundle.open_verified(MODEL).unwrap_err(), MODEL);
}
