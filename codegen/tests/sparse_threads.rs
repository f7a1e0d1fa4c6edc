//! The row-fetching JIT kernels in thread pools of 1 to 4 threads, on work
//! large enough that the sparse updates split the table among several tasks
//! (each task walks only the positions of its own rows, sorted by task first)
//! and the bag forward among blocks of bags (each kernel call fetching rows
//! ahead up to its block's end): the fused updates (f32 and Split-SGD-BF16
//! tables, whole and row shards, sum and mean, fixed pooling and offsets with
//! empty bags, i64 and i32 indices, few rows: many duplicates), `sparse_sgd`
//! and `embedding_bag` bitwise equal to the reference kernels, and those to the
//! interpreter (the definition).

use dlrm_codegen::jit::JitOptions;
use dlrm_codegen::update_in_place;
use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::{DType, Dim, Op, Pool, SingleRank, Tensor, TensorType};
use std::collections::HashMap;

mod common;
use common::{random_indices, same_bits, vals};

fn syms(s: usize) -> HashMap<String, usize> {
    HashMap::from([("B".to_string(), s)])
}

fn interp(op: &Op, ins: &[&Tensor], outs: &[TensorType], s: usize) -> Vec<Tensor> {
    let sy = syms(s);
    let ctx = EvalCtx {
        syms: &sy,
        comm: &SingleRank,
    };
    eval_op(op, ins, outs, &ctx).expect("the interpreter runs")
}

fn ty_of(t: &Tensor) -> TensorType {
    TensorType::new(t.dtype(), t.shape.iter().map(|&n| Dim::Fixed(n)))
}

/// Offsets from 0 cutting `n` indices into `s` bags, every third one empty.
fn offsets(s: usize, n: usize) -> Tensor {
    let mut off = Vec::with_capacity(s);
    let mut at = 0;
    for b in 0..s {
        off.push(at as i64);
        if b % 3 != 2 {
            at = (at + n / s.max(1) + b % 5).min(n);
        }
    }
    Tensor::i64(vec![s], off)
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool")
}

/// Runs the update `op` on copies of `params` in a pool of `threads`, with the
/// JIT kernel (`jit`) or the reference kernel.
fn update(op: &Op, params: &[Tensor], rest: &[&Tensor], jit: bool, threads: usize) -> Vec<Tensor> {
    let mut ps = params.to_vec();
    let o = JitOptions::default();
    pool(threads)
        .install(|| update_in_place(op, &mut ps, rest, jit.then_some(&o)))
        .expect("an in-place kernel")
        .expect("runs");
    ps
}

/// One fused update case: `s` bags of `l` indices (or offsets), row width `d`,
/// the table `rows` rows (a shard of the rows `lo..lo + held` when `shard`).
#[derive(Clone, Copy, Debug)]
struct Upd {
    rows: usize,
    d: usize,
    s: usize,
    l: usize,
    var: bool,
    mean: bool,
    i32s: bool,
    split: bool,
    shard: Option<(usize, usize)>,
}

fn update_case(c: Upd, seed: u64) {
    let n = c.s * c.l;
    let shape = if c.var { vec![n] } else { vec![c.s, c.l] };
    let idx = random_indices(seed, n, c.rows, c.i32s, shape);
    let off = offsets(c.s, n);
    let dy = Tensor::f32(vec![c.s, c.d], vals(seed + 1, c.s * c.d));
    let mode = if c.mean { Pool::Mean } else { Pool::Sum };
    let (lo, held) = c.shard.unwrap_or((0, c.rows));
    let tab = vals(seed + 2, c.rows * c.d)[lo * c.d..(lo + held) * c.d].to_vec();
    let (lr, rows) = (0.37, c.rows);
    let op = match (c.split, c.shard) {
        (false, None) => Op::EmbeddingUpdate { mode, lr },
        (false, Some(_)) => Op::EmbeddingUpdateRows { mode, lr, lo, rows },
        (true, None) => Op::SplitEmbeddingUpdate { mode, lr },
        (true, Some(_)) => Op::SplitEmbeddingUpdateRows { mode, lr, lo, rows },
    };
    let params = match c.split {
        false => vec![Tensor::f32(vec![held, c.d], tab)],
        true => vec![
            Tensor::from_f32(DType::BF16, vec![held, c.d], tab),
            Tensor::from_f32(DType::BF16, vec![held, c.d], vals(seed + 3, held * c.d)),
        ],
    };
    let mut rest: Vec<&Tensor> = vec![&dy, &idx];
    if c.var {
        rest.push(&off);
    }
    let mut all: Vec<&Tensor> = params.iter().collect();
    all.extend(&rest);
    let tys: Vec<TensorType> = params.iter().map(ty_of).collect();
    let want = interp(&op, &all, &tys, c.s);
    for threads in 1..=4 {
        let name = format!("{c:?} seed={seed} threads={threads}");
        let reference = update(&op, &params, &rest, false, threads);
        let jit = update(&op, &params, &rest, true, threads);
        for ((r, j), w) in reference.iter().zip(&jit).zip(&want) {
            same_bits(&format!("{name} reference vs interpreter"), r, w);
            same_bits(&format!("{name} jit vs reference"), j, r);
        }
    }
}

