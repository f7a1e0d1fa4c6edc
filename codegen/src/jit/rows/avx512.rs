//! The AVX-512 (F, BW, VL) row kernels: 16 f32 per `zmm`, up to 8 vectors
//! (128 columns) of a row in registers per pass, the last one masked. bf16
//! rows (16 per `ymm`) are widened to f32 as they are loaded; bf16 results
//! are rounded in the vector before a narrowing store (`vpmovdw`). The
//! update of a Split-SGD-BF16 table goes 32 columns at a time: full-width
//! loads and stores of its two bf16 halves, joined and split again by
//! interleaving and packing (no widening load or narrowing store per 16).
//!
//! Entries [`bag`] and [`run`] ([`super::BagFn`], [`super::RunFn`]); the bag
//! loop is [`super::bag`]'s and the update's run loop [`super::update`]'s, on
//! this width's vector operations ([`super::width::Width`]), but for the
//! Split-SGD-BF16 passes, this width's own ([`super::width::Width::own_pass`]);
//! every inner function is `#[target_feature]` for exactly the features of
//! [`super::RowKernel::Avx512`] (or inlined into one).

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::super::bag::{self, bags_cols};
    use super::super::update::{self, run_cols};
    use super::super::width::Width;
    use super::super::{BagArgs, FAR, R_GRAD_BF16, R_MEAN, R_SPLIT, RunArgs, fetch_run_row};
    use std::arch::x86_64::*;

    /// Lanes per vector.
    const LANES: usize = 16;

    /// The mask of the first `n` lanes (`n <= 16`).
    #[inline(always)]
    fn mask(n: usize) -> __mmask16 {
        ((1u32 << n) - 1) as __mmask16
    }

    /// 16 elements (the mask `m`'s, the others 0) at `p` as f32: bf16 (`BF`)
    /// widened exactly, else f32.
    ///
    /// # Safety
    /// `p` holds the masked elements.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn load16<const BF: bool>(p: *const u8, m: __mmask16) -> __m512 {
        // SAFETY: forwarded (masked lanes are not read).
        unsafe {
            if BF {
                let h = _mm256_maskz_loadu_epi16(m, p.cast());
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
            } else {
                _mm512_maskz_loadu_ps(m, p.cast())
            }
        }
    }

    /// The bf16 bit patterns (in the low halves of the lanes) of `x` rounded
    /// to nearest even, NaN kept a quiet NaN: `half::bf16::from_f32`'s rule.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn bf16_bits(x: __m512) -> __m512i {
        let bits = _mm512_castps_si512(x);
        let hi = _mm512_srli_epi32::<16>(bits);
        let lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
        let t = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lsb);
        let quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_mask_blend_epi32(nan, _mm512_srli_epi32::<16>(t), quiet)
    }

    /// Stores the mask `m`'s lanes of `x` at `p`: rounded to bf16 (`bf`), else
    /// f32.
    ///
    /// # Safety
    /// `p` holds the masked elements.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn store16(bf: bool, p: *mut u8, x: __m512, m: __mmask16) {
        // SAFETY: forwarded (masked lanes are not written).
        unsafe {
            if bf {
                _mm512_mask_cvtepi32_storeu_epi16(p.cast(), m, bf16_bits(x));
            } else {
                _mm512_mask_storeu_ps(p.cast(), m, x);
            }
        }
    }

    /// The AVX-512 vectors of the shared bag and update loops ([`bags_cols`],
    /// [`run_cols`]).
    pub(in super::super) struct Avx512;

    impl Width for Avx512 {
        const LANES: usize = LANES;
        type V = __m512;
        type Part = __mmask16;

        #[inline(always)]
        unsafe fn part(n: usize) -> __mmask16 {
            mask(n)
        }
        #[inline(always)]
        unsafe fn zero() -> __m512 {
            // SAFETY (these six): the trait's contract (AVX-512 F).
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m512 {
            unsafe { _mm512_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn add(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn sub(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_sub_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn mul(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_mul_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn div(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_div_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn load_u8(p: *const u8, m: __mmask16) -> __m512 {
            // SAFETY: the masked bytes are the caller's (others not read).
            unsafe { _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, p.cast()))) }
        }
        #[inline(always)]
        unsafe fn load<const BF: bool>(p: *const u8, m: __mmask16) -> __m512 {
            // SAFETY: forwarded.
            unsafe { load16::<BF>(p, m) }
        }
        #[inline(always)]
        unsafe fn store(bf: bool, p: *mut u8, x: __m512, m: __mmask16) {
            // SAFETY: forwarded.
            unsafe { store16(bf, p, x, m) }
        }
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn cols<const NV: usize, const T: u8>(
            a: &BagArgs,
            se: (usize, usize),
            out: *mut u8,
            cc: (usize, usize),
        ) {
            // SAFETY: forwarded; compiled with AVX-512's features.
            unsafe { bags_cols::<Self, NV, T>(a, se, out, cc) }
        }
        #[inline(always)]
        unsafe fn load_w(
            split: bool,
            hi: *mut u8,
            lo: *mut u8,
            off: usize,
            p: __mmask16,
        ) -> __m512 {
            // SAFETY: forwarded.
            unsafe { load_w(split, hi, lo, off, p) }
        }
        #[inline(always)]
        unsafe fn store_w(
            split: bool,
            w: __m512,
            hi: *mut u8,
            lo: *mut u8,
            off: usize,
            p: __mmask16,
        ) {
            // SAFETY: forwarded.
            unsafe { store_w(split, w, hi, lo, off, p) }
        }
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn run_cols<const NV: usize>(
            a: &RunArgs,
            ent: *const [i64; 2],
            run: (usize, usize, usize),
            bag: (usize, f32),
            cc: (usize, usize),
        ) {
            // SAFETY: forwarded; compiled with AVX-512's features.
            unsafe { run_cols::<Self, NV>(a, ent, run, bag, cc) }
        }
        /// A Split-SGD-BF16 table's pass: [`run_split_cols`], 32 columns a
        /// step.
        #[inline(always)]
        unsafe fn own_pass(
            a: &RunArgs,
            ent: *const [i64; 2],
            run: (usize, usize, usize),
            bag: (usize, f32),
            cc: (usize, usize),
        ) -> bool {
            if a.flags & R_SPLIT == 0 {
                return false;
            }
            // SAFETY: forwarded; `cc.1 <= 128` columns; the caller checked
            // the CPU's features.
            unsafe {
                match cc.1.div_ceil(2 * LANES) {
                    1 => run_split_cols::<1>(a, ent, run, bag, cc),
                    2 => run_split_cols::<2>(a, ent, run, bag, cc),
                    3 => run_split_cols::<3>(a, ent, run, bag, cc),
                    _ => run_split_cols::<4>(a, ent, run, bag, cc),
                }
            }
            true
        }
    }

    /// [`super::super::BagFn`]: each bag's sum in passes of up to 128 columns
    /// (the first one fetching rows ahead).
    ///
    /// # Safety
    /// [`super::super::BagFn`]'s contract.
    pub unsafe extern "C" fn bag(args: *const BagArgs, s0: i64, s1: i64, out: *mut u8) {
        // SAFETY: forwarded; the caller checked the CPU's features.
        unsafe { bag::bag::<Avx512>(args, s0, s1, out) }
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

    /// The mask of the first `n` 16-bit lanes of a `zmm` (`n <= 32`).
    #[inline(always)]
    fn mask32(n: usize) -> __mmask32 {
        if n >= 32 { !0 } else { (1u32 << n) - 1 }
    }

    /// Columns `c0..c0+cols` (`NW = ⌈cols/32⌉` pairs of vectors) of a run
    /// `i..j` of bag `s` on a Split-SGD-BF16 table, 32 columns per step: one
    /// full-width load of 32 high and of 32 low halves, joined into two f32
    /// vectors by interleaving (`vpunpck{l,h}wd`: lane `q` of the first holds
    /// column `8⌊q/4⌋ + q mod 4`, of the second that plus 4), `w - step` with
    /// the step permuted once per run into the same column order, and split
    /// back by narrowing (`vpackusdw` of the high and of the low 16 bits of
    /// each lane: exact, as both are below 2^16) into the original order. The
    /// same float operations per column as [`run_cols`].
    ///
    /// # Safety
    /// [`super::super::RunFn`]'s contract; `c0 + cols <= d`; the table is
    /// Split-SGD-BF16.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn run_split_cols<const NW: usize>(
        a: &RunArgs,
        ent: *const [i64; 2],
        (i, j, n): (usize, usize, usize),
        (s, size): (usize, f32),
        (c0, cols): (usize, usize),
    ) {
        let m = |w: usize| mask32(cols.saturating_sub(32 * w));
        let lr = _mm512_set1_ps(a.lr);
        let div = _mm512_set1_ps(size);
        let gbf = a.flags & R_GRAD_BF16 != 0;
        // Column `c` of a 32-column step sits in lane `c mod 16` of its half
        // `c / 16`; `permutex2var` picks by `c` itself.
        let lo_cols = _mm512_set_epi32(27, 26, 25, 24, 19, 18, 17, 16, 11, 10, 9, 8, 3, 2, 1, 0);
        let hi_cols = _mm512_add_epi32(lo_cols, _mm512_set1_epi32(4));
        let mut step = [[_mm512_setzero_ps(); 2]; NW];
        for (w, st) in step.iter_mut().enumerate() {
            let mut half = [_mm512_setzero_ps(); 2];
            for (h, x) in half.iter_mut().enumerate() {
                let mh = (m(w) >> (16 * h)) as __mmask16;
                // SAFETY: bag `s`'s gradient row holds `d >= c0 + cols`
                // elements of the gradient type (masked to `c0 + cols`).
                let g = unsafe {
                    let at = s * a.d + c0 + 32 * w + LANES * h;
                    match gbf {
                        true => load16::<true>(a.grad.add(at * 2), mh),
                        false => load16::<false>(a.grad.add(at * 4), mh),
                    }
                };
                let g = if a.flags & R_MEAN != 0 {
                    _mm512_div_ps(g, div)
                } else {
                    g
                };
                *x = _mm512_mul_ps(lr, g);
            }
            st[0] = _mm512_permutex2var_ps(half[0], lo_cols, half[1]);
            st[1] = _mm512_permutex2var_ps(half[0], hi_cols, half[1]);
        }
        let low = _mm512_set1_epi32(0xFFFF);
        let ahead = a.ahead;
        for e in i..j {
            // SAFETY: entries `e < j <= n` name rows of `d` elements the table
            // holds (both halves), touched by this thread only; masked to
            // `c0 + cols`.
            unsafe {
                if c0 == 0 {
                    fetch_run_row::<true>(a, ent, e + FAR * ahead, n);
                    fetch_run_row::<false>(a, ent, e + ahead, n);
                }
                let r = (*ent.add(e))[0] as usize;
                for (w, st) in step.iter().enumerate() {
                    let off = r * a.d + c0 + 32 * w;
                    let (hp, lp) = (a.hi.cast::<u16>().add(off), a.lo.cast::<u16>().add(off));
                    let h = _mm512_maskz_loadu_epi16(m(w), hp.cast());
                    let l = _mm512_maskz_loadu_epi16(m(w), lp.cast());
                    let x0 = _mm512_castsi512_ps(_mm512_unpacklo_epi16(l, h));
                    let x1 = _mm512_castsi512_ps(_mm512_unpackhi_epi16(l, h));
                    let y0 = _mm512_castps_si512(_mm512_sub_ps(x0, st[0]));
                    let y1 = _mm512_castps_si512(_mm512_sub_ps(x1, st[1]));
                    let h = _mm512_packus_epi32(
                        _mm512_srli_epi32::<16>(y0),
                        _mm512_srli_epi32::<16>(y1),
                    );
                    let l =
                        _mm512_packus_epi32(_mm512_and_si512(y0, low), _mm512_and_si512(y1, low));
                    _mm512_mask_storeu_epi16(hp.cast(), m(w), h);
                    _mm512_mask_storeu_epi16(lp.cast(), m(w), l);
                }
            }
        }
    }

    /// [`super::super::RunFn`]: every run, each in passes of up to 128
    /// columns (the first one fetching rows ahead).
    ///
    /// # Safety
    /// [`super::super::RunFn`]'s contract.
    pub unsafe extern "C" fn run(args: *const RunArgs, ent: *const [i64; 2], n: i64) {
        // SAFETY: forwarded; the caller checked the CPU's features.
        unsafe { update::run::<Avx512>(args, ent, n) }
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
