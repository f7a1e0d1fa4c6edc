//! `brgemm`, `brgemm_dgrad` and `brgemm_wgrad` on the JIT GEMM core
//! ([`super::gemm`]): the blocked MLP layers of the `-O1` plans.
//!
//! Each op packs its operands once per call into the layouts the generated loop
//! nest streams (`A` in tile-major panels `[tile][k][mr]`, a [`GemmSpec::pack_a`]
//! spec; `B` in `k × nr` panels), fusing what the op fuses into the packing, then
//! runs one compiled kernel on disjoint output blocks, one rayon task each
//! ([`GemmKernel::run_packed`]):
//!
//! | op | GEMM per output block | A (packed) | B (packed) | epilogue |
//! | --- | --- | --- | --- | --- |
//! | `brgemm(xb, wb, b)` | `yb[nb]` rows `r0..`: `S × bn`, `k = Kb·bk` | `x` (the `Kb` blocks of a row, in order) | `wb[nb]` (`Kb·bk × bn`) | bias, relu fused; sigmoid after |
//! | `brgemm_dgrad(dyb, (yb,) wb)` | `dx[kb]` rows `r0..`: `S × bk`, `k = Nb·bn` | `dz = act'(dy, y)`, fused into the packing | `wb[·][kb]ᵀ` | none |
//! | `brgemm_wgrad(dyb, (yb,) xb)` | `dw[nb][kb]`: `bk × bn`, `k = S` | `xb[kb]ᵀ` | `dz[nb]`, with `act'` and the bias gradient fused into the packing | none |
//!
//! Arithmetic: every output element is one accumulator summed over its reduction
//! index ascending (the interpreter's order) with one FMA per term, then the
//! epilogue; so the results differ from the reference kernels
//! ([`crate::kernels::brgemm`]) by float reassociation of the multiply-adds only
//! (the bias gradient and `act'` are computed exactly as there). Padding outputs
//! are exactly 0. Operands may be f32 or bf16 (widened exactly); `brgemm`'s
//! result is stored in its declared dtype (bf16 rounded to nearest even), the
//! gradients are f32. The micro-kernel is chosen per shape by
//! [`Jit::pick_micro`] under [`JitOptions::kernels`].

use super::gemm::{Elt, GemmKernel, GemmSpec, Micro, Operand, OutBuf};
use super::linear::operand;
use super::{Jit, JitError, JitOptions};
use crate::kernels::brgemm::{act_grad, check_fit, check_xw, dims, dy_y_last, floats};
use crate::kernels::{KResult, KernelError, shape_err};
use dlrm_ir::{Act, DType, Data, Tensor, TensorType};
use half::bf16;
use rayon::prelude::*;

/// Evaluates `brgemm`, `brgemm_dgrad` or `brgemm_wgrad`; `None` for other ops or
/// non-float operands or results.
pub fn eval(
    jit: &Jit,
    opts: &JitOptions,
    op: &dlrm_ir::Op,
    inputs: &[&Tensor],
    out_types: &[TensorType],
) -> Option<KResult<Vec<Tensor>>> {
    use dlrm_ir::Op;
    if inputs.iter().any(|t| operand(t).is_none()) {
        return None;
    }
    let out = elt_of(out_types.first()?.dtype)?;
    if out_types.iter().any(|t| elt_of(t.dtype).is_none()) {
        return None;
    }
    Some(match op {
        Op::Brgemm { act } => brgemm(jit, opts, *act, inputs, out).map(|t| vec![t]),
        Op::BrgemmDgrad { act } => brgemm_dgrad(jit, opts, *act, inputs, out).map(|t| vec![t]),
        Op::BrgemmWgrad { act, n } => brgemm_wgrad(jit, opts, *act, *n, inputs, out_types),
        _ => return None,
    })
}

fn elt_of(d: DType) -> Option<Elt> {
    match d {
        DType::F32 => Some(Elt::F32),
        DType::BF16 => Some(Elt::BF16),
        _ => None,
    }
}

