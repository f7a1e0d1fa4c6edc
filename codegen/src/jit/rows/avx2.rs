//! The AVX2+FMA row kernels: 8 f32 per `ymm`, up to 8 vectors (64 columns)
//! of a row in registers per pass, a partial last one masked (`vmaskmovps`,
//! slow as a store: full vectors use plain moves; the Split-SGD-BF16 halves of
//! a partial vector element by element). bf16 rows (8 per `xmm`) are widened
//! to f32 as they are loaded, bf16 results rounded in the vector and packed to
//! 16 bits (a partial vector's bf16 elements, again, one by one).
//!
//! Entries [`bag`] and [`run`] ([`super::BagFn`], [`super::RunFn`]); every
//! inner function is `#[target_feature]` for exactly the features of
//! [`super::RowKernel::Avx2`]. No multiply-add is fused: the products are
//! rounded before they are added, as the reference does.

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::super::{
        AHEAD, B_IDX64, B_MEAN, B_OUT_BF16, B_SHARD, B_TABLE_BF16, B_WEIGHTED, BagArgs,
        R_GRAD_BF16, R_MEAN, R_SPLIT, RunArgs, fetch_bag_row, fetch_run_row, index_at, run_of,
    };
    use std::arch::x86_64::*;

    /// Lanes per vector.
    const LANES: usize = 8;
    /// Vectors per pass.
    const MAXV: usize = 8;

    /// The `vmaskmovps` mask of the first `n` lanes (`n <= 8`).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn mask(n: usize) -> __m256i {
        _mm256_cmpgt_epi32(
            _mm256_set1_epi32(n as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        )
    }

    /// The first `n` (`n <= 8`) 16-bit elements at `p` in the low lanes, the
    /// others 0.
    ///
    /// # Safety
    /// `p` holds those `n` elements.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_u16(p: *const u16, n: usize) -> __m128i {
        // SAFETY: forwarded.
        unsafe {
            if n == LANES {
                return _mm_loadu_si128(p.cast());
            }
            let mut b = [0u16; LANES];
            for (t, x) in b.iter_mut().enumerate().take(n) {
                *x = *p.add(t);
            }
            _mm_loadu_si128(b.as_ptr().cast())
        }
    }

    /// 8 elements at `p` as f32, the first `n` of them (`n < 8`: the others
    /// 0): bf16 (`BF`) widened exactly, else f32.
    ///
    /// # Safety
    /// `p` holds those `n` elements.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load8<const BF: bool>(p: *const u8, n: usize) -> __m256 {
        // SAFETY: forwarded.
        unsafe {
            if BF {
                let h = _mm256_cvtepu16_epi32(load_u16(p.cast(), n));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
            } else if n == LANES {
                _mm256_loadu_ps(p.cast())
            } else {
                _mm256_maskload_ps(p.cast(), mask(n))
            }
        }
    }

    /// The 8 bf16 bit patterns of `x` rounded to nearest even, NaN kept a
    /// quiet NaN (`half::bf16::from_f32`'s rule).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn bf16_bits(x: __m256) -> __m128i {
        let bits = _mm256_castps_si256(x);
        let hi = _mm256_srli_epi32::<16>(bits);
        let lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
        let t = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lsb);
        let quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
        let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
        let r = _mm256_blendv_epi8(_mm256_srli_epi32::<16>(t), quiet, nan);
        // Every lane is below 2^16: the saturating pack keeps it.
        _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256::<1>(r))
    }

    /// Stores the first `n` lanes of `x` at `p`: rounded to bf16 (`bf`), else
    /// f32.
    ///
    /// # Safety
    /// `p` holds those `n` elements.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn store8(bf: bool, p: *mut u8, x: __m256, n: usize) {
        // SAFETY: forwarded.
        unsafe {
            if !bf {
                // `vmaskmovps` stores are slow: only a partial vector's.
                return if n == LANES {
                    _mm256_storeu_ps(p.cast(), x)
                } else {
                    _mm256_maskstore_ps(p.cast(), mask(n), x)
                };
            }
            let h = bf16_bits(x);
            if n == LANES {
                return _mm_storeu_si128(p.cast(), h);
            }
            let mut b = [0u16; LANES];
            _mm_storeu_si128(b.as_mut_ptr().cast(), h);
            for (t, &v) in b.iter().enumerate().take(n) {
                *p.cast::<u16>().add(t) = v;
            }
        }
    }

    /// Columns `c0..c0+cols` (`NV = ⌈cols/8⌉` vectors) of a bag: the rows of
    /// positions `start..end` (f32, or bf16 with `BF`) added in order, the
    /// mean's division, the store.
    ///
    /// # Safety
    /// [`super::super::BagFn`]'s contract; `c0 + cols <= d`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn bag_cols<const NV: usize, const BF: bool>(
        a: &BagArgs,
        (start, end): (usize, usize),
        out: *mut u8,
        (c0, cols): (usize, usize),
    ) {
        let es = if BF { 2 } else { 4 };
        let tail = cols - LANES * (NV - 1);
        let n_of = |k: usize| if k + 1 == NV { tail } else { LANES };
        let idx64 = a.flags & B_IDX64 != 0;
        let (shard, weighted) = (a.flags & B_SHARD != 0, a.flags & B_WEIGHTED != 0);
        let mut acc = [_mm256_setzero_ps(); NV];
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
                let row = a.table.add((i as usize * a.d + c0) * es);
                let w = if weighted {
                    Some(_mm256_set1_ps(*a.weights.add(p)))
                } else {
                    None
                };
                for (k, s) in acc.iter_mut().enumerate() {
                    let x = load8::<BF>(row.add(LANES * k * es), n_of(k));
                    // The product rounded, then added (never fused).
                    let x = match w {
                        Some(w) => _mm256_mul_ps(w, x),
                        None => x,
                    };
                    *s = _mm256_add_ps(*s, x);
                }
            }
        }
        if a.flags & B_MEAN != 0 && end > start {
            let c = _mm256_set1_ps((end - start) as f32);
            for s in acc.iter_mut() {
                *s = _mm256_div_ps(*s, c);
            }
        }
        let (obf, eo) = match a.flags & B_OUT_BF16 != 0 {
            true => (true, 2),
            false => (false, 4),
        };
        for (k, s) in acc.iter().enumerate() {
            // SAFETY: `out` holds `d >= c0 + cols` elements of the result
            // type; the last store is limited to the columns below `c0 + cols`.
            unsafe { store8(obf, out.add((c0 + LANES * k) * eo), *s, n_of(k)) };
        }
    }

    /// A [`bag_cols`] instance.
    type BagCols = unsafe fn(&BagArgs, (usize, usize), *mut u8, (usize, usize));

    /// The [`bag_cols`] of `nv` vectors (1 to 8) and the table type `BF`.
    fn bag_cols_of<const BF: bool>(nv: usize) -> BagCols {
        match nv {
            1 => bag_cols::<1, BF>,
            2 => bag_cols::<2, BF>,
            3 => bag_cols::<3, BF>,
            4 => bag_cols::<4, BF>,
            5 => bag_cols::<5, BF>,
            6 => bag_cols::<6, BF>,
            7 => bag_cols::<7, BF>,
            _ => bag_cols::<8, BF>,
        }
    }

    /// [`super::super::BagFn`]: a bag's sum in passes of up to 64 columns
    /// (the first one fetching rows ahead).
    ///
    /// # Safety
    /// [`super::super::BagFn`]'s contract.
    pub unsafe extern "C" fn bag(args: *const BagArgs, start: i64, end: i64, out: *mut u8) {
        // SAFETY: forwarded (the contract's `args`, positions and `out`).
        unsafe {
            let a = &*args;
            let se = (start as usize, end as usize);
            let mut c0 = 0;
            while c0 < a.d {
                let cols = (a.d - c0).min(LANES * MAXV);
                let f = match a.flags & B_TABLE_BF16 != 0 {
                    true => bag_cols_of::<true>(cols.div_ceil(LANES)),
                    false => bag_cols_of::<false>(cols.div_ceil(LANES)),
                };
                f(a, se, out, (c0, cols));
                c0 += cols;
            }
        }
    }

    /// 8 stored weights at element `off` of the row at `hi` (`lo`) as f32,
    /// the first `n` of them (`n < 8`: the others 0).
    ///
    /// # Safety
    /// The row holds those `n` elements.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_w(split: bool, hi: *mut u8, lo: *mut u8, off: usize, n: usize) -> __m256 {
        // SAFETY: forwarded.
        unsafe {
            if !split {
                let p = hi.cast::<f32>().add(off);
                return if n == LANES {
                    _mm256_loadu_ps(p)
                } else {
                    _mm256_maskload_ps(p, mask(n))
                };
            }
            let h = load_u16(hi.cast::<u16>().add(off), n);
            let l = load_u16(lo.cast::<u16>().add(off), n);
            let h = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h));
            _mm256_castsi256_ps(_mm256_or_si256(h, _mm256_cvtepu16_epi32(l)))
        }
    }

    /// Stores the first `n` of [`load_w`]'s weights back (split: the two
    /// halves, exact).
    ///
    /// # Safety
    /// The row holds those `n` elements.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn store_w(split: bool, w: __m256, hi: *mut u8, lo: *mut u8, off: usize, n: usize) {
        // SAFETY: forwarded.
        unsafe {
            if !split {
                // `vmaskmovps` stores are slow: only a partial vector's.
                let p = hi.cast::<f32>().add(off);
                return if n == LANES {
                    _mm256_storeu_ps(p, w)
                } else {
                    _mm256_maskstore_ps(p, mask(n), w)
                };
            }
            let (h, l) = (hi.cast::<u16>().add(off), lo.cast::<u16>().add(off));
            let bits = _mm256_castps_si256(w);
            if n == LANES {
                // Each half narrowed (`vpackusdw`: exact, both are below
                // 2^16), the two 128-bit lanes' results brought together.
                let halves = [
                    (h, _mm256_srli_epi32::<16>(bits)),
                    (l, _mm256_and_si256(bits, _mm256_set1_epi32(0xFFFF))),
                ];
                for (p, x) in halves {
                    let x = _mm256_permute4x64_epi64::<0b1000>(_mm256_packus_epi32(x, x));
                    _mm_storeu_si128(p.cast(), _mm256_castsi256_si128(x));
                }
                return;
            }
            let mut lanes = [0u32; LANES];
            _mm256_storeu_si256(lanes.as_mut_ptr().cast(), bits);
            for (t, &b) in lanes.iter().enumerate().take(n) {
                *h.add(t) = (b >> 16) as u16;
                *l.add(t) = b as u16;
            }
        }
    }

    /// Columns `c0..c0+cols` of a run `i..j` of bag `s`: the step `lr·g`
    /// (`lr·(g / size)` for the mean) once, then `w - step` per entry.
    ///
    /// # Safety
    /// [`super::super::RunFn`]'s contract; `c0 + cols <= d`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run_cols<const NV: usize>(
        a: &RunArgs,
        ent: *const [i64; 2],
        (i, j, n): (usize, usize, usize),
        (s, size): (usize, f32),
        (c0, cols): (usize, usize),
    ) {
        let tail = cols - LANES * (NV - 1);
        let w_of = |k: usize| if k + 1 == NV { tail } else { LANES };
        let split = a.flags & R_SPLIT != 0;
        let lr = _mm256_set1_ps(a.lr);
        let div = _mm256_set1_ps(size);
        let mut step = [_mm256_setzero_ps(); NV];
        let gbf = a.flags & R_GRAD_BF16 != 0;
        for (k, st) in step.iter_mut().enumerate() {
            // SAFETY: bag `s`'s gradient row holds `d >= c0 + cols` elements
            // of the gradient type (limited to `c0 + cols`).
            let g = unsafe {
                let at = s * a.d + c0 + LANES * k;
                match gbf {
                    true => load8::<true>(a.grad.add(at * 2), w_of(k)),
                    false => load8::<false>(a.grad.add(at * 4), w_of(k)),
                }
            };
            let g = if a.flags & R_MEAN != 0 {
                _mm256_div_ps(g, div)
            } else {
                g
            };
            *st = _mm256_mul_ps(lr, g);
        }
        for e in i..j {
            // SAFETY: entries `e < j <= n` name rows of `d` elements the table
            // holds, touched by this thread only; limited to `c0 + cols`.
            unsafe {
                if c0 == 0 {
                    fetch_run_row(a, ent, e + AHEAD, n);
                }
                let r = (*ent.add(e))[0] as usize;
                for (k, st) in step.iter().enumerate() {
                    let off = r * a.d + c0 + LANES * k;
                    let w = load_w(split, a.hi, a.lo, off, w_of(k));
                    store_w(split, _mm256_sub_ps(w, *st), a.hi, a.lo, off, w_of(k));
                }
            }
        }
    }

    /// [`super::super::RunFn`]: entry `i`'s run in passes of up to 64
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
pub unsafe extern "C" fn bag(_: *const super::BagArgs, _: i64, _: i64, _: *mut u8) {}

/// Never called: no native row kernel is available off x86-64.
#[cfg(not(target_arch = "x86_64"))]
pub unsafe extern "C" fn run(_: *const super::RunArgs, _: *const [i64; 2], _: i64, n: i64) -> i64 {
    n
}
