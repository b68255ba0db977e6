//! Text to phonemes with espeak-ng run as a child process, and phonemes to the ids a
//! Piper graph reads.
//!
//! Piper links libespeak-ng and keeps each clause's punctuation; the espeak-ng command
//! line prints IPA one clause a line and drops the punctuation. So this module splits
//! the text into clauses itself (at `. , ; : ! ?` followed by a space or the end),
//! hands them to one espeak-ng run separated by blank lines (a paragraph break always
//! ends a clause, so one line comes back per clause), and puts the punctuation back as
//! piper-phonemize does: `. ? !` end a sentence, `, ; :` are followed by a space. When
//! espeak-ng splits a clause of its own accord (a very long one), the line count no
//! longer matches and each clause is phonemized by its own run instead.
//!
//! Every run has a deadline ([`Phonemizer::with_timeout`]); a run that outlives it is
//! killed with its process group. The child is started by `arcane_process::spawn`, the
//! one place Arcane starts processes.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use arcane_process::{Spec, StdioMode};

use crate::config::{is_voice_name, BOS, EOS, PAD};
use crate::Error;

/// The deadline of one espeak-ng run unless [`Phonemizer::with_timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The most bytes of espeak-ng's standard output read (a 4096-character text prints
/// about as many IPA characters).
const MAX_OUTPUT_BYTES: u64 = 4 << 20;

/// The most bytes of espeak-ng's standard error kept for an error message.
const MAX_STDERR_BYTES: u64 = 4096;

/// Punctuation that ends a clause, as piper-phonemize recognises it.
const CLAUSE_ENDS: [char; 6] = ['.', ',', ';', ':', '!', '?'];

/// espeak-ng run as a child process (an executable path), with a deadline on every
/// call.
#[derive(Debug, Clone)]
pub struct Phonemizer {
    executable: PathBuf,
    timeout: Duration,
}

/// One clause of the text: what espeak-ng reads, and the punctuation that ended it.
#[derive(Debug, Clone, PartialEq)]
struct Clause {
    text: String,
    end: Option<char>,
}