fn jit_err(op: &'static str, e: JitError) -> KernelError {
    KernelError::Jit {
        op,
        reason: e.to_string(),
    }
}

/// A packed `A` (f32 or bf16 elements).
enum PackedA {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
}

impl PackedA {
    fn operand(&self, from: usize) -> Operand<'_> {
        match self {
            PackedA::F32(v) => Operand::F32(&v[from.min(v.len())..]),
            PackedA::BF16(v) => Operand::BF16(&v[from.min(v.len())..]),
        }
    }
}

/// A result buffer (f32 or bf16).
enum Out {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
}

impl Out {
    fn zeros(elt: Elt, n: usize) -> Out {
        match elt {
            Elt::F32 => Out::F32(vec![0.0; n]),
            Elt::BF16 => Out::BF16(vec![bf16::ZERO; n]),
        }
    }

    /// Disjoint consecutive chunks of `len` elements (the last may be shorter).
    fn chunks(&mut self, len: usize) -> Vec<OutBuf<'_>> {
        match self {
            Out::F32(v) => v.chunks_mut(len.max(1)).map(OutBuf::F32).collect(),
            Out::BF16(v) => v.chunks_mut(len.max(1)).map(OutBuf::BF16).collect(),
        }
    }

    fn tensor(self, shape: Vec<usize>) -> Tensor {
        match self {
            Out::F32(v) => Tensor::f32(shape, v),
            Out::BF16(v) => Tensor::bf16(shape, v),
        }
    }
}

/// Tile-major `A` (`[⌈S/mr⌉][Kb·bk][mr]`, rows past `S` zero) of a blocked
/// activation `[Kb][S][bk]` viewed as `S × Kb·bk`; `get(e)` is the element at
/// flat position `e` of the blocked source. Parallel over tiles.
fn pack_blocked_rows<T: Copy + Default + Send + Sync>(
    kb: usize,
    s: usize,
    bk: usize,
    mr: usize,
    get: impl Fn(usize) -> T + Sync,
) -> Vec<T> {
    let k = kb * bk;
    let tiles = s.div_ceil(mr);
    let mut out = vec![T::default(); tiles * k * mr];
    if k == 0 {
        return out;
    }
    out.par_chunks_mut(k * mr).enumerate().for_each(|(t, dst)| {
        let live = mr.min(s - t * mr);
        for kbi in 0..kb {
            for r in 0..live {
                let src = (kbi * s + t * mr + r) * bk;
                for i in 0..bk {
                    dst[(kbi * bk + i) * mr + r] = get(src + i);
                }
            }
        }
    });
    out
}

/// Row blocks of `m` rows for `tasks_per_row_block` output blocks: whole tiles,
/// about four tasks per thread overall, at least one tile, at most `mc_rows`.
fn row_block(m: usize, mr: usize, blocks: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let want_row_blocks = (4 * threads).div_ceil(blocks.max(1)).max(1);
    let rb = m.div_ceil(want_row_blocks).div_ceil(mr) * mr;
    rb.clamp(mr, 32 * mr.max(1))
        .min(m.div_ceil(mr) * mr)
        .max(mr)
}

/// Picks the micro-kernel for `base` and runs `go` with the chosen kernel.
fn with_kernel<T>(
    jit: &Jit,
    opts: &JitOptions,
    op: &'static str,
    base: GemmSpec,
    go: &mut dyn FnMut(GemmKernel) -> Result<T, JitError>,
) -> KResult<T> {
    let micro = {
        let mut trial = |k: GemmKernel| go(k).map(|_| ());
        jit.pick_micro(base, opts.kernels, &mut trial)
            .map_err(|e| jit_err(op, e))?
    };
    let k = jit
        .gemm(GemmSpec { micro, ..base })
        .map_err(|e| jit_err(op, e))?;
    go(k).map_err(|e| jit_err(op, e))
}

