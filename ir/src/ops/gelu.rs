//! `gelu` and `gelu_grad`: GELU, the tanh approximation (PyTorch's
//! `approximate="tanh"`, ONNX `Gelu` with `approximate="tanh"`), and its
//! gradient. The exact erf form is not provided: Rust's standard library has no
//! `erf`.
//!
//! `gelu(x) -> y`, elementwise, `y` of `x`'s type: in f32, with `β = sqrt(2/π)`
//! and `κ = 0.044715`, `u = β·(x + κ·((x·x)·x))` and `y = (0.5·x)·(1 + tanh(u))`,
//! in that order (PyTorch's CPU kernel).
//!
//! `gelu_grad(dy, x) -> dx`: the gradient at the forward *input* `x` (not its
//! output, unlike `relu_grad`/`sigmoid_grad`), `dy` first as in the other
//! gradient ops; `dy` and `x` have one shape, `dx` has `dy`'s type. With `u` as
//! in `gelu` and `t = tanh(u)`, in f32 and in this order (PyTorch's CPU kernel):
//! `dy · (0.5·(1 + t) + ((0.5·x)·(1 - t·t))·(β·(1 + (3·κ)·(x·x))))`.
//!
//! bf16 operands are widened exactly; a bf16 result is rounded once. [`gelu1`]
//! and [`gelu_grad1`] define one element; the kernels call them too, so they
//! equal the interpreter bit for bit by construction.
//!
//! ONNX: `Gelu(approximate="tanh")` from opset 20, both ways (the exact form,
//! `approximate="none"`, is refused on import). Before opset 20 the exporter
//! writes the decomposition, `x · sigmoid(2β·(x + κ·((x·x)·x)))` (the IR has no
//! `tanh`: `(1 + tanh(u))/2 = sigmoid(2u)`), equal up to rounding.

use super::cross::{arity_error, no_gradient};
use crate::error::Result;
use crate::graph::ValueId;
use crate::instance::Checked;
use crate::interp::common::{floats, store};
use crate::module::{
    DecomposeCx, GradCx, ModOp, ONNX_DEFAULT_DOMAIN, OnnxAttr, OnnxNode, OpModule, Work,
};
use crate::op::{BinaryKind, Op};
use crate::tensor::Tensor;
use crate::types::{DType, Dim, TensorType};

type R<T> = std::result::Result<T, String>;

/// The forward op `gelu` (see the module docs).
pub struct Gelu;

/// The gradient op `gelu_grad` (see the module docs).
pub struct GeluGrad;

/// The forward op's mnemonic.
pub const GELU: &str = "gelu";
/// The gradient op's mnemonic.
pub const GELU_GRAD: &str = "gelu_grad";

/// `β = sqrt(2/π)` of [`gelu1`] (PyTorch's `kBeta = M_SQRT2 * M_2_SQRTPI * 0.5`).
const GELU_BETA: f32 = (std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5) as f32;
/// `κ` of [`gelu1`].
const GELU_KAPPA: f32 = 0.044715;

/// `tanh(β·(x + κ·x³))`, shared by `gelu` and `gelu_grad`.
fn gelu_tanh(x: f32) -> f32 {
    let cube = x * x * x;
    (GELU_BETA * (x + GELU_KAPPA * cube)).tanh()
}

/// `gelu(x)`, the tanh approximation: `(0.5·x)·(1 + tanh(β·(x + κ·x³)))` (the
/// definition of `gelu`; kernels call this function).
pub fn gelu1(x: f32) -> f32 {
    0.5 * x * (1.0 + gelu_tanh(x))
}

/// `gelu_grad(dy, x)`: `dy · (0.5·(1 + t) + ((0.5·x)·(1 - t·t))·(β·(1 + 3κ·x²)))`
/// with `t = tanh(β·(x + κ·x³))` (the definition of `gelu_grad`; kernels call
/// this function).
pub fn gelu_grad1(dy: f32, x: f32) -> f32 {
    let t = gelu_tanh(x);
    let left_derivative = 0.5 * (1.0 + t);
    let inner_derivative = GELU_BETA * (1.0 + 3.0 * GELU_KAPPA * (x * x));
    let right_derivative = 0.5 * x * (1.0 - t * t) * inner_derivative;
    dy * (left_derivative + right_derivative)
}

/// Checks that `ins` are `names.len()` float operands of one shape (errors use
/// the spec's `names`).
fn check(op: &str, ins: &[&TensorType], names: &[&str]) -> R<()> {
    if ins.len() != names.len() {
        let s = if names.len() == 1 { "" } else { "s" };
        return Err(format!(
            "`{op}` takes {} operand{s} ({}), got {}",
            names.len(),
            names.join(", "),
            ins.len()
        ));
    }
    for (t, name) in ins.iter().zip(names) {
        if !t.dtype.is_float() {
            return Err(format!("{name} must be f32 or bf16, got {t}"));
        }
    }
    match ins {
        [a, b] if a.shape != b.shape => Err(format!(
            "{} {a} and {} {b} must have the same shape",
            names[0], names[1]
        )),
        _ => Ok(()),
    }
}

