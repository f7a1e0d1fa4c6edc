//! The embedding-bag forward JIT kernel (fixed pooling or offsets, sum or mean,
//! f32 or bf16 tables and results, i64 or i32 indices; a whole table, or a row
//! shard for `embedding_bag_rows`, whose kernel adds only the indices in its
//! rows; `embedding_bag_weighted`, each row times its f32 weight, the product
//! rounded and then added as the definition says), parallel over blocks of
//! bags.
//!
//! Per bag, the row width `d` is processed in chunks of up to 32 columns (8 f32x4
//! accumulators, so they stay in registers); the bag's rows are added in index
//! order starting from zero, and `mean` divides by the bag's size (an empty bag
//! gives zeros) — exactly the reference's float operations, so f32 results are
//! bitwise equal to it. While it reads a row, the first chunk's pass asks for
//! the row [`prefetch::AHEAD`] positions later (of this bag or the next ones
//! of the call; [`prefetch`]), so the random row misses overlap.
//!
//! The bag sums (f32 or bf16 tables and results; not the gradient) go instead
//! to a native row kernel where the CPU has one ([`super::rows`]: AVX-512 or
//! AVX2+FMA): the generated code calls it once for all its bags, which it
//! sums with the same float operations in the same order, fetching the rows
//! ahead itself.
//!
//! Every index is validated against the table *before* the kernel runs (the error
//! names the position and the sample; the executor adds the table's name): the
//! generated code loads rows without bounds checks.
//!
//! ABI: `fn(table, idx, bounds, out, weights, s0: i64, s1: i64, first: i64,
//! span: i64)`: bags `s0..s1`, results written from `out` (bag `s0`'s row
//! first; a weighted kernel scales index position `p`'s row by the f32
//! `weights[p]`, the others ignore `weights`); with fixed
//! pooling `L` bag `s` is `idx[s·L .. (s+1)·L]`, else `idx[bounds[s] ..
//! bounds[s+1]]` (i64 bounds); row `i` is at `table + i·row_bytes`. A shard
//! kernel adds index `i` only when `i - first < span` (unsigned): its caller
//! passes a `table` that lies `first` rows before the shard's storage. The
//! others ignore `first` and `span`.

use super::buffers::Fresh;
use super::clif::{flags, for_range, load_f32, load_f32x4, store_f32, store_f32x4, var};
use super::gemm::Elt;
use super::layout::{copy_row, jit_err, zeros};
use super::linear::{elt_of, operand};
use super::prefetch::{self, Prefetch};
use super::rows::{self, RowKernel};
use super::{Jit, JitError, JitOptions};
use crate::reference::embedding::grad_bags;
use crate::reference::optim::{Rows, op_name};
use crate::reference::{
    Indices, KResult, KernelError, block_rows, dims_of, read_bounds, validate_bag_indices,
    validate_indices,
};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{InstBuilder, Value, types};
use cranelift_frontend::FunctionBuilder;
use dlrm_ir::module::ModOp;
use dlrm_ir::{Checked, DType, Data, Pool, Tensor, TensorType};
use rayon::prelude::*;

/// What an embedding-bag kernel is specialised on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BagSpec {
    /// Row width.
    pub d: usize,
    /// Table element type.
    pub table: Elt,
    /// Result element type.
    pub out: Elt,
    /// Indices are i64 (else i32).
    pub idx64: bool,
    /// Fixed pooling `L` (else bounds).
    pub pooling: Option<usize>,
    /// Mean (else sum).
    pub mean: bool,
    /// The table is a row shard (`embedding_bag_rows`): only the indices in
    /// `first .. first + span` add a row, `table[i - first]`.
    pub shard: bool,
    /// Each row is scaled by its position's f32 weight first
    /// (`embedding_bag_weighted`: the product rounded, then added).
    pub weighted: bool,
    /// `embedding_bag_grad` (`table` is `dy`, `idx64` unused): bag `s`'s
    /// gradient rows are `dy[s]` (divided by the bag's size for `mean`).
    pub grad: bool,
    /// The table is int8 row-wise (`embedding_bag_q8`, FBGEMM's fused 8-bit
    /// rows of `d` codes and an f32 scale and bias; `table` unused): native
    /// row kernels only.
    pub q8: bool,
    /// The row kernels: a native one calls [`super::rows`]' bag sum per bag
    /// (only for the specs it covers, [`rows::emit::covers_bag`]; the others
    /// say [`RowKernel::Cranelift`]).
    pub rows: RowKernel,
}

