//! Embedding ops: `embedding_bag` (fixed pooling `[S,L]` or variable bags given by
//! `indices[N]` + `offsets[S]`) and `embedding_bag_grad`. (`sparse_sgd`, the
//! table update, is in `optim`.)
//!
//! Validation comes first, before any output is computed: offsets must start at 0
//! (any start with `last_offset`), be non-decreasing and at most `N`; every index
//! in a bag must lie in `0..rows` (for the
//! gradient, which has no table, every index must be non-negative). Errors name the
//! sample (bag) and the position inside the bag.
//!
//! Summation order: a bag's rows are added into an f32 accumulator starting at `0.0`
//! in bag order (position 0 first); `mean` then divides the sum by the bag's length.
//! An empty bag gives zeros for both `sum` and `mean`.

use super::common::{FView, R, dims, fview, ints, out_of_range, store};
use crate::{Checked, DType, Op, Pool, Tensor};
use std::borrow::Cow;
use std::ops::Range;

/// The bag structure of an index operand.
pub(super) enum Bags {
    /// `[S, L]` indices: bag `s` is row `s`.
    Fixed {
        /// Samples.
        samples: usize,
        /// Indices per bag.
        len: usize,
    },
    /// `indices[N]` with `offsets[S]` (or `offsets[S+1]` with `last_offset`),
    /// already validated.
    Var {
        /// Validated offsets, the starts of the `S` bags.
        offsets: Vec<usize>,
        /// The end of the last bag: `N`, or `offsets[S]` with `last_offset`.
        end: usize,
    },
}

impl Bags {
    /// Reads and validates the bag structure from `indices` (and `offsets`; with
    /// `last_offset` they have one more entry, the end of the last bag, and may
    /// start anywhere in `0..=N`). Their ranks (`[S, L]`, or `[N]` with `[S]`
    /// offsets) are the op's shape rule, checked by its instance; the offsets'
    /// values are checked here.
    pub(super) fn new(indices: &Tensor, offsets: Option<&Tensor>, last_offset: bool) -> R<Bags> {
        match offsets {
            None if last_offset => Err("last_offset needs an offsets operand".into()),
            None => Ok(Bags::Fixed {
                samples: indices.shape[0],
                len: indices.shape[1],
            }),
            Some(off) => {
                let n = indices.shape[0];
                let raw = ints(off, "offsets")?;
                let mut offsets = Vec::with_capacity(raw.len());
                for (s, &o) in raw.iter().enumerate() {
                    let prev = offsets.last().copied();
                    let ok = usize::try_from(o)
                        .ok()
                        .filter(|&o| o <= n && prev.is_none_or(|p| o >= p));
                    match ok {
                        Some(o) if s > 0 || o == 0 || last_offset => offsets.push(o),
                        _ => {
                            let why = if s == 0 && !last_offset {
                                "the first offset must be 0".to_string()
                            } else if s == 0 {
                                "offsets must not be negative".to_string()
                            } else if o > n as i64 {
                                format!("offsets must be at most the {n} indices")
                            } else {
                                format!(
                                    "offsets must be non-decreasing (offset {} is {})",
                                    s - 1,
                                    raw[s - 1]
                                )
                            };
                            let at = if last_offset && s + 1 == raw.len() {
                                format!("the end of the last bag (offsets[{s}])")
                            } else {
                                format!("sample {s}")
                            };
                            return Err(format!("bad offset {o} for {at}: {why}"));
                        }
                    }
                }
                if last_offset {
                    return match offsets.pop() {
                        Some(end) => Ok(Bags::Var { offsets, end }),
                        None => Err(
                            "offsets with last_offset need at least one entry (the end of the last bag)"
                                .into(),
                        ),
                    };
                }
                Ok(Bags::Var { offsets, end: n })
            }
        }
    }

    /// Number of bags (samples).
    pub(super) fn samples(&self) -> usize {
        match self {
            Bags::Fixed { samples, .. } => *samples,
            Bags::Var { offsets, .. } => offsets.len(),
        }
    }

    /// The positions of bag `s` in the flat indices.
    pub(super) fn bag(&self, s: usize) -> Range<usize> {
        match self {
            Bags::Fixed { len, .. } => s * len..(s + 1) * len,
            Bags::Var { offsets, end } => {
                let e = offsets.get(s + 1).copied().unwrap_or(*end);
                offsets[s]..e
            }
        }
    }
}

/// Checks every index: inside `0..rows` when `rows` is given, else non-negative.
/// Returns the indices as `usize`.
fn check_indices(idx: &[i64], bags: &Bags, rows: Option<usize>) -> R<Vec<usize>> {
    let mut out = vec![0usize; idx.len()];
    for s in 0..bags.samples() {
        let bag = bags.bag(s);
        for (p, flat) in bag.clone().enumerate() {
            let i = idx[flat];
            let loc = format!("sample {s}, position {p}");
            let ok = usize::try_from(i)
                .ok()
                .filter(|&u| rows.is_none_or(|r| u < r));
            match (ok, rows) {
                (Some(u), _) => out[flat] = u,
                (None, Some(r)) => return Err(out_of_range(i, &loc, r)),
                (None, None) => return Err(format!("index {i} at {loc} is negative")),
            }
        }
    }
    Ok(out)
}

/// Splits the operands after the first into indices and optional offsets and
/// validates the bags.
fn bags_of<'a>(ins: &[&'a Tensor], last_offset: bool) -> R<(Cow<'a, [i64]>, Bags)> {
    let idx = ins[1];
    let off = ins.get(2).copied();
    let bags = Bags::new(idx, off, last_offset)?;
    let raw = ints(idx, "indices")?;
    Ok((raw, bags))
}

