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
//!   "acquiredAt": "2026-11-29T04:02:41.123Z",
//!   "expiresAt": "2026-11-29T10:02:41.123Z",
//!   "ttlMilliseconds": 21600000,
//!   "releaseProcedure": "…",
//!   "staleRecovery": "…",
//!   "securityBoundary": "…"
//! }
//! ```
//!
//! # A short expiry, renewed
//!
//! The SDK 0.1.1 removes a record only once `expiresAt` has passed *and* its owner pid
//! is gone, and it insists that `expiresAt` is `acquiredAt` plus the fixed six-hour TTL.
//! A six-hour expiry would lock an SDK out for six hours after an Arcane holder is
//! killed, so `expiresAt` is kept [`HORIZON`] ahead of the last write and `acquiredAt`
//! six hours before it: a live holder rewrites both in place (the `renew` module), a
//! dead one stops, and the SDK recovers it within [`HORIZON`]. While the holder lives
//! the record never expires, so even an SDK that cannot see the holder's pid (another
//! pid namespace) leaves it alone. `acquiredAt` is therefore not the acquisition time;
//! Arcane's facts carry that. Arcane itself never decides liveness by these times.
//!
//! # Arcane's facts
//!
//! Arcane's own facts about the holder (host, boot id, process start time, uid,
//! command, when it really took the lock, the workspace's identity, and that it holds
//! the advisory lock on the sentinel) are written *into the sentinel* the holder has
//! locked, under the record's nonce ([`render_facts`]); a reader merges them into the
//! record when the nonce and pid agree ([`with_facts`]). A record without matching facts
//! is judged as the SDK's. Readers ignore unknown fields and the prose (lock-spec.md W7),
//! and still read the facts from an older Arcane record's `owner`.

use std::ops::Range;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::Value;

use crate::holder::Holder;
use crate::sys::{self, Identity};

/// The record's `kind`.
pub(crate) const KIND: &str = "arcane-workspace-operation-lock";
/// The SDK's fixed time-to-live: `expiresAt` is always `acquiredAt` plus this.
pub(crate) const TTL_MILLISECONDS: u64 = 21_600_000;
/// How far ahead of its last write a record's `expiresAt` lies: the longest an SDK 0.1.1
/// waits for a dead Arcane holder.
pub(crate) const HORIZON: Duration = Duration::from_secs(30);
/// Records larger than this are not read (and never recovered automatically).
pub(crate) const MAX_RECORD_BYTES: usize = 64 * 1024;
/// The facts are padded with spaces to at least this many bytes, so a holder rewrites
/// the sentinel in place without truncating it (JSON readers skip trailing spaces).
const FACTS_BYTES: usize = 1024;

/// The SDK's prose, word for word: its recovery check compares them.
const RELEASE_PROCEDURE: &str =
    "The owning Arcane process removes this identity-checked lock after the operation settles.";
const STALE_RECOVERY: &str = "Only after expiresAt, confirm the recorded owner process is absent, preserve workspace changes, and remove this exact identity-checked lock. A live owner is never displaced.";
const SECURITY_BOUNDARY: &str = "This lock coordinates cooperative Arcane SDK mutators. Privileged or non-cooperating filesystem mutation is outside the portable JavaScript security boundary.";

/// Between the two times: `acquiredAt`'s value, this, then `expiresAt`'s value.
const BETWEEN_TIMES: &str = "\",\n  \"expiresAt\": \"";
/// The length of one rendered time (`2026-11-29T10:02:11.123Z`).
const TIME_LEN: usize = 24;

/// What a lease's record says apart from its times.
#[derive(Debug, Clone)]
pub(crate) struct Fields<'a> {
    /// The operation (the SDK's pattern, already validated).
    pub(crate) operation: &'a str,
    /// The lease nonce (a UUID v4).
    pub(crate) nonce: &'a str,
    /// The canonical workspace as a JSON string ([`scope_json`]).
    pub(crate) scope: &'a str,
    /// The writer's pid.
    pub(crate) pid: i32,
}

/// A rendered record and where its two times sit in it.
#[derive(Debug, Clone)]
pub(crate) struct Rendered {
    /// The document's bytes.
    pub(crate) bytes: Vec<u8>,
    /// `acquiredAt`'s value through `expiresAt`'s value: what a renewal rewrites.
    pub(crate) times: Range<usize>,
}

