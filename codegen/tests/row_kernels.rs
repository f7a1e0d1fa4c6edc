//! The native row kernels of the bag forward and the sparse updates
//! (`dlrm_codegen::jit::rows`), each variant this CPU runs forced in turn
//! (AVX2+FMA, AVX-512, and the Cranelift kernels they replace), on random
//! shapes: row widths that are not multiples of the vector width (1 to 200
//! columns, more than one pass of columns), few rows (duplicates in a bag),
//! empty bags, fixed pooling and offsets, i64 and i32 indices, sum, mean and
//! weighted bags, whole tables and row shards, f32 and bf16 bag tables and
//! results, f32 and Split-SGD-BF16 updated tables with f32 and bf16
//! gradients, 1 to 4 threads — every result bitwise equal to the reference
//! kernel's (or, where there is none, the interpreter's: the definition).

use dlrm_codegen::jit::JitOptions;
use dlrm_codegen::jit::rows::{RowKernel, force_row_kernel};
use dlrm_codegen::update_in_place;
use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::{DType, Dim, Op, Pool, SingleRank, Tensor, TensorType};
use rand::Rng;
use std::collections::HashMap;

mod common;
use common::{random_indices, rng, same_bits, vals};

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

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool")
}

/// The variants this CPU runs (the others skipped with a note).
fn variants() -> Vec<RowKernel> {
    RowKernel::ALL
        .into_iter()
        .filter(|k| {
            let ok = k.available();
            if !ok {
                eprintln!("skipped: this CPU has no {}", k.name());
            }
            ok
        })
        .collect()
}

/// Offsets from 0 cutting `n` indices into `s` bags of random sizes, about a
/// fifth of them empty.
fn offsets(r: &mut impl Rng, s: usize, n: usize) -> Tensor {
    let mut cuts: Vec<i64> = (0..s).map(|_| r.random_range(0..=n) as i64).collect();
    cuts.sort_unstable();
    cuts[0] = 0;
    for k in 1..s {
        if r.random_range(0..5) == 0 {
            cuts[k] = cuts[k - 1];
        }
    }
    Tensor::i64(vec![s], cuts)
}

/// `t` with its elements rounded to `dt` (`t` itself when f32).
fn as_dtype(t: Tensor, dt: DType) -> Tensor {
    match dt {
        DType::F32 => t,
        _ => Tensor::from_f32(dt, t.shape.clone(), t.to_f32_vec()),
    }
}

/// `t` (f32) with a few elements subnormal, halfway between two bf16 values
/// (rounding ties of a bf16 result, to even both ways) or large enough for a
/// sum of two to overflow. (No NaN or infinity: the Cranelift kernels and the
/// interpreter may give NaNs of different bits.)
fn specials(mut t: Tensor, seed: u64) -> Tensor {
    let mut v = t.to_f32_vec();
    let odd = f32::from_bits(0x3F81_8000);
    let s = [1e-39, -3e-39, 1.0 + 1.0 / 256.0, odd, 3.0e38];
    for (k, &x) in s.iter().enumerate() {
        let at = (seed as usize * 7 + k * 131) % v.len();
        v[at] = x;
    }
    t.data = Tensor::f32(t.shape.clone(), v).data;
    t
}

/// The element types of the `seed`-th case: f32 for the first 40, then in
/// turn each other mix of f32 and bf16 (`[a, b]`: table and result, or
/// gradient and Split-SGD-BF16 storage).
fn elts(seed: u64) -> [DType; 2] {
    let (f, b) = (DType::F32, DType::BF16);
    match seed {
        0..40 => [f, f],
        _ => [[b, b], [b, f], [f, b]][seed as usize % 3],
    }
}

