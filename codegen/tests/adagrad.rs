//! Property tests of the Adagrad updates (`adagrad`, `sparse_adagrad`,
//! `embedding_update_adagrad` and its row-shard form): the in-place kernels (JIT
//! where there is one, and the reference kernels) against the interpreter, the
//! definition, on random ragged shapes with duplicate indices, f32 and bf16
//! gradients, elementwise and row-wise accumulators. All must be bitwise equal.

use dlrm_codegen::jit::JitOptions;
use dlrm_codegen::{KernelError, update_in_place};
use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::{DType, Dim, Op, Pool, SingleRank, Tensor, TensorType};
use proptest::prelude::*;
use std::collections::HashMap;

mod common;
use common::{random_indices, same_bits, vals};

fn ty_of(t: &Tensor) -> TensorType {
    TensorType::new(t.dtype(), t.shape.iter().map(|&n| Dim::Fixed(n)))
}

fn run(
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

/// Checks the kernels against the interpreter and returns the updated params.
fn check(name: &str, op: &Op, params: &[Tensor], rest: &[&Tensor], s: usize) -> Vec<Tensor> {
    let reference = run(op, params, rest, false).expect("reference");
    let jit = run(op, params, rest, true).expect("jit");
    let mut all: Vec<&Tensor> = params.iter().collect();
    all.extend(rest);
    let tys: Vec<TensorType> = params.iter().map(ty_of).collect();
    let sy = HashMap::from([("B".to_string(), s)]);
    let ctx = EvalCtx {
        syms: &sy,
        comm: &SingleRank,
    };
    let want = eval_op(op, &all, &tys, &ctx).expect("interpreter");
    for ((r, j), w) in reference.iter().zip(&jit).zip(&want) {
        same_bits(&format!("{name} reference vs interpreter"), r, w);
        same_bits(&format!("{name} jit vs reference"), j, r);
    }
    reference
}

fn offsets(seed: u64, s: usize, n: usize) -> Tensor {
    let mut cuts: Vec<i64> = vals(seed, s)
        .iter()
        .map(|v| ((v + 1.0) * 0.5 * n as f32) as i64)
        .collect();
    cuts.sort_unstable();
    if let Some(c) = cuts.first_mut() {
        *c = 0;
    }
    Tensor::i64(vec![s], cuts)
}

/// Non-negative accumulator values (some zero).
fn accs(seed: u64, n: usize) -> Vec<f32> {
    vals(seed, n).iter().map(|v| v.max(0.0) * 2.0).collect()
}

#[allow(clippy::too_many_arguments)]
fn fused_case(
    rows: usize,
    d: usize,
    s: usize,
    l: usize,
    var: bool,
    mean: bool,
    rowwise: bool,
    i32s: bool,
    bf_grad: bool,
    seed: u64,
    cut: Option<(usize, usize)>,
) {
    let shard = cut.map(|(a, b)| {
        let lo = a % rows;
        (lo, 1 + b % (rows - lo))
    });
    let n = s * l;
    let idx = random_indices(seed, n, rows, i32s, if var { vec![n] } else { vec![s, l] });
    let off = offsets(seed + 1, s, n);
    let gdt = if bf_grad { DType::BF16 } else { DType::F32 };
    let dy = Tensor::from_f32(gdt, vec![s, d], vals(seed + 2, s * d));
    let mode = if mean { Pool::Mean } else { Pool::Sum };
    let (lo, held) = shard.unwrap_or((0, rows));
    let tab = vals(seed + 3, rows * d)[lo * d..(lo + held) * d].to_vec();
    let acc = if rowwise {
        Tensor::f32(vec![held], accs(seed + 4, rows)[lo..lo + held].to_vec())
    } else {
        Tensor::f32(
            vec![held, d],
            accs(seed + 4, rows * d)[lo * d..(lo + held) * d].to_vec(),
        )
    };
    let (lr, eps) = (0.37, 1e-6);
    let op = match shard {
        None => Op::EmbeddingUpdateAdagrad {
            mode,
            lr,
            eps,
            rowwise,
        },
        Some(_) => Op::EmbeddingUpdateAdagradRows {
            mode,
            lr,
            eps,
            rowwise,
            lo,
            rows,
        },
    };
    let params = vec![Tensor::f32(vec![held, d], tab), acc];
    let mut rest: Vec<&Tensor> = vec![&dy, &idx];
    if var {
        rest.push(&off);
    }
    let name = format!(
        "rows={rows} d={d} s={s} l={l} var={var} mean={mean} rowwise={rowwise} i32={i32s} bfg={bf_grad} shard={shard:?}"
    );
    check(&name, &op, &params, &rest, s);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn fused_adagrad_agrees(
        rows in 1usize..40,
        d in 1usize..20,
        s in 0usize..9,
        l in 0usize..5,
        var: bool,
        mean: bool,
        rowwise: bool,
        i32s: bool,
        bf_grad: bool,
        seed in 0u64..1000,
        cut in proptest::option::of((0usize..300, 0usize..300)),
    ) {
        fused_case(rows, d, s, l, var, mean, rowwise, i32s, bf_grad, seed, cut);
    }

    #[test]
    fn sparse_adagrad_agrees(
        rows in 1usize..30,
        d in 1usize..12,
        n in 0usize..40,
        rowwise: bool,
        seed in 0u64..1000,
    ) {
        let idx = random_indices(seed, n, rows, false, vec![n]);
        let g = Tensor::f32(vec![n, d], vals(seed + 1, n * d));
        let acc = if rowwise {
            Tensor::f32(vec![rows], accs(seed + 2, rows))
        } else {
            Tensor::f32(vec![rows, d], accs(seed + 2, rows * d))
        };
        let params = vec![Tensor::f32(vec![rows, d], vals(seed + 3, rows * d)), acc];
        let op = Op::SparseAdagrad { lr: 0.05, eps: 1e-10, rowwise };
        check(&format!("sparse rows={rows} d={d} n={n} rowwise={rowwise}"), &op, &params, &[&idx, &g], 1);
    }

    #[test]
    fn dense_adagrad_agrees(
        r in 1usize..50,
        d in 1usize..40,
        rowwise: bool,
        decay: bool,
        bf_grad: bool,
        seed in 0u64..1000,
    ) {
        let gdt = if bf_grad { DType::BF16 } else { DType::F32 };
        let g = Tensor::from_f32(gdt, vec![r, d], vals(seed, r * d));
        let acc = if rowwise {
            Tensor::f32(vec![r], accs(seed + 1, r))
        } else {
            Tensor::f32(vec![r, d], accs(seed + 1, r * d))
        };
        let params = vec![Tensor::f32(vec![r, d], vals(seed + 2, r * d)), acc];
        let wd = if decay { 0.01 } else { 0.0 };
        let op = Op::Adagrad { lr: 0.1, eps: 1e-10, wd, rowwise };
        check(&format!("dense r={r} d={d} rowwise={rowwise} wd={wd}"), &op, &params, &[&g], 1);
    }
}

/// Large enough for one row range per thread (the race-free split), with many
/// duplicates: the kernels still equal the interpreter bit for bit.
#[test]
fn multi_task_update_is_bitwise_the_definition() {
    for rowwise in [false, true] {
        fused_case(
            300, 64, 256, 20, false, true, rowwise, false, false, 7, None,
        );
        fused_case(
            300,
            64,
            256,
            20,
            true,
            false,
            rowwise,
            true,
            false,
            8,
            Some((50, 120)),
        );
    }
}

/// A bad index fails before anything is written; a bf16 table is refused.
#[test]
fn errors_leave_the_state_unchanged() {
    let op = Op::EmbeddingUpdateAdagrad {
        mode: Pool::Sum,
        lr: 0.1,
        eps: 1e-10,
        rowwise: true,
    };
    let t = Tensor::f32(vec![4, 2], vals(1, 8));
    let acc = Tensor::f32(vec![4], vec![0.5; 4]);
    let dy = Tensor::f32(vec![2, 2], vals(2, 4));
    let bad = Tensor::i64(vec![2, 2], vec![0, 1, 3, 4]);
    for jit in [false, true] {
        let mut ps = vec![t.clone(), acc.clone()];
        let o = JitOptions::default();
        let err = update_in_place(&op, &mut ps, &[&dy, &bad], jit.then_some(&o))
            .expect("an in-place kernel")
            .expect_err("an error");
        assert!(err.to_string().contains('4'), "{err}");
        same_bits("table", &ps[0], &t);
        same_bits("accumulator", &ps[1], &acc);
    }
    let tb = Tensor::from_f32(DType::BF16, vec![4, 2], vals(1, 8));
    let ok = Tensor::i64(vec![2, 2], vec![0, 1, 3, 2]);
    let err = run(&op, &[tb, acc], &[&dy, &ok], false).expect_err("an error");
    assert!(err.to_string().contains("not supported yet"), "{err}");
}
