//! The forward kernels ([`forward`], [`forward_pairs`]): per sample, the dot
//! products in register blocks of operands × partners.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::narrow::{NARROW_F, forward_narrow};
#[cfg(target_arch = "x86_64")]
use super::{AHEAD, Ahead, Dot, Elem, MAX_F, mask};

/// Forward rows `s0..s1`: `ops[i]` operand `i` (`[S][D]`), `out` the result
/// (`[S][width]`): per sample, `x` (operand 0) and then each kept pair's dot
/// product `T_i · T_j` (`j < i`, or `j <= i` with self-interaction) in
/// row-major order. The products are computed in register blocks of
/// [`BLK`] × [`BLK`] pairs (operands `i0..i0 + 4` against partners `j0..j0 +
/// 4`, `j0 <= i0`): 16-lane partial sums over the columns, each loaded vector
/// feeding four FMAs, then the 16 sums across lanes at once ([`sum16`]): a
/// reassociation of the definition's sum, as the Cranelift kernel's 4-lane one
/// is. The next sample's rows are prefetched while one is computed (its
/// operands are 27 rows of 27 arrays at dlrm-mlperf's shape, more streams than
/// the hardware prefetchers follow).
///
/// # Safety
/// Every `ops[i]` holds rows `0..s1` of `d` f32, `out` rows `0..s1` of `width`
/// f32 whose rows `s0..s1` no other thread touches; the CPU has AVX-512 F and
/// VL ([`available`](super::available)).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn forward<E: Elem>(dot: Dot, ops: &[*const E], out: *mut f32, s0: usize, s1: usize) {
    if (1..=16).contains(&dot.d) && dot.f <= NARROW_F {
        // SAFETY: forwarded; the operands fit `forward_narrow`'s registers.
        return unsafe { forward_narrow(dot, ops, out, s0, s1) };
    }
    // SAFETY: forwarded; `block_dots` wants what this function has.
    unsafe {
        each_sample(dot, ops, out, (s0, s1), |rows, ij, orow| {
            if ij.0 == ij.1 {
                block_dots::<E, true>(dot, rows, ij, orow)
            } else {
                block_dots::<E, false>(dot, rows, ij, orow)
            }
        })
    }
}

/// [`forward`] on bf16 operands with AVX512_BF16's `vdpbf16ps`: each
/// instruction multiplies 32 column pairs exactly (a bf16 product fits an
/// f32) and adds them into 16 f32 lanes, two columns a lane — twice the
/// columns per instruction of widening and an FMA, and no widening. Its
/// sums are a reassociation of [`forward`]'s (column pairs summed together)
/// and it treats subnormal inputs as zero, so the results may differ from the
/// widened f32 path in the last bits; they are the same on every run on one
/// CPU. Operands of at most 16 columns take [`forward_narrow`] as in
/// [`forward`].
///
/// # Safety
/// As [`forward`], and the CPU has AVX512_BF16 ([`pairs_available`](super::pairs_available)).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn forward_pairs(
    dot: Dot,
    ops: &[*const half::bf16],
    out: *mut f32,
    s0: usize,
    s1: usize,
) {
    if (1..=16).contains(&dot.d) && dot.f <= NARROW_F {
        // SAFETY: forwarded; the operands fit `forward_narrow`'s registers.
        return unsafe { forward_narrow(dot, ops, out, s0, s1) };
    }
    // SAFETY: forwarded; `block_pairs` wants what this function has.
    unsafe {
        each_sample(dot, ops, out, (s0, s1), |rows, ij, orow| {
            block_pairs(dot, rows, ij, orow)
        })
    }
}

