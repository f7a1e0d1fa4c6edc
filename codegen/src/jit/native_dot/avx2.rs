//! The dot interaction on AVX2+FMA (8-lane f32 vectors, 16 registers), for
//! CPUs without AVX-512, on operands whose width is a multiple of 8 (every
//! DLRM's; others take the Cranelift kernels, [`fits`]):
//!
//! - the forward ([`forward`]) in register blocks of 3 operands × 4 partners
//!   (12 accumulators, 3 operand vectors and a partner's: the 16 `ymm`), the
//!   block's 12 sums across lanes by `vhaddps` trees: a reassociation of the
//!   definition's sum, as the AVX-512 forward's 16-lane one is;
//! - the backward ([`backward`]) in blocks of 4 operands × up to 24 columns,
//!   each gradient entry summed over its partners in ascending order with one
//!   FMA per term ([`each_term`], the AVX-512 backward's walk): the
//!   Cranelift kernel's order term for term, so the two agree bit for bit.
//!
//! Both prefetch the next sample's rows spread over the sample's blocks
//! ([`Ahead`]), as the AVX-512 kernels do.

use super::backward::{Block, each_sample, each_term};
use super::{AHEAD, Ahead, Dot, Elem, MAX_F};
use std::arch::x86_64::*;

/// True if this CPU can run these kernels (AVX2 and FMA).
pub fn available() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

/// Whether these kernels take operands of `d` columns: whole 8-lane vectors.
pub fn fits(d: usize) -> bool {
    d > 0 && d.is_multiple_of(8)
}

/// Operands of one forward register block.
const RB: usize = 3;
/// Partners of one forward register block.
const QB: usize = 4;

/// The forward's register blocks for `f` operands: per block row `i0`, the
/// partner blocks below `i0 + RB`.
fn forward_blocks(f: usize) -> usize {
    (0..f).step_by(RB).map(|i0| (i0 + RB).div_ceil(QB)).sum()
}

/// Forward rows `s0..s1` (as [`super::forward()`]): per sample, `x`, then
/// every kept pair's dot product, 3 operands × 4 partners at a time.
///
/// # Safety
/// Every `ops[i]` holds rows `0..s1` of `d` elements, `d` a multiple of 8;
/// `out` rows `0..s1` of `width` f32 whose rows `s0..s1` no other thread
/// touches; `f <= MAX_F`; the CPU has AVX2 and FMA ([`available`]).
#[target_feature(enable = "avx2,fma")]
pub unsafe fn forward<E: Elem>(dot: Dot, ops: &[*const E], out: *mut f32, s0: usize, s1: usize) {
    let Dot { f, d, .. } = dot;
    let width = dot.width();
    let blocks = forward_blocks(f);
    let mut rows = [std::ptr::null::<E>(); MAX_F + 8];
    for s in s0..s1 {
        // SAFETY: the caller's contract: row `s` of every operand and of the
        // result; pair columns are inside the row (`Dot::col`); a prefetch
        // never faults.
        unsafe {
            for (r, &op) in rows.iter_mut().zip(ops) {
                *r = op.add(s * d);
            }
            // Blocks past the last operand read operand 0 (their products
            // are not stored).
            let r0 = rows[0];
            rows[f..f + 8].fill(r0);
            let mut ahead = Ahead::new(ops, s + AHEAD, s1, d, blocks);
            let orow = out.add(s * width);
            for c in (0..d).step_by(8) {
                _mm256_storeu_ps(orow.add(c), E::load8(rows[0].add(c)));
            }
            for i0 in (0..f).step_by(RB) {
                for j0 in (0..i0 + RB).step_by(QB) {
                    ahead.step();
                    block(dot, &rows, (i0, j0), orow);
                }
            }
        }
    }
}

/// The kept pairs among operands `i0..i0 + 3` (those below `f`) and partners
/// `j0..j0 + 4` of one sample, into its result row `orow`.
///
/// # Safety
/// `rows[..i0 + 3]` and `rows[j0..j0 + 4]` hold `d` elements each, `d` a
/// multiple of 8; `orow` holds the sample's `width` result columns; AVX2, FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn block<E: Elem>(dot: Dot, rows: &[*const E], (i0, j0): (usize, usize), orow: *mut f32) {
    let mut acc = [[_mm256_setzero_ps(); QB]; RB];
    let mut sums = [0.0f32; RB * QB];
    // SAFETY: the caller's contract; the loads read whole vectors of the
    // rows, the copies each row's kept pairs with partners in the block.
    unsafe {
        // The block's rows, looked up once (not per column step).
        let ra: [*const E; RB] = std::array::from_fn(|r| rows[i0 + r]);
        let rb: [*const E; QB] = std::array::from_fn(|q| rows[j0 + q]);
        for c in (0..dot.d).step_by(8) {
            let a: [__m256; RB] = std::array::from_fn(|r| E::load8(ra[r].add(c)));
            for (q, &bq) in rb.iter().enumerate() {
                let b = E::load8(bq.add(c));
                for (ar, &av) in acc.iter_mut().zip(&a) {
                    ar[q] = _mm256_fmadd_ps(av, b, ar[q]);
                }
            }
        }
        // Lane 4r + q: the pair (i0 + r, j0 + q).
        let [a0, a1, a2] = acc;
        let two = sum8([a0[0], a0[1], a0[2], a0[3], a1[0], a1[1], a1[2], a1[3]]);
        _mm256_storeu_ps(sums.as_mut_ptr(), two);
        _mm_storeu_ps(sums.as_mut_ptr().add(8), sum4(a2));
        for r in 0..RB {
            let i = i0 + r;
            if i >= dot.f {
                break;
            }
            let kept = if dot.self_interaction { i + 1 } else { i };
            let n = kept.saturating_sub(j0).min(QB);
            std::ptr::copy_nonoverlapping(sums.as_ptr().add(QB * r), orow.add(dot.col(i, j0)), n);
        }
    }
}

