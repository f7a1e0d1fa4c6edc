//! The native AMX-BF16 GEMM micro-kernel ([`super::AMX_BF16`] in the registry):
//! a 32×32 tile computed with `tdpbf16ps`, the tile matrix multiply of CPUs
//! with AMX (Intel Sapphire Rapids and later), for GEMMs whose `A` and `B` are
//! both bf16 in memory. It reads `B` packed in k pairs exactly as
//! [`super::avx512bf16`] does ([`super::BPacking::KPairs`]), so the two share
//! their packing, their layout rule ([`super::avx512bf16::fits`]) and their
//! callers.
//!
//! # What it computes
//! The tile is four 16×16 f32 accumulator tiles (`tmm0..tmm3`: rows 0–15 and
//! 16–31, columns 0–15 and 16–31); per 32 k steps it loads two `A` tiles of 16
//! rows × 32 bf16 (`tmm4`, `tmm5`) and two `B` tiles of 16 k-pair rows × 16
//! columns (`tmm6`, `tmm7`: one `B` tile row is 16 words of the packed panel,
//! whose rows are `ldb` words apart) and issues four `tdpbf16ps`, each
//! 16·16·32 multiply-adds. Every configured tile is 16 rows × 64 bytes, so
//! one tile configuration (palette 1) serves every call; it is loaded once
//! per thread (`ldtilecfg`, then a thread-local flag) and stays loaded: no
//! other code of the process uses the tile registers.
//!
//! The products of two bf16 are exact in f32; the instruction adds them into
//! f32 accumulators in its own order, treats denormal inputs as zero and
//! flushes denormal results (Intel's description of `TDPBF16PS`; it reads and
//! writes no MXCSR state), as `vdpbf16ps` does. Its sums matched neither a
//! sequential `mul_add` in k order nor the pairwise sums bit for bit on this
//! CPU (about 10% of 51,200 random sums differed from each in the last bit),
//! so the results agree with the reference up to float reassociation, as
//! [`super::avx512bf16`]'s do.
//!
//! # Paths
//! - Fast: a full 32-row tile whose 32-step chunk of `k` lies inside one
//!   batch-reduce block (one block, or blocks of a multiple of 32 steps):
//!   `A` is loaded straight from memory (row stride `2·lda` bytes) and `B`
//!   from the packed panel.
//! - Otherwise (fewer rows, the last chunk of a `k` that is not a multiple of
//!   32, an odd `k`, blocks of another even length) the chunk's `A` rows are
//!   copied into a zero-padded 32×32 bf16 scratch, and the last chunk's `B`
//!   rows (the `⌈k/2⌉ mod 16` pair rows left) into a zero-padded 16-row
//!   scratch: nothing outside the tile of `A` or past `B`'s `⌈k/2⌉` rows is
//!   read.
//!
//! `C` is stored from the tiles to a 32×32 f32 scratch, and the epilogue
//! (bias, relu, the f32 or bf16 store of the `mr × nr` tile) is the AVX-512
//! kernel's ([`super::avx512::finish`]), one row at a time; with
//! [`super::F_ACC`] the accumulator tiles start from the current `C`
//! ([`super::avx512::acc_start`], bf16 widened exactly), loaded from that
//! scratch.
//!
//! Invariants the caller (the JIT loop nest, validated by its Rust wrapper)
//! guarantees: `1 <= mr <= MR`, `1 <= nr <= NR`, the layout of
//! [`super::avx512bf16`], the pointers cover the documented ranges, and the
//! CPU and the OS allow AMX ([`super::MicroKernel::available`], which asks
//! the OS for the tile state first: [`tile_state_ready`]); other arguments
//! return without a write.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::TileArgs;
#[cfg(target_arch = "x86_64")]
use super::{F_A_BF16, F_ACC, F_C_BF16};
#[cfg(target_arch = "x86_64")]
use std::mem::MaybeUninit;

