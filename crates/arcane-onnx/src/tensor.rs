//! Tensors as `arcane/1` carries them: `{type, shape, data}`, where `data` is a JSON
//! array (flat or nested, row-major) or a base64 string of the little-endian bytes.
//!
//! Floats that JSON cannot write (NaN, infinities) are the strings `"NaN"`,
//! `"Infinity"` and `"-Infinity"` in arrays; base64 carries every bit exactly. Booleans
//! are `true`/`false` (or `0`/`1`); in base64 one byte each. String tensors are always
//! arrays of strings.

use base64::Engine as _;
use half::f16;
use serde::{Deserialize, Serialize};
use serde_json::{Number, Value};

use crate::Error;

/// An element type Arcane can carry in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementType {
    /// `float16`.
    Float16,
    /// `float32`.
    Float32,
    /// `float64`.
    Float64,
    /// `int8`.
    Int8,
    /// `int16`.
    Int16,
    /// `int32`.
    Int32,
    /// `int64`.
    Int64,
    /// `uint8`.
    Uint8,
    /// `uint16`.
    Uint16,
    /// `uint32`.
    Uint32,
    /// `uint64`.
    Uint64,
    /// `bool`.
    Bool,
    /// `string`.
    String,
}

impl ElementType {
    /// Every type, in the order of the table in `docs/protocol.md`.
    pub const ALL: [ElementType; 13] = [
        Self::Float16,
        Self::Float32,
        Self::Float64,
        Self::Int8,
        Self::Int16,
        Self::Int32,
        Self::Int64,
        Self::Uint8,
        Self::Uint16,
        Self::Uint32,
        Self::Uint64,
        Self::Bool,
        Self::String,
    ];

    /// The wire name (`float32`, …), also NumPy's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Float16 => "float16",
            Self::Float32 => "float32",
            Self::Float64 => "float64",
            Self::Int8 => "int8",
            Self::Int16 => "int16",
            Self::Int32 => "int32",
            Self::Int64 => "int64",
            Self::Uint8 => "uint8",
            Self::Uint16 => "uint16",
            Self::Uint32 => "uint32",
            Self::Uint64 => "uint64",
            Self::Bool => "bool",
            Self::String => "string",
        }
    }

    /// Parses a wire name (`float` and `double` are accepted for float32 and float64).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "float" => Some(Self::Float32),
            "double" => Some(Self::Float64),
            other => Self::ALL.into_iter().find(|t| t.as_str() == other),
        }
    }

    /// The ONNX `TensorProto.DataType` number.
    pub fn onnx_code(self) -> i32 {
        match self {
            Self::Float32 => 1,
            Self::Uint8 => 2,
            Self::Int8 => 3,
            Self::Uint16 => 4,
            Self::Int16 => 5,
            Self::Int32 => 6,
            Self::Int64 => 7,
            Self::String => 8,
            Self::Bool => 9,
            Self::Float16 => 10,
            Self::Float64 => 11,
            Self::Uint32 => 12,
            Self::Uint64 => 13,
        }
    }

    /// The type for an ONNX `TensorProto.DataType` number.
    pub fn from_onnx_code(code: i64) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|t| i64::from(t.onnx_code()) == code)
    }

    /// Bytes per element in base64 and `.npy` data (`None` for strings).
    pub fn size(self) -> Option<usize> {
        match self {
            Self::Int8 | Self::Uint8 | Self::Bool => Some(1),
            Self::Float16 | Self::Int16 | Self::Uint16 => Some(2),
            Self::Float32 | Self::Int32 | Self::Uint32 => Some(4),
            Self::Float64 | Self::Int64 | Self::Uint64 => Some(8),
            Self::String => None,
        }
    }
}

impl std::fmt::Display for ElementType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tensor's elements, row-major.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum TensorData {
    Float16(Vec<f16>),
    Float32(Vec<f32>),
    Float64(Vec<f64>),
    Int8(Vec<i8>),
    Int16(Vec<i16>),
    Int32(Vec<i32>),
    Int64(Vec<i64>),
    Uint8(Vec<u8>),
    Uint16(Vec<u16>),
    Uint32(Vec<u32>),
    Uint64(Vec<u64>),
    Bool(Vec<bool>),
    String(Vec<String>),
}

