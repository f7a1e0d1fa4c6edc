//! The dot interaction on AVX-512, forward and backward (f32 operands, `dr`,
//! results and gradients): the 512-bit sibling of the Cranelift kernel of
//! [`super::interaction`], whose vectors are 128 bits wide (the x86-64 backend
//! has no wider ones). Chosen at run time ([`available`]) under
//! [`super::KernelChoice::Auto`], `Avx512`, `Avx512Bf16` or `AmxBf16`, like the
//! GEMM micro-kernels (bf16 operands and results are widened and rounded
//! around these kernels by the interaction's driver); under the other
//! choices the Cranelift kernel runs.
//!
//! Per sample, 64 columns at a time (up to four `zmm`, as many as have live
//! columns) and six operands `i` at a time (each partner's loaded columns feed
//! all six):
//! `dT_i = [i == 0] dr[..D] + Σ_k c_ik T_k` over the partners `k` of `i` in
//! ascending order, one FMA per term, with `c_ik` the `dr` entry of the pair
//! `(max, min)` (`2·dr` on the diagonal with self-interaction): the Cranelift
//! kernel's order term for term, so the two agree bit for bit on the columns
//! of its whole f32x4 vectors (its last `D mod 4` columns use a multiply and
//! an add). Columns past a multiple of 16 are masked loads and stores: nothing
//! outside a row is read or written. The coefficients are read where they lie
//! in the sample's `dr` row (no per-sample `F × F` matrix of them: gathering
//! one took a third of the backward's time at 16 columns).
//!
//! The forward ([`forward`](forward())): per sample, `x`, then the dot products in
//! register blocks of 4 operands × 4 partners (16-lane partial sums, each
//! loaded vector feeding four FMAs), the block's 16 sums across lanes at once
//! (a reassociation, as the Cranelift kernel's 4-lane sums are). The next
//! sample's rows are prefetched meanwhile, a few before each block of work
//! ([`Ahead`]): at dlrm-mlperf's 27×128 the operands are 27 streams, more
//! than the hardware prefetchers follow. There
//! (`examples/interaction_best 27 128 2048`, 2026-11-29, AMD EPYC Zen 5 class,
//! 2 threads, interleaved) the blocks and the prefetch took the forward from
//! 2.48-2.52 to 1.38-1.45 ms, and the prefetch the backward from 3.08-3.09
//! to 2.52-2.55 ms (its reads and writes alone take 1.9 ms); spreading the
//! prefetch over the sample's blocks took them on to 0.87 and 1.84 ms. An earlier
//! forward (one operand against 8 partners, a load per FMA) ran at 16% of the
//! FMA peak. Operands of at most 16 columns (dlrm-kaggle's 27×16), where
//! the sums across lanes were most of the work, take [`forward_narrow`](narrow::forward_narrow): the
//! operands transposed in registers once per sample, then each operand's dot
//! products with all its partners as lanes of one or two vectors, summed in
//! column order. bf16 operands, where the CPU has AVX512_BF16, take
//! [`forward_pairs`](forward_pairs()): the same register blocks on `vdpbf16ps` (32 columns an
//! instruction, nothing widened; a bf16 dlrm-mlperf step's forward went from
//! 1.05-1.10 to 0.68-0.72 ms, `dlrm-run --bench`, interleaved, Zen 5 class).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// True if this CPU can run these kernels (AVX-512 F, BW and VL).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// True if this CPU also has AVX512_BF16's pair dot product
/// (`vdpbf16ps`), for [`forward_pairs`](forward_pairs()).
pub fn pairs_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        available() && std::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The shape of one interaction: `f` operands of `d` columns, diagonal pairs
/// kept or not.
#[derive(Clone, Copy, Debug)]
pub struct Dot {
    /// Operands `F` (`x` and the embeddings).
    pub f: usize,
    /// Their width `D`.
    pub d: usize,
    /// Keep the diagonal pairs.
    pub self_interaction: bool,
}

impl Dot {
    /// The result's width: `D` plus one column per kept pair.
    #[inline]
    pub fn width(&self) -> usize {
        dlrm_ir::interaction_width(
            dlrm_ir::InteractionKind::Dot,
            self.self_interaction,
            &vec![self.d; self.f],
        )
    }

    /// The result column of pair `(hi, lo)`, `lo <= hi` (`lo < hi` without
    /// self-interaction): pairs in row-major order after the `D` columns of `x`.
    #[inline]
    fn col(&self, hi: usize, lo: usize) -> usize {
        let before = if self.self_interaction {
            hi * (hi + 1) / 2
        } else {
            hi * hi.saturating_sub(1) / 2
        };
        self.d + before + lo
    }
}

