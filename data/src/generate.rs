//! `dlrmc data generate`: synthetic Criteo-format TSV with the data's character, for
//! tests and examples (nothing downloads data).
//!
//! - 40 fields: label, 13 integers, 26 categoricals as 8 lower-case hex digits.
//! - Missing values at about Criteo Kaggle's per-column rates (`I12` ~77% missing,
//!   `I1`/`I10` ~45%, `C19`/`C20`/`C25`/`C26` ~44%, `C22` ~76%, ...).
//! - Heavy-tailed integers: `floor(exp(N(mu, sigma))) - 1` per column (log-normal
//!   counts with many zeros), and a few negatives in `I2` as in Criteo.
//! - Power-law ids: a Zipf-like rank over each table's cardinality
//!   ([`KAGGLE_CARDINALITIES`] times `cardinality_scale`, tables of 100 rows or
//!   less kept whole), printed as a per-table 32-bit hash of the rank. The head of each
//!   table is stable; the tail drifts from day to day, so later days bring new ids.
//! - Labels from a hidden logistic model: a few dense features plus a per-id random
//!   effect in 10 tables, its intercept calibrated to ~25% positives (Criteo's
//!   rate), so a DLRM can learn it (well above 0.5 AUC).
//!
//! The output depends only on the options (rows are generated in fixed chunks, each
//! from its own seed, in parallel, written in order).

use crate::criteo::{DENSE, SPARSE};
use crate::error::{DataError, Result};
use rayon::prelude::*;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Criteo Kaggle's per-table cardinalities (the reference's preprocessed data).
pub const KAGGLE_CARDINALITIES: [u64; SPARSE] = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
    5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
];
const MISSING_I: [f64; DENSE] = [
    0.45, 0.0, 0.21, 0.22, 0.026, 0.22, 0.043, 0.0005, 0.043, 0.45, 0.043, 0.77, 0.22,
];
const MISSING_C: [f64; SPARSE] = [
    0.0, 0.0, 0.034, 0.034, 0.0, 0.12, 0.0, 0.0, 0.0, 0.0, 0.0, 0.034, 0.0, 0.0, 0.0, 0.034, 0.0,
    0.0, 0.44, 0.44, 0.034, 0.76, 0.0, 0.034, 0.44, 0.44,
];
/// Log-normal parameters of `1 + x` per integer column: ln(median), sigma.
const INT_MU: [f64; DENSE] = [
    0.7, 1.4, 2.1, 1.6, 7.3, 3.4, 1.4, 2.2, 3.7, 0.4, 0.9, 0.4, 1.6,
];
const INT_SIGMA: [f64; DENSE] = [
    1.2, 1.8, 1.5, 1.0, 1.8, 1.6, 1.5, 1.0, 1.4, 0.7, 1.0, 1.0, 1.2,
];
/// The hidden model: weights on `ln(1 + x)` of the integer columns.
const DENSE_W: [f64; DENSE] = [
    0.35, 0.0, -0.1, 0.0, -0.05, 0.0, 0.25, 0.0, 0.0, 0.3, 0.25, 0.0, -0.15,
];
/// Per-id effect scale per table (0: the table does not matter).
const EFFECT: [f64; SPARSE] = [
    0.0, 0.5, 0.6, 0.0, 0.0, 0.4, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.6, 0.5, 0.0, 0.3, 0.0, 0.4,
    0.0, 0.0, 0.0, 0.5, 0.4, 0.0, 0.0,
];
const ZIPF_S: f64 = 1.1;
const CHUNK: u64 = 1 << 14;

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Samples in all.
    pub rows: u64,
    /// Days the samples span (in order; the tail of the id distribution drifts by day).
    pub days: u32,
    /// The seed: the output is a function of the options.
    pub seed: u64,
    /// Factor on the Kaggle cardinalities (tables of 100 rows or less are kept whole).
    pub cardinality_scale: f64,
    /// Write gzip.
    pub gzip: bool,
    /// One file per day (`day_0` .. in the `output` directory, Terabyte style)
    /// instead of one file (`output`, Kaggle style).
    pub split_files: bool,
    /// The output file, or directory with `split_files`.
    pub output: PathBuf,
}

/// What was written.
#[derive(Clone, Debug)]
pub struct GenerateReport {
    /// The files, in day order.
    pub files: Vec<PathBuf>,
    /// Samples written.
    pub rows: u64,
    /// Share of positive labels.
    pub positive_rate: f64,
    /// The cardinalities used.
    pub cardinalities: Vec<u64>,
}

/// SplitMix64: a small, fast, well-mixed generator.
#[derive(Clone)]
struct Rng(u64);

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }
    /// Uniform in (0, 1).
    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// A standard normal from a hash (the per-id effects).
