//! `brgemm`, `brgemm_dgrad` and `brgemm_wgrad` on the JIT GEMM core
//! ([`super::gemm`]): the blocked MLP layers of the `-O1` plans.
//!
//! The operands are read where they are, in their blocked layouts, wherever the
//! GEMM core can address them: the activations as a batch-reduce over their
//! blocks (`A` block `q` of row `i` at `i·lda + q·a_blk`, [`GemmSpec::kb`]), the
//! f32 weight blocks and `dz` as in-place `B` ([`BLayout::InPlace`], when the
//! block width is whole tiles of the micro-kernel). Only what the layouts cannot
//! express is copied, once per call: `wᵀ` for dgrad (`K·N` elements), `dz` when
//! the activation has a derivative, and `B` when its block width is ragged or its
//! elements are bf16. One compiled kernel then runs on disjoint output blocks, one
//! rayon task each ([`GemmKernel::run_block`]):
//!
//! | op | GEMM per output block | A | B | epilogue |
//! | --- | --- | --- | --- | --- |
//! | `brgemm(xb, wb, b)` | `yb[nb]` rows `r0..`: `S × bn`, `k = Kb·bk` | `xb`, batch-reduce over `Kb` | `wb[nb]` (`Kb·bk × bn`), in place | bias, relu fused; sigmoid after |
//! | `brgemm_dgrad(dyb, (yb,) wb)` | `dx[kb]` rows `r0..`: `S × bk`, `k = Nb·bn` | `dz = act'(dy, y)`, batch-reduce over `Nb` | `wb[·][kb]ᵀ`, packed | none |
//! | `brgemm_wgrad(dyb, (yb,) xb)` | `dw[nb][kb]`: `bk × bn`, `k = S` | `xb[kb]ᵀ`: the transposed view in place, or packed once when at least 4 N blocks reuse it | `dz[nb]`, packed (`act'` applied on the way) | none; `db` summed from `dz` |
//!
//! `brgemm_wgrad` with one-column blocks (`bn = 1`: the DLRM's last layer, one
//! output) is a matrix-vector product per column, computed as a weighted sum of
//! `x`'s rows (`x` read once; a GEMM tile would use one of its 8 or 32 lanes)
//! with the same float operations.
//!
//! `brgemm` and `brgemm_dgrad` have a second form (`run_row_chunks`): one task
//! per row chunk packs its rows of `A` once into the micro-kernel's tiles (f32,
//! bf16 widened, dgrad's `act'` applied on the way) and runs every output block
//! on them, instead of each output block reading the blocked `A` in place. Which
//! form runs is timed per shape with the micro-kernel (`Jit::pick_variant`,
//! [`JitOptions::pack_a`]); the AVX-512 kernel gains most from packing
//! (`examples/brgemm_best` at 2048×512×512, 2 threads: `brgemm` 182 against 170
//! GFLOP/s when it came in).
//!
//! `brgemm_dgrad` with a `mask` (the previous layer's `act'`, see
//! [`dlrm_ir::Op::BrgemmDgrad`]) applies it to each chunk of `dx` right after
//! the chunk's GEMM, while it is in cache (the epilogue hook of both forms),
//! reading the layer input's rows of that chunk.
//!
//! Results are not zeroed first (`Fresh`): the kernels write every element.
//!
//! Arithmetic: every output element is one accumulator summed over its reduction
//! index ascending (the interpreter's order) with one FMA per term, then the
//! epilogue (on the AVX-512 BF16 kernel, which `brgemm` with bf16 `x` and
//! weights runs under `auto` where the CPU has it, two exact products per
//! step); so the results differ from the reference kernels
//! ([`crate::kernels::brgemm`]) by float reassociation of the multiply-adds only
//! (the bias gradient and `act'` are computed exactly as there). Padding outputs
//! are exactly 0. Operands may be f32 or bf16 (widened exactly); `brgemm`'s
//! result is stored in its declared dtype (bf16 rounded to nearest even), the
//! gradients are f32. The micro-kernel is chosen per shape by
//! `Jit::pick_variant` under [`JitOptions::kernels`].

use super::buffers::{Floats, Fresh, Scratch};
use super::gemm::{BLayout, Elt, GemmKernel, GemmSpec, Micro, Operand, OutBuf, pack_b_into};
use super::layout::{buf, zeros};
use super::linear::{elt_of, operand};
use super::micro::BPacking;
use super::micro::avx512bf16::pack_b_pairs_into;
use super::pack::{Src, pack_blocked};
use super::{Jit, JitError, JitOptions};
use crate::kernels::brgemm::{
    act_grad, act_grads, check_fit, check_mask, check_xw, dims, dy_y_last, floats, mask_in_place,
    mask_operand,
};
use crate::kernels::{KResult, KernelError, shape_err};
use dlrm_ir::{Act, Data, Tensor, TensorType};
use half::bf16;
use rayon::prelude::*;
use std::borrow::Cow;

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
        // The mask is applied to f32 results only (bf16 ones: the reference).
        Op::BrgemmDgrad { mask, .. } if *mask != Act::None && out != Elt::F32 => return None,
        Op::BrgemmDgrad { act, mask } => {
            brgemm_dgrad(jit, opts, (*act, *mask), inputs, out).map(|t| vec![t])
        }
        Op::BrgemmWgrad { act, n } => brgemm_wgrad(jit, opts, *act, *n, inputs, out_types),
        _ => return None,
    })
}

