//! The reference interpreter on tiny hand-computed examples: every forward op, the
//! optimizer updates, bf16 storage, error messages, whole-graph `run` (bindings,
//! lifetimes, updates), and the collectives on 1 to 4 thread ranks.

#![expect(
    clippy::unwrap_used,
    reason = "`unwrap_err` states that a case must fail; a test fails loudly otherwise"
)]

use dlrm_ir::interp::{EvalCtx, bind_symbols, eval_instance, eval_op, run};
use dlrm_ir::module::ModOp;
use dlrm_ir::{
    A2aDir, Act, Communicator, DType, Dim, Graph, InteractionKind, IrError, LocalComm, LocalGroup,
    NodeInstance, Op, Pool, SingleRank, Tensor, TensorType, batch_slice, infer,
};
use half::bf16;
use std::collections::HashMap;
use std::thread;

// ------------------------------------------------------------------ helpers

fn syms(pairs: &[(&str, usize)]) -> HashMap<String, usize> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn fixed_ty(t: &Tensor) -> TensorType {
    TensorType::new(t.dtype(), t.shape.iter().map(|&d| Dim::Fixed(d)))
}

/// Evaluates with result types inferred from the operands' (fixed) types, so that
/// every test also checks that `infer` and the interpreter agree.
fn eval_s(op: &Op, ins: &[&Tensor], s: &HashMap<String, usize>) -> Result<Vec<Tensor>, String> {
    let tys: Vec<TensorType> = ins.iter().map(|t| fixed_ty(t)).collect();
    let refs: Vec<&TensorType> = tys.iter().collect();
    let outs = infer(op, &refs, &[]).map_err(|e| format!("infer: {e}"))?;
    eval_op(
        op,
        ins,
        &outs,
        &EvalCtx {
            syms: s,
            comm: &SingleRank,
        },
    )
}

fn eval(op: &Op, ins: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    eval_s(op, ins, &HashMap::new())
}

fn eval1(op: &Op, ins: &[&Tensor]) -> Tensor {
    let mut r = eval(op, ins).expect("eval");
    assert_eq!(r.len(), 1);
    r.remove(0)
}

/// Evaluates with explicit result types (to reach the interpreter's own checks).
fn eval_raw(op: &Op, ins: &[&Tensor], outs: &[TensorType]) -> Result<Vec<Tensor>, String> {
    eval_op(
        op,
        ins,
        outs,
        &EvalCtx {
            syms: &HashMap::new(),
            comm: &SingleRank,
        },
    )
}

fn f(shape: &[usize], data: &[f32]) -> Tensor {
    Tensor::f32(shape.to_vec(), data.to_vec())
}

fn i64t(shape: &[usize], data: &[i64]) -> Tensor {
    Tensor::i64(shape.to_vec(), data.to_vec())
}

fn bf(shape: &[usize], data: &[f32]) -> Tensor {
    Tensor::bf16(
        shape.to_vec(),
        data.iter().map(|&x| bf16::from_f32(x)).collect(),
    )
}

fn ty(dtype: DType, dims: &[usize]) -> TensorType {
    TensorType::new(dtype, dims.iter().map(|&d| Dim::Fixed(d)))
}

fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "element {i}: {a} vs {b} (got {got:?}, want {want:?})"
        );
    }
}

fn sym(s: &str) -> Dim {
    Dim::Sym(s.to_string())
}

// --------------------------------------------------------------- embedding

fn table4x2() -> Tensor {
    f(&[4, 2], &[1., 2., 3., 4., 5., 6., 7., 8.])
}

#[test]
fn embedding_bag_fixed_pooling_sum_and_mean() {
    let t = table4x2();
    let idx = i64t(&[2, 2], &[0, 2, 3, 3]);
    let sum = eval1(
        &Op::EmbeddingBag {
            mode: Pool::Sum,
            last_offset: false,
        },
        &[&t, &idx],
    );
    assert_eq!(sum, f(&[2, 2], &[6., 8., 14., 16.]));
    let mean = eval1(
        &Op::EmbeddingBag {
            mode: Pool::Mean,
            last_offset: false,
        },
        &[&t, &idx],
    );
    assert_eq!(mean, f(&[2, 2], &[3., 4., 7., 8.]));
    // i32 indices mean the same.
    let idx32 = Tensor::i32(vec![2, 2], vec![0, 2, 3, 3]);
    let sum32 = eval1(
        &Op::EmbeddingBag {
            mode: Pool::Sum,
            last_offset: false,
        },
        &[&t, &idx32],
    );
    assert_eq!(sum32, sum);
}

#[test]
fn embedding_bag_offsets_with_an_empty_bag() {
    let t = table4x2();
    let idx = i64t(&[4], &[1, 0, 3, 2]);
    let off = i64t(&[3], &[0, 2, 2]);
    let sum = eval1(
        &Op::EmbeddingBag {
            mode: Pool::Sum,
            last_offset: false,
        },
        &[&t, &idx, &off],
    );
    assert_eq!(sum, f(&[3, 2], &[4., 6., 0., 0., 12., 14.]));
    let mean = eval1(
        &Op::EmbeddingBag {
            mode: Pool::Mean,
            last_offset: false,
        },
        &[&t, &idx, &off],
    );
    assert_eq!(mean, f(&[3, 2], &[2., 3., 0., 0., 6., 7.]));
    // A trailing empty bag (offset == N) is allowed.
    let off2 = i64t(&[2], &[0, 4]);
    let sum2 = eval1(
        &Op::EmbeddingBag {
            mode: Pool::Sum,
            last_offset: false,
        },
        &[&t, &idx, &off2],
    );
    assert_eq!(sum2, f(&[2, 2], &[16., 20., 0., 0.]));
}

#[test]
fn embedding_bag_bf16_table_gives_bf16() {
    let t = bf(&[2, 2], &[1.0, 2.0, 0.5, 0.25]);
    let idx = i64t(&[1, 2], &[0, 1]);
    let y = eval1(
        &Op::EmbeddingBag {
            mode: Pool::Sum,
            last_offset: false,
        },
        &[&t, &idx],
    );
    assert_eq!(y.dtype(), DType::BF16);
    assert_eq!(y.to_f32_vec(), vec![1.5, 2.25]);
}

