//! Deterministic synthetic data that a DLRM can learn.
//!
//! [`DataSchema::from_graph`] finds the roles of a model's inputs *structurally*
//! (never by name) in the unpartitioned graph: sparse features are the integer
//! inputs used as indices (operand 1) or offsets (operand 2) of `embedding_bag`, with
//! the table's row count from the table parameter's shape and the pooling factor from
//! the indices' shape `[B,L]`; the label is the second operand of the loss (`bce` /
//! `mse`); every other input must be a dense float `[B,k]` feature.
//!
//! [`SyntheticData`] generates every value as a pure function of
//! `(seed, step, global sample index, feature, slot)` through a counter-based hash
//! (splitmix64), so a sample is the same whatever the rank count and whichever rank
//! generates it; [`SyntheticData::inputs_for`] builds exactly one rank's inputs
//! (its [`dlrm_ir::batch_slice`] of the global batch for `B`-leading tensors, the
//! whole global batch for `G`-leading ones).
//!
//! Values: dense ~ U(0,1); indices follow a Zipf-like law over the table's rows
//! (rank `r` has probability ~ 1/(r+1)), mapped through a per-feature bijection so
//! hot rows are spread over the table; variable bags (offsets form) have 0..=2L
//! lookups, their offsets start at 0, and a last_offset bag's offsets input (leading
//! dimension `B+1` or `G+1`, `include_last_offset=True`) gets one more entry, the
//! number of indices (a partitioned graph's offsets are plain, `[B]` / `[G]`). Labels come from a hidden "teacher" fixed by the seed:
//! `logit = Σ_j a_j·(dense_j - ½) + Σ_t w·mean_{i∈bag_t} v_t(i) + noise`, label 1 when
//! the logit is above a threshold calibrated so that [`POSITIVE_RATE`] of samples
//! are positive (Criteo has ~25%). The dense and sparse parts each have unit
//! variance, so a DLRM learns both: the MLP the dense part, the embeddings the
//! per-row values of the hot rows.
//!
//! Held-out evaluation batches use a disjoint step space: [`eval_step`]`(b)` =
//! `EVAL_STEP_BASE + b`.

use crate::error::{Result, RuntimeError};
use dlrm_ir::{DType, Dim, DimExpr, Graph, Tensor, TensorType, batch_slice};
use rayon::prelude::*;
use std::collections::HashMap;
use std::ops::Range;

mod schema;
pub use schema::{BagSizes, DataSchema, DenseFeature, LabelSpec, SparseFeature};

/// First step of the held-out evaluation step space (training steps stay below).
pub const EVAL_STEP_BASE: u64 = 1 << 62;

/// The step of held-out evaluation batch `b`.
pub fn eval_step(b: u64) -> u64 {
    EVAL_STEP_BASE + b
}

/// The share of positive labels the teacher's threshold aims at.
pub const POSITIVE_RATE: f64 = 0.3;

fn data_err(reason: impl Into<String>) -> RuntimeError {
    RuntimeError::Data {
        reason: reason.into(),
    }
}

// -------------------------------------------------------------------- hashing

#[inline]
pub(crate) fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A counter-based hash of a tuple of words.
#[inline]
pub(crate) fn hash(words: &[u64]) -> u64 {
    hash_on(0x6A09_E667_F3BC_C909, words)
}

/// [`hash`] of a tuple continued by `words`, from the state `h` the tuple's
/// prefix left: `hash_on(hash(p), w) == hash(p ++ w)`. Values sharing a prefix
/// (a sample's columns, a feature's rows) hash it once.
#[inline]
fn hash_on(h: u64, words: &[u64]) -> u64 {
    words.iter().fold(h, |h, &w| splitmix64(h ^ splitmix64(w)))
}

/// U(0,1) with 24 random bits (exactly representable in f32, never 1).
#[inline]
fn unit(h: u64) -> f32 {
    (h >> 40) as f32 / (1u64 << 24) as f32
}

