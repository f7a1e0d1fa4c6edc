//! `dlrmc data inspect`: what a dataset holds, per split, dense feature and table.

use crate::bags::Bags;
use crate::ds::{Dataset, Split};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::HashMap;
use std::fmt;

/// Statistics of one dense feature (after the dataset's transform).
#[derive(Clone, Debug, Serialize)]
pub struct DenseStats {
    /// `I1` ..
    pub name: String,
    /// Smallest value.
    pub min: f32,
    /// Mean.
    pub mean: f64,
    /// Largest value.
    pub max: f32,
    /// Share of samples whose value is 0 (missing or 0 in the raw data).
    pub zero_share: f64,
}

/// Statistics of one table's ids.
#[derive(Clone, Debug, Serialize)]
pub struct TableStats {
    /// `C1` ..
    pub name: String,
    /// Rows (from the manifest).
    pub rows: u64,
    /// Rows some sample uses.
    pub used: u64,
    /// The most frequent row.
    pub top_row: u32,
    /// Share of the table's ids on the most frequent row.
    pub top_share: f64,
    /// One id per sample, or a bag per sample.
    pub bags: Bags,
    /// The smallest bag (ids per sample).
    pub bag_min: u64,
    /// The mean bag.
    pub bag_mean: f64,
    /// The largest bag.
    pub bag_max: u64,
    /// The bag size of every sample, when fixed (1 for a one-hot table).
    pub hotness: Option<u64>,
}

/// The smallest, mean and largest bag of table `t`.
fn bag_sizes(ds: &Dataset, t: usize) -> (u64, f64, u64) {
    let Some(o) = ds.bag_offsets(t) else {
        return (1, 1.0, 1);
    };
    let (mut lo, mut hi) = (u64::MAX, 0);
    for w in o.windows(2) {
        let len = w[1].saturating_sub(w[0]);
        (lo, hi) = (lo.min(len), hi.max(len));
    }
    let n = o.len().saturating_sub(1).max(1);
    (lo.min(hi), ds.sparse(t).len() as f64 / n as f64, hi)
}

/// Everything `dlrmc data inspect` prints.
#[derive(Clone, Debug, Serialize)]
pub struct Inspection {
    /// The dataset directory.
    pub path: String,
    /// Samples.
    pub samples: u64,
    /// Samples per day (empty when the source has no days).
    pub days: Vec<u64>,
    /// The splits.
    pub splits: Vec<Split>,
    /// The dense transform applied at conversion.
    pub dense_transform: String,
    /// Share of positive labels, overall.
    pub positive_rate: f64,
    /// Share of positive labels per split.
    pub split_positive_rate: Vec<(String, f64)>,
    /// Per dense feature.
    pub dense: Vec<DenseStats>,
    /// Per table.
    pub tables: Vec<TableStats>,
    /// How the dataset was made (the manifest's `source`).
    pub source: serde_json::Value,
}

