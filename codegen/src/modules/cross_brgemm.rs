//! The kernels of `cross_brgemm`, `cross_brgemm_save` and `cross_brgemm_dgrad`
//! (`dlrm_ir::ops::cross_brgemm`, whose doc is the specification): a cross
//! layer's product with its elementwise step in the GEMM's epilogue.
//!
//! - The JIT kernels run the blocked GEMM of `brgemm` / `brgemm_dgrad`
//!   ([`crate::jit::brgemm`]) with an epilogue on each chunk of the f32 product
//!   while it is in cache: `y = x0 ⊙ w + x` (with `w` rounded to its dtype first,
//!   and stored when the op keeps it), or `dx = dy + t·v` then `g = dx ⊙ x0`,
//!   `dx0 = dx ⊙ w`. An f32 product that is itself a result (`w` kept in f32,
//!   `dx`, or `y` mixed in place) is written once, where the GEMM writes it; the
//!   other results are written chunk by chunk at the product's offsets.
//! - The reference kernels compose the reference `brgemm` / `brgemm_dgrad`
//!   kernels with the reference elementwise step.
//!
//! Every element is the module's float operations in its order, so each kernel
//! equals its unfused composition on the same backend bit for bit.

use crate::jit::brgemm::{Epilogue, Written, brgemm, brgemm_dgrad};
use crate::jit::buffers::{Disjoint, Floats, Fresh};
use crate::jit::gemm::Elt;
use crate::jit::linear::elt_of;
use crate::jit::{Jit, JitOptions};
use crate::reference::cross::{CHUNK, In, mix_into};
use crate::reference::{self, Elem, KResult, bind, instance_err};
use dlrm_ir::module::ModOp;
use dlrm_ir::{Act, Checked, DType, NodeInstance, Op, Tensor, TensorType};
use half::bf16;
use rayon::prelude::*;
use std::collections::HashMap;

/// The product of the forward ops.
const PRODUCT: Op = Op::Brgemm { act: Act::None };

/// The product of `cross_brgemm_dgrad`.
const DGRAD: Op = Op::BrgemmDgrad {
    act: Act::None,
    mask: Act::None,
    dtype: DType::F32,
};

/// The instance of `op` (a product) on `ins`, its result types inferred.
fn sub_instance(op: &Op, ins: &[&Tensor]) -> KResult<NodeInstance> {
    let tys: Vec<TensorType> = ins
        .iter()
        .map(|t| {
            TensorType::new(
                t.dtype(),
                t.shape.iter().map(|&d| d.into()).collect::<Vec<_>>(),
            )
        })
        .collect();
    let refs: Vec<&TensorType> = tys.iter().collect();
    let outs = dlrm_ir::infer(op, &refs, &[]).map_err(|e| instance_err(op, e))?;
    NodeInstance::of_operands(op, ins, &outs, &HashMap::new()).map_err(|e| instance_err(op, e))
}

/// `brgemm`'s result dtype: bf16 only if both factors are.
fn product_dtype(ins: &[&Tensor]) -> DType {
    if ins[..2].iter().all(|t| t.dtype() == DType::BF16) {
        DType::BF16
    } else {
        DType::F32
    }
}

