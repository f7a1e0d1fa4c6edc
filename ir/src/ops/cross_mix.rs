//! `cross_mix` and `cross_mix_grad`: the elementwise step of DCN-v2's cross layer
//! ([`super::cross`]), left over when the `contract-cross` pass (`dlrm_passes`)
//! computes the layer's two products as blocked GEMMs (`brgemm`).
//!
//! `cross_mix(x0, w, x) -> y`: `y[i] = x0[i]·w[i] + x[i]`, in `x`'s dtype.
//!
//! `cross_mix_grad(dy, x0, w) -> (g, dx0)`: `g[i] = dy[i]·x0[i]` (the gradient
//! reaching `w`, in `w`'s dtype) and `dx0[i] = dy[i]·w[i]` (in `x0`'s dtype).
//!
//! The operands have one shape, any rank (plain `[S, D]` or blocked
//! `[Db, S, bd]`: zero padding stays zero). Each element is computed in f32 with
//! the float operations of `cross` and `cross_grad` in their order, so a
//! contracted layer equals `cross` bit for bit wherever its products do.

use super::cross::{arity, arity_error, mul, no_gradient};
use crate::error::Result;
use crate::graph::ValueId;
use crate::instance::Checked;
use crate::interp::common::{floats, store};
use crate::module::{DecomposeCx, GradCx, ModOp, OpModule, Work};
use crate::op::Op;
use crate::tensor::Tensor;
use crate::types::{Dim, TensorType};

type R<T> = std::result::Result<T, String>;

/// The forward op `cross_mix` (see the module docs).
pub struct CrossMix;

/// The gradient op `cross_mix_grad` (see the module docs).
pub struct CrossMixGrad;

/// Checks that the operands are floats of one shape (errors use `names`).
fn same_floats(ins: &[&TensorType], names: [&str; 3]) -> R<()> {
    for (t, name) in ins.iter().zip(names) {
        if !t.dtype.is_float() {
            return Err(format!("{name} must be f32 or bf16, got {t}"));
        }
        if t.shape != ins[0].shape {
            return Err(format!(
                "{name} {t} must have the shape of {} {}",
                names[0], ins[0]
            ));
        }
    }
    Ok(())
}

/// `cross_mix`'s values: `x0[i]·w[i] + x[i]`, in f32 (the one definition, which
/// the fused ops of [`super::cross_brgemm`] share).
pub(super) fn mix(x0: &[f32], w: &[f32], x: &[f32]) -> Vec<f32> {
    (0..x.len()).map(|i| x0[i] * w[i] + x[i]).collect()
}

/// `cross_mix_grad`'s values: `(dy[i]·x0[i], dy[i]·w[i])`, in f32.
pub(super) fn mix_grad(dy: &[f32], x0: &[f32], w: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let g = (0..dy.len()).map(|i| dy[i] * x0[i]).collect();
    let dx0 = (0..dy.len()).map(|i| dy[i] * w[i]).collect();
    (g, dx0)
}

/// `n` flops per element and the bytes of every operand and result.
fn elementwise_work(
    ins: &[&TensorType],
    outs: &[&TensorType],
    dim: &dyn Fn(&Dim) -> f64,
    n: f64,
) -> Work {
    let numel = |t: &TensorType| t.shape.iter().map(dim).product::<f64>();
    Work {
        flops: n * ins.first().map_or(0.0, |t| numel(t)),
        bytes: ins
            .iter()
            .chain(outs)
            .map(|t| numel(t) * t.dtype.size_bytes() as f64)
            .sum(),
    }
}

