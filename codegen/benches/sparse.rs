//! Benchmarks (criterion) of the non-GEMM kernels at DLRM shapes, JIT against the
//! reference kernels, fp32 and bf16:
//!
//! - `embedding_bag/d{D}xL{L}/{dtype}/{jit|reference}`: forward, batch 2048,
//!   100k-row table; throughput in bytes (rows gathered + indices + result: GB/s).
//! - `embedding_update/d{D}xL{L}/{f32|split}/{jit|reference}`: the fused race-free
//!   sparse update (`embedding_update`, `split_embedding_update` for Split-SGD-BF16),
//!   in place; bytes = touched rows read and written + dy + indices (GB/s).
//! - `interaction/{F}x{D}/{dtype}/{fwd|bwd}/{jit|reference}`: dot interaction,
//!   batch 2048; throughput in flops (GFLOP/s; 2 per multiply-add forward, 4
//!   backward). The reference kernels are f32-only: bf16 rows have only `jit`.
//!
//! `cargo bench -p dlrm-codegen --bench sparse -- --quick [filter]`

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dlrm_codegen::jit::JitOptions;
use dlrm_ir::{DType, Dim, InteractionKind, Op, Pool, Tensor, TensorType};
use half::bf16;
use std::collections::HashMap;
use std::hint::black_box;

#[path = "../tests/common/mod.rs"]
mod common;
use common::vals;

/// The allocator `dlrm-run` uses (freed buffers are reused, not page-faulted
/// back), so the timings include the same allocation costs as a training step.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: usize = 2048;
const ROWS: usize = 100_000;

fn indices(n: usize, shape: Vec<usize>) -> Tensor {
    let mut x = 12345u64;
    let idx = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % ROWS as u64) as i64
        })
        .collect();
    Tensor::i64(shape, idx)
}

fn syms() -> HashMap<String, usize> {
    HashMap::from([("B".to_string(), BATCH)])
}

fn eval(op: &Op, ins: &[&Tensor], outs: &[TensorType], jit: bool) -> Vec<Tensor> {
    let r = if jit {
        dlrm_codegen::jit::try_eval(op, ins, outs, &syms(), &JitOptions::default())
    } else {
        dlrm_codegen::try_eval(op, ins, outs, &syms())
    };
    r.expect("a kernel").expect("runs")
}

fn bench_embedding_bag(c: &mut Criterion) {
    let mut g = c.benchmark_group("embedding_bag");
    g.sample_size(10);
    for d in [64usize, 128] {
        for l in [1usize, 100] {
            let idx = indices(BATCH * l, vec![BATCH, l]);
            for dt in [DType::F32, DType::BF16] {
                let table = Tensor::from_f32(dt, vec![ROWS, d], vals(3, ROWS * d));
                let out_ty = TensorType::new(dt, [Dim::batch(), Dim::Fixed(d)]);
                let op = Op::EmbeddingBag {
                    mode: Pool::Sum,
                    last_offset: false,
                };
                let es = dt.size_bytes();
                let bytes = BATCH * l * d * es + BATCH * d * es + BATCH * l * 8;
                g.throughput(Throughput::Bytes(bytes as u64));
                let name = format!("d{d}xL{l}/{dt}");
                let ins = [&table, &idx];
                let outs = std::slice::from_ref(&out_ty);
                g.bench_function(BenchmarkId::new(&name, "jit"), |b| {
                    b.iter(|| black_box(eval(&op, &ins, outs, true)))
                });
                if dt == DType::F32 {
                    g.bench_function(BenchmarkId::new(&name, "reference"), |b| {
                        b.iter(|| black_box(eval(&op, &ins, outs, false)))
                    });
                }
            }
        }
    }
    g.finish();
}

