//! A `.ds` dataset (dlrm-data) as the data of a plan: the schema mapping, the
//! deterministic shuffle, and batch assembly for one rank.
//!
//! **Mapping.** [`DatasetSource::new`] maps the graph's [`DataSchema`] onto the
//! dataset: the dense inputs in graph order take the dataset's dense columns in order
//! (their total width must equal the dataset's); the sparse features in graph input
//! order take the tables in column order (the counts must be equal). Bags with
//! offsets take any table: the rank's samples' ids in order and their bag starts
//! from 0 (a last_offset bag's `[B+1]` offsets ending with the id count); a fixed
//! pooling `[B,P]` takes a table whose every bag holds P ids (a one-hot table for
//! P = 1, a multi-hot one of hotness P); `[B]` indices beside `[B]` offsets (one id
//! a bag) take a table of bags of one. Any other pairing is an error naming the
//! input and the table;
//! a graph table with fewer rows than the dataset's table is an error naming both
//! counts. The label input gets the label (0.0 or 1.0). Index inputs get the dtype the
//! graph declares (i64 or i32). Every id is checked against its graph table's rows
//! while a batch is assembled (also when `--no-verify` skipped the checksums).
//!
//! **Order.** The position of training step `s` (0-based) is a pure function of
//! `(seed, s)`: epoch `s / steps_per_epoch`, batch `s % steps_per_epoch` of it, where
//! `steps_per_epoch = ⌊train samples / global batch⌋`: the last partial batch of each
//! epoch is **dropped** (a different tail each epoch, since the order changes). The
//! epoch's order is a **per-epoch permutation of fixed-size blocks** (`block` samples
//! of the training split, the last block possibly shorter) with a **permutation
//! inside each block**, both Fisher–Yates shuffles driven by a counter-based hash of
//! `(seed, epoch[, block])`. Blocks keep a batch's reads within a few contiguous
//! regions of the memory-mapped columns (cache and page friendly) while the order
//! still changes completely from epoch to epoch. Resuming at step `k` needs no state:
//! batch `k` is computed, not iterated to ([`DatasetSource::position`]).
//!
//! **Evaluation** reads a split in order, in global batches; the last partial batch
//! is padded with the split's last sample and the padded predictions are dropped
//! ([`DatasetSource::eval_samples`]).

use crate::error::{Result, RuntimeError};
use crate::synthetic::{DataSchema, SparseFeature, hash, offsets_samples, splitmix64};
use dlrm_data::{Dataset, TableInfo};
use dlrm_ir::{DType, Dim, Graph, Tensor, batch_slice};
use rayon::prelude::*;
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Samples per shuffle block (see the module docs).
pub const DEFAULT_BLOCK: usize = 4096;

/// Batches the loader prepares ahead of the training step, per rank.
pub const DEFAULT_PREFETCH: usize = 4;

// Hash streams of the shuffle.
const S_BLOCKS: u64 = 101;
const S_IN_BLOCK: u64 = 102;

/// Where the data of a run comes from when it is a dataset (`dlrm-run --data`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataConfig {
    /// The `.ds` directory.
    pub path: PathBuf,
    /// The split trained on.
    pub train_split: String,
    /// The split of the evaluations during training (`--eval-every`).
    pub eval_split: String,
    /// The split of the final evaluation.
    pub test_split: String,
    /// Check every file's checksum (and every id's range) before the run.
    pub verify: bool,
    /// Samples per shuffle block.
    pub block: usize,
    /// Batches prepared ahead of the step, per rank.
    pub prefetch: usize,
    /// What a sample with a non-finite dense value or a label outside {0, 1}
    /// does: end the run with an error naming it (default), or be skipped.
    pub on_nonfinite: OnNonFinite,
}

/// The policy for samples with a NaN or infinite dense value or a label that is
/// not 0 or 1 (`dlrm-run --on-nonfinite`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnNonFinite {
    /// The run ends with an error naming the sample, column and value, when a
    /// batch reaches it.
    #[default]
    Error,
    /// Such samples are left out of every split at the start (one pass over the
    /// dataset); the run counts them.
    Skip,
}

impl std::str::FromStr for OnNonFinite {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "error" => Ok(OnNonFinite::Error),
            "skip" => Ok(OnNonFinite::Skip),
            other => Err(format!("expected `error` or `skip`, got `{other}`")),
        }
    }
}

