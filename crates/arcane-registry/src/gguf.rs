//! A bounded reader for the GGUF header: magic, version, the metadata key/value section
//! and the tensor descriptors. Only the header is read (never the tensor data), every
//! length is checked against the file's size before anything is allocated, and large
//! arrays (the tokenizer's vocabulary) are skipped without being kept.
//!
//! A model file is untrusted input, so the reader's work is bounded too:
//!
//! * arrays nested in arrays are refused past [`MAX_ARRAY_DEPTH`] levels (real files
//!   nest at most 2), checked *before* descending, so a file of 50,000 nested levels is
//!   refused instead of overflowing the stack;
//! * all metadata arrays together may hold at most [`MAX_ARRAY_ELEMENTS`] elements (a
//!   real vocabulary has ~150k-260k), so a small file cannot make the reader walk
//!   billions of empty strings;
//! * every tensor's size must be possible: its dimensions' product must fit in a `u64`
//!   and its data (at least so many bytes for its type) must fit in the file, so an
//!   impossible tensor is refused naming it instead of being summed (saturating) into
//!   a parameter count of "18446744073.7B".
//!
//! Reference: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::Error;

/// What a user cares about in a GGUF file's header.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GgufInfo {
    /// The GGUF format version (2 or 3).
    pub version: u32,
    /// `general.architecture`, e.g. `llama`.
    pub architecture: Option<String>,
    /// `general.name`, e.g. `SmolLM2 135M Instruct`.
    pub name: Option<String>,
    /// `general.size_label`, e.g. `135M`.
    pub size_label: Option<String>,
    /// `general.parameter_count`, else the sum of the tensor element counts.
    pub parameter_count: Option<u64>,
    /// `<architecture>.context_length`: the context the model was trained for.
    pub context_length: Option<u64>,
    /// `general.file_type` as a quantization name (`Q4_1`, `Q8_0`, `F16`, …).
    pub quantization: Option<String>,
    /// `general.file_type` as stored.
    pub file_type: Option<u32>,
    /// The number of tensors.
    pub tensor_count: u64,
    /// The number of metadata keys.
    pub metadata_count: u64,
    /// `<architecture>.block_count`: the layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_count: Option<u64>,
    /// `<architecture>.embedding_length`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding_length: Option<u64>,
    /// `<architecture>.attention.head_count`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_count: Option<u64>,
    /// `<architecture>.attention.head_count_kv` (grouped-query attention; default:
    /// `head_count`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_count_kv: Option<u64>,
    /// `tokenizer.chat_template` (up to 64 KiB): what Ollama's `/api/show` calls the
    /// model's template. Not part of the serialized form (records and reports stay as
    /// they were).
    #[serde(skip)]
    pub chat_template: Option<String>,
}

impl GgufInfo {
    /// The f16 key/value cache for `context` tokens, in bytes: 2 (K and V) × layers ×
    /// context × (embedding × kv heads / heads) × 2 bytes. `None` when the header does
    /// not say.
    pub fn kv_cache_bytes(&self, context: u64) -> Option<u64> {
        let (layers, embedding, heads) =
            (self.block_count?, self.embedding_length?, self.head_count?);
        let kv_heads = self.head_count_kv.unwrap_or(heads);
        let per_token = embedding.checked_mul(kv_heads)? / heads.max(1);
        2u64.checked_mul(layers)?
            .checked_mul(context)?
            .checked_mul(per_token)?
            .checked_mul(2)
    }
}

/// The `<architecture>.*` numbers kept (the context length, and what the key/value
/// cache's size follows from).
const ARCH_NUMBERS: &[&str] = &[
    ".context_length",
    ".block_count",
    ".embedding_length",
    ".attention.head_count",
    ".attention.head_count_kv",
];

/// The name of a llama.cpp `general.file_type` (`llama_ftype`) value.
pub fn quantization_name(file_type: u32) -> Option<&'static str> {
    Some(match file_type {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        4 => "Q4_1_SOME_F16",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        _ => return None,
    })
}

/// The four bytes every GGUF file starts with.
pub const MAGIC: &[u8; 4] = b"GGUF";

const MAX_KEYS: u64 = 1 << 20;
const MAX_TENSORS: u64 = 1 << 24;
const MAX_DIMS: u32 = 8;
const MAX_KEEP_STRING: u64 = 1 << 16;