/// The lane mask of the 16 columns from `c` of a `d`-column row.
#[cfg(target_arch = "x86_64")]
#[inline]
fn mask(c: usize, d: usize) -> u16 {
    let n = d.saturating_sub(c).min(16);
    if n == 16 { u16::MAX } else { (1u16 << n) - 1 }
}

/// An operand element type the kernels read as f32 lanes: f32, or bf16
/// widened exactly in registers as it is loaded (no widened copy of the
/// operands). Its methods are inlined into the kernels' `#[target_feature]`
/// functions, which have the features they need (AVX-512 F, BW and VL; AVX2
/// for [`Elem::load8`]).
#[cfg(target_arch = "x86_64")]
pub trait Elem: Copy {
    /// 16 elements at `p` as f32 (lanes outside `m` zero, not read).
    ///
    /// # Safety
    /// The lanes of `m` lie inside an allocation; AVX-512 F, BW and VL.
    unsafe fn load16(p: *const Self, m: __mmask16) -> __m512;

    /// 16 elements at `p` as f32, all of them read: a plain load where
    /// [`Elem::load16`] is a masked one, which the kernels' loops take for
    /// whole vectors (see [`forward`](forward())).
    ///
    /// # Safety
    /// The 16 elements lie inside an allocation; AVX-512 F, BW and VL.
    unsafe fn load16_all(p: *const Self) -> __m512;

    /// 8 elements at `p` as f32 ([`avx2`]'s kernels).
    ///
    /// # Safety
    /// The 8 elements lie inside an allocation; AVX2.
    unsafe fn load8(p: *const Self) -> __m256;

    /// The element at `p` as f32.
    ///
    /// # Safety
    /// `p` is valid for reads.
    unsafe fn get(p: *const Self) -> f32;
}

#[cfg(target_arch = "x86_64")]
impl Elem for f32 {
    #[inline(always)]
    unsafe fn load16(p: *const f32, m: __mmask16) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_maskz_loadu_ps(m, p) }
    }

    #[inline(always)]
    unsafe fn load16_all(p: *const f32) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_loadu_ps(p) }
    }

    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_loadu_ps(p) }
    }

    #[inline(always)]
    unsafe fn get(p: *const f32) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { *p }
    }
}

