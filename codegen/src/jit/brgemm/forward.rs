//! `brgemm`: the blocked layer's forward pass (see the parent module's table).

use super::{
    Epilogue, RowsA, Written, jit_err, pack_w_blocks, row_block, rows_a, run_row_chunks, tail,
    with_kernel,
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
/// blocks); `B` is the weight block `wb[nb]`, read in place when `bn` is whole
/// tiles (bf16 weights only by a micro-kernel that widens them as it loads,
/// with an f32 `A`) or packed once per call, as the race finds faster
/// (`JitOptions::pack_b`).
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
    // The weight block `[K][bn]` read in place (f32, or bf16 widened as the
    // micro-kernel loads it) where the kernel can, else packed per call.
    let w_op = match &w.data {
        Data::F32(v) => Some(Operand::F32(v.as_slice())),
        Data::BF16(v) => Some(Operand::BF16(v.as_slice())),
        _ => None,
    };
    // The GEMM stops before the zero tail of the last block (`live_k`);
    // the blocks keep their `Kb·bk` strides.
    let k = live_k(xa, w, (nb, kb, s, bk, bn));
    let base = GemmSpec {
        b: match w_op {
            Some(Operand::F32(_)) => BLayout::InPlace { ldb: bn },
            Some(Operand::BF16(_)) => BLayout::InPlaceBf16 { ldb: bn },
            None => BLayout::Packed,
        },
        ..GemmSpec::new(s, bn, k, xa.elt(), c)
            .with_bias(act == Act::Relu)
            .blocked_a(bk)
    };
    let mut result = None;
    let bf16_w = matches!(w.data, Data::BF16(_));
    with_kernel(jit, opts, OP, (base, true, bf16_w), &mut |kern| {
        let sp = *kern.spec();
        let nr = sp.micro.nr();
        let packed;
        let (bp, pbias, blk_b, blk_bias) = match (sp.packed_b(), w_op) {
            (false, Some(v)) => (v, Cow::Borrowed(&bias[..]), kp * bn, bn),
            _ => {
                let panels = bn.div_ceil(nr);
                let mut pb = vec![0.0f32; nb * panels * nr];
                for (q, dst) in pb.chunks_mut(panels * nr).enumerate() {
                    dst[..bn].copy_from_slice(&bias[q * bn..(q + 1) * bn]);
                }
                packed = pack_w_blocks(w, (nb, kp), &sp);
                let v = Operand::F32(&packed[..]);
                (v, Cow::Owned(pb), sp.packed_b_len(), panels * nr)
            }
        };
        let fresh = Fresh::new(c, nb * s * bn);
        let mr = sp.micro.mr();
        let b_of = |q: usize| {
            (
                tail(bp, q * blk_b),
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
            let in_place = |_, r0| tail(xa, r0 * bk);
            let a = rows_a(xa, &sp, s * bk, &in_place);
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

/// Steps of the zero tail [`live_k`] rounds to (whole k-loop unrolls).
const LIVE_K_STEP: usize = 8;

/// The reduction length of `brgemm` without the zero tail of its last
/// block: `Kb·bk` less the trailing steps whose weight row is zero in every
/// N block and whose `x` column is zero (either sign) in every row, rounded
/// up to a multiple of [`LIVE_K_STEP`] within the block. That tail is the
/// padding the blocked layouts carry (a layer input of 367 columns in
/// blocks of 64, dlrm-kaggle's top MLP: 17 of 384 steps, 4.4% of the
/// layer's multiply-adds; that layer of a `--bench` inference step 2.61-2.83
/// to 2.55-2.62 ms, 5 interleaved pairs, Intel Xeon model 207, 2 threads);
/// its products are zeros (no infinity or NaN
/// among the factors), so leaving them out changes no sum but the sign of
/// an exact zero. The weights are checked first (`Nb·bn` values a step), `x`
/// only where they end in zeros (one cache line a row).
fn live_k(
    x: Operand<'_>,
    w: &Tensor,
    (nb, kb, s, bk, bn): (usize, usize, usize, usize, usize),
) -> usize {
    let kp = kb * bk;
    if kb == 0 || bk == 0 {
        return kp;
    }
    let last = (kb - 1) * bk;
    let zero_w = |i: usize| match &w.data {
        Data::F32(v) => v.get(i).is_some_and(|x| x.to_bits() << 1 == 0),
        Data::BF16(v) => v.get(i).is_some_and(|x| x.to_bits() << 1 == 0),
        _ => false,
    };
    // The first step of the weights' zero tail in the last block.
    let row_zero =
        |c: usize| (0..nb).all(|q| (0..bn).all(|j| zero_w((q * kp + last + c) * bn + j)));
    let mut live = bk;
    while live > 0 && row_zero(live - 1) {
        live -= 1;
    }
    if live == bk {
        return kp;
    }
    // Then `x`'s: each column's bits (sign dropped) OR-ed over the last
    // block's rows, from that column on.
    let from = (kb - 1) * s * bk;
    let acc = match x {
        Operand::F32(v) => tail_bits(v, (from, s, bk, live), |x| x.to_bits() << 1),
        Operand::BF16(v) => tail_bits(v, (from, s, bk, live), |x| u32::from(x.to_bits() << 1)),
    };
    let Some(acc) = acc else { return kp };
    let x_live = live + acc.iter().rposition(|&a| a != 0).map_or(0, |c| c + 1);
    if x_live == bk {
        return kp;
    }
    last + x_live
        .div_ceil(LIVE_K_STEP)
        .saturating_mul(LIVE_K_STEP)
        .min(bk)
}

/// Per column `live..bk` of the rows `[s][bk]` at `from` in `v`, the OR of
/// `bits` of its elements (`None` if `v` is too short).
fn tail_bits<T: Copy>(
    v: &[T],
    (from, s, bk, live): (usize, usize, usize, usize),
    bits: impl Fn(T) -> u32,
) -> Option<Vec<u32>> {
    let rows = v.get(from..from.checked_add(s.checked_mul(bk)?)?)?;
    let mut acc = vec![0u32; bk.saturating_sub(live)];
    for row in rows.chunks_exact(bk) {
        for (a, &x) in acc.iter_mut().zip(&row[live.min(bk)..]) {
            *a |= bits(x);
        }
    }
    Some(acc)
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

#[cfg(test)]
mod tests {
    use super::live_k;
    use crate::jit::gemm::Operand;
    use dlrm_ir::Tensor;
    use half::bf16;

    /// `live_k` drops the last block's steps whose weight rows and `x`
    /// columns are zero (rounded up to 8 steps), and only those: a nonzero
    /// or NaN `x` value, or a nonzero weight, in the tail keeps its steps.
    #[test]
    fn live_k_drops_only_a_tail_zero_in_both_operands() {
        let (nb, kb, s, bk, bn) = (2, 2, 5, 32, 4);
        let kp = kb * bk;
        // Live: the first 13 steps of the last block in both operands.
        let mut w = vec![0.0f32; nb * kp * bn];
        let mut x = vec![0.0f32; kb * s * bk];
        for q in 0..nb {
            for r in 0..bk + 13 {
                for j in 0..bn {
                    w[(q * kp + r) * bn + j] = 1.0 + (r + j) as f32;
                }
            }
        }
        for b in 0..kb {
            for r in 0..s {
                for c in 0..if b + 1 == kb { 13 } else { bk } {
                    x[(b * s + r) * bk + c] = -0.5 - c as f32;
                }
            }
        }
        let dims = (nb, kb, s, bk, bn);
        let k = |x: &[f32], w: &[f32]| {
            let wt = Tensor::f32(vec![nb, kb, bk, bn], w.to_vec());
            let x16: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
            let w16 = Tensor::bf16(
                vec![nb, kb, bk, bn],
                w.iter().map(|&v| bf16::from_f32(v)).collect(),
            );
            let (a, b) = (
                live_k(Operand::F32(x), &wt, dims),
                live_k(Operand::BF16(&x16), &w16, dims),
            );
            assert_eq!(a, b, "f32 and bf16 operands agree");
            a
        };
        assert_eq!(k(&x, &w), bk + 16);
        // -0 is zero.
        let mut xn = x.clone();
        xn[((kb - 1) * s + 2) * bk + 30] = -0.0;
        assert_eq!(k(&xn, &w), bk + 16);
        // A nonzero x at column 20 of one row keeps 21 steps (24 rounded).
        xn[((kb - 1) * s + 3) * bk + 20] = 0.25;
        assert_eq!(k(&xn, &w), bk + 24);
        // A NaN in the last column keeps every step (its products are NaN).
        xn[((kb - 1) * s + 4) * bk + bk - 1] = f32::NAN;
        assert_eq!(k(&xn, &w), kp);
        // A nonzero weight in the last row of one N block does too.
        let mut wn = w.clone();
        wn[(kp - 1) * bn + kp * bn + 3] = 1e-30;
        assert_eq!(k(&x, &wn), kp);
        // No padding: the whole reduction.
        let full: Vec<f32> = (0..nb * kp * bn).map(|i| i as f32 + 1.0).collect();
        assert_eq!(k(&x, &full), kp);
    }
}
