//! A bounded reader for whisper.cpp's ggml model files (`ggml-tiny.en.bin`, …): the
//! magic `0x67676d6c`, eleven `i32` hyperparameters, the mel filter block, the
//! vocabulary, then one record per tensor up to the end of the file.
//!
//! The format has no version and no table of contents, and whisper.cpp trusts what it
//! reads: it allocates `n_mel × n_fft` floats and one buffer per vocabulary token before
//! checking anything, and asserts (aborting the process) when the text and audio
//! widths differ. A model file is untrusted input, so every number is bounded *before*
//! it sizes a read or a walk:
//!
//! * each hyperparameter lies in a range a bit wider than any published Whisper model
//!   (e.g. at most 256 layers, a 65,536-sample context, a 262,144-token vocabulary), so
//!   a hostile `n_vocab = 2^31` is refused naming `n_vocab` and its value;
//! * the widths whisper.cpp assumes equal are equal, and each head count divides its
//!   width;
//! * the mel filter block (`n_mel × n_fft` f32) must match `n_mels`, be at most
//!   [`MAX_MEL_FFT`] wide, and end inside the file; the vocabulary may list at most
//!   `n_vocab` tokens of at most [`MAX_TOKEN_BYTES`] bytes, each inside the file;
//! * every tensor record has 1 to 4 dimensions, a name of at most [`MAX_NAME_BYTES`]
//!   bytes, a known ggml type and data that ends inside the file; at most
//!   [`MAX_TENSORS`] records are walked, and the file must end exactly after the last
//!   one (a truncated download is refused, not half-loaded). A header with no tensors
//!   at all (whisper.cpp's test files) is not a usable model.
//!
//! whisper.cpp's voice-activity model (Silero VAD in ggml, `ggml-silero-v6.2.0.bin`)
//! shares the magic and the tensor records but not the header: after the magic come a
//! model type (`silero-16k`), a version, the window and context sizes and the encoder's
//! layer sizes. whisper.cpp allocates one array per encoder layer from the count it
//! reads, so that count and every size are bounded too ([`read_vad`]). It has its own
//! reader ([`Vad`]), ahead of the Whisper one in the table, so that it is recorded as
//! what it is rather than refused as a broken Whisper model.
//!
//! Nothing is allocated from a count read in the file: tokens and tensor data are
//! skipped, never kept. Failures are [`WhisperError`]s with a stable
//! [`code`](WhisperError::code) naming the offending field and value.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::Error;

/// The first four bytes of a whisper.cpp ggml file, as a little-endian `u32`.
pub const WHISPER_MAGIC: u32 = 0x6767_6d6c;

/// The widest mel filter accepted (`n_fft`; whisper's is 201 = 1 + 400/2).
pub const MAX_MEL_FFT: i32 = 4096;

/// The longest vocabulary token accepted, in bytes (the longest real one is 128).
pub const MAX_TOKEN_BYTES: u32 = 1024;

/// The longest tensor name accepted, in bytes (real ones are under 48).
pub const MAX_NAME_BYTES: i32 = 1024;

/// The most tensor records walked (large-v3 has about 1,300).
pub const MAX_TENSORS: u64 = 1 << 14;

/// The hyperparameters in file order, with the inclusive range each must lie in.
const HYPERPARAMETERS: [(&str, i32, i32); 11] = [
    ("n_vocab", 1, 262_144),
    ("n_audio_ctx", 1, 65_536),
    ("n_audio_state", 1, 16_384),
    ("n_audio_head", 1, 256),
    ("n_audio_layer", 1, 256),
    ("n_text_ctx", 1, 65_536),
    ("n_text_state", 1, 16_384),
    ("n_text_head", 1, 256),
    ("n_text_layer", 1, 256),
    ("n_mels", 1, 512),
    // `ftype % 1000` is the ggml file type; `ftype / 1000` the quantization version.
    ("ftype", 0, 9_999),
];

/// What a whisper.cpp model's header says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WhisperInfo {
    /// The model size whisper.cpp names from its encoder layers (`tiny`, `base`,
    /// `small`, `medium`, `large`), or `unknown`.
    pub model_type: String,
    /// Whether the vocabulary is the multilingual one (`n_vocab >= 51865`); English-only
    /// models (`*.en`) have 51,864 tokens.
    pub multilingual: bool,
    /// `n_vocab`: the model's vocabulary size.
    pub n_vocab: u32,
    /// `n_audio_ctx`: encoder positions (1500 = 30 s of audio).
    pub n_audio_ctx: u32,
    /// `n_audio_state`: the encoder's width.
    pub n_audio_state: u32,
    /// `n_audio_head`: encoder attention heads.
    pub n_audio_head: u32,
    /// `n_audio_layer`: encoder layers.
    pub n_audio_layer: u32,
    /// `n_text_ctx`: decoder positions.
    pub n_text_ctx: u32,
    /// `n_text_state`: the decoder's width.
    pub n_text_state: u32,
    /// `n_text_head`: decoder attention heads.
    pub n_text_head: u32,
    /// `n_text_layer`: decoder layers.
    pub n_text_layer: u32,
    /// `n_mels`: mel bands of the input spectrogram (80, or 128 for large-v3).
    pub n_mels: u32,
    /// `ftype` as stored (quantization version × 1000 + ggml file type).
    pub ftype: u32,
    /// The weights' type (`F32`, `F16`, `Q5_0`, …), from `ftype % 1000`.
    pub quantization: String,
    /// The tokens the vocabulary block lists (fewer than `n_vocab`: the special tokens
    /// are implied).
    pub vocab_tokens: u32,
    /// The tensor records in the file.
    pub tensor_count: u64,
    /// The sum of the tensors' element counts.
    pub parameter_count: u64,
}