/// A result of `shape` and dtype `dt`, `f` of the operands' elements, in
/// parallel chunks.
fn mix_tensor(
    ins: (In<'_>, In<'_>, In<'_>),
    (dt, shape): (DType, Vec<usize>),
    f: impl Fn(f32, f32, f32) -> f32 + Sync,
) -> Option<Tensor> {
    let n = shape.iter().product::<usize>();
    let mut out = Fresh::new(elt_of(dt)?, n);
    {
        let o = Disjoint::new(&mut out);
        (0..n.div_ceil(CHUNK)).into_par_iter().for_each(|i| {
            let (at, len) = (i * CHUNK, CHUNK.min(n - i * CHUNK));
            let parts = (
                ins.0.range(at, len),
                ins.1.range(at, len),
                ins.2.range(at, len),
            );
            // SAFETY: each task writes its own chunk.
            mix_into(parts, unsafe { o.range(at, len) }, &f);
        });
    }
    // SAFETY: the chunks cover `0..n`, each written whole.
    Some(unsafe { out.assume_init() }.tensor(shape))
}

/// Whether the op keeps `w` (`cross_brgemm_save`).
fn saves(m: &ModOp) -> bool {
    m.mnemonic() == "cross_brgemm_save"
}

/// `cross_brgemm` / `cross_brgemm_save` on the reference kernels.
pub(crate) fn forward(m: &ModOp, c: &Checked<'_>) -> Option<KResult<Vec<Tensor>>> {
    let ins = c.inputs();
    let (x0, x) = (In::of(ins[3])?, In::of(ins[4])?);
    let y_dt = c.out(0).dtype;
    elt_of(y_dt)?;
    Some((|| {
        let w_dt = product_dtype(ins);
        let inst = sub_instance(&PRODUCT, &ins[..3])?;
        let w = reference::brgemm::brgemm(Act::None, &bind(&inst, &ins[..3])?, w_dt)?;
        let wv = In::of(&w).ok_or_else(|| instance_err(&PRODUCT, "a float product".into()))?;
        let y = mix_tensor((x0, wv, x), (y_dt, w.shape.clone()), |a, w, d| a * w + d)
            .ok_or_else(|| instance_err(&PRODUCT, "a float result".into()))?;
        Ok(if saves(m) { vec![y, w] } else { vec![y] })
    })())
}

/// `cross_brgemm_dgrad` on the reference kernels.
pub(crate) fn dgrad(_: &ModOp, c: &Checked<'_>) -> Option<KResult<Vec<Tensor>>> {
    let ins = c.inputs();
    let dy = ins[2].as_f32()?;
    let mixes = ins.len() == 5;
    let types: Vec<DType> = (0..if mixes { 3 } else { 1 })
        .map(|k| c.out(k).dtype)
        .collect();
    types.iter().try_for_each(|&d| elt_of(d).map(|_| ()))?;
    Some((|| {
        let inst = sub_instance(&DGRAD, &ins[..2])?;
        let tv = reference::brgemm::brgemm_dgrad(
            Act::None,
            Act::None,
            &bind(&inst, &ins[..2])?,
            DType::F32,
        )?;
        let tv = tv.as_f32().unwrap_or_default();
        let dx: Vec<f32> = dy.par_iter().zip(tv).map(|(&d, &t)| d + t).collect();
        let shape = ins[2].shape.clone();
        let mut outs = vec![Tensor::f32(shape.clone(), dx)];
        if mixes {
            let err = || instance_err(&DGRAD, "float operands".into());
            let (x0, w) = (
                In::of(ins[3]).ok_or_else(err)?,
                In::of(ins[4]).ok_or_else(err)?,
            );
            let d = In::F32(outs[0].as_f32().unwrap_or_default());
            let g = mix_tensor((d, x0, x0), (types[1], shape.clone()), |d, x0, _| d * x0);
            let dx0 = mix_tensor((d, w, w), (types[2], shape), |d, w, _| d * w);
            outs.extend([g.ok_or_else(err)?, dx0.ok_or_else(err)?]);
        }
        Ok(outs)
    })())
}

/// `cross_brgemm` / `cross_brgemm_save` on the JIT's blocked GEMM, the mix in
/// its epilogue.
pub(crate) fn forward_jit(
    jit: &Jit,
    m: &ModOp,
    c: &Checked<'_>,
    out_types: &[TensorType],
    opts: &JitOptions,
) -> Option<KResult<Vec<Tensor>>> {
    let ins = c.inputs();
    let (x0, x) = (In::of(ins[3])?, In::of(ins[4])?);
    let y_elt = elt_of(out_types.first()?.dtype)?;
    let save = saves(m);
    Some((|| {
        let w_dt = product_dtype(ins);
        let w_elt = if w_dt == DType::BF16 {
            Elt::BF16
        } else {
            Elt::F32
        };
        let [nb, _, _, bn] = reference::dims_of::<4>(c, 1)?;
        let s = ins[0].shape[1];
        let live_last = ins[2].shape[0] - (nb.max(1) - 1) * bn;
        let shape = vec![nb, s, bn];
        let len = nb * s * bn;
        // The product is written where the GEMM writes it: as `w` when kept,
        // else as `y`, mixed in place, when `y` has its dtype.
        let in_place = !save && w_elt == y_elt;
        let mut y_buf = (!in_place).then(|| Fresh::new(y_elt, len));
        let inst = sub_instance(&PRODUCT, &ins[..3])?;
        let sub = bind(&inst, &ins[..3])?;
        if len == 0 {
            let empty = |e| Floats::zeros(e, 0).tensor(shape.clone());
            return Ok(if save {
                vec![empty(y_elt), empty(w_elt)]
            } else {
                vec![empty(y_elt)]
            });
        }
        let product = {
            let y_out = y_buf.as_mut().map(Disjoint::new);
            let epi = |q: usize, r0: usize, chunk: Written<'_>| {
                // `w`'s padding columns are 0 by definition.
                let pad = q + 1 == nb && live_last < bn;
                let (at, n) = ((q * s + r0) * bn, chunk.len());
                let (x0c, xc) = (x0.range(at, n), x.range(at, n));
                match chunk {
                    Written::F32(rows) => {
                        if pad {
                            rows.chunks_mut(bn).for_each(|r| r[live_last..].fill(0.0));
                        }
                        mix_chunk(rows, (x0c, xc), y_out.as_ref(), at);
                    }
                    Written::BF16(rows) => {
                        if pad {
                            rows.chunks_mut(bn)
                                .for_each(|r| r[live_last..].fill(bf16::ZERO));
                        }
                        mix_chunk(rows, (x0c, xc), y_out.as_ref(), at);
                    }
                }
            };
            brgemm(
                jit,
                opts,
                Act::None,
                &sub,
                w_elt,
                Some(&epi as Epilogue<'_>),
            )?
        };
        Ok(match y_buf {
            // SAFETY: the epilogue ran on every chunk of the product, which
            // cover it, and wrote each chunk's range of `y`.
            Some(y) => {
                let y = unsafe { y.assume_init() }.tensor(shape);
                if save { vec![y, product] } else { vec![y] }
            }
            None => vec![product],
        })
    })())
}

/// The mix of one chunk `w` of the product at offset `at`:
/// `y = x0 ⊙ w + x` into `y_out`'s range, or into `w` itself (`y_out` `None`).
fn mix_chunk<W: Elem + WAsIn>(
    w: &mut [W],
    (x0, x): (In<'_>, In<'_>),
    y_out: Option<&Disjoint<'_>>,
    at: usize,
) {
    match y_out {
        // SAFETY: the GEMM's chunks are disjoint; this is this chunk's.
        Some(o) => mix_into(
            (x0, W::as_in(w), x),
            unsafe { o.range(at, w.len()) },
            &|a, w, d| a * w + d,
        ),
        None => mix_in_place(w, x0, x),
    }
}

/// A product chunk's elements as an operand.
trait WAsIn: Sized {
    fn as_in(w: &[Self]) -> In<'_>;
}

impl WAsIn for f32 {
    fn as_in(w: &[f32]) -> In<'_> {
        In::F32(w)
    }
}