/// Runs `$body` with `$v` bound to the inner vector, whatever its element type.
macro_rules! each_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            TensorData::Float16($v) => $body,
            TensorData::Float32($v) => $body,
            TensorData::Float64($v) => $body,
            TensorData::Int8($v) => $body,
            TensorData::Int16($v) => $body,
            TensorData::Int32($v) => $body,
            TensorData::Int64($v) => $body,
            TensorData::Uint8($v) => $body,
            TensorData::Uint16($v) => $body,
            TensorData::Uint32($v) => $body,
            TensorData::Uint64($v) => $body,
            TensorData::Bool($v) => $body,
            TensorData::String($v) => $body,
        }
    };
}
pub(crate) use each_data;

impl TensorData {
    /// The element type.
    pub fn element_type(&self) -> ElementType {
        match self {
            Self::Float16(_) => ElementType::Float16,
            Self::Float32(_) => ElementType::Float32,
            Self::Float64(_) => ElementType::Float64,
            Self::Int8(_) => ElementType::Int8,
            Self::Int16(_) => ElementType::Int16,
            Self::Int32(_) => ElementType::Int32,
            Self::Int64(_) => ElementType::Int64,
            Self::Uint8(_) => ElementType::Uint8,
            Self::Uint16(_) => ElementType::Uint16,
            Self::Uint32(_) => ElementType::Uint32,
            Self::Uint64(_) => ElementType::Uint64,
            Self::Bool(_) => ElementType::Bool,
            Self::String(_) => ElementType::String,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        each_data!(self, v => v.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The little-endian bytes (`None` for strings).
    pub fn to_le_bytes(&self) -> Option<Vec<u8>> {
        fn flat<T, const N: usize>(v: &[T], f: impl Fn(&T) -> [u8; N]) -> Vec<u8> {
            v.iter().flat_map(f).collect()
        }
        Some(match self {
            Self::Float16(v) => flat(v, |x| x.to_le_bytes()),
            Self::Float32(v) => flat(v, |x| x.to_le_bytes()),
            Self::Float64(v) => flat(v, |x| x.to_le_bytes()),
            Self::Int8(v) => flat(v, |x| x.to_le_bytes()),
            Self::Int16(v) => flat(v, |x| x.to_le_bytes()),
            Self::Int32(v) => flat(v, |x| x.to_le_bytes()),
            Self::Int64(v) => flat(v, |x| x.to_le_bytes()),
            Self::Uint8(v) => v.clone(),
            Self::Uint16(v) => flat(v, |x| x.to_le_bytes()),
            Self::Uint32(v) => flat(v, |x| x.to_le_bytes()),
            Self::Uint64(v) => flat(v, |x| x.to_le_bytes()),
            Self::Bool(v) => v.iter().map(|b| u8::from(*b)).collect(),
            Self::String(_) => return None,
        })
    }

    /// Elements of `element_type` from little-endian bytes; `None` when the length is
    /// not a multiple of the element size (or for strings).
    pub fn from_le_bytes(element_type: ElementType, bytes: &[u8]) -> Option<TensorData> {
        let size = element_type.size()?;
        if !bytes.len().is_multiple_of(size) {
            return None;
        }
        fn chunks<T, const N: usize>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
            bytes
                .chunks_exact(N)
                .map(|c| {
                    let mut a = [0u8; N];
                    a.copy_from_slice(c);
                    f(a)
                })
                .collect()
        }
        Some(match element_type {
            ElementType::Float16 => Self::Float16(chunks(bytes, f16::from_le_bytes)),
            ElementType::Float32 => Self::Float32(chunks(bytes, f32::from_le_bytes)),
            ElementType::Float64 => Self::Float64(chunks(bytes, f64::from_le_bytes)),
            ElementType::Int8 => Self::Int8(chunks(bytes, i8::from_le_bytes)),
            ElementType::Int16 => Self::Int16(chunks(bytes, i16::from_le_bytes)),
            ElementType::Int32 => Self::Int32(chunks(bytes, i32::from_le_bytes)),
            ElementType::Int64 => Self::Int64(chunks(bytes, i64::from_le_bytes)),
            ElementType::Uint8 => Self::Uint8(bytes.to_vec()),
            ElementType::Uint16 => Self::Uint16(chunks(bytes, u16::from_le_bytes)),
            ElementType::Uint32 => Self::Uint32(chunks(bytes, u32::from_le_bytes)),
            ElementType::Uint64 => Self::Uint64(chunks(bytes, u64::from_le_bytes)),
            ElementType::Bool => Self::Bool(bytes.iter().map(|b| *b != 0).collect()),
            ElementType::String => return None,
        })
    }
}

/// A tensor: shape and row-major elements.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// The dimensions (empty for a scalar).
    pub shape: Vec<i64>,
    /// The elements.
    pub data: TensorData,
}

/// How output tensors' `data` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// A flat JSON array (the default).
    #[default]
    Array,
    /// Base64 of the little-endian bytes (strings stay arrays).
    Base64,
}

