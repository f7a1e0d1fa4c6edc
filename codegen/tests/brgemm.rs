//! The blocked GEMM family (`block_act`, `unblock_act`, `brgemm`, `brgemm_dgrad`,
//! `brgemm_wgrad`): the reference kernels against the interpreter (bitwise: they
//! compute the same f32 operations in the same order), and the JIT kernels
//! against the reference kernels (float reassociation: one FMA per term,
//! tolerance relative to the sum of the terms' magnitudes), both micro-kernels,
//! f32 and bf16 storage, random ragged shapes (blocks that do not divide the
//! dims, dims that are not multiples of the tiles or vector width).

use dlrm_codegen::jit::{self, JitOptions, KernelChoice, micro};
use dlrm_ir::{Act, DType, Data, Dim, Op, Tensor, TensorType};
use half::bf16;
use proptest::prelude::*;
use std::collections::HashMap;

mod common;
use common::interp::{interp, out_types};
use common::vals;

fn tensor(shape: Vec<usize>, v: Vec<f32>, dt: DType) -> Tensor {
    match dt {
        DType::BF16 => Tensor::bf16(shape, v.into_iter().map(bf16::from_f32).collect()),
        _ => Tensor::f32(shape, v),
    }
}

/// A blocked activation `[ceil(k/b), s, b]` of random values (zero padding), by
/// the interpreter's `block_act`.
fn blocked(seed: u64, s: usize, k: usize, b: usize, dt: DType) -> Tensor {
    let x = tensor(vec![s, k], vals(seed, s * k), DType::F32);
    interp(&Op::BlockAct { bk: b, dtype: dt }, &[&x]).remove(0)
}

/// A blocked weight `[ceil(n/bn), ceil(k/bk), bk, bn]` (zero padding).
fn blocked_w(seed: u64, n: usize, k: usize, bn: usize, bk: usize, dt: DType) -> Tensor {
    let w = tensor(vec![n, k], vals(seed, n * k), dt);
    interp(&Op::BlockWeight { bn, bk }, &[&w]).remove(0)
}

/// One random problem of the family: `(op, operands)`.
struct Problem {
    op: Op,
    ins: Vec<Tensor>,
}

#[allow(clippy::too_many_arguments)]
fn problem(
    which: usize,
    act: Act,
    s: usize,
    n: usize,
    k: usize,
    bn: usize,
    bk: usize,
    dt: DType,
    seed: u64,
) -> Problem {
    let x = blocked(seed, s, k, bk, dt);
    let w = blocked_w(seed + 1, n, k, bn, bk, dt);
    let bias = tensor(vec![n], vals(seed + 2, n), DType::F32);
    let dy = blocked(seed + 3, s, n, bn, dt);
    // y as the forward would give it (relu: >= 0 with zeros; sigmoid: in (0,1)).
    let y = activated(act, seed + 4, s, n, bn, dt);
    let grad_ins = |last: Tensor| {
        if act == Act::None {
            vec![dy.clone(), last]
        } else {
            vec![dy.clone(), y.clone(), last]
        }
    };
    match which {
        0 => Problem {
            op: Op::Brgemm { act },
            ins: vec![x, w, bias],
        },
        1 => Problem {
            op: Op::BrgemmDgrad {
                act,
                mask: Act::None,
                dtype: DType::F32,
            },
            ins: grad_ins(w),
        },
        2 => Problem {
            op: Op::BrgemmWgrad { act, n },
            ins: grad_ins(x),
        },
        5 => Problem {
            // Without a bias: a cross layer's first product.
            op: Op::Brgemm { act },
            ins: vec![x, w],
        },
        3 => Problem {
            op: Op::BlockAct { bk, dtype: dt },
            ins: vec![tensor(vec![s, k], vals(seed, s * k), DType::F32)],
        },
        _ => Problem {
            op: Op::UnblockAct { k, dtype: dt },
            ins: vec![x],
        },
    }
}

