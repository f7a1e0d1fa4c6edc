//! The kernels against the definition: `dlrm_ir::interp::eval_op`, on the same
//! random cases (ragged sizes included). Tolerance: 1e-5 relative to the sum of the
//! terms' magnitudes for GEMMs and dot products (reassociation); the optimizer
//! updates must be bitwise equal.

mod common;

use common::*;
use dlrm_codegen::{Rows, sgd_in_place, sparse_sgd_in_place, try_eval};
use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::{Dim, Op, SingleRank, Tensor, TensorType};
use std::collections::HashMap;

fn interp(
    op: &Op,
    inputs: &[&Tensor],
    out_types: &[TensorType],
    syms: &HashMap<String, usize>,
) -> Vec<Tensor> {
    let ctx = EvalCtx {
        syms,
        comm: &SingleRank,
    };
    eval_op(op, inputs, out_types, &ctx).unwrap_or_else(|e| panic!("interpreter: {e}"))
}

#[test]
fn every_kernel_matches_the_interpreter() {
    for c in all_cases(99, 8) {
        let want = interp(&c.op, &c.refs(), &c.out_types, &c.syms);
        let got = try_eval(&c.op, &c.refs(), &c.out_types, &c.syms)
            .expect("kernel")
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_eq!(got.len(), want.len(), "{}", c.name);
        for ((g, i), w) in got.iter().zip(&want).zip(&c.want) {
            assert_eq!(g.shape, i.shape, "{}", c.name);
            assert_eq!(g.dtype(), i.dtype(), "{}", c.name);
            // Both against the f64 truth, and against each other.
            assert_close(&format!("{} (interpreter)", c.name), i, w, 1e-5);
            let both = Want {
                shape: w.shape.clone(),
                vals: i.to_f32_vec().into_iter().map(f64::from).collect(),
                scale: w.scale.iter().map(|s| 2.0 * s).collect(),
            };
            assert_close(&c.name, g, &both, 1e-5);
        }
    }
}

#[test]
fn index_errors_agree_with_the_interpreter() {
    let table = Tensor::f32(vec![5, 2], vec![0.0; 10]);
    let idx = Tensor::i64(vec![3, 2], vec![0, 1, 2, 3, 4, 5]);
    let ty = vec![TensorType::f32([Dim::batch(), Dim::Fixed(2)])];
    let syms = HashMap::from([("B".to_string(), 3)]);
    let op = Op::EmbeddingBag {
        mode: dlrm_ir::Pool::Sum,
        last_offset: false,
    };
    let ctx = EvalCtx {
        syms: &syms,
        comm: &SingleRank,
    };
    assert!(eval_op(&op, &[&table, &idx], &ty, &ctx).is_err());
    assert!(
        try_eval(&op, &[&table, &idx], &ty, &syms)
            .expect("kernel")
            .is_err()
    );
}

#[test]
fn in_place_updates_are_bitwise_the_interpreter() {
    let mut r = rng(4);
    let syms = HashMap::new();
    for (rows, d, s, l) in [(3, 4, 50, 3), (500, 16, 200, 4)] {
        for i32s in [false, true] {
            let (mut table, idx, g) = sparse_sgd_case(&mut r, rows, d, s, l, i32s);
            let op = Op::SparseSgd { lr: 0.05 };
            let want = interp(
                &op,
                &[&table, &idx, &g],
                &[TensorType::f32([Dim::Fixed(rows), Dim::Fixed(d)])],
                &syms,
            );
            sparse_sgd_in_place(&mut table, Rows::All, &idx, &g, 0.05).expect("update");
            assert_eq!(table, want[0]);
        }
    }
    let w0 = Tensor::f32(vec![3, 5], uniform(&mut r, 15));
    let g = Tensor::f32(vec![3, 5], uniform(&mut r, 15));
    let op = Op::Sgd { lr: 0.3 };
    let want = interp(
        &op,
        &[&w0, &g],
        &[TensorType::f32([Dim::Fixed(3), Dim::Fixed(5)])],
        &syms,
    );
    let mut w = w0.clone();
    sgd_in_place(&mut w, &g, 0.3).expect("sgd");
    assert_eq!(w, want[0]);
}
