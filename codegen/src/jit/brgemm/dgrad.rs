//! `brgemm_dgrad`: the input gradient of a blocked layer (see the parent module's table).
//!
//! With `dy` and the weights both bf16 and an activation whose derivative keeps
//! bf16 values exact (`none`, `relu`: `dz` is `dy` or 0), `A` is `dz` in bf16
//! and `B` (`wᵀ`) is packed from the bf16 weights: the GEMM is all-bf16, so
//! `auto` runs it on a k-pair kernel where the CPU has one (AMX-BF16, else
//! AVX-512 BF16; `B` packed in k pairs); the FMA kernels read the same bf16 `A` widened, and `B` packed
//! as f32. A bf16 result with a mask is computed in f32, masked, then rounded
//! once (the interpreter's order).

use super::{Epilogue, RowsA, Written, row_block, rows_a, run_row_chunks, tail, with_kernel};
use super::{PooledBf16, mask_into_self, masked, positive};
use crate::jit::buffers::{Floats, Fresh, Scratch};
use crate::jit::gemm::{Elt, GemmSpec, Operand};
use crate::jit::linear::operand;
use crate::jit::micro::BPacking;
use crate::jit::pack::{Src, pack_blocked, pack_wt};
use crate::jit::{Jit, JitOptions};
use crate::reference::brgemm::{DgradArgs, act_grads, dgrad_args, floats, mask_in_place};
use crate::reference::{KResult, shape_err};
use dlrm_ir::{Act, Checked, Data, Tensor};
use half::bf16;
use rayon::prelude::*;
use std::borrow::Cow;
use std::cell::OnceCell;

