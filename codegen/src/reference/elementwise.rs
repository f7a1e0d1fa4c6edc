//! Elementwise ops on f32, parallel over chunks: `relu`, `relu_grad`, `sigmoid`,
//! `sigmoid_grad`, `add`, and module ops defined by a scalar function ([`unary`],
//! [`binary`] of the module's own function). Each element is computed exactly as
//! the definition writes it, so results are bitwise equal to a sequential loop.
//!
//! Each kernel takes its operands checked against the node's instance
//! ([`Checked`]: the shape rule — one operand, or two of the same shape — was
//! verified by inference, and every buffer holds its shape's element count), so
//! nothing here re-checks a shape. `None`: an operand or the result is not f32
//! (no kernel).

use super::KResult;
use dlrm_ir::{Checked, DType, Tensor};
use rayon::prelude::*;

/// Elements per rayon task.
const CHUNK: usize = 1 << 15;

/// `f` of each element of the one operand (`None`: the operand or the result
/// is not f32).
pub(crate) fn unary(c: &Checked<'_>, f: impl Fn(f32) -> f32 + Sync) -> Option<KResult<Tensor>> {
    if c.out(0).dtype != DType::F32 {
        return None;
    }
    let x = c.input(0).as_f32()?;
    let mut out = vec![0.0f32; x.len()];
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(o, i)| o.iter_mut().zip(i).for_each(|(o, &v)| *o = f(v)));
    Some(Ok(Tensor::f32(c.in_shape(0).to_vec(), out)))
}

/// `f` of each pair of elements of two operands of one shape (verified by the
/// instance; `None`: an operand or the result is not f32).
pub(crate) fn binary(
    c: &Checked<'_>,
    f: impl Fn(f32, f32) -> f32 + Sync,
) -> Option<KResult<Tensor>> {
    if c.out(0).dtype != DType::F32 {
        return None;
    }
    let (a, b) = (c.input(0).as_f32()?, c.input(1).as_f32()?);
    let mut out = vec![0.0f32; a.len()];
    out.par_chunks_mut(CHUNK)
        .zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)))
        .for_each(|(o, (x, y))| {
            o.iter_mut()
                .zip(x.iter().zip(y))
                .for_each(|(o, (&x, &y))| *o = f(x, y))
        });
    Some(Ok(Tensor::f32(c.in_shape(0).to_vec(), out)))
}

/// `relu(x) = max(x, 0)`.
pub fn relu(c: &Checked<'_>) -> Option<KResult<Tensor>> {
    unary(c, |v| if v > 0.0 || v.is_nan() { v } else { 0.0 })
}

/// `sigmoid(x) = 1 / (1 + exp(-x))`.
pub fn sigmoid(c: &Checked<'_>) -> Option<KResult<Tensor>> {
    unary(c, |v| 1.0 / (1.0 + (-v).exp()))
}

/// `relu_grad(dy, y) = dy where y > 0, else 0`.
pub fn relu_grad(c: &Checked<'_>) -> Option<KResult<Tensor>> {
    binary(c, |dy, y| if y > 0.0 { dy } else { 0.0 })
}

/// `sigmoid_grad(dy, y) = dy · y · (1 - y)`.
pub fn sigmoid_grad(c: &Checked<'_>) -> Option<KResult<Tensor>> {
    binary(c, |dy, y| dy * y * (1.0 - y))
}

/// `add(a, b) = a + b`.
pub fn add(c: &Checked<'_>) -> Option<KResult<Tensor>> {
    binary(c, |a, b| a + b)
}
