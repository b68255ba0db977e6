//! The header of an `.onnx` file (a protobuf `ModelProto`), read without ONNX Runtime:
//! IR version, producer, opset imports, and the graph's inputs (initializers left out)
//! and outputs. Weights are skipped with seeks, never read.
//!
//! Field numbers are those of `onnx.proto`: `ModelProto` 1 `ir_version`, 2
//! `producer_name`, 3 `producer_version`, 7 `graph`, 8 `opset_import`; `GraphProto`
//! 5 `initializer`, 11 `input`, 12 `output`; `ValueInfoProto` 1 `name`, 2 `type`;
//! `TypeProto` 1 `tensor_type`; `Tensor` 1 `elem_type`, 2 `shape`; `Dimension`
//! 1 `dim_value`, 2 `dim_param`; `TensorProto` 8 `name`.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Dim, ElementType, Error, IoSpec};

/// What an `.onnx` header says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OnnxInfo {
    /// `ir_version`.
    pub ir_version: i64,
    /// `producer_name` and `producer_version`, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer: Option<String>,
    /// Opset imports: `{domain, version}` (the default domain is `ai.onnx`).
    pub opsets: Vec<Opset>,
    /// Graph inputs that are not initializers.
    pub inputs: Vec<IoSpec>,
    /// Graph outputs.
    pub outputs: Vec<IoSpec>,
}

/// One opset import.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Opset {
    /// The domain (`ai.onnx` for the default one).
    pub domain: String,
    /// The opset version.
    pub version: i64,
}

/// Whether `path`'s first bytes look like an ONNX `ModelProto` (field 1, `ir_version`,
/// as a varint), the cheap test `arcane model add` uses before [`read_onnx`].
pub fn looks_like_onnx(path: &Path) -> bool {
    let mut head = [0u8; 2];
    arcane_files::open_regular(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .map(|()| head[0] == 0x08 && head[1] > 0 && head[1] < 0x80)
        .unwrap_or(false)
}

struct Reader<R> {
    inner: R,
    pos: u64,
}

impl<R: Read + Seek> Reader<R> {
    fn byte(&mut self) -> std::io::Result<u8> {
        let mut b = [0u8; 1];
        self.inner.read_exact(&mut b)?;
        self.pos += 1;
        Ok(b[0])
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte().map_err(|e| format!("truncated varint: {e}"))?;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    fn skip(&mut self, n: u64) -> Result<(), String> {
        let n = i64::try_from(n).map_err(|_| "length out of range".to_string())?;
        self.inner
            .seek(SeekFrom::Current(n))
            .map_err(|e| e.to_string())?;
        self.pos += n as u64;
        Ok(())
    }

    fn bytes(&mut self, n: u64) -> Result<Vec<u8>, String> {
        if n > 1 << 20 {
            return Err(format!("a {n}-byte name or header field is not plausible"));
        }
        let mut buf = vec![0u8; n as usize];
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| format!("truncated: {e}"))?;
        self.pos += n;
        Ok(buf)
    }

    /// The next `(field, wire type)` before `end`, or `None` at `end`.
    fn field(&mut self, end: u64) -> Result<Option<(u64, u8)>, String> {
        if self.pos >= end {
            return Ok(None);
        }
        let key = self.varint()?;
        Ok(Some((key >> 3, (key & 7) as u8)))
    }

    fn skip_value(&mut self, wire: u8) -> Result<(), String> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.skip(8),
            2 => {
                let n = self.varint()?;
                self.skip(n)
            }
            5 => self.skip(4),
            other => Err(format!("unsupported protobuf wire type {other}")),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        let n = self.varint()?;
        String::from_utf8(self.bytes(n)?).map_err(|_| "a name is not UTF-8".to_string())
    }

    /// A length-delimited field's end offset.
    fn message_end(&mut self, limit: u64) -> Result<u64, String> {
        let n = self.varint()?;
        let end = self.pos.checked_add(n).ok_or("length overflow")?;
        if end > limit {
            return Err("a nested message runs past its parent".into());
        }
        Ok(end)
    }
}

/// Reads the header of the `.onnx` file at `path`. A file that is not an ONNX model is
/// `LOCAL_AI_MODEL_INVALID` naming it.
pub fn read_onnx(path: &Path) -> Result<OnnxInfo, Error> {
    let file = arcane_open(path)?;
    let len = file.metadata().map_err(|e| io_error(path, e))?.len();
    let mut reader = Reader {
        inner: BufReader::new(file),
        pos: 0,
    };
    parse_model(&mut reader, len).map_err(|reason| Error::ModelInvalid {
        path: path.to_path_buf(),
        reason,
    })
}

fn io_error(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    }
}

fn arcane_open(path: &Path) -> Result<File, Error> {
    let file = File::open(path).map_err(|e| io_error(path, e))?;
    let meta = file.metadata().map_err(|e| io_error(path, e))?;
    if !meta.is_file() {
        return Err(Error::ModelInvalid {
            path: path.to_path_buf(),
            reason: "it is not a regular file".into(),
        });
    }
    Ok(file)
}

