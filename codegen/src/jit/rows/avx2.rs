//! The AVX2+FMA row kernels: 8 f32 per `ymm`, up to 8 vectors (64 columns)
//! of a row in registers per pass, a partial last one masked (`vmaskmovps`,
//! slow as a store: full vectors use plain moves; the Split-SGD-BF16 halves of
//! a partial vector element by element). bf16 rows (8 per `xmm`) are widened
//! to f32 as they are loaded, bf16 results rounded in the vector and packed to
//! 16 bits (a partial vector's bf16 elements, again, one by one).
//!
//! Entries [`bag`] and [`run`] ([`super::BagFn`], [`super::RunFn`]); the bag
//! loop is [`super::bag`]'s and the update's run loop [`super::update`]'s, on
//! this width's vector operations ([`super::width::Width`], with the f32 and
//! Split-SGD-BF16 weight loads and stores); every inner function is
//! `#[target_feature]` for exactly the features of
//! [`super::RowKernel::Avx2`] (or inlined into one). No multiply-add is
//! fused (the products are rounded before they are added, as the reference
//! does) except an int8 row's dequantization, `fma(q, scale, bias)`, which the
//! reference (`embedding_bag_q8`) defines with one rounding.

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::super::bag::{self, bags_cols};
    use super::super::update::{self, run_cols};
    use super::super::width::Width;
    use super::super::{BagArgs, RunArgs};
    use std::arch::x86_64::*;

    /// Lanes per vector.
    const LANES: usize = 8;

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

    /// The AVX2 vectors of the shared bag and update loops ([`bags_cols`],
    /// [`run_cols`]): a part is a
    /// count of lanes (a partial vector's loads and stores masked or one by
    /// one, a whole one's plain).
    pub(in super::super) struct Avx2;

    impl Width for Avx2 {
        const LANES: usize = LANES;
        type V = __m256;
        type Part = usize;

        #[inline(always)]
        unsafe fn part(n: usize) -> usize {
            n
        }
        #[inline(always)]
        unsafe fn zero() -> __m256 {
            // SAFETY (these six): the trait's contract (AVX).
            unsafe { _mm256_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m256 {
            unsafe { _mm256_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn add(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn sub(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_sub_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn mul(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_mul_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn div(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_div_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn load_u8(p: *const u8, n: usize) -> __m256 {
            // SAFETY: `p` holds `n` bytes; a partial vector's are copied
            // first (no byte-masked load in AVX2).
            unsafe {
                let q = if n == LANES {
                    _mm_loadl_epi64(p.cast())
                } else {
                    let mut b = [0u8; 16];
                    std::ptr::copy_nonoverlapping(p, b.as_mut_ptr(), n);
                    _mm_loadu_si128(b.as_ptr().cast())
                };
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q))
            }
        }
        #[inline(always)]
        unsafe fn load<const BF: bool>(p: *const u8, n: usize) -> __m256 {
            // SAFETY: forwarded.
            unsafe { load8::<BF>(p, n) }
        }
        #[inline(always)]
        unsafe fn store(bf: bool, p: *mut u8, x: __m256, n: usize) {
            // SAFETY: forwarded.
            unsafe { store8(bf, p, x, n) }
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn cols<const NV: usize, const T: u8>(
            a: &BagArgs,
            se: (usize, usize),
            out: *mut u8,
            cc: (usize, usize),
        ) {
            // SAFETY: forwarded; compiled with AVX2+FMA's features.
            unsafe { bags_cols::<Self, NV, T>(a, se, out, cc) }
        }
        #[inline(always)]
        unsafe fn load_w(split: bool, hi: *mut u8, lo: *mut u8, off: usize, p: usize) -> __m256 {
            // SAFETY: forwarded.
            unsafe { load_w(split, hi, lo, off, p) }
        }
        #[inline(always)]
        unsafe fn store_w(split: bool, w: __m256, hi: *mut u8, lo: *mut u8, off: usize, p: usize) {
            // SAFETY: forwarded.
            unsafe { store_w(split, w, hi, lo, off, p) }
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn run_cols<const NV: usize>(
            a: &RunArgs,
            ent: *const [i64; 2],
            run: (usize, usize, usize),
            bag: (usize, f32),
            cc: (usize, usize),
        ) {
            // SAFETY: forwarded; compiled with AVX2+FMA's features.
            unsafe { run_cols::<Self, NV>(a, ent, run, bag, cc) }
        }
    }

    /// [`super::super::BagFn`]: each bag's sum in passes of up to 64 columns
    /// (the first one fetching rows ahead).
    ///
    /// # Safety
    /// [`super::super::BagFn`]'s contract.
    pub unsafe extern "C" fn bag(args: *const BagArgs, s0: i64, s1: i64, out: *mut u8) {
        // SAFETY: forwarded; the caller checked the CPU's features.
        unsafe { bag::bag::<Avx2>(args, s0, s1, out) }
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

    /// [`super::super::RunFn`]: every run, each in passes of up to 64
    /// columns (the first one fetching rows ahead).
    ///
    /// # Safety
    /// [`super::super::RunFn`]'s contract.
    pub unsafe extern "C" fn run(args: *const RunArgs, ent: *const [i64; 2], n: i64) {
        // SAFETY: forwarded; the caller checked the CPU's features.
        unsafe { update::run::<Avx2>(args, ent, n) }
    }
}

#[cfg(target_arch = "x86_64")]
pub use imp::{bag, run};

/// Never called: no native row kernel is available off x86-64.
#[cfg(not(target_arch = "x86_64"))]
pub unsafe extern "C" fn bag(_: *const super::BagArgs, _: i64, _: i64, _: *mut u8) {}

/// Never called: no native row kernel is available off x86-64.
#[cfg(not(target_arch = "x86_64"))]
pub unsafe extern "C" fn run(_: *const super::RunArgs, _: *const [i64; 2], _: i64) {}