/// Why a file is not a usable whisper.cpp model. Each variant has a stable
/// [`code`](WhisperError::code) and names the offending value in its message and
/// [`details`](WhisperError::details).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WhisperError {
    /// The file does not start with [`WHISPER_MAGIC`].
    #[error("it does not start with whisper.cpp's magic 0x67676d6c (found {found})")]
    BadMagic {
        /// The first bytes, in hex.
        found: String,
    },
    /// The file ends inside a part of the model.
    #[error(
        "it ends inside {part} at byte {offset}: {needed} more bytes needed, the file has {size}"
    )]
    Truncated {
        /// What was being read (`the hyperparameters`, `the mel filters`, `token 17`, …).
        part: String,
        /// Where that part's missing bytes start.
        offset: u64,
        /// How many bytes it still needed.
        needed: u64,
        /// The file's size.
        size: u64,
    },
    /// A hyperparameter lies outside its range.
    #[error("hyperparameter `{name}` is {value}, outside {min}..={max}")]
    HyperparameterOutOfRange {
        /// Its name (`n_vocab`, `n_audio_layer`, …).
        name: &'static str,
        /// The value found.
        value: i64,
        /// The least accepted.
        min: i64,
        /// The most accepted.
        max: i64,
    },
    /// Two values that must agree do not.
    #[error("`{name}` is {value} but must be {expected} ({why})")]
    Mismatch {
        /// The value's name.
        name: &'static str,
        /// The value found.
        value: i64,
        /// What it must be.
        expected: i64,
        /// Which rule it breaks.
        why: &'static str,
    },
    /// A length or count read from the file (mel filter width, vocabulary size, token
    /// or name length, tensor count or dimension) is out of bounds.
    #[error("{name} is {value}, outside {min}..={max}")]
    LengthOutOfRange {
        /// What it counts (`n_fft`, `vocabulary size`, `token 17 length`, …).
        name: String,
        /// The value found.
        value: i64,
        /// The least accepted.
        min: i64,
        /// The most accepted.
        max: i64,
    },
    /// A tensor record is impossible (an unknown type, a size that does not fit).
    #[error("tensor `{name}`: {reason}")]
    BadTensor {
        /// The tensor's name (or `#N` when the name itself is unreadable).
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The file holds a header and vocabulary but no weights.
    #[error("it holds no tensors after its vocabulary (a header-only test file, not a model)")]
    NoTensors,
}

impl WhisperError {
    /// The stable code of this refusal: `WHISPER_BAD_MAGIC`, `WHISPER_TRUNCATED`,
    /// `WHISPER_HPARAM_OUT_OF_RANGE`, `WHISPER_HPARAM_MISMATCH`,
    /// `WHISPER_LENGTH_OUT_OF_RANGE`, `WHISPER_BAD_TENSOR` or `WHISPER_NO_TENSORS`.
    pub fn code(&self) -> &'static str {
        match self {
            WhisperError::BadMagic { .. } => "WHISPER_BAD_MAGIC",
            WhisperError::Truncated { .. } => "WHISPER_TRUNCATED",
            WhisperError::HyperparameterOutOfRange { .. } => "WHISPER_HPARAM_OUT_OF_RANGE",
            WhisperError::Mismatch { .. } => "WHISPER_HPARAM_MISMATCH",
            WhisperError::LengthOutOfRange { .. } => "WHISPER_LENGTH_OUT_OF_RANGE",
            WhisperError::BadTensor { .. } => "WHISPER_BAD_TENSOR",
            WhisperError::NoTensors => "WHISPER_NO_TENSORS",
        }
    }

    /// The refusal's fields as JSON, with `check` set to [`code`](WhisperError::code).
    pub fn details(&self) -> Value {
        let mut value = match self {
            WhisperError::BadMagic { found } => json!({"found": found}),
            WhisperError::Truncated {
                part,
                offset,
                needed,
                size,
            } => json!({"part": part, "offset": offset, "needed": needed, "size": size}),
            WhisperError::HyperparameterOutOfRange {
                name,
                value,
                min,
                max,
            } => json!({"field": name, "value": value, "min": min, "max": max}),
            WhisperError::Mismatch {
                name,
                value,
                expected,
                why,
            } => json!({"field": name, "value": value, "expected": expected, "rule": why}),
            WhisperError::LengthOutOfRange {
                name,
                value,
                min,
                max,
            } => json!({"field": name, "value": value, "min": min, "max": max}),
            WhisperError::BadTensor { name, reason } => json!({"tensor": name, "reason": reason}),
            WhisperError::NoTensors => json!({}),
        };
        value["check"] = json!(self.code());
        value
    }
}