fn bench_embedding_update(c: &mut Criterion) {
    let mut g = c.benchmark_group("embedding_update");
    g.sample_size(10);
    let lr = 1e-6;
    for d in [64usize, 128] {
        for l in [1usize, 100] {
            let idx = indices(BATCH * l, vec![BATCH, l]);
            let dy = Tensor::f32(vec![BATCH, d], vals(4, BATCH * d));
            for split in [false, true] {
                let (op, mut params) = if split {
                    let hi = Tensor::from_f32(DType::BF16, vec![ROWS, d], vals(5, ROWS * d));
                    let lo = Tensor::bf16(vec![ROWS, d], vec![bf16::ZERO; ROWS * d]);
                    (
                        Op::SplitEmbeddingUpdate {
                            mode: Pool::Sum,
                            lr,
                        },
                        vec![hi, lo],
                    )
                } else {
                    (
                        Op::EmbeddingUpdate {
                            mode: Pool::Sum,
                            lr,
                        },
                        vec![Tensor::f32(vec![ROWS, d], vals(5, ROWS * d))],
                    )
                };
                let bytes = 2 * BATCH * l * d * 4 + BATCH * d * 4 + BATCH * l * 8;
                g.throughput(Throughput::Bytes(bytes as u64));
                let name = format!("d{d}xL{l}/{}", if split { "split" } else { "f32" });
                let rest = [&dy, &idx];
                for jit in [true, false] {
                    let o = JitOptions::default();
                    let id = BenchmarkId::new(&name, if jit { "jit" } else { "reference" });
                    g.bench_function(id, |b| {
                        b.iter(|| {
                            dlrm_codegen::update_in_place(
                                &op,
                                &mut params,
                                &rest,
                                jit.then_some(&o),
                            )
                            .expect("a kernel")
                            .expect("runs");
                            black_box(&params);
                        })
                    });
                }
            }
        }
    }
    g.finish();
}

fn bench_interaction(c: &mut Criterion) {
    let mut g = c.benchmark_group("interaction");
    g.sample_size(10);
    for (f, d) in [(9usize, 64usize), (27, 128)] {
        let pairs = f * (f - 1) / 2;
        let width = d + pairs;
        for dt in [DType::F32, DType::BF16] {
            let ts: Vec<Tensor> = (0..f)
                .map(|i| Tensor::from_f32(dt, vec![BATCH, d], vals(10 + i as u64, BATCH * d)))
                .collect();
            let dr = Tensor::from_f32(dt, vec![BATCH, width], vals(9, BATCH * width));
            for bwd in [false, true] {
                let (op, ins, outs) = if bwd {
                    let mut ins: Vec<&Tensor> = vec![&dr];
                    ins.extend(ts.iter());
                    let outs: Vec<TensorType> = (0..f)
                        .map(|_| TensorType::new(dt, [Dim::batch(), Dim::Fixed(d)]))
                        .collect();
                    (
                        Op::InteractionGrad {
                            kind: InteractionKind::Dot,
                            self_interaction: false,
                        },
                        ins,
                        outs,
                    )
                } else {
                    (
                        Op::Interaction {
                            kind: InteractionKind::Dot,
                            self_interaction: false,
                        },
                        ts.iter().collect(),
                        vec![TensorType::new(dt, [Dim::batch(), Dim::Fixed(width)])],
                    )
                };
                let per = if bwd { 4 } else { 2 };
                g.throughput(Throughput::Elements((BATCH * pairs * d * per) as u64));
                let name = format!("{f}x{d}/{dt}/{}", if bwd { "bwd" } else { "fwd" });
                g.bench_function(BenchmarkId::new(&name, "jit"), |b| {
                    b.iter(|| black_box(eval(&op, &ins, &outs, true)))
                });
                if dt == DType::F32 {
                    g.bench_function(BenchmarkId::new(&name, "reference"), |b| {
                        b.iter(|| black_box(eval(&op, &ins, &outs, false)))
                    });
                }
            }
        }
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_embedding_bag,
    bench_embedding_update,
    bench_interaction
);
criterion_main!(benches);