type BagFn =
    unsafe extern "C" fn(*const u8, *const u8, *const i64, *mut u8, *const f32, i64, i64, i64, i64);

/// A compiled embedding-bag kernel.
#[derive(Clone, Copy, Debug)]
pub struct BagKernel {
    spec: BagSpec,
    f: BagFn,
}

/// Columns per chunk (8 f32x4 accumulators).
const CW: usize = 32;

pub(crate) fn compile(jit: &Jit, spec: BagSpec) -> Result<BagKernel, JitError> {
    if spec.q8 && (spec.rows == RowKernel::Cranelift || spec.grad) {
        return Err(JitError::NoNative(spec.rows.name()));
    }
    if spec.rows != RowKernel::Cranelift && rows::emit::covers_bag(&spec) {
        let f = rows::emit::compile_bag(jit, spec, spec.rows)?;
        // SAFETY: generated with exactly this signature and the C call
        // convention.
        let f: BagFn = unsafe { std::mem::transmute::<*const u8, BagFn>(f) };
        return Ok(BagKernel { spec, f });
    }
    let (module, fetch) = prefetch::module(jit)?;
    let f = jit.compile_fn(module, "embedding_bag", 5, &[types::I64; 4], |m, b, p| {
        let (table, idx, bounds, out, weights) = (p[0], p[1], p[2], p[3], p[4]);
        let (s0, s1, first, span) = (p[5], p[6], p[7], p[8]);
        if spec.grad {
            return bag_grad(b, spec, table, bounds, out, s0, s1);
        }
        let d = spec.d;
        let eo = spec.out.size();
        let ei: i64 = if spec.idx64 { 8 } else { 4 };
        let row_bytes = (d * spec.table.size()) as i64;
        // The rows fetched ahead run up to the last position of bag s1 - 1.
        let fetch = Prefetch::new(m, b, fetch, row_bytes as usize);
        let (pend, _) = bag_bounds(b, spec.pooling, bounds, s1);
        for_range(b, s0, s1, 1, &mut |b, s| {
            let (start, end) = bag_bounds(b, spec.pooling, bounds, s);
            let rel = b.ins().isub(s, s0);
            let orow_off = b.ins().imul_imm_s(rel, (d * eo) as i64);
            let orow = b.ins().iadd(out, orow_off);
            let pool = RowSum {
                src: spec.table,
                out: spec.out,
                mean: spec.mean,
                weights: spec.weighted.then_some(Weights {
                    at: weights,
                    fused: false,
                }),
                fetch: Some((fetch, pend)),
            };
            sum_rows(b, pool, start, end, d, orow, &mut |b, p| {
                let ioff = b.ins().imul_imm_s(p, ei);
                let ia = b.ins().iadd(idx, ioff);
                let row = if spec.idx64 {
                    b.ins().load(types::I64, flags(), ia, 0)
                } else {
                    b.ins().sload32(flags(), ia, 0)
                };
                let live = spec.shard.then(|| {
                    let rel = b.ins().isub(row, first);
                    b.ins().icmp(IntCC::UnsignedLessThan, rel, span)
                });
                let roff = b.ins().imul_imm_s(row, row_bytes);
                (b.ins().iadd(table, roff), live)
            });
        });
    })?;
    // SAFETY: generated with exactly this signature and the C call convention.
    let f: BagFn = unsafe { std::mem::transmute::<*const u8, BagFn>(f) };
    Ok(BagKernel { spec, f })
}

/// The index positions `start..end` of bag `s`: `s·L..(s+1)·L` with fixed
/// pooling `L`, else `bounds[s]..bounds[s+1]`.
pub(crate) fn bag_bounds(
    b: &mut FunctionBuilder<'_>,
    pooling: Option<usize>,
    bounds: Value,
    s: Value,
) -> (Value, Value) {
    match pooling {
        Some(l) => {
            let st = b.ins().imul_imm_s(s, l as i64);
            let en = b.ins().iadd_imm_s(st, l as i64);
            (st, en)
        }
        None => {
            let off = b.ins().ishl_imm_u(s, 3);
            let a = b.ins().iadd(bounds, off);
            let st = b.ins().load(types::I64, flags(), a, 0);
            let en = b.ins().load(types::I64, flags(), a, 8);
            (st, en)
        }
    }
}

