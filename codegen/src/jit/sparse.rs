//! JIT kernels of the in-place optimizer updates: the race-free sparse update
//! (`sparse_sgd`, the fused `embedding_update`, `split_embedding_update`, and
//! their row-shard forms `*_rows`, whose tasks' row ranges cover the shard) and
//! the dense `sgd` / `split_sgd`.
//!
//! Sparse update (SC20): the table's rows are split into one contiguous range per
//! rayon task, and each task applies only the positions whose row is in its
//! range — no two tasks write the same row, no atomics, no locks. The positions
//! are first sorted by task (a counting sort over runs of bags, in parallel:
//! every index is read once, not once per task), each task's in index order, so
//! each row sees its updates in index order: exactly the reference's float
//! operations (`w - lr·g`, with `g = dy[bag] / size` for `mean`), and results
//! are bitwise equal to it. Tables are f32 or Split-SGD-BF16 (`hi`, `lo`: the
//! f32 master joined in registers, updated, split again — exact). A plain bf16
//! table is rounded once per row after all of its updates; that needs grouping
//! by row, which the reference kernel does (no JIT kernel: `None`).
//!
//! Every operand is validated by the reference kernels' planners
//! ([`crate::reference::optim`]) before the kernel runs: every index lies in the
//! table, bag bounds are a valid partition of the indices, lengths fit the shapes.
//!
//! While the kernel updates one entry's row, it asks the CPU for the row of the
//! entry [`prefetch::AHEAD`] on (the updates are random row reads and writes,
//! latency-bound like the embedding bag's; [`prefetch`]).
//! On an f32 or split table (f32 or bf16 gradients), a native row kernel
//! ([`super::rows`], AVX-512 or AVX2+FMA where the CPU has one) does the row
//! work instead: the generated code calls it once for all its entries, which
//! it applies run by run (a run: the entries of one bag), computing `lr·g`
//! once per run (the same value as per entry) and fetching the rows ahead
//! itself.
//!
//! ABI, sparse: `fn(hi, lo, grad, entries, bounds, n: i64, lr: f32)` over the
//! `n` entries `[row, s]` (i64 pairs): storage row `row` (at `hi + row·d`)
//! gets bag `s`'s gradient row (per position, the wrapper passes one-position
//! bags: row `s` is the position's), divided for `mean` by the size of bag `s`
//! = positions `bounds[s]..bounds[s+1]` (or `L` with fixed pooling `L`). Dense:
//! `fn(w, lo, g, n: i64, lr: f32)` over `n` elements.

use super::clif::{flags, for_range, load_f32, load_f32x4, store_f32, store_f32x4};
use super::gemm::Elt;
use super::prefetch::{self, Prefetch};
use super::rows::{self, RowKernel};
use super::{Jit, JitError};
use crate::reference::optim::{
    Grad, GradRows, SparsePlan, bag_operands, embedding_update_plan, embedding_update_plan_of,
    grad_of, sparse_sgd_plan_of, split_pair,
};
use crate::reference::{Indices, Ix, KResult, KernelError};
use crate::update::rows_of;
use cranelift_codegen::ir::{InstBuilder, Value, types};
use cranelift_frontend::FunctionBuilder;
use dlrm_ir::{Checked, CheckedMut, DType, Data, Op, Pool, Tensor, TensorType};
use rayon::prelude::*;

/// Parameter storage of an update kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Store {
    /// f32.
    F32,
    /// bf16, rounded to nearest even on every store (dense `sgd` only).
    BF16,
    /// Split-SGD-BF16: the high (`hi`) and low (`lo`) halves of an f32 master.
    Split,
}

impl Store {
    fn size(self) -> i64 {
        match self {
            Store::F32 => 4,
            Store::BF16 | Store::Split => 2,
        }
    }
}

