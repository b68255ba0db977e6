//! The JSON lock record `.arcane/workspace-operation.lock.json`: how Arcane writes it
//! and how any record (Arcane's or the JavaScript SDK's) is read.
//!
//! # Format
//!
//! The record is **exactly the SDK's schema-1 document**, so an SDK process recognises
//! it and applies its own recovery rule to a dead Arcane holder as to one of its own:
//! its twelve keys and no other, `owner` with only `pid`, the SDK's prose constants
//! word for word, a UUID-v4 nonce, the fixed TTL, the canonical workspace as `scope`,
//! and the formatting of `JSON.stringify(document, null, 2)` plus a newline (the SDK
//! compares the bytes):
//!
//! ```json
//! {
//!   "schemaVersion": 1,
//!   "kind": "arcane-workspace-operation-lock",
//!   "operation": "serve",
//!   "owner": {
//!     "pid": 412
//!   },
//!   "scope": "/canonical/workspace",
//!   "nonce": "…uuid v4…",
//!   "acquiredAt": "2026-11-29T10:02:11.123Z",
//!   "expiresAt": "2026-11-29T16:02:11.123Z",
//!   "ttlMilliseconds": 21600000,
//!   "releaseProcedure": "…",
//!   "staleRecovery": "…",
//!   "securityBoundary": "…"
//! }
//! ```
//!
//! Arcane's own facts about the holder (host, boot id, process start time, uid,
//! command, the workspace's identity, and that it holds the advisory lock on the
//! sentinel) go beside it, in `workspace-operation.lock.arcane.json`, under the same
//! nonce ([`render_facts`]); a reader merges them into the record when the nonces agree
//! ([`with_facts`]). A record without matching facts is judged as the SDK's.
//!
//! `expiresAt` and `ttlMilliseconds` are written for the SDK only; Arcane never decides
//! liveness by a wall clock. Readers ignore unknown fields and the prose (lock-spec.md
//! W7), and still read the facts from an older Arcane record's `owner`.

use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::Value;

use crate::holder::Holder;
use crate::sys::{self, Identity};

/// The record's `kind`.
pub(crate) const KIND: &str = "arcane-workspace-operation-lock";
/// The SDK's fixed time-to-live (informational only here).
pub(crate) const TTL_MILLISECONDS: u64 = 21_600_000;
/// Records larger than this are not read (and never recovered automatically).
pub(crate) const MAX_RECORD_BYTES: usize = 64 * 1024;

/// The SDK's prose, word for word: its recovery check compares them.
const RELEASE_PROCEDURE: &str =
    "The owning Arcane process removes this identity-checked lock after the operation settles.";
const STALE_RECOVERY: &str = "Only after expiresAt, confirm the recorded owner process is absent, preserve workspace changes, and remove this exact identity-checked lock. A live owner is never displaced.";
const SECURITY_BOUNDARY: &str = "This lock coordinates cooperative Arcane SDK mutators. Privileged or non-cooperating filesystem mutation is outside the portable JavaScript security boundary.";

#[derive(Serialize)]
struct Owner {
    pid: i32,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Document<'a> {
    schema_version: u32,
    kind: &'static str,
    operation: &'a str,
    owner: Owner,
    scope: String,
    nonce: &'a str,
    acquired_at: &'a str,
    expires_at: String,
    ttl_milliseconds: u64,
    release_procedure: &'static str,
    stale_recovery: &'static str,
    security_boundary: &'static str,
}

/// Renders this process's record for a new lease (the SDK's schema exactly).
pub(crate) fn render(
    operation: &str,
    nonce: &str,
    scope: &Path,
    acquired: SystemTime,
    acquired_at: &str,
) -> Vec<u8> {
    let document = Document {
        schema_version: 1,
        kind: KIND,
        operation,
        owner: Owner {
            pid: sys::own_pid(),
        },
        scope: scope.to_string_lossy().into_owned(),
        nonce,
        acquired_at,
        expires_at: arcane_report::time::format_rfc3339(
            acquired + Duration::from_millis(TTL_MILLISECONDS),
        ),
        ttl_milliseconds: TTL_MILLISECONDS,
        release_procedure: RELEASE_PROCEDURE,
        stale_recovery: STALE_RECOVERY,
        security_boundary: SECURITY_BOUNDARY,
    };
    // Serializing plain strings and integers cannot fail.
    let mut bytes = serde_json::to_vec_pretty(&document).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Facts<'a> {
    nonce: &'a str,
    owner: FactsOwner<'a>,
    workspace_identity: DirectoryIdentity,
    advisory_lock: AdvisoryLock,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FactsOwner<'a> {
    pid: i32,
    hostname: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    boot_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    start_time: Option<u64>,
    uid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    command: Option<&'a str>,
}

#[derive(Serialize)]
struct DirectoryIdentity {
    dev: u64,
    ino: u64,
}

#[derive(Serialize)]
struct AdvisoryLock {
    kind: &'static str,
    sentinel: &'static str,
}

