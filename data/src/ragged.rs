//! The ragged `.npz`: multi-hot bags per table, converted to a `.ds` dataset whose
//! tables are all multi-hot (`dlrmc data convert --format ragged-npz`).
//!
//! Each input file (a day, in order) holds, for `N` samples and tables `t = 0..T`
//! (`T` = the consecutive `X_cat_<t>_ids` arrays from 0 in the first file):
//!
//! | array | shape | meaning |
//! | --- | --- | --- |
//! | `y` | `[N]` or `[N, 1]` | label, 0 or 1 |
//! | `X_int` | `[N, D]` | integer dense features (stored as `ln(1 + max(x, 0))`, the reference's transform) |
//! | `X_cat_<t>_ids` | `[nnz_t]` | table `t`'s ids of every sample's bag, in sample order |
//! | `X_cat_<t>_lengths` | `[N]` | sample `i`'s bag holds `lengths[i]` ids, or |
//! | `X_cat_<t>_offsets` | `[N + 1]` | sample `i`'s bag is `ids[offsets[i]..offsets[i+1]]` (0 first, non-decreasing, `nnz_t` last) |
//! | `counts` | `[T]` (optional) | rows per table (else the largest id + 1) |
//!
//! Ids are rows already (with `--max-ind-range`, taken modulo it), as in the
//! reference's processed `.npz`. Every array's shape is checked against `N` and
//! every offset before anything is written; errors name the file, the array and the
//! position.

use crate::bags::Bags;
use crate::convert::{ConvertOptions, ConvertReport, Progress};
use crate::criteo::{log1p_clamped, sparse_name};
use crate::ds::{DatasetMeta, DatasetWriter, TableInfo};
use crate::error::{DataError, Result};
use crate::npy::open_npz;
use crate::processed::read_array;
use crate::split::SplitSpec;
use crate::vocab::IdMapping;
use std::path::Path;

/// One file's samples.
pub(crate) struct Day {
    pub(crate) labels: Vec<u8>,
    pub(crate) dense: Vec<f32>,
    /// Per table: its ids and each sample's bag end.
    pub(crate) bags: Vec<(Vec<u32>, Vec<u64>)>,
    /// Rows per table, when the file says.
    pub(crate) counts: Option<Vec<u64>>,
}

/// Table `t`'s bag ends (exclusive, `n` of them) from its lengths or offsets.
fn bag_ends(
    zip: &mut zip::ZipArchive<std::io::BufReader<std::fs::File>>,
    path: &Path,
    t: usize,
    n: u64,
    nnz: u64,
) -> Result<Vec<u64>> {
    let bad = |reason: String| DataError::dataset(path, reason);
    let conv = |x: i128| u64::try_from(x).ok();
    let (lengths, offsets) = (format!("X_cat_{t}_lengths"), format!("X_cat_{t}_offsets"));
    let ends = if zip.by_name(&format!("{lengths}.npy")).is_ok() {
        let a = read_array(zip, path, &lengths, conv)?;
        if a.shape != [n] {
            return Err(bad(format!(
                "{lengths} has shape {:?}, expected ({n},)",
                a.shape
            )));
        }
        let mut end = 0u64;
        a.data
            .iter()
            .map(|&l| {
                end = end.saturating_add(l);
                end
            })
            .collect()
    } else {
        let a = read_array(zip, path, &offsets, conv)?;
        if a.shape != [n + 1] {
            return Err(bad(format!(
                "{offsets} has shape {:?}, expected ({},)",
                a.shape,
                n + 1
            )));
        }
        if a.data[0] != 0 {
            return Err(bad(format!("{offsets}: element 0 is {}, not 0", a.data[0])));
        }
        if let Some(i) = a.data.windows(2).position(|w| w[1] < w[0]) {
            return Err(bad(format!(
                "{offsets}: element {} ({}) is below element {i} ({})",
                i + 1,
                a.data[i + 1],
                a.data[i]
            )));
        }
        a.data[1..].to_vec()
    };
    match ends.last() {
        Some(&last) if last != nnz => Err(bad(format!(
            "table {t}: the bags hold {last} ids, X_cat_{t}_ids has {nnz}"
        ))),
        _ => Ok(ends),
    }
}

/// Reads one file (of `tables` tables, `None`: as many as it has).
fn read_day(path: &Path, tables: Option<usize>, modulo: Option<u32>) -> Result<Day> {
    let mut zip = open_npz(path).map_err(|e| DataError::dataset(path, e.to_string()))?;
    let y = read_array(&mut zip, path, "y", |x| {
        u8::try_from(x).ok().filter(|&v| v <= 1)
    })?;
    let n = y.data.len() as u64;
    if y.shape != [n] && y.shape != [n, 1] {
        return Err(DataError::dataset(
            path,
            format!("y has shape {:?}, expected (N,)", y.shape),
        ));
    }
    let x = read_array(&mut zip, path, "X_int", |x| i64::try_from(x).ok())?;
    let width = match x.shape[..] {
        [rows, d] if rows == n => d as usize,
        _ => {
            return Err(DataError::dataset(
                path,
                format!("X_int has shape {:?}, expected ({n}, D)", x.shape),
            ));
        }
    };
    let dense = x.sample_major(path, "X_int", n, width)?;
    let tables = match tables {
        Some(t) => t,
        None => (0..)
            .take_while(|t| zip.by_name(&format!("X_cat_{t}_ids.npy")).is_ok())
            .count(),
    };
    let mut bags = Vec::with_capacity(tables);
    for t in 0..tables {
        let name = format!("X_cat_{t}_ids");
        let ids = read_array(&mut zip, path, &name, |x| u32::try_from(x).ok())?;
        if ids.shape.len() != 1 {
            return Err(DataError::dataset(
                path,
                format!("{name} has shape {:?}, expected (nnz,)", ids.shape),
            ));
        }
        let ends = bag_ends(&mut zip, path, t, n, ids.data.len() as u64)?;
        let ids = match modulo {
            Some(m) => ids.data.iter().map(|&id| id % m).collect(),
            None => ids.data,
        };
        bags.push((ids, ends));
    }
    let counts = if zip.by_name("counts.npy").is_ok() {
        Some(read_array(&mut zip, path, "counts", |x| u64::try_from(x).ok())?.data)
    } else {
        None
    };
    Ok(Day {
        labels: y.data,
        dense: dense.into_iter().map(log1p_clamped).collect(),
        bags,
        counts,
    })
}