/// `brgemm_dgrad(dyb[Nb,S,bn], (yb,) wb[Nb,Kb,bk,bn]) -> dx[Kb,S,bk]`.
///
/// `then` (if any) runs on each chunk of the f32 result as it is written, after
/// the mask; the result is then f32 whatever `out` says.
pub fn brgemm_dgrad(
    jit: &Jit,
    opts: &JitOptions,
    (act, mask): (Act, Act),
    c: &Checked<'_>,
    out: Elt,
    then: Option<Epilogue<'_>>,
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
    // The mask (the previous layer's act') on each chunk of dx while it is in
    // cache: the result is that layer's dz ([`MaskEpilogue`]).
    let me = MaskEpilogue::new(mask, (s, bk), xb, out, then);
    let masking = |q: usize, r0: usize, chunk: Written<'_>| me.run(q, r0, chunk);
    let epi: Option<Epilogue<'_>> = me.runs().then_some(&masking as Epilogue<'_>);
    let gemm_out = me.gemm_out(out);
    // relu's mask in the micro-kernel's epilogue instead, where it can
    // ([`GemmSpec::mask`]: the AVX-512 kernels), when the layer input has the
    // GEMM result's element type (read at the result's offsets): its lines
    // prefetched as each tile starts, it costs no pass of its own over `dx`
    // and the input (that pass, waiting on the input, was 1.2% of a
    // dlrm-mlperf training step). `then` still runs after.
    let kernel_mask = xb
        .and_then(operand)
        .filter(|x| mask == Act::Relu && x.elt() == gemm_out);
    let me_then = MaskEpilogue::new(Act::None, (s, bk), None, out, then);
    let then_only = |q: usize, r0: usize, chunk: Written<'_>| me_then.run(q, r0, chunk);
    let epi_then: Option<Epilogue<'_>> = me_then.runs().then_some(&then_only as Epilogue<'_>);
    // A = dz = act'(dy, y) in dy's blocked layout `[Nb][S][bn]`: read in place
    // as the batch-reduce over its Nb blocks (computed once, on first use: bf16
    // when `dz16` is), or computed into each row chunk's packed tiles.
    let dz16 = bf16_dz(act, dy, y, w);
    let (dv, yv) = (OnceCell::new(), OnceCell::new());
    let dv = || dv.get_or_init(|| floats(dy));
    let yv = || yv.get_or_init(|| floats(y));
    let dz = OnceCell::new();
    // f32 weights as they are (bf16 ones are widened while packed).
    let w32 = match &w.data {
        Data::BF16(_) => Cow::Borrowed(&[][..]),
        _ => floats(w),
    };
    let a = if dz16.is_some() { Elt::BF16 } else { Elt::F32 };
    let base = GemmSpec {
        mask: kernel_mask.is_some(),
        ..GemmSpec::new(s, bk, np, a, gemm_out).blocked_a(bn)
    };
    let mut result = None;
    let bf16_b = dz16.is_some();
    with_kernel(jit, opts, OP, (base, true, bf16_b), &mut |kern| {
        let sp = *kern.spec();
        // The kernel masks (`sp.mask`), or the epilogue does.
        let (epi, mk) = match sp.mask {
            true => (epi_then, kernel_mask),
            false => (epi, None),
        };
        let (bp, blk_b) = pack_wt_blocks(&sp, (w, &w32), (nb, kb, bk, bn));
        let fresh = Fresh::new(gemm_out, kb * s * bk);
        let mr = sp.micro.mr();
        let b_of = |q: usize| (Operand::F32(&bp[q * blk_b..(q + 1) * blk_b]), None);
        let dx = if sp.pack_a {
            // A bf16 dz is packed (widened) straight from its bf16 values:
            // widening dy and y to f32 first was two conversions of the whole
            // operand per call.
            let src = match &dz16 {
                Some(z) => Src::BF16(z.values()),
                None => Src::Dz(act, dv(), yv()),
            };
            let pack = |r0, rows, dst: &mut [f32]| pack_blocked(dst, (s, bn, mr), (r0, rows), src);
            run_row_chunks(
                kern,
                fresh,
                (kb, s, bk, row_block(s, mr, 1)),
                RowsA::Packed(&pack),
                &b_of,
                (epi, mk),
            )?
        } else {
            let a = match &dz16 {
                Some(z) => Operand::BF16(z.values()),
                None => Operand::F32(dz.get_or_init(|| match act {
                    Act::None => Cow::Borrowed(&dv()[..]),
                    _ => Cow::Owned(act_grads(act, dv(), yv())),
                })),
            };
            let in_place = |_, r0| tail(a, r0 * bn);
            let a = rows_a(a, &sp, s * bn, &in_place);
            let shape = (kb, s, bk, row_block(s, mr, kb));
            run_row_chunks(kern, fresh, shape, a, &b_of, (epi, mk))?
        };
        result = Some(dx);
        Ok(())
    })?;
    let dx = result.ok_or_else(|| shape_err(OP, "internal: no result".into()))?;
    let dx = match (dx, out) {
        (Floats::F32(v), Elt::BF16) if then.is_none() => {
            Floats::BF16(v.par_iter().map(|&x| bf16::from_f32(x)).collect())
        }
        (dx, _) => dx,
    };
    Ok(dx.tensor(vec![kb, s, bk]))
}

/// `B` of every dx block for the kernel of spec `sp`: `wᵀ` (`Nb·bn × bk`
/// for block kb: `B(n', i) = wb[n'/bn][kb][i][n'%bn]`) in `⌈bk/nr⌉` panels
/// (in k pairs for the k-pair kernels); `w32` is the f32 weights unless `w`
/// holds bf16, which are widened as each panel is packed (no f32 copy of the
/// whole weight first). Returns the panels and the floats of one block's.
fn pack_wt_blocks(
    sp: &GemmSpec,
    (w, w32): (&Tensor, &[f32]),
    geom: (usize, usize, usize, usize),
) -> (Scratch, usize) {
    let (_, kb, bk, _) = geom;
    let nr = sp.micro.nr();
    let panels = bk.div_ceil(nr);
    let pan_len = sp.b_rows() * nr;
    let mut bp = Scratch::new(kb * panels * pan_len);
    let pairs = sp.micro.b_packing() == BPacking::KPairs;
    bp.par_chunks_mut(pan_len).enumerate().for_each(|(q, pan)| {
        let (kbi, i0) = (q / panels, (q % panels) * nr);
        match &w.data {
            Data::BF16(w16) if pairs => pack_wt_pairs(pan, w16, geom, (kbi, i0, nr)),
            Data::BF16(w16) => pack_wt(pan, Src::BF16(w16), geom, (kbi, i0, nr)),
            _ => pack_wt(pan, Src::F32(w32), geom, (kbi, i0, nr)),
        }
    });
    (bp, panels * pan_len)
}