#[cfg(target_arch = "x86_64")]
impl Elem for half::bf16 {
    #[inline(always)]
    unsafe fn load16(p: *const half::bf16, m: __mmask16) -> __m512 {
        // SAFETY: the caller's contract; a bf16 is the high half of its f32.
        unsafe {
            let h = _mm256_maskz_loadu_epi16(m, p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }

    #[inline(always)]
    unsafe fn load16_all(p: *const half::bf16) -> __m512 {
        // SAFETY: the caller's contract; a bf16 is the high half of its f32.
        unsafe {
            let h = _mm256_loadu_si256(p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }

    #[inline(always)]
    unsafe fn load8(p: *const half::bf16) -> __m256 {
        // SAFETY: the caller's contract; a bf16 is the high half of its f32.
        unsafe {
            let h = _mm_loadu_si128(p.cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }

    #[inline(always)]
    unsafe fn get(p: *const half::bf16) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { (*p).to_f32() }
    }
}

/// Samples ahead of the one computed whose rows are prefetched.
const AHEAD: usize = 1;

/// Samples ahead of the one computed whose operand and gradient rows the
/// backward also fetches into L2 ([`Ahead::with_far`]), where a sample's
/// f32 operand rows hold at least [`FAR_MIN_BYTES`].
const FAR: usize = 4;

/// Bytes of a sample's f32 operand rows (`F·D` elements) from which the
/// backward fetches rows [`FAR`] samples ahead into L2 as well: one sample ahead into
/// L1 cannot hide a miss to memory across so many streams. `examples/
/// interaction_best F D 2048`, 2026-12-01, AMD EPYC Zen 4, 2 threads, f32,
/// interleaved (no far fetch → 4 samples ahead): 27×128 (13.5 KiB a sample,
/// dlrm-mlperf) 4.23-4.29 → 3.10-3.29 ms, 17×128 2.15-2.51 → 1.42, 27×64
/// 1.67-2.06 → 1.45-1.71; below this size 9×128 and 27×16 level, 27×32 one
/// pair each way, 9×64 (dlrm-small, its operands in cache) 0.19-0.20 →
/// 0.22-0.28 ms. 2 and 8 samples ahead measured as 4 at 27×128. In the
/// forward the same fetch measured no gain (stop 67; slower on the Intel
/// Xeon of stop 60).
const FAR_MIN_BYTES: usize = 6 << 10;

/// The prefetch of a later sample's operand rows, spread over the work of
/// the current one: a few rows before each of its `steps` pieces of work
/// ([`Ahead::step`]). All 27 rows asked for at once (216 lines at dlrm-mlperf's
/// 27×128) wait for each other in the core's few miss buffers and stall the
/// loads behind them; spread, they overlap with the arithmetic
/// (`examples/interaction_best 27 128 2048`, 2026-11-29, AMD EPYC Zen 5 class,
/// 2 threads, interleaved: forward 1.14-1.15 to 0.87-0.88 ms).
///
/// The backward fetches the later sample's gradient rows as well
/// ([`Ahead::with_grads`]), each beside its operand's row: 27 rows written a
/// sample, each store a miss to own the line that no hardware prefetcher
/// follows across 27 streams (`interaction_best 27 128 2048`, 2026-12-01, AMD
/// EPYC Zen 4, 2 threads, interleaved: backward 3.86-3.92 to 3.33-3.37 ms;
/// `prefetchw` instead measured the same; non-temporal stores of the gradients
/// without this fetch 3.77-3.87 against its 3.70-3.74, with it 3.48 in one
/// round, not tried in a step, where the gradients are read right after).
struct Ahead<'a, E> {
    ops: &'a [*const E],
    /// The gradient rows (f32) written beside the operands, fetched with
    /// them; empty in the forward.
    grads: &'a [*mut f32],
    /// The sample's first element in each operand, `None` past the last one.
    at: Option<usize>,
    /// Elements of a row, and bytes of an operand's row and of a gradient's.
    d: usize,
    bytes: usize,
    grad_bytes: usize,
    /// Operands asked for so far, and per step.
    next: usize,
    per: usize,
    /// The first element of a later sample whose rows (and gradient rows)
    /// each step also fetches into L2 ([`Ahead::with_far`]).
    far: Option<usize>,
}

impl<'a, E> Ahead<'a, E> {
    /// Sample `s`'s rows of `d` elements (none if `s >= end`) over `steps`.
    #[inline]
    fn new(ops: &'a [*const E], s: usize, end: usize, d: usize, steps: usize) -> Self {
        Ahead {
            ops,
            grads: &[],
            at: (s < end).then(|| s * d),
            d,
            bytes: d * size_of::<E>(),
            grad_bytes: d * size_of::<f32>(),
            next: 0,
            per: ops.len().div_ceil(steps.max(1)),
            far: None,
        }
    }

    /// The same, also fetching sample `s`'s rows into L2 (none if `s >=
    /// end`), each step beside the rows it fetches into L1.
    #[inline]
    fn with_far(self, s: usize, end: usize) -> Self {
        Ahead {
            far: (s < end).then(|| s * self.d),
            ..self
        }
    }

    /// The same, also fetching the sample's rows of `grads` (one per
    /// operand, `d` f32 each), each with its operand's.
    #[inline]
    fn with_grads(self, grads: &'a [*mut f32]) -> Self {
        Ahead { grads, ..self }
    }

    /// Asks for the next few rows (a hint: nothing is read).
    #[inline(always)]
    fn step(&mut self) {
        let Some(at) = self.at else { return };
        self.fetch::<false>(at);
        if let Some(far) = self.far {
            self.fetch::<true>(far);
        }
        self.next += self.per;
    }

    /// This step's operand and gradient rows from element `at` on, into L1
    /// (or with `L2`, into L2 only: [`crate::jit::prefetch::fetch_into`]).
    #[inline(always)]
    fn fetch<const L2: bool>(&self, at: usize) {
        use crate::jit::prefetch::fetch_into;
        for &op in self.ops.iter().skip(self.next).take(self.per) {
            fetch_into::<L2>(op.wrapping_add(at) as *const u8, self.bytes);
        }
        for &g in self.grads.iter().skip(self.next).take(self.per) {
            fetch_into::<L2>(g.wrapping_add(at) as *const u8, self.grad_bytes);
        }
    }
}

/// Most operands these kernels take (the row-pointer array's size).
pub const MAX_F: usize = 64;

#[cfg(target_arch = "x86_64")]
pub mod avx2;
mod backward;
mod forward;
mod narrow;
#[cfg(target_arch = "x86_64")]
pub use backward::backward;
#[cfg(target_arch = "x86_64")]
pub use forward::{forward, forward_pairs, forward_widened};
