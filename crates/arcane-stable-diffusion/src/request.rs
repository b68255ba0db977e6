//! One image request, as OpenAI's `POST /v1/images/generations` sends it, checked
//! against the bounds that keep one request from taking the machine.
//!
//! OpenAI's fields: `prompt` (required), `n`, `size` (`"WIDTHxHEIGHT"`, each a multiple
//! of 64 from [`MIN_SIDE`] to [`MAX_SIDE`]), `response_format` (`b64_json` only: Arcane
//! keeps no files to link to, so `url` is refused by name), `output_format` (`png`,
//! `jpeg`, `webp`), `output_compression` (JPEG quality) and `stream`. Arcane's
//! extensions: `seed`, `steps`, `cfg_scale` and `negative_prompt`. `model`, `user`,
//! `quality`, `style` and `background` are accepted and not used.

use serde_json::{json, Value};

use crate::encode::ImageFormat;
use crate::Error;

/// The narrowest side, in pixels.
pub const MIN_SIDE: u32 = 64;
/// The widest side, in pixels: a 1024×1024 image is the largest generated.
pub const MAX_SIDE: u32 = 1024;
/// The most images one request asks for.
pub const MAX_IMAGES: u32 = 4;
/// The most sampling steps.
pub const MAX_STEPS: u32 = 150;
/// The longest prompt (and negative prompt), in characters.
pub const MAX_PROMPT_CHARS: usize = 4000;
/// The largest guidance scale.
pub const MAX_CFG_SCALE: f32 = 30.0;
/// Steps when a request names none.
pub const DEFAULT_STEPS: u32 = 20;
/// Guidance when a request names none.
pub const DEFAULT_CFG_SCALE: f32 = 7.0;
/// The size when a request names none.
pub const DEFAULT_SIZE: (u32, u32) = (512, 512);

/// What one generation draws: the parameters of one image, `count` times with seeds
/// `seed`, `seed + 1`, ….
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// What to draw.
    pub prompt: String,
    /// What to steer away from.
    pub negative_prompt: String,
    /// Width in pixels (a multiple of 64).
    pub width: u32,
    /// Height in pixels (a multiple of 64).
    pub height: u32,
    /// Sampling steps.
    pub steps: u32,
    /// Classifier-free guidance scale.
    pub cfg_scale: f32,
    /// The first image's seed.
    pub seed: u64,
    /// How many images.
    pub count: u32,
    /// How each image is encoded.
    pub format: ImageFormat,
    /// JPEG quality (1 to 100).
    pub quality: u8,
}

/// A checked request: the generation, and whether the client asked for a stream of
/// events.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageRequest {
    /// What to draw.
    pub generation: Generation,
    /// `stream: true`: progress and each image as server-sent events.
    pub stream: bool,
}

impl ImageRequest {
    /// Reads OpenAI's JSON body. `random_seed` is the seed used when the request names
    /// none (the answer says which one was used).
    pub fn parse(body: &[u8], random_seed: u64) -> Result<ImageRequest, Error> {
        let json: Value = serde_json::from_slice(body)
            .map_err(|e| Error::bad("body", format!("the body is not JSON: {e}"), json!({})))?;
        if !json.is_object() {
            return Err(Error::bad(
                "body",
                "the body must be a JSON object",
                json!({}),
            ));
        }
        let prompt = text(&json, "prompt")?.ok_or_else(|| {
            Error::bad(
                "prompt",
                "the field `prompt` (what to draw) is required",
                json!({}),
            )
        })?;
        if prompt.trim().is_empty() {
            return Err(Error::bad("prompt", "the prompt is empty", json!({})));
        }
        let negative_prompt = text(&json, "negative_prompt")?.unwrap_or_default();
        match json.get("response_format") {
            None | Some(Value::Null) => {}
            Some(Value::String(f)) if f == "b64_json" => {}
            Some(other) => {
                return Err(Error::bad(
                    "response_format",
                    format!("response_format {other} is not given here: images come back inline as `b64_json` (Arcane keeps no files to link to)"),
                    json!({"value": other, "supported": ["b64_json"]}),
                ))
            }
        }
        let (width, height) = size(&json)?;
        let format = match json.get("output_format") {
            None | Some(Value::Null) => ImageFormat::Png,
            Some(Value::String(name)) => ImageFormat::parse(name).ok_or_else(|| {
                Error::bad(
                    "output_format",
                    format!(
                        "output_format `{}` is not one of png, jpeg, webp",
                        short(name)
                    ),
                    json!({"value": short(name), "supported": ["png", "jpeg", "webp"]}),
                )
            })?,
            Some(other) => return Err(wrong_type("output_format", "text", other)),
        };
        let generation = Generation {
            prompt,
            negative_prompt,
            width,
            height,
            steps: integer(&json, "steps", 1, MAX_STEPS.into())?
                .map_or(DEFAULT_STEPS, |s| s as u32),
            cfg_scale: number(&json, "cfg_scale", 0.0, MAX_CFG_SCALE)?.unwrap_or(DEFAULT_CFG_SCALE),
            seed: integer(&json, "seed", 0, i64::MAX.unsigned_abs() / 2)?.unwrap_or(random_seed),
            count: integer(&json, "n", 1, MAX_IMAGES.into())?.map_or(1, |n| n as u32),
            format,
            quality: integer(&json, "output_compression", 1, 100)?.map_or(90, |q| q as u8),
        };
        let stream = match json.get("stream") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => return Err(wrong_type("stream", "true or false", other)),
        };
        Ok(ImageRequest { generation, stream })
    }
}