#[test]
fn embedding_bag_grad_rows_per_index() {
    let dy = f(&[2, 2], &[1., 2., 3., 4.]);
    let idx = i64t(&[2, 2], &[0, 3, 1, 1]);
    let g = eval1(
        &Op::EmbeddingBagGrad {
            mode: Pool::Sum,
            last_offset: false,
        },
        &[&dy, &idx],
    );
    assert_eq!(g, f(&[2, 2, 2], &[1., 2., 1., 2., 3., 4., 3., 4.]));
    let g = eval1(
        &Op::EmbeddingBagGrad {
            mode: Pool::Mean,
            last_offset: false,
        },
        &[&dy, &idx],
    );
    assert_eq!(g, f(&[2, 2, 2], &[0.5, 1., 0.5, 1., 1.5, 2., 1.5, 2.]));
    let idx = i64t(&[3], &[2, 0, 1]);
    let off = i64t(&[2], &[0, 0]);
    let g = eval1(
        &Op::EmbeddingBagGrad {
            mode: Pool::Mean,
            last_offset: false,
        },
        &[&dy, &idx, &off],
    );
    assert_eq!(g, f(&[3, 2], &[1., 4. / 3., 1., 4. / 3., 1., 4. / 3.]));
}

#[test]
fn out_of_range_index_names_sample_and_position() {
    let table = Tensor::zeros(DType::F32, vec![100, 2]);
    let mut data = vec![0i64; 12];
    data[5 * 2 + 1] = 120;
    let idx = i64t(&[6, 2], &data);
    let err = eval(
        &Op::EmbeddingBag {
            mode: Pool::Sum,
            last_offset: false,
        },
        &[&table, &idx],
    )
    .unwrap_err();
    assert!(
        err.contains("index 120 at sample 5, position 1 is out of range for a table of 100 rows"),
        "{err}"
    );
    // With offsets the position is counted inside the bag.
    let idx = i64t(&[5], &[0, 1, 2, 3, -1]);
    let off = i64t(&[3], &[0, 2, 3]);
    let err = eval(
        &Op::EmbeddingBag {
            mode: Pool::Mean,
            last_offset: false,
        },
        &[&table, &idx, &off],
    )
    .unwrap_err();
    assert!(
        err.contains("index -1 at sample 2, position 1 is out of range for a table of 100 rows"),
        "{err}"
    );
    // sparse_sgd validates too (and applies nothing).
    let idx = i64t(&[2, 2], &[0, 1, 100, 0]);
    let g = Tensor::zeros(DType::F32, vec![2, 2, 2]);
    let err = eval(&Op::SparseSgd { lr: 0.1 }, &[&table, &idx, &g]).unwrap_err();
    assert!(
        err.contains("index 100 at sample 1, position 0 is out of range for a table of 100 rows"),
        "{err}"
    );
    // The gradient has no table but rejects negative indices.
    let dy = f(&[2, 2], &[0.; 4]);
    let idx = i64t(&[2, 2], &[0, 1, 0, -3]);
    let err = eval(
        &Op::EmbeddingBagGrad {
            mode: Pool::Sum,
            last_offset: false,
        },
        &[&dy, &idx],
    )
    .unwrap_err();
    assert!(err.contains("index -3 at sample 1, position 1"), "{err}");
}

#[test]
fn bad_offsets_are_errors() {
    let t = table4x2();
    let idx = i64t(&[3], &[0, 1, 2]);
    let cases: [(&[i64], &str); 5] = [
        (&[1, 2], "first offset must be 0"),
        (&[0, 2, 1], "non-decreasing"),
        (&[0, 4], "at most the 3 indices"),
        (&[0, -1], "non-decreasing"),
        (&[], "no bags"),
    ];
    for (off, want) in cases {
        let off = i64t(&[off.len()], off);
        for op in [
            Op::EmbeddingBag {
                mode: Pool::Sum,
                last_offset: false,
            },
            Op::EmbeddingBagGrad {
                mode: Pool::Sum,
                last_offset: false,
            },
        ] {
            let first = if matches!(op, Op::EmbeddingBag { .. }) {
                t.clone()
            } else {
                Tensor::zeros(DType::F32, vec![off.shape[0], 2])
            };
            let err = eval(&op, &[&first, &idx, &off]).unwrap_err();
            assert!(err.contains(want), "{off:?}: {err}");
        }
    }
}

// ------------------------------------------------------------------- dense

#[test]
fn linear_with_each_activation() {
    let x = f(&[2, 2], &[1., 2., -1., 0.5]);
    let w = f(&[3, 2], &[1., 0., 0., 1., 1., -1.]);
    let b = f(&[3], &[0.5, -3., 0.]);
    // z = x·wᵀ + b
    let z = [1.5, -1., -1., -0.5, -2.5, -1.5];
    let none = eval1(&Op::Linear { act: Act::None }, &[&x, &w, &b]);
    assert_eq!(none, f(&[2, 3], &z));
    let relu = eval1(&Op::Linear { act: Act::Relu }, &[&x, &w, &b]);
    assert_eq!(relu, f(&[2, 3], &[1.5, 0., 0., 0., 0., 0.]));
    let sig = eval1(&Op::Linear { act: Act::Sigmoid }, &[&x, &w, &b]);
    let want: Vec<f32> = z.iter().map(|&v: &f32| 1.0 / (1.0 + (-v).exp())).collect();
    assert_close(&sig.to_f32_vec(), &want, 1e-6);
    // Fused activation == separate op.
    let sep = eval1(&Op::Sigmoid, &[&none]);
    assert_eq!(sep, sig);
    assert_eq!(eval1(&Op::Relu, &[&none]), relu);
}

#[test]
fn elementwise_ops_and_their_grads() {
    let a = f(&[2, 2], &[-1., 0., 2., -3.]);
    let b = f(&[2, 2], &[1., 1., 1., 1.]);
    assert_eq!(eval1(&Op::Add, &[&a, &b]), f(&[2, 2], &[0., 1., 3., -2.]));
    let y = eval1(&Op::Relu, &[&a]);
    assert_eq!(y, f(&[2, 2], &[0., 0., 2., 0.]));
    let dy = f(&[2, 2], &[5., 6., 7., 8.]);
    assert_eq!(
        eval1(&Op::ReluGrad, &[&dy, &y]),
        f(&[2, 2], &[0., 0., 7., 0.])
    );
    let s = f(&[2], &[0.5, 0.25]);
    let dy = f(&[2], &[2., 4.]);
    assert_eq!(eval1(&Op::SigmoidGrad, &[&dy, &s]), f(&[2], &[0.5, 0.75]));
    assert_eq!(eval1(&Op::Sigmoid, &[&f(&[1], &[0.])]), f(&[1], &[0.5]));
}

