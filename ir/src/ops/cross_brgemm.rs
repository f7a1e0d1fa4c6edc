//! `cross_brgemm`, `cross_brgemm_save` and `cross_brgemm_dgrad`: a contracted
//! DCN-v2 cross layer ([`super::cross_mix`]) with its elementwise steps fused
//! into the epilogues of its GEMMs (the pass `fuse-cross-epilogue`,
//! `dlrm_passes`), so each chunk of a product is mixed while it is in cache
//! instead of in a separate pass over `S × D`.
//!
//! `cross_brgemm(zb, ub, b, x0b, xb) -> yb`: `w = brgemm{act=none}(zb, ub, b)`
//! (stored in `brgemm`'s result dtype: bf16 only if `zb` and `ub` are) and
//! `y = cross_mix(x0b, w, xb)` (in `xb`'s dtype). `cross_brgemm_save` has the
//! same operands and results `(yb, w)`: the training form, which keeps `w` for
//! the gradient.
//!
//! `cross_brgemm_dgrad(tb, vb, dyb[, x0b, wb])`: `dx = dyb + brgemm_dgrad{act=none}(tb, vb)`
//! (f32; `dyb` is f32): the residual of the layer's input gradient. With `x0b`
//! and `wb` (the saved `w` of the layer below), also that layer's
//! `cross_mix_grad(dx, x0b, wb)`: results `(dx, g, dx0)`, `g = dx ⊙ x0` in `wb`'s
//! dtype and `dx0 = dx ⊙ w` in `x0b`'s.
//!
//! Each is defined as the composition it replaces, element by element in the
//! same float operations, so a fused plan equals the unfused one bit for bit.

use super::cross::{arity_error, no_gradient};
use super::cross_mix::{mix, mix_grad};
use crate::error::Result;
use crate::graph::ValueId;
use crate::instance::Checked;
use crate::interp::common::{floats, store};
use crate::interp::fused;
use crate::module::{DecomposeCx, GradCx, ModOp, OpModule, Work};
use crate::op::{Act, Op};
use crate::tensor::Tensor;
use crate::types::{DType, Dim, TensorType};

type R<T> = std::result::Result<T, String>;

/// The forward ops: `cross_brgemm` (`save: false`) and `cross_brgemm_save`.
pub struct CrossBrgemm {
    /// Whether `w` is a second result (the training form).
    pub save: bool,
}

/// The inference form.
pub const CROSS_BRGEMM: CrossBrgemm = CrossBrgemm { save: false };

/// The training form (keeps `w`).
pub const CROSS_BRGEMM_SAVE: CrossBrgemm = CrossBrgemm { save: true };

/// The backward op `cross_brgemm_dgrad` (see the module docs).
pub struct CrossBrgemmDgrad;

/// The product inside `cross_brgemm`: `brgemm` without activation.
fn product() -> Op {
    Op::Brgemm { act: Act::None }
}

/// The product inside `cross_brgemm_dgrad`: `brgemm_dgrad` without
/// activation or mask, to f32.
fn dgrad() -> Op {
    Op::BrgemmDgrad {
        act: Act::None,
        mask: Act::None,
        dtype: DType::F32,
    }
}

/// Checks that `ins` (named `names`) are floats of the shape of `like`.
fn shaped_like(like: &TensorType, ins: &[&TensorType], names: &[&str]) -> R<()> {
    for (t, name) in ins.iter().zip(names) {
        if !t.dtype.is_float() {
            return Err(format!("{name} must be f32 or bf16, got {t}"));
        }
        if t.shape != like.shape {
            return Err(format!(
                "{name} {t} must have the shape of the product, {like}"
            ));
        }
    }
    Ok(())
}

/// The shape rule's arity error.
fn takes(op: &str, want: &str, got: usize) -> String {
    format!("`{op}` takes {want} operands, got {got}")
}

/// `brgemm`'s work on `(xb[Kb,S,bk], wb[Nb,Kb,bk,bn])`: `2·S·Kb·bk·Nb·bn`.
fn gemm_flops(x: &TensorType, w: &TensorType, dim: &dyn Fn(&Dim) -> f64) -> f64 {
    let s = dim(&x.shape[1]);
    2.0 * s * w.shape.iter().map(dim).product::<f64>()
}

/// The GEMM's flops, `per_elem` flops per element of the epilogue's `S × D`
/// (`sd`, a result's type), and the bytes of every operand and result.
fn fused_work(
    ins: &[&TensorType],
    outs: &[&TensorType],
    dim: &dyn Fn(&Dim) -> f64,
    sd: &TensorType,
    per_elem: f64,
) -> Work {
    let numel = |t: &TensorType| t.shape.iter().map(dim).product::<f64>();
    Work {
        flops: gemm_flops(ins[0], ins[1], dim) + per_elem * numel(sd),
        bytes: ins
            .iter()
            .chain(outs)
            .map(|t| numel(t) * t.dtype.size_bytes() as f64)
            .sum(),
    }
}

