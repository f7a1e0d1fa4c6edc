//! `cross` and `cross_grad`: one low-rank layer of DCN-v2's cross network
//! (TorchRec's `LowRankCrossNet`, the interaction of DLRM-DCNv2) and its gradient.
//!
//! `cross(x0[S,D], x[S,D], v[R,D], u[D,R], b[D]) -> y[S,D]`:
//! - `z = x · vᵀ`: `z[s,r] = Σ_k x[s,k]·v[r,k]`, one f32 accumulator, increasing `k`;
//! - `w = z · uᵀ + b`: `w[s,d] = (Σ_r z[s,r]·u[d,r]) + b[d]`, the sum as above;
//! - `y = x0 ⊙ w + x`: `y[s,d] = x0[s,d]·w[s,d] + x[s,d]`.
//!
//! `v` and `u` are in PyTorch's `Linear` layout (`[out, in]`): `v` is the weight of
//! `Linear(D, R, bias=False)` and `u` with `b` that of `Linear(R, D)`, so
//! `y = x0 * U(V(x)) + x`. The layer's `W = u·v` has rank `R`; a full-rank layer is
//! `R = D` (or `v` the identity). Results are in `x`'s dtype; every product and sum
//! is computed in f32.
//!
//! `cross_grad(dy[S,D], x0, x, v, u, b) -> (dx0, dx, dv, du, db)` recomputes `z` and
//! `w` as above, then with `g = dy ⊙ x0` (`g[s,d] = dy[s,d]·x0[s,d]`):
//! - `dx0 = dy ⊙ w`; `db[d] = Σ_s g[s,d]` (increasing `s`);
//! - `du = gᵀ · z`: `du[d,r] = Σ_s g[s,d]·z[s,r]`; `t = g · u`: `t[s,r] = Σ_d g[s,d]·u[d,r]`;
//! - `dv = tᵀ · x`: `dv[r,k] = Σ_s t[s,r]·x[s,k]`; `dx = dy + t · v`:
//!   `dx[s,k] = dy[s,k] + Σ_r t[s,r]·v[r,k]`.
//!
//! Each result has its operand's type. Every sum is one f32 accumulator in the
//! increasing order of its index. The float operands may differ in dtype (f32 or
//! bf16, as the precision pass leaves them); `x0` and `x` have the same shape.

use crate::error::{IrError, Result};
use crate::graph::{Graph, ValueId};
use crate::instance::Checked;
use crate::interp::common::{floats, store};
use crate::module::{DecomposeCx, GradCx, ModOp, OpModule, Work};
use crate::op::{BinaryKind, Op, Pool};
use crate::tensor::Tensor;
use crate::types::{Dim, TensorType};

type R<T> = std::result::Result<T, String>;

/// The forward op `cross` (see the module docs).
pub struct Cross;

/// The gradient op `cross_grad` (see the module docs).
pub struct CrossGrad;

/// Checks the operands `x0, x, v, u, b` of a layer (errors use the spec's names).
pub(super) fn check_layer(ins: &[&TensorType]) -> R<()> {
    let [x0, x, v, u, b] = ins else {
        unreachable!("arity checked by the caller")
    };
    for (name, t, rank) in [
        ("x0", x0, 2),
        ("x", x, 2),
        ("v", v, 2),
        ("u", u, 2),
        ("b", b, 1),
    ] {
        if t.rank() != rank {
            return Err(format!("{name} must have rank {rank}, got {t}"));
        }
        if !t.dtype.is_float() {
            return Err(format!("{name} must be f32 or bf16, got {t}"));
        }
    }
    if x0.shape != x.shape {
        return Err(format!("x0 {x0} and x {x} must have the same shape"));
    }
    let d = &x.shape[1];
    let r = &v.shape[0];
    let want = |name: &str, got: &Dim, want: &Dim| -> R<()> {
        if got == want {
            Ok(())
        } else {
            Err(format!("{name}: expected {want}, got {got}"))
        }
    };
    want("v's columns (the width D of x)", &v.shape[1], d)?;
    want("u's rows (the width D of x)", &u.shape[0], d)?;
    want("u's columns (the rank R, v's rows)", &u.shape[1], r)?;
    want("b's length (the width D of x)", &b.shape[0], d)
}

