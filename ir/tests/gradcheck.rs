//! Every backward op against its forward op, by central finite differences.
//!
//! For a forward `f` and a random cotangent `dy`, the scalar is `L(x) = <dy, f(x)>`
//! (evaluated in f64 from the interpreter's f32 outputs). The finite difference
//! for element `i` is `(L(x + eps·e_i) - L(x - eps·e_i)) / h`, where `h` is the
//! exact f64 difference of the two perturbed f32 values (so the rounding of
//! `x ± eps` to f32 does not bias it).
//!
//! Tolerance: `|analytic - fd| <= ATOL + RTOL·|fd|` with `ATOL = RTOL = 1e-3` and
//! `eps = 1e-2` on inputs ~ N(0, 1) of a few elements. The ops checked are
//! piecewise polynomial (central differences are then exact up to rounding: f32
//! output noise ~1e-7 over `2·eps` gives ~1e-5) or smooth with small third
//! derivatives (sigmoid: truncation `eps²/6 · |f'''|` ≈ 2e-6; gelu on N(0, 2²):
//! `|f'''| <= 0.8`, ≈ 1.3e-5; bce is checked with
//! `p` in [0.25, 0.75] and `eps = 5e-3`: truncation ≈ 3e-4 at worst). A wrong
//! gradient (a swapped index, a missing factor) is off by O(1).
//!
//! Linear-algebra identities (split as the adjoint of concat, all_to_all gather as
//! the adjoint of scatter) are checked as `<dy, f(x)> = <f*(dy), x>` in f64 with a
//! relative tolerance of 1e-9 (both sides add the same products, only the order of
//! the f64 sums differs). Seeds are fixed.

use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::module::ModOp;
use dlrm_ir::{
    A2aDir, Act, Communicator, DType, Dim, InteractionKind, LocalComm, LocalGroup, Op, Pool,
    SingleRank, Tensor, TensorType, batch_slice, infer,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::thread;

const EPS: f32 = 1e-2;
const ATOL: f64 = 1e-3;
const RTOL: f64 = 1e-3;

// ------------------------------------------------------------------ helpers

fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// n samples of N(0, 1) (Box–Muller).
fn normal(r: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u1 = 1.0 - r.random::<f64>();
            let u2 = r.random::<f64>();
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
        })
        .collect()
}

fn uniform(r: &mut ChaCha8Rng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| lo + (hi - lo) * r.random::<f32>()).collect()
}

fn randn(r: &mut ChaCha8Rng, shape: &[usize]) -> Tensor {
    Tensor::f32(shape.to_vec(), normal(r, shape.iter().product()))
}

fn i64t(shape: &[usize], data: &[i64]) -> Tensor {
    Tensor::i64(shape.to_vec(), data.to_vec())
}

fn fixed_ty(t: &Tensor) -> TensorType {
    TensorType::new(t.dtype(), t.shape.iter().map(|&d| Dim::Fixed(d)))
}

/// Evaluates `op` with result types inferred from the operands.
fn eval(op: &Op, ins: &[&Tensor], syms: &HashMap<String, usize>) -> Vec<Tensor> {
    let tys: Vec<TensorType> = ins.iter().map(|t| fixed_ty(t)).collect();
    let refs: Vec<&TensorType> = tys.iter().collect();
    let outs = infer(op, &refs, &[]).expect("infer");
    let ctx = EvalCtx {
        syms,
        comm: &SingleRank,
    };
    eval_op(op, ins, &outs, &ctx).expect("eval")
}

fn no_syms() -> HashMap<String, usize> {
    HashMap::new()
}

fn dot64(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}

/// `L = <dy, op(ins)[0]>`.
fn loss(op: &Op, ins: &[Tensor], dy: &[f32], syms: &HashMap<String, usize>) -> f64 {
    let refs: Vec<&Tensor> = ins.iter().collect();
    let y = eval(op, &refs, syms).remove(0);
    dot64(dy, &y.to_f32_vec())
}