fn hashed_normal(h: u64) -> f64 {
    let mut r = Rng(h);
    r.normal()
}

/// The model: cardinalities, seeds, intercept.
struct Model {
    seed: u64,
    card: [u64; SPARSE],
    days: u64,
    intercept: f64,
}

struct Row {
    label: bool,
    ints: [Option<i64>; DENSE],
    ids: [Option<u32>; SPARSE],
}

impl Model {
    /// The rank (0 = most frequent) of a Zipf-like draw over `c` rows.
    fn rank(c: u64, u: f64) -> u64 {
        let a = (c as f64).powf(1.0 - ZIPF_S) - 1.0;
        let x = (a * u + 1.0).powf(1.0 / (1.0 - ZIPF_S));
        (x as u64).saturating_sub(1).min(c - 1)
    }

    /// A row of day `day`, and its logit without the intercept.
    fn row(&self, rng: &mut Rng, day: u64) -> (Row, f64) {
        let mut logit = 0.0;
        let mut ints = [None; DENSE];
        for (j, v) in ints.iter_mut().enumerate() {
            if rng.uniform() < MISSING_I[j] {
                continue;
            }
            let x = ((INT_MU[j] + INT_SIGMA[j] * rng.normal()).exp().floor() as i64 - 1).max(0);
            let x = if j == 1 && rng.uniform() < 0.04 {
                -1 - (rng.next() % 3) as i64
            } else {
                x
            };
            logit += DENSE_W[j] * (x.max(0) as f64).ln_1p();
            *v = Some(x);
        }
        let mut ids = [None; SPARSE];
        for (t, v) in ids.iter_mut().enumerate() {
            let c = self.card[t];
            let mut r = Self::rank(c, rng.uniform());
            if r >= 100 && c > 1000 {
                r = (r + day * (c / 50)) % c;
            }
            if EFFECT[t] > 0.0 {
                logit +=
                    EFFECT[t] * hashed_normal(mix(self.seed ^ 0x5eed ^ ((t as u64) << 40) ^ r));
            }
            if rng.uniform() < MISSING_C[t] {
                continue;
            }
            *v = Some(mix(self.seed ^ ((t as u64 + 1) << 48) ^ r) as u32);
        }
        let row = Row {
            label: false,
            ints,
            ids,
        };
        (row, logit)
    }

