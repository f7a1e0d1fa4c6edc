//! Dense ops: `linear` and its gradients, the elementwise ops (`relu`, `sigmoid`,
//! `gelu`, `add` and the activation gradients) and the losses with their gradients.
//!
//! Summation order (the reference every optimised kernel is compared with): every
//! sum is one f32 accumulator that starts at `0.0` and adds its terms in increasing
//! index order (`linear`: over `k`, then the bias is added to the finished dot
//! product; `linear_dx`: over `n`; `linear_dw` and `linear_db`: over the samples `s`;
//! losses: over the elements in row-major order, then the negation and the division
//! by `denom`). Products are plain `a * b` (no fused multiply-add).

use super::common::{R, denom, describe, dims1, dims2, expect_arity, floats, same_shape, store};
use crate::{Act, DType, Dim, Tensor};
use std::collections::HashMap;

/// `max(x, 0)`; NaN stays NaN.
fn relu1(x: f32) -> f32 {
    if x > 0.0 || x.is_nan() { x } else { 0.0 }
}

/// `1 / (1 + exp(-x))`.
fn sigmoid1(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

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
/// definition of [`crate::Op::Gelu`]; kernels call this function).
pub fn gelu1(x: f32) -> f32 {
    0.5 * x * (1.0 + gelu_tanh(x))
}

/// `gelu_grad(dy, x)`: `dy · (0.5·(1 + t) + ((0.5·x)·(1 - t·t))·(β·(1 + 3κ·x²)))`
/// with `t = tanh(β·(x + κ·x³))` (the definition of [`crate::Op::GeluGrad`];
/// kernels call this function).
pub fn gelu_grad1(dy: f32, x: f32) -> f32 {
    let t = gelu_tanh(x);
    let left_derivative = 0.5 * (1.0 + t);
    let inner_derivative = GELU_BETA * (1.0 + 3.0 * GELU_KAPPA * (x * x));
    let right_derivative = 0.5 * x * (1.0 - t * t) * inner_derivative;
    dy * (left_derivative + right_derivative)
}

fn act1(act: Act, x: f32) -> f32 {
    match act {
        Act::None => x,
        Act::Relu => relu1(x),
        Act::Sigmoid => sigmoid1(x),
    }
}

/// `linear(x[S,K], w[N,K], b[N]) -> act(x · wᵀ + b)`.
pub(super) fn linear(act: Act, ins: &[&Tensor], out: DType) -> R<Tensor> {
    expect_arity("linear", ins, &[3])?;
    let [s, k] = dims2(ins[0], "x")?;
    let [n, kw] = dims2(ins[1], "weight")?;
    let nb = dims1(ins[2], "bias")?;
    if kw != k {
        return Err(format!(
            "x {} has {k} features but weight {} has {kw} columns",
            describe(ins[0]),
            describe(ins[1])
        ));
    }
    if nb != n {
        return Err(format!(
            "bias {} does not match the {n} rows of weight {}",
            describe(ins[2]),
            describe(ins[1])
        ));
    }
    let x = floats(ins[0], "x")?;
    let w = floats(ins[1], "weight")?;
    let b = floats(ins[2], "bias")?;
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
    store(out, vec![s, n], y)
}

/// An elementwise map of one operand.
fn map1(ins: &[&Tensor], mnemonic: &str, out: DType, f: fn(f32) -> f32) -> R<Tensor> {
    expect_arity(mnemonic, ins, &[1])?;
    let x = floats(ins[0], "operand")?;
    store(out, ins[0].shape.clone(), x.iter().map(|&v| f(v)).collect())
}

/// An elementwise map of two operands of the same shape.
fn map2(
    ins: &[&Tensor],
    mnemonic: &str,
    names: [&str; 2],
    out: DType,
    f: impl Fn(f32, f32) -> f32,
) -> R<Tensor> {
    expect_arity(mnemonic, ins, &[2])?;
    same_shape(names[0], ins[0], names[1], ins[1])?;
    let a = floats(ins[0], names[0])?;
    let b = floats(ins[1], names[1])?;
    let y = a.iter().zip(b.iter()).map(|(&x, &z)| f(x, z)).collect();
    store(out, ins[0].shape.clone(), y)
}

/// `relu(x)`.
pub(super) fn relu(ins: &[&Tensor], out: DType) -> R<Tensor> {
    map1(ins, "relu", out, relu1)
}

/// `sigmoid(x)`.
pub(super) fn sigmoid(ins: &[&Tensor], out: DType) -> R<Tensor> {
    map1(ins, "sigmoid", out, sigmoid1)
}

/// `gelu(x)`.
pub(super) fn gelu(ins: &[&Tensor], out: DType) -> R<Tensor> {
    map1(ins, "gelu", out, gelu1)
}

/// `gelu_grad(dy, x)`.
pub(super) fn gelu_grad(ins: &[&Tensor], out: DType) -> R<Tensor> {
    map2(ins, "gelu_grad", ["dy", "x"], out, gelu_grad1)
}

/// `add(a, b)`.
pub(super) fn add(ins: &[&Tensor], out: DType) -> R<Tensor> {
    map2(ins, "add", ["a", "b"], out, |a, b| a + b)
}

/// `relu_grad(dy, y)`: `dy` where `y > 0`, else 0.
pub(super) fn relu_grad(ins: &[&Tensor], out: DType) -> R<Tensor> {
    map2(ins, "relu_grad", ["dy", "y"], out, |dy, y| {
        if y > 0.0 { dy } else { 0.0 }
    })
}

/// `sigmoid_grad(dy, y)`: `(dy · y) · (1 - y)`.
pub(super) fn sigmoid_grad(ins: &[&Tensor], out: DType) -> R<Tensor> {
    map2(ins, "sigmoid_grad", ["dy", "y"], out, |dy, y| {
        dy * y * (1.0 - y)
    })
}

/// `linear_dx(dz[S,N], w[N,K]) -> dz · w`.
pub(super) fn linear_dx(ins: &[&Tensor], out: DType) -> R<Tensor> {
    expect_arity("linear_dx", ins, &[2])?;
    let [s, n] = dims2(ins[0], "dz")?;
    let [nw, k] = dims2(ins[1], "weight")?;
    if nw != n {
        return Err(format!(
            "dz {} has {n} columns but weight {} has {nw} rows",
            describe(ins[0]),
            describe(ins[1])
        ));
    }
    let dz = floats(ins[0], "dz")?;
    let w = floats(ins[1], "weight")?;
    let mut dx = Vec::with_capacity(s * k);
    for si in 0..s {
        for ki in 0..k {
            let mut acc = 0.0f32;
            for ni in 0..n {
                acc += dz[si * n + ni] * w[ni * k + ki];
            }
            dx.push(acc);
        }
    }
    store(out, vec![s, k], dx)
}

/// `linear_dw(dz[S,N], x[S,K]) -> dzᵀ · x`.
pub(super) fn linear_dw(ins: &[&Tensor], out: DType) -> R<Tensor> {
    expect_arity("linear_dw", ins, &[2])?;
    let [s, n] = dims2(ins[0], "dz")?;
    let [sx, k] = dims2(ins[1], "x")?;
    if sx != s {
        return Err(format!(
            "dz {} and x {} must have the same number of samples",
            describe(ins[0]),
            describe(ins[1])
        ));
    }
    let dz = floats(ins[0], "dz")?;
    let x = floats(ins[1], "x")?;
    let mut dw = Vec::with_capacity(n * k);
    for ni in 0..n {
        for ki in 0..k {
            let mut acc = 0.0f32;
            for si in 0..s {
                acc += dz[si * n + ni] * x[si * k + ki];
            }
            dw.push(acc);
        }
    }
    store(out, vec![n, k], dw)
}

/// `linear_db(dz[S,N]) -> Σ_s dz[s]`.
pub(super) fn linear_db(ins: &[&Tensor], out: DType) -> R<Tensor> {
    expect_arity("linear_db", ins, &[1])?;
    let [s, n] = dims2(ins[0], "dz")?;
    let dz = floats(ins[0], "dz")?;
    let mut db = Vec::with_capacity(n);
    for ni in 0..n {
        let mut acc = 0.0f32;
        for si in 0..s {
            acc += dz[si * n + ni];
        }
        db.push(acc);
    }
    store(out, vec![n], db)
}

/// `ln(v)` clamped below at -100 (PyTorch's `BCELoss`); NaN stays NaN.
fn clamped_ln(v: f32) -> f32 {
    let l = v.ln();
    if l < -100.0 { -100.0 } else { l }
}

/// A loss: `reduce(Σ term(p, y)) / denom`, an f32 scalar.
fn loss(
    ins: &[&Tensor],
    mnemonic: &str,
    d: &Dim,
    syms: &HashMap<String, usize>,
    out: DType,
    term: fn(f32, f32) -> f32,
    negate: bool,
) -> R<Tensor> {
    expect_arity(mnemonic, ins, &[2])?;
    same_shape("prediction", ins[0], "label", ins[1])?;
    let den = denom(d, syms)?;
    let p = floats(ins[0], "prediction")?;
    let y = floats(ins[1], "label")?;
    let mut acc = 0.0f32;
    for (&pi, &yi) in p.iter().zip(y.iter()) {
        acc += term(pi, yi);
    }
    let total = if negate { -acc } else { acc };
    store(out, vec![], vec![total / den])
}

/// `bce(p, y) = -Σ (y·ln p + (1-y)·ln(1-p)) / denom`, logs clamped at -100.
pub(super) fn bce(
    ins: &[&Tensor],
    d: &Dim,
    syms: &HashMap<String, usize>,
    out: DType,
) -> R<Tensor> {
    let term = |p: f32, y: f32| y * clamped_ln(p) + (1.0 - y) * clamped_ln(1.0 - p);
    loss(ins, "bce", d, syms, out, term, true)
}

/// `mse(p, y) = Σ (p - y)² / denom`.
pub(super) fn mse(
    ins: &[&Tensor],
    d: &Dim,
    syms: &HashMap<String, usize>,
    out: DType,
) -> R<Tensor> {
    let term = |p: f32, y: f32| {
        let e = p - y;
        e * e
    };
    loss(ins, "mse", d, syms, out, term, false)
}

/// `bce_grad(p, y) = (p - y) / max(p·(1-p), 1e-12) / denom`.
pub(super) fn bce_grad(
    ins: &[&Tensor],
    d: &Dim,
    syms: &HashMap<String, usize>,
    out: DType,
) -> R<Tensor> {
    let den = denom(d, syms)?;
    map2(ins, "bce_grad", ["prediction", "label"], out, |p, y| {
        (p - y) / (p * (1.0 - p)).max(1e-12) / den
    })
}

/// `mse_grad(p, y) = 2 (p - y) / denom`.
pub(super) fn mse_grad(
    ins: &[&Tensor],
    d: &Dim,
    syms: &HashMap<String, usize>,
    out: DType,
) -> R<Tensor> {
    let den = denom(d, syms)?;
    map2(ins, "mse_grad", ["prediction", "label"], out, |p, y| {
        2.0 * (p - y) / den
    })
}
