//! The native AVX-512 BF16 GEMM micro-kernel: [`super::avx512`]'s 12×32 tile
//! computed with `vdpbf16ps`, the bf16 dot product of CPUs with AVX512_BF16
//! (AMD Zen 4 and later, Intel Cooper Lake and Sapphire Rapids), chosen at run
//! time ([`super::AVX512_BF16`] in the registry) for GEMMs whose `A` and `B`
//! are both bf16 in memory: in the dlrm plans, the forward `brgemm` of a bf16
//! plan (its activations and weights). Registered in JIT modules and called by
//! the JIT loop nest per tile, like the other native kernels.
//!
//! # What it computes
//! One `vdpbf16ps` multiplies two bf16 pairs per f32 lane and adds both
//! products to the lane's accumulator: 32 multiply-adds per `zmm` instruction
//! where `vfmadd231ps` does 16, at the same issue rate on Zen 4 (a loop of
//! either measured 466 against 231 GFLOP/s on this 2-core machine). The products
//! of two bf16 values are exact in f32, so the result is the tile of
//! [`super::avx512`] (`C = act(bias + Σ_kk A(r,kk)·B(kk,j))`) up to the order
//! of the additions: each accumulator takes the k steps two at a time. The
//! instruction treats denormal inputs and results as zero (its DAZ/FTZ), which
//! the FMA kernels do not: values below 1.2e-38 in magnitude. So its results
//! agree with the reference up to float reassociation (and that flush), not
//! bit for bit with the FMA kernels; `auto` picks it deterministically (not by
//! timing) so that a run's numbers do not depend on a timing race.
//!
//! # Operands
//! - `A` is bf16, row-major within each batch-reduce block (`acs = 1`):
//!   `A(r,kk) = a[r·lda + (kk / kb)·a_blk + kk % kb]`, so the two k steps
//!   of a pair are adjacent and one 32-bit broadcast loads them. `kb` is
//!   even unless it covers all of `k` (the pairs never straddle two blocks); an
//!   odd `k` ends with one step, paired with zero.
//! - `B` is packed by [`pack_b_pairs_into`]: per panel of `NR` columns,
//!   `⌈k/2⌉` rows of `NR` 32-bit words, word `(q, j)` holding `B(2q, j)` in its
//!   low half and `B(2q+1, j)` in its high half (zero past `k` and past the
//!   matrix's columns), rows `ldb` words apart.
//! - Bias, relu, `F_ACC`, bf16 `C` and the masked ragged tiles are the AVX-512
//!   kernel's ([`super::avx512::finish`]).
//!
//! Invariants the caller (the JIT loop nest, validated by its Rust wrapper)
//! guarantees: `1 <= mr <= MR`, `1 <= nr <= NR`, the layout above, the
//! pointers cover the documented ranges, and the CPU has the features
//! ([`super::MicroKernel::available`]); other arguments return without a write.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

pub use super::avx512::{MR, NR};
use super::{F_A_BF16, TileArgs};
use half::bf16;
use rayon::prelude::*;

/// Whether a GEMM's `A` layout suits the kernel (module docs): row-major k
/// steps (`acs = 1`) and batch-reduce blocks of an even length, or one block.
pub fn fits(k: usize, acs: usize, kb: usize) -> bool {
    acs == 1 && (kb == 0 || kb >= k || kb.is_multiple_of(2))
}

/// Packs bf16 `B` (`k × n`, element `(kk, j)` at `src[kk·rs + j·cs]`) into
/// `⌈n/nr⌉` panels of `⌈k/2⌉` rows × `nr` words of k pairs (module docs), each
/// word stored as the f32 with its bits, in parallel over panels. `dst` holds
/// exactly that many words; every one is written (padding zero).
pub fn pack_b_pairs_into(
    dst: &mut [f32],
    src: &[bf16],
    (k, n, rs, cs): (usize, usize, usize, usize),
    nr: usize,
) {
    let k2 = k.div_ceil(2);
    assert_eq!(
        dst.len(),
        n.div_ceil(nr) * k2 * nr,
        "pack_b_pairs: destination size"
    );
    if k == 0 || n == 0 {
        return;
    }
    assert!(
        src.len() > (k - 1) * rs + (n - 1) * cs,
        "pack_b_pairs: source too short"
    );
    let at = |kk: usize, j: usize| -> u32 {
        if kk < k {
            u32::from(src[kk * rs + j * cs].to_bits())
        } else {
            0
        }
    };
    dst.par_chunks_mut(k2 * nr)
        .enumerate()
        .for_each(|(p, dst)| {
            let j0 = p * nr;
            let cols = nr.min(n - j0);
            if cs == 1 {
                // Rows of adjacent columns: two slices a pair, a loop LLVM
                // vectorises.
                let row_of = |kk: usize| (kk < k).then(|| &src[kk * rs + j0..kk * rs + j0 + cols]);
                for (q, row) in dst.chunks_exact_mut(nr).enumerate() {
                    let (out, pad) = row.split_at_mut(cols);
                    match (row_of(2 * q), row_of(2 * q + 1)) {
                        (Some(lo), Some(hi)) => {
                            for ((w, l), h) in out.iter_mut().zip(lo).zip(hi) {
                                *w = f32::from_bits(
                                    u32::from(l.to_bits()) | u32::from(h.to_bits()) << 16,
                                );
                            }
                        }
                        (Some(lo), None) => {
                            for (w, l) in out.iter_mut().zip(lo) {
                                *w = f32::from_bits(u32::from(l.to_bits()));
                            }
                        }
                        _ => out.fill(0.0),
                    }
                    pad.fill(0.0);
                }
                return;
            }
            for (q, row) in dst.chunks_exact_mut(nr).enumerate() {
                for (jj, w) in row.iter_mut().enumerate() {
                    let bits = if jj < cols {
                        at(2 * q, j0 + jj) | (at(2 * q + 1, j0 + jj) << 16)
                    } else {
                        0
                    };
                    *w = f32::from_bits(bits);
                }
            }
        });
}