    fn chunk(&self, rows: u64, index: u64, out: &mut Vec<u8>) -> u64 {
        let mut rng = Rng(mix(self.seed ^ mix(index + 1)));
        let start = index * CHUNK;
        let end = (start + CHUNK).min(rows);
        let mut positives = 0;
        for i in start..end {
            let day = i * self.days / rows;
            let (mut row, logit) = self.row(&mut rng, day);
            row.label = rng.uniform() < sigmoid(logit + self.intercept);
            positives += u64::from(row.label);
            write_row(&row, out);
        }
        positives
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn write_row(row: &Row, out: &mut Vec<u8>) {
    out.push(if row.label { b'1' } else { b'0' });
    for v in &row.ints {
        out.push(b'\t');
        if let Some(x) = v {
            let _ = write!(out, "{x}");
        }
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for v in &row.ids {
        out.push(b'\t');
        if let Some(id) = v {
            for k in (0..8).rev() {
                out.push(HEX[((id >> (4 * k)) & 0xf) as usize]);
            }
        }
    }
    out.push(b'\n');
}

/// The cardinalities for a scale: Kaggle's times `scale`, at least 1, tables of 100
/// rows or less kept whole.
pub fn cardinalities(scale: f64) -> [u64; SPARSE] {
    KAGGLE_CARDINALITIES.map(|c| ((c as f64 * scale).round() as u64).max(c.min(100)).max(1))
}

/// Writes the data; `progress` gets the rows written so far.
pub fn generate(opts: &GenerateOptions, progress: &mut dyn FnMut(u64)) -> Result<GenerateReport> {
    if opts.rows == 0 || opts.days == 0 {
        return Err(DataError::Usage(
            "--rows and --days must be positive".into(),
        ));
    }
    if !(opts.cardinality_scale > 0.0 && opts.cardinality_scale <= 1.0) {
        return Err(DataError::Usage(format!(
            "--cardinality-scale {} must be in (0, 1]",
            opts.cardinality_scale
        )));
    }
    let mut model = Model {
        seed: mix(opts.seed),
        card: cardinalities(opts.cardinality_scale),
        days: u64::from(opts.days),
        intercept: 0.0,
    };
    // Calibrate the intercept to 25% positives on a sample from its own stream.
    let mut rng = Rng(mix(model.seed ^ 0xca11b));
    let logits: Vec<f64> = (0..8192)
        .map(|i| model.row(&mut rng, i % model.days).1)
        .collect();
    let (mut lo, mut hi) = (-20.0, 20.0);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        let p = logits.iter().map(|&l| sigmoid(l + mid)).sum::<f64>() / logits.len() as f64;
        if p > 0.25 {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    model.intercept = 0.5 * (lo + hi);

    let days = u64::from(opts.days);
    let bounds: Vec<(u64, u64)> = if opts.split_files {
        (0..days)
            .map(|d| (d * opts.rows / days, (d + 1) * opts.rows / days))
            .collect()
    } else {
        vec![(0, opts.rows)]
    };
    if opts.split_files {
        std::fs::create_dir_all(&opts.output).map_err(|e| DataError::io(&opts.output, e))?;
    }
    let chunks = opts.rows.div_ceil(CHUNK);
    let mut files = Vec::new();
    let mut positives = 0u64;
    let mut next_chunk = 0u64;
    let mut pending: Vec<u8> = Vec::new();
    for (d, &(start, end)) in bounds.iter().enumerate() {
        let path = if opts.split_files {
            let name = format!("day_{d}{}", if opts.gzip { ".gz" } else { "" });
            opts.output.join(name)
        } else {
            opts.output.clone()
        };
        let mut out = Output::create(&path, opts.gzip)?;
        // Rows [start, end): the pending tail of a chunk, then whole chunks, in
        // parallel groups, cut at the day boundary.
        let mut written = start;
        while written < end {
            if pending.is_empty() {
                let group: Vec<u64> = (next_chunk..(next_chunk + 16).min(chunks)).collect();
                next_chunk += group.len() as u64;
                let parts: Vec<(Vec<u8>, u64)> = group
                    .par_iter()
                    .map(|&c| {
                        let mut buf = Vec::with_capacity(CHUNK as usize * 200);
                        let p = model.chunk(opts.rows, c, &mut buf);
                        (buf, p)
                    })
                    .collect();
                for (buf, p) in parts {
                    pending.extend_from_slice(&buf);
                    positives += p;
                }
            }
            // Lines in `pending` up to the day's end.
            let mut cut = 0;
            let mut n = 0;
            for (i, &b) in pending.iter().enumerate() {
                if b == b'\n' {
                    n += 1;
                    cut = i + 1;
                    if written + n == end {
                        break;
                    }
                }
            }
            out.write(&pending[..cut])?;
            pending.drain(..cut);
            written += n;
            progress(written);
        }
        out.finish()?;
        files.push(path);
    }
    Ok(GenerateReport {
        files,
        rows: opts.rows,
        positive_rate: positives as f64 / opts.rows as f64,
        cardinalities: model.card.to_vec(),
    })
}

/// A file written under a temporary name beside the target and renamed into place
/// when complete; removed if dropped unfinished.
struct Output {
    path: PathBuf,
    tmp: PathBuf,
    done: bool,
    gz: Option<flate2::write::GzEncoder<std::io::BufWriter<std::fs::File>>>,
    plain: Option<std::io::BufWriter<std::fs::File>>,
}

impl Output {
    fn create(path: &Path, gzip: bool) -> Result<Output> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "data".into());
        let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
        let f = std::fs::File::create(&tmp).map_err(|e| DataError::io(&tmp, e))?;
        let w = std::io::BufWriter::with_capacity(1 << 20, f);
        let (gz, plain) = if gzip {
            (
                Some(flate2::write::GzEncoder::new(
                    w,
                    flate2::Compression::fast(),
                )),
                None,
            )
        } else {
            (None, Some(w))
        };
        Ok(Output {
            path: path.to_path_buf(),
            tmp,
            done: false,
            gz,
            plain,
        })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let r = match (&mut self.gz, &mut self.plain) {
            (Some(g), _) => g.write_all(bytes),
            (_, Some(p)) => p.write_all(bytes),
            _ => Ok(()),
        };
        r.map_err(|e| DataError::io(&self.tmp, e))
    }

    fn finish(mut self) -> Result<()> {
        let tmp = self.tmp.clone();
        let io = |e| DataError::io(&tmp, e);
        let w = match (self.gz.take(), self.plain.take()) {
            (Some(g), _) => Some(g.finish().map_err(io)?),
            (_, Some(p)) => Some(p),
            _ => None,
        };
        if let Some(mut w) = w {
            w.flush().map_err(io)?;
            w.get_ref().sync_all().map_err(io)?;
        }
        std::fs::rename(&self.tmp, &self.path).map_err(|e| DataError::io(&self.path, e))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
