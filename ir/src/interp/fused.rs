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

use super::common::{R, denom, describe, dims1, expect_arity, floats, same_shape, store};
use super::{embedding, optim};
use crate::{Act, DType, Data, Op, Tensor};
use half::bf16;
use std::borrow::Cow;
use std::collections::HashMap;

/// Evaluates a fused op; `dtypes` are the declared result dtypes (right count).
pub(super) fn eval(
    op: &Op,
    ins: &[&Tensor],
    dtypes: &[DType],
    syms: &HashMap<String, usize>,
) -> R<Vec<Tensor>> {
    let out = dtypes
        .first()
        .copied()
        .ok_or_else(|| "internal: no result type".to_string())?;
    let one = |r: R<Tensor>| r.map(|t| vec![t]);
    match op {
        Op::BlockAct { bk, .. } => one(block_act(*bk, ins, out)),
        Op::UnblockAct { k, .. } => one(unblock_act(*k, ins, out)),
        Op::BlockWeight { bn, bk } => one(block_weight(*bn, *bk, ins, out)),
        Op::UnblockWeight { n, k } => one(unblock_weight(*n, *k, ins, out)),
        Op::Brgemm { act } => one(brgemm(*act, ins, out)),
        Op::BrgemmDgrad { act, mask } => one(brgemm_dgrad(*act, *mask, ins, out)),
        Op::BrgemmWgrad { act, n } => brgemm_wgrad(*act, *n, ins, dtypes),
        Op::BceLogits { denom: d } => {
            expect_arity("bce_logits", ins, &[2])?;
            same_shape("logits", ins[0], "label", ins[1])?;
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
            expect_arity("bce_logits_grad", ins, &[2])?;
            same_shape("logits", ins[0], "label", ins[1])?;
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
            expect_arity("embedding_update", ins, &[3, 4])?;
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
        Op::SplitEmbeddingUpdate { mode, lr } => split_embedding_update(*mode, *lr, ins),
        other => Err(format!(
            "internal: `{}` is not a fused op",
            other.mnemonic()
        )),
    }
}

/// Joins the touched rows' f32 masters, updates them as `embedding_update` does,
/// and splits them again: [`split_embedding_update_rows`] on the whole table.
fn split_embedding_update(mode: crate::Pool, lr: f32, ins: &[&Tensor]) -> R<Vec<Tensor>> {
    expect_arity("split_embedding_update", ins, &[4, 5])?;
    let [rows, _] = dims2(ins[0], "table")?;
    split_embedding_update_rows(mode, lr, 0, rows, ins)
}

/// `split_embedding_update_rows {mode, lr, lo, rows}(hi, lo, dy, indices[,
/// offsets])`: [`split_embedding_update`] on a row shard `lo .. lo+Rs` of a table
/// of `rows` rows (indices outside the shard are skipped, as in `sparse_sgd_rows`).
pub(super) fn split_embedding_update_rows(
    mode: crate::Pool,
    lr: f32,
    first: usize,
    rows: usize,
    ins: &[&Tensor],
) -> R<Vec<Tensor>> {
    expect_arity("split_embedding_update_rows", ins, &[4, 5])?;
    same_shape("high half", ins[0], "low half", ins[1])?;
    let hi = bf16_bits(ins[0], "high half")?;
    let lo = bf16_bits(ins[1], "low half")?;
    let [rs, d] = dims2(ins[0], "table shard")?;
    let range = embedding::shard_range(first, rs, rows)?;
    let mut grad_ins = vec![ins[2]];
    grad_ins.extend_from_slice(&ins[3..]);
    let g_t = embedding::embedding_bag_grad(mode, false, &grad_ins, DType::F32)?;
    let g = floats(&g_t, "row gradient")?;
    let idx = super::common::ints(ins[3], "indices")?;
    if g.len() != idx.len() * d {
        return Err(format!(
            "row gradient {} does not match indices {} and shard {}",
            describe(&g_t),
            describe(ins[3]),
            describe(ins[0])
        ));
    }
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

fn dims3(t: &Tensor, what: &str) -> R<[usize; 3]> {
    match t.shape.as_slice() {
        &[a, b, c] => Ok([a, b, c]),
        _ => Err(format!("{what} must have rank 3, got {}", describe(t))),
    }
}

fn dims4(t: &Tensor, what: &str) -> R<[usize; 4]> {
    match t.shape.as_slice() {
        &[a, b, c, d] => Ok([a, b, c, d]),
        _ => Err(format!("{what} must have rank 4, got {}", describe(t))),
    }
}

fn dims2(t: &Tensor, what: &str) -> R<[usize; 2]> {
    super::common::dims2(t, what)
}

/// Checks that `n` entries fill `nb` blocks of `b` (last block not empty).
fn check_fit(what: &str, n: usize, nb: usize, b: usize) -> R<()> {
    if b > 0 && n.div_ceil(b) == nb {
        Ok(())
    } else {
        Err(format!(
            "{what}: {n} entries do not fill {nb} blocks of {b}"
        ))
    }
}

fn block_act(bk: usize, ins: &[&Tensor], out: DType) -> R<Tensor> {
    expect_arity("block_act", ins, &[1])?;
    let [s, k] = dims2(ins[0], "x")?;
    if bk == 0 {
        return Err("block_act: bk must be positive".into());
    }
    let kb = k.div_ceil(bk);
    let x = floats(ins[0], "x")?;
    let mut y = vec![0.0f32; kb * s * bk];
    for si in 0..s {
        for ki in 0..k {
            y[((ki / bk) * s + si) * bk + ki % bk] = x[si * k + ki];
        }
    }
    store(out, vec![kb, s, bk], y)
}

fn unblock_act(k: usize, ins: &[&Tensor], out: DType) -> R<Tensor> {
    expect_arity("unblock_act", ins, &[1])?;
    let [kb, s, bk] = dims3(ins[0], "blocked x")?;
    check_fit("unblock_act", k, kb, bk)?;
    let xb = floats(ins[0], "blocked x")?;
    let mut y = Vec::with_capacity(s * k);
    for si in 0..s {
        for ki in 0..k {
            y.push(xb[((ki / bk) * s + si) * bk + ki % bk]);
        }
    }
    store(out, vec![s, k], y)
}

fn block_weight(bn: usize, bk: usize, ins: &[&Tensor], out: DType) -> R<Tensor> {
    expect_arity("block_weight", ins, &[1])?;
    let [n, k] = dims2(ins[0], "weight")?;
    if bn == 0 || bk == 0 {
        return Err("block_weight: block sizes must be positive".into());
    }
    let (nb, kb) = (n.div_ceil(bn), k.div_ceil(bk));
    let w = floats(ins[0], "weight")?;
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

fn unblock_weight(n: usize, k: usize, ins: &[&Tensor], out: DType) -> R<Tensor> {
    expect_arity("unblock_weight", ins, &[1])?;
    let [nb, kb, bk, bn] = dims4(ins[0], "blocked weight")?;
    check_fit("unblock_weight rows", n, nb, bn)?;
    check_fit("unblock_weight columns", k, kb, bk)?;
    let wb = floats(ins[0], "blocked weight")?;
    let mut y = Vec::with_capacity(n * k);
    for ni in 0..n {
        for ki in 0..k {
            y.push(wb[wb_index(ni, ki, kb, bk, bn)]);
        }
    }
    store(out, vec![n, k], y)
}

/// Shapes of a blocked GEMM: (Nb, Kb, bk, bn) of the weight, checked against the
/// activation `[Kb, S, bk]`; returns S too.
fn check_xw(x: &Tensor, w: &Tensor, xwhat: &str) -> R<([usize; 4], usize)> {
    let [kb, s, bk] = dims3(x, xwhat)?;
    let wd @ [_, wkb, wbk, _] = dims4(w, "blocked weight")?;
    if wkb != kb || wbk != bk {
        return Err(format!(
            "{xwhat} {} does not match blocked weight {}",
            describe(x),
            describe(w)
        ));
    }
    Ok((wd, s))
}

fn brgemm(act: Act, ins: &[&Tensor], out: DType) -> R<Tensor> {
    expect_arity("brgemm", ins, &[3])?;
    let ([nb, kb, bk, bn], s) = check_xw(ins[0], ins[1], "blocked x")?;
    let n = dims1(ins[2], "bias")?;
    check_fit("brgemm bias", n, nb, bn)?;
    let x = floats(ins[0], "blocked x")?;
    let w = floats(ins[1], "blocked weight")?;
    let b = floats(ins[2], "bias")?;
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
                y[(nbi * s + si) * bn + j] = act1(act, acc + b[ni]);
            }
        }
    }
    store(out, vec![nb, s, bn], y)
}