/// Whether the file at `path` starts with [`WHISPER_MAGIC`] (false when it cannot be
/// read or is shorter than four bytes).
pub fn looks_like_whisper(path: &Path) -> bool {
    let Ok(file) = arcane_files::open_regular(path) else {
        return false;
    };
    let mut magic = [0u8; 4];
    file.take(4).read_exact(&mut magic).is_ok() && u32::from_le_bytes(magic) == WHISPER_MAGIC
}

/// Reads and checks the whisper.cpp ggml model at `path`.
///
/// Fails with [`Error::FormatInvalid`] (naming the file, with the [`WhisperError`]'s
/// message and details) when it is not a usable model, [`Error::ModelInvalid`] when it is
/// not a regular file, and [`Error::Io`] when it cannot be read.
pub fn read_whisper(path: &Path) -> Result<WhisperInfo, Error> {
    read_file(path, &Ggml, |reader| reader.model())
}

/// Opens the file at `path` (a regular file, or [`Error::ModelInvalid`]) and reads it
/// with `read`; a refusal is [`Error::FormatInvalid`] in `format`'s words.
fn read_file<T>(
    path: &Path,
    format: &dyn crate::header::FormatReader,
    read: impl FnOnce(&mut Reader<File>) -> Step<T>,
) -> Result<T, Error> {
    let file = arcane_files::open_regular(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidInput {
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
    let mut reader = Reader {
        inner: BufReader::with_capacity(1 << 16, file),
        position: 0,
        size,
    };
    read(&mut reader)
        .map_err(|e| Error::io("read", path, e))?
        .map_err(|error| Error::FormatInvalid {
            path: path.to_path_buf(),
            label: format.format().label,
            format: format.key(),
            reason: error.to_string(),
            details: error.details(),
        })
}

/// The whisper.cpp reader of the registry's table ([`crate::READERS`]): records
/// `whisper`.
pub(crate) struct Ggml;

impl crate::header::FormatReader for Ggml {
    fn format(&self) -> arcane_workspace::ModelFormat {
        arcane_workspace::formats::WHISPER_GGML
    }

    fn kind(&self) -> &'static str {
        "whisper"
    }

    fn key(&self) -> &'static str {
        "whisper"
    }

    fn claims(&self, path: &Path) -> bool {
        looks_like_whisper(path)
    }

    fn read(&self, path: &Path) -> Result<crate::header::Header, Error> {
        Ok(crate::header::recorded(self.key(), &read_whisper(path)?))
    }

    fn summary(&self, header: &crate::header::Header) -> crate::header::Summary {
        let Some(info) = crate::header::field::<WhisperInfo>(header, self.key()) else {
            return crate::header::Summary::default();
        };
        let description = format!(
            "whisper {} ({}), {} parameters, {}, {}+{} layers, {} mels, whisper.cpp ggml",
            info.model_type,
            if info.multilingual {
                "multilingual"
            } else {
                "English only"
            },
            crate::header::human_count(info.parameter_count),
            info.quantization,
            info.n_audio_layer,
            info.n_text_layer,
            info.n_mels
        );
        crate::header::Summary {
            family: self.kind().into(),
            parameters: Some(info.parameter_count),
            quantization: Some(info.quantization),
            context: None,
            description,
        }
    }
}

/// The longest model type a voice-activity model may name (`silero-16k`).
pub const MAX_VAD_TYPE_BYTES: i32 = 64;

/// The most encoder layers a voice-activity model may declare (Silero has 4).
pub const MAX_VAD_LAYERS: i32 = 16;

/// What a whisper.cpp voice-activity model's header says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VadInfo {
    /// The model type (`silero-16k`).
    pub model_type: String,
    /// Its version (`6.2.0`).
    pub version: String,
    /// Samples per window (512 at 16 kHz).
    pub n_window: u32,
    /// Context samples kept between windows.
    pub n_context: u32,
    /// Encoder layers.
    pub encoder_layers: u32,
    /// The LSTM's hidden size.
    pub lstm_hidden_size: u32,
    /// The tensor records in the file.
    pub tensor_count: u64,
    /// The sum of the tensors' element counts.
    pub parameter_count: u64,
}

/// Whether the file at `path` is a whisper.cpp voice-activity model: the ggml magic,
/// then a short model type in plain ASCII (a Whisper model has its vocabulary size
/// there, tens of thousands).
pub fn looks_like_vad(path: &Path) -> bool {
    let Ok(file) = arcane_files::open_regular(path) else {
        return false;
    };
    let mut head = Vec::new();
    if file
        .take(8 + MAX_VAD_TYPE_BYTES as u64)
        .read_to_end(&mut head)
        .is_err()
        || head.len() < 8
    {
        return false;
    }
    let magic = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let length = i32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    magic == WHISPER_MAGIC
        && (1..=MAX_VAD_TYPE_BYTES).contains(&length)
        && head.get(8..8 + length as usize).is_some_and(|name| {
            name.iter()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(b))
        })
}

/// Reads and checks the whisper.cpp voice-activity model at `path`, as [`read_whisper`]
/// reads a Whisper model.
pub fn read_vad(path: &Path) -> Result<VadInfo, Error> {
    read_file(path, &Vad, |reader| reader.vad())
}

/// The reader of whisper.cpp's voice-activity models in the registry's table
/// ([`crate::READERS`]): records `vad`. Ahead of [`Ggml`], which claims any ggml file.
pub(crate) struct Vad;