pub(super) fn arity(op: &str, ins: &[&TensorType], n: usize) -> R<()> {
    if ins.len() == n {
        Ok(())
    } else {
        Err(format!("`{op}` takes {n} operands, got {}", ins.len()))
    }
}

/// The work of a layer op whose `x` is operand `at` (`v` follows it):
/// `f_srd·S·R·D + f_sd·S·D` flops, and the bytes of every operand and result.
pub(super) fn layer_work(
    ins: &[&TensorType],
    outs: &[&TensorType],
    dim: &dyn Fn(&Dim) -> f64,
    at: usize,
    (f_srd, f_sd): (f64, f64),
) -> Work {
    let (x, v) = (ins[at], ins[at + 1]);
    let sd = dim(&x.shape[0]) * dim(&x.shape[1]);
    let srd = sd * dim(&v.shape[0]);
    let bytes = ins
        .iter()
        .chain(outs)
        .map(|t| t.shape.iter().map(dim).product::<f64>() * t.dtype.size_bytes() as f64)
        .sum();
    Work {
        flops: f_srd * srd + f_sd * sd,
        bytes,
    }
}

/// The gradient rule of a gradient op: none.
pub(super) fn no_gradient(op: &str) -> Result<()> {
    Err(IrError::Graph {
        graph: String::new(),
        reason: format!("autodiff: `{op}` has no gradient (second derivatives are not supported)"),
    })
}

/// A matrix view: element `(i, j)` at `i·rs + j·cs` of the slice (a row-major
/// matrix `(cols, 1)`, its transpose `(1, cols)`).
type View<'a> = (&'a [f32], usize, usize);

/// The row-major `[m, n]` product `a[m×k] · b[k×n]` of two views: one f32
/// accumulator per element, summed in increasing `k`.
fn mm((a, ars, acs): View<'_>, (b, brs, bcs): View<'_>, m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f32;
            for p in 0..k {
                acc += a[i * ars + p * acs] * b[p * brs + j * bcs];
            }
            c[i * n + j] = acc;
        }
    }
    c
}

/// The forward's intermediates `z[S,R]` and `w[S,D]` of the operands `x, v, u, b`.
pub(super) fn forward(
    x: &[f32],
    v: &[f32],
    u: &[f32],
    b: &[f32],
    s: usize,
    d: usize,
    r: usize,
) -> (Vec<f32>, Vec<f32>) {
    // z = x·vᵀ, w = z·uᵀ (+ b below).
    let z = mm((x, d, 1), (v, 1, d), s, d, r);
    let mut w = mm((&z, r, 1), (u, 1, r), s, r, d);
    for row in w.chunks_mut(d.max(1)) {
        for (e, &bias) in row.iter_mut().zip(b) {
            *e += bias;
        }
    }
    (z, w)
}

/// The five gradients of a layer from `dy, x0, x, v, u` and the forward's `z` and
/// `w` (see the module docs), stored in the result types of `c`.
pub(super) fn grads(
    c: &Checked<'_>,
    a: [&[f32]; 7],
    (s, d, r): (usize, usize, usize),
) -> R<Vec<Tensor>> {
    let [dy, x0, x, v, u, z, w] = a;
    let g: Vec<f32> = (0..s * d).map(|i| dy[i] * x0[i]).collect();
    let dx0: Vec<f32> = (0..s * d).map(|i| dy[i] * w[i]).collect();
    let mut db = vec![0.0f32; d];
    for (j, acc) in db.iter_mut().enumerate() {
        for i in 0..s {
            *acc += g[i * d + j];
        }
    }
    let du = mm((&g, 1, d), (z, r, 1), d, s, r); // gᵀ·z
    let t = mm((&g, d, 1), (u, r, 1), s, d, r); // g·u
    let dv = mm((&t, 1, r), (x, d, 1), r, s, d); // tᵀ·x
    let tv = mm((&t, r, 1), (v, d, 1), s, r, d); // t·v
    let dx: Vec<f32> = (0..s * d).map(|i| dy[i] + tv[i]).collect();
    let out = |k: usize, shape: Vec<usize>, vals: Vec<f32>| store(c.out(k).dtype, shape, vals);
    Ok(vec![
        out(0, vec![s, d], dx0)?,
        out(1, vec![s, d], dx)?,
        out(2, vec![r, d], dv)?,
        out(3, vec![d, r], du)?,
        out(4, vec![d], db)?,
    ])
}

