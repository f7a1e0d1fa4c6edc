//! Losses on logits: `bce_logits` and `bce_logits_grad`, on f32 operands.
//!
//! `bce_logits` sums `max(z,0) - z·y + ln(1 + exp(-|z|))` in row-major order in one
//! f32 accumulator, sequentially, exactly as the definition (the batch is small;
//! the order is the contract), then divides by the denominator.
//! `bce_logits_grad` is elementwise `(sigmoid(z) - y) / denom`, parallel over
//! chunks, each element by the definition's own operations: bitwise equal.
//! A denominator whose symbol is unbound (or 0) has no kernel: the interpreter
//! reports it.
//!
//! The operands come checked against the node's instance ([`Checked`]: logits and
//! label of one shape, verified by inference; buffers of their shapes' lengths).

use super::KResult;
use dlrm_ir::{Checked, Dim, Tensor};
use rayon::prelude::*;
use std::collections::HashMap;

/// Elements per rayon task.
const CHUNK: usize = 1 << 15;

fn resolve(d: &Dim, syms: &HashMap<String, usize>) -> Option<f32> {
    let n = d.resolve(&|s| syms.get(s).copied())?;
    (n > 0).then_some(n as f32)
}

/// The f32 logits and labels (`None`: another dtype, no kernel).
fn operands<'a>(c: &Checked<'a>) -> Option<(&'a [f32], &'a [f32])> {
    Some((c.input(0).as_f32()?, c.input(1).as_f32()?))
}

/// `bce_logits(z, y) -> f32[]`.
pub fn bce_logits(
    denom: &Dim,
    c: &Checked<'_>,
    syms: &HashMap<String, usize>,
) -> Option<KResult<Tensor>> {
    let den = resolve(denom, syms)?;
    let (z, y) = operands(c)?;
    let mut acc = 0.0f32;
    for (&zi, &yi) in z.iter().zip(y) {
        acc += zi.max(0.0) - zi * yi + (-zi.abs()).exp().ln_1p();
    }
    Some(Ok(Tensor::f32(vec![], vec![acc / den])))
}

/// `bce_logits_grad(z, y) -> (sigmoid(z) - y) / denom`.
pub fn bce_logits_grad(
    denom: &Dim,
    c: &Checked<'_>,
    syms: &HashMap<String, usize>,
) -> Option<KResult<Tensor>> {
    let den = resolve(denom, syms)?;
    let (z, y) = operands(c)?;
    let mut out = vec![0.0f32; z.len()];
    out.par_chunks_mut(CHUNK)
        .zip(z.par_chunks(CHUNK).zip(y.par_chunks(CHUNK)))
        .for_each(|(o, (z, y))| {
            for (o, (&zi, &yi)) in o.iter_mut().zip(z.iter().zip(y)) {
                *o = (1.0 / (1.0 + (-zi).exp()) - yi) / den;
            }
        });
    Some(Ok(Tensor::f32(c.in_shape(0).to_vec(), out)))
}
