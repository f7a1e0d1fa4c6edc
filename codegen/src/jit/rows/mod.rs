//! Native row kernels of the row-fetching JIT kernels: the embedding-bag
//! forward's "sum a bag of rows" and the sparse update's "apply `-lr·dy` to a
//! run of rows", in AVX-512 ([`avx512`]) and AVX2+FMA ([`avx2`]) forms chosen
//! at run time, bound as JIT symbols the generated code calls (as the GEMM loop
//! nests call their micro-kernels, [`super::micro`]).
//!
//! Element types: the bag reads f32 or bf16 tables and writes f32 or bf16
//! results; the update reads f32 or bf16 gradients and updates f32 or
//! Split-SGD-BF16 tables. A bf16 element is widened exactly (`bits << 16`) on
//! load, and a bf16 result is rounded once, to nearest even with NaN kept a
//! quiet NaN (`half::bf16::from_f32`'s rule, in integer operations: no
//! AVX512-BF16 instruction, whose conversion flushes subnormals), so every
//! element type computes the same f32 operations as the f32 kernels.
//!
//! The JIT kernels keep the validation and the split into tasks; each task
//! makes one call, which does all its bags' (all its runs') row work: with
//! 512-bit (or 256-bit) vectors where Cranelift has 128-bit ones, the
//! accumulators in registers across the `_mm_prefetch` of the row
//! [`ahead_for`] positions on (and into L2 [`FAR`] times as far; no call in
//! the row loop), and the update's step
//! `lr·g` computed once per run rather than once per row. (A call per bag, as
//! before stop 53, cost more than the bag's row at pooling 1.) The float operations per element are the
//! reference's, in its order (a bag's rows added to +0 in index order, then
//! the mean's division; `w - lr·(g / size)` per entry, in entry order), so the
//! results are bitwise those of the Cranelift kernels and of the reference.
//!
//! The loops are written once for both widths, on the vector operations each
//! width implements (`width.rs`'s `Width` trait): the bag loop (`bag.rs`) and
//! the update's run loop (`update.rs`), each instantiated inside the width's
//! `#[target_feature]` functions; only AVX-512's Split-SGD-BF16 update (32
//! columns a step, on its two bf16 halves at full width) is its own.
//!
//! # The ABI
//! The arguments constant for a JIT call are a `#[repr(C)]` block ([`BagArgs`],
//! [`RunArgs`]) that the generated code writes once into a stack slot at the
//! field offsets `std::mem::offset_of!` gives; each call passes its address
//! and the bag's (run's) own values: [`BagFn`], [`RunFn`].

pub mod avx2;
pub mod avx512;
#[cfg(target_arch = "x86_64")]
mod bag;
pub(crate) mod emit;
#[cfg(target_arch = "x86_64")]
mod update;
#[cfg(target_arch = "x86_64")]
mod width;

use super::micro::Feature;
use super::prefetch::fetch_into;
use std::sync::atomic::{AtomicU8, Ordering};

/// Index positions ahead of the one being read whose rows are fetched.
pub const AHEAD: usize = 8;

/// Positions ahead whose rows a kernel fetches for rows of `bytes`: [`AHEAD`],
/// or more for rows of fewer than 4 cache lines, so that about 32 lines are
/// in flight (64-byte rows: 32 positions). Computed when the JIT kernel is
/// compiled ([`BagArgs::ahead`], [`RunArgs::ahead`]), not per bag.
pub(crate) fn ahead_for(bytes: usize) -> usize {
    (2048 / bytes.max(1)).clamp(AHEAD, 4 * AHEAD)
}

/// How many times [`BagArgs::ahead`] (or [`RunArgs::ahead`]) positions on a
/// native row kernel also fetches each row into L2 only
/// ([`super::prefetch::fetch_into`]), so that a row coming from memory
/// is on its way long before its L1 fetch: 32 rows of 256 bytes, 128 of 64,
/// 32 of 512. `dlrm-run --bench`, AMD EPYC Zen 4, 2026-12-01, interleaved:
/// dlrm-intel-small (pooling 100) inference bags 15.9-16.4 to 11.6-11.8 ms a
/// step (2, 3, 4, 6 times: 14.4, 13.1, 12.9-13.2, 13.0-13.1), its training
/// bags 16.3-17.2 to 12.0-12.9 and updates 21.0-21.9 to 18.1-18.5;
/// dlrm-mlperf training updates 2.66-2.83 to 2.02-2.07 (bf16 3.39-3.48 to
/// 2.99-3.02); the pooling-1 bags of dlrm-small, dlrm-kaggle and dlrm-mlperf
/// level.
pub const FAR: usize = 4;

