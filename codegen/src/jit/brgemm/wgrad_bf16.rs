//! `brgemm_wgrad` on a bf16 dot-product kernel (AMX-BF16 or AVX-512 BF16, as
//! `auto` or the forced `--kernels` picks them): `x` and `dy` both bf16 (a bf16
//! plan's gradients between bf16 layers) and an activation whose derivative
//! keeps bf16 values exact (`none`; `relu`: `dz` is `dy` or 0).
//!
//! The reduction runs over the samples, so the k pairs the kernel reads are
//! pairs of samples: `A = xᵀ` is copied once per call into `[Kb·bk][S]` bf16
//! rows (consecutive samples adjacent, one batch-reduce block), and `B =
//! dz[nb]` (`S × bn`) is packed in sample pairs
//! ([`pack_b_pairs_into`]). One GEMM per N block over all `Kb·bk` rows gives
//! `dw[nb]` in its blocked layout. `db` is summed from the bf16 `dz` in f32,
//! sample order (as the interpreter). Taken only where `auto` (or the forced
//! `avx512bf16` / `amxbf16`) runs such a kernel; elsewhere the general path runs.

use super::{row_block, run_blocks, with_kernel};
use crate::jit::buffers::{Fresh, Scratch};
use crate::jit::gemm::{Elt, GemmSpec, Micro, Operand, pack_b_into};
use crate::jit::micro::BPacking;
use crate::jit::micro::avx512bf16::pack_b_pairs_into;
use crate::jit::{Jit, JitOptions, KernelChoice};
use crate::kernels::KResult;
use crate::kernels::brgemm::floats;
use dlrm_ir::{Act, Data, Tensor};
use half::bf16;
use rayon::prelude::*;
use std::borrow::Cow;

/// The bf16 operands of the path: `dz` (`[Nb][S][bn]`) and `x` (`[Kb][S][bk]`),
/// or `None` when it does not apply (module docs).
pub(super) fn operands<'t>(
    opts: &JitOptions,
    act: Act,
    (dy, y, x): (&'t Tensor, &Tensor, &'t Tensor),
) -> Option<(Cow<'t, [bf16]>, &'t [bf16])> {
    let (Data::BF16(d), Data::BF16(xv)) = (&dy.data, &x.data) else {
        return None;
    };
    let dot = match opts.kernels {
        KernelChoice::Auto => Micro::Bf16Dot.available() || Micro::Amx.available(),
        KernelChoice::Avx512Bf16 => Micro::Bf16Dot.available(),
        KernelChoice::AmxBf16 => Micro::Amx.available(),
        _ => false,
    };
    if !dot {
        return None;
    }
    let dz = match act {
        Act::None => Cow::Borrowed(d.as_slice()),
        Act::Relu => {
            let yv = floats(y);
            Cow::Owned(
                d.par_iter()
                    .zip(yv.par_iter())
                    .map(|(&d, &y)| if y > 0.0 { d } else { bf16::ZERO })
                    .collect(),
            )
        }
        Act::Sigmoid => return None,
    };
    Some((dz, xv.as_slice()))
}

/// `dw` (`[Nb][Kb·bk][bn]`, elements `dw_elt`) and `db` sums (`[Nb][bn]`) from
/// the bf16 `dz` and `x` ([`operands`]).
pub(super) fn wgrad_gemm(
    jit: &Jit,
    opts: &JitOptions,
    (dz, x): (&[bf16], &[bf16]),
    (nb, kb, s, bk, bn): (usize, usize, usize, usize, usize),
    dw_elt: Elt,
) -> KResult<(crate::jit::buffers::Floats, Vec<f32>)> {
    const OP: &str = "brgemm_wgrad";
    let kp = kb * bk;
    let mut dbp = vec![0.0f32; nb * bn];
    dbp.par_chunks_mut(bn).enumerate().for_each(|(nbi, acc)| {
        for row in dz[nbi * s * bn..(nbi + 1) * s * bn].chunks_exact(bn) {
            for (a, &z) in acc.iter_mut().zip(row) {
                *a += z.to_f32();
            }
        }
    });
    let (xt, ld) = transpose_x(x, (kb, s, bk));
    let base = GemmSpec::new(kp, bn, s, Elt::BF16, dw_elt).a_strides(ld, 1);
    let mut result = None;
    with_kernel(jit, opts, OP, (base, false, true), &mut |kern| {
        let sp = *kern.spec();
        let (mr, nr) = (sp.micro.mr(), sp.micro.nr());
        let blk_b = sp.packed_b_len();
        let mut bp = Scratch::new(nb * blk_b);
        bp.chunks_mut(blk_b).enumerate().for_each(|(nbi, dst)| {
            let src = &dz[nbi * s * bn..(nbi + 1) * s * bn];
            match sp.micro.b_packing() {
                BPacking::KPairs => pack_b_pairs_into(dst, src, (s, bn, bn, 1), nr),
                BPacking::F32 => pack_b_into(dst, src, (s, bn, bn, 1), nr),
            }
        });
        let b_of = |nbi: usize| (&bp[nbi * blk_b..(nbi + 1) * blk_b], None);
        let dw = run_blocks(
            kern,
            Fresh::new(dw_elt, nb * kp * bn),
            (nb, kp, bn, row_block(kp, mr, nb)),
            &|_, r0| Operand::BF16(&xt[(r0 * ld).min(xt.len())..]),
            &b_of,
            None,
        )?;
        result = Some(dw);
        Ok(())
    })?;
    let dw = result.ok_or_else(|| crate::kernels::shape_err(OP, "internal: no result".into()))?;
    Ok((dw, dbp))
}

/// Rows of `xᵀ` each task of [`transpose_x`] writes.
const ROWS: usize = 16;

/// `xᵀ` of a blocked activation `xb[Kb][S][bk]`: `Kb·bk` rows of `S` bf16,
/// row `r` being column `r % bk` of block `r / bk`, rows `ld` elements apart
/// (returned: `S` rounded up to whole cache lines, plus one line, so that the
/// kernel's 12 rows per tile do not fall in one cache set when a row is a
/// power of two bytes), [`ROWS`] rows per task.
fn transpose_x(x: &[bf16], (kb, s, bk): (usize, usize, usize)) -> (Vec<bf16>, usize) {
    let kp = kb * bk;
    let ld = s.next_multiple_of(32) + 32;
    let mut xt = vec![bf16::ZERO; kp * ld];
    xt.par_chunks_mut(ROWS * ld)
        .enumerate()
        .for_each(|(t, dst)| {
            let r0 = t * ROWS;
            let rows = dst.len() / ld;
            // Where each row's sample 0 is in `x`; sample `si` is `si·bk` further.
            let mut base = [0usize; ROWS];
            for (rr, b) in base.iter_mut().enumerate().take(rows) {
                let r = r0 + rr;
                *b = (r / bk) * s * bk + r % bk;
            }
            for si in 0..s {
                for (rr, &b) in base.iter().enumerate().take(rows) {
                    dst[rr * ld + si] = x[b + si * bk];
                }
            }
        });
    (xt, ld)
}