// Streams: independent families of values.
const S_DENSE: u64 = 1;
const S_INDEX: u64 = 2;
const S_BAGLEN: u64 = 3;
const S_NOISE: u64 = 4;
const S_TEACHER_DENSE: u64 = 5;
const S_TEACHER_ROW: u64 = 6;
const S_PERMUTE: u64 = 7;
const S_CALIBRATE: u64 = 8;
const S_WEIGHT: u64 = 9;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// A deterministic synthetic data source for one model (see the module docs).
#[derive(Clone, Debug)]
pub struct SyntheticData {
    schema: DataSchema,
    seed: u64,
    /// Per sparse feature: (multiplier, offset) of the row bijection.
    permute: Vec<(u64, u64)>,
    /// Per dense feature, per column: the teacher's weight.
    dense_w: Vec<Vec<f32>>,
    /// Weight of each sparse feature's contribution.
    sparse_w: f32,
    /// Amplitude of the label noise.
    noise: f32,
    /// The logit threshold of a positive label.
    threshold: f32,
    /// Per sparse feature: `ln(rows + 1)` of its Zipf-like law.
    ln_rows: Vec<f64>,
    /// Per sparse feature: the hash state of `(seed, S_TEACHER_ROW, f)`.
    row_keys: Vec<u64>,
}

/// The hash states of one sample's value streams: the prefixes
/// `(seed, stream, step, sample)` of its dense values and of its indices.
#[derive(Clone, Copy)]
struct SampleKeys {
    dense: u64,
    index: u64,
}