/// Rows of an AMX tile: two 16-row accumulator tiles.
pub const MR: usize = 32;
/// Columns of an AMX tile: two 16-column accumulator tiles (the packed `B`
/// panel's width, as [`super::avx512bf16`]'s).
pub const NR: usize = 32;

/// k steps per chunk: one `A` tile row (64 bytes of bf16).
const KC: usize = 32;
/// Rows of a `B` tile: the k pairs of a chunk.
const KP: usize = KC / 2;

/// The CPU's AMX bits (CPUID leaf 7, subleaf 0, EDX): (AMX-BF16 bit 22,
/// AMX-TILE bit 24).
#[cfg(target_arch = "x86_64")]
fn cpuid_amx() -> (bool, bool) {
    // CPUID is available on every x86-64 CPU; leaf 7 only when the maximum
    // basic leaf reaches it.
    let max = __cpuid(0).eax;
    if max < 7 {
        return (false, false);
    }
    let edx = __cpuid_count(7, 0).edx;
    (edx & (1 << 22) != 0, edx & (1 << 24) != 0)
}

/// Whether the OS saves the tile state: OSXSAVE (CPUID leaf 1, ECX bit 27),
/// then XCR0 bits 17 (TILECFG) and 18 (TILEDATA).
#[cfg(target_arch = "x86_64")]
fn os_saves_tiles() -> bool {
    if __cpuid(1).ecx & (1 << 27) == 0 {
        return false;
    }
    #[target_feature(enable = "xsave")]
    fn xcr0() -> u64 {
        // SAFETY: XGETBV with ECX = 0 is valid once OSXSAVE is set (checked
        // by the caller) and only reads XCR0.
        unsafe { _xgetbv(0) }
    }
    // SAFETY: the CPU has XSAVE (OSXSAVE implies it), the feature `xcr0` needs.
    let x = unsafe { xcr0() };
    x & (3 << 17) == 3 << 17
}

