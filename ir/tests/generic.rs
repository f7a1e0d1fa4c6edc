//! The generic ops of the ONNX import (`matmul`, `binary`, `transpose`, `gather`,
//! `gather_elements`, `gather_nd`, `slice`, `reduce`, `cast`,
//! `embedding_bag_weighted`): hand-computed results, errors instead of panics, and
//! the text round trip of their attributes.

#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::{
    BinaryKind, DType, Dim, Graph, Op, Pool, SingleRank, Tensor, TensorType, infer, text,
};
use std::collections::HashMap;

fn ty(t: &Tensor) -> TensorType {
    TensorType::new(t.dtype(), t.shape.iter().map(|&d| Dim::Fixed(d)))
}

fn eval(op: Op, ins: &[&Tensor]) -> Result<Tensor, String> {
    let tys: Vec<TensorType> = ins.iter().map(|t| ty(t)).collect();
    let refs: Vec<&TensorType> = tys.iter().collect();
    let out = infer(&op, &refs, &[])?;
    let syms = HashMap::new();
    let ctx = EvalCtx {
        syms: &syms,
        comm: &SingleRank,
    };
    Ok(eval_op(&op, ins, &out, &ctx)?.remove(0))
}

#[test]
fn matmul_broadcasts_batch_dims() {
    let a = Tensor::f32(vec![2, 1, 2], vec![1., 2., 3., 4.]);
    let b = Tensor::f32(vec![2, 1], vec![10., 1.]);
    let y = eval(Op::MatMul, &[&a, &b]).unwrap();
    assert_eq!(y, Tensor::f32(vec![2, 1, 1], vec![12., 34.]));
}

#[test]
fn binary_broadcasts() {
    let a = Tensor::f32(vec![2, 2], vec![1., 2., 3., 4.]);
    let b = Tensor::f32(vec![2], vec![10., 100.]);
    let y = eval(
        Op::Binary {
            kind: BinaryKind::Mul,
        },
        &[&a, &b],
    )
    .unwrap();
    assert_eq!(y.as_f32().unwrap(), &[10., 200., 30., 400.]);
    let c = Tensor::f32(vec![3], vec![0.; 3]);
    assert!(
        infer(
            &Op::Binary {
                kind: BinaryKind::Add
            },
            &[&ty(&a), &ty(&c)],
            &[]
        )
        .is_err()
    );
}

#[test]
fn transpose_gather_slice() {
    let x = Tensor::i64(vec![2, 3], vec![0, 1, 2, 3, 4, 5]);
    let t = eval(Op::Transpose { perm: vec![1, 0] }, &[&x]).unwrap();
    assert_eq!(t.to_i64_vec().unwrap(), vec![0, 3, 1, 4, 2, 5]);
    let idx = Tensor::i64(vec![2], vec![-1, 0]);
    let g = eval(Op::Gather { axis: 1 }, &[&x, &idx]).unwrap();
    assert_eq!(
        (g.shape.clone(), g.to_i64_vec().unwrap()),
        (vec![2, 2], vec![2, 0, 5, 3])
    );
    let bad = Tensor::i64(vec![1], vec![3]);
    assert!(
        eval(Op::Gather { axis: 1 }, &[&x, &bad])
            .unwrap_err()
            .contains("out of range")
    );
    let s = Op::Slice {
        axes: vec![1],
        starts: vec![0],
        ends: vec![Dim::Fixed(3)],
        steps: vec![2],
    };
    assert_eq!(
        eval(s, &[&x]).unwrap().to_i64_vec().unwrap(),
        vec![0, 2, 3, 5]
    );
}

#[test]
fn gather_elements_and_nd() {
    let x = Tensor::f32(vec![2, 2], vec![1., 2., 3., 4.]);
    let i = Tensor::i64(vec![2, 2], vec![1, 0, 0, 0]);
    let y = eval(Op::GatherElements { axis: 1 }, &[&x, &i]).unwrap();
    assert_eq!(y.as_f32().unwrap(), &[2., 1., 3., 3.]);
    let nd = Tensor::i64(vec![2, 2], vec![1, 1, 0, 1]);
    let z = eval(Op::GatherNd { batch_dims: 0 }, &[&x, &nd]).unwrap();
    assert_eq!(z.as_f32().unwrap(), &[4., 2.]);
}

