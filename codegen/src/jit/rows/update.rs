//! The run loop of the native sparse update, written once for both vector
//! widths ([`Width`]: [`super::avx512`]'s and [`super::avx2`]'s): the step
//! `lr·g` (`lr·(g / size)` for the mean) once per run, then `w - step` per
//! entry, for f32 or bf16 gradients and f32 or Split-SGD-BF16 tables (the
//! width's [`Width::load_w`] and [`Width::store_w`]). Each width
//! instantiates [`run_cols`] inside its `#[target_feature]`
//! [`Width::run_cols`], so the width's vector operations (`#[inline(always)]`)
//! compile to its instructions there; a width may take a pass its own way
//! ([`Width::own_pass`]: AVX-512's Split-SGD-BF16 one).

use super::width::Width;
use super::{FAR, R_GRAD_BF16, R_MEAN, R_SPLIT, RunArgs, fetch_run_row, run_of};

/// Vectors per pass.
const MAXV: usize = 8;

/// Columns `c0..c0+cols` (`NV = ⌈cols/LANES⌉` vectors) of a run `i..j` of bag
/// `s`: the step `lr·g` (`lr·(g / size)` for the mean) once, then `w - step`
/// per entry.
///
/// # Safety
/// [`super::RunFn`]'s contract; `c0 + cols <= d`; the CPU has `W`'s features
/// and the caller is compiled with them.
#[inline(always)]
pub(super) unsafe fn run_cols<W: Width, const NV: usize>(
    a: &RunArgs,
    ent: *const [i64; 2],
    (i, j, n): (usize, usize, usize),
    (s, size): (usize, f32),
    (c0, cols): (usize, usize),
) {
    // SAFETY (every width operation below): the caller has `W`'s features.
    let (last, full) = unsafe { (W::part(cols - W::LANES * (NV - 1)), W::part(W::LANES)) };
    let part = |k: usize| if k + 1 == NV { last } else { full };
    let split = a.flags & R_SPLIT != 0;
    // A row's bytes (both halves of a split one).
    let ahead = a.ahead;
    let (lr, div) = unsafe { (W::splat(a.lr), W::splat(size)) };
    let mut step = [unsafe { W::zero() }; NV];
    let gbf = a.flags & R_GRAD_BF16 != 0;
    for (k, st) in step.iter_mut().enumerate() {
        // SAFETY: bag `s`'s gradient row holds `d >= c0 + cols` elements of
        // the gradient type (the last load limited to `c0 + cols`).
        unsafe {
            let at = s * a.d + c0 + W::LANES * k;
            let g = match gbf {
                true => W::load::<true>(a.grad.add(at * 2), part(k)),
                false => W::load::<false>(a.grad.add(at * 4), part(k)),
            };
            let g = if a.flags & R_MEAN != 0 {
                W::div(g, div)
            } else {
                g
            };
            *st = W::mul(lr, g);
        }
    }
    for e in i..j {
        // SAFETY: entries `e < j <= n` name rows of `d` elements the table
        // holds, touched by this thread only; the last load and store
        // limited to `c0 + cols`.
        unsafe {
            if c0 == 0 {
                fetch_run_row::<true>(a, ent, e + FAR * ahead, n);
                fetch_run_row::<false>(a, ent, e + ahead, n);
            }
            let r = (*ent.add(e))[0] as usize;
            for (k, st) in step.iter().enumerate() {
                let off = r * a.d + c0 + W::LANES * k;
                let w = W::load_w(split, a.hi, a.lo, off, part(k));
                W::store_w(split, W::sub(w, *st), a.hi, a.lo, off, part(k));
            }
        }
    }
}

/// [`super::RunFn`] on `W`: the runs of entries `0..n`, each in passes
/// of up to 8 vectors of columns (the first one fetching rows ahead), each
/// [`Width::own_pass`] or else `W`'s [`run_cols`].
///
/// # Safety
/// [`super::RunFn`]'s contract; the CPU has `W`'s features.
#[inline(always)]
pub(super) unsafe fn run<W: Width>(args: *const RunArgs, ent: *const [i64; 2], n: i64) {
    // SAFETY: forwarded (the contract's `args` and entries).
    unsafe {
        let a = &*args;
        let (mut i, n) = (0, n as usize);
        // The rows of the first `ahead` entries, then into L2 those up to
        // `FAR · ahead` (the passes fetch each entry's row `ahead` entries
        // before it is updated, and into L2 `FAR · ahead` before): a ramp, so
        // that they do not each wait a whole miss.
        for q in 0..a.ahead {
            fetch_run_row::<false>(a, ent, q, n);
        }
        for q in a.ahead..FAR * a.ahead {
            fetch_run_row::<true>(a, ent, q, n);
        }
        while i < n {
            let (j, s, size) = run_of(a, ent, i, n);
            let mut c0 = 0;
            while c0 < a.d {
                let cols = (a.d - c0).min(W::LANES * MAXV);
                let (r, g, cc) = ((i, j, n), (s, size), (c0, cols));
                if !W::own_pass(a, ent, r, g, cc) {
                    match cols.div_ceil(W::LANES) {
                        1 => W::run_cols::<1>(a, ent, r, g, cc),
                        2 => W::run_cols::<2>(a, ent, r, g, cc),
                        3 => W::run_cols::<3>(a, ent, r, g, cc),
                        4 => W::run_cols::<4>(a, ent, r, g, cc),
                        5 => W::run_cols::<5>(a, ent, r, g, cc),
                        6 => W::run_cols::<6>(a, ent, r, g, cc),
                        7 => W::run_cols::<7>(a, ent, r, g, cc),
                        _ => W::run_cols::<8>(a, ent, r, g, cc),
                    }
                }
                c0 += cols;
            }
            i = j;
        }
    }
}
