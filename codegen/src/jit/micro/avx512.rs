//! The native AVX-512 GEMM micro-kernel ([`super::AVX512`] in the registry): the
//! 512-bit sibling of [`super::avx2`], chosen at run time on CPUs with AVX-512
//! F/BW/VL, registered in JIT modules and called by the JIT loop nest per tile.
//!
//! # Tile semantics
//! For `r < mr` (`1..=MR`) and `j < nr` (`1..=NR`):
//! `C[r·ldc + j] = act(bias[j] + Σ_{kk<k} A(r,kk) · b[kk·ldb + j])`, the sum taken in
//! ascending `kk` with one fused multiply-add per term into an accumulator that
//! starts at `0.0` — bitwise identical to the AVX2 kernel, the Cranelift
//! micro-kernel and a scalar `f32::mul_add` loop. `A` is in *batch-reduce* form: a
//! sequence of blocks of `kb` k-steps, `a_blk` elements apart, the last block
//! possibly partial (`k` need not be a multiple of `kb`):
//! `A(r,kk) = a[r·lda + (kk / kb)·a_blk + (kk % kb)·acs]`, f32, or bf16
//! widened exactly (`<< 16`) with [`F_A_BF16`]. `b` rows are `ldb >= NR` f32 apart,
//! each with `NR` readable floats (lanes `>= nr` may hold anything: they only reach
//! accumulator lanes that are never stored); with [`F_B_BF16`] (f32 `A` only)
//! they are bf16, `ldb` bf16 elements apart, each row widened exactly as it is
//! loaded (`vpmovzxwd` and a shift a vector: a bf16 weight block read in place
//! instead of packed to f32 by every call, which at serving batches cost
//! more than the GEMM's widening does).
//!
//! Flags (every kernel's, [`super`]): [`F_A_BF16`]; [`F_C_BF16`] stores `C`
//! as bf16 (round to nearest even, NaN kept NaN with the quiet bit set, as
//! `half::bf16::from_f32`); [`F_BIAS`] adds `bias[j]` (`NR` readable f32); [`F_RELU`]
//! applies `x > 0 || x is NaN ? x : 0` (`-0` gives `+0`: `vmaxps(x, 0)` returns its
//! second operand then; NaN is blended back, as the interpreter keeps it); [`F_ACC`] starts the accumulators from the current `C`
//! tile instead of `0.0` (f32 `C`: so a loop nest can split `k` into chunks and get
//! the one-pass result bit for bit; with bf16 `C` the stored values are widened
//! exactly), bias and relu still applied at the end when flagged. Only the
//! `mr×nr` tile of `C` is read (with [`F_ACC`]) and written — masked loads and
//! stores for `nr < NR` and for the bf16 halves — and nothing outside the tile of
//! `A` is read.
//!
//! # Register budget and the tile shape
//! 32 `zmm` registers: `MR·2 = 24` accumulators (`NR = 32` = two `zmm` per row), 2
//! for the current `B` row, 1–2 for the broadcast `A` value (`vbroadcastss zmm,
//! m32` from memory: a load-port uop, no shuffle; LLVM prefers it to folding an
//! embedded `{1to16}` broadcast into both FMAs of the value, which would double
//! the loads), leaving a few registers for the epilogue. `2·MR = 24`
//! independent FMA chains cover the FMA latency (4 cycles) × 2 FMA ports eight
//! times over, and per k step the loads (2 `B` + `MR` `A`) stay well under the two
//! load ports while the `2·MR` FMAs keep both FMA ports busy. `MR = 12` was
//! chosen by measurement (`examples/ukernel_best.rs`, one thread, `B` hot in L1;
//! an Intel Xeon with AVX-512 F/BW/VL, AVX512_BF16 and AMX, 2 cores shared with
//! other builds, load average 9–10; the same run's FMA peak, independent
//! `vfmadd231ps zmm` chains, 175.5 GFLOP/s per core; GFLOP/s at k =
//! 64/256/1024):
//!
//! | `A` | 8×32 | 12×32 | AVX2 6×16 |
//! | --- | --- | --- | --- |
//! | packed f32 | 146/159/156 | 141/161/155 | 76/84/84 |
//! | blocked f32 (`lda` 64, in place) | 143/162/149 | 147/161/151 | 76/85/84 |
//! | row-major f32 (`lda = k`, staged) | 142/141/134 | 145/141/132 | 78/84/85 |
//! | packed bf16 | 112/132/127 | 131/141/134 | 43/45/44 |
//! | row-major bf16 | 123/140/135 | 125/140/134 | 43/47/45 |
//!
//! The 12-row tile runs at 86–92% of the peak on f32 `A` read in place at
//! `k >= 256`. An earlier run with `MR = 14` (28 accumulators) spilled and ran at
//! a third of the speed. 8 and 12 rows tie on f32 `A` in L1; 12 rows are ahead
//! on bf16 `A` at small k and load 1.5× fewer `B` bytes per FMA, which counts
//! once `B` comes from L2 in the real loop nest.
//!
//! A tile at most 16 columns wide (`nr <= 16`: a 16-wide layer, or the last
//! panel of a ragged one) runs with one vector per row: half the `B` loads and
//! FMAs of the two-vector tile, whose second vector would hold no live lane.
//!
//! # The k loop
//! The `kb` split is hoisted: the kernel loops over `A` blocks, and inside a
//! block runs a branch-free k loop unrolled by 4. f32 `A` whose rows are adjacent
//! (`lda = 1`: packed `[kk][MR]` or a transposed view) is read in place, and so
//! is row-major f32 `A` whose row stride is 32, 64, 96, 128, 160 or 192 elements
//! (the blocked activations `[Kb][S][bk]` at the block widths `block_for`
//! picks: each width its own loop, the
//! stride folded into the broadcasts' displacements), so the loop nest need not
//! pack it; any other `A` (row-major, general strides, bf16) is first copied,
//! [`KC`] k steps at a time, into an f32 scratch on the stack (bf16 widened exactly; vectorised with
//! masked loads when the tile's rows or its k steps are adjacent), so that every
//! hot loop addresses `A` with constant strides folded into immediate
//! displacements. The loop (checked with `--emit=asm`) is, per 4 k steps,
//! 96 `vfmadd231ps zmm`, 48 `vbroadcastss zmm, m32`, 8 `B` loads, 8 `B`
//! prefetches and 3–4 scalar ops, with no spill.
//!
//! # Prefetch
//! In the loop nest `B` (a weight panel, `k` rows of 128 bytes) comes from L2,
//! and `C` (a fresh output) from L2 or further: in L1 the kernel is at ~90% of
//! the FMA peak, but with `B` and `C` out of L1 it was at 33–35% (k = 64) to
//! 55–62% (k = 1024), the FMAs waiting for `B` rows and the epilogue for `C`. So each k
//! step prefetches the `B` row [`PF`] steps ahead into L1 (both of its cache
//! lines; the hardware prefetchers alone left the FMAs waiting), and the tile
//! of `C` is prefetched for writing (`prefetchw`) before the k loop, so the
//! epilogue's stores find their lines (not with [`F_ACC`], whose start loads
//! them anyway). A/B against the kernel without them, one binary, the same
//! machine and load, 12×32 f32 `A`, each call on the next of 0.5–1 MiB of `B`
//! panels and the next of 6 MiB of `C` tiles, GFLOP/s: k = 64 58–62 → 71–75,
//! k = 256 102–107 → 113–115, k = 1024 96–108 → 108–118; with `B` and `C` hot
//! the two are within 2%. Prefetching 12, 16, 24 or 32 steps ahead measured
//! the same within the noise; a third line per row (for rows not 64-byte
//! aligned) gained nothing; plain stores for whole vectors instead of masked
//! ones gained nothing.
//!
//! A blocked activation read in place (`lda` one of the block widths) is
//! a layer's input as the previous op wrote it, in L3 or further when the
//! layer starts (its row chunks were written by both cores, 4 MiB at
//! dlrm-small's widths): the loop nest's first panel of each row block reads
//! it cold, the hardware prefetchers following a tile's rows only for the
//! 3 KiB of one block. So the k loop over block `q` also prefetches, into
//! L2, the next tile's rows of that block (one line a k step, 4 a group of 4),
//! which the next tile then finds there. dlrm-small inference (Intel Xeon
//! model 207, 4 interleaved pairs, `dlrm-run --bench --infer`, 100 steps):
//! the forward GEMMs 5.12/5.49/5.39/5.26 → 5.08/5.07/5.27/5.32 ms a step;
//! `examples/brgemm_best 2048 512 256` in place with `FLUSH=1`: 1.85/1.88 →
//! 1.82/1.79 ms; dlrm-mlperf training level within the noise (its layers
//! mostly take the packed `A`, whose packing reads the rows in streams).
//!
//! Invariants the caller (the JIT loop nest, validated by its Rust wrapper)
//! guarantees: `1 <= mr <= MR`, `1 <= nr <= NR`, `kb >= 1`, the pointers cover
//! the documented ranges, and the CPU has AVX-512 F/BW/VL
//! ([`super::MicroKernel::available`]) — the symbol is registered only then.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::TileArgs;
pub use super::{F_A_BF16, F_ACC, F_B_BF16, F_BIAS, F_C_BF16, F_MASK, F_RELU};

