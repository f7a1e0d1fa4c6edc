//! `dlrmc data convert`: raw or preprocessed Criteo data to a `.ds` dataset.
//!
//! The conversion streams: input is read in batches of lines (or records), parsed in
//! parallel, and appended to a [`DatasetWriter`]; in vocabulary mode the ids are
//! counted as they pass and each table's column is rewritten through its vocabulary
//! at the end. Memory is the batch plus the vocabularies (about 16 bytes per distinct
//! id), never the data. The writer is atomic: an error anywhere (a bad line without
//! `--skip-bad-lines`, a truncated gzip stream, a full disk) drops the temporary
//! directory and leaves an existing dataset at the target untouched.
//!
//! The result does not depend on the thread count: parsing keeps line order and the
//! vocabularies are counted per table in sample order.

use crate::criteo::{self, DENSE, LineBatch, RawSample, SPARSE, TsvReader};
use crate::ds::{DatasetMeta, DatasetWriter, Manifest, TableInfo};
use crate::error::{DataError, Result};
use crate::processed;
use crate::split::SplitSpec;
use crate::vocab::{IdMapping, VocabCounter};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Lines per parsing batch.
const BATCH: usize = 1 << 16;

/// An input format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Criteo's raw TSV (Kaggle `train.txt`, Terabyte `day_N[.gz]`).
    CriteoTsv,
    /// The reference DLRM's processed `.npz` (`X_int`, `X_cat`, `y`, `counts`).
    ReferenceNpz,
    /// MLPerf's binary records: 40 little-endian int32 per sample.
    MlperfBin,
    /// Multi-hot bags per table in `.npz` files ([`crate::ragged`]).
    RaggedNpz,
    /// MLPerf DLRM-DCNv2's per-day multi-hot arrays ([`crate::mlperf_multihot`]).
    MlperfMultiHot,
}

impl Format {
    /// The format's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Format::CriteoTsv => "criteo-tsv",
            Format::ReferenceNpz => "reference-npz",
            Format::MlperfBin => "mlperf-bin",
            Format::RaggedNpz => "ragged-npz",
            Format::MlperfMultiHot => "mlperf-multihot",
        }
    }
}

impl FromStr for Format {
    type Err = DataError;
    fn from_str(s: &str) -> Result<Format> {
        [
            Format::CriteoTsv,
            Format::ReferenceNpz,
            Format::MlperfBin,
            Format::RaggedNpz,
            Format::MlperfMultiHot,
        ]
        .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                DataError::Usage(format!(
                    "unknown format `{s}` (expected criteo-tsv, reference-npz, mlperf-bin, ragged-npz or mlperf-multihot)"
                ))
            })
    }
}

/// What to convert, how, and where to.
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    /// The input format.
    pub format: Format,
    /// The input files, in order (Terabyte: one per day).
    pub inputs: Vec<PathBuf>,
    /// The dataset directory to write (replaced atomically if it is a dataset).
    pub output: PathBuf,
    /// How raw ids become rows (preprocessed formats take their ids as they are,
    /// with the optional modulo).
    pub mapping: IdMapping,
    /// The splits (default: `kaggle` for one file, `terabyte` for several).
    pub split: Option<SplitSpec>,
    /// Count and skip bad lines instead of stopping at the first.
    pub skip_bad_lines: bool,
}

/// Where the conversion is, for a progress display.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Samples written so far.
    pub rows: u64,
    /// Input bytes read so far (compressed bytes for gzip).
    pub bytes: u64,
    /// Input bytes in all (the files' sizes).
    pub total_bytes: u64,
    /// `true` once reading is done and the vocabularies are being applied.
    pub mapping: bool,
}

/// What a conversion did.
#[derive(Clone, Debug)]
pub struct ConvertReport {
    /// The written dataset's manifest.
    pub manifest: Manifest,
    /// Lines (or records) read.
    pub lines: u64,
    /// Bad lines skipped, by reason (`field-count`, `label`, `integer`,
    /// `categorical`).
    pub skipped: BTreeMap<String, u64>,
    /// The first skipped line's error, if any.
    pub first_skipped: Option<String>,
}

/// Samples into the writer, ids counted or hashed on the way.
struct Sink {
    writer: DatasetWriter,
    mapping: IdMapping,
    counter: Option<VocabCounter>,
    max_id: [u32; SPARSE],
    skipped: BTreeMap<String, u64>,
    first_skipped: Option<String>,
    skip: bool,
}

/// Where the readers put samples and report bad lines.
pub(crate) trait SampleSink {
    /// Appends good samples, in order.
    fn push_batch(&mut self, batch: &[RawSample]) -> Result<()>;
    /// A bad line or record of kind `kind`: the error, or counted when skipping.
    fn bad(&mut self, kind: &str, err: DataError) -> Result<()>;
    /// Samples written so far.
    fn samples(&self) -> u64;
}

impl SampleSink for Sink {
    fn samples(&self) -> u64 {
        self.writer.samples()
    }