/// Operands the interpreter could not read are the shape rule's to refuse, so
/// every path (the verifier, an instance, the interpreter, the kernels) refuses
/// them: `gather_elements` indices longer than the data off the axis, `gather_nd`
/// index tuples of length 0, indices with no bags. A length still symbolic is
/// left to the instance, which sees it bound.
#[test]
fn shapes_the_interpreter_cannot_read_are_refused_by_the_rule() {
    let x = Tensor::f32(vec![2, 2], vec![1., 2., 3., 4.]);
    let long = Tensor::i64(vec![3, 1], vec![0, 1, 0]);
    let err = eval(Op::GatherElements { axis: 1 }, &[&x, &long]).unwrap_err();
    assert!(err.contains("longer than the data"), "{err}");
    let empty = Tensor::i64(vec![2, 0], vec![]);
    let err = eval(Op::GatherNd { batch_dims: 0 }, &[&x, &empty]).unwrap_err();
    assert!(err.contains("index tuples of length 0"), "{err}");
    let (idx, w) = (
        Tensor::i64(vec![2], vec![0, 1]),
        Tensor::f32(vec![2], vec![1., 1.]),
    );
    let no_bags = Tensor::i64(vec![0], vec![]);
    let err = eval(Op::EmbeddingBagWeighted, &[&x, &idx, &no_bags, &w]).unwrap_err();
    assert!(err.contains("no bags"), "{err}");

    // The interpreter's own entry (its instance from the operands) refuses
    // them too, whatever result type it is given.
    let syms = HashMap::new();
    let ctx = EvalCtx {
        syms: &syms,
        comm: &SingleRank,
    };
    let out = [TensorType::new(DType::F32, [Dim::Fixed(3), Dim::Fixed(1)])];
    let err = eval_op(&Op::GatherElements { axis: 1 }, &[&x, &long], &out, &ctx).unwrap_err();
    assert!(err.contains("longer than the data"), "{err}");

    // Symbolic lengths pass the graph's rule.
    let n = TensorType::new(DType::I64, [Dim::batch(), Dim::Fixed(1)]);
    infer(&Op::GatherElements { axis: 1 }, &[&ty(&x), &n], &[]).unwrap();
    let s = TensorType::new(DType::I64, [Dim::batch()]);
    let wt = TensorType::new(DType::F32, [Dim::batch()]);
    let zero = TensorType::new(DType::I64, [Dim::Fixed(0)]);
    infer(&Op::EmbeddingBagWeighted, &[&ty(&x), &s, &zero, &wt], &[]).unwrap();
}

#[test]
fn reduce_cast_weighted_bag() {
    let x = Tensor::f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]);
    let r = Op::Reduce {
        kind: Pool::Mean,
        axes: vec![1],
        keepdims: true,
    };
    let y = eval(r, &[&x]).unwrap();
    assert_eq!(
        (y.shape.clone(), y.as_f32().unwrap().to_vec()),
        (vec![2, 1], vec![2., 5.])
    );
    let c = eval(
        Op::Cast { to: DType::I32 },
        &[&Tensor::f32(vec![2], vec![-1.7, 2.9])],
    )
    .unwrap();
    assert_eq!(c, Tensor::i32(vec![2], vec![-1, 2]));
    assert!(
        eval(
            Op::Cast { to: DType::I64 },
            &[&Tensor::f32(vec![1], vec![f32::NAN])]
        )
        .is_err()
    );
    let table = Tensor::f32(vec![3, 1], vec![1., 10., 100.]);
    let idx = Tensor::i64(vec![3], vec![0, 2, 1]);
    let off = Tensor::i64(vec![3], vec![0, 2, 2]);
    let w = Tensor::f32(vec![3], vec![2., 0.5, 3.]);
    let y = eval(Op::EmbeddingBagWeighted, &[&table, &idx, &off, &w]).unwrap();
    assert_eq!(y.as_f32().unwrap(), &[52., 0., 30.]);
}

#[test]
fn generic_ops_round_trip_through_text() {
    let mut g = Graph::new("g");
    let x = g
        .add_input("x", TensorType::f32([Dim::batch(), Dim::Fixed(4)]))
        .unwrap();
    let w = g
        .add_param("w", TensorType::f32([Dim::Fixed(4), Dim::Fixed(2)]))
        .unwrap();
    let i = g
        .add_input("i", TensorType::new(DType::I64, [Dim::Fixed(2)]))
        .unwrap();
    let m = g.add(Op::MatMul, &[x, w], "m").unwrap();
    let t = g
        .add(Op::Transpose { perm: vec![1, 0] }, &[m], "t")
        .unwrap();
    let s = g
        .add(
            Op::Slice {
                axes: vec![0],
                starts: vec![1],
                ends: vec![Dim::Fixed(2)],
                steps: vec![1],
            },
            &[t],
            "s",
        )
        .unwrap();
    let r = g
        .add(
            Op::Reduce {
                kind: Pool::Sum,
                axes: vec![0],
                keepdims: false,
            },
            &[s],
            "r",
        )
        .unwrap();
    let ga = g.add(Op::Gather { axis: 0 }, &[w, i], "ga").unwrap();
    let b = g
        .add(
            Op::Binary {
                kind: BinaryKind::Sub,
            },
            &[ga, ga],
            "b",
        )
        .unwrap();
    let c = g.add(Op::Cast { to: DType::BF16 }, &[b], "c").unwrap();
    g.add_output(r);
    g.add_output(c);
    let src = text::print(&g);
    let back = text::parse(&src).unwrap();
    assert_eq!(back, g, "{src}");
}
