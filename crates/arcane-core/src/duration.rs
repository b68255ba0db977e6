//! The one reading of a duration a person types: seconds as a bare number, or a
//! string of amounts with units (`500ms`, `90s`, `5m`, `1h30m`). `keep_alive`,
//! `--since` and the CLI's timeouts all read durations through [`parse`], so `5m`
//! means the same everywhere.

use std::time::Duration;

/// The longest duration accepted (ten years): larger values are a typo, and they
/// would overflow clock arithmetic.
const MAX_SECONDS: f64 = 10.0 * 365.0 * 86_400.0;

/// Parses a non-negative duration: `"300"`, `"2.5"`, `"500ms"`, `"90s"`, `"5m"`,
/// `"1h30m"`; the error names the text.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let bad =
        || format!("`{text}` is not a duration (seconds, or like `500ms`, `90s`, `5m`, `1h30m`)");
    let seconds = match text.parse::<f64>() {
        Ok(seconds) => seconds,
        Err(_) => sum_of_units(text).ok_or_else(bad)?,
    };
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(bad());
    }
    if seconds > MAX_SECONDS {
        return Err(format!("`{text}` is too long (at most ten years)"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// `1h30m` → 5400: amounts each followed by `ms`, `s`, `m` or `h`.
fn sum_of_units(text: &str) -> Option<f64> {
    if text.is_empty() {
        return None;
    }
    let mut total = 0.0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .filter(|&end| end > 0)?;
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, length) = if rest.starts_with("ms") {
            (0.001, 2)
        } else {
            match rest.chars().next()? {
                's' => (1.0, 1),
                'm' => (60.0, 1),
                'h' => (3600.0, 1),
                _ => return None,
            }
        };
        total += value * unit;
        rest = &rest[length..];
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_units_mean_the_same() {
        let secs = |s: f64| Ok(Duration::from_secs_f64(s));
        assert_eq!(parse("300"), secs(300.0));
        assert_eq!(parse("5m"), secs(300.0));
        assert_eq!(parse(" 1h30m "), secs(5400.0));
        assert_eq!(parse("500ms"), secs(0.5));
        assert_eq!(parse("1m30s250ms"), secs(90.25));
        assert_eq!(parse("2.5s"), secs(2.5));
        assert_eq!(parse("0"), secs(0.0));
    }

    #[test]
    fn nonsense_is_refused_naming_it() {
        for text in [
            "", "5x", "m", "5m3", "soon", "-1", "-5m", "1e400", "NaN", "inf",
        ] {
            let error = parse(text).unwrap_err();
            assert!(error.contains(text.trim()), "{text}: {error}");
        }
        assert!(parse("99999999999h").unwrap_err().contains("too long"));
    }
}
