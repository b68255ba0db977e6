//! stable-diffusion.cpp's model files, told by their content and read bounded: a
//! safetensors checkpoint, or a GGUF of diffusion tensors (what sd.cpp's `convert`
//! writes, keeping the checkpoint's tensor names); recorded under `diffusion`. Also the
//! probe of its runtime library ([`library_version`]).
//!
//! # Safetensors
//!
//! A little-endian `u64` header length `N`, `N` bytes of JSON (an object of tensors
//! `{"dtype", "shape", "data_offsets": [begin, end]}` and an optional `__metadata__` of
//! strings), then the tensors' data. stable-diffusion.cpp reads the whole header into
//! memory and trusts its offsets; a model file is untrusted input, so before anything is
//! sized by a number from the file:
//!
//! * `N` is at most [`MAX_SAFETENSORS_HEADER`] and inside the file, so a header length
//!   of `u64::MAX` is refused naming it instead of being allocated;
//! * at most [`MAX_SAFETENSORS_TENSORS`] tensors are kept, and a shape's dimensions are
//!   counted but at most [`MAX_SAFETENSORS_DIMS`] kept;
//! * every tensor has a known dtype, non-negative dimensions whose product fits in a
//!   `u64`, and exactly as many bytes as its shape and dtype take;
//! * the file holds every tensor's data: one that ends past the file (a truncated
//!   download, or a hostile offset) is refused naming the tensor.
//!
//! Then it must be a diffusion model: a file without a UNet or DiT (the safetensors of
//! a language model, a lone VAE) is refused with its own code. Refusals are
//! [`DiffusionError`]s with a stable [`code`](DiffusionError::code), surfaced as
//! [`Error::FormatInvalid`] whose `details.check` is that code.
//!
//! # GGUF
//!
//! Read by the GGUF reader ([`crate::gguf`], bounded the same way), which hands over
//! each tensor's name, dimensions and type; a GGUF is claimed here only when its
//! tensors have stable-diffusion.cpp's names and none of llama.cpp's (`blk.N.`).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use serde::de::{self, Deserializer as _, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::header::{field, human_count, recorded, FormatReader, Header, Summary};
use crate::Error;

/// The longest safetensors header accepted, in bytes (the safetensors library's own
/// limit; an SDXL checkpoint's is about 200 KB).
pub const MAX_SAFETENSORS_HEADER: u64 = 100 << 20;

/// The most tensors a safetensors header may list (an SDXL checkpoint has about 2,500).
pub const MAX_SAFETENSORS_TENSORS: usize = 1 << 16;

/// The most dimensions a safetensors tensor may have (stable-diffusion.cpp reads 5).
pub const MAX_SAFETENSORS_DIMS: usize = 8;

/// Where a denoiser's tensors (a UNet or a DiT) live, as checkpoints and sd.cpp's
/// `convert` name them, and as standalone GGUF denoisers do without the prefix.
const DENOISER_PREFIXES: &[&str] = &[
    "model.diffusion_model.",
    "diffusion_model.",
    "unet.",
    "double_blocks.",
    "single_blocks.",
    "joint_blocks.",
    "input_blocks.",
];

/// Where a checkpoint's other parts live (autoencoders, text encoders): enough for a
/// GGUF to be stable-diffusion.cpp's, not for it to be a diffusion model.
const PART_PREFIXES: &[&str] = &[
    "first_stage_model.",
    "vae.",
    "tae.",
    "cond_stage_model.",
    "conditioner.embedders.",
    "text_encoders.",
    "te.",
];

/// The token embedding whose width tells the text encoder (768: CLIP ViT-L, SD 1.x;
/// 1024: OpenCLIP ViT-H, SD 2.x), as stable-diffusion.cpp looks for it.
const TOKEN_EMBEDDINGS: &[&str] = &[
    "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight",
    "cond_stage_model.model.token_embedding.weight",
    "text_model.embeddings.token_embedding.weight",
    "te.text_model.embeddings.token_embedding.weight",
    "conditioner.embedders.0.model.token_embedding.weight",
    "conditioner.embedders.0.transformer.text_model.embeddings.token_embedding.weight",
];

/// What a diffusion model's file says of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiffusionInfo {
    /// The model family guessed from its tensors as stable-diffusion.cpp does (`SD 1.x`,
    /// `SD 2.x`, `SDXL`, `SDXS`, `SD3`, `Flux`), or `unknown`.
    pub architecture: String,
    /// The file's container: `safetensors` or `gguf`.
    pub container: String,
    /// The tensors in the file.
    pub tensor_count: u64,
    /// The sum of the tensors' element counts.
    pub parameter_count: u64,
    /// The type holding the most elements (`F16`, `BF16`, `Q8_0`, …).
    pub dtype: String,
    /// Whether it carries a full autoencoder (`first_stage_model.*`).
    pub vae: bool,
    /// Whether it carries a tiny autoencoder, TAESD (`tae.*`).
    pub taesd: bool,
}