    fn push_batch(&mut self, batch: &[RawSample]) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let mapping = self.mapping;
        let labels: Vec<u8> = batch.iter().map(|s| s.label).collect();
        let mut dense = vec![0f32; batch.len() * DENSE];
        dense
            .par_chunks_mut(DENSE * 1024)
            .zip(batch.par_chunks(1024))
            .for_each(|(out, samples)| {
                for (o, s) in out.chunks_exact_mut(DENSE).zip(samples) {
                    for (d, &x) in o.iter_mut().zip(&s.dense) {
                        *d = criteo::log1p_clamped(x);
                    }
                }
            });
        let cols: Vec<Vec<u32>> = (0..SPARSE)
            .into_par_iter()
            .map(|t| batch.iter().map(|s| mapping.pre(s.sparse[t])).collect())
            .collect();
        if let Some(c) = &mut self.counter {
            c.observe_columns(&cols);
        }
        for (m, col) in self.max_id.iter_mut().zip(&cols) {
            *m = col.iter().copied().fold(*m, u32::max);
        }
        self.writer.push_columns(&labels, &dense, &cols)
    }

    fn bad(&mut self, kind: &str, err: DataError) -> Result<()> {
        if !self.skip {
            return Err(err);
        }
        *self.skipped.entry(kind.to_string()).or_default() += 1;
        if self.first_skipped.is_none() {
            self.first_skipped = Some(err.to_string());
        }
        Ok(())
    }
}

