//! The reference kernels of `cross`, `cross_grad`, their saved forms and
//! `cross_mix` / `cross_mix_grad` (`kernels/cross.rs`) against
//! the interpreter on random shapes: batch sizes around the row-block size, widths
//! and ranks from 1, including ones that are not multiples of a SIMD width.
//!
//! Stated tolerance: `|kernel - interp| <= 1e-4 · (1 + |interp|)` per element
//! (`sgemm` sums in another order than the interpreter's one accumulator; values
//! are U(-1, 1), sums of at most a few hundred terms).

use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::module::ModOp;
use dlrm_ir::{DType, Dim, SingleRank, Tensor, TensorType, infer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;

fn rand(r: &mut ChaCha8Rng, shape: &[usize]) -> Tensor {
    let n = shape.iter().product();
    Tensor::f32(
        shape.to_vec(),
        (0..n).map(|_| r.random::<f32>() * 2.0 - 1.0).collect(),
    )
}

/// The interpreter's results of `mnemonic` on `ins`, and the result types.
fn interp(mnemonic: &str, ins: &[Tensor]) -> (Vec<Tensor>, Vec<TensorType>) {
    let op = ModOp::op(mnemonic);
    let refs: Vec<&Tensor> = ins.iter().collect();
    let tys: Vec<TensorType> = ins
        .iter()
        .map(|t| TensorType::new(t.dtype(), t.shape.iter().map(|&d| Dim::Fixed(d))))
        .collect();
    let ty_refs: Vec<&TensorType> = tys.iter().collect();
    let outs = infer(&op, &ty_refs, &[]).expect("infer");
    let syms = HashMap::new();
    let ctx = EvalCtx {
        syms: &syms,
        comm: &SingleRank,
    };
    (eval_op(&op, &refs, &outs, &ctx).expect("interpreter"), outs)
}

fn check(mnemonic: &str, ins: &[Tensor]) {
    let op = ModOp::op(mnemonic);
    let refs: Vec<&Tensor> = ins.iter().collect();
    let (want, outs) = interp(mnemonic, ins);
    let syms = HashMap::new();
    let got = dlrm_codegen::try_eval(&op, &refs, &outs, &syms)
        .expect("a kernel for f32")
        .expect("kernel");
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.shape, w.shape, "{mnemonic} result {k}");
        assert_eq!(g.dtype(), w.dtype(), "{mnemonic} result {k}");
        for (i, (&a, &b)) in g.to_f32_vec().iter().zip(&w.to_f32_vec()).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "{mnemonic} result {k}[{i}] shapes {:?}: kernel {a}, interpreter {b}",
                ins.iter().map(|t| t.shape.clone()).collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn cross_kernels_match_the_interpreter_on_random_shapes() {
    let mut r = ChaCha8Rng::seed_from_u64(11);
    for case in 0..24 {
        let s = [1, 3, 17, 64, 300][case % 5];
        let d = r.random_range(1..70);
        let rank = r.random_range(1..40);
        let layer = [
            rand(&mut r, &[s, d]),
            rand(&mut r, &[s, d]),
            rand(&mut r, &[rank, d]),
            rand(&mut r, &[d, rank]),
            rand(&mut r, &[d]),
        ];
        check("cross", &layer);
        check("cross_save", &layer);
        let mut grad = vec![rand(&mut r, &[s, d])];
        grad.extend(layer.iter().cloned());
        check("cross_grad", &grad);
        // The saved form, given the forward's own z and w.
        let saved = save(&layer);
        let mut given = grad[..5].to_vec();
        given.extend(saved);
        check("cross_grad_saved", &given);
        // The elementwise step of a contracted layer, on blocked shapes.
        let blocked = [d.div_ceil(8), s, 8];
        let mix: Vec<Tensor> = (0..3).map(|_| rand(&mut r, &blocked)).collect();
        check("cross_mix", &mix);
        check("cross_mix_grad", &mix);
        // bf16 operands in every mix (the bf16 precision's blocked activations).
        for mask in 1..8usize {
            let mixed: Vec<Tensor> = mix
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    if mask & (1 << i) == 0 {
                        t.clone()
                    } else {
                        Tensor::from_f32(DType::BF16, t.shape.clone(), t.to_f32_vec())
                    }
                })
                .collect();
            check("cross_mix", &mixed);
            check("cross_mix_grad", &mixed);
        }
    }
}

/// `cross_save`'s `z` and `w` of a layer, by the interpreter.
fn save(layer: &[Tensor]) -> Vec<Tensor> {
    interp("cross_save", layer).0[1..].to_vec()
}

#[test]
fn a_rank_zero_layer_runs_in_the_interpreter() {
    let mut r = ChaCha8Rng::seed_from_u64(13);
    let layer = [
        rand(&mut r, &[3, 4]),
        rand(&mut r, &[3, 4]),
        rand(&mut r, &[0, 4]),
        rand(&mut r, &[4, 0]),
        rand(&mut r, &[4]),
    ];
    let refs: Vec<&Tensor> = layer.iter().collect();
    let (want, outs) = interp("cross", &layer);
    assert!(dlrm_codegen::try_eval(&ModOp::op("cross"), &refs, &outs, &HashMap::new()).is_none());
    // The interpreter's rank-0 layer: w = b, so y = x0 ⊙ b + x.
    let (x0, x, b) = (
        layer[0].to_f32_vec(),
        layer[1].to_f32_vec(),
        layer[4].to_f32_vec(),
    );
    let y: Vec<f32> = (0..12).map(|i| x0[i] * b[i % 4] + x[i]).collect();
    assert_eq!(want[0].to_f32_vec(), y);
}

#[test]
fn an_empty_batch_gives_empty_results_and_zero_parameter_gradients() {
    let mut r = ChaCha8Rng::seed_from_u64(12);
    let layer = [
        rand(&mut r, &[0, 5]),
        rand(&mut r, &[0, 5]),
        rand(&mut r, &[2, 5]),
        rand(&mut r, &[5, 2]),
        rand(&mut r, &[5]),
    ];
    check("cross", &layer);
    let mut grad = vec![rand(&mut r, &[0, 5])];
    grad.extend(layer);
    check("cross_grad", &grad);
}
