//! The bag loop of the native forward, written once for both vector widths
//! ([`Width`]: [`super::avx512`]'s and [`super::avx2`]'s) and every table
//! element type (`T`: f32, bf16 widened as it is loaded, or int8 row-wise
//! dequantized as it is loaded: the one step that differs). Each width
//! instantiates [`bag_cols`] inside its
//! `#[target_feature]` [`Width::cols`], so the width's vector operations
//! (`#[inline(always)]`) compile to its instructions there.

use super::width::Width;
use super::{
    B_IDX64, B_MEAN, B_OUT_BF16, B_SHARD, B_TABLE_BF16, B_TABLE_Q8, B_WEIGHTED, BagArgs, FAR,
    fetch_bag_row, index_at,
};

/// A [`bags_cols`] instance (a width's [`Width::cols`]): bags `s0..s1`.
pub(super) type BagCols = unsafe fn(&BagArgs, (usize, usize), *mut u8, (usize, usize));

/// Vectors per pass.
const MAXV: usize = 8;

/// [`bag_cols`]' table element type `T`: f32 rows.
pub(super) const T_F32: u8 = 0;
/// [`bag_cols`]' table element type `T`: bf16 rows, widened exactly.
pub(super) const T_BF16: u8 = 1;
/// [`bag_cols`]' table element type `T`: int8 row-wise rows ([`B_TABLE_Q8`]:
/// `d` codes, then the row's f32 scale and bias), each element
/// `fma(q, scale, bias)`.
pub(super) const T_Q8: u8 = 2;

/// Columns `c0..c0+cols` (`NV = ⌈cols/LANES⌉` vectors) of a bag: the rows of
/// positions `start..end` (of element type `T`) added in order (each product
/// with a weight rounded, then added: never fused), the mean's division, the
/// store; the rows `ahead` positions on fetched meanwhile, and those
/// [`FAR`]` · ahead` on into L2.
///
/// # Safety
/// [`super::BagFn`]'s contract; `c0 + cols <= d`; the CPU has `W`'s features
/// and the caller is compiled with them.
#[inline(always)]
pub(super) unsafe fn bag_cols<W: Width, const NV: usize, const T: u8>(
    a: &BagArgs,
    (start, end): (usize, usize),
    out: *mut u8,
    (c0, cols): (usize, usize),
    ahead: usize,
) {
    let stride = super::row_stride(a);
    // SAFETY (every width operation below): the caller has `W`'s features.
    let (last, full) = unsafe { (W::part(cols - W::LANES * (NV - 1)), W::part(W::LANES)) };
    let part = |k: usize| if k + 1 == NV { last } else { full };
    let idx64 = a.flags & B_IDX64 != 0;
    let (shard, weighted) = (a.flags & B_SHARD != 0, a.flags & B_WEIGHTED != 0);
    let mut acc = [unsafe { W::zero() }; NV];
    for p in start..end {
        // SAFETY (the block): the contract: positions `start..end` and those
        // below `pend` are indices of rows the table holds (a shard's only
        // read when in it), `weights` one f32 per position when weighted; an
        // int8 row holds `d` codes and 8 bytes of scale and bias (read
        // unaligned); the last load reads only columns below `c0 + cols <= d`.
        unsafe {
            if c0 == 0 {
                fetch_bag_row::<true>(a, p + FAR * ahead);
                fetch_bag_row::<false>(a, p + ahead);
            }
            let i = index_at(a.idx, idx64, p);
            if shard && (i.wrapping_sub(a.first) as u64) >= a.span as u64 {
                continue;
            }
            let row = a.table.add(i as usize * stride);
            let (scale, bias) = match T {
                T_Q8 => (
                    W::splat(row.add(a.d).cast::<f32>().read_unaligned()),
                    W::splat(row.add(a.d + 4).cast::<f32>().read_unaligned()),
                ),
                _ => (W::zero(), W::zero()),
            };
            let w = if weighted {
                Some(W::splat(*a.weights.add(p)))
            } else {
                None
            };
            for (k, s) in acc.iter_mut().enumerate() {
                let col = c0 + W::LANES * k;
                let x = match T {
                    T_Q8 => W::fma(W::load_u8(row.add(col), part(k)), scale, bias),
                    T_BF16 => W::load::<true>(row.add(col * 2), part(k)),
                    _ => W::load::<false>(row.add(col * 4), part(k)),
                };
                let x = match w {
                    Some(w) => W::mul(w, x),
                    None => x,
                };
                *s = W::add(*s, x);
            }
        }
    }
    // SAFETY: forwarded (the caller's `out` and features).
    unsafe { finish::<W, NV>(a, end - start, acc, out, (c0, cols)) }
}

