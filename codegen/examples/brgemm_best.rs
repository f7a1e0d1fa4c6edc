//! Best-of-N throughput of the blocked GEMM ops against the unblocked linear ops
//! on the same problem (robust on a shared machine: runs interleaved, best kept):
//! `brgemm`/`linear` (relu), `brgemm_dgrad`/`linear_dx`, `brgemm_wgrad`/`linear_dw`,
//! each with the Cranelift and the native micro-kernel. Blocks as the e-graph
//! picks them for dims that 64 divides (`min(dim, 64)`; `BLOCK` to force another,
//! as the e-graph's `block_for` does where 64 would pad, e.g. 160 for 479).
//!
//! `RAYON_NUM_THREADS=2 cargo run --release -p dlrm-codegen --example brgemm_best -- S K N [reps]`
//!
//! Environment: `BLOCK` forces both blocks, `BK`/`BN` one each; `KERNELS=avx512`
//! (or another `--kernels` name) times only that micro-kernel; `CASES=brgemm,linear`
//! only those ops; `PACK=1` (or `0`) forces `A` packed per row chunk (or read in
//! place) where the op can do either ([`JitOptions::pack_a`]); `WIDEN=1` (or
//! `0`) a bf16 `A` read in place from an f32 copy of each row chunk (or
//! widened per tile, [`JitOptions::widen_a`]); `PACK_B=1` (or `0`) packs a
//! weight block wider than one tile once per call (or reads it in place,
//! [`JitOptions::pack_b`]); `FLUSH=1` writes
//! 64 MiB before each timed run, so the operands come from memory as in a
//! training step whose other ops evicted them, not from a warm L2/L3.
//! `DTYPE=bf16` gives the blocked ops bf16 operands and results (wgrad's f32),
//! as a `--precision bf16` plan has them, and times `auto` and the k-pair
//! kernels (AVX-512 BF16, AMX-BF16) the CPU has beside the FMA ones.
//!
//! Each line gives the best wall time and, beside it, the best CPU time of the
//! process (all threads; GFLOP per CPU-second is about one core's rate): on a
//! machine shared with other work the wall time also counts the time others
//! held the cores. The DLRM layers: `2048 1024 1024` (dlrm-mlperf's top MLP),
//! `2048 512 256` (dlrm-kaggle's bottom MLP), `2048 13 512` (the first layer).

use dlrm_codegen::KernelChoice;
use dlrm_codegen::jit::{self, JitOptions, micro};
use dlrm_ir::{Act, DType, Dim, Op, Tensor, TensorType};
use std::collections::HashMap;
use std::time::Instant;

/// The allocator `dlrm-run` uses (freed buffers are reused, not page-faulted
/// back), so the timings include the same allocation costs as a training step.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn vals(seed: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i + seed) * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

/// A timed case: name, op, operands, result types.
type Case<'a> = (&'static str, Op, Vec<&'a Tensor>, Vec<TensorType>);

