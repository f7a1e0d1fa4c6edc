//! Reference kernels of the blocked GEMM family: `block_act`, `unblock_act`,
//! `brgemm`, `brgemm_dgrad`, `brgemm_wgrad` (f32 and bf16 storage).
//!
//! Layouts (see `dlrm_ir::Op`): a blocked activation is `[Kb][S][bk]`, a blocked
//! weight `[Nb][Kb][bk][bn]` (`w[n][k]` at `((n/bn·Kb + k/bk)·bk + k%bk)·bn + n%bn`).
//!
//! Invariants:
//! - every element is computed with exactly the interpreter's sequence of f32
//!   operations (`dlrm_ir::interp`, `fused.rs`): one accumulator per output,
//!   summed over `k` (forward), `n` (dgrad) or `s` (wgrad, bias gradient)
//!   ascending, multiplications and additions unfused, bias added after the sum,
//!   `dz = act'(dy, y)` computed first. The results are therefore bitwise equal
//!   to the interpreter's, whatever the rayon split;
//! - padding outputs are 0 where the interpreter writes 0 (forward columns
//!   `n >= N`, weight-gradient columns `n >= N`); dgrad's padding rows come out of
//!   the sum (`Σ dz·0`) as in the interpreter;
//! - bf16 operands are widened exactly; bf16 results are rounded to nearest even.
//!
//! Parallelism: one rayon task per output block (`[nb]` or `[kb]` slab, or a
//! weight-gradient block), disjoint writes only.

use super::{KResult, arity, data_len, shape_err};
use dlrm_ir::{Act, DType, Data, Op, Tensor, TensorType};
use half::bf16;
use rayon::prelude::*;
use std::borrow::Cow;

/// Evaluates a blocked op, or `None` if `op` is not one of this family (or an
/// operand is not a float tensor, or a result dtype is not f32/bf16).
pub fn try_eval(
    op: &Op,
    inputs: &[&Tensor],
    out_types: &[TensorType],
) -> Option<KResult<Vec<Tensor>>> {
    let out = out_types.first()?.dtype;
    if out_types
        .iter()
        .any(|t| !matches!(t.dtype, DType::F32 | DType::BF16))
        || inputs.iter().any(|t| !is_float(t))
    {
        return None;
    }
    let one = |r: KResult<Tensor>| r.map(|t| vec![t]);
    Some(match op {
        Op::BlockAct { bk, .. } => one(block_act(*bk, inputs, out)),
        Op::UnblockAct { k, .. } => one(unblock_act(*k, inputs, out)),
        Op::Brgemm { act } => one(brgemm(*act, inputs, out)),
        Op::BrgemmDgrad { act, mask } => one(brgemm_dgrad(*act, *mask, inputs, out)),
        Op::BrgemmWgrad { act, n } => brgemm_wgrad(*act, *n, inputs, out_types),
        _ => return None,
    })
}

fn is_float(t: &Tensor) -> bool {
    matches!(t.data, Data::F32(_) | Data::BF16(_))
}

/// The operand as f32 (borrowed when it is f32).
pub(crate) fn floats(t: &Tensor) -> Cow<'_, [f32]> {
    match &t.data {
        Data::F32(v) => Cow::Borrowed(v.as_slice()),
        Data::BF16(v) => Cow::Owned(v.par_iter().map(|x| x.to_f32()).collect()),
        _ => Cow::Owned(Vec::new()),
    }
}

/// A result of `dtype` (bf16: round to nearest even).
pub(crate) fn store(dtype: DType, shape: Vec<usize>, v: Vec<f32>) -> Tensor {
    match dtype {
        DType::BF16 => Tensor::bf16(shape, v.par_iter().map(|&x| bf16::from_f32(x)).collect()),
        _ => Tensor::f32(shape, v),
    }
}

/// The dims of a rank-`R` operand.
pub(crate) fn dims<const R: usize>(
    op: &'static str,
    what: &str,
    t: &Tensor,
) -> KResult<[usize; R]> {
    <[usize; R]>::try_from(t.shape.as_slice()).map_err(|_| {
        shape_err(
            op,
            format!("{what} must have rank {R}, got shape {:?}", t.shape),
        )
    })
}