/// Why a file is not a usable diffusion model. Each variant has a stable
/// [`code`](DiffusionError::code) and names the offending value in its message and
/// [`details`](DiffusionError::details).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DiffusionError {
    /// The file ends before a part it declares: the header, or a tensor's data.
    #[error("the file ends at byte {size}, before the end of {part} at byte {end}")]
    Truncated {
        /// What it ends before (`the header`, ``tensor `x` ``).
        part: String,
        /// The tensor, when it is one.
        tensor: Option<String>,
        /// Where that part ends.
        end: u64,
        /// The file's size.
        size: u64,
    },
    /// The header length is more than [`MAX_SAFETENSORS_HEADER`].
    #[error("its header length is {length} bytes, more than the {max} accepted")]
    HeaderTooLarge {
        /// The length found.
        length: u64,
        /// The most accepted.
        max: u64,
    },
    /// The header is not a JSON object of tensors (or a tensor entry is malformed).
    #[error("its safetensors header is invalid at `{field}`: {reason}")]
    HeaderInvalid {
        /// The entry (`header`, `__metadata__`, a tensor's name).
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The header lists more than [`MAX_SAFETENSORS_TENSORS`] tensors.
    #[error("its header lists more than {max} tensors")]
    TooManyTensors {
        /// The most accepted.
        max: usize,
    },
    /// A tensor's dtype is not a safetensors dtype.
    #[error("tensor `{tensor}` has dtype `{dtype}`, which is no safetensors dtype")]
    UnknownDtype {
        /// The tensor.
        tensor: String,
        /// The dtype found.
        dtype: String,
    },
    /// A tensor's shape is impossible (too many, negative or overflowing dimensions).
    #[error("tensor `{tensor}` has shape {shape:?}: {reason}")]
    BadShape {
        /// The tensor.
        tensor: String,
        /// Its dimensions (the first [`MAX_SAFETENSORS_DIMS`]).
        shape: Vec<i64>,
        /// What is wrong.
        reason: String,
    },
    /// A tensor's `data_offsets` do not span the bytes its shape and dtype take.
    #[error("tensor `{tensor}` has data_offsets [{begin}, {end}], but its shape and dtype take {expected} bytes")]
    BadOffsets {
        /// The tensor.
        tensor: String,
        /// Its first offset.
        begin: u64,
        /// Its second offset.
        end: u64,
        /// The bytes its shape and dtype take.
        expected: u64,
    },
    /// The file holds no UNet or DiT.
    #[error("it holds no UNet or DiT (no `model.diffusion_model.*` tensors): its {tensor_count} tensors start with {sample:?}")]
    NotADiffusionModel {
        /// The tensors it holds.
        tensor_count: u64,
        /// The first few of their names.
        sample: Vec<String>,
    },
}

impl DiffusionError {
    /// The stable code of this refusal: `SAFETENSORS_TRUNCATED`,
    /// `SAFETENSORS_HEADER_TOO_LARGE`, `SAFETENSORS_HEADER_INVALID`,
    /// `SAFETENSORS_TOO_MANY_TENSORS`, `SAFETENSORS_UNKNOWN_DTYPE`,
    /// `SAFETENSORS_BAD_SHAPE`, `SAFETENSORS_BAD_OFFSETS` or
    /// `DIFFUSION_NOT_A_DIFFUSION_MODEL`.
    pub fn code(&self) -> &'static str {
        match self {
            DiffusionError::Truncated { .. } => "SAFETENSORS_TRUNCATED",
            DiffusionError::HeaderTooLarge { .. } => "SAFETENSORS_HEADER_TOO_LARGE",
            DiffusionError::HeaderInvalid { .. } => "SAFETENSORS_HEADER_INVALID",
            DiffusionError::TooManyTensors { .. } => "SAFETENSORS_TOO_MANY_TENSORS",
            DiffusionError::UnknownDtype { .. } => "SAFETENSORS_UNKNOWN_DTYPE",
            DiffusionError::BadShape { .. } => "SAFETENSORS_BAD_SHAPE",
            DiffusionError::BadOffsets { .. } => "SAFETENSORS_BAD_OFFSETS",
            DiffusionError::NotADiffusionModel { .. } => "DIFFUSION_NOT_A_DIFFUSION_MODEL",
        }
    }

    /// The refusal's fields as JSON, with `check` set to [`code`](DiffusionError::code).
    pub fn details(&self) -> Value {
        let mut value = match self {
            DiffusionError::Truncated {
                part,
                tensor,
                end,
                size,
            } => json!({"part": part, "tensor": tensor, "end": end, "size": size}),
            DiffusionError::HeaderTooLarge { length, max } => {
                json!({"field": "header length", "value": length, "max": max})
            }
            DiffusionError::HeaderInvalid { field, reason } => {
                json!({"field": field, "reason": reason})
            }
            DiffusionError::TooManyTensors { max } => json!({"field": "tensor count", "max": max}),
            DiffusionError::UnknownDtype { tensor, dtype } => {
                json!({"tensor": tensor, "dtype": dtype})
            }
            DiffusionError::BadShape {
                tensor,
                shape,
                reason,
            } => json!({"tensor": tensor, "shape": shape, "reason": reason}),
            DiffusionError::BadOffsets {
                tensor,
                begin,
                end,
                expected,
            } => json!({"tensor": tensor, "dataOffsets": [begin, end], "expectedBytes": expected}),
            DiffusionError::NotADiffusionModel {
                tensor_count,
                sample,
            } => json!({"tensorCount": tensor_count, "sample": sample}),
        };
        value["check"] = json!(self.code());
        value
    }
}

/// The diffusion reader of the registry's table ([`crate::READERS`]): records
/// `diffusion`.
pub(crate) struct Checkpoint;

impl FormatReader for Checkpoint {
    fn format(&self) -> arcane_workspace::ModelFormat {
        arcane_workspace::formats::DIFFUSION
    }

    fn kind(&self) -> &'static str {
        "diffusion"
    }

    fn key(&self) -> &'static str {
        "diffusion"
    }

    fn claims(&self, path: &Path) -> bool {
        let (head, got) = head(path);
        // GGUF first: its ninth byte is the low byte of the tensor count, which may be `{`.
        if got >= 4 && &head[..4] == crate::gguf::MAGIC {
            return gguf_is_diffusion(path);
        }
        got == head.len() && looks_like_safetensors(&head)
    }

    fn read(&self, path: &Path) -> Result<Header, Error> {
        Ok(recorded(self.key(), &read_diffusion(path)?))
    }

    fn summary(&self, header: &Header) -> Summary {
        let Some(info) = field::<DiffusionInfo>(header, self.key()) else {
            return Summary::default();
        };
        Summary {
            family: self.kind().into(),
            parameters: Some(info.parameter_count),
            quantization: Some(info.dtype.clone()),
            context: None,
            description: describe(&info),
        }
    }
}

impl crate::Model {
    /// What its diffusion model's file said when it was added (`None`: not a diffusion
    /// model).
    pub fn diffusion(&self) -> Option<DiffusionInfo> {
        field(&self.header, "diffusion")
    }
}

/// `SDXS, 441M parameters, F16, safetensors, TAESD`.
fn describe(info: &DiffusionInfo) -> String {
    let mut parts = vec![
        info.architecture.clone(),
        format!("{} parameters", human_count(info.parameter_count)),
        info.dtype.clone(),
        info.container.clone(),
    ];
    parts.extend(info.vae.then(|| "VAE".to_string()));
    parts.extend(info.taesd.then(|| "TAESD".to_string()));
    parts.join(", ")
}