/// Rows of an AVX-512 tile.
pub const MR: usize = 12;
/// Columns of an AVX-512 tile: two `zmm` of f32 per row.
pub const NR: usize = 32;

/// How many k steps ahead the k loop prefetches `B` rows (module docs,
/// "Prefetch").
pub const PF: usize = 16;

/// k steps of bf16 `A` widened into the f32 scratch at a time.
pub const KC: usize = 64;

/// Floats of the bf16 widening scratch: `KC` steps of `MR` rows, plus the slack
/// of one 16-lane store.
const SCRATCH: usize = KC * MR + 16;

/// The micro-kernel entry ([`super::UkernelFn`]; see the module docs for the
/// tile semantics).
///
/// # Safety
/// `t` points to a [`TileArgs`] where, for `r < mr`, `kk < k`: `A(r,kk)`
/// (module docs) is readable at `a + index·esize` (`esize` 2 with
/// [`F_A_BF16`], else 4); `b` covers `NR` f32 at `b + kk·ldb` for every
/// `kk < k` (`NR` bf16 with [`F_B_BF16`], `ldb` then in bf16 elements);
/// `bias` covers `NR` f32 when [`F_BIAS`] is set; `c` covers the
/// `mr × nr` tile with row stride `ldc` elements (readable too with
/// [`F_ACC`]); `1 <= mr <= MR`, `1 <= nr <= NR`, `kb >= 1`; the CPU has
/// AVX-512 F, BW and VL ([`super::MicroKernel::available`]). Other `mr`/`nr`,
/// or [`F_B_BF16`] with [`F_A_BF16`], return without a write.
#[cfg(target_arch = "x86_64")]
pub unsafe extern "C" fn ukernel(t: *const TileArgs) {
    // SAFETY: the caller's contract: `t` points to the call's arguments.
    let t = unsafe { TileArgs::read(t) };
    let (mr, nr, flags) = (t.mr, t.nr, t.flags);
    if nr == 0 || nr > NR || t.kb == 0 {
        return;
    }
    // SAFETY: forwarded contract (see above); `tile` reads and writes exactly the
    // documented ranges.
    unsafe {
        macro_rules! go {
            ($($r:literal)*) => {
                // A tile at most 16 columns wide: one vector per row.
                // A bf16 `B` only with an f32 `A` (`GemmSpec::normalized`).
                match (mr, flags & F_A_BF16 != 0, nr <= 16, flags & F_B_BF16 != 0) {
                    $(($r, true, true, false) => tile::<$r, true, 1, false>(&t),
                    ($r, true, false, false) => tile::<$r, true, 2, false>(&t),
                    ($r, false, true, false) => tile::<$r, false, 1, false>(&t),
                    ($r, false, false, false) => tile::<$r, false, 2, false>(&t),
                    ($r, false, true, true) => tile::<$r, false, 1, true>(&t),
                    ($r, false, false, true) => tile::<$r, false, 2, true>(&t),)*
                    _ => {}
                }
            };
        }
        go!(1 2 3 4 5 6 7 8 9 10 11 12);
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub use super::unsupported as ukernel;

// `len` k steps of `tile` from `pa`/`pb` into its accumulators `acc`:
// `acc[r] += A[r·lda + kk·acs] · B[kk·ldb..]`, in order, one FMA per term (`lda`,
// `acs` in bytes). With a `$pfa` (the blocked layouts read in place), one
// cache line a k step from there is prefetched into L2 (module docs, the end
// of "Prefetch"). A macro, so that each layout gets its own loop with the
// strides it knows as constants folded into the addresses, inlined with the
// accumulators in registers. It is expanded in `tile` only (`R`, `W`, `BBF` are `tile`'s
// parameters); it stands outside to keep that function short. `ldb` and `pb`
// are in bytes (f32 or, with `BBF`, bf16 rows of `B`).
macro_rules! kloop {
    ($acc:ident, $ldb:expr, $pa:expr, $lda:expr, $acs:expr, $pb:expr, $len:expr) => {
        kloop!($acc, $ldb, $pa, $lda, $acs, $pb, $len, None)
    };
    ($acc:ident, $ldb:expr, $pa:expr, $lda:expr, $acs:expr, $pb:expr, $len:expr, $pfa:expr) => {{
        let mut pfa: Option<*const i8> = $pfa;
        let ldb: usize = $ldb;
        let (lda, acs, len): (usize, usize, usize) = ($lda, $acs, $len);
        // One k step: W B vectors, R broadcasts (load-port
        // `vbroadcastss`, or folded into an FMA), W·R FMAs.
        let kstep = |acc: &mut [[__m512; W]; R], pa: *const u8, pb: *const u8| {
            // The B row PF k steps ahead into L1 (a hint: it never
            // faults, so it may run past the tile's last row).
            let pf = pb.wrapping_add(PF * ldb).cast::<i8>();
            _mm_prefetch::<_MM_HINT_T0>(pf);
            if W > 1 && !BBF {
                _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(64));
            }
            let [b0, b1] = load_b::<W, BBF>(pb);
            for (r, accr) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(pa.add(r * lda).cast::<f32>().read_unaligned());
                accr[0] = _mm512_fmadd_ps(av, b0, accr[0]);
                if W > 1 {
                    accr[W - 1] = _mm512_fmadd_ps(av, b1, accr[W - 1]);
                }
            }
        };
        let mut pa: *const u8 = $pa;
        let mut pb: *const u8 = $pb;
        // Unrolled by 4: the loop overhead would otherwise crowd the
        // front end.
        for _ in 0..len / 4 {
            if let Some(p) = pfa {
                // Hints: they never fault, so they may run past `A`.
                for line in 0..4 {
                    _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(64 * line));
                }
                pfa = Some(p.wrapping_add(256));
            }
            kstep(&mut $acc, pa, pb);
            kstep(&mut $acc, pa.add(acs), pb.add(ldb));
            kstep(&mut $acc, pa.add(2 * acs), pb.add(2 * ldb));
            kstep(&mut $acc, pa.add(3 * acs), pb.add(3 * ldb));
            pa = pa.wrapping_add(4 * acs);
            pb = pb.wrapping_add(4 * ldb);
        }
        for _ in 0..len % 4 {
            kstep(&mut $acc, pa, pb);
            pa = pa.wrapping_add(acs);
            pb = pb.wrapping_add(ldb);
        }
    }};
}

