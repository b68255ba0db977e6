//! [`Holder`]: who holds (or held) a workspace, as a lock record tells it.

use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};

/// Who holds (or held) a workspace lock, as read from its record.
///
/// Every field is optional because records written by the JavaScript SDK carry only
/// `owner.pid`, `operation` and `acquiredAt`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Holder {
    /// The owner's process id (in the writer's pid namespace).
    pub pid: Option<i64>,
    /// The host name the owner ran on.
    pub hostname: Option<String>,
    /// The kernel boot id the owner ran under.
    pub boot_id: Option<String>,
    /// The owner's start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: Option<u64>,
    /// A short description of the owner's command (`arcane serve`).
    pub command: Option<String>,
    /// The operation it runs.
    pub operation: Option<String>,
    /// When it took the lock (`acquiredAt`, RFC 3339 UTC).
    pub since: Option<String>,
    /// The lease nonce.
    pub nonce: Option<String>,
    /// Whether the record was written by a holder of the advisory lock (Arcane), as
    /// opposed to the JavaScript SDK, which holds none.
    pub advisory_lock: bool,
    /// Whether the owner is known to be alive (`None`: not judged).
    pub alive: Option<bool>,
}

impl Holder {
    /// The holder as a JSON object (the `holder` of `arcane lock status --output json`).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|_| json!({}))
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.pid {
            Some(pid) => write!(f, "pid {pid}")?,
            None => write!(f, "an unknown process")?,
        }
        if let Some(command) = &self.command {
            write!(f, " (`{command}`)")?;
        }
        if let Some(host) = &self.hostname {
            write!(f, " on host `{host}`")?;
        }
        if let Some(since) = &self.since {
            write!(f, " since {}", short_time(since))?;
        }
        if let Some(operation) = &self.operation {
            write!(f, ", operation `{operation}`")?;
        }
        Ok(())
    }
}

/// `2026-11-29T10:02:11.123Z` → `10:02:11Z` when it is today (UTC), else without
/// milliseconds.
pub(crate) fn short_time(rfc3339: &str) -> String {
    let today = arcane_report::time::now_rfc3339();
    let trimmed = match (rfc3339.find('.'), rfc3339.ends_with('Z')) {
        (Some(dot), true) => format!("{}Z", &rfc3339[..dot]),
        _ => rfc3339.to_string(),
    };
    if rfc3339.len() >= 11 && today.get(..10) == rfc3339.get(..10) {
        trimmed[11..].to_string()
    } else {
        trimmed
    }
}

/// `1.5 s`, `250 ms`, `2 min 5 s`.
pub(crate) fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        let tenths = ms / 100;
        if tenths.is_multiple_of(10) {
            format!("{} s", tenths / 10)
        } else {
            format!("{}.{} s", tenths / 10, tenths % 10)
        }
    } else {
        let secs = d.as_secs();
        if secs.is_multiple_of(60) {
            format!("{} min", secs / 60)
        } else {
            format!("{} min {} s", secs / 60, secs % 60)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_pid_command_host_time_and_operation() {
        let holder = Holder {
            pid: Some(412),
            hostname: Some("h".into()),
            command: Some("arcane serve".into()),
            operation: Some("serve".into()),
            since: Some("2001-01-01T10:02:11.000Z".into()),
            ..Holder::default()
        };
        assert_eq!(
            holder.to_string(),
            "pid 412 (`arcane serve`) on host `h` since 2001-01-01T10:02:11Z, operation `serve`"
        );
    }

    #[test]
    fn today_is_shortened_to_the_time_of_day() {
        let now = arcane_report::time::now_rfc3339();
        assert_eq!(short_time(&now), format!("{}Z", &now[11..19]));
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(human_duration(Duration::from_millis(250)), "250 ms");
        assert_eq!(human_duration(Duration::from_secs(30)), "30 s");
        assert_eq!(human_duration(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(human_duration(Duration::from_secs(125)), "2 min 5 s");
        assert_eq!(human_duration(Duration::from_secs(120)), "2 min");
    }
}
