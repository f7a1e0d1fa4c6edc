//! Sharded embedding bags (the partition pass's row-wise and data-parallel tables):
//! `embedding_bag_rows` (a bag over the rows `lo..lo+Rs` of a table held as a
//! shard) and `embedding_grad_dense` (the dense table gradient of a replicated
//! table).
//!
//! Every index is validated against the *whole* table (`0..rows`) before any work,
//! as in [`super::embedding`]. `embedding_bag_rows` is parallel over blocks of bags;
//! each bag adds its in-range rows in index order into an accumulator starting at
//! 0.0 (out-of-range indices are skipped) and `mean` divides by the full bag length,
//! so results are bitwise equal to the interpreter's. `embedding_grad_dense` is
//! parallel over blocks of table rows: each task scans every index in row-major
//! order and adds the gradient rows that fall in its block (SC20's race-free owner
//! computes), so every table row receives its contributions in index order, again
//! bitwise equal to the interpreter.

use super::{
    Indices, Ix, KResult, KernelError, bag_range, block_rows, dims_of, read_offsets,
    validate_indices,
};
use dlrm_ir::{Checked, Pool, Tensor};
use rayon::prelude::*;
use std::ops::Range;

const FWD: &str = "embedding_bag_rows";
const DENSE: &str = "embedding_grad_dense";

fn index_operand<'a>(op: &'static str, t: &'a Tensor) -> KResult<Indices<'a>> {
    Indices::of(t).ok_or_else(|| KernelError::DType {
        op,
        reason: format!("indices must be i64 or i32, got {}", t.dtype()),
    })
}

/// The bag structure of the index operands: `(samples, offsets)` where `offsets` is
/// `None` for fixed pooling (`indices[S,L]`, bag `s` = row `s`).
/// The instance verified the ranks and the bag count; the index values and the
/// offsets are checked here.
fn bags(op: &'static str, c: &Checked<'_>, rows: usize) -> KResult<(usize, Option<Vec<i64>>)> {
    let idx = index_operand(op, c.input(1))?;
    if c.inputs().len() == 2 {
        let [s, l] = dims_of::<2>(c, 1)?;
        validate_indices(op, idx, rows, Some(l), None)?;
        Ok((s, None))
    } else {
        let off = read_offsets(op, c.input(2), idx.len())?;
        validate_indices(op, idx, rows, None, Some(&off))?;
        Ok((off.len(), Some(off)))
    }
}

/// The indices as i64 (validated: non-negative, in range).
fn as_i64(idx: Indices<'_>) -> std::borrow::Cow<'_, [i64]> {
    match idx {
        Indices::I64(v) => std::borrow::Cow::Borrowed(v),
        Indices::I32(v) => std::borrow::Cow::Owned(v.iter().map(|x| x.get()).collect()),
    }
}

/// The index positions of bag `s`.
fn bag_of(off: &Option<Vec<i64>>, l: usize, n: usize, s: usize) -> Range<usize> {
    match off {
        None => s * l..(s + 1) * l,
        Some(o) => bag_range(o, s, n),
    }
}

/// `embedding_bag_rows {mode, lo, rows}(shard[Rs,D], indices[, offsets]) -> [S,D]`.
pub fn embedding_bag_rows(
    mode: Pool,
    lo: usize,
    rows: usize,
    c: &Checked<'_>,
) -> Option<KResult<Tensor>> {
    let shard = c.input(0).as_f32()?;
    // The instance verified the shard `lo..lo + Rs` within the table's rows.
    let &[rs, d] = c.in_shape(0) else {
        return None;
    };
    Some((|| {
        let (s, off) = bags(FWD, c, rows)?;
        let idx = index_operand(FWD, c.input(1))?;
        let n = idx.len();
        let l = if off.is_none() {
            c.in_shape(1).get(1).copied().unwrap_or(0)
        } else {
            0
        };
        let mut out = vec![0.0f32; s * d];
        if d > 0 && s > 0 {
            let v = as_i64(idx);
            {
                let sb = block_rows(s, 8, 256);
                out.par_chunks_mut(sb * d).enumerate().for_each(|(blk, o)| {
                    for (k, row) in o.chunks_exact_mut(d).enumerate() {
                        let bag = bag_of(&off, l, n, blk * sb + k);
                        let count = bag.len();
                        for p in bag {
                            let i = v[p] as usize;
                            if i < lo || i >= lo + rs {
                                continue;
                            }
                            let src = &shard[(i - lo) * d..(i - lo + 1) * d];
                            row.iter_mut().zip(src).for_each(|(o, &t)| *o += t);
                        }
                        if mode == Pool::Mean && count > 0 {
                            let c = count as f32;
                            row.iter_mut().for_each(|o| *o /= c);
                        }
                    }
                });
            }
        }
        Ok(Tensor::f32(vec![s, d], out))
    })())
}

/// `embedding_grad_dense {mode, rows}(dy[S,D], indices[, offsets]) -> f32[rows,D]`.
pub fn embedding_grad_dense(mode: Pool, rows: usize, c: &Checked<'_>) -> Option<KResult<Tensor>> {
    let dy = c.input(0).as_f32()?;
    // The instance verified dy[S,D] against the indices' bags.
    let &[s, d] = c.in_shape(0) else {
        return None;
    };
    Some((|| {
        let (_, off) = bags(DENSE, c, rows)?;
        let idx = index_operand(DENSE, c.input(1))?;
        let n = idx.len();
        let l = if off.is_none() {
            c.in_shape(1).get(1).copied().unwrap_or(0)
        } else {
            0
        };
        // (index position, sample) in row-major order, with the per-row scale.
        let mut owner = vec![0usize; n];
        for sample in 0..s {
            for p in bag_of(&off, l, n, sample) {
                owner[p] = sample;
            }
        }
        let count = |sample: usize| bag_of(&off, l, n, sample).len() as f32;
        let mut out = vec![0.0f32; rows * d];
        if d > 0 && rows > 0 {
            let v = as_i64(idx);
            {
                let rb = block_rows(rows, 64, 1 << 16);
                out.par_chunks_mut(rb * d).enumerate().for_each(|(blk, o)| {
                    let r0 = blk * rb;
                    let r1 = r0 + o.len() / d;
                    for (p, &sample) in owner.iter().enumerate() {
                        let r = v[p] as usize;
                        if r < r0 || r >= r1 {
                            continue;
                        }
                        let src = &dy[sample * d..(sample + 1) * d];
                        let dst = &mut o[(r - r0) * d..(r - r0 + 1) * d];
                        match mode {
                            Pool::Sum => dst.iter_mut().zip(src).for_each(|(o, &g)| *o += g),
                            Pool::Mean => {
                                let c = count(sample);
                                dst.iter_mut().zip(src).for_each(|(o, &g)| *o += g / c)
                            }
                        }
                    }
                });
            }
        }
        Ok(Tensor::f32(vec![rows, d], out))
    })())
}
