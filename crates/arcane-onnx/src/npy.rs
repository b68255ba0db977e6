//! NumPy `.npy` files (format versions 1, 2 and 3) to and from [`Tensor`]s: every
//! [`ElementType`], strings as fixed-width UTF-32 (`<U n`), C order only.

use crate::{ElementType, Error, Tensor, TensorData};

const MAGIC: &[u8] = b"\x93NUMPY";

fn descr(element_type: ElementType) -> &'static str {
    match element_type {
        ElementType::Float16 => "<f2",
        ElementType::Float32 => "<f4",
        ElementType::Float64 => "<f8",
        ElementType::Int8 => "|i1",
        ElementType::Int16 => "<i2",
        ElementType::Int32 => "<i4",
        ElementType::Int64 => "<i8",
        ElementType::Uint8 => "|u1",
        ElementType::Uint16 => "<u2",
        ElementType::Uint32 => "<u4",
        ElementType::Uint64 => "<u8",
        ElementType::Bool => "|b1",
        ElementType::String => "<U",
    }
}

/// Parses `.npy` bytes; `name` (the input or file) goes into error messages.
pub fn from_bytes(name: &str, bytes: &[u8]) -> Result<Tensor, Error> {
    let bad = |reason: String| Error::BadData {
        name: name.to_string(),
        reason,
    };
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(bad("not a NumPy .npy file (no \\x93NUMPY magic)".into()));
    }
    let (header_len, start): (usize, usize) = match bytes[6] {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 | 3 if bytes.len() >= 12 => {
            let n = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
            (n as usize, 12)
        }
        v => return Err(bad(format!("unsupported .npy format version {v}"))),
    };
    let end = start.checked_add(header_len).filter(|e| *e <= bytes.len());
    let end = end.ok_or_else(|| bad("truncated .npy header".into()))?;
    let header = std::str::from_utf8(&bytes[start..end])
        .map_err(|_| bad("the .npy header is not text".into()))?;
    let descr_text =
        dict_value(header, "descr").ok_or_else(|| bad(format!("no `descr` in header {header}")))?;
    if dict_value(header, "fortran_order").as_deref() != Some("False") {
        return Err(bad(
            "Fortran-ordered arrays are not supported; save with np.ascontiguousarray".into(),
        ));
    }
    let shape = parse_shape(header)
        .ok_or_else(|| bad(format!("cannot read the shape in header {header}")))?;
    let descr_text = descr_text.trim_matches(|c| c == '\'' || c == '"');
    let payload = &bytes[end..];
    let count =
        crate::tensor::element_count(&shape).ok_or_else(|| bad("the shape is too large".into()))?;
    let data = if let Some(width) = descr_text.strip_prefix("<U") {
        let width: usize = width
            .parse()
            .map_err(|_| bad(format!("bad string dtype `{descr_text}`")))?;
        read_strings(payload, width, count)
            .ok_or_else(|| bad("truncated or invalid string data".into()))?
    } else {
        let element_type = ElementType::ALL
            .into_iter()
            .find(|t| {
                let d = descr(*t);
                d == descr_text || (d.starts_with('<') && d.replacen('<', "|", 1) == descr_text)
            })
            .ok_or_else(|| {
                bad(format!(
                    "unsupported dtype `{descr_text}` (little-endian numeric, bool or <U strings)"
                ))
            })?;
        let size = element_type.size().unwrap_or(1);
        let needed = count.checked_mul(size).filter(|n| *n <= payload.len());
        let needed = needed.ok_or_else(|| bad("truncated .npy data".into()))?;
        TensorData::from_le_bytes(element_type, &payload[..needed])
            .ok_or_else(|| bad("bad .npy data".into()))?
    };
    Ok(Tensor { shape, data })
}

fn read_strings(payload: &[u8], width: usize, count: usize) -> Option<TensorData> {
    let item = width.checked_mul(4)?;
    if payload.len() < item.checked_mul(count)? {
        return None;
    }
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let chunk = &payload[i * item..(i + 1) * item];
        let text: Option<String> = chunk
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .take_while(|c| *c != 0)
            .map(char::from_u32)
            .collect();
        out.push(text?);
    }
    Some(TensorData::String(out))
}

fn dict_value(header: &str, key: &str) -> Option<String> {
    let at = header.find(&format!("'{key}'"))?;
    let rest = header[at + key.len() + 2..]
        .trim_start()
        .strip_prefix(':')?
        .trim_start();
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim().to_string())
}

fn parse_shape(header: &str) -> Option<Vec<i64>> {
    let at = header.find("'shape'")?;
    let rest = &header[at..];
    let open = rest.find('(')?;
    let close = rest.find(')')?;
    rest[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse().ok())
        .collect()
}

/// The `.npy` (format 1.0) bytes of `tensor`.
pub fn to_bytes(tensor: &Tensor) -> Vec<u8> {
    let (descr_text, payload) = match &tensor.data {
        TensorData::String(items) => {
            let width = items
                .iter()
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
                .max(1);
            let mut payload = Vec::with_capacity(items.len() * width * 4);
            for s in items {
                let mut n = 0;
                for c in s.chars() {
                    payload.extend_from_slice(&(c as u32).to_le_bytes());
                    n += 1;
                }
                payload.resize(payload.len() + (width - n) * 4, 0);
            }
            (format!("<U{width}"), payload)
        }
        data => (
            descr(data.element_type()).to_string(),
            data.to_le_bytes().unwrap_or_default(),
        ),
    };
    let dims: Vec<String> = tensor.shape.iter().map(i64::to_string).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header =
        format!("{{'descr': '{descr_text}', 'fortran_order': False, 'shape': {shape}, }}");
    let unpadded = MAGIC.len() + 4 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_round_trips() {
        let tensors = [
            Tensor {
                shape: vec![2, 2],
                data: TensorData::Float32(vec![1.0, -2.5, 3.0, 4.0]),
            },
            Tensor {
                shape: vec![3],
                data: TensorData::Int64(vec![1, -2, 3]),
            },
            Tensor {
                shape: vec![],
                data: TensorData::Bool(vec![true]),
            },
            Tensor {
                shape: vec![2],
                data: TensorData::String(vec!["héllo".into(), "x".into()]),
            },
            Tensor {
                shape: vec![1, 1],
                data: TensorData::Uint8(vec![255]),
            },
        ];
        for tensor in tensors {
            let bytes = to_bytes(&tensor);
            assert_eq!(
                (10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize) % 64,
                0
            );
            assert_eq!(from_bytes("t", &bytes).unwrap(), tensor);
        }
    }

    #[test]
    fn foreign_files_are_refused_by_name() {
        let e = from_bytes("a.npy", b"not numpy at all").unwrap_err();
        assert!(
            e.to_string().contains("a.npy") && e.to_string().contains("magic"),
            "{e}"
        );
    }
}
