//! Loss JIT kernels on logits: `bce_logits` and `bce_logits_grad`, f32 or bf16
//! operands and result.
//!
//! Cranelift has no `exp`/`log1p`: the kernels call [`EXP_SYMBOL`] and
//! [`LOG1P_SYMBOL`], JIT symbols bound to Rust's own `f32::exp` and `f32::ln_1p`
//! (the functions the reference kernel and the interpreter call), so every
//! element is computed by the definition's own operations, unfused, in its order:
//! - `bce_logits`: `acc += (max(z,0) - z·y) + ln_1p(exp(-|z|))` over the elements
//!   in row-major order, one f32 accumulator, sequentially (the order is the
//!   contract; the batch is small), then `acc / denom`: bitwise the reference's;
//! - `bce_logits_grad`: `(1 / (1 + exp(-z)) - y) / denom` elementwise, parallel
//!   over chunks: bitwise the reference's.
//!
//! `max(z, 0)` is `z > 0 ? z : 0`: a NaN logit gives 0 there, as `f32::max` does
//! (the NaN still reaches the sum through `z·y`). bf16 operands widen exactly; a
//! bf16 result is rounded once, to nearest even. A denominator whose symbol is
//! unbound (or 0) has no kernel: the interpreter reports it.
//!
//! ABI: `fn(z: *const u8, y: *const u8, out: *mut u8, n: i64, denom: f32)`.

use super::clif::{for_range, load_f32, store_f32, var};
use super::gemm::Elt;
use super::linear::elt_of;
use super::{Jit, JitError};
use crate::kernels::{KResult, KernelError, data_len, shape_err};
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{AbiParam, InstBuilder, types};
use cranelift_frontend::FunctionBuilder;
use cranelift_module::{Linkage, Module};
use dlrm_ir::{Data, Dim, Op, Tensor, TensorType};
use half::bf16;
use rayon::prelude::*;
use std::collections::HashMap;

/// The JIT symbol of `f32::exp`.
pub const EXP_SYMBOL: &str = "dlrm_expf";
/// The JIT symbol of `f32::ln_1p`.
pub const LOG1P_SYMBOL: &str = "dlrm_log1pf";

extern "C" fn expf(x: f32) -> f32 {
    x.exp()
}

extern "C" fn log1pf(x: f32) -> f32 {
    x.ln_1p()
}

/// Elements per rayon task of the gradient.
const CHUNK: usize = 1 << 14;

/// What a loss kernel is specialised on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LossSpec {
    /// `bce_logits_grad` (else `bce_logits`).
    pub grad: bool,
    /// Logits element type.
    pub z: Elt,
    /// Labels element type.
    pub y: Elt,
    /// Result element type.
    pub out: Elt,
}

type LossFn = unsafe extern "C" fn(*const u8, *const u8, *mut u8, i64, f32);

/// A compiled loss kernel.
#[derive(Clone, Copy, Debug)]
pub struct LossKernel {
    spec: LossSpec,
    f: LossFn,
}

pub(crate) fn compile(jit: &Jit, spec: LossSpec) -> Result<LossKernel, JitError> {
    let mut module = jit.module_with_symbols(&[
        (EXP_SYMBOL, expf as *const u8),
        (LOG1P_SYMBOL, log1pf as *const u8),
    ])?;
    let mut sig = module.make_signature();
    sig.params.push(AbiParam::new(types::F32));
    sig.returns.push(AbiParam::new(types::F32));
    let exp_id = module
        .declare_function(EXP_SYMBOL, Linkage::Import, &sig)
        .map_err(JitError::module)?;
    let log1p_id = module
        .declare_function(LOG1P_SYMBOL, Linkage::Import, &sig)
        .map_err(JitError::module)?;
    let f = jit.compile_fn(
        module,
        "loss",
        3,
        &[types::I64, types::F32],
        |module, b, p| {
            let (pz, py, po, n, den) = (p[0], p[1], p[2], p[3], p[4]);
            let exp = module.declare_func_in_func(exp_id, b.func);
            let log1p = module.declare_func_in_func(log1p_id, b.func);
            let call = |b: &mut FunctionBuilder<'_>, f, x| {
                let c = b.ins().call(f, &[x]);
                b.inst_results(c)[0]
            };
            let (ez, ey, eo) = (
                spec.z.size() as i64,
                spec.y.size() as i64,
                spec.out.size() as i64,
            );
            let zero = b.ins().iconst(types::I64, 0);
            let fzero = b.ins().f32const(0.0);
            let one = b.ins().f32const(1.0);
            let acc = var(b, types::F32, fzero);
            for_range(b, zero, n, 1, &mut |b, i| {
                let a = b.ins().imul_imm_s(i, ez);
                let a = b.ins().iadd(pz, a);
                let z = load_f32(b, spec.z, a, 0);
                let a = b.ins().imul_imm_s(i, ey);
                let a = b.ins().iadd(py, a);
                let y = load_f32(b, spec.y, a, 0);
                if spec.grad {
                    let nz = b.ins().fneg(z);
                    let e = call(b, exp, nz);
                    let d = b.ins().fadd(one, e);
                    let s = b.ins().fdiv(one, d);
                    let t = b.ins().fsub(s, y);
                    let r = b.ins().fdiv(t, den);
                    let o = b.ins().imul_imm_s(i, eo);
                    let o = b.ins().iadd(po, o);
                    store_f32(b, spec.out, r, o, 0);
                } else {
                    let pos = b.ins().fcmp(FloatCC::GreaterThan, z, fzero);
                    let m = b.ins().select(pos, z, fzero);
                    let zy = b.ins().fmul(z, y);
                    let t = b.ins().fsub(m, zy);
                    let az = b.ins().fabs(z);
                    let naz = b.ins().fneg(az);
                    let e = call(b, exp, naz);
                    let l = call(b, log1p, e);
                    let term = b.ins().fadd(t, l);
                    let a = b.use_var(acc);
                    let a = b.ins().fadd(a, term);
                    b.def_var(acc, a);
                }
            });
            if !spec.grad {
                let a = b.use_var(acc);
                let r = b.ins().fdiv(a, den);
                store_f32(b, spec.out, r, po, 0);
            }
        },
    )?;
    // SAFETY: generated with exactly this signature and the C call convention.
    let f: LossFn = unsafe { std::mem::transmute::<*const u8, LossFn>(f) };
    Ok(LossKernel { spec, f })
}

