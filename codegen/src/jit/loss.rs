//! Loss JIT kernels: `bce_logits` and `bce_logits_grad` on logits, `bce`,
//! `bce_grad`, `mse` and `mse_grad` on probabilities, the `sigmoid` of an
//! inference graph's output, and the other elementwise ops that need a libm
//! function (`gelu`, `gelu_grad`); f32 or bf16 operands and result.
//!
//! Cranelift has no `exp`/`log1p`/`ln`: the kernels call [`EXP_SYMBOL`],
//! [`LOG1P_SYMBOL`] and [`LN_SYMBOL`], JIT symbols bound to Rust's own
//! `f32::exp`, `f32::ln_1p` and `f32::ln` (the functions the reference kernel
//! and the interpreter call), so every element is computed by the definition's
//! own operations, unfused, in its order:
//! - `bce_logits`: `acc += (max(z,0) - z·y) + ln_1p(exp(-|z|))` over the elements
//!   in row-major order, one f32 accumulator, sequentially (the order is the
//!   contract; the batch is small), then `acc / denom`: bitwise the reference's;
//! - `bce_logits_grad`: `(1 / (1 + exp(-z)) - y) / denom` elementwise, parallel
//!   over chunks: bitwise the reference's;
//! - `bce`: `acc += y·ln'(p) + (1-y)·ln'(1-p)` likewise sequentially, then
//!   `-acc / denom`, `ln'` being `ln` clamped below at -100 (`l < -100 ? -100 :
//!   l`, NaN kept): bitwise the interpreter's (no reference kernel covers it);
//! - `bce_grad`: `(p - y) / max(p·(1-p), 1e-12) / denom` elementwise, parallel
//!   over chunks, the `max` as `f32::max` (a NaN product gives 1e-12): bitwise
//!   the interpreter's;
//! - `mse`: `acc += (p - y)·(p - y)` sequentially, then `acc / denom`; `mse_grad`:
//!   `(2·(p - y)) / denom` elementwise; `sigmoid`: `1 / (1 + exp(-x))`
//!   elementwise: bitwise the interpreter's;
//! - `gelu(x)`, `gelu_grad(dy, x)`: a call per element of [`GELU_SYMBOL`] /
//!   [`GELU_GRAD_SYMBOL`], bound to the interpreter's own scalar definitions
//!   (`dlrm_ir::interp::gelu1`, `gelu_grad1`): bitwise the interpreter's.
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
use crate::reference::{KResult, KernelError};
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{AbiParam, FuncRef, InstBuilder, Value, types};
use cranelift_frontend::FunctionBuilder;
use cranelift_jit::JITModule;
use cranelift_module::{FuncId, Linkage, Module};
use dlrm_ir::{Checked, Data, Dim, Op, Tensor, TensorType};
use half::bf16;
use rayon::prelude::*;
use std::collections::HashMap;

/// The JIT symbol of `f32::exp`.
pub const EXP_SYMBOL: &str = "dlrm_expf";
/// The JIT symbol of `f32::ln_1p`.
pub const LOG1P_SYMBOL: &str = "dlrm_log1pf";
/// The JIT symbol of `f32::ln`.
pub const LN_SYMBOL: &str = "dlrm_logf";
/// The JIT symbol of the interpreter's `gelu` of one element.
pub const GELU_SYMBOL: &str = "dlrm_gelu";
/// The JIT symbol of the interpreter's `gelu_grad` of one element (`dy`, `x`).
pub const GELU_GRAD_SYMBOL: &str = "dlrm_gelu_grad";

extern "C" fn expf(x: f32) -> f32 {
    x.exp()
}

extern "C" fn log1pf(x: f32) -> f32 {
    x.ln_1p()
}

extern "C" fn logf(x: f32) -> f32 {
    x.ln()
}

extern "C" fn gelu(x: f32) -> f32 {
    dlrm_ir::interp::gelu1(x)
}

extern "C" fn gelu_grad(dy: f32, x: f32) -> f32 {
    dlrm_ir::interp::gelu_grad1(dy, x)
}

/// Elements per rayon task of the gradient.
const CHUNK: usize = 1 << 14;