/// The wire form of a tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonTensor {
    /// The element type's wire name.
    #[serde(rename = "type")]
    pub element_type: String,
    /// The dimensions.
    pub shape: Vec<i64>,
    /// A JSON array or a base64 string.
    pub data: Value,
}

impl JsonTensor {
    /// As a JSON value (`{type, shape, data}`), moving `data` rather than copying it.
    pub fn into_value(self) -> Value {
        let mut map = serde_json::Map::with_capacity(3);
        map.insert("type".into(), Value::String(self.element_type));
        map.insert("shape".into(), Value::from(self.shape));
        map.insert("data".into(), self.data);
        Value::Object(map)
    }
}

impl Tensor {
    /// The element type.
    pub fn element_type(&self) -> ElementType {
        self.data.element_type()
    }

    /// Parses the wire form; `name` is the input's name for error messages. Checks the
    /// type name, that every dimension is ≥ 0, and that the data has exactly as many
    /// elements as the shape.
    pub fn from_json(name: &str, json: &JsonTensor) -> Result<Tensor, Error> {
        Self::parse(name, &json.element_type, &json.shape, &json.data)
    }

    /// [`Tensor::from_json`] on a wire tensor still in a JSON value (`{type, shape,
    /// data}`), read in place: the data is not copied first.
    pub fn from_value(name: &str, value: &Value) -> Result<Tensor, Error> {
        let bad = |reason: &str| Error::BadData {
            name: name.to_string(),
            reason: format!("expected {{type, shape, data}}: {reason}"),
        };
        let element_type = value["type"]
            .as_str()
            .ok_or_else(|| bad("`type` must be a string"))?;
        let shape = value["shape"]
            .as_array()
            .and_then(|dims| dims.iter().map(Value::as_i64).collect::<Option<Vec<i64>>>())
            .ok_or_else(|| bad("`shape` must be an array of integers"))?;
        Self::parse(name, element_type, &shape, &value["data"])
    }