/// Row `pb` of `B`'s tile: its `W` vectors of 16 columns (the second `b0`
/// again when `W = 1`, never used then), f32, or bf16 widened exactly with
/// `BBF`. A two-vector bf16 row comes *interleaved*: its 32 columns loaded
/// as one vector, the even columns widened by a shift and the odd ones by
/// masking off the low halves (two operations a row against four for two
/// zero-extensions and two shifts, on the FMAs' ports), so the first vector
/// holds columns 0, 2, .., 30 and the second 1, 3, .., 31: the tile's
/// accumulators hold that order ([`interleave`]).
///
/// # Safety
/// `pb` covers `16·W` elements of `B`'s type.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn load_b<const W: usize, const BBF: bool>(pb: *const u8) -> [__m512; 2] {
    // SAFETY: the caller's contract.
    unsafe {
        if BBF && W > 1 {
            let v = _mm512_loadu_si512(pb.cast());
            let even = _mm512_slli_epi32::<16>(v);
            let odd = _mm512_and_si512(v, _mm512_set1_epi32(0xFFFF_0000u32 as i32));
            return [_mm512_castsi512_ps(even), _mm512_castsi512_ps(odd)];
        }
        let load = |i: usize| {
            if BBF {
                widen_bf16(_mm256_loadu_si256(pb.add(32 * i).cast()))
            } else {
                _mm512_loadu_ps(pb.add(64 * i).cast())
            }
        };
        let b0 = load(0);
        [b0, if W > 1 { load(1) } else { b0 }]
    }
}