impl crate::header::FormatReader for Vad {
    fn format(&self) -> arcane_workspace::ModelFormat {
        arcane_workspace::formats::WHISPER_VAD
    }

    fn kind(&self) -> &'static str {
        "vad"
    }

    fn key(&self) -> &'static str {
        "vad"
    }

    fn claims(&self, path: &Path) -> bool {
        looks_like_vad(path)
    }

    fn read(&self, path: &Path) -> Result<crate::header::Header, Error> {
        Ok(crate::header::recorded(self.key(), &read_vad(path)?))
    }

    fn summary(&self, header: &crate::header::Header) -> crate::header::Summary {
        let Some(info) = crate::header::field::<VadInfo>(header, self.key()) else {
            return crate::header::Summary::default();
        };
        crate::header::Summary {
            family: self.kind().into(),
            parameters: Some(info.parameter_count),
            quantization: None,
            context: None,
            description: format!(
                "voice activity, {} v{}, {} parameters, {}-sample windows, whisper.cpp ggml (name it as a whisper model's `vad`)",
                info.model_type,
                info.version,
                crate::header::human_count(info.parameter_count),
                info.n_window
            ),
        }
    }
}

/// Reads and checks a whisper.cpp ggml model from `file` of `size` bytes (see the
/// module documentation for the bounds). I/O errors are returned as the outer `Err`;
/// a file that is not a usable model as the inner one.
#[cfg(test)]
fn read_whisper_from(file: File, size: u64) -> std::io::Result<Result<WhisperInfo, WhisperError>> {
    let mut reader = Reader {
        inner: BufReader::with_capacity(1 << 16, file),
        position: 0,
        size,
    };
    reader.model()
}

/// A position-tracking reader that never reads or skips past `size`.
struct Reader<R> {
    inner: BufReader<R>,
    position: u64,
    size: u64,
}

/// The outer `Result` carries I/O errors, the inner one refusals.
type Step<T> = std::io::Result<Result<T, WhisperError>>;

macro_rules! step {
    ($e:expr) => {
        match $e? {
            Ok(value) => value,
            Err(refusal) => return Ok(Err(refusal)),
        }
    };
}

fn refuse<T>(error: WhisperError) -> Step<T> {
    Ok(Err(error))
}

impl<R: Read + std::io::Seek> Reader<R> {
    fn truncated(&self, part: &str, needed: u64) -> WhisperError {
        WhisperError::Truncated {
            part: part.to_string(),
            offset: self.position,
            needed: needed - self.size.saturating_sub(self.position).min(needed),
            size: self.size,
        }
    }

    fn i32(&mut self, part: &str) -> Step<i32> {
        if self.size.saturating_sub(self.position) < 4 {
            return refuse(self.truncated(part, 4));
        }
        let mut bytes = [0u8; 4];
        self.inner.read_exact(&mut bytes)?;
        self.position += 4;
        Ok(Ok(i32::from_le_bytes(bytes)))
    }

    /// Skips `n` bytes of `part`, refusing when they pass the end of the file.
    fn skip(&mut self, part: &str, n: u64) -> Step<()> {
        if n > self.size.saturating_sub(self.position) {
            return refuse(self.truncated(part, n));
        }
        // `n` is at most the file's size, which fits in an `i64` on every platform.
        let offset = i64::try_from(n).map_err(std::io::Error::other)?;
        self.inner.seek_relative(offset)?;
        self.position += n;
        Ok(Ok(()))
    }

    /// One `i32` of `part` in `min..=max`, else a refusal naming it.
    fn bounded(&mut self, name: &'static str, min: i32, max: i32) -> Step<i32> {
        let value = step!(self.i32(name));
        if !(min..=max).contains(&value) {
            return refuse(WhisperError::HyperparameterOutOfRange {
                name,
                value: value.into(),
                min: min.into(),
                max: max.into(),
            });
        }
        Ok(Ok(value))
    }

    /// The tensor records from here to the end of the file: (count, elements).
    fn tensors(&mut self, min_dims: i32) -> Step<(u64, u64)> {
        let mut tensor_count = 0u64;
        let mut parameter_count = 0u64;
        while self.position < self.size {
            if tensor_count == MAX_TENSORS {
                return refuse(WhisperError::LengthOutOfRange {
                    name: "tensor count".into(),
                    value: (tensor_count + 1).try_into().unwrap_or(i64::MAX),
                    min: 1,
                    max: MAX_TENSORS.try_into().unwrap_or(i64::MAX),
                });
            }
            let elements = step!(self.tensor(tensor_count, min_dims));
            tensor_count += 1;
            parameter_count = parameter_count.saturating_add(elements);
        }
        if tensor_count == 0 {
            return refuse(WhisperError::NoTensors);
        }
        Ok(Ok((tensor_count, parameter_count)))
    }