/// [`forward`] on bf16 operands, each sample's rows widened once into f32
/// (`buf`: at least `f·d` floats, the task's) and [`forward`]'s f32 register
/// blocks run on them: the same products and sums as [`forward`] on the
/// widened operands, bit for bit. Widening as each block loads a row (the
/// generic [`forward`] on bf16) widens every row once per block it is in, and
/// `vdpbf16ps` ([`forward_pairs`]) runs at half the FMAs' rate where the CPU
/// gives it one port; both took 1.3x the f32 forward's time at dlrm-small's
/// 9 operands of 64 (Intel Xeon model 207), this 1.1x. Operands of at most
/// 16 columns take [`forward_narrow`], which widens once a sample too.
///
/// # Safety
/// As [`forward`]; `buf.len() >= f·d`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn forward_widened(
    dot: Dot,
    ops: &[*const half::bf16],
    out: *mut f32,
    (s0, s1): (usize, usize),
    buf: &mut [f32],
) {
    if (1..=16).contains(&dot.d) && dot.f <= NARROW_F {
        // SAFETY: forwarded; the operands fit `forward_narrow`'s registers.
        return unsafe { forward_narrow(dot, ops, out, s0, s1) };
    }
    let Dot { f, d, .. } = dot;
    let width = dot.width();
    let whole = d / 16 * 16;
    let base = buf.as_mut_ptr();
    let mut rows = [std::ptr::null::<f32>(); MAX_F + BLK];
    for (i, r) in rows.iter_mut().enumerate().take(f) {
        *r = base.wrapping_add(i * d).cast_const();
    }
    // The last block's missing operands read operand 0 (their products are
    // not stored).
    let r0 = rows[0];
    rows[f..f + BLK].fill(r0);
    for s in s0..s1 {
        // SAFETY: the caller's contract: row `s` of every operand and of the
        // result, `f·d` floats of `buf`; the masked loads and stores touch
        // the `d` columns only; a prefetch never faults.
        unsafe {
            for (i, &op) in ops.iter().enumerate().take(f) {
                let (src, dst) = (op.add(s * d), base.add(i * d));
                for c in (0..whole).step_by(16) {
                    _mm512_storeu_ps(dst.add(c), half::bf16::load16_all(src.add(c)));
                }
                if whole < d {
                    let m = mask(whole, d);
                    _mm512_mask_storeu_ps(dst.add(whole), m, half::bf16::load16(src.add(whole), m));
                }
            }
            let mut ahead = Ahead::new(ops, s + AHEAD, s1, d, forward_blocks(f));
            let orow = out.add(s * width);
            std::ptr::copy_nonoverlapping(rows[0], orow, d);
            for i0 in (0..f).step_by(BLK) {
                for j0 in (0..=i0).step_by(BLK) {
                    ahead.step();
                    if i0 == j0 {
                        block_dots::<f32, true>(dot, &rows, (i0, j0), orow);
                    } else {
                        block_dots::<f32, false>(dot, &rows, (i0, j0), orow);
                    }
                }
            }
        }
    }
}

/// The forward's loop over samples: `x` into the row, then `block` on every
/// register block of pairs, the next sample's rows prefetched meanwhile.
///
/// # Safety
/// As [`forward`]; `block` may be called with `rows[..f + BLK]` holding `d`
/// elements each, and the sample's result row.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn each_sample<E: Elem>(
    dot: Dot,
    ops: &[*const E],
    out: *mut f32,
    (s0, s1): (usize, usize),
    block: impl Fn(&[*const E], (usize, usize), *mut f32),
) {
    let Dot { f, d, .. } = dot;
    let width = dot.width();
    let mut rows = [std::ptr::null::<E>(); MAX_F + BLK];
    for s in s0..s1 {
        // SAFETY: the caller's contract: row `s` of every operand and of the
        // result; pair columns are inside the row (`Dot::col`); a prefetch
        // never faults.
        unsafe {
            for (r, &op) in rows.iter_mut().zip(ops) {
                *r = op.add(s * d);
            }
            // The last block's missing operands read operand 0 (their
            // products are not stored).
            let r0 = rows[0];
            rows[f..f + BLK].fill(r0);
            let mut ahead = Ahead::new(ops, s + AHEAD, s1, d, forward_blocks(f));
            let orow = out.add(s * width);
            for c in (0..d).step_by(16) {
                let m = mask(c, d);
                _mm512_mask_storeu_ps(orow.add(c), m, E::load16(rows[0].add(c), m));
            }
            for i0 in (0..f).step_by(BLK) {
                for j0 in (0..=i0).step_by(BLK) {
                    ahead.step();
                    block(&rows, (i0, j0), orow);
                }
            }
        }
    }
}

/// The register blocks of [`forward`] for `f` operands (`BLK × BLK` pairs on
/// and below the diagonal).
fn forward_blocks(f: usize) -> usize {
    let n = f.div_ceil(BLK);
    n * (n + 1) / 2
}

/// Operands and partners in one register block of [`forward`].
const BLK: usize = 4;

