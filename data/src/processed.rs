//! Data the reference tools already prepared: the reference DLRM's `.npz` and the
//! MLPerf binary records.
//!
//! - **Reference `.npz`** (`data_utils.py`, `concatCriteoAdData`): a zip of `.npy`
//!   arrays `X_int` (samples × 13 integers, negatives already 0, not yet
//!   log-transformed), `X_cat` (samples × 26 ids, already mapped through the
//!   dictionary; the reference stores them as float64 in Fortran order, any integer
//!   or integral float dtype and either order is accepted), `y` (labels) and, when
//!   present, `counts` (rows per table). Arrays are read whole, one at a time, into
//!   compact types (about 157 bytes per sample: the reference's own loader holds
//!   the whole file in memory too), then streamed into the dataset.
//! - **MLPerf binary** (`data_loader_terabyte.py`, `CriteoBinDataset`): fixed 160-byte
//!   records of 40 little-endian int32: label, 13 raw integers, 26 ids already
//!   mapped. Streamed record by record; the dense transform `ln(1 + max(x, 0))` is
//!   applied here as the loader applies `log(x + 1)` at load time.

use crate::convert::SampleSink;
use crate::criteo::{DENSE, RawSample, SPARSE, sparse_name};
use crate::error::{DataError, Result};
use crate::npy::{self, NpyError, PayloadError, Value};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

/// Bytes per MLPerf record: 40 int32.
pub const MLPERF_RECORD: usize = 4 * (1 + DENSE + SPARSE);
const RECORDS_PER_BATCH: usize = 1 << 16;