/// `gelu` (tanh approximation) and `gelu_grad` against values computed by hand in
/// f64 (`0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³)))` and its derivative).
#[test]
fn gelu_and_its_grad_by_hand() {
    let xs = [-3., -1., -0.5, 0., 0.5, 1., 3.];
    let y = eval1(&ModOp::op("gelu"), &[&f(&[7], &xs)]);
    let want_y: [f64; 7] = [
        -0.0036373920817729943,
        -0.15880800939172324,
        -0.15428599017485606,
        0.0,
        0.34571400982514394,
        0.8411919906082768,
        2.996362607918227,
    ];
    let want_y: Vec<f32> = want_y.iter().map(|&v| v as f32).collect();
    assert_close(&y.to_f32_vec(), &want_y, 1e-6);
    let want_d: [f64; 7] = [
        -0.011584166630969516,
        -0.08296408384578255,
        0.13263009646535764,
        0.5,
        0.8673699035346424,
        1.0829640838457826,
        1.0115841666309695,
    ];
    // dy = 2: twice the derivative.
    let dy = f(&[7], &[2.; 7]);
    let dx = eval1(&ModOp::op("gelu_grad"), &[&dy, &f(&[7], &xs)]);
    let want_dx: Vec<f32> = want_d.iter().map(|&v| (2.0 * v) as f32).collect();
    assert_close(&dx.to_f32_vec(), &want_dx, 1e-6);
    // Type rules: one float operand; `gelu_grad`'s `dy` and `x` agree in shape.
    assert!(eval(&ModOp::op("gelu_grad"), &[&dy, &f(&[6], &[0.; 6])]).is_err());
    assert!(eval(&ModOp::op("gelu"), &[&i64t(&[1], &[1])]).is_err());
    // bf16 storage: computed in f32, rounded once.
    let yb = eval1(&ModOp::op("gelu"), &[&bf(&[7], &xs)]);
    assert_eq!(yb.dtype(), DType::BF16);
    assert_close(&yb.to_f32_vec(), &want_y, 1e-2);
}

#[test]
fn linear_gradients_by_hand() {
    let dz = f(&[2, 2], &[1., 2., 3., 4.]);
    let w = f(&[2, 3], &[1., 0., 2., -1., 1., 0.]);
    let x = f(&[2, 3], &[1., 1., 0., 0., 2., 1.]);
    // dz·w
    assert_eq!(
        eval1(&Op::LinearDx, &[&dz, &w]),
        f(&[2, 3], &[-1., 2., 2., -1., 4., 6.])
    );
    // dzᵀ·x
    assert_eq!(
        eval1(&Op::LinearDw, &[&dz, &x]),
        f(&[2, 3], &[1., 7., 3., 2., 10., 4.])
    );
    assert_eq!(eval1(&Op::LinearDb, &[&dz]), f(&[2], &[4., 6.]));
}

#[test]
fn bce_and_mse_values() {
    let s = syms(&[("B", 2)]);
    let p = f(&[2, 1], &[0.5, 0.9]);
    let y = f(&[2, 1], &[1., 0.]);
    let bce = Op::Bce { denom: sym("B") };
    let l = eval_s(&bce, &[&p, &y], &s).expect("bce").remove(0);
    assert_eq!(l.shape, Vec::<usize>::new());
    let want = -(0.5f32.ln() + 0.1f32.ln()) / 2.0;
    assert_close(&l.to_f32_vec(), &[want], 1e-6);
    // Clamp: log 0 = -100 (no inf, no NaN), and 0·log 0 contributes 0.
    let p = f(&[2, 1], &[0., 1.]);
    let y = f(&[2, 1], &[1., 0.]);
    let l = eval_s(&bce, &[&p, &y], &s).expect("bce").remove(0);
    assert_eq!(l.to_f32_vec(), vec![100.0]);
    let y = f(&[2, 1], &[0., 1.]);
    let l = eval_s(&bce, &[&p, &y], &s).expect("bce").remove(0);
    assert_eq!(l.to_f32_vec(), vec![0.0]);
    // A fixed denom is used as is; an unbound symbol is an error.
    let l = eval(
        &Op::Bce {
            denom: Dim::Fixed(1),
        },
        &[&p, &y],
    )
    .expect("bce");
    assert_eq!(l[0].to_f32_vec(), vec![0.0]);
    let err = eval(&bce, &[&p, &y]).unwrap_err();
    assert!(err.contains("symbol B is not bound"), "{err}");

    let p = f(&[2], &[1., 2.]);
    let y = f(&[2], &[0., 4.]);
    let l = eval_s(&Op::Mse { denom: sym("B") }, &[&p, &y], &s).expect("mse");
    assert_eq!(l[0].to_f32_vec(), vec![2.5]);
    let g = eval_s(&Op::MseGrad { denom: sym("B") }, &[&p, &y], &s).expect("mse_grad");
    assert_eq!(g[0], f(&[2], &[1., -2.]));
    let p = f(&[2], &[0.5, 0.]);
    let y = f(&[2], &[1., 0.]);
    let g = eval_s(&Op::BceGrad { denom: sym("B") }, &[&p, &y], &s).expect("bce_grad");
    // (0.5-1)/0.25/2 = -1; p = 0: (0-0)/1e-12/2 = 0.
    assert_eq!(g[0], f(&[2], &[-1., 0.]));
}

// ------------------------------------------------------------- interaction

#[test]
fn interaction_dot_lower_triangle_order() {
    let x = f(&[1, 2], &[1., 2.]);
    let e0 = f(&[1, 2], &[3., 4.]);
    let e1 = f(&[1, 2], &[5., 6.]);
    // T0·T0=5, T1·T0=11, T1·T1=25, T2·T0=17, T2·T1=39, T2·T2=61.
    let op = Op::Interaction {
        kind: InteractionKind::Dot,
        self_interaction: false,
    };
    assert_eq!(
        eval1(&op, &[&x, &e0, &e1]),
        f(&[1, 5], &[1., 2., 11., 17., 39.])
    );
    let op = Op::Interaction {
        kind: InteractionKind::Dot,
        self_interaction: true,
    };
    assert_eq!(
        eval1(&op, &[&x, &e0, &e1]),
        f(&[1, 8], &[1., 2., 5., 11., 25., 17., 39., 61.])
    );
    // F = 1: just x (plus x·x with self interaction).
    assert_eq!(eval1(&op, &[&x]), f(&[1, 3], &[1., 2., 5.]));
}