/// The end of a bag's pass: the mean's division (by `size`, an empty bag
/// stays 0), then the store of columns `c0..c0+cols` at `out`.
///
/// # Safety
/// `out` holds `d >= c0 + cols` elements of the result type; the CPU has
/// `W`'s features and the caller is compiled with them.
#[inline(always)]
unsafe fn finish<W: Width, const NV: usize>(
    a: &BagArgs,
    size: usize,
    mut acc: [W::V; NV],
    out: *mut u8,
    (c0, cols): (usize, usize),
) {
    // SAFETY (the block): the caller has `W`'s features; the last store is
    // limited to the columns below `c0 + cols`, which `out` holds.
    unsafe {
        if a.flags & B_MEAN != 0 && size > 0 {
            let c = W::splat(size as f32);
            for s in acc.iter_mut() {
                *s = W::div(*s, c);
            }
        }
        let (last, full) = (W::part(cols - W::LANES * (NV - 1)), W::part(W::LANES));
        let (obf, eo) = match a.flags & B_OUT_BF16 != 0 {
            true => (true, 2),
            false => (false, 4),
        };
        for (k, s) in acc.iter().enumerate() {
            let part = if k + 1 == NV { last } else { full };
            W::store(obf, out.add((c0 + W::LANES * k) * eo), *s, part);
        }
    }
}

/// `W`'s [`bag_cols`] of `nv` vectors (1 to 8) and the table type `T`.
fn cols_of<W: Width, const T: u8>(nv: usize) -> BagCols {
    match nv {
        1 => W::cols::<1, T>,
        2 => W::cols::<2, T>,
        3 => W::cols::<3, T>,
        4 => W::cols::<4, T>,
        5 => W::cols::<5, T>,
        6 => W::cols::<6, T>,
        7 => W::cols::<7, T>,
        _ => W::cols::<8, T>,
    }
}

/// [`bag_cols`] on each bag `s` of `s0..s1` (its result row at `out + (s -
/// s0)` rows).
///
/// # Safety
/// [`super::BagFn`]'s contract; `c0 + cols <= d`; the CPU has `W`'s features
/// and the caller is compiled with them.
#[inline(always)]
pub(super) unsafe fn bags_cols<W: Width, const NV: usize, const T: u8>(
    a: &BagArgs,
    (s0, s1): (usize, usize),
    out: *mut u8,
    cc: (usize, usize),
) {
    // Read once, not per bag (the stores to `out` may alias `a` for all the
    // compiler knows).
    let (ob, ahead) = (super::out_row_bytes(a), a.ahead);
    for s in s0..s1 {
        // SAFETY: the caller's contract: bag `s`'s bounds and result row.
        unsafe {
            let (se, orow) = (super::bag_range(a, s), out.add((s - s0) * ob));
            bag_cols::<W, NV, T>(a, se, orow, cc, ahead);
        }
    }
}

/// [`super::BagFn`] on `W`: bags `s0..s1`, each in passes of up to 8 vectors
/// of columns (the first one fetching rows ahead). Rows of one pass run every
/// bag in one call of the pass's instance; wider rows take every pass of a
/// bag before the next bag, while its rows are in cache.
///
/// # Safety
/// [`super::BagFn`]'s contract; the CPU has `W`'s features.
pub(super) unsafe fn bag<W: Width>(args: *const BagArgs, s0: i64, s1: i64, out: *mut u8) {
    // SAFETY: forwarded (the contract's `args`, bags and `out`).
    unsafe {
        let a = &*args;
        let (s0, s1) = (s0 as usize, s1 as usize);
        let pass = |c0: usize| {
            let cols = (a.d - c0).min(W::LANES * MAXV);
            let nv = cols.div_ceil(W::LANES);
            let f = if a.flags & B_TABLE_Q8 != 0 {
                cols_of::<W, T_Q8>(nv)
            } else if a.flags & B_TABLE_BF16 != 0 {
                cols_of::<W, T_BF16>(nv)
            } else {
                cols_of::<W, T_F32>(nv)
            };
            (f, cols)
        };
        if a.d == 0 || s0 >= s1 {
            return;
        }
        // The rows of the call's first `ahead` positions, then into L2 those
        // up to `FAR · ahead`: the loops below fetch each position's row
        // `ahead` positions before it is read (and into L2 `FAR · ahead`
        // before), so without this ramp these rows would each wait a whole
        // miss (at pooling 1 and 64-byte rows, 32 of a task's 256 lookups).
        let first = super::bag_range(a, s0).0;
        for q in first..first + a.ahead {
            fetch_bag_row::<false>(a, q);
        }
        for q in first + a.ahead..first + FAR * a.ahead {
            fetch_bag_row::<true>(a, q);
        }
        if a.d <= W::LANES * MAXV {
            let (f, cols) = pass(0);
            f(a, (s0, s1), out, (0, cols));
            return;
        }
        let ob = super::out_row_bytes(a);
        for s in s0..s1 {
            let orow = out.add((s - s0) * ob);
            let mut c0 = 0;
            while c0 < a.d {
                let (f, cols) = pass(c0);
                f(a, (s, s + 1), orow, (c0, cols));
                c0 += cols;
            }
        }
    }
}