/// The version of stable-diffusion.cpp's library at `library` (its loader's refusal:
/// missing, not a library, not stable-diffusion.cpp's).
pub(crate) fn library_version(library: &Path) -> Result<String, Error> {
    arcane_stable_diffusion::library_version(library)
        .map_err(|error| Error::Library(Box::new(error)))
}

/// The first 9 bytes of the file at `path` and how many it has (0 when it cannot be
/// read): all a safetensors file is told by.
fn head(path: &Path) -> ([u8; 9], usize) {
    let mut head = [0u8; 9];
    let mut got = 0;
    if let Ok(file) = arcane_files::open_regular(path) {
        let mut bytes = Vec::with_capacity(head.len());
        if file.take(9).read_to_end(&mut bytes).is_ok() {
            got = bytes.len();
            head[..got].copy_from_slice(&bytes);
        }
    }
    (head, got)
}

/// Whether `head` starts a safetensors file: a header length of at least 2 (`{}`) and
/// the header's opening brace. A damaged or hostile length is still claimed, so that
/// [`read_diffusion`] names it.
fn looks_like_safetensors(head: &[u8; 9]) -> bool {
    let mut length = [0u8; 8];
    length.copy_from_slice(&head[..8]);
    u64::from_le_bytes(length) >= 2 && head[8] == b'{'
}

/// Whether the GGUF file at `path` is stable-diffusion.cpp's: some tensor has a
/// checkpoint's name and none llama.cpp's `blk.N.` (a damaged file is left to the GGUF
/// reader, which names what is wrong).
fn gguf_is_diffusion(path: &Path) -> bool {
    let (mut diffusion, mut llama) = (false, false);
    let read = crate::gguf::read_gguf_tensors(path, &mut |name, _, _| {
        diffusion |= has_prefix(name, DENOISER_PREFIXES) || has_prefix(name, PART_PREFIXES);
        llama |= name.starts_with("blk.");
    });
    read.is_ok() && diffusion && !llama
}

fn has_prefix(name: &str, prefixes: &[&str]) -> bool {
    prefixes.iter().any(|prefix| name.starts_with(prefix))
}

/// Reads and checks the diffusion model at `path`: a GGUF by the GGUF reader, anything
/// else as safetensors.
///
/// Fails with [`Error::FormatInvalid`] (naming the file, with the [`DiffusionError`]'s
/// message and details) when it is not a usable diffusion model, [`Error::ModelInvalid`]
/// when it is not a regular file or a damaged GGUF, and [`Error::Io`] when it cannot be
/// read.
pub fn read_diffusion(path: &Path) -> Result<DiffusionInfo, Error> {
    let (head, got) = head(path);
    if got >= 4 && &head[..4] == crate::gguf::MAGIC {
        return read_gguf_checkpoint(path);
    }
    let (file, size) = open(path)?;
    read_safetensors_from(file, size)
        .map_err(|e| Error::io("read", path, e))?
        .map_err(|error| refusal(path, error))
}

/// `error` as the registry reports it: the file named, `details.check` its code.
fn refusal(path: &Path, error: DiffusionError) -> Error {
    Error::FormatInvalid {
        path: path.to_path_buf(),
        label: Checkpoint.format().label,
        format: Checkpoint.key(),
        reason: error.to_string(),
        details: error.details(),
    }
}

/// The regular file at `path` and its size.
fn open(path: &Path) -> Result<(File, u64), Error> {
    let file = arcane_files::open_regular(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidInput {
            // A FIFO, socket, device or directory: named, never read (nor waited on).
            Error::ModelInvalid {
                path: path.to_path_buf(),
                reason: format!("it {e}"),
                found: None,
            }
        } else {
            Error::io("open", path, e)
        }
    })?;
    let size = file
        .metadata()
        .map_err(|e| Error::io("inspect", path, e))?
        .len();
    Ok((file, size))
}

/// A GGUF of diffusion tensors, surveyed tensor by tensor as the GGUF reader checks them.
fn read_gguf_checkpoint(path: &Path) -> Result<DiffusionInfo, Error> {
    let mut survey = Survey::default();
    crate::gguf::read_gguf_tensors(path, &mut |name, shape, kind| {
        let elements = shape.iter().fold(1u64, |n, &d| n.saturating_mul(d));
        survey.add(name, ggml_type_name(kind), elements, shape.first().copied());
    })?;
    survey.finish("gguf").map_err(|error| refusal(path, error))
}

/// Reads and checks a safetensors diffusion model from `file` of `size` bytes (see the
/// module documentation for the bounds). I/O errors are the outer `Err`; a file that is
/// not a usable model the inner one.
fn read_safetensors_from(
    mut file: impl Read,
    size: u64,
) -> std::io::Result<Result<DiffusionInfo, DiffusionError>> {
    if size < 8 {
        return Ok(Err(truncated("the header length", None, 8, size)));
    }
    let mut length = [0u8; 8];
    file.read_exact(&mut length)?;
    let length = match header_length(u64::from_le_bytes(length), size) {
        Ok(length) => length,
        Err(refusal) => return Ok(Err(refusal)),
    };
    // `length` is at most MAX_SAFETENSORS_HEADER and inside the file: safe to allocate.
    // A file that shrank since its size was read fails here, as an I/O error.
    let mut text = vec![0u8; usize::try_from(length).map_err(std::io::Error::other)?];
    file.read_exact(&mut text)?;
    Ok(parse_header(&text)
        .and_then(|entries| survey(&entries, 8 + length, size))
        .and_then(|survey| survey.finish("safetensors")))
}

/// The header length `length` of a file of `size` bytes, checked before it sizes
/// anything.
fn header_length(length: u64, size: u64) -> Result<u64, DiffusionError> {
    if length > MAX_SAFETENSORS_HEADER {
        return Err(DiffusionError::HeaderTooLarge {
            length,
            max: MAX_SAFETENSORS_HEADER,
        });
    }
    if length < 2 {
        return Err(DiffusionError::HeaderInvalid {
            field: "header length".into(),
            reason: format!("{length} bytes cannot hold a JSON object"),
        });
    }
    if length > size.saturating_sub(8) {
        return Err(truncated("the header", None, 8 + length, size));
    }
    Ok(length)
}

