//! The kernels against an independent naive f64 reference, on random shapes
//! (ragged sizes included), plus errors, fallbacks and determinism.

mod common;

use common::*;
use dlrm_codegen::{KernelError, Rows, sgd_in_place, sparse_sgd_in_place, try_eval};
use dlrm_ir::{Act, DType, Dim, Op, Pool, Tensor, TensorType};
use half::bf16;
use std::collections::HashMap;

/// GEMM / dot reassociation tolerance, relative to the sum of the terms' magnitudes.
const REL: f64 = 1e-5;

#[test]
fn every_kernel_matches_the_naive_reference() {
    let cases = all_cases(7, 12);
    assert!(cases.len() > 150);
    for c in &cases {
        let got = try_eval(&c.op, &c.refs(), &c.out_types, &c.syms)
            .unwrap_or_else(|| panic!("{}: no kernel", c.name))
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_eq!(got.len(), c.want.len(), "{}", c.name);
        for (g, w) in got.iter().zip(&c.want) {
            assert_eq!(g.dtype(), DType::F32);
            assert_close(&c.name, g, w, REL);
        }
    }
}

#[test]
fn empty_sizes_give_empty_or_zero_results() {
    let mut r = rng(1);
    for c in [
        linear(&mut r, 0, 4, 3, Act::Relu),
        linear(&mut r, 3, 0, 2, Act::None),
        linear_dx(&mut r, 0, 3, 4),
        linear_dw(&mut r, 0, 3, 4),
        linear_db(&mut r, 0, 5),
        embedding_bag(&mut r, 10, 4, 0, Some(2), Pool::Sum, false),
        embedding_bag(&mut r, 10, 4, 3, Some(0), Pool::Mean, false),
        embedding_bag_grad(&mut r, 4, 0, None, Pool::Sum, false),
    ] {
        let got = try_eval(&c.op, &c.refs(), &c.out_types, &c.syms)
            .expect("kernel")
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_close(&c.name, &got[0], &c.want[0], REL);
    }
}

#[test]
fn bf16_and_uncovered_ops_fall_back() {
    let x = Tensor::bf16(vec![2, 3], vec![bf16::ONE; 6]);
    let w = Tensor::bf16(vec![4, 3], vec![bf16::ONE; 12]);
    let b = Tensor::bf16(vec![4], vec![bf16::ONE; 4]);
    let ty = TensorType::new(DType::BF16, [Dim::Fixed(2), Dim::Fixed(4)]);
    let syms = HashMap::new();
    assert!(try_eval(&Op::Linear { act: Act::None }, &[&x, &w, &b], &[ty], &syms).is_none());
    // f32 result type but a bf16 operand: still no kernel.
    let xf = Tensor::f32(vec![2, 3], vec![1.0; 6]);
    let ty = TensorType::f32([Dim::Fixed(2), Dim::Fixed(4)]);
    assert!(try_eval(&Op::Linear { act: Act::None }, &[&xf, &w, &b], &[ty], &syms).is_none());
    let p = Tensor::f32(vec![2, 1], vec![0.5; 2]);
    let bce = Op::Bce {
        denom: Dim::batch(),
    };
    assert!(try_eval(&bce, &[&p, &p], &[TensorType::scalar_f32()], &syms).is_none());
}

