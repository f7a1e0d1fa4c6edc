//! Time per call of the fused sparse embedding update on large tables: the f32
//! table (`embedding_update`) against the Split-SGD-BF16 one
//! (`split_embedding_update`, bf16 high and low halves), with f32 and with
//! bf16 gradients, at dlrm-intel-small's shape by default (tables of 1M rows
//! of 64 columns, batch 2048, pooling 100, sum) — random rows, so every
//! update reads and writes rows from memory, as in a training step. Each
//! variant has its own tables (`TABLES` of them, used in turn, so no call
//! finds the previous call's rows in the cache); the variants are
//! interleaved, and each reports the best and the median of its samples
//! (robust on a shared machine) and the bytes of rows read and written per
//! second at the best.
//!
//! `cargo run --release -p dlrm-codegen --example update_best -- [samples] [rows] [d]`

use dlrm_codegen::jit::JitOptions;
use dlrm_ir::{DType, Op, Pool, Tensor};
use half::bf16;
use std::time::Instant;

/// The allocator `dlrm-run` uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: usize = 2048;
const POOLING: usize = 100;
/// Tables per variant, updated in turn.
const TABLES: usize = 2;

/// `n` random indices below `rows` (xorshift from `seed`).
fn indices(seed: u64, n: usize, rows: usize) -> Tensor {
    let mut x = seed | 1;
    let idx = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % rows as u64) as i64
        })
        .collect();
    Tensor::i64(vec![BATCH, n / BATCH], idx)
}

/// `n` small values (the table's starting weights, the gradients).
fn values(seed: u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u64 ^ seed).wrapping_mul(2654435761) % 2001) as f32 * 1e-3 - 1.0)
        .collect()
}

/// One variant: its op, its tables' parameters and its gradient.
struct Variant {
    name: &'static str,
    op: Op,
    tables: Vec<Vec<Tensor>>,
    dy: Tensor,
    times: Vec<f64>,
}

fn variant(name: &'static str, split: bool, grad: DType, rows: usize, d: usize) -> Variant {
    let (mode, lr) = (Pool::Sum, 1e-6);
    let tables = (0..TABLES)
        .map(|t| {
            let w = values(t as u64, rows * d);
            if split {
                let lo = vec![bf16::from_bits(0x1234); rows * d];
                vec![
                    Tensor::from_f32(DType::BF16, vec![rows, d], w),
                    Tensor::bf16(vec![rows, d], lo),
                ]
            } else {
                vec![Tensor::f32(vec![rows, d], w)]
            }
        })
        .collect();
    let op = if split {
        Op::SplitEmbeddingUpdate { mode, lr }
    } else {
        Op::EmbeddingUpdate { mode, lr }
    };
    let dy = Tensor::from_f32(grad, vec![BATCH, d], values(99, BATCH * d));
    Variant {
        name,
        op,
        tables,
        dy,
        times: Vec::new(),
    }
}

fn main() {
    let arg = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let (samples, rows, d) = (arg(1, 15), arg(2, 1_000_000), arg(3, 64));
    let idx: Vec<Tensor> = (0..TABLES)
        .map(|t| indices(7 + t as u64, BATCH * POOLING, rows))
        .collect();
    let mut vs = [
        variant("f32 table, f32 grad", false, DType::F32, rows, d),
        variant("f32 table, bf16 grad", false, DType::BF16, rows, d),
        variant("split table, f32 grad", true, DType::F32, rows, d),
        variant("split table, bf16 grad", true, DType::BF16, rows, d),
    ];
    let o = JitOptions::default();
    for s in 0..=samples {
        for v in vs.iter_mut() {
            let t = s % TABLES;
            let rest = [&v.dy, &idx[t]];
            let start = Instant::now();
            dlrm_codegen::update_in_place(&v.op, &mut v.tables[t], &rest, Some(&o))
                .expect("an in-place kernel")
                .expect("runs");
            // The first round compiles the kernels and faults the pages in.
            if s > 0 {
                v.times.push(start.elapsed().as_secs_f64());
            }
        }
    }
    // Rows read and written: 4 bytes per element either way (f32, or two
    // bf16 halves).
    let bytes = (2 * BATCH * POOLING * d * 4) as f64;
    println!("rows {rows}, d {d}, batch {BATCH}, pooling {POOLING}, {samples} samples");
    for v in vs.iter_mut() {
        v.times.sort_by(f64::total_cmp);
        let (best, median) = (v.times[0], v.times[v.times.len() / 2]);
        println!(
            "{:24} best {:7.3} ms  median {:7.3} ms  {:6.1} GB/s",
            v.name,
            best * 1e3,
            median * 1e3,
            bytes / best / 1e9
        );
    }
}
