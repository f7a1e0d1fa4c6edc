//! The Adagrad updates against hand-computed values (f64 formulas of the
//! definitions in `Op`): dense elementwise and row-wise, weight decay, the sparse
//! update with duplicate indices (coalesced first), the fused update with offsets
//! and mean pooling, the row-shard form, and the errors.

use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::{DType, Dim, Op, Pool, SingleRank, Tensor, TensorType, infer};
use std::collections::HashMap;

fn fixed_ty(t: &Tensor) -> TensorType {
    TensorType::new(t.dtype(), t.shape.iter().map(|&d| Dim::Fixed(d)))
}

fn eval(op: &Op, ins: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let tys: Vec<TensorType> = ins.iter().map(|t| fixed_ty(t)).collect();
    let refs: Vec<&TensorType> = tys.iter().collect();
    let outs = infer(op, &refs, &[]).map_err(|e| format!("infer: {e}"))?;
    eval_op(
        op,
        ins,
        &outs,
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
    Tensor {
        shape: shape.to_vec(),
        data: dlrm_ir::Data::I64(data.to_vec()),
    }
}

fn vals(t: &Tensor) -> Vec<f32> {
    t.to_f32_vec()
}

fn close(got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= 1e-6 * (1.0 + w.abs()),
            "element {i}: got {g}, want {w} ({got:?} vs {want:?})"
        );
    }
}

/// Elementwise Adagrad in f64: (w', acc').
fn ada(w: f64, g: f64, acc: f64, lr: f64, eps: f64) -> (f64, f64) {
    let a = acc + g * g;
    (w - lr * g / (a.sqrt() + eps), a)
}

#[test]
fn dense_adagrad_elementwise_with_weight_decay() {
    let w = f(&[2, 2], &[1.0, -2.0, 0.5, 3.0]);
    let acc = f(&[2, 2], &[0.0, 0.1, 1.0, 0.0]);
    let g = f(&[2, 2], &[0.5, 0.25, -1.0, 0.0]);
    let (lr, eps, wd) = (0.1, 1e-10, 0.01);
    let op = Op::Adagrad {
        lr,
        eps,
        wd,
        rowwise: false,
    };
    let r = eval(&op, &[&w, &acc, &g]).expect("ok");
    let (mut ww, mut aa) = (Vec::new(), Vec::new());
    for i in 0..4 {
        let wi = vals(&w)[i] as f64;
        let gi = vals(&g)[i] as f64 + wd as f64 * wi;
        let (a, b) = ada(wi, gi, vals(&acc)[i] as f64, lr as f64, eps as f64);
        ww.push(a);
        aa.push(b);
    }
    close(&vals(&r[0]), &ww);
    close(&vals(&r[1]), &aa);
    // A zero gradient (no decay) leaves the weight exactly as it was.
    let op0 = Op::Adagrad {
        lr,
        eps,
        wd: 0.0,
        rowwise: false,
    };
    let z = f(&[2, 2], &[0.0; 4]);
    let r0 = eval(&op0, &[&w, &acc, &z]).expect("ok");
    assert_eq!(vals(&r0[0]), vals(&w));
    assert_eq!(vals(&r0[1]), vals(&acc));
}

#[test]
fn dense_adagrad_rowwise_uses_the_mean_square_of_each_row() {
    let w = f(&[2, 3], &[1.0, 2.0, 3.0, -1.0, 0.0, 1.0]);
    let acc = f(&[2], &[0.5, 0.0]);
    let g = f(&[2, 3], &[0.3, -0.6, 0.9, 0.0, 0.0, 0.0]);
    let op = Op::Adagrad {
        lr: 0.2,
        eps: 1e-8,
        wd: 0.0,
        rowwise: true,
    };
    let r = eval(&op, &[&w, &acc, &g]).expect("ok");
    let g0 = [0.3f64, -0.6, 0.9];
    let a0 = 0.5 + g0.iter().map(|x| x * x).sum::<f64>() / 3.0;
    let want_w: Vec<f64> = (0..3)
        .map(|j| [1.0, 2.0, 3.0][j] - 0.2 * g0[j] / (a0.sqrt() + 1e-8))
        .chain([-1.0, 0.0, 1.0])
        .collect();
    close(&vals(&r[0]), &want_w);
    close(&vals(&r[1]), &[a0, 0.0]);
}

