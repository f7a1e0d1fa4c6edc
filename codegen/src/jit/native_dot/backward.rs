//! The backward kernel ([`backward`]): per sample, each operand's gradient as
//! a sum over its partners, in register blocks of operands × columns.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::{AHEAD, Ahead, Dot, Elem, FAR, FAR_MIN_BYTES, MAX_F, mask};

/// Rows of a gradient block: the operands whose gradients one pass over the
/// partners computes together (each load of a partner's columns feeds `ROWS`
/// FMAs; `ROWS × 4` accumulators, 4 loaded vectors and a broadcast fit the 32
/// `zmm` registers).
const ROWS: usize = 6;

/// Backward rows `s0..s1`: `ops[i]` operand `i`, `dr` the result's gradient
/// (`[S][width]`), `grads[i]` operand `i`'s gradient (`[S][D]`); rows `s0..s1`
/// of each gradient are written (absolute rows).
///
/// Per sample, each 64-column chunk of the gradients is computed `ROWS`
/// operands at a time: a per-sample `[F × F] · [F × D]` product, register
/// blocked, each gradient entry summed over its partners in ascending order
/// with one FMA per term. The coefficients are read from the sample's `dr` row
/// where they lie (see [`Block::rows_cols`]): no per-sample matrix of them.
///
/// # Safety
/// Every `ops[i]` holds rows `0..s1` of `d` f32, `dr` rows `0..s1` of `width`
/// f32, every `grads[i]` rows `0..s1` of `d` f32 whose rows `s0..s1` no other
/// thread touches; `f <= MAX_F`; the CPU has AVX-512 F ([`available`](super::available)).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn backward<E: Elem>(
    dot: Dot,
    ops: &[*const E],
    dr: *const f32,
    grads: &[*mut f32],
    s0: usize,
    s1: usize,
) {
    let Dot { f, d, .. } = dot;
    let steps = d.div_ceil(64) * f.div_ceil(ROWS);
    // SAFETY: forwarded.
    unsafe {
        each_sample(dot, ops, (dr, grads), (s0, s1), steps, |blk, ahead| {
            for c0 in (0..d).step_by(64) {
                // Only the vectors with live columns (a 16-wide operand is one
                // `zmm`, not four).
                let n = d - c0;
                for i0 in (0..f).step_by(ROWS) {
                    ahead.step();
                    blk.run(i0, (f - i0).min(ROWS), n.div_ceil(16).min(4), c0, n);
                }
            }
        })
    }
}

/// The backward kernels' loop over samples `s0..s1`: each sample's [`Block`]
/// (its operand, gradient and `dr` rows), and the prefetch of the next
/// sample's spread over the `steps` calls of `ahead.step()` that `body` makes
/// while it computes the sample (and into L2 of the sample [`FAR`] on, where a
/// sample's f32 operand rows hold at least [`FAR_MIN_BYTES`]).
///
/// # Safety
/// [`backward`]'s contract for the operands, `dr` and gradients; `body`'s
/// kernels have their CPU features.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn each_sample<E: Elem>(
    dot: Dot,
    ops: &[*const E],
    (dr, grads): (*const f32, &[*mut f32]),
    (s0, s1): (usize, usize),
    steps: usize,
    mut body: impl FnMut(&Block<'_, E>, &mut Ahead<'_, E>),
) {
    let Dot { f, d, .. } = dot;
    let width = dot.width();
    let mut rows = [std::ptr::null::<E>(); MAX_F];
    let mut outs = [std::ptr::null_mut::<f32>(); MAX_F];
    // Column of operand `i`'s first pair in a `dr` row (its pairs with
    // partners `0..i`, and `i` itself with self-interaction, follow it).
    let mut first = [0usize; MAX_F];
    for (i, c) in first.iter_mut().enumerate().take(f) {
        *c = dot.col(i, 0);
    }
    // f32 operands only: with bf16 ones (dlrm-mlperf's at `--precision
    // bf16`, 6.75 KiB a sample) the backward measured 0.10-0.25 ms a step
    // slower in 3 pairs of steps, level in 4 more.
    let far = size_of::<E>() == 4 && f * d * 4 >= FAR_MIN_BYTES;
    for s in s0..s1 {
        // SAFETY: the caller's contract: row `s` of every operand, of `dr` and
        // of every gradient; a prefetch never faults.
        unsafe {
            for (r, &op) in rows.iter_mut().zip(ops) {
                *r = op.add(s * d);
            }
            for (o, &g) in outs.iter_mut().zip(grads) {
                *o = g.add(s * d);
            }
            let mut ahead = Ahead::new(ops, s + AHEAD, s1, d, steps).with_grads(grads);
            if far {
                ahead = ahead.with_far(s + FAR, s1);
            }
            if s + AHEAD < s1 {
                let next = dr.add((s + AHEAD) * width) as *const u8;
                crate::jit::prefetch::fetch_lines(next, 4 * width);
            }
            let blk = Block {
                f,
                self_interaction: dot.self_interaction,
                drow: dr.add(s * width),
                first: &first[..f],
                rows: &rows[..f],
                outs: &outs[..f],
            };
            body(&blk, &mut ahead);
        }
    }
}