/// Reads the whole dataset once (tables in parallel) and summarises it.
pub fn inspect(ds: &Dataset) -> Inspection {
    let m = ds.manifest();
    let n = ds.len();
    let rate = |labels: &[u8]| {
        if labels.is_empty() {
            0.0
        } else {
            labels.iter().map(|&y| u64::from(y)).sum::<u64>() as f64 / labels.len() as f64
        }
    };
    let w = ds.dense_width();
    let dense = (0..w)
        .into_par_iter()
        .map(|j| {
            let (mut min, mut max, mut sum, mut zeros) =
                (f32::INFINITY, f32::NEG_INFINITY, 0f64, 0u64);
            for row in ds.dense().chunks_exact(w) {
                let x = row[j];
                min = min.min(x);
                max = max.max(x);
                sum += f64::from(x);
                zeros += u64::from(x == 0.0);
            }
            DenseStats {
                name: format!("I{}", j + 1),
                min,
                mean: sum / n as f64,
                max,
                zero_share: zeros as f64 / n as f64,
            }
        })
        .collect();
    let tables = m
        .tables
        .par_iter()
        .enumerate()
        .map(|(t, info)| {
            let ids = ds.sparse(t);
            let (used, top_row, top) = if info.rows <= 1 << 26 {
                let mut counts = vec![0u32; info.rows as usize];
                for &id in ids {
                    if let Some(c) = counts.get_mut(id as usize) {
                        *c = c.saturating_add(1);
                    }
                }
                let used = counts.iter().filter(|&&c| c > 0).count() as u64;
                let (top_row, top) = counts
                    .iter()
                    .enumerate()
                    .max_by_key(|&(i, &c)| (c, std::cmp::Reverse(i)))
                    .map_or((0, 0), |(i, &c)| (i as u32, u64::from(c)));
                (used, top_row, top)
            } else {
                let mut counts: HashMap<u32, u64> = HashMap::new();
                for &id in ids {
                    *counts.entry(id).or_default() += 1;
                }
                let (top_row, top) = counts
                    .iter()
                    .max_by_key(|&(&i, &c)| (c, std::cmp::Reverse(i)))
                    .map_or((0, 0), |(&i, &c)| (i, c));
                (counts.len() as u64, top_row, top)
            };
            let (bag_min, bag_mean, bag_max) = bag_sizes(ds, t);
            TableStats {
                name: info.name.clone(),
                rows: info.rows,
                used,
                top_row,
                top_share: top as f64 / ids.len().max(1) as f64,
                bags: info.bags,
                bag_min,
                bag_mean,
                bag_max,
                hotness: info.fixed_hotness(),
            }
        })
        .collect();
    Inspection {
        path: ds.path().display().to_string(),
        samples: m.samples,
        days: m.days.clone(),
        splits: m.splits.clone(),
        dense_transform: m.dense_transform.clone(),
        positive_rate: rate(ds.labels()),
        split_positive_rate: m
            .splits
            .iter()
            .map(|s| (s.name.clone(), rate(&ds.labels()[s.range()])))
            .collect(),
        dense,
        tables,
        source: m.source.clone(),
    }
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "dataset {}", self.path)?;
        writeln!(
            f,
            "samples {}  positives {:.2}%  dense transform {}",
            self.samples,
            100.0 * self.positive_rate,
            self.dense_transform
        )?;
        if let Some(format) = self.source.get("format").and_then(|v| v.as_str()) {
            write!(f, "source {format}")?;
            if let Some(files) = self.source.get("files").and_then(|v| v.as_array()) {
                write!(f, ", {} file(s)", files.len())?;
            }
            if let Some(kind) = self
                .source
                .pointer("/mapping/kind")
                .and_then(|v| v.as_str())
            {
                write!(f, ", ids by {kind}")?;
            }
            if let Some(skipped) = self.source.get("skipped").and_then(|v| v.as_object()) {
                let n: u64 = skipped.values().filter_map(|v| v.as_u64()).sum();
                if n > 0 {
                    write!(f, ", {n} bad lines skipped")?;
                }
            }
            writeln!(f)?;
        }
        if !self.days.is_empty() {
            let days: Vec<String> = self.days.iter().map(u64::to_string).collect();
            writeln!(f, "days {} ({})", self.days.len(), days.join(", "))?;
        }
        writeln!(f, "splits")?;
        for (s, (_, rate)) in self.splits.iter().zip(&self.split_positive_rate) {
            writeln!(
                f,
                "  {:<8} {:>12}..{:<12} {:>12} samples  positives {:.2}%",
                s.name,
                s.start,
                s.end,
                s.end - s.start,
                100.0 * rate
            )?;
        }
        writeln!(f, "dense features ({})", self.dense_transform)?;
        writeln!(
            f,
            "  {:<5} {:>10} {:>10} {:>10} {:>8}",
            "name", "min", "mean", "max", "zeros"
        )?;
        for d in &self.dense {
            writeln!(
                f,
                "  {:<5} {:>10.4} {:>10.4} {:>10.4} {:>7.1}%",
                d.name,
                d.min,
                d.mean,
                d.max,
                100.0 * d.zero_share
            )?;
        }
        writeln!(f, "tables")?;
        writeln!(
            f,
            "  {:<5} {:>12} {:>12} {:>10}  {:<10}{:>7} {:>6} {:>8} {:>6}",
            "name", "rows", "used", "top row", "bags", "hotness", "min", "mean", "max"
        )?;
        for t in &self.tables {
            let bags = match t.bags {
                Bags::OneHot => "one-hot",
                Bags::MultiHot => "multi-hot",
            };
            let hot = t
                .hotness
                .map_or_else(|| "varies".to_string(), |h| h.to_string());
            writeln!(
                f,
                "  {:<5} {:>12} {:>12} {:>9.2}%  {:<10}{:>7} {:>6} {:>8.2} {:>6}",
                t.name,
                t.rows,
                t.used,
                100.0 * t.top_share,
                bags,
                hot,
                t.bag_min,
                t.bag_mean,
                t.bag_max
            )?;
        }
        Ok(())
    }
}