/// The deepest metadata array nesting accepted: an array of arrays is depth 2, which is
/// the most real GGUF files use.
pub const MAX_ARRAY_DEPTH: u32 = 8;

/// The most metadata array elements accepted, all arrays (nested ones included)
/// together.
pub const MAX_ARRAY_ELEMENTS: u64 = 1 << 23;

/// The alignment of the tensor data when `general.alignment` does not say.
const DEFAULT_ALIGNMENT: u64 = 32;

/// Reads and checks the GGUF header of the file at `path`.
///
/// Fails with [`Error::ModelInvalid`] (naming the file, and for a wrong magic the bytes
/// found) when the file is not GGUF, has an unsupported version (only 2 and 3 are
/// read), or its header is truncated or malformed.
pub fn read_gguf(path: &Path) -> Result<GgufInfo, Error> {
    read_gguf_tensors(path, &mut |_, _, _| {})
}

/// Reads and checks the GGUF header of the file at `path` as [`read_gguf`] does, and
/// hands each tensor's name, dimensions (ggml's order: `ne[0]`, the row width, first)
/// and ggml type to `observe` once its size is checked; nothing is kept. A GGUF file
/// says what it is only by its tensors' names when it has no `general.architecture`
/// (stable-diffusion.cpp's `convert` writes none), so they are what tells it.
pub(crate) fn read_gguf_tensors(
    path: &Path,
    observe: &mut dyn FnMut(&str, &[u64], u32),
) -> Result<GgufInfo, Error> {
    let file = arcane_files::open_regular(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidInput {
            // A FIFO, socket, device or directory: named, never read (nor waited on).
            invalid(path, format!("it {e}"), None)
        } else {
            Error::io("open", path, e)
        }
    })?;
    let size = file
        .metadata()
        .map_err(|e| Error::io("inspect", path, e))?
        .len();
    let mut reader = Reader {
        inner: BufReader::with_capacity(1 << 16, file),
        position: 0,
        size,
        path,
        array_elements: 0,
        observe,
    };
    reader.header()
}

fn invalid(path: &Path, reason: impl Into<String>, found: Option<String>) -> Error {
    Error::ModelInvalid {
        path: path.to_path_buf(),
        reason: reason.into(),
        found,
    }
}

enum Value {
    Unsigned(u64),
    Signed(i64),
    Text(String),
    Other,
}

struct Reader<'a> {
    inner: BufReader<File>,
    position: u64,
    size: u64,
    path: &'a Path,
    /// The metadata array elements met so far (bounded by [`MAX_ARRAY_ELEMENTS`]).
    array_elements: u64,
    /// Told each tensor once it is checked ([`read_gguf_tensors`]).
    observe: &'a mut dyn FnMut(&str, &[u64], u32),
}