/// The lane sums of 8 vectors: lane `k` of the result is the sum of `a[k]`'s
/// lanes (`vhaddps` twice, then the two 128-bit halves added).
#[inline(always)]
fn sum8(a: [__m256; 8]) -> __m256 {
    // SAFETY: AVX, which every caller's features include.
    unsafe {
        let h01 = _mm256_hadd_ps(a[0], a[1]);
        let h23 = _mm256_hadd_ps(a[2], a[3]);
        let h45 = _mm256_hadd_ps(a[4], a[5]);
        let h67 = _mm256_hadd_ps(a[6], a[7]);
        // Lane k (k < 4): a[k]'s lanes 0..4; lane 4 + k: its lanes 4..8.
        let lo = _mm256_hadd_ps(h01, h23);
        let hi = _mm256_hadd_ps(h45, h67);
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(lo, hi),
            _mm256_permute2f128_ps::<0x31>(lo, hi),
        )
    }
}

/// The lane sums of 4 vectors (lane `k`: `a[k]`'s).
#[inline(always)]
fn sum4(a: [__m256; 4]) -> __m128 {
    // SAFETY: AVX, which every caller's features include.
    unsafe {
        let h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
        _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h))
    }
}

/// Rows of a backward block (`ROWS × 3` accumulators, 3 loaded vectors and a
/// broadcast fit the 16 `ymm` registers).
const ROWS: usize = 4;

/// Columns of a backward block, in 8-lane vectors.
const NV: usize = 3;

/// Backward rows `s0..s1` (as [`super::backward()`]): per sample, each
/// 24-column chunk of the gradients 4 operands at a time.
///
/// # Safety
/// Every `ops[i]` holds rows `0..s1` of `d` elements, `d` a multiple of 8;
/// `dr` rows `0..s1` of `width` f32, every `grads[i]` rows `0..s1` of `d` f32
/// whose rows `s0..s1` no other thread touches; `f <= MAX_F`; AVX2 and FMA
/// ([`available`]).
#[target_feature(enable = "avx2,fma")]
pub unsafe fn backward<E: Elem>(
    dot: Dot,
    ops: &[*const E],
    dr: *const f32,
    grads: &[*mut f32],
    s0: usize,
    s1: usize,
) {
    let Dot { f, d, .. } = dot;
    let steps = d.div_ceil(8 * NV) * f.div_ceil(ROWS);
    // SAFETY: forwarded; the loads and stores are whole vectors of the rows.
    unsafe {
        each_sample(dot, ops, (dr, grads), (s0, s1), steps, |blk, ahead| {
            for c0 in (0..d).step_by(8 * NV) {
                let nv = ((d - c0) / 8).min(NV);
                for i0 in (0..f).step_by(ROWS) {
                    ahead.step();
                    run(blk, i0, (f - i0).min(ROWS), nv, c0);
                }
            }
        })
    }
}

/// Gradients `i0..i0 + r` (`r <= ROWS`), columns `c0..c0 + 8·nv` (`nv` in
/// `1..=NV`), through the block kernel specialised on `(r, nv)`.
///
/// # Safety
/// [`backward`]'s contract for this sample; AVX2, FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn run<E: Elem>(blk: &Block<'_, E>, i0: usize, r: usize, nv: usize, c0: usize) {
    macro_rules! dispatch {
        ($($r:literal),*) => {
            match (r, nv) {
                $(
                    ($r, 1) => rows_cols::<E, $r, 1>(blk, i0, c0),
                    ($r, 2) => rows_cols::<E, $r, 2>(blk, i0, c0),
                    ($r, _) => rows_cols::<E, $r, 3>(blk, i0, c0),
                )*
                _ => unreachable!("a block has 1..=ROWS rows"),
            }
        };
    }
    // SAFETY: forwarded.
    unsafe { dispatch!(1, 2, 3, 4) }
}

/// Columns `c0..c0 + 8·NV` of gradients `i0..i0 + R`: operand 0's starts from
/// `dr`'s first `D` columns, the others from zero; then every term in
/// [`each_term`]'s order, `acc_i += c_ik · T_k`, one FMA each.
///
/// # Safety
/// [`backward`]'s contract for this sample; `i0 + R <= f`, `c0 + 8·NV <= d`;
/// AVX2, FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_cols<E: Elem, const R: usize, const NV: usize>(
    blk: &Block<'_, E>,
    i0: usize,
    c0: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); NV]; R];
    // SAFETY: the caller's contract; the loads and stores are whole vectors
    // of the rows' columns `c0..c0 + 8·NV`.
    unsafe {
        if i0 == 0 {
            for (v, a) in acc[0].iter_mut().enumerate() {
                *a = _mm256_loadu_ps(blk.drow.add(c0 + 8 * v));
            }
        }
        let load = |k: usize| -> [__m256; NV] {
            let t = blk.rows[k].add(c0);
            std::array::from_fn(|v| E::load8(t.add(8 * v)))
        };
        let fma = |row: &mut [__m256; NV], c: f32, x: &[__m256; NV]| {
            let cv = _mm256_set1_ps(c);
            for (a, &xv) in row.iter_mut().zip(x) {
                *a = _mm256_fmadd_ps(cv, xv, *a);
            }
        };
        each_term!(blk, acc, i0, R, load, fma);
        for (row, out) in acc.iter().zip(&blk.outs[i0..i0 + R]) {
            for (v, a) in row.iter().enumerate() {
                _mm256_storeu_ps(out.add(c0 + 8 * v), *a);
            }
        }
    }
}
