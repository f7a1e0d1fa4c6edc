//! Best-of-N time of the dot interaction, forward (`interaction`) and backward
//! (`interaction_grad`): the Cranelift kernels against the AVX-512 ones
//! (`--kernels cranelift` / `avx512`; and `native`, the AVX2 ones, where the
//! CPU has AVX2), interleaved (robust on a shared
//! machine), f32, batch `S`. Each time is also given as GFLOP/s (the
//! multiply-adds: `2·S·D` per kept pair forward, per (operand, partner) pair
//! backward) and as a share of this machine's FMA peak: every thread of the pool
//! running independent `vfmadd231ps` chains (16 `zmm`, or 12 `ymm` without
//! AVX-512 F), timed once per round between the kernels, best of the rounds.
//! Beside the peak, each direction's memory time: its reads and writes alone,
//! in the kernels' order, without the arithmetic ([`memory_time`]), best of the
//! rounds, and the rate at which a kernel taking that long would run; a kernel
//! near 100% of it is bound by memory, not by its FMAs (the backward at 27×128
//! reads 27 operands and writes 27 gradients of the same size: about 6.5 flops
//! a byte). A third case, `blocked`, is the forward as the plans run it:
//! `interaction_blocked`, its rows written into the next layer's column
//! blocks of `BK` (64 by default; dlrm-mlperf's plans block its 479 columns
//! by 160).
//!
//! `cargo run --release -p dlrm-codegen --example interaction_best -- [F D S reps]`
//! (default 9 64 2048 30: dlrm-small's interaction).

use dlrm_codegen::KernelChoice;
use dlrm_codegen::jit::{self, JitOptions, native_dot};
use dlrm_ir::{Dim, InteractionKind, Op, Tensor, TensorType, interaction_width};
use std::collections::HashMap;
use std::time::Instant;