/// `brgemm(xb[Kb,S,bk], wb[Nb,Kb,bk,bn], b[N]) -> act(x·wᵀ + b)` as `[Nb,S,bn]`.
pub fn brgemm(
    jit: &Jit,
    opts: &JitOptions,
    act: Act,
    ins: &[&Tensor],
    out: Elt,
) -> KResult<Tensor> {
    const OP: &str = "brgemm";
    crate::kernels::arity(OP, ins, &[3])?;
    let ([nb, kb, bk, bn], s) = check_xw(OP, ins[0], ins[1], "blocked x")?;
    let [n] = dims::<1>(OP, "bias", ins[2])?;
    check_fit(OP, "brgemm bias", n, nb, bn)?;
    let kp = kb * bk;
    let sigmoid = act == Act::Sigmoid;
    let c = if sigmoid { Elt::F32 } else { out };
    let (x, w) = (ins[0], ins[1]);
    let xa = operand(x).ok_or_else(|| shape_err(OP, "x must be a float tensor".into()))?;
    let bias = floats(ins[2]);
    if s == 0 || nb == 0 || bn == 0 {
        return Ok(Out::zeros(out, nb * s * bn).tensor(vec![nb, s, bn]));
    }
    let base = GemmSpec {
        m: s,
        n: bn,
        k: kp,
        lda: kp,
        acs: 1,
        ldc: bn,
        a: match xa {
            Operand::F32(_) => Elt::F32,
            Operand::BF16(_) => Elt::BF16,
        },
        c,
        bias: true,
        relu: act == Act::Relu,
        micro: Micro::Cranelift,
        pack_a: true,
    };
    let mut result = None;
    with_kernel(jit, opts, OP, base, &mut |kern| {
        let sp = *kern.spec();
        let (mr, nr) = (sp.micro.mr(), sp.micro.nr());
        let a = match &x.data {
            Data::F32(v) => PackedA::F32(pack_blocked_rows(kb, s, bk, mr, |e| v[e])),
            Data::BF16(v) => PackedA::BF16(pack_blocked_rows(kb, s, bk, mr, |e| v[e])),
            _ => PackedA::F32(Vec::new()),
        };
        let panels = bn.div_ceil(nr);
        let blk_b = panels * kp * nr;
        let mut bp = vec![0.0f32; nb * blk_b];
        bp.par_chunks_mut(blk_b).enumerate().for_each(|(nbi, dst)| {
            let src_base = nbi * kp * bn;
            for (p, pan) in dst.chunks_mut(kp * nr).enumerate() {
                let j0 = p * nr;
                let cols = nr.min(bn - j0);
                for kk in 0..kp {
                    let row = src_base + kk * bn + j0;
                    match &w.data {
                        Data::F32(v) => {
                            pan[kk * nr..kk * nr + cols].copy_from_slice(&v[row..row + cols])
                        }
                        Data::BF16(v) => {
                            for (d, &e) in pan[kk * nr..kk * nr + cols]
                                .iter_mut()
                                .zip(&v[row..row + cols])
                            {
                                *d = e.to_f32();
                            }
                        }
                        _ => {}
                    }
                }
            }
        });
        let mut pbias = vec![0.0f32; nb * panels * nr];
        for (nbi, dst) in pbias.chunks_mut(panels * nr).enumerate() {
            let live = bn.min(n - nbi * bn);
            dst[..live].copy_from_slice(&bias[nbi * bn..nbi * bn + live]);
        }
        let rb = row_block(s, mr, nb);
        let mut y = Out::zeros(c, nb * s * bn);
        {
            let mut tasks: Vec<(usize, usize, OutBuf<'_>)> = Vec::new();
            match &mut y {
                Out::F32(v) => {
                    for (nbi, yb) in v.chunks_mut(s * bn).enumerate() {
                        for (ri, ch) in yb.chunks_mut(rb * bn).enumerate() {
                            tasks.push((nbi, ri, OutBuf::F32(ch)));
                        }
                    }
                }
                Out::BF16(v) => {
                    for (nbi, yb) in v.chunks_mut(s * bn).enumerate() {
                        for (ri, ch) in yb.chunks_mut(rb * bn).enumerate() {
                            tasks.push((nbi, ri, OutBuf::BF16(ch)));
                        }
                    }
                }
            }
            // Row block outer, N block inner: neighbouring tasks share A rows.
            tasks.sort_by_key(|&(nbi, ri, _)| (ri, nbi));
            tasks
                .into_par_iter()
                .with_max_len(1)
                .try_for_each(|(nbi, ri, cb)| {
                    let rows = rb.min(s - ri * rb);
                    kern.run_packed(
                        a.operand(ri * rb * kp),
                        &bp[nbi * blk_b..(nbi + 1) * blk_b],
                        Some(&pbias[nbi * panels * nr..(nbi + 1) * panels * nr]),
                        cb,
                        rows,
                    )
                })?;
        }
        result = Some(y);
        Ok(())
    })?;
    let y = result.ok_or_else(|| shape_err(OP, "internal: no result".into()))?;
    let live_last = n - (nb - 1) * bn;
    let y = finish_forward(y, sigmoid, out, nb, s, bn, live_last);
    Ok(y.tensor(vec![nb, s, bn]))
}

/// Sigmoid (when fused after the GEMM) and exact zeros in the padding columns of
/// the last N block.
fn finish_forward(
    mut y: Out,
    sigmoid: bool,
    out: Elt,
    nb: usize,
    s: usize,
    bn: usize,
    live_last: usize,
) -> Out {
    let pad = |v: &mut [f32]| {
        if live_last < bn {
            for row in v[(nb - 1) * s * bn..].chunks_mut(bn) {
                row[live_last..].fill(0.0);
            }
        }
    };
    match &mut y {
        Out::F32(v) => {
            if sigmoid {
                v.par_chunks_mut(1 << 14)
                    .for_each(|c| c.iter_mut().for_each(|x| *x = 1.0 / (1.0 + (-*x).exp())));
            }
            pad(v);
        }
        Out::BF16(v) => {
            if live_last < bn {
                for row in v[(nb - 1) * s * bn..].chunks_mut(bn) {
                    row[live_last..].fill(bf16::ZERO);
                }
            }
        }
    }
    match (y, out) {
        (Out::F32(v), Elt::BF16) => Out::BF16(v.par_iter().map(|&x| bf16::from_f32(x)).collect()),
        (y, _) => y,
    }
}

/// `brgemm_dgrad(dyb[Nb,S,bn], (yb,) wb[Nb,Kb,bk,bn]) -> dx[Kb,S,bk]`.
pub fn brgemm_dgrad(
    jit: &Jit,
    opts: &JitOptions,
    act: Act,
    ins: &[&Tensor],
    out: Elt,
) -> KResult<Tensor> {
    const OP: &str = "brgemm_dgrad";
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
    let np = nb * bn;
    if s == 0 || kb == 0 || bk == 0 {
        return Ok(Out::zeros(out, kb * s * bk).tensor(vec![kb, s, bk]));
    }
    let (dyv, yv, wv) = (floats(dy), floats(y), floats(w));
    let base = GemmSpec {
        m: s,
        n: bk,
        k: np,
        lda: np,
        acs: 1,
        ldc: bk,
        a: Elt::F32,
        c: out,
        bias: false,
        relu: false,
        micro: Micro::Cranelift,
        pack_a: true,
    };
    let mut result = None;
    with_kernel(jit, opts, OP, base, &mut |kern| {
        let sp = *kern.spec();
        let (mr, nr) = (sp.micro.mr(), sp.micro.nr());
        // A = dz = act'(dy, y), `S × Nb·bn`, packed.
        let a = pack_blocked_rows(nb, s, bn, mr, |e| act_grad(act, dyv[e], yv[e]));
        // B for dx block kb: wᵀ, `Nb·bn × bk`: B(n', i) = wb[n'/bn][kb][i][n'%bn].
        let panels = bk.div_ceil(nr);
        let blk_b = panels * np * nr;
        let mut bp = vec![0.0f32; kb * blk_b];
        bp.par_chunks_mut(np * nr).enumerate().for_each(|(q, pan)| {
            let (kbi, p) = (q / panels, q % panels);
            let i0 = p * nr;
            let cols = nr.min(bk - i0);
            for nbi in 0..nb {
                let blk = (nbi * kb + kbi) * bk * bn;
                for ii in 0..cols {
                    let src = &wv[blk + (i0 + ii) * bn..blk + (i0 + ii + 1) * bn];
                    for (j, &e) in src.iter().enumerate() {
                        pan[(nbi * bn + j) * nr + ii] = e;
                    }
                }
            }
        });
        let rb = row_block(s, mr, kb);
        let mut dx = Out::zeros(out, kb * s * bk);
        {
            let mut tasks: Vec<(usize, usize, OutBuf<'_>)> = Vec::new();
            for (kbi, blk) in dx.chunks(s * bk).into_iter().enumerate() {
                let parts: Vec<OutBuf<'_>> = match blk {
                    OutBuf::F32(v) => v.chunks_mut(rb * bk).map(OutBuf::F32).collect(),
                    OutBuf::BF16(v) => v.chunks_mut(rb * bk).map(OutBuf::BF16).collect(),
                };
                for (ri, ch) in parts.into_iter().enumerate() {
                    tasks.push((kbi, ri, ch));
                }
            }
            tasks.sort_by_key(|&(kbi, ri, _)| (ri, kbi));
            tasks
                .into_par_iter()
                .with_max_len(1)
                .try_for_each(|(kbi, ri, cb)| {
                    let rows = rb.min(s - ri * rb);
                    kern.run_packed(
                        Operand::F32(&a[(ri * rb * np).min(a.len())..]),
                        &bp[kbi * blk_b..(kbi + 1) * blk_b],
                        None,
                        cb,
                        rows,
                    )
                })?;
        }
        result = Some(dx);
        Ok(())
    })?;
    let dx = result.ok_or_else(|| shape_err(OP, "internal: no result".into()))?;
    Ok(dx.tensor(vec![kb, s, bk]))
}

/// `brgemm_wgrad(dyb[Nb,S,bn], (yb,) xb[Kb,S,bk]) -> (dw[Nb,Kb,bk,bn], db[n])`.
pub fn brgemm_wgrad(
    jit: &Jit,
    opts: &JitOptions,
    act: Act,
    n: usize,
    ins: &[&Tensor],
    out_types: &[TensorType],
) -> KResult<Vec<Tensor>> {
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
    let (dw_elt, db_elt) = (
        elt_of(dw_t.dtype).ok_or_else(|| shape_err(OP, "dw must be f32 or bf16".into()))?,
        elt_of(db_t.dtype).ok_or_else(|| shape_err(OP, "db must be f32 or bf16".into()))?,
    );
    let xa = operand(x).ok_or_else(|| shape_err(OP, "x must be a float tensor".into()))?;
    if nb == 0 || kb == 0 || bn == 0 || bk == 0 || s == 0 {
        let dw = Out::zeros(dw_elt, nb * kb * bk * bn).tensor(vec![nb, kb, bk, bn]);
        let db = Out::zeros(db_elt, n).tensor(vec![n]);
        return Ok(vec![dw, db]);
    }
    let (dyv, yv) = (floats(dy), floats(y));
    let base = GemmSpec {
        m: bk,
        n: bn,
        k: s,
        lda: 1,
        acs: bk,
        ldc: bn,
        a: match xa {
            Operand::F32(_) => Elt::F32,
            Operand::BF16(_) => Elt::BF16,
        },
        c: dw_elt,
        bias: false,
        relu: false,
        micro: Micro::Cranelift,
        pack_a: true,
    };
    let mut result = None;
    with_kernel(jit, opts, OP, base, &mut |kern| {
        let sp = *kern.spec();
        let (mr, nr) = (sp.micro.mr(), sp.micro.nr());
        // A per kb block: xb[kb]ᵀ (`bk × S`), packed.
        let tiles = bk.div_ceil(mr);
        let blk_a = tiles * s * mr;
        let a = match &x.data {
            Data::F32(v) => PackedA::F32(pack_x_t(v, kb, s, bk, mr)),
            Data::BF16(v) => PackedA::BF16(pack_x_t(v, kb, s, bk, mr)),
            _ => PackedA::F32(Vec::new()),
        };
        // B per nb block: dz[nb] (`S × bn`), packed, with db summed on the way.
        let panels = bn.div_ceil(nr);
        let blk_b = panels * s * nr;
        let mut bp = vec![0.0f32; nb * blk_b];
        let mut dbp = vec![0.0f32; nb * panels * nr];
        bp.par_chunks_mut(s * nr)
            .zip(dbp.par_chunks_mut(nr))
            .enumerate()
            .for_each(|(q, (pan, dbq))| {
                let (nbi, p) = (q / panels, q % panels);
                let j0 = p * nr;
                let cols = nr.min(bn - j0);
                for si in 0..s {
                    let e = (nbi * s + si) * bn + j0;
                    let (d, yy) = (&dyv[e..e + cols], &yv[e..e + cols]);
                    let row = &mut pan[si * nr..si * nr + cols];
                    for (((o, &d), &yy), acc) in row.iter_mut().zip(d).zip(yy).zip(dbq.iter_mut()) {
                        let z = act_grad(act, d, yy);
                        *o = z;
                        *acc += z;
                    }
                }
            });
        let mut dw = Out::zeros(dw_elt, nb * kb * bk * bn);
        dw.chunks(bk * bn)
            .into_par_iter()
            .with_max_len(1)
            .enumerate()
            .try_for_each(|(blk, cb)| {
                let (nbi, kbi) = (blk / kb, blk % kb);
                kern.run_packed(
                    a.operand(kbi * blk_a),
                    &bp[nbi * blk_b..(nbi + 1) * blk_b],
                    None,
                    cb,
                    bk,
                )
            })?;
        result = Some((dw, dbp));
        Ok(())
    })?;
    let (mut dw, dbp) = result.ok_or_else(|| shape_err(OP, "internal: no result".into()))?;
    // Exact zeros in the padding columns n >= N (the interpreter writes 0).
    let live_last = n - (nb - 1) * bn;
    if live_last < bn {
        match &mut dw {
            Out::F32(v) => v[(nb - 1) * kb * bk * bn..]
                .chunks_mut(bn)
                .for_each(|r| r[live_last..].fill(0.0)),
            Out::BF16(v) => v[(nb - 1) * kb * bk * bn..]
                .chunks_mut(bn)
                .for_each(|r| r[live_last..].fill(bf16::ZERO)),
        }
    }
    // dbp is [Nb][panels·nr]: column j of block nb at nb·panels·nr + j.
    let panels_nr = dbp.len() / nb;
    let db: Vec<f32> = (0..n).map(|j| dbp[(j / bn) * panels_nr + j % bn]).collect();
    let db = match db_elt {
        Elt::F32 => Out::F32(db),
        Elt::BF16 => Out::BF16(db.iter().map(|&v| bf16::from_f32(v)).collect()),
    };
    Ok(vec![dw.tensor(vec![nb, kb, bk, bn]), db.tensor(vec![n])])
}

/// `xb[Kb][S][bk]` as `Kb` blocks of `xb[kb]ᵀ` (`bk × S`) in tile-major panels
/// `[kb][⌈bk/mr⌉][S][mr]`.
fn pack_x_t<T: Copy + Default + Send + Sync>(
    v: &[T],
    kb: usize,
    s: usize,
    bk: usize,
    mr: usize,
) -> Vec<T> {
    let tiles = bk.div_ceil(mr);
    let mut out = vec![T::default(); kb * tiles * s * mr];
    out.par_chunks_mut(s * mr).enumerate().for_each(|(q, dst)| {
        let (kbi, t) = (q / tiles, q % tiles);
        let i0 = t * mr;
        let live = mr.min(bk - i0);
        for si in 0..s {
            let src = &v[(kbi * s + si) * bk + i0..(kbi * s + si) * bk + i0 + live];
            dst[si * mr..si * mr + live].copy_from_slice(src);
        }
    });
    out
}