/// [`BagArgs::flags`]: the indices are i64 (else i32).
pub const B_IDX64: u32 = 1;
/// [`BagArgs::flags`]: only the indices `i` with `i - first < span`
/// (unsigned) add a row (a row shard).
pub const B_SHARD: u32 = 2;
/// [`BagArgs::flags`]: position `p`'s row is scaled by `weights[p]` first (the
/// product rounded, then added).
pub const B_WEIGHTED: u32 = 4;
/// [`BagArgs::flags`]: divide the sum by the bag's size (an empty bag stays 0).
pub const B_MEAN: u32 = 8;
/// [`BagArgs::flags`]: the table is bf16 (else f32).
pub const B_TABLE_BF16: u32 = 16;
/// [`BagArgs::flags`]: the result is bf16, each sum rounded once (else f32).
pub const B_OUT_BF16: u32 = 32;
/// [`BagArgs::flags`]: the table is int8 row-wise (FBGEMM's fused 8-bit
/// rows: `d` codes, then the row's f32 scale and bias; row `i` at `table +
/// i·(d+8)` bytes), each element dequantized as `fma(q, scale, bias)`.
pub const B_TABLE_Q8: u32 = 64;

/// Bytes from one table row to the next.
#[inline(always)]
fn row_stride(a: &BagArgs) -> usize {
    if a.flags & B_TABLE_Q8 != 0 {
        a.d + 8
    } else if a.flags & B_TABLE_BF16 != 0 {
        a.d * 2
    } else {
        a.d * 4
    }
}

/// [`RunArgs::flags`]: the table is Split-SGD-BF16 (`hi`, `lo`: the high and
/// low halves of the f32 master), else f32 at `hi`.
pub const R_SPLIT: u32 = 1;
/// [`RunArgs::flags`]: divide each gradient row by its bag's size first.
pub const R_MEAN: u32 = 2;
/// [`RunArgs::flags`]: the gradient is bf16 (else f32).
pub const R_GRAD_BF16: u32 = 4;

/// The arguments of an embedding-bag forward JIT call, for its [`BagFn`] calls.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BagArgs {
    /// The table (f32, bf16 with [`B_TABLE_BF16`], int8 row-wise with
    /// [`B_TABLE_Q8`]): row `i` at `table + i·d` elements (`i·(d+8)` bytes
    /// for int8; a shard's `first` rows before its storage).
    pub table: *const u8,
    /// The indices (i64 with [`B_IDX64`], else i32).
    pub idx: *const u8,
    /// One f32 weight per index position ([`B_WEIGHTED`]).
    pub weights: *const f32,
    /// Row width, in elements.
    pub d: usize,
    /// A shard's first row ([`B_SHARD`]).
    pub first: i64,
    /// A shard's row count ([`B_SHARD`]).
    pub span: i64,
    /// Rows are fetched ahead for the positions below this one only.
    pub pend: i64,
    /// Positions ahead whose rows are fetched ([`ahead_for`] of the row's
    /// bytes).
    pub ahead: usize,
    /// The bag bounds (when `pooling < 0`): bag `s` is `bounds[s]..bounds[s+1]`.
    pub bounds: *const i64,
    /// Fixed pooling `L` (`>= 0`: bag `s` is `s·L..(s+1)·L`), else `-1`.
    pub pooling: i64,
    /// `B_*` flags.
    pub flags: u32,
}

/// Index positions `start..end` of bag `s`.
///
/// # Safety
/// With `pooling < 0`, `a.bounds` holds `s + 2` entries.
#[inline(always)]
unsafe fn bag_range(a: &BagArgs, s: usize) -> (usize, usize) {
    if a.pooling >= 0 {
        let l = a.pooling as usize;
        (s * l, (s + 1) * l)
    } else {
        // SAFETY: the caller's contract.
        unsafe { (*a.bounds.add(s) as usize, *a.bounds.add(s + 1) as usize) }
    }
}

/// Bytes from one bag's result row to the next.
#[inline(always)]
fn out_row_bytes(a: &BagArgs) -> usize {
    a.d * if a.flags & B_OUT_BF16 != 0 { 2 } else { 4 }
}

/// Sums, for each bag `s` of `s0..s1` (its index positions from the bounds
/// or the fixed pooling of [`BagArgs`]), its rows into its result row, the
/// `d` elements at `out + (s - s0)·d` (f32, or bf16 with [`B_OUT_BF16`]),
/// fetching the rows [`ahead_for`] positions on (below `pend`). One call per
/// task: with pooling 1 a bag is one row, and a call per bag cost more than
/// the row (dlrm-kaggle's 64-byte rows).
///
/// # Safety (for the caller)
/// `args` is a valid [`BagArgs`] (its bounds hold `s1 + 1` entries when
/// `pooling < 0`); every index of the bags' positions names a row the table
/// holds (with [`B_SHARD`], only those in the shard are read), the positions
/// below `pend` are indices too, `out` holds `(s1 - s0)·d` elements of the
/// result type, and the CPU has the kernel's features.
pub type BagFn = unsafe extern "C" fn(args: *const BagArgs, s0: i64, s1: i64, out: *mut u8);

