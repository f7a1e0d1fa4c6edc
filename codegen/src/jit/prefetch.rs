//! Software prefetch for the row-fetching kernels (the embedding bag forward,
//! the sparse updates): their time is random table-row reads, each a cache miss
//! unless the row was asked for earlier. Cranelift has no prefetch instruction,
//! so the generated code calls [`prefetch_row`], a native function bound to the
//! JIT symbol [`PREFETCH_SYMBOL`] (as the GEMM loop nests call their native
//! micro-kernels): while the kernel reads row `p`, it asks for the row
//! [`AHEAD`] lookups later (in groups of [`EVERY`] rows, one branch per row and
//! the calls once per group), so about that many rows' misses overlap.

use super::{Jit, JitError};
use cranelift_codegen::ir::{AbiParam, FuncRef, InstBuilder, Value, types};
use cranelift_frontend::FunctionBuilder;
use cranelift_jit::JITModule;
use cranelift_module::{FuncId, Linkage, Module};

/// The JIT symbol of [`prefetch_row`].
pub(crate) const PREFETCH_SYMBOL: &str = "dlrm_prefetch_row";

/// Lookups ahead of the row being read whose row a kernel fetches.
pub(crate) const AHEAD: i64 = 8;

/// The rows are fetched in groups of this many (a power of two).
pub(crate) const EVERY: i64 = 4;

/// Asks the CPU to fetch the cache lines of the `bytes` bytes at `p` (a hint:
/// a prefetch never faults, whatever the address; nothing is read or written):
/// [`fetch_lines`], for the generated code.
pub(crate) extern "C" fn prefetch_row(p: *const u8, bytes: i64) {
    fetch_lines(p, bytes.max(0) as usize);
}

/// Fetches the cache lines of the `bytes` bytes at `p` into L1
/// (`prefetcht0`): the row prefetch of every row kernel (these Cranelift ones
/// and the native ones, [`super::rows`], which also ask for rows further
/// ahead into L2 only: [`fetch_into`]). Into L2 instead of L1 was measured
/// in stop 38 (2026-11-27, an Intel Xeon, `examples/bag_best`, interleaved
/// pairs of builds, the native kernels): on uniform lookups the JIT bag
/// forward rose from 64-78% to 77-93% of the faster hand loop (and
/// `examples/update_best`'s f32 update from 5.1-6.1 to 4.5-4.7 ms), but on
/// `dlrm-run`'s Zipf-like lookups (`INDICES=zipf`), whose hot rows stay in
/// the caches and then want to be in L1, it fell from 3.5-5.5 to 5.1-5.9 ms
/// on one thread, and in a dlrm-intel-small training step (`--bench`, 4
/// interleaved pairs) the bag and the update took 5-7% longer against the
/// step's GEMMs. Real lookups are skewed, so L1 it is, near.
#[inline(always)]
pub(crate) fn fetch_lines(p: *const u8, bytes: usize) {
    fetch_into::<false>(p, bytes);
}

/// [`fetch_lines`] (`L2` false), or into L2 only (`prefetcht1`): the native
/// row kernels' far prefetch ([`super::rows::FAR`]) and the interaction
/// backward's (`native_dot::FAR`). Further ahead into L2
/// more rows are in flight than into L1, where a deeper distance gains nothing
/// (`examples/bag_best`'s hand loops, 2 threads, AMD EPYC Zen 4, 2026-12-01:
/// 8, 16, 32, 64 rows ahead 16.2, 17.1, 17.1, 16.5 GB/s into L1, 17.2, 21.9,
/// 20.7, 19.0 into L2).
#[inline(always)]
pub(crate) fn fetch_into<const L2: bool>(p: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1, _mm_prefetch};
        let mut a = (p as usize) & !63;
        let end = (p as usize).wrapping_add(bytes);
        while a < end {
            // SAFETY: a prefetch is a hint that never faults and reads nothing
            // the program can observe.
            unsafe {
                if L2 {
                    _mm_prefetch::<_MM_HINT_T1>(a as *const i8);
                } else {
                    _mm_prefetch::<_MM_HINT_T0>(a as *const i8);
                }
            }
            a += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, bytes);
}

/// A fresh module in which [`PREFETCH_SYMBOL`] is [`prefetch_row`], declared:
/// the id to give [`Prefetch::new`] in the function being built.
pub(crate) fn module(jit: &Jit) -> Result<(JITModule, FuncId), JitError> {
    let mut module = jit.module_with_symbols(&[(PREFETCH_SYMBOL, prefetch_row as *const u8)])?;
    let mut sig = module.make_signature();
    sig.params.push(AbiParam::new(types::I64));
    sig.params.push(AbiParam::new(types::I64));
    let id = module
        .declare_function(PREFETCH_SYMBOL, Linkage::Import, &sig)
        .map_err(JitError::module)?;
    Ok((module, id))
}

/// The prefetch call in a function being built: rows of `row_bytes` bytes.
#[derive(Clone, Copy)]
pub(crate) struct Prefetch {
    f: FuncRef,
    row_bytes: i64,
}

impl Prefetch {
    /// The call of `id` (from [`module`]) in the function `b` builds.
    pub(crate) fn new(
        module: &mut JITModule,
        b: &mut FunctionBuilder<'_>,
        id: FuncId,
        row_bytes: usize,
    ) -> Self {
        Prefetch {
            f: module.declare_func_in_func(id, b.func),
            row_bytes: row_bytes as i64,
        }
    }

    /// Emits the fetch of the row at `addr`.
    pub(crate) fn row(self, b: &mut FunctionBuilder<'_>, addr: Value) {
        let n = b.ins().iconst(types::I64, self.row_bytes);
        b.ins().call(self.f, &[addr, n]);
    }

    /// Emits, when `p` is a multiple of [`EVERY`], the fetch of the rows of
    /// positions `p + AHEAD .. p + AHEAD + EVERY` (each at most `end - 1`;
    /// `p < end`), of which `row(b, q)` gives the address of position `q`'s
    /// row(s): one branch per position, and the calls (which save the caller's
    /// vector registers) once every `EVERY` positions.
    pub(crate) fn ahead(
        self,
        b: &mut FunctionBuilder<'_>,
        p: Value,
        end: Value,
        row: &mut dyn FnMut(&mut FunctionBuilder<'_>, Value) -> Vec<Value>,
    ) {
        let (fetch, next) = (b.create_block(), b.create_block());
        let m = b.ins().band_imm_s(p, EVERY - 1);
        b.ins().brif(m, next, &[], fetch, &[]);
        b.switch_to_block(fetch);
        let last = b.ins().iadd_imm_s(end, -1);
        for k in 0..EVERY {
            let q = b.ins().iadd_imm_s(p, AHEAD + k);
            let q = b.ins().smin(q, last);
            for a in row(b, q) {
                self.row(b, a);
            }
        }
        b.ins().jump(next, &[]);
        b.switch_to_block(next);
    }
}