#[test]
fn interaction_cat_and_its_grad() {
    let x = f(&[2, 2], &[1., 2., 10., 20.]);
    let e0 = f(&[2, 1], &[3., 30.]);
    let e1 = f(&[2, 3], &[4., 5., 6., 40., 50., 60.]);
    let op = Op::Interaction {
        kind: InteractionKind::Cat,
        self_interaction: false,
    };
    let r = eval1(&op, &[&x, &e0, &e1]);
    assert_eq!(
        r,
        f(
            &[2, 6],
            &[1., 2., 3., 4., 5., 6., 10., 20., 30., 40., 50., 60.]
        )
    );
    let grad = Op::InteractionGrad {
        kind: InteractionKind::Cat,
        self_interaction: false,
    };
    let g = eval(&grad, &[&r, &x, &e0, &e1]).expect("grad");
    assert_eq!(g, vec![x, e0, e1]);
}

#[test]
fn interaction_dot_grad_by_hand() {
    // One sample, x=[1,2], e=[3,4]; r = [x, x·e]; dr = [1, 1, 2].
    let x = f(&[1, 2], &[1., 2.]);
    let e = f(&[1, 2], &[3., 4.]);
    let dr = f(&[1, 3], &[1., 1., 2.]);
    let op = Op::InteractionGrad {
        kind: InteractionKind::Dot,
        self_interaction: false,
    };
    let g = eval(&op, &[&dr, &x, &e]).expect("grad");
    // dx = dr[:2] + 2·e; de = 2·x.
    assert_eq!(g, vec![f(&[1, 2], &[7., 9.]), f(&[1, 2], &[2., 4.])]);
}

// ------------------------------------------------------------------ shapes

#[test]
fn concat_split_reshape() {
    let a = f(&[2, 2], &[1., 2., 3., 4.]);
    let b = f(&[2, 1], &[5., 6.]);
    let c = eval1(&Op::Concat { axis: 1 }, &[&a, &b]);
    assert_eq!(c, f(&[2, 3], &[1., 2., 5., 3., 4., 6.]));
    let parts = eval(
        &Op::Split {
            axis: 1,
            sizes: vec![2, 1],
        },
        &[&c],
    )
    .expect("split");
    assert_eq!(parts, vec![a.clone(), b]);
    let c0 = eval1(&Op::Concat { axis: 0 }, &[&a, &f(&[1, 2], &[7., 8.])]);
    assert_eq!(c0, f(&[3, 2], &[1., 2., 3., 4., 7., 8.]));
    let parts = eval(
        &Op::Split {
            axis: 0,
            sizes: vec![1, 0, 2],
        },
        &[&c0],
    )
    .expect("split");
    assert_eq!(
        parts,
        vec![
            f(&[1, 2], &[1., 2.]),
            f(&[0, 2], &[]),
            f(&[2, 2], &[3., 4., 7., 8.])
        ]
    );
    // Index tensors move too.
    let ci = eval1(
        &Op::Concat { axis: 0 },
        &[&i64t(&[2], &[1, 2]), &i64t(&[1], &[3])],
    );
    assert_eq!(ci, i64t(&[3], &[1, 2, 3]));
    // Reshape keeps row-major order; symbols resolve through ctx.syms.
    let r = eval1(
        &Op::Reshape {
            shape: vec![Dim::Fixed(4)],
        },
        &[&a],
    );
    assert_eq!(r, f(&[4], &[1., 2., 3., 4.]));
    let op = Op::Reshape {
        shape: vec![sym("B"), Dim::Fixed(1)],
    };
    let out = [TensorType::new(DType::F32, [sym("B"), Dim::Fixed(1)])];
    let s = syms(&[("B", 4)]);
    let ctx = EvalCtx {
        syms: &s,
        comm: &SingleRank,
    };
    let r = eval_op(&op, &[&a], &out, &ctx).expect("reshape");
    assert_eq!(r[0], f(&[4, 1], &[1., 2., 3., 4.]));
    let s = syms(&[("B", 3)]);
    let ctx = EvalCtx {
        syms: &s,
        comm: &SingleRank,
    };
    let err = eval_op(&op, &[&a], &out, &ctx).unwrap_err();
    assert!(err.contains("cannot reshape"), "{err}");
}

// ---------------------------------------------------------------- optimizer

#[test]
fn sgd_and_sparse_sgd_with_duplicates() {
    let w = f(&[2], &[1., 2.]);
    let g = f(&[2], &[0.5, -1.]);
    assert_close(
        &eval1(&Op::Sgd { lr: 0.1 }, &[&w, &g]).to_f32_vec(),
        &[0.95, 2.1],
        1e-7,
    );
    let table = f(&[3, 2], &[1., 1., 2., 2., 3., 3.]);
    let idx = i64t(&[2, 2], &[0, 2, 0, 0]);
    let rg = f(&[2, 2, 2], &[1., 2., 3., 4., 5., 6., 7., 8.]);
    let t2 = eval1(&Op::SparseSgd { lr: 0.5 }, &[&table, &idx, &rg]);
    // Row 0: 1 - 0.5·(1+5+7), 1 - 0.5·(2+6+8); row 1 unchanged; row 2: 3 - 0.5·(3, 4).
    assert_eq!(t2, f(&[3, 2], &[-5.5, -7., 2., 2., 1.5, 1.]));
    // Flat indices (bags with offsets): rowgrad [N, D].
    let idx = Tensor::i32(vec![3], vec![1, 1, 2]);
    let rg = f(&[3, 2], &[1., 1., 1., 1., 2., 2.]);
    let t3 = eval1(&Op::SparseSgd { lr: 1.0 }, &[&table, &idx, &rg]);
    assert_eq!(t3, f(&[3, 2], &[1., 1., 0., 0., 1., 1.]));
}

#[test]
fn sparse_sgd_bf16_rounds_each_row_once() {
    // Three updates of +2⁻⁹ each on 1.0: rounding after each would keep 1.0 (each
    // is below half an ulp, 2⁻⁸); rounding once gives 1 + 3·2⁻⁹ -> 1 + 2⁻⁷.
    let table = bf(&[2, 1], &[1.0, 7.0]);
    let idx = i64t(&[3], &[0, 0, 0]);
    let rg = f(&[3, 1], &[-1.0, -1.0, -1.0]);
    let lr = 2f32.powi(-9);
    let t = eval1(&Op::SparseSgd { lr }, &[&table, &idx, &rg]);
    assert_eq!(t.dtype(), DType::BF16);
    assert_eq!(t.to_f32_vec(), vec![1.0 + 2f32.powi(-7), 7.0]);
}