/// One random bag case: the op, its operands (the table of element type
/// `tab`) and the result type (of element type `out`).
fn bag_case(seed: u64, [tab, out]: [DType; 2]) -> (Op, Vec<Tensor>, TensorType, usize, String) {
    let mut r = rng(seed);
    let d = [1, 5, 16, 17, 31, 64, 100, 129, 200][r.random_range(0..9)];
    let rows = [3, 50, 2000][r.random_range(0..3)];
    let s = r.random_range(1..300);
    let l = r.random_range(1..12);
    let n = s * l;
    let kind = r.random_range(0..4);
    let (var, i32s) = (kind != 0 || r.random_bool(0.3), r.random_bool(0.5));
    let mode = if r.random_bool(0.5) {
        Pool::Mean
    } else {
        Pool::Sum
    };
    let shape = if var { vec![n] } else { vec![s, l] };
    let idx = random_indices(seed + 1, n, rows, i32s, shape);
    let off = offsets(&mut r, s, n);
    let table = Tensor::f32(vec![rows, d], vals(seed + 2, rows * d));
    let (op, mut ins) = match kind {
        1 => {
            let w = Tensor::f32(vec![n], vals(seed + 3, n));
            (Op::EmbeddingBagWeighted, vec![table, idx, off, w])
        }
        2 => {
            let lo = r.random_range(0..rows);
            let held = r.random_range(1..=rows - lo);
            let shard = vals(seed + 2, rows * d)[lo * d..(lo + held) * d].to_vec();
            let t = Tensor::f32(vec![held, d], shard);
            (Op::EmbeddingBagRows { mode, lo, rows }, vec![t, idx, off])
        }
        _ => {
            let op = Op::EmbeddingBag {
                mode,
                last_offset: false,
            };
            (op, vec![table, idx, off])
        }
    };
    if !var {
        ins.truncate(2);
    }
    let mut table = ins.remove(0);
    if [tab, out] != [DType::F32; 2] {
        table = specials(table, seed);
    }
    ins.insert(0, as_dtype(table, tab));
    let out = TensorType::new(out, [Dim::batch(), Dim::Fixed(d)]);
    let name = format!(
        "{op:?} seed={seed} rows={rows} d={d} s={s} l={l} var={var} i32={i32s} {tab:?}->{:?}",
        out.dtype
    );
    (op, ins, out, s, name)
}

#[test]
fn native_bag_sums_match_the_references_on_random_shapes() {
    let ks = variants();
    for seed in 0..100u64 {
        let (op, ins, out, s, name) = bag_case(100 * seed, elts(seed));
        let ins: Vec<&Tensor> = ins.iter().collect();
        let outs = [out];
        let want = interp(&op, &ins, &outs, s);
        let sy = syms(s);
        let reference = dlrm_codegen::try_eval(&op, &ins, &outs, &sy);
        if let Some(r) = reference {
            same_bits(&format!("{name} reference"), &r.expect("runs")[0], &want[0]);
        }
        for &k in &ks {
            force_row_kernel(Some(k));
            for threads in [1, 2 + (seed as usize % 3)] {
                let o = JitOptions::default();
                let got = pool(threads)
                    .install(|| dlrm_codegen::jit::try_eval(&op, &ins, &outs, &sy, &o))
                    .expect("a JIT kernel")
                    .expect("runs");
                same_bits(&format!("{name} {k:?} t={threads}"), &got[0], &want[0]);
            }
        }
        force_row_kernel(None);
    }
}

/// `embedding_bag_q8` (int8 row-wise tables) on the native row kernels this
/// CPU runs, against the interpreter (the op's definition: `embedding_bag` on
/// the dequantized table), on random shapes: every operand form (fixed
/// pooling, offsets, offsets with a last entry, weighted), sum and mean, i64
/// and i32 indices, widths across vector and pass boundaries, 1 to 4 threads.
/// On a CPU with no native row kernel the JIT declines (the interpreter runs);
/// where one runs, at least one comparison a case.
#[test]
fn int8_row_wise_bags_match_the_interpreter_on_random_shapes() {
    use dlrm_ir::ops::embedding_bag_q8::{self, quantize_rows};
    let mut compared = 0;
    for seed in 0..60u64 {
        let (op, mut ins, out, s, name) = bag_case(7000 + 100 * seed, [DType::F32; 2]);
        let (mode, last_offset) = match op {
            Op::EmbeddingBag { mode, last_offset } => (mode, last_offset),
            Op::EmbeddingBagWeighted => (Pool::Sum, false),
            // A shard's case: the whole-table form on its rows.
            Op::EmbeddingBagRows { mode, .. } => (mode, false),
            ref other => panic!("unexpected case {other:?}"),
        };
        let [rows, d] = ins[0].shape[..] else {
            panic!("a table")
        };
        if matches!(op, Op::EmbeddingBagRows { .. }) {
            // Indices were drawn for the whole table: keep them in the shard's rows.
            let held = rows as i64;
            let idx = ins[1].to_i64_vec().expect("indices");
            let shape = ins[1].shape.clone();
            ins[1] = match ins[1].dtype() {
                DType::I32 => Tensor::i32(shape, idx.iter().map(|&i| (i % held) as i32).collect()),
                _ => Tensor::i64(shape, idx.iter().map(|&i| i % held).collect()),
            };
        }
        let q = quantize_rows(&ins[0].to_f32_vec(), d).expect("finite");
        ins[0] = Tensor::u8(vec![rows, d + 8], q);
        // The last-offset form over the same bags: offsets [S+1] ending at N.
        let last = last_offset || (ins.len() == 3 && seed % 3 == 0);
        if last && ins.len() == 3 {
            let mut off = ins[2].to_i64_vec().expect("offsets");
            off.push(ins[1].numel() as i64);
            ins[2] = Tensor::i64(vec![off.len()], off);
        }
        let op = embedding_bag_q8::op(mode, last && ins.len() == 3);
        let name = format!("q8 {name} last={last}");
        let ins: Vec<&Tensor> = ins.iter().collect();
        let outs = [TensorType::new(DType::F32, out.shape.iter().cloned())];
        let want = interp(&op, &ins, &outs, s);
        let sy = syms(s);
        for &k in &variants() {
            force_row_kernel(Some(k));
            for threads in [1, 2 + (seed as usize % 3)] {
                let o = JitOptions::default();
                let got = pool(threads)
                    .install(|| dlrm_codegen::jit::try_eval(&op, &ins, &outs, &sy, &o));
                // The forced kernel is process-wide: under `cargo test` another
                // test may force another one meanwhile, so a declined call (the
                // Cranelift kernels have no int8 rows) is not asserted here.
                if let Some(got) = got {
                    let got = got.expect("runs");
                    same_bits(&format!("{name} {k:?} t={threads}"), &got[0], &want[0]);
                    compared += 1;
                }
            }
        }
        force_row_kernel(None);
    }
    let native = variants().iter().any(|&k| k != RowKernel::Cranelift);
    assert!(!native || compared >= 60, "{compared} native comparisons");
    eprintln!("{compared} native comparisons");
}

