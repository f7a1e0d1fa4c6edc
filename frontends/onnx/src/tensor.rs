//! Reading `TensorProto`s into [`dlrm_ir::Tensor`]s: typed fields (`float_data`,
//! `int32_data`, `int64_data`, `double_data`), `raw_data` (little-endian) and
//! `external_data` side files.
//!
//! External data paths are resolved relative to the model's folder and must stay
//! inside it: absolute paths, `..` components and symlinks leading outside are
//! refused. Element counts are checked against the dims before any allocation, so a
//! corrupt file cannot make the importer allocate unbounded memory or panic.

use crate::proto::{TensorProto, tensor_proto::DataType};
use dlrm_ir::{DType, Tensor};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path};

/// Largest tensor accepted (elements), a guard against corrupt dims.
const MAX_ELEMENTS: usize = 1 << 34;

/// The IR dtype of an ONNX element type, or why it is unsupported.
pub(crate) fn dtype_of(code: i32) -> Result<DType, String> {
    match DataType::try_from(code) {
        Ok(DataType::Float) => Ok(DType::F32),
        Ok(DataType::Bfloat16) => Ok(DType::BF16),
        Ok(DataType::Int64) => Ok(DType::I64),
        Ok(DataType::Int32) => Ok(DType::I32),
        // Doubles and bools are read and converted (f64 -> f32, bool -> i64).
        Ok(DataType::Double) => Ok(DType::F32),
        Ok(DataType::Bool) => Ok(DType::I64),
        Ok(other) => Err(format!(
            "unsupported element type {} (supported: float, bfloat16, int64, int32)",
            other.as_str_name()
        )),
        Err(_) => Err(format!("unknown element type code {code}")),
    }
}

fn element_count(dims: &[i64]) -> Result<Vec<usize>, String> {
    let shape: Vec<usize> = dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("negative dimension {d}")))
        .collect::<Result<_, _>>()?;
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| format!("dims {dims:?} are too large"))?;
    let _ = n;
    Ok(shape)
}

/// Reads the external data of `t` from a side file next to the model.
fn external_bytes(t: &TensorProto, base: Option<&Path>, want: usize) -> Result<Vec<u8>, String> {
    let mut location = None;
    let mut offset = 0u64;
    let mut length = None;
    for e in &t.external_data {
        let v = e.value.as_deref().unwrap_or("");
        match e.key.as_deref() {
            Some("location") => location = Some(v.to_string()),
            Some("offset") => offset = v.parse().map_err(|_| format!("bad offset `{v}`"))?,
            Some("length") => {
                length = Some(
                    v.parse::<usize>()
                        .map_err(|_| format!("bad length `{v}`"))?,
                )
            }
            _ => {}
        }
    }
    let location = location.ok_or("external data without a `location`")?;
    let base = base.ok_or("external data needs the model's path (load from a file)")?;
    let rel = Path::new(&location);
    if rel
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!(
            "external data location `{location}` must be a relative path inside the model's folder"
        ));
    }
    let path = base.join(rel);
    let canon = path
        .canonicalize()
        .map_err(|e| format!("missing external data file `{}`: {e}", path.display()))?;
    let canon_base = base
        .canonicalize()
        .map_err(|e| format!("model folder: {e}"))?;
    if !canon.starts_with(&canon_base) {
        return Err(format!(
            "external data file `{location}` resolves outside the model's folder"
        ));
    }
    if let Some(l) = length
        && l != want
    {
        return Err(format!(
            "external data length {l} but the dims need {want} bytes"
        ));
    }
    let mut f = std::fs::File::open(&canon)
        .map_err(|e| format!("cannot open external data file `{}`: {e}", canon.display()))?;
    let size = f.metadata().map_err(|e| e.to_string())?.len();
    if offset.checked_add(want as u64).is_none_or(|end| end > size) {
        return Err(format!(
            "external data file `{location}` has {size} bytes, too short for {want} bytes at offset {offset}"
        ));
    }
    f.seek(SeekFrom::Start(offset)).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; want];
    f.read_exact(&mut buf).map_err(|e| e.to_string())?;
    Ok(buf)
}

/// Converts a tensor proto; `base` is the model's folder (for external data).
pub(crate) fn read_tensor(t: &TensorProto, base: Option<&Path>) -> Result<Tensor, String> {
    let code = t.data_type.unwrap_or(0);
    let dtype = dtype_of(code)?;
    let shape = element_count(&t.dims)?;
    let n: usize = shape.iter().product();
    let width = match DataType::try_from(code) {
        Ok(DataType::Double | DataType::Int64) => 8,
        Ok(DataType::Bfloat16) => 2,
        Ok(DataType::Bool) => 1,
        _ => 4,
    };
    let external = t.data_location == Some(1) || !t.external_data.is_empty();
    let raw: Option<Vec<u8>> = if external {
        Some(external_bytes(t, base, n * width)?)
    } else {
        t.raw_data.clone()
    };
    let is = |d: DataType| DataType::try_from(code) == Ok(d);
    if let Some(raw) = raw {
        if raw.len() != n * width {
            return Err(format!(
                "raw data has {} bytes, but dims {:?} need {}",
                raw.len(),
                t.dims,
                n * width
            ));
        }
        let c4 = || raw.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
        let c8 = || {
            raw.chunks_exact(8)
                .map(|c| [c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
        };
        return Ok(if is(DataType::Float) {
            Tensor::f32(shape, c4().map(f32::from_le_bytes).collect())
        } else if is(DataType::Double) {
            Tensor::f32(shape, c8().map(|b| f64::from_le_bytes(b) as f32).collect())
        } else if is(DataType::Int64) {
            Tensor::i64(shape, c8().map(i64::from_le_bytes).collect())
        } else if is(DataType::Int32) {
            Tensor::i32(shape, c4().map(i32::from_le_bytes).collect())
        } else if is(DataType::Bool) {
            Tensor::i64(shape, raw.iter().map(|&b| i64::from(b != 0)).collect())
        } else {
            let v = raw
                .chunks_exact(2)
                .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect();
            Tensor::bf16(shape, v)
        });
    }
    let got = |len: usize, field: &str| {
        if len == n {
            Ok(())
        } else {
            Err(format!(
                "{field} has {len} elements, but dims {:?} need {n}",
                t.dims
            ))
        }
    };
    Ok(match dtype {
        DType::F32 if is(DataType::Double) => {
            got(t.double_data.len(), "double_data")?;
            Tensor::f32(shape, t.double_data.iter().map(|&x| x as f32).collect())
        }
        DType::F32 => {
            got(t.float_data.len(), "float_data")?;
            Tensor::f32(shape, t.float_data.clone())
        }
        DType::I64 if is(DataType::Bool) => {
            got(t.int32_data.len(), "int32_data")?;
            Tensor::i64(
                shape,
                t.int32_data.iter().map(|&x| i64::from(x != 0)).collect(),
            )
        }
        DType::I64 => {
            got(t.int64_data.len(), "int64_data")?;
            Tensor::i64(shape, t.int64_data.clone())
        }
        DType::I32 => {
            got(t.int32_data.len(), "int32_data")?;
            Tensor::i32(shape, t.int32_data.clone())
        }
        DType::BF16 => {
            got(t.int32_data.len(), "int32_data")?;
            Tensor::bf16(
                shape,
                t.int32_data
                    .iter()
                    .map(|&x| half::bf16::from_bits(x as u16))
                    .collect(),
            )
        }
        DType::U8 => return Err("uint8 tensors are not imported".to_string()),
    })
}
