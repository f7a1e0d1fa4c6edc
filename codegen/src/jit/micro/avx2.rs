//! The native AVX2+FMA GEMM micro-kernel ([`super::AVX2`] in the registry), called
//! by JIT-compiled loop nests through a symbol registered in the JIT module.
//!
//! Cranelift's x86-64 backend has 128-bit vectors only, which caps a pure-Cranelift
//! GEMM at half of the machine's FMA throughput. This kernel computes one
//! [`MR`]`×`[`NR`] tile of `C = epilogue(A · Bp)` with 256-bit registers
//! (12 `ymm` accumulators, 2 for the B row, 1 broadcast), which the JIT loop nest
//! (cache blocking, panel loop, ragged edges) calls for its inner blocks.
//!
//! Tile semantics (identical to the Cranelift micro-kernel, bit for bit: both sum
//! `k` in order with one fused multiply-add per term):
//! `C[r][j] = act(bias[j] + Σ_kk A(r, kk) · B[kk·ldb + j])` for `r < mr`, `j < nr`,
//! where `A(r, kk) = a[r·lda + (kk / kb)·a_blk + (kk % kb)·acs]` (the batch-reduce
//! form: `A` is a sequence of blocks of `kb` reduction steps, `a_blk` elements
//! apart; `kb = k` is a plain strided `A`), f32 or bf16 (widened exactly); `B` rows
//! are `ldb` f32 apart with `NR` readable columns each (a zero-padded packed panel,
//! or the weights in place), lanes `>= nr` never reach `C`; `bias` `NR` f32 (or
//! absent); `act` none or relu (`x > 0 || x is NaN ? x : 0`); the accumulators start at 0, or
//! at the tile's `C` values with [`F_ACC`] (bf16 widened exactly; so a loop nest may
//! split `k` into chunks and get the one-pass result bit for bit); `C` stored as f32 or bf16
//! (round to nearest even, NaN kept NaN) with row stride `ldc` elements. Nothing
//! outside the `mr×nr` tile is read from `A` or written to `C`.
//!
//! Invariants the caller (the JIT loop nest, itself validated by its Rust wrapper)
//! guarantees: `1 <= mr <= MR`, `1 <= nr <= NR`, the pointers cover the tile, and
//! the CPU has AVX2 and FMA ([`super::MicroKernel::available`]) — the symbol is
//! registered only then.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{F_A_BF16, F_ACC, F_BIAS, F_C_BF16, F_RELU, TileArgs};

/// Rows of a native tile.
pub const MR: usize = 6;
/// Columns of a native tile (and of a packed B panel for native kernels).
pub const NR: usize = 16;