impl Rendered {
    /// The times for a record (re)written at `written`, as they sit in the document.
    pub(crate) fn times_at(written: SystemTime) -> Vec<u8> {
        let expires = written + HORIZON;
        let acquired = expires
            .checked_sub(Duration::from_millis(TTL_MILLISECONDS))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let mut span = Vec::with_capacity(2 * TIME_LEN + BETWEEN_TIMES.len());
        span.extend_from_slice(arcane_report::time::format_rfc3339(acquired).as_bytes());
        span.extend_from_slice(BETWEEN_TIMES.as_bytes());
        span.extend_from_slice(arcane_report::time::format_rfc3339(expires).as_bytes());
        span
    }

    /// Whether `current` is this document with only its times rewritten (a renewal):
    /// the same length and bytes elsewhere, and times the SDK would accept (`expiresAt`
    /// is `acquiredAt` plus the TTL).
    pub(crate) fn renewed_as(&self, current: &[u8]) -> bool {
        if current == self.bytes.as_slice() {
            return true;
        }
        let Range { start, end } = self.times.clone();
        if start == end
            || current.len() != self.bytes.len()
            || current[..start] != self.bytes[..start]
            || current[end..] != self.bytes[end..]
        {
            return false;
        }
        let span = &current[start..end];
        let (Some(acquired), Some(between), Some(expires)) = (
            span.get(..TIME_LEN),
            span.get(TIME_LEN..span.len() - TIME_LEN),
            span.get(span.len() - TIME_LEN..),
        ) else {
            return false;
        };
        let time = |b: &[u8]| {
            std::str::from_utf8(b)
                .ok()
                .and_then(arcane_report::time::parse_rfc3339)
        };
        between == BETWEEN_TIMES.as_bytes()
            && matches!(
                (time(acquired), time(expires)),
                (Some(a), Some(e)) if e.duration_since(a).ok() == Some(Duration::from_millis(TTL_MILLISECONDS))
            )
    }
}

/// Where the times sit in a record as Arcane renders it (an inherited lease's record,
/// read back); an empty range for a record of another form, whose every change then
/// counts.
pub(crate) fn locate_times(bytes: &[u8]) -> Range<usize> {
    const KEY: &[u8] = b"\"acquiredAt\": \"";
    let Some(start) = bytes
        .windows(KEY.len())
        .position(|w| w == KEY)
        .map(|i| i + KEY.len())
    else {
        return 0..0;
    };
    let end = start + 2 * TIME_LEN + BETWEEN_TIMES.len();
    let between = bytes.get(start + TIME_LEN..end - TIME_LEN);
    if between == Some(BETWEEN_TIMES.as_bytes()) {
        start..end
    } else {
        0..0
    }
}

/// Renders the record of a lease written at `written` (the SDK's document exactly, its
/// times as the module documentation says).
/// The workspace path `scope` as the JSON string a record carries (escaped as
/// `JSON.stringify` escapes; a path that is not UTF-8 is written lossily).
pub(crate) fn scope_json(scope: &Path) -> String {
    // A JSON string of a string cannot fail to serialize.
    serde_json::to_string(scope.to_string_lossy().as_ref()).unwrap_or_default()
}

pub(crate) fn render(fields: &Fields<'_>, written: SystemTime) -> Rendered {
    let scope = fields.scope;
    let mut bytes = Vec::with_capacity(1024 + scope.len());
    let b = &mut bytes;
    put(b, "{\n  \"schemaVersion\": 1,\n  \"kind\": \"");
    put(b, KIND);
    put(b, "\",\n  \"operation\": \"");
    // The operation matches `[a-z0-9][a-z0-9.-]*` and the nonce is hex and dashes:
    // neither needs escaping.
    put(b, fields.operation);
    put(b, "\",\n  \"owner\": {\n    \"pid\": ");
    push_decimal(b, u64::from(fields.pid.unsigned_abs()));
    put(b, "\n  },\n  \"scope\": ");
    put(b, scope);
    put(b, ",\n  \"nonce\": \"");
    put(b, fields.nonce);
    put(b, "\",\n  \"acquiredAt\": \"");
    let start = b.len();
    b.extend_from_slice(&Rendered::times_at(written));
    let end = b.len();
    put(b, "\",\n  \"ttlMilliseconds\": ");
    push_decimal(b, TTL_MILLISECONDS);
    put(b, ",\n  \"releaseProcedure\": \"");
    put(b, RELEASE_PROCEDURE);
    put(b, "\",\n  \"staleRecovery\": \"");
    put(b, STALE_RECOVERY);
    put(b, "\",\n  \"securityBoundary\": \"");
    put(b, SECURITY_BOUNDARY);
    put(b, "\"\n}\n");
    Rendered {
        bytes,
        times: start..end,
    }
}

