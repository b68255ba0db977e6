//! The gateway's view of an engine's answer, line by line: every `"model"` key renamed
//! to the name the client asked for, and the `usage` it reports found.
//!
//! Reads from an engine do not end where lines end: a `"model":"…"` key or a `usage`
//! object split across two reads was neither renamed nor counted when each read was
//! handled alone. [`LineTransformer`] holds the incomplete last line of a read until
//! the next read (or the end) completes it, then handles whole lines only: SSE
//! `data:` lines, NDJSON lines, a compact JSON answer. A line longer than
//! [`MAX_LINE`] is passed on as it is (a binary answer is not held whole).
//!
//! Without a rename the answer passes through untouched, read by read (its length
//! stays exact); only a copy of the incomplete line is kept to find `usage`.

use bytes::Bytes;
use serde_json::Value;

/// The longest line held back waiting for its end.
pub const MAX_LINE: usize = 1 << 20;

/// What one read (or the end) gives: the bytes to send now and the last `usage` the
/// completed lines reported.
#[derive(Debug, Default)]
pub struct Transformed {
    /// The bytes to send on (possibly none, while a line is incomplete).
    pub data: Bytes,
    /// The `usage` object of the last completed line that had one.
    pub usage: Option<Value>,
}

/// What rewrites an engine's answer on its way to the client, read by read: the
/// gateway's rename ([`LineTransformer`]) or a translation into another API's shape
/// (the Ollama API, [`crate::apis::ollama`]). The passthrough's body holds the request's
/// work and lease until [`Rewrite::finish`], and reports each `usage` to the lease, so
/// every rewrite is measured and drained alike.
pub trait Rewrite: Send + Sync {
    /// Feeds one read: the bytes to send now and the `usage` it completed.
    fn push(&mut self, data: Bytes) -> Transformed;
    /// The end of the answer: what is left to send.
    fn finish(&mut self) -> Transformed;
    /// Whether bytes are held back (the answer is not over when the engine's is).
    fn holding(&self) -> bool;
    /// Whether the answer's length changes (it is then sent without a length).
    fn changes_length(&self) -> bool;
}

impl Rewrite for LineTransformer {
    fn push(&mut self, data: Bytes) -> Transformed {
        LineTransformer::push(self, data)
    }

    fn finish(&mut self) -> Transformed {
        LineTransformer::finish(self)
    }

    fn holding(&self) -> bool {
        LineTransformer::holding(self)
    }

    fn changes_length(&self) -> bool {
        self.renames()
    }
}

/// Renames `"model"` values and finds `usage` in an answer read piece by piece.
#[derive(Debug)]
pub struct LineTransformer {
    /// The JSON string `"model"` values become; `None`: the answer passes unchanged.
    rename: Option<String>,
    /// The incomplete last line.
    pending: Vec<u8>,
}

impl LineTransformer {
    /// A transformer renaming every `"model"` value to `asked` (`None`: only finding
    /// `usage`).
    pub fn new(asked: Option<&str>) -> Self {
        Self {
            rename: asked.map(|asked| serde_json::to_string(asked).unwrap_or_default()),
            pending: Vec::new(),
        }
    }

    /// Whether the answer's bytes change (its length is then unknown).
    pub fn renames(&self) -> bool {
        self.rename.is_some()
    }

    /// Whether a line is held back.
    pub fn holding(&self) -> bool {
        self.renames() && !self.pending.is_empty()
    }

    /// Feeds one read.
    pub fn push(&mut self, data: Bytes) -> Transformed {
        self.pending.extend_from_slice(&data);
        let complete = match self.pending.iter().rposition(|b| *b == b'\n') {
            Some(end) => end + 1,
            None if self.pending.len() > MAX_LINE => self.pending.len(),
            None => 0,
        };
        let lines: Vec<u8> = self.pending.drain(..complete).collect();
        let mut out = self.handle(&lines);
        if self.rename.is_none() {
            out.data = data;
        }
        out
    }

    /// The end of the answer: the held line, complete now.
    pub fn finish(&mut self) -> Transformed {
        let rest = std::mem::take(&mut self.pending);
        let mut out = self.handle(&rest);
        if self.rename.is_none() {
            out.data = Bytes::new();
        }
        out
    }

    /// Complete lines: their renamed bytes and last `usage`.
    fn handle(&self, lines: &[u8]) -> Transformed {
        let usage = lines
            .split(|b| *b == b'\n')
            .filter_map(line_usage)
            .next_back();
        let data = match &self.rename {
            Some(value) => rename_model(lines, value),
            None => Bytes::new(),
        };
        Transformed { data, usage }
    }
}

/// The `usage` object one line reports (an SSE `data:` line or a JSON line).
fn line_usage(line: &[u8]) -> Option<Value> {
    if !line.windows(7).any(|w| w == b"\"usage\"") {
        return None;
    }
    let text = std::str::from_utf8(line).ok()?.trim();
    let json = text.strip_prefix("data:").unwrap_or(text).trim();
    let value: Value = serde_json::from_str(json).ok()?;
    value.get("usage").filter(|u| u.is_object()).cloned()
}

/// The `usage` a whole answer reports: the body as one JSON document, else its last
/// line that reports one.
pub fn find_usage(data: &[u8]) -> Option<Value> {
    if !data.windows(7).any(|w| w == b"\"usage\"") {
        return None;
    }
    serde_json::from_slice::<Value>(data)
        .ok()
        .and_then(|v| v.get("usage").filter(|u| u.is_object()).cloned())
        .or_else(|| {
            data.split(|b| *b == b'\n')
                .filter_map(line_usage)
                .next_back()
        })
}