    fn parse(name: &str, type_name: &str, shape: &[i64], data: &Value) -> Result<Tensor, Error> {
        let bad = |reason: String| Error::BadData {
            name: name.to_string(),
            reason,
        };
        let element_type = ElementType::parse(type_name).ok_or_else(|| {
            bad(format!(
                "unknown element type `{type_name}` (use one of {})",
                ElementType::ALL.map(ElementType::as_str).join(", ")
            ))
        })?;
        let count = element_count(shape).ok_or_else(|| {
            bad(format!(
                "shape {shape:?} has a negative or too large dimension"
            ))
        })?;
        let data = match data {
            Value::String(text) if element_type != ElementType::String => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|e| bad(format!("`data` is not valid base64: {e}")))?;
                TensorData::from_le_bytes(element_type, &bytes).ok_or_else(|| {
                    bad(format!(
                        "{} bytes of base64 data is not a whole number of {element_type} elements",
                        bytes.len()
                    ))
                })?
            }
            Value::Array(_) => {
                let mut flat = Vec::new();
                flatten(data, &mut flat);
                from_values(element_type, &flat).map_err(bad)?
            }
            _ => return Err(bad("`data` must be a JSON array or a base64 string".into())),
        };
        if data.len() != count {
            return Err(bad(format!(
                "shape {shape:?} needs {count} elements but `data` has {}",
                data.len()
            )));
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            data,
        })
    }

    /// The wire form, with `data` written as `encoding` says.
    pub fn to_json(&self, encoding: Encoding) -> JsonTensor {
        let data = match (encoding, self.data.to_le_bytes()) {
            (Encoding::Base64, Some(bytes)) => {
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            }
            _ => to_values(&self.data),
        };
        JsonTensor {
            element_type: self.element_type().as_str().to_string(),
            shape: self.shape.clone(),
            data,
        }
    }
}

/// The number of elements of `shape`, or `None` for a negative dimension or overflow.
pub fn element_count(shape: &[i64]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        usize::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    })
}

fn flatten<'a>(value: &'a Value, out: &mut Vec<&'a Value>) {
    match value {
        Value::Array(items) => items.iter().for_each(|v| flatten(v, out)),
        other => out.push(other),
    }
}

fn float_of(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

fn ints<T: TryFrom<i64> + TryFrom<u64>>(
    values: &[&Value],
    type_name: &str,
) -> Result<Vec<T>, String> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let converted = match v {
                Value::Number(n) => n
                    .as_i64()
                    .and_then(|x| T::try_from(x).ok())
                    .or_else(|| n.as_u64().and_then(|x| T::try_from(x).ok())),
                _ => None,
            };
            converted.ok_or_else(|| format!("element {i} ({v}) is not a {type_name}"))
        })
        .collect()
}

fn floats<T>(values: &[&Value], type_name: &str, f: impl Fn(f64) -> T) -> Result<Vec<T>, String> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            float_of(v)
                .map(&f)
                .ok_or_else(|| format!("element {i} ({v}) is not a {type_name} number"))
        })
        .collect()
}

fn from_values(element_type: ElementType, values: &[&Value]) -> Result<TensorData, String> {
    let name = element_type.as_str();
    Ok(match element_type {
        ElementType::Float16 => TensorData::Float16(floats(values, name, f16::from_f64)?),
        ElementType::Float32 => TensorData::Float32(floats(values, name, |x| x as f32)?),
        ElementType::Float64 => TensorData::Float64(floats(values, name, |x| x)?),
        ElementType::Int8 => TensorData::Int8(ints(values, name)?),
        ElementType::Int16 => TensorData::Int16(ints(values, name)?),
        ElementType::Int32 => TensorData::Int32(ints(values, name)?),
        ElementType::Int64 => TensorData::Int64(ints(values, name)?),
        ElementType::Uint8 => TensorData::Uint8(ints(values, name)?),
        ElementType::Uint16 => TensorData::Uint16(ints(values, name)?),
        ElementType::Uint32 => TensorData::Uint32(ints(values, name)?),
        ElementType::Uint64 => TensorData::Uint64(ints(values, name)?),
        ElementType::Bool => TensorData::Bool(
            values
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::Bool(b) => Ok(*b),
                    Value::Number(n) if n.as_u64() == Some(0) => Ok(false),
                    Value::Number(n) if n.as_u64() == Some(1) => Ok(true),
                    other => Err(format!("element {i} ({other}) is not a bool")),
                })
                .collect::<Result<_, _>>()?,
        ),
        ElementType::String => TensorData::String(
            values
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(format!("element {i} ({other}) is not a string")),
                })
                .collect::<Result<_, _>>()?,
        ),
    })
}

fn float_value(x: f64) -> Value {
    match Number::from_f64(x) {
        Some(n) => Value::Number(n),
        None if x.is_nan() => Value::String("NaN".into()),
        None if x > 0.0 => Value::String("Infinity".into()),
        None => Value::String("-Infinity".into()),
    }
}