fn put(bytes: &mut Vec<u8>, text: &str) {
    bytes.extend_from_slice(text.as_bytes());
}

/// Appends `value` in decimal.
fn push_decimal(bytes: &mut Vec<u8>, value: u64) {
    let start = bytes.len();
    let mut rest = value;
    loop {
        bytes.push(b'0' + (rest % 10) as u8);
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    bytes[start..].reverse();
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

/// The facts' `owner` object for process `pid` (this process), rendered once.
fn owner_json(pid: i32) -> std::borrow::Cow<'static, str> {
    let render = || {
        serde_json::to_string(&FactsOwner {
            pid,
            hostname: sys::hostname(),
            boot_id: sys::boot_id(),
            start_time: sys::own_start_time(),
            uid: sys::uid(),
            command: sys::own_command(),
        })
        // Plain strings and integers always serialize.
        .unwrap_or_default()
    };
    static OWNER: std::sync::OnceLock<(i32, String)> = std::sync::OnceLock::new();
    let (cached_pid, cached) = OWNER.get_or_init(|| (pid, render()));
    if *cached_pid == pid {
        std::borrow::Cow::Borrowed(cached.as_str())
    } else {
        // A child forked without `exec` is another owner.
        std::borrow::Cow::Owned(render())
    }
}

/// Renders Arcane's facts about this process (`pid`) as the holder of the record with
/// `nonce`, taken at `acquired_at` (RFC 3339), padded with spaces to at least
/// [`FACTS_BYTES`]:
///
/// ```json
/// {"nonce":"…","acquiredAt":"…","owner":{"pid":412,"hostname":"…","bootId":"…",
///  "startTime":123,"uid":1000,"command":"arcane serve"},
///  "workspaceIdentity":{"dev":2049,"ino":1234},
///  "advisoryLock":{"kind":"flock","sentinel":"workspace-operation.lock"}}
/// ```
pub(crate) fn render_facts(
    pid: i32,
    nonce: &str,
    acquired_at: &str,
    identity: Identity,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(FACTS_BYTES);
    // The nonce is hex and dashes and the time digits and punctuation: no escaping.
    put(&mut b, "{\"nonce\":\"");
    put(&mut b, nonce);
    put(&mut b, "\",\"acquiredAt\":\"");
    put(&mut b, acquired_at);
    put(&mut b, "\",\"owner\":");
    put(&mut b, &owner_json(pid));
    put(&mut b, ",\"workspaceIdentity\":{\"dev\":");
    push_decimal(&mut b, identity.dev);
    put(&mut b, ",\"ino\":");
    push_decimal(&mut b, identity.ino);
    put(
        &mut b,
        "},\"advisoryLock\":{\"kind\":\"flock\",\"sentinel\":\"workspace-operation.lock\"}}\n",
    );
    if b.len() < FACTS_BYTES {
        b.resize(FACTS_BYTES, b' ');
    }
    b
}

/// The record as Arcane reads it: `record` with the holder facts of `facts` merged in
/// (its owner's fields, `workspaceIdentity`, `advisoryLock`, and the real `acquiredAt`
/// in place of the record's) when both name the same nonce and owner pid; else `record`
/// unchanged (an SDK's record, or facts left over).
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
    for key in ["workspaceIdentity", "advisoryLock", "acquiredAt"] {
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

    /// The scope `/w` as a record carries it.
    const W: &str = "\"/w\"";

    fn fields(scope: &str) -> Fields<'_> {
        Fields {
            operation: "demo",
            nonce: NONCE,
            scope,
            pid: sys::own_pid(),
        }
    }

    fn sample() -> Vec<u8> {
        let record = render(&fields(W), SystemTime::now()).bytes;
        let facts = render_facts(
            sys::own_pid(),
            NONCE,
            "2026-11-29T10:02:11.123Z",
            Identity { dev: 1, ino: 2 },
        );
        with_facts(record, Some(&facts))
    }

    /// The SDK's document as a struct: serde's pretty printer writes what
    /// `JSON.stringify(document, null, 2)` writes, so it is the oracle for the hand-made
    /// rendering.
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Oracle<'a> {
        schema_version: u32,
        kind: &'static str,
        operation: &'a str,
        owner: OracleOwner,
        scope: &'a str,
        nonce: &'a str,
        acquired_at: &'a str,
        expires_at: &'a str,
        ttl_milliseconds: u64,
        release_procedure: &'static str,
        stale_recovery: &'static str,
        security_boundary: &'static str,
    }

    #[derive(Serialize)]
    struct OracleOwner {
        pid: i32,
    }

    #[test]
    fn the_record_is_byte_for_byte_what_the_sdk_writes() {
        // Quotes, backslashes, control characters and non-ASCII in the scope too.
        for scope in ["/w", "/home/a \"b\"\\c\td\u{1}é"] {
            let json = scope_json(Path::new(scope));
            let rendered = render(&fields(&json), SystemTime::now());
            let v: Value = serde_json::from_slice(&rendered.bytes).unwrap();
            let oracle = Oracle {
                schema_version: 1,
                kind: KIND,
                operation: "demo",
                owner: OracleOwner {
                    pid: sys::own_pid(),
                },
                scope,
                nonce: NONCE,
                acquired_at: v["acquiredAt"].as_str().unwrap(),
                expires_at: v["expiresAt"].as_str().unwrap(),
                ttl_milliseconds: TTL_MILLISECONDS,
                release_procedure: RELEASE_PROCEDURE,
                stale_recovery: STALE_RECOVERY,
                security_boundary: SECURITY_BOUNDARY,
            };
            let mut expected = serde_json::to_vec_pretty(&oracle).unwrap();
            expected.push(b'\n');
            assert_eq!(
                String::from_utf8_lossy(&rendered.bytes),
                String::from_utf8_lossy(&expected)
            );
        }
    }

    #[test]
    fn the_record_expires_one_horizon_after_it_is_written_and_keeps_the_ttl() {
        let written = SystemTime::now();
        let v: Value = serde_json::from_slice(&render(&fields(W), written).bytes).unwrap();
        let acquired =
            arcane_report::time::parse_rfc3339(v["acquiredAt"].as_str().unwrap()).unwrap();
        let expires = arcane_report::time::parse_rfc3339(v["expiresAt"].as_str().unwrap()).unwrap();
        assert_eq!(
            expires.duration_since(acquired).unwrap(),
            Duration::from_millis(TTL_MILLISECONDS)
        );
        let ahead = expires.duration_since(written).unwrap();
        assert!(
            ahead <= HORIZON && ahead > HORIZON - Duration::from_millis(2),
            "{ahead:?}"
        );
    }

    #[test]
    fn a_renewal_is_told_from_any_other_change() {
        let first = render(&fields(W), SystemTime::now());
        let later = SystemTime::now() + Duration::from_secs(10);
        let mut renewed = first.bytes.clone();
        renewed[first.times.clone()].copy_from_slice(&Rendered::times_at(later));
        assert_ne!(renewed, first.bytes);
        assert!(first.renewed_as(&renewed));
        assert!(first.renewed_as(&first.bytes));
        // Times that break the TTL (a torn write), another nonce, another length.
        let mut torn = renewed.clone();
        // A millisecond digit of `acquiredAt` changed alone (whatever it was).
        let digit = &mut torn[first.times.start + 20];
        *digit = b'0' + (*digit - b'0' + 1) % 10;
        assert!(!first.renewed_as(&torn));
        let other = render(
            &Fields {
                nonce: "1b5e6a0c-8d1e-4f5a-9b2c-3d4e5f607182",
                ..fields(W)
            },
            SystemTime::now(),
        );
        assert!(!first.renewed_as(&other.bytes));
        let mut longer = first.bytes.clone();
        longer.push(b' ');
        assert!(!first.renewed_as(&longer));
    }

    #[test]
    fn facts_are_padded_and_merge_only_under_the_same_nonce() {
        let facts = render_facts(
            sys::own_pid(),
            NONCE,
            "2026-11-29T10:02:11.123Z",
            Identity { dev: 1, ino: 2 },
        );
        assert!(facts.len() >= FACTS_BYTES);
        let v: Value = serde_json::from_slice(&sample()).unwrap();
        assert_eq!(v["kind"], KIND);
        assert_eq!(v["owner"]["pid"], sys::own_pid());
        assert_eq!(v["owner"]["hostname"], sys::hostname());
        assert_eq!(v["acquiredAt"], "2026-11-29T10:02:11.123Z", "the real time");
        let other = render(
            &Fields {
                nonce: "1b5e6a0c-8d1e-4f5a-9b2c-3d4e5f607182",
                ..fields(W)
            },
            SystemTime::now(),
        );
        let merged = with_facts(other.bytes.clone(), Some(&facts));
        assert_eq!(merged, other.bytes, "facts of another lease are ignored");
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