/// Asks Linux for this process's permission to use the tile data
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`): without it the
/// first tile instruction faults. Granted per process, for every thread.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_permission() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: `arch_prctl` with this request takes two integers, touches no
    // memory of ours and only changes the process's permitted XSAVE state.
    let r = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    r == 0
}

/// Other OSes enable the tile state for every process that XCR0 allows.
#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_tile_permission() -> bool {
    true
}

/// The CPU's AMX-TILE and AMX-BF16 bits, and whether this process may use
/// the tiles: the OS saves their state (XCR0) and, on Linux, granted the
/// permission (asked once, on the first call). `(tile, bf16)`, both false on
/// any failure, so a tile instruction never runs where it would fault.
pub fn tile_state_ready() -> (bool, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        static READY: std::sync::OnceLock<(bool, bool)> = std::sync::OnceLock::new();
        *READY.get_or_init(|| {
            let (bf16, tile) = cpuid_amx();
            let ok = tile && os_saves_tiles() && request_tile_permission();
            (ok, ok && bf16)
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        (false, false)
    }
}

/// The tile configuration (`ldtilecfg`'s 64 bytes): palette 1, tiles 0–7 of
/// 16 rows × 64 bytes.
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

#[cfg(target_arch = "x86_64")]
static CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        // Bytes per row (u16 at 16 + 2t), rows (u8 at 48 + t).
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    TileConfig(c)
};

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// Whether this thread has loaded [`CONFIG`].
    static CONFIGURED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Loads [`CONFIG`] on this thread unless done before.
///
/// # Safety
/// The CPU and OS allow AMX ([`tile_state_ready`]).
#[cfg(target_arch = "x86_64")]
unsafe fn configure() {
    if !CONFIGURED.get() {
        // SAFETY: the caller's contract (AMX usable); `CONFIG` is 64 readable
        // bytes of a valid palette-1 configuration.
        unsafe {
            std::arch::asm!("ldtilecfg [{0}]", in(reg) CONFIG.0.as_ptr(), options(nostack));
        }
        CONFIGURED.set(true);
    }
}

/// A 64-byte aligned scratch (tile rows start on cache lines).
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
struct Aligned<T>(T);

/// The micro-kernel entry ([`super::UkernelFn`]; `b` and `ldb` in 32-bit words
/// of k pairs; see the module docs).
///
/// # Safety
/// [`super::avx512bf16::ukernel`]'s contract with this kernel's `MR` and `NR`
/// (`b` covers `NR` words at each pair row, `bias` `NR` f32), and the CPU and
/// OS allow AMX and AVX-512 F/BW/VL ([`super::MicroKernel::available`]).
/// Arguments outside the layout return without a write.
#[cfg(target_arch = "x86_64")]
pub unsafe extern "C" fn ukernel(t: *const TileArgs) {
    // SAFETY: the caller's contract: `t` points to the call's arguments.
    let t = unsafe { TileArgs::read(t) };
    let ok = (1..=MR).contains(&t.mr)
        && (1..=NR).contains(&t.nr)
        && t.kb != 0
        && t.flags & F_A_BF16 != 0
        && super::avx512bf16::fits(t.k, t.acs, t.kb);
    if ok {
        // SAFETY: forwarded contract; `tile` reads and writes exactly the
        // documented ranges.
        unsafe { tile(&t) }
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub use super::unsupported as ukernel;

/// The tile: `C` start, the k chunks, the epilogue.
///
/// # Safety
/// [`ukernel`]'s contract, its checks passed.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn tile(t: &TileArgs) {
    use std::arch::asm;
    let TileArgs {
        c,
        k,
        ldc,
        nr,
        flags,
        ..
    } = *t;
    let esize = if flags & F_C_BF16 != 0 { 2 } else { 4 };
    // Each written before it is read: the `F_ACC` start (zero rows past
    // `mr`) or the tiles' store; the chunks' copies (`chunk`).
    let mut cs = Aligned([MaybeUninit::<f32>::uninit(); MR * NR]);
    let mut a_s = Aligned([MaybeUninit::<u16>::uninit(); MR * KC]);
    let mut b_s = Aligned([MaybeUninit::<u32>::uninit(); KP * NR]);
    let cp = cs.0.as_mut_ptr().cast::<f32>();
    // SAFETY: `configure`: AMX usable (the caller's contract). The C scratch
    // is `MR × NR` f32 (rows of 128 bytes): each tile load or store touches 16
    // rows of 64 bytes at one of its quarters. `acc_start` reads the `mr × nr`
    // tile of `C` (the caller's contract). The tile registers carry the
    // accumulators from one `asm!` block to the next: compiled Rust never
    // allocates them, and the blocks (none `pure`) keep their order.
    unsafe {
        configure();
        if flags & F_ACC != 0 {
            for r in 0..MR {
                let row = if r < t.mr {
                    super::avx512::acc_start::<1, 2>(c.add(r * ldc * esize), ldc, nr, flags)[0]
                } else {
                    [_mm512_setzero_ps(); 2]
                };
                _mm512_store_ps(cp.add(r * NR), row[0]);
                _mm512_store_ps(cp.add(r * NR + 16), row[1]);
            }
            asm!(
                "tileloadd tmm0, [{c} + {s}*1]",
                "tileloadd tmm1, [{c} + {s}*1 + 64]",
                "tileloadd tmm2, [{c2} + {s}*1]",
                "tileloadd tmm3, [{c2} + {s}*1 + 64]",
                c = in(reg) cp,
                c2 = in(reg) cp.add(16 * NR),
                s = in(reg) NR * 4,
                options(nostack),
            );
        } else {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
        }
        let mut kk = 0;
        while kk < k {
            chunk(t, kk, &mut a_s.0, &mut b_s.0);
            kk += KC;
        }
        asm!(
            "tilestored [{c} + {s}*1], tmm0",
            "tilestored [{c} + {s}*1 + 64], tmm1",
            "tilestored [{c2} + {s}*1], tmm2",
            "tilestored [{c2} + {s}*1 + 64], tmm3",
            c = in(reg) cp,
            c2 = in(reg) cp.add(16 * NR),
            s = in(reg) NR * 4,
            options(nostack),
        );
        for r in 0..t.mr {
            let row = [[
                _mm512_load_ps(cp.add(r * NR)),
                _mm512_load_ps(cp.add(r * NR + 16)),
            ]];
            let c = c.add(r * ldc * esize);
            super::avx512::finish::<1, 2, false>(row, c, ldc, nr, (t.bias, t.mask), flags);
        }
    }
}

/// The 32 k steps from `kk` (fewer at the end of `k`): two `A` tiles, two `B`
/// tiles, four `tdpbf16ps` into `tmm0..tmm3` (module docs: the fast path, or
/// the zero-padded copies).
///
/// # Safety
/// [`ukernel`]'s contract, `kk < k` a multiple of [`KC`], the tile
/// configuration loaded ([`configure`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn chunk(
    t: &TileArgs,
    kk: usize,
    a_s: &mut [MaybeUninit<u16>; MR * KC],
    b_s: &mut [MaybeUninit<u32>; KP * NR],
) {
    let TileArgs {
        a,
        b,
        k,
        lda,
        ldb,
        a_blk,
        mr,
        ..
    } = *t;
    // One block when `kb >= k`: the block index stays 0.
    let kb = t.kb.min(k);
    let len = KC.min(k - kk);
    // SAFETY: the caller's contract. `A(r, kk + j)` for `r < mr`, `j < len` is
    // inside the tile of `A`; in the fast path (`mr = MR`, `len = KC`, the
    // chunk inside one block: `kb % KC == 0` or one block) the two tile loads
    // read exactly those 32 rows × 32 steps. `B`'s pair rows `kk/2 ..
    // kk/2 + 16` exist when `len = KC` (`kk + 32 <= k`), each with `NR`
    // readable words; a shorter chunk copies its `⌈len/2⌉` rows only. The
    // scratches (aligned to 64 bytes by the caller) are written whole before
    // the tile loads read them (16 rows of 64 bytes each, inside them).
    unsafe {
        let a_at = |r: usize, g: usize| a.add(2 * (r * lda + (g / kb) * a_blk + g % kb));
        let (pa, sa) = if mr == MR && len == KC && (kb == k || kb.is_multiple_of(KC)) {
            (a_at(0, kk), 2 * lda)
        } else {
            // Zero, then the tile's steps of each row.
            let dst = a_s.as_mut_ptr().cast::<u16>();
            dst.write_bytes(0, MR * KC);
            for r in 0..mr {
                let mut j = 0;
                while j < len {
                    let g = kk + j;
                    let seg = (kb - g % kb).min(len - j);
                    std::ptr::copy_nonoverlapping(
                        a_at(r, g).cast::<u16>(),
                        dst.add(r * KC + j),
                        seg,
                    );
                    j += seg;
                }
            }
            (dst.cast_const().cast::<u8>(), 2 * KC)
        };
        let pb = b.cast::<u32>().add((kk / 2) * ldb);
        let (pb, sb) = if len == KC {
            (pb, 4 * ldb)
        } else {
            let dst = b_s.as_mut_ptr().cast::<u32>();
            dst.write_bytes(0, KP * NR);
            for q in 0..len.div_ceil(2) {
                std::ptr::copy_nonoverlapping(pb.add(q * ldb), dst.add(q * NR), NR);
            }
            (dst.cast_const(), 4 * NR)
        };
        std::arch::asm!(
            "tileloadd tmm4, [{a0} + {sa}*1]",
            "tileloadd tmm5, [{a1} + {sa}*1]",
            "tileloadd tmm6, [{b} + {sb}*1]",
            "tileloadd tmm7, [{b} + {sb}*1 + 64]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            a0 = in(reg) pa,
            a1 = in(reg) pa.add(16 * sa),
            sa = in(reg) sa,
            b = in(reg) pb,
            sb = in(reg) sb,
            options(nostack, readonly),
        );
    }
}