/// Which pointwise kernel (a loss, its gradient, or an elementwise activation)
/// a JIT kernel of this module computes (not the model's loss, `dlrm_passes::LossKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PointwiseKind {
    /// `bce_logits(z, y)`.
    BceLogits,
    /// `bce_logits_grad(z, y)`.
    BceLogitsGrad,
    /// `bce(p, y)`.
    Bce,
    /// `bce_grad(p, y)`.
    BceGrad,
    /// `mse(p, y)`.
    Mse,
    /// `mse_grad(p, y)`.
    MseGrad,
    /// `sigmoid(x)` (elementwise, one operand: the kernel's `y` and `denom`
    /// are not read).
    Sigmoid,
    /// `gelu(x)` (as `sigmoid`: one operand).
    Gelu,
    /// `gelu_grad(dy, x)` (elementwise, `denom` not read).
    GeluGrad,
}

impl PointwiseKind {
    /// A scalar sum over the elements (else elementwise).
    fn reduces(self) -> bool {
        matches!(
            self,
            PointwiseKind::BceLogits | PointwiseKind::Bce | PointwiseKind::Mse
        )
    }

    /// Operands: 2 (prediction, label), or 1 for `sigmoid` and `gelu`.
    fn arity(self) -> usize {
        if matches!(self, PointwiseKind::Sigmoid | PointwiseKind::Gelu) {
            1
        } else {
            2
        }
    }
}

/// What a loss kernel is specialised on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LossSpec {
    /// The loss.
    pub kind: PointwiseKind,
    /// Logits (or probabilities) element type.
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
        (LN_SYMBOL, logf as *const u8),
        (GELU_SYMBOL, gelu as *const u8),
        (GELU_GRAD_SYMBOL, gelu_grad as *const u8),
    ])?;
    let ids = declare_imports(&mut module)?;
    let f = jit.compile_fn(
        module,
        "loss",
        3,
        &[types::I64, types::F32],
        |module, b, p| {
            let (pz, py, po, n, den) = (p[0], p[1], p[2], p[3], p[4]);
            let [exp, log1p, ln, gelu, gelu_grad] =
                ids.map(|id| module.declare_func_in_func(id, b.func));
            let calls = Calls {
                exp,
                log1p,
                ln,
                gelu,
                gelu_grad,
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
                let y = if spec.kind.arity() == 2 {
                    let a = b.ins().imul_imm_s(i, ey);
                    let a = b.ins().iadd(py, a);
                    load_f32(b, spec.y, a, 0)
                } else {
                    fzero
                };
                let v = element(b, spec.kind, calls, (z, y, den), (fzero, one));
                if spec.kind.reduces() {
                    let a = b.use_var(acc);
                    let a = b.ins().fadd(a, v);
                    b.def_var(acc, a);
                } else {
                    let o = b.ins().imul_imm_s(i, eo);
                    let o = b.ins().iadd(po, o);
                    store_f32(b, spec.out, v, o, 0);
                }
            });
            if spec.kind.reduces() {
                let mut a = b.use_var(acc);
                if spec.kind == PointwiseKind::Bce {
                    a = b.ins().fneg(a);
                }
                let r = b.ins().fdiv(a, den);
                store_f32(b, spec.out, r, po, 0);
            }
        },
    )?;
    // SAFETY: generated with exactly this signature and the C call convention.
    let f: LossFn = unsafe { std::mem::transmute::<*const u8, LossFn>(f) };
    Ok(LossKernel { spec, f })
}

/// Declares the scalar functions a loss kernel imports in `module`: `exp`,
/// `log1p`, `ln`, `gelu` (`f32 -> f32`) and `gelu_grad` (`(f32, f32) -> f32`).
fn declare_imports(module: &mut JITModule) -> Result<[FuncId; 5], JitError> {
    let mut sig = module.make_signature();
    sig.params.push(AbiParam::new(types::F32));
    sig.returns.push(AbiParam::new(types::F32));
    let [exp_id, log1p_id, ln_id, gelu_id] = [EXP_SYMBOL, LOG1P_SYMBOL, LN_SYMBOL, GELU_SYMBOL]
        .map(|name| {
            module
                .declare_function(name, Linkage::Import, &sig)
                .map_err(JitError::module)
        });
    let (exp_id, log1p_id, ln_id, gelu_id) = (exp_id?, log1p_id?, ln_id?, gelu_id?);
    let mut sig2 = sig.clone();
    sig2.params.push(AbiParam::new(types::F32));
    let gelu_grad_id = module
        .declare_function(GELU_GRAD_SYMBOL, Linkage::Import, &sig2)
        .map_err(JitError::module)?;
    Ok([exp_id, log1p_id, ln_id, gelu_id, gelu_grad_id])
}

