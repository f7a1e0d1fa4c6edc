//! In-place reference kernels of the Split-Adagrad module ops
//! (`dlrm_ir::ops::split_adagrad`, whose doc is the specification): Adagrad on
//! the f32 master `hi << 16 | lo` of a Split-SGD-BF16 parameter, f32
//! accumulator.
//!
//! - `split_adagrad`: the dense update of [`super::adagrad`] ([`dense_chunk`],
//!   the same tasks), each task joining its elements' masters into f32, updating
//!   them and splitting them again.
//! - `split_embedding_update_adagrad`: the race-free owner-computes table
//!   update of [`super::adagrad`] (each task owns a range of rows of both halves
//!   and of the accumulator, scans all indices, sums each touched row's gradient
//!   in index order: [`touched_rows`]); each touched row is joined, updated by
//!   the reference row update ([`reference_row`]; the JIT's Adagrad row kernel
//!   on the JIT path, `jit::adagrad`) and split again.
//!
//! Every float operation is the interpreter's, on the same master: results equal
//! the interpreter's bit for bit. Operands come checked against the update's
//! instance ([`CheckedMut`]); the kernels check only data (indices, offsets),
//! before writing.

use super::adagrad::{Hyper, RowFn, chunks, dense_chunk, prefetch, reference_row, touched_rows};
use super::optim::{Grad, Rows, SparsePlan, bag_operands, embedding_update_plan_of, grad_of};
use super::{Elem, KResult, internal_in};
use dlrm_ir::module::ModOp;
use dlrm_ir::ops::split_adagrad::{self as spec, join1, split1};
use dlrm_ir::{CheckedMut, Data, Tensor};
use half::bf16;
use rayon::prelude::*;

/// `split_adagrad` in place (its kernel in the registry, `crate::modules`).
pub(crate) fn dense_update(m: &ModOp, c: &mut CheckedMut<'_>) -> Option<KResult<()>> {
    let (h, wd) = spec::dense_attrs(m);
    Some(split_adagrad(c, h, wd))
}

/// `split_embedding_update_adagrad` in place with the reference row update (its
/// kernel in the registry; the JIT's is `jit::adagrad::split_table_update`).
pub(crate) fn table_update(m: &ModOp, c: &mut CheckedMut<'_>) -> Option<KResult<()>> {
    let row = reference_row(spec::table_attrs(m).1);
    Some(split_embedding_update_adagrad(c, m, &row))
}

/// The storage of a checked split update: the parameter's shape, its halves
/// and its accumulator.
struct Split<'a> {
    shape: &'a [usize],
    hi: &'a mut [bf16],
    lo: &'a mut [bf16],
    acc: &'a mut [f32],
}

/// The halves and accumulator of a checked split update.
fn state<'a>(op: &'static str, ps: &'a mut [Tensor]) -> KResult<Split<'a>> {
    match ps {
        [hi, lo, acc] => match (&mut hi.data, &mut lo.data, &mut acc.data) {
            (Data::BF16(h), Data::BF16(l), Data::F32(a)) => Ok(Split {
                shape: &hi.shape,
                hi: h,
                lo: l,
                acc: a,
            }),
            _ => Err(internal_in(op, "the state's dtypes")),
        },
        _ => Err(internal_in(op, &format!("{} parameters", ps.len()))),
    }
}

/// Joins `hi`, `lo` into `w`.
#[inline]
fn join(w: &mut [f32], hi: &[bf16], lo: &[bf16]) {
    for ((w, &h), &l) in w.iter_mut().zip(hi).zip(lo) {
        *w = join1(h, l);
    }
}

/// Splits `w` into `hi`, `lo`.
#[inline]
fn split(w: &[f32], hi: &mut [bf16], lo: &mut [bf16]) {
    for ((&w, h), l) in w.iter().zip(hi).zip(lo) {
        (*h, *l) = split1(w);
    }
}