fn parse_model<R: Read + Seek>(r: &mut Reader<R>, len: u64) -> Result<OnnxInfo, String> {
    let mut ir_version = None;
    let (mut producer_name, mut producer_version) = (String::new(), String::new());
    let mut opsets = Vec::new();
    let mut graph = None;
    while let Some((field, wire)) = r.field(len)? {
        match (field, wire) {
            (1, 0) => ir_version = Some(r.varint()? as i64),
            (2, 2) => producer_name = r.string()?,
            (3, 2) => producer_version = r.string()?,
            (7, 2) => {
                let end = r.message_end(len)?;
                graph = Some(parse_graph(r, end)?);
            }
            (8, 2) => {
                let end = r.message_end(len)?;
                opsets.push(parse_opset(r, end)?);
            }
            (_, wire) => r.skip_value(wire)?,
        }
    }
    let ir_version = ir_version.ok_or("it has no `ir_version` (not an ONNX ModelProto)")?;
    let (inputs, outputs) = graph.ok_or("it has no graph")?;
    let producer = match (producer_name.is_empty(), producer_version.is_empty()) {
        (true, _) => None,
        (false, true) => Some(producer_name),
        (false, false) => Some(format!("{producer_name} {producer_version}")),
    };
    Ok(OnnxInfo {
        ir_version,
        producer,
        opsets,
        inputs,
        outputs,
    })
}

fn parse_opset<R: Read + Seek>(r: &mut Reader<R>, end: u64) -> Result<Opset, String> {
    let mut opset = Opset {
        domain: String::new(),
        version: 0,
    };
    while let Some((field, wire)) = r.field(end)? {
        match (field, wire) {
            (1, 2) => opset.domain = r.string()?,
            (2, 0) => opset.version = r.varint()? as i64,
            (_, wire) => r.skip_value(wire)?,
        }
    }
    if opset.domain.is_empty() {
        opset.domain = "ai.onnx".into();
    }
    Ok(opset)
}

type Graph = (Vec<IoSpec>, Vec<IoSpec>);

fn parse_graph<R: Read + Seek>(r: &mut Reader<R>, end: u64) -> Result<Graph, String> {
    let (mut inputs, mut outputs, mut initializers) = (Vec::new(), Vec::new(), Vec::new());
    while let Some((field, wire)) = r.field(end)? {
        match (field, wire) {
            (5, 2) => {
                let stop = r.message_end(end)?;
                initializers.push(parse_initializer_name(r, stop)?);
            }
            (11, 2) | (12, 2) => {
                let stop = r.message_end(end)?;
                let spec = parse_value_info(r, stop)?;
                if field == 11 {
                    inputs.push(spec)
                } else {
                    outputs.push(spec)
                }
            }
            (_, wire) => r.skip_value(wire)?,
        }
    }
    inputs.retain(|i: &IoSpec| !initializers.contains(&i.name));
    Ok((inputs, outputs))
}

fn parse_initializer_name<R: Read + Seek>(r: &mut Reader<R>, end: u64) -> Result<String, String> {
    let mut name = String::new();
    while let Some((field, wire)) = r.field(end)? {
        match (field, wire) {
            (8, 2) => name = r.string()?,
            (_, wire) => r.skip_value(wire)?,
        }
    }
    Ok(name)
}

fn parse_value_info<R: Read + Seek>(r: &mut Reader<R>, end: u64) -> Result<IoSpec, String> {
    let mut spec = IoSpec {
        name: String::new(),
        element_type: "unknown".into(),
        shape: None,
    };
    while let Some((field, wire)) = r.field(end)? {
        match (field, wire) {
            (1, 2) => spec.name = r.string()?,
            (2, 2) => {
                let stop = r.message_end(end)?;
                while let Some((field, wire)) = r.field(stop)? {
                    match (field, wire) {
                        (1, 2) => {
                            let tensor_end = r.message_end(stop)?;
                            parse_tensor_type(r, tensor_end, &mut spec)?;
                        }
                        (_, wire) => {
                            spec.element_type = "non-tensor".into();
                            r.skip_value(wire)?
                        }
                    }
                }
            }
            (_, wire) => r.skip_value(wire)?,
        }
    }
    Ok(spec)
}

fn parse_tensor_type<R: Read + Seek>(
    r: &mut Reader<R>,
    end: u64,
    spec: &mut IoSpec,
) -> Result<(), String> {
    while let Some((field, wire)) = r.field(end)? {
        match (field, wire) {
            (1, 0) => {
                let code = r.varint()? as i64;
                spec.element_type = ElementType::from_onnx_code(code)
                    .map(|t| t.as_str().to_string())
                    .unwrap_or_else(|| format!("onnx-type-{code}"));
            }
            (2, 2) => {
                let stop = r.message_end(end)?;
                let mut dims = Vec::new();
                while let Some((field, wire)) = r.field(stop)? {
                    match (field, wire) {
                        (1, 2) => {
                            let dim_end = r.message_end(stop)?;
                            dims.push(parse_dim(r, dim_end)?);
                        }
                        (_, wire) => r.skip_value(wire)?,
                    }
                }
                spec.shape = Some(dims);
            }
            (_, wire) => r.skip_value(wire)?,
        }
    }
    Ok(())
}

fn parse_dim<R: Read + Seek>(r: &mut Reader<R>, end: u64) -> Result<Dim, String> {
    let mut dim = Dim::Named("?".into());
    while let Some((field, wire)) = r.field(end)? {
        match (field, wire) {
            (1, 0) => dim = Dim::Fixed(r.varint()? as i64),
            (2, 2) => dim = Dim::Named(r.string()?),
            (_, wire) => r.skip_value(wire)?,
        }
    }
    Ok(dim)
}