/// What a sparse update kernel is specialised on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SparseSpec {
    /// Row width.
    pub d: usize,
    /// Table storage (`F32` or `Split`).
    pub table: Store,
    /// Gradient element type.
    pub grad: Elt,
    /// Fixed pooling `L` (else bounds): a `mean` bag's size.
    pub pooling: Option<usize>,
    /// Gradient row per position (else per bag).
    pub per_pos: bool,
    /// Divide the bag's gradient by its size (per bag only).
    pub mean: bool,
    /// The row kernels: a native one applies each run of entries of one bag
    /// ([`super::rows`]; only for the specs it covers,
    /// [`rows::emit::covers_run`]; the others say [`RowKernel::Cranelift`]).
    pub rows: RowKernel,
}

/// What a dense update kernel is specialised on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DenseSpec {
    /// Weight storage.
    pub w: Store,
    /// Gradient element type.
    pub grad: Elt,
}

type SparseFn =
    unsafe extern "C" fn(*mut u8, *mut u8, *const u8, *const [i64; 2], *const i64, i64, f32);
type DenseFn = unsafe extern "C" fn(*mut u8, *mut u8, *const u8, i64, f32);

/// A compiled sparse update kernel.
#[derive(Clone, Copy, Debug)]
pub struct SparseKernel {
    f: SparseFn,
}

/// A compiled dense update kernel.
#[derive(Clone, Copy, Debug)]
pub struct DenseKernel {
    f: DenseFn,
}

/// Columns per chunk (8 f32x4 registers of values in flight).
const CW: usize = 32;

/// Loads 4 (or 1) stored weights as f32 (split: the joined master).
fn load_w(
    b: &mut FunctionBuilder<'_>,
    st: Store,
    hi: Value,
    lo: Value,
    off: i32,
    x4: bool,
) -> Value {
    match (st, x4) {
        (Store::F32, true) => load_f32x4(b, Elt::F32, hi, off),
        (Store::F32, false) => load_f32(b, Elt::F32, hi, off),
        (Store::BF16, true) => load_f32x4(b, Elt::BF16, hi, off),
        (Store::BF16, false) => load_f32(b, Elt::BF16, hi, off),
        (Store::Split, true) => {
            let h = b.ins().uload16x4(flags(), hi, off);
            let h = b.ins().ishl_imm_u(h, 16);
            let l = b.ins().uload16x4(flags(), lo, off);
            let w = b.ins().bor(h, l);
            b.ins().bitcast(types::F32X4, super::clif::bc_flags(), w)
        }
        (Store::Split, false) => {
            let h = b.ins().uload16(types::I32, flags(), hi, off);
            let h = b.ins().ishl_imm_u(h, 16);
            let l = b.ins().uload16(types::I32, flags(), lo, off);
            let w = b.ins().bor(h, l);
            b.ins().bitcast(types::F32, super::clif::bc_flags(), w)
        }
    }
}

/// Stores 4 (or 1) f32 weights (split: high and low halves, exact).
fn store_w(
    b: &mut FunctionBuilder<'_>,
    st: Store,
    x: Value,
    hi: Value,
    lo: Value,
    off: i32,
    x4: bool,
) {
    match (st, x4) {
        (Store::F32, true) => store_f32x4(b, Elt::F32, x, hi, off),
        (Store::F32, false) => store_f32(b, Elt::F32, x, hi, off),
        (Store::BF16, true) => store_f32x4(b, Elt::BF16, x, hi, off),
        (Store::BF16, false) => store_f32(b, Elt::BF16, x, hi, off),
        (Store::Split, true) => {
            let bits = b.ins().bitcast(types::I32X4, super::clif::bc_flags(), x);
            let h = b.ins().ushr_imm_u(bits, 16);
            let m = b.ins().iconst(types::I32, 0xFFFF);
            let m = b.ins().splat(types::I32X4, m);
            let l = b.ins().band(bits, m);
            for (v, p) in [(h, hi), (l, lo)] {
                let n = b.ins().unarrow(v, v);
                let q = b.ins().bitcast(types::I64X2, super::clif::bc_flags(), n);
                let q = b.ins().extractlane(q, 0);
                b.ins().store(flags(), q, p, off);
            }
        }
        (Store::Split, false) => {
            let bits = b.ins().bitcast(types::I32, super::clif::bc_flags(), x);
            let h = b.ins().ushr_imm_u(bits, 16);
            b.ins().istore16(flags(), h, hi, off);
            b.ins().istore16(flags(), bits, lo, off);
        }
    }
}

