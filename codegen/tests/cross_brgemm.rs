//! The kernels of the fused cross-layer ops (`cross_brgemm`,
//! `cross_brgemm_save`, `cross_brgemm_dgrad`: a cross layer's product with its
//! elementwise step in the GEMM's epilogue) on random shapes — batch sizes
//! around the row blocks, block widths with ragged tiles, padding columns,
//! f32, bf16 and mixed operands — on every micro-kernel this CPU runs:
//! - bit for bit the unfused composition (`brgemm` then `cross_mix`;
//!   `brgemm_dgrad`, `add`, `cross_mix_grad`) on the same kernels, which is
//!   what the module's definition promises;
//! - within float reassociation of the interpreter (`|got - want| <= 1e-5·big +
//!   |want|/128` for bf16 results, `1e-5·(big + |want|)` for f32; `big` the
//!   result's largest magnitude).

use dlrm_codegen::jit::{self, JitOptions, KernelChoice, micro};
use dlrm_ir::module::ModOp;
use dlrm_ir::{Act, DType, Op, Tensor};
use half::bf16;
use std::collections::HashMap;

mod common;
use common::interp::{interp, out_types};
use common::{same_bits, vals};

/// `[rows, cols]` of random values in `dt`, blocked by `op`.
fn blocked(op: Op, seed: u64, rows: usize, cols: usize, dt: DType) -> Tensor {
    let v = vals(seed, rows * cols);
    let t = match dt {
        DType::BF16 => Tensor::bf16(
            vec![rows, cols],
            v.into_iter().map(bf16::from_f32).collect(),
        ),
        _ => Tensor::f32(vec![rows, cols], v),
    };
    interp(&op, &[&t]).remove(0)
}

/// A blocked activation `[⌈cols/bk⌉, s, bk]` in `dt`.
fn act(seed: u64, s: usize, cols: usize, bk: usize, dt: DType) -> Tensor {
    blocked(Op::BlockAct { bk, dtype: dt }, seed, s, cols, dt)
}

/// A blocked weight `[⌈n/bn⌉, ⌈k/bk⌉, bk, bn]` of an `n × k` matrix in `dt`.
fn weight(seed: u64, n: usize, k: usize, (bn, bk): (usize, usize), dt: DType) -> Tensor {
    let w = blocked(Op::BlockWeight { bn, bk }, seed, n, k, DType::F32);
    match dt {
        DType::BF16 => Tensor::bf16(
            w.shape.clone(),
            w.to_f32_vec().into_iter().map(bf16::from_f32).collect(),
        ),
        _ => w,
    }
}

/// Runs `op` on the JIT under `opts` (a kernel for these operands required).
fn jit_run(op: &Op, ins: &[&Tensor], opts: &JitOptions) -> Vec<Tensor> {
    jit::try_eval(op, ins, &out_types(op, ins), &HashMap::new(), opts)
        .unwrap_or_else(|| panic!("no JIT kernel for {op:?}"))
        .unwrap_or_else(|e| panic!("{op:?}: {e}"))
}

/// Runs `op` as the runtime does: its JIT kernel, else its reference kernel,
/// else the interpreter.
fn any_run(op: &Op, ins: &[&Tensor], opts: &JitOptions) -> Vec<Tensor> {
    let tys = out_types(op, ins);
    jit::try_eval(op, ins, &tys, &HashMap::new(), opts)
        .or_else(|| dlrm_codegen::try_eval(op, ins, &tys, &HashMap::new()))
        .map(|r| r.unwrap_or_else(|e| panic!("{op:?}: {e}")))
        .unwrap_or_else(|| interp(op, ins))
}

/// Runs `op` on the reference kernels.
fn ref_run(op: &Op, ins: &[&Tensor]) -> Vec<Tensor> {
    dlrm_codegen::try_eval(op, ins, &out_types(op, ins), &HashMap::new())
        .unwrap_or_else(|| panic!("no reference kernel for {op:?}"))
        .unwrap_or_else(|e| panic!("{op:?}: {e}"))
}