/// A blocked activation `[ceil(n/bn), S, bn]` as the forward would give it
/// after `act` (relu: >= 0 with zeros; sigmoid: in (0,1)), zero padding.
fn activated(act: Act, seed: u64, s: usize, n: usize, bn: usize, dt: DType) -> Tensor {
    let mut v = vals(seed, s * n);
    for e in &mut v {
        *e = match act {
            Act::Relu => e.max(0.0),
            Act::Sigmoid => 0.5 + 0.45 * *e,
            Act::None => *e,
        };
    }
    let t = tensor(vec![s, n], v, DType::F32);
    interp(&Op::BlockAct { bk: bn, dtype: dt }, &[&t]).remove(0)
}

/// `p` (a [`problem`] `brgemm_dgrad`) with the previous layer's `mask`: the
/// layer input `xb[Kb,S,bk]` (activated by `mask`, the result's shape) appended.
fn masked(mut p: Problem, mask: Act, seed: u64) -> Problem {
    let Op::BrgemmDgrad { act, dtype, .. } = p.op else {
        return p;
    };
    p.op = Op::BrgemmDgrad { act, mask, dtype };
    if mask != Act::None {
        let (dy, w) = (&p.ins[0], &p.ins[p.ins.len() - 1]);
        let (s, kb, bk) = (dy.shape[1], w.shape[1], w.shape[2]);
        let xb = activated(mask, seed, s, kb * bk, bk, dy.dtype());
        p.ins.push(xb);
    }
    p
}

fn acts() -> impl Strategy<Value = Act> {
    prop_oneof![Just(Act::None), Just(Act::Relu), Just(Act::Sigmoid)]
}

fn dtypes() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::BF16)]
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_f32_vec().iter().map(|x| x.to_bits()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The reference kernels give the interpreter's results bit for bit.
    #[test]
    fn reference_kernels_match_the_interpreter(
        which in 0usize..6,
        act in acts(),
        mask in acts(),
        s in 1usize..20,
        n in 1usize..40,
        k in 1usize..40,
        bn in 1usize..20,
        bk in 1usize..20,
        dt in dtypes(),
        seed in 0u64..1000,
    ) {
        // The dgrad with any mask (none: the plain dgrad).
        let p = masked(problem(which, act, s, n, k, bn.min(n), bk.min(k), dt, seed), mask, seed);
        let ins: Vec<&Tensor> = p.ins.iter().collect();
        let want = interp(&p.op, &ins);
        let got = dlrm_codegen::try_eval(&p.op, &ins, &out_types(&p.op, &ins), &HashMap::new())
            .expect("a reference kernel")
            .unwrap_or_else(|e| panic!("{e}"));
        prop_assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            prop_assert_eq!(&g.shape, &w.shape);
            prop_assert_eq!(g.dtype(), w.dtype());
            prop_assert_eq!(bits(g), bits(w), "{:?}", p.op);
        }
    }
}

#[test]
fn reference_kernels_report_shape_errors() {
    // x has 3 blocks of 4 along k, the weight 5: a clear error, no result.
    let x = blocked(1, 4, 10, 4, DType::F32);
    let w = blocked_w(2, 6, 20, 3, 4, DType::F32);
    let b = Tensor::f32(vec![6], vec![0.0; 6]);
    let op = Op::Brgemm { act: Act::None };
    let ty = vec![TensorType::f32([
        Dim::Fixed(2),
        Dim::Fixed(4),
        Dim::Fixed(3),
    ])];
    let err = dlrm_codegen::try_eval(&op, &[&x, &w, &b], &ty, &HashMap::new())
        .expect("a reference kernel")
        .expect_err("mismatched blocks");
    // The node's instance refuses it (the shape rule of `brgemm`, by inference).
    assert!(
        matches!(err, dlrm_codegen::KernelError::Shape { op: "brgemm", .. })
            && err.to_string().contains("vs weight"),
        "{err}"
    );
}