/// `data` with the value of every `"model"` key (`"model":"…"`, whitespace allowed
/// around the colon) replaced by `value`, a JSON string. Inside a JSON string every
/// quote is escaped (`\"`), so only keys match.
pub fn rename_model(data: &[u8], value: &str) -> Bytes {
    const KEY: &[u8] = b"\"model\"";
    let mut out = Vec::with_capacity(data.len());
    let mut rest = data;
    while let Some(at) = rest.windows(KEY.len()).position(|w| w == KEY) {
        let after_key = at + KEY.len();
        let Some(start) = string_value_start(&rest[after_key..]).map(|s| after_key + s) else {
            out.extend_from_slice(&rest[..after_key]);
            rest = &rest[after_key..];
            continue;
        };
        // The end of the string value: the first quote not escaped.
        let mut end = start;
        while end < rest.len() && rest[end] != b'"' {
            end += if rest[end] == b'\\' { 2 } else { 1 };
        }
        if end >= rest.len() {
            break;
        }
        out.extend_from_slice(&rest[..after_key]);
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
        rest = &rest[end + 1..];
    }
    out.extend_from_slice(rest);
    Bytes::from(out)
}

/// After a key: the offset just past the opening quote of its string value
/// (`: "`), or `None` when a string value does not follow.
fn string_value_start(after: &[u8]) -> Option<usize> {
    let mut i = 0;
    let skip = |i: &mut usize| {
        while after.get(*i).is_some_and(|b| b" \t\r".contains(b)) {
            *i += 1;
        }
    };
    skip(&mut i);
    (after.get(i) == Some(&b':')).then_some(())?;
    i += 1;
    skip(&mut i);
    (after.get(i) == Some(&b'"')).then_some(i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(transformer: &mut LineTransformer, reads: &[&str]) -> (String, Vec<Value>) {
        let mut out = Vec::new();
        let mut usages = Vec::new();
        for read in reads {
            let piece = transformer.push(Bytes::copy_from_slice(read.as_bytes()));
            out.extend_from_slice(&piece.data);
            usages.extend(piece.usage);
        }
        let tail = transformer.finish();
        out.extend_from_slice(&tail.data);
        usages.extend(tail.usage);
        (String::from_utf8(out).unwrap(), usages)
    }

    #[test]
    fn a_model_key_split_across_two_reads_is_still_renamed() {
        let mut transformer = LineTransformer::new(Some("fast"));
        let (out, _) = feed(
            &mut transformer,
            &[
                "data: {\"mod",
                "el\":\"smol-a\",\"x\":1}\n\ndata: {\"model\":\"smol",
                "-a\"}\n\n",
                "data: [DONE]\n\n",
            ],
        );
        assert_eq!(
            out,
            "data: {\"model\":\"fast\",\"x\":1}\n\ndata: {\"model\":\"fast\"}\n\ndata: [DONE]\n\n"
        );
    }

    #[test]
    fn an_incomplete_line_is_held_until_the_next_read_or_the_end() {
        let mut transformer = LineTransformer::new(Some("fast"));
        let first = transformer.push(Bytes::from_static(b"{\"model\":\"smol"));
        assert!(first.data.is_empty());
        assert!(transformer.holding());
        let second = transformer.push(Bytes::from_static(b"-a\"}"));
        assert!(second.data.is_empty(), "still no newline");
        let tail = transformer.finish();
        assert_eq!(&tail.data[..], b"{\"model\":\"fast\"}");
        assert!(!transformer.holding());
    }

    #[test]
    fn a_usage_split_across_two_reads_is_still_counted() {
        for asked in [Some("fast"), None] {
            let mut transformer = LineTransformer::new(asked);
            let reads = [
                "data: {\"choices\":[]}\n\ndata: {\"us",
                "age\":{\"prompt_tokens\":5,\"completion",
                "_tokens\":7}}\n\ndata: [DONE]\n\n",
            ];
            let (out, usages) = feed(&mut transformer, &reads);
            assert_eq!(usages.len(), 1, "{asked:?}");
            assert_eq!(usages[0]["completion_tokens"], 7);
            if asked.is_none() {
                // Unrenamed, the answer passes byte for byte.
                assert_eq!(out, reads.concat());
            }
        }
    }

    #[test]
    fn without_a_rename_each_read_passes_at_once() {
        let mut transformer = LineTransformer::new(None);
        let piece = transformer.push(Bytes::from_static(b"{\"model\":\"sm"));
        assert_eq!(&piece.data[..], b"{\"model\":\"sm");
        assert!(!transformer.holding());
    }

    #[test]
    fn a_line_past_the_limit_is_passed_on_not_held() {
        let mut transformer = LineTransformer::new(Some("fast"));
        let long = Bytes::from(vec![b'x'; MAX_LINE + 1]);
        let piece = transformer.push(long);
        assert_eq!(piece.data.len(), MAX_LINE + 1);
        assert!(!transformer.holding());
    }

    #[test]
    fn usage_is_found_in_a_json_answer_and_in_a_stream() {
        let whole = br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#;
        assert_eq!(find_usage(whole).unwrap()["completion_tokens"], 4);
        let stream = b"data: {\"choices\":[]}\n\ndata: {\"usage\":{\"prompt_tokens\":5}}\n\n";
        assert_eq!(find_usage(stream).unwrap()["prompt_tokens"], 5);
        assert_eq!(find_usage(b"data: [DONE]"), None);
    }

    #[test]
    fn every_model_key_is_renamed_and_nothing_inside_a_string() {
        let data = br#"data: {"model":"smol-a","x":1} {"model" : "a\"b"} {"content":"say \"model\":\"x\""} {"model":3}"#;
        let out = rename_model(data, "\"fast\"");
        assert_eq!(
            &out[..],
            br#"data: {"model":"fast","x":1} {"model":"fast"} {"content":"say \"model\":\"x\""} {"model":3}"#
        );
    }
}
