//! Property tests of the JIT embedding-bag (forward and `embedding_bag_grad`),
//! `linear_db`, elementwise, layout-copy (`block_act`, `unblock_act`, `cat`
//! interaction) and loss (`bce_logits`, `bce`, `mse` and their gradients,
//! `sigmoid`, `gelu` and `gelu_grad`) kernels against the interpreter (the
//! definition) and the reference kernels, on random ragged shapes, f32 and bf16
//! storage.

use dlrm_codegen::KernelError;
use dlrm_codegen::jit::{JitOptions, try_eval};
use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::module::ModOp;
use dlrm_ir::{DType, Data, Dim, InteractionKind, Op, Pool, SingleRank, Tensor, TensorType};
use proptest::prelude::*;
use std::collections::HashMap;

mod common;
use common::vals;

fn syms(s: usize) -> HashMap<String, usize> {
    HashMap::from([("B".to_string(), s)])
}

fn interp(op: &Op, ins: &[&Tensor], out: &TensorType, s: usize) -> Vec<Tensor> {
    let sy = syms(s);
    let ctx = EvalCtx {
        syms: &sy,
        comm: &SingleRank,
    };
    eval_op(op, ins, std::slice::from_ref(out), &ctx).expect("interpreter")
}

fn jit(op: &Op, ins: &[&Tensor], out: &TensorType, s: usize) -> Result<Vec<Tensor>, KernelError> {
    try_eval(
        op,
        ins,
        std::slice::from_ref(out),
        &syms(s),
        &JitOptions::default(),
    )
    .expect("a JIT kernel exists")
}