/// Checks that `n` entries fill `nb` blocks of `b` (last block not empty).
pub(crate) fn check_fit(
    op: &'static str,
    what: &str,
    n: usize,
    nb: usize,
    b: usize,
) -> KResult<()> {
    if b > 0 && n.div_ceil(b) == nb {
        Ok(())
    } else {
        Err(shape_err(
            op,
            format!("{what}: {n} entries do not fill {nb} blocks of {b}"),
        ))
    }
}

/// `(dy, y, last)`: `act=none` takes `(dy, last)` (then `y` is `dy`, unused).
pub(crate) fn dy_y_last<'t>(
    op: &'static str,
    act: Act,
    ins: &[&'t Tensor],
) -> KResult<[&'t Tensor; 3]> {
    if act == Act::None {
        arity(op, ins, &[2])?;
        Ok([ins[0], ins[0], ins[1]])
    } else {
        arity(op, ins, &[3])?;
        Ok([ins[0], ins[1], ins[2]])
    }
}

/// The activation's forward, exactly as the interpreter (`relu` keeps NaN).
#[inline]
pub(crate) fn act1(act: Act, x: f32) -> f32 {
    match act {
        Act::None => x,
        Act::Relu => {
            if x > 0.0 || x.is_nan() {
                x
            } else {
                0.0
            }
        }
        Act::Sigmoid => 1.0 / (1.0 + (-x).exp()),
    }
}

/// `dz = act'(dy, y)` (`relu_grad` / `sigmoid_grad` / identity).
#[inline]
pub(crate) fn act_grad(act: Act, dy: f32, y: f32) -> f32 {
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

/// `dz` of a gradient op as f32 (borrowed `dy` when `act=none` and `dy` is f32).
pub(crate) fn dz_of<'t>(act: Act, dy: &'t Tensor, y: &Tensor) -> Cow<'t, [f32]> {
    let d = floats(dy);
    if act == Act::None {
        return d;
    }
    Cow::Owned(act_grads(act, &d, &floats(y)))
}

/// `act'(dy, y)` elementwise (over the shorter of the two), in parallel: each
/// exactly [`act_grad`], the activation matched once per chunk so the loops
/// vectorise (with a per-element match this loop was 36% of a `brgemm_dgrad`
/// at 2048×512→128 in `perf`, ~1.0 of 2.8 ms; now 19%, ~0.4 of 2.0 ms).
pub(crate) fn act_grads(act: Act, dy: &[f32], y: &[f32]) -> Vec<f32> {
    const CHUNK: usize = 1 << 14;
    let n = dy.len().min(y.len());
    let mut out: Vec<f32> = Vec::with_capacity(n);
    out.spare_capacity_mut()[..n]
        .par_chunks_mut(CHUNK)
        .zip(dy[..n].par_chunks(CHUNK).zip(y[..n].par_chunks(CHUNK)))
        .for_each(|(o, (d, y))| {
            let it = o.iter_mut().zip(d.iter().zip(y));
            // One loop per activation, each on `act_grad` with a constant `act`
            // (inlined and folded: a select or a product, vectorised).
            match act {
                Act::None => it.for_each(|(o, (&d, _))| {
                    o.write(d);
                }),
                Act::Relu => it.for_each(|(o, (&d, &y))| {
                    o.write(act_grad(Act::Relu, d, y));
                }),
                Act::Sigmoid => it.for_each(|(o, (&d, &y))| {
                    o.write(act_grad(Act::Sigmoid, d, y));
                }),
            }
        });
    // SAFETY: the chunks of `out`'s first `n` spare elements are zipped with
    // the chunks of `dy[..n]` (same lengths), and every element was written.
    unsafe { out.set_len(n) };
    out
}

/// Checks `[Kb,S,bk]` against `[Nb,Kb,bk,bn]`; returns `([Nb,Kb,bk,bn], S)`.
pub(crate) fn check_xw(
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    xwhat: &str,
) -> KResult<([usize; 4], usize)> {
    let [kb, s, bk] = dims::<3>(op, xwhat, x)?;
    let wd @ [_, wkb, wbk, _] = dims::<4>(op, "blocked weight", w)?;
    if wkb != kb || wbk != bk {
        return Err(shape_err(
            op,
            format!(
                "{xwhat} {:?} does not match blocked weight {:?}",
                x.shape, w.shape
            ),
        ));
    }
    Ok((wd, s))
}