/// The kept pairs among operands `i0..i0 + 4` (those below `f`) and partners
/// `j0..j0 + 4` of one sample, into its result row `orow`. On the diagonal
/// (`DIAG`, `j0 == i0`) only the pairs `j <= i`, the partners' rows being the
/// operands' own (loaded once): 10 FMAs and 4 loads a column step, not 16
/// and 8, the same products in the same order. One function per form, called
/// by the loop over blocks (one function holding both, its accumulators went
/// through the stack before the lane sums and the forward ran 7-20% slower):
/// `examples/interaction_best 27 128 2048`, 2026-12-01, AMD EPYC Zen 4, 2
/// threads, 4 interleaved pairs, 1.57-1.62 → 1.52-1.54 ms (blocked 1.69-1.74
/// → 1.63-1.67), 9×64 0.19-0.24 → 0.17-0.19.
///
/// # Safety
/// `rows[..f + BLK]` hold `d` f32 each; `orow` holds the sample's `width`
/// result columns; AVX-512 F and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn block_dots<E: Elem, const DIAG: bool>(
    dot: Dot,
    rows: &[*const E],
    (i0, j0): (usize, usize),
    orow: *mut f32,
) {
    let d = dot.d;
    let mut acc = [[_mm512_setzero_ps(); BLK]; BLK];
    // SAFETY: the caller's contract; the masked loads touch the live columns
    // only.
    unsafe {
        // The block's rows, looked up once (not per column step).
        let (ra, rb): ([*const E; BLK], [*const E; BLK]) = (
            std::array::from_fn(|r| rows[i0 + r]),
            std::array::from_fn(|q| rows[j0 + q]),
        );
        let mut fma = |a: [__m512; BLK], b: [__m512; BLK]| {
            for (r, (ar, &av)) in acc.iter_mut().zip(&a).enumerate() {
                for (q, (x, &bv)) in ar.iter_mut().zip(&b).enumerate() {
                    if !DIAG || q <= r {
                        *x = _mm512_fmadd_ps(av, bv, *x);
                    }
                }
            }
        };
        // Whole vectors by plain loads, a ragged last one masked: a masked
        // load in every step, with its mask computed per step, made the
        // forward 15-20% slower (`examples/interaction_best 27 128 2048`,
        // Intel Xeon model 207, 2 threads, interleaved: 1.60-1.72 to
        // 1.38-1.47 ms; dlrm-mlperf's in a `--bench` inference step 1.99-2.09
        // to 1.70-1.76 ms).
        let whole = d / 16 * 16;
        for c in (0..whole).step_by(16) {
            let a: [__m512; BLK] = std::array::from_fn(|r| E::load16_all(ra[r].add(c)));
            let b = if DIAG {
                a
            } else {
                std::array::from_fn(|q| E::load16_all(rb[q].add(c)))
            };
            fma(a, b);
        }
        if whole < d {
            let m = mask(whole, d);
            let a: [__m512; BLK] = std::array::from_fn(|r| E::load16(ra[r].add(whole), m));
            let b = if DIAG {
                a
            } else {
                std::array::from_fn(|q| E::load16(rb[q].add(whole), m))
            };
            fma(a, b);
        }
        store_block(dot, &acc, (i0, j0), orow);
    }
}

