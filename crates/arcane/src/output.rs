//! All CLI output goes through [`Output`]: results, events, errors and progress.
//!
//! * `human`: lines for a person on stdout, diagnostics and events on stderr,
//!   progress bars only when stderr is a terminal.
//! * `json`: exactly one JSON document on stdout (the result, or the error object).
//! * `ndjson`: events as `{type,time,data}` lines on stdout as they happen, then the
//!   result (or the error) as the last line.
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

    /// Renders an error: `error: …`, `caused by: …` lines and hints for a person, or
    /// `{"code","message","details"}` for machines (on stdout, as the result).
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

/// The human line for an event, or `None` to keep it quiet at this verbosity.
/// Each command module renders its own subsystem's events (see `cmd::human_event`);
/// unknown events show as their type and data at `-v`.
fn human_event(event: &Event, verbose: u8) -> Option<String> {
    match crate::cmd::human_event(event, verbose) {
        Some(line) => Some(line),
        None => (verbose > 1).then(|| format!("{} {}", event.kind, event.data)),
    }
}