fn float_ptr(t: &Tensor) -> Option<(Elt, usize)> {
    match &t.data {
        Data::F32(v) => Some((Elt::F32, v.as_ptr() as usize)),
        Data::BF16(v) => Some((Elt::BF16, v.as_ptr() as usize)),
        _ => None,
    }
}

fn resolve(d: &Dim, syms: &HashMap<String, usize>) -> Option<f32> {
    let n = match d {
        Dim::Fixed(n) => *n,
        Dim::Sym(s) => *syms.get(s)?,
    };
    (n > 0).then_some(n as f32)
}

/// `bce_logits` and `bce_logits_grad` with JIT kernels (`None`: another op,
/// non-float operands or result, or an unresolved or zero denominator).
pub(crate) fn eval(
    jit: &Jit,
    op: &Op,
    inputs: &[&Tensor],
    out_types: &[TensorType],
    syms: &HashMap<String, usize>,
) -> Option<KResult<Vec<Tensor>>> {
    let (grad, denom) = match op {
        Op::BceLogits { denom } => (false, denom),
        Op::BceLogitsGrad { denom } => (true, denom),
        _ => return None,
    };
    let name = op.mnemonic();
    let den = resolve(denom, syms)?;
    let out = elt_of(out_types.first()?.dtype)?;
    let (ez, pz) = float_ptr(inputs.first()?)?;
    let (ey, py) = float_ptr(inputs.get(1)?)?;
    Some((|| {
        crate::kernels::arity(name, inputs, &[2])?;
        let (z, y) = (inputs[0], inputs[1]);
        if z.shape != y.shape {
            return Err(shape_err(
                name,
                format!("logits {:?} and label {:?} differ", z.shape, y.shape),
            ));
        }
        let n = z.numel();
        if data_len(z) != n || data_len(y) != n {
            return Err(shape_err(
                name,
                "operand length differs from its shape".into(),
            ));
        }
        let spec = LossSpec {
            grad,
            z: ez,
            y: ey,
            out,
        };
        let k = jit.loss(spec).map_err(|e| KernelError::Jit {
            op: name,
            reason: e.to_string(),
        })?;
        let f = k.f;
        let _ = k.spec;
        if !grad {
            let mut data = match out {
                Elt::F32 => Data::F32(vec![0.0]),
                Elt::BF16 => Data::BF16(vec![bf16::ZERO]),
            };
            let po: *mut u8 = match &mut data {
                Data::F32(v) => v.as_mut_ptr().cast(),
                Data::BF16(v) => v.as_mut_ptr().cast(),
                _ => unreachable!("float result"),
            };
            // SAFETY: z and y hold n elements of the spec's types (checked
            // above); the result holds the one element written.
            unsafe { f(pz as *const u8, py as *const u8, po, n as i64, den) };
            return Ok(vec![Tensor {
                shape: vec![],
                data,
            }]);
        }
        let go = |c: usize, po: *mut u8, len: usize| {
            let i0 = c * CHUNK;
            // SAFETY: elements i0..i0+len of z and y exist (both hold n >= i0+len
            // elements, checked above); `po` is this task's own chunk of the
            // result, `len` elements long.
            unsafe {
                f(
                    (pz as *const u8).add(i0 * ez.size()),
                    (py as *const u8).add(i0 * ey.size()),
                    po,
                    len as i64,
                    den,
                )
            }
        };
        let data = match out {
            Elt::F32 => {
                let mut o = vec![0.0f32; n];
                o.par_chunks_mut(CHUNK)
                    .enumerate()
                    .for_each(|(c, ch)| go(c, ch.as_mut_ptr().cast(), ch.len()));
                Data::F32(o)
            }
            Elt::BF16 => {
                let mut o = vec![bf16::ZERO; n];
                o.par_chunks_mut(CHUNK)
                    .enumerate()
                    .for_each(|(c, ch)| go(c, ch.as_mut_ptr().cast(), ch.len()));
                Data::BF16(o)
            }
        };
        Ok(vec![Tensor {
            shape: z.shape.clone(),
            data,
        }])
    })())
}
