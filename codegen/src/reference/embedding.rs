//! Embedding bags: forward (gather + pool) and the sparse backward (one gradient
//! row per index).
//!
//! Both forms are covered: fixed pooling (`indices[S,L]`) and variable bags
//! (`indices[N]` + `offsets[S]`). Every index is validated against the table
//! *before* any work, so an error names the first bad position (and its sample)
//! deterministically. The forward pass is parallel over blocks of bags; each bag's
//! rows are summed in index order, as in the definition, so results are bitwise
//! equal to a sequential sum (the mean divides that sum by the bag's size; an empty
//! bag gives zeros). The backward copies `dy[bag]` (divided by the bag's size for
//! `mean`) into each of the bag's rows, parallel over blocks of bags.
//!
//! The operands come checked against the node's instance ([`Checked`]: ranks,
//! samples and the bag count verified by inference); what is checked here is the
//! data: the index values and the offsets.

use super::{
    Indices, Ix, KResult, KernelError, block_rows, dims_of, read_bounds, validate_bag_indices,
    validate_indices,
};
use dlrm_ir::{Checked, Pool, Tensor};
use rayon::prelude::*;

const FWD: &str = "embedding_bag";
const BWD: &str = "embedding_bag_grad";

fn index_operand<'a>(op: &'static str, t: &'a Tensor) -> KResult<Indices<'a>> {
    Indices::of(t).ok_or_else(|| KernelError::DType {
        op,
        reason: format!("indices must be i64 or i32, got {}", t.dtype()),
    })
}

/// `embedding_bag(table[R,D], indices[S,L])` or
/// `embedding_bag(table[R,D], indices[N], offsets[S])` -> `[S,D]`
/// (`offsets[S+1]` with `last_offset`: only the indices in a bag are read).
pub fn embedding_bag(mode: Pool, last_offset: bool, c: &Checked<'_>) -> Option<KResult<Tensor>> {
    let table = c.input(0).as_f32()?;
    // The instance verified the ranks and the bag count; the indices and the
    // offsets (their values) are checked here.
    let &[rows, d] = c.in_shape(0) else {
        return None;
    };
    Some((|| {
        let idx = index_operand(FWD, c.input(1))?;
        if c.inputs().len() == 2 {
            let [s, l] = dims_of::<2>(c, 1)?;
            validate_indices(FWD, idx, rows, Some(l), None)?;
            let mut out = vec![0.0f32; s * d];
            if d > 0 && s > 0 {
                match idx {
                    Indices::I64(v) => bag_fixed(table, d, v, l, mode, &mut out),
                    Indices::I32(v) => bag_fixed(table, d, v, l, mode, &mut out),
                }
            }
            Ok(Tensor::f32(vec![s, d], out))
        } else {
            let n = idx.len();
            let bounds = read_bounds(FWD, c.input(2), n, last_offset)?;
            let s = bounds.len() - 1;
            if last_offset {
                validate_bag_indices(FWD, idx, rows, &bounds)?;
            } else {
                validate_indices(FWD, idx, rows, None, Some(&bounds[..s]))?;
            }
            let mut out = vec![0.0f32; s * d];
            if d > 0 && s > 0 {
                match idx {
                    Indices::I64(v) => bag_offsets(table, d, v, &bounds, mode, &mut out),
                    Indices::I32(v) => bag_offsets(table, d, v, &bounds, mode, &mut out),
                }
            }
            Ok(Tensor::f32(vec![s, d], out))
        }
    })())
}

/// Sums (or averages) the rows `bag` of `table` into `out` (zeroed, width `d`).
#[inline]
fn pool_bag<T: Ix>(table: &[f32], d: usize, bag: &[T], mode: Pool, out: &mut [f32]) {
    for &i in bag {
        let r = i.get() as usize;
        out.iter_mut()
            .zip(&table[r * d..(r + 1) * d])
            .for_each(|(o, &t)| *o += t);
    }
    if mode == Pool::Mean && !bag.is_empty() {
        let cnt = bag.len() as f32;
        out.iter_mut().for_each(|o| *o /= cnt);
    }
}

fn bag_fixed<T: Ix>(table: &[f32], d: usize, idx: &[T], l: usize, mode: Pool, out: &mut [f32]) {
    let s = out.len() / d;
    let sb = block_rows(s, 8, 256);
    out.par_chunks_mut(sb * d).enumerate().for_each(|(blk, o)| {
        let s0 = blk * sb;
        for (k, row) in o.chunks_exact_mut(d).enumerate() {
            let sample = s0 + k;
            pool_bag(table, d, &idx[sample * l..(sample + 1) * l], mode, row);
        }
    });
}

/// Variable bags: bag `s` is `idx[bounds[s] .. bounds[s+1]]` (`s + 1` validated
/// bounds).
fn bag_offsets<T: Ix>(
    table: &[f32],
    d: usize,
    idx: &[T],
    bounds: &[i64],
    mode: Pool,
    out: &mut [f32],
) {
    let s = bounds.len() - 1;
    let sb = block_rows(s, 8, 256);
    out.par_chunks_mut(sb * d).enumerate().for_each(|(blk, o)| {
        let s0 = blk * sb;
        for (k, row) in o.chunks_exact_mut(d).enumerate() {
            let (a, b) = (bounds[s0 + k] as usize, bounds[s0 + k + 1] as usize);
            pool_bag(table, d, &idx[a..b], mode, row);
        }
    });
}

