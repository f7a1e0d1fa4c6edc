//! Small learnable datasets written straight to `.ds`, for tests and benches that
//! need a dataset of a given schema without going through Criteo's text format
//! ([`crate::generate()`] writes Criteo TSV with the real data's character).
//!
//! Sample `i` has dense values in `[0, 1)` and uniform ids, each a hash of `i`, and
//! the label `4 (d0 - 1/2) ± 1.5 > 0` (plus when table 0's id is even), so a model
//! learns it from dense column 0 and table 0 alone (well above 0.5 AUC). Splits:
//! the first 80% `train`, then `val` and `test` of 10% each; one day.
//! [`write_learnable_bags`] gives table `t` bags of sizes drawn from a
//! [`BagSizes`] (multi-hot tables where it is not 1); the first id of a bag is the
//! one-hot dataset's id, and the label follows table 0's first id (an empty bag
//! counts as odd).

use crate::bags::{BagSizes, Bags};
use crate::ds::{DatasetMeta, DatasetWriter, Manifest, Split, TableInfo};
use crate::error::{DataError, Result};
use std::path::Path;

/// The schema of a learnable dataset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Learnable {
    /// Samples in all.
    pub samples: u64,
    /// Dense width (at least 1: the label depends on dense column 0).
    pub dense: usize,
    /// Rows of each table (at least one table: the label depends on table 0).
    pub rows: Vec<u64>,
    /// Recorded as the manifest's `source.generator` (who wrote it).
    pub generator: String,
}

/// SplitMix64's finaliser of `z + golden`: the sample hashes.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The pooling of `tables` tables from `spec`: one bag size for all (`3`, `1-100`)
/// or a comma-separated list of one per table (`3,2,1-10`).
pub fn parse_pooling(spec: &str, tables: usize) -> Result<Vec<BagSizes>> {
    let sizes = BagSizes::parse_list(spec)
        .map_err(|e| DataError::Usage(format!("pooling `{spec}`: {e}")))?;
    match sizes.len() {
        1 => Ok(vec![sizes[0]; tables]),
        n if n == tables => Ok(sizes),
        n => Err(DataError::Usage(format!(
            "pooling `{spec}` lists {n} bag sizes for {tables} tables (give one, or one per table)"
        ))),
    }
}

/// Writes the dataset `spec` describes at `path` (atomically, as every
/// [`DatasetWriter`]), one id per sample and table.
pub fn write_learnable(path: &Path, spec: &Learnable) -> Result<Manifest> {
    write_learnable_bags(path, spec, &vec![BagSizes::Fixed(1); spec.rows.len()])
}

/// Writes the dataset `spec` describes with table `t`'s bags of `pooling[t]` ids
/// (multi-hot tables where a size is not 1); the label follows the first id of
/// table 0's bag.
pub fn write_learnable_bags(
    path: &Path,
    spec: &Learnable,
    pooling: &[BagSizes],
) -> Result<Manifest> {
    if spec.dense == 0 || spec.rows.is_empty() || spec.rows.contains(&0) {
        return Err(DataError::Usage(format!(
            "a learnable dataset needs a dense column and non-empty tables (dense {}, rows {:?})",
            spec.dense, spec.rows
        )));
    }
    if let Some(&r) = spec.rows.iter().find(|&&r| r > u64::from(u32::MAX) + 1) {
        return Err(DataError::Usage(format!(
            "a table of {r} rows does not fit u32 ids"
        )));
    }
    if pooling.len() != spec.rows.len() {
        return Err(DataError::Usage(format!(
            "{} bag sizes for {} tables",
            pooling.len(),
            spec.rows.len()
        )));
    }
    let n = spec.samples;
    let kinds: Vec<Bags> = pooling
        .iter()
        .map(|&p| {
            if p == BagSizes::Fixed(1) {
                Bags::OneHot
            } else {
                Bags::MultiHot
            }
        })
        .collect();
    let mut w = DatasetWriter::create_bags(path, spec.dense, &kinds)?;
    let mut dense = vec![0f32; spec.dense];
    let mut bags: Vec<Vec<u32>> = vec![Vec::new(); spec.rows.len()];
    for i in 0..n {
        for (j, d) in dense.iter_mut().enumerate() {
            *d = (mix(i * 31 + j as u64) % 1000) as f32 / 1000.0;
        }
        for (t, (bag, &r)) in bags.iter_mut().zip(&spec.rows).enumerate() {
            let len = pooling[t].pick(mix(i * 13 + t as u64 + 5000)) as u64;
            bag.clear();
            // r <= 2^32 (checked above), so every id fits u32; bag k > 0 of a
            // sample hashes its own stream, so bag 0 is the one-hot id.
            bag.extend((0..len).map(|k| {
                let h = if k == 0 { i * 7 } else { mix(i) ^ (k << 40) };
                (mix(h + t as u64 + 1000) % r) as u32
            }));
        }
        let logit = 4.0 * (dense[0] - 0.5)
            + if bags[0].first().is_some_and(|id| id.is_multiple_of(2)) {
                1.5
            } else {
                -1.5
            };
        let refs: Vec<&[u32]> = bags.iter().map(Vec::as_slice).collect();
        w.push_bags(u8::from(logit > 0.0), &dense, &refs)?;
    }
    let (a, b) = (n * 8 / 10, n * 9 / 10);
    let split = |name: &str, start, end| Split {
        name: name.into(),
        start,
        end,
    };
    w.finish(DatasetMeta {
        dense_transform: "none".into(),
        tables: spec
            .rows
            .iter()
            .enumerate()
            .map(|(t, &rows)| TableInfo::new(format!("C{}", t + 1), rows))
            .collect(),
        splits: vec![
            split("train", 0, a),
            split("val", a, b),
            split("test", b, n),
        ],
        days: vec![n],
        source: serde_json::json!({ "generator": spec.generator }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dataset;

    #[test]
    fn the_label_follows_the_rule_and_the_splits_cover_the_samples() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("l.ds");
        let spec = Learnable {
            samples: 1000,
            dense: 3,
            rows: vec![10, 5],
            generator: "unit test".into(),
        };
        let m = write_learnable(&path, &spec).expect("write");
        assert_eq!(m.samples, 1000);
        let ds = Dataset::open(&path).expect("open");
        let names: Vec<_> = ds
            .manifest()
            .splits
            .iter()
            .map(|s| s.name.clone())
            .collect();
        assert_eq!(names, ["train", "val", "test"]);
        let positives = (0..1000u64)
            .filter(|&i| {
                let d0 = (mix(i * 31) % 1000) as f32 / 1000.0;
                let id0 = mix(i * 7 + 1000) % 10;
                4.0 * (d0 - 0.5) + if id0.is_multiple_of(2) { 1.5 } else { -1.5 } > 0.0
            })
            .count();
        let labels: usize = ds.labels().iter().map(|&l| usize::from(l)).sum();
        assert_eq!(labels, positives);
        assert!((300..700).contains(&labels), "{labels} positives of 1000");
    }

    #[test]
    fn an_empty_table_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let spec = Learnable {
            samples: 10,
            dense: 1,
            rows: vec![0],
            generator: String::new(),
        };
        let e = write_learnable(&dir.path().join("x.ds"), &spec).expect_err("refused");
        assert!(e.to_string().contains("non-empty tables"), "{e}");
    }
}