impl Reader<'_> {
    fn header(&mut self) -> Result<GgufInfo, Error> {
        let mut magic = [0u8; 4];
        let got = self.read_up_to(&mut magic)?;
        if got < 4 || &magic != MAGIC {
            let found = hex::encode(&magic[..got]);
            let shown = String::from_utf8_lossy(&magic[..got])
                .escape_debug()
                .to_string();
            return Err(invalid(
                self.path,
                format!("expected the magic `GGUF`, found `{shown}` (hex {found})"),
                Some(found),
            ));
        }
        let version = self.u32()?;
        if version != 2 && version != 3 {
            return Err(invalid(
                self.path,
                format!("unsupported GGUF version {version} (supported: 2, 3)"),
                Some(hex::encode(version.to_le_bytes())),
            ));
        }
        let tensor_count = self.u64()?;
        let metadata_count = self.u64()?;
        if tensor_count == 0 {
            return Err(invalid(
                self.path,
                "it holds no tensors: a GGUF header with no weights is not a model".to_string(),
                None,
            ));
        }
        if tensor_count > MAX_TENSORS || metadata_count > MAX_KEYS {
            return Err(invalid(
                self.path,
                format!(
                    "implausible header: {tensor_count} tensors, {metadata_count} metadata keys"
                ),
                None,
            ));
        }
        let mut info = GgufInfo {
            version,
            architecture: None,
            name: None,
            size_label: None,
            parameter_count: None,
            context_length: None,
            quantization: None,
            file_type: None,
            tensor_count,
            metadata_count,
            block_count: None,
            embedding_length: None,
            head_count: None,
            head_count_kv: None,
            chat_template: None,
        };
        // `<architecture>.<key>` numbers; which architecture is known only at the end.
        let mut numbers: HashMap<String, u64> = HashMap::new();
        let mut alignment = DEFAULT_ALIGNMENT;
        let mut splits = 1u64;
        for _ in 0..metadata_count {
            let key = self.string(MAX_KEEP_STRING)?;
            let kind = self.u32()?;
            let value = self.value(&key, kind)?;
            match (key.as_str(), value) {
                ("general.architecture", Value::Text(s)) => info.architecture = Some(s),
                ("general.name", Value::Text(s)) => info.name = Some(s),
                ("general.size_label", Value::Text(s)) => info.size_label = Some(s),
                ("tokenizer.chat_template", Value::Text(s)) => info.chat_template = Some(s),
                ("general.parameter_count", Value::Unsigned(n)) => info.parameter_count = Some(n),
                ("general.parameter_count", Value::Signed(n)) if n >= 0 => {
                    info.parameter_count = Some(n as u64)
                }
                ("general.file_type", Value::Unsigned(n)) => info.file_type = u32::try_from(n).ok(),
                ("general.file_type", Value::Signed(n)) => info.file_type = u32::try_from(n).ok(),
                ("general.alignment", Value::Unsigned(n)) => alignment = n,
                ("split.count", Value::Unsigned(n)) => splits = n.max(1),
                (key, Value::Unsigned(n)) if ARCH_NUMBERS.iter().any(|k| key.ends_with(k)) => {
                    numbers.insert(key.to_string(), n);
                }
                (key, Value::Signed(n))
                    if n >= 0 && ARCH_NUMBERS.iter().any(|k| key.ends_with(k)) =>
                {
                    numbers.insert(key.to_string(), n as u64);
                }
                _ => {}
            }
        }
        if let Some(arch) = &info.architecture {
            let number = |key: &str| numbers.get(&format!("{arch}{key}")).copied();
            info.context_length = number(".context_length");
            info.block_count = number(".block_count");
            info.embedding_length = number(".embedding_length");
            info.head_count = number(".attention.head_count");
            info.head_count_kv = number(".attention.head_count_kv");
        }
        info.quantization = info
            .file_type
            .and_then(quantization_name)
            .map(str::to_string);
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(invalid(
                self.path,
                format!("`general.alignment` is {alignment}, not a power of two"),
                None,
            ));
        }
        // Every tensor's data must lie inside the file: checked against what follows
        // the descriptor as each is read (the data comes later still), then exactly once
        // the data section's start is known. Descriptors are not kept, only the one
        // that reaches furthest.
        let mut elements = 0u64;
        let mut bytes = 0u64;
        let mut furthest: Option<(u64, Tensor)> = None;
        for _ in 0..tensor_count {
            let tensor = self.tensor()?;
            let room = self.size.saturating_sub(self.position);
            let end = match tensor.offset.checked_add(tensor.min_bytes) {
                Some(end) if end <= room => end,
                _ => return Err(self.impossible_tensor(&tensor, room)),
            };
            (self.observe)(&tensor.name, &tensor.shape, tensor.kind);
            bytes = bytes.saturating_add(tensor.min_bytes);
            elements = elements.saturating_add(tensor.elements);
            if furthest.as_ref().is_none_or(|(e, _)| end > *e) {
                furthest = Some((end, tensor));
            }
        }
        // The tensor data starts at the next multiple of the alignment.
        let data_start = self.position.div_ceil(alignment).saturating_mul(alignment);
        let data_size = self.size.saturating_sub(data_start);
        if let Some((end, tensor)) = &furthest {
            if *end > data_size {
                return Err(self.impossible_tensor(tensor, data_size));
            }
        }
        if bytes > data_size {
            return Err(invalid(
                self.path,
                format!(
                    "its {tensor_count} tensors need at least {bytes} bytes of data, but the file holds {data_size} after the header"
                ),
                None,
            ));
        }
        // A declared count that even one bit per parameter (over every part of a split
        // model) could not hold is not believed: the tensors' own count is shown.
        let plausible = self.size.saturating_mul(8).saturating_mul(splits);
        if info.parameter_count.is_none_or(|n| n > plausible) {
            info.parameter_count = Some(elements);
        }
        Ok(info)
    }

    /// Reads one tensor descriptor, refusing dimensions whose product overflows.
    fn tensor(&mut self) -> Result<Tensor, Error> {
        let name = self.string(MAX_KEEP_STRING)?;
        let dims = self.u32()?;
        if dims > MAX_DIMS {
            return Err(invalid(
                self.path,
                format!("tensor `{name}` has {dims} dimensions (at most {MAX_DIMS})"),
                None,
            ));
        }
        let mut shape = Vec::with_capacity(dims as usize);
        for _ in 0..dims {
            shape.push(self.u64()?);
        }
        let elements = shape
            .iter()
            .try_fold(1u64, |count, &dim| count.checked_mul(dim));
        let kind = self.u32()?;
        let offset = self.u64()?;
        let Some(elements) = elements else {
            return Err(invalid(
                self.path,
                format!(
                    "tensor `{name}` has dimensions {shape:?}, whose product does not fit in 64 bits"
                ),
                None,
            ));
        };
        Ok(Tensor {
            min_bytes: min_tensor_bytes(kind, elements),
            name,
            shape,
            elements,
            kind,
            offset,
        })
    }

    fn impossible_tensor(&self, tensor: &Tensor, data_size: u64) -> Error {
        invalid(
            self.path,
            format!(
                "tensor `{}` has dimensions {:?} ({} elements, at least {} bytes at offset {}), more than the {} bytes of data the file holds",
                tensor.name, tensor.shape, tensor.elements, tensor.min_bytes, tensor.offset, data_size
            ),
            None,
        )
    }

    fn truncated(&self) -> Error {
        invalid(
            self.path,
            format!(
                "the header is truncated or malformed near byte {}",
                self.position
            ),
            None,
        )
    }

    fn read_up_to(&mut self, buffer: &mut [u8]) -> Result<usize, Error> {
        let mut got = 0;
        while got < buffer.len() {
            match self.inner.read(&mut buffer[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io("read", self.path, e)),
            }
        }
        self.position += got as u64;
        Ok(got)
    }

    fn exact<const N: usize>(&mut self) -> Result<[u8; N], Error> {
        let mut buffer = [0u8; N];
        if self.read_up_to(&mut buffer)? < N {
            return Err(self.truncated());
        }
        Ok(buffer)
    }

    fn u32(&mut self) -> Result<u32, Error> {
        Ok(u32::from_le_bytes(self.exact()?))
    }

    fn u64(&mut self) -> Result<u64, Error> {
        Ok(u64::from_le_bytes(self.exact()?))
    }

    /// Skips `n` bytes, failing if that would pass the end of the file.
    fn skip(&mut self, n: u64) -> Result<(), Error> {
        if n > self.size.saturating_sub(self.position) {
            return Err(self.truncated());
        }
        let offset = i64::try_from(n).map_err(|_| self.truncated())?;
        self.inner
            .seek_relative(offset)
            .map_err(|e| Error::io("read", self.path, e))?;
        self.position += n;
        Ok(())
    }

    fn length(&mut self) -> Result<u64, Error> {
        let n = self.u64()?;
        if n > self.size.saturating_sub(self.position) {
            return Err(self.truncated());
        }
        Ok(n)
    }

    /// Reads a string, keeping at most `keep` bytes of it (the rest is skipped).
    fn string(&mut self, keep: u64) -> Result<String, Error> {
        let n = self.length()?;
        let kept = n.min(keep);
        let mut bytes = vec![0u8; kept as usize];
        if self.read_up_to(&mut bytes)? < bytes.len() {
            return Err(self.truncated());
        }
        self.skip(n - kept)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn skip_string(&mut self) -> Result<(), Error> {
        let n = self.length()?;
        self.skip(n)
    }

    fn value(&mut self, key: &str, kind: u32) -> Result<Value, Error> {
        Ok(match kind {
            0 => Value::Unsigned(u64::from(self.exact::<1>()?[0])),
            1 => Value::Signed(i64::from(self.exact::<1>()?[0] as i8)),
            2 => Value::Unsigned(u64::from(u16::from_le_bytes(self.exact()?))),
            3 => Value::Signed(i64::from(i16::from_le_bytes(self.exact()?))),
            4 => Value::Unsigned(u64::from(self.u32()?)),
            5 => Value::Signed(i64::from(i32::from_le_bytes(self.exact()?))),
            6 => {
                self.skip(4)?;
                Value::Other
            }
            7 => {
                self.skip(1)?;
                Value::Other
            }
            8 => Value::Text(self.string(MAX_KEEP_STRING)?),
            9 => {
                let element = self.u32()?;
                let count = self.u64()?;
                self.skip_array(key, element, count, 1)?;
                Value::Other
            }
            10 => Value::Unsigned(self.u64()?),
            11 => Value::Signed(i64::from_le_bytes(self.exact()?)),
            12 => {
                self.skip(8)?;
                Value::Other
            }
            other => {
                return Err(invalid(
                    self.path,
                    format!(
                        "unknown metadata value type {other} near byte {}",
                        self.position
                    ),
                    None,
                ))
            }
        })
    }

    /// Skips an array of `count` elements of type `element` found `depth` levels deep
    /// (1: a metadata value that is an array). Nested arrays recurse, but only after the
    /// depth is checked, so the recursion is at most [`MAX_ARRAY_DEPTH`] deep.
    fn skip_array(&mut self, key: &str, element: u32, count: u64, depth: u32) -> Result<(), Error> {
        self.array_elements = self.array_elements.saturating_add(count);
        if self.array_elements > MAX_ARRAY_ELEMENTS {
            return Err(invalid(
                self.path,
                format!(
                    "its metadata arrays hold more than {MAX_ARRAY_ELEMENTS} elements in all (the most accepted), at `{key}`"
                ),
                None,
            ));
        }
        let fixed = match element {
            0 | 1 | 7 => Some(1u64),
            2 | 3 => Some(2),
            4..=6 => Some(4),
            10..=12 => Some(8),
            _ => None,
        };
        if let Some(width) = fixed {
            return self.skip(count.checked_mul(width).ok_or_else(|| self.truncated())?);
        }
        if element == 9 && depth >= MAX_ARRAY_DEPTH {
            return Err(invalid(
                self.path,
                format!(
                    "metadata `{key}` nests arrays more than {MAX_ARRAY_DEPTH} levels deep (the most accepted)"
                ),
                None,
            ));
        }
        // Strings and nested arrays: each element takes at least 8 bytes.
        if count > self.size.saturating_sub(self.position) / 8 {
            return Err(self.truncated());
        }
        for _ in 0..count {
            match element {
                8 => self.skip_string()?,
                9 => {
                    let inner = self.u32()?;
                    let inner_count = self.u64()?;
                    self.skip_array(key, inner, inner_count, depth + 1)?;
                }
                other => {
                    return Err(invalid(
                        self.path,
                        format!(
                            "unknown array element type {other} near byte {}",
                            self.position
                        ),
                        None,
                    ))
                }
            }
        }
        Ok(())
    }
}