/// The arguments of a sparse update JIT call, for its [`RunFn`] calls.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RunArgs {
    /// f32 table (or the bf16 high halves, [`R_SPLIT`]): row `r` at
    /// `hi + r·d` elements.
    pub hi: *mut u8,
    /// The bf16 low halves ([`R_SPLIT`]).
    pub lo: *mut u8,
    /// The gradient rows (f32, or bf16 with [`R_GRAD_BF16`]): bag `s`'s at
    /// `grad + s·d` elements.
    pub grad: *const u8,
    /// The bag bounds (when `pooling < 0`): bag `s` is `bounds[s]..bounds[s+1]`.
    pub bounds: *const i64,
    /// Row width, in elements.
    pub d: usize,
    /// Fixed pooling `L` (`>= 0`), else `-1`: a [`R_MEAN`] bag's size.
    pub pooling: i64,
    /// Entries ahead whose rows are fetched ([`ahead_for`] of the row's
    /// bytes, both halves of a split one).
    pub ahead: usize,
    /// The learning rate.
    pub lr: f32,
    /// `R_*` flags.
    pub flags: u32,
}

/// Applies the entries `[row, s]` `0..n`, run by run (a run: the
/// entries from one on while their bag `s` is its), each `w[row] -= lr·g[s]`
/// (`g[s] / size(s)` with [`R_MEAN`]), fetching the rows of the entries
/// [`RunArgs::ahead`] on (below `n`): one call per task, as at pooling 1 a
/// call per run cost more than its row.
///
/// # Safety (for the caller)
/// `args` is a valid [`RunArgs`]; `ent` holds `n >= 0` entries, each a row
/// the table holds and a bag of the gradient (and bounds); no other thread
/// touches these rows; the CPU has the kernel's features.
pub type RunFn = unsafe extern "C" fn(args: *const RunArgs, ent: *const [i64; 2], n: i64);

/// Which row kernels the JIT's bag forward and sparse update use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowKernel {
    /// The rows summed and updated in Cranelift code (f32x4), the prefetch a
    /// call every few rows.
    Cranelift,
    /// The AVX2+FMA native kernels ([`avx2`]).
    Avx2,
    /// The AVX-512 F/BW/VL native kernels ([`avx512`]).
    Avx512,
}

impl RowKernel {
    /// Every choice, most capable last.
    pub const ALL: [RowKernel; 3] = [RowKernel::Cranelift, RowKernel::Avx2, RowKernel::Avx512];

    /// The CPU features its native kernels need.
    pub fn features(self) -> &'static [Feature] {
        match self {
            RowKernel::Cranelift => &[],
            RowKernel::Avx2 => &[Feature::Avx2, Feature::Fma],
            RowKernel::Avx512 => &[Feature::Avx512F, Feature::Avx512Bw, Feature::Avx512Vl],
        }
    }

    /// Whether this CPU can run it.
    pub fn available(self) -> bool {
        self.features().iter().all(|f| f.detected())
    }

    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            RowKernel::Cranelift => "Cranelift",
            RowKernel::Avx2 => "AVX2+FMA",
            RowKernel::Avx512 => "AVX-512",
        }
    }

    /// The forward's entry and its JIT symbol (`None` for Cranelift).
    pub(crate) fn bag(self) -> Option<(&'static str, BagFn)> {
        match self {
            RowKernel::Cranelift => None,
            RowKernel::Avx2 => Some(("dlrm_rows_bag_avx2", avx2::bag as BagFn)),
            RowKernel::Avx512 => Some(("dlrm_rows_bag_avx512", avx512::bag as BagFn)),
        }
    }

    /// The update's entry and its JIT symbol (`None` for Cranelift).
    pub(crate) fn run(self) -> Option<(&'static str, RunFn)> {
        match self {
            RowKernel::Cranelift => None,
            RowKernel::Avx2 => Some(("dlrm_rows_run_avx2", avx2::run as RunFn)),
            RowKernel::Avx512 => Some(("dlrm_rows_run_avx512", avx512::run as RunFn)),
        }
    }
}

/// The forced choice: 0 none, else `1 + ` its place in [`RowKernel::ALL`].
static FORCED: AtomicU8 = AtomicU8::new(0);