    /// A voice-activity model (see the module docs).
    fn vad(&mut self) -> Step<VadInfo> {
        let magic = step!(self.i32("the magic"));
        if magic as u32 != WHISPER_MAGIC {
            return refuse(WhisperError::BadMagic {
                found: hex(&magic.to_le_bytes()),
            });
        }
        let length = step!(self.bounded("model type length", 1, MAX_VAD_TYPE_BYTES));
        let length = length.unsigned_abs() as usize;
        if self.size.saturating_sub(self.position) < length as u64 {
            return refuse(self.truncated("the model type", length as u64));
        }
        let mut raw = vec![0u8; length];
        self.inner.read_exact(&mut raw)?;
        self.position += length as u64;
        let model_type = String::from_utf8_lossy(&raw).into_owned();
        let mut version = Vec::new();
        for name in ["version major", "version minor", "version patch"] {
            version.push(step!(self.bounded(name, 0, 9_999)).to_string());
        }
        let n_window = step!(self.bounded("n_window", 1, 65_536));
        let n_context = step!(self.bounded("n_context", 0, 65_536));
        let layers = step!(self.bounded("n_encoder_layers", 1, MAX_VAD_LAYERS));
        for _ in 0..layers {
            for name in ["encoder_in_channels", "encoder_out_channels", "kernel_size"] {
                step!(self.bounded(name, 1, 4_096));
            }
        }
        step!(self.bounded("lstm_input_size", 1, 4_096));
        let lstm_hidden_size = step!(self.bounded("lstm_hidden_size", 1, 4_096));
        step!(self.bounded("final_conv_in", 1, 4_096));
        step!(self.bounded("final_conv_out", 1, 4_096));
        let (tensor_count, parameter_count) = step!(self.tensors(0));
        Ok(Ok(VadInfo {
            model_type,
            version: version.join("."),
            n_window: n_window.unsigned_abs(),
            n_context: n_context.unsigned_abs(),
            encoder_layers: layers.unsigned_abs(),
            lstm_hidden_size: lstm_hidden_size.unsigned_abs(),
            tensor_count,
            parameter_count,
        }))
    }

    fn model(&mut self) -> Step<WhisperInfo> {
        if self.size < 4 {
            let mut head = Vec::new();
            (&mut self.inner).take(4).read_to_end(&mut head)?;
            return refuse(WhisperError::BadMagic { found: hex(&head) });
        }
        let magic = step!(self.i32("the magic"));
        if magic as u32 != WHISPER_MAGIC {
            return refuse(WhisperError::BadMagic {
                found: hex(&magic.to_le_bytes()),
            });
        }
        let mut values = [0u32; 11];
        for (slot, (name, min, max)) in values.iter_mut().zip(HYPERPARAMETERS) {
            let value = step!(self.i32("the hyperparameters"));
            if !(min..=max).contains(&value) {
                return refuse(WhisperError::HyperparameterOutOfRange {
                    name,
                    value: value.into(),
                    min: min.into(),
                    max: max.into(),
                });
            }
            // In range, hence not negative.
            *slot = value.unsigned_abs();
        }
        let [n_vocab, n_audio_ctx, n_audio_state, n_audio_head, n_audio_layer, n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype] =
            values;
        if n_text_state != n_audio_state {
            return refuse(WhisperError::Mismatch {
                name: "n_text_state",
                value: n_text_state.into(),
                expected: n_audio_state.into(),
                why: "whisper.cpp requires n_text_state == n_audio_state",
            });
        }
        for (name, state, heads) in [
            ("n_audio_head", n_audio_state, n_audio_head),
            ("n_text_head", n_text_state, n_text_head),
        ] {
            if state % heads != 0 {
                return refuse(WhisperError::Mismatch {
                    name,
                    value: heads.into(),
                    expected: gcd(state, heads).into(),
                    why: "the head count must divide the width",
                });
            }
        }
        let Some(quantization) = file_type_name(ftype % 1000) else {
            return refuse(WhisperError::HyperparameterOutOfRange {
                name: "ftype",
                value: ftype.into(),
                min: 0,
                max: 27,
            });
        };

        // The mel filters: n_mel × n_fft f32.
        let n_mel = step!(self.i32("the mel filter header"));
        if i64::from(n_mel) != i64::from(n_mels) {
            return refuse(WhisperError::Mismatch {
                name: "mel filter n_mel",
                value: n_mel.into(),
                expected: n_mels.into(),
                why: "the mel filters must have n_mels rows",
            });
        }
        let n_fft = step!(self.i32("the mel filter header"));
        if !(1..=MAX_MEL_FFT).contains(&n_fft) {
            return refuse(WhisperError::LengthOutOfRange {
                name: "mel filter n_fft".into(),
                value: n_fft.into(),
                min: 1,
                max: MAX_MEL_FFT.into(),
            });
        }
        let filter_bytes = 4 * u64::from(n_mels) * u64::from(n_fft.unsigned_abs());
        step!(self.skip("the mel filters", filter_bytes));

        // The vocabulary: a count, then (u32 length, bytes) per token.
        let tokens = step!(self.i32("the vocabulary size"));
        if !(0..=n_vocab as i32).contains(&tokens) {
            return refuse(WhisperError::LengthOutOfRange {
                name: "vocabulary size".into(),
                value: tokens.into(),
                min: 0,
                max: n_vocab.into(),
            });
        }
        for index in 0..tokens {
            let part = || format!("token {index}");
            let length = step!(self.i32(&part())) as u32;
            if length > MAX_TOKEN_BYTES {
                return refuse(WhisperError::LengthOutOfRange {
                    name: format!("token {index} length"),
                    value: length.into(),
                    min: 0,
                    max: MAX_TOKEN_BYTES.into(),
                });
            }
            step!(self.skip(&part(), length.into()));
        }

        // The tensors, to the end of the file.
        let (tensor_count, parameter_count) = step!(self.tensors(1));
        let model_type = match n_audio_layer {
            4 => "tiny",
            6 => "base",
            12 => "small",
            24 => "medium",
            32 => "large",
            _ => "unknown",
        };
        Ok(Ok(WhisperInfo {
            model_type: model_type.into(),
            multilingual: n_vocab >= 51_865,
            n_vocab,
            n_audio_ctx,
            n_audio_state,
            n_audio_head,
            n_audio_layer,
            n_text_ctx,
            n_text_state,
            n_text_head,
            n_text_layer,
            n_mels,
            ftype,
            quantization: quantization.into(),
            vocab_tokens: tokens.unsigned_abs(),
            tensor_count,
            parameter_count,
        }))
    }