/// The terms of gradients `i0..i0 + R` of one sample's [`Block`] `blk`, in
/// their order, into the accumulator rows `acc` (`[[V; NV]; R]`): per partner
/// `k` ascending, its columns loaded once (`x = load(k)`), then `fma(row, c,
/// &x)` for each row that has the pair, `c = c_ik` the `dr` entry of the pair
/// `(max, min)` (`2·dr` on the diagonal with self-interaction; `k == i`
/// skipped without it). A macro rather than a function taking closures: both
/// backward kernels expand it into their own loops, where the accumulators
/// stay in registers (through a closure call, the AVX2 kernel's spilled).
///
/// The partners come in three runs, each reading its coefficients where they
/// lie in the `dr` row: `k < i0` (below every row of the block: `c_ik` is
/// entry `k` of operand `i`'s pairs), the block's own `i0..i0 + R` (either
/// side, and the diagonal), and `k >= i0 + R` (above every row: the block's
/// `R` coefficients are entries `i0..i0 + R` of operand `k`'s pairs, side by
/// side).
///
/// Inside `unsafe`: the `dr` row holds the sample's `width` columns, `i0 + R
/// <= f`.
macro_rules! each_term {
    ($blk:expr, $acc:ident, $i0:expr, $r:expr, $load:ident, $fma:ident) => {{
        let (blk, i0) = (&$blk, $i0);
        // Below the block: row `i`'s pairs, entry `k`.
        let below: [*const f32; $r] = std::array::from_fn(|r| blk.drow.add(blk.first[i0 + r]));
        for k in 0..i0 {
            let x = $load(k);
            for (row, p) in $acc.iter_mut().zip(below) {
                $fma(row, *p.add(k), &x);
            }
        }
        // The block's own partners.
        for k in i0..i0 + $r {
            let x = $load(k);
            for (r, row) in $acc.iter_mut().enumerate() {
                let i = i0 + r;
                let c = match k.cmp(&i) {
                    std::cmp::Ordering::Less => *blk.drow.add(blk.first[i] + k),
                    std::cmp::Ordering::Greater => *blk.drow.add(blk.first[k] + i),
                    std::cmp::Ordering::Equal if blk.self_interaction => {
                        *blk.drow.add(blk.first[i] + i) * 2.0
                    }
                    std::cmp::Ordering::Equal => continue,
                };
                $fma(row, c, &x);
            }
        }
        // Above the block: operand `k`'s pairs, entries `i0..i0 + R`.
        for k in i0 + $r..blk.f {
            let x = $load(k);
            let p = blk.drow.add(blk.first[k] + i0);
            for (r, row) in $acc.iter_mut().enumerate() {
                $fma(row, *p.add(r), &x);
            }
        }
    }};
}
pub(super) use each_term;

/// One sample's operands for [`Block::run`].
#[cfg(target_arch = "x86_64")]
pub(super) struct Block<'a, E> {
    pub(super) f: usize,
    pub(super) self_interaction: bool,
    /// The sample's `dr` row.
    pub(super) drow: *const f32,
    /// [`backward`]'s first pair column of each operand.
    pub(super) first: &'a [usize],
    /// Its operands' rows.
    pub(super) rows: &'a [*const E],
    /// Its gradients' rows.
    pub(super) outs: &'a [*mut f32],
}