/// `split_adagrad {lr, eps, wd, rowwise}(hi, lo, acc, g)` in place.
fn split_adagrad(c: &mut CheckedMut<'_>, h: Hyper, wd: f32) -> KResult<()> {
    const OP: &str = spec::DENSE;
    let (ps, rest) = c.split();
    let [g] = *rest else {
        return Err(internal_in(OP, "1 gradient"));
    };
    let grad = grad_of(OP, g)?;
    let Split { shape, hi, lo, acc } = state(OP, ps)?;
    let d = shape.last().copied().unwrap_or(1);
    fn go<G: Elem>(
        hi: &mut [bf16],
        lo: &mut [bf16],
        a: &mut [f32],
        g: &[G],
        (h, wd, d): (Hyper, f32, usize),
    ) {
        let Some((wc, ac)) = chunks(h, d) else {
            return;
        };
        hi.par_chunks_mut(wc)
            .zip(lo.par_chunks_mut(wc))
            .zip(a.par_chunks_mut(ac))
            .zip(g.par_chunks(wc))
            .for_each(|(((hi, lo), a), g)| {
                let mut w = vec![0.0f32; hi.len()];
                join(&mut w, hi, lo);
                dense_chunk(&mut w, a, g, h, wd, d);
                split(&w, hi, lo);
            });
    }
    match grad {
        Grad::F32(g) => go(hi, lo, acc, g, (h, wd, d)),
        Grad::BF16(g) => go(hi, lo, acc, g, (h, wd, d)),
    }
    Ok(())
}

/// `split_embedding_update_adagrad {mode, lr, eps, rowwise, lo, rows}(hi, lo,
/// acc, dy, indices[, offsets])` in place, each touched row's joined master
/// updated by `row` (the reference's, [`reference_row`], or the JIT's).
pub(crate) fn split_embedding_update_adagrad(
    c: &mut CheckedMut<'_>,
    m: &ModOp,
    row: RowFn<'_>,
) -> KResult<()> {
    let (mode, h, (first, total)) = spec::table_attrs(m);
    let op = c.name();
    let (ps, rest) = c.split();
    let (dy, indices, offsets) = bag_operands(op, rest)?;
    let storage = ps.first().map(|t| t.shape.clone()).unwrap_or_default();
    let rows = Rows::Shard { first, total };
    let plan = embedding_update_plan_of(op, rows, &storage, mode, dy, indices, offsets)?;
    let Split { hi, lo, acc, .. } = state(op, ps)?;
    let d = plan.d;
    if d == 0 || plan.idx.len() == 0 {
        return Ok(());
    }
    let rr = plan.range_rows();
    let ad = if h.rowwise { 1 } else { d };
    hi.par_chunks_mut(rr * d)
        .zip(lo.par_chunks_mut(rr * d))
        .zip(acc.par_chunks_mut(rr * ad))
        .enumerate()
        .for_each(|(blk, ((hp, lp), ap))| {
            let r0 = plan.first + blk * rr;
            match plan.grad {
                Grad::F32(g) => task(hp, lp, ap, (r0, ad), &plan, g, row),
                Grad::BF16(g) => task(hp, lp, ap, (r0, ad), &plan, g, row),
            }
        });
    Ok(())
}

/// One task of the table update: the rows `r0 ..` held by `hi`, `lo` (and their
/// accumulators `acc`, `ad` per row).
fn task<G: Elem>(
    hi: &mut [bf16],
    lo: &mut [bf16],
    acc: &mut [f32],
    (r0, ad): (usize, usize),
    plan: &SparsePlan<'_>,
    g: &[G],
    row: RowFn<'_>,
) {
    let d = plan.d;
    let r1 = r0 + hi.len() / d;
    let mut w = vec![0.0f32; d];
    touched_rows(r0, r1, plan, g, |r, sum| {
        let (e, a) = (r * d..(r + 1) * d, r * ad..(r + 1) * ad);
        match sum {
            None => {
                prefetch(&hi[e.clone()]);
                prefetch(&lo[e]);
                prefetch(&acc[a]);
            }
            Some(sum) => {
                join(&mut w, &hi[e.clone()], &lo[e.clone()]);
                row(&mut w, &mut acc[a], sum);
                split(&w, &mut hi[e.clone()], &mut lo[e]);
            }
        }
    });
}
