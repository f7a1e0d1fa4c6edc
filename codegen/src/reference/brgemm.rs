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
//! Every kernel takes its operands checked against the node's instance
//! ([`Checked`]) and reads the blocked sizes from it: no shape is re-checked here.
//!
//! Parallelism: one rayon task per output block (`[nb]` or `[kb]` slab, or a
//! weight-gradient block), disjoint writes only.

use super::{KResult, dims_of, internal};
use dlrm_ir::{Act, Checked, DType, Data, Op, Tensor, TensorType};
use half::bf16;
use rayon::prelude::*;
use std::borrow::Cow;

/// Evaluates a blocked op on operands checked against its instance ([`Checked`]:
/// the family's shape rules — ranks, blocks of the weight against the
/// activation's, the bias or `n` within the blocks, the mask's shape — were
/// verified by inference), or `None` if the op is not one of this family (or an
/// operand is not a float tensor, or a result dtype is not f32/bf16).
pub fn try_eval(c: &Checked<'_>, out_types: &[TensorType]) -> Option<KResult<Vec<Tensor>>> {
    let (op, inputs) = (c.op(), c.inputs());
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
        Op::BlockAct { bk, .. } => one(block_act(*bk, c, out)),
        Op::UnblockAct { k, .. } => one(unblock_act(*k, c, out)),
        Op::Brgemm { act } => one(brgemm(*act, c, out)),
        Op::BrgemmDgrad { act, mask, .. } => one(brgemm_dgrad(*act, *mask, c, out)),
        Op::BrgemmWgrad { act, n } => brgemm_wgrad(*act, *n, c, out_types),
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

/// `(dy, y, last)` of checked operands: `act=none` takes `(dy, last)` (then `y`
/// is `dy`, unused); `None` for another count (the instance verified it).
pub(crate) fn dy_y_last<'t>(act: Act, ins: &[&'t Tensor]) -> Option<[&'t Tensor; 3]> {
    match (act, ins) {
        (Act::None, &[dy, last]) => Some([dy, dy, last]),
        (Act::Relu | Act::Sigmoid, &[dy, y, last]) => Some([dy, y, last]),
        _ => None,
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

/// `block_act{bk}(x[S,K]) -> [ceil(K/bk), S, bk]`.
pub fn block_act(bk: usize, c: &Checked<'_>, out: DType) -> KResult<Tensor> {
    let [s, k] = dims_of::<2>(c, 0)?;
    // The instance verified bk > 0.
    let kb = k.div_ceil(bk.max(1));
    let x = floats(c.input(0));
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
pub fn unblock_act(k: usize, c: &Checked<'_>, out: DType) -> KResult<Tensor> {
    // The instance verified that `k` fills the `Kb` blocks of `bk`.
    let [_, s, bk] = dims_of::<3>(c, 0)?;
    let xb = floats(c.input(0));
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

/// `brgemm(xb[Kb,S,bk], wb[Nb,Kb,bk,bn][, b[N]]) -> act(x·wᵀ + b)` as `[Nb,S,bn]`.
pub fn brgemm(act: Act, c: &Checked<'_>, out: DType) -> KResult<Tensor> {
    // The instance verified x's blocks against the weight's and the bias
    // against its `Nb` blocks of `bn`.
    let [_, s, _] = dims_of::<3>(c, 0)?;
    let [nb, kb, bk, bn] = dims_of::<4>(c, 1)?;
    let (x, w) = (floats(c.input(0)), floats(c.input(1)));
    // Without a bias: every column, plus 0 (which changes no sum: one starting
    // at +0 is never -0).
    let (n, b) = match c.inputs().get(2) {
        Some(&b) => (b.shape[0], floats(b)),
        None => (nb * bn, Cow::Owned(vec![0.0; nb * bn])),
    };
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
pub fn brgemm_dgrad(act: Act, mask: Act, c: &Checked<'_>, out: DType) -> KResult<Tensor> {
    let DgradArgs {
        dy,
        y,
        w,
        mask: xb,
        dims: [nb, kb, s, bk, bn],
    } = dgrad_args(act, mask, c)?;
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
        mask_in_place(mask, &mut dx, &floats(xb));
    }
    Ok(store(out, vec![kb, s, bk], dx))
}

/// The operands of `brgemm_dgrad` and their blocked sizes (verified by the
/// instance): what the reference kernel and the JIT's ([`crate::jit`]) both
/// start from.
pub(crate) struct DgradArgs<'t> {
    /// `dyb[Nb,S,bn]`.
    pub dy: &'t Tensor,
    /// `yb[Nb,S,bn]` (`dy` itself without an activation).
    pub y: &'t Tensor,
    /// `wb[Nb,Kb,bk,bn]`.
    pub w: &'t Tensor,
    /// The mask operand `xb[Kb,S,bk]` (the previous layer's input), when the
    /// mask is not `none`.
    pub mask: Option<&'t Tensor>,
    /// `[Nb, Kb, S, bk, bn]`.
    pub dims: [usize; 5],
}

/// `brgemm_dgrad`'s checked operands (the instance verified `dy` and `y` alike,
/// `dy`'s blocks against the weight's, and the mask operand of the result's
/// shape).
pub(crate) fn dgrad_args<'t>(act: Act, mask: Act, c: &Checked<'t>) -> KResult<DgradArgs<'t>> {
    let (ins, xb) = mask_operand(mask, c.inputs());
    let [dy, y, w] = dy_y_last(act, ins).ok_or_else(|| internal(c, "operand count"))?;
    let [_, s, _] = dims_of::<3>(c, 0)?;
    let [nb, kb, bk, bn] = dims_of::<4>(c, ins.len() - 1)?;
    Ok(DgradArgs {
        dy,
        y,
        w,
        mask: xb,
        dims: [nb, kb, s, bk, bn],
    })
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

/// The operands of `brgemm_wgrad` and their blocked sizes (verified by the
/// instance): what the reference kernel and the JIT's ([`crate::jit`]) both
/// start from.
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

/// `brgemm_wgrad`'s checked operands (the instance verified `dy` and `y` alike,
/// `dy` and `x` over the same samples, `n` within the `Nb` blocks of `bn`, and
/// its two results).
pub(crate) fn wgrad_args<'t>(
    act: Act,
    c: &Checked<'t>,
    out_types: &'t [TensorType],
) -> KResult<WgradArgs<'t>> {
    let ins = c.inputs();
    let [dy, y, x] = dy_y_last(act, ins).ok_or_else(|| internal(c, "operand count"))?;
    let [nb, s, bn] = dims_of::<3>(c, 0)?;
    let [kb, _, bk] = dims_of::<3>(c, ins.len() - 1)?;
    let [dw_t, db_t] = out_types else {
        return Err(internal(c, "result count"));
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
    c: &Checked<'_>,
    out_types: &[TensorType],
) -> KResult<Vec<Tensor>> {
    let WgradArgs {
        dy,
        y,
        x,
        dims: [nb, kb, s, bk, bn],
        outs: [dw_t, db_t],
    } = wgrad_args(act, c, out_types)?;
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
