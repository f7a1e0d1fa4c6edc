//! Split-Adagrad (`split_adagrad`, `split_embedding_update_adagrad`, the module
//! ops of `dlrm_ir::ops::split_adagrad`):
//! - the interpreter: the joined `(hi', lo')` equal the f32 update (`adagrad`,
//!   `embedding_update_adagrad`, `embedding_update_adagrad_rows`) of the joined
//!   master bit for bit, and the accumulators equal too;
//! - the in-place kernels (reference, and the JIT path: the JIT's Adagrad row
//!   kernel on each joined master of the table update) equal the interpreter bit
//!   for bit, with 1 to 4 threads, on random shapes (fixed and offset bags, sum
//!   and mean, row-wise and elementwise, row shards, duplicate indices, f32 and
//!   bf16 gradients).

use dlrm_codegen::jit::JitOptions;
use dlrm_codegen::update_in_place;
use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::ops::split_adagrad::{join1, split_adagrad, split_embedding_update_adagrad, split1};
use dlrm_ir::{AdagradHyper, DType, Data, Dim, Op, Pool, SingleRank, Tensor, TensorType};
use half::bf16;
use proptest::prelude::*;
use std::collections::HashMap;

mod common;
use common::{random_indices, same_bits, vals};

fn ty_of(t: &Tensor) -> TensorType {
    TensorType::new(t.dtype(), t.shape.iter().map(|&n| Dim::Fixed(n)))
}

fn interp(op: &Op, params: &[Tensor], rest: &[&Tensor]) -> Vec<Tensor> {
    let mut all: Vec<&Tensor> = params.iter().collect();
    all.extend(rest);
    let tys: Vec<TensorType> = params.iter().map(ty_of).collect();
    let sy = HashMap::new();
    let ctx = EvalCtx {
        syms: &sy,
        comm: &SingleRank,
    };
    eval_op(op, &all, &tys, &ctx).expect("interpreter")
}

/// The halves of an f32 master.
fn halves(w: &Tensor) -> (Tensor, Tensor) {
    let (h, l): (Vec<bf16>, Vec<bf16>) = w.to_f32_vec().into_iter().map(split1).unzip();
    (
        Tensor::bf16(w.shape.clone(), h),
        Tensor::bf16(w.shape.clone(), l),
    )
}

/// The raw bits of a bf16 tensor.
fn bits(t: &Tensor) -> &[bf16] {
    match &t.data {
        Data::BF16(v) => v,
        _ => panic!("not bf16"),
    }
}

/// The f32 master of two halves.
fn joined(hi: &Tensor, lo: &Tensor) -> Tensor {
    let w = bits(hi)
        .iter()
        .zip(bits(lo))
        .map(|(&h, &l)| join1(h, l))
        .collect();
    Tensor::f32(hi.shape.clone(), w)
}

/// Checks the split op against the f32 op on the master (the interpreter) and
/// the reference kernel against the interpreter with 1 to 4 threads.
fn check(name: &str, split: &Op, plain: &Op, master: &Tensor, acc: &Tensor, rest: &[&Tensor]) {
    let want = interp(plain, &[master.clone(), acc.clone()], rest);
    let (hi, lo) = halves(master);
    let params = vec![hi, lo, acc.clone()];
    let got = interp(split, &params, rest);
    same_bits(
        &format!("{name}: joined master"),
        &joined(&got[0], &got[1]),
        &want[0],
    );
    same_bits(&format!("{name}: accumulator"), &got[2], &want[1]);
    let jit = JitOptions::default();
    for threads in 1..=4 {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a pool");
        for (path, opts) in [("reference", None), ("jit", Some(&jit))] {
            let mut ps = params.clone();
            pool.install(|| update_in_place(split, &mut ps, rest, opts))
                .expect("an in-place kernel")
                .expect("the kernel runs");
            for (k, (a, b)) in ps.iter().zip(&got).enumerate() {
                let what = format!("{name}: {path} kernel result {k}, {threads} threads");
                same_bits(&what, a, b);
                if k < 2 {
                    // The halves as raw bits (a low half may be a NaN pattern).
                    let same = bits(a)
                        .iter()
                        .zip(bits(b))
                        .all(|(p, q)| p.to_bits() == q.to_bits());
                    assert!(same, "{what}: bits");
                }
            }
        }
    }
}