/// The divisor of a `mean` bag `start..end`: its size as f32 (1 when empty).
fn bag_size(b: &mut FunctionBuilder<'_>, start: Value, end: Value) -> Value {
    let cnt = b.ins().isub(end, start);
    let empty = b.ins().icmp_imm_s(IntCC::Equal, cnt, 0);
    let one = b.ins().iconst(types::I64, 1);
    let cnt = b.ins().select(empty, one, cnt);
    b.ins().fcvt_from_sint(types::F32, cnt)
}

/// `embedding_bag_grad` over bags `s0..s1`: each gradient row of bag `s` is
/// `dy[s]`, divided by the bag's size for `mean` (the reference's `v / count`,
/// element by element); the rows are written from `out` on, bag `s0`'s first
/// row first.
fn bag_grad(
    b: &mut FunctionBuilder<'_>,
    spec: BagSpec,
    dy: Value,
    bounds: Value,
    out: Value,
    s0: Value,
    s1: Value,
) {
    let (ed, eo) = (spec.table.size() as i64, spec.out.size() as i64);
    let d = spec.d as i64;
    let (base, _) = bag_bounds(b, spec.pooling, bounds, s0);
    for_range(b, s0, s1, 1, &mut |b, s| {
        let (start, end) = bag_bounds(b, spec.pooling, bounds, s);
        let src = b.ins().imul_imm_s(s, d * ed);
        let src = b.ins().iadd(dy, src);
        let div = spec.mean.then(|| {
            let c = bag_size(b, start, end);
            (c, b.ins().splat(types::F32X4, c))
        });
        for_range(b, start, end, 1, &mut |b, r| {
            let rel = b.ins().isub(r, base);
            let dst = b.ins().imul_imm_s(rel, d * eo);
            let dst = b.ins().iadd(out, dst);
            copy_row(
                b,
                spec.table,
                spec.out,
                src,
                dst,
                spec.d,
                &mut |b, x, vector| match div {
                    Some((c, cv)) => b.ins().fdiv(x, if vector { cv } else { c }),
                    None => x,
                },
            );
        });
    });
}

/// The element types and pooling of a [`sum_rows`].
#[derive(Clone, Copy)]
pub(super) struct RowSum {
    /// Element type of the rows summed.
    pub src: Elt,
    /// Element type of the result.
    pub out: Elt,
    /// Divide by the number of rows (an empty sum stays zero).
    pub mean: bool,
    /// Scale row `p` by the f32 at `weights.at + 4·p` first: the sum is then
    /// `Σ_p weight_p · row_p`.
    pub weights: Option<Weights>,
    /// While row `p` is read, fetch the rows [`prefetch::AHEAD`] positions on
    /// ([`Prefetch::ahead`]), up to position `end - 1` of this value `end`
    /// (positions past the bag's end are rows too, of the next bags).
    pub fetch: Option<(Prefetch, Value)>,
}

/// The per-row weights of a [`sum_rows`].
#[derive(Clone, Copy)]
pub(super) struct Weights {
    /// Address of the first row's f32 weight.
    pub at: Value,
    /// `acc + w·x` in one rounding (a fused multiply-add), else the product
    /// rounded, then the sum (`embedding_bag_weighted`'s definition).
    pub fused: bool,
}

