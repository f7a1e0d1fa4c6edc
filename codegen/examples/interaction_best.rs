//! Best-of-N time of the dot interaction's backward (`interaction_grad`): the
//! Cranelift kernel against the AVX-512 one (`--kernels cranelift` / `avx512`),
//! interleaved (robust on a shared machine), f32, batch `S`. (The forward has
//! only the Cranelift kernel.)
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
    let bwd = Op::InteractionGrad {
        kind,
        self_interaction: false,
    };
    let bwd_ins: Vec<&Tensor> = std::iter::once(&dr).chain(&ops).collect();
    let bwd_tys = vec![ty(d); f];
    let mut choices = vec![KernelChoice::Cranelift];
    if native_dot::available() {
        choices.push(KernelChoice::Avx512);
    }
    let syms = HashMap::new();
    let cases: [(&str, &Op, &[&Tensor], Vec<TensorType>); 1] =
        [("backward", &bwd, &bwd_ins, bwd_tys)];
    let mut best = vec![f64::INFINITY; cases.len() * choices.len()];
    for _ in 0..reps {
        for (ci, (_, op, ins, tys)) in cases.iter().enumerate() {
            for (ki, &kernels) in choices.iter().enumerate() {
                let opts = JitOptions {
                    kernels,
                    pack_a: None,
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
        "F={f} D={d} S={s}, best of {reps}, {} threads",
        rayon::current_num_threads()
    );
    for (ci, (name, ..)) in cases.iter().enumerate() {
        for (ki, kc) in choices.iter().enumerate() {
            println!(
                "{name:>9} {:>9}: {:7.3} ms",
                kc.name(),
                best[ci * choices.len() + ki] * 1e3
            );
        }
    }
}