fn jit_err(op: &'static str, e: JitError) -> KernelError {
    KernelError::Jit {
        op,
        reason: e.to_string(),
    }
}

/// Checks that `kern` writes whole rows of `width` elements and that `out` is
/// `blocks` blocks of `m` such rows: then running it on every row chunk of every
/// block writes every element of `out`.
fn check_cover(
    kern: &GemmKernel,
    out: &Fresh,
    (blocks, m, width): (usize, usize, usize),
) -> Result<(), JitError> {
    let sp = kern.spec();
    if sp.n != width || sp.ldc != width || out.len() != blocks * m * width || m > sp.m {
        return Err(JitError::Args {
            kernel: format!("{sp:?}"),
            reason: format!(
                "a result of {} elements is not {blocks} blocks of {m} rows of {width}",
                out.len()
            ),
        });
    }
    Ok(())
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

/// Picks the kernel for `base` ([`Jit::pick_variant`]: the micro-kernel and,
/// when `packable`, whether `A` is packed per row chunk; `bf16_b`: `B` is bf16
/// in memory) and runs `go` with it.
fn with_kernel<T>(
    jit: &Jit,
    opts: &JitOptions,
    op: &'static str,
    (base, packable, bf16_b): (GemmSpec, bool, bool),
    go: &mut dyn FnMut(GemmKernel) -> Result<T, JitError>,
) -> KResult<T> {
    let spec = {
        let mut trial = |k: GemmKernel| go(k).map(|_| ());
        jit.pick_variant(base, opts, (packable, bf16_b), &mut trial)
            .map_err(|e| jit_err(op, e))?
    };
    let k = jit.gemm(spec).map_err(|e| jit_err(op, e))?;
    go(k).map_err(|e| jit_err(op, e))
}

/// Runs `kern` (a spec with [`GemmSpec::pack_a`]) on row chunks of `rb` rows,
/// one rayon task each: `out` holds `blocks` blocks of `m` rows × `width` (row
/// stride `width`); the task for rows `r0..r0+rows` packs them once —
/// `pack(r0, rows, dst)` must write all of `dst`, `⌈rows/mr⌉` tiles `[k][mr]`,
/// rows past `rows` zero — and then runs every output block `q` on the packed
/// rows, reading `B` and the bias from `b_of(q)`. So `A` is packed once per
/// call, however many blocks reuse it. `epi` runs on each chunk once written.
#[allow(clippy::type_complexity)]
fn run_row_chunks<'d>(
    kern: GemmKernel,
    mut out: Fresh,
    (blocks, m, width, rb): (usize, usize, usize, usize),
    pack: &(dyn Fn(usize, usize, &mut [f32]) + Sync),
    b_of: &(dyn Fn(usize) -> (&'d [f32], Option<&'d [f32]>) + Sync),
    epi: Option<Epilogue<'_>>,
) -> Result<Floats, JitError> {
    check_cover(&kern, &out, (blocks, m, width))?;
    let rb = rb.max(1);
    let mut tasks: Vec<Vec<OutBuf<'_>>> = (0..m.div_ceil(rb)).map(|_| Vec::new()).collect();
    for blk in out.buf().chunks(m * width) {
        for (task, part) in tasks.iter_mut().zip(blk.chunks(rb * width)) {
            task.push(part);
        }
    }
    let (mr, k) = (kern.spec().micro.mr(), kern.spec().k);
    tasks
        .into_par_iter()
        .with_max_len(1)
        .enumerate()
        .try_for_each(|(ri, parts)| {
            let (r0, rows) = (ri * rb, rb.min(m - ri * rb));
            // This worker's reusable buffer: packing allocates nothing.
            let mut a = Scratch::new(rows.div_ceil(mr) * mr * k);
            pack(r0, rows, &mut a);
            for (q, mut cb) in parts.into_iter().enumerate() {
                let (b, bias) = b_of(q);
                kern.run_block(Operand::F32(&a), b, bias, cb.reborrow(), rows)?;
                run_epilogue(epi, &kern, q, r0, cb)?;
            }
            Ok(())
        })?;
    // SAFETY: every task returned Ok, and `check_cover` held: each wrote its
    // `rows` whole rows of every block, and the tasks' rows cover `0..m`.
    Ok(unsafe { out.assume_init() })
}

