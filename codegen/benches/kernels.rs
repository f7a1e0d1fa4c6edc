//! Kernel benchmarks (criterion): GFLOP/s (reported as elements/s = FLOP/s) and
//! GB/s of the JIT kernels against the reference kernels.
//!
//! - `gemm/{shape}/{dtype}/{cranelift|native|avx512|avx512bf16|amxbf16|matrixmultiply}`: the
//!   JIT GEMM core at M=2048 (packed B; bf16: `A`, `B` and `C` bf16, the
//!   AVX-512 BF16 kernel where the CPU has it), and `matrixmultiply::sgemm`
//!   (single-threaded; compare with `RAYON_NUM_THREADS=1`). Shapes: K=N in {13,64,128,256,512,1024} plus
//!   the DLRM layer shapes; `BENCH_FULL=1` runs the whole K×N grid.
//! - `brgemm/{op}/{shape}/{dtype}/{cranelift|native|avx512|avx512bf16|amxbf16}`: the blocked `brgemm` (relu),
//!   `brgemm_dgrad` (relu) and `brgemm_wgrad` (relu, with the bias gradient) JIT
//!   ops at M=2048 on the same shapes, blocks as the e-graph picks them (`bk =
//!   min(K, 64)`, `bn = min(N, 64)`), operand copies included; bf16 for the
//!   forward op only.
//! - `embedding_bag/{dim}x{pooling}/{jit|reference}`: batch 2048, 100k-row table.
//! - `interaction/{F}x{D}/reference`: batch 2048, the reference kernel (the JIT one
//!   is in `--bench sparse`).
//!
//! `cargo bench -p dlrm-codegen --bench kernels -- --quick [filter]`

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dlrm_codegen::jit::gemm::{BLayout, Elt, GemmSpec, Micro, Operand, OutBuf, pack_b};
use dlrm_codegen::jit::micro::BPacking;
use dlrm_codegen::jit::micro::avx512bf16::pack_b_pairs_into;
use dlrm_codegen::jit::{Jit, JitOptions};
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

fn gemm_shapes() -> Vec<(usize, usize)> {
    const S: [usize; 6] = [13, 64, 128, 256, 512, 1024];
    if std::env::var_os("BENCH_FULL").is_some() {
        S.iter()
            .flat_map(|&k| S.iter().map(move |&n| (k, n)))
            .collect()
    } else {
        let mut v: Vec<(usize, usize)> = S.iter().map(|&s| (s, s)).collect();
        v.extend([(13, 512), (512, 256), (256, 64), (479, 512), (512, 1024)]);
        v
    }
}

fn bench_gemm(c: &mut Criterion) {
    let jit = Jit::global().expect("jit");
    let m = 2048;
    let mut g = c.benchmark_group("gemm");
    g.sample_size(10);
    for (k, n) in gemm_shapes() {
        let flops = 2 * m * n * k;
        g.throughput(Throughput::Elements(flops as u64));
        let a32 = vals(1, m * k);
        let abf: Vec<bf16> = a32.iter().map(|&x| bf16::from_f32(x)).collect();
        let w = vals(2, n * k);
        let shape = format!("m{m}k{k}n{n}");
        for bf in [false, true] {
            let dt = if bf { "bf16" } else { "f32" };
            let mut micros = vec![Micro::Cranelift];
            if Micro::Native.available() {
                micros.push(Micro::Native);
            }
            if Micro::Native512.available() {
                micros.push(Micro::Native512);
            }
            if bf && Micro::Bf16Dot.available() {
                micros.push(Micro::Bf16Dot);
            }
            if bf && Micro::Amx.available() {
                micros.push(Micro::Amx);
            }
            for micro in micros {
                let spec = GemmSpec {
                    m,
                    n,
                    k,
                    lda: k,
                    acs: 1,
                    ldc: n,
                    a: if bf { Elt::BF16 } else { Elt::F32 },
                    c: if bf { Elt::BF16 } else { Elt::F32 },
                    bias: false,
                    relu: false,
                    mask: false,
                    micro,
                    pack_a: false,
                    b: BLayout::Packed,
                    kb: 0,
                    a_blk: 0,
                    kc: 0,
                };
                let kern = jit.gemm(spec).expect("compiles");
                let bp = if micro.b_packing() == BPacking::KPairs {
                    // `w` rounded to bf16: the kernel's operands are both bf16.
                    let wbf: Vec<bf16> = w.iter().map(|&x| bf16::from_f32(x)).collect();
                    let mut bp = vec![0.0f32; kern.spec().packed_b_len()];
                    pack_b_pairs_into(&mut bp, &wbf, (k, n, 1, k), micro.nr());
                    bp
                } else {
                    pack_b(&w, k, n, 1, k, micro.nr())
                };
                let name = match micro {
                    Micro::Cranelift => "cranelift",
                    Micro::Native => "native",
                    Micro::Native512 => "avx512",
                    Micro::Bf16Dot => "avx512bf16",
                    Micro::Amx => "amxbf16",
                };
                let id = BenchmarkId::new(format!("{shape}/{dt}"), name);
                if bf {
                    let mut out = vec![bf16::ZERO; m * n];
                    g.bench_function(id, |b| {
                        b.iter(|| {
                            kern.run(Operand::BF16(&abf), &bp, None, OutBuf::BF16(&mut out))
                                .expect("runs");
                            black_box(&out);
                        })
                    });
                } else {
                    let mut out = vec![0.0f32; m * n];
                    g.bench_function(id, |b| {
                        b.iter(|| {
                            kern.run(Operand::F32(&a32), &bp, None, OutBuf::F32(&mut out))
                                .expect("runs");
                            black_box(&out);
                        })
                    });
                }
            }
        }
        // Baseline: matrixmultiply (single-threaded BLIS-style sgemm), wᵀ by strides.
        let mut out = vec![0.0f32; m * n];
        g.bench_function(
            BenchmarkId::new(format!("{shape}/f32"), "matrixmultiply"),
            |b| {
                b.iter(|| {
                    // SAFETY: a32 is m×k row-major, w is n×k row-major read as its
                    // k×n transpose (row stride 1, column stride k), out is m×n.
                    unsafe {
                        matrixmultiply::sgemm(
                            m,
                            k,
                            n,
                            1.0,
                            a32.as_ptr(),
                            k as isize,
                            1,
                            w.as_ptr(),
                            1,
                            k as isize,
                            0.0,
                            out.as_mut_ptr(),
                            n as isize,
                            1,
                        );
                    }
                    black_box(&out);
                })
            },
        );
    }
    g.finish();
}