#[test]
fn bf16_results_round_to_nearest_even() {
    let one = bf(&[1], &[1.0]);
    let half_ulp = bf(&[1], &[2f32.powi(-8)]); // 1 + 2⁻⁸ is a tie
    let tiny_more = bf(&[1], &[2f32.powi(-8) * (1.0 + 2f32.powi(-7))]);
    let r = eval1(&Op::Add, &[&one, &half_ulp]);
    assert_eq!(r.dtype(), DType::BF16);
    assert_eq!(r.to_f32_vec(), vec![1.0], "tie rounds to the even 1.0");
    let r = eval1(&Op::Add, &[&one, &tiny_more]);
    assert_eq!(
        r.to_f32_vec(),
        vec![1.0078125],
        "1.00390625 + tiny rounds up"
    );
    let odd = bf(&[1], &[1.0078125]);
    let r = eval1(&Op::Add, &[&odd, &half_ulp]);
    assert_eq!(r.to_f32_vec(), vec![1.015625], "tie from odd rounds up");
    // A float op asked to produce bf16 rounds its f32 result the same way.
    let a = f(&[1], &[1.0]);
    let b = f(&[1], &[2f32.powi(-8) + 2f32.powi(-20)]);
    let r = eval_raw(&Op::Add, &[&a, &b], &[ty(DType::BF16, &[1])]).expect("add");
    assert_eq!(r[0].to_f32_vec(), vec![1.0078125]);
}

// ------------------------------------------------------------------- errors

#[test]
fn mismatches_are_errors_not_panics() {
    let x = f(&[2, 3], &[0.; 6]);
    let w = f(&[4, 2], &[0.; 8]);
    let b = f(&[4], &[0.; 4]);
    let err = eval_raw(
        &Op::Linear { act: Act::None },
        &[&x, &w, &b],
        &[ty(DType::F32, &[2, 4])],
    )
    .unwrap_err();
    assert!(
        err.contains("`linear`")
            && err.contains("x features vs weight columns")
            && err.contains("expected 2, got 3"),
        "{err}"
    );
    // Wrong operand count, wrong result count, wrong declared shape.
    let err = eval_raw(&Op::Relu, &[&x, &x], &[ty(DType::F32, &[2, 3])]).unwrap_err();
    assert!(err.contains("takes 1 operands, got 2"), "{err}");
    let err = eval_raw(&Op::Relu, &[&x], &[]).unwrap_err();
    assert!(err.contains("1 results"), "{err}");
    let err = eval_raw(&Op::Relu, &[&x], &[ty(DType::F32, &[3, 2])]).unwrap_err();
    assert!(err.contains("declared f32[3,2]"), "{err}");
    // A tensor whose data does not fit its shape.
    let broken = Tensor {
        shape: vec![2, 2],
        data: dlrm_ir::Data::F32(vec![1.0]),
    };
    let err = eval_raw(&Op::Relu, &[&broken], &[ty(DType::F32, &[2, 2])]).unwrap_err();
    assert!(err.contains("holds 1 elements"), "{err}");
    // Index operand where a float is expected.
    let idx = i64t(&[2, 2], &[0; 4]);
    let err = eval_raw(&Op::Add, &[&idx, &idx], &[ty(DType::F32, &[2, 2])]).unwrap_err();
    assert!(err.contains("must be f32 or bf16"), "{err}");
    // Interaction grad with a dr of the wrong width.
    let e = f(&[1, 2], &[0.; 2]);
    let dr = f(&[1, 4], &[0.; 4]);
    let err = eval_raw(
        &Op::InteractionGrad {
            kind: InteractionKind::Dot,
            self_interaction: false,
        },
        &[&dr, &e, &e],
        &[ty(DType::F32, &[1, 2]), ty(DType::F32, &[1, 2])],
    )
    .unwrap_err();
    assert!(
        err.contains("`interaction_grad`") && err.contains("dr width: expected 3, got 4"),
        "{err}"
    );
    // sparse_sgd row gradient of the wrong shape.
    let table = f(&[3, 2], &[0.; 6]);
    let idx = i64t(&[2], &[0, 1]);
    let rg = f(&[2, 3], &[0.; 6]);
    let err = eval_raw(
        &Op::SparseSgd { lr: 1.0 },
        &[&table, &idx, &rg],
        &[ty(DType::F32, &[3, 2])],
    )
    .unwrap_err();
    assert!(err.contains("row gradient"), "{err}");
}

/// An instance verified once from declared types under a binding evaluates any
/// operands of its concrete types; others are refused by the binding, naming the
/// op and the operand, before the op runs.
#[test]
fn eval_instance_binds_operands_to_the_verified_instance() {
    let s = syms(&[("B", 2)]);
    let ctx = EvalCtx {
        syms: &s,
        comm: &SingleRank,
    };
    let x_ty = TensorType::new(DType::F32, [sym("B"), Dim::Fixed(3)]);
    let w_ty = TensorType::new(DType::F32, [Dim::Fixed(4), Dim::Fixed(3)]);
    let b_ty = TensorType::new(DType::F32, [Dim::Fixed(4)]);
    let y_ty = TensorType::new(DType::BF16, [sym("B"), Dim::Fixed(4)]);
    let op = Op::Linear { act: Act::Relu };
    let inst = NodeInstance::new(&op, &[x_ty, w_ty, b_ty], std::slice::from_ref(&y_ty), &s)
        .expect("linear");
    let x = f(&[2, 3], &[1., 2., 3., -1., -2., -3.]);
    let w = f(&[4, 3], &[1., 0., 0., 0., 1., 0., 0., 0., 1., 1., 1., 1.]);
    let b = f(&[4], &[0.5, 0., 0., 0.]);
    let got = eval_instance(&inst, &[&x, &w, &b], &ctx).expect("eval");
    assert_eq!(
        got,
        eval_op(&op, &[&x, &w, &b], &[y_ty], &ctx).expect("eval_op")
    );
    assert_eq!(got[0], bf(&[2, 4], &[1.5, 2., 3., 6., 0., 0., 0., 0.]));
    // Three samples where the instance has B = 2: refused, naming op and operand.
    let x3 = f(&[3, 3], &[0.; 9]);
    let err = eval_instance(&inst, &[&x3, &w, &b], &ctx).unwrap_err();
    assert!(
        err.contains("`linear`") && err.contains("operand 0"),
        "{err}"
    );
    let err = eval_instance(&inst, &[&x, &w], &ctx).unwrap_err();
    assert!(
        err.contains("`linear`") && err.contains("2 operands"),
        "{err}"
    );
}

// ---------------------------------------------------------------- run / bind