/// One random update case: the op, its parameters and other operands (the
/// gradient of element type `grad`; the table Split-SGD-BF16 when `store` is
/// bf16, else either).
fn update_case(seed: u64, [grad, store]: [DType; 2]) -> (Op, Vec<Tensor>, Vec<Tensor>, String) {
    let mut r = rng(seed);
    let d = [1, 7, 16, 33, 64, 100, 129, 200][r.random_range(0..8)];
    let rows = [2, 40, 3000][r.random_range(0..3)];
    let s = r.random_range(1..400);
    let l = r.random_range(1..10);
    let n = s * l;
    let (var, i32s) = (r.random_bool(0.5), r.random_bool(0.5));
    let mode = if r.random_bool(0.5) {
        Pool::Mean
    } else {
        Pool::Sum
    };
    let shape = if var { vec![n] } else { vec![s, l] };
    let idx = random_indices(seed + 1, n, rows, i32s, shape);
    let off = offsets(&mut r, s, n);
    let lr = 0.37;
    let lo = if r.random_bool(0.3) {
        r.random_range(0..rows)
    } else {
        0
    };
    let held = if lo > 0 {
        r.random_range(1..=rows - lo)
    } else {
        rows
    };
    let sharded = held != rows;
    let tab = vals(seed + 2, rows * d)[lo * d..(lo + held) * d].to_vec();
    let kind = match store {
        DType::BF16 => 1,
        _ => r.random_range(0..3),
    };
    let (op, params) = match (kind, sharded) {
        (0, false) => {
            let g = as_dtype(Tensor::f32(vec![n, d], vals(seed + 4, n * d)), grad);
            let t = Tensor::f32(vec![rows, d], tab);
            let name = format!("sparse_sgd seed={seed} rows={rows} d={d} n={n} {grad:?}");
            let idx = random_indices(seed + 1, n, rows, i32s, vec![n]);
            return (Op::SparseSgd { lr }, vec![t], vec![idx, g], name);
        }
        (1, false) => (
            Op::SplitEmbeddingUpdate { mode, lr },
            split(seed, held, d, tab),
        ),
        (1, true) => (
            Op::SplitEmbeddingUpdateRows { mode, lr, lo, rows },
            split(seed, held, d, tab),
        ),
        (_, false) => (
            Op::EmbeddingUpdate { mode, lr },
            vec![Tensor::f32(vec![held, d], tab)],
        ),
        (_, true) => (
            Op::EmbeddingUpdateRows { mode, lr, lo, rows },
            vec![Tensor::f32(vec![held, d], tab)],
        ),
    };
    let dy = as_dtype(Tensor::f32(vec![s, d], vals(seed + 5, s * d)), grad);
    let mut rest = vec![dy, idx];
    if var {
        rest.push(off);
    }
    let name =
        format!("{op:?} seed={seed} rows={rows} d={d} s={s} l={l} var={var} i32={i32s} {grad:?}");
    (op, params, rest, name)
}

/// A Split-SGD-BF16 pair holding `tab` (high halves) and random low halves.
fn split(seed: u64, held: usize, d: usize, tab: Vec<f32>) -> Vec<Tensor> {
    vec![
        Tensor::from_f32(DType::BF16, vec![held, d], tab),
        Tensor::from_f32(DType::BF16, vec![held, d], vals(seed + 3, held * d)),
    ]
}