/// Central differences of `L` with respect to every element of `ins[which]`.
fn fd_grad(
    op: &Op,
    ins: &[Tensor],
    which: usize,
    dy: &[f32],
    eps: f32,
    syms: &HashMap<String, usize>,
) -> Vec<f64> {
    let base = ins[which].to_f32_vec();
    let shape = ins[which].shape.clone();
    (0..base.len())
        .map(|i| {
            let mut vp = base.clone();
            let mut vm = base.clone();
            vp[i] += eps;
            vm[i] -= eps;
            let h = f64::from(vp[i]) - f64::from(vm[i]);
            let mut p = ins.to_vec();
            let mut m = ins.to_vec();
            p[which] = Tensor::f32(shape.clone(), vp);
            m[which] = Tensor::f32(shape.clone(), vm);
            (loss(op, &p, dy, syms) - loss(op, &m, dy, syms)) / h
        })
        .collect()
}

fn assert_grad(what: &str, analytic: &[f32], fd: &[f64]) {
    assert_eq!(analytic.len(), fd.len(), "{what}: lengths");
    for (i, (&a, &n)) in analytic.iter().zip(fd).enumerate() {
        let err = (f64::from(a) - n).abs();
        assert!(
            err <= ATOL + RTOL * n.abs(),
            "{what}: element {i}: analytic {a} vs finite difference {n} (error {err:e})"
        );
    }
}

/// Checks `grad` against the finite-difference gradient of `<dy, fwd(ins)>` with
/// respect to `ins[which]`.
fn check(
    what: &str,
    fwd: &Op,
    ins: &[Tensor],
    which: usize,
    dy: &[f32],
    grad: &Tensor,
    syms: &HashMap<String, usize>,
) {
    assert_eq!(grad.shape, ins[which].shape, "{what}: gradient shape");
    let fd = fd_grad(fwd, ins, which, dy, EPS, syms);
    assert_grad(what, &grad.to_f32_vec(), &fd);
}

/// Keeps values at least `m` away from 0 (relu's kink) so that `x ± eps` stays on
/// one side.
fn away_from_zero(t: &mut Tensor, m: f32) {
    if let Some(v) = t.as_f32_mut() {
        for x in v {
            if x.abs() < m {
                *x = if *x < 0.0 { -m } else { m };
            }
        }
    }
}

// ---------------------------------------------------------------- elementwise

#[test]
fn relu_grad_matches_relu() {
    let mut r = rng(1);
    let mut x = randn(&mut r, &[3, 4]);
    away_from_zero(&mut x, 0.05);
    let dy = randn(&mut r, &[3, 4]);
    let s = no_syms();
    let y = eval(&Op::Relu, &[&x], &s).remove(0);
    let dx = eval(&Op::ReluGrad, &[&dy, &y], &s).remove(0);
    check("relu_grad", &Op::Relu, &[x], 0, &dy.to_f32_vec(), &dx, &s);
}

#[test]
fn sigmoid_grad_matches_sigmoid() {
    let mut r = rng(2);
    let x = randn(&mut r, &[2, 5]);
    let dy = randn(&mut r, &[2, 5]);
    let s = no_syms();
    let y = eval(&Op::Sigmoid, &[&x], &s).remove(0);
    let dx = eval(&Op::SigmoidGrad, &[&dy, &y], &s).remove(0);
    check(
        "sigmoid_grad",
        &Op::Sigmoid,
        &[x],
        0,
        &dy.to_f32_vec(),
        &dx,
        &s,
    );
}

#[test]
fn gelu_grad_matches_gelu() {
    let mut r = rng(3);
    // N(0, 2²): both tails and the curved middle.
    let mut x = randn(&mut r, &[3, 5]);
    if let Some(v) = x.as_f32_mut() {
        v.iter_mut().for_each(|e| *e *= 2.0);
    }
    let dy = randn(&mut r, &[3, 5]);
    let s = no_syms();
    // The gradient takes the forward *input* (not its output).
    let dx = eval(&ModOp::op("gelu_grad"), &[&dy, &x], &s).remove(0);
    check(
        "gelu_grad",
        &ModOp::op("gelu"),
        &[x],
        0,
        &dy.to_f32_vec(),
        &dx,
        &s,
    );
}

// --------------------------------------------------------------------- linear