/// `block_act{bk}(x[S,K]) -> [ceil(K/bk), S, bk]`.
pub fn block_act(bk: usize, ins: &[&Tensor], out: DType) -> KResult<Tensor> {
    const OP: &str = "block_act";
    arity(OP, ins, &[1])?;
    let [s, k] = dims::<2>(OP, "x", ins[0])?;
    if bk == 0 {
        return Err(shape_err(OP, "bk must be positive".into()));
    }
    let kb = k.div_ceil(bk);
    let x = floats(ins[0]);
    let mut y = vec![0.0f32; kb * s * bk];
    if s > 0 {
        y.par_chunks_mut(s * bk).enumerate().for_each(|(kbi, blk)| {
            let k0 = kbi * bk;
            let w = bk.min(k - k0);
            for (si, row) in blk.chunks_mut(bk).enumerate() {
                row[..w].copy_from_slice(&x[si * k + k0..si * k + k0 + w]);
            }
        });
    }
    Ok(store(out, vec![kb, s, bk], y))
}

/// `unblock_act{k}(xb[Kb,S,bk]) -> [S, k]`.
pub fn unblock_act(k: usize, ins: &[&Tensor], out: DType) -> KResult<Tensor> {
    const OP: &str = "unblock_act";
    arity(OP, ins, &[1])?;
    let [kb, s, bk] = dims::<3>(OP, "blocked x", ins[0])?;
    check_fit(OP, "unblock_act", k, kb, bk)?;
    let xb = floats(ins[0]);
    let mut y = vec![0.0f32; s * k];
    if k > 0 {
        y.par_chunks_mut(k).enumerate().for_each(|(si, row)| {
            for (kbi, dst) in row.chunks_mut(bk).enumerate() {
                let src = (kbi * s + si) * bk;
                dst.copy_from_slice(&xb[src..src + dst.len()]);
            }
        });
    }
    Ok(store(out, vec![s, k], y))
}

/// `brgemm(xb[Kb,S,bk], wb[Nb,Kb,bk,bn], b[N]) -> act(x·wᵀ + b)` as `[Nb,S,bn]`.
pub fn brgemm(act: Act, ins: &[&Tensor], out: DType) -> KResult<Tensor> {
    const OP: &str = "brgemm";
    arity(OP, ins, &[3])?;
    let ([nb, kb, bk, bn], s) = check_xw(OP, ins[0], ins[1], "blocked x")?;
    let [n] = dims::<1>(OP, "bias", ins[2])?;
    check_fit(OP, "brgemm bias", n, nb, bn)?;
    let (x, w, b) = (floats(ins[0]), floats(ins[1]), floats(ins[2]));
    let mut y = vec![0.0f32; nb * s * bn];
    if s > 0 && bn > 0 {
        y.par_chunks_mut(s * bn).enumerate().for_each(|(nbi, yb)| {
            let live = bn.min(n - nbi * bn);
            let mut acc = vec![0.0f32; bn];
            for (si, yr) in yb.chunks_mut(bn).enumerate() {
                acc.fill(0.0);
                // Σ over k ascending: block by block, then within the block.
                for kbi in 0..kb {
                    let xr = &x[(kbi * s + si) * bk..(kbi * s + si + 1) * bk];
                    let wblk = &w[(nbi * kb + kbi) * bk * bn..(nbi * kb + kbi + 1) * bk * bn];
                    for (&xv, wr) in xr.iter().zip(wblk.chunks_exact(bn)) {
                        for (a, &wv) in acc[..live].iter_mut().zip(wr) {
                            *a += xv * wv;
                        }
                    }
                }
                for (j, (o, &a)) in yr[..live].iter_mut().zip(&acc).enumerate() {
                    *o = act1(act, a + b[nbi * bn + j]);
                }
            }
        });
    }
    Ok(store(out, vec![nb, s, bn], y))
}