/// dense f32[B,2], idx i64[B,2]; emb f32[4,2], w f32[1,4], b f32[1];
/// e = embedding_bag(emb, idx); h = interaction cat(dense, e); prob = linear{sigmoid}.
fn small_model() -> Graph {
    let mut g = Graph::new("small");
    let dense = g
        .add_input("dense", TensorType::f32([Dim::batch(), Dim::Fixed(2)]))
        .expect("input");
    let idx = g
        .add_input(
            "idx.0",
            TensorType::new(DType::I64, [Dim::batch(), Dim::Fixed(2)]),
        )
        .expect("input");
    let emb = g
        .add_param("emb.0", TensorType::f32([Dim::Fixed(4), Dim::Fixed(2)]))
        .expect("param");
    let w = g
        .add_param("top.0.w", TensorType::f32([Dim::Fixed(1), Dim::Fixed(4)]))
        .expect("param");
    let b = g
        .add_param("top.0.b", TensorType::f32([Dim::Fixed(1)]))
        .expect("param");
    let e = g
        .add(
            Op::EmbeddingBag {
                mode: Pool::Sum,
                last_offset: false,
            },
            &[emb, idx],
            "e.0",
        )
        .expect("node");
    let h = g
        .add(
            Op::Interaction {
                kind: InteractionKind::Cat,
                self_interaction: false,
            },
            &[dense, e],
            "h",
        )
        .expect("node");
    let p = g
        .add(Op::Linear { act: Act::Sigmoid }, &[h, w, b], "prob")
        .expect("node");
    g.add_output(p);
    g
}

fn small_data() -> (HashMap<String, Tensor>, HashMap<String, Tensor>) {
    let inputs = HashMap::from([
        ("dense".to_string(), f(&[2, 2], &[0.1, 0.2, 0.3, 0.4])),
        ("idx.0".to_string(), i64t(&[2, 2], &[0, 1, 3, 3])),
    ]);
    let params = HashMap::from([
        ("emb.0".to_string(), table4x2()),
        ("top.0.w".to_string(), f(&[1, 4], &[0.1, -0.1, 0.01, 0.02])),
        ("top.0.b".to_string(), f(&[1], &[0.5])),
    ]);
    (inputs, params)
}

#[test]
fn run_evaluates_in_order_and_matches_eval_op() {
    let g = small_model();
    let (inputs, mut params) = small_data();
    let s = bind_symbols(&g, &inputs, &params).expect("bind");
    assert_eq!(s, syms(&[("B", 2)]));
    let out = run(&g, &inputs, &mut params, &s, &SingleRank).expect("run");
    // h = [0.1,0.2, 4,6], [0.3,0.4, 14,16]
    let z = [
        0.01f32 - 0.02 + 0.04 + 0.12 + 0.5,
        0.03 - 0.04 + 0.14 + 0.32 + 0.5,
    ];
    let want: Vec<f32> = z.iter().map(|&v| 1.0 / (1.0 + (-v).exp())).collect();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].shape, vec![2, 1]);
    assert_close(&out[0].to_f32_vec(), &want, 1e-6);
}

#[test]
fn run_reports_missing_and_mistyped_bindings() {
    let g = small_model();
    let (inputs, mut params) = small_data();
    let s = syms(&[("B", 2)]);
    let mut missing = inputs.clone();
    missing.remove("idx.0");
    let err = run(&g, &missing, &mut params, &s, &SingleRank).unwrap_err();
    assert!(
        matches!(&err, IrError::Binding { name, reason } if name == "idx.0" && reason.contains("missing input")),
        "{err}"
    );
    let mut p2 = params.clone();
    p2.remove("top.0.b");
    let err = run(&g, &inputs, &mut p2, &s, &SingleRank).unwrap_err();
    assert!(
        matches!(&err, IrError::Binding { name, .. } if name == "top.0.b"),
        "{err}"
    );
    let mut wrong = inputs.clone();
    wrong.insert("dense".into(), f(&[2, 3], &[0.; 6]));
    let err = run(&g, &wrong, &mut params, &s, &SingleRank).unwrap_err();
    assert!(
        matches!(&err, IrError::Binding { name, reason } if name == "dense" && reason.contains("f32[2,3]")),
        "{err}"
    );
    // B bound to another size than the data.
    let err = run(&g, &inputs, &mut params, &syms(&[("B", 3)]), &SingleRank).unwrap_err();
    assert!(matches!(err, IrError::Binding { .. }), "{err}");
    // bind_symbols: conflicting sizes name the value and the symbol.
    let mut conflict = inputs.clone();
    conflict.insert("idx.0".into(), i64t(&[3, 2], &[0; 6]));
    let err = bind_symbols(&g, &conflict, &params).unwrap_err();
    assert!(
        matches!(&err, IrError::Binding { name, reason } if name == "idx.0" && reason.contains("symbol B") && reason.contains("%dense")),
        "{err}"
    );
}

#[test]
fn run_eval_errors_name_node_and_operands() {
    let g = small_model();
    let (mut inputs, mut params) = small_data();
    inputs.insert("idx.0".into(), i64t(&[2, 2], &[0, 1, 4, 0]));
    let before = params.clone();
    let err = run(&g, &inputs, &mut params, &syms(&[("B", 2)]), &SingleRank).unwrap_err();
    match &err {
        IrError::Eval { node, op, reason } => {
            assert_eq!(node, "#0 %e.0");
            assert_eq!(op, "embedding_bag");
            assert!(
                reason.contains("index 4 at sample 1, position 0"),
                "{reason}"
            );
            assert!(reason.contains("(operands: %emb.0, %idx.0)"), "{reason}");
        }
        other => panic!("expected an eval error, got {other}"),
    }
    assert_eq!(params, before, "a failed run changes no parameter");
}

