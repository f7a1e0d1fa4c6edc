//! MLPerf DLRM-DCNv2's multi-hot Criteo (`dlrmc data convert --format
//! mlperf-multihot`), as `materialize_synthetic_multihot_dataset.py`
//! (mlcommons/training `recommendation_v2/torchrec_dlrm`) writes it beside TorchRec's
//! per-day arrays:
//!
//! | file | shape | meaning |
//! | --- | --- | --- |
//! | `day_<d>_sparse_multi_hot.npz` (the input named) | members `"0"` .. `"25"`, each `[N, hotness_t]` | table `t`'s fixed-size bag per sample |
//! | `day_<d>_dense.npy` (same directory) | `[N, 13]` float | dense features, already `ln(x + 3)` (TorchRec's preprocessing) |
//! | `day_<d>_labels.npy` (same directory) | `[N, 1]` or `[N]` | label, 0 or 1 |
//!
//! Every table is written multi-hot with its fixed hotness; ids are rows (with
//! `--max-ind-range`, taken modulo it). A day is read whole into memory.

use crate::error::{DataError, Result};
use crate::npy::{self, PayloadError, Value, open_npz};
use crate::processed::{Array, read_array};
use crate::ragged::Day;
use std::path::Path;

/// A standalone `.npy` file read with `conv`, its declared size checked first.
fn read_npy<T>(
    path: &Path,
    conv: impl FnMut(usize, Value) -> std::result::Result<T, String>,
) -> Result<Array<T>> {
    let f = std::fs::File::open(path).map_err(|e| DataError::io(path, e))?;
    let size = f.metadata().map_err(|e| DataError::io(path, e))?.len();
    let mut r = std::io::BufReader::new(f);
    let err = |reason: String| DataError::dataset(path, reason);
    let (h, count) = npy::read_checked_header(&mut r, size).map_err(|e| err(e.to_string()))?;
    let data = npy::read_vec(&mut r, &h, count, conv).map_err(|e| match e {
        PayloadError::Npy(e) => err(e.to_string()),
        PayloadError::Value(e) => err(e),
    })?;
    Ok(Array {
        data,
        shape: h.shape,
        fortran: h.fortran,
    })
}

/// Reads one day: `path` is its `day_<d>_sparse_multi_hot.npz`.
pub(crate) fn read_day(path: &Path, tables: Option<usize>, modulo: Option<u32>) -> Result<Day> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let stem = name.strip_suffix("_sparse_multi_hot.npz").ok_or_else(|| {
        DataError::dataset(
            path,
            "an MLPerf multi-hot input is named day_<d>_sparse_multi_hot.npz",
        )
    })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let labels = read_npy(&dir.join(format!("{stem}_labels.npy")), |i, v| match v {
        Value::Int(y @ 0..=1) => Ok(y as u8),
        Value::Float(y) if y == 0.0 || y == 1.0 => Ok(y as u8),
        v => Err(format!("element {i}: label {v} is not 0 or 1")),
    })?;
    let n = labels.data.len() as u64;
    let dense_path = dir.join(format!("{stem}_dense.npy"));
    let dense = read_npy(&dense_path, |i, v| match v {
        Value::Float(x) if x.is_finite() => Ok(x as f32),
        Value::Int(x) => Ok(x as f32),
        v => Err(format!("element {i}: {v} is not a finite number")),
    })?;
    let width = match dense.shape[..] {
        [rows, d] if rows == n => d as usize,
        _ => {
            return Err(DataError::dataset(
                &dense_path,
                format!(
                    "shape {:?}, expected ({n}, 13) like the labels",
                    dense.shape
                ),
            ));
        }
    };
    let dense = dense.sample_major(&dense_path, "dense", n, width)?;
    let mut zip = open_npz(path).map_err(|e| DataError::dataset(path, e.to_string()))?;
    let tables = tables.unwrap_or_else(|| {
        (0..)
            .take_while(|t| zip.by_name(&format!("{t}.npy")).is_ok())
            .count()
    });
    let mut bags = Vec::with_capacity(tables);
    for t in 0..tables {
        let member = t.to_string();
        let a = read_array(&mut zip, path, &member, |x| u32::try_from(x).ok())?;
        let hot = match a.shape[..] {
            [rows] if rows == n => 1,
            [rows, h] if rows == n => h as usize,
            _ => {
                return Err(DataError::dataset(
                    path,
                    format!(
                        "{member}.npy has shape {:?}, expected ({n}, hotness)",
                        a.shape
                    ),
                ));
            }
        };
        let ids = a.sample_major(path, &member, n, hot)?;
        let ids = match modulo {
            Some(m) => ids.iter().map(|&id| id % m).collect(),
            None => ids,
        };
        let ends = (1..=n).map(|i| i * hot as u64).collect();
        bags.push((ids, ends));
    }
    Ok(Day {
        labels: labels.data,
        dense,
        bags,
        counts: None,
    })
}
