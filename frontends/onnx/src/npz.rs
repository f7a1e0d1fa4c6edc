//! npz archives of named arrays (numpy's `savez` format: a zip of `.npy` files) as
//! [`Tensor`]s: f32, i64 and i32 (plus f64 read as f32, bool and other integer types
//! widened to i64 on read, u64 when it fits). Array names are the zip entry names
//! without `.npy`.

use crate::error::{OnnxError, Result};
use dlrm_data::npy::{self, Kind, PayloadError, Value};
use dlrm_ir::{Data, Tensor};
use npyz::{DType as NpyType, TypeStr, WriterBuilder};
use std::io::{Read, Write};
use std::path::Path;

fn err(path: &Path, reason: impl Into<String>) -> OnnxError {
    OnnxError::Npz {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

/// Reads every array of an npz archive, in archive order. Every declared shape is
/// checked against the bytes the archive holds before anything is allocated; two
/// arrays of one name, and bytes past an array's shape, are refused.
pub fn read(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let mut zip = npy::open_npz(path).map_err(|e| err(path, e.to_string()))?;
    let mut out = Vec::new();
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| err(path, e.to_string()))?;
        let name = entry.name().trim_end_matches(".npy").to_string();
        let t = from_npy(&mut entry).map_err(|e| err(path, format!("array `{name}`: {e}")))?;
        out.push((name, t));
    }
    Ok(out)
}

fn from_npy<R: Read>(entry: &mut zip::read::ZipFile<'_, R>) -> std::result::Result<Tensor, String> {
    let declared = entry.size();
    let (h, count) = npy::read_checked_header(entry, declared).map_err(|e| e.to_string())?;
    if h.fortran {
        return Err("Fortran-order arrays are not supported".into());
    }
    // Every dimension is at most `count` elements, which fits in a usize.
    let shape: Vec<usize> = h.shape.iter().map(|&d| d as usize).collect();
    fn values<T>(
        r: &mut impl Read,
        h: &npy::Header,
        count: usize,
        conv: impl Fn(Value) -> Option<T>,
    ) -> std::result::Result<Vec<T>, String> {
        npy::read_vec(r, h, count, |i, v| {
            conv(v).ok_or_else(|| format!("element {i}: {v} does not fit in {}", h.descr))
        })
        .map_err(|e| match e {
            PayloadError::Npy(e) => e.to_string(),
            PayloadError::Value(e) => e,
        })
    }
    let int = |v: Value| match v {
        Value::Int(x) => Some(x),
        Value::Float(_) => None,
    };
    Ok(match (h.kind, h.size) {
        (Kind::Float, _) => Tensor::f32(
            shape,
            values(entry, &h, count, |v| match v {
                Value::Float(x) => Some(x as f32),
                Value::Int(_) => None,
            })?,
        ),
        (Kind::Int, 4) => Tensor::i32(
            shape,
            values(entry, &h, count, |v| {
                int(v).and_then(|x| i32::try_from(x).ok())
            })?,
        ),
        _ => Tensor::i64(
            shape,
            values(entry, &h, count, |v| {
                int(v).and_then(|x| i64::try_from(x).ok())
            })?,
        ),
    })
}

fn npy_bytes(t: &Tensor) -> std::result::Result<Vec<u8>, String> {
    let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
    let mut buf = Vec::new();
    macro_rules! put {
        ($v:expr, $ty:ty, $code:literal) => {{
            let ts: TypeStr = $code
                .parse()
                .map_err(|e: npyz::ParseTypeStrError| e.to_string())?;
            let mut w = npyz::WriteOptions::<$ty>::new()
                .dtype(NpyType::Plain(ts))
                .shape(&shape)
                .writer(&mut buf)
                .begin_nd()
                .map_err(|e| e.to_string())?;
            w.extend($v.iter().copied()).map_err(|e| e.to_string())?;
            w.finish().map_err(|e| e.to_string())?;
        }};
    }
    match &t.data {
        Data::F32(v) => put!(v, f32, "<f4"),
        Data::I64(v) => put!(v, i64, "<i8"),
        Data::I32(v) => put!(v, i32, "<i4"),
        Data::U8(v) => put!(v, u8, "|u1"),
        Data::BF16(v) => {
            let f: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
            put!(f, f32, "<f4")
        }
    }
    Ok(buf)
}

/// Writes arrays to an npz archive (uncompressed, like `numpy.savez`); bf16 arrays
/// are widened to f32.
pub fn write(path: &Path, arrays: &[(String, Tensor)]) -> Result<()> {
    let f = std::fs::File::create(path).map_err(|e| err(path, format!("cannot create: {e}")))?;
    let mut zip = zip::ZipWriter::new(f);
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, t) in arrays {
        let bytes = npy_bytes(t).map_err(|e| err(path, format!("array `{name}`: {e}")))?;
        zip.start_file(format!("{name}.npy"), opts)
            .map_err(|e| err(path, e.to_string()))?;
        zip.write_all(&bytes)
            .map_err(|e| err(path, e.to_string()))?;
    }
    zip.finish().map_err(|e| err(path, e.to_string()))?;
    Ok(())
}