fn truncated(part: &str, tensor: Option<&str>, end: u64, size: u64) -> DiffusionError {
    DiffusionError::Truncated {
        part: part.into(),
        tensor: tensor.map(str::to_string),
        end,
        size,
    }
}

/// One tensor of the header as written, before it is checked.
struct Entry {
    name: String,
    raw: RawEntry,
}

/// A tensor's fields in the header (others are ignored, as the safetensors library
/// does).
#[derive(Deserialize)]
struct RawEntry {
    dtype: String,
    shape: Shape,
    data_offsets: [u64; 2],
}

/// A tensor's `shape`: how many dimensions it lists, and the first
/// [`MAX_SAFETENSORS_DIMS`] of them (a hostile shape of millions is counted, not kept).
struct Shape {
    dims: Vec<i64>,
    count: u64,
}

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Shape, D::Error> {
        deserializer.deserialize_seq(ShapeVisitor)
    }
}

struct ShapeVisitor;

impl<'de> Visitor<'de> for ShapeVisitor {
    type Value = Shape;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of integer dimensions")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
        let mut shape = Shape {
            dims: Vec::new(),
            count: 0,
        };
        while let Some(dim) = seq.next_element::<i64>()? {
            if shape.dims.len() < MAX_SAFETENSORS_DIMS {
                shape.dims.push(dim);
            }
            shape.count += 1;
        }
        Ok(shape)
    }
}

/// Parses the header's JSON into its tensor entries, keeping at most
/// [`MAX_SAFETENSORS_TENSORS`]; a malformed entry is refused naming it.
fn parse_header(text: &[u8]) -> Result<Vec<Entry>, DiffusionError> {
    let mut refused = None;
    let mut deserializer = serde_json::Deserializer::from_slice(text);
    let parsed = deserializer
        .deserialize_map(HeaderVisitor {
            refused: &mut refused,
        })
        // Only whitespace (the padding writers align the data with) may follow.
        .and_then(|entries| deserializer.end().map(|()| entries));
    parsed.map_err(|error| {
        refused.unwrap_or_else(|| DiffusionError::HeaderInvalid {
            field: "header".into(),
            reason: error.to_string(),
        })
    })
}

/// Walks the header's object; what it refuses is left in `refused` (serde's own error
/// cannot carry it).
struct HeaderVisitor<'a> {
    refused: &'a mut Option<DiffusionError>,
}

impl<'de> Visitor<'de> for HeaderVisitor<'_> {
    type Value = Vec<Entry>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object of tensors")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<Entry>, A::Error> {
        let mut entries = Vec::new();
        while let Some(name) = map.next_key::<String>()? {
            if name == "__metadata__" {
                let metadata = map.next_value::<BTreeMap<String, String>>();
                noted(self.refused, &name, metadata)?;
                continue;
            }
            if entries.len() == MAX_SAFETENSORS_TENSORS {
                *self.refused = Some(DiffusionError::TooManyTensors {
                    max: MAX_SAFETENSORS_TENSORS,
                });
                return Err(de::Error::custom("too many tensors"));
            }
            let raw = noted(self.refused, &name, map.next_value::<RawEntry>())?;
            entries.push(Entry { name, raw });
        }
        Ok(entries)
    }
}

/// `result`, its error noted in `refused` as the header being invalid at `field`.
fn noted<T, E: de::Error>(
    refused: &mut Option<DiffusionError>,
    field: &str,
    result: Result<T, E>,
) -> Result<T, E> {
    result.inspect_err(|error| {
        refused.get_or_insert_with(|| DiffusionError::HeaderInvalid {
            field: field.into(),
            reason: error.to_string(),
        });
    })
}

/// Checks every entry of a header ending at byte `header_end` of a file of `size`
/// bytes, and surveys them.
fn survey(entries: &[Entry], header_end: u64, size: u64) -> Result<Survey, DiffusionError> {
    let mut survey = Survey::default();
    let mut furthest: Option<&Entry> = None;
    for entry in entries {
        let (dtype, elements) = check_entry(entry)?;
        let width = entry.raw.shape.dims.last().map(|&d| d.unsigned_abs());
        survey.add(&entry.name, dtype, elements, width);
        if furthest.is_none_or(|f| entry.raw.data_offsets[1] > f.raw.data_offsets[1]) {
            furthest = Some(entry);
        }
    }
    // Offsets count from the end of the header; the last tensor must end in the file.
    if let Some(last) = furthest {
        let end = header_end.saturating_add(last.raw.data_offsets[1]);
        if end > size {
            let part = format!("tensor `{}`", last.name);
            return Err(truncated(&part, Some(&last.name), end, size));
        }
    }
    Ok(survey)
}

/// The dtype and element count of `entry`, whose offsets must span exactly its bytes.
fn check_entry(entry: &Entry) -> Result<(&'static str, u64), DiffusionError> {
    let Some((dtype, width)) = dtype_of(&entry.raw.dtype) else {
        return Err(DiffusionError::UnknownDtype {
            tensor: entry.name.clone(),
            dtype: entry.raw.dtype.clone(),
        });
    };
    let elements = elements(entry)?;
    let bytes = elements.checked_mul(width).ok_or_else(|| {
        bad_shape(
            entry,
            format!("{elements} {dtype} elements take over 2^64 bytes"),
        )
    })?;
    let [begin, end] = entry.raw.data_offsets;
    if end.checked_sub(begin) != Some(bytes) {
        return Err(DiffusionError::BadOffsets {
            tensor: entry.name.clone(),
            begin,
            end,
            expected: bytes,
        });
    }
    Ok((dtype, elements))
}

/// The element count of `entry`'s shape: at most [`MAX_SAFETENSORS_DIMS`] non-negative
/// dimensions whose product fits in a `u64` (an empty shape is a scalar).
fn elements(entry: &Entry) -> Result<u64, DiffusionError> {
    let shape = &entry.raw.shape;
    if shape.count > MAX_SAFETENSORS_DIMS as u64 {
        let reason = format!(
            "it lists {} dimensions, at most {MAX_SAFETENSORS_DIMS} accepted",
            shape.count
        );
        return Err(bad_shape(entry, reason));
    }
    shape.dims.iter().try_fold(1u64, |product, &dim| {
        let dim = u64::try_from(dim)
            .map_err(|_| bad_shape(entry, format!("dimension {dim} is negative")))?;
        product
            .checked_mul(dim)
            .ok_or_else(|| bad_shape(entry, "the product of its dimensions passes 2^64".into()))
    })
}

