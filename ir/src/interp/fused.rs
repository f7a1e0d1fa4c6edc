//! Fused and blocked ops (added by the e-graph and precision passes): the blocked
//! layouts (`block_act`, `unblock_act`, `block_weight`, `unblock_weight`), the
//! batch-reduce GEMM family (`brgemm`, `brgemm_dgrad`, `brgemm_wgrad`), the logits
//! form of BCE (`bce_logits`, `bce_logits_grad`), Split-SGD-BF16 (`split_sgd`) and
//! the fused embedding update (`embedding_update`).
//!
//! Invariants: every blocked result holds 0 in its padding; the brgemm family sums
//! in exactly the order of `linear`, `linear_dx`, `linear_dw` and `linear_db` (see
//! `dense.rs`), so that a blocked plan reproduces the unblocked one bit for bit in
//! f32 (padding terms are `0·w` products, which leave an f32 sum unchanged);
//! `embedding_update` is defined as the composition it replaces and computed by it.

use super::common::{R, denom, describe, dims, floats, store};
use super::{embedding, optim};
use crate::{Act, Checked, DType, Data, Op, Tensor};
use half::bf16;
use std::borrow::Cow;
use std::collections::HashMap;

/// Evaluates a fused op on its checked operands (their shapes, block counts and
/// dtypes are the op's rule, checked by its instance).
pub(super) fn eval(c: &Checked<'_>, syms: &HashMap<String, usize>) -> R<Vec<Tensor>> {
    let ins = c.inputs();
    let out = c.out(0).dtype;
    let one = |r: R<Tensor>| r.map(|t| vec![t]);
    match c.op() {
        Op::BlockAct { bk, .. } => one(block_act(*bk, ins[0], out)),
        Op::UnblockAct { k, .. } => one(unblock_act(*k, ins[0], out)),
        Op::BlockWeight { bn, bk } => one(block_weight(*bn, *bk, ins[0], out)),
        Op::UnblockWeight { n, k } => one(unblock_weight(*n, *k, ins[0], out)),
        Op::Brgemm { act } => one(brgemm(*act, ins, out)),
        Op::BrgemmDgrad { act, mask, .. } => one(brgemm_dgrad(*act, *mask, ins, out)),
        Op::BrgemmWgrad { act, n } => brgemm_wgrad(*act, *n, ins, [out, c.out(1).dtype]),
        Op::BceLogits { denom: d } => {
            let den = denom(d, syms)?;
            let z = floats(ins[0], "logits")?;
            let y = floats(ins[1], "label")?;
            let mut acc = 0.0f32;
            for (&zi, &yi) in z.iter().zip(y.iter()) {
                acc += zi.max(0.0) - zi * yi + (-zi.abs()).exp().ln_1p();
            }
            one(store(out, vec![], vec![acc / den]))
        }
        Op::BceLogitsGrad { denom: d } => {
            let den = denom(d, syms)?;
            let z = floats(ins[0], "logits")?;
            let y = floats(ins[1], "label")?;
            let g = z
                .iter()
                .zip(y.iter())
                .map(|(&zi, &yi)| (sigmoid1(zi) - yi) / den)
                .collect();
            one(store(out, ins[0].shape.clone(), g))
        }
        Op::SplitSgd { lr } => split_sgd(*lr, ins),
        Op::EmbeddingUpdate { mode, lr } => {
            let mut grad_ins = vec![ins[1]];
            grad_ins.extend_from_slice(&ins[2..]);
            let rows = embedding::embedding_bag_grad(*mode, false, &grad_ins, DType::F32)?;
            one(optim::sparse_sgd(
                *lr,
                Cow::Borrowed(ins[0]),
                &[ins[2], &rows],
                out,
            ))
        }
        Op::SplitEmbeddingUpdate { mode, lr } => {
            split_embedding_update_rows(*mode, *lr, (0, c.in_shape(0)[0]), ins)
        }
        Op::SplitEmbeddingUpdateRows { mode, lr, lo, rows } => {
            split_embedding_update_rows(*mode, *lr, (*lo, *rows), ins)
        }
        other => super::common::not_in_family(other, "a fused op"),
    }
}

