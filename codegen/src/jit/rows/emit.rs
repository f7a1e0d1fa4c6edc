//! The generated side of the native row kernels: the embedding-bag forward and
//! the sparse update JIT kernels that keep their loop (over bags; over runs of
//! entries) and call a native row kernel ([`super::BagFn`], [`super::RunFn`])
//! for each bag or run, bound in their module under the kernel's symbol.
//!
//! Each writes the call's constant arguments ([`super::BagArgs`],
//! [`super::RunArgs`]) once into a stack slot at entry, at the offsets
//! `std::mem::offset_of!` gives, and passes its address to every call. The
//! JIT functions' own ABIs are those of the Cranelift kernels they replace
//! ([`crate::jit::embedding`], [`crate::jit::sparse`]).

use super::super::embedding::{BagSpec, bag_bounds};
use super::super::gemm::Elt;
use super::super::sparse::{SparseSpec, Store};
use super::super::{Jit, JitError};
use super::{
    B_IDX64, B_MEAN, B_OUT_BF16, B_SHARD, B_TABLE_BF16, B_TABLE_Q8, B_WEIGHTED, BagArgs,
    R_GRAD_BF16, R_MEAN, R_SPLIT, RowKernel, RunArgs, ahead_for,
};
use cranelift_codegen::ir::{AbiParam, InstBuilder, StackSlotData, StackSlotKind, Value, types};
use cranelift_frontend::FunctionBuilder;
use cranelift_jit::JITModule;
use cranelift_module::{FuncId, Linkage, Module};
use std::mem::offset_of;

/// Whether the native forward covers `spec`: every bag sum (f32 or bf16 table
/// and result, any pooling, indices, shard, weights), not the gradient.
pub(crate) fn covers_bag(spec: &BagSpec) -> bool {
    !spec.grad
}

/// Whether the native update covers `spec`: f32 or Split-SGD-BF16 storage
/// (f32 or bf16 gradients).
pub(crate) fn covers_run(spec: &SparseSpec) -> bool {
    matches!(spec.table, Store::F32 | Store::Split)
}

/// A module in which `symbol` is bound to `entry`, with the import declared:
/// `fn(args, …)` of `params` i64 (pointer) parameters, returning nothing.
fn module_for(
    jit: &Jit,
    symbol: &str,
    entry: *const u8,
    params: usize,
) -> Result<(JITModule, FuncId), JitError> {
    let mut module = jit.module_with_symbols(&[(symbol, entry)])?;
    let mut sig = module.make_signature();
    sig.params
        .extend(std::iter::repeat_n(AbiParam::new(types::I64), params));
    let id = module
        .declare_function(symbol, Linkage::Import, &sig)
        .map_err(JitError::module)?;
    Ok((module, id))
}

/// A stack slot of `T`'s size and alignment holding `fields` (each value
/// stored at its byte offset); its address.
fn args_slot<T>(b: &mut FunctionBuilder<'_>, fields: &[(Value, usize)]) -> Value {
    let size = std::mem::size_of::<T>() as u32;
    let align = std::mem::align_of::<T>().trailing_zeros() as u8;
    let slot =
        b.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, size, align));
    for &(v, off) in fields {
        b.ins().stack_store(types::I64, v, slot, off as i32);
    }
    b.ins().stack_addr(types::I64, slot, 0)
}