impl WAsIn for bf16 {
    fn as_in(w: &[bf16]) -> In<'_> {
        In::BF16(w)
    }
}

/// `w[k] = x0[k]·w[k] + x[k]` (`y` mixed where the product is, in its dtype).
fn mix_in_place<W: Elem>(w: &mut [W], x0: In<'_>, x: In<'_>) {
    #[inline(always)]
    fn go<W: Elem, A: Elem, B: Elem>(w: &mut [W], x0: &[A], x: &[B]) {
        for ((w, a), d) in w.iter_mut().zip(x0).zip(x) {
            *w = W::store(a.load() * w.load() + d.load());
        }
    }
    /// [`go`] compiled for AVX2 (bf16 stores vectorise there, not on SSE2).
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn go_avx2<W: Elem, A: Elem, B: Elem>(w: &mut [W], x0: &[A], x: &[B]) {
        go(w, x0, x)
    }
    fn run<W: Elem, A: Elem, B: Elem>(w: &mut [W], x0: &[A], x: &[B]) {
        #[cfg(target_arch = "x86_64")]
        if crate::reference::convert::has_avx2() {
            // SAFETY: the CPU has AVX2.
            return unsafe { go_avx2(w, x0, x) };
        }
        go(w, x0, x)
    }
    match (x0, x) {
        (In::F32(a), In::F32(d)) => run(w, a, d),
        (In::F32(a), In::BF16(d)) => run(w, a, d),
        (In::BF16(a), In::F32(d)) => run(w, a, d),
        (In::BF16(a), In::BF16(d)) => run(w, a, d),
    }
}