/// `split_embedding_update_rows {mode, lr, lo, rows}(hi, lo, dy, indices[,
/// offsets])`: [`split_embedding_update`] on a row shard `lo .. lo+Rs` of a table
/// of `rows` rows (indices outside the shard are skipped, as in `sparse_sgd_rows`).
///
/// [`split_embedding_update`]: crate::Op::SplitEmbeddingUpdate
fn split_embedding_update_rows(
    mode: crate::Pool,
    lr: f32,
    (first, rows): (usize, usize),
    ins: &[&Tensor],
) -> R<Vec<Tensor>> {
    let hi = bf16_bits(ins[0], "high half")?;
    let lo = bf16_bits(ins[1], "low half")?;
    let [rs, d] = dims(&ins[0].shape);
    let range = embedding::shard_range(first, rs);
    let mut grad_ins = vec![ins[2]];
    grad_ins.extend_from_slice(&ins[3..]);
    let g_t = embedding::embedding_bag_grad(mode, false, &grad_ins, DType::F32)?;
    let g = floats(&g_t, "row gradient")?;
    let idx = super::common::ints(ins[3], "indices")?;
    let mut scratch: std::collections::BTreeMap<usize, Vec<f32>> = Default::default();
    for (flat, &i) in idx.iter().enumerate() {
        let r = match usize::try_from(i).ok().filter(|&u| u < rows) {
            Some(u) if range.contains(&u) => u - first,
            Some(_) => continue,
            None => {
                return Err(super::common::out_of_range(
                    i,
                    &super::common::index_location(&ins[3].shape, flat),
                    rows,
                ));
            }
        };
        let row = scratch.entry(r).or_insert_with(|| {
            (r * d..(r + 1) * d)
                .map(|e| f32::from_bits((u32::from(hi[e]) << 16) | u32::from(lo[e])))
                .collect()
        });
        for (w, &gv) in row.iter_mut().zip(&g[flat * d..(flat + 1) * d]) {
            *w -= lr * gv;
        }
    }
    let (mut nhi, mut nlo) = (hi, lo);
    for (r, row) in scratch {
        for (k, w) in row.into_iter().enumerate() {
            let b = w.to_bits();
            nhi[r * d + k] = (b >> 16) as u16;
            nlo[r * d + k] = (b & 0xffff) as u16;
        }
    }
    let shape = ins[0].shape.clone();
    Ok(vec![
        Tensor::bf16(
            shape.clone(),
            nhi.into_iter().map(bf16::from_bits).collect(),
        ),
        Tensor::bf16(shape, nlo.into_iter().map(bf16::from_bits).collect()),
    ])
}

