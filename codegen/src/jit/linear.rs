//! `linear`, `linear_dx` and `linear_dw` on the JIT GEMM core ([`super::gemm`]).
//!
//! | op | A (rows × k) | packed B | epilogue |
//! | --- | --- | --- | --- |
//! | `linear(x[S,K], w[N,K], b[N])` | `x` (`S×K`) | `wᵀ` (panels of w's rows) | bias, relu fused; sigmoid applied per row block after the GEMM |
//! | `linear_dx(dz[S,N], w[N,K])` | `dz` (`S×N`) | `w` (`N×K`) | none |
//! | `linear_dw(dz[S,N], x[S,K])` | `dzᵀ` (`N×S`, read in place with strides `1, N`) | `x` (`S×K`) | none, f32 result |
//!
//! Weights are packed per call (they change every training step); the packing is
//! `O(N·K)` against the GEMM's `O(S·N·K)`. Operands may be f32 or bf16 in any mix;
//! results are stored in the declared dtype (bf16 rounded to nearest even).
//!
//! The operands come checked against the node's instance ([`Checked`]: ranks and
//! shared dims verified by inference, buffers of their shapes' lengths); the
//! GEMM core still checks each slice against the spec it was compiled for.

use super::gemm::{BLayout, Elt, GemmKernel, GemmSpec, Micro, Operand, OutBuf, pack_b, pack_bias};
use super::micro::BPacking;
use super::micro::avx512bf16::pack_b_pairs_into;
use super::{Jit, JitError, JitOptions};
use crate::reference::{KResult, KernelError, shape_err};
use dlrm_ir::{Act, Checked, DType, Data, Tensor, TensorType};
use half::bf16;
use rayon::prelude::*;

/// Samples per chunk of the wgrad reduction.
const DW_CHUNK: usize = 256;

/// A float operand of a GEMM.
pub(crate) fn operand(t: &Tensor) -> Option<Operand<'_>> {
    match &t.data {
        Data::F32(v) => Some(Operand::F32(v)),
        Data::BF16(v) => Some(Operand::BF16(v)),
        _ => None,
    }
}

/// The GEMM element type of a float dtype (`None` for others).
pub(crate) fn elt_of(d: DType) -> Option<Elt> {
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

/// A result buffer of `n` elements of `elt`.
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

    fn buf(&mut self) -> OutBuf<'_> {
        match self {
            Out::F32(v) => OutBuf::F32(v),
            Out::BF16(v) => OutBuf::BF16(v),
        }
    }

    fn tensor(self, shape: Vec<usize>) -> Tensor {
        match self {
            Out::F32(v) => Tensor::f32(shape, v),
            Out::BF16(v) => Tensor::bf16(shape, v),
        }
    }
}

/// Picks the micro-kernel (`bf16_b`: `B` is bf16 in memory, see
/// [`Jit::pick_variant`]), packs B for it (`pack(micro)`: panels of its width,
/// in k pairs for the k-pair kernels, [`Micro::Bf16Dot`] and [`Micro::Amx`]), and runs the GEMM into a fresh result of
/// `m × n`.
fn run_gemm(
    jit: &Jit,
    opts: &JitOptions,
    op: &'static str,
    (base, bf16_b): (GemmSpec, bool),
    a: Operand<'_>,
    pack: &(dyn Fn(Micro) -> Vec<f32> + Sync),
    bias: Option<&[f32]>,
) -> KResult<Out> {
    let mut packed: Vec<(Micro, Vec<f32>)> = Vec::new();
    let packed_for = |micro: Micro, packed: &mut Vec<(Micro, Vec<f32>)>| -> usize {
        if let Some(i) = packed.iter().position(|(m, _)| *m == micro) {
            return i;
        }
        packed.push((micro, pack(micro)));
        packed.len() - 1
    };
    let run = |k: GemmKernel, bp: &[f32], out: &mut Out| -> Result<(), JitError> {
        let pb = bias.map(|b| pack_bias(b, k.spec().micro.nr()));
        k.run(a, bp, pb.as_deref(), out.buf())
    };
    let micro = {
        let mut trial = |k: GemmKernel| -> Result<(), JitError> {
            let i = packed_for(k.spec().micro, &mut packed);
            let mut scratch = Out::zeros(base.c, base.m * base.n);
            run(k, &packed[i].1, &mut scratch)
        };
        jit.pick_variant(base, opts, (false, bf16_b), &mut trial)
            .map_err(|e| jit_err(op, e))?
            .micro
    };
    let spec = GemmSpec {
        micro,
        // Transposed A views (wgrad's dzᵀ) are packed per row block: strided
        // reads k by k cost far more than one packing pass.
        pack_a: base.acs != 1,
        b: BLayout::Packed,
        kb: 0,
        a_blk: 0,
        ..base
    };
    let k = jit.gemm(spec).map_err(|e| jit_err(op, e))?;
    let i = packed_for(micro, &mut packed);
    let mut out = Out::zeros(base.c, base.m * base.n);
    run(k, &packed[i].1, &mut out).map_err(|e| jit_err(op, e))?;
    Ok(out)
}

