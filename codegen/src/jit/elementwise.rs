//! Elementwise JIT kernels: `relu`, `relu_grad`, `sigmoid_grad`, `add`, on f32 or
//! bf16 storage in any mix (f32x4 main loop, scalar tail), parallel over chunks.
//!
//! Each element is computed by the definition's own float operations in the same
//! order (`relu`: `x > 0 || x is NaN ? x : 0`; `relu_grad`: `y > 0 ? dy : 0`; `sigmoid_grad`:
//! `(dy·y)·(1-y)`; `add`: `a+b`), so f32 results equal the reference bit for bit
//! (up to the sign of a zero from `relu`); bf16 results are rounded once, to
//! nearest even.
//!
//! ABI: `fn(a: *const u8, b: *const u8, out: *mut u8, n: i64)` over `n` elements.

use super::buffers::{Floats, Fresh};
use super::clif::{for_range, load_f32, load_f32x4, relu_x4, store_f32, store_f32x4};
use super::gemm::Elt;
use super::{Jit, JitError};
use crate::reference::{KResult, KernelError};
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, Value, types};
use cranelift_frontend::FunctionBuilder;
use dlrm_ir::{Checked, DType, Data, Op, Tensor, TensorType};
use rayon::prelude::*;

/// The elementwise function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EwKind {
    /// `max(x, 0)` (unary).
    Relu,
    /// `y > 0 ? dy : 0` with operands `(dy, y)`.
    ReluGrad,
    /// `dy·y·(1-y)` with operands `(dy, y)`.
    SigmoidGrad,
    /// `a + b`.
    Add,
}

impl EwKind {
    fn arity(self) -> usize {
        match self {
            EwKind::Relu => 1,
            _ => 2,
        }
    }
}

/// What an elementwise kernel is specialised on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EwSpec {
    /// The function.
    pub kind: EwKind,
    /// First operand's element type.
    pub a: Elt,
    /// Second operand's element type (ignored for unary kinds).
    pub b: Elt,
    /// Result element type.
    pub out: Elt,
}

type EwFn = unsafe extern "C" fn(*const u8, *const u8, *mut u8, i64);

/// A compiled elementwise kernel.
#[derive(Clone, Copy, Debug)]
pub struct EwKernel {
    spec: EwSpec,
    f: EwFn,
}

fn apply(b: &mut FunctionBuilder<'_>, kind: EwKind, x: Value, y: Value, vector: bool) -> Value {
    let zero = {
        let z = b.ins().f32const(0.0);
        if vector {
            b.ins().splat(types::F32X4, z)
        } else {
            z
        }
    };
    match kind {
        EwKind::Relu if vector => relu_x4(b, x),
        EwKind::Relu => {
            let c = b.ins().fcmp(FloatCC::UnorderedOrGreaterThan, x, zero);
            b.ins().select(c, x, zero)
        }
        EwKind::ReluGrad => {
            let c = b.ins().fcmp(FloatCC::GreaterThan, y, zero);
            if vector {
                let m = b.ins().bitcast(types::F32X4, super::clif::bc_flags(), c);
                b.ins().band(x, m)
            } else {
                b.ins().select(c, x, zero)
            }
        }
        EwKind::SigmoidGrad => {
            let one = b.ins().f32const(1.0);
            let one = if vector {
                b.ins().splat(types::F32X4, one)
            } else {
                one
            };
            let t = b.ins().fmul(x, y);
            let u = b.ins().fsub(one, y);
            b.ins().fmul(t, u)
        }
        EwKind::Add => b.ins().fadd(x, y),
    }
}

pub(crate) fn compile(jit: &Jit, spec: EwSpec) -> Result<EwKernel, JitError> {
    let module = jit.new_module()?;
    let f = jit.compile_fn(module, "elementwise", 3, &[types::I64], |_, b, p| {
        let (pa, pb, po, n) = (p[0], p[1], p[2], p[3]);
        let (ea, eb, eo) = (
            spec.a.size() as i64,
            spec.b.size() as i64,
            spec.out.size() as i64,
        );
        let n4 = b.ins().band_imm_s(n, !3);
        let zero = b.ins().iconst(types::I64, 0);
        let addr = |b: &mut FunctionBuilder<'_>, base: Value, i: Value, es: i64| {
            let off = b.ins().imul_imm_s(i, es);
            b.ins().iadd(base, off)
        };
        for_range(b, zero, n4, 4, &mut |b, i| {
            let a = addr(b, pa, i, ea);
            let x = load_f32x4(b, spec.a, a, 0);
            let y = if spec.kind.arity() == 2 {
                let bb = addr(b, pb, i, eb);
                load_f32x4(b, spec.b, bb, 0)
            } else {
                x
            };
            let r = apply(b, spec.kind, x, y, true);
            let o = addr(b, po, i, eo);
            store_f32x4(b, spec.out, r, o, 0);
        });
        for_range(b, n4, n, 1, &mut |b, i| {
            let a = addr(b, pa, i, ea);
            let x = load_f32(b, spec.a, a, 0);
            let y = if spec.kind.arity() == 2 {
                let bb = addr(b, pb, i, eb);
                load_f32(b, spec.b, bb, 0)
            } else {
                x
            };
            let r = apply(b, spec.kind, x, y, false);
            let o = addr(b, po, i, eo);
            store_f32(b, spec.out, r, o, 0);
        });
    })?;
    // SAFETY: generated with exactly this signature and the C call convention.
    let f: EwFn = unsafe { std::mem::transmute::<*const u8, EwFn>(f) };
    Ok(EwKernel { spec, f })
}