/// The embedding-bag forward of `spec` (which [`covers_bag`]) calling `k`'s
/// native bag sum once for all its bags; the ABI of [`crate::jit::embedding`]'s kernel.
pub(crate) fn compile_bag(jit: &Jit, spec: BagSpec, k: RowKernel) -> Result<*const u8, JitError> {
    let (symbol, entry) = k.bag().ok_or(JitError::NoNative(k.name()))?;
    let (module, id) = module_for(jit, symbol, entry as *const u8, 4)?;
    jit.compile_fn(module, "embedding_bag", 5, &[types::I64; 4], |m, b, p| {
        let f = m.declare_func_in_func(id, b.func);
        let (table, idx, bounds, out, weights) = (p[0], p[1], p[2], p[3], p[4]);
        let (s0, s1, first, span) = (p[5], p[6], p[7], p[8]);
        let mut fl = 0;
        for (on, bit) in [
            (spec.idx64, B_IDX64),
            (spec.shard, B_SHARD),
            (spec.weighted, B_WEIGHTED),
            (spec.mean, B_MEAN),
            (spec.table == Elt::BF16, B_TABLE_BF16),
            (spec.out == Elt::BF16, B_OUT_BF16),
            (spec.q8, B_TABLE_Q8),
        ] {
            fl |= if on { bit } else { 0 };
        }
        // The rows fetched ahead run up to the last position of bag s1 - 1.
        let (pend, _) = bag_bounds(b, spec.pooling, bounds, s1);
        let pooling = spec.pooling.map_or(-1, |l| l as i64);
        let pooling = b.ins().iconst(types::I64, pooling);
        // A table row's bytes (f32, bf16, or int8 codes and their scale and
        // bias), as `row_stride` reads them.
        let row = match (spec.q8, spec.table) {
            (true, _) => spec.d + 8,
            (false, Elt::BF16) => spec.d * 2,
            (false, Elt::F32) => spec.d * 4,
        };
        let ahead = b.ins().iconst(types::I64, ahead_for(row) as i64);
        let d = b.ins().iconst(types::I64, spec.d as i64);
        let fl = b.ins().iconst(types::I32, i64::from(fl));
        let args = args_slot::<BagArgs>(
            b,
            &[
                (table, offset_of!(BagArgs, table)),
                (idx, offset_of!(BagArgs, idx)),
                (weights, offset_of!(BagArgs, weights)),
                (d, offset_of!(BagArgs, d)),
                (first, offset_of!(BagArgs, first)),
                (span, offset_of!(BagArgs, span)),
                (pend, offset_of!(BagArgs, pend)),
                (bounds, offset_of!(BagArgs, bounds)),
                (pooling, offset_of!(BagArgs, pooling)),
                (ahead, offset_of!(BagArgs, ahead)),
                (fl, offset_of!(BagArgs, flags)),
            ],
        );
        // One call for all the bags (`out` is bag s0's row).
        b.ins().call(f, &[args, s0, s1, out]);
    })
}

/// The sparse update of `spec` (which [`covers_run`]) calling `k`'s native
/// run update once for all its entries; the ABI of [`crate::jit::sparse`]'s
/// kernel.
pub(crate) fn compile_run(
    jit: &Jit,
    spec: SparseSpec,
    k: RowKernel,
) -> Result<*const u8, JitError> {
    let (symbol, entry) = k.run().ok_or(JitError::NoNative(k.name()))?;
    let (module, id) = module_for(jit, symbol, entry as *const u8, 3)?;
    let scalars = [types::I64, types::F32];
    jit.compile_fn(module, "sparse_update", 5, &scalars, |m, b, p| {
        let f = m.declare_func_in_func(id, b.func);
        let (hi, lo, grad, ent, bounds) = (p[0], p[1], p[2], p[3], p[4]);
        let (n, lr) = (p[5], p[6]);
        let mut fl = 0;
        if spec.table == Store::Split {
            fl |= R_SPLIT;
        }
        if spec.mean && !spec.per_pos {
            fl |= R_MEAN;
        }
        if spec.grad == Elt::BF16 {
            fl |= R_GRAD_BF16;
        }
        let d = b.ins().iconst(types::I64, spec.d as i64);
        let pooling = spec.pooling.map_or(-1, |l| l as i64);
        let pooling = b.ins().iconst(types::I64, pooling);
        // A row's bytes: f32, or both bf16 halves of a split one.
        let ahead = b.ins().iconst(types::I64, ahead_for(spec.d * 4) as i64);
        let fl = b.ins().iconst(types::I32, i64::from(fl));
        let args = args_slot::<RunArgs>(
            b,
            &[
                (hi, offset_of!(RunArgs, hi)),
                (lo, offset_of!(RunArgs, lo)),
                (grad, offset_of!(RunArgs, grad)),
                (bounds, offset_of!(RunArgs, bounds)),
                (d, offset_of!(RunArgs, d)),
                (pooling, offset_of!(RunArgs, pooling)),
                (ahead, offset_of!(RunArgs, ahead)),
                (lr, offset_of!(RunArgs, lr)),
                (fl, offset_of!(RunArgs, flags)),
            ],
        );
        // One call for all the entries, run by run.
        b.ins().call(f, &[args, ent, n]);
    })
}
