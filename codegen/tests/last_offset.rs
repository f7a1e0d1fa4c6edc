//! `embedding_bag` and `embedding_bag_grad` with `last_offset` (PyTorch's
//! `include_last_offset=True`: `S+1` offsets, any start, indices outside
//! `offsets[0] .. offsets[S]` unused): the interpreter (the definition), the
//! reference kernels and the JIT agree on random shapes, f32 and bf16 tables,
//! i64 and i32 indices; bad offsets are errors in all three, never a panic.

use dlrm_codegen::jit::{JitOptions, try_eval as jit_eval};
use dlrm_codegen::try_eval as ref_eval;
use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::{DType, Dim, Op, Pool, SingleRank, Tensor, TensorType};
use proptest::prelude::*;
use std::collections::HashMap;

mod common;
use common::vals;

fn syms(s: usize) -> HashMap<String, usize> {
    HashMap::from([("B".to_string(), s)])
}

fn interp(op: &Op, ins: &[&Tensor], out: &TensorType, s: usize) -> Result<Vec<Tensor>, String> {
    let sy = syms(s);
    let ctx = EvalCtx {
        syms: &sy,
        comm: &SingleRank,
    };
    eval_op(op, ins, std::slice::from_ref(out), &ctx).map_err(|e| e.to_string())
}

fn reference(op: &Op, ins: &[&Tensor], out: &TensorType, s: usize) -> Result<Vec<Tensor>, String> {
    ref_eval(op, ins, std::slice::from_ref(out), &syms(s))
        .expect("a reference kernel exists")
        .map_err(|e| e.to_string())
}

fn jit(op: &Op, ins: &[&Tensor], out: &TensorType, s: usize) -> Result<Vec<Tensor>, String> {
    jit_eval(
        op,
        ins,
        std::slice::from_ref(out),
        &syms(s),
        &JitOptions::default(),
    )
    .expect("a JIT kernel exists")
    .map_err(|e| e.to_string())
}

fn close(name: &str, got: &Tensor, want: &Tensor, tol: f32) {
    assert_eq!(got.shape, want.shape, "{name}: shape");
    for (i, (a, b)) in got.to_f32_vec().iter().zip(want.to_f32_vec()).enumerate() {
        assert!(
            (a - b).abs() <= tol * b.abs().max(1.0),
            "{name}: element {i}: {a} vs {b}"
        );
    }
}

fn bag(mode: Pool) -> Op {
    Op::EmbeddingBag {
        mode,
        last_offset: true,
    }
}

fn grad(mode: Pool) -> Op {
    Op::EmbeddingBagGrad {
        mode,
        last_offset: true,
    }
}

/// `s` bags over `n` indices: `s + 1` non-decreasing offsets from `start`
/// to `end` (`start <= end <= n`), some bags empty. The indices outside
/// `start..end` are out of the table's range (they must not be read).
#[allow(clippy::too_many_arguments)]
fn case(rows: usize, d: usize, s: usize, n: usize, start: usize, end: usize, seed: u64) {
    let cuts: Vec<i64> = vals(seed, s.saturating_sub(1))
        .iter()
        .map(|v| start as i64 + ((v + 1.0) * 0.5 * (end - start) as f32) as i64)
        .map(|o| o.clamp(start as i64, end as i64))
        .collect();
    let mut off = vec![start as i64];
    let mut sorted = cuts;
    sorted.sort_unstable();
    off.extend(sorted);
    if s > 0 {
        off.push(end as i64);
    }
    let s = off.len() - 1;
    let raw: Vec<i64> = vals(seed + 1, n)
        .iter()
        .enumerate()
        .map(|(p, v)| {
            if (start..end).contains(&p) {
                ((v + 1.0) * 0.5 * rows as f32) as i64 % rows as i64
            } else {
                rows as i64 + 5
            }
        })
        .collect();
    for bf in [false, true] {
        for i32s in [false, true] {
            for mode in [Pool::Sum, Pool::Mean] {
                let dt = if bf { DType::BF16 } else { DType::F32 };
                let table = Tensor::from_f32(dt, vec![rows, d], vals(seed + 2, rows * d));
                let (idx, offs) = if i32s {
                    (
                        Tensor::i32(vec![n], raw.iter().map(|&x| x as i32).collect()),
                        Tensor::i32(vec![s + 1], off.iter().map(|&x| x as i32).collect()),
                    )
                } else {
                    (
                        Tensor::i64(vec![n], raw.clone()),
                        Tensor::i64(vec![s + 1], off.clone()),
                    )
                };
                let name = format!(
                    "rows={rows} d={d} s={s} n={n} {start}..{end} bf={bf} i32={i32s} {mode:?}"
                );
                let out = TensorType::new(dt, [Dim::batch(), Dim::Fixed(d)]);
                let ins = [&table, &idx, &offs];
                let want = interp(&bag(mode), &ins, &out, s).expect("interpreter");
                let tol = if bf { 1.0 / 128.0 } else { 0.0 };
                close(
                    &name,
                    &jit(&bag(mode), &ins, &out, s).expect("jit")[0],
                    &want[0],
                    tol,
                );
                if !bf {
                    let got = reference(&bag(mode), &ins, &out, s).expect("reference");
                    close(&name, &got[0], &want[0], 0.0);
                }
                // The gradient: rows of indices in no bag are 0.
                let dy = Tensor::f32(vec![s, d], vals(seed + 3, s * d));
                let gout = TensorType::new(DType::F32, [Dim::Fixed(n), Dim::Fixed(d)]);
                let gins = [&dy, &idx, &offs];
                let gwant = interp(&grad(mode), &gins, &gout, s).expect("interpreter grad");
                let gv = gwant[0].to_f32_vec();
                for p in (0..start).chain(end..n) {
                    assert!(
                        gv[p * d..(p + 1) * d].iter().all(|&x| x == 0.0),
                        "{name}: row {p}"
                    );
                }
                let gj = jit(&grad(mode), &gins, &gout, s).expect("jit grad");
                close(&format!("{name} grad"), &gj[0], &gwant[0], 0.0);
                let gr = reference(&grad(mode), &gins, &gout, s).expect("reference grad");
                close(&format!("{name} grad"), &gr[0], &gwant[0], 0.0);
            }
        }
    }
}

