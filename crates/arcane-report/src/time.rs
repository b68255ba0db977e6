//! Wall-clock timestamps as RFC 3339 UTC strings, without a date-time dependency.
//!
//! Timestamps are for people and records only. Nothing in Arcane decides liveness or
//! expiry by comparing wall clocks (a skewed or jumping clock must never steal a lock).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The current time as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn now_rfc3339() -> String {
    format_rfc3339(SystemTime::now())
}

/// Formats `time` as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC). Times before 1970 clamp to the epoch.
///
/// Written digit by digit rather than with `format!`: the workspace lock formats several
/// of these per acquisition, and the formatting machinery cost more than the lock's own
/// system calls.
pub fn format_rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = since.as_secs();
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    let mut text = String::with_capacity(24);
    // Years past 9999 keep every digit (the text then grows, as `{:04}` did).
    let year = year.max(0) as u64;
    push_digits(
        &mut text,
        year,
        (year.checked_ilog10().unwrap_or(0) + 1).max(4),
    );
    for (separator, value, width) in [
        ('-', u64::from(month), 2),
        ('-', u64::from(day), 2),
        ('T', rem / 3600, 2),
        (':', (rem / 60) % 60, 2),
        (':', rem % 60, 2),
        ('.', u64::from(since.subsec_millis()), 3),
    ] {
        text.push(separator);
        push_digits(&mut text, value, width);
    }
    text.push('Z');
    text
}

/// Appends the last `width` (at most 20) decimal digits of `value`, zero-padded.
fn push_digits(text: &mut String, value: u64, width: u32) {
    let mut digits = [b'0'; 20];
    let width = (width as usize).min(digits.len());
    let mut rest = value;
    for slot in digits[..width].iter_mut().rev() {
        *slot = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    for &digit in &digits[..width] {
        text.push(char::from(digit));
    }
}

/// Parses the subset of RFC 3339 that Arcane and the JavaScript SDK write
/// (`YYYY-MM-DDTHH:MM:SS[.fff]Z`, UTC). Returns `None` for anything else.
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let bytes = text.as_bytes();
    if bytes.len() < 20 || *bytes.last()? != b'Z' {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<u64> {
        let s = text.get(range)?;
        if !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    if bytes[4] != b'-'
        || bytes[7] != b'-'
        || bytes[10] != b'T'
        || bytes[13] != b':'
        || bytes[16] != b':'
    {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut nanos = 0u32;
    let tail = &text[19..text.len() - 1];
    if !tail.is_empty() {
        let frac = tail.strip_prefix('.')?;
        if frac.is_empty() || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        nanos = format!("{frac:0<9}").parse().ok()?;
    }
    let days = days_from_civil(year as i64, month as u32, day as u32);
    if days < 0 {
        return None;
    }
    let secs = days as u64 * 86_400 + hour * 3600 + minute * 60 + second;
    Some(UNIX_EPOCH + Duration::new(secs, nanos))
}

// Howard Hinnant's civil-from-days algorithm (public domain), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_known_instants() {
        let t = UNIX_EPOCH + Duration::from_millis(1_796_000_123_456);
        let s = format_rfc3339(t);
        assert_eq!(s, "2026-11-30T00:55:23.456Z");
        assert_eq!(parse_rfc3339(&s), Some(t));
        assert_eq!(format_rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            parse_rfc3339("2000-02-29T12:00:00Z"),
            Some(UNIX_EPOCH + Duration::from_secs(951_825_600))
        );
    }

    #[test]
    fn the_digit_by_digit_formatting_is_what_format_writes() {
        // Across leap years, month ends and millisecond edges, up to year 10000.
        let mut millis: u64 = 0;
        while millis < 253_402_300_800_000 + 86_400_000 * 400 {
            let t = UNIX_EPOCH + Duration::from_millis(millis);
            let since = t.duration_since(UNIX_EPOCH).unwrap();
            let secs = since.as_secs();
            let (year, month, day) = civil_from_days((secs / 86_400) as i64);
            let rem = secs % 86_400;
            let expected = format!(
                "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
                rem / 3600,
                (rem / 60) % 60,
                rem % 60,
                since.subsec_millis()
            );
            assert_eq!(format_rfc3339(t), expected);
            if year < 10_000 {
                assert_eq!(parse_rfc3339(&expected), Some(t), "{expected}");
            }
            millis += 86_399_999 * 7 + 1_013;
        }
    }

    #[test]
    fn rejects_malformed_text() {
        for bad in [
            "",
            "2026-11-29",
            "2026-13-01T00:00:00Z",
            "2026-11-29T00:00:00+01:00",
            "2026-11-29T00:00:00.Z",
            "yyyy-11-29T00:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}