/// The address of row `p` of a [`sum_rows`], and whether it is added (`None`:
/// always; else a condition, false to skip the row).
pub(super) type RowAt<'a> =
    dyn FnMut(&mut FunctionBuilder<'_>, Value) -> (Value, Option<Value>) + 'a;

/// Emits the sum, from +0 and in order, of the `w`-element rows at `row(b, p)`
/// for `p` in `start..end` (weighted, or divided by their count `end - start`
/// for `mean`, as `pool` says; rows that `row` marks as skipped add nothing but
/// count), stored at `orow`: chunks of up to [`CW`] columns, each summed over
/// all the rows in registers (f32x4 groups, then a scalar tail).
pub(super) fn sum_rows(
    b: &mut FunctionBuilder<'_>,
    pool: RowSum,
    start: Value,
    end: Value,
    w: usize,
    orow: Value,
    row: &mut RowAt<'_>,
) {
    let mut c0 = 0;
    while c0 < w {
        let cols = CW.min(w - c0);
        sum_chunk(b, pool, start, end, orow, c0, cols, row);
        c0 += cols;
    }
}

/// Columns `c0..c0+cols` of a [`sum_rows`]: accumulate the rows, pool, store.
#[allow(clippy::too_many_arguments)]
fn sum_chunk(
    b: &mut FunctionBuilder<'_>,
    pool: RowSum,
    start: Value,
    end: Value,
    orow: Value,
    c0: usize,
    cols: usize,
    row: &mut RowAt<'_>,
) {
    let (et, eo) = (pool.src.size(), pool.out.size());
    let nv = cols / 4;
    let tail = cols % 4;
    let zf = b.ins().f32const(0.0);
    let zv = b.ins().splat(types::F32X4, zf);
    let vacc: Vec<_> = (0..nv).map(|_| var(b, types::F32X4, zv)).collect();
    let sacc: Vec<_> = (0..tail).map(|_| var(b, types::F32, zf)).collect();
    for_range(b, start, end, 1, &mut |b, p| {
        let (rp, live) = row(b, p);
        if let Some((fetch, pend)) = pool.fetch.filter(|_| c0 == 0) {
            // Whole rows, in the first chunk's pass (a row another kernel's
            // shard holds is not fetched: this row's address instead).
            fetch.ahead(b, p, pend, &mut |b, q| {
                let (qp, qlive) = row(b, q);
                vec![qlive.map_or(qp, |l| b.ins().select(l, qp, rp))]
            });
        }
        let skip = live.map(|live| {
            let (add, next) = (b.create_block(), b.create_block());
            b.ins().brif(live, add, &[], next, &[]);
            b.switch_to_block(add);
            next
        });
        // acc + x, or acc + weight·x (in one rounding when fused).
        let wt = pool.weights.map(|wts| {
            let off = b.ins().imul_imm_s(p, 4);
            let at = b.ins().iadd(wts.at, off);
            let w = b.ins().load(types::F32, flags(), at, 0);
            (w, b.ins().splat(types::F32X4, w))
        });
        let fused = pool.weights.is_some_and(|w| w.fused);
        let add = |b: &mut FunctionBuilder<'_>, a: Value, x: Value, w: Option<Value>| match w {
            Some(w) if fused => b.ins().fma(x, w, a),
            Some(w) => {
                let prod = b.ins().fmul(w, x);
                b.ins().fadd(a, prod)
            }
            None => b.ins().fadd(a, x),
        };
        for (v, &acc) in vacc.iter().enumerate() {
            let x = load_f32x4(b, pool.src, rp, ((c0 + 4 * v) * et) as i32);
            let a = b.use_var(acc);
            let s = add(b, a, x, wt.map(|w| w.1));
            b.def_var(acc, s);
        }
        for (l, &acc) in sacc.iter().enumerate() {
            let x = load_f32(b, pool.src, rp, ((c0 + 4 * nv + l) * et) as i32);
            let a = b.use_var(acc);
            let s = add(b, a, x, wt.map(|w| w.0));
            b.def_var(acc, s);
        }
        if let Some(next) = skip {
            b.ins().jump(next, &[]);
            b.switch_to_block(next);
        }
    });
    let mut vs: Vec<Value> = vacc.iter().map(|&a| b.use_var(a)).collect();
    let mut ss: Vec<Value> = sacc.iter().map(|&a| b.use_var(a)).collect();
    if pool.mean {
        // Divide by the bag size; an empty bag (all zeros) is left as is.
        let cf = bag_size(b, start, end);
        let cv = b.ins().splat(types::F32X4, cf);
        for v in vs.iter_mut() {
            *v = b.ins().fdiv(*v, cv);
        }
        for s in ss.iter_mut() {
            *s = b.ins().fdiv(*s, cf);
        }
    }
    for (v, &x) in vs.iter().enumerate() {
        store_f32x4(b, pool.out, x, orow, ((c0 + 4 * v) * eo) as i32);
    }
    for (l, &x) in ss.iter().enumerate() {
        store_f32(b, pool.out, x, orow, ((c0 + 4 * nv + l) * eo) as i32);
    }
}