/// Forces the row kernels of the kernels compiled from now on (`None`: the
/// best this CPU runs, the default); a choice this CPU cannot run gives the
/// Cranelift ones. For tests and benchmarks: every choice computes the same
/// bits.
pub fn force_row_kernel(k: Option<RowKernel>) {
    let v = k.map_or(0, |k| {
        1 + RowKernel::ALL.iter().position(|&x| x == k).unwrap_or(0) as u8
    });
    FORCED.store(v, Ordering::Relaxed);
}

/// The row kernels to compile with: the forced ones if this CPU runs them,
/// else the best it runs.
pub fn row_kernel() -> RowKernel {
    let forced = FORCED.load(Ordering::Relaxed);
    if forced > 0 {
        let k = RowKernel::ALL[(forced as usize - 1).min(2)];
        return if k.available() {
            k
        } else {
            RowKernel::Cranelift
        };
    }
    static BEST: std::sync::OnceLock<RowKernel> = std::sync::OnceLock::new();
    *BEST.get_or_init(|| {
        (RowKernel::ALL.iter().rev().copied())
            .find(|k| k.available())
            .unwrap_or(RowKernel::Cranelift)
    })
}

/// The index at position `p` (i64 or i32 by `idx64`).
///
/// # Safety
/// `idx` holds position `p` of that type.
#[inline(always)]
unsafe fn index_at(idx: *const u8, idx64: bool, p: usize) -> i64 {
    // SAFETY: forwarded.
    unsafe {
        if idx64 {
            *idx.cast::<i64>().add(p)
        } else {
            *idx.cast::<i32>().add(p) as i64
        }
    }
}

/// Fetches the table row of position `q` of a bag call, if `q < pend` and (in
/// a shard) the row is the shard's.
///
/// # Safety
/// `a`'s indices hold position `q` when `q < pend`.
#[inline(always)]
unsafe fn fetch_bag_row<const L2: bool>(a: &BagArgs, q: usize) {
    if (q as i64) < a.pend {
        // SAFETY: position `q < pend` is an index (the caller's contract).
        let i = unsafe { index_at(a.idx, a.flags & B_IDX64 != 0, q) };
        if a.flags & B_SHARD == 0 || (i.wrapping_sub(a.first) as u64) < a.span as u64 {
            let stride = row_stride(a);
            let row = (a.table as usize).wrapping_add(i as usize * stride);
            fetch_into::<L2>(row as *const u8, stride);
        }
    }
}

/// Fetches the row (and its low halves) of entry `q` of a run, if `q < n`.
///
/// # Safety
/// `ent` holds `n` entries.
#[inline(always)]
unsafe fn fetch_run_row<const L2: bool>(a: &RunArgs, ent: *const [i64; 2], q: usize, n: usize) {
    if q < n {
        // SAFETY: `q < n` entries.
        let [r, bag] = unsafe { *ent.add(q) };
        let r = r as usize;
        // The bag's gradient row: a task's entries name every `tasks`-th
        // bag or so (the bags whose rows it owns), a sparse walk that the
        // hardware prefetchers do not follow.
        let gs = if a.flags & R_GRAD_BF16 != 0 { 2 } else { 4 };
        fetch_into::<L2>(
            (a.grad as usize).wrapping_add(bag as usize * a.d * gs) as *const u8,
            a.d * gs,
        );
        let es = if a.flags & R_SPLIT != 0 { 2 } else { 4 };
        fetch_into::<L2>(
            (a.hi as usize).wrapping_add(r * a.d * es) as *const u8,
            a.d * es,
        );
        if a.flags & R_SPLIT != 0 {
            fetch_into::<L2>(
                (a.lo as usize).wrapping_add(r * a.d * 2) as *const u8,
                a.d * 2,
            );
        }
    }
}

/// The end of entry `i`'s run (the entries of its bag from `i` on), and the
/// divisor of that bag's gradient with [`R_MEAN`] (its size as f32).
///
/// # Safety
/// `ent` holds `n > i` entries whose bags the bounds (or pooling) cover.
#[inline(always)]
unsafe fn run_of(a: &RunArgs, ent: *const [i64; 2], i: usize, n: usize) -> (usize, usize, f32) {
    // SAFETY: `i < n` entries; the bag is one of the bounds'.
    unsafe {
        let s = (*ent.add(i))[1];
        let mut j = i + 1;
        while j < n && (*ent.add(j))[1] == s {
            j += 1;
        }
        let size = if a.pooling >= 0 {
            a.pooling
        } else {
            *a.bounds.add(s as usize + 1) - *a.bounds.add(s as usize)
        };
        (j, s as usize, size as f32)
    }
}