/// One tensor descriptor of the header.
struct Tensor {
    name: String,
    shape: Vec<u64>,
    elements: u64,
    /// Its ggml type.
    kind: u32,
    /// The least bytes its data can take (see [`min_tensor_bytes`]).
    min_bytes: u64,
    /// Where its data starts, from the start of the data section.
    offset: u64,
}

/// The least bytes `elements` elements of ggml type `kind` can take: the exact size for
/// the plain types, and one bit per element for the quantized ones (all of which use
/// more, the smallest about 1.56), so no real tensor is ever judged too big.
fn min_tensor_bytes(kind: u32, elements: u64) -> u64 {
    let width = match kind {
        // F32, I32
        0 | 26 => 4,
        // F16, BF16, I16
        1 | 25 | 30 => 2,
        // I8
        24 => 1,
        // I64, F64
        27 | 28 => 8,
        _ => return elements / 8,
    };
    elements.saturating_mul(width)
}

/// Writes a minimal GGUF v3 file for tests: the given string and u32 metadata and one
/// F32 tensor of `elements` elements (its data zeros, so keep `elements` small).
impl crate::Model {
    /// What its GGUF header said when it was added (`None`: not a GGUF model).
    pub fn gguf(&self) -> Option<GgufInfo> {
        crate::header::field(&self.header, "gguf")
    }
}