/// Renders Arcane's facts about this process as the holder of the record with `nonce`.
pub(crate) fn render_facts(nonce: &str, identity: Identity) -> Vec<u8> {
    let facts = Facts {
        nonce,
        owner: FactsOwner {
            pid: sys::own_pid(),
            hostname: sys::hostname(),
            boot_id: sys::boot_id(),
            start_time: sys::own_start_time(),
            uid: sys::uid(),
            command: sys::own_command(),
        },
        workspace_identity: DirectoryIdentity {
            dev: identity.dev,
            ino: identity.ino,
        },
        advisory_lock: AdvisoryLock {
            kind: "flock",
            sentinel: "workspace-operation.lock",
        },
    };
    let mut bytes = serde_json::to_vec_pretty(&facts).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// The record as Arcane reads it: `record` with the holder facts of `facts` merged in
/// (its owner's fields, `workspaceIdentity`, `advisoryLock`) when both name the same
/// nonce and owner pid; else `record` unchanged (an SDK's record, or facts left over).
pub(crate) fn with_facts(record: Vec<u8>, facts: Option<&[u8]>) -> Vec<u8> {
    let Some(facts) = facts.and_then(|f| serde_json::from_slice::<Value>(f).ok()) else {
        return record;
    };
    let Ok(Value::Object(mut document)) = serde_json::from_slice::<Value>(&record) else {
        return record;
    };
    let same = document.get("nonce").is_some_and(|n| n == &facts["nonce"])
        && document
            .get("owner")
            .and_then(|o| o.get("pid"))
            .is_some_and(|pid| pid == &facts["owner"]["pid"]);
    if !same {
        return record;
    }
    if let (Some(Value::Object(owner)), Some(Value::Object(known))) =
        (document.get_mut("owner"), facts.get("owner"))
    {
        for (key, value) in known {
            owner.entry(key.clone()).or_insert_with(|| value.clone());
        }
    }
    for key in ["workspaceIdentity", "advisoryLock"] {
        if let Some(value) = facts.get(key) {
            document.insert(key.to_string(), value.clone());
        }
    }
    serde_json::to_vec(&Value::Object(document)).unwrap_or(record)
}

/// A record as read from disk, understood as far as the rules need.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    /// Who wrote it.
    pub(crate) holder: Holder,
    /// `scope`: the workspace path the writer locked.
    pub(crate) scope: String,
    /// `workspaceIdentity`, when present.
    pub(crate) workspace_identity: Option<Identity>,
}

/// Parses a record, or says what is wrong with it (`"empty"`, `"not JSON"`, …).
pub(crate) fn parse(bytes: &[u8]) -> Result<Parsed, String> {
    if bytes.is_empty() {
        return Err("empty".into());
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err("blank".into());
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|_| "not JSON".to_string())?;
    let object = value
        .as_object()
        .ok_or_else(|| "not a JSON object".to_string())?;
    if object.get("schemaVersion").and_then(Value::as_u64) != Some(1) {
        return Err("of an unknown schema version".into());
    }
    if object.get("kind").and_then(Value::as_str) != Some(KIND) {
        return Err("not an Arcane workspace lock record".into());
    }
    let operation = object
        .get("operation")
        .and_then(Value::as_str)
        .ok_or_else(|| "missing its operation".to_string())?;
    let owner = object
        .get("owner")
        .and_then(Value::as_object)
        .ok_or_else(|| "missing its owner".to_string())?;
    // The SDK's "safe integer" pid; zero and negatives are invalid.
    let pid = owner
        .get("pid")
        .and_then(Value::as_i64)
        .filter(|pid| (1..=(1i64 << 53)).contains(pid))
        .ok_or_else(|| "missing a valid owner pid".to_string())?;
    let nonce = object
        .get("nonce")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| "missing its nonce".to_string())?;
    let scope = object
        .get("scope")
        .and_then(Value::as_str)
        .ok_or_else(|| "missing its scope".to_string())?;
    let string = |map: &serde_json::Map<String, Value>, key: &str| {
        map.get(key).and_then(Value::as_str).map(str::to_string)
    };
    let advisory_lock = object
        .get("advisoryLock")
        .and_then(Value::as_object)
        .and_then(|a| a.get("kind"))
        .and_then(Value::as_str)
        == Some("flock");
    let workspace_identity = object
        .get("workspaceIdentity")
        .and_then(Value::as_object)
        .and_then(|w| {
            Some(Identity {
                dev: w.get("dev")?.as_u64()?,
                ino: w.get("ino")?.as_u64()?,
            })
        });
    Ok(Parsed {
        holder: Holder {
            pid: Some(pid),
            hostname: string(owner, "hostname"),
            boot_id: string(owner, "bootId"),
            start_time: owner.get("startTime").and_then(Value::as_u64),
            command: string(owner, "command"),
            operation: Some(operation.to_string()),
            since: string(object, "acquiredAt"),
            nonce: Some(nonce.to_string()),
            advisory_lock,
            alive: None,
        },
        scope: scope.to_string(),
        workspace_identity,
    })
}