/// The imported scalar functions in the function being built.
#[derive(Clone, Copy)]
struct Calls {
    exp: FuncRef,
    log1p: FuncRef,
    ln: FuncRef,
    gelu: FuncRef,
    gelu_grad: FuncRef,
}

impl Calls {
    /// `f(x)`.
    fn call(self, b: &mut FunctionBuilder<'_>, f: FuncRef, x: Value) -> Value {
        let c = b.ins().call(f, &[x]);
        b.inst_results(c)[0]
    }

    /// `ln(v)` clamped below at -100 (NaN stays NaN).
    fn clamped_ln(self, b: &mut FunctionBuilder<'_>, v: Value) -> Value {
        let l = self.call(b, self.ln, v);
        let lo = b.ins().f32const(-100.0);
        let below = b.ins().fcmp(FloatCC::LessThan, l, lo);
        b.ins().select(below, lo, l)
    }

    /// `1 / (1 + exp(-z))` (`one`: the constant 1).
    fn sigmoid(self, b: &mut FunctionBuilder<'_>, z: Value, one: Value) -> Value {
        let nz = b.ins().fneg(z);
        let e = self.call(b, self.exp, nz);
        let d = b.ins().fadd(one, e);
        b.ins().fdiv(one, d)
    }
}

/// The value of `kind` at one element: prediction (or logit) `z`, label `y`,
/// denominator `den` (read by the gradients); `fzero`, `one` the function's
/// constants 0 and 1. Each formula is the interpreter's, operation for
/// operation.
fn element(
    b: &mut FunctionBuilder<'_>,
    kind: PointwiseKind,
    calls: Calls,
    (z, y, den): (Value, Value, Value),
    (fzero, one): (Value, Value),
) -> Value {
    match kind {
        PointwiseKind::Sigmoid => calls.sigmoid(b, z, one),
        PointwiseKind::Gelu => calls.call(b, calls.gelu, z),
        PointwiseKind::GeluGrad => {
            let c = b.ins().call(calls.gelu_grad, &[z, y]);
            b.inst_results(c)[0]
        }
        PointwiseKind::BceLogitsGrad => {
            let s = calls.sigmoid(b, z, one);
            let t = b.ins().fsub(s, y);
            b.ins().fdiv(t, den)
        }
        PointwiseKind::Mse => {
            let e = b.ins().fsub(z, y);
            b.ins().fmul(e, e)
        }
        PointwiseKind::MseGrad => {
            // `2·(p - y) / denom`, in that order.
            let e = b.ins().fsub(z, y);
            let two = b.ins().f32const(2.0);
            let t = b.ins().fmul(two, e);
            b.ins().fdiv(t, den)
        }
        PointwiseKind::BceLogits => {
            let pos = b.ins().fcmp(FloatCC::GreaterThan, z, fzero);
            let m = b.ins().select(pos, z, fzero);
            let zy = b.ins().fmul(z, y);
            let t = b.ins().fsub(m, zy);
            let az = b.ins().fabs(z);
            let naz = b.ins().fneg(az);
            let e = calls.call(b, calls.exp, naz);
            let l = calls.call(b, calls.log1p, e);
            b.ins().fadd(t, l)
        }
        PointwiseKind::Bce => {
            // y·ln p + (1-y)·ln(1-p), z being the probability p.
            let lp = calls.clamped_ln(b, z);
            let t1 = b.ins().fmul(y, lp);
            let q = b.ins().fsub(one, z);
            let lq = calls.clamped_ln(b, q);
            let ny = b.ins().fsub(one, y);
            let t2 = b.ins().fmul(ny, lq);
            b.ins().fadd(t1, t2)
        }
        PointwiseKind::BceGrad => {
            // (p - y) / max(p·(1-p), 1e-12) / denom; `f32::max` gives 1e-12
            // for a NaN product, as `q > 1e-12 ? q : 1e-12` does.
            let t = b.ins().fsub(z, y);
            let q = b.ins().fsub(one, z);
            let q = b.ins().fmul(z, q);
            let eps = b.ins().f32const(1e-12);
            let big = b.ins().fcmp(FloatCC::GreaterThan, q, eps);
            let m = b.ins().select(big, q, eps);
            let r = b.ins().fdiv(t, m);
            b.ins().fdiv(r, den)
        }
    }
}