/// Streams an MLPerf binary file into `sink`; returns the record count.
pub(crate) fn read_mlperf(
    path: &Path,
    sink: &mut dyn SampleSink,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64> {
    let file = File::open(path).map_err(|e| DataError::io(path, e))?;
    let len = file.metadata().map_err(|e| DataError::io(path, e))?.len();
    if len == 0 {
        return Err(DataError::Empty {
            path: path.to_path_buf(),
            what: "records",
        });
    }
    let rec = MLPERF_RECORD as u64;
    if len % rec != 0 {
        return Err(DataError::Record {
            path: path.to_path_buf(),
            record: len / rec + 1,
            reason: format!(
                "truncated record: the file is {len} bytes, not a multiple of {rec} (40 int32 per record)"
            ),
        });
    }
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut buf = vec![0u8; RECORDS_PER_BATCH * MLPERF_RECORD];
    let mut batch = Vec::with_capacity(RECORDS_PER_BATCH);
    let mut record = 0u64;
    let total = len / rec;
    while record < total {
        let n = ((total - record) as usize).min(RECORDS_PER_BATCH);
        let bytes = &mut buf[..n * MLPERF_RECORD];
        r.read_exact(bytes).map_err(|e| DataError::io(path, e))?;
        batch.clear();
        for (i, chunk) in bytes.chunks_exact(MLPERF_RECORD).enumerate() {
            let mut v = [0i32; 1 + DENSE + SPARSE];
            for (x, b) in v.iter_mut().zip(chunk.chunks_exact(4)) {
                *x = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            let at = record + i as u64 + 1;
            match mlperf_sample(&v) {
                Ok(s) => batch.push(s),
                Err((kind, reason)) => {
                    sink.push_batch(&batch)?;
                    batch.clear();
                    let err = DataError::Record {
                        path: path.to_path_buf(),
                        record: at,
                        reason,
                    };
                    sink.bad(kind, err)?;
                }
            }
        }
        sink.push_batch(&batch)?;
        record += n as u64;
        progress(sink.samples(), record * rec);
    }
    Ok(total)
}

fn mlperf_sample(
    v: &[i32; 1 + DENSE + SPARSE],
) -> std::result::Result<RawSample, (&'static str, String)> {
    let label = match v[0] {
        0 => 0,
        1 => 1,
        y => return Err(("label", format!("field label: {y} is not 0 or 1"))),
    };
    let mut s = RawSample {
        label,
        ..RawSample::default()
    };
    for (d, &x) in s.dense.iter_mut().zip(&v[1..=DENSE]) {
        *d = i64::from(x);
    }
    for (t, (id, &x)) in s.sparse.iter_mut().zip(&v[1 + DENSE..]).enumerate() {
        *id = u32::try_from(x).map_err(|_| {
            (
                "categorical",
                format!("field {}: id {x} is negative", sparse_name(t)),
            )
        })?;
    }
    Ok(s)
}

/// Reads the reference's `.npz` into `sink`; returns the sample count and the rows
/// per table (`counts`, or 0 per table when the file has none).
pub(crate) fn read_npz(path: &Path, sink: &mut dyn SampleSink) -> Result<(u64, Vec<u64>)> {
    let file = File::open(path).map_err(|e| DataError::io(path, e))?;
    if file.metadata().map_err(|e| DataError::io(path, e))?.len() == 0 {
        return Err(DataError::Empty {
            path: path.to_path_buf(),
            what: "arrays",
        });
    }
    let mut zip = npy::open_npz(path).map_err(|e| DataError::dataset(path, e.to_string()))?;
    let y: Array<u8> = read_array(&mut zip, path, "y", |x| {
        u8::try_from(x).ok().filter(|&y| y <= 1)
    })?;
    let n = y.shape.first().copied().unwrap_or(0);
    if y.shape.len() != 1 && !(y.shape.len() == 2 && y.shape[1] == 1) {
        return Err(bad_shape(path, "y", &y.shape, "(samples,)"));
    }
    if n == 0 {
        return Err(DataError::Empty {
            path: path.to_path_buf(),
            what: "samples",
        });
    }
    let x_int: Array<i32> = read_array(&mut zip, path, "X_int", |x| i32::try_from(x).ok())?;
    let dense = x_int.sample_major(path, "X_int", n, DENSE)?;
    drop(x_int);
    let x_cat: Array<u32> = read_array(&mut zip, path, "X_cat", |x| u32::try_from(x).ok())?;
    let cats = x_cat.sample_major(path, "X_cat", n, SPARSE)?;
    drop(x_cat);
    let counts = if zip.index_for_name("counts.npy").is_some() {
        let c: Array<u64> = read_array(&mut zip, path, "counts", |x| u64::try_from(x).ok())?;
        if c.data.len() != SPARSE {
            return Err(bad_shape(path, "counts", &c.shape, "(26,)"));
        }
        c.data
    } else {
        vec![0; SPARSE]
    };
    let mut batch = Vec::with_capacity(RECORDS_PER_BATCH);
    for start in (0..n as usize).step_by(RECORDS_PER_BATCH) {
        let end = (start + RECORDS_PER_BATCH).min(n as usize);
        batch.clear();
        for i in start..end {
            let mut s = RawSample {
                label: y.data[i],
                ..RawSample::default()
            };
            for (d, &x) in s.dense.iter_mut().zip(&dense[i * DENSE..(i + 1) * DENSE]) {
                *d = i64::from(x);
            }
            s.sparse
                .copy_from_slice(&cats[i * SPARSE..(i + 1) * SPARSE]);
            batch.push(s);
        }
        sink.push_batch(&batch)?;
    }
    Ok((n, counts))
}

fn bad_shape(path: &Path, name: &str, shape: &[u64], want: &str) -> DataError {
    DataError::dataset(
        path,
        format!("{name}.npy has shape {shape:?}, expected {want}"),
    )
}

/// A numpy array read into `T`s, with its shape and order.
pub(crate) struct Array<T> {
    pub(crate) data: Vec<T>,
    pub(crate) shape: Vec<u64>,
    pub(crate) fortran: bool,
}

impl<T: Copy> Array<T> {
    /// The values of an (n, k) array in sample-major order.
    pub(crate) fn sample_major(&self, path: &Path, name: &str, n: u64, k: usize) -> Result<Vec<T>> {
        if self.shape != [n, k as u64] {
            return Err(bad_shape(path, name, &self.shape, &format!("({n}, {k})")));
        }
        if !self.fortran {
            return Ok(self.data.clone());
        }
        let n = n as usize;
        let mut out = Vec::with_capacity(self.data.len());
        for i in 0..n {
            out.extend((0..k).map(|j| self.data[j * n + i]));
        }
        Ok(out)
    }
}

/// A float element as an integer, when it is integral.
fn float_to_int(x: f64) -> Option<i128> {
    (x.fract() == 0.0 && x.abs() < 9.0e15).then_some(x as i128)
}

pub(crate) fn read_array<T, R: Read + std::io::Seek>(
    zip: &mut zip::ZipArchive<R>,
    path: &Path,
    name: &str,
    conv: impl Fn(i128) -> Option<T>,
) -> Result<Array<T>> {
    let member = format!("{name}.npy");
    let mut file = zip
        .by_name(&member)
        .map_err(|e| DataError::dataset(path, format!("no array `{name}` ({member}): {e}")))?;
    let npy_err = |e: NpyError| DataError::dataset(path, format!("{member}: {e}"));
    let declared = file.size();
    let (h, count) = npy::read_checked_header(&mut file, declared).map_err(npy_err)?;
    let bad =
        |i: usize, what: String| DataError::dataset(path, format!("{member}: element {i}: {what}"));
    let read = npy::read_vec(&mut file, &h, count, |i, v| {
        let x = match v {
            Value::Int(x) => Some(x),
            Value::Float(f) => float_to_int(f),
        };
        let x = x.ok_or_else(|| bad(i, format!("{v} is not an integer")))?;
        conv(x).ok_or_else(|| bad(i, format!("{x} is out of range for {name}")))
    });
    let data = match read {
        Ok(data) => data,
        Err(PayloadError::Npy(e)) => return Err(npy_err(e)),
        Err(PayloadError::Value(e)) => return Err(e),
    };
    Ok(Array {
        data,
        shape: h.shape,
        fortran: h.fortran,
    })
}