/// Runs `kern` on every row chunk of every output block, one rayon task each:
/// `out` holds `blocks` blocks of `m` rows × `width` (row stride `width`), cut
/// into chunks of `rb` rows; the chunk of block `q` from row `r0` reads `A` from
/// `a_of(q, r0)` and `B` and the bias from `b_of(q)`. Chunks are ordered row
/// chunk outer, block inner, so neighbouring tasks share `A` rows. `epi`
/// runs on each chunk once written.
#[allow(clippy::type_complexity)]
fn run_blocks<'d>(
    kern: GemmKernel,
    mut out: Fresh,
    (blocks, m, width, rb): (usize, usize, usize, usize),
    a_of: &(dyn Fn(usize, usize) -> Operand<'d> + Sync),
    b_of: &(dyn Fn(usize) -> (&'d [f32], Option<&'d [f32]>) + Sync),
    epi: Option<Epilogue<'_>>,
) -> Result<Floats, JitError> {
    check_cover(&kern, &out, (blocks, m, width))?;
    let rb = rb.max(1);
    let mut tasks: Vec<(usize, usize, OutBuf<'_>)> = Vec::with_capacity(blocks * m.div_ceil(rb));
    for (q, blk) in out.buf().chunks(m * width).into_iter().enumerate() {
        for (ri, ch) in blk.chunks(rb * width).into_iter().enumerate() {
            tasks.push((q, ri, ch));
        }
    }
    tasks.sort_by_key(|&(q, ri, _)| (ri, q));
    tasks
        .into_par_iter()
        .with_max_len(1)
        .try_for_each(|(q, ri, mut cb)| {
            let r0 = ri * rb;
            let (b, bias) = b_of(q);
            kern.run_block(a_of(q, r0), b, bias, cb.reborrow(), rb.min(m - r0))?;
            run_epilogue(epi, &kern, q, r0, cb)
        })?;
    // SAFETY: every task returned Ok, and `check_cover` held: each wrote its
    // whole rows, and the tasks' row chunks cover every block.
    Ok(unsafe { out.assume_init() })
}

/// Work on a chunk of a GEMM result while it is in cache: `(block q, first row
/// r0, the chunk's rows as written)`.
type Epilogue<'e> = &'e (dyn Fn(usize, usize, &mut [f32]) + Sync);

/// Runs `epi` (if any) on the chunk `cb` of block `q` from row `r0`, which
/// `kern.run_block` has just written whole.
fn run_epilogue(
    epi: Option<Epilogue<'_>>,
    kern: &GemmKernel,
    q: usize,
    r0: usize,
    mut cb: OutBuf<'_>,
) -> Result<(), JitError> {
    let Some(epi) = epi else { return Ok(()) };
    // SAFETY: the caller ran the kernel on this chunk, which wrote all of it
    // (`check_cover`: whole rows of the chunk's width).
    match unsafe { cb.f32_written() } {
        Some(rows) => {
            epi(q, r0, rows);
            Ok(())
        }
        None => Err(JitError::Args {
            kernel: format!("{:?}", kern.spec()),
            reason: "an epilogue needs an f32 result".into(),
        }),
    }
}

/// `v[from..]` of an operand (empty past the end).
fn tail(a: Operand<'_>, from: usize) -> Operand<'_> {
    match a {
        Operand::F32(v) => Operand::F32(&v[from.min(v.len())..]),
        Operand::BF16(v) => Operand::BF16(&v[from.min(v.len())..]),
    }
}

/// `nb` blocks of `k × bn` (`B` of the forward op: the blocked weights
/// `[Nb][Kb·bk][bn]`) packed for the kernel of spec `sp` (`k`, `n = bn`): into
/// `⌈bn/nr⌉` zero-padded panels each, of f32, or of k pairs for the AVX-512 BF16
/// kernel (bf16 weights).
fn pack_w_blocks(w: &Tensor, nb: usize, sp: &GemmSpec) -> Scratch {
    let (k, bn, nr) = (sp.k, sp.n, sp.micro.nr());
    let blk = sp.packed_b_len();
    let mut bp = Scratch::new(nb * blk);
    bp.par_chunks_mut(blk).enumerate().for_each(|(q, dst)| {
        let src = q * k * bn;
        let geom = (k, bn, bn, 1);
        match &w.data {
            Data::BF16(v) if sp.micro.b_packing() == BPacking::KPairs => {
                pack_b_pairs_into(dst, &v[src..src + k * bn], geom, nr)
            }
            Data::F32(v) => pack_b_into(dst, &v[src..src + k * bn], geom, nr),
            Data::BF16(v) => pack_b_into(dst, &v[src..src + k * bn], geom, nr),
            // Not reached: the op takes float weights only.
            _ => dst.fill(0.0),
        }
    });
    bp
}

/// `brgemm(xb[Kb,S,bk], wb[Nb,Kb,bk,bn], b[N]) -> act(x·wᵀ + b)` as `[Nb,S,bn]`.
///
/// `A` is the blocked activation read in place (the batch-reduce over its `Kb`
/// blocks); `B` is the f32 weight block `wb[nb]` read in place when `bn` is whole
/// tiles (packed otherwise, and for bf16 weights).
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
    let mut bias = floats(ins[2]).into_owned();
    bias.resize(nb * bn, 0.0);
    if s == 0 || nb == 0 || bn == 0 {
        return Ok(Floats::zeros(out, nb * s * bn).tensor(vec![nb, s, bn]));
    }
    let live_last = n - (nb - 1) * bn;
    if bn == 1 {
        let y = forward_columns(jit, act, xa, w, &bias, (nb, kb, s, bk), c)
            .map_err(|e| jit_err(OP, e))?;
        let y = finish_forward(y, sigmoid, out, nb, s, bn, live_last);
        return Ok(y.tensor(vec![nb, s, bn]));
    }
    let w_f32 = match &w.data {
        Data::F32(v) => Some(v.as_slice()),
        _ => None,
    };
    let base = GemmSpec {
        m: s,
        n: bn,
        k: kp,
        lda: bk,
        acs: 1,
        ldc: bn,
        a: xa.elt(),
        c,
        bias: true,
        relu: act == Act::Relu,
        micro: Micro::Cranelift,
        pack_a: false,
        b: match w_f32 {
            Some(_) => BLayout::InPlace { ldb: bn },
            None => BLayout::Packed,
        },
        kb: bk,
        a_blk: s * bk,
    };
    let mut result = None;
    let bf16_w = matches!(w.data, Data::BF16(_));
    with_kernel(jit, opts, OP, (base, true, bf16_w), &mut |kern| {
        let sp = *kern.spec();
        let nr = sp.micro.nr();
        let packed;
        let (bp, pbias, blk_b, blk_bias) = match (sp.packed_b(), w_f32) {
            (false, Some(v)) => (v, Cow::Borrowed(&bias[..]), kp * bn, bn),
            _ => {
                let panels = bn.div_ceil(nr);
                let mut pb = vec![0.0f32; nb * panels * nr];
                for (q, dst) in pb.chunks_mut(panels * nr).enumerate() {
                    dst[..bn].copy_from_slice(&bias[q * bn..(q + 1) * bn]);
                }
                packed = pack_w_blocks(w, nb, &sp);
                (&packed[..], Cow::Owned(pb), sp.packed_b_len(), panels * nr)
            }
        };
        let fresh = Fresh::new(c, nb * s * bn);
        let mr = sp.micro.mr();
        let b_of = |q: usize| {
            (
                &bp[q * blk_b..(q + 1) * blk_b],
                Some(&pbias[q * blk_bias..(q + 1) * blk_bias]),
            )
        };
        let y = if sp.pack_a {
            let src = match xa {
                Operand::F32(v) => Src::F32(v),
                Operand::BF16(v) => Src::BF16(v),
            };
            let pack = |r0, rows, dst: &mut [f32]| pack_blocked(dst, (s, bk, mr), (r0, rows), src);
            let shape = (nb, s, bn, row_block(s, mr, 1));
            run_row_chunks(kern, fresh, shape, &pack, &b_of, None)?
        } else {
            run_blocks(
                kern,
                fresh,
                (nb, s, bn, row_block(s, mr, nb)),
                &|_, r0| tail(xa, r0 * bk),
                &b_of,
                None,
            )?
        };
        result = Some(y);
        Ok(())
    })?;
    let y = result.ok_or_else(|| shape_err(OP, "internal: no result".into()))?;
    let y = finish_forward(y, sigmoid, out, nb, s, bn, live_last);
    Ok(y.tensor(vec![nb, s, bn]))
}

/// `brgemm` with one-column blocks (`bn = 1`, e.g. a layer with one output):
/// column `q` of `y` is `x · w[q] + b[q]` (relu fused; `c` is f32 when a
/// sigmoid follows), a matrix-vector product, computed as one dot per sample
/// ([`super::reduce::row_dots`]) instead of GEMM tiles that would use one of
/// their 8 or 32 lanes. The dot sums in a few vector accumulators: its result
/// differs from the GEMM's by float reassociation.
fn forward_columns(
    jit: &Jit,
    act: Act,
    xa: Operand<'_>,
    w: &Tensor,
    bias: &[f32],
    (nb, kb, s, bk): (usize, usize, usize, usize),
    c: Elt,
) -> Result<Floats, JitError> {
    let wv = floats(w);
    let spec = super::reduce::RowDotSpec {
        kb,
        bk,
        x: xa.elt(),
        out: c,
        relu: act == Act::Relu,
    };
    let mut y = Fresh::new(c, nb * s);
    for (q, col) in y.buf().chunks(s).into_iter().enumerate() {
        let wq = wv.get(q * kb * bk..(q + 1) * kb * bk).unwrap_or(&[]);
        super::reduce::row_dots(jit, spec, xa, s, (wq, bias[q]), col)?;
    }
    // SAFETY: every call returned Ok: `row_dots` wrote all `s` elements of its
    // column, and the columns are the `nb` chunks of `s` of `y`.
    Ok(unsafe { y.assume_init() })
}

/// Sigmoid (when fused after the GEMM) and exact zeros in the padding columns of
/// the last N block.
fn finish_forward(
    mut y: Floats,
    sigmoid: bool,
    out: Elt,
    nb: usize,
    s: usize,
    bn: usize,
    live_last: usize,
) -> Floats {
    let pad = |v: &mut [f32]| {
        if live_last < bn {
            for row in v[(nb - 1) * s * bn..].chunks_mut(bn) {
                row[live_last..].fill(0.0);
            }
        }
    };
    match &mut y {
        Floats::F32(v) => {
            if sigmoid {
                v.par_chunks_mut(1 << 14)
                    .for_each(|c| c.iter_mut().for_each(|x| *x = 1.0 / (1.0 + (-*x).exp())));
            }
            pad(v);
        }
        Floats::BF16(v) => {
            if live_last < bn {
                for row in v[(nb - 1) * s * bn..].chunks_mut(bn) {
                    row[live_last..].fill(bf16::ZERO);
                }
            }
        }
    }
    match (y, out) {
        (Floats::F32(v), Elt::BF16) => {
            Floats::BF16(v.par_iter().map(|&x| bf16::from_f32(x)).collect())
        }
        (y, _) => y,
    }
}

/// `brgemm_dgrad(dyb[Nb,S,bn], (yb,) wb[Nb,Kb,bk,bn]) -> dx[Kb,S,bk]`.
pub fn brgemm_dgrad(
    jit: &Jit,
    opts: &JitOptions,
    (act, mask): (Act, Act),
    ins: &[&Tensor],
    out: Elt,
) -> KResult<Tensor> {
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
    let np = nb * bn;
    if let Some(xb) = xb {
        check_mask(OP, xb, [kb, s, bk])?;
    }
    if s == 0 || kb == 0 || bk == 0 {
        return Ok(Floats::zeros(out, kb * s * bk).tensor(vec![kb, s, bk]));
    }
    // The mask (the previous layer's act'), applied to each chunk of dx while
    // it is in cache: the result is that layer's dz.
    let xv = xb.map(floats);
    let masking = |q: usize, r0: usize, rows: &mut [f32]| {
        if let Some(xv) = &xv {
            let from = (q * s + r0) * bk;
            mask_in_place(mask, rows, &xv[from..from + rows.len()]);
        }
    };
    let epi: Option<Epilogue<'_>> = xv.as_ref().map(|_| &masking as Epilogue<'_>);
    // A = dz = act'(dy, y) in dy's blocked layout `[Nb][S][bn]`: read in place
    // as the batch-reduce over its Nb blocks (computed once, on first use), or
    // computed into each row chunk's packed tiles.
    let (dv, yv) = (floats(dy), floats(y));
    let dz = std::cell::OnceCell::new();
    let wv = floats(w);
    let base = GemmSpec {
        m: s,
        n: bk,
        k: np,
        lda: bn,
        acs: 1,
        ldc: bk,
        a: Elt::F32,
        c: out,
        bias: false,
        relu: false,
        micro: Micro::Cranelift,
        pack_a: false,
        b: BLayout::Packed,
        kb: bn,
        a_blk: s * bn,
    };
    let mut result = None;
    with_kernel(jit, opts, OP, (base, true, false), &mut |kern| {
        let sp = *kern.spec();
        let nr = sp.micro.nr();
        // B for dx block kb: wᵀ, `Nb·bn × bk`: B(n', i) = wb[n'/bn][kb][i][n'%bn].
        let panels = bk.div_ceil(nr);
        let blk_b = panels * np * nr;
        let mut bp = Scratch::new(kb * blk_b);
        bp.par_chunks_mut(np * nr).enumerate().for_each(|(q, pan)| {
            let (kbi, p) = (q / panels, q % panels);
            let i0 = p * nr;
            let cols = nr.min(bk - i0);
            if cols < nr {
                pan.fill(0.0);
            }
            for nbi in 0..nb {
                let blk = (nbi * kb + kbi) * bk * bn;
                let dst = &mut pan[nbi * bn * nr..(nbi + 1) * bn * nr];
                for ii in 0..cols {
                    let src = &wv[blk + (i0 + ii) * bn..blk + (i0 + ii + 1) * bn];
                    for (d, &e) in dst[ii..].iter_mut().step_by(nr).zip(src) {
                        *d = e;
                    }
                }
            }
        });
        let fresh = Fresh::new(out, kb * s * bk);
        let mr = sp.micro.mr();
        let b_of = |q: usize| (&bp[q * blk_b..(q + 1) * blk_b], None);
        let dx = if sp.pack_a {
            let src = Src::Dz(act, &dv, &yv);
            let pack = |r0, rows, dst: &mut [f32]| pack_blocked(dst, (s, bn, mr), (r0, rows), src);
            run_row_chunks(
                kern,
                fresh,
                (kb, s, bk, row_block(s, mr, 1)),
                &pack,
                &b_of,
                epi,
            )?
        } else {
            let dz = dz.get_or_init(|| match act {
                Act::None => Cow::Borrowed(&dv[..]),
                _ => Cow::Owned(act_grads(act, &dv, &yv)),
            });
            run_blocks(
                kern,
                fresh,
                (kb, s, bk, row_block(s, mr, kb)),
                &|_, r0| Operand::F32(&dz[(r0 * bn).min(dz.len())..]),
                &b_of,
                epi,
            )?
        };
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
        let dw = Floats::zeros(dw_elt, nb * kb * bk * bn).tensor(vec![nb, kb, bk, bn]);
        let db = Floats::zeros(db_elt, n).tensor(vec![n]);
        return Ok(vec![dw, db]);
    }
    let (dyv, yv) = (floats(dy), floats(y));
    if bn == 1 {
        return wgrad_columns(jit, act, (&dyv, &yv), xa, (nb, kb, s, bk), (dw_elt, db_elt));
    }
    // xᵀ packed once per call pays off when many N blocks reuse it; with few,
    // the transposed view read in place is faster (`brgemm_best`: 256→64 1.0
    // vs 1.4 ms, 256→1 0.4 vs 1.1; 512→256 ~5% slower).
    let pack_x = nb >= PACK_X_MIN_NB;
    let kp = kb * bk;
    let base = GemmSpec {
        // Packed: one GEMM per N block over all `Kb·bk` rows of xᵀ (its tiles
        // run across the K blocks: no ragged tile per block), whose `[Kb·bk][bn]`
        // result is exactly dw[nb]. In place: one per block dw[nb][kb].
        m: if pack_x { kp } else { bk },
        n: bn,
        k: s,
        lda: 1,
        acs: bk,
        ldc: bn,
        a: if pack_x { Elt::F32 } else { xa.elt() },
        c: dw_elt,
        bias: false,
        relu: false,
        micro: Micro::Cranelift,
        pack_a: pack_x,
        b: BLayout::Packed,
        kb: 0,
        a_blk: 0,
    };
    let mut result = None;
    with_kernel(jit, opts, OP, (base, false, false), &mut |kern| {
        let sp = *kern.spec();
        let (mr, nr) = (sp.micro.mr(), sp.micro.nr());
        // B per nb block: dz[nb] (`S × bn`), packed, with db summed on the way.
        let panels = bn.div_ceil(nr);
        let blk_b = panels * s * nr;
        let mut dbp = vec![0.0f32; nb * panels * nr];
        // Panel q (`S × nr`) of the packed dz, its db columns summed into `dbq`.
        let pack_panel = |q: usize, pan: &mut [f32], dbq: &mut [f32]| {
            let (nbi, p) = (q / panels, q % panels);
            let j0 = p * nr;
            let cols = nr.min(bn - j0);
            if cols < nr {
                pan.fill(0.0);
            }
            let rows = (
                &dyv[nbi * s * bn..(nbi + 1) * s * bn],
                &yv[nbi * s * bn..(nbi + 1) * s * bn],
            );
            match act {
                Act::None => pack_dz(rows, pan, &mut dbq[..cols], (bn, j0, nr), |d, _| d),
                Act::Relu => pack_dz(rows, pan, &mut dbq[..cols], (bn, j0, nr), |d, y| {
                    act_grad(Act::Relu, d, y)
                }),
                Act::Sigmoid => pack_dz(rows, pan, &mut dbq[..cols], (bn, j0, nr), |d, y| {
                    act_grad(Act::Sigmoid, d, y)
                }),
            }
        };
        let mut fresh = Fresh::new(dw_elt, nb * kp * bn);
        let threads = rayon::current_num_threads().max(1);
        let xt = sp.pack_a.then(|| {
            let mut xt = Scratch::new(kp.div_ceil(mr) * mr * s);
            pack_x_t(&mut xt, xa, (kb, s, bk), mr);
            xt
        });
        let dw = if let Some(xt) = xt
            .as_ref()
            .filter(|_| nb >= FUSED_DZ_BLOCKS_PER_THREAD * threads)
        {
            // One task per N block packs that block's dz into a buffer of its
            // own and runs the GEMM on it at once, while it is in cache (enough
            // blocks to share out; the packed dz never goes through memory).
            check_cover(&kern, &fresh, (nb, kp, bn))?;
            let tasks: Vec<_> = fresh
                .buf()
                .chunks(kp * bn)
                .into_iter()
                .zip(dbp.chunks_mut(panels * nr))
                .enumerate()
                .collect();
            tasks
                .into_par_iter()
                .with_max_len(1)
                .try_for_each(|(nbi, (cb, dbq))| {
                    let mut b = Scratch::new(blk_b);
                    for (p, (pan, dbp)) in b.chunks_mut(s * nr).zip(dbq.chunks_mut(nr)).enumerate()
                    {
                        pack_panel(nbi * panels + p, pan, dbp);
                    }
                    kern.run_block(Operand::F32(xt), &b, None, cb, kp)
                })?;
            // SAFETY: every task returned Ok, and `check_cover` held: task nb
            // wrote all `Kb·bk` rows of block nb, and the tasks cover every block.
            unsafe { fresh.assume_init() }
        } else {
            let mut bp = Scratch::new(nb * blk_b);
            bp.par_chunks_mut(s * nr)
                .zip(dbp.par_chunks_mut(nr))
                .enumerate()
                .for_each(|(q, (pan, dbq))| pack_panel(q, pan, dbq));
            let b_of = |nbi: usize| (&bp[nbi * blk_b..(nbi + 1) * blk_b], None);
            if let Some(xt) = &xt {
                // Row chunks of dw[nb] (whole tiles: chunk r0 starts at tile
                // r0/mr, element r0·S of the packed xᵀ).
                run_blocks(
                    kern,
                    fresh,
                    (nb, kp, bn, row_block(kp, mr, nb)),
                    &|_, r0| Operand::F32(&xt[(r0 * s).min(xt.len())..]),
                    &b_of,
                    None,
                )?
            } else {
                // One task per block dw[nb][kb]: `xb[kb]` read as its transpose.
                run_blocks(
                    kern,
                    fresh,
                    (nb * kb, bk, bn, bk),
                    &|blk, _| tail(xa, (blk % kb) * s * bk),
                    &|blk| b_of(blk / kb),
                    None,
                )?
            }
        };
        result = Some((dw, dbp));
        Ok(())
    })?;
    let (mut dw, dbp) = result.ok_or_else(|| shape_err(OP, "internal: no result".into()))?;
    // Exact zeros in the padding columns n >= N (the interpreter writes 0).
    let live_last = n - (nb - 1) * bn;
    if live_last < bn {
        match &mut dw {
            Floats::F32(v) => v[(nb - 1) * kb * bk * bn..]
                .chunks_mut(bn)
                .for_each(|r| r[live_last..].fill(0.0)),
            Floats::BF16(v) => v[(nb - 1) * kb * bk * bn..]
                .chunks_mut(bn)
                .for_each(|r| r[live_last..].fill(bf16::ZERO)),
        }
    }
    // dbp is [Nb][panels·nr]: column j of block nb at nb·panels·nr + j.
    let panels_nr = dbp.len() / nb;
    let db: Vec<f32> = (0..n).map(|j| dbp[(j / bn) * panels_nr + j % bn]).collect();
    Ok(vec![dw.tensor(vec![nb, kb, bk, bn]), db_of(db, db_elt)])
}

/// The bias gradient `db` (f32 sums) stored as `elt`.
fn db_of(db: Vec<f32>, elt: Elt) -> Tensor {
    let n = db.len();
    let db = match elt {
        Elt::F32 => Floats::F32(db),
        Elt::BF16 => Floats::BF16(db.iter().map(|&v| bf16::from_f32(v)).collect()),
    };
    db.tensor(vec![n])
}

/// `brgemm_wgrad` with one-column blocks (`bn = 1`, e.g. a layer with one
/// output): column `nb` of `dw` is `Σ_s dz[nb][s] · x[s]`, a matrix-vector
/// product, computed as a weighted sum of `x`'s rows
/// ([`super::reduce::weighted_block_sums`]) that reads `x` once — a GEMM tile
/// would use one of its 8 or 32 lanes. Same float operations as the GEMM
/// path: each element summed over the samples in order, one FMA per term;
/// `dz = act'(dy, y)` and `db` (its sum in sample order) as in [`pack_dz`].
fn wgrad_columns(
    jit: &Jit,
    act: Act,
    (dyv, yv): (&[f32], &[f32]),
    xa: Operand<'_>,
    (nb, kb, s, bk): (usize, usize, usize, usize),
    (dw_elt, db_elt): (Elt, Elt),
) -> KResult<Vec<Tensor>> {
    const OP: &str = "brgemm_wgrad";
    if dyv.len() != nb * s || yv.len() != nb * s {
        return Err(shape_err(
            OP,
            format!(
                "dy holds {} and y {} elements for {nb} blocks of {s} samples × 1",
                dyv.len(),
                yv.len()
            ),
        ));
    }
    let mut dw = zeros(dw_elt, nb * kb * bk);
    let mut db = Vec::with_capacity(nb);
    let mut dz = vec![0.0f32; s];
    for (q, mut dwq) in buf(&mut dw).chunks(kb * bk).into_iter().enumerate() {
        let mut sum = 0.0f32;
        for ((z, &d), &y) in dz.iter_mut().zip(&dyv[q * s..]).zip(&yv[q * s..]) {
            *z = act_grad(act, d, y);
            sum += *z;
        }
        db.push(sum);
        super::reduce::weighted_block_sums(jit, xa, (kb, s, bk), &dz, dwq.reborrow())
            .map_err(|e| jit_err(OP, e))?;
    }
    let dw = Tensor {
        shape: vec![nb, kb, bk, 1],
        data: dw,
    };
    Ok(vec![dw, db_of(db, db_elt)])
}

/// N blocks from which `brgemm_wgrad` packs `xᵀ` (fewer read it in place).
const PACK_X_MIN_NB: usize = 4;

/// N blocks per thread from which `brgemm_wgrad` (packed `xᵀ`) packs each
/// block's `dz` inside that block's GEMM task instead of all blocks first.
const FUSED_DZ_BLOCKS_PER_THREAD: usize = 2;

/// One packed panel of `dz = g(dy, y)` (`S` rows of `nr`, the first `db.len()`
/// columns live, from column `j0` of the `[S][bn]` block `dy`, `y`), adding each
/// row into `db` in sample order.
fn pack_dz(
    (dy, y): (&[f32], &[f32]),
    pan: &mut [f32],
    db: &mut [f32],
    (bn, j0, nr): (usize, usize, usize),
    g: impl Fn(f32, f32) -> f32,
) {
    let cols = db.len();
    for ((row, d), yy) in pan
        .chunks_exact_mut(nr)
        .zip(dy.chunks_exact(bn))
        .zip(y.chunks_exact(bn))
    {
        for (((o, &d), &yy), acc) in row[..cols]
            .iter_mut()
            .zip(&d[j0..j0 + cols])
            .zip(&yy[j0..j0 + cols])
            .zip(db.iter_mut())
        {
            let z = g(d, yy);
            *o = z;
            *acc += z;
        }
    }
}

/// `xᵀ` of a blocked activation `xb[Kb][S][bk]` (`Kb·bk × S`: row `r` is column
/// `r % bk` of block `r / bk`) into `dst` as tile-major panels `[⌈Kb·bk/mr⌉][S][mr]`
/// (f32, bf16 widened exactly), every element written: rows past `Kb·bk` zero.
///
/// Row `si` of tile `t` is columns `t·mr..(t+1)·mr` of sample `si`'s whole `x`
/// row (its blocks side by side), so this is a copy of short runs, not a
/// transpose. Each task takes [`PACK_X_SAMPLES`] samples: it stages their rows
/// side by side (reading `x` in order), then writes its part of each tile as
/// one contiguous run. (Reading each tile's runs straight from `x` touched
/// every cache line of `x` once per tile and took ~1.6× as long on a cold `x`,
/// 2048×512.)
fn pack_x_t(dst: &mut [f32], x: Operand<'_>, (kb, s, bk): (usize, usize, usize), mr: usize) {
    let kp = kb * bk;
    let tiles = kp.div_ceil(mr);
    // Sample chunks of the tiles, transposed into tasks: task c writes chunk c
    // of every tile.
    let chunk = PACK_X_SAMPLES;
    let mut tasks: Vec<Vec<&mut [f32]>> = (0..s.div_ceil(chunk)).map(|_| Vec::new()).collect();
    for tile in dst.chunks_mut(s * mr).take(tiles) {
        for (c, part) in tile.chunks_mut(chunk * mr).enumerate() {
            tasks[c].push(part);
        }
    }
    tasks
        .into_par_iter()
        .enumerate()
        .for_each(|(c, mut parts)| {
            // The chunk's rows, zero-padded to whole tiles.
            let (s0, s1) = (c * chunk, s.min((c + 1) * chunk));
            let w = tiles * mr;
            let mut rows = Scratch::new((s1 - s0) * w);
            for (si, row) in (s0..s1).zip(rows.chunks_exact_mut(w)) {
                row[kp..].fill(0.0);
                for (q, dst) in row[..kp].chunks_exact_mut(bk).enumerate() {
                    let at = (q * s + si) * bk;
                    match x {
                        Operand::F32(v) => dst.copy_from_slice(&v[at..at + bk]),
                        Operand::BF16(v) => dst
                            .iter_mut()
                            .zip(&v[at..at + bk])
                            .for_each(|(d, e)| *d = e.to_f32()),
                    }
                }
            }
            for (t, part) in parts.iter_mut().enumerate() {
                match mr {
                    12 => copy_runs::<12>(part, &rows, w, t),
                    6 => copy_runs::<6>(part, &rows, w, t),
                    4 => copy_runs::<4>(part, &rows, w, t),
                    _ => {
                        for (d, row) in part.chunks_exact_mut(mr).zip(rows.chunks_exact(w)) {
                            d.copy_from_slice(&row[t * mr..(t + 1) * mr]);
                        }
                    }
                }
            }
        });
}

/// Tile `t`'s rows of a chunk (`part`, `[samples][MR]`) from the staged rows
/// (`w` floats each): a fixed length, so a few vector moves per row rather than
/// a `memcpy` call.
fn copy_runs<const MR: usize>(part: &mut [f32], rows: &[f32], w: usize, t: usize) {
    for (d, row) in part
        .as_chunks_mut::<MR>()
        .0
        .iter_mut()
        .zip(rows.chunks_exact(w))
    {
        *d = row[t * MR..].as_chunks::<MR>().0[0];
    }
}

/// Samples per task of [`pack_x_t`].
const PACK_X_SAMPLES: usize = 64;