#[test]
fn linear_gradients_match_linear() {
    let mut r = rng(3);
    let (sn, k, n) = (3, 4, 5);
    let x = randn(&mut r, &[sn, k]);
    let w = randn(&mut r, &[n, k]);
    let b = randn(&mut r, &[n]);
    let dy = randn(&mut r, &[sn, n]);
    let s = no_syms();
    let fwd = Op::Linear { act: Act::None };
    let dx = eval(&Op::LinearDx, &[&dy, &w], &s).remove(0);
    let dw = eval(&Op::LinearDw, &[&dy, &x], &s).remove(0);
    let db = eval(&Op::LinearDb, &[&dy], &s).remove(0);
    let ins = [x, w, b];
    let dyv = dy.to_f32_vec();
    check("linear_dx", &fwd, &ins, 0, &dyv, &dx, &s);
    check("linear_dw", &fwd, &ins, 1, &dyv, &dw, &s);
    check("linear_db", &fwd, &ins, 2, &dyv, &db, &s);
}

// ---------------------------------------------------------------- interaction

#[test]
fn interaction_grad_matches_interaction() {
    let kinds = [
        (InteractionKind::Dot, false),
        (InteractionKind::Dot, true),
        (InteractionKind::Cat, false),
    ];
    let s = no_syms();
    let mut r = rng(4);
    for (kind, self_interaction) in kinds {
        for nf in 1..=4usize {
            let samples = 2;
            let widths: Vec<usize> = (0..nf)
                .map(|k| match kind {
                    InteractionKind::Dot => 3,
                    InteractionKind::Cat => 1 + k % 3,
                })
                .collect();
            let ins: Vec<Tensor> = widths
                .iter()
                .map(|&w| randn(&mut r, &[samples, w]))
                .collect();
            let fwd = Op::Interaction {
                kind,
                self_interaction,
            };
            let refs: Vec<&Tensor> = ins.iter().collect();
            let out = eval(&fwd, &refs, &s).remove(0);
            let dy = randn(&mut r, &out.shape);
            let bwd = Op::InteractionGrad {
                kind,
                self_interaction,
            };
            let mut grefs = vec![&dy];
            grefs.extend(ins.iter());
            let grads = eval(&bwd, &grefs, &s);
            assert_eq!(grads.len(), nf);
            for (k, g) in grads.iter().enumerate() {
                let what =
                    format!("interaction_grad {kind:?} self={self_interaction} F={nf} operand {k}");
                check(&what, &fwd, &ins, k, &dy.to_f32_vec(), g, &s);
            }
        }
    }
}

// ------------------------------------------------------------------ embedding

/// Scatters one gradient row per index into a zero `[rows, d]` table (in f64).
fn scatter_rows(idx: &[i64], rowgrad: &[f32], rows: usize, d: usize) -> Vec<f32> {
    let mut t = vec![0.0f64; rows * d];
    for (i, &row) in idx.iter().enumerate() {
        let row = usize::try_from(row).expect("valid index");
        for j in 0..d {
            t[row * d + j] += f64::from(rowgrad[i * d + j]);
        }
    }
    t.into_iter().map(|v| v as f32).collect()
}

#[test]
fn embedding_bag_grad_matches_embedding_bag() {
    let mut r = rng(5);
    let (rows, d) = (5, 3);
    let s = no_syms();
    // Fixed pooling with duplicates inside and across bags; offsets with an empty
    // bag, a bag of three and a last bag running to N; last_offset offsets
    // starting at 1 and ending before N (the first and last indices in no bag).
    let cases: Vec<(Tensor, Option<Tensor>, bool)> = vec![
        (i64t(&[3, 2], &[0, 2, 2, 2, 4, 1]), None, false),
        (
            i64t(&[6], &[0, 3, 3, 1, 2, 0]),
            Some(i64t(&[4], &[0, 2, 2, 5])),
            false,
        ),
        (
            i64t(&[7], &[4, 0, 3, 3, 1, 2, 0]),
            Some(i64t(&[4], &[1, 3, 3, 6])),
            true,
        ),
    ];
    for mode in [Pool::Sum, Pool::Mean] {
        for (idx, off, last_offset) in &cases {
            let last_offset = *last_offset;
            let table = randn(&mut r, &[rows, d]);
            let samples = off
                .as_ref()
                .map_or(idx.shape[0], |o| o.shape[0] - usize::from(last_offset));
            let dy = randn(&mut r, &[samples, d]);
            let fwd = Op::EmbeddingBag { mode, last_offset };
            let mut ins = vec![table.clone(), idx.clone()];
            let mut gins = vec![&dy, idx];
            if let Some(o) = off {
                ins.push(o.clone());
                gins.push(o);
            }
            let rowgrad = eval(&Op::EmbeddingBagGrad { mode, last_offset }, &gins, &s).remove(0);
            let flat_idx = idx.to_i64_vec().expect("indices");
            let dense = scatter_rows(&flat_idx, &rowgrad.to_f32_vec(), rows, d);
            let what = format!(
                "embedding_bag_grad {mode:?} offsets={} last_offset={last_offset}",
                off.is_some()
            );
            check(
                &what,
                &fwd,
                &ins,
                0,
                &dy.to_f32_vec(),
                &Tensor::f32(vec![rows, d], dense.clone()),
                &s,
            );
            // sparse_sgd with lr = -1 on a zero table is the same scatter.
            let zero = Tensor::zeros(DType::F32, vec![rows, d]);
            let via_sgd = eval(&Op::SparseSgd { lr: -1.0 }, &[&zero, idx, &rowgrad], &s).remove(0);
            assert_grad(
                &format!("{what} via sparse_sgd"),
                &via_sgd.to_f32_vec(),
                &dense.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
            );
        }
    }
}