fn to_f32(t: &Tensor) -> Vec<f32> {
    t.to_f32_vec()
}

/// `linear(x[S,K], w[N,K], b[N]) -> act(x · wᵀ + b)`.
pub fn linear(
    jit: &Jit,
    opts: &JitOptions,
    act: Act,
    c: &Checked<'_>,
    out_types: &[TensorType],
) -> Option<KResult<Vec<Tensor>>> {
    const OP: &str = "linear";
    let [x, w, b] = c.inputs() else { return None };
    let (xa, _) = (operand(x)?, operand(w)?);
    operand(b)?;
    let out_elt = elt_of(out_types.first()?.dtype)?;
    // The instance verified x[S,K], weight[N,K], bias[N].
    let (&[s, k], &[n, _]) = (c.in_shape(0), c.in_shape(1)) else {
        return None;
    };
    Some((|| {
        let sigmoid = act == Act::Sigmoid;
        let c = if sigmoid { Elt::F32 } else { out_elt };
        let base = GemmSpec::new(s, n, k, xa_elt(xa), c).with_bias(act == Act::Relu);
        let bias = to_f32(b);
        let pack = |micro: Micro| match &w.data {
            Data::BF16(v) if micro.b_packing() == BPacking::KPairs => {
                let mut bp = vec![0.0f32; GemmSpec { micro, ..base }.packed_b_len()];
                pack_b_pairs_into(&mut bp, v, (k, n, 1, k), micro.nr());
                bp
            }
            Data::F32(v) => pack_b(v, k, n, 1, k, micro.nr()),
            Data::BF16(v) => pack_b(v, k, n, 1, k, micro.nr()),
            _ => Vec::new(),
        };
        let bf16_w = matches!(w.data, Data::BF16(_));
        let out = run_gemm(jit, opts, OP, (base, bf16_w), xa, &pack, Some(&bias))?;
        let out = if sigmoid {
            let Out::F32(mut v) = out else {
                return Err(shape_err(OP, "internal: sigmoid scratch is not f32".into()));
            };
            v.par_chunks_mut(1 << 14)
                .for_each(|c| c.iter_mut().for_each(|x| *x = 1.0 / (1.0 + (-*x).exp())));
            match out_elt {
                Elt::F32 => Out::F32(v),
                Elt::BF16 => Out::BF16(v.par_iter().map(|&x| bf16::from_f32(x)).collect()),
            }
        } else {
            out
        };
        Ok(vec![out.tensor(vec![s, n])])
    })())
}

fn xa_elt(a: Operand<'_>) -> Elt {
    match a {
        Operand::F32(_) => Elt::F32,
        Operand::BF16(_) => Elt::BF16,
    }
}