/// The lane indices of [`interleave`]'s permutations (`_mm512_permutex2var_ps`:
/// lane `i` of the result takes lane `v[i]` of the first vector, or lane
/// `v[i] - 16` of the second): to the natural order, columns 0-15 (`hi`:
/// 16-31), column `2m` being the first vector's lane `m` and `2m + 1` the
/// second's; from it, the even columns (`hi`: the odd ones).
const fn perm(to_natural: bool, hi: bool) -> [i32; 16] {
    let mut v = [0i32; 16];
    let mut i = 0;
    while i < 16 {
        let (m, odd) = ((i / 2) as i32, i % 2 == 1);
        v[i] = match (to_natural, hi) {
            (true, false) => m + if odd { 16 } else { 0 },
            (true, true) => 8 + m + if odd { 16 } else { 0 },
            (false, false) => 2 * i as i32,
            (false, true) => 2 * i as i32 + 1,
        };
        i += 1;
    }
    v
}

/// [`perm`]'s four index vectors: `[to_natural][hi]`.
static PERMS: [[[i32; 16]; 2]; 2] = [
    [perm(false, false), perm(false, true)],
    [perm(true, false), perm(true, true)],
];

/// The accumulators of a two-vector bf16-`B` tile ([`load_b`]) between the
/// natural column order (`to_natural`: columns 0-15, 16-31) and the
/// interleaved one (even columns, odd columns), row by row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
fn interleave<const R: usize, const W: usize>(acc: &mut [[__m512; W]; R], to_natural: bool) {
    if W < 2 {
        return;
    }
    let [lo, hi] = &PERMS[usize::from(to_natural)];
    // SAFETY: each index array is 16 i32, one 512-bit load.
    let (lo, hi) = unsafe {
        (
            _mm512_loadu_si512(lo.as_ptr().cast()),
            _mm512_loadu_si512(hi.as_ptr().cast()),
        )
    };
    for accr in acc.iter_mut() {
        let (a, b) = (accr[0], accr[W - 1]);
        accr[0] = _mm512_permutex2var_ps(a, lo, b);
        accr[W - 1] = _mm512_permutex2var_ps(a, hi, b);
    }
}