/// `(dy, y, last)` of a gradient op: `act=none` takes `(dy, last)`.
fn dy_y_last<'t>(act: Act, ins: &[&'t Tensor], what: &str) -> R<[&'t Tensor; 3]> {
    if act == Act::None {
        expect_arity(what, ins, &[2])?;
        Ok([ins[0], ins[0], ins[1]])
    } else {
        expect_arity(what, ins, &[3])?;
        Ok([ins[0], ins[1], ins[2]])
    }
}

fn brgemm_dgrad(act: Act, mask: Act, ins: &[&Tensor], out: DType) -> R<Tensor> {
    // With a mask, the last operand is the layer's blocked input.
    let (ins, xb) = match (mask, ins.split_last()) {
        (Act::None, _) | (_, None) => (ins, None),
        (_, Some((xb, rest))) => (rest, Some(*xb)),
    };
    let ins = &dy_y_last(act, ins, "brgemm_dgrad")?;
    same_shape("blocked dy", ins[0], "blocked y", ins[1])?;
    let [nb_dy, s, bn_dy] = dims3(ins[0], "blocked dy")?;
    let [nb, kb, bk, bn] = dims4(ins[2], "blocked weight")?;
    if nb_dy != nb || bn_dy != bn {
        return Err(format!(
            "blocked dy {} does not match blocked weight {}",
            describe(ins[0]),
            describe(ins[2])
        ));
    }
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
        if xb.shape != [kb, s, bk] {
            return Err(format!(
                "blocked x (mask) {} is not the result's [{kb}, {s}, {bk}]",
                describe(xb)
            ));
        }
        let x = floats(xb, "blocked x (mask)")?;
        for (d, &v) in dx.iter_mut().zip(x.iter()) {
            *d = act_grad(mask, *d, v);
        }
    }
    // Padding columns stay exactly 0 whatever the sums gave (signed zeros).
    store(out, vec![kb, s, bk], dx)
}

fn brgemm_wgrad(act: Act, n: usize, ins: &[&Tensor], dtypes: &[DType]) -> R<Vec<Tensor>> {
    let ins = &dy_y_last(act, ins, "brgemm_wgrad")?;
    same_shape("blocked dy", ins[0], "blocked y", ins[1])?;
    let [nb, s, bn] = dims3(ins[0], "blocked dy")?;
    let [kb, sx, bk] = dims3(ins[2], "blocked x")?;
    if sx != s {
        return Err(format!(
            "blocked dy {} and blocked x {} must have the same samples",
            describe(ins[0]),
            describe(ins[2])
        ));
    }
    check_fit("brgemm_wgrad n", n, nb, bn)?;
    let [dw_t, db_t] = dtypes else {
        return Err("internal: brgemm_wgrad has two results".into());
    };
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
        store(*dw_t, vec![nb, kb, bk, bn], dw)?,
        store(*db_t, vec![n], db)?,
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
    expect_arity("split_sgd", ins, &[3])?;
    same_shape("high half", ins[0], "low half", ins[1])?;
    same_shape("weight", ins[0], "gradient", ins[2])?;
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
