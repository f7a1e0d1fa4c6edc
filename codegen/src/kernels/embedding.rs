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

use super::{
    Indices, Ix, KResult, KernelError, arity, bag_range, block_rows, dims2, f32_operand,
    read_offsets, shape_err, validate_indices,
};
use dlrm_ir::{Pool, Tensor};
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
/// `embedding_bag(table[R,D], indices[N], offsets[S])` -> `[S,D]`.
pub fn embedding_bag(mode: Pool, inputs: &[&Tensor]) -> Option<KResult<Tensor>> {
    let table = f32_operand(inputs, 0)?;
    Some((|| {
        arity(FWD, inputs, &[2, 3])?;
        let (rows, d) = dims2(FWD, "table", inputs[0])?;
        let idx = index_operand(FWD, inputs[1])?;
        if inputs.len() == 2 {
            let (s, l) = dims2(FWD, "indices (fixed pooling)", inputs[1])?;
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
            if inputs[1].shape.len() != 1 {
                return Err(shape_err(
                    FWD,
                    format!(
                        "indices with offsets must have rank 1, got {:?}",
                        inputs[1].shape
                    ),
                ));
            }
            let n = idx.len();
            let off = read_offsets(FWD, inputs[2], n)?;
            validate_indices(FWD, idx, rows, None, Some(&off))?;
            let s = off.len();
            let mut out = vec![0.0f32; s * d];
            if d > 0 && s > 0 {
                match idx {
                    Indices::I64(v) => bag_offsets(table, d, v, &off, mode, &mut out),
                    Indices::I32(v) => bag_offsets(table, d, v, &off, mode, &mut out),
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

fn bag_offsets<T: Ix>(
    table: &[f32],
    d: usize,
    idx: &[T],
    off: &[i64],
    mode: Pool,
    out: &mut [f32],
) {
    let s = off.len();
    let n = idx.len();
    let sb = block_rows(s, 8, 256);
    out.par_chunks_mut(sb * d).enumerate().for_each(|(blk, o)| {
        let s0 = blk * sb;
        for (k, row) in o.chunks_exact_mut(d).enumerate() {
            pool_bag(table, d, &idx[bag_range(off, s0 + k, n)], mode, row);
        }
    });
}

/// `embedding_bag_grad(dy[S,D], indices[S,L]) -> [S,L,D]` or
/// `embedding_bag_grad(dy[S,D], indices[N], offsets[S]) -> [N,D]`.
pub fn embedding_bag_grad(mode: Pool, inputs: &[&Tensor]) -> Option<KResult<Tensor>> {
    let dy = f32_operand(inputs, 0)?;
    Some((|| {
        arity(BWD, inputs, &[2, 3])?;
        let (s, d) = dims2(BWD, "dy", inputs[0])?;
        index_operand(BWD, inputs[1])?;
        let scale = |cnt: usize| match mode {
            Pool::Sum => None,
            Pool::Mean => Some(cnt as f32),
        };
        if inputs.len() == 2 {
            let (si, l) = dims2(BWD, "indices (fixed pooling)", inputs[1])?;
            if si != s {
                return Err(shape_err(
                    BWD,
                    format!(
                        "dy {:?} and indices {:?} differ in samples",
                        inputs[0].shape, inputs[1].shape
                    ),
                ));
            }
            let mut out = vec![0.0f32; s * l * d];
            if s > 0 && l > 0 && d > 0 {
                let div = scale(l);
                let sb = block_rows(s, 8, 256);
                out.par_chunks_mut(sb * l * d)
                    .enumerate()
                    .for_each(|(blk, o)| {
                        let s0 = blk * sb;
                        for (k, bag) in o.chunks_exact_mut(l * d).enumerate() {
                            let src = &dy[(s0 + k) * d..(s0 + k + 1) * d];
                            for row in bag.chunks_exact_mut(d) {
                                copy_row(row, src, div);
                            }
                        }
                    });
            }
            Ok(Tensor::f32(vec![s, l, d], out))
        } else {
            if inputs[1].shape.len() != 1 {
                return Err(shape_err(
                    BWD,
                    format!(
                        "indices with offsets must have rank 1, got {:?}",
                        inputs[1].shape
                    ),
                ));
            }
            let n = inputs[1].shape[0];
            let off = read_offsets(BWD, inputs[2], n)?;
            if off.len() != s {
                return Err(shape_err(
                    BWD,
                    format!("dy has {s} samples, offsets {}", off.len()),
                ));
            }
            let mut out = vec![0.0f32; n * d];
            if s > 0 && d > 0 {
                // Blocks of bags own contiguous runs of gradient rows.
                let sb = block_rows(s, 8, 256);
                let mut pieces: Vec<(usize, &mut [f32])> = Vec::with_capacity(s.div_ceil(sb));
                let mut rest: &mut [f32] = &mut out;
                for s0 in (0..s).step_by(sb) {
                    let s1 = (s0 + sb).min(s);
                    let rows = bag_range(&off, s0, n).start..bag_range(&off, s1 - 1, n).end;
                    let (head, tail) = std::mem::take(&mut rest).split_at_mut(rows.len() * d);
                    pieces.push((s0, head));
                    rest = tail;
                }
                pieces.into_par_iter().for_each(|(s0, o)| {
                    let base = off[s0] as usize;
                    for sample in s0..(s0 + sb).min(s) {
                        let r = bag_range(&off, sample, n);
                        let div = scale(r.len());
                        let src = &dy[sample * d..(sample + 1) * d];
                        for row in o[(r.start - base) * d..(r.end - base) * d].chunks_exact_mut(d) {
                            copy_row(row, src, div);
                        }
                    }
                });
            }
            Ok(Tensor::f32(vec![n, d], out))
        }
    })())
}

#[inline]
fn copy_row(dst: &mut [f32], src: &[f32], div: Option<f32>) {
    match div {
        None => dst.copy_from_slice(src),
        Some(c) => dst.iter_mut().zip(src).for_each(|(o, &v)| *o = v / c),
    }
}