/// The layer's dims `(S, D, R)` from checked operands whose `x` is operand `at`.
pub(super) fn dims(c: &Checked<'_>, at: usize) -> (usize, usize, usize) {
    let x = c.in_shape(at);
    (x[0], x[1], c.in_shape(at + 1)[0])
}

impl OpModule for Cross {
    fn mnemonic(&self) -> &'static str {
        "cross"
    }

    no_attributes!();

    fn infer(&self, _: &ModOp, ins: &[&TensorType]) -> R<Vec<TensorType>> {
        arity("cross", ins, 5)?;
        check_layer(ins)?;
        Ok(vec![ins[1].clone()])
    }

    fn eval(&self, c: &Checked<'_>) -> R<Vec<Tensor>> {
        let (s, d, r) = dims(c, 1);
        let x0 = floats(c.input(0), "x0")?;
        let x = floats(c.input(1), "x")?;
        let (v, u, b) = (
            floats(c.input(2), "v")?,
            floats(c.input(3), "u")?,
            floats(c.input(4), "b")?,
        );
        let (_, w) = forward(&x, &v, &u, &b, s, d, r);
        let y: Vec<f32> = (0..s * d).map(|i| x0[i] * w[i] + x[i]).collect();
        Ok(vec![store(c.out(0).dtype, vec![s, d], y)?])
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
        let mut operands = vec![dy];
        operands.extend_from_slice(cx.inputs());
        let hints: Vec<String> = (0..5).map(|k| cx.hint(k)).collect();
        let names: Vec<&str> = hints.iter().map(String::as_str).collect();
        let grads = cx.add(ModOp::op("cross_grad"), &operands, &names)?;
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
            return Err(arity_error(g, "cross", 5, ins.len()));
        };
        let y = names.first().copied().unwrap_or("cross");
        let (_, w) = decomposed_forward(g, x, v, u, b, y)?;
        let p = g.add(mul(), &[x0, w], &format!("{y}.scaled"))?;
        Ok(vec![g.add(Op::Add, &[p, x], y)?])
    }

    no_onnx_form!();

    not_an_update!();
}

pub(super) fn mul() -> Op {
    Op::Binary {
        kind: BinaryKind::Mul,
    }
}

pub(super) fn arity_error(g: &Graph, op: &str, want: usize, got: usize) -> IrError {
    IrError::Graph {
        graph: g.name.clone(),
        reason: format!("`{op}` takes {want} operands, got {got}"),
    }
}

pub(super) fn transposed(g: &mut Graph, m: ValueId, name: &str) -> Result<ValueId> {
    g.add(Op::Transpose { perm: vec![1, 0] }, &[m], name)
}

/// `z = x·vᵀ` and `w = z·uᵀ + b` as primitive ops.
pub(super) fn decomposed_forward(
    g: &mut Graph,
    x: ValueId,
    v: ValueId,
    u: ValueId,
    b: ValueId,
    y: &str,
) -> Result<(ValueId, ValueId)> {
    let vt = transposed(g, v, &format!("{y}.vt"))?;
    let z = g.add(Op::MatMul, &[x, vt], &format!("{y}.z"))?;
    let ut = transposed(g, u, &format!("{y}.ut"))?;
    let zu = g.add(Op::MatMul, &[z, ut], &format!("{y}.zu"))?;
    let add = Op::Binary {
        kind: BinaryKind::Add,
    };
    let w = g.add(add, &[zu, b], &format!("{y}.w"))?;
    Ok((z, w))
}