#[test]
fn a_slice_of_global_offsets_and_the_whole_offsets_agree() {
    // Bags over the middle of the indices (TorchRec's per-key slice), over all
    // of them (PyTorch's include_last_offset=True), no bag, all bags empty.
    case(10, 3, 4, 20, 5, 14, 1);
    case(7, 5, 6, 12, 0, 12, 2);
    case(4, 2, 0, 3, 1, 1, 3);
    case(9, 4, 3, 8, 8, 8, 4);
    case(300, 37, 700, 3000, 17, 2999, 5);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn random_last_offset_bags_agree(
        rows in 1usize..40,
        d in 1usize..20,
        s in 0usize..30,
        n in 0usize..80,
        a in 0usize..80,
        b in 0usize..80,
        seed in 0u64..1000,
    ) {
        let (start, end) = (a.min(b).min(n), a.max(b).min(n));
        case(rows, d, s, n, start, end, seed);
    }
}

#[test]
fn bad_offsets_are_errors_in_every_implementation() {
    let table = Tensor::f32(vec![4, 2], vals(1, 8));
    let idx = Tensor::i64(vec![5], vec![0, 1, 2, 3, 0]);
    let out = TensorType::new(DType::F32, [Dim::batch(), Dim::Fixed(2)]);
    for off in [vec![0, 2, 6], vec![0, 3, 2], vec![-1, 2, 3]] {
        let offs = Tensor::i64(vec![3], off.clone());
        let ins = [&table, &idx, &offs];
        let op = bag(Pool::Sum);
        let e = interp(&op, &ins, &out, 2).expect_err("interpreter");
        assert!(e.contains("offset"), "{off:?}: {e}");
        let e = reference(&op, &ins, &out, 2).expect_err("reference");
        assert!(e.contains("offsets"), "{off:?}: {e}");
        let e = jit(&op, &ins, &out, 2).expect_err("jit");
        assert!(e.contains("offsets"), "{off:?}: {e}");
    }
    // No offset at all: not even the end of the last bag.
    let empty = Tensor::i64(vec![0], vec![]);
    let out0 = TensorType::new(DType::F32, [Dim::Fixed(0), Dim::Fixed(2)]);
    let ins = [&table, &idx, &empty];
    assert!(interp(&bag(Pool::Sum), &ins, &out0, 0).is_err());
    assert!(reference(&bag(Pool::Sum), &ins, &out0, 0).is_err());
    assert!(jit(&bag(Pool::Sum), &ins, &out0, 0).is_err());
    // An index out of range inside a bag names its sample; outside, unread.
    let idx = Tensor::i64(vec![5], vec![9, 1, 7, 3, 9]);
    let offs = Tensor::i64(vec![3], vec![1, 2, 4]);
    let ins = [&table, &idx, &offs];
    let e = interp(&bag(Pool::Sum), &ins, &out, 2).expect_err("interpreter");
    assert!(e.contains("sample 1"), "{e}");
    let e = reference(&bag(Pool::Sum), &ins, &out, 2).expect_err("reference");
    assert!(e.contains("sample 1") && e.contains("position 2"), "{e}");
    let e = jit(&bag(Pool::Sum), &ins, &out, 2).expect_err("jit");
    assert!(e.contains("sample 1") && e.contains("position 2"), "{e}");
}
