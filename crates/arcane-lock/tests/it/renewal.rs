//! Issue 31: a held record's short expiry is renewed in place, and neither the holder's
//! self-check nor its release takes a renewal for tampering.

use std::time::{Duration, SystemTime};

use arcane_lock::WorkspaceLock;
use arcane_report::NullSink;

use crate::support::*;

fn times(ws: &std::path::Path) -> (SystemTime, SystemTime) {
    let v = read_record(ws);
    let time = |key: &str| arcane_report::time::parse_rfc3339(v[key].as_str().unwrap()).unwrap();
    (time("acquiredAt"), time("expiresAt"))
}

#[test]
fn a_held_record_is_renewed_in_place_and_stays_the_holders() {
    let ws = workspace();
    let lock = WorkspaceLock::acquire(ws.path(), &options("serve"), &NullSink).unwrap();
    let inode = |path: &std::path::Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().ino()
    };
    let record = record_path(ws.path());
    let first_inode = inode(&record);
    let (_, first) = times(ws.path());
    // The renewer rewrites the times every ten seconds.
    wait_until("the record is renewed", || times(ws.path()).1 != first);
    let (acquired, expires) = times(ws.path());
    assert!(expires > first, "the expiry moved forward");
    assert_eq!(
        expires.duration_since(acquired).unwrap(),
        Duration::from_millis(21_600_000),
        "still the SDK's TTL"
    );
    assert!(
        expires <= SystemTime::now() + Duration::from_secs(31),
        "a short horizon, not six hours"
    );
    assert_eq!(inode(&record), first_inode, "rewritten in place");
    // Everything but the times is as it was, and the facts still name the real time.
    let v = read_record(ws.path());
    assert_eq!(v["nonce"], lock.nonce());
    assert_eq!(sentinel_facts(ws.path())["acquiredAt"], lock.acquired_at());
    lock.check().expect("a renewal is not a compromise");
    lock.release().expect("nor at release");
    assert!(!record.exists());
}

#[test]
fn a_lease_released_before_its_renewal_leaves_nothing_behind() {
    let ws = workspace();
    let lock = WorkspaceLock::acquire(ws.path(), &options("build"), &NullSink).unwrap();
    let (_, expires) = times(ws.path());
    lock.release().unwrap();
    assert!(!record_path(ws.path()).exists());
    // The expiry it wrote was a horizon ahead of its acquisition, not six hours.
    assert!(expires <= SystemTime::now() + Duration::from_secs(31));
}