/// The micro-kernel entry ([`super::UkernelFn`]; see the module docs for the
/// tile semantics).
///
/// # Safety
/// `t` points to a [`TileArgs`] where: `a` covers every `A(r, kk)` above for
/// `r < mr`, `kk < k`, `b` covers `(k-1)·ldb + NR` f32, `bias` covers `NR` f32
/// when `F_BIAS` is set, `c` covers the `mr × nr` tile with row stride `ldc`
/// (readable too when `F_ACC` is set); `1 <= mr <= MR`, `1 <= nr <= NR`, `kb >= 1`; the
/// CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
pub unsafe extern "C" fn ukernel(t: *const TileArgs) {
    // SAFETY: the caller's contract: `t` points to the call's arguments.
    let TileArgs {
        a,
        b,
        c,
        bias,
        k,
        lda,
        acs,
        ldc,
        ldb,
        kb,
        a_blk,
        mr,
        nr,
        flags,
        // F_MASK is not taken here (`Micro::masks`).
        mask: _,
    } = unsafe { TileArgs::read(t) };
    let g = Geom {
        k,
        lda,
        acs,
        ldc,
        nr,
        flags,
        ldb,
        kb: kb.max(1),
        a_blk,
    };
    // SAFETY: forwarded contract (see above); `tile` reads and writes exactly the
    // documented ranges.
    unsafe {
        macro_rules! go {
            ($r:literal) => {
                if flags & F_A_BF16 != 0 {
                    tile::<$r, true>(a, b, c, bias, &g)
                } else {
                    tile::<$r, false>(a, b, c, bias, &g)
                }
            };
        }
        match mr {
            6 => go!(6),
            5 => go!(5),
            4 => go!(4),
            3 => go!(3),
            2 => go!(2),
            1 => go!(1),
            _ => {}
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub use super::unsupported as ukernel;

/// A tile's geometry and flags (the scalar fields of [`TileArgs`]).
struct Geom {
    k: usize,
    lda: usize,
    acs: usize,
    ldc: usize,
    nr: usize,
    flags: u32,
    ldb: usize,
    kb: usize,
    a_blk: usize,
}

/// One tile of `R` rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const R: usize, const ABF: bool>(
    a: *const u8,
    b: *const f32,
    c: *mut u8,
    bias: *const f32,
    g: &Geom,
) {
    let esize = if ABF { 2 } else { 4 };
    let (lda, ldc, nr, flags, ldb) = (g.lda, g.ldc, g.nr, g.flags, g.ldb);
    // SAFETY: the caller's contract: every A element `r < R, kk < k`, every
    // `B[kk][0..NR]`, the bias row and (with F_ACC) the C tile are readable.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        if flags & F_ACC != 0 {
            for (r, accr) in acc.iter_mut().enumerate() {
                let mut tmp = [0f32; NR];
                if flags & F_C_BF16 != 0 {
                    // bf16 `C`: widened exactly.
                    let row = c.add(r * ldc * 2).cast::<u16>();
                    for (j, t) in tmp.iter_mut().enumerate().take(nr) {
                        *t = f32::from_bits(u32::from(row.add(j).read_unaligned()) << 16);
                    }
                } else {
                    let row = c.add(r * ldc * 4).cast::<f32>();
                    std::ptr::copy_nonoverlapping(row, tmp.as_mut_ptr(), nr);
                }
                accr[0] = _mm256_loadu_ps(tmp.as_ptr());
                accr[1] = _mm256_loadu_ps(tmp.as_ptr().add(8));
            }
        }
        let step = g.acs * esize;
        // One k step: two B vectors, R broadcasts, 2R FMAs.
        let kstep = |acc: &mut [[__m256; 2]; R], pa: *const u8, pb: *const f32| {
            let b0 = _mm256_loadu_ps(pb);
            let b1 = _mm256_loadu_ps(pb.add(8));
            for (r, accr) in acc.iter_mut().enumerate() {
                let p = pa.add(r * lda * esize);
                let av = if ABF {
                    let bits = u32::from(p.cast::<u16>().read_unaligned()) << 16;
                    _mm256_set1_ps(f32::from_bits(bits))
                } else {
                    _mm256_set1_ps(p.cast::<f32>().read_unaligned())
                };
                accr[0] = _mm256_fmadd_ps(av, b0, accr[0]);
                accr[1] = _mm256_fmadd_ps(av, b1, accr[1]);
            }
        };
        // Batch-reduce: the blocks of A in order, `kb` steps each (the last may be
        // shorter); B runs on row by row.
        let mut pb = b;
        let mut done = 0;
        let mut blk_a = a;
        while done < g.k {
            let len = g.kb.min(g.k - done);
            let mut pa = blk_a;
            // Unrolled by 4: the loop overhead would otherwise hold the front end
            // at its 4-uop limit.
            for _ in 0..len / 4 {
                kstep(&mut acc, pa, pb);
                kstep(&mut acc, pa.add(step), pb.add(ldb));
                kstep(&mut acc, pa.add(2 * step), pb.add(2 * ldb));
                kstep(&mut acc, pa.add(3 * step), pb.add(3 * ldb));
                pa = pa.add(4 * step);
                pb = pb.add(4 * ldb);
            }
            for _ in 0..len % 4 {
                kstep(&mut acc, pa, pb);
                pa = pa.add(step);
                pb = pb.add(ldb);
            }
            done += len;
            blk_a = blk_a.add(g.a_blk * esize);
        }
        if flags & F_BIAS != 0 {
            let bb0 = _mm256_loadu_ps(bias);
            let bb1 = _mm256_loadu_ps(bias.add(8));
            for accr in acc.iter_mut() {
                accr[0] = _mm256_add_ps(accr[0], bb0);
                accr[1] = _mm256_add_ps(accr[1], bb1);
            }
        }
        if flags & F_RELU != 0 {
            // maxps(x, 0) returns its second operand when x is NaN or ±0: `x > 0 ?
            // x : +0`; then NaN is put back (the interpreter keeps it).
            let z = _mm256_setzero_ps();
            let relu = |x: __m256| {
                let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
                _mm256_blendv_ps(_mm256_max_ps(x, z), x, nan)
            };
            for accr in acc.iter_mut() {
                accr[0] = relu(accr[0]);
                accr[1] = relu(accr[1]);
            }
        }
        for (r, accr) in acc.iter().enumerate() {
            if flags & F_C_BF16 != 0 {
                let row = c.add(r * ldc * 2).cast::<u16>();
                let packed = to_bf16x16(accr[0], accr[1]);
                if nr == NR {
                    _mm256_storeu_si256(row.cast::<__m256i>(), packed);
                } else {
                    let mut tmp = [0u16; NR];
                    _mm256_storeu_si256(tmp.as_mut_ptr().cast::<__m256i>(), packed);
                    std::ptr::copy_nonoverlapping(tmp.as_ptr(), row, nr);
                }
            } else {
                let row = c.add(r * ldc * 4).cast::<f32>();
                if nr == NR {
                    _mm256_storeu_ps(row, accr[0]);
                    _mm256_storeu_ps(row.add(8), accr[1]);
                } else {
                    let mut tmp = [0f32; NR];
                    _mm256_storeu_ps(tmp.as_mut_ptr(), accr[0]);
                    _mm256_storeu_ps(tmp.as_mut_ptr().add(8), accr[1]);
                    std::ptr::copy_nonoverlapping(tmp.as_ptr(), row, nr);
                }
            }
        }
    }
}

/// 16 f32 (two vectors) rounded to bf16, nearest even, NaN kept NaN (quiet bit
/// set, as `half::bf16::from_f32`), in order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn to_bf16x16(lo: __m256, hi: __m256) -> __m256i {
    let round = |x: __m256| {
        let bits = _mm256_castps_si256(x);
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
        let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(
            _mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)),
            lsb,
        ));
        let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
        let quiet = _mm256_or_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(0x40));
        _mm256_blendv_epi8(rounded, quiet, nan)
    };
    // packus works per 128-bit lane: [lo0..3, hi0..3, lo4..7, hi4..7]; reorder.
    let packed = _mm256_packus_epi32(round(lo), round(hi));
    _mm256_permute4x64_epi64::<0b11_01_10_00>(packed)
}
