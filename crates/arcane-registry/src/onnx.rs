//! ONNX graphs: read without ONNX Runtime (a protobuf `ModelProto`, by
//! [`arcane_onnx::model::read_onnx`]), recorded under `onnx`.

use std::path::Path;

use arcane_onnx::model::OnnxInfo;

use crate::header::{field, recorded, FormatReader, Header, Summary};
use crate::Error;

/// The ONNX reader of the registry's table ([`crate::READERS`]).
pub(crate) struct Graph;

impl FormatReader for Graph {
    fn format(&self) -> arcane_workspace::ModelFormat {
        arcane_workspace::formats::ONNX
    }

    fn kind(&self) -> &'static str {
        "onnx"
    }

    fn key(&self) -> &'static str {
        "onnx"
    }

    fn claims(&self, path: &Path) -> bool {
        arcane_onnx::model::looks_like_onnx(path)
    }

    fn read(&self, path: &Path) -> Result<Header, Error> {
        Ok(recorded(self.key(), &read(path)?))
    }

    fn summary(&self, header: &Header) -> Summary {
        Summary {
            family: self.kind().into(),
            description: field::<OnnxInfo>(header, self.key())
                .map(|info| describe(&info))
                .unwrap_or_default(),
            ..Summary::default()
        }
    }
}

/// The version of the ONNX Runtime library at `library` (its loader's refusal: missing,
/// not ONNX Runtime, too old).
pub(crate) fn library_version(library: &Path) -> Result<String, Error> {
    arcane_onnx::library_version(library).map_err(|error| Error::Library(Box::new(error)))
}

/// Reads the ONNX graph at `path`; a file that is not one is
/// [`Error::ModelInvalid`] naming why.
pub(crate) fn read(path: &Path) -> Result<OnnxInfo, Error> {
    arcane_onnx::model::read_onnx(path).map_err(|error| Error::ModelInvalid {
        path: path.to_path_buf(),
        reason: error.to_string(),
        found: None,
    })
}

/// `ONNX IR 8, opset ai.onnx 16, inputs input, state, sr, outputs output`.
pub(crate) fn describe(info: &OnnxInfo) -> String {
    let opsets: Vec<String> = info
        .opsets
        .iter()
        .map(|o| format!("{} {}", o.domain, o.version))
        .collect();
    let names = |specs: &[arcane_onnx::IoSpec]| {
        specs
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "ONNX IR {}, opset {}, inputs {}, outputs {}",
        info.ir_version,
        opsets.join(" + "),
        names(&info.inputs),
        names(&info.outputs)
    )
}
