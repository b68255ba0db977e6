//! `Content-Length` framing for the stdio transport (the LSP-style framing the SDK uses).
//!
//! A frame is `Content-Length: <n>`, CRLF CRLF, then `n` bytes of UTF-8 JSON. Header
//! names match case-insensitively and extra header lines are tolerated. Input may
//! arrive split or concatenated in any way; [`Decoder`] buffers it. Errors
//! ([`FrameProblem`]): a header block without a length, a length that is not a
//! decimal number, a frame (or header block) over the size limit, input that ends in
//! the middle of a frame, a body that is not UTF-8 or not JSON. Valid JSON that is not
//! an object is still a frame (the protocol layer answers it `ok:false`). Unlike the
//! SDK, frames have a size limit ([`DEFAULT_MAX_FRAME`]) so a peer cannot make the
//! host buffer without bound.

use serde_json::Value;

use crate::error::{Error, FrameProblem};

/// The default limit on one frame's body (8 MiB, the HTTP body limit too).
pub const DEFAULT_MAX_FRAME: usize = 8 * 1024 * 1024;

/// The limit on one header block.
pub const MAX_HEADER: usize = 8 * 1024;

/// Encodes one frame.
pub fn encode(body: &[u8]) -> Vec<u8> {
    let mut out = format!("Content-Length: {}\r\n\r\n", body.len()).into_bytes();
    out.extend_from_slice(body);
    out
}

/// An incremental frame decoder.
#[derive(Debug)]
pub struct Decoder {
    buffer: Vec<u8>,
    max_frame: usize,
    /// The parsed length of the frame whose header was already consumed.
    pending: Option<usize>,
}

impl Decoder {
    /// A decoder accepting bodies up to `max_frame` bytes.
    pub fn new(max_frame: usize) -> Self {
        Self {
            buffer: Vec::new(),
            max_frame,
            pending: None,
        }
    }

    /// Appends bytes read from the transport.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next complete frame's JSON, `Ok(None)` when more input is needed.
    pub fn next_frame(&mut self) -> Result<Option<Value>, Error> {
        let length = match self.pending {
            Some(length) => length,
            None => {
                let Some(end) = find(&self.buffer, b"\r\n\r\n") else {
                    if self.buffer.len() > MAX_HEADER {
                        return Err(Error::frame(
                            FrameProblem::TooLarge,
                            format!("header block longer than {MAX_HEADER} bytes"),
                        ));
                    }
                    return Ok(None);
                };
                if end > MAX_HEADER {
                    return Err(Error::frame(
                        FrameProblem::TooLarge,
                        format!("header block longer than {MAX_HEADER} bytes"),
                    ));
                }
                let length = parse_header(&self.buffer[..end], self.max_frame)?;
                self.buffer.drain(..end + 4);
                self.pending = Some(length);
                length
            }
        };
        if self.buffer.len() < length {
            return Ok(None);
        }
        self.pending = None;
        let body: Vec<u8> = self.buffer.drain(..length).collect();
        let text = String::from_utf8(body).map_err(|e| {
            Error::frame(
                FrameProblem::InvalidUtf8,
                format!("invalid UTF-8 at byte {}", e.utf8_error().valid_up_to()),
            )
        })?;
        let value = parse_strict(&text)?;
        // Any valid JSON is a frame: one that is not an object (`[1]`, `"hi"`, `null`) is
        // answered `ok:false` by the protocol layer and the transport stays open.
        Ok(Some(value))
    }

    /// Called at end of input: fails with `IPC_FRAME_INCOMPLETE` if a partial frame is
    /// buffered. Whitespace between frames is not a frame.
    pub fn finish(&self) -> Result<(), Error> {
        if self.pending.is_some() || self.buffer.iter().any(|b| !b.is_ascii_whitespace()) {
            return Err(Error::frame(
                FrameProblem::Incomplete,
                format!(
                    "input ended inside a frame ({} bytes buffered)",
                    self.buffer.len()
                ),
            ));
        }
        Ok(())
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn parse_header(block: &[u8], max_frame: usize) -> Result<usize, Error> {
    let text = std::str::from_utf8(block)
        .map_err(|_| Error::frame(FrameProblem::LengthInvalid, "the header block is not UTF-8"))?;
    let mut length: Option<usize> = None;
    for line in text.split("\r\n") {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if !name.trim().eq_ignore_ascii_case("content-length") {
            continue;
        }
        let value = value.trim();
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Error::frame(
                FrameProblem::LengthInvalid,
                format!("`Content-Length: {value}` is not a decimal number"),
            ));
        }
        let parsed: usize = match value.parse() {
            Ok(n) => n,
            Err(_) => {
                return Err(Error::frame(
                    FrameProblem::TooLarge,
                    format!("`Content-Length: {value}` exceeds the {max_frame}-byte limit"),
                ));
            }
        };
        if length.is_some_and(|l| l != parsed) {
            return Err(Error::frame(
                FrameProblem::LengthInvalid,
                "two different `Content-Length` values",
            ));
        }
        length = Some(parsed);
    }
    let length = length.ok_or_else(|| {
        Error::frame(
            FrameProblem::LengthMissing,
            "the header block has no `Content-Length`",
        )
    })?;
    if length > max_frame {
        return Err(Error::frame(
            FrameProblem::TooLarge,
            format!("a {length}-byte frame exceeds the {max_frame}-byte limit"),
        ));
    }
    Ok(length)
}

#[cfg(test)]
mod strict_tests {
    use super::*;
    use arcane_report::Diagnostic;