#[test]
fn out_of_range_index_names_position_and_sample() {
    let table = Tensor::f32(vec![5, 2], vec![0.0; 10]);
    let idx = Tensor::i64(vec![3, 2], vec![0, 1, 2, 3, 4, 5]);
    let ty = TensorType::f32([Dim::batch(), Dim::Fixed(2)]);
    let syms = HashMap::from([("B".to_string(), 3)]);
    let err = try_eval(
        &Op::EmbeddingBag {
            mode: Pool::Sum,
            last_offset: false,
        },
        &[&table, &idx],
        std::slice::from_ref(&ty),
        &syms,
    )
    .expect("kernel")
    .expect_err("index 5 is out of range");
    assert_eq!(
        err,
        KernelError::IndexOutOfRange {
            op: "embedding_bag",
            position: 5,
            sample: Some(2),
            index: 5,
            rows: 5
        }
    );
    assert!(err.to_string().contains("sample 2"), "{err}");
    // Offsets form: negative index in the second bag.
    let idx = Tensor::i32(vec![4], vec![0, 1, -1, 2]);
    let off = Tensor::i32(vec![2], vec![0, 2]);
    let ty2 = TensorType::f32([Dim::Fixed(2), Dim::Fixed(2)]);
    let err = try_eval(
        &Op::EmbeddingBag {
            mode: Pool::Mean,
            last_offset: false,
        },
        &[&table, &idx, &off],
        std::slice::from_ref(&ty2),
        &syms,
    )
    .expect("kernel")
    .expect_err("negative index");
    assert!(
        matches!(
            err,
            KernelError::IndexOutOfRange {
                position: 2,
                sample: Some(1),
                index: -1,
                ..
            }
        ),
        "{err:?}"
    );
    // Bad offsets.
    let off = Tensor::i32(vec![2], vec![0, 5]);
    let idx = Tensor::i32(vec![4], vec![0, 1, 1, 2]);
    let err = try_eval(
        &Op::EmbeddingBag {
            mode: Pool::Sum,
            last_offset: false,
        },
        &[&table, &idx, &off],
        &[ty2],
        &syms,
    )
    .expect("kernel")
    .expect_err("offset beyond N");
    assert!(matches!(err, KernelError::Offsets { .. }), "{err:?}");
}

#[test]
fn declared_types_are_checked() {
    let mut r = rng(3);
    let c = linear(&mut r, 4, 3, 2, Act::None);
    let wrong = vec![TensorType::f32([Dim::batch(), Dim::Fixed(3)])];
    let err = try_eval(&c.op, &c.refs(), &wrong, &c.syms)
        .expect("kernel")
        .expect_err("n mismatch");
    assert!(
        matches!(err, KernelError::Shape { op: "linear", .. }),
        "{err:?}"
    );
    let bad_b = HashMap::from([("B".to_string(), 5)]);
    assert!(
        try_eval(&c.op, &c.refs(), &c.out_types, &bad_b)
            .expect("kernel")
            .is_err()
    );
}

fn seq_sparse_sgd(table: &mut [f32], d: usize, idx: &[i64], g: &[f32], lr: f32) {
    for (p, &i) in idx.iter().enumerate() {
        for c in 0..d {
            table[i as usize * d + c] -= lr * g[p * d + c];
        }
    }
}

#[test]
fn sparse_sgd_is_bitwise_the_sequential_update() {
    let mut r = rng(11);
    for (rows, d, s, l) in [
        (1, 4, 7, 3),
        (10, 1, 100, 2),
        (1000, 16, 300, 5),
        (37, 13, 1000, 10),
    ] {
        for i32s in [false, true] {
            let (mut table, idx, g) = sparse_sgd_case(&mut r, rows, d, s, l, i32s);
            let mut want = table.to_f32_vec();
            let iv = idx.to_i64_vec().expect("ints");
            seq_sparse_sgd(&mut want, d, &iv, &g.to_f32_vec(), 0.37);
            sparse_sgd_in_place(&mut table, Rows::All, &idx, &g, 0.37).expect("update");
            let got = table.as_f32().expect("f32");
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "rows={rows} d={d}"
            );
        }
    }
}