impl Phonemizer {
    /// A phonemizer that runs `executable` (espeak-ng) with the default deadline
    /// ([`DEFAULT_TIMEOUT`]).
    pub fn new(executable: PathBuf) -> Phonemizer {
        Phonemizer {
            executable,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Finds `espeak-ng` on `PATH` (None if absent).
    pub fn find() -> Option<Phonemizer> {
        // The one environment read of this crate: the caller asked for a PATH lookup,
        // as a shell would do it.
        #[allow(clippy::disallowed_methods)]
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .filter(|dir| dir.is_absolute())
            .map(|dir| dir.join("espeak-ng"))
            .find(|candidate| is_executable(candidate))
            .map(Phonemizer::new)
    }

    /// The same phonemizer with a deadline of `timeout` on each run.
    pub fn with_timeout(mut self, timeout: Duration) -> Phonemizer {
        self.timeout = timeout;
        self
    }

    /// The executable it runs.
    pub fn executable(&self) -> &Path {
        &self.executable
    }

    /// The deadline of each run.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// IPA phonemes of `text` for espeak voice `voice` (e.g. "en-us"), with clause
    /// punctuation kept as Piper keeps it; sentences are joined by a space.
    pub fn phonemize(&self, voice: &str, text: &str) -> Result<String, Error> {
        Ok(self.sentences(voice, text)?.join(" "))
    }

    /// The phonemes of each sentence of `text` (a sentence ends at `.`, `?` or `!`),
    /// as Piper synthesizes them one by one. Sentences without phonemes are left out.
    pub(crate) fn sentences(&self, voice: &str, text: &str) -> Result<Vec<String>, Error> {
        if !is_voice_name(voice) {
            return Err(Error::BadVoiceName {
                voice: voice.to_string(),
            });
        }
        let clauses = split_clauses(text);
        let spoken: Vec<usize> = (0..clauses.len())
            .filter(|&i| speakable(&clauses[i].text))
            .collect();
        let mut phonemes = vec![String::new(); clauses.len()];
        if !spoken.is_empty() {
            let input: Vec<&str> = spoken.iter().map(|&i| clauses[i].text.as_str()).collect();
            let output = self.run(voice, &input.join("\n\n"))?;
            let lines: Vec<&str> = output.lines().collect();
            if lines.len() == spoken.len() {
                for (&i, line) in spoken.iter().zip(lines) {
                    phonemes[i] = clean(line);
                }
            } else {
                for &i in &spoken {
                    let output = self.run(voice, &clauses[i].text)?;
                    let words: Vec<String> = output.lines().map(clean).collect();
                    phonemes[i] = words
                        .into_iter()
                        .filter(|w| !w.is_empty())
                        .collect::<Vec<_>>()
                        .join(" ");
                }
            }
        }
        let mut sentences = Vec::new();
        let mut sentence = String::new();
        for (clause, phonemes) in clauses.iter().zip(phonemes) {
            sentence.push_str(&phonemes);
            match clause.end {
                Some(end @ ('.' | '?' | '!')) => {
                    sentence.push(end);
                    sentences.push(std::mem::take(&mut sentence));
                }
                Some(end) => {
                    sentence.push(end);
                    sentence.push(' ');
                }
                None => {}
            }
        }
        sentences.push(sentence);
        sentences.retain(|s| {
            s.chars()
                .any(|c| !c.is_whitespace() && !CLAUSE_ENDS.contains(&c))
        });
        Ok(sentences)
    }

    /// Runs espeak-ng on `input` (fed on standard input, so text starting with `-` is
    /// not an option) and returns what it printed, within the deadline.
    fn run(&self, voice: &str, input: &str) -> Result<String, Error> {
        let executable = self.executable.clone();
        let mut spec = Spec::new(&executable).args(["-q", "--ipa", "-v", voice, "--stdin"]);
        spec.stdin = StdioMode::Piped;
        spec.stdout = StdioMode::Piped;
        spec.stderr = StdioMode::Piped;
        let mut child = arcane_process::spawn(spec).map_err(|source| Error::PhonemizerStart {
            executable: executable.clone(),
            source,
        })?;
        let stdin = child.stdin.take();
        let input = format!("{input}\n");
        let writer = std::thread::spawn(move || {
            if let Some(mut stdin) = stdin {
                // A child that exits without reading gives EPIPE: its exit says why.
                let _ = stdin.write_all(input.as_bytes());
            }
        });
        let stdout = read_all(child.stdout.take(), MAX_OUTPUT_BYTES);
        let stderr = read_all(child.stderr.take(), MAX_STDERR_BYTES);
        let exit = child.wait_timeout(self.timeout);
        if exit.is_none() {
            child.signal(libc::SIGKILL);
            child.wait();
        }
        // The group is gone now (its leftovers are killed once the leader is reaped),
        // so the pipes are closed and these threads end.
        let _ = writer.join();
        let stdout = stdout.join().unwrap_or_default();
        let stderr = String::from_utf8_lossy(&stderr.join().unwrap_or_default()).into_owned();
        let Some(exit) = exit else {
            return Err(Error::PhonemizerTimeout {
                executable,
                timeout_ms: self.timeout.as_millis(),
            });
        };
        let failed = |reason: String| Error::PhonemizerFailed {
            executable: executable.clone(),
            reason,
            stderr: stderr.clone(),
        };
        if !exit.success() {
            return Err(failed(exit.describe()));
        }
        if stdout.len() as u64 > MAX_OUTPUT_BYTES {
            return Err(failed(format!(
                "it printed more than {MAX_OUTPUT_BYTES} bytes"
            )));
        }
        String::from_utf8(stdout).map_err(|_| failed("its output is not UTF-8".into()))
    }
}

/// Reads up to `limit + 1` bytes of `stream` on a thread (so that a full pipe never
/// blocks the child), then drains the rest.
fn read_all<R: Read + Send + 'static>(
    stream: Option<R>,
    limit: u64,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut stream) = stream {
            let _ = (&mut stream).take(limit + 1).read_to_end(&mut bytes);
            let _ = std::io::copy(&mut stream, &mut std::io::sink());
        }
        bytes
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Splits `text` into clauses at clause punctuation followed by whitespace or the end.
/// Whitespace (line breaks included) becomes single spaces, control characters go, so
/// a clause never holds the blank line that separates clauses on espeak-ng's input.
fn split_clauses(text: &str) -> Vec<Clause> {
    let chars: Vec<char> = text
        .chars()
        .map(|c| if c.is_whitespace() { ' ' } else { c })
        .filter(|c| !c.is_control())
        .collect();
    let mut clauses = Vec::new();
    let mut current = String::new();
    for (i, &c) in chars.iter().enumerate() {
        let ends = CLAUSE_ENDS.contains(&c) && chars.get(i + 1).is_none_or(|n| *n == ' ');
        if c == ' ' && current.ends_with(' ') {
            continue;
        }
        current.push(c);
        if ends {
            clauses.push(Clause {
                text: current.trim().to_string(),
                end: Some(c),
            });
            current.clear();
        }
    }
    if !current.trim().is_empty() {
        clauses.push(Clause {
            text: current.trim().to_string(),
            end: None,
        });
    }
    clauses
}

/// `phonemes` (one sentence's) cut into pieces of at most `max` phonemes (codepoints,
/// `max` ≥ 1), at word boundaries (spaces) where a word fits and inside a word where
/// it alone is longer: a graph's memory grows with the audio of one run, so a sentence
/// without punctuation is not one run.
pub(crate) fn split_phonemes(phonemes: &str, max: usize) -> Vec<String> {
    let max = max.max(1);
    let mut pieces = Vec::new();
    let mut current = String::new();
    let mut count = 0;
    for word in phonemes.split(' ').filter(|w| !w.is_empty()) {
        let length = word.chars().count();
        if count > 0 && count + 1 + length > max {
            pieces.push(std::mem::take(&mut current));
            count = 0;
        }
        if count > 0 {
            current.push(' ');
            count += 1;
        }
        for c in word.chars() {
            if count == max {
                pieces.push(std::mem::take(&mut current));
                count = 0;
            }
            current.push(c);
            count += 1;
        }
    }
    if !current.is_empty() {
        pieces.push(current);
    }
    pieces
}

/// Whether espeak-ng could say anything for `text` (more than spaces and ASCII
/// punctuation).
fn speakable(text: &str) -> bool {
    text.chars()
        .any(|c| !c.is_whitespace() && !c.is_ascii_punctuation())
}

/// One line of espeak-ng's IPA: trimmed, with language switches (`(fr)…(en)`) removed
/// as piper-phonemize removes them.
fn clean(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_flag = false;
    for c in line.trim().chars() {
        match c {
            '(' => in_flag = true,
            ')' if in_flag => in_flag = false,
            _ if in_flag => {}
            _ => out.push(c),
        }
    }
    out
}

/// A phoneme string turned into a Piper graph's input ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PhonemeIds {
    /// BOS, pad, then each known phoneme's ids followed by pad, then EOS.
    pub ids: Vec<i64>,
    /// How many phonemes (codepoints) were found in the map.
    pub found: usize,
    /// Phonemes missing from the map (skipped), with how often each occurred.
    pub missing: BTreeMap<char, usize>,
}