/// Runs the update `op` on copies of `params` in a pool of `threads`, with
/// the JIT kernel (`jit`) or the reference kernel.
fn update(op: &Op, params: &[Tensor], rest: &[&Tensor], jit: bool, threads: usize) -> Vec<Tensor> {
    let mut ps = params.to_vec();
    let o = JitOptions::default();
    pool(threads)
        .install(|| update_in_place(op, &mut ps, rest, jit.then_some(&o)))
        .expect("an in-place kernel")
        .expect("runs");
    ps
}

#[test]
fn native_row_updates_match_the_references_on_random_shapes() {
    let ks = variants();
    for seed in 0..100u64 {
        let (op, params, rest, name) = update_case(100 * seed + 7, elts(seed));
        let rest: Vec<&Tensor> = rest.iter().collect();
        let reference = update(&op, &params, &rest, false, 1);
        let mut all: Vec<&Tensor> = params.iter().collect();
        all.extend(&rest);
        let tys: Vec<TensorType> = (params.iter())
            .map(|t| TensorType::new(t.dtype(), t.shape.iter().map(|&n| Dim::Fixed(n))))
            .collect();
        let want = interp(&op, &all, &tys, 1);
        for (r, w) in reference.iter().zip(&want) {
            same_bits(&format!("{name} reference vs interpreter"), r, w);
        }
        for &k in &ks {
            force_row_kernel(Some(k));
            for threads in [1, 2 + (seed as usize % 3)] {
                let got = update(&op, &params, &rest, true, threads);
                for (g, r) in got.iter().zip(&reference) {
                    same_bits(&format!("{name} {k:?} t={threads}"), g, r);
                }
            }
        }
        force_row_kernel(None);
    }
}

#[test]
fn the_default_row_kernel_is_the_best_this_cpu_runs() {
    force_row_kernel(None);
    let best = dlrm_codegen::jit::rows::row_kernel();
    assert!(best.available(), "{best:?} runs here");
    let better: Vec<_> = (RowKernel::ALL.iter())
        .skip_while(|&&k| k != best)
        .skip(1)
        .filter(|k| k.available())
        .collect();
    assert!(
        better.is_empty(),
        "{best:?} chosen while {better:?} run here"
    );
}

/// Split-SGD-BF16 updates on tables of random bits (high halves NaN,
/// infinite, subnormal and zero among them; low halves anything) and on row
/// widths around the native kernels' 32-column steps: every variant's two
/// halves bitwise the reference's (itself checked against the interpreter).
#[test]
fn native_split_updates_keep_every_bit_pattern() {
    let ks = variants();
    for seed in 0..40u64 {
        let mut r = rng(5000 + seed);
        let d = [1, 15, 16, 31, 32, 33, 64, 95, 128, 130, 161][r.random_range(0..11)];
        let rows = [1, 3, 50][r.random_range(0..3)];
        let (s, l) = (r.random_range(1..60), r.random_range(1..6));
        let n = s * l;
        let mut bits = |k: usize| -> Vec<half::bf16> {
            (0..k)
                .map(|_| half::bf16::from_bits(r.random_range(0..=u16::MAX)))
                .collect()
        };
        let params = vec![
            Tensor::bf16(vec![rows, d], bits(rows * d)),
            Tensor::bf16(vec![rows, d], bits(rows * d)),
        ];
        let mode = if seed % 2 == 0 { Pool::Sum } else { Pool::Mean };
        let op = Op::SplitEmbeddingUpdate { mode, lr: 0.61 };
        let grad = if seed % 3 == 0 {
            DType::F32
        } else {
            DType::BF16
        };
        let dy = as_dtype(Tensor::f32(vec![s, d], vals(seed + 9, s * d)), grad);
        let idx = random_indices(seed + 11, n, rows, seed % 4 == 0, vec![s, l]);
        let rest = [&dy, &idx];
        let name = format!("split bits seed={seed} rows={rows} d={d} s={s} l={l} {grad:?}");
        let reference = update(&op, &params, &rest, false, 1);
        let mut all: Vec<&Tensor> = params.iter().collect();
        all.extend(rest);
        let tys: Vec<TensorType> = (params.iter())
            .map(|t| TensorType::new(t.dtype(), t.shape.iter().map(|&n| Dim::Fixed(n))))
            .collect();
        let want = interp(&op, &all, &tys, 1);
        for (a, w) in reference.iter().zip(&want) {
            same_bits(&format!("{name} reference vs interpreter"), a, w);
        }
        for &k in &ks {
            force_row_kernel(Some(k));
            for threads in [1, 2] {
                let got = update(&op, &params, &rest, true, threads);
                for (g, a) in got.iter().zip(&reference) {
                    same_bits(&format!("{name} {k:?} t={threads}"), g, a);
                }
            }
        }
        force_row_kernel(None);
    }
}