fn float_ptr(t: &Tensor) -> Option<(Elt, usize)> {
    match &t.data {
        Data::F32(v) => Some((Elt::F32, v.as_ptr() as usize)),
        Data::BF16(v) => Some((Elt::BF16, v.as_ptr() as usize)),
        _ => None,
    }
}

fn resolve(d: &Dim, syms: &HashMap<String, usize>) -> Option<f32> {
    let n = d.resolve(&|s| syms.get(s).copied())?;
    (n > 0).then_some(n as f32)
}

/// `bce_logits`, `bce_logits_grad`, `bce`, `bce_grad`, `mse`, `mse_grad`,
/// `sigmoid`, `gelu` and `gelu_grad` with JIT kernels (`None`: another op, non-float operands or
/// result, or an unresolved or zero denominator).
pub(crate) fn eval(
    jit: &Jit,
    c: &Checked<'_>,
    out_types: &[TensorType],
    syms: &HashMap<String, usize>,
) -> Option<KResult<Vec<Tensor>>> {
    let (kind, denom) = match c.op() {
        Op::BceLogits { denom } => (PointwiseKind::BceLogits, denom),
        Op::BceLogitsGrad { denom } => (PointwiseKind::BceLogitsGrad, denom),
        Op::Bce { denom } => (PointwiseKind::Bce, denom),
        Op::BceGrad { denom } => (PointwiseKind::BceGrad, denom),
        Op::Mse { denom } => (PointwiseKind::Mse, denom),
        Op::MseGrad { denom } => (PointwiseKind::MseGrad, denom),
        Op::Sigmoid => (PointwiseKind::Sigmoid, &Dim::Fixed(1)),
        Op::Gelu => (PointwiseKind::Gelu, &Dim::Fixed(1)),
        Op::GeluGrad => (PointwiseKind::GeluGrad, &Dim::Fixed(1)),
        _ => return None,
    };
    let name = c.name();
    let den = resolve(denom, syms)?;
    let out = elt_of(out_types.first()?.dtype)?;
    // The instance verified the arity and that `z` and `y` share one shape; the
    // buffers hold its `n` elements.
    let z = c.input(0);
    let (ez, pz) = float_ptr(z)?;
    // `sigmoid` has no label: the kernel does not read it.
    let (ey, py) = match kind.arity() {
        2 => float_ptr(c.input(1))?,
        _ => (ez, pz),
    };
    let n = z.numel();
    Some((|| {
        let spec = LossSpec {
            kind,
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
        if kind.reduces() {
            let mut data = match out {
                Elt::F32 => Data::F32(vec![0.0]),
                Elt::BF16 => Data::BF16(vec![bf16::ZERO]),
            };
            let po: *mut u8 = match &mut data {
                Data::F32(v) => v.as_mut_ptr().cast(),
                Data::BF16(v) => v.as_mut_ptr().cast(),
                _ => unreachable!("float result"),
            };
            // SAFETY: z and y hold n elements of the spec's types (`Checked`);
            // the result holds the one element written.
            unsafe { f(pz as *const u8, py as *const u8, po, n as i64, den) };
            return Ok(vec![Tensor {
                shape: vec![],
                data,
            }]);
        }
        let go = |c: usize, po: *mut u8, len: usize| {
            let i0 = c * CHUNK;
            // SAFETY: elements i0..i0+len of z and y exist (both hold n >= i0+len
            // elements, `Checked`); `po` is this task's own chunk of the result,
            // `len` elements long.
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
