//! Property tests of the JIT GEMM core and the linear ops on it, against an f64
//! reference (tolerance relative to the sum of the terms' magnitudes, plus one
//! bf16 rounding step for bf16 results) and against the reference kernels.
//! Shapes are random and ragged (not multiples of the tile or vector width).

use dlrm_codegen::jit::gemm::{BLayout, Elt, GemmSpec, Micro, Operand, OutBuf, pack_b, pack_bias};
use dlrm_codegen::jit::{Jit, JitOptions, KernelChoice, micro};
use dlrm_ir::{Act, DType, Dim, Op, Tensor, TensorType};
use half::bf16;
use proptest::prelude::*;
use std::collections::HashMap;

mod common;
use common::vals;

/// Every micro-kernel this CPU can run.
fn micros() -> Vec<Micro> {
    [Micro::Cranelift, Micro::Native, Micro::Native512]
        .into_iter()
        .filter(|m| m.available())
        .collect()
}

fn round_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// Checks `got` against f64 `want` with per-element `scale` (Σ|terms|).
fn check(name: &str, got: &[f32], want: &[f64], scale: &[f64], bf16_out: bool) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        let mut tol = 2e-6 * s + 1e-30;
        if bf16_out {
            tol += w.abs() * (1.0 / 128.0);
        }
        assert!(
            ((g as f64) - w).abs() <= tol,
            "{name}: element {i}: got {g}, want {w} (tol {tol})"
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn gemm_case(
    m: usize,
    n: usize,
    k: usize,
    a_bf: bool,
    c_bf: bool,
    bias: bool,
    relu: bool,
    seed: u64,
) {
    let jit = Jit::global().expect("jit");
    // Row-major A (acs = 1), or a transposed view (lda = 1, as wgrad reads dzᵀ).
    let (lda, acs) = if seed % 4 == 3 {
        (1, m + (seed as usize % 3))
    } else {
        (k + (seed as usize % 3), 1)
    };
    let ldc = n + (seed as usize % 2);
    let a32 = vals(
        seed,
        m.saturating_sub(1) * lda + k.saturating_sub(1) * acs + 1,
    );
    let abf = round_bf16(&a32);
    let a_eff: Vec<f32> = if a_bf {
        abf.iter().map(|x| x.to_f32()).collect()
    } else {
        a32.clone()
    };
    // B given as its transpose w[n][k] (like a linear weight).
    let w = vals(seed + 1, n * k);
    let bvec = vals(seed + 2, n);
    let mut want = vec![0.0f64; m * n];
    let mut scale = vec![0.0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = if bias { bvec[j] as f64 } else { 0.0 };
            let mut sc = acc.abs();
            for kk in 0..k {
                let t = a_eff[i * lda + kk * acs] as f64 * w[j * k + kk] as f64;
                acc += t;
                sc += t.abs();
            }
            if relu && acc <= 0.0 {
                acc = 0.0;
            }
            want[i * n + j] = acc;
            scale[i * n + j] = sc;
        }
    }
    let mut outs: Vec<Vec<f32>> = Vec::new();
    for micro in micros() {
        let spec = GemmSpec {
            m,
            n,
            k,
            lda,
            acs,
            ldc,
            a: if a_bf { Elt::BF16 } else { Elt::F32 },
            c: if c_bf { Elt::BF16 } else { Elt::F32 },
            bias,
            relu,
            mask: false,
            micro,
            pack_a: seed % 3 == 1,
            b: BLayout::Packed,
            kb: 0,
            a_blk: 0,
            // The reduction in chunks on some cases (any length: odd ones and
            // ones past `k` are dropped by `normalized` where they cannot run).
            kc: if seed.is_multiple_of(2) { k / 3 } else { 0 },
        };
        let kern = jit.gemm(spec).expect("compiles");
        let bp = pack_b(&w, k, n, 1, k, micro.nr());
        let pb = bias.then(|| pack_bias(&bvec, micro.nr()));
        let a = if a_bf {
            Operand::BF16(&abf)
        } else {
            Operand::F32(&a32)
        };
        let clen = m.saturating_sub(1) * ldc + n;
        // Sentinels in the padding columns must survive.
        let got: Vec<f32> = if c_bf {
            let mut c = vec![bf16::from_f32(7.0); clen];
            kern.run(a, &bp, pb.as_deref(), OutBuf::BF16(&mut c))
                .expect("runs");
            for i in 0..m.saturating_sub(1) {
                for j in n..ldc {
                    assert_eq!(c[i * ldc + j].to_f32(), 7.0, "padding written");
                }
            }
            (0..m)
                .flat_map(|i| (0..n).map(move |j| (i, j)))
                .map(|(i, j)| c[i * ldc + j].to_f32())
                .collect()
        } else {
            let mut c = vec![7.0f32; clen];
            kern.run(a, &bp, pb.as_deref(), OutBuf::F32(&mut c))
                .expect("runs");
            for i in 0..m.saturating_sub(1) {
                for j in n..ldc {
                    assert_eq!(c[i * ldc + j], 7.0, "padding written");
                }
            }
            (0..m)
                .flat_map(|i| (0..n).map(move |j| (i, j)))
                .map(|(i, j)| c[i * ldc + j])
                .collect()
        };
        check(&format!("{spec:?}"), &got, &want, &scale, c_bf);
        outs.push(got);
    }
    // The FMA micro-kernels sum k in order: bitwise the Cranelift kernel's.
    for (o, micro) in outs[1..].iter().zip(&micros()[1..]) {
        assert!(
            o.iter()
                .zip(&outs[0])
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{micro:?} differs from the Cranelift kernel"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn gemm_matches_f64(
        m in 1usize..40,
        n in 1usize..40,
        k in 0usize..45,
        a_bf in any::<bool>(),
        c_bf in any::<bool>(),
        bias in any::<bool>(),
        relu in any::<bool>(),
        seed in 0u64..1000,
    ) {
        gemm_case(m, n, k, a_bf, c_bf, bias, relu, seed);
    }
}

#[test]
fn gemm_larger_shapes_cover_cache_blocks() {
    // m beyond one cache block (and ragged), k long enough for the unrolled loop.
    gemm_case(301, 37, 130, false, false, true, true, 5);
    gemm_case(97, 70, 257, true, true, true, false, 6);
}

#[test]
fn gemm_long_reductions() {
    // k of the DLRM layers' size, ragged: row-major, transposed (seed % 4 == 3)
    // and packed (seed % 3 == 1) A; bf16 A and C; batch-reduce A in blocks of
    // kb; each native kernel bitwise the Cranelift kernel's.
    gemm_case(53, 45, 700, false, false, true, true, 4);
    gemm_case(29, 33, 517, true, false, true, true, 7);
    gemm_case(30, 64, 1029, false, false, false, true, 11);
    gemm_case(14, 20, 300, false, true, true, false, 8);
    for (m, n, k, kb, seed) in [
        (40, 32, 600, 64, 1),
        (37, 16, 513, 50, 2),
        (13, 32, 385, 200, 3),
        // Two AVX-512 panels (four AVX2 ones) of B in place.
        (21, 64, 300, 64, 4),
    ] {
        batch_reduce_case(m, n, k, kb, seed % 2 == 0, true, true, seed);
    }
}

fn syms(s: usize) -> HashMap<String, usize> {
    HashMap::from([("B".to_string(), s)])
}

fn ty(dtype: DType, dims: &[Dim]) -> TensorType {
    TensorType::new(dtype, dims.iter().cloned())
}

fn tensor(dtype: DType, shape: Vec<usize>, seed: u64) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_f32(dtype, shape, vals(seed, n))
}

