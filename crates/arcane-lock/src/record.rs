//! The JSON lock record `.arcane/workspace-operation.lock.json`: how Arcane writes it
//! and how any record (Arcane's or the JavaScript SDK's) is read.
//!
//! # Format
//!
//! Two-space-indented JSON plus a newline, mode 0600, keeping the SDK's schema-1 fields
//! so SDK processes recognise it:
//!
//! ```json
//! {
//!   "schemaVersion": 1,
//!   "kind": "arcane-workspace-operation-lock",
//!   "operation": "serve",
//!   "owner": { "pid": 412, "hostname": "h", "bootId": "…", "startTime": 81234, "uid": 1000, "command": "arcane serve" },
//!   "scope": "/canonical/workspace",
//!   "workspaceIdentity": { "dev": 2049, "ino": 1234567 },
//!   "nonce": "…uuid v4…",
//!   "acquiredAt": "2026-11-29T10:02:11.123Z",
//!   "expiresAt": "2026-11-29T16:02:11.123Z",
//!   "ttlMilliseconds": 21600000,
//!   "advisoryLock": { "kind": "flock", "sentinel": "workspace-operation.lock" },
//!   "releaseProcedure": "…",
//!   "staleRecovery": "…"
//! }
//! ```
//!
//! `expiresAt` and `ttlMilliseconds` are written for the SDK only; Arcane never decides
//! liveness by a wall clock. `advisoryLock` marks a record whose writer held the
//! advisory lock on the sentinel for as long as the record existed; its absence marks
//! an SDK record. Readers ignore unknown fields and the prose (lock-spec.md W7).

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

const RELEASE_PROCEDURE: &str = "The owning Arcane process removes this record while it still holds the advisory lock on the sentinel file named in advisoryLock, after the operation settles.";
const STALE_RECOVERY: &str = "Liveness is decided by the advisory lock on the sentinel, never by expiresAt. A record whose writer no longer holds that lock on this host is stale and is replaced by the next holder; a live owner is never displaced; a record from another host is never broken automatically.";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Owner<'a> {
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

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Document<'a> {
    schema_version: u32,
    kind: &'static str,
    operation: &'a str,
    owner: Owner<'a>,
    scope: String,
    workspace_identity: DirectoryIdentity,
    nonce: &'a str,
    acquired_at: &'a str,
    expires_at: String,
    ttl_milliseconds: u64,
    advisory_lock: AdvisoryLock,
    release_procedure: &'static str,
    stale_recovery: &'static str,
}

/// Renders this process's record for a new lease.
pub(crate) fn render(
    operation: &str,
    nonce: &str,
    scope: &Path,
    identity: Identity,
    acquired: SystemTime,
    acquired_at: &str,
) -> Vec<u8> {
    let document = Document {
        schema_version: 1,
        kind: KIND,
        operation,
        owner: Owner {
            pid: sys::own_pid(),
            hostname: sys::hostname(),
            boot_id: sys::boot_id(),
            start_time: sys::own_start_time(),
            uid: sys::uid(),
            command: sys::own_command(),
        },
        scope: scope.to_string_lossy().into_owned(),
        workspace_identity: DirectoryIdentity {
            dev: identity.dev,
            ino: identity.ino,
        },
        nonce,
        acquired_at,
        expires_at: arcane_report::time::format_rfc3339(
            acquired + Duration::from_millis(TTL_MILLISECONDS),
        ),
        ttl_milliseconds: TTL_MILLISECONDS,
        advisory_lock: AdvisoryLock {
            kind: "flock",
            sentinel: "workspace-operation.lock",
        },
        release_procedure: RELEASE_PROCEDURE,
        stale_recovery: STALE_RECOVERY,
    };
    // Serializing plain strings and integers cannot fail.
    let mut bytes = serde_json::to_vec_pretty(&document).unwrap_or_default();
    bytes.push(b'\n');
    bytes
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

    fn sample() -> Vec<u8> {
        let now = SystemTime::now();
        render(
            "demo",
            "n-1",
            Path::new("/w"),
            Identity { dev: 1, ino: 2 },
            now,
            &arcane_report::time::format_rfc3339(now),
        )
    }

    #[test]
    fn the_record_keeps_the_sdk_schema_and_formatting() {
        let bytes = sample();
        assert!(bytes.ends_with(b"}\n"));
        assert!(bytes.starts_with(b"{\n  \"schemaVersion\": 1,\n"));
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