impl DataConfig {
    /// The defaults for the dataset at `path`: splits `train`, `val`, `test`,
    /// verified, [`DEFAULT_BLOCK`], [`DEFAULT_PREFETCH`].
    pub fn new(path: impl Into<PathBuf>) -> DataConfig {
        DataConfig {
            path: path.into(),
            train_split: "train".into(),
            eval_split: "val".into(),
            test_split: "test".into(),
            verify: true,
            block: DEFAULT_BLOCK,
            prefetch: DEFAULT_PREFETCH,
            on_nonfinite: OnNonFinite::Error,
        }
    }
}

/// Where a training step reads: the epoch and the batch within it (0-based).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// The epoch.
    pub epoch: u64,
    /// The batch within the epoch.
    pub batch: u64,
}

/// A dataset serving one plan's inputs (see the module docs).
#[derive(Debug)]
pub struct DatasetSource {
    ds: Dataset,
    schema: DataSchema,
    seed: u64,
    global_batch: usize,
    block: usize,
    train: Range<usize>,
    steps_per_epoch: u64,
    /// Per dense feature: its first column in the dataset's dense row.
    dense_at: Vec<usize>,
    /// With [`OnNonFinite::Skip`]: the kept samples of each split (by its range).
    kept: Option<Kept>,
}

/// The samples kept by [`OnNonFinite::Skip`].
#[derive(Debug, Default)]
struct Kept {
    splits: HashMap<(usize, usize), Vec<u32>>,
    skipped: u64,
}