/// The JIT linear ops against the interpreter (the definition, with bf16
/// rounding of its own), for f32 and bf16 storage and every kernel choice.
fn linear_ops_case(s: usize, k: usize, n: usize, bf: bool, act: Act, seed: u64) {
    let dt = if bf { DType::BF16 } else { DType::F32 };
    let x = tensor(dt, vec![s, k], seed);
    let w = tensor(dt, vec![n, k], seed + 1);
    let b = tensor(dt, vec![n], seed + 2);
    let dz = tensor(dt, vec![s, n], seed + 3);
    let b_dim = Dim::batch();
    let cases: Vec<(Op, Vec<&Tensor>, TensorType)> = vec![
        (
            Op::Linear { act },
            vec![&x, &w, &b],
            ty(dt, &[b_dim.clone(), Dim::Fixed(n)]),
        ),
        (
            Op::LinearDx,
            vec![&dz, &w],
            ty(dt, &[b_dim.clone(), Dim::Fixed(k)]),
        ),
        (
            Op::LinearDw,
            vec![&dz, &x],
            ty(DType::F32, &[Dim::Fixed(n), Dim::Fixed(k)]),
        ),
    ];
    for (op, ins, out_ty) in cases {
        let ctx = dlrm_ir::interp::EvalCtx {
            syms: &syms(s),
            comm: &dlrm_ir::SingleRank,
        };
        let want = dlrm_ir::interp::eval_op(&op, &ins, std::slice::from_ref(&out_ty), &ctx)
            .expect("interpreter");
        // The k-pair kernels (forced) run the bf16 `linear` (two bf16
        // operands); the other ops on AVX-512.
        for kernels in [
            KernelChoice::Cranelift,
            KernelChoice::Native,
            KernelChoice::Auto,
            KernelChoice::Avx512Bf16,
            KernelChoice::AmxBf16,
        ] {
            let available = match kernels {
                KernelChoice::Native => micro::AVX2.available(),
                KernelChoice::Avx512Bf16 => micro::AVX512_BF16.available(),
                KernelChoice::AmxBf16 => micro::AMX_BF16.available(),
                _ => true,
            };
            if !available {
                continue;
            }
            let got = dlrm_codegen::jit::try_eval(
                &op,
                &ins,
                std::slice::from_ref(&out_ty),
                &syms(s),
                &JitOptions {
                    kernels,
                    ..JitOptions::default()
                },
            )
            .expect("a JIT kernel exists")
            .expect("runs");
            assert_eq!(got[0].shape, want[0].shape);
            assert_eq!(got[0].dtype(), want[0].dtype());
            let (g, wv) = (got[0].to_f32_vec(), want[0].to_f32_vec());
            // Scale: the terms' magnitudes are bounded by the reduction length.
            let red = match op {
                Op::Linear { .. } => k,
                Op::LinearDx => n,
                _ => s,
            } as f32;
            let bf_out = got[0].dtype() == DType::BF16;
            for (i, (a, e)) in g.iter().zip(&wv).enumerate() {
                let mut tol = 4e-6 * (red + 1.0);
                if bf_out {
                    tol += e.abs() / 64.0;
                }
                assert!(
                    (a - e).abs() <= tol,
                    "{op:?} {kernels:?} s={s} k={k} n={n} bf16={bf}: element {i}: {a} vs {e}"
                );
            }
        }
    }
}