/// `w -= lr · (g / div)` for `cols` columns from column `c0` of the rows at `wp`
/// (`lp`: low halves) and `gp`.
#[allow(clippy::too_many_arguments)]
fn update_cols(
    b: &mut FunctionBuilder<'_>,
    st: Store,
    ge: Elt,
    wp: Value,
    lp: Value,
    gp: Value,
    lr: (Value, Value),
    div: Option<(Value, Value)>,
    c0: usize,
    cols: usize,
) {
    let (et, eg) = (st.size() as usize, ge.size());
    let nv = cols / 4;
    for c in (0..nv).map(|v| c0 + 4 * v).chain(c0 + 4 * nv..c0 + cols) {
        let x4 = c < c0 + 4 * nv;
        let g = if x4 {
            load_f32x4(b, ge, gp, (c * eg) as i32)
        } else {
            load_f32(b, ge, gp, (c * eg) as i32)
        };
        let g = match div {
            Some((s, v)) => b.ins().fdiv(g, if x4 { v } else { s }),
            None => g,
        };
        let u = b.ins().fmul(if x4 { lr.1 } else { lr.0 }, g);
        let w = load_w(b, st, wp, lp, (c * et) as i32, x4);
        let w = b.ins().fsub(w, u);
        store_w(b, st, w, wp, lp, (c * et) as i32, x4);
    }
}

/// The whole row of width `d`: a runtime loop over full chunks, then the tail.
#[allow(clippy::too_many_arguments)]
fn update_row(
    b: &mut FunctionBuilder<'_>,
    st: Store,
    ge: Elt,
    d: usize,
    wp: Value,
    lp: Value,
    gp: Value,
    lr: (Value, Value),
    div: Option<(Value, Value)>,
) {
    let (et, eg) = (st.size(), ge.size() as i64);
    let full = d / CW;
    if full == 1 {
        update_cols(b, st, ge, wp, lp, gp, lr, div, 0, CW);
    } else if full > 1 {
        let zero = b.ins().iconst(types::I64, 0);
        let end = b.ins().iconst(types::I64, full as i64);
        for_range(b, zero, end, 1, &mut |b, c| {
            let ow = b.ins().imul_imm_s(c, CW as i64 * et);
            let og = b.ins().imul_imm_s(c, CW as i64 * eg);
            let (wc, lc, gc) = (
                b.ins().iadd(wp, ow),
                b.ins().iadd(lp, ow),
                b.ins().iadd(gp, og),
            );
            update_cols(b, st, ge, wc, lc, gc, lr, div, 0, CW);
        });
    }
    if !d.is_multiple_of(CW) {
        update_cols(b, st, ge, wp, lp, gp, lr, div, full * CW, d % CW);
    }
}

fn lr_pair(b: &mut FunctionBuilder<'_>, lr: Value) -> (Value, Value) {
    (lr, b.ins().splat(types::F32X4, lr))
}