/// The text field `name`, bounded by [`MAX_PROMPT_CHARS`].
fn text(json: &Value, name: &'static str) -> Result<Option<String>, Error> {
    match json.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.contains('\0') => Err(Error::bad(
            name,
            format!("`{name}` contains a NUL character"),
            json!({"value": short(s)}),
        )),
        Some(Value::String(s)) => {
            let chars = s.chars().count();
            if chars > MAX_PROMPT_CHARS {
                return Err(Error::bad(
                    name,
                    format!("`{name}` is {chars} characters long; at most {MAX_PROMPT_CHARS} are accepted"),
                    json!({"value": short(s), "length": chars, "max": MAX_PROMPT_CHARS}),
                ));
            }
            Ok(Some(s.clone()))
        }
        Some(other) => Err(wrong_type(name, "text", other)),
    }
}

/// `size`: `"WIDTHxHEIGHT"` (or `auto`, the default 512×512).
fn size(json: &Value) -> Result<(u32, u32), Error> {
    let raw = match json.get("size") {
        None | Some(Value::Null) => return Ok(DEFAULT_SIZE),
        Some(Value::String(s)) if s == "auto" => return Ok(DEFAULT_SIZE),
        Some(Value::String(s)) => s,
        Some(other) => return Err(wrong_type("size", "text such as \"512x512\"", other)),
    };
    let bounds = json!({"value": short(raw), "min": MIN_SIDE, "max": MAX_SIDE, "multipleOf": 64});
    let parsed = raw
        .split_once(['x', 'X'])
        .and_then(|(w, h)| Some((w.trim().parse::<u32>().ok()?, h.trim().parse::<u32>().ok()?)));
    let Some((width, height)) = parsed else {
        return Err(Error::bad(
            "size",
            format!(
                "size `{}` is not WIDTHxHEIGHT such as \"512x512\"",
                short(raw)
            ),
            bounds,
        ));
    };
    for side in [width, height] {
        if !(MIN_SIDE..=MAX_SIDE).contains(&side) || side % 64 != 0 {
            return Err(Error::bad(
                "size",
                format!("size `{raw}`: each side must be a multiple of 64 from {MIN_SIDE} to {MAX_SIDE}"),
                bounds,
            ));
        }
    }
    Ok((width, height))
}

/// The integer field `name` in `min..=max`.
fn integer(json: &Value, name: &'static str, min: u64, max: u64) -> Result<Option<u64>, Error> {
    match json.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) if (min..=max).contains(&v) => Ok(Some(v)),
            _ => Err(Error::bad(
                name,
                format!("`{name}` is {n}; it must be a whole number from {min} to {max}"),
                json!({"value": n, "min": min, "max": max}),
            )),
        },
        Some(other) => Err(wrong_type(name, "a whole number", other)),
    }
}