/// The batch-reduce `A` (blocks of `kb` steps, `a_blk` apart, each row `lda`
/// apart inside them) and an in-place `B` (row stride `ldb`, garbage beyond
/// column `n`), against f64 and bitwise between the micro-kernels; a width that
/// is not whole tiles falls back to a packed `B` (whole tiles, one or
/// several panels, are read in place).
#[allow(clippy::too_many_arguments)]
fn batch_reduce_case(
    m: usize,
    n: usize,
    k: usize,
    kb: usize,
    a_bf: bool,
    bias: bool,
    relu: bool,
    seed: u64,
) {
    let jit = Jit::global().expect("jit");
    let kb = kb.clamp(1, k.max(1));
    let blocks = k.div_ceil(kb).max(1);
    let lda = kb + (seed as usize % 3);
    let a_blk = m * lda + (seed as usize % 5);
    let a32 = vals(seed, blocks * a_blk + m * lda + kb);
    let abf = round_bf16(&a32);
    let a_at = |i: usize, kk: usize| {
        let e = i * lda + (kk / kb) * a_blk + kk % kb;
        if a_bf { abf[e].to_f32() } else { a32[e] }
    };
    let ldb = n + (seed as usize % 7);
    // In place: B[kk][j] at kk·ldb + j; the columns past n hold garbage.
    let b = vals(seed + 1, k.max(1) * ldb + 64);
    let bvec = vals(seed + 2, n);
    let mut want = vec![0.0f64; m * n];
    let mut scale = vec![0.0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = if bias { bvec[j] as f64 } else { 0.0 };
            let mut sc = acc.abs();
            for kk in 0..k {
                let t = a_at(i, kk) as f64 * b[kk * ldb + j] as f64;
                acc += t;
                sc += t.abs();
            }
            if relu && acc <= 0.0 {
                acc = 0.0;
            }
            want[i * n + j] = acc;
            scale[i * n + j] = sc;
        }
    }
    let mut outs: Vec<Vec<f32>> = Vec::new();
    for micro in micros() {
        let kern = jit
            .gemm(GemmSpec {
                m,
                n,
                k,
                lda,
                acs: 1,
                ldc: n,
                a: if a_bf { Elt::BF16 } else { Elt::F32 },
                c: Elt::F32,
                bias,
                relu,
                mask: false,
                micro,
                pack_a: false,
                b: BLayout::InPlace { ldb },
                kb,
                a_blk,
                // Chunks of two batch-reduce blocks where `k` has more.
                kc: 2 * kb,
            })
            .expect("compiles");
        let nr = micro.nr();
        assert_eq!(
            kern.spec().packed_b(),
            !n.is_multiple_of(nr),
            "layout fallback"
        );
        let (bp, pb) = if kern.spec().packed_b() {
            (
                pack_b(&b, k, n, ldb, 1, nr),
                bias.then(|| pack_bias(&bvec, nr)),
            )
        } else {
            (b.clone(), bias.then(|| bvec.clone()))
        };
        let a = if a_bf {
            Operand::BF16(&abf)
        } else {
            Operand::F32(&a32)
        };
        let mut c = vec![0.0f32; m * n];
        kern.run(a, &bp, pb.as_deref(), OutBuf::F32(&mut c))
            .expect("runs");
        check(&format!("{micro:?}"), &c, &want, &scale, false);
        outs.push(c);
    }
    for o in &outs[1..] {
        assert!(
            o.iter()
                .zip(&outs[0])
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "micro-kernels differ"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn batch_reduce_a_and_in_place_b_match_f64(
        m in 1usize..30,
        n in prop_oneof![Just(8usize), Just(16), Just(64), 1usize..40],
        k in 0usize..70,
        kb in 1usize..20,
        a_bf in any::<bool>(),
        bias in any::<bool>(),
        relu in any::<bool>(),
        seed in 0u64..1000,
    ) {
        batch_reduce_case(m, n, k, kb, a_bf, bias, relu, seed);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn linear_ops_match_the_interpreter(
        s in 1usize..50,
        k in 1usize..40,
        n in 1usize..40,
        bf in any::<bool>(),
        act in prop_oneof![Just(Act::None), Just(Act::Relu), Just(Act::Sigmoid)],
        seed in 0u64..1000,
    ) {
        linear_ops_case(s, k, n, bf, act, seed);
    }
}

#[test]
fn spec_constructors_set_the_common_defaults_and_each_setter_its_fields() {
    let spec = GemmSpec::new(7, 5, 3, Elt::BF16, Elt::F32);
    let plain = GemmSpec {
        m: 7,
        n: 5,
        k: 3,
        lda: 3,
        acs: 1,
        ldc: 5,
        a: Elt::BF16,
        c: Elt::F32,
        bias: false,
        relu: false,
        mask: false,
        micro: Micro::Cranelift,
        pack_a: false,
        b: BLayout::Packed,
        kb: 0,
        a_blk: 0,
        kc: 0,
    };
    assert_eq!(spec, plain);
    let biased = GemmSpec {
        bias: true,
        relu: true,
        ..plain
    };
    assert_eq!(spec.with_bias(true), biased);
    let strided = GemmSpec {
        lda: 1,
        acs: 7,
        ..plain
    };
    assert_eq!(spec.a_strides(1, 7), strided);
    // A blocked activation [k/2][7][2]: rows 2 apart, blocks 7·2 apart.
    let blocked = GemmSpec {
        lda: 2,
        kb: 2,
        a_blk: 14,
        ..plain
    };
    assert_eq!(spec.a_strides(1, 7).blocked_a(2), blocked);
}

#[test]
fn kernel_cache_reuses_compiled_code() {
    let jit = Jit::global().expect("jit");
    let spec = GemmSpec::new(11, 5, 3, Elt::F32, Elt::F32);
    jit.gemm(spec).expect("compiles");
    let before = jit.stats();
    jit.gemm(spec).expect("cached");
    let after = jit.stats();
    assert_eq!(after.compiled, before.compiled, "no recompilation");
    assert!(after.hits > before.hits);
}

#[test]
fn wrong_lengths_are_refused_before_the_call() {
    let jit = Jit::global().expect("jit");
    let spec = GemmSpec::new(4, 4, 4, Elt::F32, Elt::F32);
    let k = jit.gemm(spec).expect("compiles");
    let a = vec![1.0f32; 15]; // one short
    let bp = pack_b(&[1.0f32; 16], 4, 4, 1, 4, Micro::Cranelift.nr());
    let mut c = vec![0.0f32; 16];
    let err = k
        .run(Operand::F32(&a), &bp, None, OutBuf::F32(&mut c))
        .expect_err("short A");
    assert!(err.to_string().contains("A holds 15"), "{err}");
    assert!(c.iter().all(|&v| v == 0.0), "nothing written");
}

#[test]
#[ignore = "prints the generated code (DLRM_JIT_DISASM=1)"]
fn disasm_cranelift_tile() {
    let jit = Jit::new().expect("jit");
    let spec = GemmSpec::new(8, 8, 64, Elt::F32, Elt::F32);
    jit.gemm(spec).expect("compiles");
}

#[test]
fn wgrad_reduction_in_chunks_matches_the_interpreter() {
    // More samples than one wgrad chunk (256), ragged, f32 and bf16 operands.
    linear_ops_case(600, 19, 13, false, Act::Relu, 3);
    linear_ops_case(517, 9, 21, true, Act::None, 4);
}
