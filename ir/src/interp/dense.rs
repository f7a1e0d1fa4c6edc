//! Dense ops: `linear` and its gradients, the elementwise ops (`relu`, `sigmoid`,
//! `add` and the activation gradients) and the losses with their gradients.
//!
//! Summation order (the reference every optimised kernel is compared with): every
//! sum is one f32 accumulator that starts at `0.0` and adds its terms in increasing
//! index order (`linear`: over `k`, then the bias is added to the finished dot
//! product; `linear_dx`: over `n`; `linear_dw` and `linear_db`: over the samples `s`;
//! losses: over the elements in row-major order, then the negation and the division
//! by `denom`). Products are plain `a * b` (no fused multiply-add).

use super::common::{R, denom, dims, floats, store};
use crate::{Act, Checked, Op, Tensor};
use std::collections::HashMap;

/// `max(x, 0)`; NaN stays NaN.
fn relu1(x: f32) -> f32 {
    if x > 0.0 || x.is_nan() { x } else { 0.0 }
}

/// `1 / (1 + exp(-x))`.
fn sigmoid1(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn act1(act: Act, x: f32) -> f32 {
    match act {
        Act::None => x,
        Act::Relu => relu1(x),
        Act::Sigmoid => sigmoid1(x),
    }
}

/// Evaluates a dense op on its checked operands.
pub(super) fn eval(c: &Checked<'_>, syms: &HashMap<String, usize>) -> R<Tensor> {
    let one = |i: usize, what: &str| floats(c.input(i), what);
    match c.op() {
        Op::Linear { act } => linear(*act, c),
        Op::Relu => map1(c, relu1),
        Op::Sigmoid => map1(c, sigmoid1),
        Op::Add => map2(c, ["a", "b"], |a, b| a + b),
        Op::ReluGrad => map2(c, ["dy", "y"], |dy, y| if y > 0.0 { dy } else { 0.0 }),
        Op::SigmoidGrad => map2(c, ["dy", "y"], |dy, y| dy * y * (1.0 - y)),
        Op::LinearDx => {
            let [s, n] = dims(c.in_shape(0));
            let k = c.in_shape(1)[1];
            let (dz, w) = (one(0, "dz")?, one(1, "weight")?);
            let dx = gemm(s, k, n, |si, ki, ni| dz[si * n + ni] * w[ni * k + ki]);
            store(c.out(0).dtype, vec![s, k], dx)
        }
        Op::LinearDw => {
            let [s, n] = dims(c.in_shape(0));
            let k = c.in_shape(1)[1];
            let (dz, x) = (one(0, "dz")?, one(1, "x")?);
            let dw = gemm(n, k, s, |ni, ki, si| dz[si * n + ni] * x[si * k + ki]);
            store(c.out(0).dtype, vec![n, k], dw)
        }
        Op::LinearDb => {
            let [s, n] = dims(c.in_shape(0));
            let dz = one(0, "dz")?;
            let db = gemm(1, n, s, |_, ni, si| dz[si * n + ni]);
            store(c.out(0).dtype, vec![n], db)
        }
        Op::Bce { denom: d } => {
            let term = |p: f32, y: f32| y * clamped_ln(p) + (1.0 - y) * clamped_ln(1.0 - p);
            loss(c, denom(d, syms)?, term, true)
        }
        Op::Mse { denom: d } => {
            let term = |p: f32, y: f32| {
                let e = p - y;
                e * e
            };
            loss(c, denom(d, syms)?, term, false)
        }
        Op::BceGrad { denom: d } => {
            let den = denom(d, syms)?;
            map2(c, ["prediction", "label"], |p, y| {
                (p - y) / (p * (1.0 - p)).max(1e-12) / den
            })
        }
        Op::MseGrad { denom: d } => {
            let den = denom(d, syms)?;
            map2(c, ["prediction", "label"], |p, y| 2.0 * (p - y) / den)
        }
        other => super::common::not_in_family(other, "a dense op"),
    }
}

/// `out[i][j] = Σ_r term(i, j, r)` for `r` in `0..depth` ascending, row-major
/// `[rows, cols]`.
fn gemm(
    rows: usize,
    cols: usize,
    depth: usize,
    term: impl Fn(usize, usize, usize) -> f32,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * cols);
    for i in 0..rows {
        for j in 0..cols {
            let mut acc = 0.0f32;
            for r in 0..depth {
                acc += term(i, j, r);
            }
            out.push(acc);
        }
    }
    out
}

/// `linear(x[S,K], w[N,K], b[N]) -> act(x · wᵀ + b)`.
fn linear(act: Act, c: &Checked<'_>) -> R<Tensor> {
    let [s, k] = dims(c.in_shape(0));
    let n = c.in_shape(1)[0];
    let x = floats(c.input(0), "x")?;
    let w = floats(c.input(1), "weight")?;
    let b = floats(c.input(2), "bias")?;
    let mut y = Vec::with_capacity(s * n);
    for si in 0..s {
        let xr = &x[si * k..(si + 1) * k];
        for ni in 0..n {
            let wr = &w[ni * k..(ni + 1) * k];
            let mut acc = 0.0f32;
            for (a, c) in xr.iter().zip(wr) {
                acc += a * c;
            }
            y.push(act1(act, acc + b[ni]));
        }
    }
    store(c.out(0).dtype, vec![s, n], y)
}

/// An elementwise map of one operand.
fn map1(c: &Checked<'_>, f: fn(f32) -> f32) -> R<Tensor> {
    let x = floats(c.input(0), "operand")?;
    store(
        c.out(0).dtype,
        c.in_shape(0).to_vec(),
        x.iter().map(|&v| f(v)).collect(),
    )
}

/// An elementwise map of two operands of the same shape.
fn map2(c: &Checked<'_>, names: [&str; 2], f: impl Fn(f32, f32) -> f32) -> R<Tensor> {
    let a = floats(c.input(0), names[0])?;
    let b = floats(c.input(1), names[1])?;
    let y = a.iter().zip(b.iter()).map(|(&x, &z)| f(x, z)).collect();
    store(c.out(0).dtype, c.in_shape(0).to_vec(), y)
}

/// `ln(v)` clamped below at -100 (PyTorch's `BCELoss`); NaN stays NaN.
fn clamped_ln(v: f32) -> f32 {
    let l = v.ln();
    if l < -100.0 { -100.0 } else { l }
}

/// A loss over `prediction` and `label` of one shape: `reduce(Σ term(p, y)) /
/// denom`, an f32 scalar.
fn loss(c: &Checked<'_>, den: f32, term: fn(f32, f32) -> f32, negate: bool) -> R<Tensor> {
    let p = floats(c.input(0), "prediction")?;
    let y = floats(c.input(1), "label")?;
    let mut acc = 0.0f32;
    for (&pi, &yi) in p.iter().zip(y.iter()) {
        acc += term(pi, yi);
    }
    let total = if negate { -acc } else { acc };
    store(c.out(0).dtype, vec![], vec![total / den])
}