pub(crate) fn compile_sparse(jit: &Jit, spec: SparseSpec) -> Result<SparseKernel, JitError> {
    if spec.rows != RowKernel::Cranelift && rows::emit::covers_run(&spec) {
        let f = rows::emit::compile_run(jit, spec, spec.rows)?;
        // SAFETY: generated with exactly this signature and the C call
        // convention.
        let f: SparseFn = unsafe { std::mem::transmute::<*const u8, SparseFn>(f) };
        return Ok(SparseKernel { f });
    }
    let (module, fetch) = prefetch::module(jit)?;
    let f = jit.compile_fn(
        module,
        "sparse_update",
        5,
        &[types::I64, types::F32],
        |m, b, p| {
            let (hi, lo, grad, ent, bounds) = (p[0], p[1], p[2], p[3], p[4]);
            let (n, lr) = (p[5], p[6]);
            let lr = lr_pair(b, lr);
            let rb = spec.d as i64 * spec.table.size();
            let gb = spec.d as i64 * spec.grad.size() as i64;
            let fetch = Prefetch::new(m, b, fetch, rb as usize);
            let zero = b.ins().iconst(types::I64, 0);
            for_range(b, zero, n, 1, &mut |b, i| {
                let at = |b: &mut FunctionBuilder<'_>, i: Value| -> Value {
                    let o = b.ins().imul_imm_s(i, 16);
                    b.ins().iadd(ent, o)
                };
                // The rows of the entries `AHEAD` on (their high and low halves).
                fetch.ahead(b, i, n, &mut |b, q| {
                    let eq = at(b, q);
                    let rq = b.ins().load(types::I64, flags(), eq, 0);
                    let oq = b.ins().imul_imm_s(rq, rb);
                    match spec.table {
                        Store::Split => vec![b.ins().iadd(hi, oq), b.ins().iadd(lo, oq)],
                        _ => vec![b.ins().iadd(hi, oq)],
                    }
                });
                let e = at(b, i);
                let row = b.ins().load(types::I64, flags(), e, 0);
                let s = b.ins().load(types::I64, flags(), e, 8);
                let div = (spec.mean && !spec.per_pos).then(|| {
                    let (start, end) = super::embedding::bag_bounds(b, spec.pooling, bounds, s);
                    let cnt = b.ins().isub(end, start);
                    let cf = b.ins().fcvt_from_sint(types::F32, cnt);
                    (cf, b.ins().splat(types::F32X4, cf))
                });
                let og = b.ins().imul_imm_s(s, gb);
                let gp = b.ins().iadd(grad, og);
                let ow = b.ins().imul_imm_s(row, rb);
                let (wp, lp) = (b.ins().iadd(hi, ow), b.ins().iadd(lo, ow));
                update_row(b, spec.table, spec.grad, spec.d, wp, lp, gp, lr, div);
            });
        },
    )?;
    // SAFETY: generated with exactly this signature and the C call convention.
    let f: SparseFn = unsafe { std::mem::transmute::<*const u8, SparseFn>(f) };
    Ok(SparseKernel { f })
}

pub(crate) fn compile_dense(jit: &Jit, spec: DenseSpec) -> Result<DenseKernel, JitError> {
    let module = jit.new_module()?;
    let scalars = [types::I64, types::F32];
    let f = jit.compile_fn(module, "dense_update", 3, &scalars, |_, b, p| {
        let (w, lo, g, n, lr) = (p[0], p[1], p[2], p[3], p[4]);
        let lr = lr_pair(b, lr);
        let (et, eg) = (spec.w.size(), spec.grad.size() as i64);
        let n16 = b.ins().band_imm_s(n, !15);
        let n1 = b.ins().band_imm_s(n, !3);
        let zero = b.ins().iconst(types::I64, 0);
        let at = |b: &mut FunctionBuilder<'_>, i: Value| {
            let ow = b.ins().imul_imm_s(i, et);
            let og = b.ins().imul_imm_s(i, eg);
            (
                b.ins().iadd(w, ow),
                b.ins().iadd(lo, ow),
                b.ins().iadd(g, og),
            )
        };
        // 16 elements per trip, then 4, then one at a time.
        for (from, to, step, cols) in [(zero, n16, 16, 16), (n16, n1, 4, 4)] {
            for_range(b, from, to, step, &mut |b, i| {
                let (wp, lp, gp) = at(b, i);
                update_cols(b, spec.w, spec.grad, wp, lp, gp, lr, None, 0, cols);
            });
        }
        for_range(b, n1, n, 1, &mut |b, i| {
            let (wp, lp, gp) = at(b, i);
            update_cols(b, spec.w, spec.grad, wp, lp, gp, lr, None, 0, 1);
        });
    })?;
    // SAFETY: generated with exactly this signature and the C call convention.
    let f: DenseFn = unsafe { std::mem::transmute::<*const u8, DenseFn>(f) };
    Ok(DenseKernel { f })
}