    #[test]
    fn duplicate_keys_are_refused_at_any_depth_and_unique_ones_parse_unchanged() {
        for bad in [
            r#"{"method":"system.ping","method":"core.host.shutdown"}"#,
            r#"{"id":"1","params":{"a":1,"a":2}}"#,
            r#"[{"x":1},{"y":1,"y":2}]"#,
        ] {
            let error = parse_strict(bad).unwrap_err();
            assert_eq!(error.details()["reason"], "IPC_DUPLICATE_KEY", "{bad}");
        }
        let good = r#"{"id":"1","method":"m","params":{"a":[1,2.5,true,null,"s"],"b":{}}}"#;
        assert_eq!(
            parse_strict(good).unwrap(),
            serde_json::from_str::<Value>(good).unwrap()
        );
        assert_eq!(
            parse_strict("{").unwrap_err().details()["reason"],
            "IPC_INVALID_JSON"
        );
        assert!(parse_strict("[1] 2").is_err(), "trailing data");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(e: Error) -> FrameProblem {
        match e {
            Error::Frame { problem, .. } => problem,
            other => panic!("not a frame error: {other:?}"),
        }
    }

    #[test]
    fn decodes_split_and_concatenated_frames() {
        let mut all = encode(br#"{"a":1}"#);
        all.extend(encode(br#"{"b":2}"#));
        let mut decoder = Decoder::new(1024);
        let mut seen = Vec::new();
        for byte in &all {
            decoder.push(std::slice::from_ref(byte));
            while let Some(v) = decoder.next_frame().unwrap() {
                seen.push(v);
            }
        }
        assert_eq!(
            seen,
            vec![serde_json::json!({"a":1}), serde_json::json!({"b":2})]
        );
        decoder.finish().unwrap();
    }

    #[test]
    fn header_names_are_case_insensitive_and_extra_lines_tolerated() {
        let mut decoder = Decoder::new(1024);
        decoder.push(b"content-type: application/json\r\nCONTENT-LENGTH: 2\r\n\r\n{}");
        assert_eq!(decoder.next_frame().unwrap(), Some(serde_json::json!({})));
    }

    #[test]
    fn reports_each_problem() {
        let cases: Vec<(&[u8], FrameProblem)> = vec![
            (b"X-Other: 1\r\n\r\n{}", FrameProblem::LengthMissing),
            (b"Content-Length: 1x\r\n\r\n{}", FrameProblem::LengthInvalid),
            (b"Content-Length: -2\r\n\r\n{}", FrameProblem::LengthInvalid),
            (b"Content-Length: 99999\r\n\r\n{}", FrameProblem::TooLarge),
            (
                b"Content-Length: 2\r\n\r\n\xff\xfe",
                FrameProblem::InvalidUtf8,
            ),
            (b"Content-Length: 2\r\n\r\n{]", FrameProblem::InvalidJson),
        ];
        for (input, expected) in cases {
            let mut decoder = Decoder::new(1024);
            decoder.push(input);
            assert_eq!(
                problem(decoder.next_frame().unwrap_err()),
                expected,
                "{}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn valid_json_that_is_not_an_object_is_still_a_frame() {
        for body in ["[1]", "\"hi\"", "null", "3"] {
            let mut decoder = Decoder::new(1024);
            decoder.push(&encode(body.as_bytes()));
            let expected: Value = serde_json::from_str(body).unwrap();
            assert_eq!(decoder.next_frame().unwrap(), Some(expected), "{body}");
        }
    }

    #[test]
    fn an_unterminated_frame_is_incomplete_at_eof() {
        let mut decoder = Decoder::new(1024);
        decoder.push(b"Content-Length: 10\r\n\r\n{\"a\"");
        assert_eq!(decoder.next_frame().unwrap(), None);
        assert_eq!(
            problem(decoder.finish().unwrap_err()),
            FrameProblem::Incomplete
        );
        let mut decoder = Decoder::new(1024);
        decoder.push(b"Content-Len");
        assert_eq!(
            problem(decoder.finish().unwrap_err()),
            FrameProblem::Incomplete
        );
    }

    #[test]
    fn an_endless_header_is_refused() {
        let mut decoder = Decoder::new(1024);
        decoder.push(&vec![b'a'; MAX_HEADER + 1]);
        assert_eq!(
            problem(decoder.next_frame().unwrap_err()),
            FrameProblem::TooLarge
        );
    }
}

/// Parses a frame's JSON, refusing an object that has the same key twice anywhere in it
/// (serde_json alone keeps the last one: `"method":"system.ping","method":"core.host.shutdown"`
/// would be read as the second). Used by every transport.
pub fn parse_strict(text: &str) -> Result<Value, Error> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let parsed = serde::Deserialize::deserialize(&mut deserializer)
        .and_then(|StrictValue(value)| deserializer.end().map(|()| value));
    parsed.map_err(|e| {
        if e.to_string().starts_with(DUPLICATE) {
            Error::frame(
                FrameProblem::DuplicateKey,
                format!(
                    "{} (at line {} column {})",
                    e.to_string().split(" at line").next().unwrap_or(DUPLICATE),
                    e.line(),
                    e.column()
                ),
            )
        } else {
            Error::frame(
                FrameProblem::InvalidJson,
                format!("invalid JSON at line {} column {}", e.line(), e.column()),
            )
        }
    })
}

const DUPLICATE: &str = "duplicate key";

/// A JSON value whose objects have unique keys.
struct StrictValue(Value);

impl<'de> serde::Deserialize<'de> for StrictValue {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        serde::Deserialize::deserialize(d).map(|StrictValue(v)| v)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(StrictValue(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!("{DUPLICATE} `{key}`")));
            }
            let StrictValue(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}