// ---------------------------------------------------------------------- losses

#[test]
fn bce_grad_matches_bce() {
    let mut r = rng(6);
    let n = 4;
    let s: HashMap<String, usize> = [("B".to_string(), n)].into();
    let p = Tensor::f32(vec![n, 1], uniform(&mut r, n, 0.25, 0.75));
    // Hard and soft labels.
    let y = Tensor::f32(vec![n, 1], vec![0.0, 1.0, 0.3, 0.8]);
    let scale = normal(&mut r, 1);
    let fwd = Op::Bce {
        denom: Dim::batch(),
    };
    let g = eval(
        &Op::BceGrad {
            denom: Dim::batch(),
        },
        &[&p, &y],
        &s,
    )
    .remove(0);
    let analytic: Vec<f32> = g.to_f32_vec().iter().map(|v| v * scale[0]).collect();
    let fd = fd_grad(&fwd, &[p, y], 0, &scale, 5e-3, &s);
    assert_grad("bce_grad", &analytic, &fd);
}

#[test]
fn mse_grad_matches_mse() {
    let mut r = rng(7);
    let s = no_syms();
    let p = randn(&mut r, &[3, 2]);
    let y = randn(&mut r, &[3, 2]);
    let scale = normal(&mut r, 1);
    let fwd = Op::Mse {
        denom: Dim::Fixed(5),
    };
    let g = eval(
        &Op::MseGrad {
            denom: Dim::Fixed(5),
        },
        &[&p, &y],
        &s,
    )
    .remove(0);
    let analytic: Vec<f32> = g.to_f32_vec().iter().map(|v| v * scale[0]).collect();
    let fd = fd_grad(&fwd, &[p, y], 0, &scale, EPS, &s);
    assert_grad("mse_grad", &analytic, &fd);
}

// ----------------------------------------------------------------- adjoints

fn assert_same(what: &str, lhs: f64, rhs: f64, scale: f64) {
    assert!(
        (lhs - rhs).abs() <= 1e-9 * (1.0 + scale),
        "{what}: {lhs} vs {rhs}"
    );
}

#[test]
fn split_is_the_adjoint_of_concat() {
    let mut r = rng(8);
    let s = no_syms();
    for axis in 0..3usize {
        let sizes = vec![2usize, 1, 3];
        let parts: Vec<Tensor> = sizes
            .iter()
            .map(|&k| {
                let mut shape = vec![2usize, 3, 2];
                shape[axis] = k;
                randn(&mut r, &shape)
            })
            .collect();
        let refs: Vec<&Tensor> = parts.iter().collect();
        let y = eval(&Op::Concat { axis }, &refs, &s).remove(0);
        let dy = randn(&mut r, &y.shape);
        let pieces = eval(
            &Op::Split {
                axis,
                sizes: sizes.clone(),
            },
            &[&dy],
            &s,
        );
        let lhs = dot64(&dy.to_f32_vec(), &y.to_f32_vec());
        let rhs: f64 = pieces
            .iter()
            .zip(&parts)
            .map(|(a, b)| dot64(&a.to_f32_vec(), &b.to_f32_vec()))
            .sum();
        let scale: f64 = dy
            .to_f32_vec()
            .iter()
            .zip(y.to_f32_vec())
            .map(|(a, b)| f64::from((a * b).abs()))
            .sum();
        assert_same(&format!("concat/split axis {axis}"), lhs, rhs, scale);
        // And split undoes concat exactly.
        let back = eval(&Op::Split { axis, sizes }, &[&y], &s);
        assert_eq!(back, parts, "split(concat(x)) on axis {axis}");
    }
}