/// A training step: a dense param `w` and a table `emb`, both updated; the loss
/// and the new `w` (also an update value) are outputs.
#[test]
fn run_applies_updates_with_an_owned_table() {
    let mut g = Graph::new("step");
    let x = g
        .add_input("x", TensorType::f32([Dim::Fixed(2)]))
        .expect("input");
    let idx = g
        .add_input(
            "idx",
            TensorType::new(DType::I64, [Dim::batch(), Dim::Fixed(1)]),
        )
        .expect("input");
    let w = g
        .add_param("w", TensorType::f32([Dim::Fixed(2)]))
        .expect("param");
    let emb = g
        .add_param("emb", TensorType::f32([Dim::Fixed(3), Dim::Fixed(2)]))
        .expect("param");
    let w2 = g.add(Op::Sgd { lr: 1.0 }, &[w, x], "w.new").expect("sgd");
    // An intermediate table (emb + emb): at its last use the sparse_sgd owns it and
    // updates it in place.
    let emb_mid = g.add(Op::Add, &[emb, emb], "emb.twice").expect("add");
    let e = g
        .add(
            Op::EmbeddingBag {
                mode: Pool::Sum,
                last_offset: false,
            },
            &[emb_mid, idx],
            "e",
        )
        .expect("bag");
    let rg = g
        .add(
            Op::EmbeddingBagGrad {
                mode: Pool::Sum,
                last_offset: false,
            },
            &[e, idx],
            "rg",
        )
        .expect("grad");
    let emb2 = g
        .add(Op::SparseSgd { lr: 0.5 }, &[emb_mid, idx, rg], "emb.new")
        .expect("sparse");
    let loss = g
        .add(
            Op::Mse {
                denom: Dim::batch(),
            },
            &[e, e],
            "loss",
        )
        .expect("mse");
    g.add_output(loss);
    g.add_output(w2);
    g.add_update(w, w2).expect("update");
    g.add_update(emb, emb2).expect("update");
    dlrm_ir::verify(&g).expect("verify");

    let inputs = HashMap::from([
        ("x".to_string(), f(&[2], &[0.5, -1.])),
        ("idx".to_string(), i64t(&[2, 1], &[2, 2])),
    ]);
    let mut params = HashMap::from([
        ("w".to_string(), f(&[2], &[1., 1.])),
        ("emb".to_string(), f(&[3, 2], &[1., 2., 3., 4., 5., 6.])),
    ]);
    let s = bind_symbols(&g, &inputs, &params).expect("bind");
    let out = run(&g, &inputs, &mut params, &s, &SingleRank).expect("run");
    assert_eq!(out, vec![Tensor::scalar(0.0), f(&[2], &[0.5, 2.])]);
    assert_eq!(params["w"], f(&[2], &[0.5, 2.]));
    // emb.twice row 2 = [10, 12]; e = [[10,12],[10,12]]; rg = e; row 2 -= 0.5·2·[10,12].
    assert_eq!(params["emb"], f(&[3, 2], &[2., 4., 6., 8., 0., 0.]));
}

// -------------------------------------------------------------- collectives