fn sigmoid1(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn act1(act: Act, x: f32) -> f32 {
    match act {
        Act::None => x,
        Act::Relu => {
            if x > 0.0 || x.is_nan() {
                x
            } else {
                0.0
            }
        }
        Act::Sigmoid => sigmoid1(x),
    }
}

/// The activation's backward: `dz` from `dy` and the activation's output `y`
/// (exactly `relu_grad` / `sigmoid_grad`).
fn act_grad(act: Act, dy: f32, y: f32) -> f32 {
    match act {
        Act::None => dy,
        Act::Relu => {
            if y > 0.0 {
                dy
            } else {
                0.0
            }
        }
        Act::Sigmoid => dy * y * (1.0 - y),
    }
}

/// `block_act{bk}(x[S,K])` stored as `out`.
pub(crate) fn block_act(bk: usize, x: &Tensor, out: DType) -> R<Tensor> {
    let [s, k] = dims(&x.shape);
    let kb = k.div_ceil(bk);
    let x = floats(x, "x")?;
    let mut y = vec![0.0f32; kb * s * bk];
    for si in 0..s {
        for ki in 0..k {
            y[((ki / bk) * s + si) * bk + ki % bk] = x[si * k + ki];
        }
    }
    store(out, vec![kb, s, bk], y)
}

/// `unblock_act{k}(xb[Kb,S,bk])` stored as `out`.
pub(crate) fn unblock_act(k: usize, xb: &Tensor, out: DType) -> R<Tensor> {
    let [_, s, bk] = dims(&xb.shape);
    let xb = floats(xb, "blocked x")?;
    let mut y = Vec::with_capacity(s * k);
    for si in 0..s {
        for ki in 0..k {
            y.push(xb[((ki / bk) * s + si) * bk + ki % bk]);
        }
    }
    store(out, vec![s, k], y)
}

fn block_weight(bn: usize, bk: usize, w: &Tensor, out: DType) -> R<Tensor> {
    let [n, k] = dims(&w.shape);
    let (nb, kb) = (n.div_ceil(bn), k.div_ceil(bk));
    let w = floats(w, "weight")?;
    let mut y = vec![0.0f32; nb * kb * bk * bn];
    for ni in 0..n {
        for ki in 0..k {
            y[wb_index(ni, ki, kb, bk, bn)] = w[ni * k + ki];
        }
    }
    store(out, vec![nb, kb, bk, bn], y)
}

/// Position of `w[n][k]` in a blocked weight.
fn wb_index(n: usize, k: usize, kb: usize, bk: usize, bn: usize) -> usize {
    (((n / bn) * kb + k / bk) * bk + k % bk) * bn + n % bn
}

fn unblock_weight(n: usize, k: usize, wb: &Tensor, out: DType) -> R<Tensor> {
    let [_, kb, bk, bn] = dims(&wb.shape);
    let wb = floats(wb, "blocked weight")?;
    let mut y = Vec::with_capacity(n * k);
    for ni in 0..n {
        for ki in 0..k {
            y.push(wb[wb_index(ni, ki, kb, bk, bn)]);
        }
    }
    store(out, vec![n, k], y)
}

/// `brgemm` (see [`Op::Brgemm`]) on `ins = (xb, wb[, b])`, stored as `out`.
pub(crate) fn brgemm(act: Act, ins: &[&Tensor], out: DType) -> R<Tensor> {
    let [kb, s, bk] = dims(&ins[0].shape);
    let [nb, _, _, bn] = dims(&ins[1].shape);
    // Without a bias every column is live (the weight's zero padding rows give
    // zero columns) and nothing is added: `act(acc)`.
    let (n, b) = match ins.get(2) {
        Some(b) => (b.shape[0], Some(floats(b, "bias")?)),
        None => (nb * bn, None),
    };
    let x = floats(ins[0], "blocked x")?;
    let w = floats(ins[1], "blocked weight")?;
    let mut y = vec![0.0f32; nb * s * bn];
    for nbi in 0..nb {
        for si in 0..s {
            for j in 0..bn {
                let ni = nbi * bn + j;
                if ni >= n {
                    continue;
                }
                // Σ over k ascending: block by block, then within the block.
                let mut acc = 0.0f32;
                for kbi in 0..kb {
                    let xr = &x[(kbi * s + si) * bk..(kbi * s + si + 1) * bk];
                    let wblk = ((nbi * kb + kbi) * bk) * bn;
                    for (i, &xv) in xr.iter().enumerate() {
                        acc += xv * w[wblk + i * bn + j];
                    }
                }
                let z = match &b {
                    Some(b) => acc + b[ni],
                    None => acc,
                };
                y[(nbi * s + si) * bn + j] = act1(act, z);
            }
        }
    }
    store(out, vec![nb, s, bn], y)
}

/// `(dy, y, last)` of a gradient op: `act=none` takes `(dy, last)`.
fn dy_y_last<'t>(act: Act, ins: &[&'t Tensor]) -> [&'t Tensor; 3] {
    if act == Act::None {
        [ins[0], ins[0], ins[1]]
    } else {
        [ins[0], ins[1], ins[2]]
    }
}