impl OpModule for CrossGrad {
    fn mnemonic(&self) -> &'static str {
        "cross_grad"
    }

    no_attributes!();

    fn infer(&self, _: &ModOp, ins: &[&TensorType]) -> R<Vec<TensorType>> {
        arity("cross_grad", ins, 6)?;
        check_layer(&ins[1..])?;
        if !ins[0].dtype.is_float() || ins[0].shape != ins[2].shape {
            return Err(format!(
                "dy {} must be a float of x's shape {}",
                ins[0], ins[2]
            ));
        }
        Ok(ins[1..].iter().map(|&t| t.clone()).collect())
    }

    fn eval(&self, c: &Checked<'_>) -> R<Vec<Tensor>> {
        let (s, d, r) = dims(c, 2);
        let dy = floats(c.input(0), "dy")?;
        let x0 = floats(c.input(1), "x0")?;
        let x = floats(c.input(2), "x")?;
        let (v, u, b) = (
            floats(c.input(3), "v")?,
            floats(c.input(4), "u")?,
            floats(c.input(5), "b")?,
        );
        let (z, w) = forward(&x, &v, &u, &b, s, d, r);
        grads(c, [&dy, &x0, &x, &v, &u, &z, &w], (s, d, r))
    }

    fn work(
        &self,
        _: &ModOp,
        ins: &[&TensorType],
        outs: &[&TensorType],
        dim: &dyn Fn(&Dim) -> f64,
    ) -> Work {
        // The recomputed forward (4·SRD), du, t, dv and t·v (2·SRD each).
        layer_work(ins, outs, dim, 2, (12.0, 6.0))
    }

    fn backward(&self, _: &ModOp, _: &mut dyn GradCx) -> Result<()> {
        no_gradient("cross_grad")
    }

    fn decompose(
        &self,
        _: &ModOp,
        g: &mut DecomposeCx<'_>,
        ins: &[ValueId],
        names: &[&str],
    ) -> Result<Vec<ValueId>> {
        let &[dy, x0, x, v, u, b] = ins else {
            return Err(arity_error(g, "cross_grad", 6, ins.len()));
        };
        let n = |k: usize, fallback: &str| names.get(k).copied().unwrap_or(fallback).to_string();
        let base = n(1, "cross_grad");
        let (z, w) = decomposed_forward(g, x, v, u, b, &base)?;
        decomposed_grads(g, [dy, x0, x, v, u, z, w], names)
    }

    no_onnx_form!();

    not_an_update!();
}

/// The gradients of a layer as primitive ops, from `dy, x0, x, v, u, z, w`.
pub(super) fn decomposed_grads(
    g: &mut Graph,
    a: [ValueId; 7],
    names: &[&str],
) -> Result<Vec<ValueId>> {
    let [dy, x0, x, v, u, z, w] = a;
    let n = |k: usize, fallback: &str| names.get(k).copied().unwrap_or(fallback).to_string();
    let base = n(1, "cross_grad");
    {
        let gg = g.add(mul(), &[dy, x0], &format!("{base}.g"))?;
        let dx0 = g.add(mul(), &[dy, w], &n(0, "dx0"))?;
        let sum = Op::Reduce {
            kind: Pool::Sum,
            axes: vec![0],
            keepdims: false,
        };
        let db = g.add(sum, &[gg], &n(4, "db"))?;
        let gt = transposed(g, gg, &format!("{base}.gt"))?;
        let du = g.add(Op::MatMul, &[gt, z], &n(3, "du"))?;
        let t = g.add(Op::MatMul, &[gg, u], &format!("{base}.t"))?;
        let tt = transposed(g, t, &format!("{base}.tt"))?;
        let dv = g.add(Op::MatMul, &[tt, x], &n(2, "dv"))?;
        let tv = g.add(Op::MatMul, &[t, v], &format!("{base}.tv"))?;
        let dx = g.add(Op::Add, &[dy, tv], &n(1, "dx"))?;
        Ok(vec![dx0, dx, dv, du, db])
    }
}