/// The work of `flops` operations per element of the first result, and the
/// bytes of every operand and result.
fn work(ins: &[&TensorType], outs: &[&TensorType], dim: &dyn Fn(&Dim) -> f64, flops: f64) -> Work {
    let numel = |t: &TensorType| t.shape.iter().map(dim).product::<f64>();
    Work {
        flops: flops * outs.first().map_or(0.0, |t| numel(t)),
        bytes: ins
            .iter()
            .chain(outs)
            .map(|t| numel(t) * t.dtype.size_bytes() as f64)
            .sum(),
    }
}

impl OpModule for Gelu {
    fn mnemonic(&self) -> &'static str {
        GELU
    }

    no_attributes!();

    fn infer(&self, _: &ModOp, ins: &[&TensorType]) -> R<Vec<TensorType>> {
        check(GELU, ins, &["operand"])?;
        Ok(vec![ins[0].clone()])
    }

    fn eval(&self, c: &Checked<'_>) -> R<Vec<Tensor>> {
        let x = floats(c.input(0), "operand")?;
        let y = x.iter().map(|&v| gelu1(v)).collect();
        Ok(vec![store(c.out(0).dtype, c.in_shape(0).to_vec(), y)?])
    }

    fn work(
        &self,
        _: &ModOp,
        ins: &[&TensorType],
        outs: &[&TensorType],
        dim: &dyn Fn(&Dim) -> f64,
    ) -> Work {
        // 8 multiplies and adds, and the tanh counted as one.
        work(ins, outs, dim, 9.0)
    }

    fn backward(&self, _: &ModOp, cx: &mut dyn GradCx) -> Result<()> {
        let (Some(dy), &[x]) = (cx.dy(0), cx.inputs()) else {
            return Ok(());
        };
        // The gradient reads the forward input, not its output.
        let h = cx.hint(0);
        for dx in cx.add(ModOp::op(GELU_GRAD), &[dy, x], &[&h])? {
            cx.contribute(0, dx);
        }
        Ok(())
    }

    fn decompose(
        &self,
        _: &ModOp,
        g: &mut DecomposeCx<'_>,
        ins: &[ValueId],
        names: &[&str],
    ) -> Result<Vec<ValueId>> {
        let &[x] = ins else {
            return Err(arity_error(g, GELU, 1, ins.len()));
        };
        let y = names.first().copied().unwrap_or(GELU);
        let dtype = g.ty(x).dtype;
        let x = widened(g, x, y)?;
        let (s, _, _) = sigmoid_of_2u(g, x, y)?;
        let r = g.add(mul(), &[x, s], &last(y, dtype))?;
        Ok(vec![narrowed(g, r, dtype, y)?])
    }

    fn onnx(&self, _: &ModOp) -> Option<OnnxNode> {
        let tanh = OnnxAttr::Str("tanh".into());
        Some(OnnxNode::new("Gelu", ONNX_DEFAULT_DOMAIN, 20).with("approximate", tanh))
    }

    fn onnx_import(&self, node: &OnnxNode) -> Option<R<ModOp>> {
        if !node.is("Gelu", ONNX_DEFAULT_DOMAIN) {
            return None;
        }
        let approximate = node
            .only_attrs(&["approximate"])
            .and_then(|()| node.string("approximate", "none"));
        Some(approximate.and_then(|a| match a.as_str() {
            "tanh" => ModOp::new(&Gelu, Vec::new()),
            other => Err(format!(
                "unsupported attribute value approximate=\"{other}\" (only \"tanh\": dlrmc's \
                 gelu is the tanh approximation)"
            )),
        }))
    }

    not_an_update!();
}