/// The allocator `dlrm-run` uses, so the timings include the same allocation
/// costs as a training step.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The kernel choices timed: Cranelift, the AVX2 kernels (`native`) and the
/// AVX-512 ones where the CPU has them; `KERNELS=avx512,native` keeps only
/// those named (`cranelift`, `native`, `avx512`), e.g. to compare two builds'
/// AVX-512 kernels alone.
fn kernel_choices() -> Vec<KernelChoice> {
    let mut choices = vec![KernelChoice::Cranelift];
    if native_dot::avx2::available() {
        choices.push(KernelChoice::Native);
    }
    if native_dot::available() {
        choices.push(KernelChoice::Avx512);
    }
    if let Ok(only) = std::env::var("KERNELS") {
        choices.retain(|c| only.split(',').any(|k| k == c.name()));
    }
    choices
}

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().expect("numbers: F D S [reps]"))
        .collect();
    let (f, d, s) = (
        a.first().copied().unwrap_or(9),
        a.get(1).copied().unwrap_or(64),
        a.get(2).copied().unwrap_or(2048),
    );
    let reps = a.get(3).copied().unwrap_or(30);
    let kind = InteractionKind::Dot;
    let width = interaction_width(kind, false, &vec![d; f]);
    let val = |seed: usize, n: usize| -> Vec<f32> {
        (0..n)
            .map(|i| (((i + seed) * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect()
    };
    let ops: Vec<Tensor> = (0..f)
        .map(|i| Tensor::f32(vec![s, d], val(i, s * d)))
        .collect();
    let dr = Tensor::f32(vec![s, width], val(99, s * width));
    let ty = |w: usize| TensorType::f32([Dim::Fixed(s), Dim::Fixed(w)]);
    let self_interaction = false;
    let bwd = Op::InteractionGrad {
        kind,
        self_interaction,
    };
    let bwd_ins: Vec<&Tensor> = std::iter::once(&dr).chain(&ops).collect();
    let bwd_tys = vec![ty(d); f];
    let partners = if self_interaction {
        f
    } else {
        f.saturating_sub(1)
    };
    // Multiply-adds: the forward's one per kept pair and column, the
    // backward's one per (operand, partner) and column.
    let pairs = width - d;
    let flops = [
        2.0 * (s * d * pairs) as f64,
        2.0 * (s * d * f * partners) as f64,
        2.0 * (s * d * pairs) as f64,
    ];
    let fwd = Op::Interaction {
        kind,
        self_interaction,
    };
    let fwd_ins: Vec<&Tensor> = ops.iter().collect();
    let choices = kernel_choices();
    let syms = HashMap::new();
    // The forward as the plans run it (`interaction_blocked`, its rows
    // written into the next layer's column blocks of `BK`, 64 by default).
    let bk: usize = std::env::var("BK")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&b| b > 0)
        .unwrap_or(64);
    let kb = width.div_ceil(bk);
    let blocked = dlrm_ir::ops::interaction_blocked::op(self_interaction, bk, dlrm_ir::DType::F32);
    let blocked_ty = TensorType::f32([Dim::Fixed(kb), Dim::Fixed(s), Dim::Fixed(bk)]);
    let cases: [(&str, &Op, &[&Tensor], Vec<TensorType>); 3] = [
        ("forward", &fwd, &fwd_ins, vec![ty(width)]),
        ("backward", &bwd, &bwd_ins, bwd_tys),
        ("blocked", &blocked, &fwd_ins, vec![blocked_ty]),
    ];
    let mut best = vec![f64::INFINITY; cases.len() * choices.len()];
    let mut peak = 0f64;
    // Each direction's inputs (as slices) and result lengths.
    let traffic: [(Vec<&[f32]>, Vec<usize>); 3] = [
        (slices(&fwd_ins), vec![s * width]),
        (slices(&bwd_ins), vec![s * d; f]),
        (slices(&fwd_ins), vec![kb * s * bk]),
    ];
    let mut mem = [f64::INFINITY; 3];
    for _ in 0..reps {
        peak = peak.max(fma_peak());
        for (m, (ins, outs)) in mem.iter_mut().zip(&traffic) {
            *m = m.min(memory_time(ins, outs, s));
        }
        for (ci, (_, op, ins, tys)) in cases.iter().enumerate() {
            for (ki, &kernels) in choices.iter().enumerate() {
                let opts = JitOptions {
                    kernels,
                    ..JitOptions::default()
                };
                let t0 = Instant::now();
                let r = jit::try_eval(op, ins, tys, &syms, &opts)
                    .expect("a JIT kernel")
                    .expect("runs");
                let dt = t0.elapsed().as_secs_f64();
                std::hint::black_box(r);
                let e = &mut best[ci * choices.len() + ki];
                *e = e.min(dt);
            }
        }
    }
    println!(
        "F={f} D={d} S={s}, best of {reps}, {} threads; FMA peak {peak:.1} GFLOP/s",
        rayon::current_num_threads()
    );
    let names: Vec<&str> = cases.iter().map(|c| c.0).collect();
    report(&names, &choices, (&flops, &mem, &best), peak);
}

/// One line per case: its memory time and the rate a kernel taking that long
/// would run at; then one per kernel choice: its best time, GFLOP/s, share of
/// the FMA peak and of the memory rate (`best[case · choices + choice]`).
fn report(
    names: &[&str],
    choices: &[KernelChoice],
    (flops, mem, best): (&[f64], &[f64], &[f64]),
    peak: f64,
) {
    for (ci, name) in names.iter().enumerate() {
        let bound = flops[ci] / mem[ci] / 1e9;
        println!(
            "{name:>9}    memory: {:7.3} ms for its reads and writes alone: {bound:6.1} GFLOP/s, \
             {:4.1}% of the FMA peak",
            mem[ci] * 1e3,
            100.0 * bound / peak
        );
        for (ki, kc) in choices.iter().enumerate() {
            let t = best[ci * choices.len() + ki];
            let gflops = flops[ci] / t / 1e9;
            println!(
                "{name:>9} {:>9}: {:7.3} ms, {gflops:6.1} GFLOP/s, {:4.1}% of the FMA peak, \
                 {:4.1}% of the memory rate",
                kc.name(),
                t * 1e3,
                100.0 * gflops / peak,
                100.0 * mem[ci] / t
            );
        }
    }
}

/// The data of f32 tensors.
fn slices<'t>(ts: &[&'t Tensor]) -> Vec<&'t [f32]> {
    ts.iter().map(|t| t.as_f32().expect("f32 inputs")).collect()
}