/// One tile of `R` rows of `W` vectors (`W = 1` when `nr <= 16`, else 2), `A`
/// f32 (`ABF = false`) or bf16, `B` f32 (`BBF = false`) or bf16.
///
/// # Safety
/// [`ukernel`]'s contract with `mr = R`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn tile<const R: usize, const ABF: bool, const W: usize, const BBF: bool>(t: &TileArgs) {
    let TileArgs {
        a,
        b,
        c,
        bias,
        k,
        lda,
        acs,
        ldc,
        nr,
        flags,
        ldb,
        kb: kb_len,
        a_blk,
        mask,
        ..
    } = *t;
    // SAFETY: the caller's contract: the C tile (masked to `nr` lanes), every
    // `A(r,kk)`, the `B` rows, the bias row and the mask tile are accessible as
    // documented; the masked loads and stores touch no lane outside the tile.
    unsafe {
        if flags & F_ACC == 0 {
            prefetch_c::<R>(c, ldc, nr, flags);
        }
        prefetch_mask::<R>(t);
        let mut acc = acc_start::<R, W>(c, ldc, nr, flags);
        if BBF && flags & F_ACC != 0 {
            interleave::<R, W>(&mut acc, false);
        }
        let esize = if ABF { 2 } else { 4 };
        // Written before read (see `stage_a`), never read beyond what was written.
        let mut scratch = [std::mem::MaybeUninit::<f32>::uninit(); SCRATCH];
        let sp = scratch.as_ptr().cast::<u8>();
        let mut kk = 0;
        let mut pa = a;
        let mut pb = b.cast::<u8>();
        // `B`'s row stride in bytes.
        let ldb = ldb * if BBF { 2 } else { 4 };
        // The batch-reduce blocks: `A` jumps by `a_blk` elements, `B` runs on.
        while kk < k {
            let len = kb_len.min(k - kk);
            if !ABF && lda == 1 {
                // f32 with the rows adjacent (packed or transposed): in place,
                // the row offsets are immediates.
                if acs == R {
                    kloop!(acc, ldb, pa, 4, R * 4, pb, len);
                } else {
                    kloop!(acc, ldb, pa, 4, acs * 4, pb, len);
                }
                pb = pb.wrapping_add(len * ldb);
            } else if !ABF && acs == 1 && matches!(lda, 32 | 64 | 96 | 128 | 160 | 192) {
                // f32 rows of the blocked layouts' widths: in place, with the
                // row stride a constant of each loop (a run-time stride costs
                // registers and address arithmetic: 4.9 against 3.1 ms for
                // `brgemm` 2048×512×256 in `examples/brgemm_best`). The widths
                // are `block_for`'s: up to 64, and the wide blocks up to 192.
                // The next tile's rows of this block (`R·lda` floats from
                // the end of this tile's: `R·lda / 16` lines, fewer than the
                // `lda` k steps that prefetch one each) into L2, from where
                // the previous op left them.
                let next = Some(pa.wrapping_add(R * lda * 4).cast::<i8>());
                match lda {
                    32 => kloop!(acc, ldb, pa, 128, 4, pb, len, next),
                    64 => kloop!(acc, ldb, pa, 256, 4, pb, len, next),
                    96 => kloop!(acc, ldb, pa, 384, 4, pb, len, next),
                    128 => kloop!(acc, ldb, pa, 512, 4, pb, len, next),
                    160 => kloop!(acc, ldb, pa, 640, 4, pb, len, next),
                    _ => kloop!(acc, ldb, pa, 768, 4, pb, len, next),
                }
                pb = pb.wrapping_add(len * ldb);
            } else {
                // Otherwise staged, KC steps at a time, into the f32 scratch with
                // constant strides (bf16 widened exactly on the way).
                let mut done = 0;
                while done < len {
                    let n = KC.min(len - done);
                    let src = pa.add(done * acs * esize);
                    if stage_a::<R, ABF>(src, lda, acs, n, &mut scratch) {
                        kloop!(acc, ldb, sp, KC * 4, 4, pb, n);
                    } else {
                        kloop!(acc, ldb, sp, 4, R * 4, pb, n);
                    }
                    pb = pb.wrapping_add(n * ldb);
                    done += n;
                }
            }
            kk += len;
            pa = pa.wrapping_add(a_blk * esize);
        }
        if BBF {
            interleave::<R, W>(&mut acc, true);
        }
        finish::<R, W, false>(acc, c, ldc, nr, (bias, mask), flags);
    }
}