/// A one-column `brgemm_wgrad` (the matrix-vector path) whose `dy` holds fewer
/// elements than its shape says: a clear error from the JIT kernel, not a
/// result computed from what is there.
#[test]
fn one_column_wgrad_refuses_a_short_dy() {
    let p = problem(2, Act::None, 30, 1, 64, 1, 64, DType::F32, 3);
    let mut ins = p.ins.clone();
    if let Data::F32(v) = &mut ins[0].data {
        v.truncate(20);
    }
    let refs: Vec<&Tensor> = ins.iter().collect();
    let tys = out_types(&p.op, &p.ins.iter().collect::<Vec<_>>());
    let opts = JitOptions::default();
    let err = jit::try_eval(&p.op, &refs, &tys, &HashMap::new(), &opts)
        .expect("a JIT kernel")
        .expect_err("a short dy");
    // The call's one buffer check (the operands against the node's instance).
    assert!(err.to_string().contains("operand 0 holds 20"), "{err}");
}

/// `t` with every element replaced by its magnitude (exact in f32 and bf16).
fn abs(t: &Tensor) -> Tensor {
    let v: Vec<f32> = t.to_f32_vec().iter().map(|x| x.abs()).collect();
    tensor(t.shape.clone(), v, t.dtype())
}

/// Every micro-kernel this CPU can run, each with `A` packed per row chunk,
/// read in place and (bf16) widened per row chunk, forced, and a weight block
/// wider than one tile packed or read in place.
fn kernel_choices() -> Vec<JitOptions> {
    let mut v = vec![KernelChoice::Cranelift];
    if micro::AVX2.available() {
        v.push(KernelChoice::Native);
    }
    if micro::AVX512.available() {
        v.push(KernelChoice::Avx512);
    }
    if micro::AVX512_BF16.available() {
        // Runs the GEMMs of two bf16 operands on the BF16 kernel.
        v.push(KernelChoice::Avx512Bf16);
    }
    if micro::AMX_BF16.available() {
        // Runs the GEMMs of two bf16 operands on the AMX kernel.
        v.push(KernelChoice::AmxBf16);
    }
    v.into_iter()
        .flat_map(|kernels| {
            [
                (false, false, false),
                (false, false, true),
                (true, false, false),
                (false, true, false),
                (false, true, true),
                (true, true, false),
            ]
            .map(|(p, c, w)| JitOptions {
                kernels,
                pack_a: Some(p),
                chunk_k: Some(c),
                widen_a: Some(w),
                // B packed where A is in place and not chunked (both forms
                // of B thus meet every form of A).
                pack_b: Some(!p && !c),
            })
        })
        .collect()
}

/// Runs `f` on a pool of `threads` threads.
fn on_threads(threads: usize, f: impl FnOnce() + Send) {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool")
        .install(f);
}

