//! All CLI output goes through [`Output`]: results, events, errors and progress.
//!
//! * `human`: lines for a person on stdout, diagnostics and events on stderr,
//!   progress bars only when stderr is a terminal.
//! * `json`: exactly one JSON document on stdout (the result, or `{"error": {…}}`).
//! * `ndjson`: events as `{type,time,data}` lines on stdout as they happen, then the
//!   result (or `{"type": "error", "error": {…}}`) as the last line.
//!
//! In machine modes stdout carries only data; anything for a person goes to stderr.
//! A closed stdout (`arcane … | head`) is not an error.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;

use arcane_report::{error_json, Diagnostic, Event, EventSink};
use serde_json::Value;

use crate::cli::OutputMode;

/// The CLI's printer.
pub struct Output {
    /// The selected mode.
    pub mode: OutputMode,
    /// `-v` count.
    pub verbose: u8,
    color: bool,
    stderr_tty: bool,
    lock: Mutex<()>,
}

impl Output {
    /// A printer for `mode`.
    pub fn new(mode: OutputMode, verbose: u8) -> Self {
        Self {
            mode,
            verbose,
            color: crate::config::color_allowed() && std::io::stderr().is_terminal(),
            stderr_tty: std::io::stderr().is_terminal(),
            lock: Mutex::new(()),
        }
    }

    /// Whether a person is reading (human mode).
    pub fn is_human(&self) -> bool {
        self.mode == OutputMode::Human
    }

    /// Whether progress bars may be drawn (human mode, stderr is a terminal, not `-v`).
    pub fn progress_allowed(&self) -> bool {
        self.is_human() && self.stderr_tty && self.verbose == 0
    }

    /// Prints a command's result: `human` text for a person, `value` for machines.
    pub fn result(&self, human: &str, value: &Value) {
        let _guard = self.lock.lock();
        let mut out = std::io::stdout().lock();
        let _ = match self.mode {
            OutputMode::Human => {
                if human.is_empty() {
                    Ok(())
                } else if human.ends_with('\n') {
                    out.write_all(human.as_bytes())
                } else {
                    writeln!(out, "{human}")
                }
            }
            OutputMode::Json => serde_json::to_writer_pretty(&mut out, value)
                .map_err(std::io::Error::other)
                .and_then(|_| writeln!(out)),
            OutputMode::Ndjson => serde_json::to_writer(&mut out, value)
                .map_err(std::io::Error::other)
                .and_then(|_| writeln!(out)),
        };
        let _ = out.flush();
    }