impl OpModule for CrossMix {
    fn mnemonic(&self) -> &'static str {
        "cross_mix"
    }

    no_attributes!();

    fn infer(&self, _: &ModOp, ins: &[&TensorType]) -> R<Vec<TensorType>> {
        arity("cross_mix", ins, 3)?;
        same_floats(ins, ["x0", "w", "x"])?;
        Ok(vec![ins[2].clone()])
    }

    fn eval(&self, c: &Checked<'_>) -> R<Vec<Tensor>> {
        let x0 = floats(c.input(0), "x0")?;
        let w = floats(c.input(1), "w")?;
        let x = floats(c.input(2), "x")?;
        Ok(vec![store(
            c.out(0).dtype,
            c.in_shape(2).to_vec(),
            mix(&x0, &w, &x),
        )?])
    }

    fn work(
        &self,
        _: &ModOp,
        ins: &[&TensorType],
        outs: &[&TensorType],
        dim: &dyn Fn(&Dim) -> f64,
    ) -> Work {
        elementwise_work(ins, outs, dim, 2.0)
    }

    fn backward(&self, _: &ModOp, cx: &mut dyn GradCx) -> Result<()> {
        let Some(dy) = cx.dy(0) else {
            return Ok(());
        };
        let &[x0, w, _] = cx.inputs() else {
            unreachable!("arity checked by infer")
        };
        let (gw, gx0) = (cx.hint(1), cx.hint(0));
        let grads = cx.add(
            ModOp::op("cross_mix_grad"),
            &[dy, x0, w],
            &[gw.as_str(), gx0.as_str()],
        )?;
        cx.contribute(1, grads[0]);
        cx.contribute(0, grads[1]);
        cx.contribute(2, dy);
        Ok(())
    }

    fn decompose(
        &self,
        _: &ModOp,
        g: &mut DecomposeCx<'_>,
        ins: &[ValueId],
        names: &[&str],
    ) -> Result<Vec<ValueId>> {
        let &[x0, w, x] = ins else {
            return Err(arity_error(g, "cross_mix", 3, ins.len()));
        };
        let y = names.first().copied().unwrap_or("cross_mix");
        let p = g.add(mul(), &[x0, w], &format!("{y}.scaled"))?;
        Ok(vec![g.add(Op::Add, &[p, x], y)?])
    }

    no_onnx_form!();

    not_an_update!();
}

impl OpModule for CrossMixGrad {
    fn mnemonic(&self) -> &'static str {
        "cross_mix_grad"
    }

    no_attributes!();

    fn infer(&self, _: &ModOp, ins: &[&TensorType]) -> R<Vec<TensorType>> {
        arity("cross_mix_grad", ins, 3)?;
        same_floats(ins, ["dy", "x0", "w"])?;
        Ok(vec![ins[2].clone(), ins[1].clone()])
    }

    fn eval(&self, c: &Checked<'_>) -> R<Vec<Tensor>> {
        let dy = floats(c.input(0), "dy")?;
        let x0 = floats(c.input(1), "x0")?;
        let w = floats(c.input(2), "w")?;
        let (g, dx0) = mix_grad(&dy, &x0, &w);
        let shape = c.in_shape(0).to_vec();
        Ok(vec![
            store(c.out(0).dtype, shape.clone(), g)?,
            store(c.out(1).dtype, shape, dx0)?,
        ])
    }

    fn work(
        &self,
        _: &ModOp,
        ins: &[&TensorType],
        outs: &[&TensorType],
        dim: &dyn Fn(&Dim) -> f64,
    ) -> Work {
        elementwise_work(ins, outs, dim, 2.0)
    }

    fn backward(&self, _: &ModOp, _: &mut dyn GradCx) -> Result<()> {
        no_gradient("cross_mix_grad")
    }

    fn decompose(
        &self,
        _: &ModOp,
        g: &mut DecomposeCx<'_>,
        ins: &[ValueId],
        names: &[&str],
    ) -> Result<Vec<ValueId>> {
        let &[dy, x0, w] = ins else {
            return Err(arity_error(g, "cross_mix_grad", 3, ins.len()));
        };
        let n = |k: usize, fallback: &str| names.get(k).copied().unwrap_or(fallback).to_string();
        let gw = g.add(mul(), &[dy, x0], &n(0, "g"))?;
        let dx0 = g.add(mul(), &[dy, w], &n(1, "dx0"))?;
        Ok(vec![gw, dx0])
    }

    no_onnx_form!();

    not_an_update!();
}