/// The GGUF reader of the registry's table ([`crate::READERS`]): records `gguf`. A
/// file no other reader claims is read by it, so its refusal names the magic found.
pub(crate) struct Gguf;

impl crate::header::FormatReader for Gguf {
    fn format(&self) -> arcane_workspace::ModelFormat {
        arcane_workspace::formats::GGUF
    }

    fn kind(&self) -> &'static str {
        "gguf"
    }

    fn key(&self) -> &'static str {
        "gguf"
    }

    fn claims(&self, path: &Path) -> bool {
        let mut magic = [0u8; 4];
        arcane_files::open_regular(path)
            .and_then(|file| file.take(4).read_exact(&mut magic))
            .is_ok_and(|()| &magic == MAGIC)
    }

    fn read(&self, path: &Path) -> Result<crate::header::Header, Error> {
        // The chat template is read from the file when asked for (`/api/show`), not
        // recorded: a record holds what it can give back as it was added.
        let info = read_gguf(path)?;
        Ok(crate::header::recorded(self.key(), &info))
    }

    fn summary(&self, header: &crate::header::Header) -> crate::header::Summary {
        let Some(info) = crate::header::field::<GgufInfo>(header, self.key()) else {
            return crate::header::Summary::default();
        };
        let mut parts = vec![info
            .architecture
            .clone()
            .unwrap_or_else(|| "unknown architecture".into())];
        if let Some(count) = info.parameter_count {
            parts.push(format!("{} parameters", crate::header::human_count(count)));
        }
        parts.extend(info.quantization.clone());
        if let Some(context) = info.context_length {
            parts.push(format!("context {context}"));
        }
        parts.push(format!("GGUF v{}", info.version));
        crate::header::Summary {
            family: info.architecture.unwrap_or_else(|| "-".into()),
            parameters: info.parameter_count,
            quantization: info.quantization,
            context: info.context_length,
            description: parts.join(", "),
        }
    }
}