/// Elements per rayon task.
const CHUNK: usize = 1 << 14;

fn float_ptr(t: &Tensor) -> Option<(Elt, *const u8, usize)> {
    match &t.data {
        Data::F32(v) => Some((Elt::F32, v.as_ptr().cast(), v.len())),
        Data::BF16(v) => Some((Elt::BF16, v.as_ptr().cast(), v.len())),
        _ => None,
    }
}

impl EwKernel {
    /// Runs over the `n` elements of the checked operands (`a`, and `b` for a
    /// binary kind: buffers of `n` elements each, [`Checked`]); the `n` results
    /// are written into a fresh buffer (not zeroed first: the kernel writes every
    /// element). The operands' element types are checked against the spec.
    fn run(&self, c: &Checked<'_>) -> Result<Floats, JitError> {
        let s = self.spec;
        let bad = |r: &str| JitError::Args {
            kernel: format!("{s:?}"),
            reason: r.to_string(),
        };
        let (ea, pa, n) = float_ptr(c.input(0)).ok_or_else(|| bad("a is not a float tensor"))?;
        let (eb, pb) = match s.kind.arity() {
            2 => {
                let (eb, pb, _) =
                    float_ptr(c.input(1)).ok_or_else(|| bad("b is not a float tensor"))?;
                (eb, pb)
            }
            _ => (s.b, pa),
        };
        if ea != s.a || eb != s.b {
            return Err(bad("operand types differ from the spec"));
        }
        let (pa, pb) = (pa as usize, pb as usize);
        let f = self.f;
        let go = |chunk: usize, po: *mut u8, len: usize| {
            let i0 = chunk * CHUNK;
            // SAFETY: elements i0..i0+len of a and b exist (`Checked`: both
            // buffers hold their common shape's n >= i0+len elements); `po` is
            // this task's own chunk of the result, `len` elements long.
            unsafe {
                f(
                    (pa as *const u8).add(i0 * s.a.size()),
                    (pb as *const u8).add(i0 * s.b.size()),
                    po,
                    len as i64,
                )
            }
        };
        let mut out = Fresh::new(s.out, n);
        out.buf()
            .chunks(CHUNK)
            .into_par_iter()
            .enumerate()
            .for_each(|(c, mut ch)| {
                let len = ch.len();
                go(c, ch.as_mut_ptr(), len)
            });
        // SAFETY: the chunks cover all `n` elements, and the kernel wrote every
        // element of each (its ABI: all `len` results).
        Ok(unsafe { out.assume_init() })
    }
}

/// `relu`, `relu_grad`, `sigmoid_grad`, `add` with a JIT kernel (`None`: other op
/// or non-float dtypes). The operands are checked against the node's instance
/// (one operand, or two of one shape; buffers of their shapes' lengths).
pub(crate) fn eval(
    jit: &Jit,
    c: &Checked<'_>,
    out_types: &[TensorType],
) -> Option<KResult<Vec<Tensor>>> {
    let kind = match c.op() {
        Op::Relu => EwKind::Relu,
        Op::ReluGrad => EwKind::ReluGrad,
        Op::SigmoidGrad => EwKind::SigmoidGrad,
        Op::Add => EwKind::Add,
        _ => return None,
    };
    let op_name = c.name();
    let (ea, _, _) = float_ptr(c.input(0))?;
    let eb = if kind.arity() == 2 {
        float_ptr(c.input(1))?.0
    } else {
        ea
    };
    let out = match out_types.first()?.dtype {
        DType::F32 => Elt::F32,
        DType::BF16 => Elt::BF16,
        _ => return None,
    };
    let spec = EwSpec {
        kind,
        a: ea,
        b: eb,
        out,
    };
    let jit_err = |e: JitError| KernelError::Jit {
        op: op_name,
        reason: e.to_string(),
    };
    Some((|| {
        let k = jit.elementwise(spec).map_err(jit_err)?;
        let out = k.run(c).map_err(jit_err)?;
        Ok(vec![out.tensor(c.in_shape(0).to_vec())])
    })())
}
