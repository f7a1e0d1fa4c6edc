//! Small Cranelift code-generation helpers shared by the kernel generators:
//! f32/bf16 loads and stores (scalar and f32x4), the bf16 rounding rule, loops.
//!
//! bf16 loads widen exactly (`bits << 16`); bf16 stores round to nearest even and
//! keep NaN a (quiet) NaN, exactly as `half::bf16::from_f32`.

use super::gemm::Elt;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{Endianness, InstBuilder, MemFlagsData, Value, types};
use cranelift_frontend::{FunctionBuilder, Variable};

/// Flags of every kernel memory access: in bounds (checked by the Rust wrapper),
/// little-endian.
pub(crate) fn flags() -> MemFlagsData {
    MemFlagsData::trusted().with_endianness(Endianness::Little)
}

/// Flags of a lane-reinterpreting `bitcast` (endianness only).
pub(crate) fn bc_flags() -> MemFlagsData {
    MemFlagsData::new().with_endianness(Endianness::Little)
}

/// Loads one element as f32.
pub(crate) fn load_f32(b: &mut FunctionBuilder<'_>, elt: Elt, p: Value, off: i32) -> Value {
    match elt {
        Elt::F32 => b.ins().load(types::F32, flags(), p, off),
        Elt::BF16 => {
            let h = b.ins().uload16(types::I32, flags(), p, off);
            let w = b.ins().ishl_imm_u(h, 16);
            b.ins().bitcast(types::F32, bc_flags(), w)
        }
    }
}

/// Loads 4 consecutive elements as f32x4.
pub(crate) fn load_f32x4(b: &mut FunctionBuilder<'_>, elt: Elt, p: Value, off: i32) -> Value {
    match elt {
        Elt::F32 => b.ins().load(types::F32X4, flags(), p, off),
        Elt::BF16 => {
            let h = b.ins().uload16x4(flags(), p, off);
            let w = b.ins().ishl_imm_u(h, 16);
            b.ins().bitcast(types::F32X4, bc_flags(), w)
        }
    }
}

fn splat_i32(b: &mut FunctionBuilder<'_>, v: i32) -> Value {
    let c = b.ins().iconst(types::I32, i64::from(v));
    b.ins().splat(types::I32X4, c)
}

/// f32x4 -> i32x4 of bf16 bit patterns (nearest even, NaN quiet).
pub(crate) fn bf16_bits_x4(b: &mut FunctionBuilder<'_>, x: Value) -> Value {
    let bits = b.ins().bitcast(types::I32X4, bc_flags(), x);
    let hi = b.ins().ushr_imm_u(bits, 16);
    let one = splat_i32(b, 1);
    let lsb = b.ins().band(hi, one);
    let k = splat_i32(b, 0x7FFF);
    let t = b.ins().iadd(bits, k);
    let t = b.ins().iadd(t, lsb);
    let rounded = b.ins().ushr_imm_u(t, 16);
    let q = splat_i32(b, 0x40);
    let quiet = b.ins().bor(hi, q);
    let nan = b.ins().fcmp(FloatCC::Unordered, x, x);
    b.ins().bitselect(nan, quiet, rounded)
}

/// Scalar f32 -> i32 holding the bf16 bit pattern (nearest even, NaN quiet).
fn bf16_bits(b: &mut FunctionBuilder<'_>, x: Value) -> Value {
    let bits = b.ins().bitcast(types::I32, bc_flags(), x);
    let hi = b.ins().ushr_imm_u(bits, 16);
    let lsb = b.ins().band_imm_u(hi, 1);
    let t = b.ins().iadd_imm_s(bits, 0x7FFF);
    let t = b.ins().iadd(t, lsb);
    let rounded = b.ins().ushr_imm_u(t, 16);
    let quiet = b.ins().bor_imm_u(hi, 0x40);
    let nan = b.ins().fcmp(FloatCC::Unordered, x, x);
    b.ins().select(nan, quiet, rounded)
}

/// Stores one f32 as `elt`.
pub(crate) fn store_f32(b: &mut FunctionBuilder<'_>, elt: Elt, x: Value, p: Value, off: i32) {
    match elt {
        Elt::F32 => {
            b.ins().store(flags(), x, p, off);
        }
        Elt::BF16 => {
            let w = bf16_bits(b, x);
            b.ins().istore16(flags(), w, p, off);
        }
    }
}

/// Stores an f32x4 as 4 consecutive `elt`.
pub(crate) fn store_f32x4(b: &mut FunctionBuilder<'_>, elt: Elt, x: Value, p: Value, off: i32) {
    match elt {
        Elt::F32 => {
            b.ins().store(flags(), x, p, off);
        }
        Elt::BF16 => {
            let w = bf16_bits_x4(b, x);
            let h = b.ins().unarrow(w, w);
            let q = b.ins().bitcast(types::I64X2, bc_flags(), h);
            let lo = b.ins().extractlane(q, 0);
            b.ins().store(flags(), lo, p, off);
        }
    }
}

/// `x > 0 || x is NaN ? x : 0` on f32x4 (NaN kept, as the interpreter keeps it).
pub(crate) fn relu_x4(b: &mut FunctionBuilder<'_>, x: Value) -> Value {
    let zf = b.ins().f32const(0.0);
    let z = b.ins().splat(types::F32X4, zf);
    // `x > 0` or NaN (kept, as the interpreter keeps it): the mask keeps x.
    let m = b.ins().fcmp(FloatCC::UnorderedOrGreaterThan, x, z);
    let mf = b.ins().bitcast(types::F32X4, bc_flags(), m);
    b.ins().band(x, mf)
}

/// A variable initialised to `init`.
pub(crate) fn var(b: &mut FunctionBuilder<'_>, ty: types::Type, init: Value) -> Variable {
    let v = b.declare_var(ty);
    b.def_var(v, init);
    v
}

/// `for i in (start..end).step_by(step) { body(b, i) }` on i64 values.
pub(crate) fn for_range(
    b: &mut FunctionBuilder<'_>,
    start: Value,
    end: Value,
    step: i64,
    body: &mut dyn FnMut(&mut FunctionBuilder<'_>, Value),
) {
    let iv = var(b, types::I64, start);
    let head = b.create_block();
    let blk = b.create_block();
    let exit = b.create_block();
    b.ins().jump(head, &[]);
    b.switch_to_block(head);
    let i = b.use_var(iv);
    let c = b.ins().icmp(IntCC::SignedLessThan, i, end);
    b.ins().brif(c, blk, &[], exit, &[]);
    b.switch_to_block(blk);
    let i = b.use_var(iv);
    body(b, i);
    let i = b.use_var(iv);
    let next = b.ins().iadd_imm_s(i, step);
    b.def_var(iv, next);
    b.ins().jump(head, &[]);
    b.switch_to_block(exit);
}