/// Prefetches the `R × nr` tile of `C` into L1: every line each row
/// touches, once. A hint that never faults and reads nothing. It asks for
/// the lines owned (`_MM_HINT_ET0`), but without the `prfchw` target feature
/// (unstable in this Rust) that compiles to `prefetcht0`; an `asm!`
/// `prefetchw` and no prefetch at all measured level with it in dlrm-mlperf
/// training (Intel Xeon model 207, 4 interleaved triples), and one prefetch a
/// line instead of three a row (the last element's line again) saved a
/// little beside the mask's ([`prefetch_mask`]).
///
/// It and [`prefetch_mask`] and [`finish`] are always inlined into the
/// tiles, so they carry no `target_feature` of their own (stable Rust does
/// not allow it beside `inline(always)`): the features are the caller's.
/// With the features and a plain `#[inline]`, LLVM kept them out of line
/// in 132 call sites of the tiles (too long to inline), the accumulators
/// going through the stack into `finish`; for short reductions that was
/// a large share of a tile. Inlined: `examples/brgemm_best` (AVX-512, 2
/// threads, AMD EPYC Zen 4, 3 interleaved pairs of builds, CPU time)
/// 2048×13×512 0.52-0.59 → 0.47-0.50 ms, 2048×100×512 (`BK=100`,
/// dlrm-small's first top layer) 2.22-2.32 → 2.10-2.16 ms, 2048×512×256
/// and 2048×1024×1024 level.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn prefetch_c<const R: usize>(c: *mut u8, ldc: usize, nr: usize, flags: u32) {
    let esize = if flags & F_C_BF16 != 0 { 2 } else { 4 };
    let last = (nr - 1) * esize;
    for r in 0..R {
        let row = c.wrapping_add(r * ldc * esize).cast::<i8>().cast_const();
        // Each line of the row once: from the first's start to the last's.
        let skip = row.addr() & 63;
        let mut off = 0;
        while off <= skip + last {
            // SAFETY: a hint that never faults; SSE is in x86-64's baseline.
            unsafe { _mm_prefetch::<_MM_HINT_ET0>(row.wrapping_add(off).wrapping_sub(skip)) };
            off += 64;
        }
    }
}

/// With [`F_MASK`], prefetches the tile's mask (as [`prefetch_c`] the `C`
/// tile): the epilogue reads it after the k loop has hidden its latency.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn prefetch_mask<const R: usize>(t: &TileArgs) {
    if t.flags & F_MASK != 0 {
        prefetch_c::<R>(t.c.wrapping_offset(t.mask), t.ldc, t.nr, t.flags);
    }
}

/// The accumulators' start: zero, or with [`F_ACC`] the current `C` tile
/// (`nr` columns; bf16 widened exactly).
///
/// # Safety
/// With [`F_ACC`], the `R × nr` tile of `C` (row stride `ldc` elements) is
/// readable; `1 <= nr <= NR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
pub(super) unsafe fn acc_start<const R: usize, const W: usize>(
    c: *mut u8,
    ldc: usize,
    nr: usize,
    flags: u32,
) -> [[__m512; W]; R] {
    let ms = lane_masks(nr);
    let cbf = flags & F_C_BF16 != 0;
    let mut acc = [[_mm512_setzero_ps(); W]; R];
    if flags & F_ACC != 0 {
        // SAFETY: the caller's contract; the masked loads touch no lane past `nr`.
        unsafe {
            for (r, accr) in acc.iter_mut().enumerate() {
                for w in 0..W {
                    accr[w] = if cbf {
                        let row = c.wrapping_add(r * ldc * 2).cast::<i16>();
                        widen_bf16(_mm256_maskz_loadu_epi16(ms[w], row.wrapping_add(16 * w)))
                    } else {
                        let row = c.wrapping_add(r * ldc * 4).cast::<f32>();
                        _mm512_maskz_loadu_ps(ms[w], row.wrapping_add(16 * w))
                    };
                }
            }
        }
    }
    acc
}

/// The lane mask of each of the two vectors of a tile row with `nr` columns.
#[inline]
fn lane_masks(nr: usize) -> [u16; 2] {
    let mask = if nr >= NR { u32::MAX } else { (1u32 << nr) - 1 };
    [mask as u16, (mask >> 16) as u16]
}

