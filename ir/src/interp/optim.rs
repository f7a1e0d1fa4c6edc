//! Optimizer updates: `sgd` (dense) and `sparse_sgd` (embedding rows).
//!
//! Both are functional in the IR (they return the new parameter) and compute in f32:
//! - `sgd`: `w' = w - lr·g` elementwise, stored in the result dtype.
//! - `sparse_sgd`: the table is widened to f32, then for every index in row-major
//!   order `table[idx] -= lr·rowgrad[i]` (element by element, `d` ascending), and
//!   the result is stored in the result dtype. For a bf16 table this means a row hit
//!   by several indices is rounded to bf16 once, after all its updates (not after
//!   each). Rows never indexed come back bit-identical.
//!
//! Every index is validated before any update is applied.

use super::common::{R, dims, floats, index_location, ints, out_of_range, store};
use crate::{Checked, DType, Data, Op, Tensor};
use half::bf16;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// Evaluates `sgd`, `sparse_sgd`, `sparse_sgd_rows` or `embedding_update_rows` on
/// its checked operands (their shapes are the op's rule, checked by its instance).
pub(super) fn eval(c: &Checked<'_>) -> R<Tensor> {
    let ins = c.inputs();
    let out = c.out(0).dtype;
    match *c.op() {
        Op::Sgd { lr } => {
            let w = floats(ins[0], "weight")?;
            let g = floats(ins[1], "gradient")?;
            let y = w.iter().zip(g.iter()).map(|(&a, &b)| a - lr * b).collect();
            store(out, ins[0].shape.clone(), y)
        }
        Op::SparseSgd { lr } => sparse_sgd(lr, Cow::Borrowed(ins[0]), &ins[1..], out),
        Op::SparseSgdRows { lr, lo, rows } => {
            sparse_sgd_rows(lr, (lo, rows), Cow::Borrowed(ins[0]), ins[1], ins[2], out)
        }
        Op::EmbeddingUpdateRows { mode, lr, lo, rows } => {
            let mut grad_ins = vec![ins[1]];
            grad_ins.extend_from_slice(&ins[2..]);
            let rowgrad = super::embedding::embedding_bag_grad(mode, false, &grad_ins, DType::F32)?;
            sparse_sgd_rows(lr, (lo, rows), Cow::Borrowed(ins[0]), ins[2], &rowgrad, out)
        }
        ref other => super::common::not_in_family(other, "an SGD update"),
    }
}

/// `sparse_sgd(table[R,D], indices[..], rowgrad[.., D])`. The table is taken as a
/// `Cow` so that a caller owning it (the interpreter's `run`, at the table's last
/// use) has it updated in place without a copy. The operands satisfy the rule of
/// `sparse_sgd` (checked by its instance, or built so by the callers here).
pub(super) fn sparse_sgd(
    lr: f32,
    table: Cow<'_, Tensor>,
    ins: &[&Tensor],
    out: DType,
) -> R<Tensor> {
    // `ins` are the indices and the row gradient, and the bag bounds of a
    // `last_offset` bag: only the indices it reads are applied.
    let narrowed;
    let (idx_t, g_t) = match ins {
        [i, g] => (*i, *g),
        [i, g, bounds] => {
            narrowed = super::jagged::narrow_to_bags(i, g, bounds)?;
            (&narrowed.0, &narrowed.1)
        }
        _ => return Err("internal: `sparse_sgd` without its operands".into()),
    };
    let [rows, d] = dims(&table.shape);
    let raw = ints(idx_t, "indices")?;
    let g = floats(g_t, "row gradient")?;
    let mut idx = Vec::with_capacity(raw.len());
    for (flat, &i) in raw.iter().enumerate() {
        match usize::try_from(i).ok().filter(|&u| u < rows) {
            Some(u) => idx.push(u),
            None => {
                return Err(out_of_range(i, &index_location(&idx_t.shape, flat), rows));
            }
        }
    }
    let shape = table.shape.clone();
    match (&table.data, out) {
        (Data::BF16(_), DType::BF16) => {
            // Only the touched rows are widened; untouched rows are unchanged by
            // widen-then-round, so this equals widening the whole table.
            let mut t = table.into_owned();
            let Data::BF16(v) = &mut t.data else {
                return Err("internal: table dtype changed".into());
            };
            let mut scratch: BTreeMap<usize, Vec<f32>> = BTreeMap::new();
            for (i, &r) in idx.iter().enumerate() {
                let row = scratch
                    .entry(r)
                    .or_insert_with(|| v[r * d..(r + 1) * d].iter().map(|x| x.to_f32()).collect());
                for (w, &gv) in row.iter_mut().zip(&g[i * d..(i + 1) * d]) {
                    *w -= lr * gv;
                }
            }
            for (r, row) in scratch {
                for (dst, w) in v[r * d..(r + 1) * d].iter_mut().zip(row) {
                    *dst = bf16::from_f32(w);
                }
            }
            Ok(t)
        }
        _ => {
            let mut v: Vec<f32> = match table {
                Cow::Owned(Tensor {
                    data: Data::F32(v), ..
                }) => v,
                other => floats(&other, "table")?.into_owned(),
            };
            for (i, &r) in idx.iter().enumerate() {
                for (w, &gv) in v[r * d..(r + 1) * d].iter_mut().zip(&g[i * d..(i + 1) * d]) {
                    *w -= lr * gv;
                }
            }
            store(out, shape, v)
        }
    }
}

/// `sparse_sgd_rows {lr, lo, rows}(shard[Rs,D], indices[..], rowgrad[.., D])`: every
/// index is checked against the whole table (`0..rows`), then the in-range ones
/// (shifted by `lo`, in row-major order) update the shard exactly as `sparse_sgd`.
fn sparse_sgd_rows(
    lr: f32,
    (lo, rows): (usize, usize),
    table: Cow<'_, Tensor>,
    idx_t: &Tensor,
    g_t: &Tensor,
    out: DType,
) -> R<Tensor> {
    let [rs, d] = dims(&table.shape);
    let range = super::embedding::shard_range(lo, rs);
    let raw = ints(idx_t, "indices")?;
    let g = floats(g_t, "row gradient")?;
    let mut local = Vec::new();
    let mut grads = Vec::new();
    for (flat, &i) in raw.iter().enumerate() {
        match usize::try_from(i).ok().filter(|&u| u < rows) {
            Some(u) if range.contains(&u) => {
                local.push((u - lo) as i64);
                grads.extend_from_slice(&g[flat * d..(flat + 1) * d]);
            }
            Some(_) => {}
            None => {
                return Err(out_of_range(i, &index_location(&idx_t.shape, flat), rows));
            }
        }
    }
    let n = local.len();
    let idx = Tensor {
        shape: vec![n],
        data: Data::I64(local),
    };
    let rowgrad = Tensor {
        shape: vec![n, d],
        data: Data::F32(grads),
    };
    sparse_sgd(lr, table, &[&idx, &rowgrad], out)
}