/// `brgemm_dgrad(dyb[Nb,S,bn], (yb,) wb[Nb,Kb,bk,bn]) -> dx[Kb,S,bk]`.
pub fn brgemm_dgrad(act: Act, mask: Act, ins: &[&Tensor], out: DType) -> KResult<Tensor> {
    const OP: &str = "brgemm_dgrad";
    let (ins, xb) = mask_operand(mask, ins);
    let [dy, y, w] = dy_y_last(OP, act, ins)?;
    if dy.shape != y.shape {
        return Err(shape_err(
            OP,
            format!(
                "blocked dy {:?} and blocked y {:?} differ",
                dy.shape, y.shape
            ),
        ));
    }
    let [nb_dy, s, bn_dy] = dims::<3>(OP, "blocked dy", dy)?;
    let [nb, kb, bk, bn] = dims::<4>(OP, "blocked weight", w)?;
    if nb_dy != nb || bn_dy != bn {
        return Err(shape_err(
            OP,
            format!(
                "blocked dy {:?} does not match blocked weight {:?}",
                dy.shape, w.shape
            ),
        ));
    }
    let dz = dz_of(act, dy, y);
    let w = floats(w);
    // wᵀ per block, `[Nb][Kb][bn][bk]`, so the inner loop runs over contiguous i.
    let mut wt = vec![0.0f32; w.len()];
    if bk > 0 && bn > 0 {
        wt.par_chunks_mut(bk * bn)
            .zip(w.par_chunks(bk * bn))
            .for_each(|(t, b)| {
                for i in 0..bk {
                    for j in 0..bn {
                        t[j * bk + i] = b[i * bn + j];
                    }
                }
            });
    }
    let mut dx = vec![0.0f32; kb * s * bk];
    if s > 0 && bk > 0 {
        dx.par_chunks_mut(s * bk).enumerate().for_each(|(kbi, xb)| {
            for (si, xr) in xb.chunks_mut(bk).enumerate() {
                // Σ over n ascending (transposed weight blocks).
                for nbi in 0..nb {
                    let dzr = &dz[(nbi * s + si) * bn..(nbi * s + si + 1) * bn];
                    let tb = &wt[(nbi * kb + kbi) * bk * bn..(nbi * kb + kbi + 1) * bk * bn];
                    for (&d, tr) in dzr.iter().zip(tb.chunks_exact(bk)) {
                        for (a, &tv) in xr.iter_mut().zip(tr) {
                            *a += d * tv;
                        }
                    }
                }
            }
        });
    }
    if let Some(xb) = xb {
        check_mask(OP, xb, [kb, s, bk])?;
        mask_in_place(mask, &mut dx, &floats(xb));
    }
    Ok(store(out, vec![kb, s, bk], dx))
}

/// `brgemm_dgrad`'s operands without the mask operand, and the mask operand
/// (the last, when `mask` is not `none`).
pub(crate) fn mask_operand<'a, 't>(
    mask: Act,
    ins: &'a [&'t Tensor],
) -> (&'a [&'t Tensor], Option<&'t Tensor>) {
    match (mask, ins.split_last()) {
        (Act::None, _) | (_, None) => (ins, None),
        (_, Some((xb, rest))) => (rest, Some(*xb)),
    }
}

/// Checks that the mask operand has the result's blocked shape.
pub(crate) fn check_mask(op: &'static str, xb: &Tensor, shape: [usize; 3]) -> KResult<()> {
    if xb.shape != shape || data_len(xb) != xb.numel() {
        return Err(shape_err(
            op,
            format!(
                "blocked x (mask) {:?} is not the result's {shape:?}",
                xb.shape
            ),
        ));
    }
    Ok(())
}

/// `dx[i] = mask'(dx[i], x[i])` (over the shorter of the two), each exactly
/// [`act_grad`]: the previous layer's `dz` from this layer's `dx` and input;
/// the mask matched once per call so the loops vectorise.
pub(crate) fn mask_in_place(mask: Act, dx: &mut [f32], x: &[f32]) {
    let it = dx.iter_mut().zip(x);
    // As in `act_grads`: relu's is a select, not a branch (a branch per element,
    // taken at random, made the masked `brgemm_dgrad` 40% slower).
    match mask {
        Act::None => {}
        Act::Relu => it.for_each(|(d, &x)| *d = act_grad(Act::Relu, *d, x)),
        Act::Sigmoid => it.for_each(|(d, &x)| *d = act_grad(Act::Sigmoid, *d, x)),
    }
}