    /// Reads one tensor record (`n_dims, name length, type`, the dimensions, the name)
    /// and skips its data; returns its element count. `min_dims`: 1 for a Whisper
    /// model, 0 for a voice-activity model (which has scalars).
    fn tensor(&mut self, index: u64, min_dims: i32) -> Step<u64> {
        let part = format!("tensor #{index}");
        let n_dims = step!(self.i32(&part));
        let name_length = step!(self.i32(&part));
        let kind = step!(self.i32(&part));
        if !(min_dims..=4).contains(&n_dims) {
            return refuse(WhisperError::LengthOutOfRange {
                name: format!("tensor #{index} dimensions"),
                value: n_dims.into(),
                min: min_dims.into(),
                max: 4,
            });
        }
        if !(1..=MAX_NAME_BYTES).contains(&name_length) {
            return refuse(WhisperError::LengthOutOfRange {
                name: format!("tensor #{index} name length"),
                value: name_length.into(),
                min: 1,
                max: MAX_NAME_BYTES.into(),
            });
        }
        let mut shape = Vec::with_capacity(4);
        for _ in 0..n_dims {
            let dim = step!(self.i32(&part));
            if dim < 1 {
                return refuse(WhisperError::LengthOutOfRange {
                    name: format!("tensor #{index} dimension"),
                    value: dim.into(),
                    min: 1,
                    max: i32::MAX.into(),
                });
            }
            shape.push(u64::from(dim.unsigned_abs()));
        }
        if self.size.saturating_sub(self.position) < name_length.unsigned_abs().into() {
            return refuse(self.truncated(&part, name_length.unsigned_abs().into()));
        }
        let mut raw = vec![0u8; name_length.unsigned_abs() as usize];
        self.inner.read_exact(&mut raw)?;
        self.position += raw.len() as u64;
        let name = String::from_utf8_lossy(&raw).into_owned();
        let bad = |reason: String| {
            Ok(Err(WhisperError::BadTensor {
                name: name.clone(),
                reason,
            }))
        };
        // Four dimensions of at most 2^31 each: the product fits in a u128, and must
        // fit in a u64.
        let elements = shape.iter().map(|&d| u128::from(d)).product::<u128>();
        let Ok(elements) = u64::try_from(elements) else {
            return bad(format!("dimensions {shape:?} do not fit in 64 bits"));
        };
        let Some((block, block_bytes)) = type_block(kind) else {
            return bad(format!("unknown ggml type {kind}"));
        };
        if elements % block != 0 {
            return bad(format!(
                "{elements} elements are not whole blocks of {block} for ggml type {kind}"
            ));
        }
        let bytes = (elements / block).saturating_mul(block_bytes);
        if bytes > self.size.saturating_sub(self.position) {
            return Ok(Err(WhisperError::BadTensor {
                name: name.clone(),
                reason: format!(
                    "dimensions {shape:?} (ggml type {kind}) need {bytes} bytes of data at byte {}, past the end of the file ({} bytes)",
                    self.position, self.size
                ),
            }));
        }
        step!(self.skip(&part, bytes));
        Ok(Ok(elements))
    }
}

/// The elements per block and bytes per block of the ggml tensor types whisper.cpp
/// files use (plain floats and the quantizations its `quantize` tool writes).
fn type_block(kind: i32) -> Option<(u64, u64)> {
    Some(match kind {
        0 => (1, 4),     // F32
        1 => (1, 2),     // F16
        2 => (32, 18),   // Q4_0
        3 => (32, 20),   // Q4_1
        6 => (32, 22),   // Q5_0
        7 => (32, 24),   // Q5_1
        8 => (32, 34),   // Q8_0
        10 => (256, 84), // Q2_K
        11 => (256, 110),
        12 => (256, 144),
        13 => (256, 176),
        14 => (256, 210), // Q6_K
        30 => (1, 2),     // BF16
        _ => return None,
    })
}