/// A best-effort holder description from whatever bytes a record has (for messages).
pub(crate) fn holder_hint(bytes: &[u8]) -> Option<Holder> {
    parse(bytes).ok().map(|p| p.holder)
}

/// A fresh UUID v4 nonce. Without kernel randomness (never seen on Linux 3.17+), time
/// and pid keep it unique per lease, which is all a nonce needs.
pub(crate) fn new_nonce() -> String {
    arcane_files::uuid_v4().unwrap_or_else(|_| {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        format!("{now:032x}-{:08x}", sys::own_pid())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONCE: &str = "0b5e6a0c-8d1e-4f5a-9b2c-3d4e5f607182";

    fn sample() -> Vec<u8> {
        let now = SystemTime::now();
        let record = render(
            "demo",
            NONCE,
            Path::new("/w"),
            now,
            &arcane_report::time::format_rfc3339(now),
        );
        with_facts(
            record,
            Some(&render_facts(NONCE, Identity { dev: 1, ino: 2 })),
        )
    }

    #[test]
    fn the_record_is_exactly_the_sdk_document() {
        let now = SystemTime::now();
        let bytes = render(
            "demo",
            NONCE,
            Path::new("/w"),
            now,
            &arcane_report::time::format_rfc3339(now),
        );
        assert!(bytes.ends_with(b"}\n"));
        assert!(bytes.starts_with(b"{\n  \"schemaVersion\": 1,\n"));
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        // The SDK's exact key sets.
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "acquiredAt",
                "expiresAt",
                "kind",
                "nonce",
                "operation",
                "owner",
                "releaseProcedure",
                "schemaVersion",
                "scope",
                "securityBoundary",
                "staleRecovery",
                "ttlMilliseconds"
            ]
        );
        assert_eq!(v["owner"].as_object().unwrap().len(), 1);
        assert_eq!(v["securityBoundary"], SECURITY_BOUNDARY);
        let bytes = sample();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["kind"], KIND);
        assert_eq!(v["owner"]["pid"], sys::own_pid());
        assert_eq!(v["scope"], "/w");
        assert_eq!(v["ttlMilliseconds"], TTL_MILLISECONDS);
        let acquired =
            arcane_report::time::parse_rfc3339(v["acquiredAt"].as_str().unwrap()).unwrap();
        let expires = arcane_report::time::parse_rfc3339(v["expiresAt"].as_str().unwrap()).unwrap();
        assert_eq!(
            expires.duration_since(acquired).unwrap(),
            Duration::from_millis(TTL_MILLISECONDS)
        );
    }

    #[test]
    fn our_record_parses_back_with_its_identity() {
        let parsed = parse(&sample()).unwrap();
        assert!(parsed.holder.advisory_lock);
        assert_eq!(parsed.holder.pid, Some(i64::from(sys::own_pid())));
        assert_eq!(parsed.holder.hostname.as_deref(), Some(sys::hostname()));
        assert_eq!(parsed.workspace_identity, Some(Identity { dev: 1, ino: 2 }));
        assert_eq!(parsed.holder.operation.as_deref(), Some("demo"));
    }

    #[test]
    fn an_sdk_record_with_unknown_fields_is_understood() {
        let sdk = br#"{"schemaVersion":1,"kind":"arcane-workspace-operation-lock","operation":"package","owner":{"pid":77},"scope":"/w","nonce":"x","acquiredAt":"2020-01-01T00:00:00.000Z","expiresAt":"2020-01-01T06:00:00.000Z","ttlMilliseconds":21600000,"somethingNew":true,"staleRecovery":"other prose"}"#;
        let parsed = parse(sdk).unwrap();
        assert!(!parsed.holder.advisory_lock);
        assert_eq!(parsed.holder.pid, Some(77));
        assert_eq!(parsed.workspace_identity, None);
    }

    #[test]
    fn broken_records_say_what_is_wrong() {
        assert_eq!(parse(b"").unwrap_err(), "empty");
        assert_eq!(parse(b"not json").unwrap_err(), "not JSON");
        assert_eq!(parse(b"[1]").unwrap_err(), "not a JSON object");
        assert_eq!(
            parse(br#"{"schemaVersion":1,"kind":"arcane-workspace-operation-lock","operation":"x","owner":{"pid":0},"scope":"/w","nonce":"n"}"#).unwrap_err(),
            "missing a valid owner pid"
        );
        assert_eq!(
            parse(br#"{"schemaVersion":2,"kind":"arcane-workspace-operation-lock"}"#).unwrap_err(),
            "of an unknown schema version"
        );
    }

    #[test]
    fn nonces_are_uuid_v4_and_unique() {
        let a = new_nonce();
        let b = new_nonce();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"));
    }
}
