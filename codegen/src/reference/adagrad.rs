//! In-place Adagrad updates on parameter storage (the optimizer ops `adagrad`,
//! `sparse_adagrad`, `embedding_update_adagrad` and its row-shard form).
//!
//! - [`adagrad`]: the dense update, parallel over chunks of elements (or of
//!   rows, row-wise); the gradient may be f32 or bf16, weight and accumulator f32.
//! - [`sparse_adagrad`] and [`embedding_update_adagrad`]: the
//!   race-free embedding update of [`super::optim`] with optimizer state: the
//!   table's stored rows are split into one contiguous range per rayon task, each
//!   task owning the same rows of the accumulator; every task scans all indices and
//!   groups the positions in its range by row (stable: index order within a row),
//!   sums each row's gradient from 0.0 in that order (coalescing, as the
//!   definition), then updates the row and its accumulator once with the
//!   interpreter's own scalar functions ([`dlrm_ir::interp::adagrad_acc1`],
//!   [`adagrad_row_acc`], [`adagrad_step1`]): results are bitwise equal to the
//!   interpreter's.
//!
//! All take their operands checked against the update's instance
//! ([`CheckedMut`]: shapes and dtypes verified once by the op's shape rule, which
//! refuses a bf16 table or weight, "not supported yet") and check only data
//! (every index, offsets), before writing: on error the parameters are unchanged.

use super::optim::{
    Grad, Rows, SparsePlan, bag_operands, embedding_update_plan_of, grad_of, gval, operands,
    sparse_sgd_plan_of,
};
use super::{Elem, KResult, internal_in};
use dlrm_ir::interp::{adagrad_acc1, adagrad_row_acc, adagrad_step1};
use dlrm_ir::{CheckedMut, Data, Pool, Tensor};
use rayon::prelude::*;

/// Elements per task of the dense update.
const CHUNK: usize = 1 << 15;

/// Adagrad's hyper-parameters (weight decay only for the dense update): the
/// IR's, as the ops carry them.
pub use dlrm_ir::AdagradHyper as Hyper;

/// The f32 storage of a checked weight or table and of its accumulator (`acc`
/// shaped like `w`, or `[R]` for a row-wise `w[R, D]`: the op's shape rule), and
/// the row width `D` (the last dim; 1 for a scalar).
pub(crate) fn state<'a>(
    op: &'static str,
    ps: &'a mut [Tensor],
) -> KResult<(&'a mut [f32], &'a mut [f32], usize)> {
    let [w, acc] = ps else {
        return Err(internal_in(op, &format!("{} parameters", ps.len())));
    };
    let d = w.shape.last().copied().unwrap_or(1);
    match (&mut w.data, &mut acc.data) {
        (Data::F32(w), Data::F32(a)) => Ok((w, a, d)),
        _ => Err(internal_in(op, "the state's dtypes")),
    }
}

/// `adagrad {lr, eps, wd, rowwise}(w, acc, g)` in place on checked operands.
pub(crate) fn adagrad(c: &mut CheckedMut<'_>, h: Hyper, wd: f32) -> KResult<()> {
    const OP: &str = "adagrad";
    let (ps, rest) = c.split();
    let [g] = *rest else {
        return Err(internal_in(OP, "1 gradient"));
    };
    let grad = grad_of(OP, g)?;
    let (w, a, d) = state(OP, ps)?;
    fn go<G: Elem>(w: &mut [f32], a: &mut [f32], g: &[G], h: Hyper, wd: f32, d: usize) {
        let Some((wc, ac)) = chunks(h, d) else {
            return;
        };
        w.par_chunks_mut(wc)
            .zip(a.par_chunks_mut(ac))
            .zip(g.par_chunks(wc))
            .for_each(|((w, a), g)| dense_chunk(w, a, g, h, wd, d));
    }
    match grad {
        Grad::F32(g) => go(w, a, g, h, wd, d),
        Grad::BF16(g) => go(w, a, g, h, wd, d),
    }
    Ok(())
}