fn mismatch(path: &Path, reason: impl Into<String>) -> RuntimeError {
    RuntimeError::Dataset {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Training steps in one epoch of `split` of `ds` with `global_batch` (the last
/// partial batch dropped); an error if the split is shorter than one batch.
pub fn steps_per_epoch(ds: &Dataset, split: &str, global_batch: usize) -> Result<u64> {
    let r = ds.split(split)?;
    let steps = r.len() / global_batch.max(1);
    if steps == 0 {
        return Err(mismatch(
            ds.path(),
            format!(
                "split `{split}` has {} samples, fewer than one global batch of {global_batch}",
                r.len()
            ),
        ));
    }
    Ok(steps as u64)
}

impl DatasetSource {
    /// Opens `cfg.path` (and verifies it if `cfg.verify`) for a graph of `schema`.
    pub fn open(
        cfg: &DataConfig,
        schema: DataSchema,
        seed: u64,
        global_batch: usize,
    ) -> Result<DatasetSource> {
        let ds = Dataset::open(&cfg.path)?;
        if cfg.verify {
            ds.verify_with(cfg.on_nonfinite == OnNonFinite::Error)?;
        }
        let src = DatasetSource::new(ds, schema, seed, global_batch, &cfg.train_split, cfg.block)?;
        match cfg.on_nonfinite {
            OnNonFinite::Error => Ok(src),
            OnNonFinite::Skip => {
                let splits = [&cfg.train_split, &cfg.eval_split, &cfg.test_split];
                src.skipping(&splits, &cfg.train_split)
            }
        }
    }

    /// This source with the samples that have a non-finite dense value or a label
    /// outside {0, 1} left out of the named splits (those the dataset has), and
    /// the training epoch recounted.
    fn skipping(mut self, splits: &[&String], train: &str) -> Result<DatasetSource> {
        let (dense, w, labels) = (self.ds.dense(), self.ds.dense_width(), self.ds.labels());
        let good =
            |s: usize| labels[s] <= 1 && dense[s * w..(s + 1) * w].iter().all(|x| x.is_finite());
        let mut kept = Kept::default();
        for name in splits {
            let Ok(r) = self.ds.split(name) else {
                continue;
            };
            if kept.splits.contains_key(&(r.start, r.end)) {
                continue;
            }
            let list: Vec<u32> = r
                .clone()
                .into_par_iter()
                .filter(|&s| good(s))
                .map(|s| s as u32)
                .collect();
            kept.skipped += (r.len() - list.len()) as u64;
            kept.splits.insert((r.start, r.end), list);
        }
        let n = self.split_len(&self.train.clone(), Some(&kept));
        self.steps_per_epoch = (n / self.global_batch.max(1)) as u64;
        if self.steps_per_epoch == 0 {
            return Err(mismatch(
                self.ds.path(),
                format!(
                    "split `{train}` keeps {n} samples after skipping {} with non-finite \
                     values or bad labels, fewer than one global batch of {}",
                    kept.skipped, self.global_batch
                ),
            ));
        }
        self.kept = Some(kept);
        Ok(self)
    }

    /// Samples skipped by [`OnNonFinite::Skip`] (0 without it).
    pub fn skipped(&self) -> u64 {
        self.kept.as_ref().map_or(0, |k| k.skipped)
    }

    /// The number of samples of `split` used (all, or those kept).
    fn split_len(&self, split: &Range<usize>, kept: Option<&Kept>) -> usize {
        match kept.and_then(|k| k.splits.get(&(split.start, split.end))) {
            Some(list) => list.len(),
            None => split.len(),
        }
    }

    /// Sample `i` of `split` (of those kept).
    fn nth(&self, split: &Range<usize>, i: usize) -> usize {
        match self
            .kept
            .as_ref()
            .and_then(|k| k.splits.get(&(split.start, split.end)))
        {
            Some(list) => list[i] as usize,
            None => split.start + i,
        }
    }

    /// Maps `schema` onto `ds` (see the module docs), training on split `train`.
    pub fn new(
        ds: Dataset,
        schema: DataSchema,
        seed: u64,
        global_batch: usize,
        train: &str,
        block: usize,
    ) -> Result<DatasetSource> {
        let path = ds.path().to_path_buf();
        let width: usize = schema.dense.iter().map(|d| d.width).sum();
        if width != ds.dense_width() {
            let inputs: Vec<String> = schema
                .dense
                .iter()
                .map(|d| format!("%{} [B,{}]", d.input, d.width))
                .collect();
            return Err(mismatch(
                &path,
                format!(
                    "has {} dense features per sample, the plan's dense inputs take {width} ({})",
                    ds.dense_width(),
                    inputs.join(", ")
                ),
            ));
        }
        if schema.sparse.len() != ds.num_tables() {
            return Err(mismatch(
                &path,
                format!(
                    "has {} tables (categorical features), the plan has {} sparse features",
                    ds.num_tables(),
                    schema.sparse.len()
                ),
            ));
        }
        for (t, (f, info)) in schema.sparse.iter().zip(&ds.manifest().tables).enumerate() {
            check_bags(&path, t, f, info)?;
            if (f.rows as u64) < info.rows {
                return Err(mismatch(
                    &path,
                    format!(
                        "table {t} (`{}`) has {} rows but the plan's table for %{} has {}: \
                         compile the model with `dlrmc compile --data {}` (table sizes from the data), \
                         or convert the data with `--max-ind-range {}`",
                        info.name,
                        info.rows,
                        f.input,
                        f.rows,
                        path.display(),
                        f.rows
                    ),
                ));
            }
        }
        if block == 0 {
            return Err(mismatch(
                &path,
                "the shuffle block must be at least 1 sample",
            ));
        }
        let spe = steps_per_epoch(&ds, train, global_batch)?;
        let train = ds.split(train)?;
        let mut dense_at = Vec::with_capacity(schema.dense.len());
        let mut at = 0;
        for d in &schema.dense {
            dense_at.push(at);
            at += d.width;
        }
        Ok(DatasetSource {
            ds,
            schema,
            seed,
            global_batch,
            block,
            train,
            steps_per_epoch: spe,
            dense_at,
            kept: None,
        })
    }

    /// The dataset.
    pub fn dataset(&self) -> &Dataset {
        &self.ds
    }

    /// Training steps per epoch (the last partial batch dropped).
    pub fn steps_per_epoch(&self) -> u64 {
        self.steps_per_epoch
    }

    /// The global batch the order is cut into.
    pub fn global_batch(&self) -> usize {
        self.global_batch
    }

    /// Where training step `step` (0-based) reads.
    pub fn position(&self, step: u64) -> Position {
        Position {
            epoch: step / self.steps_per_epoch,
            batch: step % self.steps_per_epoch,
        }
    }

    /// Fisher–Yates permutation of `0..n` from the hash state `key`.
    fn permutation(key: u64, n: usize) -> Vec<u32> {
        let mut p: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            let r = splitmix64(key ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let j = (r % (i as u64 + 1)) as usize;
            p.swap(i, j);
        }
        p
    }

    /// The dataset samples of every position of training step `step`'s global
    /// batch, in batch order.
    pub fn train_samples(&self, step: u64) -> Vec<usize> {
        let pos = self.position(step);
        let n = self.split_len(&self.train, self.kept.as_ref());
        let block = self.block;
        let nblocks = n.div_ceil(block);
        let order = Self::permutation(hash(&[self.seed, S_BLOCKS, pos.epoch]), nblocks);
        // Only the split's last block may be short: find its slot in the order.
        let last = nblocks - 1;
        let short = n - last * block;
        let short_slot = order
            .iter()
            .position(|&b| b as usize == last)
            .unwrap_or(last);
        let locate = |i: usize| -> (usize, usize) {
            if short == block || i < short_slot * block {
                (i / block, i % block)
            } else if i < short_slot * block + short {
                (short_slot, i - short_slot * block)
            } else {
                let k = i - short;
                (k / block + 1, k % block)
            }
        };
        let start = pos.batch as usize * self.global_batch;
        let mut out = Vec::with_capacity(self.global_batch);
        let mut cached: Option<(usize, Vec<u32>)> = None;
        for i in start..start + self.global_batch {
            let (slot, off) = locate(i);
            let b = order[slot] as usize;
            let perm = match &cached {
                Some((s, p)) if *s == slot => p,
                _ => {
                    let len = if b == last { short } else { block };
                    let key = hash(&[self.seed, S_IN_BLOCK, pos.epoch, b as u64]);
                    &cached.insert((slot, Self::permutation(key, len))).1
                }
            };
            out.push(self.nth(&self.train, b * block + perm[off] as usize));
        }
        out
    }

    /// Global batches of an evaluation of `split` (the last one padded).
    pub fn eval_batches(&self, split: &Range<usize>) -> usize {
        self.split_len(split, self.kept.as_ref())
            .div_ceil(self.global_batch)
    }

    /// The samples of evaluation batch `b` of `split`: positions past the split's
    /// end repeat its last sample (padding, whose predictions are dropped).
    pub fn eval_samples(&self, split: &Range<usize>, b: usize) -> Vec<usize> {
        let n = self.split_len(split, self.kept.as_ref());
        let start = b * self.global_batch;
        (start..start + self.global_batch)
            .map(|i| self.nth(split, i.min(n.saturating_sub(1))))
            .collect()
    }

    /// The labels of `split`, in order.
    pub fn labels(&self, split: &Range<usize>) -> Vec<f32> {
        let labels = self.ds.labels();
        (0..self.split_len(split, self.kept.as_ref()))
            .map(|i| f32::from(labels[self.nth(split, i)]))
            .collect()
    }

    /// Dense feature `f`'s values of the samples `rows`, sample-major; a NaN or
    /// infinite value is an error naming the sample, the column and the value
    /// (training on it would poison every parameter it reaches).
    fn dense_rows(&self, f: usize, rows: &[usize]) -> Result<Vec<f32>> {
        let w = self.schema.dense[f].width;
        let (dw, at) = (self.ds.dense_width(), self.dense_at[f]);
        let all = self.ds.dense();
        let mut vals = Vec::with_capacity(rows.len() * w);
        for &s in rows {
            let row = &all[s * dw + at..s * dw + at + w];
            if let Some(c) = row.iter().position(|x| !x.is_finite()) {
                return Err(mismatch(
                    self.ds.path(),
                    format!(
                        "sample {s}: dense column {} (input %{}) is {}, not a finite number",
                        at + c,
                        self.schema.dense[f].input,
                        row[c]
                    ),
                ));
            }
            vals.extend_from_slice(row);
        }
        Ok(vals)
    }

    /// The inputs of `rank_graph` for the global batch `samples` (dataset sample
    /// indices in batch order): `B`-leading inputs take this rank's [`batch_slice`]
    /// of it, `G`-leading ones all of it.
    pub fn inputs(
        &self,
        samples: &[usize],
        ranks: usize,
        rank: usize,
        rank_graph: &Graph,
    ) -> Result<HashMap<String, Tensor>> {
        let path = self.ds.path();
        if ranks == 0 || rank >= ranks {
            return Err(mismatch(path, format!("rank {rank} of {ranks} ranks")));
        }
        // A file truncated under the job would fault on the reads below.
        self.ds.check_unchanged()?;
        let global = samples.len();
        let local = batch_slice(global, ranks, rank);
        let rows_of = |name: &str, d: Option<&Dim>| -> Result<&[usize]> {
            match d {
                Some(Dim::Sym(s)) if s == Dim::BATCH => Ok(&samples[local.clone()]),
                Some(Dim::Sym(s)) if s == Dim::GLOBAL => Ok(samples),
                Some(Dim::Fixed(n)) if *n == local.len() => Ok(&samples[local.clone()]),
                other => Err(mismatch(
                    path,
                    format!(
                        "input %{name} of graph `{}`: leading dimension {} is neither B ({}) nor G ({global})",
                        rank_graph.name,
                        other.map_or_else(|| "(none)".to_string(), |d| d.to_string()),
                        local.len()
                    ),
                )),
            }
        };
        let schema = &self.schema;
        let mut out = HashMap::new();
        for &v in rank_graph.inputs() {
            let name = rank_graph.name_of(v);
            let ty = rank_graph.ty(v);
            if let Some(f) = schema.dense.iter().position(|d| d.input == name) {
                let w = schema.dense[f].width;
                let rows = rows_of(name, ty.shape.first())?;
                let vals = self.dense_rows(f, rows)?;
                out.insert(
                    name.to_string(),
                    Tensor::from_f32(ty.dtype, vec![rows.len(), w], vals),
                );
            } else if schema.label.as_ref().is_some_and(|l| l.input == name) {
                let rows = rows_of(name, ty.shape.first())?;
                let cols: usize = ty.shape[1..]
                    .iter()
                    .map(|d| d.fixed().unwrap_or(1))
                    .product();
                let labels = self.ds.labels();
                if let Some(&s) = rows.iter().find(|&&s| labels[s] > 1) {
                    return Err(mismatch(
                        path,
                        format!("sample {s}: label {} is not 0 or 1", labels[s]),
                    ));
                }
                let vals: Vec<f32> = rows
                    .iter()
                    .flat_map(|&s| std::iter::repeat_n(f32::from(labels[s]), cols))
                    .collect();
                let mut shape = vec![rows.len()];
                shape.extend(ty.shape[1..].iter().map(|d| d.fixed().unwrap_or(1)));
                out.insert(name.to_string(), Tensor::from_f32(ty.dtype, shape, vals));
            } else if let Some(t) = schema.sparse.iter().position(|s| s.input == name) {
                let feat = &schema.sparse[t];
                let (rows, last) = match &feat.offsets {
                    None => (rows_of(name, ty.shape.first())?, false),
                    Some(o) => {
                        let lead = rank_graph
                            .find(o)
                            .and_then(|ov| rank_graph.ty(ov).shape.first());
                        offsets_samples(lead, |d| rows_of(o, d))?
                    }
                };
                let (ids, starts) = self.bags(t, rows, feat.rows)?;
                let shape = match &feat.offsets {
                    None => vec![rows.len(), feat.pooling],
                    Some(_) => vec![ids.len()],
                };
                out.insert(name.to_string(), index_tensor(ty.dtype, shape, ids, path)?);
                if let Some(o) = &feat.offsets {
                    let odt = rank_graph
                        .find(o)
                        .map_or(DType::I64, |ov| rank_graph.ty(ov).dtype);
                    // A last_offset bag's offsets end with the id count.
                    let n = rows.len() + usize::from(last);
                    let offs = starts[..n].to_vec();
                    out.insert(o.clone(), index_tensor(odt, vec![n], offs, path)?);
                }
            } else if schema
                .sparse
                .iter()
                .any(|s| s.offsets.as_deref() == Some(name))
            {
                // Built with its indices.
            } else {
                return Err(mismatch(
                    path,
                    format!(
                        "input %{name} of graph `{}` has no column in the dataset",
                        rank_graph.name
                    ),
                ));
            }
        }
        Ok(out)
    }

    /// Table `t`'s bags of the samples `rows`, read once: their ids in order, each
    /// checked against the graph table's `limit`, and the bag starts from 0
    /// (`rows.len() + 1` of them, the last the id count).
    fn bags(&self, t: usize, rows: &[usize], limit: usize) -> Result<(Vec<u32>, Vec<u32>)> {
        let hot = self.ds.manifest().tables[t].fixed_hotness();
        let mut ids = Vec::with_capacity(rows.len() * hot.unwrap_or(1) as usize);
        let mut starts = Vec::with_capacity(rows.len() + 1);
        starts.push(0);
        for &s in rows {
            let bag = self.ds.bag(t, s)?;
            if let Some(&id) = bag.iter().find(|&&id| id as usize >= limit) {
                return Err(mismatch(
                    &self.ds.path().join(format!("sparse.{t}.u32")),
                    format!("sample {s}: id {id} of table {t} is beyond the plan's {limit} rows"),
                ));
            }
            ids.extend_from_slice(bag);
            let end = u32::try_from(ids.len()).map_err(|_| {
                mismatch(
                    self.ds.path(),
                    format!("table {t}: a batch's bags hold more than 2^32 ids"),
                )
            })?;
            starts.push(end);
        }
        Ok((ids, starts))
    }
}

/// Whether sparse feature `f` can take table `t` (`info`)'s bags: a fixed pooling
/// `[B, P]` needs bags of exactly P ids, a one-id-a-bag `[B]` input bags of one;
/// offsets-form bags take any.
fn check_bags(path: &Path, t: usize, f: &SparseFeature, info: &TableInfo) -> Result<()> {
    let hot = info.fixed_hotness();
    let (want, form) = match (&f.offsets, f.one_per_bag) {
        (None, _) => (
            f.pooling as u64,
            format!("a fixed pooling of {}", f.pooling),
        ),
        (Some(_), true) => (
            1,
            "one id per bag ([B] indices beside [B] offsets)".to_string(),
        ),
        (Some(_), false) => return Ok(()),
    };
    if hot == Some(want) {
        return Ok(());
    }
    let has = match hot {
        Some(h) => format!("bags of {h} ids"),
        None => "bags of varying size (multi-hot)".to_string(),
    };
    Err(mismatch(
        path,
        format!(
            "sparse feature %{} takes {form}, but table {t} (`{}`) has {has}: \
             use a model whose bags take offsets, or data of that hotness",
            f.input, info.name
        ),
    ))
}

fn index_tensor(dtype: DType, shape: Vec<usize>, v: Vec<u32>, path: &Path) -> Result<Tensor> {
    match dtype {
        DType::I64 => Ok(Tensor::i64(shape, v.into_iter().map(i64::from).collect())),
        DType::I32 => v
            .into_iter()
            .map(i32::try_from)
            .collect::<std::result::Result<Vec<i32>, _>>()
            .map(|v| Tensor::i32(shape, v))
            .map_err(|_| mismatch(path, "an id does not fit the graph's i32 indices")),
        other => Err(mismatch(
            path,
            format!("index inputs must be i64 or i32, got {other}"),
        )),
    }
}

/// The loader's speed: one rank's batch assembly, timed on the loader's own thread.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct LoaderBench {
    /// Batches assembled.
    pub batches: u64,
    /// Batches (one rank's inputs of one step) per second.
    pub batches_per_s: f64,
    /// Global samples per second the loader keeps up with (batches/s × global batch).
    pub samples_per_s: f64,
}

/// Times the assembly of rank 0's inputs of training steps `0..batches` of `job`
/// (`None` without a dataset). The dataset is opened without verification.
pub fn bench_loader(job: &crate::driver::Job, batches: u64) -> Result<Option<LoaderBench>> {
    let Some(cfg) = &job.settings.data else {
        return Ok(None);
    };
    let schema_graph = job.full_train.as_ref().unwrap_or(&job.full_infer);
    let schema = DataSchema::from_graph(schema_graph)?;
    let cfg = DataConfig {
        verify: false,
        ..cfg.clone()
    };
    let src = DatasetSource::open(&cfg, schema, job.seed, job.global_batch)?;
    let graph = match &job.train_graphs {
        Some(g) => g.first(),
        None => job.infer_graphs.first(),
    }
    .ok_or_else(|| mismatch(&cfg.path, "the job has no graph for rank 0"))?;
    let batches = batches.max(1);
    // One untimed batch: page in the maps' first blocks like a warm-up step.
    src.inputs(&src.train_samples(0), job.settings.ranks, 0, graph)?;
    let t0 = std::time::Instant::now();
    for s in 0..batches {
        let inputs = src.inputs(&src.train_samples(s), job.settings.ranks, 0, graph)?;
        std::hint::black_box(inputs);
    }
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    let batches_per_s = batches as f64 / secs;
    Ok(Some(LoaderBench {
        batches,
        batches_per_s,
        samples_per_s: batches_per_s * job.global_batch as f64,
    }))
}