fn jit_err(op: &'static str) -> impl Fn(JitError) -> KernelError {
    move |e| KernelError::Jit {
        op,
        reason: e.to_string(),
    }
}

fn grad_ptr(g: Grad<'_>) -> (Elt, usize) {
    match g {
        Grad::F32(v) => (Elt::F32, v.as_ptr() as usize),
        Grad::BF16(v) => (Elt::BF16, v.as_ptr() as usize),
    }
}

/// Runs a validated sparse plan on a table at `hi` (and `lo`) with a JIT kernel.
fn run_sparse(
    jit: &Jit,
    op: &'static str,
    table: Store,
    hi: *mut u8,
    lo: *mut u8,
    plan: &SparsePlan<'_>,
    lr: f32,
) -> KResult<()> {
    if plan.d == 0 || plan.idx.len() == 0 || plan.bags == 0 {
        return Ok(());
    }
    let (grad, gptr) = grad_ptr(plan.grad);
    let per_pos = plan.src == GradRows::PerPosition;
    // Per-position gradients: one-position bags (bag s = position s, whose
    // gradient row is s either way).
    let pooling = if per_pos { Some(1) } else { plan.pooling };
    let nbags = if per_pos { plan.idx.len() } else { plan.bags };
    let mut spec = SparseSpec {
        d: plan.d,
        table,
        grad,
        pooling,
        per_pos,
        mean: matches!(plan.src, GradRows::PerBag { mean: true }),
        rows: RowKernel::Cranelift,
    };
    if rows::emit::covers_run(&spec) {
        spec.rows = rows::row_kernel();
    }
    let k = jit.sparse(spec).map_err(jit_err(op))?;
    let rr = plan.range_rows();
    let tasks = plan.stored.div_ceil(rr);
    let work = Work {
        pooling,
        bounds: &plan.bounds,
        bags: nbags,
        first: plan.first,
        stored: plan.stored,
        rr,
        tasks,
    };
    let pieces = match plan.idx {
        Indices::I64(v) => work.entries(v),
        Indices::I32(v) => work.entries(v),
    };
    let (hi, lo, bptr) = (hi as usize, lo as usize, plan.bounds.as_ptr() as usize);
    let f = k.f;
    (0..tasks).into_par_iter().for_each(|t| {
        for ent in pieces.iter().map(|p| &p[t]).filter(|e| !e.is_empty()) {
            // SAFETY: the plan validated every index against the table's rows
            // of `d` elements, of which the storage holds `first..first +
            // stored` (`hi`, `lo` hold stored·d elements of the spec's storage,
            // checked by the caller); each entry's row is a storage row
            // (`Work::entries`) of this task's range, disjoint from the other
            // tasks' (no two tasks write a row), and its bag is one of the
            // plan's: the bounds (a partition of the indices, `bags + 1`
            // entries) or the fixed pooling (`bags·L` indices; per position,
            // `L = 1`) give a `mean` bag's size, the gradient's shape (a row
            // per bag or per position) its gradient row.
            unsafe {
                f(
                    hi as *mut u8,
                    lo as *mut u8,
                    gptr as *const u8,
                    ent.as_ptr(),
                    bptr as *const i64,
                    ent.len() as i64,
                    lr,
                )
            }
        }
    });
    Ok(())
}

/// The bags of a sparse update and how its table storage is split among tasks.
struct Work<'a> {
    /// Fixed pooling `L` (else `bounds`: bag `s` is `bounds[s]..bounds[s+1]`).
    pooling: Option<usize>,
    bounds: &'a [i64],
    /// Number of bags.
    bags: usize,
    /// The storage holds the table rows `first..first + stored`.
    first: usize,
    stored: usize,
    /// Task `t` owns the storage rows `t·rr .. (t+1)·rr`, of `tasks` tasks.
    rr: usize,
    tasks: usize,
}