/// The epilogue of a tile: bias ([`F_BIAS`]), relu ([`F_RELU`]), the mask
/// ([`F_MASK`], its elements `mask` bytes from `C`'s), and the store of its
/// `R × nr` values to `C` (f32, or bf16 with [`F_C_BF16`]: with `CVT`, the
/// caller compiled with AVX512_BF16 and DQ, by `vcvtneps2bf16` inline,
/// else by [`store_bf16_cvt`] where the CPU has them, else [`to_bf16`]). The
/// accumulators come by value: taking their address (`&mut`) in a call that is
/// not inlined kept them in memory through the whole k loop (the AVX-512
/// kernel ran at 45 against 112 GFLOP/s in `examples/ukernel_best`).
///
/// # Safety
/// The `R × nr` tile of `C` (row stride `ldc` elements) is writable; with
/// [`F_BIAS`], `bias` covers `16·W` f32; with [`F_MASK`], the `R × nr` tile
/// `mask` bytes from `C`'s is readable; `1 <= nr <= NR`; called only from
/// code compiled for AVX-512 F, BW and VL on a CPU that has them (it has no
/// `target_feature` of its own: [`prefetch_c`]), and with `CVT` for
/// AVX512_BF16 and DQ too.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn finish<const R: usize, const W: usize, const CVT: bool>(
    mut acc: [[__m512; W]; R],
    c: *mut u8,
    ldc: usize,
    nr: usize,
    (bias, mask): (*const f32, isize),
    flags: u32,
) {
    let ms = lane_masks(nr);
    let cbf = flags & F_C_BF16 != 0;
    // SAFETY: the caller's contract; the masked stores touch no lane past `nr`.
    unsafe {
        if flags & F_BIAS != 0 {
            for w in 0..W {
                let bb = _mm512_loadu_ps(bias.add(16 * w));
                for accr in acc.iter_mut() {
                    accr[w] = _mm512_add_ps(accr[w], bb);
                }
            }
        }
        if flags & F_RELU != 0 {
            // maxps(x, 0) returns its second operand when x is NaN or ±0: `x > 0 ?
            // x : +0`; then NaN is put back (the interpreter keeps it).
            let z = _mm512_setzero_ps();
            let relu = |x: __m512| {
                let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
                _mm512_mask_blend_ps(nan, _mm512_max_ps(x, z), x)
            };
            // Index loops over `W` throughout: with iterator adaptors
            // (`flatten`, `zip`, `array::from_fn`) over the const-generic
            // accumulators, LLVM kept them in memory and the tile ran at half
            // speed (`examples/brgemm_best 2048 512 256`: 7–10 against 3–4
            // ms).
            #[allow(clippy::needless_range_loop)]
            for accr in acc.iter_mut() {
                for w in 0..W {
                    accr[w] = relu(accr[w]);
                }
            }
        }
        if flags & F_MASK != 0 {
            // `C` zeroed where its mask element is not > 0 (NaN: not), the
            // mask read as `C` is laid out, `mask` bytes on.
            let z = _mm512_setzero_ps();
            #[allow(clippy::needless_range_loop)]
            for r in 0..R {
                for w in 0..W {
                    let m = if cbf {
                        let row = c.wrapping_offset(mask).wrapping_add(r * ldc * 2);
                        widen_bf16(_mm256_maskz_loadu_epi16(
                            ms[w],
                            row.cast::<i16>().wrapping_add(16 * w),
                        ))
                    } else {
                        let row = c.wrapping_offset(mask).wrapping_add(r * ldc * 4);
                        _mm512_maskz_loadu_ps(ms[w], row.cast::<f32>().wrapping_add(16 * w))
                    };
                    let keep = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(m, z);
                    acc[r][w] = _mm512_maskz_mov_ps(keep, acc[r][w]);
                }
            }
        }
        if cbf && CVT {
            // SAFETY: `CVT`: the caller is compiled with, and the CPU has,
            // AVX512_BF16 and DQ.
            return store_cvt_rows(acc, c, ldc, ms);
        }
        if cbf && crate::reference::convert::has_avx512_bf16() {
            return store_bf16_cvt(acc, c, ldc, ms);
        }
        for (r, accr) in acc.iter().enumerate() {
            for (w, &a) in accr.iter().enumerate().take(W) {
                if cbf {
                    let row = c.wrapping_add(r * ldc * 2).cast::<i16>();
                    _mm512_mask_cvtepi32_storeu_epi16(row.wrapping_add(16 * w), ms[w], to_bf16(a));
                } else {
                    let row = c.wrapping_add(r * ldc * 4).cast::<f32>();
                    _mm512_mask_storeu_ps(row.wrapping_add(16 * w), ms[w], a);
                }
            }
        }
    }
}

/// [`finish`]'s store of a bf16 `C` with AVX512_BF16's `vcvtneps2bf16`
/// (one instruction where [`to_bf16`]'s integer rounding takes eight): the
/// same rounding to nearest even and quieted NaN, except that the
/// instruction flushes subnormal inputs to zero, so a vector holding one
/// (`vfpclassps`) is rounded by [`to_bf16`] instead: the bits are the same.
/// `finish` took 2.3% of the cycles of `examples/brgemm_best 2048 512 256`
/// (bf16, `A` widened per row chunk) rounding with [`to_bf16`]; with this,
/// 0.7%, and this 1.0% (Intel Xeon model 207, `perf record`).
///
/// # Safety
/// As [`finish`]'s store; the CPU has AVX-512 F, BW, VL, DQ and BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")]
unsafe fn store_bf16_cvt<const R: usize, const W: usize>(
    acc: [[__m512; W]; R],
    c: *mut u8,
    ldc: usize,
    ms: [u16; 2],
) {
    // SAFETY: forwarded; compiled with the features it needs.
    unsafe { store_cvt_rows(acc, c, ldc, ms) }
}