#[test]
fn sparse_sgd_bf16_table_rounds_once_per_row() {
    // The interpreter's rule: a touched row is updated in f32 (all of its updates,
    // in index order) and rounded to bf16 once.
    let mut r = rng(12);
    let (t32, idx, g) = sparse_sgd_case(&mut r, 20, 8, 500, 4, false);
    let mut table = Tensor::bf16(
        t32.shape.clone(),
        t32.to_f32_vec().into_iter().map(bf16::from_f32).collect(),
    );
    let mut master = table.to_f32_vec();
    let mut want: Vec<bf16> = match &table.data {
        dlrm_ir::Data::BF16(v) => v.clone(),
        _ => unreachable!(),
    };
    let gv = g.to_f32_vec();
    let iv = idx.to_i64_vec().expect("ints");
    for (p, &i) in iv.iter().enumerate() {
        for c in 0..8 {
            master[i as usize * 8 + c] -= 0.5 * gv[p * 8 + c];
        }
    }
    for &i in &iv {
        for c in 0..8 {
            want[i as usize * 8 + c] = bf16::from_f32(master[i as usize * 8 + c]);
        }
    }
    sparse_sgd_in_place(&mut table, Rows::All, &idx, &g, 0.5).expect("update");
    assert_eq!(table.data, dlrm_ir::Data::BF16(want));
}

#[test]
fn sparse_sgd_rejects_bad_index_before_touching_the_table() {
    let mut table = Tensor::f32(vec![4, 2], (0..8).map(|x| x as f32).collect());
    let before = table.clone();
    let idx = Tensor::i64(vec![2, 3], vec![0, 1, 2, 3, 0, 4]);
    let g = Tensor::f32(vec![2, 3, 2], vec![1.0; 12]);
    let err =
        sparse_sgd_in_place(&mut table, Rows::All, &idx, &g, 1.0).expect_err("index 4 of 4 rows");
    assert_eq!(
        err,
        KernelError::IndexOutOfRange {
            op: "sparse_sgd",
            position: 5,
            sample: Some(1),
            index: 4,
            rows: 4
        }
    );
    assert_eq!(table, before);
    let g_bad = Tensor::f32(vec![2, 3, 3], vec![1.0; 18]);
    assert!(sparse_sgd_in_place(&mut table, Rows::All, &idx, &g_bad, 1.0).is_err());
    assert_eq!(table, before);
}

#[test]
fn sgd_is_bitwise_the_definition() {
    let mut r = rng(5);
    for n in [1usize, 7, 100_003] {
        let w0 = uniform(&mut r, n);
        let g = uniform(&mut r, n);
        let mut w = Tensor::f32(vec![n], w0.clone());
        sgd_in_place(&mut w, &Tensor::f32(vec![n], g.clone()), 0.1).expect("sgd");
        let want: Vec<f32> = w0.iter().zip(&g).map(|(w, g)| w - 0.1 * g).collect();
        assert_eq!(w.as_f32().expect("f32"), &want[..]);
        // bf16 weight, f32 gradient.
        let mut wb = Tensor::bf16(vec![n], w0.iter().map(|&x| bf16::from_f32(x)).collect());
        sgd_in_place(&mut wb, &Tensor::f32(vec![n], g.clone()), 0.1).expect("sgd bf16");
        let want: Vec<bf16> = w0
            .iter()
            .zip(&g)
            .map(|(&w, g)| bf16::from_f32(bf16::from_f32(w).to_f32() - 0.1 * g))
            .collect();
        assert_eq!(wb.data, dlrm_ir::Data::BF16(want));
    }
    let mut w = Tensor::f32(vec![2], vec![0.0; 2]);
    assert!(sgd_in_place(&mut w, &Tensor::f32(vec![3], vec![0.0; 3]), 0.1).is_err());
    assert!(sgd_in_place(&mut w, &Tensor::i64(vec![2], vec![0; 2]), 0.1).is_err());
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let cases = all_cases(21, 4);
    let run = |threads: usize| -> Vec<Vec<Tensor>> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        pool.install(|| {
            cases
                .iter()
                .map(|c| {
                    try_eval(&c.op, &c.refs(), &c.out_types, &c.syms)
                        .expect("kernel")
                        .expect("ok")
                })
                .collect()
        })
    };
    let one = run(1);
    let five = run(5);
    for ((a, b), c) in one.iter().zip(&five).zip(&cases) {
        assert_eq!(a, b, "{}", c.name);
    }
}
