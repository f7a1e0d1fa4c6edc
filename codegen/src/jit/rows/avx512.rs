//! The AVX-512 (F, BW, VL) row kernels: 16 f32 per `zmm`, up to 8 vectors
//! (128 columns) of a row in registers per pass, the last one masked.
//!
//! Entries [`bag`] and [`run`] ([`super::BagFn`], [`super::RunFn`]); every
//! inner function is `#[target_feature]` for exactly the features of
//! [`super::RowKernel::Avx512`].

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::super::{
        AHEAD, B_IDX64, B_MEAN, B_SHARD, B_WEIGHTED, BagArgs, R_MEAN, R_SPLIT, RunArgs,
        fetch_bag_row, fetch_run_row, index_at, run_of,
    };
    use std::arch::x86_64::*;

    /// Lanes per vector.
    const LANES: usize = 16;
    /// Vectors per pass.
    const MAXV: usize = 8;

    /// The mask of the first `n` lanes (`n <= 16`).
    #[inline(always)]
    fn mask(n: usize) -> __mmask16 {
        ((1u32 << n) - 1) as __mmask16
    }

    /// Columns `c0..c0+cols` (`NV = ⌈cols/16⌉` vectors) of a bag: the rows of
    /// positions `start..end` added in order, the mean's division, the store.
    ///
    /// # Safety
    /// [`super::super::BagFn`]'s contract; `c0 + cols <= d`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn bag_cols<const NV: usize>(
        a: &BagArgs,
        (start, end): (usize, usize),
        out: *mut f32,
        (c0, cols): (usize, usize),
    ) {
        let last = mask(cols - LANES * (NV - 1));
        let idx64 = a.flags & B_IDX64 != 0;
        let (shard, weighted) = (a.flags & B_SHARD != 0, a.flags & B_WEIGHTED != 0);
        let mut acc = [_mm512_setzero_ps(); NV];
        for p in start..end {
            // SAFETY (the block): the contract: positions `start..end` and those
            // below `pend` are indices of rows the table holds (a shard's only
            // read when in it), `weights` one f32 per position when weighted;
            // the masked load reads only columns below `c0 + cols <= d`.
            unsafe {
                if c0 == 0 {
                    fetch_bag_row(a, p + AHEAD);
                }
                let i = index_at(a.idx, idx64, p);
                if shard && (i.wrapping_sub(a.first) as u64) >= a.span as u64 {
                    continue;
                }
                let row = a.table.add(i as usize * a.d + c0);
                let w = if weighted {
                    Some(_mm512_set1_ps(*a.weights.add(p)))
                } else {
                    None
                };
                for (k, s) in acc.iter_mut().enumerate() {
                    let x = if k + 1 == NV {
                        _mm512_maskz_loadu_ps(last, row.add(LANES * k))
                    } else {
                        _mm512_loadu_ps(row.add(LANES * k))
                    };
                    // The product rounded, then added (never fused).
                    let x = match w {
                        Some(w) => _mm512_mul_ps(w, x),
                        None => x,
                    };
                    *s = _mm512_add_ps(*s, x);
                }
            }
        }
        if a.flags & B_MEAN != 0 && end > start {
            let c = _mm512_set1_ps((end - start) as f32);
            for s in acc.iter_mut() {
                *s = _mm512_div_ps(*s, c);
            }
        }
        for (k, s) in acc.iter().enumerate() {
            // SAFETY: `out` holds `d >= c0 + cols` f32; the last store is
            // masked to the columns below `c0 + cols`.
            unsafe {
                let o = out.add(c0 + LANES * k);
                if k + 1 == NV {
                    _mm512_mask_storeu_ps(o, last, *s);
                } else {
                    _mm512_storeu_ps(o, *s);
                }
            }
        }
    }

    /// [`super::super::BagFn`]: a bag's sum in passes of up to 128 columns
    /// (the first one fetching rows ahead).
    ///
    /// # Safety
    /// [`super::super::BagFn`]'s contract.
    pub unsafe extern "C" fn bag(args: *const BagArgs, start: i64, end: i64, out: *mut f32) {
        // SAFETY: forwarded (the contract's `args`, positions and `out`).
        unsafe {
            let a = &*args;
            let se = (start as usize, end as usize);
            let mut c0 = 0;
            while c0 < a.d {
                let cols = (a.d - c0).min(LANES * MAXV);
                let cc = (c0, cols);
                match cols.div_ceil(LANES) {
                    1 => bag_cols::<1>(a, se, out, cc),
                    2 => bag_cols::<2>(a, se, out, cc),
                    3 => bag_cols::<3>(a, se, out, cc),
                    4 => bag_cols::<4>(a, se, out, cc),
                    5 => bag_cols::<5>(a, se, out, cc),
                    6 => bag_cols::<6>(a, se, out, cc),
                    7 => bag_cols::<7>(a, se, out, cc),
                    _ => bag_cols::<8>(a, se, out, cc),
                }
                c0 += cols;
            }
        }
    }

    /// 16 (masked: `m`'s) stored weights at element `off` of the row at `hi`
    /// (`lo`) as f32.
    ///
    /// # Safety
    /// The row holds the masked elements.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn load_w(split: bool, hi: *mut u8, lo: *mut u8, off: usize, m: __mmask16) -> __m512 {
        // SAFETY: forwarded.
        unsafe {
            if split {
                let h = _mm256_maskz_loadu_epi16(m, hi.cast::<i16>().add(off).cast());
                let l = _mm256_maskz_loadu_epi16(m, lo.cast::<i16>().add(off).cast());
                let h = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h));
                _mm512_castsi512_ps(_mm512_or_si512(h, _mm512_cvtepu16_epi32(l)))
            } else {
                _mm512_maskz_loadu_ps(m, hi.cast::<f32>().add(off))
            }
        }
    }

    /// Stores [`load_w`]'s 16 (masked) weights back (split: the two halves,
    /// exact).
    ///
    /// # Safety
    /// The row holds the masked elements.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn store_w(split: bool, w: __m512, hi: *mut u8, lo: *mut u8, off: usize, m: __mmask16) {
        // SAFETY: forwarded.
        unsafe {
            if split {
                let bits = _mm512_castps_si512(w);
                let h = _mm512_srli_epi32::<16>(bits);
                _mm512_mask_cvtepi32_storeu_epi16(hi.cast::<i16>().add(off).cast(), m, h);
                _mm512_mask_cvtepi32_storeu_epi16(lo.cast::<i16>().add(off).cast(), m, bits);
            } else {
                _mm512_mask_storeu_ps(hi.cast::<f32>().add(off), m, w);
            }
        }
    }

    /// Columns `c0..c0+cols` of a run `i..j` of bag `s`: the step `lr·g`
    /// (`lr·(g / size)` for the mean) once, then `w - step` per entry.
    ///
    /// # Safety
    /// [`super::super::RunFn`]'s contract; `c0 + cols <= d`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn run_cols<const NV: usize>(
        a: &RunArgs,
        ent: *const [i64; 2],
        (i, j, n): (usize, usize, usize),
        (s, size): (usize, f32),
        (c0, cols): (usize, usize),
    ) {
        let last = mask(cols - LANES * (NV - 1));
        let m = |k: usize| if k + 1 == NV { last } else { 0xFFFF };
        let split = a.flags & R_SPLIT != 0;
        let lr = _mm512_set1_ps(a.lr);
        let div = _mm512_set1_ps(size);
        let mut step = [_mm512_setzero_ps(); NV];
        for (k, st) in step.iter_mut().enumerate() {
            // SAFETY: bag `s`'s gradient row holds `d >= c0 + cols` f32.
            let g = unsafe { _mm512_maskz_loadu_ps(m(k), a.grad.add(s * a.d + c0 + LANES * k)) };
            let g = if a.flags & R_MEAN != 0 {
                _mm512_div_ps(g, div)
            } else {
                g
            };
            *st = _mm512_mul_ps(lr, g);
        }
        for e in i..j {
            // SAFETY: entries `e < j <= n` name rows of `d` elements the table
            // holds, touched by this thread only; masked to `c0 + cols`.
            unsafe {
                if c0 == 0 {
                    fetch_run_row(a, ent, e + AHEAD, n);
                }
                let r = (*ent.add(e))[0] as usize;
                for (k, st) in step.iter().enumerate() {
                    let off = r * a.d + c0 + LANES * k;
                    let w = load_w(split, a.hi, a.lo, off, m(k));
                    store_w(split, _mm512_sub_ps(w, *st), a.hi, a.lo, off, m(k));
                }
            }
        }
    }

    /// [`super::super::RunFn`]: entry `i`'s run in passes of up to 128
    /// columns (the first one fetching rows ahead).
    ///
    /// # Safety
    /// [`super::super::RunFn`]'s contract.
    pub unsafe extern "C" fn run(
        args: *const RunArgs,
        ent: *const [i64; 2],
        i: i64,
        n: i64,
    ) -> i64 {
        // SAFETY: forwarded (the contract's `args` and entries).
        unsafe {
            let a = &*args;
            let (i, n) = (i as usize, n as usize);
            let (j, s, size) = run_of(a, ent, i, n);
            let mut c0 = 0;
            while c0 < a.d {
                let cols = (a.d - c0).min(LANES * MAXV);
                let (r, g, cc) = ((i, j, n), (s, size), (c0, cols));
                match cols.div_ceil(LANES) {
                    1 => run_cols::<1>(a, ent, r, g, cc),
                    2 => run_cols::<2>(a, ent, r, g, cc),
                    3 => run_cols::<3>(a, ent, r, g, cc),
                    4 => run_cols::<4>(a, ent, r, g, cc),
                    5 => run_cols::<5>(a, ent, r, g, cc),
                    6 => run_cols::<6>(a, ent, r, g, cc),
                    7 => run_cols::<7>(a, ent, r, g, cc),
                    _ => run_cols::<8>(a, ent, r, g, cc),
                }
                c0 += cols;
            }
            j as i64
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub use imp::{bag, run};

/// Never called: no native row kernel is available off x86-64.
#[cfg(not(target_arch = "x86_64"))]
pub unsafe extern "C" fn bag(_: *const super::BagArgs, _: i64, _: i64, _: *mut f32) {}

/// Never called: no native row kernel is available off x86-64.
#[cfg(not(target_arch = "x86_64"))]
pub unsafe extern "C" fn run(_: *const super::RunArgs, _: *const [i64; 2], _: i64, n: i64) -> i64 {
    n
}