impl OpModule for GeluGrad {
    fn mnemonic(&self) -> &'static str {
        GELU_GRAD
    }

    no_attributes!();

    fn infer(&self, _: &ModOp, ins: &[&TensorType]) -> R<Vec<TensorType>> {
        check(GELU_GRAD, ins, &["dy", "x"])?;
        Ok(vec![ins[0].clone()])
    }

    fn eval(&self, c: &Checked<'_>) -> R<Vec<Tensor>> {
        let dy = floats(c.input(0), "dy")?;
        let x = floats(c.input(1), "x")?;
        let dx = dy.iter().zip(x.iter()).map(|(&d, &v)| gelu_grad1(d, v));
        Ok(vec![store(
            c.out(0).dtype,
            c.in_shape(0).to_vec(),
            dx.collect(),
        )?])
    }

    fn work(
        &self,
        _: &ModOp,
        ins: &[&TensorType],
        outs: &[&TensorType],
        dim: &dyn Fn(&Dim) -> f64,
    ) -> Work {
        // 18 multiplies and adds, and the tanh counted as one.
        work(ins, outs, dim, 19.0)
    }

    fn backward(&self, _: &ModOp, _: &mut dyn GradCx) -> Result<()> {
        no_gradient(GELU_GRAD)
    }

    /// `dy · (s + (x·(s·(1 - s)))·(2β·(1 + 3κ·(x·x))))` with `s = sigmoid(2u)`
    /// (the module docs' formula with `0.5·(1 + t) = s`, `1 - t·t = 4·s·(1 - s)`).
    fn decompose(
        &self,
        _: &ModOp,
        g: &mut DecomposeCx<'_>,
        ins: &[ValueId],
        names: &[&str],
    ) -> Result<Vec<ValueId>> {
        let &[dy, x] = ins else {
            return Err(arity_error(g, GELU_GRAD, 2, ins.len()));
        };
        let y = names.first().copied().unwrap_or(GELU_GRAD);
        let dtype = g.ty(dy).dtype;
        let (dy, x) = (widened(g, dy, &format!("{y}.dy"))?, widened(g, x, y)?);
        let (s, xx, b2) = sigmoid_of_2u(g, x, y)?;
        let n = |what: &str| format!("{y}.{what}");
        let one = g.scalar(&n("one"), 1.0)?;
        let k3 = g.scalar(&n("3kappa"), 3.0 * GELU_KAPPA)?;
        let sub = Op::Binary {
            kind: BinaryKind::Sub,
        };
        let one_s = g.add(sub, &[one, s], &n("one_s"))?;
        let ss = g.add(mul(), &[s, one_s], &n("ss"))?;
        let p = g.add(mul(), &[k3, xx], &n("p"))?;
        let q = g.add(add(), &[one, p], &n("q"))?;
        let d = g.add(mul(), &[b2, q], &n("d"))?;
        let r = g.add(mul(), &[x, ss], &n("r"))?;
        let rd = g.add(mul(), &[r, d], &n("rd"))?;
        let sum = g.add(add(), &[s, rd], &n("sum"))?;
        let dx = g.add(mul(), &[dy, sum], &last(y, dtype))?;
        Ok(vec![narrowed(g, dx, dtype, y)?])
    }

    no_onnx_form!();

    not_an_update!();
}

fn mul() -> Op {
    Op::Binary {
        kind: BinaryKind::Mul,
    }
}

fn add() -> Op {
    Op::Binary {
        kind: BinaryKind::Add,
    }
}

/// `sigmoid(2β·(x + κ·((x·x)·x)))` of an f32 `x` as primitive ops, with `x·x`
/// and the constant `2β`.
fn sigmoid_of_2u(
    g: &mut DecomposeCx<'_>,
    x: ValueId,
    y: &str,
) -> Result<(ValueId, ValueId, ValueId)> {
    let n = |what: &str| format!("{y}.{what}");
    let kappa = g.scalar(&n("kappa"), GELU_KAPPA)?;
    let b2 = g.scalar(&n("2beta"), 2.0 * GELU_BETA)?;
    let xx = g.add(mul(), &[x, x], &n("xx"))?;
    let xxx = g.add(mul(), &[xx, x], &n("xxx"))?;
    let kx = g.add(mul(), &[kappa, xxx], &n("kx"))?;
    let inner = g.add(add(), &[x, kx], &n("inner"))?;
    let u2 = g.add(mul(), &[b2, inner], &n("2u"))?;
    Ok((g.add(Op::Sigmoid, &[u2], &n("s"))?, xx, b2))
}

/// The name of a decomposition's last f32 value: the result's own when it is
/// f32, else that of the value rounded to it.
fn last(y: &str, dtype: DType) -> String {
    match dtype {
        DType::F32 => y.to_string(),
        _ => format!("{y}.f32"),
    }
}

/// `v` as f32 (bf16 widened exactly).
fn widened(g: &mut DecomposeCx<'_>, v: ValueId, y: &str) -> Result<ValueId> {
    match g.ty(v).dtype {
        DType::F32 => Ok(v),
        _ => g.add(Op::Cast { to: DType::F32 }, &[v], &format!("{y}.wide")),
    }
}

/// The f32 `v` stored as `dtype` (named `y`; `v` itself when f32).
fn narrowed(g: &mut DecomposeCx<'_>, v: ValueId, dtype: DType, y: &str) -> Result<ValueId> {
    match dtype {
        DType::F32 => Ok(v),
        to => g.add(Op::Cast { to }, &[v], y),
    }
}