#[test]
fn sparse_adagrad_coalesces_duplicates_before_updating() {
    // Row 1 is hit twice: one update with the summed gradient, not two.
    let t = f(&[3, 2], &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
    let acc = f(&[3, 2], &[0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
    let idx = i64t(&[3], &[1, 2, 1]);
    let rows = f(&[3, 2], &[0.5, -1.0, 2.0, 0.0, 0.25, 1.0]);
    let (lr, eps) = (0.1f32, 1e-10f32);
    let op = Op::SparseAdagrad {
        lr,
        eps,
        rowwise: false,
    };
    let r = eval(&op, &[&t, &acc, &idx, &rows]).expect("ok");
    let (l, e) = (lr as f64, eps as f64);
    let (w10, a10) = ada(2.0, 0.75, 1.0, l, e);
    let (w11, a11) = ada(2.0, 0.0, 1.0, l, e);
    let (w20, a20) = ada(3.0, 2.0, 0.0, l, e);
    let (w21, a21) = ada(3.0, 0.0, 0.0, l, e);
    close(&vals(&r[0]), &[1.0, 1.0, w10, w11, w20, w21]);
    close(&vals(&r[1]), &[0.0, 0.0, a10, a11, a20, a21]);

    // Row-wise: one accumulator per row, the mean of the coalesced squares.
    let racc = f(&[3], &[0.0, 1.0, 0.0]);
    let opr = Op::SparseAdagrad {
        lr,
        eps,
        rowwise: true,
    };
    let r = eval(&opr, &[&t, &racc, &idx, &rows]).expect("ok");
    let a1 = 1.0 + (0.75f64 * 0.75 + 0.0) / 2.0;
    let a2 = (4.0f64 + 0.0) / 2.0;
    close(
        &vals(&r[0]),
        &[
            1.0,
            1.0,
            2.0 - l * 0.75 / (a1.sqrt() + e),
            2.0,
            3.0 - l * 2.0 / (a2.sqrt() + e),
            3.0,
        ],
    );
    close(&vals(&r[1]), &[0.0, a1, a2]);
}

#[test]
fn fused_update_equals_sparse_adagrad_of_the_bag_gradient() {
    let t = f(&[4, 2], &[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]);
    let acc_full = f(&[4, 2], &[0.2; 8]);
    let acc_row = f(&[4], &[0.0, 0.3, 0.0, 0.1]);
    let dy = f(&[2, 2], &[1.0, -2.0, 0.5, 0.25]);
    let idx = i64t(&[4], &[0, 3, 3, 1]);
    let off = i64t(&[2], &[0, 3]);
    for rowwise in [false, true] {
        let acc = if rowwise { &acc_row } else { &acc_full };
        let fused = Op::EmbeddingUpdateAdagrad {
            mode: Pool::Mean,
            lr: 0.05,
            eps: 1e-6,
            rowwise,
        };
        let got = eval(&fused, &[&t, acc, &dy, &idx, &off]).expect("ok");
        let bg = eval(
            &Op::EmbeddingBagGrad {
                mode: Pool::Mean,
                last_offset: false,
            },
            &[&dy, &idx, &off],
        )
        .expect("ok");
        let sparse = Op::SparseAdagrad {
            lr: 0.05,
            eps: 1e-6,
            rowwise,
        };
        let want = eval(&sparse, &[&t, acc, &idx, &bg[0]]).expect("ok");
        assert_eq!(vals(&got[0]), vals(&want[0]), "rowwise={rowwise}");
        assert_eq!(vals(&got[1]), vals(&want[1]), "rowwise={rowwise}");
        // Row 2 is untouched, row 3 (twice in bag 0) changed.
        assert_eq!(vals(&got[0])[4..6], vals(&t)[4..6]);
        assert_ne!(vals(&got[0])[6..8], vals(&t)[6..8]);
    }
}

#[test]
fn row_shard_updates_only_its_rows() {
    let table: Vec<f32> = (0..12).map(|x| x as f32 * 0.1).collect();
    let t = f(&[6, 2], &table);
    let acc = f(&[6], &[0.0; 6]);
    let dy = f(&[2, 2], &[1.0, 2.0, -1.0, 0.5]);
    let idx = i64t(&[2, 2], &[0, 4, 5, 2]);
    let whole = Op::EmbeddingUpdateAdagrad {
        mode: Pool::Sum,
        lr: 0.1,
        eps: 1e-10,
        rowwise: true,
    };
    let full = eval(&whole, &[&t, &acc, &dy, &idx]).expect("ok");
    // The shard holding rows 3..6.
    let shard = f(&[3, 2], &table[6..]);
    let sacc = f(&[3], &[0.0; 3]);
    let op = Op::EmbeddingUpdateAdagradRows {
        mode: Pool::Sum,
        lr: 0.1,
        eps: 1e-10,
        rowwise: true,
        lo: 3,
        rows: 6,
    };
    let r = eval(&op, &[&shard, &sacc, &dy, &idx]).expect("ok");
    assert_eq!(vals(&r[0]), vals(&full[0])[6..].to_vec());
    assert_eq!(vals(&r[1]), vals(&full[1])[3..].to_vec());
    // An index outside the whole table is an error even if outside the shard.
    let bad = i64t(&[2, 2], &[0, 4, 6, 2]);
    let e = eval(&op, &[&shard, &sacc, &dy, &bad]).expect_err("an error");
    assert!(e.contains("6"), "{e}");
}

#[test]
fn shape_errors_and_bf16_refusal() {
    let w = f(&[2, 2], &[0.0; 4]);
    let g = f(&[2, 2], &[0.0; 4]);
    let op = Op::Adagrad {
        lr: 0.1,
        eps: 1e-10,
        wd: 0.0,
        rowwise: false,
    };
    let bad_acc = f(&[2], &[0.0; 2]);
    let e = eval(&op, &[&w, &bad_acc, &g]).expect_err("an error");
    assert!(e.contains("same shape"), "{e}");
    let wb = Tensor::from_f32(DType::BF16, vec![2, 2], vec![0.0; 4]);
    let acc = f(&[2, 2], &[0.0; 4]);
    let e = eval(&op, &[&wb, &acc, &g]).expect_err("an error");
    assert!(e.contains("not supported yet"), "{e}");
    let rw = Op::Adagrad {
        lr: 0.1,
        eps: 1e-10,
        wd: 0.0,
        rowwise: true,
    };
    let e = eval(&rw, &[&w, &acc, &g]).expect_err("an error");
    assert!(e.contains("rank 1"), "{e}");
    let t = f(&[3, 2], &[0.0; 6]);
    let tacc = f(&[3, 2], &[0.0; 6]);
    let idx = i64t(&[1], &[3]);
    let rows = f(&[1, 2], &[1.0, 1.0]);
    let sp = Op::SparseAdagrad {
        lr: 0.1,
        eps: 1e-10,
        rowwise: false,
    };
    let e = eval(&sp, &[&t, &tacc, &idx, &rows]).expect_err("an error");
    assert!(e.contains("3"), "{e}");
}
