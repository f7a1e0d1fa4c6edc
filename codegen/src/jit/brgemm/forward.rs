//! `brgemm`: the blocked layer's forward pass (see the parent module's table).

use super::{
    Epilogue, RowsA, Written, jit_err, pack_w_blocks, row_block, run_row_chunks, tail, with_kernel,
};
use crate::jit::buffers::{Floats, Fresh};
use crate::jit::gemm::{BLayout, Elt, GemmSpec, Operand};
use crate::jit::linear::operand;
use crate::jit::pack::{Src, pack_blocked};
use crate::jit::{Jit, JitError, JitOptions};
use crate::reference::brgemm::floats;
use crate::reference::{KResult, dims_of, shape_err};
use dlrm_ir::{Act, Checked, Data, Tensor};
use half::bf16;
use rayon::prelude::*;
use std::borrow::Cow;

/// `brgemm(xb[Kb,S,bk], wb[Nb,Kb,bk,bn][, b[N]]) -> act(x·wᵀ + b)` as `[Nb,S,bn]`.
///
/// `A` is the blocked activation read in place (the batch-reduce over its `Kb`
/// blocks); `B` is the f32 weight block `wb[nb]` read in place when `bn` is whole
/// tiles (packed otherwise, and for bf16 weights).
///
/// `epi` (if any) runs on each chunk of the product as it is written (in
/// `out`'s dtype), before `finish_forward` (the padding columns are not yet
/// zero there); `act` must not be sigmoid.
pub fn brgemm(
    jit: &Jit,
    opts: &JitOptions,
    act: Act,
    c: &Checked<'_>,
    out: Elt,
    epi: Option<Epilogue<'_>>,
) -> KResult<Tensor> {
    const OP: &str = "brgemm";
    // The instance verified x's blocks against the weight's and the bias
    // against its `Nb` blocks of `bn`; the buffers hold their shapes' elements.
    let ins = c.inputs();
    let [_, s, _] = dims_of::<3>(c, 0)?;
    let [nb, kb, bk, bn] = dims_of::<4>(c, 1)?;
    // Without a bias (a cross layer's first product) it is 0 and every column
    // is live (the weight's padding rows are zero).
    let n = match ins.get(2) {
        Some(b) => b.shape[0],
        None => nb * bn,
    };
    let kp = kb * bk;
    let sigmoid = act == Act::Sigmoid;
    if sigmoid && epi.is_some() {
        return Err(shape_err(OP, "internal: an epilogue after sigmoid".into()));
    }
    let c = if sigmoid { Elt::F32 } else { out };
    let (x, w) = (ins[0], ins[1]);
    let xa = operand(x).ok_or_else(|| shape_err(OP, "x must be a float tensor".into()))?;
    let mut bias = ins.get(2).map_or_else(Vec::new, |b| floats(b).into_owned());
    bias.resize(nb * bn, 0.0);
    if s == 0 || nb == 0 || bn == 0 {
        return Ok(Floats::zeros(out, nb * s * bn).tensor(vec![nb, s, bn]));
    }
    let live_last = n - (nb - 1) * bn;
    if bn == 1 {
        let mut y = forward_columns(jit, act, xa, w, &bias, (nb, kb, s, bk), c)
            .map_err(|e| jit_err(OP, e))?;
        if let Some(epi) = epi {
            match &mut y {
                Floats::F32(v) => v
                    .chunks_mut(s)
                    .enumerate()
                    .for_each(|(q, col)| epi(q, 0, Written::F32(col))),
                Floats::BF16(v) => v
                    .chunks_mut(s)
                    .enumerate()
                    .for_each(|(q, col)| epi(q, 0, Written::BF16(col))),
            }
        }
        let y = finish_forward(y, sigmoid, out, nb, s, bn, live_last);
        return Ok(y.tensor(vec![nb, s, bn]));
    }
    let w_f32 = match &w.data {
        Data::F32(v) => Some(v.as_slice()),
        _ => None,
    };
    let base = GemmSpec {
        b: match w_f32 {
            Some(_) => BLayout::InPlace { ldb: bn },
            None => BLayout::Packed,
        },
        ..GemmSpec::new(s, bn, kp, xa.elt(), c)
            .with_bias(act == Act::Relu)
            .blocked_a(bk)
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
            run_row_chunks(kern, fresh, shape, RowsA::Packed(&pack), &b_of, (epi, None))?
        } else {
            let a = match (xa, sp.a) {
                (Operand::BF16(v), Elt::F32) => RowsA::Widened {
                    a: v,
                    src_blk: s * bk,
                },
                _ => RowsA::InPlace(&|_, r0| tail(xa, r0 * bk)),
            };
            let shape = (nb, s, bn, row_block(s, mr, nb));
            run_row_chunks(kern, fresh, shape, a, &b_of, (epi, None))?
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
/// ([`crate::jit::reduce::row_dots`]) instead of GEMM tiles that would use one of
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
    let spec = crate::jit::reduce::RowDotSpec {
        kb,
        bk,
        x: xa.elt(),
        out: c,
        relu: act == Act::Relu,
    };
    let mut y = Fresh::new(c, nb * s);
    for (q, col) in y.buf().chunks(s).into_iter().enumerate() {
        let wq = wv.get(q * kb * bk..(q + 1) * kb * bk).unwrap_or(&[]);
        crate::jit::reduce::row_dots(jit, spec, xa, s, (wq, bias[q]), col)?;
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