/// `cross_brgemm_dgrad` on the JIT's blocked GEMM, the residual and the mix in
/// its epilogue.
pub(crate) fn dgrad_jit(
    jit: &Jit,
    _: &ModOp,
    c: &Checked<'_>,
    out_types: &[TensorType],
    opts: &JitOptions,
) -> Option<KResult<Vec<Tensor>>> {
    let ins = c.inputs();
    let dy = ins[2].as_f32()?;
    let mixes = ins.len() == 5;
    let (x0, w) = match mixes {
        true => (Some(In::of(ins[3])?), Some(In::of(ins[4])?)),
        false => (None, None),
    };
    let elts: Vec<Elt> = out_types
        .iter()
        .map(|t| elt_of(t.dtype))
        .collect::<Option<_>>()?;
    Some((|| {
        let shape = ins[2].shape.clone();
        let len = dy.len();
        let s = shape.get(1).copied().unwrap_or(0);
        let bk = shape.get(2).copied().unwrap_or(0);
        let mut g_buf = mixes.then(|| Fresh::new(elts[1], len));
        let mut dx0_buf = mixes.then(|| Fresh::new(elts[2], len));
        let inst = sub_instance(&DGRAD, &ins[..2])?;
        let sub = bind(&inst, &ins[..2])?;
        if len == 0 {
            return Ok(elts
                .iter()
                .map(|&e| Floats::zeros(e, 0).tensor(shape.clone()))
                .collect());
        }
        let dx = {
            let g_out = g_buf.as_mut().map(Disjoint::new);
            let dx0_out = dx0_buf.as_mut().map(Disjoint::new);
            let epi = |q: usize, r0: usize, chunk: Written<'_>| {
                let Written::F32(rows) = chunk else {
                    unreachable!("brgemm_dgrad gives its epilogue f32 rows")
                };
                let (at, n) = ((q * s + r0) * bk, rows.len());
                for (r, &d) in rows.iter_mut().zip(&dy[at..at + n]) {
                    *r += d; // dy + t·v (an IEEE sum commutes)
                }
                if let (Some(g_out), Some(dx0_out), Some(x0), Some(w)) = (&g_out, &dx0_out, x0, w) {
                    let (d, x0c, wc) = (In::F32(rows), x0.range(at, n), w.range(at, n));
                    // SAFETY: the GEMM's chunks are disjoint; this is this chunk's.
                    let (g, dx0) = unsafe { (g_out.range(at, n), dx0_out.range(at, n)) };
                    mix_into((d, x0c, x0c), g, &|d, x0, _| d * x0);
                    mix_into((d, wc, wc), dx0, &|d, w, _| d * w);
                }
            };
            let epi: Epilogue<'_> = &epi;
            brgemm_dgrad(jit, opts, (Act::None, Act::None), &sub, Elt::F32, Some(epi))?
        };
        let mut outs = vec![dx];
        for b in [g_buf, dx0_buf].into_iter().flatten() {
            // SAFETY: the epilogue ran on every chunk of the product, which
            // cover it, and wrote each chunk's range.
            outs.push(unsafe { b.assume_init() }.tensor(shape.clone()));
        }
        Ok(outs)
    })())
}