/// The epilogue of a masked `brgemm_dgrad` (and of one with a `then`): the
/// mask on each chunk of `dx` as it is written. relu's keeps an element or
/// zeroes it, so it commutes with rounding: a bf16 result is rounded by the
/// kernel and masked in bf16 (no f32 result, no rounding pass, the layer input
/// `keep` read as it is stored). Other masks (sigmoid's) work on f32 rows
/// (`xv`), from which a bf16 result is then rounded.
struct MaskEpilogue<'a, 'e> {
    mask: Act,
    s: usize,
    bk: usize,
    keep: Option<&'a Tensor>,
    xv: Option<Cow<'a, [f32]>>,
    then: Option<Epilogue<'e>>,
}

impl<'a, 'e> MaskEpilogue<'a, 'e> {
    fn new(
        mask: Act,
        (s, bk): (usize, usize),
        xb: Option<&'a Tensor>,
        out: Elt,
        then: Option<Epilogue<'e>>,
    ) -> Self {
        let direct = out == Elt::BF16 && mask == Act::Relu && then.is_none();
        MaskEpilogue {
            mask,
            s,
            bk,
            keep: xb.filter(|_| direct),
            xv: xb.filter(|_| !direct).map(floats),
            then,
        }
    }

    /// Whether there is anything to run.
    fn runs(&self) -> bool {
        self.keep.is_some() || self.xv.is_some() || self.then.is_some()
    }

    /// The GEMM's result type: f32 for an f32 epilogue, else `out`.
    fn gemm_out(&self, out: Elt) -> Elt {
        if self.xv.is_some() || self.then.is_some() {
            Elt::F32
        } else {
            out
        }
    }

    fn run(&self, q: usize, r0: usize, chunk: Written<'_>) {
        let from = (q * self.s + r0) * self.bk;
        let rows = match (chunk, self.keep) {
            (Written::BF16(rows), Some(xb)) => {
                let to = from + rows.len();
                match &xb.data {
                    Data::BF16(x) => mask_into_self(rows, &x[from..to], positive),
                    Data::F32(x) => mask_into_self(rows, &x[from..to], |y: f32| y > 0.0),
                    _ => {}
                }
                return;
            }
            (Written::F32(rows), _) => rows,
            (Written::BF16(_), None) => {
                unreachable!("the GEMM writes f32 when an f32 epilogue runs")
            }
        };
        if let Some(xv) = &self.xv {
            mask_in_place(self.mask, rows, &xv[from..from + rows.len()]);
        }
        if let Some(then) = self.then {
            then(q, r0, Written::F32(rows));
        }
    }
}

/// A bf16 `dz`: `dy` itself, or computed into a pooled buffer.
enum Dz16<'t> {
    Dy(&'t [bf16]),
    Pooled(PooledBf16),
}

impl Dz16<'_> {
    fn values(&self) -> &[bf16] {
        match self {
            Dz16::Dy(d) => d,
            Dz16::Pooled(z) => z.values(),
        }
    }
}

/// `dz = act'(dy, y)` as bf16 when it is exact there and the GEMM can be all
/// bf16: `dy` and the weights bf16, `act` none (dz is dy) or relu (dy or 0:
/// exactly the f32 definition's, `y > 0`, read from a bf16 `y` as bits).
fn bf16_dz<'t>(act: Act, dy: &'t Tensor, y: &Tensor, w: &Tensor) -> Option<Dz16<'t>> {
    let (Data::BF16(d), Data::BF16(_)) = (&dy.data, &w.data) else {
        return None;
    };
    match (act, &y.data) {
        (Act::None, _) => Some(Dz16::Dy(d)),
        (Act::Relu, Data::BF16(yv)) => masked(d, yv, positive).map(Dz16::Pooled),
        (Act::Relu, _) => masked(d, &floats(y), |y: f32| y > 0.0).map(Dz16::Pooled),
        (Act::Sigmoid, _) => None,
    }
}