fn to_values(data: &TensorData) -> Value {
    let items: Vec<Value> = match data {
        TensorData::Float16(v) => v.iter().map(|x| float_value(x.to_f64())).collect(),
        TensorData::Float32(v) => v.iter().map(|x| float_value(f64::from(*x))).collect(),
        TensorData::Float64(v) => v.iter().map(|x| float_value(*x)).collect(),
        TensorData::Int8(v) => v.iter().map(|x| Value::from(*x)).collect(),
        TensorData::Int16(v) => v.iter().map(|x| Value::from(*x)).collect(),
        TensorData::Int32(v) => v.iter().map(|x| Value::from(*x)).collect(),
        TensorData::Int64(v) => v.iter().map(|x| Value::from(*x)).collect(),
        TensorData::Uint8(v) => v.iter().map(|x| Value::from(*x)).collect(),
        TensorData::Uint16(v) => v.iter().map(|x| Value::from(*x)).collect(),
        TensorData::Uint32(v) => v.iter().map(|x| Value::from(*x)).collect(),
        TensorData::Uint64(v) => v.iter().map(|x| Value::from(*x)).collect(),
        TensorData::Bool(v) => v.iter().map(|x| Value::from(*x)).collect(),
        TensorData::String(v) => v.iter().map(|x| Value::from(x.as_str())).collect(),
    };
    Value::Array(items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: Value) -> Result<Tensor, Error> {
        let json: JsonTensor = serde_json::from_value(value).unwrap();
        Tensor::from_json("x", &json)
    }

    #[test]
    fn arrays_and_base64_carry_the_same_tensor_for_every_numeric_type() {
        for element_type in ElementType::ALL {
            if element_type == ElementType::String {
                continue;
            }
            let data = if element_type == ElementType::Bool {
                json!([[true, false], [false, true]])
            } else {
                json!([[1, 2], [3, 4]])
            };
            let tensor =
                parse(json!({"type": element_type.as_str(), "shape": [2, 2], "data": data}))
                    .unwrap();
            assert_eq!(tensor.element_type(), element_type);
            let b64 = tensor.to_json(Encoding::Base64);
            assert!(b64.data.is_string(), "{element_type}");
            let back = Tensor::from_json("x", &b64).unwrap();
            assert_eq!(back, tensor, "{element_type}");
            let array = tensor.to_json(Encoding::Array);
            assert_eq!(Tensor::from_json("x", &array).unwrap(), tensor);
        }
    }

    #[test]
    fn non_finite_floats_round_trip_as_strings() {
        let t = parse(
            json!({"type": "float32", "shape": [3], "data": ["NaN", "Infinity", "-Infinity"]}),
        )
        .unwrap();
        let out = t.to_json(Encoding::Array);
        assert_eq!(out.data, json!(["NaN", "Infinity", "-Infinity"]));
    }

    #[test]
    fn bad_data_names_the_input_and_the_problem() {
        let e = parse(json!({"type": "int8", "shape": [1], "data": [300]})).unwrap_err();
        assert!(
            e.to_string().contains("input `x`") && e.to_string().contains("not a int8"),
            "{e}"
        );
        let e = parse(json!({"type": "float32", "shape": [2, 2], "data": [1, 2, 3]})).unwrap_err();
        assert!(e.to_string().contains("needs 4 elements"), "{e}");
        let e = parse(json!({"type": "complex", "shape": [1], "data": [1]})).unwrap_err();
        assert!(
            e.to_string().contains("unknown element type `complex`"),
            "{e}"
        );
        let e = parse(json!({"type": "float32", "shape": [3], "data": "AAAA"})).unwrap_err();
        assert!(e.to_string().contains("3 bytes"), "{e}");
        let e = parse(json!({"type": "float32", "shape": [-1], "data": []})).unwrap_err();
        assert!(e.to_string().contains("negative"), "{e}");
        assert_eq!(
            arcane_report::Diagnostic::code(&e),
            arcane_report::codes::ARCANE_USAGE
        );
    }
}
