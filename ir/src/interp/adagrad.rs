//! Adagrad updates: `adagrad` (dense), `sparse_adagrad` (embedding rows), the fused
//! `embedding_update_adagrad` and its row-shard form. All compute in f32 on f32
//! state; every index is validated before anything is computed.
//!
//! The per-element arithmetic is written once here ([`adagrad_acc1`],
//! [`adagrad_row_acc`], [`adagrad_step1`]) and called by the kernels, so they
//! equal the interpreter bit for bit by construction:
//! - elementwise: `G = acc + g·g`, `w' = w - lr·(g / (sqrt(G) + eps))`;
//! - row-wise: `G = acc[r] + (Σ_j g_j·g_j) / D` (sum from 0.0, `j` ascending), then
//!   every element of the row with that `G`.
//!
//! Sparse forms coalesce first: one gradient row per distinct table row, the sum of
//! its row gradients in row-major index order from 0.0; each touched row is then
//! updated once (rows are independent, so the order of rows is immaterial).

use super::common::{R, describe, dims, floats, index_location, ints, out_of_range};
use super::embedding;
use crate::{AdagradHyper as Hyper, Checked, DType, Data, Op, Tensor};
use std::collections::BTreeMap;

/// The elementwise accumulator update: `acc + g·g`.
#[inline]
pub fn adagrad_acc1(acc: f32, g: f32) -> f32 {
    acc + g * g
}

/// The row-wise accumulator update: `acc + (Σ_j g_j·g_j) / D` over the row `g`.
#[inline]
pub fn adagrad_row_acc(acc: f32, g: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &x in g {
        s += x * x;
    }
    acc + s / g.len() as f32
}

/// The weight update given the new accumulator `acc`: `w - lr·(g / (sqrt(acc) + eps))`.
#[inline]
pub fn adagrad_step1(w: f32, g: f32, acc: f32, lr: f32, eps: f32) -> f32 {
    w - lr * (g / (acc.sqrt() + eps))
}

fn f32_vec(t: &Tensor, what: &str) -> R<Vec<f32>> {
    match &t.data {
        Data::F32(v) => Ok(v.clone()),
        _ => Err(format!("{what} must be f32, got {}", describe(t))),
    }
}

/// Evaluates an Adagrad update on its checked operands (their shapes and the f32
/// state are the op's rule, checked by its instance).
pub(super) fn eval(c: &Checked<'_>) -> R<Vec<Tensor>> {
    let ins = c.inputs();
    let rows = |i: usize| c.in_shape(i)[0];
    if let Some((mode, h)) = c.op().embedding_adagrad() {
        let shard = match *c.op() {
            Op::EmbeddingUpdateAdagradRows { lo, rows, .. } => (lo, rows),
            _ => (0, rows(0)),
        };
        let rowgrad = embedding::embedding_bag_grad(mode, false, &ins[2..], DType::F32)?;
        return sparse_adagrad_rows(h, shard, ins[0], ins[1], ins[3], &rowgrad);
    }
    match *c.op() {
        Op::Adagrad {
            lr,
            eps,
            wd,
            rowwise,
        } => adagrad(lr, eps, wd, rowwise, ins),
        Op::SparseAdagrad { lr, eps, rowwise } => {
            let h = Hyper { lr, eps, rowwise };
            if let Some(bounds) = ins.get(4) {
                // A `last_offset` bag's bounds: only the indices it reads are applied.
                let (idx, g) = super::jagged::narrow_to_bags(ins[2], ins[3], bounds)?;
                return sparse_adagrad_rows(h, (0, rows(0)), ins[0], ins[1], &idx, &g);
            }
            sparse_adagrad_rows(h, (0, rows(0)), ins[0], ins[1], ins[2], ins[3])
        }
        ref other => super::common::not_in_family(other, "an Adagrad update"),
    }
}

/// `adagrad {lr, eps, wd, rowwise}(w, acc, g) -> (w', acc')`.
fn adagrad(lr: f32, eps: f32, wd: f32, rowwise: bool, ins: &[&Tensor]) -> R<Vec<Tensor>> {
    let mut w = f32_vec(ins[0], "weight")?;
    let mut acc = f32_vec(ins[1], "accumulator")?;
    let mut g = floats(ins[2], "gradient")?.into_owned();
    if wd != 0.0 {
        for (gi, &wi) in g.iter_mut().zip(&w) {
            *gi += wd * wi;
        }
    }
    if rowwise {
        let d = ins[0].shape[1];
        if d > 0 {
            for ((wr, gr), a) in w.chunks_mut(d).zip(g.chunks(d)).zip(acc.iter_mut()) {
                *a = adagrad_row_acc(*a, gr);
                for (wi, &gi) in wr.iter_mut().zip(gr) {
                    *wi = adagrad_step1(*wi, gi, *a, lr, eps);
                }
            }
        }
    } else {
        for ((wi, &gi), a) in w.iter_mut().zip(&g).zip(acc.iter_mut()) {
            *a = adagrad_acc1(*a, gi);
            *wi = adagrad_step1(*wi, gi, *a, lr, eps);
        }
    }
    Ok(vec![
        Tensor::f32(ins[0].shape.clone(), w),
        Tensor::f32(ins[1].shape.clone(), acc),
    ])
}

/// The sparse update of the rows `lo .. lo+Rs` of a table of `rows` rows held by
/// `table[Rs, D]` (the whole table when `lo = 0`, `Rs = rows`): every index is
/// checked against `0..rows`, those outside the shard are skipped.
fn sparse_adagrad_rows(
    h: Hyper,
    (lo, rows): (usize, usize),
    table: &Tensor,
    acc: &Tensor,
    idx_t: &Tensor,
    g_t: &Tensor,
) -> R<Vec<Tensor>> {
    let [rs, d] = dims(&table.shape);
    let range = embedding::shard_range(lo, rs);
    let raw = ints(idx_t, "indices")?;
    let g = floats(g_t, "row gradient")?;
    // Coalesce: one summed gradient per touched (local) row.
    let mut sums: BTreeMap<usize, Vec<f32>> = BTreeMap::new();
    for (flat, &i) in raw.iter().enumerate() {
        match usize::try_from(i).ok().filter(|&u| u < rows) {
            Some(u) if range.contains(&u) => {
                let row = sums.entry(u - lo).or_insert_with(|| vec![0.0; d]);
                for (s, &x) in row.iter_mut().zip(&g[flat * d..(flat + 1) * d]) {
                    *s += x;
                }
            }
            Some(_) => {}
            None => return Err(out_of_range(i, &index_location(&idx_t.shape, flat), rows)),
        }
    }
    let mut w = f32_vec(table, "table")?;
    let mut a = f32_vec(acc, "accumulator")?;
    for (r, gr) in sums {
        let wr = &mut w[r * d..(r + 1) * d];
        if h.rowwise {
            a[r] = adagrad_row_acc(a[r], &gr);
            for (wi, &gi) in wr.iter_mut().zip(&gr) {
                *wi = adagrad_step1(*wi, gi, a[r], h.lr, h.eps);
            }
        } else {
            let ar = &mut a[r * d..(r + 1) * d];
            for ((wi, &gi), ai) in wr.iter_mut().zip(&gr).zip(ar.iter_mut()) {
                *ai = adagrad_acc1(*ai, gi);
                *wi = adagrad_step1(*wi, gi, *ai, h.lr, h.eps);
            }
        }
    }
    Ok(vec![
        Tensor::f32(table.shape.clone(), w),
        Tensor::f32(acc.shape.clone(), a),
    ])
}
