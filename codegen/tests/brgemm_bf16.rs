//! The backward GEMMs of a bf16 plan (`brgemm_dgrad` and `brgemm_wgrad` on bf16
//! gradients, weights and activations) run on the k-pair kernels (AMX-BF16,
//! AVX-512 BF16) where the CPU has them — `auto`'s pick, and each forced by its
//! `--kernels` choice — and agree with the interpreter. One test in its own
//! binary, so the JIT's pick counts it reads are its own.

use dlrm_codegen::jit::{self, Jit, JitOptions, KernelChoice, micro};
use dlrm_ir::{Act, DType, Op, Tensor};
use half::bf16;
use std::collections::HashMap;

mod common;
use common::interp::{interp, out_types};
use common::vals;

/// `[rows, cols]` of random bf16 values, blocked by `op`.
fn blocked(op: Op, seed: u64, rows: usize, cols: usize) -> Tensor {
    let v = vals(seed, rows * cols)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    interp(&op, &[&Tensor::bf16(vec![rows, cols], v)]).remove(0)
}

/// How many GEMM shapes the global JIT has given to `kernel`.
fn picks(jit: &Jit, kernel: &micro::MicroKernel) -> usize {
    jit.gemm_picks()
        .iter()
        .filter(|(name, _)| name == kernel.name)
        .map(|(_, n)| n)
        .sum()
}

/// Runs `op` under `kernels`: the JIT's results within reassociation of the
/// interpreter's (relative to the largest magnitude, plus one bf16 step for
/// bf16 results), and one more shape given to `kernel`.
fn runs_on(
    jit: &Jit,
    (kernels, kernel): (KernelChoice, &micro::MicroKernel),
    op: &Op,
    ins: &[&Tensor],
) {
    let tys = out_types(op, ins);
    let want = interp(op, ins);
    let before = picks(jit, kernel);
    let opts = JitOptions {
        kernels,
        ..JitOptions::default()
    };
    let got = jit::try_eval(op, ins, &tys, &HashMap::new(), &opts)
        .expect("a JIT kernel")
        .unwrap_or_else(|e| panic!("{op:?}: {e}"));
    assert!(
        picks(jit, kernel) > before,
        "{op:?} under {kernels:?}: {:?}",
        jit.gemm_picks()
    );
    for (g, w) in got.iter().zip(&want) {
        assert_eq!((&g.shape, g.dtype()), (&w.shape, w.dtype()), "{op:?}");
        let (g, w) = (g.to_f32_vec(), w.to_f32_vec());
        let big = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
            let tol = 1e-5 * big + b.abs() / 128.0;
            assert!((a - b).abs() <= tol, "{op:?}: element {i}: {a} vs {b}");
        }
    }
}

/// A 150 -> 96 layer's blocked operands for `s` samples, blocks of 64
/// (outputs) and 32 (inputs, the last one ragged): `(dy, y, x, w)`, all bf16.
fn layer(s: usize) -> [Tensor; 4] {
    layer_n(s, 96)
}

/// [`layer`] with `n` outputs.
fn layer_n(s: usize, n: usize) -> [Tensor; 4] {
    let k = 150;
    let act = |bk, seed, cols| {
        let op = Op::BlockAct {
            bk,
            dtype: DType::BF16,
        };
        blocked(op, seed, s, cols)
    };
    let w = blocked(Op::BlockWeight { bn: 64, bk: 32 }, 4, n, k);
    [act(64, 1, n), act(64, 2, n), act(32, 3, k), w]
}

#[test]
fn bf16_gradients_run_on_the_k_pair_kernels() {
    // `auto` prefers AMX-BF16, then AVX-512 BF16.
    let auto = [&micro::AMX_BF16, &micro::AVX512_BF16]
        .into_iter()
        .find(|k| k.available());
    let Some(auto) = auto else {
        eprintln!("skipped: this CPU has neither AMX-BF16 nor AVX512_BF16");
        return;
    };
    let mut choices = vec![(KernelChoice::Auto, auto)];
    for (choice, kernel) in [
        (KernelChoice::Avx512Bf16, &micro::AVX512_BF16),
        (KernelChoice::AmxBf16, &micro::AMX_BF16),
    ] {
        if kernel.available() {
            choices.push((choice, kernel));
        }
    }
    let jit = Jit::global().expect("a JIT");
    // Each case a new sample count, so a new GEMM shape (picks are per shape).
    let mut s = 300;
    let mut next = || {
        s += 1;
        layer(s)
    };
    for (act, &choice) in [Act::None, Act::Relu]
        .into_iter()
        .flat_map(|a| choices.iter().map(move |c| (a, c)))
    {
        for (mask, dtype) in [
            (Act::None, DType::BF16),
            (Act::None, DType::F32),
            // The fused mask on a bf16 result (masked in f32, then rounded).
            (Act::Relu, DType::BF16),
        ] {
            let [dy, y, x, w] = next();
            let mut ins = vec![&dy, &y, &w, &x];
            if act == Act::None {
                ins.remove(1);
            }
            if mask == Act::None {
                ins.pop();
            }
            runs_on(jit, choice, &Op::BrgemmDgrad { act, mask, dtype }, &ins);
        }
        let [dy, y, x, _] = next();
        let ins = match act {
            Act::None => vec![&dy, &x],
            _ => vec![&dy, &y, &x],
        };
        runs_on(jit, choice, &Op::BrgemmWgrad { act, n: 96 }, &ins);
    }
    // wgrad's `xᵀ` in blocks of 64 samples: whole blocks, a ragged last one
    // (odd: the kernels' single last step), fewer samples than one block.
    for s in [128, 77, 5] {
        let [dy, y, x, _] = layer(s);
        let op = Op::BrgemmWgrad {
            act: Act::Relu,
            n: 96,
        };
        runs_on(jit, choices[0], &op, &[&dy, &y, &x]);
    }
    // Enough N blocks (17, the last one ragged) that each wgrad task packs
    // its own block's `dz` just before its GEMM, on up to 8 threads.
    for (s, act) in [(130, Act::Relu), (131, Act::None)] {
        let n = 16 * 64 + 24;
        let [dy, y, x, _] = layer_n(s, n);
        let ins = match act {
            Act::None => vec![&dy, &x],
            _ => vec![&dy, &y, &x],
        };
        runs_on(jit, choices[0], &Op::BrgemmWgrad { act, n }, &ins);
    }
}