/// CPU time of this process so far (all threads), in seconds: on a shared
/// machine, unlike wall time, it leaves out the time other processes held
/// the cores (but counts rayon's idle spinning).
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; the clock id is a constant
    // every Linux has.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn ty_of(dtype: DType, shape: &[usize]) -> TensorType {
    TensorType::new(dtype, shape.iter().map(|&d| Dim::Fixed(d)))
}

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().expect("numbers: S K N [reps]"))
        .collect();
    let (s, k, n) = (a[0], a[1], a[2]);
    let reps = a.get(3).copied().unwrap_or(10).max(1);
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|b| b.parse::<usize>().ok())
    };
    let forced = env("BLOCK");
    let bk = env("BK").or(forced).unwrap_or(64).min(k);
    let bn = env("BN").or(forced).unwrap_or(64).min(n);
    let (kb, nb) = (k.div_ceil(bk), n.div_ceil(bn));
    // DTYPE=bf16: the blocked operands and the activations' results in bf16, as
    // a `--precision bf16` plan has them (the bias and wgrad's results f32).
    let bf16 = std::env::var("DTYPE").is_ok_and(|d| d == "bf16");
    let dt = if bf16 { DType::BF16 } else { DType::F32 };
    let t = |shape: Vec<usize>, seed| {
        let len = shape.iter().product();
        Tensor::f32(shape, vals(seed, len))
    };
    let tb = |shape: Vec<usize>, seed| {
        let len = shape.iter().product();
        Tensor::from_f32(dt, shape, vals(seed, len))
    };
    let ty = |shape: &[usize]| ty_of(dt, shape);
    let (x, w, b) = (t(vec![s, k], 1), t(vec![n, k], 2), t(vec![n], 3));
    let dy = t(vec![s, n], 4);
    let (xb, wb) = (tb(vec![kb, s, bk], 1), tb(vec![nb, kb, bk, bn], 2));
    let (dyb, yb) = (tb(vec![nb, s, bn], 4), tb(vec![nb, s, bn], 5));
    let cases: Vec<Case<'_>> = vec![
        (
            "linear",
            Op::Linear { act: Act::Relu },
            vec![&x, &w, &b],
            vec![ty_of(DType::F32, &[s, n])],
        ),
        (
            "brgemm",
            Op::Brgemm { act: Act::Relu },
            vec![&xb, &wb, &b],
            vec![ty(&[nb, s, bn])],
        ),
        (
            "linear_dx",
            Op::LinearDx,
            vec![&dy, &w],
            vec![ty_of(DType::F32, &[s, k])],
        ),
        (
            "brgemm_dgrad",
            Op::BrgemmDgrad {
                act: Act::Relu,
                mask: Act::None,
                dtype: dt,
            },
            vec![&dyb, &yb, &wb],
            vec![ty(&[kb, s, bk])],
        ),
        (
            "linear_dw",
            Op::LinearDw,
            vec![&dy, &x],
            vec![ty_of(DType::F32, &[n, k])],
        ),
        (
            "brgemm_wgrad",
            Op::BrgemmWgrad { act: Act::Relu, n },
            vec![&dyb, &yb, &xb],
            vec![
                ty_of(DType::F32, &[nb, kb, bk, bn]),
                ty_of(DType::F32, &[n]),
            ],
        ),
    ];
    let mut cases = cases;
    if let Ok(only) = std::env::var("CASES") {
        cases.retain(|c| only.split(',').any(|o| o == c.0));
    }
    let choices = kernel_choices(bf16);
    let forms = ["PACK", "WIDEN", "PACK_B"].map(|v| env(v).map(|p| p != 0));
    let flops = 2.0 * (s * n * k) as f64;
    let syms = HashMap::new();
    let mut times = vec![Vec::with_capacity(reps); cases.len() * choices.len()];
    let mut best_cpu = vec![f64::INFINITY; times.len()];
    let mut flush = env("FLUSH")
        .filter(|&f| f != 0)
        .map(|_| vec![0u8; 64 << 20]);
    for _ in 0..reps {
        for (ci, (_, op, ins, tys)) in cases.iter().enumerate() {
            for (ki, &kernels) in choices.iter().enumerate() {
                let opts = options(kernels, forms);
                if let Some(f) = flush.as_mut() {
                    f.iter_mut().for_each(|b| *b = b.wrapping_add(1));
                    std::hint::black_box(&f);
                }
                let (t0, c0) = (Instant::now(), cpu_seconds());
                let r = jit::try_eval(op, ins, tys, &syms, &opts)
                    .expect("a JIT kernel")
                    .expect("runs");
                let (dt, dc) = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);
                std::hint::black_box(r);
                times[ci * choices.len() + ki].push(dt);
                let e = &mut best_cpu[ci * choices.len() + ki];
                *e = e.min(dc);
            }
        }
    }
    let names: Vec<&str> = cases.iter().map(|c| c.0).collect();
    println!(
        "S={s} K={k} N={n} bk={bk} bn={bn}, best of {reps}, {} threads",
        rayon::current_num_threads()
    );
    print_best(&names, &choices, &mut times, &best_cpu, flops);
}

/// The kernels this CPU has (the bf16 ones for `DTYPE=bf16`), or only `KERNELS`.
fn kernel_choices(bf16: bool) -> Vec<KernelChoice> {
    let mut choices = vec![KernelChoice::Cranelift];
    if micro::AVX2.available() {
        choices.push(KernelChoice::Native);
    }
    if micro::AVX512.available() {
        choices.push(KernelChoice::Avx512);
    }
    if bf16 {
        choices.push(KernelChoice::Auto);
        if micro::AVX512_BF16.available() {
            choices.push(KernelChoice::Avx512Bf16);
        }
        if micro::AMX_BF16.available() {
            choices.push(KernelChoice::AmxBf16);
        }
    }
    if let Ok(only) = std::env::var("KERNELS") {
        choices.retain(|c| c.name() == only);
    }
    choices
}

/// One line per case and kernel: the best wall time and its rate, the
/// median wall time (a step runs each op once, so its time is nearer the
/// median than the best), and the best CPU time and its rate.
fn print_best(
    names: &[&str],
    choices: &[KernelChoice],
    times: &mut [Vec<f64>],
    best_cpu: &[f64],
    flops: f64,
) {
    for (ci, name) in names.iter().enumerate() {
        for (ki, kc) in choices.iter().enumerate() {
            let t = &mut times[ci * choices.len() + ki];
            t.sort_by(f64::total_cmp);
            let (dt, med) = (t[0], t[t.len() / 2]);
            let dc = best_cpu[ci * choices.len() + ki];
            println!(
                "{name:>14} {:>9}: {:8.3} ms {:7.1} GFLOP/s, median {:8.3} ms; CPU {:8.3} ms {:7.1} GFLOP/CPU-s",
                kc.name(),
                dt * 1e3,
                flops / dt / 1e9,
                med * 1e3,
                dc * 1e3,
                flops / dc / 1e9
            );
        }
    }
}

/// The JIT options of one timed variant (the reduction chunks timed per shape).
fn options(kernels: KernelChoice, [pack_a, widen_a, pack_b]: [Option<bool>; 3]) -> JitOptions {
    JitOptions {
        kernels,
        pack_a,
        widen_a,
        pack_b,
        ..JitOptions::default()
    }
}