#[test]
fn fused_updates_split_among_tasks_match_the_references() {
    // n·d ≥ 2^14 everywhere: one row range per thread.
    let base = Upd {
        rows: 37,
        d: 64,
        s: 300,
        l: 5,
        var: false,
        mean: false,
        i32s: false,
        split: false,
        shard: None,
    };
    let cases = [
        base,
        Upd { mean: true, ..base },
        Upd {
            var: true,
            mean: true,
            i32s: true,
            ..base
        },
        Upd {
            rows: 5000,
            d: 19,
            s: 700,
            l: 3,
            var: true,
            ..base
        },
        Upd {
            split: true,
            shard: Some((9, 20)),
            ..base
        },
        Upd {
            rows: 1000,
            d: 33,
            split: true,
            var: true,
            mean: true,
            ..base
        },
        Upd {
            rows: 3,
            d: 8,
            s: 1000,
            l: 4,
            shard: Some((1, 2)),
            ..base
        },
    ];
    for (k, c) in cases.into_iter().enumerate() {
        update_case(c, 10 * k as u64);
    }
}

#[test]
fn sparse_sgd_split_among_tasks_matches_the_references() {
    for (rows, d, s, l, i32s) in [(50, 40, 200, 3, false), (4000, 16, 500, 4, true)] {
        let n = s * l;
        let idx = random_indices(7, n, rows, i32s, vec![s, l]);
        let g = Tensor::f32(vec![s, l, d], vals(8, n * d));
        let params = vec![Tensor::f32(vec![rows, d], vals(9, rows * d))];
        let op = Op::SparseSgd { lr: 0.5 };
        let want = interp(&op, &[&params[0], &idx, &g], &[ty_of(&params[0])], s);
        for threads in 1..=4 {
            let name = format!("sparse_sgd rows={rows} d={d} s={s} threads={threads}");
            let reference = update(&op, &params, &[&idx, &g], false, threads);
            let jit = update(&op, &params, &[&idx, &g], true, threads);
            same_bits(&format!("{name} reference"), &reference[0], &want[0]);
            same_bits(&format!("{name} jit"), &jit[0], &reference[0]);
        }
    }
}

#[test]
fn embedding_bags_in_blocks_match_the_references() {
    for (rows, d, s, l, var, mean, i32s) in [
        (1000, 64, 1500, 20, false, false, false),
        (40, 37, 900, 9, true, true, true),
        (300, 70, 1200, 1, true, false, false),
    ] {
        let n = s * l;
        let shape = if var { vec![n] } else { vec![s, l] };
        let idx = random_indices(3, n, rows, i32s, shape);
        let off = offsets(s, n);
        let table = Tensor::f32(vec![rows, d], vals(4, rows * d));
        let op = Op::EmbeddingBag {
            mode: if mean { Pool::Mean } else { Pool::Sum },
            last_offset: false,
        };
        let mut ins = vec![&table, &idx];
        if var {
            ins.push(&off);
        }
        let out = [TensorType::new(DType::F32, [Dim::batch(), Dim::Fixed(d)])];
        let want = interp(&op, &ins, &out, s);
        let sy = syms(s);
        for threads in 1..=4 {
            let name = format!("embedding_bag rows={rows} d={d} s={s} var={var} t={threads}");
            let p = pool(threads);
            let o = JitOptions::default();
            let jit = p
                .install(|| dlrm_codegen::jit::try_eval(&op, &ins, &out, &sy, &o))
                .expect("a JIT kernel")
                .expect("runs");
            let reference = p
                .install(|| dlrm_codegen::try_eval(&op, &ins, &out, &sy))
                .expect("a reference kernel")
                .expect("runs");
            same_bits(&format!("{name} reference"), &reference[0], &want[0]);
            same_bits(&format!("{name} jit"), &jit[0], &reference[0]);
        }
    }
}