/// The elements of weight and of accumulator per task of the dense update
/// (whole rows when row-wise); `None` when there is nothing to update.
pub(crate) fn chunks(h: Hyper, d: usize) -> Option<(usize, usize)> {
    if !h.rowwise {
        return Some((CHUNK, CHUNK));
    }
    let rows = (CHUNK / d.max(1)).max(1);
    (d > 0).then_some((rows * d, rows))
}

/// The dense update of one task's elements `w` (whole rows of `d` when
/// row-wise), their accumulators `a` and gradient `g`, in order, with the
/// interpreter's scalar functions.
pub(crate) fn dense_chunk<G: Elem>(
    w: &mut [f32],
    a: &mut [f32],
    g: &[G],
    h: Hyper,
    wd: f32,
    d: usize,
) {
    let grad = |w: f32, g: G| {
        let g = g.load();
        if wd != 0.0 { g + wd * w } else { g }
    };
    if h.rowwise {
        let mut gr = vec![0.0f32; d];
        for ((wr, ar), grow) in w.chunks_mut(d).zip(a.iter_mut()).zip(g.chunks(d)) {
            for ((x, &wi), &gi) in gr.iter_mut().zip(wr.iter()).zip(grow) {
                *x = grad(wi, gi);
            }
            *ar = adagrad_row_acc(*ar, &gr);
            for (wi, &gi) in wr.iter_mut().zip(&gr) {
                *wi = adagrad_step1(*wi, gi, *ar, h.lr, h.eps);
            }
        }
    } else {
        for ((wi, ai), &gi) in w.iter_mut().zip(a.iter_mut()).zip(g) {
            let gv = grad(*wi, gi);
            *ai = adagrad_acc1(*ai, gv);
            *wi = adagrad_step1(*wi, gv, *ai, h.lr, h.eps);
        }
    }
}

/// The update of one touched row: `(w[D], acc[D] or acc[1], summed g[D])`.
pub(crate) type RowFn<'a> = &'a (dyn Fn(&mut [f32], &mut [f32], &[f32]) + Sync);

/// The reference row update (the interpreter's scalar functions).
pub(crate) fn reference_row(h: Hyper) -> impl Fn(&mut [f32], &mut [f32], &[f32]) + Sync {
    move |row: &mut [f32], acc: &mut [f32], sum: &[f32]| {
        if h.rowwise {
            let ar = adagrad_row_acc(acc[0], sum);
            acc[0] = ar;
            for (w, &gi) in row.iter_mut().zip(sum) {
                *w = adagrad_step1(*w, gi, ar, h.lr, h.eps);
            }
        } else {
            for ((w, ai), &gi) in row.iter_mut().zip(acc.iter_mut()).zip(sum) {
                *ai = adagrad_acc1(*ai, gi);
                *w = adagrad_step1(*w, gi, *ai, h.lr, h.eps);
            }
        }
    }
}

/// `sparse_adagrad(table, acc, indices, rowgrad)` in place on checked operands,
/// with the row update `row` (the reference's: [`reference_row`]).
pub(crate) fn sparse_adagrad(
    c: &mut CheckedMut<'_>,
    rows: Rows,
    h: Hyper,
    row: RowFn<'_>,
) -> KResult<()> {
    let op = c.name();
    let (ps, [indices, rowgrad]) = operands::<2, 2>(c)?;
    let plan = sparse_sgd_plan_of(op, rows, &ps[0].shape, indices, rowgrad)?;
    let (t, a, _) = state(op, ps)?;
    apply(t, a, &plan, h, row);
    Ok(())
}