/// [`store_bf16_cvt`]'s body, with no features of its own: inlined there,
/// and into [`finish`] where its caller, the AVX-512 BF16 kernel's tile, is
/// compiled with AVX512_BF16 and DQ (`finish`'s `CVT`), so the store is not
/// a call with the accumulators through the stack (9.8% of the cycles of
/// `DTYPE=bf16 KERNELS=avx512bf16 brgemm_best 2048 13 512`, under 0.8% at
/// 2048×512×256).
///
/// # Safety
/// As [`store_bf16_cvt`]'s, and its caller is compiled with its features.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn store_cvt_rows<const R: usize, const W: usize>(
    acc: [[__m512; W]; R],
    c: *mut u8,
    ldc: usize,
    ms: [u16; 2],
) {
    for (r, accr) in acc.iter().enumerate() {
        let row = c.wrapping_add(r * ldc * 2).cast::<i16>();
        for (w, &a) in accr.iter().enumerate().take(W) {
            let dst = row.wrapping_add(16 * w);
            // SAFETY: the caller's contract: the masked stores touch the
            // tile's `nr` lanes of row `r` only.
            unsafe {
                // Class 0x20: subnormal.
                if _mm512_fpclass_ps_mask::<0x20>(a) == 0 {
                    let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(a));
                    _mm256_mask_storeu_epi16(dst, ms[w], h);
                } else {
                    _mm512_mask_cvtepi32_storeu_epi16(dst, ms[w], to_bf16(a));
                }
            }
        }
    }
}

/// Copies `n <= KC` k steps of an `A` tile (`R` rows, strides `lda`, `acs` in
/// elements, starting at `pa`; bf16 when `ABF`, widened exactly) into `scratch`
/// as f32: row-major `[r][KC]` when the tile's k steps are adjacent (`acs = 1`,
/// returns true), else `[kk][R]` (returns false).
///
/// # Safety
/// Every element `pa[r·lda + kk·acs]`, `r < R`, `kk < n`, is readable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn stage_a<const R: usize, const ABF: bool>(
    pa: *const u8,
    lda: usize,
    acs: usize,
    n: usize,
    scratch: &mut [std::mem::MaybeUninit<f32>; SCRATCH],
) -> bool {
    let s = scratch.as_mut_ptr().cast::<f32>();
    let esize = if ABF { 2 } else { 4 };
    // 16 elements from `p` (lanes `>= cnt` zero; masked: no lane past `cnt` read).
    let load16 = |p: *const u8, cnt: usize| {
        let m = if cnt >= 16 {
            u16::MAX
        } else {
            (1u16 << cnt) - 1
        };
        // SAFETY: the caller's contract covers the `cnt` unmasked lanes.
        unsafe {
            if ABF {
                widen_bf16(_mm256_maskz_loadu_epi16(m, p.cast()))
            } else {
                _mm512_maskz_loadu_ps(m, p.cast())
            }
        }
    };
    // SAFETY: the reads are the tile's elements (masked loads touch no other
    // lane); the writes stay inside `scratch` ([`SCRATCH`] floats, `R <= MR`: a
    // 16-lane store at `kk·R` or `r·KC + j` with `kk, j < KC` fits).
    unsafe {
        if acs == 1 {
            // Each row's k steps are adjacent: 16 at a time.
            for r in 0..R {
                let row = pa.add(r * lda * esize);
                let mut j = 0;
                while j < n {
                    _mm512_storeu_ps(s.add(r * KC + j), load16(row.add(j * esize), n - j));
                    j += 16;
                }
            }
            true
        } else if lda == 1 && R > 1 {
            // The R rows of each k step are adjacent: one masked load.
            for kk in 0..n {
                _mm512_storeu_ps(s.add(kk * R), load16(pa.add(kk * acs * esize), R));
            }
            false
        } else {
            for kk in 0..n {
                for r in 0..R {
                    let p = pa.add((r * lda + kk * acs) * esize);
                    let v = if ABF {
                        f32::from_bits(u32::from(p.cast::<u16>().read_unaligned()) << 16)
                    } else {
                        p.cast::<f32>().read_unaligned()
                    };
                    s.add(kk * R + r).write(v);
                }
            }
            false
        }
    }
}

/// 16 bf16 widened exactly to f32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
pub(super) fn widen_bf16(v: __m256i) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v)))
}

/// 16 f32 rounded to bf16 (in the low half of each 32-bit lane), nearest even,
/// NaN kept NaN with the quiet bit set (as `half::bf16::from_f32` and
/// [`super::avx2`]'s `to_bf16x16`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
pub(super) fn to_bf16(x: __m512) -> __m512i {
    let bits = _mm512_castps_si512(x);
    let hi = _mm512_srli_epi32::<16>(bits);
    let lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(
        _mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)),
        lsb,
    ));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
    let quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
    _mm512_mask_blend_epi32(nan, rounded, quiet)
}