/// One panel of `wᵀ` for K block `kbi` in k pairs for the k-pair kernels
/// (`⌈Nb·bn/2⌉` rows of `nr` words, word `(q, j)` holding `B(2q, i0+j)` in its
/// low half and `B(2q+1, i0+j)` in its high half; zero past `Nb·bn` and `bk`),
/// as [`crate::jit::micro::avx512bf16::pack_b_pairs_into`] lays out a panel.
fn pack_wt_pairs(
    pan: &mut [f32],
    w: &[bf16],
    (nb, kb, bk, bn): (usize, usize, usize, usize),
    (kbi, i0, nr): (usize, usize, usize),
) {
    let np = nb * bn;
    let cols = nr.min(bk - i0);
    if cols < nr {
        pan.fill(0.0);
    }
    // Where `B(nn, i0)` is in `w` (`B(nn, i)` is `i - i0` rows of `bn` on).
    let start = |nn: usize| ((nn / bn) * kb + kbi) * bk * bn + i0 * bn + nn % bn;
    let col = |nn: usize| (nn < np).then(|| w[start(nn)..].iter().step_by(bn).take(cols));
    for (q, row) in pan.chunks_exact_mut(nr).enumerate() {
        let row = &mut row[..cols];
        match (col(2 * q), col(2 * q + 1)) {
            (Some(lo), Some(hi)) => {
                for ((d, l), h) in row.iter_mut().zip(lo).zip(hi) {
                    *d = f32::from_bits(u32::from(l.to_bits()) | u32::from(h.to_bits()) << 16);
                }
            }
            (Some(lo), None) => {
                for (d, l) in row.iter_mut().zip(lo) {
                    *d = f32::from_bits(u32::from(l.to_bits()));
                }
            }
            _ => row.fill(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pack_wt_pairs;
    use half::bf16;

    #[test]
    fn pack_wt_pairs_is_the_transposed_weights_in_k_pairs() {
        // Odd `Nb·bn` (a half-empty last pair), ragged last panels.
        for (nb, kb, bk, bn, nr) in [
            (1usize, 1usize, 1usize, 1usize, 32usize),
            (3, 2, 40, 5, 32),
            (2, 3, 64, 64, 32),
            (4, 1, 20, 7, 16),
        ] {
            let w: Vec<bf16> = (0..nb * kb * bk * bn)
                .map(|i| bf16::from_bits((i as u16).wrapping_mul(40503) & 0xBFFF))
                .collect();
            let np = nb * bn;
            for kbi in 0..kb {
                for i0 in (0..bk).step_by(nr) {
                    let mut got = vec![f32::NAN; np.div_ceil(2) * nr];
                    pack_wt_pairs(&mut got, &w, (nb, kb, bk, bn), (kbi, i0, nr));
                    for (q, row) in got.chunks_exact(nr).enumerate() {
                        for (jj, v) in row.iter().enumerate() {
                            // B(nn, i) = w[nn / bn][kbi][i][nn % bn], zero outside.
                            let b = |nn: usize| {
                                let i = i0 + jj;
                                if nn < np && i < bk {
                                    u32::from(
                                        w[((nn / bn) * kb + kbi) * bk * bn + i * bn + nn % bn]
                                            .to_bits(),
                                    )
                                } else {
                                    0
                                }
                            };
                            let want = b(2 * q) | b(2 * q + 1) << 16;
                            assert_eq!(
                                v.to_bits(),
                                want,
                                "nb {nb} bn {bn} bk {bk}: pair {q} column {jj}"
                            );
                        }
                    }
                }
            }
        }
    }
}