/// The name of a ggml file type (`ggml_ftype`), the `ftype % 1000` of the header.
fn file_type_name(ftype: u32) -> Option<&'static str> {
    Some(match ftype {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        4 => "Q4_1_SOME_F16",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        24 => "BF16",
        _ => return None,
    })
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A whisper.cpp ggml file for tests: the given hyperparameters, an `n_mels × 3` mel
/// filter block, `tokens` one-byte tokens and one F32 tensor `t` of 4 elements.
#[doc(hidden)]
pub fn test_whisper_bytes(hparams: [i32; 11], tokens: i32) -> Vec<u8> {
    let mut out = WHISPER_MAGIC.to_le_bytes().to_vec();
    for value in hparams {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.extend_from_slice(&hparams[9].to_le_bytes());
    out.extend_from_slice(&3i32.to_le_bytes());
    for _ in 0..hparams[9].max(0) * 3 {
        out.extend_from_slice(&0.5f32.to_le_bytes());
    }
    out.extend_from_slice(&tokens.to_le_bytes());
    for i in 0..tokens.max(0) {
        out.extend_from_slice(&1u32.to_le_bytes());
        out.push(b'a' + (i % 26) as u8);
    }
    for value in [1i32, 1, 0, 4] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.push(b't');
    out.extend_from_slice(&[0u8; 16]);
    out
}

/// The hyperparameters of whisper tiny.en (`ftype` 1, F16).
#[doc(hidden)]
pub const TINY_EN: [i32; 11] = [51_864, 1500, 384, 6, 4, 448, 384, 6, 4, 80, 1];

#[cfg(test)]
mod tests {
    use super::*;

    fn read(bytes: &[u8]) -> Result<WhisperInfo, WhisperError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.bin");
        std::fs::write(&path, bytes).unwrap();
        let file = File::open(&path).unwrap();
        read_whisper_from(file, bytes.len() as u64).unwrap()
    }

    /// A voice-activity model's header with `layers` encoder layers, then one tensor
    /// (`tensor` false: none).
    fn vad_bytes(layers: i32, tensor: bool) -> Vec<u8> {
        let mut out = WHISPER_MAGIC.to_le_bytes().to_vec();
        out.extend_from_slice(&10i32.to_le_bytes());
        out.extend_from_slice(b"silero-16k");
        for value in [6i32, 2, 0, 512, 64, layers] {
            out.extend_from_slice(&value.to_le_bytes());
        }
        for _ in 0..layers.clamp(0, 20) {
            for value in [128i32, 64, 3] {
                out.extend_from_slice(&value.to_le_bytes());
            }
        }
        for value in [128i32, 128, 128, 1] {
            out.extend_from_slice(&value.to_le_bytes());
        }
        if tensor {
            for value in [1i32, 1, 0, 4] {
                out.extend_from_slice(&value.to_le_bytes());
            }
            out.push(b't');
            out.extend_from_slice(&[0u8; 16]);
        }
        out
    }

    fn written(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ggml-silero.bin");
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    #[test]
    fn a_voice_activity_model_is_told_from_a_whisper_model_and_read() {
        let (_dir, vad) = written(&vad_bytes(4, true));
        assert!(looks_like_vad(&vad));
        let info = read_vad(&vad).unwrap();
        assert_eq!(info.model_type, "silero-16k");
        assert_eq!(info.version, "6.2.0");
        assert_eq!(
            (info.n_window, info.n_context, info.encoder_layers),
            (512, 64, 4)
        );
        assert_eq!((info.tensor_count, info.parameter_count), (1, 4));
        let (_dir, whisper) = written(&test_whisper_bytes(TINY_EN, 3));
        assert!(!looks_like_vad(&whisper));
        // The registry's table asks the VAD reader first: each file gets its own.
        let format = |path: &Path| crate::header::format_of_file(path).map(|f| f.id);
        assert_eq!(format(&vad), Some("whisper-vad"));
        assert_eq!(format(&whisper), Some("whisper-ggml"));
    }

    #[test]
    fn a_hostile_voice_activity_header_is_refused_naming_the_value() {
        // whisper.cpp allocates one array per declared layer: 2^31 is refused first.
        let (_dir, path) = written(&vad_bytes(i32::MAX, true));
        let error = read_vad(&path).unwrap_err().to_string();
        assert!(
            error.contains("n_encoder_layers") && error.contains("2147483647"),
            "{error}"
        );
        let (_dir, path) = written(&vad_bytes(4, false));
        let error = read_vad(&path).unwrap_err().to_string();
        assert!(error.contains("no tensors"), "{error}");
        let mut cut = vad_bytes(4, true);
        cut.truncate(30);
        let (_dir, path) = written(&cut);
        assert!(read_vad(&path)
            .unwrap_err()
            .to_string()
            .contains("ends inside"));
    }

    #[test]
    fn reads_a_well_formed_model() {
        let info = read(&test_whisper_bytes(TINY_EN, 30)).unwrap();
        assert_eq!(info.model_type, "tiny");
        assert!(!info.multilingual);
        assert_eq!(info.n_vocab, 51_864);
        assert_eq!(info.n_mels, 80);
        assert_eq!(info.quantization, "F16");
        assert_eq!(info.vocab_tokens, 30);
        assert_eq!(info.tensor_count, 1);
        assert_eq!(info.parameter_count, 4);
    }

    #[test]
    fn refuses_another_magic_naming_the_bytes() {
        let mut bytes = test_whisper_bytes(TINY_EN, 3);
        bytes[..4].copy_from_slice(b"GGUF");
        let error = read(&bytes).unwrap_err();
        assert_eq!(error.code(), "WHISPER_BAD_MAGIC");
        assert_eq!(error.details()["found"], "47475546");
        assert_eq!(read(b"lm").unwrap_err().code(), "WHISPER_BAD_MAGIC");
    }

    #[test]
    fn refuses_every_truncation() {
        let bytes = test_whisper_bytes(TINY_EN, 5);
        // Every proper prefix past the magic is refused, none is read as a model.
        for cut in 4..bytes.len() {
            let error = read(&bytes[..cut]).unwrap_err();
            assert!(
                matches!(
                    error.code(),
                    "WHISPER_TRUNCATED" | "WHISPER_BAD_TENSOR" | "WHISPER_NO_TENSORS"
                ),
                "cut at {cut}: {error}"
            );
        }
        let error = read(&bytes[..100]).unwrap_err();
        assert_eq!(error.code(), "WHISPER_TRUNCATED", "{error}");
        assert_eq!(error.details()["part"], "the mel filters");
    }

    #[test]
    fn refuses_hostile_hyperparameters_naming_them() {
        for (index, value) in [
            (0, i32::MAX),
            (0, -1),
            (4, 100_000),
            (9, 0),
            (10, 5),
            (10, -7),
        ] {
            let mut hparams = TINY_EN;
            hparams[index] = value;
            let error = read(&test_whisper_bytes(hparams, 3)).unwrap_err();
            assert_eq!(error.code(), "WHISPER_HPARAM_OUT_OF_RANGE", "{error}");
            assert_eq!(error.details()["field"], HYPERPARAMETERS[index].0);
            assert_eq!(error.details()["value"], i64::from(value));
            assert!(error.to_string().contains(&value.to_string()), "{error}");
        }
    }

    #[test]
    fn refuses_inconsistent_widths() {
        let mut hparams = TINY_EN;
        hparams[6] = 512;
        let error = read(&test_whisper_bytes(hparams, 3)).unwrap_err();
        assert_eq!(error.code(), "WHISPER_HPARAM_MISMATCH");
        assert_eq!(error.details()["field"], "n_text_state");
        let mut hparams = TINY_EN;
        hparams[3] = 7;
        let error = read(&test_whisper_bytes(hparams, 3)).unwrap_err();
        assert_eq!(error.details()["field"], "n_audio_head");
    }

    #[test]
    fn refuses_hostile_block_lengths() {
        // The mel filter width, the vocabulary size and a token's length.
        let good = test_whisper_bytes(TINY_EN, 3);
        let patch = |offset: usize, value: i32| {
            let mut bytes = good.clone();
            bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
            read(&bytes).unwrap_err()
        };
        let error = patch(52, i32::MAX);
        assert_eq!(error.code(), "WHISPER_LENGTH_OUT_OF_RANGE");
        assert_eq!(error.details()["field"], "mel filter n_fft");
        // A plausible width whose block passes the end of the file.
        let error = patch(52, 4000);
        assert_eq!(error.code(), "WHISPER_TRUNCATED");
        let error = patch(48, 81);
        assert_eq!(error.code(), "WHISPER_HPARAM_MISMATCH");
        let vocab = 56 + 80 * 3 * 4;
        let error = patch(vocab, 2_000_000_000);
        assert_eq!(error.code(), "WHISPER_LENGTH_OUT_OF_RANGE");
        assert_eq!(error.details()["value"], 2_000_000_000);
        // A plausible count, more tokens than the file holds.
        let mut bytes = good.clone();
        bytes[vocab..vocab + 4].copy_from_slice(&40_000i32.to_le_bytes());
        bytes.truncate(vocab + 4 + 3 * 5);
        let error = read(&bytes).unwrap_err();
        assert_eq!(error.code(), "WHISPER_TRUNCATED", "{error}");
        assert_eq!(error.details()["part"], "token 3");
        let error = patch(vocab + 4, -1);
        assert_eq!(error.details()["field"], "token 0 length");
        let error = patch(vocab + 4, 900);
        assert_eq!(error.code(), "WHISPER_TRUNCATED");
    }

    #[test]
    fn refuses_impossible_tensors_naming_them() {
        let good = test_whisper_bytes(TINY_EN, 0);
        let tensor = good.len() - 16 - 1 - 4 * 4;
        let patch = |offset: usize, value: i32| {
            let mut bytes = good.clone();
            bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
            read(&bytes).unwrap_err()
        };
        assert_eq!(patch(tensor, 9).details()["field"], "tensor #0 dimensions");
        assert_eq!(
            patch(tensor + 4, i32::MAX).details()["field"],
            "tensor #0 name length"
        );
        let error = patch(tensor + 8, 99);
        assert_eq!(error.code(), "WHISPER_BAD_TENSOR");
        assert_eq!(error.details()["tensor"], "t");
        let error = patch(tensor + 12, i32::MAX);
        assert_eq!(error.code(), "WHISPER_BAD_TENSOR");
        assert!(error.to_string().contains("past the end"), "{error}");
        // Trailing bytes that are not a whole record.
        let mut bytes = good.clone();
        bytes.extend_from_slice(&[1, 0, 0]);
        assert_eq!(read(&bytes).unwrap_err().code(), "WHISPER_TRUNCATED");
    }

    #[test]
    fn a_header_without_weights_is_not_a_model() {
        let mut bytes = test_whisper_bytes(TINY_EN, 3);
        bytes.truncate(bytes.len() - 16 - 1 - 16);
        assert_eq!(read(&bytes).unwrap_err(), WhisperError::NoTensors);
    }
}