/// The JIT kernel of `p` against the reference kernel, for every micro-kernel:
/// `|jit - ref| <= 1e-5·scale (+ one bf16 step for bf16 results)`, where `scale`
/// is the reference kernel run on the operands' magnitudes (Σ|terms|; `y` kept,
/// so the relu mask and sigmoid factor are the same).
fn check_jit(p: &Problem) {
    let ins: Vec<&Tensor> = p.ins.iter().collect();
    let tys = out_types(&p.op, &ins);
    let syms = HashMap::new();
    let want = dlrm_codegen::try_eval(&p.op, &ins, &tys, &syms)
        .expect("a reference kernel")
        .unwrap_or_else(|e| panic!("{e}"));
    let has_y = !matches!(
        p.op,
        Op::Brgemm { .. }
            | Op::BrgemmDgrad { act: Act::None, .. }
            | Op::BrgemmWgrad { act: Act::None, .. }
    );
    // The mask operand (last) is kept too: the same mask on the magnitudes.
    let has_mask = matches!(p.op, Op::BrgemmDgrad { mask, .. } if mask != Act::None);
    let last = p.ins.len() - 1;
    let abs_ins: Vec<Tensor> = p
        .ins
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if has_y && i == 1 || has_mask && i == last {
                t.clone()
            } else {
                abs(t)
            }
        })
        .collect();
    let abs_refs: Vec<&Tensor> = abs_ins.iter().collect();
    // Forward: the scale is taken before the activation (act=none).
    let scale_op = match p.op {
        Op::Brgemm { .. } => Op::Brgemm { act: Act::None },
        ref o => o.clone(),
    };
    let scale = dlrm_codegen::try_eval(
        &scale_op,
        &abs_refs,
        &out_types(&scale_op, &abs_refs),
        &syms,
    )
    .expect("a reference kernel")
    .unwrap_or_else(|e| panic!("{e}"));
    let mut in_place: HashMap<KernelChoice, Vec<Tensor>> = HashMap::new();
    for opts in kernel_choices() {
        let got = jit::try_eval(&p.op, &ins, &tys, &syms, &opts)
            .expect("a JIT kernel")
            .unwrap_or_else(|e| panic!("{:?} {opts:?}: {e}", p.op));
        assert_eq!(got.len(), want.len());
        // Packing A changes where the kernel reads it, not the arithmetic.
        match in_place.get(&opts.kernels) {
            None => {
                in_place.insert(opts.kernels, got.clone());
            }
            Some(first) => {
                for (a, b) in got.iter().zip(first) {
                    let bits = |t: &Tensor| {
                        t.to_f32_vec()
                            .iter()
                            .map(|v| v.to_bits())
                            .collect::<Vec<_>>()
                    };
                    assert_eq!(
                        bits(a),
                        bits(b),
                        "{:?} {opts:?}: packed A differs from A in place",
                        p.op
                    );
                }
            }
        }
        for ((g, w), sc) in got.iter().zip(&want).zip(&scale) {
            assert_eq!(g.shape, w.shape, "{:?}", p.op);
            assert_eq!(g.dtype(), w.dtype(), "{:?}", p.op);
            let bf = g.dtype() == DType::BF16;
            let (g, w, sc) = (g.to_f32_vec(), w.to_f32_vec(), sc.to_f32_vec());
            for (i, ((&a, &b), &c)) in g.iter().zip(&w).zip(&sc).enumerate() {
                let tol = 1e-5 * f64::from(c) + if bf { f64::from(b.abs()) / 128.0 } else { 0.0 };
                assert!(
                    (f64::from(a) - f64::from(b)).abs() <= tol,
                    "{:?} {opts:?} shapes {:?}: element {i}: jit {a}, reference {b} (tol {tol})",
                    p.op,
                    p.ins.iter().map(|t| t.shape.clone()).collect::<Vec<_>>()
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The JIT brgemm family against the reference kernels, both micro-kernels,
    /// random ragged shapes and blocks, f32 and bf16 storage, every epilogue and
    /// every dgrad mask.
    #[test]
    fn jit_kernels_match_the_reference(
        which in prop_oneof![0usize..3, Just(5usize)],
        act in acts(),
        mask in acts(),
        s in 1usize..40,
        n in 1usize..70,
        k in 1usize..70,
        // One-column blocks often: `brgemm_wgrad` computes them as a
        // matrix-vector product.
        bn in prop_oneof![Just(1usize), 1usize..40],
        bk in 1usize..40,
        dt in dtypes(),
        seed in 0u64..1000,
    ) {
        let p = problem(which, act, s, n, k, bn.min(n), bk.min(k), dt, seed);
        check_jit(&masked(p, mask, seed + 5));
    }
}

/// `t` as f32 (exact).
fn widened(t: &Tensor) -> Tensor {
    Tensor::f32(t.shape.clone(), t.to_f32_vec())
}

/// `p` (a [`problem`] of bf16 operands) as the precision pass leaves a bf16 or
/// mixed plan's backward: `dy` bf16, the other GEMM operand (`w` or `x`; last
/// but for a mask) bf16 unless `f32_other`, `y` and the mask operand bf16, and
/// a `brgemm_dgrad` storing `dx` as `out`.
fn bf16_gradient(mut p: Problem, f32_other: bool, out: DType) -> Problem {
    let other = match p.op {
        Op::BrgemmDgrad {
            mask,
            ref mut dtype,
            ..
        } => {
            *dtype = out;
            p.ins.len() - 1 - usize::from(mask != Act::None)
        }
        _ => p.ins.len() - 1,
    };
    if f32_other {
        p.ins[other] = widened(&p.ins[other]);
    }
    p
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// `brgemm_dgrad` and `brgemm_wgrad` on bf16 gradients (bf16 results for
    /// dgrad, the other operand bf16 or f32): the reference kernels against the
    /// interpreter bit for bit, the JIT (on every micro-kernel, the BF16 one
    /// where the CPU has it) against the reference kernels.
    #[test]
    fn bf16_gradients_match_the_reference(
        which in 1usize..3,
        act in acts(),
        mask in acts(),
        s in 1usize..40,
        n in 1usize..70,
        k in 1usize..70,
        bn in prop_oneof![Just(1usize), 1usize..40],
        bk in 1usize..40,
        f32_other in any::<bool>(),
        out in dtypes(),
        seed in 0u64..1000,
    ) {
        let p = problem(which, act, s, n, k, bn.min(n), bk.min(k), DType::BF16, seed);
        let p = bf16_gradient(masked(p, mask, seed + 5), f32_other, out);
        let ins: Vec<&Tensor> = p.ins.iter().collect();
        let want = interp(&p.op, &ins);
        let got = dlrm_codegen::try_eval(&p.op, &ins, &out_types(&p.op, &ins), &HashMap::new())
            .expect("a reference kernel")
            .unwrap_or_else(|e| panic!("{e}"));
        for (g, w) in got.iter().zip(&want) {
            prop_assert_eq!(g.dtype(), w.dtype());
            prop_assert_eq!(bits(g), bits(w), "{:?}", p.op);
        }
        check_jit(&p);
    }
}

/// A DLRM-sized layer (several row blocks and tasks per block), every op.
#[test]
fn jit_kernels_match_the_reference_at_a_layer_shape() {
    for (which, act) in [
        (0, Act::Relu),
        (1, Act::Relu),
        (2, Act::Relu),
        (0, Act::Sigmoid),
    ] {
        check_jit(&problem(which, act, 301, 100, 77, 64, 32, DType::F32, 7));
    }
    // The mask on both dgrad forms (A packed per row chunk, or read in place).
    let p = problem(1, Act::Relu, 301, 100, 77, 64, 32, DType::F32, 12);
    check_jit(&masked(p, Act::Relu, 13));
    // wgrad with 5 N blocks: an f32 xᵀ read in place; a bf16 one packed (at
    // least 4 N blocks): on 2 threads its 8 K blocks packed one per task
    // against every N block; with 2 K blocks (and on 8 threads) packed whole,
    // its tiles across K blocks. On 2 threads each N block packs its dz in its
    // own GEMM task (xᵀ in place or packed whole), on 8 all blocks' dz are
    // packed first.
    for threads in [2, 8] {
        on_threads(threads, || {
            check_jit(&problem(2, Act::Relu, 301, 300, 77, 64, 32, DType::F32, 10));
            check_jit(&problem(
                2,
                Act::Sigmoid,
                130,
                200,
                100,
                40,
                13,
                DType::BF16,
                11,
            ));
            check_jit(&problem(
                2,
                Act::Relu,
                130,
                200,
                26,
                40,
                13,
                DType::BF16,
                12,
            ));
        });
    }
    // The bf16 forward with blocks of 32 and 64 steps: on the AMX kernel, full
    // 32-row tiles read `A` in place, the ragged last rows and the zero-padded
    // last K block through its copies.
    check_jit(&problem(
        0,
        Act::Relu,
        301,
        100,
        128,
        64,
        32,
        DType::BF16,
        17,
    ));
    check_jit(&problem(
        0,
        Act::Sigmoid,
        130,
        70,
        100,
        64,
        64,
        DType::BF16,
        18,
    ));
    check_jit(&problem(0, Act::None, 130, 1, 64, 1, 64, DType::BF16, 8));
    check_jit(&problem(2, Act::None, 130, 1, 64, 1, 64, DType::BF16, 9));
    // The forward and wgrad with one-column blocks (matrix-vector products):
    // one output, and three or two with a ragged K block.
    for which in [0, 2] {
        check_jit(&problem(
            which,
            Act::Relu,
            301,
            1,
            256,
            1,
            64,
            DType::F32,
            14,
        ));
        check_jit(&problem(
            which,
            Act::Sigmoid,
            130,
            3,
            100,
            1,
            13,
            DType::F32,
            15,
        ));
        check_jit(&problem(
            which,
            Act::Relu,
            67,
            2,
            90,
            1,
            30,
            DType::BF16,
            16,
        ));
    }
}

/// At serving batches a layer has fewer row chunks than two a thread, and
/// each chunk's output blocks are cut into groups, a task each: the forward
/// and dgrad (f32 and bf16, `A` packed or in place, every micro-kernel) of a
/// 30-row batch (3 tiles of 12 rows, the last short) with 5 and 16 output
/// blocks, on 2 and 8 threads, against the reference kernels.
#[test]
fn serving_batches_cut_output_blocks_into_groups() {
    for threads in [2, 8] {
        on_threads(threads, || {
            for (which, dt, n, seed) in [
                (0, DType::F32, 320, 21),
                (1, DType::F32, 320, 22),
                (0, DType::BF16, 1024, 23),
                (1, DType::BF16, 300, 24),
            ] {
                check_jit(&problem(which, Act::Relu, 30, n, 130, 64, 64, dt, seed));
            }
        });
    }
}

/// A NaN reaching the fused relu stays NaN, as in the interpreter (a diverging
/// model must not be hidden by the epilogue), with every micro-kernel, and the
/// reference kernel agrees; in GEMM tiles and in one-column blocks (row dots).
#[test]
fn fused_relu_keeps_nan_like_the_interpreter() {
    for (n, bn) in [(17, 16), (3, 1)] {
        relu_keeps_nan(n, bn);
    }
}

fn relu_keeps_nan(n: usize, bn: usize) {
    let (s, k) = (13, 20);
    let mut xv = vals(3, s * k);
    xv[5 * k + 2] = f32::NAN;
    let x = tensor(vec![s, k], xv, DType::F32);
    let xb = interp(
        &Op::BlockAct {
            bk: 8,
            dtype: DType::F32,
        },
        &[&x],
    )
    .remove(0);
    let w = blocked_w(4, n, k, bn, 8, DType::F32);
    let b = tensor(vec![n], vals(5, n), DType::F32);
    let op = Op::Brgemm { act: Act::Relu };
    let ins = [&xb, &w, &b];
    let tys = out_types(&op, &ins);
    let want = interp(&op, &ins).remove(0).to_f32_vec();
    let nans = want.iter().filter(|v| v.is_nan()).count();
    assert!(nans > 0, "the interpreter keeps NaN");
    let reference = dlrm_codegen::try_eval(&op, &ins, &tys, &HashMap::new())
        .expect("a reference kernel")
        .expect("runs")
        .remove(0)
        .to_f32_vec();
    let mut results = vec![("reference".to_string(), reference)];
    for opts in kernel_choices() {
        let got = jit::try_eval(&op, &ins, &tys, &HashMap::new(), &opts)
            .expect("a JIT kernel")
            .expect("runs")
            .remove(0)
            .to_f32_vec();
        results.push((format!("{opts:?}"), got));
    }
    for (name, got) in results {
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.is_nan(), w.is_nan(), "{name}: element {i}: {g} vs {w}");
        }
    }
}

/// Long reductions (a layer's K of 1100, wgrad's batch of 1100) in chunks that
/// keep `B`'s rows in L1 (`chunk_k`, [`dlrm_codegen::jit::gemm::GemmSpec::kc`]):
/// the same bits as one pass, with `A` packed or in place, on every
/// micro-kernel, and within tolerance of the reference (`check_jit`).
#[test]
fn chunked_reductions_give_the_same_bits() {
    for (which, act, s, n, k, bn, bk, dt, seed) in [
        (0, Act::Relu, 70, 96, 1100, 64, 64, DType::F32, 21),
        (0, Act::Sigmoid, 70, 96, 1100, 64, 50, DType::F32, 22),
        (1, Act::Relu, 70, 1100, 96, 64, 64, DType::F32, 23),
        (2, Act::Relu, 1100, 96, 100, 64, 32, DType::F32, 24),
        (2, Act::None, 1100, 300, 77, 64, 32, DType::F32, 25),
        (0, Act::Relu, 70, 96, 1100, 64, 64, DType::BF16, 26),
        // bf16 weight gradients (k pairs where a k-pair kernel runs).
        (2, Act::Relu, 1100, 96, 100, 64, 32, DType::BF16, 27),
        (2, Act::None, 1101, 130, 64, 64, 64, DType::BF16, 28),
    ] {
        let p = problem(which, act, s, n, k, bn, bk, dt, seed);
        let ins: Vec<&Tensor> = p.ins.iter().collect();
        let tys = out_types(&p.op, &ins);
        for opts in kernel_choices() {
            let run = |chunk_k| {
                let o = JitOptions {
                    chunk_k: Some(chunk_k),
                    ..opts
                };
                jit::try_eval(&p.op, &ins, &tys, &HashMap::new(), &o)
                    .expect("a JIT kernel")
                    .unwrap_or_else(|e| panic!("{:?}: {e}", p.op))
            };
            let (whole, chunked) = (run(false), run(true));
            for (a, b) in whole.iter().zip(&chunked) {
                let (a, b) = (bits(a), bits(b));
                let first = (0..a.len()).find(|&i| a[i] != b[i]);
                assert!(
                    a.len() == b.len() && first.is_none(),
                    "{:?} under {opts:?}: element {first:?} differs",
                    p.op
                );
            }
        }
        check_jit(&p);
    }
}

/// A bf16 `A` widened once per row chunk into an f32 copy
/// ([`dlrm_codegen::jit::gemm::GemmSpec::widened`]) gives the bits of the
/// same kernel widening it per tile, forward and dgrad (relu's mask, bf16
/// `dz`), on every FMA micro-kernel, at batches that take several row
/// chunks of unequal size and a ragged last tile; the picks then name the
/// widened form.
#[test]
fn widened_bf16_a_gives_the_same_bits_as_widening_per_tile() {
    let mut kernels = vec![KernelChoice::Cranelift];
    if micro::AVX2.available() {
        kernels.push(KernelChoice::Native);
    }
    if micro::AVX512.available() {
        kernels.push(KernelChoice::Avx512);
    }
    for (which, act, s, n, k, bn, bk, seed) in [
        (0, Act::Relu, 1001, 96, 192, 64, 64, 41),
        (0, Act::None, 777, 64, 100, 32, 50, 42),
        (1, Act::Relu, 1001, 128, 96, 64, 32, 43),
        (1, Act::None, 403, 64, 64, 64, 64, 44),
    ] {
        let p = problem(which, act, s, n, k, bn, bk, DType::BF16, seed);
        let ins: Vec<&Tensor> = p.ins.iter().collect();
        let tys = out_types(&p.op, &ins);
        for &kernels in &kernels {
            let run = |widen| {
                let o = JitOptions {
                    kernels,
                    pack_a: Some(false),
                    chunk_k: Some(false),
                    widen_a: Some(widen),
                    pack_b: None,
                };
                jit::try_eval(&p.op, &ins, &tys, &HashMap::new(), &o)
                    .expect("a JIT kernel")
                    .unwrap_or_else(|e| panic!("{:?}: {e}", p.op))
            };
            let (per_tile, widened) = (run(false), run(true));
            for (a, b) in per_tile.iter().zip(&widened) {
                let (a, b) = (bits(a), bits(b));
                let first = (0..a.len()).find(|&i| a[i] != b[i]);
                assert!(
                    a.len() == b.len() && first.is_none(),
                    "{:?} under {kernels:?}: element {first:?} differs",
                    p.op
                );
            }
        }
        check_jit(&p);
    }
    let picks = jit::Jit::global().expect("a JIT").gemm_picks();
    assert!(
        picks.iter().any(|(name, _)| name.contains("A widened")),
        "no widened pick in {picks:?}"
    );
}