impl OpModule for CrossBrgemm {
    fn mnemonic(&self) -> &'static str {
        if self.save {
            "cross_brgemm_save"
        } else {
            "cross_brgemm"
        }
    }

    no_attributes!();

    fn infer(&self, _: &ModOp, ins: &[&TensorType]) -> R<Vec<TensorType>> {
        if ins.len() != 5 {
            return Err(takes(self.mnemonic(), "5", ins.len()));
        }
        let w = crate::infer(&product(), &ins[..3], &[])?.remove(0);
        shaped_like(&w, &ins[3..], &["x0", "x"])?;
        let y = ins[4].clone();
        Ok(if self.save { vec![y, w] } else { vec![y] })
    }

    fn eval(&self, c: &Checked<'_>) -> R<Vec<Tensor>> {
        let ins = c.inputs();
        // `brgemm`'s result dtype: bf16 only if both factors are.
        let w_dtype = if ins[..2].iter().all(|t| t.dtype() == DType::BF16) {
            DType::BF16
        } else {
            DType::F32
        };
        let w = fused::brgemm(Act::None, &ins[..3], w_dtype)?;
        let (x0, wv, x) = (
            floats(ins[3], "x0")?,
            floats(&w, "w")?,
            floats(ins[4], "x")?,
        );
        let y = store(c.out(0).dtype, c.in_shape(4).to_vec(), mix(&x0, &wv, &x))?;
        Ok(if self.save { vec![y, w] } else { vec![y] })
    }

    fn work(
        &self,
        _: &ModOp,
        ins: &[&TensorType],
        outs: &[&TensorType],
        dim: &dyn Fn(&Dim) -> f64,
    ) -> Work {
        fused_work(ins, outs, dim, ins[4], 2.0)
    }

    fn backward(&self, _: &ModOp, _: &mut dyn GradCx) -> Result<()> {
        no_gradient(self.mnemonic())
    }

    fn decompose(
        &self,
        _: &ModOp,
        g: &mut DecomposeCx<'_>,
        ins: &[ValueId],
        names: &[&str],
    ) -> Result<Vec<ValueId>> {
        let &[z, u, b, x0, x] = ins else {
            return Err(arity_error(g, self.mnemonic(), 5, ins.len()));
        };
        let y = names.first().copied().unwrap_or("cross");
        let w_name = names
            .get(1)
            .map_or_else(|| format!("{y}.w"), |n| n.to_string());
        let w = g.add(product(), &[z, u, b], &w_name)?;
        let y = g.add(ModOp::op("cross_mix"), &[x0, w, x], y)?;
        Ok(if self.save { vec![y, w] } else { vec![y] })
    }

    no_onnx_form!();

    not_an_update!();
}

impl OpModule for CrossBrgemmDgrad {
    fn mnemonic(&self) -> &'static str {
        "cross_brgemm_dgrad"
    }

    no_attributes!();

    fn infer(&self, _: &ModOp, ins: &[&TensorType]) -> R<Vec<TensorType>> {
        if ins.len() != 3 && ins.len() != 5 {
            return Err(takes(self.mnemonic(), "3 or 5", ins.len()));
        }
        let dx = crate::infer(&dgrad(), &ins[..2], &[])?.remove(0);
        if ins[2].dtype != DType::F32 || ins[2].shape != dx.shape {
            return Err(format!(
                "dy {} must be f32 of the product's shape, {dx}",
                ins[2]
            ));
        }
        if ins.len() == 3 {
            return Ok(vec![dx]);
        }
        shaped_like(&dx, &ins[3..], &["x0", "w"])?;
        let (x0, w) = (ins[3], ins[4]);
        Ok(vec![
            dx.clone(),
            dx.with_dtype(w.dtype),
            dx.with_dtype(x0.dtype),
        ])
    }

    fn eval(&self, c: &Checked<'_>) -> R<Vec<Tensor>> {
        let ins = c.inputs();
        let tv = fused::brgemm_dgrad(Act::None, Act::None, &ins[..2], DType::F32)?;
        let (tv, dy) = (floats(&tv, "t·v")?, floats(ins[2], "dy")?);
        let dx: Vec<f32> = (0..dy.len()).map(|i| dy[i] + tv[i]).collect();
        let shape = c.in_shape(2).to_vec();
        if ins.len() == 3 {
            return Ok(vec![Tensor::f32(shape, dx)]);
        }
        let (x0, w) = (floats(ins[3], "x0")?, floats(ins[4], "w")?);
        let (g, dx0) = mix_grad(&dx, &x0, &w);
        Ok(vec![
            Tensor::f32(shape.clone(), dx),
            store(c.out(1).dtype, shape.clone(), g)?,
            store(c.out(2).dtype, shape, dx0)?,
        ])
    }

    fn work(
        &self,
        _: &ModOp,
        ins: &[&TensorType],
        outs: &[&TensorType],
        dim: &dyn Fn(&Dim) -> f64,
    ) -> Work {
        let per_elem = if ins.len() == 5 { 3.0 } else { 1.0 };
        fused_work(ins, outs, dim, ins[2], per_elem)
    }

    fn backward(&self, _: &ModOp, _: &mut dyn GradCx) -> Result<()> {
        no_gradient(self.mnemonic())
    }

    fn decompose(
        &self,
        _: &ModOp,
        g: &mut DecomposeCx<'_>,
        ins: &[ValueId],
        names: &[&str],
    ) -> Result<Vec<ValueId>> {
        let (t, v, dy, rest) = match *ins {
            [t, v, dy] => (t, v, dy, None),
            [t, v, dy, x0, w] => (t, v, dy, Some((x0, w))),
            _ => return Err(arity_error(g, self.mnemonic(), 5, ins.len())),
        };
        let n = |k: usize, fallback: &str| names.get(k).copied().unwrap_or(fallback).to_string();
        let dx_name = n(0, "dx");
        let tv = g.add(dgrad(), &[t, v], &format!("{dx_name}.tv"))?;
        let dx = g.add(Op::Add, &[dy, tv], &dx_name)?;
        let Some((x0, w)) = rest else {
            return Ok(vec![dx]);
        };
        let grads = g.add_node(
            ModOp::op("cross_mix_grad"),
            &[dx, x0, w],
            &[&n(1, "g"), &n(2, "dx0")],
        )?;
        Ok([vec![dx], grads].concat())
    }

    no_onnx_form!();

    not_an_update!();
}