/// Turns `phonemes` into ids as piper-phonemize's `phonemes_to_ids` does: BOS, pad,
/// then for every codepoint its ids and a pad, then EOS. Codepoints missing from the
/// map are skipped and counted.
pub(crate) fn phoneme_ids(
    map: &std::collections::HashMap<char, Vec<i64>>,
    phonemes: &str,
) -> PhonemeIds {
    let special = |c: char| map.get(&c).map(Vec::as_slice).unwrap_or(&[]);
    let pad = special(PAD);
    let mut out = PhonemeIds::default();
    out.ids.extend_from_slice(special(BOS));
    out.ids.extend_from_slice(pad);
    for c in phonemes.chars() {
        match map.get(&c) {
            Some(ids) => {
                out.ids.extend_from_slice(ids);
                out.ids.extend_from_slice(pad);
                out.found += 1;
            }
            None => *out.missing.entry(c).or_default() += 1,
        }
    }
    out.ids.extend_from_slice(special(EOS));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clause(text: &str, end: Option<char>) -> Clause {
        Clause {
            text: text.into(),
            end,
        }
    }

    #[test]
    fn clauses_end_at_punctuation_before_a_space_or_the_end() {
        assert_eq!(
            split_clauses("Hello,  world.\nIt is 3:45, 3.5 -- fine!  ok"),
            vec![
                clause("Hello,", Some(',')),
                clause("world.", Some('.')),
                clause("It is 3:45,", Some(',')),
                clause("3.5 -- fine!", Some('!')),
                clause("ok", None),
            ]
        );
        assert_eq!(split_clauses("   "), vec![]);
        assert_eq!(split_clauses("-v x"), vec![clause("-v x", None)]);
        assert!(!speakable("...!"));
        assert!(speakable("é"));
    }

    #[test]
    fn long_sentences_are_cut_at_words_and_long_words_inside() {
        assert_eq!(split_phonemes("ab cd ef", 5), vec!["ab cd", "ef"]);
        assert_eq!(split_phonemes("ab cd ef", 8), vec!["ab cd ef"]);
        assert_eq!(split_phonemes("abcdefg h", 3), vec!["abc", "def", "g h"]);
        assert_eq!(split_phonemes("  ", 3), Vec::<String>::new());
        let sentence = "wˈɜːd ".repeat(819);
        let pieces = split_phonemes(&sentence, 256);
        assert!(pieces.iter().all(|p| p.chars().count() <= 256));
        assert_eq!(pieces.join(" "), sentence.trim_end());
        assert!(pieces
            .iter()
            .all(|p| !p.starts_with(' ') && !p.ends_with(' ')));
    }

    #[test]
    fn language_switches_are_removed() {
        assert_eq!(clean(" (fr)bɔ̃ʒuʁ(en) wˈɜːld "), "bɔ̃ʒuʁ wˈɜːld");
    }

    #[test]
    fn ids_are_bos_pad_then_phoneme_pad_pairs_then_eos() {
        let map = [('_', 0), ('^', 1), ('$', 2), (' ', 3), ('a', 14)]
            .into_iter()
            .map(|(c, id)| (c, vec![id]))
            .collect();
        let ids = phoneme_ids(&map, "a aX");
        assert_eq!(ids.ids, vec![1, 0, 14, 0, 3, 0, 14, 0, 2]);
        assert_eq!(ids.found, 3);
        assert_eq!(ids.missing, BTreeMap::from([('X', 1)]));
    }
}