impl Work<'_> {
    /// The positions of bag `s` (`s = bags`: the empty range at the end).
    fn bag(&self, s: usize) -> std::ops::Range<usize> {
        match self.pooling {
            Some(l) => s * l..(s + 1) * l,
            None if s == self.bags => {
                let end = self.bounds[s] as usize;
                end..end
            }
            None => self.bounds[s] as usize..self.bounds[s + 1] as usize,
        }
    }

    /// Each task's entries `[storage row, bag]`, one per position whose row
    /// the storage holds, in pieces: piece `c` (a run of bags, counted in
    /// parallel) holds `tasks` lists, task `t`'s the entries of its rows, in
    /// position order. Task `t` walking its list of every piece in turn sees
    /// each of its rows' updates in index order, as the reference applies them
    /// (a counting sort by task: each position is read once, not once per
    /// task).
    fn entries<I: Ix>(&self, idx: &[I]) -> Vec<Vec<Vec<[i64; 2]>>> {
        let pieces = if self.tasks > 1 { self.tasks } else { 1 };
        let per = self.bags.div_ceil(pieces);
        (0..pieces)
            .into_par_iter()
            .map(|c| {
                let (s0, s1) = ((c * per).min(self.bags), ((c + 1) * per).min(self.bags));
                // Room for an even share of the run's positions and a quarter.
                let n = self.bag(s1).start - self.bag(s0).start;
                let cap = n / self.tasks + n / (4 * self.tasks);
                let mut out: Vec<Vec<_>> =
                    (0..self.tasks).map(|_| Vec::with_capacity(cap)).collect();
                for s in s0..s1 {
                    for &i in &idx[self.bag(s)] {
                        let r = (i.get() as usize).wrapping_sub(self.first);
                        if r < self.stored {
                            out[r / self.rr].push([r as i64, s as i64]);
                        }
                    }
                }
                out
            })
            .collect()
    }
}

/// Elements per task of the dense updates.
const CHUNK: usize = 1 << 15;

/// Runs a dense update of `n` elements at `w` (and `lo`) with gradient `g`.
#[allow(clippy::too_many_arguments)]
fn run_dense(
    jit: &Jit,
    op: &'static str,
    st: Store,
    w: *mut u8,
    lo: *mut u8,
    n: usize,
    g: Grad<'_>,
    lr: f32,
) -> KResult<()> {
    let (grad, gptr) = grad_ptr(g);
    let k = jit.dense(DenseSpec { w: st, grad }).map_err(jit_err(op))?;
    let (w, lo, f) = (w as usize, lo as usize, k.f);
    let (et, eg) = (st.size() as usize, grad.size());
    (0..n.div_ceil(CHUNK)).into_par_iter().for_each(|c| {
        let i0 = c * CHUNK;
        let len = CHUNK.min(n - i0);
        // SAFETY: `w` (and `lo`) and `g` hold `n` elements of their element types
        // (checked by the caller); this task owns elements `i0..i0+len`.
        unsafe {
            f(
                (w as *mut u8).add(i0 * et),
                (lo as *mut u8).add(i0 * et),
                (gptr as *const u8).add(i0 * eg),
                len as i64,
                lr,
            )
        }
    });
    Ok(())
}

/// `embedding_grad_dense {mode, rows}(dy[S,D], indices[, offsets]) -> f32[rows,D]`
/// with the sparse update kernel (`None`: a non-f32 result). The dense gradient
/// is an `embedding_update` with learning rate -1 on a zero table: each row
/// receives `0 - (-1·g) = 0 + g` for its positions in index order, bitwise the
/// definition's sums (`-1·g` is exact, and `w - (-x)` is `w + x`), race-free
/// over row ranges as the update is.
pub(crate) fn embedding_grad_dense(
    jit: &Jit,
    mode: Pool,
    rows: usize,
    c: &Checked<'_>,
    out_types: &[TensorType],
) -> Option<KResult<Vec<Tensor>>> {
    const OP: &str = "embedding_grad_dense";
    let inputs = c.inputs();
    if out_types.first()?.dtype != DType::F32 || !(2..=3).contains(&inputs.len()) {
        return None;
    }
    // The instance verified dy[S,D] against the indices' bags; the plan checks
    // the index values and the offsets (data).
    let &[_, d] = c.in_shape(0) else {
        return None;
    };
    Some((|| {
        let (dy, idx, off) = (inputs[0], inputs[1], inputs.get(2).copied());
        let plan = embedding_update_plan(OP, [rows, d], mode, dy, idx, off)?;
        let mut grad = vec![0.0f32; rows * d];
        let p = grad.as_mut_ptr().cast::<u8>();
        run_sparse(jit, OP, Store::F32, p, p, &plan, -1.0)?;
        Ok(vec![Tensor::f32(vec![rows, d], grad)])
    })())
}