/// Evaluates an embedding op on its checked operands.
pub(super) fn eval(c: &Checked<'_>) -> R<Tensor> {
    let ins = c.inputs();
    let out = c.out(0).dtype;
    match *c.op() {
        Op::EmbeddingBag { mode, last_offset } => {
            let [rows, _] = dims(c.in_shape(0));
            bag_sum(mode, ins, last_offset, 0..rows, rows, out)
        }
        Op::EmbeddingBagRows { mode, lo, rows } => {
            let rs = c.in_shape(0)[0];
            bag_sum(mode, ins, false, lo..lo + rs, rows, out)
        }
        Op::EmbeddingBagGrad { mode, last_offset } => {
            embedding_bag_grad(mode, last_offset, ins, out)
        }
        Op::EmbeddingGradDense { mode, rows } => embedding_grad_dense(mode, rows, ins),
        ref other => super::common::not_in_family(other, "an embedding op"),
    }
}

/// `embedding_bag(table[R,D], indices[, offsets]) -> [S,D]` (`offsets[S+1]` with
/// `last_offset`) on the rows `range` of a table of `rows` rows: operand 0 holds
/// rows `range` (the whole table, or a shard of `embedding_bag_rows`); indices are
/// validated against `0..rows`, only those in `range` are looked up, and `mean`
/// divides by the full bag length.
fn bag_sum(
    mode: Pool,
    ins: &[&Tensor],
    last_offset: bool,
    range: Range<usize>,
    rows: usize,
    out: DType,
) -> R<Tensor> {
    let d = ins[0].shape[1];
    let table: FView<'_> = fview(ins[0], "table")?;
    let (raw, bags) = bags_of(ins, last_offset)?;
    let idx = check_indices(&raw, &bags, Some(rows))?;
    let samples = bags.samples();
    let mut y = Vec::with_capacity(samples * d);
    let mut acc = vec![0.0f32; d];
    for s in 0..samples {
        acc.iter_mut().for_each(|a| *a = 0.0);
        let bag = bags.bag(s);
        let count = bag.len();
        for flat in bag {
            if !range.contains(&idx[flat]) {
                continue;
            }
            let base = (idx[flat] - range.start) * d;
            for (j, a) in acc.iter_mut().enumerate() {
                *a += table.get(base + j);
            }
        }
        if mode == Pool::Mean && count > 0 {
            let c = count as f32;
            acc.iter_mut().for_each(|a| *a /= c);
        }
        y.extend_from_slice(&acc);
    }
    store(out, vec![samples, d], y)
}

/// `embedding_bag_grad(dy[S,D], indices[, offsets])`: one row per index, `dy[bag]`
/// (divided by the bag's length for `mean`); shape `indices.shape ++ [D]`. With
/// `last_offset`, the rows of indices in no bag are 0. The operands satisfy the
/// rule of `embedding_bag_grad` (checked by its instance, or by the instance of a
/// fused update that contains it).
pub(super) fn embedding_bag_grad(
    mode: Pool,
    last_offset: bool,
    ins: &[&Tensor],
    out: DType,
) -> R<Tensor> {
    let [s_dy, d] = dims(&ins[0].shape);
    let dy = super::common::floats(ins[0], "dy")?;
    let (raw, bags) = bags_of(ins, last_offset)?;
    check_indices(&raw, &bags, None)?;
    let weights = match ins.get(3) {
        Some(w) => Some(super::common::floats(w, "weights")?),
        None => None,
    };
    let mut g = vec![0.0f32; raw.len() * d];
    for s in 0..s_dy {
        let bag = bags.bag(s);
        let count = bag.len() as f32;
        let row = &dy[s * d..(s + 1) * d];
        for flat in bag {
            let dst = &mut g[flat * d..(flat + 1) * d];
            let w = weights.as_ref().map_or(1.0, |w| w[flat]);
            for (o, &v) in dst.iter_mut().zip(row) {
                *o = match (mode, &weights) {
                    (Pool::Sum, None) => v,
                    (Pool::Sum, Some(_)) => v * w,
                    (Pool::Mean, _) => v / count,
                };
            }
        }
    }
    let mut shape = ins[1].shape.clone();
    shape.push(d);
    store(out, shape, g)
}

// ---- sharded embeddings

/// The rows `lo..lo+rs` of a table of `rows` rows (the op's rule checked that they
/// fit).
pub(super) fn shard_range(lo: usize, rs: usize) -> Range<usize> {
    lo..lo + rs
}

/// `embedding_grad_dense {mode, rows}(dy[S,D], indices[, offsets]) -> f32[rows,D]`.
fn embedding_grad_dense(mode: Pool, rows: usize, ins: &[&Tensor]) -> R<Tensor> {
    let rowgrad = embedding_bag_grad(mode, false, ins, DType::F32)?;
    let g = super::common::floats(&rowgrad, "row gradient")?;
    let (raw, bags) = bags_of(ins, false)?;
    let idx = check_indices(&raw, &bags, Some(rows))?;
    let d = ins[0].shape[1];
    let mut dense = vec![0.0f32; rows * d];
    for (i, &r) in idx.iter().enumerate() {
        for (o, &v) in dense[r * d..(r + 1) * d]
            .iter_mut()
            .zip(&g[i * d..(i + 1) * d])
        {
            *o += v;
        }
    }
    store(DType::F32, vec![rows, d], dense)
}