/// `embedding_update_adagrad(table, acc, dy, indices[, offsets])` in place (its
/// row-shard form with [`Rows::Shard`]) on checked operands, with the row update
/// `row` (the reference's: [`reference_row`]).
pub(crate) fn embedding_update_adagrad(
    c: &mut CheckedMut<'_>,
    rows: Rows,
    mode: Pool,
    h: Hyper,
    row: RowFn<'_>,
) -> KResult<()> {
    let op = c.name();
    let (ps, rest) = c.split();
    let (dy, indices, offsets) = bag_operands(op, rest)?;
    let storage = ps.first().map(|t| t.shape.clone()).unwrap_or_default();
    let plan = embedding_update_plan_of(op, rows, &storage, mode, dy, indices, offsets)?;
    let (t, a, _) = state(op, ps)?;
    apply(t, a, &plan, h, row);
    Ok(())
}

/// Applies a validated plan to f32 table and accumulator storage, race-free.
fn apply(t: &mut [f32], a: &mut [f32], plan: &SparsePlan<'_>, h: Hyper, row: RowFn<'_>) {
    let d = plan.d;
    if d == 0 || plan.idx.len() == 0 {
        return;
    }
    let rr = plan.range_rows();
    let ad = if h.rowwise { 1 } else { d };
    let first = plan.first;
    t.par_chunks_mut(rr * d)
        .zip(a.par_chunks_mut(rr * ad))
        .enumerate()
        .for_each(|(blk, (part, acc))| match plan.grad {
            Grad::F32(g) => rows_of(part, acc, ad, first + blk * rr, plan, g, row),
            Grad::BF16(g) => rows_of(part, acc, ad, first + blk * rr, plan, g, row),
        });
}

/// One task: the rows `r0 ..` held by `part` (and their accumulators `acc`, `ad`
/// per row): each touched row's gradient summed in index order, then `row`.
fn rows_of<G: Elem>(
    part: &mut [f32],
    acc: &mut [f32],
    ad: usize,
    r0: usize,
    plan: &SparsePlan<'_>,
    g: &[G],
    row: RowFn<'_>,
) {
    let d = plan.d;
    let r1 = r0 + part.len() / d;
    touched_rows(r0, r1, plan, g, |r, sum| match sum {
        None => {
            prefetch(&part[r * d..(r + 1) * d]);
            prefetch(&acc[r * ad..(r + 1) * ad]);
        }
        Some(sum) => row(
            &mut part[r * d..(r + 1) * d],
            &mut acc[r * ad..(r + 1) * ad],
            sum,
        ),
    });
}

/// The touched rows of `r0 .. r1` in increasing order: for each, its summed
/// gradient (its positions in index order, from 0.0) given to `f(local row,
/// Some(sum))`; `f(local row, None)` announces a row a few groups ahead (a
/// random read to prefetch meanwhile).
pub(crate) fn touched_rows<G: Elem>(
    r0: usize,
    r1: usize,
    plan: &SparsePlan<'_>,
    g: &[G],
    mut f: impl FnMut(usize, Option<&[f32]>),
) {
    let d = plan.d;
    let mut hits: Vec<(usize, usize, Option<f32>)> = Vec::new();
    plan.visit(r0, r1, |r, src, div| hits.push((r, src, div)));
    hits.sort_by_key(|h| h.0);
    let groups: Vec<&[(usize, usize, Option<f32>)]> = hits.chunk_by(|a, b| a.0 == b.0).collect();
    let mut sum = vec![0.0f32; d];
    for (k, grp) in groups.iter().enumerate() {
        if let Some(next) = groups.get(k + AHEAD) {
            f(next[0].0 - r0, None);
        }
        sum.iter_mut().for_each(|s| *s = 0.0);
        for &(_, src, div) in grp.iter() {
            for (c, s) in sum.iter_mut().enumerate() {
                *s += gval(g, d, src, c, div);
            }
        }
        f(grp[0].0 - r0, Some(&sum));
    }
}

/// Rows fetched ahead of the one being updated.
const AHEAD: usize = 4;

/// Asks the CPU to bring `v` into the cache (a hint; no effect elsewhere).
#[inline(always)]
pub(crate) fn prefetch<T>(v: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        for line in v.chunks((64 / std::mem::size_of::<T>().max(1)).max(1)) {
            // SAFETY: a prefetch is a hint that never faults; the address is
            // inside `v`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast::<i8>()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = v;
}