/// `embedding_bag_q8` (its JIT kernel in the registry, `crate::modules`): the
/// bag kernels' loop with the int8 row kernel, weighted with a 4th operand.
pub(crate) fn embedding_bag_q8(
    jit: &Jit,
    m: &ModOp,
    c: &Checked<'_>,
    out_types: &[TensorType],
    _: &JitOptions,
) -> Option<KResult<Vec<Tensor>>> {
    let (mode, last_offset) = dlrm_ir::ops::embedding_bag_q8::attrs_of(m);
    let weighted = c.inputs().len() == 4;
    embedding_bag(jit, (mode, weighted, last_offset), Rows::All, c, out_types)
}

/// `embedding_bag` with a JIT kernel (`None`: non-float table or result); with
/// `rows` a [`Rows::Shard`], `embedding_bag_rows` on that shard of the table;
/// `weighted`: `embedding_bag_weighted` (`table, indices, offsets, weights`,
/// sum; `None` for non-f32 weights); `last_offset`: offsets `[S+1]`, the last
/// one ending the last bag, any start (only the indices in a bag are read and
/// checked).
pub(crate) fn embedding_bag(
    jit: &Jit,
    (mode, weighted, last_offset): (Pool, bool, bool),
    rows: Rows,
    c: &Checked<'_>,
    out_types: &[TensorType],
) -> Option<KResult<Vec<Tensor>>> {
    let inputs = c.inputs();
    // An int8 row-wise table (`embedding_bag_q8`): native row kernels only.
    let q8 = inputs[0].dtype() == DType::U8;
    let op = match (q8, weighted) {
        (true, _) => "embedding_bag_q8",
        (false, true) => "embedding_bag_weighted",
        (false, false) => op_name(rows, "embedding_bag", "embedding_bag_rows"),
    };
    if q8 && (rows != Rows::All || rows::row_kernel() == RowKernel::Cranelift) {
        return None;
    }
    let arity_ok = match weighted {
        true => inputs.len() == 4,
        false if last_offset => inputs.len() == 3,
        false => (2..=3).contains(&inputs.len()),
    };
    if !arity_ok {
        return None;
    }
    let weights = match (weighted, inputs.get(3).map(|t| &t.data)) {
        (false, _) => None,
        (true, Some(Data::F32(w))) => Some(w.as_slice()),
        (true, _) => return None,
    };
    let (tab_elt, tab_ptr) = match &inputs[0].data {
        Data::F32(v) => (Elt::F32, v.as_ptr().cast::<u8>()),
        Data::BF16(v) => (Elt::BF16, v.as_ptr().cast::<u8>()),
        Data::U8(v) => (Elt::F32, v.as_ptr()),
        _ => return None,
    };
    let out = match out_types.first()?.dtype {
        DType::F32 => Elt::F32,
        DType::BF16 => Elt::BF16,
        _ => return None,
    };
    // The instance verified the ranks, the bag count, the weights' shape and the
    // shard within its table; the buffers hold their shapes' elements. The index
    // values and the offsets are checked below (data).
    let &[stored, width] = c.in_shape(0) else {
        return None;
    };
    // An int8 row holds `d` codes and 8 bytes of scale and bias.
    let d = if q8 { width.checked_sub(8)? } else { width };
    Some((|| {
        // Indices are validated against the whole table; a shard holds its
        // rows `first..first + stored`.
        let total = rows.table_rows(stored);
        let first = rows.first();
        let idx = Indices::of(inputs[1]).ok_or_else(|| KernelError::DType {
            op,
            reason: format!("indices must be i64 or i32, got {}", inputs[1].dtype()),
        })?;
        let (s, pooling, bounds) = bags(op, c, idx, total, last_offset)?;
        let mut spec = BagSpec {
            d,
            table: tab_elt,
            out,
            idx64: matches!(idx, Indices::I64(_)),
            pooling,
            mean: mode == Pool::Mean,
            shard: rows != Rows::All,
            weighted,
            grad: false,
            q8,
            rows: RowKernel::Cranelift,
        };
        if q8 || rows::emit::covers_bag(&spec) {
            spec.rows = rows::row_kernel();
        }
        let k = jit.embedding(spec).map_err(|e| KernelError::Jit {
            op,
            reason: e.to_string(),
        })?;
        // Not zeroed: the kernel stores every column of every bag (an empty
        // bag's zeros too), and the tasks of `run_bags` cover all `s` bags.
        let mut fresh = Fresh::new(out, s * d);
        // SAFETY: every index was validated against the table's `total` rows
        // of `d` elements (`bags`), of which the storage at `tab_ptr` holds
        // `first..first + stored` (stored·d elements, `Checked` above); the
        // bags are the validated `s×L` indices or `bounds` (s+1 non-decreasing
        // entries at most the indices' length, the indices between the first
        // and the last validated); `weights`: one f32 per index (checked);
        // `fresh` holds `s × d` elements of `out`.
        unsafe {
            run_bags(
                k,
                (&mut fresh, s),
                (tab_ptr, first, stored),
                idx,
                &bounds,
                weights,
            );
        }
        // SAFETY: every bag's row was written by its task's kernel calls
        // (`run_bags`); with s = 0 or d = 0 the result is empty.
        Ok(vec![unsafe { fresh.assume_init() }.tensor(vec![s, d])])
    })())
}

