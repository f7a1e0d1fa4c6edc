//! `cross_save` and `cross_grad_saved`: the cross layer of [`super::cross`] in a
//! training step, its forward keeping the two intermediates its gradient needs, so
//! the backward does not compute them again (8·S·R·D flops instead of 12).
//!
//! `cross_save(x0, x, v, u, b) -> (y, z[S,R], w[S,D])`: `y` exactly as `cross`,
//! with `z = x · vᵀ` and `w = z · uᵀ + b` as `cross` computes them, in `x`'s dtype.
//!
//! `cross_grad_saved(dy, x0, x, v, u, z, w) -> (dx0, dx, dv, du, db)`: exactly
//! `cross_grad`'s results from the given `z` and `w` instead of recomputed ones
//! (`db` in `u`'s dtype). Given `cross_save`'s own `z` and `w` it equals
//! `cross_grad` bit for bit.
//!
//! The pass `save-activations` (`dlrm_passes`) turns each `cross` with its
//! `cross_grad` of a training graph into this pair.

use super::cross::{
    arity, arity_error, check_layer, decomposed_forward, decomposed_grads, dims, forward, grads,
    layer_work, mul, no_gradient,
};
use crate::error::Result;
use crate::graph::ValueId;
use crate::instance::Checked;
use crate::interp::common::{floats, store};
use crate::module::{DecomposeCx, GradCx, ModOp, OpModule, Work};
use crate::op::Op;
use crate::tensor::Tensor;
use crate::types::{Dim, TensorType};

type R<T> = std::result::Result<T, String>;

/// The forward op `cross_save` (see the module docs).
pub struct CrossSave;

/// The gradient op `cross_grad_saved` (see the module docs).
pub struct CrossGradSaved;

impl OpModule for CrossSave {
    fn mnemonic(&self) -> &'static str {
        "cross_save"
    }

    no_attributes!();

    fn infer(&self, _: &ModOp, ins: &[&TensorType]) -> R<Vec<TensorType>> {
        arity("cross_save", ins, 5)?;
        check_layer(ins)?;
        let (x, v) = (ins[1], ins[2]);
        let z = TensorType::new(x.dtype, [x.shape[0].clone(), v.shape[0].clone()]);
        Ok(vec![x.clone(), z, x.clone()])
    }

    fn eval(&self, c: &Checked<'_>) -> R<Vec<Tensor>> {
        let (s, d, r) = dims(c, 1);
        let x0 = floats(c.input(0), "x0")?;
        let x = floats(c.input(1), "x")?;
        let (v, u) = (floats(c.input(2), "v")?, floats(c.input(3), "u")?);
        let b = floats(c.input(4), "b")?;
        let (z, w) = forward(&x, &v, &u, &b, s, d, r);
        let y: Vec<f32> = (0..s * d).map(|i| x0[i] * w[i] + x[i]).collect();
        Ok(vec![
            store(c.out(0).dtype, vec![s, d], y)?,
            store(c.out(1).dtype, vec![s, r], z)?,
            store(c.out(2).dtype, vec![s, d], w)?,
        ])
    }

    fn work(
        &self,
        _: &ModOp,
        ins: &[&TensorType],
        outs: &[&TensorType],
        dim: &dyn Fn(&Dim) -> f64,
    ) -> Work {
        layer_work(ins, outs, dim, 1, (4.0, 3.0))
    }

    fn backward(&self, _: &ModOp, cx: &mut dyn GradCx) -> Result<()> {
        let Some(dy) = cx.dy(0) else {
            return Ok(());
        };
        let (ins, outs) = (cx.inputs().to_vec(), cx.outputs().to_vec());
        let operands = [dy, ins[0], ins[1], ins[2], ins[3], outs[1], outs[2]];
        let hints: Vec<String> = (0..5).map(|k| cx.hint(k)).collect();
        let names: Vec<&str> = hints.iter().map(String::as_str).collect();
        let grads = cx.add(ModOp::op("cross_grad_saved"), &operands, &names)?;
        for (k, g) in grads.into_iter().enumerate() {
            cx.contribute(k, g);
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
        let &[x0, x, v, u, b] = ins else {
            return Err(arity_error(g, "cross_save", 5, ins.len()));
        };
        let y = names.first().copied().unwrap_or("cross");
        let (z, w) = decomposed_forward(g, x, v, u, b, y)?;
        let p = g.add(mul(), &[x0, w], &format!("{y}.scaled"))?;
        Ok(vec![g.add(Op::Add, &[p, x], y)?, z, w])
    }

    no_onnx_form!();

    not_an_update!();
}

impl OpModule for CrossGradSaved {
    fn mnemonic(&self) -> &'static str {
        "cross_grad_saved"
    }

    no_attributes!();

    fn infer(&self, _: &ModOp, ins: &[&TensorType]) -> R<Vec<TensorType>> {
        arity("cross_grad_saved", ins, 7)?;
        let (dy, x0, x, v, u, z, w) = (ins[0], ins[1], ins[2], ins[3], ins[4], ins[5], ins[6]);
        // The layer's rule with `w` standing in for `b` (checked as [D] below).
        let b = TensorType::new(u.dtype, [x.shape[1].clone()]);
        check_layer(&[x0, x, v, u, &b])?;
        for (name, t, want) in [("dy", dy, x), ("w", w, x)] {
            if !t.dtype.is_float() || t.shape != want.shape {
                return Err(format!("{name} {t} must be a float of x's shape {want}"));
            }
        }
        let zs = [x.shape[0].clone(), v.shape[0].clone()];
        if !z.dtype.is_float() || z.shape != zs {
            return Err(format!(
                "z {z} must be a float of shape [{}, {}]",
                zs[0], zs[1]
            ));
        }
        Ok(vec![x0.clone(), x.clone(), v.clone(), u.clone(), b])
    }

    fn eval(&self, c: &Checked<'_>) -> R<Vec<Tensor>> {
        let (s, d, r) = dims(c, 2);
        let f = |k: usize, what: &str| floats(c.input(k), what);
        let (dy, x0, x) = (f(0, "dy")?, f(1, "x0")?, f(2, "x")?);
        let (v, u, z, w) = (f(3, "v")?, f(4, "u")?, f(5, "z")?, f(6, "w")?);
        grads(c, [&dy, &x0, &x, &v, &u, &z, &w], (s, d, r))
    }

    fn work(
        &self,
        _: &ModOp,
        ins: &[&TensorType],
        outs: &[&TensorType],
        dim: &dyn Fn(&Dim) -> f64,
    ) -> Work {
        // du, t, dv and t·v (2·SRD each).
        layer_work(ins, outs, dim, 2, (8.0, 4.0))
    }

    fn backward(&self, _: &ModOp, _: &mut dyn GradCx) -> Result<()> {
        no_gradient("cross_grad_saved")
    }

    fn decompose(
        &self,
        _: &ModOp,
        g: &mut DecomposeCx<'_>,
        ins: &[ValueId],
        names: &[&str],
    ) -> Result<Vec<ValueId>> {
        let &[dy, x0, x, v, u, z, w] = ins else {
            return Err(arity_error(g, "cross_grad_saved", 7, ins.len()));
        };
        decomposed_grads(g, [dy, x0, x, v, u, z, w], names)
    }

    no_onnx_form!();

    not_an_update!();
}