/// Converts `opts.inputs` into a dataset at `opts.output`, calling `progress` after
/// every batch.
pub fn convert(
    opts: &ConvertOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<ConvertReport> {
    if opts.inputs.is_empty() {
        return Err(DataError::Usage("no input files".into()));
    }
    let mapping = match (opts.format, opts.mapping) {
        (Format::CriteoTsv, m) => m,
        (_, IdMapping::Vocabulary { min_count, .. }) if min_count > 1 => {
            return Err(DataError::Usage(format!(
                "--min-count applies to raw ids; {} data is already mapped",
                opts.format.name()
            )));
        }
        (_, m) => IdMapping::AsIs { modulo: m.modulo() },
    };
    match opts.format {
        Format::RaggedNpz => return crate::ragged::convert_ragged(opts, mapping, progress),
        Format::MlperfMultiHot => {
            let read = &crate::mlperf_multihot::read_day;
            return crate::ragged::convert_days(opts, mapping, progress, ("ln(x+3)", read));
        }
        _ => {}
    }
    let split = opts
        .split
        .clone()
        .unwrap_or_else(|| SplitSpec::default_for(opts.inputs.len()));
    let mut sink = Sink {
        writer: DatasetWriter::create(&opts.output, DENSE, SPARSE)?,
        mapping,
        counter: matches!(mapping, IdMapping::Vocabulary { .. }).then(|| VocabCounter::new(SPARSE)),
        max_id: [0; SPARSE],
        skipped: BTreeMap::new(),
        first_skipped: None,
        skip: opts.skip_bad_lines,
    };
    let read = read_inputs(opts, &mut sink, progress)?;
    let samples = sink.writer.samples();
    if samples == 0 {
        return Err(DataError::Usage(format!(
            "no samples left to write ({} bad lines skipped)",
            sink.skipped.values().sum::<u64>()
        )));
    }
    progress(&Progress {
        rows: samples,
        bytes: read.total_bytes,
        total_bytes: read.total_bytes,
        mapping: true,
    });
    let Sink {
        mut writer,
        counter,
        max_id,
        skipped,
        first_skipped,
        ..
    } = sink;
    let (rows, table_stats) = match (mapping, counter) {
        (IdMapping::Vocabulary { min_count, .. }, Some(counter)) => {
            let mut rows = Vec::new();
            let mut stats = Vec::new();
            for (t, v) in counter.finish(min_count).iter().enumerate() {
                writer.map_sparse(t, |id| v.row(id))?;
                rows.push(v.rows());
                stats.push(serde_json::json!({"distinct": v.distinct(), "rare_ids": v.rare_ids()}));
            }
            (rows, stats)
        }
        (IdMapping::Vocabulary { .. }, None) => {
            return Err(DataError::Usage("internal: no vocabulary counter".into()));
        }
        (IdMapping::Hash { modulo }, _) => (vec![u64::from(modulo); SPARSE], Vec::new()),
        (IdMapping::AsIs { modulo }, _) => (
            as_is_rows(modulo, &max_id, read.counts.as_deref())?,
            Vec::new(),
        ),
    };
    let (splits, days) = split.plan(&read.per_file)?;
    let tables = rows
        .iter()
        .enumerate()
        .map(|(t, &rows)| TableInfo::new(criteo::sparse_name(t), rows))
        .collect();
    let mut source = serde_json::json!({
        "format": opts.format.name(),
        "files": read.files,
        "lines": read.lines,
        "mapping": mapping.describe(),
        "split": split.describe(),
        "skipped": skipped,
    });
    if !table_stats.is_empty() {
        source["vocabulary"] = serde_json::Value::Array(table_stats);
    }
    let manifest = writer.finish(DatasetMeta {
        dense_transform: "log1p".into(),
        tables,
        splits,
        days,
        source,
    })?;
    Ok(ConvertReport {
        manifest,
        lines: read.lines,
        skipped,
        first_skipped,
    })
}

/// What reading the input files found.
struct Read {
    /// The rows each file gave.
    per_file: Vec<u64>,
    /// Each file's entry in the manifest's `source`.
    files: Vec<serde_json::Value>,
    /// Lines read (bad ones too).
    lines: u64,
    /// The input files' bytes.
    total_bytes: u64,
    /// The reference's `counts` (its `.npz` files), the largest per table.
    counts: Option<Vec<u64>>,
}

/// Reads every input file into `sink`, reporting progress.
fn read_inputs(
    opts: &ConvertOptions,
    sink: &mut Sink,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Read> {
    let mut total_bytes = 0;
    for p in &opts.inputs {
        total_bytes += std::fs::metadata(p).map_err(|e| DataError::io(p, e))?.len();
    }
    let mut read = Read {
        per_file: Vec::new(),
        files: Vec::new(),
        lines: 0,
        total_bytes,
        counts: None,
    };
    let mut done_bytes = 0u64;
    for path in &opts.inputs {
        let before = sink.writer.samples();
        let mut report = |rows: u64, b: u64| {
            progress(&Progress {
                rows,
                bytes: done_bytes + b,
                total_bytes,
                mapping: false,
            })
        };
        let (file_lines, extra) = match opts.format {
            Format::CriteoTsv => read_tsv(path, sink, &mut report)?,
            Format::MlperfBin => {
                let n = processed::read_mlperf(path, sink, &mut report)?;
                (n, serde_json::Value::Null)
            }
            Format::ReferenceNpz => {
                let (n, c) = processed::read_npz(path, sink)?;
                read.counts = Some(merge_counts(read.counts.take(), c));
                (n, serde_json::Value::Null)
            }
            Format::RaggedNpz | Format::MlperfMultiHot => {
                return Err(DataError::Usage(
                    "internal: multi-hot inputs are read by ragged::convert_days".into(),
                ));
            }
        };
        done_bytes += std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let rows = sink.writer.samples() - before;
        read.lines += file_lines;
        read.per_file.push(rows);
        let mut entry = serde_json::json!({"path": path.display().to_string(), "lines": file_lines, "rows": rows});
        if !extra.is_null() {
            entry["gzip"] = extra;
        }
        read.files.push(entry);
    }
    Ok(read)
}

/// Each table's rows for ids kept as they are: the largest id seen + 1 (at most
/// `modulo`), or the reference's `counts`, which must cover the ids seen.
fn as_is_rows(modulo: Option<u32>, max_id: &[u32], counts: Option<&[u64]>) -> Result<Vec<u64>> {
    let cap = modulo.map_or(u64::MAX, u64::from);
    let mut rows = Vec::new();
    for t in 0..SPARSE {
        let seen = u64::from(max_id[t]) + 1;
        let r = match counts {
            Some(c) if c[t] >= seen.min(cap) => c[t].min(cap),
            Some(c) => {
                return Err(DataError::Usage(format!(
                    "table {} ({}) has id {} but `counts` says {} rows",
                    t,
                    criteo::sparse_name(t),
                    max_id[t],
                    c[t]
                )));
            }
            None => seen,
        };
        rows.push(r);
    }
    Ok(rows)
}

fn merge_counts(prev: Option<Vec<u64>>, next: Vec<u64>) -> Vec<u64> {
    match prev {
        None => next,
        Some(p) => p.iter().zip(&next).map(|(a, b)| *a.max(b)).collect(),
    }
}

/// Reads one TSV file into the sink; returns its line count and whether it was gzip.
fn read_tsv(
    path: &Path,
    sink: &mut Sink,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(u64, serde_json::Value)> {
    let mut reader = TsvReader::open(path)?;
    let mut batch = LineBatch::default();
    let mut good = Vec::with_capacity(BATCH);
    loop {
        reader.read_batch(&mut batch, BATCH)?;
        if batch.lines.is_empty() {
            break;
        }
        let parsed: Vec<std::result::Result<RawSample, criteo::LineError>> = (0..batch.lines.len())
            .into_par_iter()
            .with_min_len(1024)
            .map(|i| {
                let mut s = RawSample::default();
                criteo::parse_line(batch.line(i), &mut s).map(|()| s)
            })
            .collect();
        good.clear();
        for (i, r) in parsed.into_iter().enumerate() {
            match r {
                Ok(s) => good.push(s),
                Err(e) => {
                    let err = DataError::Input {
                        path: path.to_path_buf(),
                        line: batch.first_line + i as u64,
                        reason: e.message,
                    };
                    // Push the good lines before it, so that a stop leaves a
                    // consistent writer (dropped anyway) and a skip keeps order.
                    sink.push_batch(&good)?;
                    good.clear();
                    sink.bad(e.kind.key(), err)?;
                }
            }
        }
        sink.push_batch(&good)?;
        progress(sink.writer.samples(), reader.bytes_read());
    }
    if reader.lines() == 0 {
        return Err(DataError::Empty {
            path: path.to_path_buf(),
            what: "lines",
        });
    }
    Ok((reader.lines(), serde_json::Value::Bool(reader.is_gzip())))
}
