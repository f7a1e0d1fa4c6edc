//! `brgemm_dgrad`: the input gradient of a blocked layer (see the parent module's table).

use super::{Epilogue, row_block, run_blocks, run_row_chunks, with_kernel};
use crate::jit::buffers::{Floats, Fresh, Scratch};
use crate::jit::gemm::{BLayout, Elt, GemmSpec, Micro, Operand};
use crate::jit::pack::{Src, pack_blocked};
use crate::jit::{Jit, JitOptions};
use crate::kernels::brgemm::{DgradArgs, act_grads, dgrad_args, floats, mask_in_place};
use crate::kernels::{KResult, shape_err};
use dlrm_ir::{Act, Checked, Tensor};
use rayon::prelude::*;
use std::borrow::Cow;

/// `brgemm_dgrad(dyb[Nb,S,bn], (yb,) wb[Nb,Kb,bk,bn]) -> dx[Kb,S,bk]`.
pub fn brgemm_dgrad(
    jit: &Jit,
    opts: &JitOptions,
    (act, mask): (Act, Act),
    c: &Checked<'_>,
    out: Elt,
) -> KResult<Tensor> {
    const OP: &str = "brgemm_dgrad";
    let DgradArgs {
        dy,
        y,
        w,
        mask: xb,
        dims: [nb, kb, s, bk, bn],
    } = dgrad_args(act, mask, c)?;
    let np = nb * bn;
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