    /// A status line for a person (stderr, human mode only).
    pub fn note(&self, line: &str) {
        if self.is_human() {
            let _guard = self.lock.lock();
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "{line}");
        }
    }

    /// Renders an event: a human line on stderr, or an NDJSON line on stdout.
    /// In `json` mode events are not printed (the document is the result).
    pub fn event(&self, event: &Event) {
        match self.mode {
            OutputMode::Human => {
                if let Some(line) = human_event(event, self.verbose) {
                    self.note(&line);
                }
            }
            OutputMode::Ndjson => {
                let _guard = self.lock.lock();
                let mut out = std::io::stdout().lock();
                if serde_json::to_writer(&mut out, event).is_ok() {
                    let _ = writeln!(out);
                }
                let _ = out.flush();
            }
            OutputMode::Json => {}
        }
    }

    /// Renders an error: `error: …`, `caused by: …` lines, the engine's last output
    /// lines (when the details carry them) and hints for a person; for machines, on
    /// stdout as the result, `{"error": E}` (`json`) or `{"type": "error", "error": E}`
    /// (`ndjson`), where `E` is `{"code", "message", "details"}` plus `"causes"` and
    /// `"hints"` when there are any (`arcane_report::error_json`).
    pub fn error(&self, error: &dyn Diagnostic) {
        match self.mode {
            OutputMode::Human => {
                let mut text = format!("{}: {error}", self.paint("error", "1;31"));
                if self.verbose > 0 {
                    text.push_str(&format!(" [{}]", error.code()));
                }
                let mut source = error.source();
                while let Some(cause) = source {
                    text.push_str(&format!("\n  caused by: {cause}"));
                    source = cause.source();
                }
                let details = error.details();
                text.push_str(&last_lines_text(&details));
                if self.verbose > 0 && !details.is_null() {
                    text.push_str(&format!("\n  details: {details}"));
                }
                for hint in error.hints() {
                    text.push_str(&format!("\n\n{}: {hint}", self.paint("hint", "1;36")));
                }
                let _guard = self.lock.lock();
                let _ = writeln!(std::io::stderr().lock(), "{text}");
            }
            OutputMode::Json => self.result("", &serde_json::json!({"error": error_json(error)})),
            OutputMode::Ndjson => self.result(
                "",
                &serde_json::json!({"type": "error", "error": error_json(error)}),
            ),
        }
    }

    fn paint(&self, text: &str, style: &str) -> String {
        if self.color {
            format!("\x1b[{style}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
}

impl EventSink for Output {
    fn emit(&self, event: Event) {
        self.event(&event);
    }
}

/// How long a progress bar runs before it shows a rate. Earlier, the first update
/// (which may carry everything done before the bar existed) divided by almost no time
/// makes rates such as `643.59 GiB/s`.
const RATE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// The one progress-bar style of the CLI: `template` as indicatif reads it, plus
/// `{rate}` (binary units, `MiB/s`) and `{decimal_rate}` (`MB/s`), which stay empty
/// until the bar has run for [`RATE_AFTER`]. Use these instead of indicatif's
/// `{bytes_per_sec}`. `None` when the template is invalid (the bar keeps the default).
pub fn progress_style(template: &str) -> Option<indicatif::ProgressStyle> {
    let style = indicatif::ProgressStyle::with_template(template).ok()?;
    let rate = |decimal: bool| {
        move |state: &indicatif::ProgressState, out: &mut dyn std::fmt::Write| {
            let _ = out.write_str(&rate_text(state.elapsed(), state.per_sec(), decimal));
        }
    };
    Some(
        style
            .with_key("rate", rate(false))
            .with_key("decimal_rate", rate(true)),
    )
}

/// A rate for a person, or nothing while too little time has passed to tell.
fn rate_text(elapsed: std::time::Duration, per_second: f64, decimal: bool) -> String {
    if elapsed < RATE_AFTER || !per_second.is_finite() || per_second < 0.0 {
        return String::new();
    }
    let bytes = per_second as u64;
    if decimal {
        format!("{}/s", indicatif::DecimalBytes(bytes))
    } else {
        format!("{}/s", indicatif::BinaryBytes(bytes))
    }
}

/// The most engine output lines a human error shows (`details.lastLines` keeps more).
const SHOWN_LAST_LINES: usize = 10;

/// The last lines an engine printed (`details.lastLines`, as the supervisor's errors
/// carry them), indented under the error: often the real cause, e.g. `error: invalid
/// argument: --ctx-sise`. Empty when there are none.
fn last_lines_text(details: &Value) -> String {
    let lines: Vec<&str> = details["lastLines"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if lines.is_empty() {
        return String::new();
    }
    let shown = &lines[lines.len().saturating_sub(SHOWN_LAST_LINES)..];
    let mut text = String::from("\n  the engine's last output lines:");
    for line in shown {
        text.push_str(&format!("\n    | {line}"));
    }
    text
}

/// The human line for an event, or `None` to keep it quiet at this verbosity.
/// Each command module renders its own subsystem's events (see `cmd::human_event`);
/// unknown events show as their type and data at `-v`.
fn human_event(event: &Event, verbose: u8) -> Option<String> {
    match crate::cmd::human_event(event, verbose) {
        Some(line) => Some(line),
        None => (verbose > 1).then(|| format!("{} {}", event.kind, event.data)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_rate_is_shown_before_enough_time_has_passed() {
        let huge = 643.59 * 1024.0 * 1024.0 * 1024.0;
        assert_eq!(
            rate_text(std::time::Duration::from_millis(2), huge, false),
            ""
        );
        assert_eq!(
            rate_text(std::time::Duration::ZERO, f64::INFINITY, true),
            ""
        );
        assert_eq!(
            rate_text(
                std::time::Duration::from_secs(2),
                2.0 * 1024.0 * 1024.0,
                false
            ),
            "2.00 MiB/s"
        );
        assert_eq!(
            rate_text(std::time::Duration::from_secs(2), 2e6, true),
            "2.00 MB/s"
        );
    }

    /// A terminal that records what a bar draws.
    #[derive(Debug, Clone, Default)]
    struct Screen(std::sync::Arc<std::sync::Mutex<String>>);

    impl indicatif::TermLike for Screen {
        fn width(&self) -> u16 {
            200
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, line: &str) -> std::io::Result<()> {
            self.write_str(&format!("{line}\n"))
        }
        fn write_str(&self, text: &str) -> std::io::Result<()> {
            if let Ok(mut screen) = self.0.lock() {
                screen.push_str(text);
            }
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Issue 10, item 11: the first update of a bar (bytes done before it existed, no
    /// time elapsed) draws no rate.
    #[test]
    fn a_bars_first_draw_has_no_rate() {
        let screen = Screen::default();
        let target = indicatif::ProgressDrawTarget::term_like(Box::new(screen.clone()));
        let bar = indicatif::ProgressBar::with_draw_target(Some(10 << 30), target);
        bar.set_style(progress_style("{msg} {bytes}/{total_bytes} {rate}").unwrap());
        bar.set_message("building");
        bar.set_position(5 << 30);
        bar.tick();
        let drawn = screen.0.lock().unwrap().clone();
        assert!(drawn.contains("building 5.00 GiB/10.00 GiB"), "{drawn:?}");
        assert!(!drawn.contains("/s"), "{drawn:?}");
    }

    #[test]
    fn the_last_engine_lines_are_shown_bounded_and_in_order() {
        let lines: Vec<String> = (1..=15).map(|i| format!("line {i}")).collect();
        let text = last_lines_text(&serde_json::json!({"lastLines": lines}));
        assert!(text.contains("| line 15"), "{text}");
        assert!(text.contains("| line 6\n"), "{text}");
        assert!(!text.contains("| line 5\n"), "{text}");
        assert!(text.find("line 6").unwrap() < text.find("line 15").unwrap());
        assert_eq!(last_lines_text(&serde_json::json!({"lastLines": []})), "");
        assert_eq!(last_lines_text(&Value::Null), "");
    }
}