/// `brgemm_dgrad` (see [`Op::BrgemmDgrad`]) on its operands, stored as `out`.
pub(crate) fn brgemm_dgrad(act: Act, mask: Act, ins: &[&Tensor], out: DType) -> R<Tensor> {
    // With a mask, the last operand is the layer's blocked input.
    let (ins, xb) = match (mask, ins.split_last()) {
        (Act::None, _) | (_, None) => (ins, None),
        (_, Some((xb, rest))) => (rest, Some(*xb)),
    };
    let ins = &dy_y_last(act, ins);
    let [_, s, _] = dims(&ins[0].shape);
    let [nb, kb, bk, bn] = dims(&ins[2].shape);
    let dy = floats(ins[0], "blocked dy")?;
    let y = floats(ins[1], "blocked y")?;
    let w = floats(ins[2], "blocked weight")?;
    let dz: Vec<f32> = dy
        .iter()
        .zip(y.iter())
        .map(|(&d, &v)| act_grad(act, d, v))
        .collect();
    let mut dx = vec![0.0f32; kb * s * bk];
    for kbi in 0..kb {
        for si in 0..s {
            for i in 0..bk {
                // Σ over n ascending (transposed weight blocks).
                let mut acc = 0.0f32;
                for nbi in 0..nb {
                    let dzr = &dz[(nbi * s + si) * bn..(nbi * s + si + 1) * bn];
                    let wrow = (((nbi * kb + kbi) * bk) + i) * bn;
                    for (j, &d) in dzr.iter().enumerate() {
                        acc += d * w[wrow + j];
                    }
                }
                dx[(kbi * s + si) * bk + i] = acc;
            }
        }
    }
    if let Some(xb) = xb {
        let x = floats(xb, "blocked x (mask)")?;
        for (d, &v) in dx.iter_mut().zip(x.iter()) {
            *d = act_grad(mask, *d, v);
        }
    }
    // Padding columns stay exactly 0 whatever the sums gave (signed zeros).
    store(out, vec![kb, s, bk], dx)
}

fn brgemm_wgrad(act: Act, n: usize, ins: &[&Tensor], [dw_t, db_t]: [DType; 2]) -> R<Vec<Tensor>> {
    let ins = &dy_y_last(act, ins);
    let [nb, s, bn] = dims(&ins[0].shape);
    let [kb, _, bk] = dims(&ins[2].shape);
    let dy = floats(ins[0], "blocked dy")?;
    let y = floats(ins[1], "blocked y")?;
    let x = floats(ins[2], "blocked x")?;
    let dz: Vec<f32> = dy
        .iter()
        .zip(y.iter())
        .map(|(&d, &v)| act_grad(act, d, v))
        .collect();
    let mut dw = vec![0.0f32; nb * kb * bk * bn];
    let mut db = vec![0.0f32; n];
    for nbi in 0..nb {
        for j in 0..bn {
            let ni = nbi * bn + j;
            if ni >= n {
                continue;
            }
            let dzat = |si: usize| dz[(nbi * s + si) * bn + j];
            for kbi in 0..kb {
                for i in 0..bk {
                    // Batch-reduce over the samples, ascending.
                    let mut acc = 0.0f32;
                    for si in 0..s {
                        acc += dzat(si) * x[(kbi * s + si) * bk + i];
                    }
                    dw[(((nbi * kb + kbi) * bk) + i) * bn + j] = acc;
                }
            }
            let mut acc = 0.0f32;
            for si in 0..s {
                acc += dzat(si);
            }
            db[ni] = acc;
        }
    }
    Ok(vec![
        store(dw_t, vec![nb, kb, bk, bn], dw)?,
        store(db_t, vec![n], db)?,
    ])
}

fn bf16_bits(t: &Tensor, what: &str) -> R<Vec<u16>> {
    super::common::check_len(t, what)?;
    match &t.data {
        Data::BF16(v) => Ok(v.iter().map(|x| x.to_bits()).collect()),
        _ => Err(format!("{what} must be bf16, got {}", describe(t))),
    }
}

fn split_sgd(lr: f32, ins: &[&Tensor]) -> R<Vec<Tensor>> {
    let hi = bf16_bits(ins[0], "high half")?;
    let lo = bf16_bits(ins[1], "low half")?;
    let g = floats(ins[2], "gradient")?;
    let mut nhi = Vec::with_capacity(hi.len());
    let mut nlo = Vec::with_capacity(hi.len());
    for ((&h, &l), &gv) in hi.iter().zip(&lo).zip(g.iter()) {
        let w = f32::from_bits((u32::from(h) << 16) | u32::from(l));
        let bits = (w - lr * gv).to_bits();
        nhi.push(bf16::from_bits((bits >> 16) as u16));
        nlo.push(bf16::from_bits((bits & 0xffff) as u16));
    }
    let shape = ins[0].shape.clone();
    Ok(vec![
        Tensor::bf16(shape.clone(), nhi),
        Tensor::bf16(shape, nlo),
    ])
}