/// Equal values, or within `tol` relative (one bf16 rounding step when the
/// sum in f32 before one rounding is the definition; orders agree, so usually
/// exact). NaN matches any NaN: which NaN an invalid operation returns (sign,
/// payload) depends on the hardware's operand order, which no definition fixes.
fn assert_close(name: &str, got: &Tensor, want: &Tensor, tol: f32) {
    assert_eq!(got.shape, want.shape, "{name}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{name}: dtype");
    for (i, (a, b)) in got.to_f32_vec().iter().zip(want.to_f32_vec()).enumerate() {
        assert!(
            (a - b).abs() <= tol * b.abs().max(1.0)
                || a.to_bits() == b.to_bits()
                || a.is_nan() && b.is_nan(),
            "{name}: element {i}: {a} vs {b}"
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn bag_case(
    rows: usize,
    d: usize,
    s: usize,
    l: usize,
    offsets: bool,
    mean: bool,
    bf: bool,
    i32s: bool,
    seed: u64,
) {
    let dt = if bf { DType::BF16 } else { DType::F32 };
    let table = Tensor::from_f32(dt, vec![rows, d], vals(seed, rows * d));
    let n = s * l;
    let raw: Vec<i64> = vals(seed + 1, n)
        .iter()
        .map(|v| ((v + 1.0) * 0.5 * rows as f32) as i64 % rows as i64)
        .collect();
    let idx = if i32s {
        Tensor::i32(
            if offsets { vec![n] } else { vec![s, l] },
            raw.iter().map(|&x| x as i32).collect(),
        )
    } else {
        Tensor::i64(if offsets { vec![n] } else { vec![s, l] }, raw)
    };
    // Variable bags: sizes 0..=2l, cut from the same n indices.
    let off: Vec<i64> = (0..s)
        .map(|b| ((b * n) / s.max(1)) as i64 - (b % 2) as i64 * ((b > 0) as i64))
        .map(|o| o.max(0))
        .collect();
    let mut off_sorted = off.clone();
    for i in 1..off_sorted.len() {
        off_sorted[i] = off_sorted[i].max(off_sorted[i - 1]);
    }
    let off_t = Tensor::i64(vec![s], off_sorted);
    let op = Op::EmbeddingBag {
        mode: if mean { Pool::Mean } else { Pool::Sum },
        last_offset: false,
    };
    let out_ty = TensorType::new(dt, [Dim::batch(), Dim::Fixed(d)]);
    let ins: Vec<&Tensor> = if offsets {
        vec![&table, &idx, &off_t]
    } else {
        vec![&table, &idx]
    };
    let want = interp(&op, &ins, &out_ty, s);
    let got = jit(&op, &ins, &out_ty, s).expect("runs");
    // Same association as the definition: f32 exact, bf16 one rounding apart at most.
    let tol = if bf { 1.0 / 128.0 } else { 0.0 };
    assert_close(
        &format!("bag rows={rows} d={d} s={s} l={l} off={offsets} mean={mean} bf={bf}"),
        &got[0],
        &want[0],
        tol,
    );
}

#[test]
fn embedding_bag_blocks_of_many_bags_match_the_interpreter() {
    // Enough bags for several blocks (one kernel call each, fetching rows
    // ahead up to its block's end), ragged.
    bag_case(500, 64, 1001, 1, false, false, false, false, 1);
    bag_case(300, 37, 777, 3, true, true, false, true, 2);
    bag_case(200, 50, 613, 7, false, false, true, false, 3);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn embedding_bag_matches_the_interpreter(
        rows in 1usize..60,
        d in 1usize..75,
        s in 1usize..40,
        l in 0usize..6,
        offsets in any::<bool>(),
        mean in any::<bool>(),
        bf in any::<bool>(),
        i32s in any::<bool>(),
        seed in 0u64..1000,
    ) {
        bag_case(rows, d, s, l, offsets, mean, bf, i32s, seed);
    }

    #[test]
    fn elementwise_matches_the_interpreter(
        n in 1usize..300,
        which in 0usize..4,
        bf_a in any::<bool>(),
        bf_out in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let dta = if bf_a { DType::BF16 } else { DType::F32 };
        let dto = if bf_out { DType::BF16 } else { DType::F32 };
        let a = Tensor::from_f32(dta, vec![n], vals(seed, n));
        let b = Tensor::from_f32(dta, vec![n], vals(seed + 7, n));
        let (op, ins): (Op, Vec<&Tensor>) = match which {
            0 => (Op::Relu, vec![&a]),
            1 => (Op::ReluGrad, vec![&a, &b]),
            2 => (Op::SigmoidGrad, vec![&a, &b]),
            _ => (Op::Add, vec![&a, &b]),
        };
        let out_ty = TensorType::new(dto, [Dim::Fixed(n)]);
        let want = interp(&op, &ins, &out_ty, 1);
        let got = jit(&op, &ins, &out_ty, 1).expect("runs");
        // The definition's own float operations: exact (bf16: rounded once, the same way).
        assert_close(&format!("{op:?} n={n}"), &got[0], &want[0], 0.0);
    }
}

#[test]
fn out_of_range_index_names_the_sample_before_running() {
    let table = Tensor::f32(vec![10, 4], vals(1, 40));
    let idx = Tensor::i64(vec![3, 2], vec![0, 1, 2, 3, 4, 10]);
    let op = Op::EmbeddingBag {
        mode: Pool::Sum,
        last_offset: false,
    };
    let out_ty = TensorType::new(DType::F32, [Dim::batch(), Dim::Fixed(4)]);
    let err = jit(&op, &[&table, &idx], &out_ty, 3).expect_err("index 10 of 10 rows");
    assert_eq!(
        err,
        KernelError::IndexOutOfRange {
            op: "embedding_bag",
            position: 5,
            sample: Some(2),
            index: 10,
            rows: 10,
        }
    );
    assert!(err.to_string().contains("(sample 2)"), "{err}");
    let neg = Tensor::i64(vec![1, 1], vec![-1]);
    let err = jit(&op, &[&table, &neg], &out_ty, 1).expect_err("negative index");
    assert!(err.to_string().contains("index -1"), "{err}");
}

#[test]
fn linear_db_column_blocks_match_the_references() {
    // Large enough for column blocks (one task each), the last one ragged.
    for (s, n, bf) in [(700, 130, false), (1025, 67, true), (513, 257, false)] {
        let dz = Tensor::from_f32(dt(bf), vec![s, n], wide_vals(s as u64, s * n, false));
        let out = TensorType::new(DType::F32, [Dim::Fixed(n)]);
        three_way(
            &format!("linear_db s={s} n={n}"),
            &Op::LinearDb,
            &[&dz],
            &[out],
            s,
            0.0,
        );
    }
}

/// Runs `op` with the JIT, the reference kernels (when they cover it) and the
/// interpreter, and checks the three agree bit for bit (`tol` 0) or within `tol`.
fn three_way(name: &str, op: &Op, ins: &[&Tensor], outs: &[TensorType], s: usize, tol: f32) {
    let sy = syms(s);
    let ctx = EvalCtx {
        syms: &sy,
        comm: &SingleRank,
    };
    let want = eval_op(op, ins, outs, &ctx).expect("interpreter");
    let got = try_eval(op, ins, outs, &sy, &JitOptions::default())
        .expect("a JIT kernel exists")
        .expect("runs");
    assert_eq!(got.len(), want.len(), "{name}: result count");
    for (g, w) in got.iter().zip(&want) {
        assert_close(&format!("{name} vs interpreter"), g, w, tol);
    }
    if let Some(reference) = dlrm_codegen::try_eval(op, ins, outs, &sy) {
        let reference = reference.expect("reference runs");
        for (g, r) in got.iter().zip(&reference) {
            assert_close(&format!("{name} vs reference"), g, r, tol);
        }
    }
}

/// The bits of a bf16 tensor's elements.
fn bf16_bits(t: &Tensor) -> Vec<u16> {
    match &t.data {
        Data::BF16(v) => v.iter().map(|x| x.to_bits()).collect(),
        _ => panic!("a bf16 tensor"),
    }
}

/// bf16 → bf16 layout copies (`block_act` with padding, `unblock_act`, the
/// `cat` interaction and its gradient) on every bf16 bit pattern give the
/// interpreter's bits (`assert_close` lets any NaN match any NaN; here a
/// signalling NaN must come out quiet, its sign and payload kept, as the
/// definition's widen-then-round does).
#[test]
fn bf16_layout_copies_keep_every_bit_pattern_as_the_reference_does() {
    let (s, k) = (1024, 64);
    let x = Tensor {
        shape: vec![s, k],
        data: Data::BF16((0..=u16::MAX).map(half::bf16::from_bits).collect()),
    };
    let sy = syms(s);
    let run = |op: &Op, ins: &[&Tensor], outs: &[TensorType]| {
        let got = try_eval(op, ins, outs, &sy, &JitOptions::default())
            .expect("a JIT kernel exists")
            .expect("runs");
        let ctx = EvalCtx {
            syms: &sy,
            comm: &SingleRank,
        };
        let want = eval_op(op, ins, outs, &ctx).expect("interpreter");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.shape, w.shape, "{op:?}: shape");
            let (g, w) = (bf16_bits(g), bf16_bits(w));
            if let Some(i) = (0..g.len()).find(|&i| g[i] != w[i]) {
                panic!("{op:?}: element {i}: {:#06x} vs {:#06x}", g[i], w[i]);
            }
        }
        got
    };
    let bf = |dims: Vec<Dim>| TensorType::new(DType::BF16, dims);
    // 64 columns in blocks of 24: the last block has 16 live and 8 padding.
    let op = Op::BlockAct {
        bk: 24,
        dtype: DType::BF16,
    };
    let xb = run(
        &op,
        &[&x],
        &[bf(vec![Dim::Fixed(3), Dim::batch(), Dim::Fixed(24)])],
    );
    let op = Op::UnblockAct {
        k,
        dtype: DType::BF16,
    };
    run(&op, &[&xb[0]], &[bf(vec![Dim::batch(), Dim::Fixed(k)])]);
    let op = Op::Interaction {
        kind: InteractionKind::Cat,
        self_interaction: false,
    };
    let cat = run(&op, &[&x, &x], &[bf(vec![Dim::batch(), Dim::Fixed(2 * k)])]);
    let op = Op::InteractionGrad {
        kind: InteractionKind::Cat,
        self_interaction: false,
    };
    let outs = [
        bf(vec![Dim::batch(), Dim::Fixed(k)]),
        bf(vec![Dim::batch(), Dim::Fixed(k)]),
    ];
    run(&op, &[&cat[0], &x, &x], &outs);
}

fn dt(bf: bool) -> DType {
    if bf { DType::BF16 } else { DType::F32 }
}

/// Values in [-8, 8) with some NaNs and infinities when `specials`.
fn wide_vals(seed: u64, n: usize, specials: bool) -> Vec<f32> {
    vals(seed, n)
        .into_iter()
        .enumerate()
        .map(|(i, v)| match i % 37 {
            5 if specials => f32::NAN,
            11 if specials => f32::INFINITY,
            17 if specials => f32::NEG_INFINITY,
            _ => v * 8.0,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn block_act_and_unblock_act_match_the_references(
        s in 0usize..40,
        k in 1usize..200,
        bk in 1usize..100,
        bf_in in any::<bool>(),
        bf_out in any::<bool>(),
        specials in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let x = Tensor::from_f32(dt(bf_in), vec![s, k], wide_vals(seed, s * k, specials));
        let kb = k.div_ceil(bk);
        let op = Op::BlockAct { bk, dtype: dt(bf_out) };
        let out = TensorType::new(dt(bf_out), [Dim::Fixed(kb), Dim::batch(), Dim::Fixed(bk)]);
        let name = format!("block_act s={s} k={k} bk={bk} bf={bf_in}->{bf_out}");
        three_way(&name, &op, &[&x], &[out], s, 0.0);
        // Unblock a blocked tensor whose padding holds garbage (dropped).
        let xb = Tensor::from_f32(dt(bf_in), vec![kb, s, bk], wide_vals(seed + 3, kb * s * bk, specials));
        let op = Op::UnblockAct { k, dtype: dt(bf_out) };
        let out = TensorType::new(dt(bf_out), [Dim::batch(), Dim::Fixed(k)]);
        let name = format!("unblock_act s={s} k={k} bk={bk} bf={bf_in}->{bf_out}");
        three_way(&name, &op, &[&xb], &[out], s, 0.0);
    }

    #[test]
    fn losses_grads_and_sigmoid_match_the_references(
        s in 1usize..300,
        rank2 in any::<bool>(),
        fixed_denom in any::<bool>(),
        bf_z in any::<bool>(),
        bf_y in any::<bool>(),
        bf_out in any::<bool>(),
        soft in any::<bool>(),
        specials in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let shape = if rank2 { vec![s, 1] } else { vec![s] };
        let zs = wide_vals(seed, s, specials);
        let z = Tensor::from_f32(dt(bf_z), shape.clone(), zs.clone());
        // Probabilities (bce) in [0, 1], some exactly 0 or 1 (ln clamped at
        // -100) or tiny (p·(1-p) below 1e-12); NaN and ±inf when `specials`.
        let ps: Vec<f32> = zs
            .iter()
            .enumerate()
            .map(|(i, &v)| match i % 13 {
                3 => 0.0,
                7 => 1.0,
                9 => 1e-13,
                _ if v.is_finite() => (v + 8.0) / 16.0,
                _ => v,
            })
            .collect();
        let p = Tensor::from_f32(dt(bf_z), shape.clone(), ps);
        // Labels: 0/1, or soft labels in [0, 1].
        let y: Vec<f32> = vals(seed + 1, s)
            .iter()
            .map(|v| if soft { (v + 1.0) * 0.5 } else { f32::from(*v > 0.0) })
            .collect();
        let y = Tensor::from_f32(dt(bf_y), shape.clone(), y);
        let denom = if fixed_denom { Dim::Fixed(s + 3) } else { Dim::batch() };
        let dims: Vec<Dim> = shape.iter().map(|&d| Dim::Fixed(d)).collect();
        let cases = [
            (Op::BceLogits { denom: denom.clone() }, vec![&z, &y], vec![]),
            (Op::BceLogitsGrad { denom: denom.clone() }, vec![&z, &y], dims.clone()),
            (Op::Bce { denom: denom.clone() }, vec![&p, &y], vec![]),
            (Op::BceGrad { denom: denom.clone() }, vec![&p, &y], dims.clone()),
            (Op::Mse { denom: denom.clone() }, vec![&z, &y], vec![]),
            (Op::MseGrad { denom }, vec![&z, &y], dims.clone()),
            (Op::Sigmoid, vec![&z], dims),
        ];
        for (op, ins, out_dims) in cases {
            let out = TensorType::new(dt(bf_out), out_dims);
            let name = format!("{} s={s} bf={bf_z},{bf_y}->{bf_out}", op.mnemonic());
            three_way(&name, &op, &ins, &[out], s, 0.0);
        }
    }

    #[test]
    fn gelu_and_grad_match_the_references(
        shape in proptest::collection::vec(0usize..20, 1..4),
        bf_x in any::<bool>(),
        bf_dy in any::<bool>(),
        bf_out in any::<bool>(),
        specials in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let n: usize = shape.iter().product();
        let x = Tensor::from_f32(dt(bf_x), shape.clone(), wide_vals(seed, n, specials));
        let dy = Tensor::from_f32(dt(bf_dy), shape.clone(), wide_vals(seed + 1, n, specials));
        let dims: Vec<Dim> = shape.iter().map(|&d| Dim::Fixed(d)).collect();
        let out = TensorType::new(dt(bf_out), dims);
        let name = format!("gelu {shape:?} bf={bf_x}->{bf_out}");
        three_way(&name, &ModOp::op("gelu"), &[&x], std::slice::from_ref(&out), 1, 0.0);
        let name = format!("gelu_grad {shape:?} bf={bf_dy},{bf_x}->{bf_out}");
        three_way(&name, &ModOp::op("gelu_grad"), &[&dy, &x], &[out], 1, 0.0);
    }

    #[test]
    fn cat_interaction_and_grad_match_the_references(
        s in 0usize..40,
        widths in proptest::collection::vec(0usize..90, 1..5),
        bfs in proptest::collection::vec(any::<bool>(), 5),
        bf_out in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let xs: Vec<Tensor> = widths
            .iter()
            .enumerate()
            .map(|(i, &w)| Tensor::from_f32(dt(bfs[i]), vec![s, w], wide_vals(seed + i as u64, s * w, true)))
            .collect();
        let ins: Vec<&Tensor> = xs.iter().collect();
        let width: usize = widths.iter().sum();
        let op = Op::Interaction { kind: InteractionKind::Cat, self_interaction: false };
        let out = TensorType::new(dt(bf_out), [Dim::batch(), Dim::Fixed(width)]);
        let name = format!("cat s={s} widths={widths:?} bf={bfs:?}->{bf_out}");
        three_way(&name, &op, &ins, &[out], s, 0.0);
        let dr = Tensor::from_f32(dt(bfs[4]), vec![s, width], wide_vals(seed + 9, s * width, true));
        let mut gins = vec![&dr];
        gins.extend(xs.iter());
        // Gradients in mixed dtypes.
        let outs: Vec<TensorType> = widths
            .iter()
            .enumerate()
            .map(|(i, &w)| TensorType::new(dt(bf_out ^ (i % 2 == 1)), [Dim::batch(), Dim::Fixed(w)]))
            .collect();
        let op = Op::InteractionGrad { kind: InteractionKind::Cat, self_interaction: false };
        three_way(&format!("cat grad s={s} widths={widths:?}"), &op, &gins, &outs, s, 0.0);
    }

    #[test]
    fn embedding_bag_grad_matches_the_references(
        s in 0usize..60,
        d in 0usize..80,
        l in 0usize..6,
        offsets in any::<bool>(),
        mean in any::<bool>(),
        bf_dy in any::<bool>(),
        bf_out in any::<bool>(),
        i32s in any::<bool>(),
        specials in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let dy = Tensor::from_f32(dt(bf_dy), vec![s, d], wide_vals(seed, s * d, specials));
        // With offsets, a few indices more (bags of 0..2l+2 rows).
        let n = s * l + if s > 0 { seed as usize % 3 } else { 0 };
        let raw: Vec<i64> = (0..n as i64).map(|i| (i * 7 + seed as i64) % 11).collect();
        let idx_shape = if offsets { vec![n] } else { vec![s, l] };
        let raw = if offsets { raw } else { raw[..s * l].to_vec() };
        let idx = if i32s {
            Tensor::i32(idx_shape, raw.iter().map(|&x| x as i32).collect())
        } else {
            Tensor::i64(idx_shape, raw)
        };
        // Ragged bags, the first ones short or empty: bag b starts at ⌊b²·n/s²⌋.
        let off: Vec<i64> = (0..s).map(|b| (b * b * n / (s * s)) as i64).collect();
        let off = Tensor::i64(vec![s], off);
        let op = Op::EmbeddingBagGrad {
            mode: if mean { Pool::Mean } else { Pool::Sum },
            last_offset: false,
        };
        let (ins, dims): (Vec<&Tensor>, Vec<Dim>) = if offsets {
            (vec![&dy, &idx, &off], vec![Dim::Fixed(n), Dim::Fixed(d)])
        } else {
            (vec![&dy, &idx], vec![Dim::batch(), Dim::Fixed(l), Dim::Fixed(d)])
        };
        let out = TensorType::new(dt(bf_out), dims);
        let name = format!("embedding_bag_grad s={s} d={d} l={l} n={n} off={offsets} mean={mean} bf={bf_dy}->{bf_out}");
        three_way(&name, &op, &ins, &[out], s, 0.0);
    }

    /// A weighted bag's row gradient (`embedding_bag_grad` with per-sample
    /// weights): the reference kernel against the interpreter on random shapes
    /// (the JIT declines it; the reference kernel serves it).
    #[test]
    fn weighted_embedding_bag_grad_reference_matches_the_interpreter(
        s in 0usize..60,
        d in 0usize..40,
        n in 0usize..200,
        seed in 0u64..1000,
    ) {
        // Indices need bags to be in: none without samples.
        let n = if s == 0 { 0 } else { n };
        let dy = Tensor::f32(vec![s, d], vals(seed, s * d));
        let idx = Tensor::i64(vec![n], (0..n as i64).map(|i| (i * 5 + seed as i64) % 13).collect());
        let off = Tensor::i64(vec![s], (0..s).map(|b| (b * b * n / (s * s).max(1)) as i64).collect());
        let w = Tensor::f32(vec![n], vals(seed + 1, n));
        let op = Op::EmbeddingBagGrad { mode: Pool::Sum, last_offset: false };
        let ins = [&dy, &idx, &off, &w];
        let outs = [TensorType::new(DType::F32, [Dim::Fixed(n), Dim::Fixed(d)])];
        let sy = syms(s);
        let ctx = EvalCtx { syms: &sy, comm: &SingleRank };
        let want = eval_op(&op, &ins, &outs, &ctx).expect("interpreter");
        prop_assert!(try_eval(&op, &ins, &outs, &sy, &JitOptions::default()).is_none());
        let got = dlrm_codegen::try_eval(&op, &ins, &outs, &sy)
            .expect("a reference kernel")
            .expect("runs");
        assert_close(&format!("weighted grad s={s} d={d} n={n}"), &got[0], &want[0], 0.0);
    }

    #[test]
    fn linear_db_matches_the_references(
        s in 0usize..300,
        n in 0usize..150,
        bf_dz in any::<bool>(),
        bf_out in any::<bool>(),
        specials in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let dz = Tensor::from_f32(dt(bf_dz), vec![s, n], wide_vals(seed, s * n, specials));
        let out = TensorType::new(dt(bf_out), [Dim::Fixed(n)]);
        let name = format!("linear_db s={s} n={n} bf={bf_dz}->{bf_out}");
        three_way(&name, &Op::LinearDb, &[&dz], &[out], s, 0.0);
    }

}
