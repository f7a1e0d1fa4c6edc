//! Loss JIT kernels: `bce_logits` and `bce_logits_grad` on logits, `bce`,
//! `bce_grad`, `mse` and `mse_grad` on probabilities, the `sigmoid` of an
//! inference graph's output, and the elementwise ops defined by a Rust scalar
//! function ([`Scalar`], [`map`]: module ops whose formula needs a libm
//! function); f32 or bf16 operands and result.
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
//! - a [`Scalar`] map (`f(x)` or `f(a, b)`): a call per element of
//!   [`MAP_SYMBOL`], bound to the op's own scalar definition (the function the
//!   interpreter calls): bitwise the interpreter's.
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
/// The JIT symbol of a [`Scalar`] map's function.
pub const MAP_SYMBOL: &str = "dlrm_map";

extern "C" fn expf(x: f32) -> f32 {
    x.exp()
}

extern "C" fn log1pf(x: f32) -> f32 {
    x.ln_1p()
}

extern "C" fn logf(x: f32) -> f32 {
    x.ln()
}

/// The scalar definition of an elementwise op, which a pointwise kernel calls
/// per element through [`MAP_SYMBOL`] ([`map`]). Kernels are cached by the
/// function's address.
#[derive(Clone, Copy, Debug)]
pub enum Scalar {
    /// `f(x)`: one operand.
    Unary(extern "C" fn(f32) -> f32),
    /// `f(a, b)`: two operands of one shape.
    Binary(extern "C" fn(f32, f32) -> f32),
}

impl Scalar {
    /// The operand count and the function's address (the cache key).
    fn key(self) -> (usize, usize) {
        match self {
            Scalar::Unary(f) => (1, f as usize),
            Scalar::Binary(f) => (2, f as usize),
        }
    }

    /// The function's address (what [`MAP_SYMBOL`] is bound to).
    fn address(self) -> *const u8 {
        match self {
            Scalar::Unary(f) => f as *const u8,
            Scalar::Binary(f) => f as *const u8,
        }
    }
}

impl PartialEq for Scalar {
    fn eq(&self, other: &Scalar) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Scalar {}

impl std::hash::Hash for Scalar {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.key().hash(h);
    }
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
    /// A scalar function per element ([`Scalar`]: one operand as `sigmoid`, or
    /// two; `denom` not read).
    Map(Scalar),
}

impl PointwiseKind {
    /// A scalar sum over the elements (else elementwise).
    fn reduces(self) -> bool {
        matches!(
            self,
            PointwiseKind::BceLogits | PointwiseKind::Bce | PointwiseKind::Mse
        )
    }

    /// Operands: 2 (prediction, label), 1 for `sigmoid`, a map's own.
    fn arity(self) -> usize {
        match self {
            PointwiseKind::Sigmoid => 1,
            PointwiseKind::Map(f) => f.key().0,
            _ => 2,
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
    let mut symbols = vec![
        (EXP_SYMBOL, expf as *const u8),
        (LOG1P_SYMBOL, log1pf as *const u8),
        (LN_SYMBOL, logf as *const u8),
    ];
    let map = match spec.kind {
        PointwiseKind::Map(f) => {
            symbols.push((MAP_SYMBOL, f.address()));
            Some(f.key().0)
        }
        _ => None,
    };
    let mut module = jit.module_with_symbols(&symbols)?;
    let (ids, map) = declare_imports(&mut module, map)?;
    let f = jit.compile_fn(
        module,
        "loss",
        3,
        &[types::I64, types::F32],
        |module, b, p| {
            let (pz, py, po, n, den) = (p[0], p[1], p[2], p[3], p[4]);
            let [exp, log1p, ln] = ids.map(|id| module.declare_func_in_func(id, b.func));
            let calls = Calls {
                exp,
                log1p,
                ln,
                map: map.map(|id| module.declare_func_in_func(id, b.func)),
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
/// `log1p`, `ln` (`f32 -> f32`) and, for a map of `map` operands, its function
/// (`(f32, ..) -> f32`).
fn declare_imports(
    module: &mut JITModule,
    map: Option<usize>,
) -> Result<([FuncId; 3], Option<FuncId>), JitError> {
    let sig = |module: &JITModule, n: usize| {
        let mut sig = module.make_signature();
        sig.params.extend((0..n).map(|_| AbiParam::new(types::F32)));
        sig.returns.push(AbiParam::new(types::F32));
        sig
    };
    let mut declare = |name: &str, n: usize| {
        let s = sig(module, n);
        module
            .declare_function(name, Linkage::Import, &s)
            .map_err(JitError::module)
    };
    let ids = [
        declare(EXP_SYMBOL, 1)?,
        declare(LOG1P_SYMBOL, 1)?,
        declare(LN_SYMBOL, 1)?,
    ];
    let map = map.map(|n| declare(MAP_SYMBOL, n)).transpose()?;
    Ok((ids, map))
}

/// The imported scalar functions in the function being built.
#[derive(Clone, Copy)]
struct Calls {
    exp: FuncRef,
    log1p: FuncRef,
    ln: FuncRef,
    /// A map kernel's function (declared for those only).
    map: Option<FuncRef>,
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
        PointwiseKind::Map(f) => {
            let Some(map) = calls.map else {
                unreachable!("`compile` declares the function of a map kernel")
            };
            let args = [z, y];
            let c = b.ins().call(map, &args[..f.key().0]);
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

/// `bce_logits`, `bce_logits_grad`, `bce`, `bce_grad`, `mse`, `mse_grad` and
/// `sigmoid` with JIT kernels (`None`: another op, non-float operands or result,
/// or an unresolved or zero denominator).
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
        _ => return None,
    };
    run(jit, c, out_types, kind, resolve(denom, syms)?)
}

/// The elementwise op of checked operands `c` whose every element is `f` of
/// the operands' elements, with a JIT kernel calling `f` (`None`: non-float
/// operands or result). Bitwise the interpreter's when the interpreter calls
/// `f` too.
pub fn map(
    jit: &Jit,
    c: &Checked<'_>,
    out_types: &[TensorType],
    f: Scalar,
) -> Option<KResult<Vec<Tensor>>> {
    run(jit, c, out_types, PointwiseKind::Map(f), 1.0)
}

/// The kernel of `kind` on `c`, denominator `den`.
fn run(
    jit: &Jit,
    c: &Checked<'_>,
    out_types: &[TensorType],
    kind: PointwiseKind,
    den: f32,
) -> Option<KResult<Vec<Tensor>>> {
    let name = c.name();
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