#[cfg(target_arch = "x86_64")]
impl<E: Elem> Block<'_, E> {
    /// Gradients `i0..i0 + r` (`r <= ROWS`), columns `c0..c0 + n` in `nv`
    /// vectors (`1..=4`, `n <= 16·nv`), through the block kernel specialised
    /// on `(r, nv)` and on whether the columns fill the vectors.
    ///
    /// # Safety
    /// [`backward`]'s contract for this sample; AVX-512 F.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn run(&self, i0: usize, r: usize, nv: usize, c0: usize, n: usize) {
        macro_rules! dispatch {
            ($whole:literal; $($r:literal),*) => {
                match (r, nv) {
                    $(
                        ($r, 1) => self.rows_cols::<$r, 1, $whole>(i0, c0, n),
                        ($r, 2) => self.rows_cols::<$r, 2, $whole>(i0, c0, n),
                        ($r, 3) => self.rows_cols::<$r, 3, $whole>(i0, c0, n),
                        ($r, _) => self.rows_cols::<$r, 4, $whole>(i0, c0, n),
                    )*
                    _ => unreachable!("a block has 1..=ROWS rows"),
                }
            };
        }
        // SAFETY: forwarded; `WHOLE` when the `n` columns fill the `nv`
        // vectors (plain loads, as the forward's: see `rows_cols`).
        unsafe {
            if n == 16 * nv {
                dispatch!(true; 1, 2, 3, 4, 5, 6)
            } else {
                dispatch!(false; 1, 2, 3, 4, 5, 6)
            }
        }
    }

    /// Columns `c0..c0 + n` (`NV` vectors) of gradients `i0..i0 + R`: operand
    /// 0's starts from `dr`'s first `D` columns, the others from zero; then
    /// per partner `k` ascending (skipping `k == i` without self-interaction),
    /// `acc_i += c_ik · T_k`, one FMA per term, with `c_ik` the `dr` entry of
    /// the pair `(max, min)` (`2·dr` on the diagonal with self-interaction),
    /// in [`each_term`]'s order. `WHOLE`: `n = 16·NV`, the partners' columns
    /// read by plain loads (masked ones otherwise).
    ///
    /// # Safety
    /// [`backward`]'s contract for this sample; `i0 + R <= f`; AVX-512 F.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn rows_cols<const R: usize, const NV: usize, const WHOLE: bool>(
        &self,
        i0: usize,
        c0: usize,
        n: usize,
    ) {
        let ms: [u16; NV] = std::array::from_fn(|v| mask(16 * v, n));
        let mut acc = [[_mm512_setzero_ps(); NV]; R];
        // SAFETY: the caller's contract; the masked loads and stores touch the
        // `n` live columns only; every coefficient read is a kept pair's column
        // of the `dr` row (`Dot::col`).
        unsafe {
            let load = |k: usize| -> [__m512; NV] {
                let t = self.rows[k].add(c0);
                if WHOLE {
                    std::array::from_fn(|v| E::load16_all(t.add(16 * v)))
                } else {
                    std::array::from_fn(|v| E::load16(t.add(16 * v), ms[v]))
                }
            };
            let fma = |row: &mut [__m512; NV], c: f32, x: &[__m512; NV]| {
                let cv = _mm512_set1_ps(c);
                for (a, &xv) in row.iter_mut().zip(x) {
                    *a = _mm512_fmadd_ps(cv, xv, *a);
                }
            };
            if i0 == 0 {
                for v in 0..NV {
                    acc[0][v] = _mm512_maskz_loadu_ps(ms[v], self.drow.add(c0 + 16 * v));
                }
            }
            each_term!(self, acc, i0, R, load, fma);
            for (row, out) in acc.iter().zip(&self.outs[i0..i0 + R]) {
                let g = out.add(c0);
                for (v, a) in row.iter().enumerate() {
                    _mm512_mask_storeu_ps(g.add(16 * v), ms[v], *a);
                }
            }
        }
    }
}