/// The micro-kernel entry ([`super::UkernelFn`]; `b` and `ldb` in 32-bit
/// words of k pairs; see the module docs).
///
/// # Safety
/// `t` points to a [`TileArgs`] where, for `r < mr`, `kk < k`: `A(r,kk)`
/// (module docs) is readable at `a + 2·index`; `b` covers `NR` words at
/// `b + q·ldb` for every pair `q < ⌈k/2⌉`; `bias` covers `NR` f32 when
/// [`super::F_BIAS`] is set; `c` covers the `mr × nr` tile with row stride
/// `ldc` elements (readable too with [`super::F_ACC`]); the CPU has the
/// kernel's features ([`super::MicroKernel::available`]). Arguments outside the
/// module docs' layout (`acs != 1`, an odd `kb < k`, `mr` or `nr` out of range,
/// `A` not flagged bf16) return without a write.
#[cfg(target_arch = "x86_64")]
pub unsafe extern "C" fn ukernel(t: *const TileArgs) {
    // SAFETY: the caller's contract: `t` points to the call's arguments.
    let t = unsafe { TileArgs::read(t) };
    let (k, mr, nr, kb) = (t.k, t.mr, t.nr, t.kb);
    if nr == 0 || nr > NR || kb == 0 || t.flags & F_A_BF16 == 0 || !fits(k, t.acs, kb) {
        return;
    }
    // `b` and `ldb` in words of k pairs, `kb <= k`.
    let t = TileArgs {
        kb: kb.min(k.max(1)),
        ..t
    };
    // SAFETY: forwarded contract (see above); `tile` reads and writes exactly the
    // documented ranges.
    unsafe {
        macro_rules! go {
            ($($r:literal)*) => {
                // A tile at most 16 columns wide: one vector per row.
                match (mr, nr <= 16) {
                    $(($r, true) => tile::<$r, 1>(&t),
                    ($r, false) => tile::<$r, 2>(&t),)*
                    _ => {}
                }
            };
        }
        go!(1 2 3 4 5 6 7 8 9 10 11 12);
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub use super::unsupported as ukernel;

/// 32 bf16 as the dot product's operand type.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn bh(v: __m512i) -> __m512bh {
    // SAFETY: both are 64 bytes of plain SIMD data; every bit pattern is valid.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// k steps of `A` staged at a time when its row stride is not one of the
/// blocked widths (even: the pairs stay whole).
const KC: usize = 64;

/// Copies `n <= KC` bf16 k steps of each of the `R` rows of an `A` tile (row
/// stride `lda` elements, from `pa`) into `scratch` as rows of `KC` elements.
///
/// # Safety
/// Every element `pa[r·lda + kk]`, `r < R`, `kk < n`, is readable; `R <= MR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn stage<const R: usize>(
    pa: *const u8,
    lda: usize,
    n: usize,
    scratch: &mut [std::mem::MaybeUninit<u16>; MR * KC],
) {
    let s = scratch.as_mut_ptr().cast::<u16>();
    // SAFETY: masked loads read only the tile's `n` elements of each row; the
    // masked stores stay inside row `r` of `scratch` (`KC` elements, `n <= KC`).
    unsafe {
        for r in 0..R {
            let row = pa.add(2 * r * lda).cast::<u16>();
            let mut j = 0;
            while j < n {
                let cnt = (n - j).min(32);
                let m = if cnt == 32 {
                    u32::MAX
                } else {
                    (1u32 << cnt) - 1
                };
                let v = _mm512_maskz_loadu_epi16(m, row.add(j).cast());
                _mm512_mask_storeu_epi16(s.add(r * KC + j).cast(), m, v);
                j += 32;
            }
        }
    }
}

/// One tile of `R` rows of `W` vectors (`W = 1` when `nr <= 16`, else 2).
///
/// # Safety
/// [`ukernel`]'s contract with `mr = R` and `fits(k, 1, kb)`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")]
unsafe fn tile<const R: usize, const W: usize>(t: &TileArgs) {
    let TileArgs {
        a,
        b,
        c,
        bias,
        k,
        lda,
        ldc,
        nr,
        flags,
        ldb,
        kb: kb_len,
        a_blk,
        ..
    } = *t;
    let b = b.cast::<u32>();
    // SAFETY: the caller's contract: the C tile (masked to `nr` lanes), every
    // `A(r,kk)` (a pair's 32-bit load reads two steps of one row and one block;
    // an odd last step is read alone), the `B` pair rows and the bias row are
    // accessible as documented.
    unsafe {
        let mut acc = super::avx512::acc_start::<R, W>(c, ldc, nr, flags);
        super::avx512::prefetch_mask::<R>(t);
        // `pairs` k pairs from `pa` (a row's steps adjacent, rows `$lda`
        // bytes apart: a constant in each loop) and `pb` (`ldb` words a row),
        // then the odd last step when `odd`. A macro, so that each row stride
        // gets its own loop with it folded into the addresses.
        macro_rules! kloop {
            ($pa:expr, $lda:expr, $pb:expr, $pairs:expr, $odd:expr) => {{
                let lda: usize = $lda;
                // One pair of k steps (or, `single`, one step paired with zero,
                // as `B`'s padding): W B vectors, R broadcasts, W·R dot products.
                let step =
                    |acc: &mut [[__m512; W]; R], pa: *const u8, pb: *const u32, single: bool| {
                        let b0: __m512bh = bh(_mm512_loadu_si512(pb.cast()));
                        let b1: __m512bh = if W > 1 {
                            bh(_mm512_loadu_si512(pb.add(16).cast()))
                        } else {
                            b0
                        };
                        // Index loops (see the AVX-512 kernel: iterator adaptors
                        // kept the accumulators in memory).
                        #[allow(clippy::needless_range_loop)]
                        for r in 0..R {
                            let p = pa.add(r * lda);
                            let v = if single {
                                i32::from(p.cast::<u16>().read_unaligned())
                            } else {
                                p.cast::<i32>().read_unaligned()
                            };
                            let x: __m512bh = bh(_mm512_set1_epi32(v));
                            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
                            if W > 1 {
                                acc[r][W - 1] = _mm512_dpbf16_ps(acc[r][W - 1], x, b1);
                            }
                        }
                    };
                let mut pa: *const u8 = $pa;
                let mut pb: *const u32 = $pb;
                // Unrolled by 2.
                for _ in 0..$pairs / 2 {
                    step(&mut acc, pa, pb, false);
                    step(&mut acc, pa.add(4), pb.add(ldb), false);
                    pa = pa.wrapping_add(8);
                    pb = pb.wrapping_add(2 * ldb);
                }
                if $pairs % 2 == 1 {
                    step(&mut acc, pa, pb, false);
                    pa = pa.wrapping_add(4);
                    pb = pb.wrapping_add(ldb);
                }
                if $odd {
                    step(&mut acc, pa, pb, true);
                    pb = pb.wrapping_add(ldb);
                }
                pb
            }};
        }
        // Written before read (see `stage`), never read beyond what was written.
        let mut scratch = [std::mem::MaybeUninit::<u16>::uninit(); MR * KC];
        let mut kk = 0;
        let mut pa = a;
        let mut pb = b;
        // The batch-reduce blocks: `A` jumps by `a_blk` elements, `B` runs on.
        while kk < k {
            let len = kb_len.min(k - kk);
            let (pairs, odd) = (len / 2, len % 2 == 1);
            pb = match lda {
                32 => kloop!(pa, 64, pb, pairs, odd),
                64 => kloop!(pa, 128, pb, pairs, odd),
                96 => kloop!(pa, 192, pb, pairs, odd),
                128 => kloop!(pa, 256, pb, pairs, odd),
                160 => kloop!(pa, 320, pb, pairs, odd),
                192 => kloop!(pa, 384, pb, pairs, odd),
                _ => {
                    // Another row stride (the blocked layouts' widths, those of
                    // `block_for`, are above): staged, KC steps at a time, into
                    // rows of KC elements, so that the loop's stride is a
                    // constant (a run-time stride measured 161 against 210
                    // GFLOP/s in `examples/ukernel_best`).
                    let mut done = 0;
                    while done < len {
                        let n = KC.min(len - done);
                        stage::<R>(pa.add(2 * done), lda, n, &mut scratch);
                        let sp = scratch.as_ptr().cast::<u8>();
                        pb = kloop!(sp, 2 * KC, pb, n / 2, n % 2 == 1);
                        done += n;
                    }
                    pb
                }
            };
            kk += len;
            pa = pa.wrapping_add(a_blk * 2);
        }
        super::avx512::finish::<R, W, true>(acc, c, ldc, nr, (bias, t.mask), flags);
    }
}