/// Width of owner `r`'s tensor `k`.
fn width(r: usize, k: usize) -> usize {
    1 + (2 * r + k) % 3
}

/// One rank: `<dY, scatter(X)>` and `<gather(dY), X>` for random `X` and `dY`.
fn a2a_rank(c: LocalComm, counts: Vec<usize>, global: usize) -> (f64, f64, f64) {
    let n = counts.len();
    let rank = c.rank();
    let b = batch_slice(global, n, rank).len();
    let s: HashMap<String, usize> = [("G".to_string(), global), ("B".to_string(), b)].into();
    let ctx = EvalCtx { syms: &s, comm: &c };
    let mut r = rng(100 + rank as u64);
    let xs: Vec<Tensor> = (0..counts[rank])
        .map(|k| randn(&mut r, &[global, width(rank, k)]))
        .collect();
    let scatter_types: Vec<TensorType> = (0..n)
        .flat_map(|o| (0..counts[o]).map(move |k| (o, k)))
        .map(|(o, k)| TensorType::f32([Dim::batch(), Dim::Fixed(width(o, k))]))
        .collect();
    let refs: Vec<&Tensor> = xs.iter().collect();
    let ys = eval_op(
        &Op::AllToAll {
            dir: A2aDir::Scatter,
            counts: counts.clone(),
            rank,
        },
        &refs,
        &scatter_types,
        &ctx,
    )
    .expect("scatter");
    let dys: Vec<Tensor> = ys.iter().map(|y| randn(&mut r, &y.shape)).collect();
    let gather_types: Vec<TensorType> = xs.iter().map(fixed_ty).collect();
    let drefs: Vec<&Tensor> = dys.iter().collect();
    let dxs = eval_op(
        &Op::AllToAll {
            dir: A2aDir::Gather,
            counts,
            rank,
        },
        &drefs,
        &gather_types,
        &ctx,
    )
    .expect("gather");
    let lhs: f64 = dys
        .iter()
        .zip(&ys)
        .map(|(a, b)| dot64(&a.to_f32_vec(), &b.to_f32_vec()))
        .sum();
    let rhs: f64 = dxs
        .iter()
        .zip(&xs)
        .map(|(a, b)| dot64(&a.to_f32_vec(), &b.to_f32_vec()))
        .sum();
    let scale: f64 = dxs
        .iter()
        .zip(&xs)
        .flat_map(|(a, b)| {
            a.to_f32_vec()
                .into_iter()
                .zip(b.to_f32_vec())
                .map(|(p, q)| f64::from((p * q).abs()))
                .collect::<Vec<_>>()
        })
        .sum();
    (lhs, rhs, scale)
}

#[test]
fn all_to_all_gather_is_the_adjoint_of_scatter() {
    for (counts, global) in [
        (vec![1usize, 2], 5usize),
        (vec![2, 0, 1], 7),
        (vec![1, 1, 1], 2),
    ] {
        let n = counts.len();
        let handles: Vec<_> = LocalGroup::new(n)
            .into_iter()
            .map(|c| {
                let counts = counts.clone();
                thread::spawn(move || a2a_rank(c, counts, global))
            })
            .collect();
        let (mut lhs, mut rhs, mut scale) = (0.0, 0.0, 0.0);
        for h in handles {
            let (l, r, s) = h.join().expect("rank thread");
            lhs += l;
            rhs += r;
            scale += s;
        }
        assert!(scale > 0.0, "the check must involve data");
        assert_same(
            &format!("all_to_all counts {counts:?} G={global}"),
            lhs,
            rhs,
            scale,
        );
    }
}