/// The update `op` on checked operands with a JIT kernel (`None`: no JIT kernel
/// for this op or storage; the caller runs the reference kernel). Same contract
/// as [`crate::update::update_in_place`]; the instance verified the shapes and
/// dtypes, the bind each buffer's length ([`dlrm_ir::NodeInstance::bind_mut`]),
/// the plans check the index values and offsets.
pub(crate) fn update_in_place(op: &Op, c: &mut CheckedMut<'_>) -> Option<KResult<()>> {
    let jit = Jit::global().ok()?;
    let name = c.name();
    let rows = rows_of(op);
    let (ps, rest) = c.split();
    match (op, ps, rest) {
        (Op::SparseSgd { lr } | Op::SparseSgdRows { lr, .. }, [t], &[idx, g]) => {
            let shape = t.shape.clone();
            let Data::F32(w) = &mut t.data else {
                return None;
            };
            Some(
                sparse_sgd_plan_of(name, rows, &shape, idx, g).and_then(|plan| {
                    let p = w.as_mut_ptr().cast::<u8>();
                    run_sparse(jit, name, Store::F32, p, p, &plan, *lr)
                }),
            )
        }
        (
            Op::EmbeddingUpdate { mode, lr } | Op::EmbeddingUpdateRows { mode, lr, .. },
            [t],
            rest,
        ) => {
            let shape = t.shape.clone();
            let Data::F32(w) = &mut t.data else {
                return None;
            };
            Some((|| {
                let (dy, idx, off) = bag_operands(name, rest)?;
                let plan = embedding_update_plan_of(name, rows, &shape, *mode, dy, idx, off)?;
                let p = w.as_mut_ptr().cast::<u8>();
                run_sparse(jit, name, Store::F32, p, p, &plan, *lr)
            })())
        }
        (
            Op::SplitEmbeddingUpdate { mode, lr } | Op::SplitEmbeddingUpdateRows { mode, lr, .. },
            ps,
            rest,
        ) => Some((|| {
            let (dy, idx, off) = bag_operands(name, rest)?;
            let (shape, h, l) = split_pair(name, ps)?;
            let plan = embedding_update_plan_of(name, rows, shape, *mode, dy, idx, off)?;
            let (hp, lp) = (h.as_mut_ptr().cast::<u8>(), l.as_mut_ptr().cast::<u8>());
            run_sparse(jit, name, Store::Split, hp, lp, &plan, *lr)
        })()),
        (Op::Sgd { lr }, [w], &[g]) => {
            let st = match w.dtype() {
                DType::F32 => Store::F32,
                DType::BF16 => Store::BF16,
                _ => return None,
            };
            let n = w.numel();
            let p = match &mut w.data {
                Data::F32(v) => v.as_mut_ptr().cast::<u8>(),
                Data::BF16(v) => v.as_mut_ptr().cast::<u8>(),
                _ => return None,
            };
            Some(grad_of(name, g).and_then(|gr| run_dense(jit, name, st, p, p, n, gr, *lr)))
        }
        (Op::SplitSgd { lr }, ps, &[g]) => Some((|| {
            let gr = grad_of(name, g)?;
            let (_, h, l) = split_pair(name, ps)?;
            let n = h.len();
            let (hp, lp) = (h.as_mut_ptr().cast::<u8>(), l.as_mut_ptr().cast::<u8>());
            run_dense(jit, name, Store::Split, hp, lp, n, gr, *lr)
        })()),
        _ => None,
    }
}