/// The bags of an `embedding_bag` call on checked operands: their count, the
/// fixed pooling `L` (indices `[S, L]`) or else the bounds read from the
/// offsets (`S + 1` entries, `last_offset`: the offsets' own last one), the
/// index values validated against the table's `total` rows (data: only the
/// indices in a bag with `last_offset`).
fn bags(
    op: &'static str,
    c: &Checked<'_>,
    idx: Indices<'_>,
    total: usize,
    last_offset: bool,
) -> KResult<(usize, Option<usize>, Vec<i64>)> {
    let inputs = c.inputs();
    if inputs.len() == 2 {
        let [s, l] = dims_of::<2>(c, 1)?;
        validate_indices(op, idx, total, Some(l), None)?;
        return Ok((s, Some(l), Vec::new()));
    }
    let n = idx.len();
    let bounds = read_bounds(op, inputs[2], n, last_offset)?;
    let s = bounds.len() - 1;
    if last_offset {
        validate_bag_indices(op, idx, total, &bounds)?;
    } else {
        validate_indices(op, idx, total, None, Some(&bounds[..s]))?;
    }
    Ok((s, None, bounds))
}

/// Runs the bag kernel `k` on the `s` bags into `fresh` (`s × d` elements of
/// the kernel's result type), in blocks of bags, one rayon task and one kernel
/// call each (the kernel fetches its rows ahead itself).
///
/// # Safety
///
/// `tab` holds the table rows `first..first + stored` of `d` elements of the
/// kernel's table type; every index of every bag was validated against the
/// whole table, and the kernel reads only the rows in that range; the bags are
/// the kernel's fixed pooling over `s·L` indices, or `bounds` (`s + 1`
/// non-decreasing entries at most the indices' length) over `idx`; `weights`,
/// with a weighted kernel, holds one f32 per index; `fresh` holds `s × d`
/// elements.
unsafe fn run_bags(
    k: BagKernel,
    (fresh, s): (&mut Fresh, usize),
    (tab_ptr, first, stored): (*const u8, usize, usize),
    idx: Indices<'_>,
    bounds: &[i64],
    weights: Option<&[f32]>,
) {
    let (d, tab_elt) = (k.spec.d, k.spec.table);
    // Not zeroed: the kernel stores every column of every bag (an empty
    // bag's zeros too), and the tasks below cover all `s` bags.
    if s > 0 && d > 0 {
        let idx_ptr = match idx {
            Indices::I64(v) => v.as_ptr().cast::<u8>(),
            Indices::I32(v) => v.as_ptr().cast::<u8>(),
        } as usize;
        let row_bytes = if k.spec.q8 { d + 8 } else { d * tab_elt.size() };
        // Table row `r` at `tab + r·row_bytes`: `first` rows before a
        // shard's storage (only its own rows are read or fetched).
        let tab = (tab_ptr as usize).wrapping_sub(first * row_bytes);
        let bnd = bounds.as_ptr() as usize;
        let wts = weights.map_or(std::ptr::null(), <[f32]>::as_ptr) as usize;
        let sb = block_rows(s, 8, 256);
        let f = k.f;
        let go = |blk: usize, po: *mut u8, bags: usize| {
            let s0 = blk * sb;
            // SAFETY: every index was validated against the table's `total`
            // rows of `d` elements, of which the storage holds `first..first +
            // stored` (stored·d elements, `Checked` above; with a shard, the
            // kernel reads only the rows in that range, at `tab`, see above);
            // fixed pooling: indices s·L..(s+1)·L of the validated `s×L`
            // indices; offsets: `bounds` holds s+1 non-decreasing entries at
            // most the indices' length (read_bounds), the indices between the
            // first and the last validated (validate_bag_indices); the rows
            // fetched ahead are those of positions up to the end of bag
            // `s0 + bags - 1`, among them; weighted: one f32 weight per index
            // (checked). `po` is this task's own `bags × d` chunk of the
            // result, bag s0's row first.
            unsafe {
                f(
                    tab as *const u8,
                    idx_ptr as *const u8,
                    bnd as *const i64,
                    po,
                    wts as *const f32,
                    s0 as i64,
                    (s0 + bags) as i64,
                    first as i64,
                    stored as i64,
                )
            }
        };
        fresh
            .buf()
            .chunks(sb * d)
            .into_par_iter()
            .enumerate()
            .for_each(|(blk, mut ch)| go(blk, ch.as_mut_ptr(), ch.len() / d));
    }
}