/// [`block_dots`] with `vdpbf16ps` on bf16 rows ([`forward_pairs`]): 32
/// columns a step, column pairs `2q, 2q + 1` into lane `q`.
///
/// # Safety
/// As [`block_dots`], and AVX512_BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn block_pairs(
    dot: Dot,
    rows: &[*const half::bf16],
    (i0, j0): (usize, usize),
    orow: *mut f32,
) {
    let d = dot.d;
    let mut acc = [[_mm512_setzero_ps(); BLK]; BLK];
    // SAFETY: the caller's contract; the masked loads touch the live columns
    // only (the others read as zeros, whose products add nothing).
    unsafe {
        let (ra, rb): ([*const half::bf16; BLK], [*const half::bf16; BLK]) = (
            std::array::from_fn(|r| rows[i0 + r]),
            std::array::from_fn(|q| rows[j0 + q]),
        );
        let mut pairs = |a: [__m512bh; BLK], b: [__m512bh; BLK]| {
            for (ar, &av) in acc.iter_mut().zip(&a) {
                for (x, &bv) in ar.iter_mut().zip(&b) {
                    *x = _mm512_dpbf16_ps(*x, av, bv);
                }
            }
        };
        // Whole steps by plain loads, a ragged last one masked (as in
        // `block_dots`): the bf16 dlrm-mlperf forward in a `--bench`
        // inference step 2.30-2.43 to 2.05-2.12 ms (Intel Xeon model 207,
        // interleaved).
        let whole = d / 32 * 32;
        let all = |p: *const half::bf16| -> __m512bh {
            std::mem::transmute(_mm512_loadu_si512(p.cast()))
        };
        for c in (0..whole).step_by(32) {
            pairs(
                std::array::from_fn(|r| all(ra[r].add(c))),
                std::array::from_fn(|q| all(rb[q].add(c))),
            );
        }
        if whole < d {
            let m: __mmask32 = (1u32 << (d - whole)) - 1;
            let part = |p: *const half::bf16| -> __m512bh {
                std::mem::transmute(_mm512_maskz_loadu_epi16(m, p.add(whole).cast()))
            };
            pairs(
                std::array::from_fn(|r| part(ra[r])),
                std::array::from_fn(|q| part(rb[q])),
            );
        }
        store_block(dot, &acc, (i0, j0), orow);
    }
}

/// The sums across lanes of one register block's accumulators (`acc[r][q]`:
/// operand `i0 + r` against partner `j0 + q`), stored at the kept pairs'
/// columns of `orow`.
///
/// # Safety
/// `orow` holds the sample's `width` result columns; AVX-512 F and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl")]
#[inline]
unsafe fn store_block(
    dot: Dot,
    acc: &[[__m512; BLK]; BLK],
    (i0, j0): (usize, usize),
    orow: *mut f32,
) {
    // Lane 4r + q: the pair (i0 + r, j0 + q).
    let v = sum16(std::array::from_fn(|k| acc[k % BLK][k / BLK]));
    let blocks = [
        _mm512_castps512_ps128(v),
        _mm512_extractf32x4_ps::<1>(v),
        _mm512_extractf32x4_ps::<2>(v),
        _mm512_extractf32x4_ps::<3>(v),
    ];
    for (r, &row) in blocks.iter().enumerate() {
        let i = i0 + r;
        if i >= dot.f {
            break;
        }
        let kept = if dot.self_interaction { i + 1 } else { i };
        let n = kept.saturating_sub(j0).min(BLK);
        if n > 0 {
            // SAFETY: the caller's contract: the pair columns of row `i`
            // with partners `j0..j0 + n` lie inside the sample's row.
            unsafe { _mm_mask_storeu_ps(orow.add(dot.col(i, j0)), (1u8 << n) - 1, row) };
        }
    }
}

/// The lane sums of 16 vectors: lane `4r + q` of the result is the sum of the
/// lanes of `a[4q + r]` (a transposing tree of 256- and 128-bit block
/// shuffles, in-block shuffles and adds: 45 instructions for 16 sums).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn sum16(a: [__m512; 16]) -> __m512 {
    // s[p]: block b of a[2p]'s halves summed in blocks 0, 1 (b = 0, 1 with 2,
    // 3), a[2p + 1]'s in blocks 2, 3.
    let s: [__m512; 8] = std::array::from_fn(|p| {
        let (x, y) = (a[2 * p], a[2 * p + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(x, y),
            _mm512_shuffle_f32x4::<0xEE>(x, y),
        )
    });
    // t[q]: block r holds four partial sums of a[4q + r].
    let t: [__m512; 4] = std::array::from_fn(|q| {
        let (x, y) = (s[2 * q], s[2 * q + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(x, y),
            _mm512_shuffle_f32x4::<0xDD>(x, y),
        )
    });
    // u01, per block: the sums of t0's and t1's lanes 0 + 2, 0 + 2, 1 + 3,
    // 1 + 3 (alike u23 of t2, t3).
    let half =
        |x: __m512, y: __m512| _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
    let (u01, u23) = (half(t[0], t[1]), half(t[2], t[3]));
    // Per block: t0's, t1's, t2's and t3's whole sums.
    _mm512_add_ps(
        _mm512_shuffle_ps::<0b01_00_01_00>(u01, u23),
        _mm512_shuffle_ps::<0b11_10_11_10>(u01, u23),
    )
}
