//! Jagged batches (TorchRec's `KeyedJaggedTensor`): `offsets_from_lengths` against
//! hand-computed bounds, its errors (negative length, uneven runs), and the sparse
//! updates given a `last_offset` bag's bounds: the indices outside them (other
//! keys' ids, here beyond the table) are neither checked nor applied, in the
//! interpreter (the definition), the reference kernels and the JIT alike (bit for
//! bit); bad bounds are errors in all three and leave the parameters unchanged.

#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use dlrm_codegen::jit::JitOptions;
use dlrm_codegen::{KernelError, update_in_place};
use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::{Dim, Op, SingleRank, Tensor, TensorType, infer};
use std::collections::HashMap;

/// Deterministic values in [-1, 1).
fn vals(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn ty(t: &Tensor) -> TensorType {
    TensorType::new(t.dtype(), t.shape.iter().map(|&d| Dim::Fixed(d)))
}

fn eval(op: Op, ins: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let tys: Vec<TensorType> = ins.iter().map(|t| ty(t)).collect();
    let refs: Vec<&TensorType> = tys.iter().collect();
    let out = infer(&op, &refs, &[])?;
    let syms = HashMap::new();
    let ctx = EvalCtx {
        syms: &syms,
        comm: &SingleRank,
    };
    eval_op(&op, ins, &out, &ctx)
}

fn offsets(keys: usize, key: usize, l: &Tensor) -> Result<Tensor, String> {
    Ok(eval(Op::OffsetsFromLengths { keys, key }, &[l])?.remove(0))
}

#[test]
fn offsets_from_lengths_gives_each_keys_bounds_in_the_values() {
    // 3 keys of 2 samples: G = [0, 1, 1, 4, 5, 5, 7].
    let l = Tensor::i64(vec![6], vec![1, 0, 3, 1, 0, 2]);
    assert_eq!(
        offsets(3, 0, &l).unwrap(),
        Tensor::i64(vec![3], vec![0, 1, 1])
    );
    assert_eq!(
        offsets(3, 1, &l).unwrap(),
        Tensor::i64(vec![3], vec![1, 4, 5])
    );
    assert_eq!(
        offsets(3, 2, &l).unwrap(),
        Tensor::i64(vec![3], vec![5, 5, 7])
    );
    assert_eq!(
        offsets(1, 0, &l).unwrap(),
        Tensor::i64(vec![7], vec![0, 1, 1, 4, 5, 5, 7])
    );
    let l32 = Tensor::i32(vec![6], vec![1, 0, 3, 1, 0, 2]);
    assert_eq!(
        offsets(3, 1, &l32).unwrap(),
        Tensor::i32(vec![3], vec![1, 4, 5])
    );
    // No sample: one bound.
    let empty = Tensor::i64(vec![0], vec![]);
    assert_eq!(
        offsets(2, 1, &empty).unwrap(),
        Tensor::i64(vec![1], vec![0])
    );
}

#[test]
fn offsets_from_lengths_refuses_bad_lengths() {
    let neg = Tensor::i64(vec![4], vec![1, 2, -1, 0]);
    let e = offsets(2, 0, &neg).unwrap_err();
    assert!(
        e.contains("position 2") && e.contains("key 1") && e.contains("negative"),
        "{e}"
    );
    let uneven = Tensor::i64(vec![5], vec![1; 5]);
    assert!(offsets(2, 0, &uneven).unwrap_err().contains("equal runs"));
    let ty = TensorType::new(dlrm_ir::DType::I64, [Dim::Fixed(6)]);
    assert!(infer(&Op::OffsetsFromLengths { keys: 3, key: 3 }, &[&ty], &[]).is_err());
    let big = Tensor::i32(vec![2], vec![i32::MAX, 1]);
    assert!(offsets(1, 0, &big).unwrap_err().contains("position 1"));
}

/// Indices `[7, 9, 1, 3, 1, 42]` of which the bag bounds `[2, 3, 5]` read
/// positions 2..5 (rows 1, 3, 1); the others are beyond the 5-row table.
fn bounded() -> (Tensor, Tensor, Tensor, Tensor) {
    let table = Tensor::f32(vec![5, 2], (0..10).map(|v| v as f32 * 0.25).collect());
    let idx = Tensor::i64(vec![6], vec![7, 9, 1, 3, 1, 42]);
    let g = Tensor::f32(vec![6, 2], (0..12).map(|v| 1.0 + v as f32).collect());
    let bounds = Tensor::i64(vec![3], vec![2, 3, 5]);
    (table, idx, g, bounds)
}

#[test]
fn sparse_sgd_applies_only_the_indices_in_the_bags() {
    let (t, idx, g, b) = bounded();
    let op = Op::SparseSgd { lr: 0.5 };
    let got = eval(op.clone(), &[&t, &idx, &g, &b]).unwrap().remove(0);
    let mut want = t.to_f32_vec();
    for (pos, row) in [(2, 1), (3, 3), (4, 1)] {
        for j in 0..2 {
            want[row * 2 + j] -= 0.5 * (1.0 + (pos * 2 + j) as f32);
        }
    }
    assert_eq!(got, Tensor::f32(vec![5, 2], want));
    // Without the bounds every index is checked: 7 is not a row.
    let e = eval(op.clone(), &[&t, &idx, &g]).unwrap_err();
    assert!(e.contains('7'), "{e}");
    // Bounds that are not a range of the indices, and an index inside them that
    // is not a row, are errors.
    for bad in [vec![3, 2], vec![0, 7], vec![-1, 2]] {
        let b = Tensor::i64(vec![2], bad);
        assert!(eval(op.clone(), &[&t, &idx, &g, &b]).is_err());
    }
    let b = Tensor::i64(vec![2], vec![5, 6]);
    assert!(eval(op, &[&t, &idx, &g, &b]).unwrap_err().contains("42"));
}

#[test]
fn sparse_adagrad_applies_only_the_indices_in_the_bags() {
    let (t, idx, g, b) = bounded();
    for rowwise in [false, true] {
        let op = Op::SparseAdagrad {
            lr: 0.5,
            eps: 1e-8,
            rowwise,
        };
        let acc = if rowwise {
            Tensor::f32(vec![5], vec![0.0; 5])
        } else {
            Tensor::f32(vec![5, 2], vec![0.0; 10])
        };
        let got = eval(op.clone(), &[&t, &acc, &idx, &g, &b]).unwrap();
        // The definition: the update over the bags' indices alone.
        let idx2 = Tensor::i64(vec![3], vec![1, 3, 1]);
        let g2 = Tensor::f32(vec![3, 2], (4..10).map(|v| 1.0 + v as f32).collect());
        let want = eval(op, &[&t, &acc, &idx2, &g2]).unwrap();
        assert_eq!(got, want, "rowwise={rowwise}");
        // Rows in no bag keep their weights and accumulators (no 0/0).
        let (w, a) = (got[0].to_f32_vec(), got[1].to_f32_vec());
        for r in [0, 2, 4] {
            assert_eq!(&w[r * 2..r * 2 + 2], &t.to_f32_vec()[r * 2..r * 2 + 2]);
            assert!(a.iter().all(|v| v.is_finite()));
        }
    }
}

fn kernel(
    op: &Op,
    params: &[Tensor],
    rest: &[&Tensor],
    jit: bool,
) -> Result<Vec<Tensor>, KernelError> {
    let mut ps = params.to_vec();
    let o = JitOptions::default();
    update_in_place(op, &mut ps, rest, jit.then_some(&o)).expect("an in-place kernel")?;
    Ok(ps)
}

fn interp_upd(op: &Op, params: &[Tensor], rest: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let mut all: Vec<&Tensor> = params.iter().collect();
    all.extend(rest);
    let tys: Vec<TensorType> = params.iter().map(ty).collect();
    let sy = HashMap::new();
    let ctx = EvalCtx {
        syms: &sy,
        comm: &SingleRank,
    };
    eval_op(op, &all, &tys, &ctx)
}

fn same_bits(name: &str, a: &Tensor, b: &Tensor) {
    assert_eq!(a.shape, b.shape, "{name}: shape");
    let (x, y) = (a.to_f32_vec(), b.to_f32_vec());
    if let Some(i) = (0..x.len()).find(|&i| x[i].to_bits() != y[i].to_bits()) {
        panic!("{name}: element {i}: {} vs {}", x[i], y[i]);
    }
}

/// A table of `rows` rows, `n` indices of which positions `lo..hi` are rows
/// (with duplicates) and the others `rows + 7 + i` (not rows), a row gradient.
fn operands(rows: usize, d: usize, n: usize, lo: usize, hi: usize, seed: u64) -> [Tensor; 3] {
    let t = Tensor::f32(vec![rows, d], vals(seed, rows * d));
    let idx: Vec<i64> = (0..n)
        .map(|i| {
            if (lo..hi).contains(&i) {
                ((i * 7 + seed as usize) % rows) as i64
            } else {
                (rows + 7 + i) as i64
            }
        })
        .collect();
    let g = Tensor::f32(vec![n, d], vals(seed + 1, n * d));
    [t, Tensor::i64(vec![n], idx), g]
}

fn ops() -> Vec<(Op, Option<bool>)> {
    let adagrad = |rowwise| Op::SparseAdagrad {
        lr: 0.3,
        eps: 1e-8,
        rowwise,
    };
    vec![
        (Op::SparseSgd { lr: 0.3 }, None),
        (adagrad(false), Some(false)),
        (adagrad(true), Some(true)),
    ]
}

fn params(t: &Tensor, rowwise: Option<bool>) -> Vec<Tensor> {
    let [rows, d] = [t.shape[0], t.shape[1]];
    match rowwise {
        None => vec![t.clone()],
        Some(false) => vec![t.clone(), Tensor::f32(vec![rows, d], vec![0.1; rows * d])],
        Some(true) => vec![t.clone(), Tensor::f32(vec![rows], vec![0.0; rows])],
    }
}

#[test]
fn bounded_updates_agree_and_skip_the_indices_in_no_bag() {
    for (seed, (rows, d, n, lo, hi)) in [(9, 4, 20, 3, 11), (3, 17, 9, 0, 9), (5, 8, 6, 6, 6)]
        .into_iter()
        .enumerate()
    {
        let [t, idx, g] = operands(rows, d, n, lo, hi, seed as u64);
        // Bags over lo..hi: the bounds' inner entries do not matter to the update.
        let bounds = Tensor::i64(vec![3], vec![lo as i64, lo.midpoint(hi) as i64, hi as i64]);
        for (op, rowwise) in ops() {
            let name = format!("{} case {seed}", op.mnemonic());
            let ps = params(&t, rowwise);
            let rest = [&idx, &g, &bounds];
            let want = interp_upd(&op, &ps, &rest).expect("interpreter");
            let reference = kernel(&op, &ps, &rest, false).expect("reference");
            let jit = kernel(&op, &ps, &rest, true).expect("jit");
            for ((r, j), w) in reference.iter().zip(&jit).zip(&want) {
                same_bits(&format!("{name}: reference vs interpreter"), r, w);
                same_bits(&format!("{name}: jit vs interpreter"), j, w);
            }
            // The same as the update over the bags' indices alone.
            let idx2 = Tensor::i64(
                vec![hi - lo],
                idx.to_i64_vec().expect("ints")[lo..hi].to_vec(),
            );
            let g2 = Tensor::f32(vec![hi - lo, d], g.to_f32_vec()[lo * d..hi * d].to_vec());
            let alone = interp_upd(&op, &ps, &[&idx2, &g2]).expect("alone");
            for (a, w) in alone.iter().zip(&want) {
                same_bits(&format!("{name}: bounded vs alone"), w, a);
            }
            // Without the bounds, the indices in no bag are out of the table.
            if lo > 0 || hi < n {
                assert!(interp_upd(&op, &ps, &[&idx, &g]).is_err(), "{name}");
            }
        }
    }
}

#[test]
fn bad_bounds_are_errors_in_every_implementation() {
    let [t, idx, g] = operands(9, 4, 10, 2, 6, 1);
    // Not a range of the 10 indices; reaching an index that is not a row.
    for bad in [vec![4, 3], vec![0, 11], vec![-1, 2], vec![], vec![2, 7]] {
        let len = bad.len();
        let bounds = Tensor::i64(vec![len], bad.clone());
        for (op, rowwise) in ops() {
            let ps = params(&t, rowwise);
            let rest = [&idx, &g, &bounds];
            assert!(interp_upd(&op, &ps, &rest).is_err(), "{bad:?}");
            for jit in [false, true] {
                let mut got = ps.clone();
                let o = JitOptions::default();
                let r = update_in_place(&op, &mut got, &rest, jit.then_some(&o)).expect("a kernel");
                assert!(r.is_err(), "{} {bad:?} jit={jit}", op.mnemonic());
                assert_eq!(got, ps, "{} {bad:?}: parameters changed", op.mnemonic());
            }
        }
    }
}
