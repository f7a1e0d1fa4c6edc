//! npz archives of named arrays (numpy's `savez` format: a zip of `.npy` files) as
//! [`Tensor`]s: f32, i64 and i32 (plus f64 read as f32, bool and other integer types
//! widened to i64 on read). Array names are the zip entry names without `.npy`.

use crate::error::{OnnxError, Result};
use dlrm_ir::{Data, Tensor};
use npyz::{DType as NpyType, NpyFile, TypeStr, WriterBuilder};
use std::io::{Read, Write};
use std::path::Path;

fn err(path: &Path, reason: impl Into<String>) -> OnnxError {
    OnnxError::Npz {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

/// Reads every array of an npz archive, in archive order.
pub fn read(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let f = std::fs::File::open(path).map_err(|e| err(path, format!("cannot open: {e}")))?;
    let mut zip =
        zip::ZipArchive::new(f).map_err(|e| err(path, format!("not a zip archive: {e}")))?;
    let mut out = Vec::new();
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| err(path, e.to_string()))?;
        let name = entry.name().trim_end_matches(".npy").to_string();
        let mut bytes = Vec::new();
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| err(path, format!("array `{name}`: {e}")))?;
        let t = from_npy(&bytes).map_err(|e| err(path, format!("array `{name}`: {e}")))?;
        out.push((name, t));
    }
    Ok(out)
}

fn from_npy(bytes: &[u8]) -> std::result::Result<Tensor, String> {
    let npy = NpyFile::new(bytes).map_err(|e| e.to_string())?;
    if npy.order() != npyz::Order::C {
        return Err("Fortran-order arrays are not supported".into());
    }
    let shape: Vec<usize> = npy
        .shape()
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| "dimension too large".to_string()))
        .collect::<std::result::Result<_, _>>()?;
    let NpyType::Plain(ts) = npy.dtype() else {
        return Err("structured arrays are not supported".into());
    };
    let (kind, size) = (ts.type_char(), ts.size_field());
    use npyz::TypeChar as C;
    let e = |x: std::io::Error| x.to_string();
    Ok(match (kind, size) {
        (C::Float, 4) => Tensor::f32(shape, npy.into_vec::<f32>().map_err(e)?),
        (C::Float, 8) => Tensor::f32(
            shape,
            npy.into_vec::<f64>()
                .map_err(e)?
                .into_iter()
                .map(|x| x as f32)
                .collect(),
        ),
        (C::Int, 8) => Tensor::i64(shape, npy.into_vec::<i64>().map_err(e)?),
        (C::Int, 4) => Tensor::i32(shape, npy.into_vec::<i32>().map_err(e)?),
        (C::Int, 2) => Tensor::i64(
            shape,
            npy.into_vec::<i16>()
                .map_err(e)?
                .into_iter()
                .map(i64::from)
                .collect(),
        ),
        (C::Int, 1) => Tensor::i64(
            shape,
            npy.into_vec::<i8>()
                .map_err(e)?
                .into_iter()
                .map(i64::from)
                .collect(),
        ),
        (C::Bool, 1) => Tensor::i64(
            shape,
            npy.into_vec::<u8>()
                .map_err(e)?
                .into_iter()
                .map(i64::from)
                .collect(),
        ),
        (C::Uint, 4) => Tensor::i64(
            shape,
            npy.into_vec::<u32>()
                .map_err(e)?
                .into_iter()
                .map(i64::from)
                .collect(),
        ),
        _ => {
            return Err(format!(
                "unsupported dtype `{ts}` (f32, f64, i64, i32 and small ints)"
            ));
        }
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