/// Non-negative accumulator values (some zero).
fn accs(seed: u64, n: usize) -> Vec<f32> {
    vals(seed, n).iter().map(|v| v.max(0.0) * 2.0).collect()
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

/// A table case: `[rows, d]` (its shard `cut` when given), `s` bags of `l`.
#[allow(clippy::too_many_arguments)]
fn table_case(
    (rows, d, s, l): (usize, usize, usize, usize),
    var: bool,
    mean: bool,
    rowwise: bool,
    bf_grad: bool,
    seed: u64,
    cut: Option<(usize, usize)>,
) {
    let shard = cut.map(|(a, b)| {
        let lo = a % rows;
        (lo, 1 + b % (rows - lo))
    });
    let n = s * l;
    let idx = random_indices(seed, n, rows, false, if var { vec![n] } else { vec![s, l] });
    let off = offsets(seed + 1, s, n);
    let gdt = if bf_grad { DType::BF16 } else { DType::F32 };
    let dy = Tensor::from_f32(gdt, vec![s, d], vals(seed + 2, s * d));
    let mode = if mean { Pool::Mean } else { Pool::Sum };
    let (lo, held) = shard.unwrap_or((0, rows));
    let master = Tensor::f32(vec![held, d], vals(seed + 3, held * d));
    let acc = if rowwise {
        Tensor::f32(vec![held], accs(seed + 4, held))
    } else {
        Tensor::f32(vec![held, d], accs(seed + 4, held * d))
    };
    let h = AdagradHyper {
        lr: 0.37,
        eps: 1e-6,
        rowwise,
    };
    let plain = match shard {
        None => Op::EmbeddingUpdateAdagrad {
            mode,
            lr: h.lr,
            eps: h.eps,
            rowwise,
        },
        Some(_) => Op::EmbeddingUpdateAdagradRows {
            mode,
            lr: h.lr,
            eps: h.eps,
            rowwise,
            lo,
            rows,
        },
    };
    let split = split_embedding_update_adagrad(mode, h, lo, rows);
    let mut rest: Vec<&Tensor> = vec![&dy, &idx];
    if var {
        rest.push(&off);
    }
    let name = format!(
        "rows={rows} d={d} s={s} l={l} var={var} mean={mean} rowwise={rowwise} bfg={bf_grad} shard={shard:?}"
    );
    check(&name, &split, &plain, &master, &acc, &rest);
}

fn dense_case(r: usize, d: usize, rowwise: bool, wd: f32, bf_grad: bool, seed: u64) {
    let gdt = if bf_grad { DType::BF16 } else { DType::F32 };
    let g = Tensor::from_f32(gdt, vec![r, d], vals(seed, r * d));
    let acc = if rowwise {
        Tensor::f32(vec![r], accs(seed + 1, r))
    } else {
        Tensor::f32(vec![r, d], accs(seed + 1, r * d))
    };
    let master = Tensor::f32(vec![r, d], vals(seed + 2, r * d));
    let h = AdagradHyper {
        lr: 0.1,
        eps: 1e-10,
        rowwise,
    };
    let plain = Op::Adagrad {
        lr: h.lr,
        eps: h.eps,
        wd,
        rowwise,
    };
    let name = format!("dense r={r} d={d} rowwise={rowwise} wd={wd} bfg={bf_grad}");
    check(&name, &split_adagrad(h, wd), &plain, &master, &acc, &[&g]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn split_table_update_is_the_f32_update_of_the_master(
        rows in 1usize..40,
        d in 1usize..20,
        s in 0usize..9,
        l in 0usize..5,
        var: bool,
        mean: bool,
        rowwise: bool,
        bf_grad: bool,
        seed in 0u64..1000,
        cut in proptest::option::of((0usize..300, 0usize..300)),
    ) {
        table_case((rows, d, s, l), var, mean, rowwise, bf_grad, seed, cut);
    }

    #[test]
    fn split_dense_update_is_the_f32_update_of_the_master(
        r in 1usize..50,
        d in 1usize..40,
        rowwise: bool,
        decay: bool,
        bf_grad: bool,
        seed in 0u64..1000,
    ) {
        dense_case(r, d, rowwise, if decay { 0.01 } else { 0.0 }, bf_grad, seed);
    }
}

/// Large enough for several tasks (one row range per thread, several dense
/// chunks), with many duplicate indices.
#[test]
fn multi_task_split_updates_are_bitwise_the_definition() {
    for rowwise in [false, true] {
        table_case((300, 64, 64, 8), true, false, rowwise, false, 7, None);
        table_case(
            (300, 64, 64, 8),
            false,
            true,
            rowwise,
            true,
            8,
            Some((100, 150)),
        );
        dense_case(700, 100, rowwise, 0.0, false, 9);
    }
    dense_case(300, 256, false, 0.01, true, 10);
}