impl SyntheticData {
    /// A generator for `schema` with `seed`; calibrates the label threshold on a
    /// reserved set of samples.
    pub fn new(schema: DataSchema, seed: u64) -> SyntheticData {
        let permute = schema
            .sparse
            .iter()
            .enumerate()
            .map(|(f, feat)| {
                let rows = feat.rows.max(1) as u64;
                // A multiplier coprime to rows makes `rank·a + b mod rows` a bijection.
                let mut a = 1 + hash(&[seed, S_PERMUTE, f as u64, 0]) % rows;
                while gcd(a, rows) != 1 {
                    a += 1;
                }
                (a, hash(&[seed, S_PERMUTE, f as u64, 1]) % rows)
            })
            .collect();
        let total_cols: usize = schema.dense.iter().map(|d| d.width).sum();
        // U(-1,1) weights on U(0,1)-½ columns: variance 1/36 per column; scale the
        // dense part to unit variance.
        let dscale = if total_cols > 0 {
            6.0 / (total_cols as f32).sqrt()
        } else {
            0.0
        };
        let dense_w = schema
            .dense
            .iter()
            .enumerate()
            .map(|(f, d)| {
                (0..d.width)
                    .map(|j| {
                        dscale
                            * (2.0 * unit(hash(&[seed, S_TEACHER_DENSE, f as u64, j as u64])) - 1.0)
                    })
                    .collect()
            })
            .collect();
        // v_t ~ U(-1,1) has variance 1/3: scale the sparse part to unit variance.
        let nsparse = schema.sparse.len();
        let sparse_w = if nsparse > 0 {
            (3.0 / nsparse as f32).sqrt()
        } else {
            0.0
        };
        let ln_rows = schema
            .sparse
            .iter()
            .map(|feat| (feat.rows.max(1) as f64 + 1.0).ln())
            .collect();
        let row_keys = (0..nsparse)
            .map(|f| hash(&[seed, S_TEACHER_ROW, f as u64]))
            .collect();
        let mut data = SyntheticData {
            schema,
            seed,
            permute,
            dense_w,
            sparse_w,
            noise: 0.1,
            threshold: 0.0,
            ln_rows,
            row_keys,
        };
        let mut logits: Vec<f32> = (0..4096u64)
            .into_par_iter()
            .map(|s| data.logit(hash(&[seed, S_CALIBRATE]), s))
            .collect();
        logits.sort_by(f32::total_cmp);
        let k = ((1.0 - POSITIVE_RATE) * logits.len() as f64) as usize;
        data.threshold = logits
            .get(k.min(logits.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0);
        data
    }

    /// The schema this generator serves.
    pub fn schema(&self) -> &DataSchema {
        &self.schema
    }

    /// The data seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The hash states shared by a sample's values.
    #[inline]
    fn keys(&self, step: u64, sample: u64) -> SampleKeys {
        SampleKeys {
            dense: hash(&[self.seed, S_DENSE, step, sample]),
            index: hash(&[self.seed, S_INDEX, step, sample]),
        }
    }

    /// Dense value of column `col` of dense feature `f` for a sample:
    /// `unit(hash(seed, S_DENSE, step, sample, f, col))`.
    #[inline]
    fn dense(&self, keys: SampleKeys, f: usize, col: usize) -> f32 {
        unit(hash_on(keys.dense, &[f as u64, col as u64]))
    }

    /// The bag length of sparse feature `f` for a sample.
    #[inline]
    fn bag_len(&self, step: u64, sample: u64, f: usize) -> usize {
        let feat = &self.schema.sparse[f];
        if feat.offsets.is_none() {
            feat.pooling
        } else if feat.one_per_bag {
            1
        } else {
            let h = hash(&[self.seed, S_BAGLEN, step, sample, f as u64]);
            match feat.bag_sizes {
                Some(s) => s.pick(h),
                None => (h % (2 * feat.pooling as u64 + 1)) as usize,
            }
        }
    }

    /// Index `slot` of sparse feature `f`'s bag for a sample: a Zipf-like rank
    /// from `unit(hash(seed, S_INDEX, step, sample, f, slot))`, then the
    /// feature's row bijection.
    #[inline]
    fn index(&self, keys: SampleKeys, f: usize, slot: usize) -> i64 {
        let rows = self.schema.sparse[f].rows.max(1) as u64;
        let u = f64::from(unit(hash_on(keys.index, &[f as u64, slot as u64])));
        // P(rank < r) = ln(r+1)/ln(rows+1).
        let rank = ((self.ln_rows[f] * u).exp() - 1.0).floor() as u64;
        let rank = rank.min(rows - 1);
        let (a, b) = self.permute[f];
        ((rank.wrapping_mul(a) % rows + b) % rows) as i64
    }

    /// The teacher's value of row `row` of sparse feature `f`, in [-1, 1):
    /// from `hash(seed, S_TEACHER_ROW, f, row)`.
    #[inline]
    fn row_value(&self, f: usize, row: i64) -> f32 {
        2.0 * unit(hash_on(self.row_keys[f], &[row as u64])) - 1.0
    }

    fn logit(&self, step: u64, sample: u64) -> f32 {
        let keys = self.keys(step, sample);
        let mut z = 0.0f32;
        for (f, w) in self.dense_w.iter().enumerate() {
            for (j, &a) in w.iter().enumerate() {
                z += a * (self.dense(keys, f, j) - 0.5);
            }
        }
        for f in 0..self.schema.sparse.len() {
            let len = self.bag_len(step, sample, f);
            if len == 0 {
                continue;
            }
            let sum: f32 = (0..len)
                .map(|k| self.row_value(f, self.index(keys, f, k)))
                .sum();
            z += self.sparse_w * sum / len as f32;
        }
        let noise = 2.0 * unit(hash(&[self.seed, S_NOISE, step, sample])) - 1.0;
        z + self.noise * noise
    }

    /// The label (0 or 1) of a global sample of a step.
    pub fn label(&self, step: u64, sample: u64) -> f32 {
        if self.logit(step, sample) > self.threshold {
            1.0
        } else {
            0.0
        }
    }

    /// The labels of the global samples `samples` of a step.
    pub fn labels(&self, step: u64, samples: Range<usize>) -> Vec<f32> {
        samples
            .into_par_iter()
            .map(|s| self.label(step, s as u64))
            .collect()
    }

    /// The inputs of `rank_graph` for `step`: exactly the graph's inputs, `B`-leading
    /// tensors holding this rank's [`batch_slice`] of the global batch, `G`-leading
    /// ones the whole global batch. Every input must be in the schema (by name: a
    /// partitioned graph keeps the unpartitioned graph's input names).
    pub fn inputs_for(
        &self,
        step: u64,
        global_batch: usize,
        ranks: usize,
        rank: usize,
        rank_graph: &Graph,
    ) -> Result<HashMap<String, Tensor>> {
        if ranks == 0 || rank >= ranks {
            return Err(data_err(format!("rank {rank} of {ranks} ranks")));
        }
        let at = Samples {
            local: batch_slice(global_batch, ranks, rank),
            global: global_batch,
            graph: rank_graph,
        };
        let schema = &self.schema;
        let mut out = HashMap::new();
        for &v in rank_graph.inputs() {
            let name = rank_graph.name_of(v);
            let ty = rank_graph.ty(v);
            if let Some(f) = schema.dense.iter().position(|d| d.input == name) {
                out.insert(name.to_string(), self.dense_input(step, f, name, ty, &at)?);
            } else if schema.label.as_ref().is_some_and(|l| l.input == name) {
                out.insert(name.to_string(), self.label_input(step, name, ty, &at)?);
            } else if let Some(f) = schema.sparse.iter().position(|s| s.input == name) {
                match &schema.sparse[f].offsets {
                    None => {
                        let t = self.fixed_bags_input(step, f, name, ty, &at)?;
                        out.insert(name.to_string(), t);
                    }
                    Some(off_name) => {
                        let off_v = rank_graph.find(off_name).ok_or_else(|| {
                            data_err(format!(
                                "graph `{}` has indices %{name} but no offsets %{off_name}",
                                rank_graph.name
                            ))
                        })?;
                        let off_ty = rank_graph.ty(off_v);
                        let (idx, off) =
                            self.jagged_input(step, f, off_name, off_ty, ty.dtype, &at)?;
                        out.insert(name.to_string(), idx);
                        out.insert(off_name.clone(), off);
                    }
                }
            } else if let Some(f) = schema
                .sparse
                .iter()
                .position(|s| s.weights.as_deref() == Some(name))
            {
                out.insert(
                    name.to_string(),
                    self.weights_input(step, f, rank_graph, &at)?,
                );
            } else if let Some(f) = schema
                .sparse
                .iter()
                .position(|s| s.offsets.as_deref() == Some(name))
            {
                // Generated with its indices above (or below, in input order).
                if !out.contains_key(name) {
                    let idx_name = schema.sparse[f].input.clone();
                    let idx_ty = rank_graph
                        .find(&idx_name)
                        .map(|v| rank_graph.ty(v).dtype)
                        .unwrap_or(DType::I64);
                    let (idx, off) = self.jagged_input(step, f, name, ty, idx_ty, &at)?;
                    out.insert(idx_name, idx);
                    out.insert(name.to_string(), off);
                }
            } else {
                return Err(data_err(format!(
                    "input %{name} of graph `{}` is not in the data schema",
                    rank_graph.name
                )));
            }
        }
        Ok(out)
    }

    /// Dense feature `f` as input `name` of type `ty`: `[S, width]`.
    fn dense_input(
        &self,
        step: u64,
        f: usize,
        name: &str,
        ty: &TensorType,
        at: &Samples<'_>,
    ) -> Result<Tensor> {
        let w = self.schema.dense[f].width;
        expect_width(name, ty, "width", w)?;
        let r = at.of(name, ty.shape.first())?;
        let vals = self.per_sample(step, &r, w, |keys, j| self.dense(keys, f, j));
        Ok(Tensor::from_f32(ty.dtype, vec![r.len(), w], vals))
    }

    /// `w` values per sample of `r`, row-major: `value(keys, j)` for column `j`
    /// of a sample with `keys` (samples in parallel).
    fn per_sample<T: Copy + Default + Send>(
        &self,
        step: u64,
        r: &Range<usize>,
        w: usize,
        value: impl Fn(SampleKeys, usize) -> T + Sync,
    ) -> Vec<T> {
        let mut vals = vec![T::default(); r.len() * w];
        if w > 0 {
            vals.par_chunks_mut(w).enumerate().for_each(|(k, row)| {
                let keys = self.keys(step, (r.start + k) as u64);
                for (j, x) in row.iter_mut().enumerate() {
                    *x = value(keys, j);
                }
            });
        }
        vals
    }

    /// The labels as input `name` of type `ty` (each repeated over its trailing
    /// dims).
    fn label_input(
        &self,
        step: u64,
        name: &str,
        ty: &TensorType,
        at: &Samples<'_>,
    ) -> Result<Tensor> {
        let r = at.of(name, ty.shape.first())?;
        let cols: usize = ty.shape[1..]
            .iter()
            .map(|d| d.fixed().unwrap_or(1))
            .product();
        let labels = self.labels(step, r.clone());
        let vals: Vec<f32> = labels
            .iter()
            .flat_map(|&y| std::iter::repeat_n(y, cols))
            .collect();
        let mut shape = vec![r.len()];
        shape.extend(ty.shape[1..].iter().map(|d| d.fixed().unwrap_or(1)));
        Ok(Tensor::from_f32(ty.dtype, shape, vals))
    }

    /// Sparse feature `f` of fixed pooling `L` as input `name` of type `ty`:
    /// indices `[S, L]`.
    fn fixed_bags_input(
        &self,
        step: u64,
        f: usize,
        name: &str,
        ty: &TensorType,
        at: &Samples<'_>,
    ) -> Result<Tensor> {
        let r = at.of(name, ty.shape.first())?;
        let l = self.schema.sparse[f].pooling;
        expect_width(name, ty, "pooling", l)?;
        let idx = self.per_sample(step, &r, l, |keys, slot| self.index(keys, f, slot));
        index_tensor(ty.dtype, vec![r.len(), l], idx)
    }

    /// Sparse feature `f` of variable bags: its indices (of dtype `idx_dtype`)
    /// and its offsets (input `off_name` of type `off_ty`, whose length says
    /// the samples and whether it ends with the last bag's end).
    fn jagged_input(
        &self,
        step: u64,
        f: usize,
        off_name: &str,
        off_ty: &TensorType,
        idx_dtype: DType,
        at: &Samples<'_>,
    ) -> Result<(Tensor, Tensor)> {
        let (r, last) = offsets_samples(off_ty.shape.first(), |d| at.of(off_name, d))?;
        let (idx, off) = self.variable_bags(step, f, r, last);
        let n = off.len();
        Ok((
            index_tensor(idx_dtype, vec![idx.len()], idx)?,
            index_tensor(off_ty.dtype, vec![n], off)?,
        ))
    }

    /// The per-sample weights of sparse feature `f` (a weighted bag): one
    /// U(0.5, 1.5) weight per index of its bags, for the samples its offsets
    /// input holds (this rank's or the global batch).
    fn weights_input(
        &self,
        step: u64,
        f: usize,
        rank_graph: &Graph,
        at: &Samples<'_>,
    ) -> Result<Tensor> {
        let feat = &self.schema.sparse[f];
        let off_name = feat
            .offsets
            .as_deref()
            .ok_or_else(|| data_err(format!("weighted bags of %{} need offsets", feat.input)))?;
        let off_ty = rank_graph
            .find(off_name)
            .map(|v| rank_graph.ty(v))
            .ok_or_else(|| {
                data_err(format!(
                    "graph `{}` has no offsets %{off_name}",
                    rank_graph.name
                ))
            })?;
        let (r, _) = offsets_samples(off_ty.shape.first(), |d| at.of(off_name, d))?;
        let w: Vec<Vec<f32>> = r
            .into_par_iter()
            .map(|s| {
                let len = self.bag_len(step, s as u64, f);
                (0..len)
                    .map(|k| {
                        let h = hash(&[self.seed, S_WEIGHT, step, s as u64, f as u64, k as u64]);
                        0.5 + unit(h)
                    })
                    .collect()
            })
            .collect();
        let w: Vec<f32> = w.into_iter().flatten().collect();
        Ok(Tensor::f32(vec![w.len()], w))
    }

    /// Indices and offsets of variable bags for the samples `r`; with `last`, the
    /// offsets end with the number of indices (`include_last_offset=True`).
    fn variable_bags(
        &self,
        step: u64,
        f: usize,
        r: Range<usize>,
        last: bool,
    ) -> (Vec<i64>, Vec<i64>) {
        let bags: Vec<Vec<i64>> = r
            .into_par_iter()
            .map(|s| {
                let len = self.bag_len(step, s as u64, f);
                let keys = self.keys(step, s as u64);
                (0..len).map(|k| self.index(keys, f, k)).collect()
            })
            .collect();
        let mut off = Vec::with_capacity(bags.len() + 1);
        let mut at = 0i64;
        for b in &bags {
            off.push(at);
            at += b.len() as i64;
        }
        if last {
            off.push(at);
        }
        (bags.into_iter().flatten().collect(), off)
    }
}

/// Input `name` of type `ty` must be `[S, w]` (`what`: the schema's word for
/// `w`).
fn expect_width(name: &str, ty: &TensorType, what: &str, w: usize) -> Result<()> {
    if ty.rank() != 2 || ty.shape[1].fixed() != Some(w) {
        return Err(data_err(format!(
            "input %{name} is {ty}, the schema has {what} {w}"
        )));
    }
    Ok(())
}

/// Which samples a rank's input holds: a `B`-leading input this rank's
/// [`batch_slice`], a `G`-leading one the whole global batch.
struct Samples<'a> {
    local: Range<usize>,
    global: usize,
    graph: &'a Graph,
}