/// `got` within reassociation of the interpreter's `want`.
fn close(case: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(
        (&got.shape, got.dtype()),
        (&want.shape, want.dtype()),
        "{case}"
    );
    let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
    let big = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let rel = if got.dtype() == DType::BF16 {
        1.0 / 128.0
    } else {
        1e-5
    };
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * big + rel * b.abs(),
            "{case}: element {i}: {a} vs {b}"
        );
    }
}

/// The kernel choices this CPU runs, each with both `A` forms.
fn choices() -> Vec<JitOptions> {
    let mut ks = vec![KernelChoice::Cranelift];
    for (k, m) in [
        (KernelChoice::Native, &micro::AVX2),
        (KernelChoice::Avx512, &micro::AVX512),
        (KernelChoice::Avx512Bf16, &micro::AVX512_BF16),
        (KernelChoice::AmxBf16, &micro::AMX_BF16),
    ] {
        if m.available() {
            ks.push(k);
        }
    }
    ks.into_iter()
        .flat_map(|kernels| {
            [(true, false), (false, true)].map(|(p, c)| JitOptions {
                kernels,
                pack_a: Some(p),
                chunk_k: Some(c),
                widen_a: None,
                pack_b: Some(c),
            })
        })
        .collect()
}

/// The storage of each operand group of a case: (`z`, `u`), (`x0`, `x`).
const DTYPES: [(DType, DType); 3] = [
    (DType::F32, DType::F32),
    (DType::BF16, DType::BF16),
    (DType::BF16, DType::F32),
];

#[test]
fn the_fused_forward_is_the_composition_on_every_kernel() {
    let cases = [
        // (S, R, D, br, bd): ragged batch, padding columns (D < Db·bd), ragged tiles.
        (37, 24, 40, 16, 32),
        (64, 32, 64, 32, 64),
        (129, 40, 100, 32, 48),
        (5, 8, 17, 8, 1),
    ];
    for (ci, &(s, r, d, br, bd)) in cases.iter().enumerate() {
        for (di, &(dt_zu, dt_x)) in DTYPES.iter().enumerate() {
            let seed = (ci * 10 + di) as u64 * 7;
            let z = act(seed + 1, s, r, br, dt_zu);
            let u = weight(seed + 2, d, r, (bd, br), dt_zu);
            let b = Tensor::f32(vec![d], vals(seed + 3, d));
            let x0 = act(seed + 4, s, d, bd, dt_x);
            let x = act(seed + 5, s, d, bd, dt_x);
            let fused_ins = [&z, &u, &b, &x0, &x];
            for save in [false, true] {
                let name = if save {
                    "cross_brgemm_save"
                } else {
                    "cross_brgemm"
                };
                let op = ModOp::op(name);
                let case = format!("{name} S={s} R={r} D={d} br={br} bd={bd} {dt_zu}/{dt_x}");
                let want = interp(&op, &fused_ins);
                // The interpreter's definition: the composition.
                let w = interp(&Op::Brgemm { act: Act::None }, &fused_ins[..3]).remove(0);
                let y = interp(&ModOp::op("cross_mix"), &[&x0, &w, &x]).remove(0);
                same_bits(&format!("{case}: interp y"), &want[0], &y);
                if save {
                    same_bits(&format!("{case}: interp w"), &want[1], &w);
                }
                // The reference kernels.
                let got = ref_run(&op, &fused_ins);
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    close(&format!("{case}: reference result {k}"), g, w);
                }
                for opts in choices() {
                    let case = format!("{case} {opts:?}");
                    let got = jit_run(&op, &fused_ins, &opts);
                    assert_eq!(got.len(), want.len(), "{case}");
                    let w =
                        jit_run(&Op::Brgemm { act: Act::None }, &fused_ins[..3], &opts).remove(0);
                    let y = any_run(&ModOp::op("cross_mix"), &[&x0, &w, &x], &opts).remove(0);
                    same_bits(&format!("{case}: y"), &got[0], &y);
                    if save {
                        same_bits(&format!("{case}: w"), &got[1], &w);
                    }
                    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                        close(&format!("{case}: result {k}"), g, w);
                    }
                }
            }
        }
    }
}