fn bad_shape(entry: &Entry, reason: String) -> DiffusionError {
    DiffusionError::BadShape {
        tensor: entry.name.clone(),
        shape: entry.raw.shape.dims.clone(),
        reason,
    }
}

/// The safetensors dtypes of whole bytes, with their width in bytes.
fn dtype_of(dtype: &str) -> Option<(&'static str, u64)> {
    Some(match dtype {
        "BOOL" => ("BOOL", 1),
        "U8" => ("U8", 1),
        "I8" => ("I8", 1),
        "F8_E4M3" => ("F8_E4M3", 1),
        "F8_E5M2" => ("F8_E5M2", 1),
        "F8_E8M0" => ("F8_E8M0", 1),
        "I16" => ("I16", 2),
        "U16" => ("U16", 2),
        "F16" => ("F16", 2),
        "BF16" => ("BF16", 2),
        "I32" => ("I32", 4),
        "U32" => ("U32", 4),
        "F32" => ("F32", 4),
        "I64" => ("I64", 8),
        "U64" => ("U64", 8),
        "F64" => ("F64", 8),
        _ => return None,
    })
}

/// The name of a ggml tensor type; the unknown ones share one name, so a hostile GGUF
/// cannot grow the survey's table.
fn ggml_type_name(kind: u32) -> &'static str {
    const NAMES: [&str; 40] = [
        "F32", "F16", "Q4_0", "Q4_1", "", "", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K",
        "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S",
        "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16", "", "", "", "TQ1_0",
        "TQ2_0", "", "", "", "MXFP4",
    ];
    match NAMES.get(kind as usize) {
        Some(name) if !name.is_empty() => name,
        _ => "unknown",
    }
}

/// What the tensors of a file say, gathered one tensor at a time (nothing per tensor is
/// kept but the first few names).
#[derive(Default)]
struct Survey {
    tensors: u64,
    parameters: u64,
    /// Elements per type.
    types: BTreeMap<&'static str, u64>,
    sample: Vec<String>,
    denoiser: bool,
    vae: bool,
    taesd: bool,
    /// stable-diffusion.cpp's clues to the version (`get_sd_version`).
    unet: bool,
    encoders: bool,
    middle_block_1: bool,
    output_block_71: bool,
    flux: bool,
    sd3: bool,
    token_width: Option<u64>,
}

impl Survey {
    /// Adds tensor `name` of `elements` elements of `dtype`, whose row width (ggml's
    /// `ne[0]`) is `width`.
    fn add(&mut self, name: &str, dtype: &'static str, elements: u64, width: Option<u64>) {
        self.tensors += 1;
        self.parameters = self.parameters.saturating_add(elements);
        let total = self.types.entry(dtype).or_default();
        *total = total.saturating_add(elements);
        if self.sample.len() < 3 {
            self.sample.push(name.to_string());
        }
        self.denoiser |= has_prefix(name, DENOISER_PREFIXES);
        self.vae |= name.starts_with("first_stage_model.") || name.starts_with("vae.");
        self.taesd |= name.starts_with("tae.");
        self.clues(name);
        if TOKEN_EMBEDDINGS.contains(&name) {
            self.token_width = width;
        }
    }

    /// The names stable-diffusion.cpp tells a model's version by.
    fn clues(&mut self, name: &str) {
        let has = |part: &str| name.contains(part);
        self.unet |= has("model.diffusion_model.input_blocks.") || has("unet.down_blocks.");
        self.encoders |= has("conditioner.embedders.1")
            || has("cond_stage_model.1")
            || name.starts_with("te.1.");
        self.middle_block_1 |=
            has("model.diffusion_model.middle_block.1.") || has("unet.mid_block.resnets.1.");
        self.output_block_71 |=
            has("model.diffusion_model.output_blocks.7.1") || has("unet.up_blocks.2.attentions.1");
        self.flux |= has("double_blocks.");
        self.sd3 |= has("joint_blocks.");
    }