/// The number field `name` in `min..=max`.
fn number(json: &Value, name: &'static str, min: f32, max: f32) -> Result<Option<f32>, Error> {
    match json.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            let value = n.as_f64().unwrap_or(f64::NAN) as f32;
            if value.is_finite() && (min..=max).contains(&value) {
                Ok(Some(value))
            } else {
                Err(Error::bad(
                    name,
                    format!("`{name}` is {n}; it must be a number from {min} to {max}"),
                    json!({"value": n, "min": min, "max": max}),
                ))
            }
        }
        Some(other) => Err(wrong_type(name, "a number", other)),
    }
}

fn wrong_type(name: &'static str, wanted: &str, value: &Value) -> Error {
    let shown = short(&value.to_string());
    Error::bad(
        name,
        format!("`{name}` must be {wanted}, not `{shown}`"),
        json!({"value": shown}),
    )
}

/// `text`'s first 64 characters, for messages.
fn short(text: &str) -> String {
    match text.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<ImageRequest, Error> {
        ImageRequest::parse(body.as_bytes(), 99)
    }

    #[test]
    fn an_openai_request_is_read_with_its_defaults_and_extensions() {
        let request = parse(r#"{"model":"sd","prompt":"a lighthouse","size":"256x128","n":2,"response_format":"b64_json","output_format":"webp","seed":7,"steps":4,"cfg_scale":1.5,"negative_prompt":"fog","stream":true}"#).unwrap();
        let g = &request.generation;
        assert_eq!(
            (g.width, g.height, g.count, g.seed, g.steps),
            (256, 128, 2, 7, 4)
        );
        assert_eq!((g.cfg_scale, g.format), (1.5, ImageFormat::Webp));
        assert_eq!(g.negative_prompt, "fog");
        assert!(request.stream);
        let request = parse(r#"{"prompt":"x"}"#).unwrap();
        let g = &request.generation;
        assert_eq!((g.width, g.height), DEFAULT_SIZE);
        assert_eq!((g.count, g.seed, g.steps), (1, 99, DEFAULT_STEPS));
        assert_eq!(g.format, ImageFormat::Png);
        assert!(!request.stream);
    }

    #[test]
    fn every_bound_is_a_refusal_naming_the_field_and_value() {
        for (body, field, shown) in [
            (r#"{"prompt":"x","size":"100x64"}"#, "size", "100x64"),
            (r#"{"prompt":"x","size":"2048x2048"}"#, "size", "2048x2048"),
            (r#"{"prompt":"x","size":"0x0"}"#, "size", "0x0"),
            (r#"{"prompt":"x","size":"big"}"#, "size", "big"),
            (r#"{"prompt":"x","n":5}"#, "n", "5"),
            (r#"{"prompt":"x","n":0}"#, "n", "0"),
            (r#"{"prompt":"x","n":-1}"#, "n", "-1"),
            (r#"{"prompt":"x","steps":151}"#, "steps", "151"),
            (r#"{"prompt":"x","steps":1.5}"#, "steps", "1.5"),
            (r#"{"prompt":"x","cfg_scale":31}"#, "cfg_scale", "31"),
            (r#"{"prompt":"x","seed":-3}"#, "seed", "-3"),
            (
                r#"{"prompt":"x","response_format":"url"}"#,
                "response_format",
                "url",
            ),
            (
                r#"{"prompt":"x","output_format":"gif"}"#,
                "output_format",
                "gif",
            ),
            (r#"{"prompt":"x","stream":"yes"}"#, "stream", "yes"),
            (r#"{"prompt":7}"#, "prompt", "7"),
            (r#"{"prompt":"  "}"#, "prompt", "empty"),
            (r#"{"prompt":"a\u0000b"}"#, "prompt", "NUL"),
            (r#"{"size":"64x64"}"#, "prompt", "required"),
            (r#"[1]"#, "body", "object"),
            (r#"{"prompt":"#, "body", "JSON"),
        ] {
            let error = match parse(body) {
                Err(error) => error,
                Ok(request) => panic!("{body} was accepted as {request:?}"),
            };
            assert_eq!(error.field(), Some(field), "{body}: {error}");
            assert!(error.to_string().contains(shown), "{body}: {error}");
        }
        let long = format!(r#"{{"prompt":"{}"}}"#, "a".repeat(MAX_PROMPT_CHARS + 1));
        let error = parse(&long).unwrap_err();
        assert_eq!(error.field(), Some("prompt"));
        assert!(error.to_string().contains("4001"), "{error}");
    }
}
