//! Elementwise ops on f32, parallel over chunks: `relu`, `relu_grad`, `sigmoid`,
//! `sigmoid_grad`, `gelu`, `gelu_grad`, `add`. Each element is computed exactly as
//! the definition writes it (`gelu` and `gelu_grad` call the interpreter's own
//! scalar functions), so results are bitwise equal to a sequential loop.

use super::{KResult, arity, f32_operand, shape_err};
use dlrm_ir::Tensor;
use rayon::prelude::*;

/// Elements per rayon task.
const CHUNK: usize = 1 << 15;

fn unary(a: &Tensor, x: &[f32], f: impl Fn(f32) -> f32 + Sync) -> Tensor {
    let mut out = vec![0.0f32; x.len()];
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(o, i)| o.iter_mut().zip(i).for_each(|(o, &v)| *o = f(v)));
    Tensor::f32(a.shape.clone(), out)
}

fn binary(
    op: &'static str,
    inputs: &[&Tensor],
    f: impl Fn(f32, f32) -> f32 + Sync,
) -> Option<KResult<Tensor>> {
    let (a, b) = (f32_operand(inputs, 0)?, f32_operand(inputs, 1)?);
    Some((|| {
        arity(op, inputs, &[2])?;
        if inputs[0].shape != inputs[1].shape {
            return Err(shape_err(
                op,
                format!(
                    "shapes {:?} and {:?} differ",
                    inputs[0].shape, inputs[1].shape
                ),
            ));
        }
        let mut out = vec![0.0f32; a.len()];
        out.par_chunks_mut(CHUNK)
            .zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)))
            .for_each(|(o, (x, y))| {
                o.iter_mut()
                    .zip(x.iter().zip(y))
                    .for_each(|(o, (&x, &y))| *o = f(x, y))
            });
        Ok(Tensor::f32(inputs[0].shape.clone(), out))
    })())
}

/// `relu(x) = max(x, 0)`.
pub fn relu(inputs: &[&Tensor]) -> Option<KResult<Tensor>> {
    let x = f32_operand(inputs, 0)?;
    Some(arity("relu", inputs, &[1]).map(|()| {
        unary(
            inputs[0],
            x,
            |v| if v > 0.0 || v.is_nan() { v } else { 0.0 },
        )
    }))
}

/// `sigmoid(x) = 1 / (1 + exp(-x))`.
pub fn sigmoid(inputs: &[&Tensor]) -> Option<KResult<Tensor>> {
    let x = f32_operand(inputs, 0)?;
    Some(arity("sigmoid", inputs, &[1]).map(|()| unary(inputs[0], x, |v| 1.0 / (1.0 + (-v).exp()))))
}

/// `relu_grad(dy, y) = dy where y > 0, else 0`.
pub fn relu_grad(inputs: &[&Tensor]) -> Option<KResult<Tensor>> {
    binary("relu_grad", inputs, |dy, y| if y > 0.0 { dy } else { 0.0 })
}

/// `sigmoid_grad(dy, y) = dy · y · (1 - y)`.
pub fn sigmoid_grad(inputs: &[&Tensor]) -> Option<KResult<Tensor>> {
    binary("sigmoid_grad", inputs, |dy, y| dy * y * (1.0 - y))
}

/// `gelu(x)`: [`dlrm_ir::interp::gelu1`] per element.
pub fn gelu(inputs: &[&Tensor]) -> Option<KResult<Tensor>> {
    let x = f32_operand(inputs, 0)?;
    Some(arity("gelu", inputs, &[1]).map(|()| unary(inputs[0], x, dlrm_ir::interp::gelu1)))
}

/// `gelu_grad(dy, x)`: [`dlrm_ir::interp::gelu_grad1`] per element.
pub fn gelu_grad(inputs: &[&Tensor]) -> Option<KResult<Tensor>> {
    binary("gelu_grad", inputs, dlrm_ir::interp::gelu_grad1)
}

/// `add(a, b) = a + b`.
pub fn add(inputs: &[&Tensor]) -> Option<KResult<Tensor>> {
    binary("add", inputs, |a, b| a + b)
}