fn syms(b: usize) -> HashMap<String, usize> {
    HashMap::from([("B".to_string(), b)])
}

fn bench_embedding(c: &mut Criterion) {
    let mut g = c.benchmark_group("embedding_bag");
    g.sample_size(10);
    let (batch, rows) = (2048usize, 100_000usize);
    for d in [64usize, 128] {
        for l in [1usize, 100] {
            for dt in [DType::F32, DType::BF16] {
                let table = Tensor::from_f32(dt, vec![rows, d], vals(3, rows * d));
                let mut x = 12345u64;
                let idx: Vec<i64> = (0..batch * l)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        (x % rows as u64) as i64
                    })
                    .collect();
                let idx = Tensor::i64(vec![batch, l], idx);
                let out_ty = TensorType::new(dt, [Dim::batch(), Dim::Fixed(d)]);
                let op = Op::EmbeddingBag {
                    mode: Pool::Sum,
                    last_offset: false,
                };
                let bytes =
                    batch * l * d * dt.size_bytes() + batch * d * dt.size_bytes() + batch * l * 8;
                g.throughput(Throughput::Bytes(bytes as u64));
                let name = format!("d{d}xL{l}/{dt}");
                let ins = [&table, &idx];
                g.bench_function(BenchmarkId::new(&name, "jit"), |b| {
                    b.iter(|| {
                        black_box(
                            dlrm_codegen::jit::try_eval(
                                &op,
                                &ins,
                                std::slice::from_ref(&out_ty),
                                &syms(batch),
                                &JitOptions::default(),
                            )
                            .expect("kernel")
                            .expect("runs"),
                        )
                    })
                });
                if dt == DType::F32 {
                    g.bench_function(BenchmarkId::new(&name, "reference"), |b| {
                        b.iter(|| {
                            black_box(
                                dlrm_codegen::try_eval(
                                    &op,
                                    &ins,
                                    std::slice::from_ref(&out_ty),
                                    &syms(batch),
                                )
                                .expect("kernel")
                                .expect("runs"),
                            )
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
    let batch = 2048usize;
    for (f, d) in [(9usize, 64usize), (27, 128)] {
        let ts: Vec<Tensor> = (0..f)
            .map(|i| Tensor::f32(vec![batch, d], vals(10 + i as u64, batch * d)))
            .collect();
        let ins: Vec<&Tensor> = ts.iter().collect();
        let width = d + f * (f - 1) / 2;
        let out_ty = TensorType::new(DType::F32, [Dim::batch(), Dim::Fixed(width)]);
        let op = Op::Interaction {
            kind: InteractionKind::Dot,
            self_interaction: false,
        };
        g.throughput(Throughput::Elements(
            (batch * f * (f - 1) / 2 * 2 * d) as u64,
        ));
        g.bench_function(BenchmarkId::new(format!("{f}x{d}"), "reference"), |b| {
            b.iter(|| {
                black_box(
                    dlrm_codegen::try_eval(&op, &ins, std::slice::from_ref(&out_ty), &syms(batch))
                        .expect("kernel")
                        .expect("runs"),
                )
            })
        });
    }
    g.finish();
}

fn fixed_ty(dt: DType, shape: &[usize]) -> TensorType {
    TensorType::new(dt, shape.iter().map(|&d| Dim::Fixed(d)))
}

fn float_tensor(dt: DType, shape: Vec<usize>, v: Vec<f32>) -> Tensor {
    match dt {
        DType::BF16 => Tensor::bf16(shape, v.into_iter().map(bf16::from_f32).collect()),
        _ => Tensor::f32(shape, v),
    }
}

fn bench_brgemm(c: &mut Criterion) {
    use dlrm_ir::Act;
    let m = 2048;
    let mut g = c.benchmark_group("brgemm");
    g.sample_size(10);
    let mut choices = vec![dlrm_codegen::KernelChoice::Cranelift];
    if Micro::Native.available() {
        choices.push(dlrm_codegen::KernelChoice::Native);
    }
    if Micro::Native512.available() {
        choices.push(dlrm_codegen::KernelChoice::Avx512);
    }
    if Micro::Bf16Dot.available() {
        choices.push(dlrm_codegen::KernelChoice::Avx512Bf16);
    }
    if Micro::Amx.available() {
        choices.push(dlrm_codegen::KernelChoice::AmxBf16);
    }
    let syms = HashMap::new();
    for (k, n) in gemm_shapes() {
        let (bk, bn) = (k.min(64), n.min(64));
        let (kb, nb) = (k.div_ceil(bk), n.div_ceil(bn));
        g.throughput(Throughput::Elements((2 * m * n * k) as u64));
        let shape = format!("m{m}k{k}n{n}");
        for (op_name, dt) in [
            ("brgemm", DType::F32),
            ("brgemm", DType::BF16),
            ("brgemm_dgrad", DType::F32),
            ("brgemm_wgrad", DType::F32),
        ] {
            let x = float_tensor(dt, vec![kb, m, bk], vals(1, kb * m * bk));
            let w = float_tensor(dt, vec![nb, kb, bk, bn], vals(2, nb * kb * bk * bn));
            let b = Tensor::f32(vec![n], vals(3, n));
            let dy = float_tensor(dt, vec![nb, m, bn], vals(4, nb * m * bn));
            let y = float_tensor(dt, vec![nb, m, bn], vals(5, nb * m * bn));
            let (op, ins, tys) = match op_name {
                "brgemm" => (
                    Op::Brgemm { act: Act::Relu },
                    vec![x, w, b],
                    vec![fixed_ty(dt, &[nb, m, bn])],
                ),
                "brgemm_dgrad" => (
                    Op::BrgemmDgrad {
                        act: Act::Relu,
                        mask: Act::None,
                        dtype: DType::F32,
                    },
                    vec![dy, y, w],
                    vec![fixed_ty(DType::F32, &[kb, m, bk])],
                ),
                _ => (
                    Op::BrgemmWgrad { act: Act::Relu, n },
                    vec![dy, y, x],
                    vec![
                        fixed_ty(DType::F32, &[nb, kb, bk, bn]),
                        fixed_ty(DType::F32, &[n]),
                    ],
                ),
            };
            let refs: Vec<&Tensor> = ins.iter().collect();
            for kernels in &choices {
                let k_pairs = [
                    dlrm_codegen::KernelChoice::Avx512Bf16,
                    dlrm_codegen::KernelChoice::AmxBf16,
                ];
                if k_pairs.contains(kernels) && dt != DType::BF16 {
                    // The same as `avx512` without two bf16 operands.
                    continue;
                }
                let opts = JitOptions {
                    kernels: *kernels,
                    ..JitOptions::default()
                };
                let id = BenchmarkId::new(
                    format!("{op_name}/{shape}/{}", dt.mnemonic()),
                    kernels.name(),
                );
                g.bench_function(id, |bch| {
                    bch.iter(|| {
                        black_box(
                            dlrm_codegen::jit::try_eval(&op, &refs, &tys, &syms, &opts)
                                .expect("a JIT kernel")
                                .expect("runs"),
                        )
                    })
                });
            }
        }
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_gemm,
    bench_brgemm,
    bench_embedding,
    bench_interaction
);
criterion_main!(benches);