impl Samples<'_> {
    /// The samples of input `name` whose leading dimension is `d`.
    fn of(&self, name: &str, d: Option<&Dim>) -> Result<Range<usize>> {
        match d {
            Some(Dim::Sym(s)) if s == Dim::BATCH => Ok(self.local.clone()),
            Some(Dim::Sym(s)) if s == Dim::GLOBAL => Ok(0..self.global),
            Some(Dim::Fixed(n)) if *n == self.local.len() => Ok(self.local.clone()),
            other => Err(data_err(format!(
                "input %{name} of graph `{}`: leading dimension {} is neither B ({}) nor G ({})",
                self.graph.name,
                other.map_or_else(|| "(none)".to_string(), |d| d.to_string()),
                self.local.len(),
                self.global
            ))),
        }
    }
}

/// The samples of a bag's offsets input whose leading dimension is `lead`, and
/// whether the offsets carry one entry more than samples, the end of the last bag
/// (a last_offset bag's `[B+1]` / `[G+1]`; the partition makes a rank's offsets
/// plain, `[B]` / `[G]`). `samples` maps a samples dimension to its samples.
pub(crate) fn offsets_samples<T, E>(
    lead: Option<&Dim>,
    samples: impl Fn(Option<&Dim>) -> std::result::Result<T, E>,
) -> std::result::Result<(T, bool), E> {
    match samples(lead) {
        Ok(r) => Ok((r, false)),
        Err(e) => match lead.and_then(one_less) {
            Some(d) => samples(Some(&d)).map(|r| (r, true)).map_err(|_| e),
            None => Err(e),
        },
    }
}

/// `d - 1` (`B` of `B+1`, `n` of `n+1`), if it is a dimension.
fn one_less(d: &Dim) -> Option<Dim> {
    Dim::from_expr(d.to_expr().sub(&DimExpr::int(1))?)
}

fn index_tensor(dtype: DType, shape: Vec<usize>, v: Vec<i64>) -> Result<Tensor> {
    match dtype {
        DType::I64 => Ok(Tensor::i64(shape, v)),
        DType::I32 => v
            .into_iter()
            .map(i32::try_from)
            .collect::<std::result::Result<Vec<i32>, _>>()
            .map(|v| Tensor::i32(shape, v))
            .map_err(|_| data_err("an index does not fit i32")),
        other => Err(data_err(format!(
            "index inputs must be i64 or i32, got {other}"
        ))),
    }
}