/// `linear_dx(dz[S,N], w[N,K]) -> dz · w`.
pub fn linear_dx(
    jit: &Jit,
    opts: &JitOptions,
    c: &Checked<'_>,
    out_types: &[TensorType],
) -> Option<KResult<Vec<Tensor>>> {
    const OP: &str = "linear_dx";
    let [dz, w] = c.inputs() else { return None };
    let (dza, _) = (operand(dz)?, operand(w)?);
    let out_elt = elt_of(out_types.first()?.dtype)?;
    // The instance verified dz[S,N], weight[N,K].
    let (&[s, n], &[_, k]) = (c.in_shape(0), c.in_shape(1)) else {
        return None;
    };
    Some((|| {
        let base = GemmSpec::new(s, k, n, xa_elt(dza), out_elt);
        let pack = |micro: Micro| match &w.data {
            Data::F32(v) => pack_b(v, n, k, k, 1, micro.nr()),
            Data::BF16(v) => pack_b(v, n, k, k, 1, micro.nr()),
            _ => Vec::new(),
        };
        let out = run_gemm(jit, opts, OP, (base, false), dza, &pack, None)?;
        Ok(vec![out.tensor(vec![s, k])])
    })())
}

/// `linear_dw(dz[S,N], x[S,K]) -> dzᵀ · x` (`[N,K]`, f32).
pub fn linear_dw(
    jit: &Jit,
    opts: &JitOptions,
    c: &Checked<'_>,
    out_types: &[TensorType],
) -> Option<KResult<Vec<Tensor>>> {
    const OP: &str = "linear_dw";
    let [dz, x] = c.inputs() else { return None };
    // A = dzᵀ read in place: element (n, s) at dz[s·N + n].
    let (a, _) = (operand(dz)?, operand(x)?);
    let out_elt = elt_of(out_types.first()?.dtype)?;
    // The instance verified dz[S,N], x[S,K].
    let (&[s, n], &[_, k]) = (c.in_shape(0), c.in_shape(1)) else {
        return None;
    };
    Some((|| {
        let base = GemmSpec::new(n, k, s, xa_elt(a), out_elt).a_strides(1, n);
        // The reduction over samples runs in chunks of DW_CHUNK samples (the B
        // panel of a chunk stays in L1), partial products summed in chunk order.
        let chunks = if out_elt == Elt::F32 {
            s.div_ceil(DW_CHUNK).max(1)
        } else {
            1
        };
        let step = s.div_ceil(chunks).max(1);
        let mut total: Option<Vec<f32>> = None;
        let mut single: Option<Out> = None;
        for c0 in (0..s.max(1)).step_by(step) {
            let len = step.min(s - c0.min(s));
            let a_c = match a {
                Operand::F32(v) => Operand::F32(&v[(c0 * n).min(v.len())..]),
                Operand::BF16(v) => Operand::BF16(&v[(c0 * n).min(v.len())..]),
            };
            let pack = |micro: Micro| match &x.data {
                Data::F32(v) => pack_b(&v[(c0 * k).min(v.len())..], len, k, k, 1, micro.nr()),
                Data::BF16(v) => pack_b(&v[(c0 * k).min(v.len())..], len, k, k, 1, micro.nr()),
                _ => Vec::new(),
            };
            let spec = (GemmSpec { k: len, ..base }, false);
            let part = run_gemm(jit, opts, OP, spec, a_c, &pack, None)?;
            match (chunks, part, total.as_mut()) {
                (1, p, _) => single = Some(p),
                (_, Out::F32(p), None) => total = Some(p),
                (_, Out::F32(p), Some(t)) => t
                    .par_chunks_mut(1 << 14)
                    .zip(p.par_chunks(1 << 14))
                    .for_each(|(t, p)| t.iter_mut().zip(p).for_each(|(t, &p)| *t += p)),
                (_, Out::BF16(_), _) => {
                    return Err(shape_err(OP, "internal: chunked wgrad must be f32".into()));
                }
            }
        }
        let out = match (single, total) {
            (Some(o), _) => o,
            (None, Some(t)) => Out::F32(t),
            (None, None) => Out::zeros(out_elt, n * k),
        };
        Ok(vec![out.tensor(vec![n, k])])
    })())
}