#[doc(hidden)]
pub fn write_test_gguf(
    path: &Path,
    strings: &[(&str, &str)],
    numbers: &[(&str, u32)],
    elements: u64,
) -> std::io::Result<()> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&1u64.to_le_bytes());
    out.extend_from_slice(&((strings.len() + numbers.len() + 1) as u64).to_le_bytes());
    let put_string = |out: &mut Vec<u8>, s: &str| {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    };
    for (key, value) in strings {
        put_string(&mut out, key);
        out.extend_from_slice(&8u32.to_le_bytes());
        put_string(&mut out, value);
    }
    for (key, value) in numbers {
        put_string(&mut out, key);
        out.extend_from_slice(&4u32.to_le_bytes());
        out.extend_from_slice(&value.to_le_bytes());
    }
    // A vocabulary-like array of strings, to exercise skipping.
    put_string(&mut out, "tokenizer.ggml.tokens");
    out.extend_from_slice(&9u32.to_le_bytes());
    out.extend_from_slice(&8u32.to_le_bytes());
    out.extend_from_slice(&3u64.to_le_bytes());
    for token in ["<s>", "</s>", "hello"] {
        put_string(&mut out, token);
    }
    put_string(&mut out, "token_embd.weight");
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&elements.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    // The data section: aligned, then the tensor's `elements` F32 zeros.
    let data_start = out.len().div_ceil(DEFAULT_ALIGNMENT as usize) * DEFAULT_ALIGNMENT as usize;
    out.resize(data_start + elements as usize * 4, 0);
    std::fs::write(path, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF v3 header: `keys` metadata entries already encoded in `metadata`, then the
    /// tensors `(name, dims, type, offset)`, then `data` bytes of (aligned) data.
    fn raw_gguf(
        keys: u64,
        metadata: &[u8],
        tensors: &[(&str, &[u64], u32, u64)],
        data: usize,
    ) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&keys.to_le_bytes());
        out.extend_from_slice(metadata);
        for (name, dims, kind, offset) in tensors {
            out.extend_from_slice(&(name.len() as u64).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for dim in *dims {
                out.extend_from_slice(&dim.to_le_bytes());
            }
            out.extend_from_slice(&kind.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
        let start = out.len().div_ceil(32) * 32;
        out.resize(start + data, 0);
        out
    }

    /// A metadata key `key` holding an array nested `depth` levels deep (the innermost
    /// an empty u32 array).
    fn nested_array(key: &str, depth: usize) -> Vec<u8> {
        let mut out = (key.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(&9u32.to_le_bytes());
        for _ in 1..depth {
            out.extend_from_slice(&9u32.to_le_bytes());
            out.extend_from_slice(&1u64.to_le_bytes());
        }
        out.extend_from_slice(&4u32.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        out
    }

    const ONE_TENSOR: &[(&str, &[u64], u32, u64)] = &[("w", &[4], 0, 0)];

    fn refusal(error: Error) -> String {
        match error {
            Error::ModelInvalid { reason, .. } => reason,
            other => panic!("expected ModelInvalid, got {other:?}"),
        }
    }

    #[test]
    fn deep_array_nesting_is_refused_without_overflowing_the_stack() {
        // Issue 19 §9: 50,000 nested levels (600 KB) overflowed the stack (exit 134).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deep.gguf");
        let bytes = raw_gguf(1, &nested_array("evil.nest", 50_000), ONE_TENSOR, 16);
        assert!(bytes.len() > 500_000);
        std::fs::write(&path, &bytes).unwrap();
        let reason = refusal(read_gguf(&path).unwrap_err());
        assert!(
            reason.contains("evil.nest") && reason.contains("8 levels"),
            "{reason}"
        );
        // The limit itself, and an array of arrays as real files use, are read.
        for depth in [2, MAX_ARRAY_DEPTH as usize] {
            std::fs::write(
                &path,
                raw_gguf(1, &nested_array("ok", depth), ONE_TENSOR, 16),
            )
            .unwrap();
            read_gguf(&path).unwrap_or_else(|e| panic!("depth {depth}: {e}"));
        }
        let one_more = raw_gguf(
            1,
            &nested_array("k", MAX_ARRAY_DEPTH as usize + 1),
            ONE_TENSOR,
            16,
        );
        std::fs::write(&path, one_more).unwrap();
        assert!(refusal(read_gguf(&path).unwrap_err()).contains("levels deep"));
    }

    #[test]
    fn too_many_array_elements_in_all_are_refused() {
        // An array of 2^23 + 1 empty strings: 64 MiB of zeros, written sparse, that the
        // reader would otherwise walk one string at a time.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wide.gguf");
        let count = MAX_ARRAY_ELEMENTS + 1;
        let mut metadata = 4u64.to_le_bytes().to_vec();
        metadata.extend_from_slice(b"wide");
        metadata.extend_from_slice(&9u32.to_le_bytes());
        metadata.extend_from_slice(&8u32.to_le_bytes());
        metadata.extend_from_slice(&count.to_le_bytes());
        let head = raw_gguf(1, &metadata, &[], 0);
        // `raw_gguf` wrote no tensors: the tensor count goes in by hand, and the
        // descriptor after the (sparse) strings.
        let mut tail = raw_gguf(0, &[], ONE_TENSOR, 16)[24..].to_vec();
        tail.truncate(tail.len() - 16);
        let mut file = File::create(&path).unwrap();
        let mut head = head;
        head.truncate(24 + metadata.len());
        head[8..16].copy_from_slice(&1u64.to_le_bytes());
        std::io::Write::write_all(&mut file, &head).unwrap();
        let tail_at = head.len() as u64 + count * 8;
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(tail_at)).unwrap();
        std::io::Write::write_all(&mut file, &tail).unwrap();
        file.set_len(tail_at + tail.len() as u64 + 64).unwrap();
        drop(file);
        let reason = refusal(read_gguf(&path).unwrap_err());
        assert!(
            reason.contains(&MAX_ARRAY_ELEMENTS.to_string()) && reason.contains("wide"),
            "{reason}"
        );
    }

    #[test]
    fn impossible_tensor_sizes_are_refused_naming_the_tensor() {
        // Issue 19 §9: dimensions of 2^62 elements counted as "18446744073.7B" parameters.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("huge.gguf");
        let cases: &[(&[u64], u32, &str)] = &[
            // 2^62 F32 elements: 2^64 bytes, past any file.
            (&[1 << 31, 1 << 31], 0, "bytes"),
            // 2^62 quantized elements: still 2^59 bytes at one bit each.
            (&[1 << 31, 1 << 31], 12, "bytes"),
            // A product past 2^64.
            (&[1 << 62, 8], 0, "64 bits"),
            // Plausible dimensions whose data is not in the file (4,000 bytes of 64).
            (&[1000], 0, "bytes"),
        ];
        for (dims, kind, says) in cases {
            let tensors: &[(&str, &[u64], u32, u64)] =
                &[("w", &[4], 0, 0), ("blk.0.ffn_up.weight", dims, *kind, 16)];
            std::fs::write(&path, raw_gguf(0, &[], tensors, 64)).unwrap();
            let reason = refusal(read_gguf(&path).unwrap_err());
            assert!(
                reason.contains("blk.0.ffn_up.weight") && reason.contains(says),
                "{dims:?}: {reason}"
            );
        }
        // An offset that puts a small tensor past the end is refused too.
        std::fs::write(&path, raw_gguf(0, &[], &[("late", &[4], 0, 1 << 40)], 64)).unwrap();
        assert!(refusal(read_gguf(&path).unwrap_err()).contains("late"));
        // Tensors that fit exactly are read, and counted.
        let fits: &[(&str, &[u64], u32, u64)] = &[("a", &[4], 0, 0), ("b", &[2, 4], 1, 16)];
        std::fs::write(&path, raw_gguf(0, &[], fits, 32)).unwrap();
        assert_eq!(read_gguf(&path).unwrap().parameter_count, Some(12));
    }

    #[test]
    fn a_declared_parameter_count_no_file_could_hold_is_not_believed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let mut metadata = 23u64.to_le_bytes().to_vec();
        metadata.extend_from_slice(b"general.parameter_count");
        metadata.extend_from_slice(&10u32.to_le_bytes());
        metadata.extend_from_slice(&(1u64 << 62).to_le_bytes());
        std::fs::write(&path, raw_gguf(1, &metadata, ONE_TENSOR, 16)).unwrap();
        assert_eq!(read_gguf(&path).unwrap().parameter_count, Some(4));
    }

    #[test]
    fn a_header_without_tensors_is_not_a_model() {
        // Issue: a 24-byte GGUF (magic, version, zero tensors, zero keys) was accepted.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.gguf");
        let mut bytes = b"GGUF".to_vec();
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(&0u64.to_le_bytes());
        bytes.extend_from_slice(&0u64.to_le_bytes());
        assert_eq!(bytes.len(), 24);
        std::fs::write(&path, &bytes).unwrap();
        let error = read_gguf(&path).unwrap_err();
        assert!(error.to_string().contains("no tensors"), "{error}");
    }

    #[test]
    fn reads_the_metadata_that_matters() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        write_test_gguf(
            &path,
            &[
                ("general.architecture", "llama"),
                ("general.name", "Tiny"),
                ("general.size_label", "1K"),
            ],
            &[
                ("general.file_type", 3),
                ("llama.context_length", 2048),
                ("other.context_length", 7),
            ],
            1234,
        )
        .unwrap();
        let info = read_gguf(&path).unwrap();
        assert_eq!(info.version, 3);
        assert_eq!(info.architecture.as_deref(), Some("llama"));
        assert_eq!(info.name.as_deref(), Some("Tiny"));
        assert_eq!(info.size_label.as_deref(), Some("1K"));
        assert_eq!(info.context_length, Some(2048));
        assert_eq!(info.quantization.as_deref(), Some("Q4_1"));
        assert_eq!(info.parameter_count, Some(1234));
        assert_eq!(info.tensor_count, 1);
    }

    #[test]
    fn refuses_other_files_naming_the_bytes_found() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("elf");
        std::fs::write(&path, b"\x7fELF\x02\x01\x01").unwrap();
        match read_gguf(&path).unwrap_err() {
            Error::ModelInvalid { found, reason, .. } => {
                assert_eq!(found.as_deref(), Some("7f454c46"));
                assert!(reason.contains("GGUF"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        std::fs::write(&path, b"GG").unwrap();
        assert!(
            matches!(read_gguf(&path).unwrap_err(), Error::ModelInvalid { found: Some(f), .. } if f == "4747")
        );
        std::fs::write(&path, b"GGUF\x01\x00\x00\x00").unwrap();
        assert!(
            matches!(read_gguf(&path).unwrap_err(), Error::ModelInvalid { reason, .. } if reason.contains("version 1"))
        );
    }

    #[test]
    fn refuses_truncated_headers_without_huge_allocations() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.gguf");
        write_test_gguf(&good, &[("general.architecture", "llama")], &[], 10).unwrap();
        let bytes = std::fs::read(&good).unwrap();
        // Every prefix that cuts into the header or the data must be refused, never
        // panic.
        for cut in 0..bytes.len() {
            let path = dir.path().join("cut.gguf");
            std::fs::write(&path, &bytes[..cut]).unwrap();
            assert!(
                matches!(read_gguf(&path), Err(Error::ModelInvalid { .. })),
                "cut at {cut}"
            );
        }
        // A string length of 2^63 must be refused, not allocated.
        let mut huge = bytes[..24].to_vec();
        huge.extend_from_slice(&(1u64 << 63).to_le_bytes());
        let path = dir.path().join("huge.gguf");
        std::fs::write(&path, &huge).unwrap();
        assert!(matches!(read_gguf(&path), Err(Error::ModelInvalid { .. })));
    }
}