/// `embedding_bag_grad` with a JIT kernel (`None`: non-float `dy` or result).
/// The operands are checked against the node's instance, the offsets as the
/// reference checks them ([`crate::reference::embedding::grad_bags`]; the index
/// values are not read).
pub(crate) fn embedding_bag_grad(
    jit: &Jit,
    (mode, last_offset): (Pool, bool),
    c: &Checked<'_>,
    out_types: &[TensorType],
) -> Option<KResult<Vec<Tensor>>> {
    const OP: &str = "embedding_bag_grad";
    if c.inputs().len() > 3 {
        return None; // per-sample weights: the reference kernel
    }
    let dy = operand(c.input(0))?;
    let out = elt_of(out_types.first()?.dtype)?;
    Some((|| {
        let g = grad_bags(c, last_offset)?;
        let spec = BagSpec {
            d: g.d,
            table: dy.elt(),
            out,
            idx64: false,
            pooling: g.pooling,
            mean: mode == Pool::Mean,
            shard: false,
            weighted: false,
            grad: true,
            q8: false,
            rows: RowKernel::Cranelift,
        };
        let k = jit.embedding(spec).map_err(jit_err(OP))?;
        let mut data = zeros(k.spec.out, g.n * k.spec.d);
        if g.n > 0 && g.d > 0 {
            let f = k.f;
            let sb = block_rows(g.s, 8, 256);
            let (pdy, bnd) = (dy.ptr_at(0) as usize, g.bounds.as_ptr() as usize);
            let go = |s0: usize, po: *mut u8| {
                // SAFETY: `dy` holds s·d elements of the spec's type (checked);
                // bags s0..s1 read its rows s0..s1 < s; with offsets, `bounds`
                // holds the s+1 validated, non-decreasing row bounds (at most
                // n). `po` is this task's own run of the result: the rows
                // rows(s0).start..rows(s1-1).end, `d` elements each, which the
                // kernel writes relative to rows(s0).start.
                unsafe {
                    f(
                        pdy as *const u8,
                        std::ptr::null(),
                        bnd as *const i64,
                        po,
                        std::ptr::null(),
                        s0 as i64,
                        (s0 + sb).min(g.s) as i64,
                        0,
                        0,
                    )
                }
            };
            match &mut data {
                Data::F32(o) => g
                    .blocks(o, sb)
                    .into_par_iter()
                    .for_each(|(s0, o)| go(s0, o.as_mut_ptr().cast())),
                Data::BF16(o) => g
                    .blocks(o, sb)
                    .into_par_iter()
                    .for_each(|(s0, o)| go(s0, o.as_mut_ptr().cast())),
                _ => {}
            }
        }
        Ok(vec![Tensor {
            shape: g.shape,
            data,
        }])
    })())
}