/// Converts ragged `.npz` files (see the module docs).
pub(crate) fn convert_ragged(
    opts: &ConvertOptions,
    mapping: IdMapping,
    progress: &mut dyn FnMut(&Progress),
) -> Result<ConvertReport> {
    convert_days(opts, mapping, progress, ("log1p", &read_day))
}

/// Reads one input file (of `tables` tables, `None`: as many as the first has), ids
/// taken modulo the option.
pub(crate) type ReadDay<'a> = &'a dyn Fn(&Path, Option<usize>, Option<u32>) -> Result<Day>;

/// Converts `opts.inputs`, a day each read by `read`, into a dataset of multi-hot
/// tables whose dense values went through `transform` (the manifest's
/// `dense_transform`).
pub(crate) fn convert_days(
    opts: &ConvertOptions,
    mapping: IdMapping,
    progress: &mut dyn FnMut(&Progress),
    (transform, read): (&str, ReadDay<'_>),
) -> Result<ConvertReport> {
    let modulo = mapping.modulo();
    let total_bytes: u64 = opts
        .inputs
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum();
    let mut writer: Option<(DatasetWriter, usize, usize)> = None;
    let (mut per_file, mut max_id, mut counts) = (Vec::new(), Vec::new(), None::<Vec<u64>>);
    for path in &opts.inputs {
        let day = read(path, writer.as_ref().map(|w| w.2), modulo)?;
        let (w, width, tables) = match &mut writer {
            Some(w) => w,
            None => {
                let t = day.bags.len();
                if t == 0 {
                    return Err(DataError::dataset(
                        path,
                        "no table (no ids array of table 0)",
                    ));
                }
                let width = day.dense.len() / day.labels.len().max(1);
                max_id = vec![0u32; t];
                writer.insert((
                    DatasetWriter::create_bags(&opts.output, width, &vec![Bags::MultiHot; t])?,
                    width,
                    t,
                ))
            }
        };
        if day.dense.len() != day.labels.len() * *width {
            return Err(DataError::dataset(
                path,
                format!("the dense features are not {width} wide like the first file's"),
            ));
        }
        for (m, (ids, _)) in max_id.iter_mut().zip(&day.bags) {
            *m = ids.iter().copied().fold(*m, u32::max);
        }
        if let Some(c) = day.counts {
            if c.len() != *tables {
                return Err(DataError::dataset(
                    path,
                    format!("counts has {} entries for {tables} tables", c.len()),
                ));
            }
            counts = Some(match counts {
                Some(p) => p.iter().zip(&c).map(|(a, b)| *a.max(b)).collect(),
                None => c,
            });
        }
        let cols: Vec<(&[u32], &[u64])> = day.bags.iter().map(|(i, e)| (&i[..], &e[..])).collect();
        w.push_bag_columns(&day.labels, &day.dense, &cols)?;
        per_file.push(day.labels.len() as u64);
        progress(&Progress {
            rows: w.samples(),
            bytes: total_bytes,
            total_bytes,
            mapping: false,
        });
    }
    let Some((writer, _, _)) = writer else {
        return Err(DataError::Usage("no input files".into()));
    };
    let mut tables = Vec::new();
    for (t, &m) in max_id.iter().enumerate() {
        let seen = u64::from(m) + 1;
        let rows = match &counts {
            Some(c) if c[t] < seen => {
                return Err(DataError::Usage(format!(
                    "table {t} ({}) has id {m} but `counts` says {} rows",
                    sparse_name(t),
                    c[t]
                )));
            }
            Some(c) => c[t],
            None => seen,
        };
        tables.push(TableInfo::new(sparse_name(t), rows));
    }
    let split = opts
        .split
        .clone()
        .unwrap_or_else(|| SplitSpec::default_for(opts.inputs.len()));
    let (splits, days) = split.plan(&per_file)?;
    let lines = per_file.iter().sum();
    let manifest = writer.finish(DatasetMeta {
        dense_transform: transform.into(),
        tables,
        splits,
        days,
        source: serde_json::json!({
            "format": opts.format.name(),
            "files": opts.inputs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "mapping": mapping.describe(),
            "split": split.describe(),
        }),
    })?;
    Ok(ConvertReport {
        manifest,
        lines,
        skipped: Default::default(),
        first_skipped: None,
    })
}