fn on_ranks<T: Send + 'static>(
    n: usize,
    f: impl Fn(LocalComm) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let handles: Vec<_> = LocalGroup::new(n)
        .into_iter()
        .map(|c| {
            let f = f.clone();
            thread::spawn(move || f(c))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}

#[test]
fn all_reduce_sums_over_ranks() {
    for n in 1..=4usize {
        let out = on_ranks(n, move |c| {
            let r = c.rank() as f32;
            let a = f(&[2, 2], &[r, r + 1., 2. * r, -r]);
            let b = f(&[3], &[1., 10. * r, 0.5]);
            let outs = [fixed_ty(&a), fixed_ty(&b)];
            let s = HashMap::new();
            let ctx = EvalCtx { syms: &s, comm: &c };
            eval_op(&Op::AllReduce, &[&a, &b], &outs, &ctx).expect("all_reduce")
        });
        let sr: f32 = (0..n).map(|r| r as f32).sum();
        let nf = n as f32;
        for res in &out {
            assert_eq!(res[0], f(&[2, 2], &[sr, sr + nf, 2. * sr, -sr]));
            assert_eq!(res[1], f(&[3], &[nf, 10. * sr, 0.5 * nf]));
        }
    }
}

/// Width of owner `r`'s `k`-th tensor (different per tensor, to catch mix-ups).
fn width(r: usize, k: usize) -> usize {
    1 + (r + 2 * k) % 3
}

/// Value of owner `r`'s tensor `k` at sample `s`, element `j`.
fn owned_value(r: usize, k: usize, s: usize, j: usize) -> f32 {
    (r * 1000 + k * 100 + s * 10 + j) as f32
}

fn scatter_gather(counts: Vec<usize>, global: usize) {
    let n = counts.len();
    let out = on_ranks(n, move |c| {
        let rank = c.rank();
        let b = batch_slice(global, n, rank).len();
        let s = syms(&[("G", global), ("B", b)]);
        let ctx = EvalCtx { syms: &s, comm: &c };
        let mine: Vec<Tensor> = (0..counts[rank])
            .map(|k| {
                let w = width(rank, k);
                let v = (0..global)
                    .flat_map(|s| (0..w).map(move |j| owned_value(rank, k, s, j)))
                    .collect::<Vec<_>>();
                f(&[global, w], &v)
            })
            .collect();
        let scatter_types: Vec<TensorType> = (0..n)
            .flat_map(|r| (0..counts[r]).map(move |k| (r, k)))
            .map(|(r, k)| TensorType::f32([Dim::batch(), Dim::Fixed(width(r, k))]))
            .collect();
        let refs: Vec<&Tensor> = mine.iter().collect();
        let scatter = Op::AllToAll {
            dir: A2aDir::Scatter,
            counts: counts.clone(),
            rank,
        };
        let got = eval_op(&scatter, &refs, &scatter_types, &ctx).expect("scatter");
        // Each result is its owner's tensor restricted to this rank's samples.
        let rows = batch_slice(global, n, rank);
        let mut j = 0;
        for (r, &count) in counts.iter().enumerate() {
            for k in 0..count {
                let w = width(r, k);
                let want: Vec<f32> = rows
                    .clone()
                    .flat_map(|s| (0..w).map(move |e| owned_value(r, k, s, e)))
                    .collect();
                assert_eq!(
                    got[j],
                    f(&[b, w], &want),
                    "rank {rank}, owner {r}, tensor {k}"
                );
                j += 1;
            }
        }
        let gather_types: Vec<TensorType> = (0..counts[rank])
            .map(|k| TensorType::f32([Dim::global(), Dim::Fixed(width(rank, k))]))
            .collect();
        let gather = Op::AllToAll {
            dir: A2aDir::Gather,
            counts: counts.clone(),
            rank,
        };
        let grefs: Vec<&Tensor> = got.iter().collect();
        let back = eval_op(&gather, &grefs, &gather_types, &ctx).expect("gather");
        (back, mine)
    });
    for (rank, (back, mine)) in out.into_iter().enumerate() {
        assert_eq!(back, mine, "gather(scatter(x)) != x on rank {rank}");
    }
}

#[test]
fn all_to_all_scatter_then_gather_is_identity() {
    scatter_gather(vec![2], 5);
    scatter_gather(vec![1, 1], 4);
    scatter_gather(vec![2, 0, 1], 7);
    scatter_gather(vec![0, 3, 1], 7);
    scatter_gather(vec![1, 0, 2, 1], 9);
    scatter_gather(vec![1, 1, 1, 1], 2); // some ranks own no samples
}

#[test]
fn all_to_all_checks_group_rank_and_batch() {
    let x = f(&[3, 1], &[1., 2., 3.]);
    let outs = [TensorType::f32([Dim::batch(), Dim::Fixed(1)])];
    let s = syms(&[("G", 3), ("B", 3)]);
    let ctx = EvalCtx {
        syms: &s,
        comm: &SingleRank,
    };
    let op = |counts: Vec<usize>, rank| Op::AllToAll {
        dir: A2aDir::Scatter,
        counts,
        rank,
    };
    let ok = eval_op(&op(vec![1], 0), &[&x], &outs, &ctx).expect("one rank");
    assert_eq!(ok[0], x);
    let err = eval_op(&op(vec![1, 0], 0), &[&x], &[outs[0].clone()], &ctx).unwrap_err();
    assert!(err.contains("group has 1"), "{err}");
    let s2 = syms(&[("G", 3), ("B", 2)]);
    let ctx2 = EvalCtx {
        syms: &s2,
        comm: &SingleRank,
    };
    let err = eval_op(&op(vec![1], 0), &[&x], &outs, &ctx2).unwrap_err();
    assert!(err.contains("B is 2"), "{err}");
    let s3 = syms(&[("B", 3)]);
    let ctx3 = EvalCtx {
        syms: &s3,
        comm: &SingleRank,
    };
    let err = eval_op(&op(vec![1], 0), &[&x], &outs, &ctx3).unwrap_err();
    assert!(err.contains("symbol G is not bound"), "{err}");

    // On 2 ranks, a rank that fails its local check aborts the group: the peer gets
    // an error instead of hanging; and a wrong `rank` attribute is caught.
    let out = on_ranks(2, move |c| {
        let rank = c.rank();
        let b = batch_slice(4, 2, rank).len();
        let bad_b = if rank == 1 { b + 1 } else { b };
        let s = syms(&[("G", 4), ("B", bad_b)]);
        let ctx = EvalCtx { syms: &s, comm: &c };
        let x = f(&[4, 1], &[0.; 4]);
        let outs = [
            TensorType::f32([Dim::batch(), Dim::Fixed(1)]),
            TensorType::f32([Dim::batch(), Dim::Fixed(1)]),
        ];
        eval_op(&op(vec![1, 1], rank), &[&x], &outs, &ctx)
    });
    assert!(
        out[1].as_ref().is_err_and(|e| e.contains("B is 3")),
        "{out:?}"
    );
    assert!(out[0].is_err(), "{out:?}");
    let out = on_ranks(2, move |c| {
        let s = syms(&[("G", 2), ("B", 1)]);
        let ctx = EvalCtx { syms: &s, comm: &c };
        let x = f(&[2, 1], &[0.; 2]);
        let outs = [
            TensorType::f32([Dim::batch(), Dim::Fixed(1)]),
            TensorType::f32([Dim::batch(), Dim::Fixed(1)]),
        ];
        eval_op(&op(vec![1, 1], 0), &[&x], &outs, &ctx)
    });
    assert!(
        out[1]
            .as_ref()
            .is_err_and(|e| e.contains("for rank 0 but runs on rank 1")),
        "{out:?}"
    );
    assert!(out[0].is_err(), "{out:?}");
}

#[test]
fn embedding_bag_last_offset_reads_only_the_indices_in_its_bags() {
    let t = table4x2();
    // Offsets [1, 3, 3, 4] over 6 indices: bags [1,3), [3,3), [3,4);
    // positions 0, 4 and 5 are in no bag (their indices, 9 and -1, are unread).
    let idx = i64t(&[6], &[9, 1, 0, 3, 2, -1]);
    let off = i64t(&[4], &[1, 3, 3, 4]);
    let op = |mode| Op::EmbeddingBag {
        mode,
        last_offset: true,
    };
    let sum = eval1(&op(Pool::Sum), &[&t, &idx, &off]);
    assert_eq!(sum, f(&[3, 2], &[4., 6., 0., 0., 7., 8.]));
    let mean = eval1(&op(Pool::Mean), &[&t, &idx, &off]);
    assert_eq!(mean, f(&[3, 2], &[2., 3., 0., 0., 7., 8.]));
    // The gradient: the rows of the indices in no bag are 0.
    let dy = f(&[3, 2], &[1., 2., 3., 4., 5., 6.]);
    let g = Op::EmbeddingBagGrad {
        mode: Pool::Mean,
        last_offset: true,
    };
    let rows = eval1(&g, &[&dy, &idx, &off]);
    assert_eq!(
        rows,
        f(&[6, 2], &[0., 0., 0.5, 1., 0.5, 1., 5., 6., 0., 0., 0., 0.])
    );
}

#[test]
fn bad_last_offset_offsets_are_errors() {
    let t = table4x2();
    let idx = i64t(&[3], &[0, 1, 2]);
    let cases: [(&[i64], &str); 4] = [
        (
            &[0, 2, 4],
            "the end of the last bag (offsets[2]): offsets must be at most the 3 indices",
        ),
        (&[0, 2, 1], "non-decreasing"),
        (&[-1, 2], "sample 0: offsets must not be negative"),
        (&[], "at least one entry"),
    ];
    for (off, want) in cases {
        let off = i64t(&[off.len()], off);
        let s = off.shape[0].saturating_sub(1);
        for op in [
            Op::EmbeddingBag {
                mode: Pool::Sum,
                last_offset: true,
            },
            Op::EmbeddingBagGrad {
                mode: Pool::Sum,
                last_offset: true,
            },
        ] {
            let first = if matches!(op, Op::EmbeddingBag { .. }) {
                t.clone()
            } else {
                Tensor::zeros(DType::F32, vec![s, 2])
            };
            let err = eval(&op, &[&first, &idx, &off]).unwrap_err();
            assert!(err.contains(want), "{off:?}: {err}");
        }
    }
    // An index out of range inside a bag is an error naming its sample.
    let idx = i64t(&[3], &[0, 7, 2]);
    let off = i64t(&[3], &[0, 1, 3]);
    let op = Op::EmbeddingBag {
        mode: Pool::Sum,
        last_offset: true,
    };
    let err = eval(&op, &[&t, &idx, &off]).unwrap_err();
    assert!(err.contains("sample 1"), "{err}");
}