/// Where the gradient rows of an `embedding_bag_grad` go: bag `s`'s rows are
/// [`GradBags::rows`]`(s)` of the `n × d` result (validated operands).
pub(crate) struct GradBags {
    /// Samples (bags).
    pub s: usize,
    /// Row width.
    pub d: usize,
    /// Gradient rows (one per index).
    pub n: usize,
    /// Fixed pooling `L`, else `None` (variable bags of `off`).
    pub pooling: Option<usize>,
    /// Variable bags: the `s + 1` validated bag bounds ([`read_bounds`]: the
    /// offsets then `n`, or the offsets as given with `last_offset`); empty with
    /// fixed pooling. Rows outside `bounds[0] .. bounds[s]` belong to no bag.
    pub bounds: Vec<i64>,
    /// The result's shape (`indices.shape ++ [d]`).
    pub shape: Vec<usize>,
}

impl GradBags {
    /// The gradient rows of bag `sample`.
    pub fn rows(&self, sample: usize) -> std::ops::Range<usize> {
        match self.pooling {
            Some(l) => sample * l..(sample + 1) * l,
            None => self.bounds[sample] as usize..self.bounds[sample + 1] as usize,
        }
    }

    /// Splits the result `out` (`n·d` elements) into the contiguous runs of rows
    /// of the blocks of `sb` bags: `(first bag, its block's rows)`.
    /// Rows in no bag (before the first bag's, from `last_offset` bounds) are
    /// in no piece.
    pub fn blocks<'a, T>(&self, out: &'a mut [T], sb: usize) -> Vec<(usize, &'a mut [T])> {
        let mut pieces = Vec::with_capacity(self.s.div_ceil(sb));
        let skip = if self.s > 0 {
            self.rows(0).start * self.d
        } else {
            0
        };
        let mut rest = &mut out[skip..];
        for s0 in (0..self.s).step_by(sb) {
            let s1 = (s0 + sb).min(self.s);
            let len = (self.rows(s1 - 1).end - self.rows(s0).start) * self.d;
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
            pieces.push((s0, head));
            rest = tail;
        }
        pieces
    }
}

/// Where the rows of `embedding_bag_grad(dy[S,D], indices[S,L])` or
/// `embedding_bag_grad(dy[S,D], indices[N], offsets[S])` (`offsets[S+1]` with
/// `last_offset`) go, from checked operands (the instance verified the shapes
/// and the bag count; the offsets' values are checked here, the indices' are
/// not read).
pub(crate) fn grad_bags(c: &Checked<'_>, last_offset: bool) -> KResult<GradBags> {
    let [s, d] = dims_of::<2>(c, 0)?;
    index_operand(BWD, c.input(1))?;
    if c.inputs().len() == 2 {
        let [_, l] = dims_of::<2>(c, 1)?;
        return Ok(GradBags {
            s,
            d,
            n: s * l,
            pooling: Some(l),
            bounds: Vec::new(),
            shape: vec![s, l, d],
        });
    }
    let [n] = dims_of::<1>(c, 1)?;
    let bounds = read_bounds(BWD, c.input(2), n, last_offset)?;
    Ok(GradBags {
        s,
        d,
        n,
        pooling: None,
        bounds,
        shape: vec![n, d],
    })
}

/// `embedding_bag_grad(dy[S,D], indices[S,L]) -> [S,L,D]` or
/// `embedding_bag_grad(dy[S,D], indices[N], offsets[S]) -> [N,D]` (`offsets[S+1]`
/// with `last_offset`: the rows of indices in no bag are 0); with per-sample
/// `weights[N]`, row `i` scaled by `weights[i]`.
pub fn embedding_bag_grad(
    mode: Pool,
    last_offset: bool,
    c: &Checked<'_>,
) -> Option<KResult<Tensor>> {
    let dy = c.input(0).as_f32()?;
    let weights = match c.inputs().get(3) {
        Some(w) => Some(w.as_f32()?),
        None => None,
    };
    Some((|| {
        let g = grad_bags(c, last_offset)?;
        let d = g.d;
        let mut out = vec![0.0f32; g.n * d];
        if g.n > 0 && d > 0 {
            // Blocks of bags own contiguous runs of gradient rows.
            let sb = block_rows(g.s, 8, 256);
            g.blocks(&mut out, sb).into_par_iter().for_each(|(s0, o)| {
                let base = g.rows(s0).start;
                for sample in s0..(s0 + sb).min(g.s) {
                    let r = g.rows(sample);
                    let div = match mode {
                        Pool::Sum => None,
                        Pool::Mean => Some(r.len() as f32),
                    };
                    let src = &dy[sample * d..(sample + 1) * d];
                    let rows = o[(r.start - base) * d..(r.end - base) * d].chunks_exact_mut(d);
                    for (i, row) in r.clone().zip(rows) {
                        copy_row(row, src, div);
                        if let Some(w) = weights {
                            row.iter_mut().for_each(|x| *x *= w[i]);
                        }
                    }
                }
            });
        }
        Ok(Tensor::f32(g.shape, out))
    })())
}

#[inline]
fn copy_row(dst: &mut [f32], src: &[f32], div: Option<f32>) {
    match div {
        None => dst.copy_from_slice(src),
        Some(c) => dst.iter_mut().zip(src).for_each(|(o, &v)| *o = v / c),
    }
}