/// Seconds for the kernels' memory traffic without their arithmetic: per block
/// of `SB` samples (the kernels' order), every input's rows read and every
/// result's rows written, results freshly allocated as the kernels' are; the
/// blocks shared out over the pool. `ins` and `outs` are `[S][w]` row-major
/// (`outs` gives each result's length). A kernel that takes about this long
/// is bound by memory, not by its FMAs.
fn memory_time(ins: &[&[f32]], outs: &[usize], s: usize) -> f64 {
    use rayon::prelude::*;
    use std::mem::MaybeUninit;
    const SB: usize = 16;
    let t0 = Instant::now();
    let mut res: Vec<Vec<f32>> = outs.iter().map(|&n| Vec::with_capacity(n)).collect();
    // Block b's rows of every result.
    let mut blocks: Vec<Vec<&mut [MaybeUninit<f32>]>> =
        (0..s.div_ceil(SB)).map(|_| Vec::new()).collect();
    for (v, &n) in res.iter_mut().zip(outs) {
        let w = n / s;
        for (b, rows) in v.spare_capacity_mut()[..n].chunks_mut(SB * w).enumerate() {
            blocks[b].push(rows);
        }
    }
    let sum: f32 = blocks
        .into_par_iter()
        .enumerate()
        .map(|(b, outs)| {
            // 64 independent lanes: the adds keep up with memory.
            let mut acc = [0f32; 64];
            for v in ins {
                let w = v.len() / s;
                for row in v[b * SB * w..((b + 1) * SB * w).min(v.len())].chunks(64) {
                    for (a, &x) in acc.iter_mut().zip(row) {
                        *a += x;
                    }
                }
            }
            for o in outs {
                o.fill(MaybeUninit::new(1.0));
            }
            acc.iter().sum::<f32>()
        })
        .sum();
    let dt = t0.elapsed().as_secs_f64();
    std::hint::black_box((sum, res));
    dt
}

/// The FMA rate of the pool in GFLOP/s, one timed run: every thread runs
/// independent multiply-add chains.
fn fma_peak() -> f64 {
    use rayon::prelude::*;
    const ITERS: usize = 2_000_000;
    let threads = rayon::current_num_threads();
    let t0 = Instant::now();
    let lanes: usize = (0..threads)
        .into_par_iter()
        .map(|_| fma_chains(ITERS))
        .sum();
    // Each counted lane did ITERS multiply-adds: 2 flops.
    2.0 * (ITERS * lanes) as f64 / t0.elapsed().as_secs_f64() / 1e9
}

/// Runs `iters` rounds of independent FMA chains; returns how many f32
/// lanes ran (16 `zmm` × 16 with AVX-512 F, else 12 `ymm` × 8, else 4 scalar
/// chains).
fn fma_chains(iters: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512 F.
            return unsafe { chains512(iters) };
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA.
            return unsafe { chains256(iters) };
        }
    }
    let mut acc = [1.0f32; 4];
    for _ in 0..iters {
        for a in &mut acc {
            *a = a.mul_add(0.999_999, 1e-7);
        }
    }
    std::hint::black_box(acc);
    4
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn chains512(iters: usize) -> usize {
    use std::arch::x86_64::*;
    let (m, c) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    let mut acc = [_mm512_set1_ps(1.0); 16];
    for _ in 0..iters {
        for a in &mut acc {
            *a = _mm512_fmadd_ps(*a, m, c);
        }
    }
    std::hint::black_box(acc);
    16 * 16
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn chains256(iters: usize) -> usize {
    use std::arch::x86_64::*;
    let (m, c) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); 12];
    for _ in 0..iters {
        for a in &mut acc {
            *a = _mm256_fmadd_ps(*a, m, c);
        }
    }
    std::hint::black_box(acc);
    12 * 8
}