/// The operands of `brgemm_wgrad` and their blocked sizes, checked: what the
/// reference kernel and the JIT's ([`crate::jit`]) both start from.
pub(crate) struct WgradArgs<'t> {
    /// `dyb[Nb,S,bn]`.
    pub dy: &'t Tensor,
    /// `yb[Nb,S,bn]` (`dy` itself without an activation).
    pub y: &'t Tensor,
    /// `xb[Kb,S,bk]`.
    pub x: &'t Tensor,
    /// `[Nb, Kb, S, bk, bn]`.
    pub dims: [usize; 5],
    /// The declared types of `dw` and `db`.
    pub outs: [&'t TensorType; 2],
}

/// Checks `brgemm_wgrad`'s operands (`dy` and `y` alike, `dy` and `x` over the
/// same samples, `n` within the `Nb` blocks of `bn`) and its two results.
pub(crate) fn wgrad_args<'t>(
    act: Act,
    n: usize,
    ins: &[&'t Tensor],
    out_types: &'t [TensorType],
) -> KResult<WgradArgs<'t>> {
    const OP: &str = "brgemm_wgrad";
    let [dy, y, x] = dy_y_last(OP, act, ins)?;
    if dy.shape != y.shape {
        return Err(shape_err(
            OP,
            format!(
                "blocked dy {:?} and blocked y {:?} differ",
                dy.shape, y.shape
            ),
        ));
    }
    let [nb, s, bn] = dims::<3>(OP, "blocked dy", dy)?;
    let [kb, sx, bk] = dims::<3>(OP, "blocked x", x)?;
    if sx != s {
        return Err(shape_err(
            OP,
            format!(
                "blocked dy {:?} and blocked x {:?} must have the same samples",
                dy.shape, x.shape
            ),
        ));
    }
    check_fit(OP, "brgemm_wgrad n", n, nb, bn)?;
    let [dw_t, db_t] = out_types else {
        return Err(shape_err(
            OP,
            format!("has two results, {} declared", out_types.len()),
        ));
    };
    Ok(WgradArgs {
        dy,
        y,
        x,
        dims: [nb, kb, s, bk, bn],
        outs: [dw_t, db_t],
    })
}

/// `brgemm_wgrad(dyb[Nb,S,bn], (yb,) xb[Kb,S,bk]) -> (dw[Nb,Kb,bk,bn], db[n])`.
pub fn brgemm_wgrad(
    act: Act,
    n: usize,
    ins: &[&Tensor],
    out_types: &[TensorType],
) -> KResult<Vec<Tensor>> {
    let WgradArgs {
        dy,
        y,
        x,
        dims: [nb, kb, s, bk, bn],
        outs: [dw_t, db_t],
    } = wgrad_args(act, n, ins, out_types)?;
    let dz = dz_of(act, dy, y);
    let x = floats(x);
    let mut dw = vec![0.0f32; nb * kb * bk * bn];
    if bk > 0 && bn > 0 {
        dw.par_chunks_mut(bk * bn)
            .enumerate()
            .for_each(|(blk, out)| {
                let (nbi, kbi) = (blk / kb, blk % kb);
                let live = bn.min(n - nbi * bn);
                // Batch-reduce over the samples, ascending.
                for si in 0..s {
                    let dzr = &dz[(nbi * s + si) * bn..(nbi * s + si) * bn + live];
                    let xr = &x[(kbi * s + si) * bk..(kbi * s + si + 1) * bk];
                    for (&xv, or) in xr.iter().zip(out.chunks_exact_mut(bn)) {
                        for (o, &d) in or[..live].iter_mut().zip(dzr) {
                            *o += d * xv;
                        }
                    }
                }
            });
    }
    let db = bias_grad(&dz, s, bn, n);
    Ok(vec![
        store(dw_t.dtype, vec![nb, kb, bk, bn], dw),
        store(db_t.dtype, vec![n], db),
    ])
}

/// `db[n] = Σ_s dz[s][n]` over `s` ascending, from a blocked `dz[Nb][S][bn]`.
pub(crate) fn bias_grad(dz: &[f32], s: usize, bn: usize, n: usize) -> Vec<f32> {
    let mut db = vec![0.0f32; n];
    if bn == 0 {
        return db;
    }
    db.par_chunks_mut(bn).enumerate().for_each(|(nbi, d)| {
        for si in 0..s {
            let r = &dz[(nbi * s + si) * bn..(nbi * s + si) * bn + d.len()];
            for (a, &v) in d.iter_mut().zip(r) {
                *a += v;
            }
        }
    });
    db
}