    /// The family, by a simpler form of stable-diffusion.cpp's `get_sd_version`: SDXS
    /// is an SD 1.x text encoder with neither the second middle block nor the output
    /// block 7.1.
    fn architecture(&self) -> &'static str {
        match self.token_width {
            _ if self.sd3 => "SD3",
            _ if self.flux => "Flux",
            _ if self.unet && self.encoders => "SDXL",
            Some(768) if !self.middle_block_1 && !self.output_block_71 => "SDXS",
            Some(768) => "SD 1.x",
            Some(1024) => "SD 2.x",
            _ => "unknown",
        }
    }

    /// What the file is, when it holds a denoiser.
    fn finish(self, container: &str) -> Result<DiffusionInfo, DiffusionError> {
        if !self.denoiser {
            return Err(DiffusionError::NotADiffusionModel {
                tensor_count: self.tensors,
                sample: self.sample,
            });
        }
        let dtype = self.types.iter().max_by_key(|(_, &n)| n).map(|(t, _)| *t);
        Ok(DiffusionInfo {
            architecture: self.architecture().into(),
            container: container.into(),
            tensor_count: self.tensors,
            parameter_count: self.parameters,
            dtype: dtype.unwrap_or("unknown").into(),
            vae: self.vae,
            taesd: self.taesd,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arcane_report::Diagnostic;

    /// A tensor of a test file: name, dtype, shape.
    type Tensor<'a> = (&'a str, &'a str, &'a [u64]);

    /// SDXS-512-DS in miniature: an SD 1.x text encoder (768 wide), a UNet without the
    /// second middle block or output block 7.1, and a TAESD.
    const SDXS: &[Tensor] = &[
        (
            "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight",
            "F16",
            &[8, 768],
        ),
        (
            "model.diffusion_model.input_blocks.0.0.weight",
            "F16",
            &[4, 4, 3, 3],
        ),
        ("model.diffusion_model.out.2.bias", "F32", &[4]),
        ("tae.decoder.layers.0.weight", "F32", &[2, 3]),
    ];

    /// A safetensors file of `header` (JSON) followed by `data` zero bytes.
    fn raw(header: &str, data: u64) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.resize(out.len() + data as usize, 0);
        out
    }

    /// A well-formed safetensors file of `tensors`, their data laid out one after
    /// another in the header's (sorted) order, with a `__metadata__`.
    fn safetensors(tensors: &[Tensor]) -> Vec<u8> {
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), json!({"format": "pt"}));
        let mut sorted = tensors.to_vec();
        sorted.sort();
        let mut offset = 0;
        for (name, dtype, shape) in sorted {
            let bytes = shape.iter().product::<u64>() * dtype_of(dtype).unwrap().1;
            let entry =
                json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + bytes]});
            header.insert(name.into(), entry);
            offset += bytes;
        }
        raw(&Value::Object(header).to_string(), offset)
    }

    /// A header of one tensor `entry`, and enough data for the entry's stated offsets
    /// when they are small.
    fn one(entry: Value) -> Vec<u8> {
        let data = entry["data_offsets"][1].as_u64().unwrap_or(0).min(1 << 16);
        raw(
            &json!({ "model.diffusion_model.w": entry }).to_string(),
            data,
        )
    }

    fn read(bytes: &[u8]) -> Result<DiffusionInfo, DiffusionError> {
        read_safetensors_from(bytes, bytes.len() as u64).unwrap()
    }

    fn refused(bytes: &[u8]) -> DiffusionError {
        read(bytes).expect_err("refused")
    }

    #[test]
    fn reads_a_well_formed_diffusion_model() {
        let info = read(&safetensors(SDXS)).unwrap();
        assert_eq!(info.tensor_count, 4);
        assert_eq!(info.parameter_count, 8 * 768 + 4 * 4 * 3 * 3 + 4 + 6);
        assert_eq!(info.dtype, "F16");
        assert_eq!(info.architecture, "SDXS");
        assert_eq!(info.container, "safetensors");
        assert!(info.taesd && !info.vae);
        let summary = Checkpoint.summary(&recorded("diffusion", &info));
        assert_eq!(summary.family, "diffusion");
        assert_eq!(summary.parameters, Some(6_298));
        assert_eq!(summary.quantization.as_deref(), Some("F16"));
        assert_eq!(
            summary.description,
            "SDXS, 6K parameters, F16, safetensors, TAESD"
        );
        // Padding after the JSON, as writers align the data, is allowed.
        let padded = raw("{\"model.diffusion_model.w\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]}}    ", 4);
        assert_eq!(read(&padded).unwrap().parameter_count, 1);
    }

    #[test]
    fn the_architecture_follows_stable_diffusion_cpps_clues() {
        let guess = |tensors: &[Tensor]| read(&safetensors(tensors)).unwrap().architecture;
        let mut sd1 = SDXS.to_vec();
        sd1.push((
            "model.diffusion_model.middle_block.1.norm.bias",
            "F32",
            &[4],
        ));
        assert_eq!(guess(&sd1), "SD 1.x");
        let mut tiny = SDXS.to_vec();
        tiny.push((
            "model.diffusion_model.output_blocks.7.1.norm.bias",
            "F32",
            &[4],
        ));
        assert_eq!(guess(&tiny), "SD 1.x");
        let mut sd2 = sd1.clone();
        sd2[0].2 = &[8, 1024];
        assert_eq!(guess(&sd2), "SD 2.x");
        let mut sdxl = sd1.clone();
        sdxl.push(("conditioner.embedders.1.model.ln_final.bias", "F32", &[4]));
        assert_eq!(guess(&sdxl), "SDXL");
        let flux = [(
            "model.diffusion_model.double_blocks.0.img_mod.lin.bias",
            "BF16",
            &[4][..],
        )];
        assert_eq!(guess(&flux), "Flux");
        let vae = [
            ("model.diffusion_model.x", "F16", &[4][..]),
            ("first_stage_model.decoder.conv_in.bias", "F32", &[4]),
        ];
        let info = read(&safetensors(&vae)).unwrap();
        assert_eq!(info.architecture, "unknown");
        assert!(info.vae && !info.taesd);
    }

    #[test]
    fn refuses_every_truncation() {
        let bytes = safetensors(SDXS);
        let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap());
        // Every proper prefix is refused as truncated, none is read as a model.
        for cut in 0..bytes.len() {
            let error = refused(&bytes[..cut]);
            assert_eq!(
                error.code(),
                "SAFETENSORS_TRUNCATED",
                "cut at {cut}: {error}"
            );
            assert_eq!(error.details()["size"], cut);
        }
        let error = refused(&bytes[..100]);
        assert_eq!(error.details()["part"], "the header");
        assert_eq!(error.details()["end"], header_end);
        // Cut in the data: the tensor that reaches furthest is named.
        let error = refused(&bytes[..bytes.len() - 1]);
        assert_eq!(error.details()["tensor"], "tae.decoder.layers.0.weight");
        assert_eq!(error.details()["end"], bytes.len());
        assert!(
            error.to_string().contains("tae.decoder.layers.0.weight"),
            "{error}"
        );
    }

    #[test]
    fn refuses_hostile_header_lengths_naming_them() {
        let good = safetensors(SDXS);
        let with_length = |length: u64| {
            let mut bytes = good.clone();
            bytes[..8].copy_from_slice(&length.to_le_bytes());
            refused(&bytes)
        };
        for length in [u64::MAX, MAX_SAFETENSORS_HEADER + 1] {
            let error = with_length(length);
            assert_eq!(error.code(), "SAFETENSORS_HEADER_TOO_LARGE", "{error}");
            assert_eq!(error.details()["value"], length);
            assert!(error.to_string().contains(&length.to_string()), "{error}");
        }
        // Within the bound but past the end of the file.
        let error = with_length(good.len() as u64);
        assert_eq!(error.code(), "SAFETENSORS_TRUNCATED", "{error}");
        assert_eq!(error.details()["end"], good.len() + 8);
        let error = with_length(MAX_SAFETENSORS_HEADER);
        assert_eq!(error.code(), "SAFETENSORS_TRUNCATED", "{error}");
        let error = with_length(1);
        assert_eq!(error.code(), "SAFETENSORS_HEADER_INVALID", "{error}");
        assert_eq!(error.details()["field"], "header length");
    }

    #[test]
    fn refuses_a_header_that_is_not_an_object_of_tensors() {
        let cases = [
            ("[1, 2]", "header"),
            ("\"model.diffusion_model.w\"", "header"),
            (
                "{\"model.diffusion_model.w\": 1}",
                "model.diffusion_model.w",
            ),
            ("{\"t\": {\"dtype\": \"F32\", \"shape\": [1]}}", "t"),
            (
                "{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}}",
                "t",
            ),
            (
                "{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}",
                "t",
            ),
            ("{\"__metadata__\": {\"format\": 1}}", "__metadata__"),
            ("{} trailing", "header"),
            ("{\"t\": ", "t"),
        ];
        for (header, field) in cases {
            let error = refused(&raw(header, 0));
            assert_eq!(
                error.code(),
                "SAFETENSORS_HEADER_INVALID",
                "{header}: {error}"
            );
            assert_eq!(error.details()["field"], field, "{header}");
        }
    }

    #[test]
    fn refuses_an_unknown_dtype_naming_it() {
        let error = refused(&one(
            json!({"dtype": "Q4_K", "shape": [4], "data_offsets": [0, 4]}),
        ));
        assert_eq!(error.code(), "SAFETENSORS_UNKNOWN_DTYPE");
        assert_eq!(error.details()["dtype"], "Q4_K");
        assert_eq!(error.details()["tensor"], "model.diffusion_model.w");
    }

    #[test]
    fn refuses_impossible_shapes_naming_them() {
        let shape = |shape: Value, dtype: &str| {
            refused(&one(
                json!({"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}),
            ))
        };
        // A product past 2^64, its bytes past 2^64, a negative dimension, too many.
        let cases = [
            (json!([1u64 << 32, 1u64 << 32]), "F16", "2^64"),
            (json!([1u64 << 62]), "F32", "2^64 bytes"),
            (json!([4, -1]), "F32", "-1"),
            (json!(vec![1; 9]), "F32", "9 dimensions"),
        ];
        for (dims, dtype, says) in cases {
            let error = shape(dims.clone(), dtype);
            assert_eq!(error.code(), "SAFETENSORS_BAD_SHAPE", "{dims}: {error}");
            assert_eq!(error.details()["tensor"], "model.diffusion_model.w");
            assert!(error.to_string().contains(says), "{dims}: {error}");
        }
        // A million dimensions are counted, not kept.
        let error = shape(json!(vec![1; 1_000_000]), "F32");
        assert_eq!(
            error.details()["shape"].as_array().unwrap().len(),
            MAX_SAFETENSORS_DIMS
        );
        assert!(error.to_string().contains("1000000 dimensions"), "{error}");
    }

    #[test]
    fn refuses_offsets_that_do_not_span_the_tensor() {
        for offsets in [[0, 12], [0, 20], [16, 0], [8, 4]] {
            let entry = json!({"dtype": "F32", "shape": [4], "data_offsets": offsets});
            let error = refused(&one(entry));
            assert_eq!(
                error.code(),
                "SAFETENSORS_BAD_OFFSETS",
                "{offsets:?}: {error}"
            );
            assert_eq!(error.details()["dataOffsets"], json!(offsets));
            assert_eq!(error.details()["expectedBytes"], 16);
        }
    }

    #[test]
    fn refuses_offsets_outside_the_file_naming_the_tensor() {
        for begin in [1u64 << 40, u64::MAX - 16] {
            let entry = json!({"dtype": "F32", "shape": [4], "data_offsets": [begin, begin + 16]});
            let error = refused(&one(entry));
            assert_eq!(error.code(), "SAFETENSORS_TRUNCATED", "{begin}: {error}");
            assert_eq!(error.details()["tensor"], "model.diffusion_model.w");
            assert!(error.details()["end"].as_u64().unwrap() > begin);
        }
    }

    #[test]
    fn refuses_more_tensors_than_the_bound() {
        let header = |count: usize| {
            let entries: Vec<String> = (0..count)
                .map(|i| format!("\"model.diffusion_model.t{i}\":{{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}"))
                .collect();
            raw(&format!("{{{}}}", entries.join(",")), 0)
        };
        let info = read(&header(MAX_SAFETENSORS_TENSORS)).unwrap();
        assert_eq!(info.tensor_count, MAX_SAFETENSORS_TENSORS as u64);
        let error = refused(&header(MAX_SAFETENSORS_TENSORS + 1));
        assert_eq!(error.code(), "SAFETENSORS_TOO_MANY_TENSORS");
        assert_eq!(error.details()["max"], MAX_SAFETENSORS_TENSORS);
    }

    #[test]
    fn refuses_a_file_without_a_unet_or_dit() {
        let llm: &[Tensor] = &[
            ("lm_head.weight", "BF16", &[4, 2]),
            ("model.layers.0.self_attn.q_proj.weight", "BF16", &[2, 2]),
        ];
        let vae: &[Tensor] = &[("first_stage_model.decoder.conv_in.bias", "F32", &[4])];
        for (tensors, count) in [(llm, 2), (vae, 1), (&[][..], 0)] {
            let error = refused(&safetensors(tensors));
            assert_eq!(error.code(), "DIFFUSION_NOT_A_DIFFUSION_MODEL", "{error}");
            assert_eq!(error.details()["tensorCount"], count);
            let sample: Vec<&str> = tensors.iter().map(|t| t.0).collect();
            assert_eq!(error.details()["sample"], json!(sample));
        }
    }

    #[test]
    fn refusals_reach_users_with_their_check() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let bytes = safetensors(SDXS);
        std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
        let error = crate::read_header(&path).err().expect("refused");
        assert_eq!(error.code(), arcane_report::codes::LOCAL_AI_MODEL_INVALID);
        let details = error.details();
        assert_eq!(details["check"], "SAFETENSORS_TRUNCATED");
        assert_eq!(details["format"], "diffusion");
        assert_eq!(details["path"], path.display().to_string());
        assert!(error.to_string().contains("Stable Diffusion"), "{error}");
        std::fs::write(&path, &bytes).unwrap();
        let (reader, header) = crate::read_header(&path).unwrap();
        assert_eq!(reader.kind(), "diffusion");
        assert_eq!(
            field::<DiffusionInfo>(&header, "diffusion")
                .unwrap()
                .tensor_count,
            4
        );
    }

    #[test]
    fn safetensors_are_claimed_by_their_first_nine_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let format = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            crate::format_of_file(&path)
        };
        let diffusion = Some(arcane_workspace::formats::DIFFUSION);
        assert_eq!(format(&safetensors(SDXS)), diffusion);
        // A damaged file is claimed; reading it says what is wrong.
        let mut hostile = safetensors(SDXS);
        hostile[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(format(&hostile), diffusion);
        // A header length of 0x3f08 starts with the bytes ONNX is told by (0x08, then a
        // byte under 0x80): still safetensors.
        let mut onnx_like = raw(&format!("{{{}}}", " ".repeat(0x3f06)), 0);
        assert_eq!(&onnx_like[..2], &[0x08, 0x3f]);
        assert_eq!(format(&onnx_like), diffusion);
        onnx_like[8] = b'[';
        assert_ne!(format(&onnx_like), diffusion);
        assert_eq!(format(&safetensors(SDXS)[..8]), None);
        assert_eq!(format(&raw("{}", 0)[..9]), diffusion);
        let mut empty = raw("{}", 0);
        empty[..8].copy_from_slice(&1u64.to_le_bytes());
        assert_eq!(format(&empty), None);
    }

    /// A GGUF v3 file of `tensors` (name, dims in ggml's order, ggml type F32 or F16),
    /// with no metadata, as stable-diffusion.cpp's `convert` writes them.
    fn gguf(tensors: &[(&str, &[u64], u32)]) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        let mut offset = 0u64;
        for (name, dims, kind) in tensors {
            out.extend_from_slice(&(name.len() as u64).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            dims.iter()
                .for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
            out.extend_from_slice(&kind.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            let bytes = dims.iter().product::<u64>() * if *kind == 0 { 4 } else { 2 };
            offset += bytes.div_ceil(32) * 32;
        }
        let start = out.len().div_ceil(32) * 32;
        out.resize(start + offset as usize, 0);
        out
    }

    const SD1_GGUF: &[(&str, &[u64], u32)] = &[
        (
            "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight",
            &[768, 8],
            1,
        ),
        (
            "model.diffusion_model.input_blocks.0.0.weight",
            &[3, 3, 4, 4],
            1,
        ),
        ("model.diffusion_model.middle_block.1.norm.bias", &[4], 0),
        ("first_stage_model.decoder.conv_in.bias", &[4], 0),
    ];

    #[test]
    fn a_gguf_of_diffusion_tensors_is_claimed_and_read_by_its_tensors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sd.gguf");
        std::fs::write(&path, gguf(SD1_GGUF)).unwrap();
        assert_eq!(
            crate::format_of_file(&path),
            Some(arcane_workspace::formats::DIFFUSION)
        );
        let (reader, header) = crate::read_header(&path).unwrap();
        assert_eq!(reader.kind(), "diffusion");
        let info: DiffusionInfo = field(&header, "diffusion").unwrap();
        assert_eq!(info.container, "gguf");
        assert_eq!(info.architecture, "SD 1.x");
        assert_eq!(info.tensor_count, 4);
        assert_eq!(info.parameter_count, 768 * 8 + 144 + 4 + 4);
        assert_eq!(info.dtype, "F16");
        assert!(info.vae && !info.taesd);
        // Damaged (its last tensor's 16 bytes cut short), it is left to the GGUF
        // reader, which names what is wrong.
        let bytes = gguf(SD1_GGUF);
        std::fs::write(&path, &bytes[..bytes.len() - 17]).unwrap();
        assert_eq!(
            crate::format_of_file(&path),
            Some(arcane_workspace::formats::GGUF)
        );
        assert!(matches!(
            crate::read_header(&path),
            Err(Error::ModelInvalid { .. })
        ));
    }

    #[test]
    fn a_llama_gguf_is_never_claimed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("llm.gguf");
        let gguf_format = Some(arcane_workspace::formats::GGUF);
        crate::write_test_gguf(&path, &[("general.architecture", "llama")], &[], 16).unwrap();
        assert_eq!(crate::format_of_file(&path), gguf_format);
        // Diffusion names beside llama.cpp's blocks: still llama.cpp's.
        let mut mixed = SD1_GGUF.to_vec();
        mixed.push(("blk.0.attn_q.weight", &[4], 0));
        std::fs::write(&path, gguf(&mixed)).unwrap();
        assert_eq!(crate::format_of_file(&path), gguf_format);
        // 123 tensors make the ninth byte `{`; the GGUF magic decides first.
        let names: Vec<String> = (0..123).map(|i| format!("blk.{i}.w")).collect();
        let many: Vec<(&str, &[u64], u32)> =
            names.iter().map(|n| (n.as_str(), &[4][..], 0)).collect();
        let bytes = gguf(&many);
        assert_eq!(bytes[8], b'{');
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(crate::format_of_file(&path), gguf_format);
    }

    #[test]
    fn a_gguf_without_a_unet_is_refused_as_no_diffusion_model() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vae.gguf");
        std::fs::write(
            &path,
            gguf(&[("first_stage_model.decoder.conv_in.bias", &[4], 0)]),
        )
        .unwrap();
        let error = crate::read_header(&path).err().expect("refused");
        assert_eq!(error.details()["check"], "DIFFUSION_NOT_A_DIFFUSION_MODEL");
        assert_eq!(error.details()["tensorCount"], 1);
    }

    #[test]
    fn ggml_types_are_named_and_unknown_ones_share_a_name() {
        assert_eq!(ggml_type_name(0), "F32");
        assert_eq!(ggml_type_name(8), "Q8_0");
        assert_eq!(ggml_type_name(30), "BF16");
        assert_eq!(ggml_type_name(39), "MXFP4");
        for unknown in [4, 31, 40, u32::MAX] {
            assert_eq!(ggml_type_name(unknown), "unknown");
        }
    }
}