#[test]
fn the_fused_dgrad_is_the_composition_on_every_kernel() {
    let cases = [
        (37, 24, 40, 16, 32),
        (64, 32, 64, 32, 64),
        (129, 40, 100, 32, 48),
    ];
    for (ci, &(s, r, d, br, bd)) in cases.iter().enumerate() {
        for (di, &(dt_tv, dt_x)) in DTYPES.iter().enumerate() {
            let seed = (ci * 10 + di) as u64 * 11;
            let t = act(seed + 1, s, r, br, dt_tv);
            let v = weight(seed + 2, r, d, (br, bd), dt_tv);
            let dy = act(seed + 3, s, d, bd, DType::F32);
            let x0 = act(seed + 4, s, d, bd, dt_x);
            let w = act(seed + 5, s, d, bd, dt_x);
            let dgrad = Op::BrgemmDgrad {
                act: Act::None,
                mask: Act::None,
                dtype: DType::F32,
            };
            let op = ModOp::op("cross_brgemm_dgrad");
            for mixes in [false, true] {
                let ins: Vec<&Tensor> = if mixes {
                    vec![&t, &v, &dy, &x0, &w]
                } else {
                    vec![&t, &v, &dy]
                };
                let case = format!("dgrad mix={mixes} S={s} R={r} D={d} {dt_tv}/{dt_x}");
                let want = interp(&op, &ins);
                let compose = |run: &dyn Fn(&Op, &[&Tensor]) -> Vec<Tensor>| {
                    let tv = run(&dgrad, &[&t, &v]).remove(0);
                    let dx = run(&Op::Add, &[&dy, &tv]).remove(0);
                    let mut outs = vec![dx];
                    if mixes {
                        let m = run(&ModOp::op("cross_mix_grad"), &[&outs[0], &x0, &w]);
                        outs.extend(m);
                    }
                    outs
                };
                for (k, (a, b)) in want.iter().zip(&compose(&interp)).enumerate() {
                    same_bits(&format!("{case}: interp result {k}"), a, b);
                }
                let got = ref_run(&op, &ins);
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    close(&format!("{case}: reference result {k}"), g, w);
                }
                for opts in choices() {
                    let case = format!("{case} {opts:?}");
                    let got = jit_run(&op, &ins, &opts);
                    assert_eq!(got.len(), want.len(), "{case}");
                    let parts = compose(&|op, ins| any_run(op, ins, &opts));
                    for (k, ((g, p), w)) in got.iter().zip(&parts).zip(&want).enumerate() {
                        same_bits(&format!("{case}: result {k}"), g, p);
                        close(&format!("{case}: result {k} vs interp"), g, w);
                    }
                }
            }
        }
    }
}

#[test]
fn an_empty_batch_gives_empty_results() {
    let z = act(1, 0, 8, 8, DType::F32);
    let u = weight(2, 16, 8, (16, 8), DType::F32);
    let b = Tensor::f32(vec![16], vals(3, 16));
    let x = act(4, 0, 16, 16, DType::F32);
    let op = ModOp::op("cross_brgemm_save");
    let ins = [&z, &u, &b, &x, &x];
    let opts = JitOptions::default();
    for got in [jit_run(&op, &ins, &opts), ref_run(&op, &ins)] {
        assert_eq!(got.len(), 2);
        assert!(
            got.iter().all(|t| t.shape == [1, 0, 16]),
            "{:?}",
            got[0].shape
        );
    }
}
